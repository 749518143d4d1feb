//! Resuming a run from a checkpoint: every decision a resumed run takes
//! from the checkpoint, in one place.
//!
//! [`Resume::read`] reads (and verifies) `checkpoint.json` once. Its
//! methods decide, for the command line, the demo, the Python package and
//! [`Trainer`](super::Trainer) alike:
//! - the model: the checkpoint's, unless another is asked for
//!   ([`Resume::model`]);
//! - the optimizer: the one asked for, with the checkpoint's settings when
//!   it is the same kind ([`Resume::optimizer`]);
//! - the seed: always the checkpoint's, so the resumed epochs shuffle as
//!   the uninterrupted run's would have ([`Resume::seed`]);
//! - the label vocabulary: the checkpoint's, so class ids keep their
//!   meaning ([`Resume::label_vocabulary`]);
//! - the data position: exact, or the start of the checkpoint's epoch, or
//!   a refusal naming what changed ([`Resume::position`]);
//! - the weights and the optimizer state, with a warning for whatever
//!   cannot be restored ([`Resume::restore`], used by the trainer).

use std::path::{Path, PathBuf};

use candle_nn::VarMap;

use super::checkpoint::{Checkpoint, CheckpointError, CheckpointMeta};
use super::optim::{OptimizerConfig, OptimizerKind, TrainOptimizer};
use super::{DataFingerprint, InputSpec, ModelConfig, TrainError};

/// A checkpoint being resumed: every decision a resumed run takes from
/// it. The command line, the demo and [`Trainer`](super::Trainer) all
/// resume through it, so they resume alike.
#[derive(Debug, Clone)]
pub struct Resume {
    dir: PathBuf,
    meta: CheckpointMeta,
}

/// Where a resumed run's data starts.
#[derive(Debug, Clone, PartialEq)]
pub enum ResumeAt {
    /// Exactly where the checkpoint's run stopped: its pipeline state.
    Exact(serde_json::Value),
    /// At the start of the checkpoint's epoch: the checkpoint recorded no
    /// position, or a forced resume made the position meaningless.
    EpochStart {
        /// The epoch the run resumes with.
        epoch: u64,
        /// Why not exactly: `None` when the checkpoint holds no position
        /// (it was saved at an epoch's end, or by an older version),
        /// else the differences a forced resume accepted.
        forced: Option<Vec<String>>,
    },
}

impl ResumeAt {
    /// The pipeline state to start from, when exact.
    pub fn pipeline_state(&self) -> Option<&serde_json::Value> {
        match self {
            ResumeAt::Exact(state) => Some(state),
            ResumeAt::EpochStart { .. } => None,
        }
    }
}

