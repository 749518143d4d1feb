//! `tfpipe train`: trains a model fed by the pipeline and reports stall
//! versus compute, the start-up breakdown and test accuracy.
//!
//! Also home of the helpers `predict` and `demo` share: opening TFRecord
//! data as batch streams, the progress bar, and writing JSON reports.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tfpipe::Schema;
use tfpipe::pipeline::{Parallelism, Pipeline};
use tfpipe::train::{
    BatchStream, BoxError, Checkpoint, InputSpec, ModelConfig, OptimizerConfig, OptimizerKind,
    SchemaMeta, TrainConfig, TrainReport, Trainer, classes_from_metadata, parse_device,
};

use super::Status;

/// Arguments of `tfpipe train`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Training data: TFRecord files or globs (compression from the suffix).
    #[arg(long, required = true, num_args = 1..)]
    pub data: Vec<String>,
    /// A feature to parse, NAME:DTYPE[:SHAPE] (e.g. image_raw:uint8:28x28, label:int64).
    #[arg(long = "feature", conflicts_with = "schema")]
    pub features: Vec<String>,
    /// A schema file (`PREFIX.features.json` from `tfpipe convert`).
    #[arg(long)]
    pub schema: Option<PathBuf>,
    /// The label feature (int64 class ids). By default the schema's label.
    #[arg(long)]
    pub label: Option<String>,
    /// The number of classes (labels must be below it). By default the size
    /// of the label vocabulary `tfpipe convert` recorded in the schema file,
    /// else 10.
    #[arg(long)]
    pub classes: Option<usize>,
    /// Test data, evaluated after every epoch.
    #[arg(long, num_args = 1..)]
    pub test_data: Vec<String>,
    /// The model: mlp or cnn (LeNet-like, for 28x28 inputs). By default mlp,
    /// or the checkpoint's with --resume.
    #[arg(long)]
    pub model: Option<String>,
    /// The MLP's hidden layer sizes, comma-separated. By default 256.
    #[arg(long)]
    pub hidden: Option<String>,
    /// The optimizer: adamw, adamw-fused (the same update in one pass per
    /// tensor, CPU only, much faster) or sgd. By default adamw, or the checkpoint's.
    #[arg(long)]
    pub optimizer: Option<String>,
    /// The learning rate. By default 0.001 for adamw, 0.1 for sgd.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Epochs to train. By default 1.
    #[arg(long, conflicts_with = "steps")]
    pub epochs: Option<u64>,
    /// Steps to train (instead of epochs).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Examples per batch.
    #[arg(long, default_value_t = 256)]
    pub batch_size: usize,
    /// Shuffle buffer size in examples (0: no shuffle).
    #[arg(long, default_value_t = 10_000)]
    pub shuffle_buffer: usize,
    /// Parse workers: a number or `auto`.
    #[arg(long, default_value = "auto")]
    pub num_parallel_calls: String,
    /// Batches the device-prefetch stage converts ahead (0: on the training thread).
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// cpu, cuda or cuda:N (cuda needs the `cuda` cargo feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Save a checkpoint here at the end.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Continue from the checkpoint here.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Write TensorBoard event files here.
    #[arg(long)]
    pub logdir: Option<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long)]
    pub report_json: Option<PathBuf>,
    /// Seeds weight initialisation and shuffling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CPU threads for the model's math (candle). By default half the cores
    /// (at least 1), leaving the rest to the pipeline; RAYON_NUM_THREADS, if
    /// set, is respected.
    #[arg(long)]
    pub compute_threads: Option<usize>,
}

