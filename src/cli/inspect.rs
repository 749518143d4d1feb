//! `tfpipe inspect`: validate every record of each file and infer its schema.
//!
//! Each file is read to the end under [`OnCorruption::Skip`], so a record with
//! a bad data CRC is counted and passed over, and lost framing (bad length CRC,
//! truncation, a corrupt compressed stream) ends that file. Every record is
//! also scanned as protobuf (validated like a decode, without copying its
//! values: `tfpipe::example::scan`); one that is not a valid message counts
//! as corrupt. Whether a bytes value is text is decided on its first 4 KiB
//! (the line of each feature with longer values says so), so large values
//! cost no more than reading them.
//! Problems go to stderr as `PATH: record N at byte M: <what>`.
//!
//! Record type: every record is decoded as a `SequenceExample`, whose field 1
//! (`context`) has the same number and type as an `Example`'s `features`. A
//! file is a `SequenceExample` file when any record has a top-level field 2
//! (`feature_lists`), which an `Example` never has; otherwise it is an
//! `Example` file and `context` is reported as `features`. `--type` overrides.
//!
//! The inferred schema gives each feature in the `--feature NAME:DTYPE[:SHAPE]`
//! text form: the shape is omitted when every record holding the feature has
//! exactly one value, is `N` when all have exactly N, and `var` otherwise; the
//! comment says in how many records it is present (a feature missing from some
//! records needs a default, or a `var` spec). Feature lists of a
//! `SequenceExample` are given as `NAME:DTYPE:seq[:N]` (every step has N
//! values, or one when omitted) or `NAME:DTYPE:seq:var`, with their step counts.
//!
//! Files are inspected in parallel, on threads from [`tfpipe::spawn`] (not
//! the global rayon pool that candle's matmuls share); the report keeps the
//! input order.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context as _;
use serde::Serialize;
use tfpipe::example::json::RecordType;
use tfpipe::example::scan::{FeatureView, ListKind, RecordScanner, RecordShape};
use tfpipe::example::{DType, FeatureSpec, Layout, Value};
use tfpipe::spawn::{Cancel, Thread};
use tfpipe::tfrecord::{Compression, OnCorruption, ReaderOptions};

use super::cat::{TypeArg, open};
use super::{CompressionFlag, Status, resolve_files};

/// Arguments of `tfpipe inspect`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// The message in each record (`auto`: SequenceExample when any record has
    /// feature lists).
    #[arg(long = "type", value_enum, default_value_t = TypeArg::Auto)]
    pub record_type: TypeArg,
    #[command(flatten)]
    pub compression: CompressionFlag,
    /// TFRecord files or quoted globs, as for `--data` (`-` reads standard input).
    #[arg(required = true, value_name = "FILE|GLOB")]
    pub files: Vec<PathBuf>,
}

/// Runs `tfpipe inspect`.
pub fn run(args: Args) -> anyhow::Result<Status> {
    let files = resolve_files(&args.files)?;
    let reports = inspect_all(files, &args)?;

    let mut status = Status::Ok;
    let mut files = Vec::new();
    for report in reports {
        match report {
            Ok(report) => {
                for problem in &report.problems {
                    eprintln!("{problem}");
                }
                if !report.problems.is_empty() && status == Status::Ok {
                    status = Status::Problems;
                }
                files.push(report);
            }
            Err(err) => {
                eprintln!("tfpipe: {err}");
                status = Status::Error;
            }
        }
    }
    let total = Total::of(&files);

    let stdout = io::stdout();
    let mut out = stdout.lock();
    if args.json {
        let report = JsonReport {
            files: files.iter().map(FileReport::json).collect(),
            total: total.json(),
        };
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(io::Error::from)
            .context("writing to stdout")?;
        writeln!(out).context("writing to stdout")?;
    } else {
        let mut text = String::new();
        for file in &files {
            file.write_text(&mut text);
        }
        if files.len() > 1 {
            total.write_text(&mut text);
        }
        out.write_all(text.as_bytes())
            .context("writing to stdout")?;
    }
    out.flush().context("writing to stdout")?;
    Ok(status)
}

