//! `tfpipe train`'s flags (`Args`, with its groups: the model, the
//! optimizer and schedule, the outputs and resume), each parsed into the
//! library type it sets,
//! and the flag that fixes each library error (library messages name no
//! flags).
//! No decision lives here: the rules are the library's (`ModelConfig::for_input`,
//! `Resume`, `LrSchedule`), and these only turn text into their inputs.

use std::path::PathBuf;

use anyhow::{Context, bail};

use super::CompressionFlag;
use tfpipe::pipeline::MixSource;
use tfpipe::train::{
    CheckpointError, Decay, Impute, LrSchedule, ModelChoiceError, ModelKind, ModelRequest, Monitor,
    OptimizerConfig, OptimizerKind, Resume, RunOutputs, Setting, TrainError,
};

/// The model flags.
#[derive(Debug, clap::Args)]
pub struct ModelFlags {
    /// The model: mlp, cnn (LeNet-like, over an image's [H, W, C]) or
    /// embedding (token ids -> embedding -> masked mean pooling -> MLP). By
    /// default embedding when the schema has a variable-length int64
    /// feature, cnn when the input is one image decoded from encoded bytes
    /// (an `image` spec) and the task is classification, else mlp; or the
    /// checkpoint's with --resume.
    #[arg(long)]
    pub model: Option<String>,
    /// The image size, HxW or HxWxC (C: 1 grey or 3 RGB): images decoded
    /// from encoded bytes (`image` specs) are decoded at this size instead
    /// of the schema's; for a plain number input it is the [H, W, C] (C by
    /// default 1) the CNN reads its values as. By default the schema's
    /// size, or 28x28x1.
    #[arg(long, value_name = "HxW[xC]", value_parser = parse_image_size)]
    pub image_size: Option<ImageSize>,
    /// The MLP's hidden layer sizes, comma-separated. By default 256 (64
    /// for the embedding model's head).
    #[arg(long)]
    pub hidden: Option<String>,
    /// The embedding model: token ids are below this. By default the
    /// schema file's `vocab_size` (as `tfpipe demo --tokens` writes it).
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// The embedding model: the width of each token's embedding. By default 32.
    #[arg(long)]
    pub embedding_dim: Option<usize>,
}

impl ModelFlags {
    /// Whether any flag asks for a model (rather than the checkpoint's).
    pub fn any(&self) -> bool {
        self.model.is_some() || self.hidden.is_some()
    }

    /// What the flags ask of the model.
    pub fn request(&self) -> anyhow::Result<ModelRequest> {
        let kind = self
            .model
            .as_deref()
            .map(str::parse::<ModelKind>)
            .transpose()
            .map_err(model_error)?;
        let hidden = match self.hidden.as_deref() {
            Some(text) => Some(parse_hidden(text)?),
            None => None,
        };
        Ok(ModelRequest {
            kind,
            hidden,
            vocab_size: self.vocab_size,
            embedding_dim: self.embedding_dim,
            image: None,
        })
    }
}

/// `--image-size HxW[xC]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSize {
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// `None`: the image spec's channels, or 1.
    pub channels: Option<usize>,
}

fn parse_image_size(text: &str) -> Result<ImageSize, String> {
    let dims: Result<Vec<usize>, _> = text.split('x').map(|d| d.trim().parse()).collect();
    let bad = || format!("{text:?} is not an image size (expected HxW or HxWxC, e.g. 64x64x3)");
    match dims.map_err(|_| bad())?[..] {
        [height, width] => Ok(ImageSize {
            height,
            width,
            channels: None,
        }),
        [height, width, c] => Ok(ImageSize {
            height,
            width,
            channels: Some(c),
        }),
        _ => Err(bad()),
    }
}

/// `--hidden 256,128`: layer sizes.
fn parse_hidden(text: &str) -> anyhow::Result<Vec<usize>> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim().parse::<usize>().with_context(|| {
                format!("--hidden: {s:?} is not a layer size (e.g. --hidden 256,128)")
            })
        })
        .collect()
}

/// The optimizer and learning-rate schedule flags.
#[derive(Debug, clap::Args)]
pub struct OptimizerFlags {
    /// The optimizer: adam, adamw or sgd. By default adamw, or the
    /// checkpoint's. (adamw-fused is accepted as adamw.)
    #[arg(long)]
    pub optimizer: Option<String>,
    /// The learning rate. By default 0.001 for adam and adamw, 0.1 for sgd.
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// Weight decay: decoupled for adamw (default 0.01), L2 for adam and sgd (default 0).
    #[arg(long, allow_negative_numbers = true)]
    pub weight_decay: Option<f64>,
    /// SGD momentum in [0, 1). By default 0.
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f64>,
    /// Learning-rate schedule: constant, step or cosine. By default constant.
    #[arg(long, default_value = "constant")]
    pub lr_schedule: String,
    /// step schedule: multiply the rate by --lr-gamma every this many epochs.
    #[arg(long, default_value_t = 1)]
    pub lr_step_epochs: u64,
    /// step schedule: the factor.
    #[arg(long, default_value_t = 0.5)]
    pub lr_gamma: f64,
    /// cosine schedule: the final rate.
    #[arg(long, default_value_t = 0.0)]
    pub min_lr: f64,
    /// Linear warm-up over this many steps.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: u64,
}

