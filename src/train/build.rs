//! Building a [`Trainer`]: from a model of one's own ([`Trainer::new`]) or
//! a built-in one ([`Trainer::builtin`]), and restoring a checkpoint into
//! it when the config resumes one (every decision through [`Resume`]).
//!
//! Invariant: a trainer that exists is ready to step: its model fits the
//! input spec, its optimizer is built over the model's variables, and a
//! resumed checkpoint's weights (and, where it can, optimizer state) are
//! loaded.

use std::time::{Duration, Instant};

use candle_nn::VarMap;

use super::checkpoint::CheckpointLoad;
use super::model::{BuiltinModel, Model, ModelConfig};
use super::optim::{OptimizerConfig, TrainOptimizer};
use super::report::DeviceStartup;
use super::trainer::State;
use super::{ModelChoiceError, Resume, Setting, TrainConfig, TrainError, Trainer};

impl Trainer {
    /// A trainer for `model` (whose variables are in `varmap`) with
    /// `optimizer` over them. With [`Reproducibility::resume`](super::Reproducibility::resume), the checkpoint's weights
    /// load into `varmap` (every variable by name and shape) and, when both
    /// the checkpoint and `optimizer` carry optimizer state, that too; a
    /// foreign optimizer restarts its moments (see [`warnings`](Self::warnings)).
    pub fn new(
        config: TrainConfig,
        model: impl Model + 'static,
        varmap: VarMap,
        optimizer: impl TrainOptimizer + Send + 'static,
    ) -> Result<Trainer, TrainError> {
        let resume = read_resume(&config)?;
        Trainer::from_parts(
            config,
            Box::new(model),
            varmap,
            Box::new(optimizer),
            None,
            resume,
        )
    }

    /// A trainer for a built-in model with one of our optimizers: weights
    /// drawn from the config's seed, or loaded from the checkpoint it
    /// resumes (which must hold the same model).
    pub fn builtin(
        mut config: TrainConfig,
        model: ModelConfig,
        optimizer: OptimizerConfig,
    ) -> Result<Trainer, TrainError> {
        model.validate()?;
        optimizer.validate()?;
        model.check_input(&config.input.spec)?;
        // Ids are checked against the table's size.
        if let (ModelConfig::Embedding { vocab, .. }, Some(tokens)) =
            (&model, config.input.spec.tokens.as_mut())
        {
            tokens.vocab = Some(*vocab);
        }
        // Read once: the model is checked against it before any weights
        // are drawn, and the same read restores them.
        let resume = read_resume(&config)?;
        if let Some((resume, _)) = &resume {
            resume.check_model(&model)?;
        }
        // Weights drawn on the host and uploaded, optimizer state allocated.
        let upload = Instant::now();
        let (built, varmap) = BuiltinModel::init(
            model.clone(),
            config.reproducibility.seed,
            &config.placement.device,
        )?;
        let optim = optimizer.build(varmap.all_vars())?;
        let weights_upload_ms = upload.elapsed().as_secs_f64() * 1e3;
        let mut trainer =
            Trainer::from_parts(config, Box::new(built), varmap, optim, Some(model), resume)?;
        trainer.device_startup.weights_upload_ms = Some(weights_upload_ms);
        Ok(trainer)
    }

    fn from_parts(
        mut config: TrainConfig,
        model: Box<dyn Model>,
        varmap: VarMap,
        optim: Box<dyn TrainOptimizer + Send>,
        builtin: Option<ModelConfig>,
        resume: Option<(Resume, Duration)>,
    ) -> Result<Trainer, TrainError> {
        if config.length.epochs == Some(0) || config.length.steps == Some(0) {
            return Err(TrainError::config(
                Setting::RunLength,
                "nothing to do: 0 epochs or 0 steps",
            ));
        }
        if model.task() != config.input.spec.task {
            return Err(TrainError::Model(ModelChoiceError::TaskMismatch {
                model: model.describe(),
                model_task: model.task(),
                input_task: config.input.spec.task,
            }));
        }
        let mut state = State {
            model,
            varmap,
            optim,
            builtin,
            step: 0,
            epoch: 0,
            position: None,
        };
        let mut warnings = Vec::new();
        let mut checkpoint_load = None;
        if let Some((resume, read)) = resume {
            let start = Instant::now();
            let input = &mut config.input.spec;
            resume.check_input(input)?;
            warnings = resume.restore(&state.varmap, &mut state.optim)?;
            let meta = resume.meta();
            state.step = meta.step;
            state.epoch = meta.epoch;
            state.position = meta
                .pipeline_state
                .as_ref()
                .and_then(|v| serde_json::from_value(v.clone()).ok());
            // Scale inputs as the checkpoint's model was trained.
            if input.standardize.is_empty() {
                input.standardize = meta.input.standardize.clone();
            }
            config.reproducibility.seed = resume.seed();
            let load_ms = (start.elapsed() + read).as_secs_f64() * 1e3;
            checkpoint_load = Some(CheckpointLoad {
                load_ms,
                pipeline_warmup_ms: 0.0,
                overlap_ms: 0.0,
            });
        }
        Ok(Trainer {
            config,
            state,
            observers: Vec::new(),
            stopped_early: false,
            checkpoint_load,
            warnings,
            device_startup: DeviceStartup::default(),
            ready_at: Instant::now(),
        })
    }
}

