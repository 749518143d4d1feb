//! `tfpipe predict`: loads a checkpoint, predicts over TFRecord data, and
//! reports load time and first versus steady prediction latency.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use prost::Message;
use tfpipe::example::Example;
use tfpipe::example::proto::{Feature, Features, Int64List, feature};
use tfpipe::pipeline::{Parallelism, Pipeline, Rank, Remainder};
use tfpipe::tfrecord::{Compression, FileRecordReader, FileRecordWriter, ReaderOptions};
use tfpipe::train::{BatchStream, PredictReport, Predictor, TrainError, parse_device};

use super::Status;
use super::train::{set_compute_threads, write_json};

/// Arguments of `tfpipe predict`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The checkpoint directory (from `tfpipe train --save DIR`).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// TFRecord files or globs to predict (the checkpoint's schema parses them).
    #[arg(long, required = true, num_args = 1..)]
    pub data: Vec<String>,
    /// Untimed predictions on the first batch before timing.
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// Examples per prediction call.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Write predictions here: JSON lines, or TFRecord `Example`s when the
    /// name ends in .tfrecord (.gz, .zlib).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long)]
    pub report_json: Option<PathBuf>,
    /// cpu, cuda or cuda:N (cuda needs the `cuda` cargo feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Parse workers: a number or `auto`.
    #[arg(long, default_value = "auto")]
    pub num_parallel_calls: String,
    /// CPU threads for the model's math (candle). By default half the cores.
    #[arg(long)]
    pub compute_threads: Option<usize>,
    /// With ranks, each rank predicts its share (every record once over
    /// all ranks, nothing dropped): give each rank its own --output.
    #[command(flatten)]
    pub rank: super::rank::RankArgs,
}

/// Runs `tfpipe predict`.
pub fn run(args: Args) -> anyhow::Result<Status> {
    set_compute_threads(args.compute_threads)?;
    let device = parse_device(&super::rank::device(&args.device)?)?;
    let rank = args.rank.resolve()?;
    let parallelism: Parallelism = args
        .num_parallel_calls
        .parse()
        .map_err(anyhow::Error::msg)?;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let predictor = Predictor::load(&args.checkpoint, &device)?;
    let report = predict_share(
        &predictor,
        &args.data,
        rank,
        args.batch_size,
        parallelism,
        args.warmup,
        args.output.as_deref(),
    )?;
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{report}")?;
    if let Some(path) = &args.report_json {
        write_json(path, &report)?;
    }
    Ok(Status::Ok)
}

/// Predicts `files` with `predictor`, writing predictions to `output` if given.
pub(super) fn predict(
    predictor: &Predictor,
    files: &[String],
    batch_size: usize,
    parallelism: Parallelism,
    warmup: usize,
    output: Option<&Path>,
) -> anyhow::Result<PredictReport> {
    predict_share(
        predictor,
        files,
        None,
        batch_size,
        parallelism,
        warmup,
        output,
    )
}

/// [`predict`] on `rank`'s share of `files` (all of them for `None`).
fn predict_share(
    predictor: &Predictor,
    files: &[String],
    rank: Option<Rank>,
    batch_size: usize,
    parallelism: Parallelism,
    warmup: usize,
    output: Option<&Path>,
) -> anyhow::Result<PredictReport> {
    let meta = predictor.meta();
    let Some(schema_meta) = &meta.schema else {
        bail!(
            "the checkpoint has no schema (it was saved without one), so its input cannot be parsed"
        );
    };
    // Prediction keeps every record: no rank waits for another.
    let pipeline_files = super::rank::share(
        Pipeline::tfrecord_files(files)?,
        rank,
        Remainder::Keep,
        true,
    )?;
    let with_labels = match (&schema_meta.label, pipeline_files.paths().first()) {
        (Some(label), Some(first)) => has_feature(first, label)?,
        _ => false,
    };
    let schema = schema_meta.to_schema(with_labels);
    let mut stream: Box<dyn BatchStream> = Box::new(
        pipeline_files
            .records()
            .batch(batch_size)
            .parse_batches(schema, parallelism)
            .prefetch(2)
            .start()?,
    );
    let mut sink = match output {
        Some(path) => Some(Sink::create(path)?),
        None => None,
    };
    let report = predictor.run(
        stream.as_mut(),
        with_labels,
        warmup,
        &mut |predicted, labels| match sink.as_mut() {
            Some(sink) => sink
                .write(predicted, labels)
                .map_err(|e| TrainError::Events {
                    path: sink.path().to_path_buf(),
                    source: std::io::Error::other(format!("{e:#}")),
                }),
            None => Ok(()),
        },
    )?;
    if let Some(sink) = sink {
        let path = sink.finish()?;
        eprintln!(
            "wrote {} predictions to {}",
            report.examples,
            path.display()
        );
    }
    Ok(report)
}