/// Inspects `files` on up to one thread per core, each taking the next file
/// in turn; the reports come back in the order of `files`.
fn inspect_all(
    files: Vec<PathBuf>,
    args: &Args,
) -> anyhow::Result<Vec<Result<FileReport, String>>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(files.len())
        .max(1);
    let files = Arc::new(files);
    let next = Arc::new(AtomicUsize::new(0));
    let settings = Arc::new((args.record_type, args.compression));
    let mut workers = Vec::with_capacity(threads);
    for i in 0..threads {
        let (files, next, settings) = (files.clone(), next.clone(), settings.clone());
        let worker = Thread::spawn(format!("inspect-{i}"), move |cancel: &Cancel| {
            let mut done = Vec::new();
            while !cancel.is_cancelled() {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = files.get(index) else { break };
                let (record_type, compression) = *settings;
                let report =
                    inspect_file(path, record_type, compression).map_err(|err| format!("{err:#}"));
                done.push((index, report));
            }
            done
        })
        .context("cannot start a thread")?;
        workers.push(worker);
    }
    let mut reports: Vec<(usize, Result<FileReport, String>)> = Vec::with_capacity(files.len());
    for worker in workers {
        reports.extend(worker.join()?);
    }
    reports.sort_by_key(|(index, _)| *index);
    Ok(reports.into_iter().map(|(_, report)| report).collect())
}

/// What one file holds.
struct FileReport {
    path: PathBuf,
    compression: Compression,
    record_type: RecordType,
    /// Good records (valid framing and protobuf).
    records: u64,
    /// Bytes on disk (`None` for stdin).
    file_bytes: Option<u64>,
    /// Bytes of the uncompressed record stream that were read.
    uncompressed_bytes: u64,
    /// Records passed over for a bad data CRC.
    skipped: u64,
    /// Every problem, as `PATH: record N at byte M: <what>`.
    problems: Vec<String>,
    schema: SchemaStats,
}

/// Inspects one file; `Err` only for I/O errors that stop it from being read.
fn inspect_file(
    path: &PathBuf,
    record_type: TypeArg,
    compression: CompressionFlag,
) -> anyhow::Result<FileReport> {
    let compression = compression
        .explicit()
        .unwrap_or_else(|| Compression::from_path(path));
    let options = ReaderOptions {
        compression: Some(compression),
        on_corruption: OnCorruption::Skip,
        ..ReaderOptions::default()
    };
    let file_bytes = if path.as_os_str() == "-" {
        None
    } else {
        if tfpipe::storage::is_url(path) {
            Some(tfpipe::storage::size_of(path)?)
        } else {
            let metadata = std::fs::metadata(path)
                .with_context(|| format!("{}: cannot open", path.display()))?;
            Some(metadata.len())
        }
    };
    let mut reader = open(path, options)?;
    let mut schema = SchemaStats::default();
    let mut problems = Vec::new();
    let mut records = 0;
    let mut has_lists = false;
    let mut scanner = RecordScanner::new();
    loop {
        let position = reader.position();
        match reader.next_record() {
            Ok(Some(raw)) => match scanner.scan(raw) {
                Ok(shape) => {
                    records += 1;
                    has_lists |= shape.record_type() == RecordType::Sequence;
                    schema.add(&shape);
                }
                Err(err) => problems.push((
                    position.offset,
                    format!(
                        "{}: record {} at byte {}: not a valid tf.train.Example or SequenceExample: {err}",
                        path.display(),
                        position.record,
                        position.offset
                    ),
                )),
            },
            Ok(None) => break,
            Err(err) if err.is_corruption() => {
                let offset = err.location().map_or(u64::MAX, |l| l.offset);
                problems.push((offset, err.to_string()));
                break;
            }
            Err(err) => return Err(err.into()),
        }
    }
    let skipped = reader
        .corruptions()
        .iter()
        .filter(|c| matches!(c.kind, tfpipe::tfrecord::CorruptionKind::DataCrc { .. }))
        .count() as u64;
    // The reader's corruptions (skipped records, the one that ended the file)
    // and the records that did not decode, in stream order.
    problems.extend(
        reader
            .corruptions()
            .iter()
            .map(|c| (c.location.offset, c.to_string())),
    );
    problems.sort_by_key(|(offset, _)| *offset);
    let record_type = match record_type {
        TypeArg::Example => RecordType::Example,
        TypeArg::Sequence => RecordType::Sequence,
        TypeArg::Auto if has_lists => RecordType::Sequence,
        TypeArg::Auto => RecordType::Example,
    };
    Ok(FileReport {
        path: path.clone(),
        compression,
        record_type,
        records,
        file_bytes,
        uncompressed_bytes: reader.position().offset,
        skipped,
        problems: problems.into_iter().map(|(_, p)| p).collect(),
        schema,
    })
}

