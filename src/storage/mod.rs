//! Where data lives, as bytes: local paths, object-store URLs and globs, one
//! resolver for all of them; opening, opening at an offset, sizes and ranged
//! reads. Nothing here knows what a record is: the layers above frame the
//! bytes into records (`tfrecord`, which also keeps the record index) and
//! stream them (`pipeline`).
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
//! An object is read by one streaming GET, or by parallel ranged GETs with
//! read-ahead (by default 8 MiB ranges, 4 in flight per object,
//! [`ReadOptions`]), whichever was measured faster on its server
//! ([`ReadStrategy::Auto`]: once per store and process, on the first object
//! of at least the read-ahead's size); either way a reader never waits on
//! one round trip once it is going, and no more than the read-ahead is
//! buffered ahead of it. Bytes reach the reader as the body arrives, chunk
//! by chunk: records are parsed from the first bytes of a range, not after
//! its last. GZIP/ZLIB objects are decompressed as that
//! stream arrives. Several objects are read at once by
//! `TfRecordFiles::interleave` in the pipeline.
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
//! [`Pipeline::tfrecord_files`]: crate::Pipeline::tfrecord_files
//! [`Location`]: crate::Location

#[cfg(feature = "object-store")]
mod object;
mod resolve;

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[cfg(feature = "object-store")]
pub use object::{
    ObjectWriter, PendingObject, commit_objects, delete_object, install_crypto_provider,
    read_strategy, set_bucket_options, set_read_strategy,
};
pub(crate) use resolve::url_str;
pub use resolve::{Listing, is_dataset_file, is_url, partition_values, resolve, resolve_listing};

/// Why a path, URL or object could not be resolved, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// A path, URL or glob names nothing.
    #[error("{pattern}: no such file (or no file matches the pattern)")]
    NoMatch {
        /// The glob pattern.
        pattern: String,
    },
    /// A glob pattern is malformed.
    #[error("{pattern}: bad glob pattern: {reason}")]
    BadGlob {
        /// The glob pattern.
        pattern: String,
        /// What is wrong.
        reason: String,
    },
    /// Not a URL tfpipe can read.
    #[error("{url}: {reason}")]
    BadUrl {
        /// The object's URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// An object-store operation failed (after retries where it is transient).
    ///
    /// A self-contained message (see [`crate::error`]): it holds the
    /// store's error and each of its causes once (`object_store`'s errors
    /// embed their first cause in their own text, the deeper ones, such as
    /// why a request could not be built, only in their source chain), and
    /// `source()` is `None`, so no cause prints twice. The store's error is
    /// kept for matching on its kind.
    #[cfg(feature = "object-store")]
    #[error("{url}: {operation} failed{}: {}", attempts_note(*.attempts), cause_chain(.error))]
    Store {
        /// The object's URL.
        url: String,
        /// What was being done (`GET`, `HEAD`, `list`, ...).
        operation: String,
        /// How many times it was tried.
        attempts: u32,
        // Boxed: the store's error is large, and every error enum that
        // wraps this one would grow with it (clippy's result_large_err).
        /// The store's error (kept for matching its kind; see above).
        error: Box<object_store::Error>,
    },
    /// An `http(s)://` directory whose server answers neither a WebDAV
    /// listing (`PROPFIND`, the `source`) nor with an HTML index page of
    /// links to its files.
    #[cfg(feature = "object-store")]
    #[error(
        "{url}: an http(s) directory is listed by WebDAV (PROPFIND) or from its HTML index page, and this server gives neither (the index page: {index}); name the files instead"
    )]
    NoHttpListing {
        /// The directory's URL.
        url: String,
        /// Why the index page did not list it.
        index: String,
        /// The WebDAV listing's error.
        #[source]
        listing: Box<StorageError>,
    },
    /// A ranged read returned fewer bytes than asked for, every attempt.
    #[error("{url}: bytes {}..{}: the server returned {got} bytes (after {attempts} attempts)", range.start, range.end)]
    ShortRead {
        /// The object's URL.
        url: String,
        /// The byte range asked for.
        range: Range<u64>,
        /// The bytes returned.
        got: u64,
        /// How many times it was tried.
        attempts: u32,
    },
    /// The URL needs the `object-store` feature, which this build lacks.
    #[error("{url}: object-storage URLs need tfpipe built with the `object-store` feature")]
    NotBuilt {
        /// The object's URL.
        url: String,
    },
    /// A local file could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The store's error (kept for matching its kind; see above).
        error: io::Error,
    },
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

    /// As an `io::Error` of [`io_kind`](Self::io_kind), keeping this error
    /// as its source; a local file's own `io::Error` is returned as it is
    /// (whoever wraps it names the path, so it is not said twice).
    pub fn into_io(self) -> io::Error {
        match self {
            StorageError::Io { error, .. } => error,
            other => io::Error::new(other.io_kind(), other),
        }
    }
}

