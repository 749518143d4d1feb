//! `tfpipe train`: trains a model fed by the pipeline and reports stall
//! versus compute, the start-up breakdown and test accuracy.
//!
//! This file turns the flags into the library's inputs (schema, task,
//! model, optimizer, data, resume), adds the flag that fixes each error,
//! and prints; the decisions are the library's (`tfpipe::train`).

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, bail};
use tfpipe::Schema;
use tfpipe::example::{DType, FeatureSpec, SchemaMetadata};
use tfpipe::pipeline::Rank;
use tfpipe::pipeline::{Pipeline, Remainder};
use tfpipe::train::{
    DataFingerprint, ImageInput, ImageShape, Impute, InputSelection, InputSpec, IntLabels,
    LabelClasses, MissingLabels, ModelChoice, ModelConfig, ModelInput, ModelRequest, PixelScaling,
    Placement, Reproducibility, Resume, ResumeAt, RunControl, RunLength, SchemaMeta,
    SkippedFeature, Task, TaskKind, TrainConfig, TrainData, TrainReport, parse_device,
};

use super::common::{
    check_model_size, check_output_dir, check_output_file, check_size, check_vocabulary,
    load_schema, read_facts, set_compute_threads, write_json,
};
use super::fit::{RunOptions, train};
pub use super::train_flags::Args;
use super::train_flags::{ImageSize, ModelFlags, model_error, with_hint};
use super::{Status, interrupt};

/// Runs `tfpipe train`.
pub fn run(mut args: Args) -> anyhow::Result<Status> {
    let threads = set_compute_threads(args.runtime.compute_threads)?;
    // Resolve and check everything before any work starts.
    let rank = args.rank.resolve()?;
    prepare_outputs(&mut args, rank)?;
    let weights = super::mix_into_data(&mut args.data, &args.mix);
    // Device init (on CUDA: the context, cuBLAS and cuRAND handles).
    let init = Instant::now();
    let device = parse_device(&super::rank::device(&args.runtime.device)?)?;
    let device_init = init.elapsed();
    let resumed = args.outputs.resume.as_ref().map(Resume::read).transpose()?;
    let inputs = Inputs::from_flags(&args, rank, resumed.as_ref())?;
    let model = choose_model(&args, resumed.as_ref(), &inputs)?;
    check_model_size(&model, &inputs.spec, args.batch_size, args.prefetch)?;
    let optimizer = args.optimizer.config(resumed.as_ref())?;
    let steps_per_epoch = inputs
        .recorded
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
    let seed = run_seed(&args, resumed.as_ref());
    let data = TrainData {
        files: args.data.clone(),
        reader: args.compression.reader_options(),
        schema: inputs.spec.parse_schema(&inputs.schema),
        batch_size: args.batch_size,
        shuffle_buffer: args.shuffle_buffer,
        seed,
        parallelism: args.parse.num_parallel_calls,
        rank,
        label_classes: inputs.label_classes.clone(),
        sequences: args.sequences.resolve(args.batch_size)?,
        padding: Default::default(),
        weights,
        partition_features: args.partition_features.clone(),
        missing_labels: match args.skip_missing_labels {
            true => MissingLabels::skip(),
            false => MissingLabels::default(),
        },
    };
    // What the pipeline's order depends on: checkpoints record it, and a
    // resume must read the same data the same way. Taken only when a
    // checkpoint is written or read: it costs a glob listing, and a sample
    // read or a HEAD per file, that a run without checkpoints need not pay.
    let fingerprint = match outputs.save.is_some() || resumed.is_some() {
        true => Some(data.fingerprint().map_err(anyhow::Error::from_boxed)?),
        false => None,
    };
    let resume_position = match &resumed {
        Some(resume) => resume_position(resume, fingerprint.as_ref(), args.outputs.force_resume)?,
        None => None,
    };
    let pixels = match args.rescale {
        true => PixelScaling::Rescale,
        false => PixelScaling::Standardize,
    };
    let config = TrainConfig::new(inputs.model_input(pixels))
        .length(
            RunLength::new()
                .epochs(args.epochs)
                .steps(args.steps)
                .examples_per_epoch(inputs.recorded.records),
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
        padding: Default::default(),
        weights: Vec::new(),
        missing_labels: data.missing_labels.fresh(),
        ..data.clone()
    });
    let run = RunOptions {
        outputs,
        tuner: threads.tuner(),
        resume_position,
        device_init,
    };
    let report = train(config, model, optimizer, &data, validation.as_ref(), &run)?;
    print_report(&args, &report)?;
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

