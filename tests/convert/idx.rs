//! IDX: the bundled MNIST files read back pixel for pixel.

use std::io::Read;

use tfpipe::convert::{Format, IdxOptions, Sharding};
use tfpipe::example::{DType, Layout};

use super::common::*;

fn gunzip(path: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[test]
fn mnist_train_reads_back_pixel_for_pixel() {
    let dir = tempfile::tempdir().unwrap();
    let images = testdata("mnist/train-images-idx3-ubyte.gz");
    let summary = run(
        &Format::Idx(IdxOptions::default()),
        std::slice::from_ref(&images),
        dir.path(),
        |o| o.sharding = Sharding::Shards(4),
    )
    .unwrap();
    assert_eq!(summary.records, 8000);
    let (schema, meta) = load_schema(&summary);
    assert_eq!(schema.features[0].name, "image_raw");
    assert_eq!(schema.features[0].dtype, DType::Uint8);
    assert_eq!(schema.features[0].layout, Layout::Fixed(vec![28, 28]));
    assert_eq!(schema.features[1].name, "label");
    assert_eq!(schema.features[1].dtype, DType::Int64);
    assert_eq!(schema.label.as_deref(), Some("label"));
    assert_eq!(meta["source"]["label_counts"]["0"], 789);
    let pixels = gunzip(&images);
    let labels = gunzip(&testdata("mnist/train-labels-idx1-ubyte.gz"));
    for (i, row) in read_rows(&summary).iter().enumerate() {
        assert_eq!(
            row["image_raw"],
            Feat::B(vec![pixels[16 + i * 784..16 + (i + 1) * 784].to_vec()])
        );
        assert_eq!(row["label"], Feat::I(vec![i64::from(labels[8 + i])]));
    }
}

#[test]
fn mnist_as_float_with_explicit_labels() {
    let dir = tempfile::tempdir().unwrap();
    let images = testdata("mnist/test-images-idx3-ubyte.gz");
    let format = Format::Idx(IdxOptions {
        labels: Some(testdata("mnist/test-labels-idx1-ubyte.gz")),
        as_float: true,
        ..IdxOptions::default()
    });
    let summary = run(&format, std::slice::from_ref(&images), dir.path(), |_| {}).unwrap();
    assert_eq!(summary.records, 2000);
    let (schema, _) = load_schema(&summary);
    assert_eq!(schema.features[0].dtype, DType::Float32);
    let pixels = gunzip(&images);
    let rows = read_rows(&summary);
    for i in [0, 1, 1999] {
        let expected: Vec<f32> = pixels[16 + i * 784..16 + (i + 1) * 784]
            .iter()
            .map(|&p| f32::from(p) / 255.0)
            .collect();
        assert_eq!(rows[i]["image_raw"], Feat::F(expected));
    }
}

#[test]
fn mnist_output_is_byte_identical_for_any_thread_count() {
    let images = testdata("mnist/train-images-idx3-ubyte.gz");
    let mut outputs = Vec::new();
    for threads in [1, 2, 5] {
        let dir = tempfile::tempdir().unwrap();
        let summary = run(
            &Format::Idx(IdxOptions::default()),
            std::slice::from_ref(&images),
            dir.path(),
            |o| {
                o.threads = threads;
                o.sharding = Sharding::RecordsPerShard(3000);
            },
        )
        .unwrap();
        assert_eq!(summary.shards.len(), 3);
        outputs.push(shard_bytes(&summary));
    }
    assert!(outputs.iter().all(|o| o == &outputs[0]));
}
