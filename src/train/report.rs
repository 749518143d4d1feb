//! The training report: what the user reads after `tfpipe train`, as a table
//! (`Display`) and as JSON (`serde`, the keys `--report-json` promises).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::checkpoint::CheckpointLoad;
use super::model::Task;
use super::objective::Evaluation;
use super::tensor::{SkippedFeature, join};
use super::timing::PhaseSummary;

/// TensorFlow profiler's input-bound verdict from the stall fraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// Under 5% of step time waiting for input.
    #[serde(rename = "not input-bound")]
    NotInputBound,
    /// 5% to 20%.
    #[serde(rename = "moderately input-bound")]
    ModeratelyInputBound,
    /// 20% or more.
    #[serde(rename = "highly input-bound")]
    HighlyInputBound,
}

impl Verdict {
    /// The verdict for a stall fraction (data wait over step time, 0..=1).
    pub fn from_stall(fraction: f64) -> Verdict {
        if fraction < 0.05 {
            Verdict::NotInputBound
        } else if fraction < 0.20 {
            Verdict::ModeratelyInputBound
        } else {
            Verdict::HighlyInputBound
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::NotInputBound => "not input-bound",
            Verdict::ModeratelyInputBound => "moderately input-bound",
            Verdict::HighlyInputBound => "highly input-bound",
        })
    }
}

/// Start-up milestones in milliseconds from process start (or from the
/// trainer's origin instant).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Startup {
    /// The pipeline (first epoch's stream) constructed.
    pub pipeline_built: f64,
    /// The first batch arrived as tensors on the device.
    pub first_batch: f64,
    /// The model initialised (weights on the device) or loaded from the
    /// checkpoint: when the trainer was made, before `fit` opened the data.
    pub model_ready: f64,
    /// The first training step finished.
    pub first_step: f64,
}

/// The device's share of start-up, in milliseconds (durations, not
/// milestones). On CUDA: creating the context (with cuBLAS and cuRAND
/// handles), drawing the weights on the host and uploading them, and the
/// first kernel. On the CPU there is nothing to create, upload or warm up,
/// so `device_init_ms` and `weights_upload_ms` are about 0 (the weights are
/// drawn in place) and `first_kernel_ms` is `None` ("n/a" in the table).
///
/// The first kernel is a one-element kernel plus `synchronize`, run once
/// per trainer while the pipeline starts (overlapped with its start-up):
/// the driver loads (JIT-compiles) that kernel's module and launches it.
/// The first training step, which loads the other modules it uses, is
/// [`TrainReport::first_step_ms`], to compare with the steady step.
///
/// ```
/// let d = tfpipe::train::DeviceStartup::default();
/// assert_eq!(d.first_kernel_ms, None);
/// assert!(serde_json::to_string(&d).unwrap().contains("\"weights_upload_ms\""));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceStartup {
    /// Creating the device ([`parse_device`](super::parse_device)), as the
    /// caller reported it with
    /// [`Trainer::record_device_init`](super::Trainer::record_device_init);
    /// 0 when not reported.
    #[serde(default)]
    pub device_init_ms: f64,
    /// Building the model: weights drawn on the host and uploaded, optimizer
    /// state allocated on the device ([`Trainer::builtin`](super::Trainer::builtin)).
    /// `None` for a model built outside the trainer ([`Trainer::new`](super::Trainer::new)).
    #[serde(default)]
    pub weights_upload_ms: Option<f64>,
    /// The first kernel on the device, synchronized (warm-up). `None` on the CPU.
    #[serde(default)]
    pub first_kernel_ms: Option<f64>,
}

impl fmt::Display for DeviceStartup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1} ms"));
        write!(
            f,
            "init {:.1} ms, weights drawn and uploaded {}, first kernel (warm-up) {}",
            self.device_init_ms,
            ms(self.weights_upload_ms),
            ms(self.first_kernel_ms)
        )
    }
}

