//! The training loop on candle, and the reports that say where the time goes.
//!
//! Data flow of [`Trainer::fit`]: a [`BatchStream`] (usually a
//! [`pipeline`](crate::pipeline)) yields [`Batch`](crate::Batch)es; a
//! device-prefetch thread (`prefetch.rs`) turns each into tensors on the target
//! device while the current step computes; the loop times every step in three
//! phases (data wait, host-to-device copy, compute) into hdrhistograms and ends
//! with a [`TrainReport`]: throughput, the stall fraction with a verdict in
//! TensorFlow profiler's words, the pipeline's bottleneck stage, and the
//! start-up breakdown (process start -> model ready -> pipeline built -> first
//! batch -> first step; on a GPU also the device's init, weights upload and
//! first kernel, [`DeviceStartup`]).
//!
//! | file | what lives there |
//! |---|---|
//! | `model.rs` | [`ModelConfig`], [`Model`] (MLP, LeNet-like CNN, token embedding), seeded init |
//! | `ops.rs` | [`ops`]: fused CPU kernels (linear + bias + ReLU, softmax cross-entropy, im2col conv, max-pool, in-place optimizer updates), each with a candle-ops fallback off the CPU |
//! | `tensor.rs` | [`InputSpec`] (inputs chosen from a schema, standardisation, token ids padded per batch with a mask), `Batch` -> tensors without an extra copy |
//! | `classes.rs` | [`IntLabels`]: an int64 label's class count counted from the data, or refused |
//! | `impute.rs` | [`Impute`], [`Imputation`]: missing inputs filled only when asked, with a missing-indicator column |
//! | `tokens.rs` | [`TokenSet`], a generated token-classification set |
//! | `optim.rs` | [`OptimizerConfig`], [`TrainOptimizer`]; our Adam, AdamW and SGD (one in-place pass per tensor on the CPU) |
//! | `threads.rs` | [`ThreadTuner`]: compute threads chosen by timing the steps |
//! | `timing.rs` | [`Phase`] histograms and their [`PhaseSummary`] |
//! | `prefetch.rs` | [`BatchStream`], the device-prefetch thread |
//! | `data.rs` | [`TrainData`]: the standard input pipeline of a run (per-epoch seeds, validation, resuming at a position) |
//! | `config.rs` | [`TrainConfig`] and its parts: [`ModelInput`], [`RunLength`], [`Placement`], [`Reproducibility`], [`RunControl`] |
//! | `trainer.rs` | [`Trainer`], evaluation |
//! | `report.rs` | [`TrainReport`], [`Verdict`], tables |
//! | `checkpoint.rs` | safetensors + JSON checkpoints, background loading |
//! | `predict.rs` | [`Predictor`] and prediction latency |
//! | `tensorboard.rs` | [`EventWriter`]: `events.out.tfevents.*` files |
//!
//! Invariants: every thread started here (prefetch, checkpoint loading) is
//! joined when its owner is dropped; channels are bounded. On CUDA the clock
//! is read only after `device.synchronize()`, so compute times are kernel
//! times, not launch times.

mod build;
mod checkpoint;
mod choice;
mod classes;
mod clock;
mod config;
mod data;
mod device;
mod feeder;
mod impute;
mod missing;
mod model;
mod objective;
mod observer;
pub mod ops;
mod optim;
mod predict;
mod prefetch;
mod report;
mod resume;
mod run;
mod schedule;
mod sequences;
mod tensor;
mod tensorboard;
mod threads;
mod timing;
mod tokens;
mod trainer;

pub use crate::rng::epoch_seed;
/// candle, re-exported so that a custom [`Model`] is written against the
/// versions tfpipe trains with (`tfpipe::train::candle_core::Tensor`).
pub use candle_core;
/// candle's layers and variable maps, re-exported like [`candle_core`].
pub use candle_nn;
pub use checkpoint::{
    Checkpoint, CheckpointError, CheckpointLoad, CheckpointMeta, DefaultMeta, FORMAT, FeatureMeta,
    META_FILE, SchemaMeta,
};
pub use choice::{ImageInput, ModelChoice, ModelChoiceError, ModelKind, ModelRequest, TaskKind};
pub use classes::{IntLabels, MAX_INFERRED_CLASSES};
pub use config::{ModelInput, Placement, Reproducibility, RunControl, RunLength, TrainConfig};
pub use data::{DataFingerprint, FileFingerprint, LabelClasses, TrainData, UnknownLabel};
pub use device::parse_device;
pub use impute::{Imputation, Impute, MISSING_INT64};
pub use missing::MissingLabels;
pub use model::{BuiltinModel, ImageShape, Model, ModelConfig, Task, seed_vars};
pub use objective::Evaluation;
pub use observer::{Checkpointer, Control, EarlyStopping, Monitor, Observer, RunInfo, TensorBoard};
pub use optim::{
    Adam, AdamW, Foreign, OptimizerConfig, OptimizerKind, OptimizerState, Sgd, TrainOptimizer,
};
pub use predict::{
    Labels, Outputs, PredictOptions, PredictReport, PredictedBatch, PredictionLatency,
    PredictionSink, Predictor,
};
pub use prefetch::{BatchEvent, BatchStream, BoxError, IterStream, WithBottleneck};
pub use report::{DeviceStartup, EpochReport, Startup, TrainReport, Verdict};
pub use resume::{Resume, ResumeAt};
pub use run::RunOutputs;
pub use schedule::{Decay, LrSchedule};
pub use sequences::{PaddingMeter, SequenceReport, Sequences, padding_of, token_feature};
pub use tensor::{
    BatchTensors, InputSelection, InputSpec, PixelScaling, Pooling, SkippedFeature, Standardize,
    TokenSpec, batch_to_tensors, classes_from_metadata,
};
pub use tensorboard::{EventWriter, Scalar};
pub use threads::ThreadTuner;
pub use timing::{Phase, PhaseSummary};
pub use tokens::{TokenFiles, TokenSet};
pub use trainer::{Progress, TestOpener, Trainer, resume_pipeline};

