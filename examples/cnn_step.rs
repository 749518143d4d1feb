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

use std::time::Instant;

use tfpipe::batch::{Batch, Column, Values};
use tfpipe::example::{DType, FeatureSpec, Layout, Schema};
use tfpipe::train::candle_core::Device;
use tfpipe::train::{
    ImageShape, InputSpec, ModelConfig, OptimizerConfig, OptimizerKind, Task, TrainConfig, Trainer,
    batch_to_tensors,
};

/// Steps left out of the statistics: the first ones pay for allocation.
const WARM_UP: usize = 10;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    keep_large_buffers();
    candle_pool_off();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let image = parse_shape(args.first().map_or("64x64x3", String::as_str))?;
    let rows: usize = args.get(1).map_or(Ok(64), |s| s.parse())?;
    let steps: usize = args.get(2).map_or(Ok(100), |s| s.parse())?;
    let classes: usize = args.get(3).map_or(Ok(9), |s| s.parse())?;
    if rows == 0 || steps == 0 || classes < 2 {
        return Err("BATCH and STEPS must be positive and CLASSES at least 2".into());
    }

    let schema = schema(image);
    let input = InputSpec::from_schema(&schema, Task::Classification { classes })?.spec;
    let batch = random_batch(image, rows, classes, 7);
    let tensors = batch_to_tensors(batch, &input, 0, &Device::Cpu)?;
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
            cpu_start = process_cpu_seconds();
        }
        let start = Instant::now();
        loss = trainer.step(&tensors)?;
        if step >= WARM_UP {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let cpu_per_image_ms = (process_cpu_seconds() - cpu_start) * 1e3 / (steps * rows) as f64;
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

/// What `tfpipe train` does first (`keep_large_buffers` in
/// src/cli/common.rs): buffers under 64 MB come from malloc's heap rather
/// than fresh mappings that every step would fault in again.
fn keep_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called first thing
    // in main, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }
}

/// What `tfpipe train` does too (`set_compute_threads` in
/// src/cli/common.rs): candle's own elementwise pool, whose threads wait by
/// spinning, gets only the caller, unless `CANDLE_NUM_THREADS` is set. With
/// it on, its spinning thread took 7% of the CPU of a 64x64x3 step here.
fn candle_pool_off() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: no other thread exists yet (first thing in main).
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
}

fn parse_shape(text: &str) -> Result<ImageShape, String> {
    let sides: Vec<usize> = text
        .split('x')
        .map(|s| s.parse().map_err(|_| format!("not HxWxC: {text:?}")))
        .collect::<Result<_, _>>()?;
    match sides[..] {
        [h, w, c] => Ok(ImageShape::new(h, w, c)),
        _ => Err(format!("not HxWxC: {text:?}")),
    }
}

fn schema(image: ImageShape) -> Schema {
    let fixed = |name: &str, dtype, shape| FeatureSpec {
        name: name.into(),
        dtype,
        layout: Layout::Fixed(shape),
        default: None,
        image: None,
    };
    Schema {
        features: vec![
            fixed(
                "image",
                DType::Uint8,
                vec![image.height, image.width, image.channels],
            ),
            fixed("label", DType::Int64, vec![]),
        ],
        label: Some("label".into()),
    }
}

/// Pixels and labels from a xorshift generator: the step's cost does not
/// depend on the values.
fn random_batch(image: ImageShape, rows: usize, classes: usize, seed: u64) -> Batch {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let pixels = image.height * image.width * image.channels;
    let image_values: Vec<u8> = (0..rows * pixels).map(|_| next() as u8).collect();
    let labels: Vec<i64> = (0..rows)
        .map(|_| (next() % classes as u64) as i64)
        .collect();
    Batch {
        num_rows: rows,
        columns: vec![
            Column {
                name: "image".into(),
                values: Values::Uint8(image_values),
                row_splits: vec![],
                inner_shape: vec![image.height, image.width, image.channels],
            },
            Column {
                name: "label".into(),
                values: Values::Int64(labels),
                row_splits: vec![],
                inner_shape: vec![],
            },
        ],
    }
}

/// User + system CPU seconds of this process, from `/proc/self/stat`
/// (0 where that file is missing, so only the CPU figure is lost).
fn process_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start at ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|s| s.parse::<f64>().ok());
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    match (ticks(11), ticks(12)) {
        // In USER_HZ ticks, 100 a second on Linux.
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => 0.0,
    }
}
