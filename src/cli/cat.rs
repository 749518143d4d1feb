//! `tfpipe cat`: every record as one JSON object per line, in the golden-file
//! encoding of [`tfpipe::example::json`].
//!
//! Indexes restart at 0 for each file, so the output for one file equals the
//! `records` array of its golden JSON. On a corrupt file the good records before
//! the corruption are printed, the error goes to stderr, the remaining files are
//! still printed, and the exit status is 1.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::ValueEnum;
use tfpipe::example::json::{RecordJson, RecordType};
use tfpipe::tfrecord::{FileRecordReader, ReaderOptions, RecordReader};

use super::{CompressionFlag, Status, resolve_files};

/// Arguments of `tfpipe cat`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {
    /// The message in each record. `auto` looks at the first 64 records of
    /// each file: a top-level field 2 (`feature_lists`) means SequenceExample
    /// (and any later record with one is printed as a SequenceExample).
    #[arg(long = "type", value_enum, default_value_t = TypeArg::Auto)]
    pub record_type: TypeArg,
    #[command(flatten)]
    pub compression: CompressionFlag,
    /// Print at most N records in all (over all files).
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// TFRecord files or quoted globs, as for `--data` (`-` reads standard input).
    #[arg(required = true, value_name = "FILE|GLOB")]
    pub files: Vec<PathBuf>,
}

/// `--type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum TypeArg {
    /// Decide per file from its records (field 2 means SequenceExample).
    #[default]
    Auto,
    /// `tf.train.Example`.
    Example,
    /// `tf.train.SequenceExample`.
    Sequence,
}

/// How many records `auto` looks at before settling on Example.
const SNIFF_RECORDS: usize = 64;

/// Opens `path` (or stdin for `-`) for reading records.
pub fn open(path: &PathBuf, options: ReaderOptions) -> anyhow::Result<FileRecordReader> {
    if path.as_os_str() == "-" {
        let stdin: Box<dyn io::Read + Send> = Box::new(io::stdin());
        let compression = options.compression.unwrap_or_default();
        let reader = RecordReader::new(compression.decoder(stdin), options);
        Ok(reader.with_path("<stdin>"))
    } else {
        Ok(FileRecordReader::open(path, options)?)
    }
}

/// Runs `tfpipe cat`.
pub fn run(args: Args) -> anyhow::Result<Status> {
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut status = Status::Ok;
    let mut left = args.limit.unwrap_or(u64::MAX);
    for path in &resolve_files(&args.files)? {
        if left == 0 {
            break;
        }
        let options = ReaderOptions {
            compression: args.compression.explicit(),
            ..ReaderOptions::default()
        };
        let reader = open(path, options)?;
        if cat_file(reader, args.record_type, &mut left, &mut out)? == Status::Problems {
            status = Status::Problems;
        }
    }
    out.flush().context("writing to stdout")?;
    Ok(status)
}

/// Prints the records of one file; problems go to stderr and make the result
/// `Status::Problems`. Only output errors are `Err`.
fn cat_file(
    mut reader: FileRecordReader,
    record_type: TypeArg,
    left: &mut u64,
    out: &mut impl Write,
) -> anyhow::Result<Status> {
    let mut status = Status::Ok;
    // Records read ahead to decide `auto`, with their index and offset.
    let mut lookahead: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    let mut failure = None;
    let auto = record_type == TypeArg::Auto;
    let record_type = match record_type {
        TypeArg::Example => RecordType::Example,
        TypeArg::Sequence => RecordType::Sequence,
        TypeArg::Auto => {
            let mut found = RecordType::Example;
            while lookahead.len() < SNIFF_RECORDS && (lookahead.len() as u64) < *left {
                let position = reader.position();
                match reader.next_record() {
                    Ok(Some(record)) => {
                        lookahead.push((position.record, position.offset, record.to_vec()));
                        if RecordType::sniff(record) == RecordType::Sequence {
                            found = RecordType::Sequence;
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(err) => {
                        failure = Some(err);
                        break;
                    }
                }
            }
            found
        }
    };
    for (index, offset, record) in &lookahead {
        status = status.max_problem(print(
            reader.path(),
            *index,
            *offset,
            record,
            record_type,
            out,
        )?);
        *left -= 1;
    }
    if let Some(err) = failure {
        return report(out, err);
    }
    let path = reader.path().map(Path::to_path_buf);
    while *left > 0 {
        let position = reader.position();
        match reader.next_record() {
            Ok(Some(record)) => {
                // A SequenceExample with feature lists after a first stretch
                // without any: print it as one rather than drop its lists
                // (an Example decoder skips field 2).
                let record_type = if auto && record_type == RecordType::Example {
                    RecordType::sniff(record)
                } else {
                    record_type
                };
                let printed = print(
                    path.as_deref(),
                    position.record,
                    position.offset,
                    record,
                    record_type,
                    out,
                )?;
                status = status.max_problem(printed);
                *left -= 1;
            }
            Ok(None) => break,
            Err(err) => return report(out, err),
        }
    }
    Ok(status)
}

/// Prints one record, or reports on stderr that it does not decode.
fn print(
    path: Option<&Path>,
    index: u64,
    offset: u64,
    record: &[u8],
    record_type: RecordType,
    out: &mut impl Write,
) -> anyhow::Result<Status> {
    match RecordJson::decode(index, record, record_type) {
        Ok(json) => {
            serde_json::to_writer(&mut *out, &json)
                .map_err(io::Error::from)
                .context("writing to stdout")?;
            out.write_all(b"\n").context("writing to stdout")?;
            Ok(Status::Ok)
        }
        Err(err) => {
            let location = tfpipe::Location {
                path: path.map(|p| p.to_path_buf()),
                record: index,
                offset,
            };
            out.flush().context("writing to stdout")?;
            eprintln!(
                "tfpipe: {location}: not a valid {}: {err}",
                record_type.message_name()
            );
            Ok(Status::Problems)
        }
    }
}

/// Reports corrupt data on stderr after flushing what was printed before it;
/// an I/O error that is not about the data is returned instead (status 2).
fn report(out: &mut impl Write, err: tfpipe::RecordError) -> anyhow::Result<Status> {
    out.flush().context("writing to stdout")?;
    if !err.is_corruption() {
        return Err(err.into());
    }
    eprintln!("tfpipe: {err}");
    Ok(Status::Problems)
}

impl Status {
    /// The worse of `self` and `other`, for data problems.
    fn max_problem(self, other: Status) -> Status {
        if other == Status::Problems {
            other
        } else {
            self
        }
    }
}