impl OptimizerFlags {
    /// The optimizer: the one asked for (by default the resumed
    /// checkpoint's, else AdamW) with the flags' settings on top.
    pub fn config(&self, resumed: Option<&Resume>) -> anyhow::Result<OptimizerConfig> {
        let requested = self
            .optimizer
            .as_deref()
            .map(str::parse::<OptimizerKind>)
            .transpose()?;
        let mut optimizer = match resumed {
            Some(resume) => resume.optimizer(requested),
            None => OptimizerConfig::default_for(requested.unwrap_or(OptimizerKind::AdamW)),
        };
        if let Some(lr) = self.lr {
            optimizer.lr = lr;
        }
        if let Some(wd) = self.weight_decay {
            optimizer.weight_decay = wd;
        }
        if let Some(m) = self.momentum {
            if optimizer.kind != OptimizerKind::Sgd && m != 0.0 {
                bail!(
                    "--momentum applies to --optimizer sgd (adam and adamw have their own moments)"
                );
            }
            optimizer.momentum = m;
        }
        optimizer.validate().map_err(with_hint)?;
        Ok(optimizer)
    }

    /// The learning-rate schedule, for a run of `steps` steps or `epochs`
    /// epochs of `steps_per_epoch` (cosine needs one of them).
    pub fn schedule(
        &self,
        steps: Option<u64>,
        epochs: Option<u64>,
        steps_per_epoch: Option<u64>,
    ) -> anyhow::Result<LrSchedule> {
        let decay = match self.lr_schedule.as_str() {
            "constant" => Decay::Constant,
            "step" => Decay::Step {
                epochs: self.lr_step_epochs,
                gamma: self.lr_gamma,
            },
            "cosine" => {
                let steps = match (steps, epochs.unwrap_or(1), steps_per_epoch) {
                    (Some(s), _, _) => s,
                    (None, e, Some(per)) => e * per,
                    (None, _, None) => bail!(
                        "--lr-schedule cosine needs the run's length in steps: give --steps, or a --schema file that records the record count"
                    ),
                };
                Decay::Cosine {
                    steps: steps.saturating_sub(self.warmup_steps).max(1),
                    min_lr: self.min_lr,
                }
            }
            other => bail!("--lr-schedule {other:?}: expected constant, step or cosine"),
        };
        let schedule = LrSchedule {
            decay,
            warmup_steps: self.warmup_steps,
        };
        schedule.validate().map_err(with_hint)?;
        Ok(schedule)
    }
}

/// The flags for what a run writes, and for resuming.
#[derive(Debug, clap::Args)]
pub struct OutputFlags {
    /// Save a checkpoint (a directory) here at the end, and on Ctrl-C.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Save the checkpoint as the next numbered version of this base
    /// directory (DIR/1, DIR/2, ...), which `tfpipe serve --model NAME=DIR`
    /// polls and serves warm.
    #[arg(long, conflicts_with = "save")]
    pub save_versions: Option<PathBuf>,
    /// With --save: also save every this many epochs.
    #[arg(long, requires = "save")]
    pub checkpoint_every: Option<u64>,
    /// With --save DIR: keep the best epoch by --monitor in DIR-best.
    #[arg(long, requires = "save")]
    pub keep_best: bool,
    /// Stop when --monitor has not improved for this many epochs.
    #[arg(long)]
    pub early_stopping: Option<u64>,
    /// What --keep-best and --early-stopping watch: loss (validation loss)
    /// or metric (validation accuracy, or MAE for regression).
    #[arg(long, default_value = "loss")]
    pub monitor: String,
    /// Continue from the checkpoint here (its weights, optimizer state, epoch and step).
    /// The data and its options (files, batch size, shuffle buffer, ranks) must be the
    /// checkpoint's, or the resume is refused.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Resume even though the batch size differs from the checkpoint's: the run then
    /// restarts the checkpoint's epoch from its beginning and is no longer exact.
    #[arg(long, requires = "resume")]
    pub force_resume: bool,
    /// Write TensorBoard event files here (`train/` and `validation/` runs, as Keras).
    #[arg(long)]
    pub logdir: Option<PathBuf>,
}

