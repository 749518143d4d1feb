//! What a training run does, split by concern: [`TrainConfig`] holds one
//! part per question a run answers.
//!
//! | part | the question | default |
//! |---|---|---|
//! | [`ModelInput`] | what the model sees: inputs, schema, class names | (required) |
//! | [`RunLength`] | how long: epochs, steps | one epoch |
//! | [`Placement`] | where: device, prefetch depth | CPU, 2 batches ahead |
//! | [`Reproducibility`] | seed, the checkpoint to resume | seed 0, a fresh start |
//! | [`LrSchedule`] | the learning rate over the run | constant |
//! | [`RunControl`] | a stop flag, where start-up times count from | none, now |
//!
//! Every part is built with by-value setters whose docs end with their
//! default, so a config reads as the list of what differs from the
//! defaults. The fields are private: the trainer is the only reader, and a
//! part can grow a setting without breaking callers. The model and the
//! optimizer are not part of the config: they are given to
//! [`Trainer::new`](super::Trainer::new) or
//! [`Trainer::builtin`](super::Trainer::builtin).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use candle_core::Device;

use super::checkpoint::SchemaMeta;
use super::schedule::LrSchedule;
use super::tensor::{InputSpec, PixelScaling, SkippedFeature};

/// What a training run does: one part per concern, each built with
/// setters whose docs end with their default.
///
/// | part | the question | default |
/// |---|---|---|
/// | [`ModelInput`] | what the model sees: inputs, schema, class names | (required) |
/// | [`RunLength`] | how long: epochs, steps | one epoch |
/// | [`Placement`] | where: device, prefetch depth | CPU, 2 batches ahead |
/// | [`Reproducibility`] | seed, the checkpoint to resume | seed 0, a fresh start |
/// | [`LrSchedule`] | the learning rate over the run | constant |
/// | [`RunControl`] | a stop flag, where start-up times count from | none, now |
///
/// ```
/// use tfpipe::train::*;
///
/// let input = InputSpec {
///     features: vec![("image".into(), 784)],
///     label: Some("label".into()),
///     task: Task::Classification { classes: 10 },
///     standardize: vec![],
///     tokens: None,
///     impute: None,
/// };
/// let config = TrainConfig::new(ModelInput::new(input).label_vocabulary(
///         (0..10).map(|d| d.to_string()).collect::<Vec<_>>(),
///     ))
///     .length(RunLength::new().epochs(3))
///     .placement(Placement::new().prefetch(4))
///     .reproducibility(Reproducibility::new().seed(7));
/// assert_eq!(config.seed(), 7);
/// assert!(config.device().is_cpu());
/// assert_eq!(config.input().inputs(), 784);
/// ```
#[derive(Debug, Clone)]
pub struct TrainConfig {
    pub(super) input: ModelInput,
    pub(super) length: RunLength,
    pub(super) placement: Placement,
    pub(super) reproducibility: Reproducibility,
    pub(super) schedule: LrSchedule,
    pub(super) control: RunControl,
}

impl TrainConfig {
    /// A config for `input` (an [`InputSpec`] or a [`ModelInput`]) with
    /// every other part at its default: one epoch, on the CPU with prefetch
    /// 2, seed 0 and no resume, a constant learning rate, no stop flag.
    pub fn new(input: impl Into<ModelInput>) -> TrainConfig {
        TrainConfig {
            input: input.into(),
            length: RunLength::new(),
            placement: Placement::new(),
            reproducibility: Reproducibility::new(),
            schedule: LrSchedule::default(),
            control: RunControl::new(),
        }
    }

    /// How long the run goes. By default one epoch.
    pub fn length(mut self, length: RunLength) -> TrainConfig {
        self.length = length;
        self
    }

    /// Where the run computes. By default the CPU, prefetch 2.
    pub fn placement(mut self, placement: Placement) -> TrainConfig {
        self.placement = placement;
        self
    }

    /// The seed and the checkpoint to resume. By default seed 0, no resume.
    pub fn reproducibility(mut self, reproducibility: Reproducibility) -> TrainConfig {
        self.reproducibility = reproducibility;
        self
    }

    /// The learning-rate schedule over the optimizer's base rate. By default
    /// constant ([`LrSchedule::default`]).
    pub fn schedule(mut self, schedule: LrSchedule) -> TrainConfig {
        self.schedule = schedule;
        self
    }

    /// A stop flag and the start-up origin. By default no flag, and start-up
    /// times count from the moment [`TrainConfig::new`] ran.
    pub fn control(mut self, control: RunControl) -> TrainConfig {
        self.control = control;
        self
    }

