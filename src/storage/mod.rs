//! Where data lives: local paths, object-store URLs and globs, one resolver
//! for all of them, and the record index that makes a TFRecord file
//! randomly accessible.
//!
//! # Paths and URLs
//!
//! Everywhere tfpipe takes a data path ([`Pipeline::tfrecord_files`], `cat`,
//! `inspect`, `bench`, `train`, `predict`) it takes, through [`resolve`]:
//!
//! - a local path, or a local glob (`data/train-*.tfrecord`, matches sorted);
//! - with the `object-store` feature (on by default), a URL: `s3://bucket/key`,
//!   `gs://bucket/key`, `az://container/key`, `http(s)://host/path`, also with
//!   a glob in the key (`s3://bucket/train/part-*.tfrecord.gz`). A glob URL is
//!   listed by the prefix before its first wildcard, then matched key by key
//!   (`*` and `?` stop at `/`, as in a shell).
//!
//! A URL travels through the crate as a `PathBuf` holding the URL text, so
//! errors name it where they would name a file: a [`Location`] reads
//! `s3://bucket/train-0.tfrecord: record 7 at byte 81920`.
//!
//! # Credentials and endpoints
//!
//! Each store is configured from its standard environment variables, through
//! `object_store`'s `from_env` builders: `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, and for
//! S3-compatible servers `AWS_ENDPOINT_URL` (the AWS CLI's variable) and
//! `AWS_ALLOW_HTTP=true`; `GOOGLE_SERVICE_ACCOUNT` (and friends) for GCS;
//! `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY` (and friends)
//! for Azure. A program can also set options per bucket with
//! `set_bucket_options` (they win over the environment; `object-store` feature).
//!
//! # Reading for latency
//!
//! An object is read by parallel ranged GETs with read-ahead: by default
//! 8 MiB ranges, 4 in flight per object ([`ReadOptions`]), so a reader never
//! waits on one round trip once it is going. Each range reaches the reader as
//! its body arrives, chunk by chunk: records are parsed from the first bytes
//! of a range, not after its last. GZIP/ZLIB objects are decompressed as that
//! stream arrives. Several objects are read at once by
//! [`TfRecordFiles::interleave`](crate::pipeline::TfRecordFiles::interleave).
//! A failed range is retried with exponential backoff (a dropped connection, a
//! 5xx), from its first byte not yet delivered; a missing object or a refused
//! credential is not. Every error names the
//! URL and the byte range, and the record reader adds the record and offset.
//!
//! # Threads
//!
//! `object_store` is async. All its I/O runs on one small tokio runtime (one
//! current-thread scheduler) whose thread is started through
//! [`crate::spawn::Thread`], plus one thread (also ours) that resolves host
//! names, so tokio's blocking pool never starts. Both live while any reader,
//! listing or upload needs them and are stopped and joined when the last of
//! those is dropped.
//!
//! # The record index
//!
//! [`RecordIndex`] holds one `offset size` pair per record, in the format of
//! DALI's `tfrecord2idx` (`tfpipe index FILES` writes them). With it a file
//! can be read by record ([`IndexedFiles::read`]), sharded exactly by record
//! ([`IndexedFiles::shard_records`]), and read as a full random permutation
//! across files without a shuffle buffer ([`IndexedFiles::global_shuffle`]).
//! An index that disagrees with its data file is an error, never trusted.
//!
//! [`Pipeline::tfrecord_files`]: crate::Pipeline::tfrecord_files
//! [`Location`]: crate::Location

mod index;
#[cfg(feature = "object-store")]
mod object;
mod resolve;

use std::io::{self, Read as _};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use index::{
    GlobalShuffle, IndexError, IndexProblem, IndexedFiles, RecordId, RecordIndex, index_path,
};
#[cfg(feature = "object-store")]
pub use object::{
    ObjectWriter, PendingObject, commit_objects, delete_object, install_crypto_provider,
    set_bucket_options,
};
pub(crate) use resolve::url_str;
pub use resolve::{is_url, resolve};

use crate::tfrecord::{Compression, FileRecordReader, ReaderOptions, RecordError};