/// Gives each rank its own output paths, picks the next numbered version
/// for `--save-versions`, and checks every destination before any work.
fn prepare_outputs(args: &mut Args, rank: Option<Rank>) -> anyhow::Result<()> {
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
    check_output_file(args.report.report_json.as_deref(), "--report-json")
}

/// What the model trains on: the schema it parses, the input spec, the
/// text label's classes, and what the schema file records.
struct Inputs {
    schema: Schema,
    spec: InputSpec,
    skipped: Vec<SkippedFeature>,
    label_classes: Option<LabelClasses>,
    recorded: SchemaMetadata,
}

impl Inputs {
    /// The schema, task and inputs the flags and the data give, checked
    /// against the resumed checkpoint's and the validation data's
    /// vocabularies.
    fn from_flags(
        args: &Args,
        rank: Option<Rank>,
        resumed: Option<&Resume>,
    ) -> anyhow::Result<Inputs> {
        let (mut schema, recorded_classes) = load_schema(
            &args.features,
            args.schema.as_deref(),
            args.label.as_deref(),
        )?;
        select_inputs(&mut schema, args.inputs.as_deref(), args.exclude.as_deref())?;
        if let Some(size) = args.model.image_size {
            resize_images(&mut schema, size)?;
        }
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
        let label_classes = match kind {
            TaskKind::Classification => {
                text_label_classes(args, &schema, &label, resumed, &recorded)?
            }
            TaskKind::Regression => None,
        };
        let task = match kind {
            TaskKind::Regression => Task::Regression,
            TaskKind::Classification => {
                let task = classification(
                    args,
                    &label,
                    label_classes.as_ref(),
                    recorded_classes,
                    resumed,
                )?;
                // The last layer alone holds classes x hidden weights.
                check_size("--classes", task.outputs() as u128 * 4 * 64)?;
                task
            }
        };
        // Parse only what the model takes: skipped features cost nothing.
        let selection = InputSpec::from_schema(&schema, task).map_err(|e| {
            let hint = if kind == TaskKind::Classification && label_dtype == DType::Float32 {
                "a float32 label is a regression target (--task regression)"
            } else {
                "choose the inputs with --feature NAME:DTYPE[:SHAPE], or convert numbers as such (`tfpipe convert csv --column NAME:float32`)"
            };
            anyhow::Error::new(e).context(hint)
        })?;
        let selection = impute(selection, args.impute);
        let inputs = Inputs {
            schema: selection.schema,
            spec: selection.spec,
            skipped: selection.skipped,
            label_classes,
            recorded,
        };
        inputs.check_vocabularies(args, resumed)?;
        if let Some(resume) = resumed {
            // Before the model is built: its input width would differ too
            // (the indicator columns), and say less.
            resume.check_input(&inputs.spec).map_err(with_hint)?;
        }
        Ok(inputs)
    }

    /// Fails when the resumed checkpoint, or the validation data's own
    /// schema file, records another label vocabulary than this data's.
    fn check_vocabularies(&self, args: &Args, resumed: Option<&Resume>) -> anyhow::Result<()> {
        if let Some(resume) = resumed {
            check_vocabulary(
                resume.label_vocabulary(),
                self.recorded.label_vocabulary.as_deref(),
                &format!("the checkpoint {}", resume.dir().display()),
                "this data's schema",
            )?;
        }
        // Validation data converted on its own has its own schema file: its
        // vocabulary must be the training data's.
        if let Some(first) = args.validation_data.first()
            && let Ok(files) = Pipeline::tfrecord_files([first.as_str()])
            && let Some(path) = files
                .paths()
                .first()
                .and_then(|p| tfpipe::convert::schema_file_beside(p))
        {
            check_vocabulary(
                self.recorded.label_vocabulary.as_deref(),
                read_facts(&path)?.label_vocabulary.as_deref(),
                "the training data",
                &format!("the validation data's schema {}", path.display()),
            )?;
        }
        Ok(())
    }

