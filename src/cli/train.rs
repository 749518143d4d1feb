//! `tfpipe train`: trains a model fed by the pipeline and reports stall
//! versus compute, the start-up breakdown and test accuracy.
//!
//! Also home of the helpers `predict` and `demo` share: opening TFRecord
//! data as batch streams, the progress bar, and writing JSON reports.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use tfpipe::Schema;
use tfpipe::example::{DType, SchemaMetadata};
use tfpipe::pipeline::{Pipeline, Remainder};
use tfpipe::train::{
    CheckpointError, Control, Decay, EpochReport, InputSpec, LabelClasses, LrSchedule, ModelChoice,
    ModelChoiceError, ModelConfig, ModelInput, ModelKind, ModelRequest, Monitor, Observer,
    OptimizerConfig, OptimizerKind, Placement, Progress, Reproducibility, Resume, ResumeAt,
    RunControl, RunInfo, RunLength, RunOutputs, SchemaMeta, Setting, Task, ThreadTuner,
    TrainConfig, TrainData, TrainError, TrainReport, Trainer, parse_device,
};

use super::common::{
    check_model_size, check_output_dir, check_output_file, check_size, check_vocabulary,
    load_schema, progress_bar, read_facts, schema_file_beside, set_compute_threads, write_json,
};
use super::{CompressionFlag, Status, interrupt};

/// Arguments of `tfpipe train`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Training data: TFRecord files or globs (compression from the suffix).
    #[arg(long, required = true, num_args = 1..)]
    pub data: Vec<String>,
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
    /// The number of classes (labels must be below it). By default the size
    /// of the label vocabulary `tfpipe convert` recorded in the schema file,
    /// else 10.
    #[arg(long, value_parser = super::positive::<usize>)]
    pub classes: Option<usize>,
    /// classification or regression. By default regression for a float32
    /// label, classification otherwise.
    #[arg(long)]
    pub task: Option<String>,
    /// Validation data, evaluated after every epoch (`--test-data` is an alias).
    #[arg(long = "validation-data", visible_alias = "test-data", num_args = 1..)]
    pub validation_data: Vec<String>,
    /// The model: mlp, cnn (LeNet-like, for 28x28 inputs) or embedding
    /// (token ids -> embedding -> masked mean pooling -> MLP). By default
    /// embedding when the schema has a variable-length int64 feature, else
    /// mlp; or the checkpoint's with --resume.
    #[arg(long)]
    pub model: Option<String>,
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

