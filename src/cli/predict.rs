//! `tfpipe predict`: loads a checkpoint, predicts over TFRecord data, and
//! reports load time and first versus steady prediction latency.
//!
//! Predictions go to stdout as JSON Lines by default (and for `--output -`),
//! one object per record, in record order:
//!
//! ```text
//! {"key":"r17","class":2,"class_name":"Gentoo","probabilities":[0.01,0.02,0.97],"label":2}
//! {"key":"r18","value":21.4,"label":22.0}
//! ```
//!
//! `class`, `class_name` (when the checkpoint recorded a label vocabulary)
//! and `probabilities` for classification, `value` for regression; `key`
//! with `--key NAME`, `label` when the data has labels. The report then goes
//! to stderr, so stdout is the predictions alone. `--output FILE` writes them
//! atomically instead (temporary file, fsync, rename): a failure or a signal
//! leaves no file and no temporary behind; `--output FILE.tfrecord` writes
//! `Example`s.
//!
//! The data's label vocabulary, when known (`--schema FILE`, or the
//! `PREFIX.features.json` beside `PREFIX-NNNNN-of-NNNNN.tfrecord` shards),
//! must equal the checkpoint's: other class ids would mean other labels.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, bail};
use prost::Message;
use serde::Serialize;
use tfpipe::Schema;
use tfpipe::atomic_file::AtomicFile;
use tfpipe::batch::{Column, Values};
use tfpipe::example::proto::{BytesList, Feature, Features, FloatList, Int64List, feature};
use tfpipe::example::{DType, Example, FeatureSpec, Layout};
use tfpipe::pipeline::{Parallelism, Pipeline, Rank, Remainder};
use tfpipe::tfrecord::{Compression, FileRecordReader, FileRecordWriter, ReaderOptions};
use tfpipe::train::{
    BatchStream, Labels, Outputs, PredictOptions, PredictReport, PredictedBatch, Predictor,
    TrainError, parse_device,
};

use super::common::{
    check_output_file, check_size, check_vocabulary, set_compute_threads, write_json,
};
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
    /// The data's schema file (`PREFIX.features.json`): its label
    /// vocabulary must be the checkpoint's. By default the one beside
    /// `PREFIX-NNNNN-of-NNNNN.tfrecord` shards, when there is one.
    #[arg(long)]
    pub schema: Option<PathBuf>,
    /// Untimed predictions on the first batch before timing (at most
    /// 1,000,000). The first call of a process pays for allocating and
    /// faulting in the model's buffers (without warm-up: 17-20x the steady
    /// median at batch 1, 6-8x at batch 32, 3x at batch 256); two passes
    /// still left 1.5-2.8x at batch 32, ten bring the first timed
    /// prediction to the steady state (0.7-1.2x) for a few milliseconds.
    #[arg(long, default_value_t = 10, value_parser = super::warmup_passes)]
    pub warmup: usize,
    /// Examples per prediction call.
    #[arg(long, default_value_t = 32, value_parser = super::positive::<usize>)]
    pub batch_size: usize,
    /// Where predictions go: `-` (the default) is stdout, as JSON Lines; a
    /// file name ending in .tfrecord (.gz, .zlib) gets TFRecord `Example`s;
    /// any other file name JSON Lines. Files appear only when complete.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// A feature of the records to copy into each prediction as `key`
    /// (e.g. an id), in any dtype.
    #[arg(long)]
    pub key: Option<String>,
    #[command(flatten)]
    pub report: super::ReportFlags,
    #[command(flatten)]
    pub runtime: super::RuntimeFlags,
    #[command(flatten)]
    pub parse: super::ParseFlags,
    /// With ranks, each rank predicts its share (every record once over
    /// all ranks, nothing dropped): name the rank in --output
    /// (`pred-{rank}.jsonl`), or let the launcher collect stdout.
    #[command(flatten)]
    pub rank: super::rank::RankArgs,
}

/// Where predictions go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Output {
    /// JSON Lines on stdout.
    Stdout,
    /// A file, written atomically.
    File(PathBuf),
}

impl Output {
    fn from_arg(arg: Option<&Path>) -> Output {
        match arg {
            None => Output::Stdout,
            Some(p) if p.as_os_str() == "-" => Output::Stdout,
            Some(p) => Output::File(p.to_path_buf()),
        }
    }
}