/// How a sequential read fetches an object ([`ReadOptions::strategy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadStrategy {
    /// Measured per server: the first object of at least the read-ahead's
    /// size (`range_size * ranges_in_flight`) is fetched both ways, its
    /// first read-ahead's worth of bytes by one GET, then by
    /// `ranges_in_flight` ranged GETs at once, and the ranges are chosen only
    /// when 1.25 times faster; until then, and for smaller objects, one
    /// stream. The default.
    #[default]
    Auto,
    /// One streaming GET per object (a plain download's speed on servers
    /// that cap nothing per connection, or serve ranges slowly).
    Stream,
    /// Ranged GETs of `range_size`, `ranges_in_flight` at once (faster where
    /// each connection is capped, as on S3).
    Ranges,
}

/// How objects are read: strategy, range size, read-ahead depth and retries.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadOptions {
    /// Bytes per ranged GET, at most. By default 8 MiB. An object smaller
    /// than `range_size * ranges_in_flight` is split into
    /// `ranges_in_flight` ranges of at least 1 MiB (or `range_size`, if
    /// smaller), so that a small object is fetched in parallel too.
    pub range_size: u64,
    /// Ranged GETs in flight per object (the read-ahead). By default 4.
    pub ranges_in_flight: usize,
    /// Bytes one streaming GET ([`ReadStrategy::Stream`]) may hold ahead of
    /// its reader, within the read-ahead (the smaller of the two bounds
    /// it; at least 1 MiB). By default 4 MiB: enough to carry a reader over
    /// a pause (about 45 ms of one S3 connection), and small enough that
    /// the allocator recycles the body buffers while they are still
    /// mapped, instead of faulting in fresh pages for every byte (with the
    /// whole 32 MiB read-ahead per stream, that cost a reader of 8 objects
    /// a third of its CPU; see `docs/storage.md`).
    pub stream_buffer: u64,
    /// Attempts per range before a transient error is reported. By default 5.
    pub attempts: u32,
    /// The wait before the first retry; it doubles each retry up to 5 s.
    /// By default 100 ms.
    pub backoff: Duration,
    /// One stream or parallel ranges for a sequential read. By default
    /// [`ReadStrategy::Auto`], measured per server. Random access (an
    /// index's records) always takes ranged GETs.
    pub strategy: ReadStrategy,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            range_size: 8 << 20,
            ranges_in_flight: 4,
            stream_buffer: 4 << 20,
            attempts: 5,
            backoff: Duration::from_millis(100),
            strategy: ReadStrategy::Auto,
        }
    }
}

/// A byte stream from [`open`]: a local file, or an object read by ranged
/// GETs with read-ahead.
pub type ByteStream = Box<dyn io::Read + Send>;

/// Opens the file or object at `path` (a local path or a URL, see
/// [`resolve`]) for reading from byte `start` on: a local file is seeked
/// there, an object is read from there (no GET of what lies before it).
///
/// ```
/// use std::io::Read as _;
/// use tfpipe::storage::{self, ReadOptions};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("bytes");
/// std::fs::write(&path, b"hello world")?;
/// let mut text = String::new();
/// storage::open(&path, 6, &ReadOptions::default())?.read_to_string(&mut text)?;
/// assert_eq!(text, "world");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open(path: &Path, start: u64, read: &ReadOptions) -> Result<ByteStream, StorageError> {
    use std::io::Seek as _;
    if let Some(url) = resolve::url_str(path) {
        return Ok(Box::new(open_object_at(url, start, read)?));
    }
    let io_error = |error| StorageError::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut file = std::fs::File::open(path).map_err(io_error)?;
    if start > 0 {
        file.seek(io::SeekFrom::Start(start)).map_err(io_error)?;
    }
    Ok(Box::new(file))
}

/// An object's first GET, sent before its reader is wanted ([`open_ahead`]),
/// so that the server's time to first bytes passes while other files are
/// read. Dropping it aborts the GET.
#[derive(Debug)]
pub(crate) struct OpenAhead {
    #[cfg(feature = "object-store")]
    started: object::StartedOpen,
    /// Without object storage there is nothing to open ahead.
    #[cfg(not(feature = "object-store"))]
    never: std::convert::Infallible,
}

