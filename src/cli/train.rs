//! `tfpipe train`: trains a model fed by the pipeline and reports stall
//! versus compute, the start-up breakdown and test accuracy.
//!
//! This file turns the flags into the library's inputs (schema, task,
//! model, optimizer, data, resume), adds the flag that fixes each error,
//! and prints; the decisions are the library's (`tfpipe::train`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use tfpipe::Schema;
use tfpipe::example::{DType, SchemaMetadata};
use tfpipe::pipeline::{Pipeline, Remainder};
use tfpipe::train::{
    InputSpec, LabelClasses, ModelChoice, ModelConfig, ModelInput, Placement, Reproducibility,
    Resume, ResumeAt, RunControl, RunLength, SchemaMeta, Task, TaskKind, TrainConfig, TrainData,
    parse_device,
};

use super::common::{
    check_model_size, check_output_dir, check_output_file, check_size, check_vocabulary,
    load_schema, read_facts, schema_file_beside, set_compute_threads, write_json,
};
use super::fit::{RunOptions, train};
use super::train_flags::{ModelFlags, OptimizerFlags, OutputFlags, model_error, with_hint};
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

/// Runs `tfpipe train`.
pub fn run(mut args: Args) -> anyhow::Result<Status> {
    let threads = set_compute_threads(args.runtime.compute_threads)?;
    // Resolve and check everything before any work starts.
    let rank = args.rank.resolve()?;
    super::rank::per_rank_paths(
        rank,
        [
            ("--save", &mut args.outputs.save),
            ("--logdir", &mut args.outputs.logdir),
            ("--report-json", &mut args.report.report_json),
            ("--resume", &mut args.outputs.resume),
        ],
    )?;
    if let Some(base) = &args.outputs.save_versions {
        let dir = tfpipe::serve::next_version_dir(base)
            .with_context(|| format!("--save-versions {}", base.display()))?;
        args.outputs.save = Some(dir);
    }
    check_output_dir(args.outputs.save.as_deref(), "--save")?;
    check_output_dir(args.outputs.logdir.as_deref(), "--logdir")?;
    check_output_file(args.report.report_json.as_deref(), "--report-json")?;
    // Device init (on CUDA: the context, cuBLAS and cuRAND handles).
    let init = Instant::now();
    let device = parse_device(&super::rank::device(&args.runtime.device)?)?;
    let device_init = init.elapsed();
    let resumed = args.outputs.resume.as_ref().map(Resume::read).transpose()?;
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
    let label_dtype = schema.feature(&label).map_or(DType::Int64, |f| f.dtype);
    let requested = args
        .task
        .as_deref()
        .map(str::parse::<TaskKind>)
        .transpose()
        .context("--task")?;
    let kind = TaskKind::for_label(label_dtype, requested);
    let float_label = label_dtype == DType::Float32;
    let label_classes = match kind {
        TaskKind::Classification => {
            text_label_classes(&args, &schema, &label, resumed.as_ref(), &recorded)?
        }
        TaskKind::Regression => None,
    };
    let task = match kind {
        TaskKind::Regression => Task::Regression,
        TaskKind::Classification => {
            let task = Task::classification(args.classes, label_classes.as_ref(), recorded_classes)
                .map_err(with_hint)?;
            // The last layer alone holds classes x hidden weights.
            check_size("--classes", task.outputs() as u128 * 4 * 64)?;
            task
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
                args.outputs
                    .resume
                    .as_deref()
                    .unwrap_or(Path::new(""))
                    .display()
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
    let model = match resumed_model {
        Some(model) if !args.model.any() => model,
        _ => {
            let chosen = model_config(&args.model, &input, recorded.vocab_size)?;
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
    let optimizer = args.optimizer.config(resumed.as_ref())?;
    let parallelism = args.parse.num_parallel_calls;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let steps_per_epoch = recorded
        .records
        .map(|r| r.div_ceil(args.batch_size as u64).max(1));
    let schedule = args
        .optimizer
        .schedule(args.steps, args.epochs, steps_per_epoch)?;
    if let (Some(resume), None) = (&args.outputs.resume, &args.outputs.save) {
        eprintln!(
            "tfpipe: warning: --resume without --save: this run's progress will not be saved (add --save DIR; --save {} continues in place)",
            resume.display()
        );
    }
    // SIGINT, SIGTERM and SIGHUP stop training after the current step; the
    // observers still run, so `--save` saves, and the exit is 128 + signal.
    let interrupt = interrupt::install().context("installing the signal handlers")?;
    let outputs = args.outputs.outputs()?;
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
    };
    // What the pipeline's order depends on: checkpoints record it, and a
    // resume must read the same data the same way. Taken only when a
    // checkpoint is written or read: it costs a glob listing, and a sample
    // read or a HEAD per file, that a run without checkpoints need not pay.
    let fingerprint = match outputs.save.is_some() || resumed.is_some() {
        true => Some(data.fingerprint().map_err(anyhow::Error::from_boxed)?),
        false => None,
    };
    let resume_at = match &resumed {
        Some(resume) => Some(
            resume
                .position(fingerprint.as_ref(), args.outputs.force_resume)
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
            .resume(args.outputs.resume.clone())
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
        ..data.clone()
    });
    let run = RunOptions {
        outputs,
        tuner: threads.tuner(),
        resume_position,
        device_init,
    };
    let report = train(config, model, optimizer, &data, validation.as_ref(), &run)?;
    let mut stdout = std::io::stdout().lock();
    // The per-epoch lines were printed as the epochs ended.
    write!(stdout, "{report:#}")?;
    if let Some(dir) = &args.outputs.save {
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
        let note = if args.outputs.save.is_some() {
            "checkpoint saved"
        } else {
            "nothing saved (no --save)"
        };
        return Err(interrupt.error().note(note).into());
    }
    Ok(Status::Ok)
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
/// those `--exclude` names.
fn select_inputs(
    schema: &mut Schema,
    inputs: Option<&[String]>,
    exclude: Option<&[String]>,
) -> anyhow::Result<()> {
    match (inputs, exclude) {
        (Some(names), _) => schema.select(names, true).context("--inputs"),
        (None, Some(names)) => schema.select(names, false).context("--exclude"),
        (None, None) => Ok(()),
    }
}

/// The model the flags ask for, the data deciding what they leave open
/// (`ModelConfig::for_input` holds the rules).
fn model_config(
    flags: &ModelFlags,
    input: &InputSpec,
    recorded_vocab: Option<usize>,
) -> anyhow::Result<ModelChoice> {
    let request = flags.request()?;
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