/// Counts over the features of many records.
#[derive(Debug, Default, Clone)]
struct SchemaStats {
    records: u64,
    /// `features` of an Example, `context` of a SequenceExample.
    features: BTreeMap<String, FeatureStats>,
    lists: BTreeMap<String, ListStats>,
}

impl SchemaStats {
    fn add(&mut self, record: &RecordShape<'_>) {
        self.records += 1;
        for (name, feature) in record.features() {
            self.feature(name).add(feature);
        }
        for (name, list) in record.feature_lists() {
            let stats = self.list(name);
            stats.present += 1;
            stats.steps.add(list.steps() as u64);
            for step in list.iter() {
                stats.step.add(step);
            }
        }
    }

    /// The stats of feature `name` (allocating its name only the first time).
    fn feature(&mut self, name: &str) -> &mut FeatureStats {
        if !self.features.contains_key(name) {
            self.features
                .insert(name.to_string(), FeatureStats::default());
        }
        self.features.get_mut(name).expect("inserted above")
    }

    /// The stats of feature list `name`.
    fn list(&mut self, name: &str) -> &mut ListStats {
        if !self.lists.contains_key(name) {
            self.lists.insert(name.to_string(), ListStats::default());
        }
        self.lists.get_mut(name).expect("inserted above")
    }

    fn merge(&mut self, other: &SchemaStats) {
        self.records += other.records;
        for (name, stats) in &other.features {
            self.features.entry(name.clone()).or_default().merge(stats);
        }
        for (name, stats) in &other.lists {
            let mine = self.lists.entry(name.clone()).or_default();
            mine.present += stats.present;
            mine.steps.merge(&stats.steps);
            mine.step.merge(&stats.step);
        }
    }
}

/// A running min/max.
#[derive(Debug, Default, Clone, Copy)]
struct Range {
    min: Option<u64>,
    max: u64,
}

impl Range {
    fn add(&mut self, n: u64) {
        self.min = Some(self.min.map_or(n, |m| m.min(n)));
        self.max = self.max.max(n);
    }

    fn merge(&mut self, other: &Range) {
        if let Some(min) = other.min {
            self.add(min);
            self.add(other.max);
        }
    }

    fn text(&self) -> String {
        match self.min {
            None => "no".into(),
            Some(min) if min == self.max => min.to_string(),
            Some(min) => format!("{min}-{}", self.max),
        }
    }
}

/// One feature key across records (or one feature list's steps).
#[derive(Debug, Default, Clone)]
struct FeatureStats {
    /// Records (or steps) holding the key.
    present: u64,
    /// How many of those have a bytes, float, int64 list, or none.
    kinds: [u64; 4],
    /// Values per record, over those with a list set.
    values: Range,
    /// Bytes per value of a bytes list.
    value_bytes: Range,
    /// Bytes values that are not text (not UTF-8, or with control
    /// characters other than tab and newlines): raw data such as pixels.
    binary_values: u64,
    /// Bytes values longer than [`TEXT_SAMPLE`], checked for text on a prefix.
    sampled_values: u64,
    /// Bytes values that are encoded images (JPEG, PNG, GIF, BMP by their
    /// signature, with a header that reads).
    images: ImagesSeen,
}

/// What the encoded images of one feature have in common.
#[derive(Debug, Default, Clone, Copy)]
struct ImagesSeen {
    count: u64,
    /// `(height, width)` while every image has the same size.
    size: Option<(u64, u64)>,
    mixed_sizes: bool,
    /// Whether any image has colour (else every one is grey).
    colour: bool,
}

impl ImagesSeen {
    fn add(&mut self, value: &[u8]) {
        let Ok(header) = tfpipe::image::read_header(value) else {
            return;
        };
        self.merge(&ImagesSeen {
            count: 1,
            size: Some((header.height, header.width)),
            mixed_sizes: false,
            colour: header.channels > 1,
        });
    }

    fn merge(&mut self, other: &ImagesSeen) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *other;
            return;
        }
        self.count += other.count;
        self.mixed_sizes |= other.mixed_sizes || self.size != other.size;
        self.colour |= other.colour;
    }

    /// `NAME:image:HxWxC` at the images' common size, or 224x224 with a
    /// centre crop when sizes differ.
    fn spec(&self, name: &str) -> String {
        let channels = if self.colour { 3 } else { 1 };
        match self.size {
            Some((h, w)) if !self.mixed_sizes => format!("{name}:image:{h}x{w}x{channels}"),
            _ => format!("{name}:image:224x224x{channels}:center"),
        }
    }
}