/// Runs `tfpipe train`.
pub fn run(mut args: Args) -> anyhow::Result<Status> {
    let threads = set_compute_threads(args.runtime.compute_threads)?;
    // Resolve and check everything before any work starts.
    let rank = args.rank.resolve()?;
    super::rank::per_rank_paths(
        rank,
        [
            ("--save", &mut args.save),
            ("--logdir", &mut args.logdir),
            ("--report-json", &mut args.report.report_json),
            ("--resume", &mut args.resume),
        ],
    )?;
    if let Some(base) = &args.save_versions {
        let dir = tfpipe::serve::next_version_dir(base)
            .with_context(|| format!("--save-versions {}", base.display()))?;
        args.save = Some(dir);
    }
    check_output_dir(args.save.as_deref(), "--save")?;
    check_output_dir(args.logdir.as_deref(), "--logdir")?;
    check_output_file(args.report.report_json.as_deref(), "--report-json")?;
    // Device init (on CUDA: the context, cuBLAS and cuRAND handles).
    let init = Instant::now();
    let device = parse_device(&super::rank::device(&args.runtime.device)?)?;
    let device_init = init.elapsed();
    let resumed = args.resume.as_ref().map(Resume::read).transpose()?;
    let (mut schema, recorded_classes) = load_schema(
        &args.features,
        args.schema.as_deref(),
        args.label.as_deref(),
    )?;
    select_inputs(&mut schema, args.inputs.as_deref(), args.exclude.as_deref())?;
    let mut recorded = match &args.schema {
        Some(path) if args.label.is_none() || args.label == schema.label => read_facts(path)?,
        _ => SchemaMetadata::default(),
    };
    super::note_skipped_indexes(&args.data)?;
    if rank.is_some() {
        // Steps per epoch (the schedule, the progress bar) come from this rank's share.
        let files = super::rank::share(
            Pipeline::tfrecord_files(&args.data)?,
            rank,
            Remainder::Drop,
            true,
        )?;
        recorded.records = files.rank_share().map(|s| s.records);
    }
    let Some(label) = schema.label.clone() else {
        bail!("no label: name the label feature with --label NAME");
    };
    if args.classes == Some(0) {
        bail!("--classes must be at least 1");
    }
    let float_label = schema.feature(&label).map(|f| f.dtype) == Some(DType::Float32);
    let task = match args.task.as_deref() {
        Some("classification") => None,
        Some("regression") => Some(Task::Regression),
        Some(other) => bail!("--task {other:?}: expected classification or regression"),
        None if float_label => Some(Task::Regression),
        None => None,
    };
    let label_classes = match task {
        None => text_label_classes(&args, &schema, &label, resumed.as_ref(), &recorded)?,
        Some(_) => None,
    };
    let task = match task {
        Some(t) => t,
        None if label_classes.is_some() => {
            let count = label_classes.as_ref().map_or(0, |c| c.names().len());
            let classes = args.classes.unwrap_or(count);
            if classes < count {
                bail!("--classes {classes}: the text label {label:?} has {count} classes");
            }
            Task::Classification { classes }
        }
        None => {
            let classes = args.classes.or(recorded_classes).unwrap_or(10);
            // The last layer alone holds classes x hidden weights.
            check_size("--classes", classes as u128 * 4 * 64)?;
            Task::Classification { classes }
        }
    };
    // Parse only what the model takes: skipped features cost nothing.
    let selection = match InputSpec::from_schema(&schema, task) {
        Ok(s) => s,
        Err(e) => {
            let hint = if matches!(task, Task::Classification { .. }) && float_label {
                "a float32 label is a regression target (--task regression)"
            } else {
                "choose the inputs with --feature NAME:DTYPE[:SHAPE], or convert numbers as such (`tfpipe convert csv --column NAME:float32`)"
            };
            return Err(anyhow::Error::new(e).context(hint));
        }
    };
    let schema = selection.schema;
    let input = selection.spec;
    if let Some(resume) = &resumed {
        check_vocabulary(
            resume.label_vocabulary(),
            recorded.label_vocabulary.as_deref(),
            &format!(
                "the checkpoint {}",
                args.resume.as_deref().unwrap_or(Path::new("")).display()
            ),
            "this data's schema",
        )?;
    }
    // Validation data converted on its own has its own schema file: its
    // vocabulary must be the training data's.
    if let Some(first) = args.validation_data.first()
        && let Ok(files) = Pipeline::tfrecord_files([first.as_str()])
        && let Some(path) = files.paths().first().and_then(|p| schema_file_beside(p))
    {
        check_vocabulary(
            recorded.label_vocabulary.as_deref(),
            read_facts(&path)?.label_vocabulary.as_deref(),
            "the training data",
            &format!("the validation data's schema {}", path.display()),
        )?;
    }
    let resumed_model = resumed.as_ref().and_then(|r| r.model().cloned());
    let model = match (&args.model, &args.hidden, resumed_model) {
        (None, None, Some(model)) => model,
        _ => {
            let chosen = model_config(&args, &input, recorded.vocab_size)?;
            // Never a silent switch: say which model the data chose, and why.
            if let Some(why) = &chosen.chosen_because {
                eprintln!(
                    "tfpipe: model {} because {why} (choose with --model)",
                    chosen.config.describe()
                );
            }
            chosen.config
        }
    };
    check_model_size(&model, &input, args.batch_size, args.prefetch)?;
    let requested = args
        .optimizer
        .as_deref()
        .map(str::parse::<OptimizerKind>)
        .transpose()?;
    let mut optimizer = match &resumed {
        Some(resume) => resume.optimizer(requested),
        None => OptimizerConfig::default_for(requested.unwrap_or(OptimizerKind::AdamW)),
    };
    let kind = optimizer.kind;
    if let Some(lr) = args.lr {
        optimizer.lr = lr;
    }
    if let Some(wd) = args.weight_decay {
        optimizer.weight_decay = wd;
    }
    if let Some(m) = args.momentum {
        if kind != OptimizerKind::Sgd && m != 0.0 {
            bail!("--momentum applies to --optimizer sgd (adam and adamw have their own moments)");
        }
        optimizer.momentum = m;
    }
    optimizer.validate().map_err(with_hint)?;
    let parallelism = args.parse.num_parallel_calls;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let steps_per_epoch = recorded
        .records
        .map(|r| r.div_ceil(args.batch_size as u64).max(1));
    let schedule = schedule(&args, steps_per_epoch)?;
    if args.resume.is_some() && args.save.is_none() {
        eprintln!(
            "tfpipe: warning: --resume without --save: this run's progress will not be saved (add --save DIR; --save {} continues in place)",
            args.resume.as_deref().unwrap_or(Path::new("")).display()
        );
    }
    // SIGINT, SIGTERM and SIGHUP stop training after the current step; the
    // observers still run, so `--save` saves, and the exit is 128 + signal.
    let interrupt = interrupt::install().context("installing the signal handlers")?;
    let monitor = match args.monitor.as_str() {
        "loss" => Monitor::Loss,
        "metric" => Monitor::Metric,
        other => bail!("--monitor {other:?}: expected loss or metric"),
    };
    // One seed schedule per training: a resumed run keeps the checkpoint's.
    let seed = match &resumed {
        Some(resume) => {
            if resume.seed() != args.seed && args.seed != 0 {
                eprintln!(
                    "tfpipe: warning: --seed {} ignored: the checkpoint's run is seeded {}, and resuming continues its schedule",
                    args.seed,
                    resume.seed()
                );
            }
            resume.seed()
        }
        None => args.seed,
    };
    let data = TrainData {
        files: args.data.clone(),
        reader: args.compression.reader_options(),
        schema: schema.clone(),
        batch_size: args.batch_size,
        shuffle_buffer: args.shuffle_buffer,
        seed,
        parallelism,
        rank,
        label_classes: label_classes.clone(),
        sequences: args.sequences.resolve(args.batch_size)?,
        padding: Default::default(),
    };
    // What the pipeline's order depends on: checkpoints record it, and a
    // resume must read the same data the same way. Taken only when a
    // checkpoint is written or read: it costs a glob listing, and a sample
    // read or a HEAD per file, that a run without checkpoints need not pay.
    let fingerprint = match args.save.is_some() || resumed.is_some() {
        true => Some(data.fingerprint().map_err(anyhow::Error::from_boxed)?),
        false => None,
    };
    let resume_at = match &resumed {
        Some(resume) => Some(
            resume
                .position(fingerprint.as_ref(), args.force_resume)
                .map_err(with_hint)?,
        ),
        None => None,
    };
    match &resume_at {
        Some(ResumeAt::EpochStart {
            forced: Some(differences),
            ..
        }) => eprintln!(
            "tfpipe: warning: --force-resume: {}: restarting the checkpoint's epoch from its beginning (no longer exact)",
            differences.join("; ")
        ),
        Some(ResumeAt::EpochStart {
            forced: None,
            epoch,
        }) if *epoch > 0 => eprintln!(
            "tfpipe: note: the checkpoint holds no pipeline position: resuming at the start of epoch {epoch}"
        ),
        _ => {}
    }
    let resume_position = resume_at.and_then(|at| at.pipeline_state().cloned());
    let config = TrainConfig::new(
        ModelInput::new(input)
            .schema(SchemaMeta::from_schema(&schema))
            .label_vocabulary(
                label_classes
                    .as_ref()
                    .map(|c| c.names().to_vec())
                    .or_else(|| recorded.label_vocabulary.clone()),
            )
            .skipped_features(selection.skipped),
    )
    .length(
        RunLength::new()
            .epochs(args.epochs)
            .steps(args.steps)
            .examples_per_epoch(recorded.records),
    )
    .placement(Placement::new().device(device).prefetch(args.prefetch))
    .reproducibility(
        Reproducibility::new()
            .seed(seed)
            .resume(args.resume.clone())
            .data(fingerprint),
    )
    .schedule(schedule)
    .control(
        RunControl::new()
            .stop_flag(interrupt.flag())
            .origin(super::process_start()),
    );
    let validation = (!args.validation_data.is_empty()).then(|| TrainData {
        files: args.validation_data.clone(),
        shuffle_buffer: 0,
        // Every rank evaluates all of it (the same numbers on every rank).
        rank: None,
        padding: Default::default(),
        ..data.clone()
    });
    let run = RunOptions {
        outputs: RunOutputs {
            save: args.save.clone(),
            logdir: args.logdir.clone(),
            checkpoint_every: args.checkpoint_every,
            keep_best: args.keep_best.then_some(monitor),
            early_stopping: args.early_stopping.map(|p| (monitor, p)),
        },
        tuner: threads.tuner(),
        resume_position,
        device_init,
    };
    let report = train(config, model, optimizer, &data, validation.as_ref(), &run)?;
    let mut stdout = std::io::stdout().lock();
    // The per-epoch lines were printed as the epochs ended.
    write!(stdout, "{report:#}")?;
    if let Some(dir) = &args.save {
        writeln!(
            stdout,
            "checkpoint saved to {} (global step {})",
            dir.display(),
            report.global_step
        )?;
    }
    if let Some(path) = &args.report.report_json {
        write_json(path, &report)?;
    }
    if report.interrupted {
        let note = if args.save.is_some() {
            "checkpoint saved"
        } else {
            "nothing saved (no --save)"
        };
        return Err(interrupt.error().note(note).into());
    }
    Ok(Status::Ok)
}

