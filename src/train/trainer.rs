//! The training loop: [`Trainer::fit`] and evaluation.
//!
//! Each step is timed in three phases: data wait (blocked on the next
//! batch), copy (batch to device tensors; overlapped on the prefetch thread
//! unless `prefetch` is 0) and compute (forward, backward, optimizer update,
//! then `device.synchronize()` before the clock is read). The first batch's
//! wait is start-up (it includes the pipeline's own start-up) and is reported
//! in the start-up breakdown, not in the data wait or the stall fraction.
//!
//! # Resume
//! A checkpoint holds the weights, the optimizer's state, the epoch, the
//! global step, the seed and, when the training stream can report one
//! ([`BatchStream::position`]; a pipeline's iterator state), the stream's
//! position after the last batch trained on. The position is captured now
//! and then (every 64 events and at each epoch marker, on the thread that
//! reads the stream)
//! and stored as that capture plus the number of events consumed since;
//! [`resume_pipeline`] restarts the pipeline at the capture and drops those
//! events, so the resumed run's first batch is the one the interrupted run
//! would have trained on next. A stream that cannot report its position
//! (or one read per epoch, which ends instead of marking epochs) resumes
//! at the start of the checkpoint's epoch.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use serde::{Deserialize, Serialize};

use super::TrainError;
use super::checkpoint::{Checkpoint, CheckpointLoad, CheckpointMeta, FORMAT};
use super::clock::{EpochClock, RunClock, ratio};
use super::config::{RunLength, TrainConfig};
use super::device::{device_name, first_kernel};
use super::feeder::Feeder;
use super::model::{Model, ModelConfig, Task};
use super::objective::{Evaluation, Totals, evaluate};
use super::observer::{Control, Observer, RunInfo};
use super::optim::TrainOptimizer;
use super::prefetch::{BatchEvent, BatchStream, BoxError, Fetched};
use super::report::{DeviceStartup, EpochReport, TrainReport, Verdict};
use super::tensor::{BatchTensors, Standardize};

/// What observers see after each step.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// The global step (after this step).
    pub step: u64,
    /// Steps done in this run.
    pub run_steps: u64,
    /// The epoch.
    pub epoch: u64,
    /// Steps done in this epoch.
    pub epoch_steps: u64,
    /// Examples done in this epoch.
    pub epoch_examples: u64,
    /// This step's loss.
    pub loss: f32,
    /// The learning rate this step used.
    pub learning_rate: f64,
    /// This step's examples.
    pub rows: usize,
    /// Examples per second so far in this run.
    pub examples_per_sec: f64,
    /// Data wait over step time so far.
    pub stall_fraction: f64,
}

/// The trained state: never absent once a [`Trainer`] exists.
pub(super) struct State {
    pub(super) model: Box<dyn Model>,
    pub(super) varmap: VarMap,
    pub(super) optim: Box<dyn TrainOptimizer + Send>,
    /// The built-in model's config (checkpoints store it so `predict` can
    /// rebuild the model); `None` for other models.
    pub(super) builtin: Option<ModelConfig>,
    /// Global step: optimizer updates applied.
    pub(super) step: u64,
    /// Completed epochs.
    pub(super) epoch: u64,
    /// Where the training stream stood after the last batch (or marker)
    /// trained on, when the stream can say: checkpoints keep it, so a
    /// resumed run continues at the next batch.
    pub(super) position: Option<StreamPosition>,
}

/// A stream's position as a checkpoint stores it: the last captured
/// position (`anchor`) and the events consumed after it (`skip`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StreamPosition {
    anchor: serde_json::Value,
    skip: u64,
}

impl StreamPosition {
    /// Follows one consumed event that came with `captured` (or not).
    fn advance(
        position: &mut Option<StreamPosition>,
        captured: Option<Result<serde_json::Value, String>>,
        warnings: &mut Vec<String>,
    ) {
        match captured {
            Some(Ok(anchor)) => *position = Some(StreamPosition { anchor, skip: 0 }),
            Some(Err(why)) => {
                if position.take().is_some() || warnings.iter().all(|w| !w.contains(&why)) {
                    warnings.push(format!(
                        "the training data cannot report its position ({why}): a run resumed from a checkpoint restarts its epoch"
                    ));
                }
            }
            None => {
                if let Some(p) = position.as_mut() {
                    p.skip += 1;
                }
            }
        }
    }
}

