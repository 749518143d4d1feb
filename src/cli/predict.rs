//! `tfpipe predict`: loads a checkpoint, predicts over TFRecord data, and
//! reports load time and first versus steady prediction latency.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use prost::Message;
use tfpipe::atomic_file::AtomicFile;
use tfpipe::example::Example;
use tfpipe::example::proto::{Feature, Features, Int64List, feature};
use tfpipe::pipeline::{Parallelism, Pipeline};
use tfpipe::tfrecord::{Compression, FileRecordReader, FileRecordWriter, ReaderOptions};
use tfpipe::train::{BatchStream, PredictReport, Predictor, TrainError, parse_device};

use super::train::{check_output_file, check_size, set_compute_threads, write_json};
use super::{CompressionFlag, Status, interrupt};

/// Arguments of `tfpipe predict`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The checkpoint directory (from `tfpipe train --save DIR`).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// TFRecord files or globs to predict (the checkpoint's schema parses them).
    #[arg(long, required = true, num_args = 1..)]
    pub data: Vec<String>,
    #[command(flatten)]
    pub compression: CompressionFlag,
    /// Untimed predictions on the first batch before timing.
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// Examples per prediction call.
    #[arg(long, default_value_t = 32, value_parser = super::positive::<usize>)]
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
}

/// Runs `tfpipe predict`.
pub fn run(args: Args) -> anyhow::Result<Status> {
    set_compute_threads(args.compute_threads)?;
    // Every destination is checked before the checkpoint is even loaded.
    check_output_file(args.output.as_deref(), "--output")?;
    check_output_file(args.report_json.as_deref(), "--report-json")?;
    let device = parse_device(&args.device)?;
    let parallelism: Parallelism = args
        .num_parallel_calls
        .parse()
        .map_err(anyhow::Error::msg)?;
    let predictor = Predictor::load(&args.checkpoint, &device)?;
    let data = Data {
        files: &args.data,
        options: args.compression.reader_options(),
        batch_size: args.batch_size,
        parallelism,
    };
    let report = predict(&predictor, &data, args.warmup, args.output.as_deref())?;
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{report}")?;
    if let Some(path) = &args.report_json {
        write_json(path, &report)?;
    }
    Ok(Status::Ok)
}

/// The data to predict and how to read it.
pub(super) struct Data<'a> {
    /// TFRecord files or globs.
    pub files: &'a [String],
    /// How to read them (`--compression`).
    pub options: ReaderOptions,
    pub batch_size: usize,
    pub parallelism: Parallelism,
}

/// Predicts `data` with `predictor`, writing predictions to `output` if given.
///
/// With an `output`, SIGINT, SIGTERM and SIGHUP stop at the next batch: the
/// temporary output file is removed and the error is the interrupt.
pub(super) fn predict(
    predictor: &Predictor,
    data: &Data<'_>,
    warmup: usize,
    output: Option<&Path>,
) -> anyhow::Result<PredictReport> {
    let meta = predictor.meta();
    let Some(schema_meta) = &meta.schema else {
        bail!(
            "the checkpoint has no schema (it was saved without one), so its input cannot be parsed"
        );
    };
    // The batches in flight (prefetched, parsed, as a tensor), as float32s.
    check_size(
        &format!(
            "--batch-size {} ({} inputs per example)",
            data.batch_size,
            meta.input.inputs()
        ),
        (data.batch_size as u128)
            .saturating_mul(meta.input.inputs() as u128)
            .saturating_mul(4 * 4),
    )?;
    let pipeline_files = Pipeline::tfrecord_files(data.files)?.reader_options(data.options.clone());
    let with_labels = match (&schema_meta.label, pipeline_files.paths().first()) {
        (Some(label), Some(first)) => has_feature(first, label, data.options.clone())?,
        _ => false,
    };
    let schema = schema_meta.to_schema(with_labels);
    let mut stream: Box<dyn BatchStream> = Box::new(
        pipeline_files
            .records()
            .batch(data.batch_size)
            .parse_batches(schema, data.parallelism)
            .prefetch(2)
            .start()?,
    );
    let (mut sink, interrupt) = match output {
        Some(path) => (Some(Sink::create(path)?), Some(interrupt::install()?)),
        None => (None, None),
    };
    // The sink's own error (a full disk, an interrupt): the library only
    // hears that the sink failed, and this is what the user is told.
    let mut failed: Option<anyhow::Error> = None;
    let result = predictor.run(
        stream.as_mut(),
        with_labels,
        warmup,
        &mut |predicted, labels| {
            let Some(sink) = sink.as_mut() else {
                return Ok(());
            };
            let written = match interrupt.as_ref().map(interrupt::Interrupt::check) {
                Some(Err(stopped)) => Err(anyhow::Error::new(
                    stopped.note("no predictions were written"),
                )),
                _ => sink.write(predicted, labels),
            };
            written.map_err(|e| {
                failed = Some(e);
                TrainError::Config("the prediction output failed".into())
            })
        },
    );
    if let Some(err) = failed {
        return Err(err);
    }
    let report = result?;
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
fn has_feature(path: &Path, name: &str, options: ReaderOptions) -> anyhow::Result<bool> {
    let mut reader = FileRecordReader::open(path, options)?;
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
        out: BufWriter<AtomicFile>,
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
        let file = AtomicFile::create(path)?;
        Ok(Sink::Json {
            out: BufWriter::new(file),
            path: path.to_path_buf(),
        })
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
                Ok(file.commit()?)
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
