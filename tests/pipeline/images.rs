//! Image features in the pipeline: `NAME:image:HxWxC` decodes encoded
//! images in the parallel parse stage; a corrupt image is a located parse
//! error that `ignore_errors` skips and counts.

use prost::Message;
use tfpipe::example::proto::{BytesList, Example, Feature, Features, Int64List, feature::Kind};
use tfpipe::pipeline::{Parallelism, Pipeline};
use tfpipe::tfrecord::Compression;
use tfpipe::{DType, Schema};

use crate::common::{watchdog, write_shards};

fn example(image: Vec<u8>, label: i64) -> Vec<u8> {
    let bytes = Feature {
        kind: Some(Kind::BytesList(BytesList { value: vec![image] })),
    };
    let label = Feature {
        kind: Some(Kind::Int64List(Int64List { value: vec![label] })),
    };
    let feature = [("image".to_string(), bytes), ("label".to_string(), label)].into();
    Example {
        features: Some(Features { feature }),
    }
    .encode_to_vec()
}

/// The first MNIST digit of testdata/mnist, raw, and as the PNG TensorFlow wrote.
fn digit() -> (Vec<u8>, Vec<u8>) {
    use std::io::Read as _;
    let gz = std::fs::File::open("testdata/mnist/train-images-idx3-ubyte.gz").unwrap();
    let mut idx = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut idx)
        .unwrap();
    let png = std::fs::read("testdata/images/digit.png").unwrap();
    (idx[16..16 + 784].to_vec(), png)
}

#[test]
fn image_features_decode_in_the_parse_stage_and_bad_ones_are_located() {
    let (pixels, png) = digit();
    let bad = 3u64;
    let dir = tempfile::tempdir().unwrap();
    let paths = write_shards(dir.path(), 1, 8, Compression::None, |i| {
        let image = if i == bad {
            png[..png.len() / 2].to_vec()
        } else {
            png.clone()
        };
        example(image, i as i64)
    });
    let schema = Schema::from_feature_texts(&["image:image:28x28x1", "label:int64"]).unwrap();
    assert_eq!(schema.features[0].dtype, DType::Uint8);
    let pipeline = Pipeline::tfrecord_files([paths[0].display().to_string()])
        .unwrap()
        .records()
        .batch(8)
        .parse_batches(schema, Parallelism::Fixed(2));
    let items: Vec<_> = watchdog(20, {
        let pipeline = pipeline.clone();
        move || pipeline.start().unwrap().collect()
    });
    assert_eq!(items.len(), 2, "the error, then the batch of the others");
    let err = items[0].as_ref().unwrap_err();
    assert!(err.is_data_error());
    let location = err.location().expect("located");
    assert_eq!(location.record, bad);
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "stage parse: {}: record 3 at byte ",
            paths[0].display()
        )) && text.contains("feature \"image\": cannot decode the image: corrupt PNG"),
        "{text}"
    );
    let batch = items[1].as_ref().unwrap();
    assert_eq!(batch.num_rows, 7);
    let column = batch.column("image").unwrap();
    assert_eq!(column.inner_shape, [28, 28, 1]);
    let values = column.as_u8().unwrap();
    for row in values.chunks_exact(784) {
        assert_eq!(row, &pixels[..], "the PNG decodes to the digit's pixels");
    }

    let (rows, skipped) = watchdog(20, move || {
        let mut it = pipeline.ignore_errors().start().unwrap();
        let rows: usize = it.by_ref().map(|b| b.unwrap().num_rows).sum();
        (rows, it.metrics().stage("ignore_errors").unwrap().skipped)
    });
    assert_eq!((rows, skipped), (7, 1));
}

#[test]
fn a_normalised_nchw_image_feature_is_float32() {
    let (pixels, png) = digit();
    let schema = Schema::from_feature_texts(&["image:image:14x14x1:area,float32,nchw"]).unwrap();
    assert_eq!(schema.features[0].dtype, DType::Float32);
    let mut parser = tfpipe::BatchParser::new(schema).unwrap();
    let batch = parser.parse(&[example(png, 0)]).unwrap();
    let values = batch.columns[0].as_f32().unwrap();
    assert_eq!(batch.columns[0].inner_shape, [1, 14, 14]);
    // Area halving averages each 2x2 block.
    let block = |r: usize, c: usize| {
        [(0, 0), (0, 1), (1, 0), (1, 1)]
            .iter()
            .map(|(dr, dc)| f32::from(pixels[(2 * r + dr) * 28 + 2 * c + dc]))
            .sum::<f32>()
            / 4.0
            / 255.0
    };
    for r in 0..14 {
        for c in 0..14 {
            assert!((values[r * 14 + c] - block(r, c)).abs() < 1e-5);
        }
    }
}

/// One event of a run: a batch's image values, or an epoch's end.
#[derive(Debug, PartialEq)]
enum Seen {
    Images(Vec<u8>),
    End(u64),
}