use crate::Location;
use crate::pipeline::PipelineError;

/// Errors of training, evaluation, checkpoints and prediction.
///
/// Each variant's message is its own; the cause (an I/O error, a
/// [`PipelineError`] with its location, candle's error, a
/// [`CheckpointError`]) is its [`source`](std::error::Error::source), never
/// repeated in the message, so a printer that walks the chain (anyhow's
/// `{:#}`, the CLI) shows each cause once:
///
/// ```
/// let err = tfpipe::train::Checkpoint::read_meta("no/such/checkpoint").unwrap_err();
/// assert_eq!(err.to_string(), "checkpoint no/such/checkpoint");
/// let cause = std::error::Error::source(&err).unwrap();
/// assert_eq!(cause.to_string(), "cannot read checkpoint.json");
/// assert!(std::error::Error::source(cause).unwrap().downcast_ref::<std::io::Error>().is_some());
/// ```
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A bad device name, a build without the `cuda` feature, or no GPU.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The batch does not fit the model's input (missing column, ragged, wrong size, bad label).
    #[error("batch {batch}: {reason}")]
    Input {
        /// The batch's index in the run.
        batch: u64,
        /// What is wrong.
        reason: String,
    },
    /// A class label outside `0..classes`, named by its record where that
    /// is known ([`TrainData::fit`] finds it), else by batch and row.
    #[error(
        "{}label {name:?} = {value} is outside 0..{classes} (the number of classes is {classes})",
        label_place(*.batch, *.row, .location.as_ref())
    )]
    Label {
        /// The batch's index in the run.
        batch: u64,
        /// The row within the batch.
        row: usize,
        /// The record: its file, index and offset.
        location: Option<Location>,
        /// The label feature.
        name: String,
        /// The label value found.
        value: i64,
        /// The number of classes.
        classes: usize,
    },
    /// An int64 label's values that give no number of classes (see
    /// [`IntLabels::classes`]): none, or values that look like a quantity.
    #[error("label {label:?}: {found}: {why}")]
    LabelValues {
        /// The label feature.
        label: String,
        /// What the data holds (`7 distinct values from 3 to 9 in 1599 records`).
        found: String,
        /// Why that gives no class count.
        why: String,
    },
    /// A model that does not fit the data (see [`ModelConfig::for_input`]).
    #[error(transparent)]
    Model(#[from] ModelChoiceError),
    /// A setting that cannot work: which one, and why.
    #[error("{setting}: {reason}")]
    Config {
        /// The setting.
        setting: Setting,
        /// Why it cannot work, with its value.
        reason: String,
    },
    /// The data source failed (I/O, corruption, parse error), with the
    /// pipeline's error and its location.
    #[error("data")]
    Data(#[source] Box<PipelineError>),
    /// A tensor operation failed inside candle.
    #[error("{context}")]
    Candle {
        /// What was being done.
        context: &'static str,
        #[source]
        /// The underlying error.
        source: candle_core::Error,
    },
    /// A checkpoint that cannot be written, read or used.
    #[error("checkpoint {}", path.display())]
    Checkpoint {
        /// The directory or file.
        path: std::path::PathBuf,
        #[source]
        /// The underlying error.
        source: Box<CheckpointError>,
    },
    /// A TensorBoard event file that cannot be written.
    #[error("event file {}", path.display())]
    Events {
        /// The directory or file.
        path: std::path::PathBuf,
        #[source]
        /// The underlying error.
        source: std::io::Error,
    },
    /// An output (predictions) that cannot be written.
    #[error("{}: cannot write", path.display())]
    Output {
        /// The directory or file.
        path: std::path::PathBuf,
        #[source]
        /// The underlying error.
        source: std::io::Error,
    },
    /// A worker thread (device prefetch) panicked.
    #[error(transparent)]
    Panic(#[from] crate::spawn::Panicked),
    /// A thread could not be started.
    #[error("cannot start the {0} thread")]
    Spawn(&'static str, #[source] std::io::Error),
}

/// Where a bad label is: its record, else its batch and row.
fn label_place(batch: u64, row: usize, location: Option<&Location>) -> String {
    match location {
        Some(at) => format!("{at}: "),
        None => format!("batch {batch}: row {row}: "),
    }
}

/// A training setting, as [`TrainError::Config`] names it (a front end
/// maps each to its own flag or argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Setting {
    /// The optimizer's learning rate.
    LearningRate,
    /// The optimizer's weight decay.
    WeightDecay,
    /// SGD's momentum.
    Momentum,
    /// Adam's moment decay rates and epsilon.
    AdamMoments,
    /// The number of classes.
    Classes,
    /// The hidden layer sizes.
    HiddenSizes,
    /// The embedding table's rows and width.
    Embedding,
    /// The label feature.
    Label,
    /// The input features.
    Inputs,
    /// The run's length (epochs, steps).
    RunLength,
    /// The learning-rate schedule.
    LrSchedule,
    /// The CNN's input image size.
    ImageSize,
}

impl Setting {
    /// What the setting is called in messages.
    pub fn name(self) -> &'static str {
        match self {
            Setting::LearningRate => "learning rate",
            Setting::WeightDecay => "weight decay",
            Setting::Momentum => "momentum",
            Setting::AdamMoments => "Adam's moments",
            Setting::Classes => "classes",
            Setting::HiddenSizes => "hidden sizes",
            Setting::Embedding => "embedding",
            Setting::Label => "label",
            Setting::Inputs => "inputs",
            Setting::RunLength => "run length",
            Setting::LrSchedule => "learning-rate schedule",
            Setting::ImageSize => "image size",
        }
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why [`parse_device`] gave no device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// Not `cpu`, `cuda` or `cuda:N`.
    #[error("unknown device {name:?} (expected cpu, cuda or cuda:N)")]
    Unknown {
        /// The label feature.
        name: String,
    },
    /// `cuda` in a build without the `cuda` feature.
    #[error(
        "cuda:{ordinal}: this tfpipe was built without the `cuda` feature; rebuild with `cargo build --release --features cuda` (needs a CUDA toolkit)"
    )]
    NotBuilt {
        /// The GPU index (`cuda:N`).
        ordinal: usize,
    },
    /// The driver, or the GPU, is missing or refused to start (candle's
    /// error, without its backtrace, is the source).
    #[error(
        "cuda:{ordinal}: no usable CUDA device (an NVIDIA GPU and its driver are needed; `nvidia-smi` lists them)"
    )]
    Unavailable {
        /// The GPU index (`cuda:N`).
        ordinal: usize,
        #[source]
        /// The underlying error.
        error: candle_core::Error,
    },
}