impl OutputFlags {
    /// What `--keep-best` and `--early-stopping` watch.
    pub fn monitor(&self) -> anyhow::Result<Monitor> {
        match self.monitor.as_str() {
            "loss" => Ok(Monitor::Loss),
            "metric" => Ok(Monitor::Metric),
            other => bail!("--monitor {other:?}: expected loss or metric"),
        }
    }

    /// The outputs the flags ask for.
    pub fn outputs(&self) -> anyhow::Result<RunOutputs> {
        let monitor = self.monitor()?;
        Ok(RunOutputs {
            save: self.save.clone(),
            logdir: self.logdir.clone(),
            checkpoint_every: self.checkpoint_every,
            keep_best: self.keep_best.then_some(monitor),
            early_stopping: self.early_stopping.map(|p| (monitor, p)),
        })
    }
}

/// The library's error, with the flag that fixes it where there is one
/// (library messages name no flags).
pub(super) fn with_hint(e: TrainError) -> anyhow::Error {
    let hint = match &e {
        TrainError::Label { .. } | TrainError::LabelValues { .. } => Some(
            "set the number of classes with --classes, or, if the label is a quantity rather than a class, train a regression with --task regression",
        ),
        TrainError::Model(e) => model_hint(e),
        TrainError::Data(e) if e.parse_error().is_some_and(|p| p.is_missing()) => Some(
            "a record lacks this feature: for an input that may be missing (a schema default marks it, as `tfpipe convert` gives columns with missing values), fill it with --impute mean|zero (adds a missing-indicator column); for the label, skip such records with --skip-missing-labels",
        ),
        TrainError::Config { setting, .. } => setting_flag(*setting),
        TrainError::Checkpoint { source, .. } => match &**source {
            CheckpointError::OtherData {
                only_batch_size: true,
                ..
            } => Some("--force-resume accepts another batch size, inexactly"),
            CheckpointError::Imputation { .. } => {
                Some("resume with the checkpoint's --impute (or none, if it had none)")
            }
            _ => None,
        },
        _ => None,
    };
    match hint {
        Some(hint) => anyhow::Error::new(e).context(hint),
        None => anyhow::Error::new(e),
    }
}

/// The flag that sets `setting`.
fn setting_flag(setting: Setting) -> Option<&'static str> {
    Some(match setting {
        Setting::LearningRate => "set it with --lr",
        Setting::WeightDecay => "set it with --weight-decay",
        Setting::Momentum => "set it with --momentum",
        Setting::Classes => "set it with --classes",
        Setting::HiddenSizes => "set them with --hidden",
        Setting::Embedding => "set them with --vocab-size and --embedding-dim",
        Setting::Label => "choose it with --label",
        Setting::Inputs => {
            "choose the inputs with --feature NAME:DTYPE[:SHAPE], --inputs or --exclude, or convert numbers as such (`tfpipe convert csv --column NAME:float32`)"
        }
        Setting::RunLength => "set it with --epochs or --steps",
        Setting::ImageSize => "set it with --image-size HxWxC",
        Setting::LrSchedule => {
            "set it with --lr-schedule, --lr-step-epochs, --lr-gamma and --min-lr"
        }
        _ => return None,
    })
}

/// A model choice's error, with the flag that fixes it.
pub(super) fn model_error(e: ModelChoiceError) -> anyhow::Error {
    match model_hint(&e) {
        Some(hint) => anyhow::Error::new(e).context(hint),
        None => anyhow::Error::new(e),
    }
}

/// The flag that fixes a model choice's error, where one does.
fn model_hint(e: &ModelChoiceError) -> Option<&'static str> {
    Some(match e {
        ModelChoiceError::UnknownKind { .. } => "--model takes mlp, cnn or embedding",
        ModelChoiceError::TokensNeedEmbedding { .. } => "token ids take --model embedding",
        ModelChoiceError::NoTokens => {
            "--model embedding needs a token feature (--feature NAME:int64:var)"
        }
        ModelChoiceError::ClassifierOnly { .. } => "a regression takes --model mlp",
        ModelChoiceError::UnknownVocabulary { .. } => "give --vocab-size N",
        ModelChoiceError::HiddenNotApplicable { .. } => {
            "--hidden applies to --model mlp and embedding"
        }
        ModelChoiceError::InputCount { .. } => {
            "the cnn model reads its input as one image: give its size with --image-size HxWxC, or choose the inputs with --inputs or --feature (a shape NAME:uint8:HxWxC sizes the image)"
        }
        ModelChoiceError::ChannelsFirst { .. } => {
            "drop the image spec's nchw option (--feature NAME:image:HxWxC[:OPTIONS])"
        }
        _ => return None,
    })
}