/// Trains any [`Model`] with any optimizer from [`BatchStream`]s, and
/// reports where the time went.
///
/// Two ways in: [`Trainer::builtin`] builds one of the built-in models
/// (MLP, CNN) and one of our optimizers from their configs;
/// [`Trainer::new`] takes a model of your own, its `VarMap` and any
/// optimizer ([`OptimizerConfig::build`](super::OptimizerConfig::build) for ours, [`Foreign`](super::Foreign)
/// around any `candle_nn::Optimizer`). Both train through the same `fit`.
///
/// ```no_run
/// # use tfpipe::train::*;
/// use tfpipe::pipeline::{Parallelism, Pipeline};
///
/// // One pipeline for the whole run: `repeat` marks each epoch's end and
/// // the shuffle reseeds itself per epoch (the pipeline's seed scheme).
/// fn open_pipeline(_first_epoch: u64) -> Result<Box<dyn BatchStream>, BoxError> {
///     let schema = tfpipe::Schema::from_feature_texts(&["image:uint8:784", "label:int64"])?;
///     let batches = Pipeline::tfrecord_files(["train-*.tfrecord"])?
///         .interleave(4, 16)
///         .shuffle(10_000, 0)
///         .repeat(None)
///         .batch(256)
///         .parse_batches(schema, Parallelism::Auto)
///         .prefetch(2)
///         .start()?;
///     Ok(Box::new(batches))
/// }
///
/// let task = Task::Classification { classes: 10 };
/// let input = InputSpec { features: vec![("image".into(), 784)], label: Some("label".into()), task, standardize: vec![], tokens: None, impute: None };
/// let model = ModelConfig::Mlp { inputs: 784, hidden: vec![256], classes: 10 };
/// let config = TrainConfig::new(input).length(RunLength::new().epochs(3));
/// let mut trainer = Trainer::builtin(config, model, OptimizerConfig::default_for(OptimizerKind::AdamW))?;
/// let report = trainer.fit(open_pipeline, None)?;
/// println!("{report}");
/// trainer.save("checkpoints/mnist")?;
/// # Ok::<(), TrainError>(())
/// ```
pub struct Trainer {
    pub(super) config: TrainConfig,
    pub(super) state: State,
    pub(super) observers: Vec<Box<dyn Observer>>,
    /// An observer stopped the last `fit` early.
    pub(super) stopped_early: bool,
    /// How the checkpoint load went, when resuming.
    pub(super) checkpoint_load: Option<CheckpointLoad>,
    /// Things the user should know (e.g. a foreign optimizer's state not restored).
    pub(super) warnings: Vec<String>,
    /// Device init, weights upload and first kernel, for the report.
    pub(super) device_startup: DeviceStartup,
    /// When the model was ready (the trainer made): start-up's `model_ready`.
    pub(super) ready_at: Instant,
}

/// The test-data opener `fit` takes.
pub type TestOpener<'a> = &'a mut dyn FnMut() -> Result<Box<dyn BatchStream>, BoxError>;

impl Trainer {
    /// Records how long creating the config's device took (the caller made it:
    /// on CUDA the context, cuBLAS and cuRAND handles), for the report's
    /// [`DeviceStartup::device_init_ms`].
    ///
    /// ```
    /// use std::time::Instant;
    /// use tfpipe::train::*;
    ///
    /// let start = Instant::now();
    /// let device = parse_device("cpu")?;
    /// let took = start.elapsed();
    /// let input = InputSpec { features: vec![("x".into(), 4)], label: Some("y".into()), task: Task::Classification { classes: 2 }, standardize: vec![], tokens: None, impute: None };
    /// let config = TrainConfig::new(input).placement(Placement::new().device(device));
    /// let model = ModelConfig::Mlp { inputs: 4, hidden: vec![8], classes: 2 };
    /// let mut trainer = Trainer::builtin(config, model, OptimizerConfig::default_for(OptimizerKind::Sgd))?;
    /// trainer.record_device_init(took);
    /// # Ok::<(), TrainError>(())
    /// ```
    pub fn record_device_init(&mut self, took: Duration) {
        self.device_startup.device_init_ms = took.as_secs_f64() * 1e3;
    }

    /// Forgets the pipeline position a resumed checkpoint recorded: for a
    /// run whose data will be opened at the start of the checkpoint's epoch
    /// instead (its data options changed), so that the next checkpoint does
    /// not record a position in a stream this run never read.
    pub fn restart_epoch(&mut self) {
        self.state.position = None;
    }

    /// The config.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Things the user should be told (e.g. optimizer state that could not be restored).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The global step (0 before training; the checkpoint's after resuming).
    pub fn global_step(&self) -> u64 {
        self.state.step
    }

