//! The training loop: [`Trainer::fit`] and evaluation.
//!
//! Each step is timed in three phases: data wait (blocked on the next
//! batch), copy (batch to device tensors; overlapped on the prefetch thread
//! unless `prefetch` is 0) and compute (forward, backward, optimizer update,
//! then `device.synchronize()` before the clock is read). The first batch's
//! wait is start-up (it includes the pipeline's own start-up) and is reported
//! in the start-up breakdown, not in the data wait or the stall fraction.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::{D, Device, Tensor};
use candle_nn::VarMap;

use super::TrainError;
use super::checkpoint::{
    BackgroundLoad, Checkpoint, CheckpointLoad, CheckpointMeta, FORMAT, SchemaMeta,
};
use super::model::{Model, ModelConfig};
use super::optim::{Optim, OptimizerConfig, OptimizerKind};
use super::prefetch::{BatchStream, BoxError, DevicePrefetch, Fetched};
use super::report::{EpochReport, Startup, TrainReport, Verdict};
use super::tensor::{BatchTensors, InputSpec, SkippedFeature, Standardize, batch_to_tensors};
use super::tensorboard::EventWriter;
use super::timing::Phase;

/// Parses `cpu`, `cuda` or `cuda:N` into a candle device.
///
/// Without the `cuda` cargo feature, `cuda` fails with a message that names it.
///
/// ```
/// assert!(tfpipe::train::parse_device("cpu").unwrap().is_cpu());
/// # #[cfg(not(feature = "cuda"))]
/// assert!(tfpipe::train::parse_device("cuda").unwrap_err().to_string().contains("`cuda` feature"));
/// ```
pub fn parse_device(name: &str) -> Result<Device, TrainError> {
    let name = name.trim().to_ascii_lowercase();
    if name == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match name.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| {
                TrainError::Device(format!(
                    "unknown device {name:?} (expected cpu, cuda or cuda:N)"
                ))
            })?,
        None => {
            return Err(TrainError::Device(format!(
                "unknown device {name:?} (expected cpu, cuda or cuda:N)"
            )));
        }
    };
    cuda_device(ordinal)
}

#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize) -> Result<Device, TrainError> {
    Device::new_cuda(ordinal).map_err(|e| TrainError::Device(format!("cuda:{ordinal}: {e}")))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(ordinal: usize) -> Result<Device, TrainError> {
    Err(TrainError::Device(format!(
        "--device cuda:{ordinal}: this tfpipe was built without the `cuda` feature; rebuild with `cargo build --release --features cuda` (needs a CUDA toolkit)"
    )))
}

/// A device's name as reports print it.
pub(crate) fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// What a training run does.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// The model (must match the checkpoint's when resuming).
    pub model: ModelConfig,
    /// The optimizer.
    pub optimizer: OptimizerConfig,
    /// Which columns feed the model. When its `standardize` is empty, `fit`
    /// fills it from the first training batch (or, resuming, from the
    /// checkpoint).
    pub input: InputSpec,
    /// Schema features the model does not take (from
    /// [`InputSpec::from_schema`]), listed in the report.
    pub skipped_features: Vec<SkippedFeature>,
    /// The training data's schema, stored in checkpoints for `predict`.
    pub schema: Option<SchemaMeta>,
    /// Epochs in this run. With neither `epochs` nor `steps`: one epoch.
    pub epochs: Option<u64>,
    /// Steps in this run (across epochs; the last epoch may end early).
    pub steps: Option<u64>,
    /// Seeds the weight initialisation (and is stored in checkpoints).
    pub seed: u64,
    /// The device to train on.
    pub device: Device,
    /// Device-prefetch depth: batches converted ahead on the prefetch
    /// thread. 0 converts on the training thread (no overlap). By default 2.
    pub prefetch: usize,
    /// Continue from this checkpoint directory.
    pub resume: Option<PathBuf>,
    /// Write TensorBoard events here.
    pub logdir: Option<PathBuf>,
    /// Write per-step scalars every this many steps. By default 10.
    pub log_every: u64,
    /// Where start-up times count from: process start for the CLI. By
    /// default the moment the config was made.
    pub origin: Instant,
}