/// One prediction run: the data, and what to do with the predictions.
pub(super) struct Job<'a> {
    pub files: &'a [String],
    /// How to read them (`--compression`).
    pub reader: ReaderOptions,
    pub batch_size: usize,
    pub parallelism: Parallelism,
    pub warmup: usize,
    pub output: Output,
    pub key: Option<&'a str>,
    /// Raised by a signal: stop, and write no file.
    pub stop: Option<Arc<AtomicBool>>,
    /// This process's share of the files (`--rank`/`--world-size`).
    pub rank: Option<Rank>,
}

/// Runs `tfpipe predict`.
pub fn run(mut args: Args) -> anyhow::Result<Status> {
    set_compute_threads(args.runtime.compute_threads)?;
    let rank = args.rank.resolve()?;
    super::rank::per_rank_paths(
        rank,
        [
            ("--output", &mut args.output),
            ("--report-json", &mut args.report.report_json),
        ],
    )?;
    let output = Output::from_arg(args.output.as_deref());
    // Every destination is checked before any work.
    if let Output::File(path) = &output {
        check_output_file(Some(path), "--output")?;
    }
    check_output_file(args.report.report_json.as_deref(), "--report-json")?;
    let device = parse_device(&super::rank::device(&args.runtime.device)?)?;
    let parallelism = args.parse.num_parallel_calls;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let interrupt = interrupt::install().context("installing the signal handlers")?;
    let predictor = Predictor::load(&args.checkpoint, &device)?;
    super::note_skipped_indexes(&args.data)?;
    let schema_file = match &args.schema {
        Some(path) => Some(path.clone()),
        None => Pipeline::tfrecord_files(&args.data)?
            .paths()
            .first()
            .and_then(|p| tfpipe::convert::schema_file_beside(p)),
    };
    if let Some(path) = &schema_file {
        let facts = super::common::read_facts(path)?;
        check_vocabulary(
            predictor.meta().label_vocabulary.as_deref(),
            facts.label_vocabulary.as_deref(),
            &format!("the checkpoint {}", args.checkpoint.display()),
            &format!("the data's schema {}", path.display()),
        )?;
    }
    let to_stdout = output == Output::Stdout;
    let report = predict(
        &predictor,
        Job {
            files: &args.data,
            reader: args.compression.reader_options(),
            batch_size: args.batch_size,
            parallelism,
            warmup: args.warmup,
            output,
            key: args.key.as_deref(),
            stop: Some(interrupt.flag()),
            rank,
        },
    )?;
    if report.interrupted {
        let note = if to_stdout {
            "the predictions on stdout are incomplete"
        } else {
            "no output was written"
        };
        return Err(interrupt.error().note(note).into());
    }
    // With the predictions on stdout, the report goes to stderr.
    if to_stdout {
        eprint!("{report}");
    } else {
        print!("{report}");
    }
    if let Some(path) = &args.report.report_json {
        write_json(path, &report)?;
    }
    Ok(Status::Ok)
}

