//! Images per second through tfpipe's parse stage: read ImageNet-style
//! TFRecords, batch by 64, then per record decode the JPEG, take a random
//! crop (`sample_distorted_bounding_box`), resize to 224x224, flip at random
//! and normalise to float32, in the parallel parse stage on N workers, from
//! the spec `image/encoded:image:224x224x3:random_crop,flip,imagenet`. The
//! tf.data side of the comparison is `scripts/tf_image_bench.py`, whose
//! `--write` makes the data (docs/benchmarks.md, "Image pipeline").
//!
//! ```sh
//! cargo run --release --no-default-features --features images --example image_pipeline -- '/tmp/imgbench/shard-*' 2 2 recycle
//! ```
//!
//! With `recycle` (the default) each batch is handed back through a
//! [`BatchRecycler`] once counted, and the parse stage's workers parse the
//! next batches into its 38.5 MB buffer; `fresh` parses each batch into a
//! new buffer, as a consumer that keeps its batches must. A fifth argument
//! `uint8` keeps the pixels as bytes (a quarter of the float32 batch; the
//! normalisation left to the model's first layer) instead of `imagenet`. A
//! sixth, `exact`, decodes every JPEG at full size instead of DCT-scaled
//! (`scaled`, the default of `random_crop`; docs/images.md, "DCT-scaled
//! decoding").
//!
//! Every random choice of record `i` of epoch `e` is drawn from
//! `element_seed(42, e, i)`: the same crops and flips whatever the worker
//! count (`Pipeline::parse_batches_seeded`).

use std::time::Instant;

use tfpipe::Schema;
use tfpipe::pipeline::{BatchRecycler, Event, Parallelism, Pipeline};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let pattern = args
        .get(1)
        .ok_or(
            "usage: image_pipeline GLOB [THREADS] [EPOCHS] [recycle|fresh] [imagenet|uint8] [scaled|exact]",
        )?
        .clone();
    let threads: usize = args.get(2).map_or(Ok(2), |t| t.parse())?;
    let epochs: u64 = args.get(3).map_or(Ok(2), |t| t.parse())?;
    let recycle = match args.get(4).map_or("recycle", String::as_str) {
        "recycle" => true,
        "fresh" => false,
        other => return Err(format!("expected recycle or fresh, not {other:?}").into()),
    };
    let output = match args.get(5).map_or("imagenet", String::as_str) {
        out @ ("imagenet" | "uint8") => out,
        other => return Err(format!("expected imagenet or uint8, not {other:?}").into()),
    };
    let scaling = match args.get(6).map_or("scaled", String::as_str) {
        "scaled" => "",
        "exact" => ",exact",
        other => return Err(format!("expected scaled or exact, not {other:?}").into()),
    };
    let schema = Schema::from_feature_texts(&[
        &format!("image/encoded:image:224x224x3:random_crop,flip,{output}{scaling}"),
        "image/class/label:int64",
    ])?;
    // Enough for every batch in flight: the workers' and prefetch's.
    let recycler = BatchRecycler::new(threads + 3);
    let records = Pipeline::tfrecord_files([pattern.as_str()])?
        .records()
        .batch(64);
    let parsed = if recycle {
        records.parse_batches_recycled(schema, Parallelism::Fixed(threads), 42, &recycler)
    } else {
        records.parse_batches_seeded(schema, Parallelism::Fixed(threads), 42)
    };
    let mut batches = parsed.prefetch(2).repeat(Some(epochs)).start()?;
    let (mut images, mut epoch) = (0, 0);
    let mut start = Instant::now();
    while let Some(event) = batches.next_event() {
        match event {
            Event::Item(batch) => {
                let batch = batch?;
                images += batch.num_rows;
                if recycle {
                    recycler.recycle(batch);
                }
            }
            Event::EpochEnd(_) => {
                let seconds = start.elapsed().as_secs_f64();
                println!(
                    "epoch {epoch}: {images} images in {seconds:.2} s: {:.0} images/s ({threads} threads, {}, {output})",
                    images as f64 / seconds,
                    if recycle { "recycled" } else { "fresh" }
                );
                (images, epoch, start) = (0, epoch + 1, Instant::now());
            }
        }
    }
    Ok(())
}