    /// Completed epochs.
    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }

    /// The model.
    pub fn model(&self) -> &dyn Model {
        self.state.model.as_ref()
    }

    /// The model's variables.
    pub fn varmap(&self) -> &VarMap {
        &self.state.varmap
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &dyn TrainOptimizer {
        self.state.optim.as_ref()
    }

    /// The metadata a checkpoint of the current state holds.
    pub fn checkpoint_meta(&self) -> CheckpointMeta {
        CheckpointMeta {
            format: FORMAT.into(),
            step: self.state.step,
            epoch: self.state.epoch,
            model: self.state.builtin.clone(),
            model_description: self.state.model.describe(),
            optimizer: self.state.optim.config(),
            optimizer_state: false,
            input: self.config.input.spec.clone(),
            schema: self.config.input.schema.clone(),
            seed: self.config.reproducibility.seed,
            label_vocabulary: self.config.input.label_vocabulary.clone(),
            pipeline_state: self
                .state
                .position
                .as_ref()
                .and_then(|p| serde_json::to_value(p).ok()),
            files: Default::default(),
            data: self.config.reproducibility.data.clone(),
            checksum: None,
        }
    }

    /// Saves a checkpoint of the current state (weights, optimizer state,
    /// epoch, step, seed) into the directory `dir`, atomically.
    pub fn save(&self, dir: impl AsRef<std::path::Path>) -> Result<(), TrainError> {
        Checkpoint::save(
            dir,
            &self.state.varmap,
            self.state.optim.state(),
            &self.checkpoint_meta(),
        )
    }

    /// One training step on tensors already on the device: returns the loss.
    /// (For feeding from memory, as the benchmarks do; `fit` uses the same code.)
    pub fn step(&mut self, batch: &BatchTensors) -> Result<f32, TrainError> {
        let device = self.config.placement.device.clone();
        let (loss, _) = train_step(&mut self.state, batch, &device)?;
        loss.to_scalar::<f32>()
            .map_err(TrainError::candle("reading the loss"))
    }

    /// Loss and metrics of the current model over `stream`.
    pub fn evaluate(&mut self, stream: &mut dyn BatchStream) -> Result<Evaluation, TrainError> {
        evaluate(
            self.state.model.as_ref(),
            stream,
            &self.config.input.spec,
            &self.config.placement.device,
        )
    }

    /// Adds an observer, called as training goes (see [`Observer`]).
    pub fn observe(&mut self, observer: impl Observer + 'static) {
        self.observers.push(Box::new(observer));
    }

    /// Calls `f` after every step (an [`Observer`] of steps only).
    pub fn on_progress(&mut self, f: impl FnMut(&Progress) + 'static) {
        self.observe(f);
    }

    /// Trains for the configured epochs or steps, and reports.
    ///
    /// `train` opens the training data, given the number of the epoch it
    /// starts with. A stream with epoch markers (a pipeline with
    /// [`repeat`](crate::pipeline::Pipeline::repeat)) serves the whole run:
    /// each marker ends an epoch. A stream that just ends ends an epoch
    /// too, and `train` is called again for the next one. `validation`, if
    /// given, opens the validation data, evaluated after every epoch.
    ///
    /// With the [stop flag](super::RunControl::stop_flag) raised (Ctrl-C), training stops after the
    /// current step; the report says `interrupted`, and the observers'
    /// [`on_train_end`](Observer::on_train_end) still runs (so a
    /// [`Checkpointer`](super::Checkpointer) saves).
    pub fn fit<S, F>(
        &mut self,
        mut train: F,
        mut validation: Option<TestOpener<'_>>,
    ) -> Result<TrainReport, TrainError>
    where
        S: BatchStream + 'static,
        F: FnMut(u64) -> Result<S, BoxError>,
    {
        let mut observers = std::mem::take(&mut self.observers);
        let result = self.fit_observed(&mut train, &mut validation, &mut observers);
        self.observers = observers;
        result
    }

    fn fit_observed<S, F>(
        &mut self,
        train: &mut F,
        validation: &mut Option<TestOpener<'_>>,
        observers: &mut [Box<dyn Observer>],
    ) -> Result<TrainReport, TrainError>
    where
        S: BatchStream + 'static,
        F: FnMut(u64) -> Result<S, BoxError>,
    {
        let mut fit = self.begin_fit();
        let info = RunInfo {
            epochs: fit.plan.epochs,
            steps: fit.plan.steps,
            examples_per_epoch: self.config.length.examples_per_epoch,
            first_epoch: self.state.epoch,
            first_step: self.state.step,
            task: fit.task,
        };
        for o in observers.iter_mut() {
            o.on_train_begin(&info)?;
        }
        while !fit.plan.done(fit.epochs.len() as u64, fit.clock.steps) && !fit.interrupted {
            let run = self.train_epoch(&mut fit, train, observers)?;
            if run.clock.steps == 0 {
                // Resumed at the exact end of an epoch (a step limit or a
                // signal that landed on its last batch): the restored stream
                // starts with that epoch's marker. The epoch was trained in
                // full before the checkpoint, so go on with the next one,
                // once (a stream of nothing but markers has run dry).
                if run.ended == EpochEnd::Marker
                    && fit.clock.steps == 0
                    && self.state.step > 0
                    && !fit.skipped_finished_epoch
                    && !fit.interrupted
                {
                    fit.skipped_finished_epoch = true;
                    self.state.epoch += 1;
                    continue;
                }
                if fit.clock.steps == 0 && !fit.interrupted {
                    return Err(TrainError::data(
                        "the training data produced no batches".into(),
                    ));
                }
                // A stream that ended right after its last epoch marker (a
                // finite `repeat`) is opened afresh for the next epoch; one
                // that gave nothing at all has run dry.
                if run.ended == EpochEnd::Exhausted && fit.stream_steps > 0 {
                    fit.stream_steps = 0;
                    continue;
                }
                break;
            }
            if self.finish_epoch(&mut fit, run, validation, observers)? == Control::Stop {
                self.stopped_early = true;
                break;
            }
        }
        // The pipeline's threads stop before the observers' last word (a
        // checkpoint written at the end sees no reader still running).
        drop(fit.feeder.take());
        for o in observers.iter_mut() {
            o.on_train_end(self, fit.interrupted)?;
        }
        let mut report = self.report(
            fit.start,
            &fit.clock,
            fit.eval_time,
            fit.bottleneck,
            fit.epochs,
        );
        report.interrupted = fit.interrupted;
        report.stopped_early = std::mem::take(&mut self.stopped_early);
        Ok(report)
    }

    /// The state a `fit` call starts from.
    fn begin_fit(&self) -> Fit {
        let inline = self.config.placement.prefetch == 0;
        let mut clock = RunClock::new(self.config.control.origin, inline);
        clock.startup.model_ready = clock.since_origin(self.ready_at);
        Fit {
            start: Instant::now(),
            device: self.config.placement.device.clone(),
            inline,
            plan: Plan::new(&self.config.length),
            task: self.config.input.spec.task,
            base_lr: self.state.optim.learning_rate(),
            clock,
            eval_time: Duration::ZERO,
            bottleneck: None,
            epochs: Vec::new(),
            feeder: None,
            stream_steps: 0,
            skipped_finished_epoch: false,
            interrupted: false,
        }
    }

    /// Trains until an epoch marker, the stream's end, the plan's step
    /// limit or the stop flag; opens the data first when no stream is open.
    fn train_epoch<S, F>(
        &mut self,
        fit: &mut Fit,
        train: &mut F,
        observers: &mut [Box<dyn Observer>],
    ) -> Result<EpochRun, TrainError>
    where
        S: BatchStream + 'static,
        F: FnMut(u64) -> Result<S, BoxError>,
    {
        let mut run = EpochRun::new(self.state.epoch, fit.task);
        loop {
            if fit.plan.steps.is_some_and(|m| fit.clock.steps >= m) {
                break;
            }
            if self.stop_requested() {
                fit.interrupted = true;
                break;
            }
            if fit.feeder.is_none() {
                self.open_feeder(fit, train, run.epoch)?;
            }
            let Some(feed) = fit.feeder.as_mut() else {
                break;
            };
            let wait_start = Instant::now();
            let fetched = feed.next(fit.clock.steps)?;
            let wait = wait_start.elapsed();
            match fetched {
                Fetched::End { bottleneck } => {
                    fit.bottleneck = bottleneck.or(fit.bottleneck.take());
                    fit.feeder = None;
                    // The next epoch reads a new stream: no position in this one.
                    self.state.position = None;
                    run.ended = EpochEnd::Exhausted;
                    break;
                }
                Fetched::EpochEnd { position } => {
                    StreamPosition::advance(&mut self.state.position, position, &mut self.warnings);
                    run.ended = EpochEnd::Marker;
                    break;
                }
                Fetched::Batch {
                    tensors,
                    copy,
                    bottleneck,
                    position,
                } => {
                    fit.bottleneck = bottleneck.or(fit.bottleneck.take());
                    // Trained on below, before anything can save.
                    StreamPosition::advance(&mut self.state.position, position, &mut self.warnings);
                    if run.clock.steps == 0 {
                        run.first_wait = run.start.elapsed();
                    }
                    // Inline, the conversion ran inside `next`: it is copy, not wait.
                    let wait = if fit.inline {
                        wait.saturating_sub(copy)
                    } else {
                        wait
                    };
                    self.fit_step(fit, &mut run, &tensors, wait, copy, observers)?;
                }
            }
        }
        Ok(run)
    }

    /// Whether the stop flag (Ctrl-C) is raised.
    fn stop_requested(&self) -> bool {
        self.config
            .control
            .stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::SeqCst))
    }

    /// Opens the training data for `epoch` and starts converting it.
    fn open_feeder<S, F>(
        &mut self,
        fit: &mut Fit,
        train: &mut F,
        epoch: u64,
    ) -> Result<(), TrainError>
    where
        S: BatchStream + 'static,
        F: FnMut(u64) -> Result<S, BoxError>,
    {
        let stream = train(epoch).map_err(TrainError::data)?;
        if fit.clock.steps == 0 {
            fit.clock.startup.pipeline_built = fit.clock.since_origin(Instant::now());
        }
        // The first batch's wait is start-up either way (see the module
        // doc), so taking it here costs the steps nothing.
        let stream = self.with_statistics(stream);
        fit.feeder = Some(Feeder::new(
            stream,
            &self.config.input.spec,
            &self.config.placement,
            fit.clock.steps,
        )?);
        fit.stream_steps = 0;
        // Once per trainer, while the pipeline makes its first batches.
        if fit.clock.steps == 0 && self.device_startup.first_kernel_ms.is_none() {
            self.device_startup.first_kernel_ms = first_kernel(&fit.device)?;
        }
        Ok(())
    }

    /// One optimizer step on `tensors`, its accounting, and the observers'
    /// `on_step`.
    fn fit_step(
        &mut self,
        fit: &mut Fit,
        run: &mut EpochRun,
        tensors: &BatchTensors,
        wait: Duration,
        copy: Duration,
        observers: &mut [Box<dyn Observer>],
    ) -> Result<(), TrainError> {
        let learning_rate = self.scheduled_rate(fit.base_lr, run.epoch);
        let compute_start = Instant::now();
        let (loss, outputs) = train_step(&mut self.state, tensors, &fit.device)?;
        let busy = compute_start.elapsed();
        fit.clock.record_step(wait, copy, busy, &mut run.clock);
        // Outside the timed phases: reading the loss and the metrics.
        let loss = loss
            .to_scalar::<f32>()
            .map_err(TrainError::candle("reading the loss"))?;
        if let Some(labels) = &tensors.labels {
            run.totals.add(loss, &outputs, labels, tensors.rows)?;
        }
        run.clock.steps += 1;
        run.clock.examples += tensors.rows as u64;
        fit.stream_steps += 1;
        fit.clock.examples += tensors.rows as u64;
        let progress = Progress {
            step: self.state.step,
            run_steps: fit.clock.steps,
            epoch: run.epoch,
            epoch_steps: run.clock.steps,
            epoch_examples: run.clock.examples,
            loss,
            learning_rate,
            rows: tensors.rows,
            examples_per_sec: fit.clock.examples as f64
                / fit.start.elapsed().as_secs_f64().max(1e-9),
            stall_fraction: fit.clock.stall_fraction(),
        };
        for o in observers.iter_mut() {
            o.on_step(&progress)?;
        }
        Ok(())
    }

    /// The learning rate for the next step, set on the optimizer when the
    /// schedule is not constant.
    fn scheduled_rate(&mut self, base_lr: f64, epoch: u64) -> f64 {
        if self.config.schedule.is_constant() {
            return base_lr;
        }
        let lr = self.config.schedule.rate(base_lr, self.state.step, epoch);
        self.state.optim.set_learning_rate(lr);
        lr
    }

    /// Validates (unless interrupted), counts the epoch when it completed,
    /// reports it to the observers and keeps its report. Stop when any
    /// observer says so (each one is still told).
    fn finish_epoch(
        &mut self,
        fit: &mut Fit,
        run: EpochRun,
        validation: &mut Option<TestOpener<'_>>,
        observers: &mut [Box<dyn Observer>],
    ) -> Result<Control, TrainError> {
        let eval_start = Instant::now();
        let val = match validation.as_mut() {
            Some(open) if !fit.interrupted => {
                let mut stream = open().map_err(TrainError::data)?;
                Some(evaluate(
                    self.state.model.as_ref(),
                    stream.as_mut(),
                    &self.config.input.spec,
                    &fit.device,
                )?)
            }
            _ => None,
        };
        fit.eval_time += eval_start.elapsed();
        if run.ended != EpochEnd::StepLimit && !fit.interrupted {
            self.state.epoch += 1;
        }
        let mut report = EpochReport::new(
            run.epoch,
            run.clock.steps,
            run.clock.examples,
            &run.totals.evaluation(),
            val.as_ref(),
            self.state.optim.learning_rate(),
            ratio(run.clock.wait, run.clock.wait + run.clock.busy),
            run.start.elapsed().as_secs_f64() * 1e3,
        );
        report.first_wait_ms = run.first_wait.as_secs_f64() * 1e3;
        let mut control = Control::Continue;
        for o in observers.iter_mut() {
            if o.on_epoch_end(&report, self)? == Control::Stop {
                control = Control::Stop;
            }
        }
        fit.epochs.push(report);
        Ok(control)
    }

    fn report(
        &self,
        fit_start: Instant,
        clock: &RunClock,
        eval_time: Duration,
        bottleneck: Option<String>,
        epochs: Vec<EpochReport>,
    ) -> TrainReport {
        let wall = fit_start.elapsed();
        let inline = clock.inline;
        let stall = clock.stall_fraction();
        let accounted = clock.data_wait.total()
            + clock.compute.total()
            + eval_time
            + if inline {
                clock.copy.total()
            } else {
                Duration::ZERO
            };
        let last = epochs.last();
        let mut checkpoint_load = self.checkpoint_load;
        if let Some(c) = checkpoint_load.as_mut() {
            c.pipeline_warmup_ms = clock.startup.first_batch - clock.startup.pipeline_built;
        }
        TrainReport {
            model: self.state.model.describe(),
            optimizer: self.state.optim.describe(),
            device: device_name(&self.config.placement.device),
            task: self.config.input.spec.task,
            examples: clock.examples,
            steps: clock.steps,
            global_step: self.state.step,
            wall_ms: wall.as_secs_f64() * 1e3,
            examples_per_sec: clock.examples as f64 / wall.as_secs_f64().max(1e-9),
            stall_fraction: stall,
            verdict: Verdict::from_stall(stall),
            bottleneck_stage: bottleneck,
            data_wait_ms: clock.data_wait.summary(),
            copy_ms: clock.copy.summary(),
            copy_overlapped: !inline,
            compute_ms: clock.compute.summary(),
            eval_ms: eval_time.as_secs_f64() * 1e3,
            other_ms: wall.saturating_sub(accounted).as_secs_f64() * 1e3,
            startup_ms: clock.startup,
            device_startup_ms: self.device_startup,
            first_step_ms: clock.first_step_ms,
            steady_step_ms_p50: clock.steady.summary().p50,
            val_loss: last.and_then(|e| e.val_loss),
            val_accuracy: last.and_then(|e| e.val_accuracy),
            val_mae: last.and_then(|e| e.val_mae),
            val_rmse: last.and_then(|e| e.val_rmse),
            checkpoint_load,
            skipped_features: self.config.input.skipped_features.clone(),
            standardized: self
                .config
                .input
                .spec
                .standardize
                .iter()
                .any(|s| !s.is_identity()),
            warnings: self.warnings.clone(),
            sequences: None,
            skipped_unlabelled: None,
            interrupted: false,
            stopped_early: false,
            epochs,
        }
    }
}

