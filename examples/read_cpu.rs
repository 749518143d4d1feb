//! The floors in docs/benchmarks.md: what one core does with no pipeline
//! around it.
//!
//! `cargo run --release --example read_cpu -- FILE...` reads every record of
//! each file in turn on one thread with both CRCs checked (the reader alone,
//! which `tfpipe inspect` is measured against). With `--feature SPEC`
//! (repeatable, as for `tfpipe bench`) it also copies each record out of the
//! read buffer into a reused buffer and parses them 256 at a time into a
//! reused batch: read + CRC + copy + parse, the work of the pipeline
//! benchmark without its stages, threads and hand-offs.
//!
//! It prints records, bytes, the wall time and the process's CPU time (user +
//! system, from `getrusage`), which stays comparable on a shared machine
//! where wall time does not.

#[path = "common/args.rs"]
mod args;
#[path = "common/cpu.rs"]
mod cpu;

use std::time::Instant;

use tfpipe::Batch;
use tfpipe::example::{BatchParser, Schema};
use tfpipe::tfrecord::{FileRecordReader, ReaderOptions};

use cpu::cpu_seconds;

/// Records parsed at a time with `--feature` (the benchmark's batch size).
const BATCH: usize = 256;

/// The files, and the feature specs given with `--feature`.
fn args() -> Result<(Vec<String>, Vec<String>), String> {
    args::files_and_specs("usage: read_cpu [--feature SPEC]... FILE...")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (files, specs) = args()?;
    let mut parser = if specs.is_empty() {
        None
    } else {
        Some(BatchParser::new(Schema::from_feature_texts(&specs)?)?)
    };
    let mut batch = Batch::default();
    let mut held: Vec<Vec<u8>> = vec![Vec::new(); BATCH];
    let mut filled = 0;
    let (user0, sys0) = cpu_seconds();
    let start = Instant::now();
    let (mut records, mut bytes) = (0u64, 0u64);
    for file in &files {
        let mut reader = FileRecordReader::open(file, ReaderOptions::default())?;
        while let Some(record) = reader.next_record()? {
            records += 1;
            bytes += record.len() as u64;
            let Some(parser) = parser.as_mut() else {
                continue;
            };
            held[filled].clear();
            held[filled].extend_from_slice(record);
            filled += 1;
            if filled == BATCH {
                parser.parse_into(&held, &mut batch)?;
                filled = 0;
            }
        }
    }
    if let Some(parser) = parser.as_mut() {
        parser.parse_into(&held[..filled], &mut batch)?;
    }
    let wall = start.elapsed().as_secs_f64();
    let (user, sys) = cpu_seconds();
    let cpu = user - user0 + sys - sys0;
    println!(
        "{records} records, {bytes} payload bytes{}: wall {wall:.3} s, user {:.3} s, sys {:.3} s, \
         {:.3} us of CPU per record",
        if parser.is_some() { ", parsed" } else { "" },
        user - user0,
        sys - sys0,
        cpu / records.max(1) as f64 * 1e6,
    );
    Ok(())
}
