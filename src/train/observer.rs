//! Observers: what [`Trainer::fit`](super::Trainer::fit) tells the world
//! while it runs, as Keras' callbacks do. Progress bars, TensorBoard,
//! checkpointing and early stopping are all [`Observer`]s; add your own with
//! [`Trainer::observe`](super::Trainer::observe).
//!
//! The trainer calls, in order: [`on_train_begin`](Observer::on_train_begin)
//! once, [`on_step`](Observer::on_step) after every step,
//! [`on_epoch_end`](Observer::on_epoch_end) after each epoch's validation,
//! and [`on_train_end`](Observer::on_train_end) once, also when the run
//! stops early (an observer asked it to, or it was interrupted), but not when
//! it failed. An observer's error ends `fit` with that error.
//!
//! Per step, the machinery costs one virtual call per observer and a
//! `Progress` of a few words on the stack (`cargo bench --bench train --
//! observers` measures it).

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::TrainError;
use super::model::Task;
use super::report::EpochReport;
use super::tensorboard::EventWriter;
use super::trainer::{Progress, Trainer};

/// What an observer can ask for at the end of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Go on.
    Continue,
    /// Stop after this epoch (early stopping).
    Stop,
}

/// What a run is about to do, for [`Observer::on_train_begin`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunInfo {
    /// Epochs this run trains, when bounded by epochs.
    pub epochs: Option<u64>,
    /// Steps this run trains, when bounded by steps.
    pub steps: Option<u64>,
    /// Examples in one epoch, when known (from the schema file or counted).
    pub examples_per_epoch: Option<u64>,
    /// The first epoch's number (the checkpoint's epoch when resuming).
    pub first_epoch: u64,
    /// The global step at the start.
    pub first_step: u64,
    /// What the model learns.
    pub task: Task,
}

/// Called by [`Trainer::fit`](super::Trainer::fit) as training goes; every
/// method has a default that does nothing.
pub trait Observer {
    /// Once, before the first step.
    fn on_train_begin(&mut self, run: &RunInfo) -> Result<(), TrainError> {
        let _ = run;
        Ok(())
    }

    /// After every step.
    fn on_step(&mut self, progress: &Progress) -> Result<(), TrainError> {
        let _ = progress;
        Ok(())
    }

    /// After every epoch (validation included), with the trainer to read
    /// or save (e.g. [`Trainer::save`]).
    fn on_epoch_end(
        &mut self,
        epoch: &EpochReport,
        trainer: &Trainer,
    ) -> Result<Control, TrainError> {
        let _ = (epoch, trainer);
        Ok(Control::Continue)
    }

    /// Once, after the last step (also after an early stop or an interrupt).
    fn on_train_end(&mut self, trainer: &Trainer, interrupted: bool) -> Result<(), TrainError> {
        let _ = (trainer, interrupted);
        Ok(())
    }
}

/// Any `FnMut(&Progress)` observes steps.
impl<F: FnMut(&Progress)> Observer for F {
    fn on_step(&mut self, progress: &Progress) -> Result<(), TrainError> {
        self(progress);
        Ok(())
    }
}

/// TensorBoard event files in Keras' layout: `LOGDIR/train/` and
/// `LOGDIR/validation/` runs, each with `epoch_loss`, `epoch_accuracy` (or
/// `epoch_mae` and `epoch_rmse` for regression) and `epoch_learning_rate`
/// (train run), stepped by epoch, so that train and validation curves share
/// a chart. Beside Keras' tags, the train run carries per-step
/// `batch_loss`, `examples_per_sec` and `stall_fraction` every `every` steps
/// (stepped by global step), and `epoch_stall_fraction`.
pub struct TensorBoard {
    train: EventWriter,
    validation: Option<EventWriter>,
    logdir: PathBuf,
    every: u64,
    window: (Instant, u64),
    examples: u64,
}

