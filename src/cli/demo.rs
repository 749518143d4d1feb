//! `tfpipe demo` (and `tfpipe` with no arguments): the whole story on the
//! bundled MNIST sample. Converts the IDX files to TFRecord shards, trains an
//! MLP on the CPU through the full pipeline, evaluates every epoch, saves a
//! checkpoint, reloads it and predicts, printing each report.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use prost::Message;
use tfpipe::example::proto::{BytesList, Feature, Features, Int64List, feature};
use tfpipe::example::{DType, Example, FeatureSpec, Layout, Schema};
use tfpipe::pipeline::Parallelism;
use tfpipe::tfrecord::{Compression, FileRecordWriter};
use tfpipe::train::{
    InputSpec, ModelConfig, OptimizerConfig, OptimizerKind, Predictor, SchemaMeta, TrainConfig,
};

use super::Status;
use super::predict::predict;
use super::train::{DataOptions, ms_since, train, write_json};

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
}

/// The bundled sample, found at compile time (override with `--testdata`).
const BUNDLED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/mnist");

/// Runs the demo.
pub fn run(args: Args) -> anyhow::Result<Status> {
    let started = Instant::now();
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
    println!(
        "tfpipe demo: MNIST digits -> TFRecord -> MLP on the CPU -> checkpoint -> predictions"
    );
    println!("source  {}", source.display());
    println!("output  {}", out.display());

    // 1. Convert.
    println!("\n== 1. convert IDX to TFRecord shards");
    let t = Instant::now();
    let train_files = convert_idx(&source, "train", &out, 4)?;
    let test_files = convert_idx(&source, "test", &out, 1)?;
    println!(
        "wrote {} + {} shards ({} and {} records) in {:.1} ms",
        train_files.paths.len(),
        test_files.paths.len(),
        train_files.records,
        test_files.records,
        ms_since(t)
    );

    // 2. Train through the pipeline, evaluating every epoch.
    println!(
        "\n== 2. train mlp 784-256-10 (adamw, batch {batch_size}, {epochs} epochs) through the pipeline"
    );
    let schema = mnist_schema();
    let input = InputSpec::from_schema(&schema, 10)?;
    let model = ModelConfig::Mlp {
        inputs: input.inputs(),
        hidden: vec![256],
        classes: 10,
    };
    let mut config = TrainConfig::new(
        model,
        OptimizerConfig::default_for(OptimizerKind::AdamW),
        input,
    );
    config.schema = Some(SchemaMeta::from_schema(&schema));
    config.epochs = Some(epochs);
    config.seed = seed;
    config.logdir = Some(out.join("logs"));
    config.origin = super::process_start();
    let data = DataOptions {
        files: train_files.globs(),
        schema: schema.clone(),
        batch_size,
        shuffle_buffer: 10_000,
        seed,
        parallelism: Parallelism::Auto,
    };
    let test = DataOptions {
        files: test_files.globs(),
        shuffle_buffer: 0,
        batch_size: 256,
        ..data.clone()
    };
    let checkpoint = out.join("checkpoint");
    let report = train(config, &data, Some(&test), Some(&checkpoint))?;
    print!("{report}");
    println!("checkpoint saved to {}", checkpoint.display());
    write_json(&out.join("train-report.json"), &report)?;

    // 3. Reload the checkpoint and predict the test digits.
    println!("\n== 3. reload the checkpoint and predict the test digits");
    let predictor = Predictor::load(&checkpoint, &candle_core::Device::Cpu)?;
    let predictions = out.join("predictions.jsonl");
    let predicted = predict(
        &predictor,
        &test_files.globs(),
        32,
        Parallelism::Auto,
        2,
        Some(&predictions),
    )?;
    print!("{predicted}");
    write_json(&out.join("predict-report.json"), &predicted)?;

    println!("\n== done in {:.1} s", started.elapsed().as_secs_f64());
    if let Some(accuracy) = report.test_accuracy {
        println!(
            "test accuracy {:.2}% after {} epochs",
            accuracy * 100.0,
            report.epochs.len()
        );
    }
    println!(
        "TensorBoard:  tensorboard --logdir {}",
        out.join("logs").display()
    );
    println!(
        "Again by hand: tfpipe train --data '{}' --feature image_raw:uint8:28x28 --feature label:int64 --label label --test-data '{}' --epochs 5 --batch-size 32",
        out.join("train-*.tfrecord").display(),
        out.join("test-*.tfrecord").display()
    );
    Ok(Status::Ok)
}

