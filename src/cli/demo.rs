//! `tfpipe demo` (and `tfpipe` with no arguments): the whole story on the
//! bundled MNIST sample. Converts the IDX files to TFRecord shards, trains an
//! MLP on the CPU through the full pipeline, evaluates every epoch, saves a
//! checkpoint, reloads it and predicts, printing each report.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use tfpipe::convert::{self, Format, IdxOptions, OutputOptions, Sharding, Summary};
use tfpipe::pipeline::Parallelism;
use tfpipe::tfrecord::ReaderOptions;
use tfpipe::train::{
    InputSpec, ModelConfig, ModelInput, OptimizerConfig, OptimizerKind, Placement, Predictor,
    Reproducibility, RunControl, RunLength, SchemaMeta, Task, TokenSet, TrainConfig, TrainData,
    parse_device,
};

use super::Status;
use super::predict::{Job, Output, predict};
use super::train::{RunOptions, ms_since, set_compute_threads, train, write_json};

/// Arguments of `tfpipe demo`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {
    /// Write the shards, checkpoint and reports here (default: a new temporary directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The MNIST IDX files (default: the sample bundled in the source tree's testdata/mnist).
    #[arg(long)]
    pub testdata: Option<PathBuf>,
    /// Training epochs (default 5).
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Examples per batch (default 32, as Keras' fit).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Seeds weight initialisation and shuffling (default 0).
    #[arg(long)]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub runtime: super::RuntimeFlags,
    /// Instead of MNIST: generate the token-classification set
    /// (`tfpipe::train::TokenSet`: variable-length int64 ids, 4 classes)
    /// and train the embedding model on it.
    #[arg(long)]
    pub tokens: bool,
    /// With --tokens: training records to generate (default 3000; a tenth
    /// as many more for validation).
    #[arg(long, requires = "tokens")]
    pub records: Option<u64>,
}

/// The bundled sample, found at compile time (override with `--testdata`).
const BUNDLED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/mnist");

