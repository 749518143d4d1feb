//! Converters from raw data to sharded TFRecord files plus a schema file
//! (`tfpipe convert`).
//!
//! One file per input format: [`csv`](CsvOptions), [`json`](JsonOptions),
//! [`idx`](IdxOptions) (MNIST), [`images`](ImagesOptions) (a class-per-folder
//! tree), each a small `Source` (scan, encode, locate). One driver,
//! `driver.rs`, runs every format: scan, plan, encode in order on the one
//! spawner, write, commit all or nothing; so every rule (numbers, the fixed
//! schema, the split, fan-out, signals, atomic commit) is made once for all
//! formats. Shared pieces: `output.rs` (loading, the ordered parallel
//! encoder, sharding, the output seam and the commit), `encode.rs`
//! (hand-written Example encoding), `infer.rs` (type inference and the
//! tabular schema), `error.rs`.
//!
//! Every conversion writes `PREFIX-00000-of-0000N.tfrecord[.gz|.zlib]` and
//! `PREFIX.features.json` (the [`Schema`] plus counts as metadata), so that
//! `tfpipe train --schema PREFIX.features.json --data 'PREFIX-*'` needs
//! nothing else.
//!
//! Invariants:
//! - Record `i` (in input order) goes to shard `i % shards`, as
//!   `tf.data.Dataset.shard` splits, so shard sizes differ by at most one,
//!   every shard holds a spread of the input (images sorted by class are not
//!   one class per shard), and reading the shards round-robin
//!   (`interleave(cycle_length=shards, block_length=1)`) restores the input
//!   order. It also lets one writer thread per group of shards compress in
//!   parallel.
//! - Output is deterministic: the same input and options give byte-identical
//!   shards for any thread count (tasks are encoded in parallel, written in order).
//! - Example keys are written in sorted order, so each record equals prost's
//!   canonical encoding of the same Example.
//! - Nothing appears under a final name unless the whole conversion succeeded.
//!
//! Schema choices for tabular data (CSV, JSON):
//! - Types are inferred over the whole input: int64 if every present value is
//!   an integer, else float32 if every one is a number, else bytes. `--column
//!   NAME:DTYPE` overrides, and then values that do not fit are bad rows.
//! - A missing value (CSV: empty, `NA`, `--na`; JSON: `null` or absent) leaves
//!   the feature out of that record. A feature missing in some records is, by
//!   default ([`Missing::Default`]), a fixed scalar with a default of 0, 0.0 or
//!   the empty string, so dense consumers (the trainer) can batch it; the
//!   schema metadata counts the missing values per feature. With
//!   [`Missing::Var`] it is a var-length feature instead (0 or 1 values).
//! - The label (`--label`) is a fixed scalar that must be present (a row
//!   without it is a bad row): int64 as is, float32 as is, and a text label
//!   becomes an int64 class index in sorted order of the distinct values, with
//!   the vocabulary in the metadata (`source.label_vocabulary`).
//!
//! ```no_run
//! use std::path::PathBuf;
//! use tfpipe::convert::{self, CsvOptions, Format, OutputOptions, Sharding};
//!
//! let output = OutputOptions {
//!     sharding: Sharding::Shards(4),
//!     ..OutputOptions::new("out/penguins")
//! };
//! let format = Format::Csv(CsvOptions { label: Some("species".into()), ..CsvOptions::default() });
//! let summary = convert::convert(&format, &[PathBuf::from("penguins.csv")], &output)?;
//! println!("{} records in {} shards", summary.records, summary.shards.len());
//! # Ok::<(), tfpipe::convert::ConvertError>(())
//! ```

mod csv;
mod driver;
mod encode;
mod error;
mod idx;
mod images;
mod infer;
mod json;
mod output;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

pub use csv::{CsvOptions, HEADER_LOOKS_LIKE_DATA, Header};
pub use error::{ConvertError, ConvertOption, SourceLocation};
pub use idx::{IdxOptions, labels_path_for};
pub use images::{ImagesLayout, ImagesOptions, RESIZE_AVAILABLE};
pub use json::JsonOptions;
pub use output::{schema_file_beside, schema_path, shard_path};