    /// Which columns feed the model. Once a [`Trainer`](super::Trainer) is
    /// built or has trained, its standardisation is filled in (from the
    /// checkpoint or the first training batch).
    pub fn input(&self) -> &InputSpec {
        &self.input.spec
    }

    /// The seed: the configured one, or, once a trainer resumed, the
    /// checkpoint's (one seed schedule per training).
    pub fn seed(&self) -> u64 {
        self.reproducibility.seed
    }

    /// The device the run trains on.
    pub fn device(&self) -> &Device {
        &self.placement.device
    }
}

/// What the model sees: the input columns, and what checkpoints keep so
/// that `predict` can read the same data and name the classes.
///
/// ```
/// use tfpipe::train::{InputSpec, ModelInput, Task};
/// let spec = InputSpec {
///     features: vec![("x".into(), 2)],
///     label: Some("y".into()),
///     task: Task::Classification { classes: 2 },
///     standardize: vec![],
///     tokens: None,
///     impute: None,
/// };
/// let input = ModelInput::new(spec).label_vocabulary(vec!["no".to_string(), "yes".to_string()]);
/// # let _ = input;
/// ```
#[derive(Debug, Clone)]
pub struct ModelInput {
    /// When its `standardize` is empty, `fit` fills it from the first
    /// training batch (or, resuming, from the checkpoint).
    pub(super) spec: InputSpec,
    pub(super) skipped_features: Vec<SkippedFeature>,
    pub(super) schema: Option<SchemaMeta>,
    pub(super) label_vocabulary: Option<Vec<String>>,
    /// How uint8 inputs are scaled when the statistics are taken.
    pub(super) pixels: PixelScaling,
}

impl ModelInput {
    /// The model reads the columns `input` names; nothing skipped, no
    /// schema or class names recorded.
    pub fn new(input: InputSpec) -> ModelInput {
        ModelInput {
            spec: input,
            skipped_features: Vec::new(),
            schema: None,
            label_vocabulary: None,
            pixels: PixelScaling::Rescale,
        }
    }

    /// Schema features the model does not take (from
    /// [`InputSpec::from_schema`]), listed in the report. By default none.
    pub fn skipped_features(mut self, skipped: Vec<SkippedFeature>) -> ModelInput {
        self.skipped_features = skipped;
        self
    }

    /// The training data's schema, stored in checkpoints for `predict`. By
    /// default none (a checkpoint then cannot tell `predict` how to parse).
    pub fn schema(mut self, schema: SchemaMeta) -> ModelInput {
        self.schema = Some(schema);
        self
    }

    /// The class names in class-id order (the schema file's label
    /// vocabulary), stored in checkpoints for `predict`; `None` clears
    /// them. By default none (predictions carry class ids only).
    pub fn label_vocabulary(mut self, names: impl Into<Option<Vec<String>>>) -> ModelInput {
        self.label_vocabulary = names.into();
        self
    }

    /// How uint8 inputs are scaled: divided by 255 only, or then
    /// standardised with the other inputs (see
    /// [`Standardize::from_batch_with`](super::Standardize::from_batch_with)).
    /// By default [`PixelScaling::Rescale`]. A resumed checkpoint keeps the
    /// statistics it was trained with.
    pub fn pixels(mut self, pixels: PixelScaling) -> ModelInput {
        self.pixels = pixels;
        self
    }
}

impl From<InputSpec> for ModelInput {
    fn from(input: InputSpec) -> ModelInput {
        ModelInput::new(input)
    }
}

/// How long a run goes, and how long an epoch is.
///
/// With `--resume`, the counts mean more epochs or steps on top of the
/// checkpoint's.
///
/// ```
/// use tfpipe::train::RunLength;
/// // 3 epochs, but at most 1000 steps; the CLI passes options through as they are.
/// let length = RunLength::new().epochs(3).steps(1000);
/// let from_flags = RunLength::new().epochs(None::<u64>).steps(Some(1000));
/// # let _ = (length, from_flags);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunLength {
    pub(super) epochs: Option<u64>,
    pub(super) steps: Option<u64>,
    pub(super) examples_per_epoch: Option<u64>,
}

impl RunLength {
    /// One epoch (neither epochs nor steps set).
    pub fn new() -> RunLength {
        RunLength::default()
    }

    /// Epochs in this run; `None` clears the count. Whichever of epochs and
    /// steps runs out first ends the run. By default unset: with neither
    /// epochs nor steps, one epoch. 0 is refused when the trainer is built.
    pub fn epochs(mut self, epochs: impl Into<Option<u64>>) -> RunLength {
        self.epochs = epochs.into();
        self
    }

    /// Steps in this run, across epochs (the last epoch may end early);
    /// `None` clears the count. By default unset (see [`epochs`](Self::epochs)).
    pub fn steps(mut self, steps: impl Into<Option<u64>>) -> RunLength {
        self.steps = steps.into();
        self
    }

