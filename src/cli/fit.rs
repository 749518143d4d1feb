//! Training with the command line's display: a progress bar with the
//! step, loss, throughput and stall, and each epoch's line on stdout as it
//! ends. What `tfpipe train` and the demo share; the run itself is the
//! library's (`Trainer`, `TrainData::fit`, `RunOutputs`).

use std::io::Write;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tfpipe::train::{
    Control, EpochReport, ModelConfig, Observer, OptimizerConfig, Progress, RunInfo, RunOutputs,
    ThreadTuner, TrainConfig, TrainData, TrainError, TrainReport, Trainer,
};

use super::common::progress_bar;
use super::train_flags::with_hint;

/// A run's outputs, compute-thread tuning and start position.
#[derive(Debug, Default)]
pub(super) struct RunOptions {
    pub outputs: RunOutputs,
    /// Chooses the compute threads by measurement (see [`set_compute_threads`]).
    pub tuner: Option<ThreadTuner>,
    /// The resumed checkpoint's pipeline position (`pipeline_state`).
    pub resume_position: Option<serde_json::Value>,
    /// How long creating the device took (the report's `device_init_ms`).
    pub device_init: Duration,
}

/// Trains with a progress bar and per-epoch lines on stdout; checkpoints
/// and TensorBoard as `run` says. An interrupted run still saves.
pub(super) fn train(
    config: TrainConfig,
    model: ModelConfig,
    optimizer: OptimizerConfig,
    data: &TrainData,
    validation: Option<&TrainData>,
    run: &RunOptions,
) -> anyhow::Result<TrainReport> {
    let mut trainer = Trainer::builtin(config, model, optimizer)?;
    trainer.record_device_init(run.device_init);
    for warning in trainer.warnings() {
        eprintln!("tfpipe: warning: {warning}");
    }
    let bar = progress_bar(None);
    trainer.observe(Bar::new(bar.clone(), data.batch_size));
    if let Some(tuner) = &run.tuner {
        trainer.observe(tuner.clone());
    }
    run.outputs.observe(&mut trainer)?;
    let report = data.fit(&mut trainer, run.resume_position.clone(), validation);
    bar.finish_and_clear();
    report.map_err(with_hint)
}

/// The progress bar: steps of the run with a total and an ETA when the
/// length is known (steps, or epochs times steps per epoch, from the
/// schema's record count or the first epoch), and each epoch's line on
/// stdout as it ends.
struct Bar {
    bar: ProgressBar,
    batch_size: usize,
    epochs: Option<u64>,
}

impl Bar {
    fn new(bar: ProgressBar, batch_size: usize) -> Bar {
        Bar {
            bar,
            batch_size,
            epochs: None,
        }
    }

    fn set_length(&self, steps: u64) {
        self.bar.set_length(steps);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} step {pos}/{len} [{elapsed_precise}, ETA {eta}] {wide_bar} {msg}",
        ) {
            self.bar.set_style(style);
        }
    }
}

impl Observer for Bar {
    fn on_train_begin(&mut self, run: &RunInfo) -> Result<(), TrainError> {
        self.epochs = run.epochs;
        let per_epoch = run
            .examples_per_epoch
            .map(|n| n.div_ceil(self.batch_size as u64).max(1));
        match (run.steps, run.epochs, per_epoch) {
            (Some(steps), _, _) => self.set_length(steps),
            (None, Some(epochs), Some(per)) => self.set_length(epochs * per),
            _ => {}
        }
        Ok(())
    }

    fn on_step(&mut self, p: &Progress) -> Result<(), TrainError> {
        self.bar.set_position(p.run_steps);
        self.bar.set_message(format!(
            "epoch {}  loss {:.4}  {:.0} examples/s  stall {:.1}%",
            p.epoch,
            p.loss,
            p.examples_per_sec,
            p.stall_fraction * 100.0
        ));
        Ok(())
    }

    fn on_epoch_end(&mut self, e: &EpochReport, _: &Trainer) -> Result<Control, TrainError> {
        // Without a record count, the first epoch tells how long one is.
        if self.bar.length().is_none()
            && let Some(epochs) = self.epochs
        {
            self.set_length(epochs * e.steps);
        }
        let line = e.line();
        self.bar.suspend(|| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        });
        Ok(Control::Continue)
    }
}
