//! TFRecord files: framing, masked CRC32C, compression, reading and writing.
//!
//! A TFRecord stream is a sequence of records, each framed as
//! `u64 length | masked CRC of length | data | masked CRC of data`
//! (see `frame.rs`); GZIP and ZLIB files compress that whole stream.
//!
//! - [`RecordReader`] reads from any `io::Read` with a reused buffer
//!   ([`RecordReader::read_record`]) or zero-copy ([`RecordReader::next_record`]),
//!   checking both CRCs, and reports corruption with file, record index and
//!   byte offset ([`Location`]). After an error it is fused.
//! - [`RecordWriter`] writes to any `io::Write`; [`FileRecordWriter`] writes to a
//!   path through a temporary file renamed into place on success.
//!
//! Offsets are in the *uncompressed* stream and match what TensorFlow reports:
//! the record start for a bad length CRC or a truncation, the data start for a
//! bad data CRC. One deliberate difference from TensorFlow: a stream that ends
//! inside a record header is reported as truncated (TensorFlow ends quietly).

mod compression;
pub(crate) mod crc;
pub(crate) mod frame;
mod index;
mod inflate;
mod reader;
mod sink;
mod writer;

use std::io;
use std::path::PathBuf;

pub use crate::error::Location;
pub use compression::{Compression, UnknownCompression};
pub use crc::masked_crc32c;
pub use frame::framed_len;
pub use index::{IndexError, IndexProblem, IndexedFiles, RecordId, RecordIndex, index_path};
pub use inflate::{DecodeError, Format};
pub use reader::{
    FileRecordReader, MAX_CORRUPTIONS_KEPT, OnCorruption, Position, ReaderOptions, RecordReader,
    Records,
};
pub use sink::{PendingRecords, RecordSink, SinkError};
pub use writer::{FileRecordWriter, PendingFile, RecordWriter};

/// What is wrong with a corrupt record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CorruptionKind {
    /// The length field does not match its CRC; the framing is lost.
    #[error(
        "length CRC mismatch (length field says {length}, stored CRC {stored:#010x}, computed {computed:#010x})"
    )]
    LengthCrc {
        /// The record length its header states.
        length: u64,
        /// The CRC stored in the file.
        stored: u32,
        /// The CRC of the bytes read.
        computed: u32,
    },
    /// The data does not match its CRC.
    #[error(
        "data CRC mismatch over {length} bytes (stored {stored:#010x}, computed {computed:#010x})"
    )]
    DataCrc {
        /// The record length its header states.
        length: u64,
        /// The CRC stored in the file.
        stored: u32,
        /// The CRC of the bytes read.
        computed: u32,
    },
    /// The stream ends inside a 12-byte record header.
    #[error("truncated record header: the stream ends {available} bytes into the 12-byte header")]
    TruncatedHeader {
        /// The bytes there were.
        available: usize,
    },
    /// The stream ends inside a record's data or its CRC.
    #[error(
        "truncated record: the header promises {length} data bytes and a 4-byte CRC, the stream ends after {available} bytes"
    )]
    TruncatedData {
        /// The record length its header states.
        length: u64,
        /// The bytes there were.
        available: u64,
    },
    /// The stream's first header is not a TFRecord header, and its bytes
    /// show what the file is instead (JSON, PNG, ...).
    #[error("not a TFRecord file: it starts like {what}")]
    NotTfRecord {
        /// What the bytes look like instead.
        what: &'static str,
    },
    /// The compressed stream around the records is damaged, or has bytes
    /// after its end (counted under a skip policy instead of failing).
    #[error("{reason}")]
    Compressed {
        /// What is wrong with the compressed stream.
        reason: String,
    },
    /// The length field passed its CRC but exceeds the reader's limit.
    #[error(
        "implausible record length {length} bytes (limit {limit}; raise ReaderOptions::max_record_len if it is real)"
    )]
    ImplausibleLength {
        /// The record length its header states.
        length: u64,
        /// The largest length accepted.
        limit: u64,
    },
}

/// A corrupt record that a reader skipped or stopped at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// Where: the record index and the offset TensorFlow would report.
    pub location: Location,
    /// What failed.
    pub kind: CorruptionKind,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.location, self.kind)
    }
}

/// Errors from reading or writing TFRecord files.
///
/// Each message is complete: it includes the I/O error's text, so that
/// error is not also returned by [`source`](std::error::Error::source)
/// (which would print it twice in an error chain); get it typed with
/// [`RecordError::io_error`].
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A corrupt record.
    #[error("{location}: {kind}")]
    Corrupt {
        /// Where in the input.
        location: Location,
        /// What is wrong with it.
        kind: CorruptionKind,
    },
    /// Reading (or decompressing) failed.
    #[error("{location}: read failed: {error}")]
    Io {
        /// Where in the input.
        location: Location,
        /// The underlying error.
        error: io::Error,
    },
    /// The file could not be opened.
    #[error("{}: cannot open: {error}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: io::Error,
    },
    /// The output file could not be created or renamed into place.
    #[error("{}: cannot create: {error}", path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: io::Error,
    },
    /// Writing failed.
    #[error("{}: write failed: {error}", path.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "<stream>".into()))]
    Write {
        /// The file.
        path: Option<PathBuf>,
        /// The underlying error.
        error: io::Error,
    },
}

impl RecordError {
    /// The position of the failure, for corruption and read errors.
    pub fn location(&self) -> Option<&Location> {
        match self {
            RecordError::Corrupt { location, .. } | RecordError::Io { location, .. } => {
                Some(location)
            }
            _ => None,
        }
    }

    /// The I/O error behind a read, open, create or write failure.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            RecordError::Io { error, .. }
            | RecordError::Open { error, .. }
            | RecordError::Create { error, .. }
            | RecordError::Write { error, .. } => Some(error),
            RecordError::Corrupt { .. } => None,
        }
    }

    /// Whether the error is about the data rather than the system: corrupt
    /// framing, or a decompressor that found its input invalid or cut short.
    pub fn is_corruption(&self) -> bool {
        match self {
            RecordError::Corrupt { .. } => true,
            RecordError::Io { error, .. } => matches!(
                error.kind(),
                io::ErrorKind::InvalidData
                    | io::ErrorKind::InvalidInput
                    | io::ErrorKind::UnexpectedEof
            ),
            _ => false,
        }
    }

    /// What was corrupt, if this is a corruption error.
    pub fn corruption(&self) -> Option<&CorruptionKind> {
        match self {
            RecordError::Corrupt { kind, .. } => Some(kind),
            _ => None,
        }
    }
}