const KIND_NAMES: [&str; 3] = ["bytes_list", "float_list", "int64_list"];
const DTYPES: [DType; 3] = [DType::Bytes, DType::Float32, DType::Int64];

impl FeatureStats {
    fn add(&mut self, feature: FeatureView<'_>) {
        self.present += 1;
        let kind = match feature.kind() {
            Some(ListKind::Bytes) => 0,
            Some(ListKind::Float) => 1,
            Some(ListKind::Int64) => 2,
            None => 3,
        };
        for value in feature.bytes_values() {
            self.value_bytes.add(value.len() as u64);
            self.binary_values += u64::from(!is_text(value));
            self.sampled_values += u64::from(value.len() > TEXT_SAMPLE);
            if tfpipe::image::ImageFormat::sniff(value).is_some() {
                self.images.add(value);
            }
        }
        self.kinds[kind] += 1;
        if kind < 3 {
            self.values.add(feature.len() as u64);
        }
    }

    fn merge(&mut self, other: &FeatureStats) {
        self.present += other.present;
        for (mine, theirs) in self.kinds.iter_mut().zip(other.kinds) {
            *mine += theirs;
        }
        self.values.merge(&other.values);
        self.value_bytes.merge(&other.value_bytes);
        self.binary_values += other.binary_values;
        self.images.merge(&other.images);
        self.sampled_values += other.sampled_values;
    }

    /// The one list kind seen, if exactly one was.
    fn kind(&self) -> Option<usize> {
        let seen: Vec<usize> = (0..3).filter(|&k| self.kinds[k] > 0).collect();
        match seen[..] {
            [k] => Some(k),
            _ => None,
        }
    }

    fn kind_name(&self) -> String {
        let seen: Vec<&str> = (0..3)
            .filter(|&k| self.kinds[k] > 0)
            .map(|k| KIND_NAMES[k])
            .collect();
        match seen.len() {
            0 => "no list set".into(),
            _ => seen.join("+"),
        }
    }

    /// `NAME:uint8:N` for a bytes feature that every one of the `records`
    /// has as exactly one value of N bytes: the spec that decodes it raw
    /// (`decode_raw`), which a model can train on.
    fn raw_spec(&self, name: &str, records: u64) -> Option<String> {
        let every_record = self.kind() == Some(0) && self.kinds[0] == records && records > 0;
        match (self.values.min, self.values.max, self.value_bytes.min) {
            (Some(1), 1, Some(n)) if every_record && n > 0 && n == self.value_bytes.max => {
                Some(format!("{name}:uint8:{n}"))
            }
            _ => None,
        }
    }

    /// `NAME:image:HxWxC` for a bytes feature that every one of the
    /// `records` has as exactly one encoded image.
    fn image_spec(&self, name: &str, records: u64) -> Option<String> {
        let every_record = self.kind() == Some(0) && self.kinds[0] == records && records > 0;
        let one_each = self.values.min == Some(1) && self.values.max == 1;
        (every_record && one_each && self.images.count == records).then(|| self.images.spec(name))
    }

    /// The spec to paste: [`Self::image_spec`] for encoded images,
    /// [`Self::raw_spec`] for raw data (values that are not text), else
    /// [`Self::spec`].
    fn best_spec(&self, name: &str, records: u64) -> Option<String> {
        if let Some(image) = self.image_spec(name, records) {
            return Some(image);
        }
        match self.raw_spec(name, records) {
            Some(raw) if self.binary_values > 0 => Some(raw),
            _ => self.spec(name, false, records),
        }
    }

    /// What else the values can be read as: `as text: NAME:bytes` when the
    /// pasted spec decodes them raw, `decoded raw: NAME:uint8:N` when it
    /// reads them as strings.
    fn alternative(&self, name: &str, records: u64) -> Option<String> {
        if self.image_spec(name, records).is_some() {
            let spec = self.spec(name, false, records)?;
            return Some(format!("encoded images; as bytes: {spec}"));
        }
        let raw = self.raw_spec(name, records)?;
        let spec = self.spec(name, false, records)?;
        if self.binary_values > 0 {
            Some(format!("as strings: {spec}"))
        } else {
            Some(format!("decoded raw: {raw}"))
        }
    }