/// One epoch's numbers, with Keras' names (`loss`, `accuracy`,
/// `val_loss`, `val_accuracy`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochReport {
    /// The epoch number (continues after `--resume`).
    pub epoch: u64,
    /// Steps in this epoch.
    pub steps: u64,
    /// Examples trained on in this epoch.
    pub examples: u64,
    /// Mean training loss per example over the epoch.
    pub loss: f64,
    /// Training accuracy over the epoch (classification; fraction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Training mean absolute error (regression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mae: Option<f64>,
    /// Training root mean squared error (regression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rmse: Option<f64>,
    /// Loss on the validation data after this epoch.
    pub val_loss: Option<f64>,
    /// Accuracy on the validation data after this epoch (classification; fraction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_accuracy: Option<f64>,
    /// Validation mean absolute error (regression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_mae: Option<f64>,
    /// Validation root mean squared error (regression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_rmse: Option<f64>,
    /// The learning rate at the end of the epoch.
    pub learning_rate: f64,
    /// Data wait over step time in this epoch.
    pub stall_fraction: f64,
    /// Wall time of the epoch (training and evaluation), ms.
    pub wall_ms: f64,
    /// From the epoch's start to its first batch, ms: opening the data
    /// (when a stream is opened for the epoch) and waiting for the batch.
    /// For the run's first epoch this is start-up.
    #[serde(default)]
    pub first_wait_ms: f64,
}

impl EpochReport {
    /// The report of an epoch from its training and validation numbers.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        epoch: u64,
        steps: u64,
        examples: u64,
        train: &Evaluation,
        validation: Option<&Evaluation>,
        learning_rate: f64,
        stall_fraction: f64,
        wall_ms: f64,
    ) -> EpochReport {
        EpochReport {
            epoch,
            steps,
            examples,
            loss: train.loss,
            accuracy: train.accuracy,
            mae: train.mae,
            rmse: train.rmse,
            val_loss: validation.map(|v| v.loss),
            val_accuracy: validation.and_then(|v| v.accuracy),
            val_mae: validation.and_then(|v| v.mae),
            val_rmse: validation.and_then(|v| v.rmse),
            learning_rate,
            stall_fraction,
            wall_ms,
            first_wait_ms: 0.0,
        }
    }

    /// The line Keras users know: `epoch 3  loss 0.1234  accuracy 96.10%  val_loss ...`.
    pub fn line(&self) -> String {
        let mut s = format!("epoch {:<4} loss {:.4}", self.epoch, self.loss);
        let metrics = |prefix: &str, acc: Option<f64>, mae: Option<f64>, rmse: Option<f64>| {
            let mut m = String::new();
            if let Some(a) = acc {
                m += &format!("  {prefix}accuracy {:.2}%", a * 100.0);
            }
            if let Some(a) = mae {
                m += &format!("  {prefix}mae {a:.4}");
            }
            if let Some(a) = rmse {
                m += &format!("  {prefix}rmse {a:.4}");
            }
            m
        };
        s += &metrics("", self.accuracy, self.mae, self.rmse);
        if let Some(l) = self.val_loss {
            s += &format!("  val_loss {l:.4}");
            s += &metrics("val_", self.val_accuracy, self.val_mae, self.val_rmse);
        }
        s += &format!(
            "  lr {:.3e}  stall {:.1}%  ({:.0} ms)",
            self.learning_rate,
            self.stall_fraction * 100.0,
            self.wall_ms
        );
        s
    }
}