/// Runs `tfpipe train`.
pub fn run(args: Args) -> anyhow::Result<Status> {
    set_compute_threads(args.compute_threads)?;
    // Resolve and check everything before any work starts.
    let device = parse_device(&args.device)?;
    let resumed = match &args.resume {
        Some(dir) => Some(Checkpoint::read_meta(dir)?),
        None => None,
    };
    let (schema, recorded_classes) = load_schema(
        &args.features,
        args.schema.as_deref(),
        args.label.as_deref(),
    )?;
    if schema.label.is_none() {
        bail!("no label: name the label feature with --label NAME");
    }
    if args.classes == Some(0) {
        bail!("--classes must be at least 1");
    }
    let classes = args.classes.or(recorded_classes).unwrap_or(10);
    // Parse only what the model takes: skipped features cost nothing.
    let selection = InputSpec::from_schema(&schema, classes)?;
    let schema = selection.schema;
    let input = selection.spec;
    let model = match (&args.model, &args.hidden, &resumed) {
        (None, None, Some(meta)) => meta.model.clone(),
        _ => model_config(args.model.as_deref(), args.hidden.as_deref(), &input)?,
    };
    let kind = match (&args.optimizer, &resumed) {
        (Some(text), _) => text.parse::<OptimizerKind>().map_err(anyhow::Error::msg)?,
        (None, Some(meta)) => meta.optimizer.kind,
        (None, None) => OptimizerKind::AdamW,
    };
    let mut optimizer = match &resumed {
        Some(meta) if meta.optimizer.kind == kind => meta.optimizer,
        _ => OptimizerConfig::default_for(kind),
    };
    if let Some(lr) = args.lr {
        optimizer.lr = lr;
    }
    let parallelism: Parallelism = args
        .num_parallel_calls
        .parse()
        .map_err(anyhow::Error::msg)?;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let mut config = TrainConfig::new(model, optimizer, input);
    config.schema = Some(SchemaMeta::from_schema(&schema));
    config.skipped_features = selection.skipped;
    config.epochs = args.epochs;
    config.steps = args.steps;
    config.seed = args.seed;
    config.device = device;
    config.prefetch = args.prefetch;
    config.resume = args.resume.clone();
    config.logdir = args.logdir.clone();
    config.origin = super::process_start();
    let data = DataOptions {
        files: args.data.clone(),
        schema: schema.clone(),
        batch_size: args.batch_size,
        shuffle_buffer: args.shuffle_buffer,
        seed: args.seed,
        parallelism,
    };
    let test = (!args.test_data.is_empty()).then(|| DataOptions {
        files: args.test_data.clone(),
        shuffle_buffer: 0,
        ..data.clone()
    });
    let report = train(config, &data, test.as_ref(), args.save.as_deref())?;
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{report}")?;
    if let Some(dir) = &args.save {
        writeln!(
            stdout,
            "checkpoint saved to {} (global step {})",
            dir.display(),
            report.global_step
        )?;
    }
    if let Some(path) = &args.report_json {
        write_json(path, &report)?;
    }
    Ok(Status::Ok)
}

/// Trains with a progress bar; saves to `save` when given.
pub(super) fn train(
    config: TrainConfig,
    data: &DataOptions,
    test: Option<&DataOptions>,
    save: Option<&Path>,
) -> anyhow::Result<TrainReport> {
    let bar = progress_bar(config.steps);
    let mut trainer = Trainer::new(config)?;
    let shown = bar.clone();
    trainer.on_progress(move |p| {
        shown.set_position(p.run_steps);
        shown.set_message(format!(
            "epoch {}  loss {:.4}  {:.0} examples/s  stall {:.1}%",
            p.epoch,
            p.loss,
            p.examples_per_sec,
            p.stall_fraction * 100.0
        ));
    });
    let train_data = data.clone();
    let open = move |epoch: u64| train_data.open(epoch);
    let report = match test {
        Some(test) => {
            let test = test.clone();
            let mut open_test = move || test.open(0);
            trainer.fit(open, Some(&mut open_test))
        }
        None => trainer.fit(open, None),
    };
    bar.finish_and_clear();
    let report = report?;
    if let Some(dir) = save {
        trainer.save(dir)?;
    }
    Ok(report)
}

/// What it takes to open the data as a pipeline of batches.
#[derive(Debug, Clone)]
pub(super) struct DataOptions {
    pub files: Vec<String>,
    pub schema: Schema,
    pub batch_size: usize,
    /// 0: read in file order.
    pub shuffle_buffer: usize,
    pub seed: u64,
    pub parallelism: Parallelism,
}

impl DataOptions {
    /// Starts the pipeline for `epoch`: read (files interleaved), shuffle
    /// (reseeded per epoch), batch, parse per batch, prefetch.
    pub(super) fn open(&self, epoch: u64) -> Result<Box<dyn BatchStream>, BoxError> {
        let files = Pipeline::tfrecord_files(&self.files)?;
        let records = if self.shuffle_buffer > 0 {
            files
                .interleave(4, 16)
                .shuffle(self.shuffle_buffer, self.seed.wrapping_add(epoch))
        } else {
            files.records()
        };
        let iter = records
            .batch(self.batch_size)
            .parse_batches(self.schema.clone(), self.parallelism)
            .prefetch(2)
            .start()?;
        Ok(Box::new(iter))
    }
}