use crate::example::{DType, Layout, Schema, SchemaMetadata};
use crate::tfrecord::Compression;

/// A schema to convert with, instead of inferring one: the features (types,
/// defaults, var-length or fixed) and the label vocabulary of an earlier
/// conversion's schema file, so that a test split, new data, or the workers of
/// a fanned-out conversion encode exactly as the training data did.
///
/// With it, every input column must be a feature of the schema and every
/// feature a column; a value that does not fit the feature's type, a missing
/// value where the feature has no default, and a label outside the
/// vocabulary are bad rows (errors with line and column, or skipped and
/// counted). The schema file written is the given schema.
#[derive(Debug, Clone, PartialEq)]
pub struct FixedSchema {
    /// The features and the label.
    pub schema: Schema,
    /// The text label's classes in class-index order (`source.label_vocabulary`
    /// in the schema file), when the label was text.
    pub vocabulary: Option<Vec<String>>,
    /// Where it came from, for messages.
    pub path: PathBuf,
}

impl FixedSchema {
    /// Reads a schema file written by a conversion (`PREFIX.features.json`).
    pub fn load(path: impl AsRef<Path>) -> Result<FixedSchema, ConvertError> {
        let path = path.as_ref();
        let (schema, metadata) =
            Schema::load_with_metadata(path).map_err(|source| ConvertError::FixedSchema {
                path: path.to_path_buf(),
                source,
            })?;
        let bad = |problem: String| {
            ConvertError::options(
                ConvertOption::Schema,
                format!("{}: {problem}", path.display()),
            )
        };
        // Tabular conversions record `label_vocabulary`, image folders `classes`.
        let vocabulary = SchemaMetadata::from_json(&metadata)
            .map_err(bad)?
            .label_vocabulary;
        if let Some(vocab) = &vocabulary
            && !vocab.windows(2).all(|w| w[0].as_bytes() < w[1].as_bytes())
        {
            return Err(bad(
                "source.label_vocabulary is not sorted and distinct, as conversions write it"
                    .into(),
            ));
        }
        if vocabulary.is_some() && schema.label.is_none() {
            return Err(bad("a label vocabulary but no label".into()));
        }
        Ok(FixedSchema {
            schema,
            vocabulary,
            path: path.to_path_buf(),
        })
    }

    /// The label: the schema's; `asked` (an explicit label option) must agree.
    pub(crate) fn label_for(&self, asked: Option<&str>) -> Result<Option<String>, ConvertError> {
        match (asked, &self.schema.label) {
            (Some(a), Some(l)) if a != l => Err(ConvertError::options(
                ConvertOption::Label,
                format!(
                    "label column {a:?} differs from the label {l:?} of the schema {}",
                    self.path.display()
                ),
            )),
            (Some(a), None) => Err(ConvertError::options(
                ConvertOption::Label,
                format!(
                    "label column {a:?}: the schema {} has no label",
                    self.path.display()
                ),
            )),
            (_, l) => Ok(l.clone()),
        }
    }

    /// Every column is a feature and every feature a column.
    pub(crate) fn check_columns(&self, names: &[String]) -> Result<(), ConvertError> {
        let features: Vec<&str> = self
            .schema
            .features
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        let extra: Vec<&String> = names
            .iter()
            .filter(|n| !features.contains(&n.as_str()))
            .collect();
        let absent: Vec<&&str> = features
            .iter()
            .filter(|f| !names.iter().any(|n| n == **f))
            .collect();
        if extra.is_empty() && absent.is_empty() {
            return Ok(());
        }
        Err(ConvertError::options(
            ConvertOption::Schema,
            format!(
                "the input's columns do not match the schema {}: {}{}",
                self.path.display(),
                if extra.is_empty() {
                    String::new()
                } else {
                    format!("not in the schema: {extra:?}; ")
                },
                if absent.is_empty() {
                    String::new()
                } else {
                    format!("missing from the input: {absent:?}")
                },
            ),
        ))
    }

