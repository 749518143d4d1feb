//! `tfpipe bench-train`: the tfpipe side of `bench/keras_fit.py` (in the
//! shared folder beside the repository), with the same job and the same
//! measurements, so that the two JSON lines compare.
//!
//! The job, as in `keras_fit.py`: TFRecord files of `tf.train.Example`
//! with `image_raw` (784 raw bytes) and `label` (int64); shuffled in a
//! 10,000-example buffer, batched (256), parsed and prefetched; an MLP
//! 784-256-10 (ReLU, logits, softmax cross-entropy) trained with Adam at lr
//! 0.001 (no weight decay) for one epoch, pixels scaled to [0, 1].
//! `--model cnn` trains the LeNet-like CNN instead (`scripts/keras_cnn.py`
//! is its Keras side).
//!
//! The measurements, as in `keras_fit.py`: a clock read after every step
//! (Keras: `on_train_batch_end`); `ex_per_s` counts from the `fit` call to
//! the last step, `steady_ex_per_s` from the first step's end to the last,
//! `median_step_ms` is the median gap between consecutive steps after the
//! first 10. Beside them: the stall fraction, the compute threads, the
//! start-up breakdown and the load average, because on a shared machine
//! only a ratio taken in one minute means anything.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use anyhow::bail;
use tfpipe::Schema;
use tfpipe::pipeline::Parallelism;
use tfpipe::train::{
    InputSpec, ModelConfig, ModelKind, ModelRequest, OptimizerConfig, OptimizerKind, Placement,
    RunControl, RunLength, Task, TrainConfig, TrainData, Trainer, parse_device,
};

use super::Status;
use super::common::{check_model_size, set_compute_threads};

/// Arguments of `tfpipe bench-train`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TFRecord files or globs with `image_raw` (784 bytes) and `label` (int64).
    #[arg(required = true, num_args = 1..)]
    pub files: Vec<String>,
    /// Examples per batch.
    #[arg(long, default_value_t = 256)]
    pub batch_size: usize,
    /// Epochs to train.
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Stop after this many steps (a quick look; the comparison runs whole epochs).
    #[arg(long)]
    pub steps: Option<u64>,
    /// mlp (784-256-10, as keras_fit.py) or cnn (LeNet-like, as scripts/keras_cnn.py).
    #[arg(long, default_value = "mlp")]
    pub model: String,
    /// The optimizer: adam (keras_fit.py's), adamw or sgd; no weight decay.
    #[arg(long, default_value = "adam")]
    pub optimizer: String,
    #[command(flatten)]
    pub runtime: super::RuntimeFlags,
}

/// Runs `tfpipe bench-train`: prints one JSON line.
pub fn run(args: Args) -> anyhow::Result<Status> {
    let threads = set_compute_threads(args.runtime.compute_threads)?;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    // Device init (on CUDA: the context, cuBLAS and the kernel modules' handles).
    let init = Instant::now();
    let device = parse_device(&args.runtime.device)?;
    let device_init = init.elapsed();
    let mut schema = Schema::from_feature_texts(&["image_raw:uint8:784", "label:int64"])?;
    schema.label = Some("label".into());
    let selection = InputSpec::from_schema(&schema, Task::Classification { classes: 10 })?;
    let kind = args.model.parse::<ModelKind>()?;
    if kind == ModelKind::Embedding {
        bail!("--model {kind}: bench-train's MNIST-like data has no token ids (mlp or cnn)");
    }
    let request = ModelRequest {
        kind: Some(kind),
        ..ModelRequest::default()
    };
    let model = ModelConfig::for_input(&selection.spec, &request, None)?.config;
    // Refused before any allocation: `--batch-size 1e12` used to abort.
    check_model_size(&model, &selection.spec, args.batch_size, 2)?;
    let kind: OptimizerKind = args.optimizer.parse()?;
    let optimizer = OptimizerConfig {
        weight_decay: 0.0,
        ..OptimizerConfig::default_for(kind)
    };
    let config = TrainConfig::new(selection.spec)
        .length(RunLength::new().epochs(args.epochs).steps(args.steps))
        .placement(Placement::new().device(device))
        .control(RunControl::new().origin(super::process_start()));
    let data = TrainData {
        files: args.files.clone(),
        schema: selection.schema,
        batch_size: args.batch_size,
        shuffle_buffer: 10_000,
        seed: 1,
        parallelism: Parallelism::Auto,
        rank: None,
        label_classes: None,
        sequences: Default::default(),
        padding: Default::default(),
        reader: tfpipe::tfrecord::ReaderOptions::default(),
        weights: Vec::new(),
        partition_features: Vec::new(),
        missing_labels: Default::default(),
    };
    // `builtin` times the weights' upload itself (the report's device start-up).
    let mut trainer = Trainer::builtin(config, model, optimizer)?;
    trainer.record_device_init(device_init);
    let stamps = Rc::new(RefCell::new(Vec::<Instant>::with_capacity(4096)));
    let seen = Rc::clone(&stamps);
    trainer.on_progress(move |_| seen.borrow_mut().push(Instant::now()));
    if let Some(tuner) = threads.tuner() {
        trainer.observe(tuner);
    }
    let fit_start = Instant::now();
    let report = trainer.fit(|epoch| data.open(epoch), None)?;
    let stamps = stamps.borrow();
    let (Some(first), Some(last)) = (stamps.first(), stamps.last()) else {
        bail!("no steps ran");
    };
    let mut gaps: Vec<f64> = stamps
        .windows(2)
        .skip(9)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .collect();
    gaps.sort_by(f64::total_cmp);
    let median = gaps.get(gaps.len() / 2).copied().unwrap_or(f64::NAN);
    let examples = report.examples as f64;
    let first_rows = args.batch_size.min(report.examples as usize) as f64;
    let line = serde_json::json!({
        "ex_per_s": examples / (*last - fit_start).as_secs_f64().max(1e-9),
        "steady_ex_per_s": (examples - first_rows) / (*last - *first).as_secs_f64().max(1e-9),
        "median_step_ms": median,
        "fit_to_first_step_s": (*first - fit_start).as_secs_f64(),
        "steps": report.steps,
        "examples": report.examples,
        "stall_fraction": report.stall_fraction,
        "compute_step_ms_p50": report.compute_ms.p50,
        "compute_threads": if threads.tune { tfpipe::train::ops::compute_threads() } else { threads.threads },
        "compute_threads_tuned": threads.tune,
        // candle's elementwise pool, the calling thread included.
        "candle_pool_threads": candle_core::utils::barrier_pool().n_workers() + 1,
        "optimizer": report.optimizer,
        "model": report.model,
        "device": report.device,
        "device_init_ms": report.device_startup_ms.device_init_ms,
        "model_build_ms": report.device_startup_ms.weights_upload_ms,
        "first_kernel_ms": report.device_startup_ms.first_kernel_ms,
        "startup_ms": report.startup_ms,
        "first_step_ms": report.first_step_ms,
        "loss": report.epochs.last().map(|e| e.loss),
        "loadavg": load_average(),
    });
    println!("{line}");
    Ok(Status::Ok)
}

/// The 1-minute load average, when the system says it.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
