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
use tfpipe::train::{
    InputSpec, ModelConfig, OptimizerConfig, OptimizerKind, Predictor, SchemaMeta, Task,
    TrainConfig,
};

use super::Status;
use super::predict::predict;
use super::train::{DataOptions, RunOptions, ms_since, set_compute_threads, train, write_json};

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
    /// CPU threads for the model's math (default: half the cores).
    #[arg(long)]
    pub compute_threads: Option<usize>,
}

/// The bundled sample, found at compile time (override with `--testdata`).
const BUNDLED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/mnist");

/// Runs the demo.
pub fn run(args: Args) -> anyhow::Result<Status> {
    let started = Instant::now();
    let mut stdout = std::io::stdout().lock();
    let source = args
        .testdata
        .clone()
        .unwrap_or_else(|| PathBuf::from(BUNDLED));
    let epochs = args.epochs.unwrap_or(5);
    let batch_size = args.batch_size.unwrap_or(32);
    let seed = args.seed.unwrap_or(0);
    let out = match &args.out {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("{}: cannot create", dir.display()))?;
            dir.clone()
        }
        None => tempfile::Builder::new()
            .prefix("tfpipe-demo-")
            .tempdir()
            .context("cannot create a temporary directory")?
            .keep(),
    };
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
    let compute_threads = set_compute_threads(args.compute_threads)?;
    writeln!(
        stdout,
        "\n== 2. train mlp 784-256-10 (adamw, batch {batch_size}, {epochs} epochs, {compute_threads} compute threads) through the pipeline"
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
    let mut config = TrainConfig::new(input);
    config.schema = Some(SchemaMeta::from_schema(&schema));
    config.skipped_features = selection.skipped;
    config.epochs = Some(epochs);
    config.seed = seed;
    config.origin = super::process_start();
    let data = DataOptions {
        files: globs(&train_files),
        schema: schema.clone(),
        batch_size,
        shuffle_buffer: 10_000,
        seed,
        parallelism: Parallelism::Auto,
    };
    let test = DataOptions {
        files: globs(&test_files),
        shuffle_buffer: 0,
        batch_size: 256,
        ..data.clone()
    };
    let checkpoint = out.join("checkpoint");
    let run = RunOptions {
        save: Some(checkpoint.clone()),
        logdir: Some(out.join("logs")),
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
    let predictor = Predictor::load(&checkpoint, &candle_core::Device::Cpu)?;
    let predictions = out.join("predictions.jsonl");
    let predicted = predict(
        &predictor,
        &globs(&test_files),
        32,
        Parallelism::Auto,
        2,
        Some(&predictions),
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
        "Again by hand: tfpipe train --schema {} --data '{}' --test-data '{}' --epochs {epochs} --batch-size {batch_size}",
        train_files.schema_path.display(),
        out.join("train-*.tfrecord").display(),
        out.join("test-*.tfrecord").display()
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

fn globs(summary: &Summary) -> Vec<String> {
    summary
        .shards
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}