    /// The feature `name`'s type and whether a value may be missing (the
    /// feature has a default or is var-length).
    pub(crate) fn column(&self, name: &str) -> Result<(DType, bool), ConvertError> {
        let Some(feature) = self.schema.features.iter().find(|f| f.name == name) else {
            return Err(ConvertError::options(
                ConvertOption::Schema,
                format!(
                    "column {name:?} is not in the schema {}",
                    self.path.display()
                ),
            ));
        };
        let scalar = match &feature.layout {
            Layout::Fixed(shape) => shape.iter().product::<usize>() == 1,
            Layout::Var => true,
            _ => false,
        };
        if !scalar || !matches!(feature.dtype, DType::Int64 | DType::Float32 | DType::Bytes) {
            return Err(ConvertError::options(
                ConvertOption::Schema,
                format!(
                    "feature {name:?} of the schema {} is {feature}: a table column converts only to a scalar (or var-length) int64, float32 or bytes",
                    self.path.display()
                ),
            ));
        }
        let may_miss = feature.default.is_some() || matches!(feature.layout, Layout::Var);
        Ok((feature.dtype, may_miss))
    }
}

/// How records are spread over shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sharding {
    /// About one shard per 128 MiB of input, at least one.
    #[default]
    Auto,
    /// Exactly this many shards (record `i` in shard `i % n`; the first ones
    /// may hold one record more).
    Shards(usize),
    /// At most this many records per shard: `ceil(records / n)` shards,
    /// filled round-robin.
    RecordsPerShard(u64),
}

/// What a feature that is missing in some records becomes in the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missing {
    /// A fixed scalar with a default (0, 0.0, or the empty string). The default.
    #[default]
    Default,
    /// A var-length feature (0 or 1 values per record).
    Var,
}

/// The two phases of a conversion, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading the whole input once: type inference, counting, validation.
    Scanning,
    /// Encoding and writing records.
    Encoding,
}

/// A progress report, sent after each window of work.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Which pass over the input.
    pub phase: Phase,
    /// Input bytes done in this phase.
    pub bytes_done: u64,
    /// Input bytes in total.
    pub bytes_total: u64,
    /// Records (rows, images) done in this phase.
    pub records: u64,
}

/// A progress callback.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Where and how to write, shared by every format.
#[derive(Clone)]
pub struct OutputOptions {
    /// Output prefix: shards are `PREFIX-00000-of-00008.tfrecord`, the schema
    /// `PREFIX.features.json`. Missing directories above it are created (and
    /// removed again if the conversion fails).
    pub prefix: PathBuf,
    /// How records are spread over shards. By default [`Sharding::Auto`].
    pub sharding: Sharding,
    /// Compression of the shards. By default none.
    pub compression: Compression,
    /// Encoding threads; 0 means one per core. By default 0.
    pub threads: usize,
    /// Skip (and count) bad rows instead of failing. By default `false`.
    pub skip_bad_rows: bool,
    /// Checked between chunks of work: when set, the conversion stops with
    /// [`ConvertError::Interrupted`] and leaves no output. By default `None`.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Called with progress after each window of work. By default `None`.
    pub progress: Option<ProgressFn>,
    /// Convert only this worker's part of the inputs (see [`Fanout`]). By
    /// default `None`: all of them.
    pub fanout: Option<Fanout>,
    /// Split the records into a training and a validation set (see
    /// [`Split`]). By default `None`: one set.
    pub split: Option<Split>,
}

