//! TFRecord read and write throughput.
//!
//! Raw reads (both CRCs checked) of page-cached uncompressed files of ~800 B
//! and ~100 KB records, through the zero-copy `next_record` and the
//! buffer-reusing `read_record`; GZIP read and write. The files are generated
//! in a temporary directory; `TFPIPE_BENCH_MB` sets the size of each
//! uncompressed file (default 128), `TFPIPE_BENCH_BUFFER` the reader's
//! `buffer_size`. Throughput is in uncompressed bytes. `crc32c_only` is the
//! ceiling: CRC32C alone over the same bytes already in memory.
//!
//! Time is the benchmark thread's CPU time (user + system, so the kernel's
//! copy out of the page cache counts), not wall time: this measures one
//! core's throughput and stays meaningful on a shared, busy machine. Set
//! `TFPIPE_BENCH_WALL=1` for wall time.
//!
//! ```text
//! cargo bench --bench tfrecord_read -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tfpipe::tfrecord::{Compression, FileRecordReader, ReaderOptions, RecordWriter};

/// Deterministic pseudo-random record content, cheap to make.
fn fill(buf: &mut [u8], seed: &mut u64) {
    for chunk in buf.chunks_mut(8) {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        // Half the bytes small, so GZIP has something to do, as with real
        // protobuf-encoded features.
        let word = (*seed & 0x0f0f_0f0f_ffff_ffff).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Writes `total` bytes of records of `record_len` bytes; returns the
/// uncompressed (framed) size.
fn generate(path: &Path, record_len: usize, total: usize, compression: Compression) -> u64 {
    let mut writer = tfpipe::tfrecord::FileRecordWriter::create(path, compression).unwrap();
    let mut record = vec![0u8; record_len];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut written = 0;
    while written < total {
        // Vary the length a little, as real records do.
        let len = record_len - (seed as usize % (record_len / 8 + 1));
        fill(&mut record[..len], &mut seed);
        writer.write_record(&record[..len]).unwrap();
        written += len + 16;
    }
    writer.finish().unwrap();
    written as u64
}

fn read_all_zero_copy(path: &Path, options: &ReaderOptions) -> u64 {
    let mut reader = FileRecordReader::open(path, options.clone()).unwrap();
    let mut bytes = 0;
    while let Some(record) = reader.next_record().unwrap() {
        bytes += black_box(record).len() as u64;
    }
    bytes
}

fn read_all_buffered(path: &Path, options: &ReaderOptions) -> u64 {
    let mut reader = FileRecordReader::open(path, options.clone()).unwrap();
    let mut record = Vec::new();
    let mut bytes = 0;
    while reader.read_record(&mut record).unwrap() {
        bytes += black_box(&record).len() as u64;
    }
    bytes
}

/// This thread's CPU time so far (wall time where unsupported or asked for).
#[derive(Clone, Copy)]
enum Clock {
    ThreadCpu,
    Wall(Instant),
}

impl Clock {
    fn now() -> Clock {
        if std::env::var_os("TFPIPE_BENCH_WALL").is_some() || thread_cpu_time().is_none() {
            Clock::Wall(Instant::now())
        } else {
            Clock::ThreadCpu
        }
    }

    fn elapsed_since(self, start: Duration) -> Duration {
        match self {
            Clock::ThreadCpu => thread_cpu_time().unwrap_or_default() - start,
            Clock::Wall(t) => t.elapsed(),
        }
    }

    fn start(self) -> Duration {
        match self {
            Clock::ThreadCpu => thread_cpu_time().unwrap_or_default(),
            Clock::Wall(_) => Duration::ZERO,
        }
    }
}

#[cfg(unix)]
fn thread_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

#[cfg(not(unix))]
fn thread_cpu_time() -> Option<Duration> {
    None
}

/// Runs `work` `iters` times and returns the time it took by [`Clock`].
fn timed(iters: u64, mut work: impl FnMut()) -> Duration {
    let clock = Clock::now();
    let start = clock.start();
    for _ in 0..iters {
        work();
    }
    clock.elapsed_since(start)
}

fn size_mb() -> usize {
    std::env::var("TFPIPE_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let total = size_mb() << 20;
    let options = ReaderOptions {
        buffer_size: std::env::var("TFPIPE_BENCH_BUFFER")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(ReaderOptions::default().buffer_size),
        ..ReaderOptions::default()
    };

    for (name, record_len) in [("800B", 826), ("100KB", 100 << 10)] {
        let path: PathBuf = dir.path().join(format!("{name}.tfrecord"));
        let file_len = generate(&path, record_len, total, Compression::None);
        // Warm the page cache.
        read_all_zero_copy(&path, &options);
        let mut group = c.benchmark_group(format!("read_{name}"));
        group.throughput(Throughput::Bytes(file_len));
        group.sample_size(10);
        group.bench_function("next_record", |b| {
            b.iter_custom(|n| {
                timed(n, || {
                    black_box(read_all_zero_copy(&path, &options));
                })
            })
        });
        group.bench_function("read_record", |b| {
            b.iter_custom(|n| {
                timed(n, || {
                    black_box(read_all_buffered(&path, &options));
                })
            })
        });
        if record_len > 1000 {
            // The ceiling: CRC32C alone over the file's bytes in memory.
            let bytes = std::fs::read(&path).unwrap();
            group.bench_function("crc32c_only", |b| {
                b.iter_custom(|n| {
                    timed(n, || {
                        black_box(crc32c::crc32c(black_box(&bytes)));
                    })
                })
            });
        }
        group.finish();
        std::fs::remove_file(&path).unwrap();
    }

    // GZIP: smaller files, the codec is the cost.
    let gz_total = total / 4;
    let gz_path = dir.path().join("800B.tfrecord.gz");
    let uncompressed = generate(&gz_path, 826, gz_total, Compression::Gzip);
    let mut group = c.benchmark_group("gzip_800B");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(uncompressed));
    group.bench_function("read", |b| {
        b.iter_custom(|n| {
            timed(n, || {
                black_box(read_all_zero_copy(&gz_path, &options));
            })
        })
    });
    let mut record = vec![0u8; 826];
    fill(&mut record, &mut 1);
    let count = uncompressed as usize / (826 + 16);
    group.bench_function("write", |b| {
        b.iter_custom(|n| {
            timed(n, || {
                let mut writer = RecordWriter::new(std::io::sink(), Compression::Gzip);
                for _ in 0..count {
                    writer.write_record(&record).unwrap();
                }
                writer.finish().unwrap();
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