/// The learning-rate schedule the flags ask for.
fn schedule(args: &Args, steps_per_epoch: Option<u64>) -> anyhow::Result<LrSchedule> {
    let decay = match args.lr_schedule.as_str() {
        "constant" => Decay::Constant,
        "step" => Decay::Step {
            epochs: args.lr_step_epochs,
            gamma: args.lr_gamma,
        },
        "cosine" => {
            let steps = match (args.steps, args.epochs.unwrap_or(1), steps_per_epoch) {
                (Some(s), _, _) => s,
                (None, e, Some(per)) => e * per,
                (None, _, None) => bail!(
                    "--lr-schedule cosine needs the run's length in steps: give --steps, or a --schema file that records the record count"
                ),
            };
            Decay::Cosine {
                steps: steps.saturating_sub(args.warmup_steps).max(1),
                min_lr: args.min_lr,
            }
        }
        other => bail!("--lr-schedule {other:?}: expected constant, step or cosine"),
    };
    let schedule = LrSchedule {
        decay,
        warmup_steps: args.warmup_steps,
    };
    schedule.validate().map_err(with_hint)?;
    Ok(schedule)
}

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

/// The library's error, with the flag that fixes it where there is one
/// (library messages name no flags).
pub(super) fn with_hint(e: TrainError) -> anyhow::Error {
    let hint = match &e {
        TrainError::Label { .. } => Some(
            "set the number of classes with --classes, or, if the label is a quantity rather than a class, train a regression with --task regression",
        ),
        TrainError::Model(e) => model_hint(e),
        TrainError::Config { setting, .. } => setting_flag(*setting),
        TrainError::Checkpoint { source, .. } => match &**source {
            CheckpointError::OtherData {
                only_batch_size: true,
                ..
            } => Some("--force-resume accepts another batch size, inexactly"),
            _ => None,
        },
        _ => None,
    };
    match hint {
        Some(hint) => anyhow::Error::new(e).context(hint),
        None => anyhow::Error::new(e),
    }
}