/// How long a run goes: epochs, steps, or one epoch by default.
struct Plan {
    epochs: Option<u64>,
    steps: Option<u64>,
}

impl Plan {
    fn new(length: &RunLength) -> Plan {
        match (length.epochs, length.steps) {
            (None, None) => Plan {
                epochs: Some(1),
                steps: None,
            },
            (epochs, steps) => Plan { epochs, steps },
        }
    }

    /// Whether a run that did `epochs` epochs and `steps` steps is done.
    fn done(&self, epochs: u64, steps: u64) -> bool {
        self.epochs.is_some_and(|m| epochs >= m) || self.steps.is_some_and(|m| steps >= m)
    }
}

/// The state of one `fit` call, shared by its parts.
struct Fit {
    start: Instant,
    device: Device,
    /// Batches are converted on the training thread (no device prefetch).
    inline: bool,
    plan: Plan,
    task: Task,
    base_lr: f64,
    clock: RunClock,
    eval_time: Duration,
    bottleneck: Option<String>,
    epochs: Vec<EpochReport>,
    feeder: Option<Feeder>,
    /// Steps taken from the current stream.
    stream_steps: u64,
    interrupted: bool,
    /// A resumed stream's first, already finished epoch was passed over.
    skipped_finished_epoch: bool,
}

