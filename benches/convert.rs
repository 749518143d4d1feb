//! Conversion throughput: a generated numeric CSV (10 int64 + 10 float32
//! columns), the same table as JSON Lines, and the bundled MNIST IDX files,
//! on 1 thread and on all cores; and the cost of loading the input by
//! `read` (what the converters do) against a memory map.
//!
//! `cargo bench --bench convert -- --warm-up-time 1 --measurement-time 3`
//! The full-size CSV (1,000,000 rows, ~148 MB) is measured through the CLI;
//! see README.md for the commands.

use std::io::Write;
use std::path::{Path, PathBuf};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tfpipe::convert::{self, CsvOptions, Format, IdxOptions, JsonOptions, OutputOptions, Sharding};

/// Writes `rows` rows of 10 int and 10 float columns, like the Python baseline's CSV.
fn generate_csv(path: &Path, rows: usize) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let header: Vec<String> = (0..10)
        .map(|i| format!("i{i}"))
        .chain((0..10).map(|i| format!("f{i}")))
        .collect();
    writeln!(out, "{}", header.join(",")).unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..rows {
        let mut line = String::with_capacity(160);
        for c in 0..20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if c < 10 {
                line.push_str(&((x % 100_000) as i64 - 50_000).to_string());
            } else {
                line.push_str(&format!("{:.4}", (x % 1_000_000) as f64 / 1000.0));
            }
            line.push(if c == 19 { '\n' } else { ',' });
        }
        out.write_all(line.as_bytes()).unwrap();
    }
}

/// The CSV's rows as JSON Lines objects (numbers kept as written).
fn csv_to_jsonl(csv: &Path, path: &Path) {
    let text = std::fs::read_to_string(csv).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for line in lines {
        let fields: Vec<String> = header
            .iter()
            .zip(line.split(','))
            .map(|(k, v)| format!("\"{k}\": {v}"))
            .collect();
        writeln!(out, "{{{}}}", fields.join(", ")).unwrap();
    }
}

/// One group: `input` converted to 8 shards under `out`, on one thread and
/// on every core, with the input's size as the throughput.
fn bench_text_input(
    c: &mut Criterion,
    name: &str,
    format: &Format,
    input: &Path,
    out: &Path,
    cores: usize,
) {
    let bytes = std::fs::metadata(input).unwrap().len();
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    group.throughput(Throughput::Bytes(bytes));
    for threads in [1, cores] {
        group.bench_function(format!("threads_{threads}"), |b| {
            b.iter(|| {
                let output = OutputOptions {
                    sharding: Sharding::Shards(8),
                    threads,
                    ..OutputOptions::new(out)
                };
                convert::convert(format, std::slice::from_ref(&input.to_path_buf()), &output)
                    .unwrap()
            })
        });
    }
    group.finish();
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("numbers.csv");
    generate_csv(&csv, 100_000);
    let csv_bytes = std::fs::metadata(&csv).unwrap().len();
    let mnist =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/mnist/train-images-idx3-ubyte.gz");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    let csv_format = Format::Csv(CsvOptions::default());
    let csv_out = dir.path().join("csv");
    bench_text_input(
        c,
        "convert_csv_100k_rows",
        &csv_format,
        &csv,
        &csv_out,
        cores,
    );

    // Loading the input: read (what the converters do; safe if the file
    // changes) against a memory map with every byte touched (the old way,
    // which dies with SIGBUS if the file is truncated meanwhile).
    let mut group = c.benchmark_group("load_csv_input");
    group.sample_size(20);
    group.throughput(Throughput::Bytes(csv_bytes));
    group.bench_function("read", |b| {
        b.iter(|| {
            let data = std::fs::read(&csv).unwrap();
            data.iter()
                .fold(0u64, |acc, &x| acc.wrapping_add(u64::from(x)))
        })
    });
    group.bench_function("mmap", |b| {
        b.iter(|| {
            let file = std::fs::File::open(&csv).unwrap();
            // SAFETY: the bench's own temporary file, not changed while mapped.
            let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
            map.iter()
                .fold(0u64, |acc, &x| acc.wrapping_add(u64::from(x)))
        })
    });
    group.finish();

    let jsonl = dir.path().join("numbers.jsonl");
    csv_to_jsonl(&csv, &jsonl);
    let json_format = Format::Json(JsonOptions::default());
    let json_out = dir.path().join("json");
    bench_text_input(
        c,
        "convert_jsonl_100k_records",
        &json_format,
        &jsonl,
        &json_out,
        cores,
    );

    let mut group = c.benchmark_group("convert_mnist_8000");
    group.sample_size(10);
    group.throughput(Throughput::Elements(8000));
    for threads in [1, cores] {
        group.bench_function(format!("threads_{threads}"), |b| {
            b.iter(|| {
                let output = OutputOptions {
                    sharding: Sharding::Shards(4),
                    threads,
                    ..OutputOptions::new(dir.path().join("mnist"))
                };
                convert::convert(
                    &Format::Idx(IdxOptions::default()),
                    std::slice::from_ref(&mnist),
                    &output,
                )
                .unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