/// The checkpoint `config` resumes, read, and how long reading it took
/// (part of the report's checkpoint load time).
fn read_resume(config: &TrainConfig) -> Result<Option<(Resume, Duration)>, TrainError> {
    let Some(dir) = &config.reproducibility.resume else {
        return Ok(None);
    };
    let start = Instant::now();
    let resume = Resume::read(dir)?;
    Ok(Some((resume, start.elapsed())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{InputSpec, OptimizerKind, Reproducibility, RunLength, Task};

    fn input(classes: usize) -> InputSpec {
        InputSpec {
            features: vec![("x".into(), 4)],
            label: Some("y".into()),
            task: Task::Classification { classes },
            standardize: vec![],
            tokens: None,
            impute: None,
        }
    }

    fn mlp(classes: usize) -> ModelConfig {
        ModelConfig::Mlp {
            inputs: 4,
            hidden: vec![3],
            classes,
        }
    }

    fn sgd() -> OptimizerConfig {
        OptimizerConfig::default_for(OptimizerKind::Sgd)
    }

    #[test]
    fn a_built_trainer_is_ready_and_refuses_what_cannot_train() {
        let trainer = Trainer::builtin(TrainConfig::new(input(2)), mlp(2), sgd()).unwrap();
        assert_eq!((trainer.global_step(), trainer.epoch()), (0, 0));
        assert!(trainer.warnings().is_empty());
        // A model that does not fit the input, by the model-choice rules.
        let Err(TrainError::Model(ModelChoiceError::TaskMismatch { .. })) =
            Trainer::builtin(TrainConfig::new(input(3)), mlp(2), sgd())
        else {
            panic!("a 2-class model trained on 3 classes");
        };
        // Nothing to do is a configuration error naming the run's length.
        let none = TrainConfig::new(input(2)).length(RunLength::new().epochs(0));
        let Err(TrainError::Config { setting, .. }) = Trainer::builtin(none, mlp(2), sgd()) else {
            panic!("0 epochs accepted");
        };
        assert_eq!(setting, Setting::RunLength);
    }

    #[test]
    fn resuming_loads_the_checkpoint_and_refuses_another_model_or_input() {
        let dir = tempfile::tempdir().unwrap();
        let first = Trainer::builtin(TrainConfig::new(input(2)), mlp(2), sgd()).unwrap();
        first.save(dir.path()).unwrap();
        let resume = || Reproducibility::new().resume(dir.path().to_path_buf());
        let config = TrainConfig::new(input(2)).reproducibility(resume());
        let resumed = Trainer::builtin(config, mlp(2), sgd()).unwrap();
        let weights = |t: &Trainer| {
            let mut all: Vec<(String, Vec<f32>)> = t
                .varmap()
                .data()
                .lock()
                .unwrap()
                .iter()
                .map(|(n, v)| (n.clone(), v.flatten_all().unwrap().to_vec1().unwrap()))
                .collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            all
        };
        assert_eq!(weights(&first), weights(&resumed));
        // Another model: its weights could not load.
        let config = TrainConfig::new(input(2)).reproducibility(resume());
        let wider = ModelConfig::Mlp {
            inputs: 4,
            hidden: vec![5],
            classes: 2,
        };
        assert!(matches!(
            Trainer::builtin(config, wider, sgd()),
            Err(TrainError::Checkpoint { .. })
        ));
        // Other inputs, with a model of one's own: refused by the same rules.
        let varmap = VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(
            &varmap,
            candle_core::DType::F32,
            &candle_core::Device::Cpu,
        );
        let other = InputSpec {
            features: vec![("z".into(), 4)],
            ..input(2)
        };
        let model = BuiltinModel::new(mlp(2), vb).unwrap();
        let optimizer = sgd().build(varmap.all_vars()).unwrap();
        let config = TrainConfig::new(other).reproducibility(resume());
        assert!(matches!(
            Trainer::new(config, model, varmap, optimizer),
            Err(TrainError::Checkpoint { .. })
        ));
    }
}