impl TrainConfig {
    /// A config with the defaults: one epoch, seed 0, CPU, prefetch 2.
    pub fn new(model: ModelConfig, optimizer: OptimizerConfig, input: InputSpec) -> TrainConfig {
        TrainConfig {
            model,
            optimizer,
            input,
            skipped_features: Vec::new(),
            schema: None,
            epochs: None,
            steps: None,
            seed: 0,
            device: Device::Cpu,
            prefetch: 2,
            resume: None,
            logdir: None,
            log_every: 10,
            origin: Instant::now(),
        }
    }
}

/// What the progress callback sees after each step.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// The global step.
    pub step: u64,
    /// Steps done in this run.
    pub run_steps: u64,
    /// The epoch.
    pub epoch: u64,
    /// This step's loss.
    pub loss: f32,
    /// Examples per second so far in this run.
    pub examples_per_sec: f64,
    /// Data wait over step time so far.
    pub stall_fraction: f64,
}

/// The progress callback.
type ProgressFn = dyn FnMut(&Progress);

/// The trained state.
struct State {
    model: Model,
    varmap: VarMap,
    optim: Optim,
    step: u64,
    epoch: u64,
}

/// Loss and accuracy over a data set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction classified correctly.
    pub accuracy: f64,
    /// Examples seen.
    pub examples: u64,
}

/// Trains a [`Model`] from [`BatchStream`]s and reports where the time went.
///
/// ```no_run
/// # use tfpipe::train::*;
/// use tfpipe::pipeline::{Parallelism, Pipeline};
///
/// // Each epoch reads the shards afresh, shuffled with that epoch's seed.
/// fn open_pipeline(epoch: u64) -> Result<Box<dyn BatchStream>, BoxError> {
///     let schema = tfpipe::Schema::from_feature_texts(&["image:uint8:784", "label:int64"])?;
///     let batches = Pipeline::tfrecord_files(["train-*.tfrecord"])?
///         .interleave(4, 16)
///         .shuffle(10_000, epoch)
///         .batch(256)
///         .parse_batches(schema, Parallelism::Auto)
///         .prefetch(2)
///         .start()?;
///     Ok(Box::new(batches))
/// }
///
/// let input = InputSpec { features: vec![("image".into(), 784)], label: Some("label".into()), classes: 10, standardize: vec![] };
/// let model = ModelConfig::Mlp { inputs: 784, hidden: vec![256], classes: 10 };
/// let mut config = TrainConfig::new(model, OptimizerConfig::default_for(OptimizerKind::AdamW), input);
/// config.epochs = Some(3);
/// let mut trainer = Trainer::new(config)?;
/// let report = trainer.fit(open_pipeline, None)?;
/// println!("{report}");
/// trainer.save("checkpoints/mnist")?;
/// # Ok::<(), TrainError>(())
/// ```
pub struct Trainer {
    config: TrainConfig,
    state: Option<State>,
    progress: Option<Box<ProgressFn>>,
}

/// The test-data opener `fit` takes.
pub type TestOpener<'a> = &'a mut dyn FnMut() -> Result<Box<dyn BatchStream>, BoxError>;

impl Trainer {
    /// Checks the config; builds nothing yet (the model is built in `fit`,
    /// overlapped with the pipeline's start-up, or by `prepare`).
    pub fn new(mut config: TrainConfig) -> Result<Trainer, TrainError> {
        config.model.validate()?;
        config.optimizer.validate()?;
        if config.model.inputs() != config.input.inputs() {
            return Err(TrainError::Config(format!(
                "{} takes {} inputs but the features give {}",
                config.model.describe(),
                config.model.inputs(),
                config.input.inputs()
            )));
        }
        if config.model.classes() != config.input.classes {
            return Err(TrainError::Config(format!(
                "{} has {} classes but the input spec says {}",
                config.model.describe(),
                config.model.classes(),
                config.input.classes
            )));
        }
        if config.epochs == Some(0) || config.steps == Some(0) {
            return Err(TrainError::Config(
                "nothing to do: 0 epochs or 0 steps".into(),
            ));
        }
        // Resuming: scale inputs as the checkpoint's model was trained
        // (its metadata is a small JSON file, read here; the weights load
        // in the background in `fit`).
        if let Some(dir) = &config.resume
            && config.input.standardize.is_empty()
        {
            let meta = Checkpoint::read_meta(dir)?;
            if meta.input.features == config.input.features {
                config.input.standardize = meta.input.standardize;
            }
        }
        Ok(Trainer {
            config,
            state: None,
            progress: None,
        })
    }