impl TensorBoard {
    /// Creates `logdir/train/` (and `validation/` once validation data
    /// arrives) with new event files. Per-step scalars every `every` steps.
    pub fn create(logdir: impl AsRef<Path>, every: u64) -> Result<TensorBoard, TrainError> {
        let logdir = logdir.as_ref().to_path_buf();
        Ok(TensorBoard {
            train: EventWriter::create(logdir.join("train"))?,
            validation: None,
            logdir,
            every: every.max(1),
            window: (Instant::now(), 0),
            examples: 0,
        })
    }

    fn metrics(
        accuracy: Option<f64>,
        mae: Option<f64>,
        rmse: Option<f64>,
    ) -> Vec<(&'static str, f32)> {
        let mut out = Vec::new();
        if let Some(a) = accuracy {
            out.push(("epoch_accuracy", a as f32));
        }
        if let Some(a) = mae {
            out.push(("epoch_mae", a as f32));
        }
        if let Some(a) = rmse {
            out.push(("epoch_rmse", a as f32));
        }
        out
    }
}

impl Observer for TensorBoard {
    fn on_train_begin(&mut self, _run: &RunInfo) -> Result<(), TrainError> {
        self.window = (Instant::now(), 0);
        Ok(())
    }

    fn on_step(&mut self, p: &Progress) -> Result<(), TrainError> {
        self.examples += p.rows as u64;
        if p.step.is_multiple_of(self.every) {
            let dt = self.window.0.elapsed().as_secs_f64();
            let rate = (self.examples - self.window.1) as f64 / dt.max(1e-9);
            self.window = (Instant::now(), self.examples);
            self.train.scalars(
                p.step,
                &[
                    ("batch_loss", p.loss),
                    ("examples_per_sec", rate as f32),
                    ("stall_fraction", p.stall_fraction as f32),
                ],
            )?;
        }
        Ok(())
    }

    fn on_epoch_end(&mut self, e: &EpochReport, _: &Trainer) -> Result<Control, TrainError> {
        let mut train = vec![
            ("epoch_loss", e.loss as f32),
            ("epoch_learning_rate", e.learning_rate as f32),
            ("epoch_stall_fraction", e.stall_fraction as f32),
        ];
        train.extend(Self::metrics(e.accuracy, e.mae, e.rmse));
        self.train.scalars(e.epoch, &train)?;
        self.train.flush()?;
        if let Some(loss) = e.val_loss {
            if self.validation.is_none() {
                self.validation = Some(EventWriter::create(self.logdir.join("validation"))?);
            }
            if let Some(v) = self.validation.as_mut() {
                let mut scalars = vec![("epoch_loss", loss as f32)];
                scalars.extend(Self::metrics(e.val_accuracy, e.val_mae, e.val_rmse));
                v.scalars(e.epoch, &scalars)?;
                v.flush()?;
            }
        }
        Ok(Control::Continue)
    }

    fn on_train_end(&mut self, _: &Trainer, _: bool) -> Result<(), TrainError> {
        self.train.flush()?;
        if let Some(v) = self.validation.as_mut() {
            v.flush()?;
        }
        Ok(())
    }
}

/// Which number decides "best" and "improved".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Monitor {
    /// Validation loss (lower is better); the training loss without validation data.
    Loss,
    /// The task's validation metric: accuracy (higher is better) or MAE
    /// (lower is better); the training one without validation data.
    Metric,
}

impl Monitor {
    /// The monitored value of `e`, as "lower is better".
    fn value(&self, e: &EpochReport) -> f64 {
        match self {
            Monitor::Loss => e.val_loss.unwrap_or(e.loss),
            Monitor::Metric => match (e.val_accuracy.or(e.accuracy), e.val_mae.or(e.mae)) {
                (Some(acc), _) => -acc,
                (None, Some(mae)) => mae,
                (None, None) => e.val_loss.unwrap_or(e.loss),
            },
        }
    }

    /// Its name in messages.
    pub fn name(&self) -> &'static str {
        match self {
            Monitor::Loss => "val_loss",
            Monitor::Metric => "the validation metric",
        }
    }
}