/// Predicts `job.files` with `predictor`, writing the predictions where
/// `job.output` says. An interrupted run returns its report with
/// `interrupted` set, having written no file.
pub(super) fn predict(predictor: &Predictor, job: Job<'_>) -> anyhow::Result<PredictReport> {
    let meta = predictor.meta();
    let Some(schema_meta) = &meta.schema else {
        bail!(
            "the checkpoint has no schema (it was saved without one), so its input cannot be parsed"
        );
    };
    // The batches in flight (prefetched, parsed, as a tensor), as float32s,
    // before anything is allocated.
    check_size(
        &format!(
            "--batch-size {} ({} inputs per example)",
            job.batch_size,
            meta.input.inputs()
        ),
        (job.batch_size as u128)
            .saturating_mul(meta.input.inputs() as u128)
            .saturating_mul(4 * 4),
    )?;
    // Created first: a signal from here on must leave no temporary file.
    let mut sink = Sink::create(&job.output, predictor)?;
    // Prediction keeps every record: no rank waits for another.
    let pipeline_files = super::rank::share(
        Pipeline::tfrecord_files(job.files)?.reader_options(job.reader.clone()),
        job.rank,
        Remainder::Keep,
        true,
    )?;
    let first = match pipeline_files.paths().first() {
        Some(path) => first_example(path, job.reader.clone())?.map(|e| (path.clone(), e)),
        None => None,
    };
    let has = |name: &str| {
        first
            .as_ref()
            .and_then(|(_, e)| e.features.as_ref())
            .is_some_and(|f| f.feature.contains_key(name))
    };
    if job
        .stop
        .as_ref()
        .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst))
    {
        return Ok(PredictReport {
            interrupted: true,
            ..PredictReport::empty(predictor.load_ms())
        });
    }
    let with_labels = schema_meta.label.as_deref().is_some_and(has);
    // Missing inputs arrive as the markers the model was trained to fill.
    let mut schema = meta.input.parse_schema(&schema_meta.to_schema(with_labels));
    if let Some(key) = job.key {
        add_key_feature(&mut schema, key, first.as_ref())?;
    }
    // A text label is scored through the classes the model was trained with.
    let text_label = schema
        .label
        .as_deref()
        .and_then(|l| schema.feature(l))
        .filter(|f| f.dtype == tfpipe::DType::Bytes)
        .map(|f| f.name.clone());
    let mut parsed = pipeline_files
        .records()
        .batch(job.batch_size)
        .parse_batches(schema, job.parallelism);
    if let Some(label) = text_label {
        let names = predictor
            .meta()
            .label_vocabulary
            .clone()
            .unwrap_or_default();
        parsed = tfpipe::train::LabelClasses::new(label, names).apply(parsed);
    }
    let mut stream: Box<dyn BatchStream> = Box::new(parsed.prefetch(2).start()?);
    let options = PredictOptions {
        with_labels,
        warmup: job.warmup,
        key: job.key,
        stop: job.stop.as_deref(),
    };
    let report = predictor.run(stream.as_mut(), options, &mut |batch| {
        sink.write(batch).map_err(|source| TrainError::Output {
            path: sink.name(),
            source,
        })
    })?;
    if report.interrupted {
        // Dropped unfinished: the temporary file goes.
        return Ok(report);
    }
    if let Some(path) = sink.finish()? {
        eprintln!(
            "wrote {} predictions to {}",
            report.examples,
            path.display()
        );
    }
    Ok(report)
}

/// The first record of `path` as an `Example` (`None` for an empty file).
fn first_example(path: &Path, options: ReaderOptions) -> anyhow::Result<Option<Example>> {
    let mut reader = FileRecordReader::open(path, options)?;
    let mut buf = Vec::new();
    if !reader.read_record(&mut buf)? {
        return Ok(None);
    }
    let example = Example::decode(buf.as_slice())
        .with_context(|| format!("{}: record 0 at byte 0: not an Example", path.display()))?;
    Ok(Some(example))
}

/// Adds the key feature to `schema` (unless the model reads it already),
/// variable-length in the dtype the first record holds it in.
fn add_key_feature(
    schema: &mut Schema,
    key: &str,
    first: Option<&(PathBuf, Example)>,
) -> anyhow::Result<()> {
    if schema.feature(key).is_some() {
        return Ok(());
    }
    let Some((path, example)) = first else {
        return Ok(());
    };
    let features = example.features.as_ref();
    let kind = features
        .and_then(|f| f.feature.get(key))
        .and_then(|f| f.kind.as_ref());
    let dtype = match kind {
        Some(feature::Kind::BytesList(_)) => DType::Bytes,
        Some(feature::Kind::Int64List(_)) => DType::Int64,
        Some(feature::Kind::FloatList(_)) => DType::Float32,
        None => {
            let mut names: Vec<&str> = features
                .map(|f| f.feature.keys().map(String::as_str).collect())
                .unwrap_or_default();
            names.sort_unstable();
            bail!(
                "--key {key:?}: the first record of {} has no such feature (it has: {})",
                path.display(),
                names.join(", ")
            );
        }
    };
    schema.features.push(FeatureSpec {
        name: key.to_string(),
        dtype,
        layout: Layout::Var,
        default: None,
        image: None,
    });
    Ok(())
}

