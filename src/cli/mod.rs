//! The `tfpipe` command line: one file per subcommand, parsed with clap derive.
//!
//! Exit codes: 0 success, 1 problems found in the data (corruption, bad rows),
//! 2 usage or I/O errors, 128 + the signal when interrupted (130 SIGINT, 143
//! SIGTERM, 129 SIGHUP; see [`interrupt`]). A closed stdout (`| head`) exits 0.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tfpipe::Pipeline;
use tfpipe::tfrecord::{Compression, ReaderOptions};

mod bench;
mod bench_train;
mod cat;
mod common;
mod convert;
mod demo;
mod fit;
mod index;
mod inspect;
pub mod interrupt;
mod predict;
mod rank;
mod serve;
mod train;
mod train_flags;

/// A fast, honest streaming dataset engine for TFRecord files.
///
/// With no subcommand, runs the demo: MNIST digits to TFRecord, trained,
/// evaluated, checkpointed and reloaded, with the reports.
#[derive(Debug, Parser)]
#[command(name = "tfpipe", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print each record as one JSON object per line.
    Cat(cat::Args),
    /// Validate files and print counts and the inferred schema.
    Inspect(inspect::Args),
    /// Convert CSV, JSON, MNIST IDX or image folders to sharded TFRecord.
    Convert(Box<convert::Args>),
    /// Run the input pipeline to the end and report its throughput.
    Bench(bench::Args),
    /// Train the reference job of `bench/keras_fit.py` and print the same JSON.
    BenchTrain(bench_train::Args),
    /// Train a model fed by the pipeline, reporting stall versus compute.
    Train(Box<train::Args>),
    /// Load a checkpoint and predict, reporting latency.
    Predict(predict::Args),
    /// Serve checkpoints over TF Serving's REST API and KServe v2, warm.
    Serve(Box<serve::Args>),
    /// The end-to-end demo on the bundled MNIST sample (the default).
    Demo(demo::Args),
    /// Write a record index (FILE.idx, DALI's format) for each TFRecord file.
    Index(index::Args),
}

/// `--compression`, shared by every subcommand that reads TFRecord files
/// (`#[command(flatten)]`).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct CompressionFlag {
    /// Compression of the TFRecord files; `auto` infers it from each file's
    /// name (.gz, .zlib/.zz).
    #[arg(long, value_enum, default_value_t = CompressionArg::Auto)]
    pub compression: CompressionArg,
}

impl CompressionFlag {
    /// The explicit compression, or `None` for "infer from the name".
    pub fn explicit(&self) -> Option<Compression> {
        self.compression.explicit()
    }

    /// Reader options with this compression.
    pub fn reader_options(&self) -> ReaderOptions {
        ReaderOptions {
            compression: self.explicit(),
            ..ReaderOptions::default()
        }
    }
}

/// `--device` and `--compute-threads`, shared by every subcommand that runs
/// a model (`#[command(flatten)]`).
#[derive(Debug, Clone, clap::Args)]
pub struct RuntimeFlags {
    /// cpu, cuda or cuda:N (cuda needs the `cuda` cargo feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// CPU threads for the model's math (candle), fixed. By default candle's pool gets every
    /// core and the count used is chosen by timing the steps; RAYON_NUM_THREADS, if set, is
    /// respected as a fixed count.
    #[arg(long)]
    pub compute_threads: Option<usize>,
}

impl Default for RuntimeFlags {
    fn default() -> Self {
        RuntimeFlags {
            device: "cpu".into(),
            compute_threads: None,
        }
    }
}

/// `--num-parallel-calls`, shared by every subcommand that parses records.
#[derive(Debug, Clone, clap::Args)]
pub struct ParseFlags {
    /// Parse workers: a number or `auto`.
    #[arg(long, default_value = "auto")]
    pub num_parallel_calls: tfpipe::Parallelism,
}