    /// Examples in one epoch, when known: progress bars show a total and an
    /// ETA from it ([`RunInfo::examples_per_epoch`](super::RunInfo)). By
    /// default unknown.
    pub fn examples_per_epoch(mut self, examples: impl Into<Option<u64>>) -> RunLength {
        self.examples_per_epoch = examples.into();
        self
    }
}

/// Where a run computes: the device, and how far ahead batches are
/// converted to its tensors.
///
/// ```
/// use tfpipe::train::{Placement, parse_device};
/// let placement = Placement::new().device(parse_device("cpu")?).prefetch(0);
/// # let _ = placement;
/// # Ok::<(), tfpipe::train::TrainError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Placement {
    pub(super) device: Device,
    pub(super) prefetch: usize,
}

impl Default for Placement {
    fn default() -> Placement {
        Placement {
            device: Device::Cpu,
            prefetch: 2,
        }
    }
}

impl Placement {
    /// The CPU, prefetch 2.
    pub fn new() -> Placement {
        Placement::default()
    }

    /// The device to train on ([`parse_device`](super::parse_device) reads
    /// `cpu`, `cuda`, `cuda:N`). By default the CPU.
    pub fn device(mut self, device: Device) -> Placement {
        self.device = device;
        self
    }

    /// Device-prefetch depth: batches converted to tensors ahead, on the
    /// prefetch thread, while the current step computes. 0 converts on the
    /// training thread (no overlap; the report counts the copy in the step).
    /// By default 2.
    pub fn prefetch(mut self, batches: usize) -> Placement {
        self.prefetch = batches;
        self
    }
}

/// The seed, and the checkpoint a run continues from.
///
/// ```
/// use tfpipe::train::Reproducibility;
/// let fresh = Reproducibility::new().seed(42);
/// let resumed = Reproducibility::new().resume(std::path::PathBuf::from("checkpoints/run1"));
/// # let _ = (fresh, resumed);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reproducibility {
    pub(super) seed: u64,
    pub(super) resume: Option<PathBuf>,
    pub(super) data: Option<super::DataFingerprint>,
}

impl Reproducibility {
    /// Seed 0, a fresh start.
    pub fn new() -> Reproducibility {
        Reproducibility::default()
    }

    /// Seeds the built-in models' weight initialisation, and is stored in
    /// checkpoints. Resuming keeps the checkpoint's seed instead (one seed
    /// schedule per training, so resumed epochs shuffle as the
    /// uninterrupted run's would have). By default 0.
    pub fn seed(mut self, seed: u64) -> Reproducibility {
        self.seed = seed;
        self
    }

    /// Continue from this checkpoint directory: its weights, optimizer
    /// state, epoch, global step and seed; `None` starts afresh. By default
    /// none.
    pub fn resume(mut self, dir: impl Into<Option<PathBuf>>) -> Reproducibility {
        self.resume = dir.into();
        self
    }

    /// The training data's fingerprint, stored in checkpoints so that a
    /// resume can check it reads the same data the same way
    /// ([`TrainData::fingerprint`](super::TrainData::fingerprint)). By
    /// default none.
    pub fn data(
        mut self,
        fingerprint: impl Into<Option<super::DataFingerprint>>,
    ) -> Reproducibility {
        self.data = fingerprint.into();
        self
    }
}

/// Outside control over a run: a stop flag, and the instant start-up times
/// count from.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::AtomicBool;
/// use tfpipe::train::RunControl;
/// let stop = Arc::new(AtomicBool::new(false));
/// let control = RunControl::new().stop_flag(stop.clone());
/// // A Ctrl-C handler stores `true`: training stops after the current step.
/// # let _ = control;
/// ```
#[derive(Debug, Clone)]
pub struct RunControl {
    pub(super) stop: Option<Arc<AtomicBool>>,
    pub(super) origin: Instant,
}

impl Default for RunControl {
    fn default() -> RunControl {
        RunControl {
            stop: None,
            origin: Instant::now(),
        }
    }
}

impl RunControl {
    /// No stop flag; start-up counts from now.
    pub fn new() -> RunControl {
        RunControl::default()
    }

    /// Raised (e.g. by a Ctrl-C handler), training stops after the current
    /// step; observers' `on_train_end` still runs. By default none.
    pub fn stop_flag(mut self, stop: Arc<AtomicBool>) -> RunControl {
        self.stop = Some(stop);
        self
    }

    /// Where the report's start-up times count from: process start for the
    /// CLI. By default the moment this `RunControl` was made.
    pub fn origin(mut self, origin: Instant) -> RunControl {
        self.origin = origin;
        self
    }
}