/// Checkpoints as training goes: into `dir` every `every` epochs and at
/// the end of the run (also when interrupted), and, with `keep_best`, the
/// best epoch by `monitor` into `DIR-best` beside it (Keras' `ModelCheckpoint` with
/// `save_best_only`). Each save is atomic (see
/// [`Checkpoint::save`](super::Checkpoint::save)).
pub struct Checkpointer {
    dir: PathBuf,
    every: Option<u64>,
    keep_best: Option<Monitor>,
    best: f64,
    saved: Vec<(u64, PathBuf)>,
}

impl Checkpointer {
    /// Saves into `dir` at the end of the run.
    pub fn new(dir: impl Into<PathBuf>) -> Checkpointer {
        Checkpointer {
            dir: dir.into(),
            every: None,
            keep_best: None,
            best: f64::INFINITY,
            saved: Vec::new(),
        }
    }

    /// Also saves every `n` epochs. By default only at the end.
    pub fn every(mut self, n: u64) -> Checkpointer {
        self.every = Some(n.max(1));
        self
    }

    /// Also keeps the best epoch by `monitor` in `DIR-best`. By default not.
    pub fn keep_best(mut self, monitor: Monitor) -> Checkpointer {
        self.keep_best = Some(monitor);
        self
    }

    /// The directory of the best checkpoint: `DIR-best` beside `DIR`.
    pub fn best_dir(&self) -> PathBuf {
        let mut name = self.dir.file_name().unwrap_or_default().to_os_string();
        name.push("-best");
        self.dir.with_file_name(name)
    }

    /// Saves done so far: (global step, directory).
    pub fn saved(&self) -> &[(u64, PathBuf)] {
        &self.saved
    }
}

impl Observer for Checkpointer {
    fn on_epoch_end(&mut self, e: &EpochReport, trainer: &Trainer) -> Result<Control, TrainError> {
        if let Some(monitor) = self.keep_best {
            let value = monitor.value(e);
            if value < self.best {
                self.best = value;
                let best = self.best_dir();
                trainer.save(&best)?;
                self.saved.push((trainer.global_step(), best));
            }
        }
        if self
            .every
            .is_some_and(|n| trainer.epoch().is_multiple_of(n))
        {
            trainer.save(&self.dir)?;
            self.saved.push((trainer.global_step(), self.dir.clone()));
        }
        Ok(Control::Continue)
    }

    fn on_train_end(&mut self, trainer: &Trainer, _interrupted: bool) -> Result<(), TrainError> {
        if self
            .saved
            .last()
            .is_none_or(|(step, dir)| *step != trainer.global_step() || dir != &self.dir)
        {
            trainer.save(&self.dir)?;
            self.saved.push((trainer.global_step(), self.dir.clone()));
        }
        Ok(())
    }
}

/// Stops training when `monitor` has not improved by more than `min_delta`
/// for `patience` epochs (Keras' `EarlyStopping`).
pub struct EarlyStopping {
    monitor: Monitor,
    patience: u64,
    min_delta: f64,
    best: f64,
    waited: u64,
    stopped_at: Option<u64>,
}

impl EarlyStopping {
    /// Stops after `patience` epochs without improvement of `monitor`.
    pub fn new(monitor: Monitor, patience: u64) -> EarlyStopping {
        EarlyStopping {
            monitor,
            patience,
            min_delta: 0.0,
            best: f64::INFINITY,
            waited: 0,
            stopped_at: None,
        }
    }

    /// An improvement must be larger than this. By default 0.
    pub fn min_delta(mut self, delta: f64) -> EarlyStopping {
        self.min_delta = delta.abs();
        self
    }

    /// The epoch after which it stopped training, if it did.
    pub fn stopped_at(&self) -> Option<u64> {
        self.stopped_at
    }
}

impl Observer for EarlyStopping {
    fn on_epoch_end(&mut self, e: &EpochReport, _: &Trainer) -> Result<Control, TrainError> {
        let value = self.monitor.value(e);
        if value < self.best - self.min_delta {
            self.best = value;
            self.waited = 0;
            return Ok(Control::Continue);
        }
        self.waited += 1;
        if self.waited >= self.patience {
            self.stopped_at = Some(e.epoch);
            return Ok(Control::Stop);
        }
        Ok(Control::Continue)
    }
}