/// How variable-length token sequences are batched (`train`, `bench`):
/// parsed into [`tfpipe::train::Sequences`], which the library applies.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SequenceFlags {
    /// Batch token sequences of similar length together: bucket boundaries,
    /// e.g. `12,16,20,24` (tf.data's bucket_by_sequence_length).
    #[arg(
        long,
        value_name = "B1,B2,...",
        value_delimiter = ',',
        conflicts_with = "pack"
    )]
    pub bucket_boundaries: Option<Vec<usize>>,
    /// With --bucket-boundaries: one batch size per bucket, one more than
    /// the boundaries (default: --batch-size for every bucket).
    #[arg(
        long,
        value_name = "N1,N2,...",
        value_delimiter = ',',
        requires = "bucket_boundaries"
    )]
    pub bucket_batch_sizes: Option<Vec<usize>>,
    /// Pack token sequences first-fit into rows of LENGTH tokens, --batch-size
    /// rows per batch, with segment ids (longer sequences are truncated).
    #[arg(long, value_name = "LENGTH", value_parser = positive::<usize>)]
    pub pack: Option<usize>,
}

impl SequenceFlags {
    /// The batching these flags ask for, checked (with the flags to fix).
    pub fn resolve(&self, batch_size: usize) -> anyhow::Result<tfpipe::train::Sequences> {
        use tfpipe::train::Sequences;
        let sequences = match (&self.bucket_boundaries, self.pack) {
            (Some(boundaries), _) => match &self.bucket_batch_sizes {
                Some(sizes) => Sequences::Bucketed {
                    boundaries: boundaries.clone(),
                    batch_sizes: sizes.clone(),
                },
                None => Sequences::bucketed(boundaries.clone(), batch_size),
            },
            (None, Some(length)) => Sequences::Packed { length },
            (None, None) => Sequences::Padded,
        };
        sequences.check().map_err(|e| {
            anyhow::anyhow!("{e} (check --bucket-boundaries, --bucket-batch-sizes and --pack)")
        })?;
        Ok(sequences)
    }
}

/// `--report-json`, shared by the subcommands that end with a report.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportFlags {
    /// Write the report as JSON here.
    #[arg(long)]
    pub report_json: Option<std::path::PathBuf>,
}

/// The values of `--compression`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CompressionArg {
    /// From the file name.
    #[default]
    Auto,
    /// Plain framed records.
    None,
    /// GZIP (several members read fully).
    Gzip,
    /// One zlib stream.
    Zlib,
}

impl CompressionArg {
    /// The explicit compression, or `None` for "infer from the name".
    pub fn explicit(self) -> Option<Compression> {
        match self {
            CompressionArg::Auto => None,
            CompressionArg::None => Some(Compression::None),
            CompressionArg::Gzip => Some(Compression::Gzip),
            CompressionArg::Zlib => Some(Compression::Zlib),
        }
    }
}

/// Makes `--mix`'s sources the data, one pattern per source, and returns
/// their weights (empty without `--mix`: `data` is one source).
pub(crate) fn mix_into_data(
    data: &mut Vec<String>,
    mix: &[tfpipe::pipeline::MixSource],
) -> Vec<f64> {
    if mix.is_empty() {
        return Vec::new();
    }
    *data = mix.iter().map(|m| m.files.clone()).collect();
    mix.iter().map(|m| m.weight).collect()
}

/// Says once per process that `--data` globs left out record index files
/// (`tfpipe index` writes `NAME.idx` beside `NAME`, so `'out/train-*'` matches
/// both; the library reads only the data).
pub(crate) fn note_skipped_indexes<P: AsRef<str>>(
    patterns: impl IntoIterator<Item = P>,
) -> anyhow::Result<()> {
    static NOTED: std::sync::Once = std::sync::Once::new();
    let skipped = tfpipe::storage::resolve_listing(patterns)?.skipped_indexes;
    if let Some(first) = skipped.first() {
        NOTED.call_once(|| {
            eprintln!(
                "tfpipe: note: skipping {} record index file(s) that the pattern also matched ({}{})",
                skipped.len(),
                first.display(),
                if skipped.len() > 1 { ", ..." } else { "" }
            );
        });
    }
    Ok(())
}