/// A text label's classes: the resumed checkpoint's (class ids must not
/// move), else the schema file's vocabulary, else counted in one pass over
/// the training data (and said so). `None` for a label that is not text.
fn text_label_classes(
    args: &Args,
    schema: &Schema,
    label: &str,
    resumed: Option<&Resume>,
    recorded: &SchemaMetadata,
) -> anyhow::Result<Option<LabelClasses>> {
    if schema.feature(label).map(|f| f.dtype) != Some(DType::Bytes) {
        return Ok(None);
    }
    let known = resumed
        .and_then(|r| r.label_vocabulary().map(<[String]>::to_vec))
        .or_else(|| recorded.label_vocabulary.clone());
    let classes = match known {
        Some(names) => LabelClasses::new(label, names),
        None => {
            let counted = LabelClasses::count(&args.data, args.compression.reader_options(), label)
                .map_err(anyhow::Error::from_boxed)?;
            let names = counted.names();
            let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
            eprintln!(
                "tfpipe: label {label:?} is text: {} classes counted in one pass over the data ({}{}), saved with the checkpoint",
                names.len(),
                shown.join(", "),
                if names.len() > 8 { ", ..." } else { "" }
            );
            counted
        }
    };
    Ok(Some(classes))
}

/// Keeps, besides the label, only the features `--inputs` names, or drops
/// those `--exclude` names; a name that is not a feature is an error.
fn select_inputs(
    schema: &mut Schema,
    inputs: Option<&[String]>,
    exclude: Option<&[String]>,
) -> anyhow::Result<()> {
    let (names, flag, keep) = match (inputs, exclude) {
        (Some(names), _) => (names, "--inputs", true),
        (None, Some(names)) => (names, "--exclude", false),
        (None, None) => return Ok(()),
    };
    for name in names {
        if schema.feature(name).is_none() {
            bail!(
                "{flag}: {name:?} is not a feature (features: {})",
                schema
                    .features
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let label = schema.label.clone();
    schema
        .features
        .retain(|f| Some(&f.name) == label.as_ref() || names.contains(&f.name) == keep);
    Ok(())
}

/// The model the flags ask for, the data deciding what they leave open
/// (`ModelConfig::for_input` holds the rules).
fn model_config(
    args: &Args,
    input: &InputSpec,
    recorded_vocab: Option<usize>,
) -> anyhow::Result<ModelChoice> {
    let kind = args
        .model
        .as_deref()
        .map(str::parse::<ModelKind>)
        .transpose()
        .map_err(model_error)?;
    let hidden = match args.hidden.as_deref() {
        Some(text) => Some(parse_hidden(text)?),
        None => None,
    };
    let request = ModelRequest {
        kind,
        hidden,
        vocab_size: args.vocab_size,
        embedding_dim: args.embedding_dim,
    };
    let chosen = ModelConfig::for_input(input, &request, recorded_vocab).map_err(model_error)?;
    if let ModelConfig::Embedding { vocab, dim, .. } = &chosen.config {
        check_size(
            "--vocab-size x --embedding-dim (the embedding table)",
            (*vocab as u128)
                .saturating_mul(*dim as u128)
                .saturating_mul(16),
        )?;
    }
    Ok(chosen)
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
        Setting::LrSchedule => {
            "set it with --lr-schedule, --lr-step-epochs, --lr-gamma and --min-lr"
        }
        _ => return None,
    })
}

/// A model choice's error, with the flag that fixes it.
fn model_error(e: ModelChoiceError) -> anyhow::Error {
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
            "--model cnn takes 28x28 inputs (784 values per example); choose the inputs with --inputs or --feature"
        }
        _ => return None,
    })
}