/// One input split into a training and a validation set in one run, with
/// one schema (types and label vocabulary inferred over the whole input),
/// so the two sets always agree:
///
/// - exactly `round(records * fraction)` good records, chosen by `seed`
///   (the same input, fraction and seed always give the same split), go to
///   `PREFIX-validation-00000-of-0000M.tfrecord`, the rest to
///   `PREFIX-train-00000-of-0000N.tfrecord`;
/// - one schema file, `PREFIX.features.json`, serves both (its metadata
///   `split` gives each set's records, shards and glob);
/// - [`Sharding::Shards`]`(n)` gives the training set `n` shards and the
///   validation set `ceil(n * fraction)`; the other shardings apply to each
///   set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Split {
    /// The share of records in the validation set, strictly between 0 and 1.
    pub fraction: f64,
    /// Chooses which records: the same seed, the same split.
    pub seed: u64,
}

/// The validation set of a split conversion.
#[derive(Debug)]
pub struct SplitSummary {
    /// Records in the validation set.
    pub records: u64,
    /// Its shards, in order.
    pub shards: Vec<PathBuf>,
}

/// One worker of a conversion fanned out over `workers` processes (a Slurm
/// array job, a Kubernetes indexed Job, ...), which need not talk to each
/// other:
///
/// - worker `index` converts the input files `i` with `i % workers == index`;
/// - each writes the same number of shards `k` ([`Sharding::Shards`]),
///   numbered globally: worker `w`'s shard `j` is
///   `PREFIX-{w*k + j}-of-{workers*k}`, so together they form one set;
/// - the schema must be fixed beforehand ([`CsvOptions::schema`], from a
///   schema file), so types and label classes agree across workers (IDX
///   files have a fixed schema of their own);
/// - worker 0 writes the schema file.
///
/// Together the workers write the same records as one conversion of all the
/// inputs with that schema (in another order across shards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fanout {
    /// How many workers share the inputs (at least 1).
    pub workers: usize,
    /// This worker, `0..workers`.
    pub index: usize,
}

impl std::fmt::Debug for OutputOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputOptions")
            .field("prefix", &self.prefix)
            .field("sharding", &self.sharding)
            .field("compression", &self.compression)
            .field("threads", &self.threads)
            .field("skip_bad_rows", &self.skip_bad_rows)
            .field("fanout", &self.fanout)
            .field("split", &self.split)
            .finish_non_exhaustive()
    }
}

impl OutputOptions {
    /// Defaults, writing under `prefix`.
    pub fn new(prefix: impl Into<PathBuf>) -> Self {
        OutputOptions {
            prefix: prefix.into(),
            sharding: Sharding::Auto,
            compression: Compression::None,
            threads: 0,
            skip_bad_rows: false,
            cancel: None,
            progress: None,
            fanout: None,
            split: None,
        }
    }

    /// The prefix of set `set`'s shards: the prefix itself, or with a split
    /// `PREFIX-train` and `PREFIX-validation`.
    pub(crate) fn set_prefix(&self, set: usize) -> PathBuf {
        match self.split {
            None => self.prefix.clone(),
            Some(_) => {
                let mut name = self.prefix.as_os_str().to_os_string();
                name.push("-");
                name.push(output::SET_NAMES[set.min(1)]);
                PathBuf::from(name)
            }
        }
    }

    /// Shard `k` of the `shards` of set `set`: globally numbered in a fan-out.
    pub(crate) fn shard_file(&self, set: usize, k: usize, shards: usize) -> PathBuf {
        let prefix = self.set_prefix(set);
        match self.fanout {
            Some(f) => shard_path(
                &prefix,
                f.index * shards + k,
                f.workers * shards,
                self.compression,
            ),
            None => shard_path(&prefix, k, shards, self.compression),
        }
    }
}

/// An input format and its options.
#[derive(Debug, Clone)]
pub enum Format {
    /// CSV with a header row.
    Csv(CsvOptions),
    /// JSON Lines or one JSON array of objects.
    Json(JsonOptions),
    /// MNIST IDX images with their labels.
    Idx(IdxOptions),
    /// A folder tree `ROOT/<class>/*.{png,jpg,jpeg}`.
    Images(ImagesOptions),
}