/// The files named by `paths` for `cat` and `inspect`: globs expanded by
/// the same resolver as `--data` ([`Pipeline::tfrecord_files`]); plain
/// names and `-` (standard input) kept as they are, so that a file that
/// cannot be opened is reported in its turn, after the files before it.
pub(crate) fn resolve_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        let text = path.to_string_lossy();
        if path.as_os_str() == "-" || !text.contains(['*', '?', '[']) {
            files.push(path.clone());
        } else {
            note_skipped_indexes([path.to_string_lossy()])?;
            let found = Pipeline::tfrecord_files([path.to_string_lossy()])?;
            files.extend_from_slice(found.paths());
        }
    }
    Ok(files)
}

/// Fails unless files can be created under `prefix`'s directory: its first
/// ancestor that exists is a directory (not a file) and writable. Nothing is
/// created here; the output creates the missing directories when it writes.
/// For outputs named by a prefix (`convert -o out/p` writes `out/p-*`).
pub(crate) fn check_output_prefix(prefix: &std::path::Path, flag: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut dir = match prefix.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    while !dir.exists() {
        match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => dir = p,
            _ => {
                dir = std::path::Path::new(".");
                break;
            }
        }
    }
    if !dir.is_dir() {
        anyhow::bail!(
            "{flag} {}: {} is a file; a directory is needed",
            prefix.display(),
            dir.display()
        );
    }
    tempfile::Builder::new()
        .prefix(".tfpipe-probe")
        .tempfile_in(dir)
        .map(drop)
        .with_context(|| {
            format!(
                "{flag} {}: {} is not writable",
                prefix.display(),
                dir.display()
            )
        })
}

/// Process exit statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Everything worked.
    Ok = 0,
    /// The command ran, and found problems in the data.
    Problems = 1,
    /// Usage or I/O error.
    Error = 2,
    // Interrupted: a command returns `Err(interrupt::Interrupted)`, and
    // `main` exits with 128 + the signal.
}

impl From<Status> for ExitCode {
    fn from(status: Status) -> ExitCode {
        ExitCode::from(status as u8)
    }
}

/// When `main` was entered: the "process start" of start-up reports. (The
/// kernel's start time in `/proc/self/stat` has only 10 ms resolution; what
/// precedes `main` here is the dynamic loader, well under a millisecond.)
pub(crate) static PROCESS_START: OnceLock<Instant> = OnceLock::new();

/// [`PROCESS_START`], set now if it was not.
pub(crate) fn process_start() -> Instant {
    *PROCESS_START.get_or_init(Instant::now)
}

/// Time since [`PROCESS_START`].
pub(crate) fn process_elapsed() -> Duration {
    process_start().elapsed()
}

/// Parses the command line, runs the command, prints errors as `tfpipe: ...`.
pub fn main() -> ExitCode {
    process_start();
    common::keep_large_buffers();
    let cli = parse_args();
    let result = match cli.command {
        Some(Command::Cat(args)) => cat::run(args),
        Some(Command::Inspect(args)) => inspect::run(args),
        Some(Command::Convert(args)) => convert::run(*args),
        Some(Command::Bench(args)) => bench::run(args),
        Some(Command::BenchTrain(args)) => bench_train::run(args),
        Some(Command::Train(args)) => train::run(*args),
        Some(Command::Predict(args)) => predict::run(args),
        Some(Command::Serve(args)) => serve::run(*args),
        Some(Command::Demo(args)) => demo::run(args),
        Some(Command::Index(args)) => index::run(args),
        None => demo::run(demo::Args::default()),
    };
    match result {
        Ok(status) => status.into(),
        Err(err) if is_broken_pipe(&err) => Status::Ok.into(),
        Err(err) => {
            eprintln!("tfpipe: {}", message(&err));
            exit_code(&err)
        }
    }
}