    /// Calls `f` after every step (the CLI draws its progress bar with it).
    pub fn on_progress(&mut self, f: impl FnMut(&Progress) + 'static) {
        self.progress = Some(Box::new(f));
    }

    /// The config.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The global step (0 before training; the checkpoint's after resuming).
    pub fn global_step(&self) -> u64 {
        self.state.as_ref().map_or(0, |s| s.step)
    }

    /// Completed epochs.
    pub fn epoch(&self) -> u64 {
        self.state.as_ref().map_or(0, |s| s.epoch)
    }

    /// The model, once built.
    pub fn model(&self) -> Option<&Model> {
        self.state.as_ref().map(|s| &s.model)
    }

    /// Builds (or loads, when resuming) the model now, on this thread.
    pub fn prepare(&mut self) -> Result<(), TrainError> {
        if self.state.is_none() {
            let checkpoint = build_model(&self.config)?;
            self.state = Some(self.state_from(checkpoint)?);
        }
        Ok(())
    }

    fn state_from(&self, c: Checkpoint) -> Result<State, TrainError> {
        let optim = Optim::new(&self.config.optimizer, c.varmap.all_vars())?;
        Ok(State {
            model: c.model,
            varmap: c.varmap,
            optim,
            step: c.meta.step,
            epoch: c.meta.epoch,
        })
    }

    /// The metadata a checkpoint of the current state holds.
    pub fn checkpoint_meta(&self) -> CheckpointMeta {
        CheckpointMeta {
            format: FORMAT.into(),
            step: self.global_step(),
            epoch: self.epoch(),
            model: self.config.model.clone(),
            optimizer: self.config.optimizer,
            input: self.config.input.clone(),
            schema: self.config.schema.clone(),
            seed: self.config.seed,
        }
    }

    /// Saves a checkpoint of the current state into `dir`.
    pub fn save(&self, dir: impl AsRef<std::path::Path>) -> Result<(), TrainError> {
        let state = self.state.as_ref().ok_or_else(|| {
            TrainError::Config("nothing to save: the model was never built".into())
        })?;
        Checkpoint::save(dir, &state.varmap, &self.checkpoint_meta())
    }