/// Why a path, URL or object could not be resolved, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// A path, URL or glob names nothing.
    #[error("{pattern}: no such file (or no file matches the pattern)")]
    NoMatch { pattern: String },
    /// A glob pattern is malformed.
    #[error("{pattern}: bad glob pattern: {reason}")]
    BadGlob { pattern: String, reason: String },
    /// Not a URL tfpipe can read.
    #[error("{url}: {reason}")]
    BadUrl { url: String, reason: String },
    /// An object-store operation failed (after retries where it is transient).
    ///
    /// The message holds the store's error and each of its causes once
    /// (`object_store`'s errors embed their first cause in their own text,
    /// the deeper ones, such as why a request could not be built, only in
    /// their source chain), so it is complete wherever it is wrapped; the
    /// store's error is also the [`source`](std::error::Error::source).
    #[cfg(feature = "object-store")]
    #[error("{url}: {operation} failed{}: {}", attempts_note(*.attempts), cause_chain(.error))]
    Store {
        url: String,
        operation: String,
        attempts: u32,
        // Boxed: the store's error is large, and every error enum that
        // wraps this one would grow with it (clippy's result_large_err).
        #[source]
        error: Box<object_store::Error>,
    },
    /// A ranged read returned fewer bytes than asked for, every attempt.
    #[error("{url}: bytes {}..{}: the server returned {got} bytes (after {attempts} attempts)", range.start, range.end)]
    ShortRead {
        url: String,
        range: Range<u64>,
        got: u64,
        attempts: u32,
    },
    /// The URL needs the `object-store` feature, which this build lacks.
    #[error("{url}: object-storage URLs need tfpipe built with the `object-store` feature")]
    NotBuilt { url: String },
    /// A local file could not be read.
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    /// The object-store runtime thread could not be started or has stopped.
    #[error("object-store runtime: {0}")]
    Runtime(io::Error),
}

/// `error`'s text followed by each cause in its source chain whose text is
/// not already there (many errors repeat their source in their own text).
#[cfg(feature = "object-store")]
fn cause_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let next_text = next.to_string();
        if !text.contains(&next_text) {
            text.push_str(": ");
            text.push_str(&next_text);
        }
        cause = next.source();
    }
    text
}

/// The HTTP status a store's `Generic` error carries, if any.
///
/// `object_store` maps 401/403/404 to typed errors for GET and HEAD but
/// not for LIST, whose error is `Generic` around its private `RetryError`;
/// the status is only in that error's text ("Server returned non-2xx
/// status code: 403 Forbidden").
#[cfg(feature = "object-store")]
fn http_status(error: &object_store::Error) -> Option<u16> {
    const MARK: &str = "status code: ";
    let text = cause_chain(error);
    let at = text.find(MARK)? + MARK.len();
    text.get(at..at + 3)?.parse().ok()
}

#[cfg(feature = "object-store")]
fn attempts_note(attempts: u32) -> String {
    if attempts > 1 {
        format!(" after {attempts} attempts")
    } else {
        String::new()
    }
}

impl StorageError {
    /// The `io::ErrorKind` this error is closest to (missing objects are
    /// `NotFound`, refused credentials `PermissionDenied`, the rest `Other`),
    /// never a kind that reads as corrupt data.
    pub fn io_kind(&self) -> io::ErrorKind {
        match self {
            StorageError::NoMatch { .. } => io::ErrorKind::NotFound,
            StorageError::Io { error, .. } => error.kind(),
            #[cfg(feature = "object-store")]
            StorageError::Store { error, .. } => match error.as_ref() {
                object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
                object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. } => io::ErrorKind::PermissionDenied,
                _ => match http_status(error) {
                    Some(401 | 403) => io::ErrorKind::PermissionDenied,
                    Some(404) => io::ErrorKind::NotFound,
                    _ => io::ErrorKind::Other,
                },
            },
            _ => io::ErrorKind::Other,
        }
    }

    /// As an `io::Error` of [`io_kind`](Self::io_kind), keeping this error as its source.
    pub fn into_io(self) -> io::Error {
        io::Error::new(self.io_kind(), self)
    }
}

/// How objects are read: range size, read-ahead depth and retries.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadOptions {
    /// Bytes per ranged GET, at most. By default 8 MiB. An object smaller
    /// than `range_size * ranges_in_flight` is split into
    /// `ranges_in_flight` ranges of at least 1 MiB (or `range_size`, if
    /// smaller), so that a small object is fetched in parallel too.
    pub range_size: u64,
    /// Ranged GETs in flight per object (the read-ahead). By default 4.
    pub ranges_in_flight: usize,
    /// Attempts per range before a transient error is reported. By default 5.
    pub attempts: u32,
    /// The wait before the first retry; it doubles each retry up to 5 s.
    /// By default 100 ms.
    pub backoff: Duration,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            range_size: 8 << 20,
            ranges_in_flight: 4,
            attempts: 5,
            backoff: Duration::from_millis(100),
        }
    }
}

/// Opens the TFRecord file or object at `path` (a local path or a URL, see
/// [`resolve`]), with the compression from `options` or else from its name.
/// Object reads use [`ReadOptions::default`].
pub fn open_records(
    path: impl AsRef<Path>,
    options: ReaderOptions,
) -> Result<FileRecordReader, RecordError> {
    open_records_with(path, options, &ReadOptions::default())
}