/// One JSON line.
#[derive(Serialize)]
struct Line<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    class: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    class_name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    probabilities: Option<&'a [f32]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<serde_json::Value>,
}

impl<'a> Line<'a> {
    fn of(batch: &'a PredictedBatch, row: usize, predictor: &'a Predictor) -> Line<'a> {
        let (class, value) = match &batch.outputs {
            Outputs::Classes { ids, .. } => (ids.get(row).copied(), None),
            Outputs::Values(v) => (None, v.get(row).copied()),
        };
        Line {
            key: batch.key.as_ref().map(|c| key_json(c, row)),
            class,
            class_name: class.and_then(|c| predictor.class_name(c)),
            probabilities: batch.outputs.probabilities(row),
            value,
            label: match &batch.labels {
                Some(Labels::Classes(l)) => l.get(row).map(|&l| l.into()),
                Some(Labels::Values(l)) => l.get(row).map(|&l| l.into()),
                None => None,
            },
        }
    }
}

/// Row `row` of the key column: one value as itself, several as an
/// array, none as `null`. Byte strings become text (invalid UTF-8 replaced).
fn key_json(col: &Column, row: usize) -> serde_json::Value {
    let range = row_range(col, row);
    let values: Vec<serde_json::Value> = match &col.values {
        Values::Bytes { data, offsets } => range
            .filter_map(|i| Some(&data[*offsets.get(i)?..*offsets.get(i + 1)?]))
            .map(|b| String::from_utf8_lossy(b).into_owned().into())
            .collect(),
        Values::Int64(v) => slice(v, range).iter().map(|&x| x.into()).collect(),
        Values::Float32(v) => slice(v, range).iter().map(|&x| x.into()).collect(),
        Values::Uint8(v) => slice(v, range).iter().map(|&x| x.into()).collect(),
        Values::Int16(v) => slice(v, range).iter().map(|&x| x.into()).collect(),
        Values::Uint16(v) => slice(v, range).iter().map(|&x| x.into()).collect(),
        Values::Int32(v) => slice(v, range).iter().map(|&x| x.into()).collect(),
        Values::Float64(v) => slice(v, range).iter().map(|&x| x.into()).collect(),
        Values::Sparse { .. } => Vec::new(),
    };
    match values.len() {
        0 => serde_json::Value::Null,
        1 => values.into_iter().next().unwrap_or_default(),
        _ => serde_json::Value::Array(values),
    }
}

/// The value indices of row `row` of a fixed-shape or variable-length column.
fn row_range(col: &Column, row: usize) -> std::ops::Range<usize> {
    let width: usize = col.inner_shape.iter().product();
    match col.row_splits.first() {
        Some(splits) => match (splits.get(row), splits.get(row + 1)) {
            (Some(&a), Some(&b)) => a * width..b * width,
            _ => 0..0,
        },
        None => row * width..(row + 1) * width,
    }
}

fn slice<T>(v: &[T], range: std::ops::Range<usize>) -> &[T] {
    v.get(range).unwrap_or(&[])
}

/// Where predictions go.
enum Sink<'p> {
    /// JSON lines on stdout.
    Stdout {
        out: BufWriter<std::io::Stdout>,
        predictor: &'p Predictor,
    },
    /// JSON lines, into a temporary file renamed at the end.
    Json {
        out: BufWriter<AtomicFile>,
        path: PathBuf,
        predictor: &'p Predictor,
    },
    /// TFRecord `Example`s: `class` and `probabilities` (or `value`),
    /// `key` and `label` when known.
    Records(Box<FileRecordWriter>),
}