/// `image_raw`: 28x28 uint8 pixels (one bytes value); `label`: int64.
fn mnist_schema() -> Schema {
    Schema {
        features: vec![
            FeatureSpec {
                name: "image_raw".into(),
                dtype: DType::Uint8,
                layout: Layout::Fixed(vec![28, 28]),
                default: None,
            },
            FeatureSpec {
                name: "label".into(),
                dtype: DType::Int64,
                layout: Layout::Fixed(vec![]),
                default: None,
            },
        ],
        label: Some("label".into()),
    }
}

struct Shards {
    paths: Vec<PathBuf>,
    records: usize,
}

impl Shards {
    fn globs(&self) -> Vec<String> {
        self.paths
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect()
    }
}

/// Converts `DIR/{split}-images-idx3-ubyte.gz` + labels into `shards` shards.
fn convert_idx(dir: &Path, split: &str, out: &Path, shards: usize) -> anyhow::Result<Shards> {
    let images_path = dir.join(format!("{split}-images-idx3-ubyte.gz"));
    let labels_path = dir.join(format!("{split}-labels-idx1-ubyte.gz"));
    let (dims, images) = read_idx(&images_path, 0x0803)?;
    let (ldims, labels) = read_idx(&labels_path, 0x0801)?;
    let [count, rows, cols] = dims[..] else {
        bail!(
            "{}: expected 3 dimensions, found {}",
            images_path.display(),
            dims.len()
        );
    };
    if ldims[0] != count {
        bail!(
            "{}: {} labels for {count} images in {}",
            labels_path.display(),
            ldims[0],
            images_path.display()
        );
    }
    let pixels = rows * cols;
    let mut paths = Vec::new();
    let mut pending = Vec::new();
    let mut buf = Vec::new();
    for shard in 0..shards {
        let path = out.join(format!("{split}-{shard:05}-of-{shards:05}.tfrecord"));
        let mut writer = FileRecordWriter::create(&path, Compression::None)?;
        for i in (shard..count).step_by(shards) {
            let mut feature = std::collections::BTreeMap::new();
            feature.insert(
                "image_raw".to_string(),
                Feature {
                    kind: Some(feature::Kind::BytesList(BytesList {
                        value: vec![images[i * pixels..(i + 1) * pixels].to_vec()],
                    })),
                },
            );
            feature.insert(
                "label".to_string(),
                Feature {
                    kind: Some(feature::Kind::Int64List(Int64List {
                        value: vec![i64::from(labels[i])],
                    })),
                },
            );
            buf.clear();
            Example {
                features: Some(Features { feature }),
            }
            .encode(&mut buf)?;
            writer.write_record(&buf)?;
        }
        pending.push(writer.finish_pending()?);
    }
    for p in pending {
        paths.push(p.persist()?);
    }
    Ok(Shards {
        paths,
        records: count,
    })
}

/// Reads a gzipped IDX file: its dimensions and its bytes.
fn read_idx(path: &Path, magic: u32) -> anyhow::Result<(Vec<usize>, Vec<u8>)> {
    let file =
        std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut data = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut data)
        .with_context(|| format!("{}: cannot decompress", path.display()))?;
    let word = |at: usize| -> anyhow::Result<usize> {
        let bytes: [u8; 4] = data
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .with_context(|| format!("{}: truncated header at byte {at}", path.display()))?;
        Ok(u32::from_be_bytes(bytes) as usize)
    };
    let found = word(0)? as u32;
    if found != magic {
        bail!(
            "{}: byte 0: magic {found:#010x}, expected {magic:#010x}",
            path.display()
        );
    }
    let ndims = (magic & 0xff) as usize;
    let dims = (0..ndims)
        .map(|i| word(4 + 4 * i))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let start = 4 + 4 * ndims;
    let len: usize = dims.iter().product();
    if data.len() < start + len {
        bail!(
            "{}: byte {}: truncated, {} of {len} data bytes",
            path.display(),
            data.len(),
            data.len() - start
        );
    }
    data.drain(..start);
    data.truncate(len);
    Ok((dims, data))
}
