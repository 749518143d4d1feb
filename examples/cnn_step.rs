//! Times the built-in CNN's training step (forward, loss, backward, Adam) on
//! a batch held in memory, at any image size: the model side of a
//! comparison with Keras, without the input pipeline. The Keras side is
//! `scripts/keras_cnn_step.py`, which takes the same arguments.
//!
//! ```text
//! cargo run --release --example cnn_step -- [HxWxC] [BATCH] [STEPS] [CLASSES]
//! cargo run --release --example cnn_step -- 64x64x3 64 100 9
//! ```
//!
//! Prints one JSON line: the median and 10th/90th percentile step in ms
//! (the first 10 steps left out), and the process's CPU time per image over
//! the timed steps. `RAYON_NUM_THREADS` sets the compute threads, as
//! `--compute-threads` does for `tfpipe train`; malloc's thresholds and
//! candle's elementwise pool are set as `tfpipe train` sets them.

#[path = "common/cpu.rs"]
mod cpu;
#[path = "common/train_env.rs"]
mod train_env;

use std::time::Instant;

use tfpipe::example::{Layout, Schema};
use tfpipe::train::candle_core::{Device, Tensor};
use tfpipe::train::{
    BatchTensors, ImageShape, InputSpec, ModelConfig, OptimizerConfig, OptimizerKind, Task,
    TrainConfig, Trainer,
};

/// Steps left out of the statistics: the first ones pay for allocation.
const WARM_UP: usize = 10;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    train_env::keep_large_buffers();
    train_env::candle_pool_off();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let shape = args.first().map_or("64x64x3", String::as_str);
    let rows: usize = args.get(1).map_or(Ok(64), |s| s.parse())?;
    let steps: usize = args.get(2).map_or(Ok(100), |s| s.parse())?;
    let classes: usize = args.get(3).map_or(Ok(9), |s| s.parse())?;
    if rows == 0 || steps == 0 || classes < 2 {
        return Err("BATCH and STEPS must be positive and CLASSES at least 2".into());
    }

    // The schema `tfpipe train --feature image:uint8:HxWxC --feature
    // label:int64` would make, parsed by the same feature specs.
    let mut schema =
        Schema::from_feature_texts(&[format!("image:uint8:{shape}"), "label:int64".into()])?;
    schema.label = Some("label".into());
    let image = match &schema.features[0].layout {
        Layout::Fixed(sides) if sides.len() == 3 => ImageShape::new(sides[0], sides[1], sides[2]),
        _ => return Err(format!("not HxWxC: {shape:?}").into()),
    };
    let input = InputSpec::from_schema(&schema, Task::Classification { classes })?.spec;
    let tensors = batch_in_memory(image, rows, classes)?;
    let mut trainer = Trainer::builtin(
        TrainConfig::new(input),
        ModelConfig::cnn(classes, image),
        OptimizerConfig::default_for(OptimizerKind::Adam),
    )?;

    let mut times = Vec::with_capacity(steps);
    let mut cpu_start = 0.0;
    let mut loss = 0.0;
    for step in 0..WARM_UP + steps {
        if step == WARM_UP {
            cpu_start = cpu_total();
        }
        let start = Instant::now();
        loss = trainer.step(&tensors)?;
        if step >= WARM_UP {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let cpu_per_image_ms = (cpu_total() - cpu_start) * 1e3 / (steps * rows) as f64;
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "{{\"image\":\"{image}\",\"batch\":{rows},\"steps\":{steps},\"median_step_ms\":{:.3},\
         \"p10_step_ms\":{:.3},\"p90_step_ms\":{:.3},\"cpu_per_image_ms\":{cpu_per_image_ms:.4},\
         \"loss\":{loss:.4}}}",
        at(0.5),
        at(0.1),
        at(0.9)
    );
    Ok(())
}

/// One batch as the trainer takes it: pixels in 0..1 (what the uint8
/// feature becomes) and class ids in turn. The step's cost does not depend
/// on the values.
fn batch_in_memory(
    image: ImageShape,
    rows: usize,
    classes: usize,
) -> Result<BatchTensors, Box<dyn std::error::Error>> {
    let pixels = image.height * image.width * image.channels;
    let labels: Vec<u32> = (0..rows).map(|i| (i % classes) as u32).collect();
    Ok(BatchTensors {
        features: Tensor::rand(0f32, 1f32, (rows, pixels), &Device::Cpu)?,
        labels: Some(Tensor::from_vec(labels, rows, &Device::Cpu)?),
        tokens: None,
        mask: None,
        pool: None,
        rows,
    })
}

/// User + system CPU seconds of this process.
fn cpu_total() -> f64 {
    let (user, system) = cpu::cpu_seconds();
    user + system
}