/// The schema from `--schema` or `--feature`s, with `--label` applied, and
/// the number of classes the schema file records for its label (when
/// `--label` names another feature, that count does not apply).
pub(super) fn load_schema(
    features: &[String],
    schema: Option<&Path>,
    label: Option<&str>,
) -> anyhow::Result<(Schema, Option<usize>)> {
    let (mut schema, classes) = match schema {
        Some(path) => {
            let (schema, metadata) = Schema::load_with_metadata(path)?;
            (schema, classes_from_metadata(&metadata))
        }
        None if features.is_empty() => {
            bail!("no features: give --schema FILE or --feature NAME:DTYPE[:SHAPE]...")
        }
        None => (Schema::from_feature_texts(features)?, None),
    };
    let classes = classes.filter(|_| label.is_none() || label == schema.label.as_deref());
    if let Some(label) = label {
        if schema.feature(label).is_none() {
            bail!(
                "--label {label:?} is not a feature (features: {})",
                schema
                    .features
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        schema.label = Some(label.to_string());
    }
    Ok((schema, classes))
}

fn model_config(
    model: Option<&str>,
    hidden: Option<&str>,
    input: &InputSpec,
) -> anyhow::Result<ModelConfig> {
    match model.unwrap_or("mlp").to_ascii_lowercase().as_str() {
        "mlp" => {
            let hidden = hidden
                .unwrap_or("256")
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| {
                    s.trim().parse::<usize>().with_context(|| {
                        format!("--hidden: {s:?} is not a layer size (e.g. --hidden 256,128)")
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok(ModelConfig::Mlp {
                inputs: input.inputs(),
                hidden,
                classes: input.classes,
            })
        }
        "cnn" => {
            if hidden.is_some() {
                bail!("--hidden applies to --model mlp only");
            }
            if input.inputs() != 28 * 28 {
                bail!(
                    "--model cnn takes 28x28 inputs (784 values per example); the features give {}",
                    input.inputs()
                );
            }
            Ok(ModelConfig::Cnn {
                classes: input.classes,
            })
        }
        other => bail!("unknown model {other:?} (expected mlp or cnn)"),
    }
}

/// Sets how many threads candle's CPU kernels use. candle sizes its matmul
/// parallelism from `RAYON_NUM_THREADS` (read on every matmul; default: all
/// physical cores) and its rayon pool from the same variable. On a 2-core
/// machine two compute threads fight the pipeline's threads for the cores:
/// measured on the demo, one compute thread made a step 5x faster (1.1 ms
/// against 5.4 ms median at batch 32), so the default is half the cores.
///
/// Must run before any other thread exists or candle's pool is built: call
/// it first in a command (the demo calls it after conversion, whose
/// threads have all finished).
pub(super) fn set_compute_threads(threads: Option<usize>) -> anyhow::Result<usize> {
    if threads == Some(0) {
        bail!("--compute-threads must be at least 1");
    }
    let from_env = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let n = match (threads, from_env) {
        (Some(n), _) => n,
        (None, Some(n)) if n > 0 => return Ok(n),
        _ => std::thread::available_parallelism().map_or(1, |c| (c.get() / 2).max(1)),
    };
    // SAFETY: called before this process starts threads that could read
    // the environment concurrently (see above); nothing else writes it.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    Ok(n)
}

/// A progress bar on stderr, hidden when stderr is not a terminal.
pub(super) fn progress_bar(len: Option<u64>) -> ProgressBar {
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::no_length(),
    };
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        let template = if len.is_some() {
            "{spinner} step {pos}/{len} [{elapsed_precise}] {wide_bar} {msg}"
        } else {
            "{spinner} step {pos} [{elapsed_precise}] {msg}"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(200));
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar
}

/// Writes `value` as pretty JSON to `path`, atomically (temp file + rename).
pub(super) fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut file = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("{}: cannot create", path.display()))?;
    serde_json::to_writer_pretty(&mut file, value)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    std::io::Write::write_all(&mut file, b"\n")
        .with_context(|| format!("{}: cannot write", path.display()))?;
    file.persist(path)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(())
}

/// Milliseconds since `since`.
pub(super) fn ms_since(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}
