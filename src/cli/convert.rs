//! `tfpipe convert`: raw data (CSV, JSON, MNIST IDX, image folders) to
//! sharded TFRecord plus `PREFIX.features.json`. The work is in
//! [`tfpipe::convert`]; this file turns flags into options, shows progress,
//! handles Ctrl-C and prints the summary.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use tfpipe::convert::{
    self, ConvertError, ConvertOption, CsvOptions, Format, Header, IdxOptions, ImagesLayout,
    ImagesOptions, JsonOptions, Missing, OutputOptions, Phase, Sharding, Summary,
};
use tfpipe::tfrecord::Compression;

use super::{Status, interrupt};

/// Input formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// CSV with a header row.
    Csv,
    /// JSON Lines, or one JSON array of objects.
    Json,
    /// MNIST IDX images (`*-images-idx3-ubyte[.gz]`) with their labels file.
    Idx,
    /// A folder tree ROOT/<class>/*.{png,jpg,jpeg}.
    Images,
}

/// The feature names of `convert images`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LayoutArg {
    /// TFDS's `image` (marked as an image in the schema) and `label`.
    Tfds,
    /// tensorflow/models' ImageNet layout: `image/encoded`, `image/class/label`, ...
    Imagenet,
}

/// What a column with missing values becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MissingArg {
    /// A fixed scalar with default 0, 0.0 or "" (dense consumers can batch it).
    Default,
    /// A var-length feature (0 or 1 values per record).
    Var,
}

/// Arguments of `tfpipe convert`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Input format.
    #[arg(value_enum)]
    pub format: FormatArg,
    /// Input files (for `images`: the ROOT folder; for `idx`: the images files).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output prefix: writes PREFIX-00000-of-0000N.tfrecord and PREFIX.features.json.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Number of shards [default: one per 128 MiB of input].
    #[arg(long, conflicts_with = "records_per_shard", allow_hyphen_values = true, value_parser = positive::<usize>)]
    pub shards: Option<usize>,
    /// Records per shard (instead of --shards).
    #[arg(long, allow_hyphen_values = true, value_parser = positive::<u64>)]
    pub records_per_shard: Option<u64>,
    /// Shard compression: none, gzip or zlib.
    #[arg(long, default_value = "none")]
    pub compression: Compression,
    /// Encoding threads [default: one per core].
    #[arg(long, allow_hyphen_values = true, value_parser = positive::<usize>)]
    pub threads: Option<usize>,
    /// Fan-out: this conversion is one of N workers (with --worker-index); each converts every
    /// N-th input file into --shards shards numbered globally (PREFIX-...-of-N*shards).
    /// Needs a fixed schema (--schema; idx has its own); worker 0 writes the schema file.
    #[arg(long, value_name = "N", requires = "worker_index", allow_hyphen_values = true, value_parser = positive::<usize>)]
    pub num_workers: Option<usize>,
    /// Fan-out: which worker this is, 0..N.
    #[arg(long, value_name = "I", requires = "num_workers")]
    pub worker_index: Option<usize>,
    /// Skip bad rows (counted and reported) instead of failing.
    #[arg(long)]
    pub skip_bad_rows: bool,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// csv: the field delimiter (one character; `tab` or `\t` for tabs).
    #[arg(long, default_value = ",")]
    pub delimiter: String,
    /// csv, json: a column type overriding inference, NAME:DTYPE (int64, float32, bytes); repeatable.
    #[arg(long = "column", value_name = "NAME:DTYPE")]
    pub columns: Vec<String>,
    /// Convert with this schema file (PREFIX.features.json of an earlier convert) instead of
    /// inferring one: the same types, defaults and label vocabulary (for images: the classes).
    #[arg(long, value_name = "FILE")]
    pub schema: Option<PathBuf>,
    /// Split the records into PREFIX-train-* and PREFIX-validation-* shards in one run, this
    /// share (0 < F < 1) going to validation; one schema file serves both.
    #[arg(long, value_name = "F", allow_hyphen_values = true)]
    pub validation_fraction: Option<f64>,
    /// Chooses the validation records of --validation-fraction: the same seed, the same split.
    #[arg(long, default_value_t = 0, requires = "validation_fraction")]
    pub seed: u64,
    /// csv: another value meaning "missing" (besides empty and NA); repeatable.
    #[arg(long)]
    pub na: Vec<String>,
    /// csv: the file has no header row: every row is data, and the columns are named
    /// column_1, column_2, ...
    #[arg(long, conflicts_with = "names")]
    pub no_header: bool,
    /// csv: the file has no header row, and these are its column names (comma-separated).
    #[arg(long, value_name = "A,B,...", value_delimiter = ',')]
    pub names: Option<Vec<String>>,
    /// csv, json: the label column (text labels become class indices).
    #[arg(long)]
    pub label: Option<String>,
    /// csv, json: what a column with missing values becomes in the schema.
    #[arg(long, value_enum, default_value = "default")]
    pub missing: MissingArg,
    /// idx: the labels file [default: inferred from the images file name].
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// idx: store pixels as float32 in [0, 1] instead of raw bytes.
    #[arg(long)]
    pub as_float: bool,
    /// images: decode and resize to WxH, storing raw RGB pixels (needs the `images` feature).
    #[arg(long, value_name = "WxH")]
    pub resize: Option<String>,
    /// images: the feature names [default: tfds].
    #[arg(long, value_enum)]
    pub layout: Option<LayoutArg>,
}