impl TrainError {
    /// A [`Config`](TrainError::Config) error for `setting`.
    pub(crate) fn config(setting: Setting, reason: impl Into<String>) -> TrainError {
        TrainError::Config {
            setting,
            reason: reason.into(),
        }
    }

    pub(crate) fn candle(context: &'static str) -> impl FnOnce(candle_core::Error) -> TrainError {
        move |source| TrainError::Candle {
            context,
            source: checkpoint::strip_backtrace(source),
        }
    }

    /// A checkpoint error about `path`.
    pub fn checkpoint(path: impl Into<std::path::PathBuf>, source: CheckpointError) -> TrainError {
        TrainError::Checkpoint {
            path: path.into(),
            source: Box::new(source),
        }
    }

    /// A data source's error as a [`TrainError::Data`]: a pipeline's error
    /// stays itself (with its location); any other becomes a
    /// [`PipelineError::User`] of the stage `source`.
    pub fn data(error: BoxError) -> TrainError {
        TrainError::Data(match error.downcast::<PipelineError>() {
            Ok(p) => p,
            Err(error) => Box::new(PipelineError::User {
                stage: "source".into(),
                error,
            }),
        })
    }

    /// Where in the input data the error is, when it is about input data.
    pub fn location(&self) -> Option<&Location> {
        match self {
            TrainError::Data(e) => e.location(),
            _ => None,
        }
    }

    /// Whether the error is about bad input data (exit code 1 in the CLI)
    /// rather than usage or I/O.
    pub fn is_data_error(&self) -> bool {
        match self {
            TrainError::Data(e) => e.is_data_error(),
            TrainError::Input { .. } => true,
            // A label beyond the classes is fixed by the number of classes
            // (or by training a regression), not by other data.
            TrainError::Label { .. } => false,
            TrainError::Checkpoint { source, .. } => {
                matches!(**source, CheckpointError::Checksum { .. })
            }
            _ => false,
        }
    }
}