    /// The `--feature` spec, when one kind was seen: for a feature, or (with
    /// `steps`) for the steps of a feature list. A fixed-length feature that
    /// some of the `records` lack gets a zero (or empty) default, so the spec
    /// parses every record when pasted into another command.
    fn spec(&self, name: &str, steps: bool, records: u64) -> Option<String> {
        let kind = self.kind()?;
        let dtype = DTYPES[kind];
        let shape = match (self.values.min, self.values.max) {
            (Some(1), 1) => Some(vec![]),
            (Some(min), max) if min == max && min > 0 => Some(vec![min as usize]),
            _ => None,
        };
        let layout = match (steps, shape) {
            (false, Some(shape)) => Layout::Fixed(shape),
            (false, None) => Layout::Var,
            (true, Some(shape)) => Layout::FixedSequence(shape),
            (true, None) => Layout::VarSequence,
        };
        let default = (matches!(layout, Layout::Fixed(_)) && self.kinds[kind] < records).then(
            || match dtype {
                DType::Int64 => Value::Int64(vec![0]),
                DType::Float32 => Value::Float32(vec![0.0]),
                _ => Value::Bytes(vec![Vec::new()]),
            },
        );
        let spec = FeatureSpec {
            name: name.to_string(),
            dtype,
            layout,
            default,
            image: None,
        };
        Some(spec.to_string())
    }

    fn json(&self, name: &str, records: u64) -> FeatureJson {
        FeatureJson {
            name: name.to_string(),
            spec: self.best_spec(name, records),
            bytes_spec: self
                .raw_spec(name, records)
                .and_then(|_| self.spec(name, false, records)),
            raw_spec: self.raw_spec(name, records),
            min_bytes_per_value: self.value_bytes.min,
            max_bytes_per_value: self.value_bytes.min.map(|_| self.value_bytes.max),
            text_check_prefix_bytes: (self.sampled_values > 0).then_some(TEXT_SAMPLE),
            kind: self.kind().map(|k| KIND_NAMES[k]),
            present: self.present,
            no_list_set: self.kinds[3],
            min_values: self.values.min,
            max_values: self.values.min.map(|_| self.values.max),
        }
    }
}

