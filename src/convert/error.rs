//! The converter's errors. Every error about input data leads with its
//! [`SourceLocation`] (file, line, column, byte offset), quotes the offending
//! value and says what was expected.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::example::SchemaError;
use crate::tfrecord::RecordError;

/// A position in an input file. Lines and columns are 1-based; the byte
/// offset is 0-based, in the uncompressed input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLocation {
    /// The input file.
    pub path: PathBuf,
    /// The line (CSV, JSON), when the format has lines.
    pub line: Option<u64>,
    /// The column: the character column for JSON, the field number for CSV.
    pub column: Option<u64>,
    /// For CSV, the name of the column (from the header).
    pub field: Option<String>,
    /// The byte offset in the (uncompressed) input.
    pub byte: u64,
}

impl SourceLocation {
    /// A location given by a byte offset only (IDX files, images).
    pub fn at_byte(path: &Path, byte: u64) -> Self {
        SourceLocation {
            path: path.to_path_buf(),
            line: None,
            column: None,
            field: None,
            byte,
        }
    }

    /// A location by line and column, computed from the byte offset `byte`
    /// into `text` (the whole input). Columns count characters, not bytes.
    pub fn in_text(path: &Path, text: &[u8], byte: usize) -> Self {
        let byte = byte.min(text.len());
        let before = &text[..byte];
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count() as u64;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        // Count UTF-8 characters (bytes that are not continuation bytes).
        let column = 1 + before[line_start..]
            .iter()
            .filter(|&&b| (b & 0xC0) != 0x80)
            .count() as u64;
        SourceLocation {
            path: path.to_path_buf(),
            line: Some(line),
            column: Some(column),
            field: None,
            byte: byte as u64,
        }
    }
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.path.display())?;
        match (self.line, self.column, &self.field) {
            (Some(line), Some(column), Some(name)) => {
                write!(f, " line {line}, field {column} ({name:?})")?
            }
            (Some(line), Some(column), None) => write!(f, " line {line}, column {column}")?,
            (Some(line), None, _) => write!(f, " line {line}")?,
            _ => {}
        }
        if self.line.is_some() {
            write!(f, " (byte {})", self.byte)
        } else {
            write!(f, " byte {}", self.byte)
        }
    }
}

/// Errors from converting raw data to TFRecord.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// An input file could not be read.
    #[error("{}: cannot read", path.display())]
    Read {
        /// The input file.
        path: PathBuf,
        #[source]
        /// The underlying error.
        source: std::io::Error,
    },
    /// A gzip-compressed input is damaged: `offset` bytes decompressed
    /// cleanly before the damage.
    #[error("{}: corrupt gzip data after {offset} decompressed bytes", path.display())]
    Gzip {
        /// The input file.
        path: PathBuf,
        /// The byte offset.
        offset: u64,
        #[source]
        /// The underlying error.
        source: std::io::Error,
    },
    /// An input changed size while it was being read.
    #[error("{}: the file changed while being read ({expected} bytes when opened, {read} read)", path.display())]
    Changed {
        /// The input file.
        path: PathBuf,
        /// Its size when opened.
        expected: u64,
        /// Bytes actually read.
        read: u64,
    },
    /// A row (CSV line, JSON object, image file) that cannot be converted.
    /// `--skip-bad-rows` skips these; every other error stops the conversion.
    #[error("{location}: {problem}")]
    BadRow {
        /// Where in the input.
        location: SourceLocation,
        /// What is wrong.
        problem: String,
    },
    /// The input is malformed beyond a single row (a broken header, a
    /// truncated IDX file, a JSON syntax error, label and image counts that
    /// disagree).
    #[error("{location}: {problem}")]
    BadInput {
        /// Where in the input.
        location: SourceLocation,
        /// What is wrong.
        problem: String,
    },
    /// The options do not make sense for this input: which option, and
    /// why (a self-contained message, which names the value).
    #[error("{reason}")]
    Options {
        /// The option at fault.
        option: ConvertOption,
        /// Why it does not fit.
        reason: String,
    },
    /// Resizing asked for without the `images` cargo feature.
    #[error(
        "resizing decodes images, which needs the `images` cargo feature: rebuild with `cargo build --release --features images`"
    )]
    ResizeUnavailable,
    /// Every row was bad (or the input was empty).
    #[error(
        "{}: no records to write ({skipped} bad rows skipped)",
        files_text(inputs)
    )]
    NoRecords {
        /// Input values per example.
        inputs: Vec<PathBuf>,
        /// Bad rows skipped.
        skipped: u64,
    },
    /// Writing a shard failed.
    #[error(transparent)]
    Write(#[from] RecordError),
    /// The schema file could not be written.
    #[error("cannot write the schema file")]
    Schema(#[from] SchemaError),
    /// Writing or renaming an output file failed.
    #[error("{}: cannot write", path.display())]
    Output {
        /// The input file.
        path: PathBuf,
        #[source]
        /// The underlying error.
        source: std::io::Error,
    },
    /// Creating, syncing or switching an output into place failed.
    #[error(transparent)]
    Commit(#[from] crate::atomic_file::OutputError),
    /// Converting the records at `location` panicked: a bug in tfpipe. The
    /// conversion stopped and wrote nothing.
    #[error(
        "{location}: the converter panicked on the records from here (a bug in tfpipe; please report it)"
    )]
    Panicked {
        /// Where in the input.
        location: Box<SourceLocation>,
        #[source]
        /// The underlying error.
        source: Box<crate::spawn::Panicked>,
    },
    /// A converter thread panicked outside the work on any record.
    #[error("a converter thread failed")]
    Thread(#[source] crate::spawn::Panicked),
    /// The operating system could not start the converter's threads.
    #[error("cannot start {threads} converter threads")]
    Spawn {
        /// The threads asked for.
        threads: usize,
        #[source]
        /// The underlying error.
        source: std::io::Error,
    },
    /// Converter threads ended before their work was done (only after a
    /// failure of theirs, which is reported instead).
    #[error("the converter's threads stopped early")]
    WorkersGone,
    /// The second pass over the input found another number of records than
    /// the first: an input changed during the conversion.
    #[error(
        "the record count differs from the first pass: did an input change during the conversion?"
    )]
    CountChanged,
    /// The schema to convert with cannot be read (the source names the file).
    #[error("cannot convert with this schema")]
    FixedSchema {
        /// The input file.
        path: PathBuf,
        #[source]
        /// The underlying error.
        source: SchemaError,
    },
    /// The conversion was cancelled (Ctrl-C).
    #[error("interrupted; no output was written")]
    Interrupted,
    /// Uploading to object storage failed (the URL and operation are in the error).
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
}