    /// One training step on tensors already on the device: returns the loss.
    /// (For feeding from memory, as the benchmarks do; `fit` uses the same code.)
    pub fn step(&mut self, batch: &BatchTensors) -> Result<f32, TrainError> {
        self.prepare()?;
        let device = self.config.device.clone();
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| TrainError::Config("no model".into()))?;
        let (loss, _) = train_step(state, batch, &device, state.step)?;
        state.step += 1;
        loss.to_scalar::<f32>()
            .map_err(TrainError::candle("reading the loss"))
    }

    /// Loss and accuracy of the current model over `stream`.
    pub fn evaluate(&mut self, stream: &mut dyn BatchStream) -> Result<Evaluation, TrainError> {
        self.prepare()?;
        let state = self
            .state
            .as_ref()
            .ok_or_else(|| TrainError::Config("no model".into()))?;
        evaluate(
            &state.model,
            stream,
            &self.config.input,
            &self.config.device,
        )
    }

    /// Trains for the configured epochs or steps. `train` opens the training
    /// data for an epoch (given the epoch number); `test`, if given, opens the
    /// test data, evaluated after every epoch.
    pub fn fit<S, F>(
        &mut self,
        mut train: F,
        mut test: Option<TestOpener<'_>>,
    ) -> Result<TrainReport, TrainError>
    where
        S: BatchStream + 'static,
        F: FnMut(u64) -> Result<S, BoxError>,
    {
        let fit_start = Instant::now();
        let origin = self.config.origin;
        let since_origin = |t: Instant| t.saturating_duration_since(origin).as_secs_f64() * 1e3;
        let device = self.config.device.clone();
        let mut events = match &self.config.logdir {
            Some(dir) => Some(EventWriter::create(dir)?),
            None => None,
        };

        // Build or load the model on a background thread while the
        // pipeline starts and produces its first batch.
        let mut loader = if self.state.is_none() {
            let config = self.config.clone();
            Some(BackgroundLoad::spawn(move || build_model(&config))?)
        } else {
            None
        };

        let mut data_wait = Phase::new();
        let mut copy = Phase::new();
        let mut compute = Phase::new();
        let mut steady = Phase::new();
        let mut startup = Startup::default();
        let mut first_step_ms = 0.0;
        let mut checkpoint_load = None;
        let mut eval_time = Duration::ZERO;
        let mut bottleneck: Option<String> = None;
        let mut epochs = Vec::new();
        let mut run_steps = 0u64;
        let mut run_examples = 0u64;
        let mut epochs_done = 0u64;
        let inline = self.config.prefetch == 0;
        let max_epochs = match (self.config.epochs, self.config.steps) {
            (None, None) => Some(1),
            (e, _) => e,
        };

        'epochs: loop {
            if max_epochs.is_some_and(|m| epochs_done >= m)
                || self.config.steps.is_some_and(|m| run_steps >= m)
            {
                break;
            }
            let epoch_start = Instant::now();
            let epoch = self.epoch();
            let stream = train(epoch).map_err(TrainError::Data)?;
            let built = Instant::now();
            if epochs_done == 0 {
                startup.pipeline_built = since_origin(built);
            }
            // The first batch's wait is start-up either way (see the
            // module doc), so taking it here costs the steps nothing.
            let stream = self.with_statistics(stream);
            let mut feeder = Feeder::new(stream, &self.config, run_steps, inline)?;
            let (mut ep_steps, mut ep_examples, mut ep_loss, mut ep_correct) =
                (0u64, 0u64, 0f64, 0u64);
            let (mut ep_wait, mut ep_busy) = (Duration::ZERO, Duration::ZERO);
            let mut window = (Instant::now(), run_examples);
            let mut ended = false;
            loop {
                if self.config.steps.is_some_and(|m| run_steps >= m) {
                    break;
                }
                let wait_start = Instant::now();
                let fetched = feeder.next(run_steps)?;
                let wait = wait_start.elapsed();
                let (tensors, batch_copy, stage) = match fetched {
                    Fetched::End { bottleneck: stage } => {
                        bottleneck = stage.or(bottleneck);
                        ended = true;
                        break;
                    }
                    Fetched::Batch {
                        tensors,
                        copy,
                        bottleneck: stage,
                    } => (tensors, copy, stage),
                };
                bottleneck = stage.or(bottleneck);
                let first = run_steps == 0;
                // Inline, the conversion ran inside `next`: it is copy, not wait.
                let wait = if inline {
                    wait.saturating_sub(batch_copy)
                } else {
                    wait
                };
                if first {
                    let arrived = Instant::now();
                    startup.first_batch = since_origin(arrived);
                    if let Some(l) = loader.take() {
                        let (checkpoint, load_start, load_end) = l.join()?;
                        if self.config.resume.is_some() {
                            // Both start with `fit`: the load on its thread,
                            // the pipeline's construction and first batch here.
                            checkpoint_load = Some(CheckpointLoad::between(
                                load_start, load_end, fit_start, arrived,
                            ));
                        }
                        self.state = Some(self.state_from(checkpoint)?);
                    }
                    startup.model_ready = since_origin(Instant::now());
                } else {
                    data_wait.record(wait);
                    ep_wait += wait;
                }
                copy.record(batch_copy);
                let state = self
                    .state
                    .as_mut()
                    .ok_or_else(|| TrainError::Config("no model".into()))?;
                let compute_start = Instant::now();
                let (loss, logits) = train_step(state, &tensors, &device, state.step)?;
                let busy = compute_start.elapsed();
                compute.record(busy);
                let step_busy = if inline { busy + batch_copy } else { busy };
                if first {
                    startup.first_step = since_origin(Instant::now());
                    first_step_ms = step_busy.as_secs_f64() * 1e3;
                } else {
                    steady.record(step_busy);
                    ep_busy += step_busy;
                }
                state.step += 1;
                run_steps += 1;
                ep_steps += 1;
                run_examples += tensors.rows as u64;
                ep_examples += tensors.rows as u64;
                // Outside the timed phases: reading the loss and counting hits.
                let loss = loss
                    .to_scalar::<f32>()
                    .map_err(TrainError::candle("reading the loss"))?;
                ep_loss += f64::from(loss);
                if let Some(labels) = &tensors.labels {
                    ep_correct += correct(&logits, labels)?;
                }
                let stall = stall_fraction(&data_wait, &copy, &compute, inline);
                let elapsed = fit_start.elapsed().as_secs_f64();
                if let Some(events) = events.as_mut() {
                    if state.step % self.config.log_every.max(1) == 0 {
                        let dt = window.0.elapsed().as_secs_f64();
                        let rate = (run_examples - window.1) as f64 / dt.max(1e-9);
                        window = (Instant::now(), run_examples);
                        events.scalars(
                            state.step,
                            &[
                                ("train/loss", loss),
                                ("train/examples_per_sec", rate as f32),
                                ("train/stall_fraction", stall as f32),
                            ],
                        )?;
                    }
                }
                if let Some(progress) = self.progress.as_mut() {
                    progress(&Progress {
                        step: state.step,
                        run_steps,
                        epoch,
                        loss,
                        examples_per_sec: run_examples as f64 / elapsed.max(1e-9),
                        stall_fraction: stall,
                    });
                }
            }
            drop(feeder);
            if ep_steps == 0 {
                if run_steps == 0 {
                    return Err(TrainError::Data(
                        "the training data produced no batches".into(),
                    ));
                }
                break 'epochs;
            }
            let eval_start = Instant::now();
            let evaluation = match test.as_mut() {
                Some(open) => {
                    let mut stream = open().map_err(TrainError::Data)?;
                    let state = self
                        .state
                        .as_ref()
                        .ok_or_else(|| TrainError::Config("no model".into()))?;
                    Some(evaluate(
                        &state.model,
                        stream.as_mut(),
                        &self.config.input,
                        &device,
                    )?)
                }
                None => None,
            };
            eval_time += eval_start.elapsed();
            let state = self
                .state
                .as_mut()
                .ok_or_else(|| TrainError::Config("no model".into()))?;
            if ended {
                state.epoch += 1;
            }
            let report = EpochReport {
                epoch,
                steps: ep_steps,
                examples: ep_examples,
                train_loss: ep_loss / ep_steps as f64,
                train_accuracy: ep_correct as f64 / ep_examples.max(1) as f64,
                stall_fraction: ratio(ep_wait, ep_wait + ep_busy),
                test_loss: evaluation.map(|e| e.loss),
                test_accuracy: evaluation.map(|e| e.accuracy),
                wall_ms: epoch_start.elapsed().as_secs_f64() * 1e3,
            };
            if let Some(events) = events.as_mut() {
                let mut scalars = vec![
                    ("epoch/train_loss", report.train_loss as f32),
                    ("epoch/train_accuracy", report.train_accuracy as f32),
                    ("epoch/stall_fraction", report.stall_fraction as f32),
                ];
                if let Some(e) = evaluation {
                    scalars.push(("epoch/test_loss", e.loss as f32));
                    scalars.push(("epoch/test_accuracy", e.accuracy as f32));
                }
                events.scalars(state.step, &scalars)?;
                events.flush()?;
            }
            epochs.push(report);
            epochs_done += 1;
        }
        if let Some(events) = events.as_mut() {
            events.flush()?;
        }

        let wall = fit_start.elapsed();
        let wall_ms = wall.as_secs_f64() * 1e3;
        let stall = stall_fraction(&data_wait, &copy, &compute, inline);
        let accounted = data_wait.total()
            + compute.total()
            + eval_time
            + if inline { copy.total() } else { Duration::ZERO };
        let last = epochs.last();
        Ok(TrainReport {
            model: self.config.model.describe(),
            optimizer: describe_optimizer(&self.config.optimizer),
            device: device_name(&device),
            examples: run_examples,
            steps: run_steps,
            global_step: self.global_step(),
            wall_ms,
            examples_per_sec: run_examples as f64 / wall.as_secs_f64().max(1e-9),
            stall_fraction: stall,
            verdict: Verdict::from_stall(stall),
            bottleneck_stage: bottleneck,
            data_wait_ms: data_wait.summary(),
            copy_ms: copy.summary(),
            copy_overlapped: !inline,
            compute_ms: compute.summary(),
            eval_ms: eval_time.as_secs_f64() * 1e3,
            other_ms: wall.saturating_sub(accounted).as_secs_f64() * 1e3,
            startup_ms: startup,
            first_step_ms,
            steady_step_ms_p50: steady.summary().p50,
            test_loss: last.and_then(|e| e.test_loss),
            test_accuracy: last.and_then(|e| e.test_accuracy),
            checkpoint_load,
            skipped_features: self.config.skipped_features.clone(),
            standardized: self
                .config
                .input
                .standardize
                .iter()
                .any(|s| !s.is_identity()),
            epochs,
        })
    }
}

