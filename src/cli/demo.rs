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
    InputSpec, ModelConfig, ModelInput, ModelRequest, OptimizerConfig, OptimizerKind, Placement,
    Predictor, Reproducibility, RunControl, RunLength, RunOutputs, SchemaMeta, Task, TokenSet,
    TrainConfig, TrainData, parse_device,
};

use super::Status;
use super::common::{ms_since, set_compute_threads, write_json};
use super::fit::{RunOptions, train};
use super::predict::{Job, Output, predict};

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

/// Runs the demo: writes its data, trains on it through the pipeline
/// (choosing the model as `tfpipe train` would from the schema), saves a
/// checkpoint and, for the digits, reloads it and predicts.
pub fn run(args: Args) -> anyhow::Result<Status> {
    let started = Instant::now();
    let device = parse_device(&args.runtime.device)?;
    let device_init = started.elapsed();
    let mut stdout = std::io::stdout().lock();
    let epochs = args.epochs.unwrap_or(5);
    let batch_size = args.batch_size.unwrap_or(32);
    let seed = args.seed.unwrap_or(0);
    let out = out_dir(&args)?;
    let set = match args.tokens {
        true => tokens(&args, &out, seed, &mut stdout)?,
        false => digits(&args, &out, &mut stdout)?,
    };

    // Train through the pipeline, evaluating every epoch. The data
    // writers' threads have finished: safe to size candle's now.
    let compute_threads = set_compute_threads(args.runtime.compute_threads)?;
    let selection = InputSpec::from_schema(&set.schema, set.task)?;
    let model =
        ModelConfig::for_input(&selection.spec, &ModelRequest::default(), set.vocab_size)?.config;
    writeln!(
        stdout,
        "\n== {}. train {} (adamw, batch {batch_size}, {epochs} epochs, {compute_threads} compute threads, {}) through the pipeline",
        set.step,
        model.describe(),
        device_name(&device)
    )?;
    let config = TrainConfig::new(
        ModelInput::new(selection.spec)
            .schema(SchemaMeta::from_schema(&selection.schema))
            .label_vocabulary(set.label_vocabulary.clone())
            .skipped_features(selection.skipped),
    )
    .length(
        RunLength::new()
            .epochs(epochs)
            .examples_per_epoch(set.records),
    )
    .placement(Placement::new().device(device.clone()))
    .reproducibility(Reproducibility::new().seed(seed))
    .control(RunControl::new().origin(super::process_start()));
    let data = TrainData {
        files: set.train.clone(),
        reader: ReaderOptions::default(),
        schema: selection.schema,
        batch_size,
        shuffle_buffer: 10_000,
        seed,
        parallelism: Parallelism::Auto,
        rank: None,
        label_classes: None,
        sequences: Default::default(),
        padding: Default::default(),
        weights: Vec::new(),
        partition_features: Vec::new(),
        missing_labels: Default::default(),
    };
    let test = TrainData {
        files: set.test.clone(),
        shuffle_buffer: 0,
        batch_size: 256,
        ..data.clone()
    };
    let checkpoint = out.join(format!("{}checkpoint", set.prefix));
    let run = RunOptions {
        outputs: RunOutputs {
            save: Some(checkpoint.clone()),
            logdir: set.logs.then(|| out.join("logs")),
            ..RunOutputs::default()
        },
        tuner: compute_threads.tuner(),
        device_init,
        ..RunOptions::default()
    };
    let optimizer = OptimizerConfig::default_for(OptimizerKind::AdamW);
    let report = train(config, model, optimizer, &data, Some(&test), &run)?;
    write!(stdout, "{report:#}")?;
    writeln!(stdout, "checkpoint saved to {}", checkpoint.display())?;
    write_json(
        &out.join(format!("{}train-report.json", set.prefix)),
        &report,
    )?;

    if !args.tokens {
        predict_digits(&checkpoint, &device, &set.test, &out, &mut stdout)?;
    }
    writeln!(
        stdout,
        "\n== done in {:.1} s: {:.0} examples/s",
        started.elapsed().as_secs_f64(),
        report.examples_per_sec
    )?;
    if let Some(accuracy) = report.val_accuracy {
        writeln!(
            stdout,
            "{} accuracy {:.2}% after {} epochs",
            set.test_name,
            accuracy * 100.0,
            report.epochs.len()
        )?;
    }
    if set.logs {
        writeln!(
            stdout,
            "TensorBoard:  tensorboard --logdir {}",
            out.join("logs").display()
        )?;
    }
    writeln!(
        stdout,
        "Again by hand: {} train {} --epochs {epochs} --batch-size {batch_size}",
        this_binary(),
        set.again
    )?;
    writeln!(
        stdout,
        "(`cargo install --path .` puts tfpipe on your PATH; then `tfpipe --help`)"
    )?;
    Ok(Status::Ok)
}