/// A conversion option, as [`ConvertError::Options`] names it (a front
/// end maps each to its own flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConvertOption {
    /// The input files or folder.
    Inputs,
    /// IDX: the labels file beside an images file.
    Labels,
    /// The label column.
    Label,
    /// The declared column types.
    ColumnTypes,
    /// Columns named by the other options.
    Columns,
    /// CSV: the column names given instead of a header.
    Names,
    /// The schema to convert with.
    Schema,
    /// Images: the size to resize to.
    Resize,
    /// The shard count or records per shard.
    Sharding,
    /// The validation split.
    ValidationSplit,
    /// A fanned-out conversion's worker index and count.
    FanOut,
    /// The output prefix.
    Output,
}

impl From<crate::tfrecord::SinkError> for ConvertError {
    fn from(e: crate::tfrecord::SinkError) -> ConvertError {
        match e {
            crate::tfrecord::SinkError::Record(e) => ConvertError::Write(e),
            crate::tfrecord::SinkError::Storage(e) => ConvertError::Storage(e),
        }
    }
}

impl ConvertError {
    /// An [`Options`](ConvertError::Options) error for `option`.
    pub(crate) fn options(option: ConvertOption, reason: String) -> ConvertError {
        ConvertError::Options { option, reason }
    }

    /// Whether the error is about bad input data (a row, a malformed or
    /// damaged input, nothing convertible) rather than options or I/O.
    pub fn is_data_error(&self) -> bool {
        matches!(
            self,
            ConvertError::BadRow { .. }
                | ConvertError::BadInput { .. }
                | ConvertError::Gzip { .. }
                | ConvertError::NoRecords { .. }
        )
    }

    /// Whether a policy of skipping bad rows may skip this error (a row
    /// that cannot be converted).
    pub fn is_bad_row(&self) -> bool {
        matches!(self, ConvertError::BadRow { .. })
    }

    /// The input position, for errors about input data.
    pub fn location(&self) -> Option<&SourceLocation> {
        match self {
            ConvertError::BadRow { location, .. } | ConvertError::BadInput { location, .. } => {
                Some(location)
            }
            ConvertError::Panicked { location, .. } => Some(location),
            _ => None,
        }
    }

    pub(crate) fn read(path: &Path, source: std::io::Error) -> Self {
        ConvertError::Read {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// `a.csv`, or `a.csv (and 2 more files)`.
fn files_text(inputs: &[PathBuf]) -> String {
    match inputs {
        [] => "no input".into(),
        [one] => one.display().to_string(),
        [first, rest @ ..] => format!("{} (and {} more files)", first.display(), rest.len()),
    }
}

/// Quotes a raw value for an error message: as a string, shortened if long.
pub(crate) fn quote(raw: &[u8]) -> String {
    const MAX: usize = 60;
    let text = String::from_utf8_lossy(raw);
    if text.chars().count() > MAX {
        let short: String = text.chars().take(MAX).collect();
        format!("{short:?}...")
    } else {
        format!("{text:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_from_offset_counts_lines_and_characters() {
        let text = "ab\ncdé f\n".as_bytes();
        let at_f = text.iter().position(|&b| b == b'f').unwrap();
        let loc = SourceLocation::in_text(Path::new("x.json"), text, at_f);
        assert_eq!(loc.line, Some(2));
        assert_eq!(loc.column, Some(5));
        assert_eq!(
            loc.to_string(),
            format!("x.json: line 2, column 5 (byte {at_f})")
        );
        let start = SourceLocation::in_text(Path::new("x.json"), text, 0);
        assert_eq!((start.line, start.column), (Some(1), Some(1)));
    }

    #[test]
    fn quote_shortens_long_values() {
        assert_eq!(quote(b"abc"), "\"abc\"");
        let long = vec![b'x'; 100];
        assert!(quote(&long).ends_with("..."));
    }
}