/// Runs the demo.
pub fn run(args: Args) -> anyhow::Result<Status> {
    if args.tokens {
        return run_tokens(args);
    }
    let started = Instant::now();
    let device = parse_device(&args.runtime.device)?;
    let device_init = started.elapsed();
    let mut stdout = std::io::stdout().lock();
    let source = args
        .testdata
        .clone()
        .unwrap_or_else(|| PathBuf::from(BUNDLED));
    let epochs = args.epochs.unwrap_or(5);
    let batch_size = args.batch_size.unwrap_or(32);
    let seed = args.seed.unwrap_or(0);
    let out = out_dir(&args)?;
    writeln!(
        stdout,
        "tfpipe demo: MNIST digits -> TFRecord -> MLP on the CPU -> checkpoint -> predictions"
    )?;
    writeln!(stdout, "source  {}", source.display())?;
    writeln!(stdout, "output  {}", out.display())?;

    // 1. Convert.
    writeln!(stdout, "\n== 1. convert IDX to TFRecord shards")?;
    let t = Instant::now();
    let train_files = convert_idx(&source, "train", &out, 4)?;
    let test_files = convert_idx(&source, "test", &out, 1)?;
    writeln!(
        stdout,
        "wrote {} + {} shards ({} and {} records) and {} in {:.1} ms",
        train_files.shards.len(),
        test_files.shards.len(),
        train_files.records,
        test_files.records,
        train_files.schema_path.display(),
        ms_since(t)
    )?;

    // 2. Train through the pipeline, evaluating every epoch. The
    // conversion's threads have finished: safe to size candle's now.
    let compute_threads = set_compute_threads(args.runtime.compute_threads)?;
    writeln!(
        stdout,
        "\n== 2. train mlp 784-256-10 (adamw, batch {batch_size}, {epochs} epochs, {compute_threads} compute threads, {}) through the pipeline",
        device_name(&device)
    )?;
    let schema = train_files.schema.clone();
    let selection = InputSpec::from_schema(&schema, Task::Classification { classes: 10 })?;
    let schema = selection.schema;
    let input = selection.spec;
    let model = ModelConfig::Mlp {
        inputs: input.inputs(),
        hidden: vec![256],
        classes: 10,
    };
    let config = TrainConfig::new(
        ModelInput::new(input)
            .schema(SchemaMeta::from_schema(&schema))
            .skipped_features(selection.skipped),
    )
    .length(RunLength::new().epochs(epochs))
    .placement(Placement::new().device(device.clone()))
    .reproducibility(Reproducibility::new().seed(seed))
    .control(RunControl::new().origin(super::process_start()));
    let data = TrainData {
        files: globs(&train_files),
        reader: ReaderOptions::default(),
        schema: schema.clone(),
        batch_size,
        shuffle_buffer: 10_000,
        seed,
        parallelism: Parallelism::Auto,
        rank: None,
        label_classes: None,
    };
    let test = TrainData {
        files: globs(&test_files),
        shuffle_buffer: 0,
        batch_size: 256,
        ..data.clone()
    };
    let checkpoint = out.join("checkpoint");
    let run = RunOptions {
        save: Some(checkpoint.clone()),
        logdir: Some(out.join("logs")),
        tuner: compute_threads.tuner(),
        device_init,
        ..RunOptions::default()
    };
    let report = train(
        config,
        model,
        OptimizerConfig::default_for(OptimizerKind::AdamW),
        &data,
        Some(&test),
        &run,
    )?;
    write!(stdout, "{report:#}")?;
    writeln!(stdout, "checkpoint saved to {}", checkpoint.display())?;
    write_json(&out.join("train-report.json"), &report)?;

    // 3. Reload the checkpoint and predict the test digits.
    writeln!(
        stdout,
        "\n== 3. reload the checkpoint and predict the test digits"
    )?;
    let predictor = Predictor::load(&checkpoint, &device)?;
    let predictions = out.join("predictions.jsonl");
    let test_globs = globs(&test_files);
    let predicted = predict(
        &predictor,
        Job {
            files: &test_globs,
            reader: ReaderOptions::default(),
            batch_size: 32,
            parallelism: Parallelism::Auto,
            warmup: 2,
            output: Output::File(predictions),
            key: None,
            stop: None,
            rank: None,
        },
    )?;
    write!(stdout, "{predicted}")?;
    write_json(&out.join("predict-report.json"), &predicted)?;

    writeln!(
        stdout,
        "\n== done in {:.1} s",
        started.elapsed().as_secs_f64()
    )?;
    if let Some(accuracy) = report.val_accuracy {
        writeln!(
            stdout,
            "test accuracy {:.2}% after {} epochs",
            accuracy * 100.0,
            report.epochs.len()
        )?;
    }
    writeln!(
        stdout,
        "TensorBoard:  tensorboard --logdir {}",
        out.join("logs").display()
    )?;
    writeln!(
        stdout,
        "Again by hand: {} train --schema {} --data '{}' --test-data '{}' --epochs {epochs} --batch-size {batch_size}",
        this_binary(),
        train_files.schema_path.display(),
        out.join("train-*.tfrecord").display(),
        out.join("test-*.tfrecord").display()
    )?;
    writeln!(
        stdout,
        "(`cargo install --path .` puts tfpipe on your PATH; then `tfpipe --help`)"
    )?;
    Ok(Status::Ok)
}

/// Converts `DIR/{split}-images-idx3-ubyte.gz` (and its labels) into
/// `OUT/{split}-0000N-of-...tfrecord` + `OUT/{split}.features.json`.
fn convert_idx(dir: &Path, split: &str, out: &Path, shards: usize) -> anyhow::Result<Summary> {
    let images = dir.join(format!("{split}-images-idx3-ubyte.gz"));
    let output = OutputOptions {
        sharding: Sharding::Shards(shards),
        ..OutputOptions::new(out.join(split))
    };
    Ok(convert::convert(
        &Format::Idx(IdxOptions::default()),
        &[images],
        &output,
    )?)
}

/// A device's name as the reports print it (`cpu`, `cuda:0`).
fn device_name(device: &candle_core::Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// The output directory: `--out`, or a new temporary one.
fn out_dir(args: &Args) -> anyhow::Result<PathBuf> {
    match &args.out {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("{}: cannot create", dir.display()))?;
            Ok(dir.clone())
        }
        None => Ok(tempfile::Builder::new()
            .prefix("tfpipe-demo-")
            .tempdir()
            .context("cannot create a temporary directory")?
            .keep()),
    }
}

