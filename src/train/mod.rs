//! The training loop on candle, and the reports that say where the time goes.
//!
//! Data flow of [`Trainer::fit`]: a [`BatchStream`] (usually a
//! [`pipeline`](crate::pipeline)) yields [`Batch`](crate::Batch)es; a
//! device-prefetch thread (`prefetch.rs`) turns each into tensors on the target
//! device while the current step computes; the loop times every step in three
//! phases (data wait, host-to-device copy, compute) into hdrhistograms and ends
//! with a [`TrainReport`]: throughput, the stall fraction with a verdict in
//! TensorFlow profiler's words, the pipeline's bottleneck stage, and the
//! start-up breakdown (process start -> pipeline built -> first batch -> model
//! ready -> first step).
//!
//! | file | what lives there |
//! |---|---|
//! | `model.rs` | [`ModelConfig`], [`Model`] (MLP, LeNet-like CNN), seeded init |
//! | `tensor.rs` | [`InputSpec`] (inputs chosen from a schema, standardisation), `Batch` -> tensors without an extra copy |
//! | `optim.rs` | [`OptimizerConfig`], AdamW and SGD from candle-nn |
//! | `timing.rs` | [`Phase`] histograms and their [`PhaseSummary`] |
//! | `prefetch.rs` | [`BatchStream`], the device-prefetch thread |
//! | `trainer.rs` | [`Trainer`], [`TrainConfig`], evaluation |
//! | `report.rs` | [`TrainReport`], [`Verdict`], tables |
//! | `checkpoint.rs` | safetensors + JSON checkpoints, background loading |
//! | `predict.rs` | [`Predictor`] and prediction latency |
//! | `tensorboard.rs` | [`EventWriter`]: `events.out.tfevents.*` files |
//!
//! Invariants: every thread started here (prefetch, checkpoint loading) is
//! joined when its owner is dropped; channels are bounded. On CUDA the clock
//! is read only after `device.synchronize()`, so compute times are kernel
//! times, not launch times.

mod checkpoint;
mod model;
mod optim;
mod predict;
mod prefetch;
mod report;
mod tensor;
mod tensorboard;
mod timing;
mod trainer;

pub use checkpoint::{
    Checkpoint, CheckpointLoad, CheckpointMeta, DefaultMeta, FeatureMeta, SchemaMeta,
};
pub use model::{Model, ModelConfig};
pub use optim::{OptimizerConfig, OptimizerKind};
pub use predict::{PredictReport, PredictionLatency, Predictor};
pub use prefetch::{BatchStream, BoxError, IterStream, WithBottleneck};
pub use report::{EpochReport, Startup, TrainReport, Verdict};
pub use tensor::{
    BatchTensors, InputSelection, InputSpec, SkippedFeature, Standardize, batch_to_tensors,
    classes_from_metadata,
};
pub use tensorboard::{EventWriter, Scalar};
pub use timing::{Phase, PhaseSummary};
pub use trainer::{Evaluation, Progress, TestOpener, TrainConfig, Trainer, parse_device};

/// Errors of training, evaluation, checkpoints and prediction.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// `--device cuda` in a build without the `cuda` feature, or a bad device name.
    #[error("{0}")]
    Device(String),
    /// The batch does not fit the model's input (missing column, ragged, wrong size, bad label).
    #[error("batch {batch}: {reason}")]
    Input { batch: u64, reason: String },
    /// A configuration that cannot work (empty hidden sizes, CNN on non-28x28 input, ...).
    #[error("invalid training configuration: {0}")]
    Config(String),
    /// The data source failed (I/O, corruption, parse error), as reported by the pipeline.
    #[error("data: {0}")]
    Data(#[source] BoxError),
    /// A tensor operation failed inside candle.
    #[error("{context}: {source}")]
    Candle {
        context: &'static str,
        #[source]
        source: candle_core::Error,
    },
    /// A checkpoint that cannot be written or read.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        path: std::path::PathBuf,
        reason: String,
    },
    /// A TensorBoard event file that cannot be written.
    #[error("event file {path}: {source}")]
    Events {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A worker thread (prefetch, checkpoint load) panicked.
    #[error("{0} thread panicked: {1}")]
    Panic(&'static str, String),
}

impl TrainError {
    pub(crate) fn candle(context: &'static str) -> impl FnOnce(candle_core::Error) -> TrainError {
        move |source| TrainError::Candle { context, source }
    }
}

/// The text of a panic payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}
