//! The TFRecord reader alone (both CRCs checked, nothing decoded): the floor
//! that `tfpipe inspect` is measured against (docs/benchmarks.md).
//!
//! `cargo run --release --example read_cpu -- FILE...` reads every record of
//! each file in turn on one thread and prints records, bytes, the wall time
//! and the process's CPU time (user + system, from `getrusage`), which stays
//! comparable on a shared machine where wall time does not.

use std::time::Instant;

use tfpipe::tfrecord::{FileRecordReader, ReaderOptions};

/// User and system CPU seconds of this process so far.
fn cpu_seconds() -> (f64, f64) {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is valid.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (seconds(usage.ru_utime), seconds(usage.ru_stime))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        return Err("usage: read_cpu FILE...".into());
    }
    let (user0, sys0) = cpu_seconds();
    let start = Instant::now();
    let (mut records, mut bytes) = (0u64, 0u64);
    for file in &files {
        let mut reader = FileRecordReader::open(file, ReaderOptions::default())?;
        while let Some(record) = reader.next_record()? {
            records += 1;
            bytes += record.len() as u64;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let (user, sys) = cpu_seconds();
    println!(
        "{records} records, {bytes} payload bytes: wall {wall:.3} s, user {:.3} s, sys {:.3} s",
        user - user0,
        sys - sys0
    );
    Ok(())
}