/// One epoch in progress.
struct EpochRun {
    epoch: u64,
    start: Instant,
    totals: Totals,
    clock: EpochClock,
    /// How the epoch ended: a marker, the stream's end, or the plan's step
    /// limit (the default, also for an interrupt).
    ended: EpochEnd,
    /// Until the epoch's first batch: opening the data (a stream per
    /// epoch) or the wait across an epoch marker (one stream).
    first_wait: Duration,
}

impl EpochRun {
    fn new(epoch: u64, task: Task) -> EpochRun {
        EpochRun {
            epoch,
            start: Instant::now(),
            totals: Totals::new(task),
            clock: EpochClock::default(),
            ended: EpochEnd::StepLimit,
            first_wait: Duration::ZERO,
        }
    }
}

/// How an epoch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpochEnd {
    /// An epoch marker from the stream (it goes on with the next epoch).
    Marker,
    /// The stream ended.
    Exhausted,
    /// The run's step limit (or an interrupt) came first: the epoch is incomplete.
    StepLimit,
}

impl Trainer {
    /// Fills `input.standardize` from `stream`'s first batch when it is
    /// still empty, and returns the stream with that batch put back.
    fn with_statistics<S: BatchStream>(&mut self, mut stream: S) -> Peeked<S> {
        let pixels = self.config.input.pixels;
        let input = &mut self.config.input.spec;
        if !input.standardize.is_empty() {
            return Peeked {
                first: None,
                rest: stream,
            };
        }
        let first = stream.next_batch();
        if let Some(Ok(batch)) = &first {
            input.standardize = Standardize::from_batch_with(batch, input, pixels);
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

    fn next_event(&mut self) -> Option<Result<BatchEvent, BoxError>> {
        match self.first.take() {
            Some(item) => item.map(|r| r.map(BatchEvent::Batch)),
            None => self.rest.next_event(),
        }
    }

    fn bottleneck_stage(&self) -> Option<String> {
        self.rest.bottleneck_stage()
    }

    // Asked after an event was returned: by then the held batch is out, and
    // the rest's position is the stream's.
    fn position(&self) -> Option<Result<serde_json::Value, String>> {
        match &self.first {
            Some(_) => Some(Err("a batch is held back".into())),
            None => self.rest.position(),
        }
    }
}

/// Starts `pipeline` (the training pipeline a run read through, built the
/// same way) where a checkpoint's [`pipeline_state`](CheckpointMeta::pipeline_state)
/// says that run's trainer stood: the first batch it yields is the one the
/// interrupted run would have trained on next.
///
/// The state holds the pipeline's last captured state and the events
/// (batches, epoch markers) consumed after it; those are read again and
/// dropped here.
///
/// ```
/// use tfpipe::pipeline::Pipeline;
/// use tfpipe::train::{BatchStream, resume_pipeline};
/// let p = Pipeline::from_vec(vec![tfpipe::Batch::default(); 3]);
/// let it = p.start()?;
/// let saved = serde_json::json!({ "anchor": serde_json::to_value(it.state()?)?, "skip": 2 });
/// let mut resumed = resume_pipeline(&p, &saved)?;
/// assert!(resumed.next_batch().is_some());
/// assert!(resumed.next_batch().is_none());
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// ```
pub fn resume_pipeline(
    pipeline: &crate::pipeline::Pipeline<crate::Batch>,
    saved: &serde_json::Value,
) -> Result<Box<dyn BatchStream>, BoxError> {
    let position: StreamPosition = serde_json::from_value(saved.clone())
        .map_err(|e| format!("the checkpoint's pipeline state: {e}"))?;
    let state: crate::pipeline::PipelineState = serde_json::from_value(position.anchor)
        .map_err(|e| format!("the checkpoint's pipeline state: {e}"))?;
    let mut iter = pipeline.start_from(&state)?;
    for _ in 0..position.skip {
        match iter.next_event() {
            Some(crate::pipeline::Event::Item(Err(e))) => return Err(e.into()),
            Some(_) => {}
            None => break,
        }
    }
    Ok(Box::new(iter))
}

/// Forward, loss, backward, update, synchronize. Returns (loss, outputs).
fn train_step(
    state: &mut State,
    batch: &BatchTensors,
    device: &Device,
) -> Result<(Tensor, Tensor), TrainError> {
    let labels = batch.labels.as_ref().ok_or_else(|| TrainError::Input {
        batch: state.step,
        reason: "no labels: training needs the label column".into(),
    })?;
    let err = || TrainError::candle("training step");
    let outputs = state.model.forward_t(batch, true).map_err(err())?;
    let loss = state.model.loss(&outputs, labels).map_err(err())?;
    let grads = loss.backward().map_err(err())?;
    state.optim.step(&grads).map_err(err())?;
    device.synchronize().map_err(err())?;
    state.step += 1;
    Ok((loss, outputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{InputSpec, OptimizerConfig, OptimizerKind, TrainData};

    #[test]
    fn a_run_is_one_epoch_unless_told_and_ends_at_the_first_limit() {
        let plan = Plan::new(&RunLength::new());
        assert!(!plan.done(0, 1_000_000) && plan.done(1, 0));
        let plan = Plan::new(&RunLength::new().epochs(3).steps(10));
        assert!(!plan.done(2, 9));
        assert!(plan.done(3, 0) && plan.done(0, 10));
        let plan = Plan::new(&RunLength::new().steps(5));
        assert!(!plan.done(100, 4) && plan.done(0, 5));
    }

    #[test]
    fn the_stream_position_is_the_last_capture_plus_the_events_since() {
        let mut position = None;
        let mut warnings = Vec::new();
        StreamPosition::advance(&mut position, None, &mut warnings);
        assert_eq!(position, None, "nothing captured yet");
        let anchor = serde_json::json!({"at": 1});
        StreamPosition::advance(&mut position, Some(Ok(anchor.clone())), &mut warnings);
        StreamPosition::advance(&mut position, None, &mut warnings);
        StreamPosition::advance(&mut position, None, &mut warnings);
        assert_eq!(position, Some(StreamPosition { anchor, skip: 2 }));
        // A stream that cannot say where it is: forgotten, and said once.
        for _ in 0..3 {
            StreamPosition::advance(&mut position, Some(Err("a cache".into())), &mut warnings);
        }
        assert_eq!(position, None);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("a cache"), "{warnings:?}");
    }

    #[test]
    fn fit_runs_the_planned_steps_over_a_file_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.tfrecord");
        let mut writer =
            crate::tfrecord::FileRecordWriter::create(&path, crate::Compression::None).unwrap();
        use crate::example::proto::{Example, Feature, Features, FloatList, Int64List, feature};
        for i in 0..40i64 {
            let x: Vec<f32> = (0..4).map(|j| ((i + j) % 5) as f32).collect();
            let kind = |k| Feature { kind: Some(k) };
            let features = [
                (
                    "x".to_string(),
                    kind(feature::Kind::FloatList(FloatList { value: x })),
                ),
                (
                    "y".to_string(),
                    kind(feature::Kind::Int64List(Int64List { value: vec![i % 2] })),
                ),
            ];
            let example = Example {
                features: Some(Features {
                    feature: features.into_iter().collect(),
                }),
            };
            writer
                .write_record(&prost::Message::encode_to_vec(&example))
                .unwrap();
        }
        writer.finish().unwrap();
        let schema = crate::Schema::from_feature_texts(&["x:float32:4", "y:int64"])
            .unwrap()
            .with_label("y")
            .unwrap();
        let data = TrainData::new([path.to_string_lossy()], schema, 8).shuffle_buffer(0);
        let input = InputSpec::from_schema(&data.schema, Task::Classification { classes: 2 })
            .unwrap()
            .spec;
        let model = ModelConfig::Mlp {
            inputs: 4,
            hidden: vec![3],
            classes: 2,
        };
        let config = TrainConfig::new(input).length(RunLength::new().steps(7));
        let optimizer = OptimizerConfig::default_for(OptimizerKind::Sgd);
        let mut trainer = Trainer::builtin(config, model, optimizer).unwrap();
        let report = data.fit(&mut trainer, None, None).unwrap();
        // 40 records in batches of 8: one epoch of 5 steps, then 2 more.
        assert_eq!((report.global_step, trainer.epoch()), (7, 1));
        assert_eq!(report.epochs[0].steps, 5);
    }
}
