//! Images per second through tfpipe's parallel map: read ImageNet-style
//! TFRecords, then per record decode the JPEG, take a random crop
//! (`sample_distorted_bounding_box`), resize to 224x224, flip at random and
//! normalise to float32, on N worker threads, batched by 64. The tf.data side
//! of the comparison is `scripts/tf_image_bench.py`, whose `--write` makes the
//! data (docs/benchmarks.md, "Image pipeline").
//!
//! ```sh
//! cargo run --release --no-default-features --features images --example image_pipeline -- '/tmp/imgbench/shard-*' 2
//! ```
//!
//! Every random choice is drawn from `element_seed(seed, epoch, id)`, with
//! the record's file and index as its id: the same crops and flips whatever
//! the thread count.

use std::time::Instant;

use tfpipe::image::{
    Augment, Crop, ImageOptions, ImageWorker, OutputSlice, OutputType, RandomCrop, element_seed,
};
use tfpipe::pipeline::{MapOptions, Parallelism, Pipeline, Record};
use tfpipe::{BatchParser, Schema};

/// A stable id for a record: its file's path hashed (FNV-1a) with its index.
fn record_id(record: &Record) -> u64 {
    let Some(position) = record.position() else {
        return 0;
    };
    let path = position.path();
    let hash = path
        .to_string_lossy()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    hash ^ position.record()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let pattern = args
        .get(1)
        .ok_or("usage: image_pipeline GLOB [THREADS] [EPOCHS]")?
        .clone();
    let threads: usize = args.get(2).map_or(Ok(2), |t| t.parse())?;
    let epochs: u64 = args.get(3).map_or(Ok(2), |t| t.parse())?;
    let options = ImageOptions {
        crop: Crop::Random(RandomCrop::default()),
        augment: Augment {
            flip: true,
            ..Augment::default()
        },
        output: OutputType::IMAGENET,
        ..ImageOptions::new(224, 224, 3)
    };
    let schema = Schema::from_feature_texts(&["image/encoded:bytes", "image/class/label:int64"])?;
    let map = MapOptions {
        parallelism: Parallelism::Fixed(threads),
        deterministic: true,
    };
    for epoch in 0..epochs {
        let schema = schema.clone();
        let start = Instant::now();
        let batches = Pipeline::tfrecord_files([pattern.as_str()])?
            .records()
            .map_parallel_with(
                map,
                move || {
                    let parser = BatchParser::new(schema.clone()).expect("a valid schema");
                    let worker = ImageWorker::new(options).expect("valid options");
                    (parser, worker)
                },
                move |(parser, worker), record: Record| {
                    let batch = parser.parse_one(&record)?;
                    let bytes = batch.columns[0].bytes(0).unwrap_or_default();
                    let label = batch.columns[1].as_i64().map_or(0, |l| l[0]);
                    let mut pixels = vec![0f32; options.output_len()];
                    let seed = element_seed(42, epoch, record_id(&record));
                    worker.process(bytes, seed, OutputSlice::Float32(&mut pixels))?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>((pixels, label))
                },
            )
            .batch(64)
            .prefetch(2)
            .start()?;
        let mut images = 0;
        for batch in batches {
            images += batch?.len();
        }
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "epoch {epoch}: {images} images in {seconds:.2} s: {:.0} images/s ({threads} threads)",
            images as f64 / seconds
        );
    }
    Ok(())
}
