//! Batch parse of MNIST-like `tf.train.Example`s (784-byte `image_raw` read as
//! `uint8:28x28`, int64 `label`) in batches of 256, on one core: the schema-driven
//! decoder reusing a batch (`parse_into`), allocating a new one (`parse`), and
//! prost decoding into owned `Example` structs for comparison. Also a mixed batch
//! (the golden `examples.tfrecord`: scalars, var-length floats/ints/bytes).
//!
//! `cargo bench --bench parse -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use prost::Message;
use tfpipe::Batch;
use tfpipe::example::proto::{self, feature::Kind};
use tfpipe::example::{BatchParser, Example, Schema};
use tfpipe::tfrecord::{FileRecordReader, ReaderOptions};

const BATCH: usize = 256;

fn mnist_records() -> Vec<Vec<u8>> {
    // A fixed xorshift stream: image bytes look like noise, which is all the
    // decoder sees of them anyway.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..BATCH)
        .map(|i| {
            let image: Vec<u8> = (0..784).map(|_| next() as u8).collect();
            let feature = |kind| proto::Feature { kind: Some(kind) };
            Example {
                features: Some(proto::Features {
                    feature: [
                        (
                            "image_raw".to_string(),
                            feature(Kind::BytesList(proto::BytesList { value: vec![image] })),
                        ),
                        (
                            "label".to_string(),
                            feature(Kind::Int64List(proto::Int64List {
                                value: vec![(i % 10) as i64],
                            })),
                        ),
                    ]
                    .into(),
                }),
            }
            .encode_to_vec()
        })
        .collect()
}

fn mnist(c: &mut Criterion) {
    let records = mnist_records();
    let schema = Schema::from_feature_texts(&["image_raw:uint8:28x28", "label:int64"]).unwrap();
    let mut parser = BatchParser::new(schema).unwrap();
    let mut group = c.benchmark_group("mnist_batch256");
    group.throughput(Throughput::Elements(BATCH as u64));
    let mut batch = Batch::default();
    group.bench_function("parse_into", |b| {
        b.iter(|| {
            parser.parse_into(black_box(&records), &mut batch).unwrap();
            black_box(&batch);
        })
    });
    group.bench_function("parse", |b| {
        b.iter(|| black_box(parser.parse(black_box(&records)).unwrap()))
    });
    group.bench_function("prost_owned_examples", |b| {
        b.iter(|| {
            let examples: Vec<Example> = black_box(&records)
                .iter()
                .map(|r| Example::decode(&r[..]).unwrap())
                .collect();
            black_box(examples)
        })
    });
    group.finish();
}

fn golden_mixed(c: &mut Criterion) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/tf-golden/examples.tfrecord"
    );
    let mut reader = FileRecordReader::open(path, ReaderOptions::default()).unwrap();
    let mut records = Vec::new();
    let mut record = Vec::new();
    while reader.read_record(&mut record).unwrap() {
        records.push(record.clone());
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
    ])
    .unwrap();
    let mut parser = BatchParser::new(schema).unwrap();
    let mut group = c.benchmark_group("golden_mixed_batch50");
    group.throughput(Throughput::Elements(records.len() as u64));
    let mut batch = Batch::default();
    group.bench_function("parse_into", |b| {
        b.iter(|| {
            parser.parse_into(black_box(&records), &mut batch).unwrap();
            black_box(&batch);
        })
    });
    group.bench_function("prost_owned_examples", |b| {
        b.iter(|| {
            let examples: Vec<Example> = black_box(&records)
                .iter()
                .map(|r| Example::decode(&r[..]).unwrap())
                .collect();
            black_box(examples)
        })
    });
    group.finish();
}

criterion_group!(benches, mnist, golden_mixed);
criterion_main!(benches);