/// Whether the first record of `path` has feature `name`.
fn has_feature(path: &Path, name: &str) -> anyhow::Result<bool> {
    let mut reader = FileRecordReader::open(path, ReaderOptions::default())?;
    let mut buf = Vec::new();
    if !reader.read_record(&mut buf)? {
        return Ok(false);
    }
    let example = Example::decode(buf.as_slice())
        .with_context(|| format!("{}: record 0: not an Example", path.display()))?;
    Ok(example
        .features
        .is_some_and(|f| f.feature.contains_key(name)))
}

/// Where predictions go.
enum Sink {
    /// JSON lines, written to a temporary file renamed at the end.
    Json {
        out: BufWriter<tempfile::NamedTempFile>,
        path: PathBuf,
    },
    /// TFRecord `Example`s with `prediction` (and `label`) int64 features.
    Records(Box<FileRecordWriter>),
}

impl Sink {
    fn create(path: &Path) -> anyhow::Result<Sink> {
        let name = path.to_string_lossy();
        if name.contains(".tfrecord") {
            let writer = FileRecordWriter::create(path, Compression::from_path(path))?;
            return Ok(Sink::Records(Box::new(writer)));
        }
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let file = tempfile::NamedTempFile::new_in(dir)
            .with_context(|| format!("{}: cannot create", path.display()))?;
        Ok(Sink::Json {
            out: BufWriter::new(file),
            path: path.to_path_buf(),
        })
    }

    fn path(&self) -> &Path {
        match self {
            Sink::Json { path, .. } => path,
            Sink::Records(w) => w.path(),
        }
    }

    fn write(&mut self, predicted: &[u32], labels: Option<&[u32]>) -> anyhow::Result<()> {
        match self {
            Sink::Json { out, path } => {
                for (i, p) in predicted.iter().enumerate() {
                    match labels.and_then(|l| l.get(i)) {
                        Some(l) => writeln!(out, "{{\"prediction\":{p},\"label\":{l}}}"),
                        None => writeln!(out, "{{\"prediction\":{p}}}"),
                    }
                    .with_context(|| format!("{}: cannot write", path.display()))?;
                }
            }
            Sink::Records(w) => {
                let mut buf = Vec::new();
                for (i, p) in predicted.iter().enumerate() {
                    let mut features = std::collections::BTreeMap::new();
                    features.insert("prediction".to_string(), int64(i64::from(*p)));
                    if let Some(l) = labels.and_then(|l| l.get(i)) {
                        features.insert("label".to_string(), int64(i64::from(*l)));
                    }
                    let example = Example {
                        features: Some(Features { feature: features }),
                    };
                    buf.clear();
                    example.encode(&mut buf)?;
                    w.write_record(&buf)?;
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> anyhow::Result<PathBuf> {
        match self {
            Sink::Json { out, path } => {
                let file = out
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .with_context(|| format!("{}: cannot write", path.display()))?;
                file.persist(&path)
                    .with_context(|| format!("{}: cannot write", path.display()))?;
                Ok(path)
            }
            Sink::Records(w) => Ok(w.finish()?),
        }
    }
}

fn int64(v: i64) -> Feature {
    Feature {
        kind: Some(feature::Kind::Int64List(Int64List { value: vec![v] })),
    }
}