impl<'p> Sink<'p> {
    fn create(output: &Output, predictor: &'p Predictor) -> anyhow::Result<Sink<'p>> {
        let path = match output {
            Output::Stdout => {
                return Ok(Sink::Stdout {
                    out: BufWriter::new(std::io::stdout()),
                    predictor,
                });
            }
            Output::File(path) => path,
        };
        if path.to_string_lossy().contains(".tfrecord") {
            let writer = FileRecordWriter::create(path, Compression::from_path(path))?;
            return Ok(Sink::Records(Box::new(writer)));
        }
        let file = AtomicFile::create(path)?;
        Ok(Sink::Json {
            out: BufWriter::new(file),
            path: path.clone(),
            predictor,
        })
    }

    fn name(&self) -> PathBuf {
        match self {
            Sink::Stdout { .. } => PathBuf::from("stdout"),
            Sink::Json { path, .. } => path.clone(),
            Sink::Records(w) => w.path().to_path_buf(),
        }
    }

    /// Writes one batch's lines (or records). The error keeps its kind, so
    /// a closed stdout (`| head`) is told apart from a full disk.
    fn write(&mut self, batch: &PredictedBatch) -> std::io::Result<()> {
        match self {
            Sink::Stdout { out, predictor } => write_lines(out, batch, predictor),
            Sink::Json { out, predictor, .. } => write_lines(out, batch, predictor),
            Sink::Records(w) => {
                let mut buf = Vec::new();
                for row in 0..batch.rows {
                    buf.clear();
                    example_of(batch, row)
                        .encode(&mut buf)
                        .map_err(std::io::Error::other)?;
                    w.write_record(&buf).map_err(std::io::Error::other)?;
                }
                Ok(())
            }
        }
    }

    /// Flushes, and moves a file into place; the path when one was written.
    fn finish(self) -> anyhow::Result<Option<PathBuf>> {
        match self {
            Sink::Stdout { mut out, .. } => {
                out.flush()?;
                Ok(None)
            }
            Sink::Json { out, path, .. } => {
                let file = out
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .with_context(|| format!("{}: cannot write", path.display()))?;
                Ok(Some(file.commit()?))
            }
            Sink::Records(w) => Ok(Some(w.finish()?)),
        }
    }
}

fn write_lines(
    out: &mut impl Write,
    batch: &PredictedBatch,
    predictor: &Predictor,
) -> std::io::Result<()> {
    for row in 0..batch.rows {
        serde_json::to_writer(&mut *out, &Line::of(batch, row, predictor))?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

fn example_of(batch: &PredictedBatch, row: usize) -> Example {
    let mut features = BTreeMap::new();
    match &batch.outputs {
        Outputs::Classes { ids, .. } => {
            if let Some(&id) = ids.get(row) {
                features.insert("class".to_string(), int64(i64::from(id)));
            }
            if let Some(p) = batch.outputs.probabilities(row) {
                features.insert("probabilities".to_string(), float(p.to_vec()));
            }
        }
        Outputs::Values(v) => {
            if let Some(&x) = v.get(row) {
                features.insert("value".to_string(), float(vec![x]));
            }
        }
    }
    if let Some(key) = batch.key.as_ref().and_then(|c| key_feature(c, row)) {
        features.insert("key".to_string(), key);
    }
    match &batch.labels {
        Some(Labels::Classes(l)) => {
            if let Some(&l) = l.get(row) {
                features.insert("label".to_string(), int64(i64::from(l)));
            }
        }
        Some(Labels::Values(l)) => {
            if let Some(&l) = l.get(row) {
                features.insert("label".to_string(), float(vec![l]));
            }
        }
        None => {}
    }
    Example {
        features: Some(Features { feature: features }),
    }
}

/// Row `row` of the key column as a feature of its own kind (byte
/// strings, int64 or float32; other dtypes are not keys a record holds).
fn key_feature(col: &Column, row: usize) -> Option<Feature> {
    let range = row_range(col, row);
    let kind = match &col.values {
        Values::Bytes { data, offsets } => feature::Kind::BytesList(BytesList {
            value: range
                .filter_map(|i| Some(data[*offsets.get(i)?..*offsets.get(i + 1)?].to_vec()))
                .collect(),
        }),
        Values::Int64(v) => feature::Kind::Int64List(Int64List {
            value: slice(v, range).to_vec(),
        }),
        Values::Float32(v) => feature::Kind::FloatList(FloatList {
            value: slice(v, range).to_vec(),
        }),
        _ => return None,
    };
    Some(Feature { kind: Some(kind) })
}

fn int64(v: i64) -> Feature {
    Feature {
        kind: Some(feature::Kind::Int64List(Int64List { value: vec![v] })),
    }
}

fn float(value: Vec<f32>) -> Feature {
    Feature {
        kind: Some(feature::Kind::FloatList(FloatList { value })),
    }
}