/// A whole number of at least 1, with a message that says so (clap's own
/// answer to `-3` is a misleading hint about `--`).
fn positive<T>(text: &str) -> Result<T, String>
where
    T: std::str::FromStr + TryFrom<u64>,
{
    let bad = || format!("{text:?} is not a whole number of at least 1");
    let n: u64 = text.trim().parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    T::try_from(n).map_err(|_| format!("{text:?} is too large"))
}

fn format_of(args: &Args) -> anyhow::Result<Format> {
    let only = |set: bool, flag: &str, formats: &[FormatArg]| -> anyhow::Result<()> {
        if set && !formats.contains(&args.format) {
            bail!(
                "{flag} does not apply to the {:?} format",
                format!("{:?}", args.format).to_lowercase()
            );
        }
        Ok(())
    };
    use FormatArg::*;
    only(args.delimiter != ",", "--delimiter", &[Csv])?;
    only(!args.na.is_empty(), "--na", &[Csv])?;
    only(args.no_header, "--no-header", &[Csv])?;
    only(args.names.is_some(), "--names", &[Csv])?;
    only(!args.columns.is_empty(), "--column", &[Csv, Json])?;
    only(args.label.is_some(), "--label", &[Csv, Json])?;
    only(
        args.missing != MissingArg::Default,
        "--missing",
        &[Csv, Json],
    )?;
    only(args.labels.is_some(), "--labels", &[Idx])?;
    only(args.as_float, "--as-float", &[Idx])?;
    only(args.resize.is_some(), "--resize", &[Images])?;
    only(args.layout.is_some(), "--layout", &[Images])?;
    if args.schema.is_some() && !args.columns.is_empty() {
        bail!("--column does not apply with --schema: the schema gives every column's type");
    }
    let schema = args
        .schema
        .as_ref()
        .map(convert::FixedSchema::load)
        .transpose()?;
    let missing = match args.missing {
        MissingArg::Default => Missing::Default,
        MissingArg::Var => Missing::Var,
    };
    Ok(match args.format {
        Csv => {
            let delimiter = match args.delimiter.as_str() {
                "tab" | "\\t" | "\t" => b'\t',
                d if d.len() == 1 => d.as_bytes()[0],
                d => bail!("--delimiter {d:?}: expected one ASCII character (or `tab`)"),
            };
            Format::Csv(
                CsvOptions {
                    delimiter,
                    na: args.na.clone(),
                    label: args.label.clone(),
                    missing,
                    schema,
                    header: match (&args.names, args.no_header) {
                        (Some(names), _) => Header::Names(names.clone()),
                        (None, true) => Header::None,
                        (None, false) => Header::FirstRow,
                    },
                    ..CsvOptions::default()
                }
                .with_column_texts(&args.columns)?,
            )
        }
        Json => Format::Json(
            JsonOptions {
                label: args.label.clone(),
                missing,
                schema,
                ..JsonOptions::default()
            }
            .with_column_texts(&args.columns)?,
        ),
        Idx => Format::Idx(IdxOptions {
            labels: args.labels.clone(),
            as_float: args.as_float,
            schema,
        }),
        Images => {
            let resize = match &args.resize {
                None => None,
                Some(text) => {
                    let parsed = text
                        .split_once(['x', 'X'])
                        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)));
                    match parsed {
                        Some(size) => Some(size),
                        None => bail!("--resize {text:?}: expected WIDTHxHEIGHT, e.g. 64x64"),
                    }
                }
            };
            let layout = match args.layout {
                Some(LayoutArg::Imagenet) => ImagesLayout::Imagenet,
                Some(LayoutArg::Tfds) | None => ImagesLayout::Tfds,
            };
            Format::Images(ImagesOptions {
                layout,
                resize,
                schema,
            })
        }
    })
}

fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{msg:>9} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {prefix}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}

/// Runs `tfpipe convert`.
pub fn run(args: Args) -> anyhow::Result<Status> {
    let format = format_of(&args)?;
    // The destination is checked before any input is read.
    super::check_output_prefix(&args.output, "--output")?;
    let interrupt = interrupt::install()?;
    let bar = progress_bar();
    let progress = {
        let bar = bar.clone();
        Arc::new(move |p: &convert::Progress| {
            bar.set_length(p.bytes_total);
            bar.set_position(p.bytes_done);
            bar.set_message(match p.phase {
                Phase::Scanning => "scanning",
                Phase::Encoding => "encoding",
            });
            bar.set_prefix(format!("{} records", p.records));
        })
    };
    let output = OutputOptions {
        sharding: match (args.shards, args.records_per_shard) {
            (Some(n), _) => Sharding::Shards(n),
            (None, Some(r)) => Sharding::RecordsPerShard(r),
            (None, None) => Sharding::Auto,
        },
        compression: args.compression,
        threads: args.threads.unwrap_or(0),
        skip_bad_rows: args.skip_bad_rows,
        cancel: Some(interrupt.flag()),
        progress: Some(progress),
        fanout: match (args.num_workers, args.worker_index) {
            (Some(workers), Some(index)) => Some(convert::Fanout { workers, index }),
            _ => None,
        },
        split: args.validation_fraction.map(|fraction| convert::Split {
            fraction,
            seed: args.seed,
        }),
        ..OutputOptions::new(&args.output)
    };
    let result = convert::convert(&format, &args.inputs, &output);
    bar.finish_and_clear();
    if result.is_err() && interrupt.is_set() {
        // Whatever stopped the conversion (the cancel check, or a read cut
        // short by the signal), it was interrupted.
        return Err(interrupt.error().note("no output was written").into());
    }
    match result {
        Ok(summary) => {
            for warning in &summary.warnings {
                let flags = if warning.starts_with(convert::HEADER_LOOKS_LIKE_DATA) {
                    ": --no-header or --names"
                } else {
                    ""
                };
                eprintln!("tfpipe: warning: {warning}{flags}");
            }
            if !summary.stale_shards.is_empty() {
                eprintln!(
                    "tfpipe: warning: {} shard(s) of an earlier conversion share this prefix and match PREFIX-* (e.g. {}); remove them before reading with a glob",
                    summary.stale_shards.len(),
                    summary.stale_shards[0].display()
                );
            }
            let mut out = std::io::stdout().lock();
            if args.json {
                writeln!(out, "{}", summary_json(&summary))?;
            } else {
                print_summary(&mut out, &summary)?;
            }
            out.flush()?;
            Ok(Status::Ok)
        }
        Err(ConvertError::Interrupted) => {
            Err(interrupt.error().note("no output was written").into())
        }
        Err(e) if e.is_data_error() => {
            eprintln!("tfpipe: {}", tfpipe::error::display_chain(&e));
            if e.is_bad_row() && !args.skip_bad_rows {
                eprintln!("tfpipe: no output was written (--skip-bad-rows skips such rows)");
            } else {
                eprintln!("tfpipe: no output was written");
            }
            Ok(Status::Problems)
        }
        Err(e) => {
            let hint = match &e {
                ConvertError::Options { option, .. } => option_flags(*option),
                _ => None,
            };
            let e = anyhow::Error::new(e);
            let e = match hint {
                Some(hint) => e.context(hint),
                None => e,
            };
            Err(e).context("convert failed; no output was written")
        }
    }
}