/// Parses the command line. Every flag that takes a value takes a negative
/// number too, so `--shards -3` and `--lr -0.1` reach the flag's own check
/// (which says what is wrong) instead of clap's hint about `--`; a number
/// that does not parse is answered with what the flag needs.
fn parse_args() -> Cli {
    let mut command = allow_negative_numbers(Cli::command());
    let parsed = command
        .try_get_matches_from_mut(std::env::args_os())
        .and_then(|matches| Cli::from_arg_matches(&matches))
        .map_err(|err| err.format(&mut command));
    match parsed {
        Ok(cli) => cli,
        Err(err) => match number_error(&err) {
            Some(text) => {
                eprintln!("tfpipe: {text}\n\nFor more information, try '--help'.");
                std::process::exit(Status::Error as i32);
            }
            None => err.exit(),
        },
    }
}

/// `command` and its subcommands, with negative numbers allowed as values.
fn allow_negative_numbers(command: clap::Command) -> clap::Command {
    command
        .mut_args(|arg| {
            if arg.get_action().takes_values() {
                arg.allow_negative_numbers(true)
            } else {
                arg
            }
        })
        .mut_subcommands(allow_negative_numbers)
}

/// For a numeric flag whose value does not parse as its type: what the flag
/// needs, as `--shards -3: must be a whole number, 0 or more`. (clap's own
/// text is the parser's, "invalid digit found in string".)
fn number_error(err: &clap::Error) -> Option<String> {
    if err.kind() != ErrorKind::ValueValidation {
        return None;
    }
    let text = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.as_str()),
        _ => None,
    };
    let flag = text(ContextKind::InvalidArg)?;
    // `--shards <N>` names the flag and its placeholder; keep the flag.
    let flag = flag.split_whitespace().next().unwrap_or(flag);
    let value = text(ContextKind::InvalidValue)?;
    let source = std::error::Error::source(err)?;
    let what = if let Some(e) = source.downcast_ref::<std::num::ParseIntError>() {
        use std::num::IntErrorKind;
        match e.kind() {
            IntErrorKind::PosOverflow => "is too large".to_string(),
            IntErrorKind::Empty => "needs a value".to_string(),
            _ if value.trim_start().starts_with('-') => {
                "must be a whole number, 0 or more (it cannot be negative)".to_string()
            }
            _ => "must be a whole number (digits only, such as 256)".to_string(),
        }
    } else if source.is::<std::num::ParseFloatError>() {
        "must be a number (such as 0.001)".to_string()
    } else {
        return None;
    };
    Some(format!("{flag} {value}: {what}"))
}

/// A whole number of at least 1, for flags that count things (`--shards`,
/// `--batch-size`): `value_parser = cli::positive::<usize>`. Like [`count`],
/// it takes `1e6`.
pub(crate) fn positive<T>(text: &str) -> Result<T, String>
where
    T: TryFrom<u64>,
{
    match whole_number(text) {
        Ok(0) => Err("must be a whole number of at least 1".into()),
        Ok(n) => T::try_from(n).map_err(|_| "is too large".into()),
        Err(why) if why.starts_with("must") => Err(format!("{why}, at least 1")),
        Err(why) => Err(why),
    }
}

/// The most warm-up passes `predict --warmup` runs: a few reach the steady
/// state; more only keep the command busy (a million passes of a small model
/// take a minute or two), and far more would never end.
pub(crate) const MAX_WARMUP: usize = 1_000_000;

/// `--warmup`: a whole number from 0 to [`MAX_WARMUP`].
pub(crate) fn warmup_passes(text: &str) -> Result<usize, String> {
    match count::<usize>(text)? {
        n if n <= MAX_WARMUP => Ok(n),
        _ => Err(format!(
            "must be at most {MAX_WARMUP} (a few passes reach the steady state)"
        )),
    }
}

