//! A training run assembled from its parts: where it writes
//! ([`RunOutputs`]) and the data it reads ([`TrainData::fit`]). What
//! `tfpipe train`, the demo and any program that trains on TFRecord files
//! share; the command line adds only its progress display.

use std::path::PathBuf;

use super::{
    Checkpointer, EarlyStopping, Monitor, TensorBoard, TrainData, TrainError, TrainReport, Trainer,
};

/// How often TensorBoard gets the training loss, in steps.
const TENSORBOARD_EVERY: u64 = 10;

/// Where a run writes, and when it stops early: each set field becomes the
/// observer that does it ([`observe`](Self::observe)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOutputs {
    /// The checkpoint directory, written at the end (and as below).
    pub save: Option<PathBuf>,
    /// TensorBoard's log directory (`train/` and `validation/` runs).
    pub logdir: Option<PathBuf>,
    /// Also checkpoint every this many steps.
    pub checkpoint_every: Option<u64>,
    /// Checkpoint only when the monitored number improves.
    pub keep_best: Option<Monitor>,
    /// Stop after this many epochs without improvement of the monitored number.
    pub early_stopping: Option<(Monitor, u64)>,
}

impl RunOutputs {
    /// Adds to `trainer` the observers these outputs need: a
    /// [`Checkpointer`], a [`TensorBoard`] writer, [`EarlyStopping`].
    /// Fails when the log directory cannot be created.
    ///
    /// ```
    /// use tfpipe::train::*;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let input = InputSpec { features: vec![("x".into(), 4)], label: Some("y".into()), task: Task::Classification { classes: 2 }, standardize: vec![], tokens: None };
    /// let model = ModelConfig::Mlp { inputs: 4, hidden: vec![8], classes: 2 };
    /// let mut trainer = Trainer::builtin(TrainConfig::new(input), model, OptimizerConfig::default_for(OptimizerKind::Sgd))?;
    /// let outputs = RunOutputs { save: Some(dir.path().join("ckpt")), keep_best: Some(Monitor::Loss), ..RunOutputs::default() };
    /// outputs.observe(&mut trainer)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn observe(&self, trainer: &mut Trainer) -> Result<(), TrainError> {
        if let Some(dir) = &self.logdir {
            trainer.observe(TensorBoard::create(dir, TENSORBOARD_EVERY)?);
        }
        if let Some(dir) = &self.save {
            let mut checkpointer = Checkpointer::new(dir);
            if let Some(n) = self.checkpoint_every {
                checkpointer = checkpointer.every(n);
            }
            if let Some(monitor) = self.keep_best {
                checkpointer = checkpointer.keep_best(monitor);
            }
            trainer.observe(checkpointer);
        }
        if let Some((monitor, patience)) = self.early_stopping {
            trainer.observe(EarlyStopping::new(monitor, patience));
        }
        Ok(())
    }
}

impl TrainData {
    /// Trains `trainer` on this data: one pipeline for the whole run,
    /// from its start, or from `position`, the pipeline position a resumed
    /// checkpoint recorded ([`Resume::position`](super::Resume::position));
    /// `validation` is evaluated after every epoch. Without a position, a
    /// resumed trainer restarts its epoch from the beginning.
    pub fn fit(
        &self,
        trainer: &mut Trainer,
        position: Option<serde_json::Value>,
        validation: Option<&TrainData>,
    ) -> Result<TrainReport, TrainError> {
        if position.is_none() {
            trainer.restart_epoch();
        }
        let open = self.opener(position);
        let mut report = match validation {
            Some(v) => {
                let v = v.clone();
                let mut open_validation = move || v.open(0);
                trainer.fit(open, Some(&mut open_validation))
            }
            None => trainer.fit(open, None),
        }?;
        if self.token_feature().is_some() {
            report.sequences = super::SequenceReport::new(&self.sequences, &self.padding);
        }
        Ok(report)
    }
}