    /// The model's input as checkpoints record it.
    fn model_input(&self, pixels: PixelScaling) -> ModelInput {
        ModelInput::new(self.spec.clone())
            .pixels(pixels)
            .schema(SchemaMeta::from_schema(&self.schema))
            .label_vocabulary(
                self.label_classes
                    .as_ref()
                    .map(|c| c.names().to_vec())
                    .or_else(|| self.recorded.label_vocabulary.clone()),
            )
            .skipped_features(self.skipped.clone())
    }
}

/// `selection` with its inputs that may be missing imputed as `fill` asks,
/// said aloud either way.
fn impute(selection: InputSelection, fill: Option<Impute>) -> InputSelection {
    let Some(fill) = fill else {
        return selection;
    };
    let selection = selection.impute(fill);
    match &selection.spec.impute {
        Some(imputation) => eprintln!("tfpipe: {imputation}"),
        None => eprintln!(
            "tfpipe: note: --impute {fill}: no input may be missing (none has a default in the schema), so nothing is imputed"
        ),
    }
    selection
}

/// The resumed checkpoint's model unless the flags ask for one; otherwise
/// the one the flags and the data choose, said aloud when the data chose.
fn choose_model(
    args: &Args,
    resumed: Option<&Resume>,
    inputs: &Inputs,
) -> anyhow::Result<ModelConfig> {
    if let Some(model) = resumed.and_then(Resume::model)
        && !args.model.any()
    {
        return Ok(model.clone());
    }
    let image = image_input(args.model.image_size, inputs)?;
    let chosen = model_config(&args.model, image, &inputs.spec, inputs.recorded.vocab_size)?;
    // Never a silent switch: say which model the data chose, and why.
    if let Some(why) = &chosen.chosen_because {
        eprintln!(
            "tfpipe: model {} because {why} (choose with --model)",
            chosen.config.describe()
        );
    }
    Ok(chosen.config)
}

/// The run's seed: a resumed run keeps the checkpoint's (one seed
/// schedule per training), and says so when `--seed` asked for another.
fn run_seed(args: &Args, resumed: Option<&Resume>) -> u64 {
    let Some(resume) = resumed else {
        return args.seed;
    };
    if resume.seed() != args.seed && args.seed != 0 {
        eprintln!(
            "tfpipe: warning: --seed {} ignored: the checkpoint's run is seeded {}, and resuming continues its schedule",
            args.seed,
            resume.seed()
        );
    }
    resume.seed()
}

/// Where the resumed run's data starts (`None`: the start of the
/// checkpoint's epoch, said when it is not exact).
fn resume_position(
    resume: &Resume,
    fingerprint: Option<&DataFingerprint>,
    force: bool,
) -> anyhow::Result<Option<serde_json::Value>> {
    let at = resume.position(fingerprint, force).map_err(with_hint)?;
    match &at {
        ResumeAt::EpochStart {
            forced: Some(differences),
            ..
        } => eprintln!(
            "tfpipe: warning: --force-resume: {}: restarting the checkpoint's epoch from its beginning (no longer exact)",
            differences.join("; ")
        ),
        ResumeAt::EpochStart {
            forced: None,
            epoch,
        } if *epoch > 0 => eprintln!(
            "tfpipe: note: the checkpoint holds no pipeline position: resuming at the start of epoch {epoch}"
        ),
        _ => {}
    }
    Ok(at.pipeline_state().cloned())
}

/// The report on stdout (the per-epoch lines were printed as the epochs
/// ended), where the checkpoint went, and `--report-json`.
fn print_report(args: &Args, report: &TrainReport) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
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
        write_json(path, report)?;
    }
    Ok(())
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
            let counted = LabelClasses::count(
                &args.data,
                args.compression.reader_options(),
                label,
                &args.partition_features,
            )
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

