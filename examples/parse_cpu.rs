//! Batch-parse throughput per CPU-second of the measuring thread, for shared
//! machines where wall-clock benchmarks (`cargo bench --bench parse`) are noisy:
//! the time comes from `/proc/thread-self/schedstat` (Linux), so time spent
//! descheduled while other processes run is not counted.
//!
//! `cargo run --release --example parse_cpu` (run from the repository root).
//! Same workloads as `benches/parse.rs`: 256 MNIST-like Examples (784-byte
//! `image_raw` as `uint8:28x28`, int64 `label`) and the 50 golden Examples.

use std::hint::black_box;

use prost::Message;
use tfpipe::Batch;
use tfpipe::example::proto::{self, feature::Kind};
use tfpipe::example::{BatchParser, Example, Schema};
use tfpipe::tfrecord::{FileRecordReader, ReaderOptions};

/// Nanoseconds this thread has spent on a CPU.
fn cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("/proc/thread-self/schedstat (Linux only)");
    let first = stat.split_whitespace().next().unwrap_or("0");
    first.parse().unwrap_or(0)
}

/// Best of 5 runs of 0.4 CPU-seconds each, after a warm-up.
fn measure(name: &str, records: usize, mut f: impl FnMut()) {
    for _ in 0..200 {
        f();
    }
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = cpu_ns();
        let mut iterations = 0;
        while cpu_ns() - start < 400_000_000 {
            for _ in 0..50 {
                f();
            }
            iterations += 50;
        }
        best = best.min((cpu_ns() - start) as f64 / f64::from(iterations));
    }
    println!(
        "{name:32} {:7.2} M records per CPU-second",
        records as f64 / best * 1e3
    );
}

fn mnist_records() -> Vec<Vec<u8>> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let feature = |kind| proto::Feature { kind: Some(kind) };
    (0..256)
        .map(|i| {
            let image: Vec<u8> = (0..784).map(|_| next() as u8).collect();
            let label = proto::Int64List {
                value: vec![i % 10],
            };
            Example {
                features: Some(proto::Features {
                    feature: [
                        (
                            "image_raw".to_string(),
                            feature(Kind::BytesList(proto::BytesList { value: vec![image] })),
                        ),
                        ("label".to_string(), feature(Kind::Int64List(label))),
                    ]
                    .into(),
                }),
            }
            .encode_to_vec()
        })
        .collect()
}

fn prost_owned(records: &[Vec<u8>]) {
    let examples: Vec<Example> = records
        .iter()
        .map(|r| Example::decode(&r[..]).expect("valid Example"))
        .collect();
    black_box(examples);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut batch = Batch::default();

    let records = mnist_records();
    let schema = Schema::from_feature_texts(&["image_raw:uint8:28x28", "label:int64"])?;
    let mut parser = BatchParser::new(schema)?;
    measure("mnist256 parse_into", records.len(), || {
        parser
            .parse_into(black_box(&records), &mut batch)
            .expect("parses");
        black_box(&batch);
    });
    measure("mnist256 parse", records.len(), || {
        black_box(parser.parse(black_box(&records)).expect("parses"));
    });
    measure("mnist256 prost_owned_examples", records.len(), || {
        prost_owned(black_box(&records))
    });

    let path = "testdata/tf-golden/examples.tfrecord";
    let mut reader = FileRecordReader::open(path, ReaderOptions::default())?;
    let (mut golden, mut record) = (Vec::new(), Vec::new());
    while reader.read_record(&mut record)? {
        golden.push(record.clone());
    }
    let schema = Schema::from_feature_texts(&[
        "id:int64",
        "label:bytes=<none>",
        "score:float32=-1",
        "emb:float32:3=0",
        "flag:int64=-1",
        "tags:bytes:var",
        "counts:int64:var",
        "weights:float32:var",
    ])?;
    let mut parser = BatchParser::new(schema)?;
    measure("golden50 parse_into", golden.len(), || {
        parser
            .parse_into(black_box(&golden), &mut batch)
            .expect("parses");
        black_box(&batch);
    });
    measure("golden50 prost_owned_examples", golden.len(), || {
        prost_owned(black_box(&golden))
    });
    Ok(())
}