/// Everything `tfpipe train` reports. Times in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainReport {
    /// The model, e.g. `mlp 784-256-10`.
    pub model: String,
    /// The optimizer, e.g. `adamw lr=0.001`.
    pub optimizer: String,
    /// The device, e.g. `cpu` or `cuda:0`.
    pub device: String,
    /// What the model learns.
    pub task: Task,
    /// Examples trained on in this run.
    pub examples: u64,
    /// Steps in this run.
    pub steps: u64,
    /// The global step after this run (continues after `--resume`).
    pub global_step: u64,
    /// Wall time of the whole `fit`: start-up, steps, evaluation.
    pub wall_ms: f64,
    /// `examples` over `wall_ms`.
    pub examples_per_sec: f64,
    /// Data wait over step time (data wait + copy + compute), 0..=1.
    pub stall_fraction: f64,
    /// TensorFlow profiler's verdict for `stall_fraction`.
    pub verdict: Verdict,
    /// The pipeline's slowest stage, from its metrics (when the source has them).
    pub bottleneck_stage: Option<String>,
    /// Time blocked on the next batch, per step.
    pub data_wait_ms: PhaseSummary,
    /// Batch-to-tensor conversion and host-to-device copy, per step.
    pub copy_ms: PhaseSummary,
    /// Whether the copy ran on the prefetch thread, overlapped with compute
    /// (then it is not part of the step time).
    pub copy_overlapped: bool,
    /// Forward, backward and optimizer update, per step.
    pub compute_ms: PhaseSummary,
    /// Time spent evaluating on the test data.
    pub eval_ms: f64,
    /// The rest of the wall time: waiting for the model at start-up,
    /// checkpoint and event-file writes, progress callbacks.
    pub other_ms: f64,
    /// Start-up milestones from process start.
    pub startup_ms: Startup,
    /// The device's start-up: context, weights upload, first kernel.
    #[serde(default)]
    pub device_startup_ms: DeviceStartup,
    /// The first (warm-up) step: copy + compute.
    pub first_step_ms: f64,
    /// The median of the later steps' copy + compute.
    pub steady_step_ms_p50: f64,
    /// Validation loss after the last epoch.
    pub val_loss: Option<f64>,
    /// Validation accuracy after the last epoch (classification; fraction).
    pub val_accuracy: Option<f64>,
    /// Validation mean absolute error after the last epoch (regression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_mae: Option<f64>,
    /// Validation root mean squared error after the last epoch (regression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_rmse: Option<f64>,
    /// The checkpoint load when resuming (before the pipeline starts), and
    /// the pipeline's warm-up.
    pub checkpoint_load: Option<CheckpointLoad>,
    /// Schema features the model did not take (bytes, variable-length, sequences).
    #[serde(default)]
    pub skipped_features: Vec<SkippedFeature>,
    /// Whether some inputs were standardised (mean and standard deviation
    /// from the first training batch, or the resumed checkpoint's).
    #[serde(default)]
    pub standardized: bool,
    /// Whether the run was interrupted (Ctrl-C) before its planned end.
    #[serde(default)]
    pub interrupted: bool,
    /// Whether an observer (early stopping) ended the run.
    #[serde(default)]
    pub stopped_early: bool,
    /// What the user should know (e.g. optimizer state not restored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// How token sequences were batched and the padding it cost (runs with a
    /// token feature, through [`TrainData::fit`](super::TrainData::fit)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequences: Option<super::SequenceReport>,
    /// Training records skipped for lacking their label, per epoch (runs
    /// that asked for it, through [`TrainData::fit`](super::TrainData::fit);
    /// see [`MissingLabels::skipped`](super::MissingLabels::skipped)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_unlabelled: Option<u64>,
    /// Per-epoch numbers.
    pub epochs: Vec<EpochReport>,
}