/// What the demo trains on, written into its output directory.
struct DemoSet {
    /// Training and test files.
    train: Vec<String>,
    test: Vec<String>,
    /// Their schema, with its label.
    schema: tfpipe::Schema,
    task: Task,
    /// The class names, when the set has them.
    label_vocabulary: Option<Vec<String>>,
    /// The token vocabulary's size, when the set has token ids.
    vocab_size: Option<usize>,
    /// Training records (for the progress bar's length).
    records: Option<u64>,
    /// The step number of the training headline.
    step: u32,
    /// Prefix of the checkpoint and report names.
    prefix: &'static str,
    /// What the test split is called in the last line.
    test_name: &'static str,
    /// Whether to write TensorBoard logs.
    logs: bool,
    /// The `tfpipe train` arguments that train on the same files.
    again: String,
}

/// The bundled MNIST digits, converted to TFRecord shards.
fn digits(args: &Args, out: &Path, stdout: &mut impl Write) -> anyhow::Result<DemoSet> {
    let source = args
        .testdata
        .clone()
        .unwrap_or_else(|| PathBuf::from(BUNDLED));
    writeln!(
        stdout,
        "tfpipe demo: MNIST digits -> TFRecord -> MLP on the CPU -> checkpoint -> predictions"
    )?;
    writeln!(stdout, "source  {}", source.display())?;
    writeln!(stdout, "output  {}", out.display())?;
    writeln!(stdout, "\n== 1. convert IDX to TFRecord shards")?;
    let t = Instant::now();
    let train_files = convert_idx(&source, "train", out, 4)?;
    let test_files = convert_idx(&source, "test", out, 1)?;
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
    Ok(DemoSet {
        train: globs(&train_files),
        test: globs(&test_files),
        schema: train_files.schema.clone(),
        task: Task::Classification { classes: 10 },
        label_vocabulary: None,
        vocab_size: None,
        records: None,
        step: 2,
        prefix: "",
        test_name: "test",
        logs: true,
        again: format!(
            "--schema {} --data '{}' --validation-data '{}'",
            train_files.schema_path.display(),
            out.join("train-*.tfrecord").display(),
            out.join("test-*.tfrecord").display()
        ),
    })
}

/// `--tokens`: the generated token-classification set.
fn tokens(args: &Args, out: &Path, seed: u64, stdout: &mut impl Write) -> anyhow::Result<DemoSet> {
    let records = args.records.unwrap_or(3000);
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
    Ok(DemoSet {
        train: vec![train_files.data.to_string_lossy().into_owned()],
        test: vec![validation.data.to_string_lossy().into_owned()],
        schema: set.schema(),
        task: Task::Classification {
            classes: set.classes,
        },
        label_vocabulary: Some(set.class_names()),
        vocab_size: Some(set.vocab),
        records: Some(records),
        step: 1,
        prefix: "tokens-",
        test_name: "validation",
        logs: false,
        again: format!(
            "--schema {} --data {} --validation-data {}",
            train_files.schema.display(),
            train_files.data.display(),
            validation.data.display()
        ),
    })
}

/// Reloads the digits' checkpoint and predicts the test digits.
fn predict_digits(
    checkpoint: &Path,
    device: &candle_core::Device,
    test: &[String],
    out: &Path,
    stdout: &mut impl Write,
) -> anyhow::Result<()> {
    writeln!(
        stdout,
        "\n== 3. reload the checkpoint and predict the test digits"
    )?;
    let predictor = Predictor::load(checkpoint, device)?;
    let predicted = predict(
        &predictor,
        Job {
            files: test,
            reader: ReaderOptions::default(),
            batch_size: 32,
            parallelism: Parallelism::Auto,
            warmup: 2,
            output: Output::File(out.join("predictions.jsonl")),
            key: None,
            stop: None,
            rank: None,
        },
    )?;
    write!(stdout, "{predicted}")?;
    write_json(&out.join("predict-report.json"), &predicted)?;
    Ok(())
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