/// `tfpipe demo --tokens`: generate the token set, train the embedding
/// model on it through the pipeline (as `tfpipe train` would pick it from
/// the schema), save, and report.
fn run_tokens(args: Args) -> anyhow::Result<Status> {
    let started = Instant::now();
    let device = parse_device(&args.runtime.device)?;
    let device_init = started.elapsed();
    let mut stdout = std::io::stdout().lock();
    let records = args.records.unwrap_or(3000);
    let epochs = args.epochs.unwrap_or(5);
    let batch_size = args.batch_size.unwrap_or(32);
    let seed = args.seed.unwrap_or(0);
    let out = out_dir(&args)?;
    let set = TokenSet {
        seed,
        ..TokenSet::default()
    };
    writeln!(
        stdout,
        "tfpipe demo --tokens: generated token ids -> TFRecord -> embedding model -> checkpoint"
    )?;
    let t = Instant::now();
    let train_files = set.write(&out.join("tokens-train"), 0, records)?;
    let validation = set.write(&out.join("tokens-validation"), records, records / 10)?;
    writeln!(
        stdout,
        "wrote {records} + {} records ({} classes, ids in 0..{}, lengths {}-{}) in {:.1} ms",
        records / 10,
        set.classes,
        set.vocab,
        set.min_len,
        set.max_len,
        ms_since(t)
    )?;
    let compute_threads = set_compute_threads(args.runtime.compute_threads)?;
    let task = Task::Classification {
        classes: set.classes,
    };
    let selection = InputSpec::from_schema(&set.schema(), task)?;
    let model = ModelConfig::Embedding {
        vocab: set.vocab,
        dim: 32,
        inputs: selection.spec.inputs(),
        hidden: vec![64],
        classes: set.classes,
    };
    writeln!(
        stdout,
        "\n== train {} (adamw, batch {batch_size}, {epochs} epochs, {compute_threads} compute threads, {})",
        model.describe(),
        device_name(&device)
    )?;
    let config = TrainConfig::new(
        ModelInput::new(selection.spec)
            .schema(SchemaMeta::from_schema(&selection.schema))
            .label_vocabulary(set.class_names()),
    )
    .length(RunLength::new().epochs(epochs).examples_per_epoch(records))
    .placement(Placement::new().device(device))
    .reproducibility(Reproducibility::new().seed(seed))
    .control(RunControl::new().origin(super::process_start()));
    let data = TrainData {
        files: vec![train_files.data.to_string_lossy().into_owned()],
        reader: ReaderOptions::default(),
        schema: selection.schema.clone(),
        batch_size,
        shuffle_buffer: 10_000,
        seed,
        parallelism: Parallelism::Auto,
        rank: None,
        label_classes: None,
    };
    let test = TrainData {
        files: vec![validation.data.to_string_lossy().into_owned()],
        shuffle_buffer: 0,
        batch_size: 256,
        ..data.clone()
    };
    let checkpoint = out.join("tokens-checkpoint");
    let run = RunOptions {
        save: Some(checkpoint.clone()),
        tuner: compute_threads.tuner(),
        device_init,
        ..RunOptions::default()
    };
    let report = train(
        config,
        model,
        OptimizerConfig::default_for(OptimizerKind::AdamW),
        &data,
        Some(&test),
        &run,
    )?;
    write!(stdout, "{report:#}")?;
    write_json(&out.join("tokens-train-report.json"), &report)?;
    writeln!(
        stdout,
        "\n== done in {:.1} s: {:.0} examples/s",
        started.elapsed().as_secs_f64(),
        report.examples_per_sec
    )?;
    if let Some(accuracy) = report.val_accuracy {
        writeln!(
            stdout,
            "validation accuracy {:.2}% after {} epochs",
            accuracy * 100.0,
            report.epochs.len()
        )?;
    }
    writeln!(
        stdout,
        "Again by hand: {} train --schema {} --data {} --validation-data {} --epochs {epochs} --batch-size {batch_size}",
        this_binary(),
        train_files.schema.display(),
        train_files.data.display(),
        validation.data.display()
    )?;
    writeln!(
        stdout,
        "(`cargo install --path .` puts tfpipe on your PATH; then `tfpipe --help`)"
    )?;
    Ok(Status::Ok)
}

fn globs(summary: &Summary) -> Vec<String> {
    summary
        .shards
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

/// How to run this binary again from the current directory: its path
/// relative to here when it is below (`target/release/tfpipe` after `cargo
/// run --release`), else its full path. `cargo run` does not put it on PATH.
fn this_binary() -> String {
    let Ok(exe) = std::env::current_exe() else {
        return "tfpipe".into();
    };
    let here = std::env::current_dir().unwrap_or_default();
    match exe.strip_prefix(&here) {
        Ok(relative) => relative.display().to_string(),
        Err(_) => exe.display().to_string(),
    }
}