impl fmt::Display for TrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "model      {} ({}, {})",
            self.model, self.optimizer, self.device
        )?;
        writeln!(
            f,
            "trained    {} examples in {} steps (global step {}) in {:.0} ms: {:.0} examples/s",
            self.examples, self.steps, self.global_step, self.wall_ms, self.examples_per_sec
        )?;
        if self.standardized {
            writeln!(
                f,
                "inputs     standardised (mean and std of each feature from the first training batch)"
            )?;
        }
        if !self.skipped_features.is_empty() {
            writeln!(f, "skipped features: {}", join(&self.skipped_features))?;
        }
        if let Some(s) = &self.sequences {
            writeln!(f, "sequences  {s}")?;
        }
        if let Some(n) = self.skipped_unlabelled {
            writeln!(
                f,
                "skipped    {n} training records without a label per epoch"
            )?;
        }
        // `{:#}` leaves the per-epoch lines out (for callers that printed
        // them as the epochs ended).
        if !f.alternate() {
            for e in &self.epochs {
                writeln!(f, "{}", e.line())?;
            }
        }
        if self.interrupted {
            writeln!(f, "interrupted: training stopped early on a signal")?;
        }
        if self.stopped_early {
            writeln!(
                f,
                "early stopping: no improvement for the configured patience"
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "{:<18} {:>10} {:>9} {:>9} {:>9} {:>9}",
            "per step (ms)", "total", "p50", "p90", "p99", "max"
        )?;
        let copy_name = if self.copy_overlapped {
            "copy (overlapped)"
        } else {
            "copy"
        };
        for (name, p) in [
            ("data wait", &self.data_wait_ms),
            (copy_name, &self.copy_ms),
            ("compute", &self.compute_ms),
        ] {
            writeln!(
                f,
                "{:<18} {:>10.1} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                name, p.total, p.p50, p.p90, p.p99, p.max
            )?;
        }
        writeln!(f, "{:<18} {:>10.1}", "evaluation", self.eval_ms)?;
        writeln!(f, "{:<18} {:>10.1}", "other", self.other_ms)?;
        writeln!(f)?;
        write!(
            f,
            "stall      {:.1}% of step time waiting for input: {}",
            self.stall_fraction * 100.0,
            self.verdict
        )?;
        match &self.bottleneck_stage {
            Some(stage) if self.verdict != Verdict::NotInputBound => {
                writeln!(f, "; the pipeline's bottleneck stage is {stage:?}")?
            }
            Some(stage) => writeln!(f, " (pipeline's slowest stage: {stage:?})")?,
            None => writeln!(f)?,
        }
        let s = &self.startup_ms;
        writeln!(
            f,
            "start-up   process start -> model ready {:.1} ms -> pipeline built {:.1} ms -> first batch {:.1} ms -> first step {:.1} ms",
            s.model_ready, s.pipeline_built, s.first_batch, s.first_step
        )?;
        writeln!(f, "device     {}", self.device_startup_ms)?;
        writeln!(
            f,
            "steps      first (warm-up) {:.3} ms, steady median {:.3} ms",
            self.first_step_ms, self.steady_step_ms_p50
        )?;
        if let Some(c) = &self.checkpoint_load {
            writeln!(
                f,
                "checkpoint loaded in {:.1} ms; the pipeline then warmed up for {:.1} ms",
                c.load_ms, c.pipeline_warmup_ms
            )?;
        }
        if let Some(l) = self.val_loss {
            write!(f, "validation loss {l:.4}")?;
            if let Some(a) = self.val_accuracy {
                write!(f, ", accuracy {:.2}%", a * 100.0)?;
            }
            if let (Some(mae), Some(rmse)) = (self.val_mae, self.val_rmse) {
                write!(f, ", mae {mae:.4}, rmse {rmse:.4}")?;
            }
            writeln!(f)?;
        }
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_thresholds_are_tensorflows() {
        assert_eq!(Verdict::from_stall(0.0), Verdict::NotInputBound);
        assert_eq!(Verdict::from_stall(0.0499), Verdict::NotInputBound);
        assert_eq!(Verdict::from_stall(0.05), Verdict::ModeratelyInputBound);
        assert_eq!(Verdict::from_stall(0.1999), Verdict::ModeratelyInputBound);
        assert_eq!(Verdict::from_stall(0.20), Verdict::HighlyInputBound);
        assert_eq!(
            serde_json::to_string(&Verdict::HighlyInputBound).unwrap(),
            "\"highly input-bound\""
        );
    }
}