impl Resume {
    /// Reads the checkpoint in `dir` (its metadata, checksum verified; the
    /// weights load later, into the model).
    ///
    /// ```no_run
    /// use tfpipe::train::{OptimizerKind, Resume};
    ///
    /// let resume = Resume::read("checkpoints/mnist")?;
    /// println!("epoch {}, seed {}", resume.meta().epoch, resume.seed());
    /// let optimizer = resume.optimizer(None); // the checkpoint's, settings and all
    /// let sgd = resume.optimizer(Some(OptimizerKind::Sgd)); // another: its defaults
    /// # Ok::<(), tfpipe::train::TrainError>(())
    /// ```
    pub fn read(dir: impl AsRef<Path>) -> Result<Resume, TrainError> {
        let dir = dir.as_ref().to_path_buf();
        let meta = Checkpoint::read_meta(&dir)?;
        Ok(Resume { dir, meta })
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Everything `checkpoint.json` records.
    pub fn meta(&self) -> &CheckpointMeta {
        &self.meta
    }

    /// The built-in model to rebuild: the checkpoint's (`None` for a custom
    /// model, which the caller rebuilds in code).
    pub fn model(&self) -> Option<&ModelConfig> {
        self.meta.model.as_ref()
    }

    /// Fails unless `model` is the checkpoint's: its weights could not load.
    pub fn check_model(&self, model: &ModelConfig) -> Result<(), TrainError> {
        if self.meta.model.as_ref() == Some(model) {
            return Ok(());
        }
        Err(self.error(CheckpointError::Model {
            found: self.meta.model_description.clone(),
            wanted: model.describe(),
        }))
    }

    /// The optimizer: `requested` (by default the checkpoint's kind, else
    /// AdamW), with the checkpoint's settings when it is the same kind and
    /// the kind's defaults otherwise. The caller applies its own overrides
    /// (learning rate, ...) on top.
    pub fn optimizer(&self, requested: Option<OptimizerKind>) -> OptimizerConfig {
        let saved = self.meta.optimizer;
        let kind = requested
            .or(saved.map(|o| o.kind))
            .unwrap_or(OptimizerKind::AdamW);
        match saved {
            Some(o) if o.kind == kind => o,
            _ => OptimizerConfig::default_for(kind),
        }
    }

    /// The run's seed: the checkpoint's. One seed schedule per training,
    /// so the resumed epochs shuffle (and draw) as the uninterrupted run's.
    pub fn seed(&self) -> u64 {
        self.meta.seed
    }

    /// The class names the model was trained with, in class-id order.
    pub fn label_vocabulary(&self) -> Option<&[String]> {
        self.meta.label_vocabulary.as_deref()
    }

    /// Where the data resumes. `now` is the fingerprint of this run's data
    /// (`None`: not taken, nothing to compare). A checkpoint trained on
    /// other data is refused ([`CheckpointError::OtherData`]), unless only
    /// the batch size changed and `force` is set: then the run restarts the
    /// checkpoint's epoch, inexactly, and says so.
    pub fn position(
        &self,
        now: Option<&DataFingerprint>,
        force: bool,
    ) -> Result<ResumeAt, TrainError> {
        let epoch_start = |forced| ResumeAt::EpochStart {
            epoch: self.meta.epoch,
            forced,
        };
        if let (Some(then), Some(now)) = (self.meta.data.as_ref(), now) {
            let differences = then.differences(now);
            let only_batch_size = then.only_batch_size_differs(now);
            if force && only_batch_size {
                return Ok(epoch_start(Some(differences)));
            }
            if !differences.is_empty() {
                return Err(self.error(CheckpointError::OtherData {
                    differences,
                    only_batch_size,
                }));
            }
        }
        Ok(match &self.meta.pipeline_state {
            Some(state) => ResumeAt::Exact(state.clone()),
            None => epoch_start(None),
        })
    }

    /// Fails unless `input` is what the checkpoint's model was trained on
    /// (the same features, imputation and task).
    pub fn check_input(&self, input: &InputSpec) -> Result<(), TrainError> {
        let trained = &self.meta.input;
        if trained.features != input.features {
            return Err(self.error(CheckpointError::Inputs {
                trained: describe_inputs(trained),
                found: describe_inputs(input),
            }));
        }
        if trained.impute != input.impute {
            let describe = |i: &Option<super::Imputation>| {
                i.as_ref()
                    .map_or("missing inputs not imputed".to_string(), |i| i.to_string())
            };
            return Err(self.error(CheckpointError::Imputation {
                trained: describe(&trained.impute),
                found: describe(&input.impute),
            }));
        }
        if trained.task != input.task {
            return Err(self.error(CheckpointError::Inputs {
                trained: format!("{:?}", trained.task),
                found: format!("{:?}", input.task),
            }));
        }
        Ok(())
    }

    /// Loads the weights into `varmap` and, when the checkpoint holds state
    /// for the same kind of optimizer as `optimizer`, that state. Returns a
    /// warning for each thing that could not be restored (the optimizer's
    /// moments then restart).
    pub fn restore(
        &self,
        varmap: &VarMap,
        optimizer: &mut dyn TrainOptimizer,
    ) -> Result<Vec<String>, TrainError> {
        Checkpoint::load_weights(&self.dir, varmap)?;
        let saved = self.meta.optimizer.map(|o| o.kind);
        let same_kind = saved == optimizer.config().map(|c| c.kind);
        let described = optimizer.describe();
        let mut warnings = Vec::new();
        match (self.meta.optimizer_state, optimizer.state_mut()) {
            (true, Some(state)) if same_kind => {
                Checkpoint::load_optimizer(&self.dir, &self.meta, varmap, state)?;
            }
            (_, None) => warnings.push(format!(
                "the optimizer ({described}) does not expose its state, so resuming restarts its moments"
            )),
            (false, Some(_)) => warnings.push(
                "the checkpoint holds no optimizer state; the optimizer's moments restart"
                    .to_string(),
            ),
            (true, Some(_)) => warnings.push(format!(
                "the checkpoint's optimizer state is for {}; {described} starts afresh",
                saved.map_or("another optimizer".into(), |k| k.to_string()),
            )),
        }
        Ok(warnings)
    }

    fn error(&self, source: CheckpointError) -> TrainError {
        TrainError::checkpoint(self.dir.clone(), source)
    }
}

/// `inputs pixels[784], age[1]`.
fn describe_inputs(input: &InputSpec) -> String {
    let list: Vec<String> = input
        .features
        .iter()
        .map(|(name, width)| format!("{name}[{width}]"))
        .collect();
    format!("inputs {}", list.join(", "))
}