fn seen(it: &mut tfpipe::pipeline::PipelineIter<tfpipe::Batch>, n: Option<usize>) -> Vec<Seen> {
    let mut out = Vec::new();
    while n.is_none_or(|n| out.len() < n) {
        match it.next_event() {
            Some(tfpipe::pipeline::Event::Item(batch)) => {
                let batch = batch.unwrap();
                out.push(Seen::Images(batch.columns[0].as_u8().unwrap().to_vec()));
            }
            Some(tfpipe::pipeline::Event::EpochEnd(e)) => out.push(Seen::End(e)),
            None => break,
        }
    }
    out
}

#[test]
fn random_image_options_draw_from_seed_epoch_and_position_and_resume_exactly() {
    use tfpipe::pipeline::PipelineState;
    let jpeg = std::fs::read("testdata/images/china_q90.jpg").unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 2, 5, Compression::None, |i| {
        example(jpeg.clone(), i as i64)
    });
    let pattern = dir.path().join("part-*").display().to_string();
    let spec =
        "image:image:6x6x3:random_crop,flip,brightness(0.2),contrast(0.8,1.2),saturation(0.5,1.5)";
    let schema = Schema::from_feature_texts(&[spec, "label:int64"]).unwrap();
    let pipeline = move |workers: usize, seed: u64| {
        Pipeline::tfrecord_files([pattern.as_str()])
            .unwrap()
            .records()
            .batch(3)
            .parse_batches_seeded(schema.clone(), Parallelism::Fixed(workers), seed)
            .prefetch(2)
            .repeat(Some(2))
    };
    watchdog(60, move || {
        let full = seen(&mut pipeline(1, 9).start().unwrap(), None);
        // 10 records in batches of 3, 3, 3, 1 (two files, in order), twice.
        assert_eq!(full.len(), 10);
        assert_eq!(full, seen(&mut pipeline(3, 9).start().unwrap(), None));
        assert_ne!(full, seen(&mut pipeline(1, 10).start().unwrap(), None));
        let Seen::Images(first) = &full[0] else {
            panic!("{:?}", full[0])
        };
        let image = |batch: &[u8], i: usize| batch[i * 108..(i + 1) * 108].to_vec();
        // The same JPEG in every record, drawn differently per position and epoch.
        assert_ne!(image(first, 0), image(first, 1));
        assert_eq!(full[4], Seen::End(0));
        assert_ne!(full[5], full[0], "epoch 1 draws anew");
        for cut in 0..=full.len() {
            let mut it = pipeline(2, 9).start().unwrap();
            let head = seen(&mut it, Some(cut));
            assert_eq!(head, full[..cut]);
            let json = it.state().unwrap().to_json();
            drop(it);
            let state = PipelineState::from_json(&json).unwrap();
            let mut resumed = pipeline(2, 9).start_from(&state).unwrap();
            assert_eq!(seen(&mut resumed, None), full[cut..], "cut at {cut}");
        }
    });
}

/// `parse_batches_recycled` parses into the batches the consumer hands
/// back (each marked here by a capacity no fresh batch has), poisoned with
/// NaNs or of another schema, and still yields exactly the batches of
/// `parse_batches_seeded`, in order; the recycler never holds more than
/// its capacity.
#[test]
fn recycled_batches_are_reused_and_change_nothing() {
    use tfpipe::Batch;
    use tfpipe::batch::Values;
    use tfpipe::pipeline::BatchRecycler;
    let (_, png) = digit();
    let dir = tempfile::tempdir().unwrap();
    let paths = write_shards(dir.path(), 1, 48, Compression::None, |i| {
        example(png.clone(), i as i64)
    });
    let schema = Schema::from_feature_texts(&[
        "image:image:20x20x1:random_crop,flip,float32",
        "label:int64",
    ])
    .unwrap();
    let source = || {
        Pipeline::tfrecord_files([paths[0].display().to_string()])
            .unwrap()
            .records()
            .batch(4)
    };
    let fresh: Vec<Batch> = watchdog(20, {
        let pipeline = source().parse_batches_seeded(schema.clone(), Parallelism::Fixed(2), 9);
        move || pipeline.start().unwrap().map(Result::unwrap).collect()
    });
    let recycler = BatchRecycler::new(2);
    let pipeline = source().parse_batches_recycled(schema, Parallelism::Fixed(2), 9, &recycler);
    let (recycled, marked) = watchdog(20, move || {
        let (mut batches, mut marked) = (Vec::new(), Vec::new());
        for (i, batch) in pipeline.start().unwrap().enumerate() {
            let batch = batch.unwrap();
            let Values::Float32(v) = &batch.columns[0].values else {
                panic!("float32 images")
            };
            marked.push(v.capacity());
            batches.push(batch.clone());
            let mut given = batch;
            if i == 3 {
                // A batch of another schema is rebuilt, not misread.
                given = tfpipe::BatchParser::new(Schema::from_feature_texts(&["x:int64"]).unwrap())
                    .unwrap()
                    .empty_batch();
            } else if let Values::Float32(v) = &mut given.columns[0].values {
                v.iter_mut().for_each(|x| *x = f32::NAN);
                v.reserve_exact(10_000 + i);
            }
            recycler.recycle(given);
            assert!(recycler.held() <= 2);
        }
        (batches, marked)
    });
    assert_eq!(recycled, fresh);
    let reused = marked.iter().filter(|&&c| c >= 10_000).count();
    assert!(reused > 0, "no batch reused a recycled buffer: {marked:?}");
}