/// Sends the GET that [`open`] of `path` from its start would send first,
/// and returns at once; [`open_started`] makes the stream. `None` for a local
/// file, for an object whose read starts with a `HEAD` (parallel ranges
/// chosen for its store), or where the GET cannot be sent (the error is left
/// to the reader's own open, which reports it in its place).
pub(crate) fn open_ahead(path: &Path, read: &ReadOptions) -> Option<OpenAhead> {
    #[cfg(feature = "object-store")]
    if let Some(url) = resolve::url_str(path) {
        let started = object::ObjectReader::start_open(url, read.clone()).ok()??;
        return Some(OpenAhead { started });
    }
    let _ = (path, read);
    None
}

/// The stream [`open`] from byte 0 would give, from the GET [`open_ahead`]
/// sent: waits for its answer, and fails as `open` would.
pub(crate) fn open_started(ahead: OpenAhead) -> Result<ByteStream, StorageError> {
    #[cfg(feature = "object-store")]
    return Ok(Box::new(object::ObjectReader::finish_open(ahead.started)?));
    #[cfg(not(feature = "object-store"))]
    match ahead.never {}
}

/// Reads `ranges` of the file or object at `path`, in order: positioned reads
/// of a local file, parallel ranged GETs (all in flight at once, retried as
/// [`ReadOptions::default`] says) of an object. A range past the end is a
/// short read, reported as an error.
pub fn read_ranges(path: &Path, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>, StorageError> {
    if let Some(url) = resolve::url_str(path) {
        return read_object_ranges(url, ranges);
    }
    let io_error = |error| StorageError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::open(path).map_err(io_error)?;
    ranges
        .iter()
        .map(|range| {
            let len = usize::try_from(range.end.saturating_sub(range.start)).map_err(|_| {
                io_error(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "range too large",
                ))
            })?;
            let mut buf = vec![0u8; len];
            read_exact_at(&file, &mut buf, range.start).map_err(io_error)?;
            Ok(buf)
        })
        .collect()
}

/// The whole of a (small) file or object, such as an index or schema file.
pub fn read_whole(path: &Path) -> Result<Vec<u8>, StorageError> {
    let Some(url) = resolve::url_str(path) else {
        return std::fs::read(path).map_err(|error| StorageError::Io {
            path: path.to_path_buf(),
            error,
        });
    };
    // No HEAD first: opening the object learns its size, and the buffer
    // grows only as bytes arrive.
    let mut bytes = Vec::new();
    let mut reader = open_object_at(url, 0, &ReadOptions::default())?;
    io::Read::read_to_end(&mut reader, &mut bytes).map_err(|error| StorageError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    Ok(bytes)
}

/// Reads exactly `buf.len()` bytes of `file` at `offset`, without moving
/// its cursor (so one handle serves reads from many threads).
pub(crate) fn read_exact_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(buf, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = file;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buf)
    }
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

#[cfg(feature = "object-store")]
fn read_object_ranges(url: &str, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>, StorageError> {
    let parts = object::read_ranges(url, ranges, &ReadOptions::default())?;
    Ok(parts.into_iter().map(Vec::from).collect())
}

/// A ranged GET started by [`start_range`] and received with [`PendingRange::wait`].
#[cfg(feature = "object-store")]
pub(crate) struct PendingRange(object::Pending<Result<bytes::Bytes, StorageError>>);

#[cfg(feature = "object-store")]
impl PendingRange {
    /// Waits for the range's bytes.
    pub(crate) fn wait(self) -> Result<bytes::Bytes, StorageError> {
        self.0.wait().and_then(|r| r)
    }
}

/// Starts one ranged GET of the object at `url`, to be received later: for
/// readers that keep many small reads in flight (the global shuffle).
#[cfg(feature = "object-store")]
pub(crate) fn start_range(url: &str, range: Range<u64>) -> Result<PendingRange, StorageError> {
    // One RangeReader per object would be cheaper; the store lookup is a
    // hash probe, small next to a GET.
    let reader = object::RangeReader::new(url, ReadOptions::default())?;
    Ok(PendingRange(reader.start(range)))
}

#[cfg(not(feature = "object-store"))]
fn read_object_ranges(url: &str, _ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>, StorageError> {
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
