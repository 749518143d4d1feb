//! Converters from raw data to sharded TFRecord files plus a schema file
//! (`tfpipe convert`).
//!
//! One file per input format: [`csv`](CsvOptions), [`json`](JsonOptions),
//! [`idx`](IdxOptions) (MNIST), [`images`](ImagesOptions) (a class-per-folder
//! tree). Shared pieces: `output.rs` (loading, the ordered parallel driver,
//! sharding, the all-or-nothing finish), `encode.rs` (hand-written Example
//! encoding), `infer.rs` (type inference and the tabular schema), `error.rs`.
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

pub use csv::CsvOptions;
pub use error::{ConvertError, SourceLocation};
pub use idx::{IdxOptions, labels_path_for};
pub use images::{ImagesOptions, RESIZE_AVAILABLE};
pub use json::JsonOptions;
pub use output::{schema_path, shard_path};

use crate::example::Schema;
use crate::tfrecord::Compression;

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
}

impl std::fmt::Debug for OutputOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputOptions")
            .field("prefix", &self.prefix)
            .field("sharding", &self.sharding)
            .field("compression", &self.compression)
            .field("threads", &self.threads)
            .field("skip_bad_rows", &self.skip_bad_rows)
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

/// The result of a successful conversion.
#[derive(Debug)]
pub struct Summary {
    /// Records written.
    pub records: u64,
    /// Bad rows skipped (`--skip-bad-rows`).
    pub rows_skipped: u64,
    /// The first few skipped rows' errors.
    pub bad_rows: Vec<ConvertError>,
    /// Input bytes (uncompressed).
    pub bytes_in: u64,
    /// Output bytes on disk (all shards).
    pub bytes_out: u64,
    /// The shards, in order.
    pub shards: Vec<PathBuf>,
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
        return Err(ConvertError::Options("no input files given".into()));
    }
    match output.sharding {
        Sharding::Shards(0) => {
            return Err(ConvertError::Options(
                "the shard count must be at least 1".into(),
            ));
        }
        Sharding::RecordsPerShard(0) => {
            return Err(ConvertError::Options(
                "the records per shard must be at least 1".into(),
            ));
        }
        _ => {}
    }
    let created = check_prefix(&output.prefix)?;
    let ctx = output::Ctx::new(output)?;
    let result = match format {
        Format::Csv(options) => csv::convert(inputs, options, &ctx),
        Format::Json(options) => json::convert(inputs, options, &ctx),
        Format::Idx(options) => idx::convert(inputs, options, &ctx),
        Format::Images(options) => images::convert(inputs, options, &ctx),
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

/// Checks the output prefix before any work: it has a file name, and no file
/// sits where its directory should be. Returns the directories above it that
/// do not exist yet (outermost first): they are created with the first output
/// file, and removed again if the conversion fails.
fn check_prefix(prefix: &Path) -> Result<Vec<PathBuf>, ConvertError> {
    if prefix.as_os_str().is_empty() || prefix.file_name().is_none() {
        return Err(ConvertError::Options(format!(
            "output prefix {:?} needs a file-name part, e.g. out/data",
            prefix.display().to_string()
        )));
    }
    if crate::storage::is_url(prefix) {
        // Object storage has no directories to create.
        return Ok(Vec::new());
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
                return Err(ConvertError::Options(format!(
                    "output prefix {}: {} is a file, not a directory",
                    prefix.display(),
                    dir.display()
                )));
            }
            Err(_) => missing.push(dir.to_path_buf()),
        }
        at = dir.parent();
    }
    missing.reverse();
    Ok(missing)
}
