//! The input pipeline on MNIST-like TFRecord shards: read -> shuffle(10,000)
//! -> batch(256) -> parse -> prefetch(2), for parallelism 1, 2 and auto,
//! uncompressed and GZIP; plus the same without the parse stage (the engine
//! alone).
//!
//! The shards (784-byte `image_raw` + int64 `label`, 8 shards) are generated
//! once per run in a temporary directory. `TFPIPE_BENCH_RECORDS` sets the
//! record count (default 500,000, as in the issue; smaller for quick runs);
//! the GZIP variant uses a fifth of them, since compressing them while
//! generating costs about a minute otherwise. With `TFPIPE_BENCH_DIR` set,
//! the shards are written there and kept, for `tfpipe bench` to read.
//!
//! ```text
//! cargo bench --bench pipeline -- --warm-up-time 1 --measurement-time 3
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use prost::Message;
use tfpipe::Schema;
use tfpipe::example::Example;
use tfpipe::example::proto::{BytesList, Feature, Features, Int64List, feature};
use tfpipe::pipeline::{Interleave, Parallelism, Pipeline, Record, ShuffleOptions};
use tfpipe::tfrecord::{Compression, FileRecordWriter};

const SHARDS: u64 = 8;

fn example(i: u64) -> Vec<u8> {
    // MNIST-like: about 19% of the pixels ink (pseudo-random values), the
    // rest 0, so GZIP compresses it about as well as real digits (3x).
    let mut state = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let image: Vec<u8> = (0..784)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if state % 100 < 19 {
                (state >> 32) as u8 | 1
            } else {
                0
            }
        })
        .collect();
    let mut features = BTreeMap::new();
    features.insert(
        "image_raw".to_string(),
        Feature {
            kind: Some(feature::Kind::BytesList(BytesList { value: vec![image] })),
        },
    );
    features.insert(
        "label".to_string(),
        Feature {
            kind: Some(feature::Kind::Int64List(Int64List {
                value: vec![(i % 10) as i64],
            })),
        },
    );
    Example {
        features: Some(Features { feature: features }),
    }
    .encode_to_vec()
}

fn write_shards(dir: &Path, records: u64, compression: Compression) -> Vec<PathBuf> {
    let per_shard = records.div_ceil(SHARDS);
    (0..SHARDS)
        .map(|s| {
            let path = dir.join(format!("mnist-{s:02}.tfrecord{}", compression.suffix()));
            let mut w = FileRecordWriter::create(&path, compression).expect("create shard");
            for k in s * per_shard..((s + 1) * per_shard).min(records) {
                w.write_record(&example(k)).expect("write record");
            }
            w.finish().expect("finish shard")
        })
        .collect()
}

fn pattern(dir: &Path, compression: Compression) -> String {
    dir.join(format!("mnist-*.tfrecord{}", compression.suffix()))
        .display()
        .to_string()
}

fn records_pipeline(pattern: &str, par: Parallelism) -> Pipeline<Vec<Record>> {
    Pipeline::tfrecord_files([pattern])
        .expect("shards exist")
        .interleave_with(Interleave::new(4, 16).parallel(par))
        .shuffle(10_000, 42)
        .batch(256)
}

fn run_to_end<T: Send + 'static>(p: &Pipeline<T>) -> usize {
    let mut n = 0;
    for item in p.start().expect("start") {
        item.expect("no errors");
        n += 1;
    }
    n
}

fn bench(c: &mut Criterion) {
    let records: u64 = std::env::var("TFPIPE_BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500_000);
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = match std::env::var_os("TFPIPE_BENCH_DIR") {
        Some(kept) => {
            std::fs::create_dir_all(&kept).expect("TFPIPE_BENCH_DIR");
            PathBuf::from(kept)
        }
        None => temp.path().to_path_buf(),
    };
    let t = Instant::now();
    // GZIP compression of the generated shards costs about 50 s of CPU per
    // 500,000 records; the GZIP variant uses a fifth of the records.
    let gzip_records = records / 5;
    write_shards(dir.as_path(), records, Compression::None);
    write_shards(dir.as_path(), gzip_records, Compression::Gzip);
    eprintln!(
        "generated {records} + {gzip_records} (GZIP) records in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let schema =
        Schema::from_feature_texts(&["image_raw:uint8:784", "label:int64"]).expect("schema");
    let settings = [
        ("1", Parallelism::Fixed(1)),
        ("2", Parallelism::Fixed(2)),
        ("auto", Parallelism::Auto),
    ];
    for compression in [Compression::None, Compression::Gzip] {
        let pat = pattern(dir.as_path(), compression);
        let (name, records) = match compression {
            Compression::None => ("uncompressed", records),
            _ => ("gzip", gzip_records),
        };
        let mut group = c.benchmark_group(format!("read_shuffle_batch/{name}"));
        group.throughput(Throughput::Elements(records));
        group.sample_size(10);
        for (label, par) in settings {
            let p = records_pipeline(&pat, par).prefetch(2);
            group.bench_function(BenchmarkId::from_parameter(label), |b| {
                b.iter(|| run_to_end(&p))
            });
        }
        group.finish();
        {
            let mut group = c.benchmark_group(format!("read_shuffle_batch_parse/{name}"));
            group.throughput(Throughput::Elements(records));
            group.sample_size(10);
            for (label, par) in settings {
                let p = records_pipeline(&pat, par)
                    .parse_batches(schema.clone(), par)
                    .prefetch(2);
                group.bench_function(BenchmarkId::from_parameter(label), |b| {
                    b.iter(|| run_to_end(&p))
                });
            }
            group.finish();
        }
    }
    // Time to first batch, with the default 10,000 and a 100,000 buffer.
    let pat = pattern(dir.as_path(), Compression::None);
    let mut group = c.benchmark_group("first_batch");
    group.sample_size(10);
    for (label, buffer, early_start) in [
        ("10000", 10_000usize, false),
        ("100000", 100_000, false),
        ("100000-early-start", 100_000, true),
    ] {
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    let p = Pipeline::tfrecord_files([&pat])
                        .expect("shards exist")
                        .interleave(4, 16)
                        .shuffle_with(ShuffleOptions {
                            buffer_size: buffer,
                            seed: 1,
                            early_start,
                            ..ShuffleOptions::default()
                        })
                        .batch(256)
                        .parse_batches(schema.clone(), Parallelism::Auto)
                        .prefetch(2);
                    let mut it = p.start().expect("start");
                    it.next().expect("a batch").expect("no error");
                    total += t.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