impl Format {
    /// The schema to convert with (`--schema`), when one was given.
    pub fn fixed_schema(&self) -> Option<&FixedSchema> {
        match self {
            Format::Csv(o) => o.schema.as_ref(),
            Format::Json(o) => o.schema.as_ref(),
            Format::Idx(o) => o.schema.as_ref(),
            Format::Images(o) => o.schema.as_ref(),
        }
    }
}

/// The result of a successful conversion.
#[derive(Debug)]
pub struct Summary {
    /// Records written (with a split: both sets together).
    pub records: u64,
    /// Bad rows skipped (`--skip-bad-rows`).
    pub rows_skipped: u64,
    /// The first few skipped rows' errors.
    pub bad_rows: Vec<ConvertError>,
    /// What the user should know although nothing failed: integers beyond
    /// int64 kept exactly as text, files ignored in an image folder, ...
    pub warnings: Vec<String>,
    /// Input bytes (uncompressed).
    pub bytes_in: u64,
    /// Output bytes on disk (all shards).
    pub bytes_out: u64,
    /// The shards, in order (with a split: the training set's).
    pub shards: Vec<PathBuf>,
    /// The validation set, when the conversion was split ([`Split`]).
    pub validation: Option<SplitSummary>,
    /// The schema file.
    pub schema_path: PathBuf,
    /// The schema written.
    pub schema: Schema,
    /// Wall time of the conversion.
    pub seconds: f64,
    /// Shards of an earlier conversion with the same prefix but another
    /// shard count: `PREFIX-*` matches them too. Left alone; worth a warning.
    pub stale_shards: Vec<PathBuf>,
}