/// Arguments of `tfpipe train`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Training data: TFRecord files, globs or dataset directories
    /// (compression from the suffix).
    #[arg(long, required_unless_present = "mix", num_args = 1..)]
    pub data: Vec<String>,
    /// A weighted source FILES=WEIGHT (repeatable), instead of --data: each
    /// source is read on its own and the sources are mixed by weight
    /// (tf.data's sample_from_datasets, renormalised as sources run out), e.g.
    /// --mix 'web/*.tfrecord=0.7' --mix 'books/=0.3'.
    #[arg(long, value_name = "FILES=WEIGHT", conflicts_with = "data")]
    pub mix: Vec<MixSource>,
    /// Features read from the key=value directories of each record's file
    /// (comma-separated; a Spark dataset's partition columns), typed by the
    /// --feature spec of that name if there is one, else bytes.
    #[arg(long, value_name = "A,B,...", value_delimiter = ',')]
    pub partition_features: Vec<String>,
    #[command(flatten)]
    pub compression: CompressionFlag,
    /// A feature to parse, NAME:DTYPE[:SHAPE] (e.g. image_raw:uint8:28x28, label:int64).
    /// With --schema, overrides the schema file's feature of that name (or adds one).
    #[arg(long = "feature")]
    pub features: Vec<String>,
    /// The model's inputs: only these features (comma-separated), besides the label.
    /// By default every feature the models can take.
    #[arg(
        long,
        value_name = "A,B,...",
        value_delimiter = ',',
        conflicts_with = "exclude"
    )]
    pub inputs: Option<Vec<String>>,
    /// Features that are not inputs (comma-separated), e.g. an id column.
    #[arg(long, value_name = "A,B,...", value_delimiter = ',')]
    pub exclude: Option<Vec<String>>,
    /// A schema file (`PREFIX.features.json` from `tfpipe convert`).
    #[arg(long)]
    pub schema: Option<PathBuf>,
    /// The label feature: int64 class ids (classification) or float32
    /// values (regression). By default the schema's label.
    #[arg(long)]
    pub label: Option<String>,
    /// Skip the records that have no label (counted and reported) instead
    /// of stopping at the first with an error naming it.
    #[arg(long)]
    pub skip_missing_labels: bool,
    /// Fill missing inputs with their mean or with 0, adding a 0/1
    /// missing-indicator column per input that may be missing (one whose
    /// schema spec gives a default, as `tfpipe convert` does for a column
    /// with missing values). By default a missing input is an error naming
    /// its record. A resume must use the checkpoint's.
    #[arg(long, value_name = "mean|zero")]
    pub impute: Option<Impute>,
    /// Only divide uint8 inputs (pixels) by 255, as Keras' Rescaling(1/255);
    /// by default they are then standardised like the other inputs.
    #[arg(long)]
    pub rescale: bool,
    /// The number of classes (labels must be below it). By default the size
    /// of the label vocabulary (the schema file's, or a text label's counted
    /// in one pass), else the largest int64 label counted in one pass over
    /// the data plus one (refused when the values look like a quantity).
    #[arg(long, value_parser = super::positive::<usize>)]
    pub classes: Option<usize>,
    /// classification or regression. By default regression for a float32
    /// label, classification otherwise.
    #[arg(long)]
    pub task: Option<String>,
    /// Validation data, evaluated after every epoch (`--test-data` is an alias).
    #[arg(long = "validation-data", visible_alias = "test-data", num_args = 1..)]
    pub validation_data: Vec<String>,
    #[command(flatten)]
    pub model: ModelFlags,
    #[command(flatten)]
    pub optimizer: OptimizerFlags,
    /// Epochs to train (with --resume: this many more). By default 1.
    #[arg(long, conflicts_with = "steps", value_parser = super::count::<u64>)]
    pub epochs: Option<u64>,
    /// Steps to train instead of epochs (with --resume: this many more).
    #[arg(long, value_parser = super::count::<u64>)]
    pub steps: Option<u64>,
    /// Examples per batch.
    #[arg(long, default_value_t = 256, value_parser = super::positive::<usize>)]
    pub batch_size: usize,
    /// Shuffle buffer size in examples (0: no shuffle).
    #[arg(long, default_value_t = 10_000, value_parser = super::count::<usize>)]
    pub shuffle_buffer: usize,
    #[command(flatten)]
    pub parse: super::ParseFlags,
    #[command(flatten)]
    pub sequences: super::SequenceFlags,
    /// Batches the device-prefetch stage converts ahead (0: on the training thread).
    #[arg(long, default_value_t = 2, value_parser = super::count::<usize>)]
    pub prefetch: usize,
    #[command(flatten)]
    pub runtime: super::RuntimeFlags,
    #[command(flatten)]
    pub outputs: OutputFlags,
    #[command(flatten)]
    pub report: super::ReportFlags,
    /// Seeds weight initialisation and the shuffle (which reseeds itself
    /// each epoch from this seed and the epoch number). A resumed run keeps
    /// the checkpoint's.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub rank: super::rank::RankArgs,
}