impl Trainer {
    /// Fills `input.standardize` from `stream`'s first batch when it is
    /// still empty, and returns the stream with that batch put back.
    fn with_statistics<S: BatchStream>(&mut self, mut stream: S) -> Peeked<S> {
        if !self.config.input.standardize.is_empty() {
            return Peeked {
                first: None,
                rest: stream,
            };
        }
        let first = stream.next_batch();
        if let Some(Ok(batch)) = &first {
            self.config.input.standardize = Standardize::from_batch(batch, &self.config.input);
        }
        Peeked {
            first: Some(first),
            rest: stream,
        }
    }
}

/// A stream whose first item was taken out (to compute statistics) and is
/// handed out again first.
struct Peeked<S> {
    /// `Some(item)` until handed out; the item itself is `None` when the
    /// stream was empty.
    first: Option<Option<Result<crate::Batch, BoxError>>>,
    rest: S,
}

impl<S: BatchStream> BatchStream for Peeked<S> {
    fn next_batch(&mut self) -> Option<Result<crate::Batch, BoxError>> {
        match self.first.take() {
            Some(item) => item,
            None => self.rest.next_batch(),
        }
    }

    fn bottleneck_stage(&self) -> Option<String> {
        self.rest.bottleneck_stage()
    }
}

fn describe_optimizer(o: &OptimizerConfig) -> String {
    match o.kind {
        OptimizerKind::AdamW => format!("adamw lr={} wd={}", o.lr, o.weight_decay),
        OptimizerKind::AdamWFused => format!("adamw-fused lr={} wd={}", o.lr, o.weight_decay),
        OptimizerKind::Sgd => format!("sgd lr={}", o.lr),
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        0.0
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}

/// Data wait over step time (wait + compute, + copy when it is not overlapped).
fn stall_fraction(wait: &Phase, copy: &Phase, compute: &Phase, inline: bool) -> f64 {
    let copy = if inline { copy.total() } else { Duration::ZERO };
    ratio(wait.total(), wait.total() + copy + compute.total())
}

/// Builds the model: from the checkpoint when resuming, fresh otherwise.
fn build_model(config: &TrainConfig) -> Result<Checkpoint, TrainError> {
    match &config.resume {
        Some(dir) => {
            let c = Checkpoint::load(dir, &config.device)?;
            if c.meta.model != config.model {
                return Err(TrainError::Checkpoint {
                    path: dir.clone(),
                    reason: format!(
                        "holds {} but this run asks for {}",
                        c.meta.model.describe(),
                        config.model.describe()
                    ),
                });
            }
            if c.meta.input.inputs() != config.input.inputs() {
                return Err(TrainError::Checkpoint {
                    path: dir.clone(),
                    reason: format!(
                        "was trained on {} input values per example; this data has {}",
                        c.meta.input.inputs(),
                        config.input.inputs()
                    ),
                });
            }
            Ok(c)
        }
        None => {
            let (model, varmap) = Model::init(config.model.clone(), config.seed, &config.device)?;
            Ok(Checkpoint {
                meta: CheckpointMeta {
                    format: FORMAT.into(),
                    step: 0,
                    epoch: 0,
                    model: config.model.clone(),
                    optimizer: config.optimizer,
                    input: config.input.clone(),
                    schema: config.schema.clone(),
                    seed: config.seed,
                },
                model,
                varmap,
            })
        }
    }
}

/// Forward, loss, backward, update, synchronize. Returns (loss, logits).
fn train_step(
    state: &mut State,
    batch: &BatchTensors,
    device: &Device,
    step: u64,
) -> Result<(Tensor, Tensor), TrainError> {
    let labels = batch.labels.as_ref().ok_or_else(|| TrainError::Input {
        batch: step,
        reason: "no labels: training needs the label column".into(),
    })?;
    let err = TrainError::candle("training step");
    let logits = state.model.forward(&batch.features).map_err(err)?;
    let loss = candle_nn::loss::cross_entropy(&logits, labels)
        .map_err(TrainError::candle("training step"))?;
    state
        .optim
        .backward_step(&loss)
        .map_err(TrainError::candle("training step"))?;
    device
        .synchronize()
        .map_err(TrainError::candle("training step"))?;
    Ok((loss, logits))
}

/// The number of rows whose arg-max logit is the label.
pub(crate) fn correct(logits: &Tensor, labels: &Tensor) -> Result<u64, TrainError> {
    let err = TrainError::candle("counting correct predictions");
    let hits = logits
        .argmax(D::Minus1)
        .and_then(|p| p.eq(labels))
        .and_then(|h| h.to_dtype(candle_core::DType::U32))
        .and_then(|h| h.sum_all())
        .and_then(|s| s.to_scalar::<u32>())
        .map_err(err)?;
    Ok(u64::from(hits))
}

/// Loss and accuracy of `model` over `stream`.
pub(crate) fn evaluate(
    model: &Model,
    stream: &mut dyn BatchStream,
    input: &InputSpec,
    device: &Device,
) -> Result<Evaluation, TrainError> {
    let (mut loss_sum, mut hits, mut examples, mut index) = (0f64, 0u64, 0u64, 0u64);
    while let Some(batch) = stream.next_batch() {
        let tensors = batch_to_tensors(batch.map_err(TrainError::Data)?, input, index, device)?;
        index += 1;
        let labels = tensors.labels.as_ref().ok_or_else(|| TrainError::Input {
            batch: index - 1,
            reason: "no labels: evaluation needs the label column".into(),
        })?;
        let err = TrainError::candle("evaluation");
        let logits = model.forward(&tensors.features).map_err(err)?;
        let loss = candle_nn::loss::cross_entropy(&logits, labels)
            .and_then(|l| l.to_scalar::<f32>())
            .map_err(TrainError::candle("evaluation"))?;
        loss_sum += f64::from(loss) * tensors.rows as f64;
        hits += correct(&logits, labels)?;
        examples += tensors.rows as u64;
    }
    Ok(Evaluation {
        loss: if examples == 0 {
            f64::NAN
        } else {
            loss_sum / examples as f64
        },
        accuracy: if examples == 0 {
            f64::NAN
        } else {
            hits as f64 / examples as f64
        },
        examples,
    })
}

/// Feeds batches: through the device-prefetch thread, or inline.
enum Feeder {
    Thread(DevicePrefetch),
    Inline {
        stream: Box<dyn BatchStream>,
        input: InputSpec,
        device: Device,
        ended: bool,
    },
}

impl Feeder {
    fn new<S: BatchStream + 'static>(
        stream: S,
        config: &TrainConfig,
        first_index: u64,
        inline: bool,
    ) -> Result<Feeder, TrainError> {
        if inline {
            Ok(Feeder::Inline {
                stream: Box::new(stream),
                input: config.input.clone(),
                device: config.device.clone(),
                ended: false,
            })
        } else {
            Ok(Feeder::Thread(DevicePrefetch::spawn(
                stream,
                config.input.clone(),
                config.device.clone(),
                config.prefetch,
                first_index,
            )?))
        }
    }

    /// The next item.
    fn next(&mut self, index: u64) -> Result<Fetched, TrainError> {
        match self {
            Feeder::Thread(p) => p.recv(),
            Feeder::Inline {
                stream,
                input,
                device,
                ended,
            } => {
                if *ended {
                    return Ok(Fetched::End {
                        bottleneck: stream.bottleneck_stage(),
                    });
                }
                match stream.next_batch() {
                    None => {
                        *ended = true;
                        Ok(Fetched::End {
                            bottleneck: stream.bottleneck_stage(),
                        })
                    }
                    Some(Err(e)) => Err(TrainError::Data(e)),
                    Some(Ok(batch)) => {
                        let start = Instant::now();
                        let tensors = batch_to_tensors(batch, input, index, device)?;
                        device
                            .synchronize()
                            .map_err(TrainError::candle("host-to-device copy"))?;
                        Ok(Fetched::Batch {
                            tensors,
                            copy: start.elapsed(),
                            bottleneck: None,
                        })
                    }
                }
            }
        }
    }
}