/// Whether a bytes value reads as text: UTF-8 without control characters
/// other than tab and newlines. Only the first [`TEXT_SAMPLE`] bytes are
/// checked (a character cut at that boundary counts as text), so a large
/// value costs no more than a small one; the report says so.
fn is_text(value: &[u8]) -> bool {
    let sample = &value[..value.len().min(TEXT_SAMPLE)];
    // An ASCII control byte is never part of a multi-byte character, so one
    // settles it without decoding (raw pixels usually start with one).
    let control = |b: &u8| (*b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r')) || *b == 0x7f;
    if sample.iter().any(control) {
        return false;
    }
    if sample.is_ascii() {
        return true;
    }
    let text = match std::str::from_utf8(sample) {
        Ok(text) => text,
        Err(cut) if cut.error_len().is_none() && value.len() > TEXT_SAMPLE => {
            // Only the last character was cut by the sample's end.
            std::str::from_utf8(&sample[..cut.valid_up_to()]).unwrap_or_default()
        }
        Err(_) => return false,
    };
    text.chars()
        .all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r'))
}

/// Bytes of each bytes value checked by [`is_text`].
const TEXT_SAMPLE: usize = 4096;

/// `3 values`, `0-6 values`, `1 value`.
fn values_text(range: &Range) -> String {
    let text = range.text();
    if text == "1" {
        "1 value".into()
    } else {
        format!("{text} values")
    }
}

/// One feature list of a SequenceExample.
#[derive(Debug, Default, Clone)]
struct ListStats {
    /// Records holding the list.
    present: u64,
    /// Steps per record.
    steps: Range,
    /// The steps' features.
    step: FeatureStats,
}

impl FileReport {
    fn write_text(&self, out: &mut String) {
        let bytes = match self.file_bytes {
            Some(n) if self.compression != Compression::None => {
                format!("{n} bytes ({} uncompressed)", self.uncompressed_bytes)
            }
            Some(n) => format!("{n} bytes"),
            None => format!("{} bytes uncompressed", self.uncompressed_bytes),
        };
        let _ = writeln!(
            out,
            "{}: {}, {} records, {bytes}, compression {}, {} skipped, {} corrupt",
            self.path.display(),
            self.record_type.message_name(),
            self.records,
            self.compression,
            self.skipped,
            self.problems.len(),
        );
        write_schema(out, &self.schema, self.record_type);
    }

    fn json(&self) -> FileJson {
        FileJson {
            path: self.path.display().to_string(),
            record_type: self.record_type.message_name(),
            compression: self.compression.to_string(),
            records: self.records,
            file_bytes: self.file_bytes,
            uncompressed_bytes: self.uncompressed_bytes,
            skipped: self.skipped,
            corrupt: self.problems.len() as u64,
            problems: self.problems.clone(),
            schema: schema_json(&self.schema, self.record_type),
        }
    }
}

fn write_schema(out: &mut String, schema: &SchemaStats, record_type: RecordType) {
    let records = schema.records;
    if record_type == RecordType::Sequence {
        let _ = writeln!(out, "  context:");
    }
    let width = schema
        .features
        .iter()
        .map(|(name, f)| f.best_spec(name, records).map_or(0, |s| s.len()))
        .max()
        .unwrap_or(0);
    for (name, stats) in &schema.features {
        let with_list = stats.present - stats.kinds[3];
        let mut note = match stats.best_spec(name, records) {
            Some(spec) => format!(
                "--feature {spec:width$}  # {} in {with_list}/{records} records, {}",
                stats.kind_name(),
                values_text(&stats.values)
            ),
            None if with_list == 0 => format!("# {name}: no dtype to infer"),
            None => format!(
                "# {name}: mixed kinds ({}) in {with_list}/{records} records, {}",
                stats.kind_name(),
                values_text(&stats.values)
            ),
        };
        if let (Some(n), Some(alternative)) =
            (stats.value_bytes.min, stats.alternative(name, records))
        {
            let _ = write!(note, " of {n} bytes ({alternative})");
        }
        if stats.sampled_values > 0 {
            let _ = write!(note, ", text checked on {TEXT_SAMPLE}-byte prefixes");
        }
        if stats.kinds[3] > 0 {
            let _ = write!(note, ", no list set in {}/{records}", stats.kinds[3]);
        }
        let _ = writeln!(out, "  {note}");
    }
    if record_type == RecordType::Sequence {
        let _ = writeln!(out, "  feature lists:");
        let width = schema
            .lists
            .iter()
            .map(|(name, l)| l.step.spec(name, true, 0).map_or(0, |s| s.len()))
            .max()
            .unwrap_or(0);
        for (name, stats) in &schema.lists {
            let counts = format!(
                "in {}/{records} records, {} steps, {} per step",
                stats.present,
                stats.steps.text(),
                values_text(&stats.step.values)
            );
            let line = match stats.step.spec(name, true, 0) {
                Some(spec) => format!(
                    "--feature {spec:width$}  # {} {counts}",
                    stats.step.kind_name()
                ),
                None if stats.step.present == 0 => format!("# {name}: no steps {counts}"),
                None => format!("# {name}: {} {counts}", stats.step.kind_name()),
            };
            let _ = writeln!(out, "  {line}");
        }
    }
}

fn schema_json(schema: &SchemaStats, record_type: RecordType) -> SchemaJson {
    let features = schema
        .features
        .iter()
        .map(|(name, stats)| stats.json(name, schema.records))
        .collect();
    let feature_lists = (record_type == RecordType::Sequence).then(|| {
        schema
            .lists
            .iter()
            .map(|(name, stats)| ListJson {
                name: name.clone(),
                spec: stats.step.spec(name, true, 0),
                kind: stats.step.kind().map(|k| KIND_NAMES[k]),
                present: stats.present,
                min_steps: stats.steps.min,
                max_steps: stats.steps.min.map(|_| stats.steps.max),
                min_values_per_step: stats.step.values.min,
                max_values_per_step: stats.step.values.min.map(|_| stats.step.values.max),
            })
            .collect()
    });
    SchemaJson {
        records: schema.records,
        features,
        feature_lists,
    }
}

/// All files together.
struct Total {
    files: usize,
    records: u64,
    file_bytes: u64,
    uncompressed_bytes: u64,
    skipped: u64,
    corrupt: u64,
    record_type: Option<RecordType>,
    schema: SchemaStats,
}

impl Total {
    fn of(files: &[FileReport]) -> Total {
        let mut schema = SchemaStats::default();
        for file in files {
            schema.merge(&file.schema);
        }
        let mut types = files.iter().map(|f| f.record_type);
        let first = types.next();
        let record_type = if types.all(|t| Some(t) == first) {
            first
        } else {
            None
        };
        Total {
            files: files.len(),
            records: files.iter().map(|f| f.records).sum(),
            file_bytes: files.iter().filter_map(|f| f.file_bytes).sum(),
            uncompressed_bytes: files.iter().map(|f| f.uncompressed_bytes).sum(),
            skipped: files.iter().map(|f| f.skipped).sum(),
            corrupt: files.iter().map(|f| f.problems.len() as u64).sum(),
            record_type,
            schema,
        }
    }

    fn write_text(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "total: {} files, {} records, {} bytes ({} uncompressed), {} skipped, {} corrupt",
            self.files,
            self.records,
            self.file_bytes,
            self.uncompressed_bytes,
            self.skipped,
            self.corrupt
        );
        match self.record_type {
            Some(record_type) => write_schema(out, &self.schema, record_type),
            None => {
                let _ = writeln!(
                    out,
                    "  (files hold different record types; no merged schema)"
                );
            }
        }
    }

    fn json(&self) -> TotalJson {
        TotalJson {
            files: self.files,
            records: self.records,
            file_bytes: self.file_bytes,
            uncompressed_bytes: self.uncompressed_bytes,
            skipped: self.skipped,
            corrupt: self.corrupt,
            record_type: self.record_type.map(RecordType::message_name),
            schema: self.record_type.map(|t| schema_json(&self.schema, t)),
        }
    }
}