/// The flags that set a conversion option.
fn option_flags(option: ConvertOption) -> Option<&'static str> {
    Some(match option {
        ConvertOption::Labels => "--labels FILE",
        ConvertOption::Label => "--label",
        ConvertOption::ColumnTypes => "--column NAME:DTYPE",
        ConvertOption::Names => "--names",
        ConvertOption::Schema => "--schema",
        ConvertOption::Resize => "--resize WxH",
        ConvertOption::Sharding => "--shards or --records-per-shard",
        ConvertOption::ValidationSplit => "--validation-fraction",
        ConvertOption::FanOut => "--num-workers and --worker-index",
        ConvertOption::Output => "-o PREFIX",
        _ => return None,
    })
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn features_text(summary: &Summary) -> Vec<String> {
    // The `--feature` text form, so the lines can be pasted into other commands.
    summary
        .schema
        .features
        .iter()
        .map(|f| {
            if summary.schema.label.as_deref() == Some(f.name.as_str()) {
                format!("{f} (label)")
            } else {
                f.to_string()
            }
        })
        .collect()
}

fn summary_json(s: &Summary) -> serde_json::Value {
    json!({
        "records": s.records,
        "rows_skipped": s.rows_skipped,
        "bad_rows": s.bad_rows.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        "bytes_in": s.bytes_in,
        "bytes_out": s.bytes_out,
        "shards": s.shards.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "validation": s.validation.as_ref().map(|v| json!({
            "records": v.records,
            "shards": v.shards.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        })),
        "schema": s.schema_path.display().to_string(),
        "features": features_text(s),
        "seconds": s.seconds,
        "warnings": s.warnings,
        "stale_shards": s.stale_shards.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "mb_per_sec_in": mb(s.bytes_in) / s.seconds.max(1e-9),
        "records_per_sec": s.records as f64 / s.seconds.max(1e-9),
    })
}

fn print_summary(out: &mut impl Write, s: &Summary) -> std::io::Result<()> {
    let secs = s.seconds.max(1e-9);
    writeln!(
        out,
        "converted {} records in {:.3} s: {:.1} MB in ({:.1} MB/s, {:.0} records/s), {:.1} MB out",
        s.records,
        s.seconds,
        mb(s.bytes_in),
        mb(s.bytes_in) / secs,
        s.records as f64 / secs,
        mb(s.bytes_out)
    )?;
    let shards =
        |out: &mut dyn Write, label: &str, list: &[PathBuf]| match (list.first(), list.len()) {
            (Some(first), 1) => writeln!(out, "  {label:<12} 1: {}", first.display()),
            (Some(first), n) => writeln!(out, "  {label:<12} {n}: {} ...", first.display()),
            (None, _) => Ok(()),
        };
    match &s.validation {
        None => shards(out, "shards", &s.shards)?,
        Some(v) => {
            let train = s.records - v.records;
            shards(out, &format!("train {train}"), &s.shards)?;
            shards(out, &format!("valid {}", v.records), &v.shards)?;
        }
    }
    writeln!(out, "  schema       {}", s.schema_path.display())?;
    for (i, f) in features_text(s).iter().enumerate() {
        writeln!(out, "  {:<12} {f}", if i == 0 { "features" } else { "" })?;
    }
    writeln!(out, "  rows skipped {}", s.rows_skipped)?;
    for e in &s.bad_rows {
        writeln!(out, "    {e}")?;
    }
    if s.rows_skipped > s.bad_rows.len() as u64 {
        writeln!(
            out,
            "    ... and {} more",
            s.rows_skipped - s.bad_rows.len() as u64
        )?;
    }
    Ok(())
}