/// A whole number, 0 or more (`--prefetch`, `--shuffle-buffer`):
/// `value_parser = cli::count::<usize>`. Takes `1e6` as well as `1000000`,
/// so that a size written that way reaches the memory check.
pub(crate) fn count<T>(text: &str) -> Result<T, String>
where
    T: TryFrom<u64>,
{
    let n = whole_number(text).map_err(|why| match why.starts_with("must") {
        true => format!("{why}, 0 or more"),
        false => why,
    })?;
    T::try_from(n).map_err(|_| "is too large".into())
}

/// `256` or `2.5e3`; `Err` says what is wrong (negative, not whole, too large).
fn whole_number(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(n) = text.parse::<u64>() {
        return Ok(n);
    }
    let negative = text.starts_with('-');
    match text.parse::<f64>() {
        _ if negative => Err("must be a whole number (it cannot be negative)".into()),
        Ok(x) if x.is_finite() && x.fract() == 0.0 && x < u64::MAX as f64 => Ok(x as u64),
        Ok(x) if x.is_finite() && x.fract() == 0.0 => Err("is too large".into()),
        _ => Err("must be a whole number (such as 256 or 1e6)".into()),
    }
}

/// The error and its causes, joined by `: `. Each cause prints once
/// because every error type keeps the convention of `tfpipe::error`: a
/// message never repeats its source.
fn message(err: &anyhow::Error) -> String {
    tfpipe::error::display_chain(err.as_ref())
}

/// The exit status for an error a command returned (the table in the
/// README): 128 + the signal once a signal arrived (whatever the error: it is
/// a consequence of stopping); 1 when the error is about bad data (it then
/// carries its location); 2 for usage and I/O errors.
fn exit_code(err: &anyhow::Error) -> ExitCode {
    let interrupted = err
        .chain()
        .find_map(|cause| cause.downcast_ref::<interrupt::Interrupted>().copied())
        .or_else(interrupt::received);
    if let Some(interrupted) = interrupted {
        return ExitCode::from(interrupted.exit_code());
    }
    if err.chain().any(is_bad_data) {
        return Status::Problems.into();
    }
    Status::Error.into()
}

/// Whether `cause` is a problem found in the input data (as opposed to the
/// system or the command line): each error type's own classification.
fn is_bad_data(cause: &(dyn std::error::Error + 'static)) -> bool {
    use tfpipe::convert::ConvertError;
    use tfpipe::train::TrainError;
    if let Some(e) = cause.downcast_ref::<tfpipe::RecordError>() {
        return e.is_corruption();
    }
    if let Some(e) = cause.downcast_ref::<tfpipe::PipelineError>() {
        return e.is_data_error();
    }
    if let Some(e) = cause.downcast_ref::<tfpipe::IndexError>() {
        return e.is_data_error();
    }
    if let Some(e) = cause.downcast_ref::<TrainError>() {
        return e.is_data_error();
    }
    if let Some(e) = cause.downcast_ref::<ConvertError>() {
        return e.is_data_error();
    }
    cause.is::<tfpipe::example::ParseError>()
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_digits_and_exponents_and_say_what_is_wrong() {
        assert_eq!(count::<usize>("256"), Ok(256));
        assert_eq!(count::<u64>("1e12"), Ok(1_000_000_000_000));
        assert_eq!(count::<usize>("0"), Ok(0));
        assert!(
            count::<usize>("-3")
                .unwrap_err()
                .contains("cannot be negative")
        );
        assert!(count::<usize>("2.5").unwrap_err().contains("whole number"));
        assert!(count::<u8>("300").unwrap_err().contains("too large"));
        assert!(count::<u64>("1e30").unwrap_err().contains("too large"));
        assert_eq!(positive::<usize>("1e3"), Ok(1000));
        assert!(positive::<usize>("0").unwrap_err().contains("at least 1"));
        assert!(positive::<usize>("-1").unwrap_err().contains("at least 1"));
        assert!(positive::<usize>("x").unwrap_err().contains("at least 1"));
    }
}