#[derive(Serialize)]
struct JsonReport {
    files: Vec<FileJson>,
    total: TotalJson,
}

#[derive(Serialize)]
struct FileJson {
    path: String,
    record_type: &'static str,
    compression: String,
    records: u64,
    file_bytes: Option<u64>,
    uncompressed_bytes: u64,
    skipped: u64,
    corrupt: u64,
    problems: Vec<String>,
    schema: SchemaJson,
}

#[derive(Serialize)]
struct TotalJson {
    files: usize,
    records: u64,
    file_bytes: u64,
    uncompressed_bytes: u64,
    skipped: u64,
    corrupt: u64,
    record_type: Option<&'static str>,
    schema: Option<SchemaJson>,
}

#[derive(Serialize)]
struct SchemaJson {
    records: u64,
    features: Vec<FeatureJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    feature_lists: Option<Vec<ListJson>>,
}

#[derive(Serialize)]
struct FeatureJson {
    name: String,
    /// The spec to paste (`raw_spec` for raw data).
    spec: Option<String>,
    /// With `raw_spec`: the values as strings.
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_spec: Option<String>,
    /// `NAME:uint8:N` when every record has one value of N bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    raw_spec: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_bytes_per_value: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_bytes_per_value: Option<u64>,
    /// Set when values longer than this were checked for text on a prefix of this many bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    text_check_prefix_bytes: Option<usize>,
    kind: Option<&'static str>,
    present: u64,
    no_list_set: u64,
    min_values: Option<u64>,
    max_values: Option<u64>,
}

#[derive(Serialize)]
struct ListJson {
    name: String,
    spec: Option<String>,
    kind: Option<&'static str>,
    present: u64,
    min_steps: Option<u64>,
    max_steps: Option<u64>,
    min_values_per_step: Option<u64>,
    max_values_per_step: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_utf8_without_control_characters() {
        assert!(is_text(b"hello\tworld\n"));
        assert!(is_text("héllo wörld".as_bytes()));
        assert!(!is_text(b"\x00\x01pixels"));
        assert!(!is_text(b"abc\x7f"));
        assert!(!is_text(&[0xff, 0xfe, b'a']));
        // U+0085 (NEXT LINE) is a C1 control character: two bytes, neither ASCII.
        assert!(!is_text("a\u{85}b".as_bytes()));
    }

    #[test]
    fn text_check_reads_a_prefix_of_large_values() {
        // A two-byte character straddling the sample's end is text...
        let mut straddling = vec![b'a'; TEXT_SAMPLE - 1];
        straddling.extend_from_slice("é and more".as_bytes());
        assert!(is_text(&straddling));
        // ...and so is anything after the prefix, which is not read.
        let mut tail = vec![b'a'; TEXT_SAMPLE];
        tail.push(0);
        assert!(is_text(&tail));
        // A cut character at the end of a short value is not text.
        assert!(!is_text(&"é".as_bytes()[..1]));
    }
}