/// The classification task: over `--classes`, the text label's classes,
/// the resumed checkpoint's count, or the schema file's vocabulary; else
/// over the int64 label's values counted in one pass over the data (refused
/// when they look like a quantity). Never a silent default: a count the
/// data gave is said with its reason.
fn classification(
    args: &Args,
    label: &str,
    text: Option<&LabelClasses>,
    recorded: Option<usize>,
    resumed: Option<&Resume>,
) -> anyhow::Result<Task> {
    if args.classes.is_some() || text.is_some() {
        return Task::classification(args.classes, text, recorded).map_err(with_hint);
    }
    if let Some(resume) = resumed
        && let task @ Task::Classification { .. } = resume.meta().input.task
    {
        return Ok(task);
    }
    if let Some(classes) = recorded {
        eprintln!(
            "tfpipe: label {label:?}: {classes} classes, from the label vocabulary in the schema file (set --classes to choose)"
        );
        return Ok(Task::Classification { classes });
    }
    let counted = IntLabels::count(
        &args.data,
        args.compression.reader_options(),
        label,
        &args.partition_features,
    )
    .map_err(anyhow::Error::from_boxed)?;
    let classes = counted.classes().map_err(with_hint)?;
    eprintln!(
        "tfpipe: label {label:?}: {classes} classes, from its values counted in one pass over the data ({counted}); set --classes to choose, or --task regression if it is a quantity rather than a class"
    );
    Ok(Task::Classification { classes })
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

/// `--image-size`: the image features (`image` specs) among the inputs
/// decode at this size (and channel count, when given). Says nothing when
/// there is none: the size is then the CNN's view of a plain input
/// ([`image_input`]).
fn resize_images(schema: &mut Schema, size: ImageSize) -> anyhow::Result<()> {
    let label = schema.label.clone();
    for feature in &mut schema.features {
        let Some(mut options) = feature.image else {
            continue;
        };
        if label.as_ref() == Some(&feature.name) {
            continue;
        }
        options.height = size.height;
        options.width = size.width;
        options.channels = size.channels.unwrap_or(options.channels);
        options
            .check()
            .with_context(|| format!("--image-size for {:?}", feature.name))?;
        *feature = FeatureSpec::image(feature.name.clone(), options);
    }
    Ok(())
}

/// The inputs as one image, for the CNN: the schema's image or `[H, W, C]`
/// feature, or, with `--image-size` and a plain input, that input read at
/// that size (an image spec was already resized by [`resize_images`]).
fn image_input(size: Option<ImageSize>, inputs: &Inputs) -> anyhow::Result<Option<ImageInput>> {
    let found = ImageInput::of_schema(&inputs.schema, &inputs.spec).map_err(model_error)?;
    let Some(size) = size else {
        return Ok(found);
    };
    if let Some(image) = found.as_ref().filter(|i| i.decoded) {
        return Ok(Some(image.clone()));
    }
    let ([(feature, _)], None) = (&inputs.spec.features[..], &inputs.spec.tokens) else {
        bail!(
            "--image-size: the inputs are {} features; an image is one (choose it with --inputs)",
            inputs.spec.features.len()
        );
    };
    Ok(Some(ImageInput {
        feature: feature.clone(),
        shape: ImageShape::new(size.height, size.width, size.channels.unwrap_or(1)),
        decoded: false,
    }))
}

/// The model the flags ask for, the data deciding what they leave open
/// (`ModelConfig::for_input` holds the rules).
fn model_config(
    flags: &ModelFlags,
    image: Option<ImageInput>,
    input: &InputSpec,
    recorded_vocab: Option<usize>,
) -> anyhow::Result<ModelChoice> {
    let request = ModelRequest {
        image,
        ..flags.request()?
    };
    let chosen = ModelConfig::for_input(input, &request, recorded_vocab).map_err(model_error)?;
    chosen.config.validate().map_err(with_hint)?;
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