/// Converts `inputs` in `format` to shards and a schema file, as `output` says.
pub fn convert(
    format: &Format,
    inputs: &[PathBuf],
    output: &OutputOptions,
) -> Result<Summary, ConvertError> {
    if inputs.is_empty() {
        return Err(ConvertError::options(
            ConvertOption::Inputs,
            "no input files given".into(),
        ));
    }
    match output.sharding {
        Sharding::Shards(0) => {
            return Err(ConvertError::options(
                ConvertOption::Sharding,
                "the shard count must be at least 1".into(),
            ));
        }
        Sharding::RecordsPerShard(0) => {
            return Err(ConvertError::options(
                ConvertOption::Sharding,
                "the records per shard must be at least 1".into(),
            ));
        }
        _ => {}
    }
    let mine;
    let inputs = match output.fanout {
        None => inputs,
        Some(f) => {
            mine = fanout_inputs(f, format, inputs, output.sharding)?;
            &mine[..]
        }
    };
    if output.split.is_some() && output.fanout.is_some() {
        return Err(ConvertError::options(ConvertOption::FanOut,
            "a fanned-out conversion cannot also split into training and validation sets: split the inputs by file instead, or convert each worker's validation part in a second fan-out".into(),
        ));
    }
    let created = check_prefix(&output.prefix)?;
    let ctx = output::Ctx::new(output)?;
    let fixed = format.fixed_schema();
    let result = match format {
        Format::Csv(options) => {
            driver::run(csv::CsvSource::new(inputs, options), inputs, fixed, &ctx)
        }
        Format::Json(options) => {
            driver::run(json::JsonSource::new(inputs, options), inputs, fixed, &ctx)
        }
        Format::Idx(options) => {
            driver::run(idx::IdxSource::new(inputs, options), inputs, fixed, &ctx)
        }
        Format::Images(options) => driver::run(
            images::ImagesSource::new(inputs, options),
            inputs,
            fixed,
            &ctx,
        ),
    };
    if result.is_err() {
        // A failed conversion leaves nothing, not even the directories it
        // created (only empty ones are removed, innermost first).
        for dir in created.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
    result
}

/// Scans and encodes `inputs` as `convert` would, on one thread, writing
/// nothing: the good record count, the encoded records and the schema (for
/// the fuzz targets, [`crate::fuzzing`]).
pub(crate) fn dry_run(
    format: &Format,
    inputs: &[PathBuf],
    skip_bad_rows: bool,
) -> Result<(u64, Vec<Vec<u8>>, Schema), ConvertError> {
    let output = OutputOptions {
        threads: 1,
        skip_bad_rows,
        ..OutputOptions::new("unused")
    };
    let ctx = output::Ctx::new(&output)?;
    match format {
        Format::Csv(options) => driver::dry_run(csv::CsvSource::new(inputs, options), &ctx),
        Format::Json(options) => driver::dry_run(json::JsonSource::new(inputs, options), &ctx),
        Format::Idx(options) => driver::dry_run(idx::IdxSource::new(inputs, options), &ctx),
        Format::Images(options) => {
            driver::dry_run(images::ImagesSource::new(inputs, options), &ctx)
        }
    }
}

/// This worker's inputs, after checking that a fan-out makes sense.
fn fanout_inputs(
    f: Fanout,
    format: &Format,
    inputs: &[PathBuf],
    sharding: Sharding,
) -> Result<Vec<PathBuf>, ConvertError> {
    if f.workers == 0 || f.index >= f.workers {
        return Err(ConvertError::options(
            ConvertOption::FanOut,
            format!(
                "worker index {} of {} workers: the index must be below the worker count",
                f.index, f.workers
            ),
        ));
    }
    if !matches!(sharding, Sharding::Shards(_)) {
        return Err(ConvertError::options(ConvertOption::FanOut,
            "a fanned-out conversion needs a fixed shard count per worker, so the workers' shard numbers agree"
                .into(),
        ));
    }
    if format.fixed_schema().is_none() && !matches!(format, Format::Idx(_)) {
        return Err(ConvertError::options(ConvertOption::FanOut,
            "a fanned-out conversion needs a fixed schema (a schema file; idx has its own), so the workers' types and classes agree"
                .into(),
        ));
    }
    if inputs.len() < f.workers {
        return Err(ConvertError::options(
            ConvertOption::FanOut,
            format!(
                "{} workers share {} input files by file: give at least as many files as workers",
                f.workers,
                inputs.len()
            ),
        ));
    }
    Ok(inputs
        .iter()
        .enumerate()
        .filter(|(i, _)| i % f.workers == f.index)
        .map(|(_, p)| p.clone())
        .collect())
}

/// Checks the output prefix before any work: it has a file name, and no file
/// sits where its directory should be. Returns the directories above it that
/// do not exist yet (outermost first): they are created with the first output
/// file, and removed again if the conversion fails.
fn check_prefix(prefix: &Path) -> Result<Vec<PathBuf>, ConvertError> {
    if prefix.as_os_str().is_empty() || prefix.file_name().is_none() {
        return Err(ConvertError::options(
            ConvertOption::Output,
            format!(
                "output prefix {:?} needs a file-name part, e.g. out/data",
                prefix.display().to_string()
            ),
        ));
    }
    if crate::storage::is_url(prefix) {
        // Object storage has no directories to create.
        return Ok(Vec::new());
    }
    // A directory where the schema file must go would be moved aside by the
    // final rename, and the conversion would seem to succeed.
    let schema = output::schema_path(prefix);
    if schema.is_dir() {
        return Err(ConvertError::options(
            ConvertOption::Output,
            format!(
                "output prefix {}: {} is a directory, where the schema file must go",
                prefix.display(),
                schema.display()
            ),
        ));
    }
    let mut missing = Vec::new();
    let mut at = prefix.parent();
    while let Some(dir) = at {
        if dir.as_os_str().is_empty() {
            break;
        }
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => {
                return Err(ConvertError::options(
                    ConvertOption::Output,
                    format!(
                        "output prefix {}: {} is a file, not a directory",
                        prefix.display(),
                        dir.display()
                    ),
                ));
            }
            Err(_) => missing.push(dir.to_path_buf()),
        }
        at = dir.parent();
    }
    missing.reverse();
    Ok(missing)
}