/// [`open_records`] with explicit object-read settings.
pub fn open_records_with(
    path: impl AsRef<Path>,
    options: ReaderOptions,
    read: &ReadOptions,
) -> Result<FileRecordReader, RecordError> {
    let path = path.as_ref();
    let Some(url) = resolve::url_str(path) else {
        return FileRecordReader::open_local(path, options);
    };
    let mut object = open_object(url, read).map_err(|e| open_error(path, e))?;
    // As for local files: a name that says uncompressed, content that
    // starts like GZIP or ZLIB, is read as such.
    let (compression, input): (Compression, Box<dyn io::Read + Send>) = match options.compression {
        Some(compression) => (compression, Box::new(object)),
        None => match Compression::from_path(path) {
            Compression::None => {
                let head =
                    crate::tfrecord::read_head(&mut object).map_err(|error| RecordError::Open {
                        path: path.to_path_buf(),
                        error,
                    })?;
                let compression = crate::tfrecord::sniff_compression(&head);
                (compression, Box::new(io::Cursor::new(head).chain(object)))
            }
            named => (named, Box::new(object)),
        },
    };
    let options = ReaderOptions {
        compression: Some(compression),
        ..options
    };
    Ok(FileRecordReader::decoding(input, options).with_path(PathBuf::from(url)))
}

fn open_error(path: &Path, error: StorageError) -> RecordError {
    RecordError::Open {
        path: path.to_path_buf(),
        error: error.into_io(),
    }
}

/// Opens the TFRecord file or object at `path` positioned at `position` (a
/// record's index and uncompressed frame offset, as
/// [`RecordReader::position`](crate::tfrecord::RecordReader::position)
/// reported). An uncompressed object is read from that byte on (no GET of
/// what lies before it); a compressed one is decoded from the start and the
/// records before `position` are read and dropped, since a compressed stream
/// cannot seek.
pub fn open_records_at(
    path: impl AsRef<Path>,
    options: ReaderOptions,
    position: crate::tfrecord::Position,
) -> Result<FileRecordReader, RecordError> {
    let path = path.as_ref();
    let Some(url) = resolve::url_str(path) else {
        return FileRecordReader::open_at(path, options, position);
    };
    let compression = options
        .compression
        .unwrap_or_else(|| Compression::from_path(path));
    if compression != Compression::None || position.offset == 0 {
        let mut reader = open_records(path, options)?;
        while reader.position().offset < position.offset && reader.next_record()?.is_some() {}
        return Ok(reader);
    }
    let object = open_object_at(url, position.offset, &ReadOptions::default())
        .map_err(|e| open_error(path, e))?;
    let options = ReaderOptions {
        compression: Some(Compression::None),
        ..options
    };
    Ok(FileRecordReader::decoding(object, options)
        .with_path(PathBuf::from(url))
        .starting_at(position.record, position.offset))
}

/// Opens an object for reading as a byte stream (`io::Read`), with
/// parallel ranged GETs and read-ahead.
#[cfg(feature = "object-store")]
pub fn open_object(url: &str, read: &ReadOptions) -> Result<ObjectReader, StorageError> {
    open_object_at(url, 0, read)
}

/// [`open_object`] from byte `start` on.
#[cfg(feature = "object-store")]
pub fn open_object_at(
    url: &str,
    start: u64,
    read: &ReadOptions,
) -> Result<ObjectReader, StorageError> {
    object::ObjectReader::open_from(url, start, read.clone())
}

#[cfg(not(feature = "object-store"))]
fn open_object(url: &str, read: &ReadOptions) -> Result<std::io::Empty, StorageError> {
    open_object_at(url, 0, read)
}

#[cfg(not(feature = "object-store"))]
fn open_object_at(
    url: &str,
    _start: u64,
    _read: &ReadOptions,
) -> Result<std::io::Empty, StorageError> {
    Err(StorageError::NotBuilt {
        url: url.to_string(),
    })
}

#[cfg(feature = "object-store")]
pub use object::ObjectReader;

/// Reads `ranges` of the object at `url` (parallel ranged GETs, all in
/// flight at once, retried as [`ReadOptions::default`] says), in order.
/// For re-reading records at stored positions (a restored shuffle buffer).
#[cfg(feature = "object-store")]
pub(crate) fn read_object_ranges(
    url: &str,
    ranges: &[Range<u64>],
) -> Result<Vec<bytes::Bytes>, StorageError> {
    object::read_ranges(url, ranges, &ReadOptions::default())
}

#[cfg(not(feature = "object-store"))]
pub(crate) fn read_object_ranges(
    url: &str,
    _ranges: &[Range<u64>],
) -> Result<Vec<Vec<u8>>, StorageError> {
    Err(StorageError::NotBuilt {
        url: url.to_string(),
    })
}

/// The size in bytes of a file or object.
pub fn size_of(path: &Path) -> Result<u64, StorageError> {
    match resolve::url_str(path) {
        Some(url) => object_size(url),
        None => std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(|error| StorageError::Io {
                path: path.to_path_buf(),
                error,
            }),
    }
}

#[cfg(feature = "object-store")]
fn object_size(url: &str) -> Result<u64, StorageError> {
    object::head(url).map(|meta| meta.size)
}

#[cfg(not(feature = "object-store"))]
fn object_size(url: &str) -> Result<u64, StorageError> {
    Err(StorageError::NotBuilt {
        url: url.to_string(),
    })
}
