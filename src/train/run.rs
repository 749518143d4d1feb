//! A training run assembled from its parts: where it writes
//! ([`RunOutputs`]) and the data it reads ([`TrainData::fit`]). What
//! `tfpipe train`, the demo and any program that trains on TFRecord files
//! share; the command line adds only its progress display.

use std::path::PathBuf;

use crate::Location;
use crate::example::{BatchParser, Schema};
use crate::pipeline::{Pipeline, Remainder};

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
    /// let input = InputSpec { features: vec![("x".into(), 4)], label: Some("y".into()), task: Task::Classification { classes: 2 }, standardize: vec![], tokens: None, impute: None };
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
        let fitted = match validation {
            Some(v) => {
                let v = v.clone();
                let mut open_validation = move || v.open(0);
                trainer.fit(open, Some(&mut open_validation))
            }
            None => trainer.fit(open, None),
        };
        let mut report = fitted.map_err(|e| locate_label(e, self, validation))?;
        if self.token_feature().is_some() {
            report.sequences = super::SequenceReport::new(&self.sequences, &self.padding);
        }
        if self.missing_labels.skips() {
            report.skipped_unlabelled = Some(self.missing_labels.skipped());
        }
        Ok(report)
    }
}

/// A label error named by its record: the first record of `data` (then of
/// `validation`) whose label is outside the classes, found by reading the
/// label alone, in file order. The batches are shuffled, so the trainer
/// knows only a batch and a row; the scan runs only once training has
/// failed. Any other error, or a label not found again, is returned as is.
fn locate_label(error: TrainError, data: &TrainData, validation: Option<&TrainData>) -> TrainError {
    let TrainError::Label {
        batch,
        row,
        location: None,
        name,
        value,
        classes,
    } = error
    else {
        return error;
    };
    let found = std::iter::once(data)
        .chain(validation)
        .find_map(|d| d.first_label_outside(&name, classes));
    let (location, value) = match found {
        Some((at, v)) => (Some(at), v),
        None => (None, value),
    };
    TrainError::Label {
        batch,
        row,
        location,
        name,
        value,
        classes,
    }
}

impl TrainData {
    /// The first record (files in order, this rank's share) whose `label`
    /// is an integer outside `0..classes`, with its value; `None` when none
    /// is, or the data cannot be read (its own error then comes elsewhere).
    fn first_label_outside(&self, label: &str, classes: usize) -> Option<(Location, i64)> {
        let spec = self.schema.feature(label)?.clone();
        let schema = Schema {
            features: vec![spec],
            label: Some(label.to_string()),
        };
        let mut parser = BatchParser::new(schema).ok()?;
        let mut files = Pipeline::tfrecord_files(&self.files)
            .ok()?
            .reader_options(self.reader.clone());
        if let Some(rank) = self.rank {
            files = files.rank(rank, Remainder::Drop).ok()?;
        }
        for record in files.records().start().ok()? {
            let record = record.ok()?;
            let Ok(batch) = parser.parse_one(&record) else {
                continue;
            };
            let Some(&v) = batch
                .columns
                .first()
                .and_then(|c| c.values.as_i64()?.first())
            else {
                continue;
            };
            if v < 0 || v as u64 >= classes as u64 {
                return Some((record.position()?.location(), v));
            }
        }
        None
    }
}
