//! The record index (DALI's `tfrecord2idx` format) and what it enables:
//! random access by record, exact sharding by record, and a global shuffle
//! that reads a full random permutation across files with no buffer.
//!
//! # Format
//!
//! One line per record, `OFFSET SIZE`, in decimal, separated by a space:
//! `OFFSET` is where the record's 12-byte header starts, `SIZE` the framed
//! length (header, data and the 4-byte data CRC). This is exactly what DALI's
//! `tfrecord2idx` writes, so its index files are read as they are. Indexes
//! describe uncompressed files only (a compressed file has no byte offsets to
//! jump to).
//!
//! # Trust
//!
//! An index is checked against its data file before use, and never trusted
//! silently: the entries must tile the file exactly (first at 0, each starting
//! where the previous ended, the last ending at the file's size), which catches
//! a truncated or appended file and a truncated index. Every record read
//! through the index is then checked again: its header's length CRC, its
//! length against the indexed size, and its data CRC. A stale index that
//! passes the size check (a file rewritten with the same size) fails on the
//! first record it misplaces, with the file, record and offset.
//!
//! ```
//! use tfpipe::storage::{IndexedFiles, RecordIndex};
//! use tfpipe::tfrecord::{Compression, FileRecordWriter};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("data.tfrecord");
//! let mut writer = FileRecordWriter::create(&path, Compression::None)?;
//! for i in 0..10u8 {
//!     writer.write_record(&[i; 3])?;
//! }
//! writer.finish()?;
//!
//! // Build and write `data.tfrecord.idx`, then read record 7 directly.
//! let index = RecordIndex::build(&path)?;
//! index.write(&tfpipe::storage::index_path(&path, None))?;
//! let files = IndexedFiles::open([&path], None)?;
//! assert_eq!(files.len(), 10);
//! assert_eq!(files.read(files.position(7).unwrap())?, [7u8; 3]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::StorageError;
use super::resolve::url_str;
use crate::error::Location;
use crate::pipeline::state::{StageState, StageStream, StateError};
use crate::pipeline::{
    Env, Event, FileId, Pipeline, PipelineError, Record, RecordPosition, Stream,
};
use crate::tfrecord::frame::{self, FOOTER_LEN, HEADER_LEN, Header};
use crate::tfrecord::{Compression, FileRecordReader, ReaderOptions, RecordError};

/// What is wrong with an index, or with a record read through one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexProblem {
    /// A line is not `OFFSET SIZE`.
    #[error("line {line}: expected `OFFSET SIZE`, found {text:?}")]
    Malformed { line: usize, text: String },
    /// An entry does not start where the previous one ended.
    #[error(
        "entry {record} starts at byte {found}, but the previous record ends at byte {expected}"
    )]
    NotContiguous {
        record: u64,
        expected: u64,
        found: u64,
    },
    /// An entry is smaller than an empty record's 16 bytes.
    #[error("entry {record} has size {size}, less than the 16 bytes of an empty record")]
    TooSmall { record: u64, size: u64 },
    /// The entries do not end where the data file does.
    #[error(
        "the index covers {indexed} bytes but the data file has {actual} (stale index, or truncated data or index)"
    )]
    SizeMismatch { indexed: u64, actual: u64 },
    /// The record at an indexed offset does not match the index.
    #[error("the record at the indexed offset does not match the index: {reason}")]
    RecordMismatch { reason: String },
    /// The data file is compressed.
    #[error(
        "{compression}-compressed files cannot be indexed (there are no byte offsets to seek to)"
    )]
    Compressed { compression: Compression },
}

/// Errors building, loading, checking or using a record index.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// The index disagrees with itself or with its data file.
    #[error("{}: {problem} (index {})", data.display(), index.display())]
    Invalid {
        data: PathBuf,
        index: PathBuf,
        problem: IndexProblem,
    },
    /// A record read through the index is not where or what the index says.
    #[error("{location}: {problem}")]
    Record {
        location: Location,
        problem: IndexProblem,
    },
    /// The index file could not be read or written.
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    /// Reading the data file failed (while building, or a record).
    #[error(transparent)]
    Read(#[from] RecordError),
    /// Writing a local index file failed.
    #[error(transparent)]
    Output(#[from] crate::atomic_file::OutputError),
    /// Reading or writing through object storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A record position beyond the data.
    #[error("record position {position} is out of range ({len} records)")]
    OutOfRange { position: RecordId, len: u64 },
}

impl IndexError {
    /// File, record index and byte offset, for errors about a record.
    pub fn location(&self) -> Option<&Location> {
        match self {
            IndexError::Record { location, .. } => Some(location),
            IndexError::Read(e) => e.location(),
            _ => None,
        }
    }
}

/// The index path for `data`: `DATA.idx` beside it, or `DIR/NAME.idx` with
/// an output directory (local). For a URL, `DATA.idx` is the object beside it.
pub fn index_path(data: &Path, dir: Option<&Path>) -> PathBuf {
    let name = data
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match dir {
        Some(dir) => dir.join(format!("{name}.idx")),
        None => {
            let mut text = data.as_os_str().to_owned();
            text.push(".idx");
            PathBuf::from(text)
        }
    }
}

/// One `(offset, size)` pair per record: where each framed record starts in
/// an uncompressed TFRecord file and how long it is. See the [storage module
/// docs](crate::storage) for the format and the checks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordIndex {
    /// `(offset, framed size)` per record, in file order.
    entries: Vec<(u64, u64)>,
}

impl RecordIndex {
    /// Indexes `path` (a local file or a URL) by reading it through, checking
    /// every record's CRCs. Fails on a compressed or corrupt file.
    pub fn build(path: impl AsRef<Path>) -> Result<RecordIndex, IndexError> {
        let path = path.as_ref();
        let compression = Compression::from_path(path);
        if compression != Compression::None {
            return Err(IndexError::Invalid {
                data: path.to_path_buf(),
                index: index_path(path, None),
                problem: IndexProblem::Compressed { compression },
            });
        }
        let options = ReaderOptions {
            compression: Some(Compression::None),
            ..ReaderOptions::default()
        };
        let reader = FileRecordReader::open(path, options)?;
        RecordIndex::from_reader(reader)
    }

    /// Indexes the records `reader` yields (framed, uncompressed).
    pub fn from_reader<R: io::Read>(
        mut reader: crate::tfrecord::RecordReader<R>,
    ) -> Result<RecordIndex, IndexError> {
        let mut entries = Vec::new();
        loop {
            let start = reader.position().offset;
            if reader.next_record()?.is_none() {
                break;
            }
            entries.push((start, reader.position().offset - start));
        }
        Ok(RecordIndex { entries })
    }

    /// Parses index text (`OFFSET SIZE` lines; blank lines are ignored).
    /// `index` names it in errors, `data` is the file it describes.
    pub fn parse(text: &str, data: &Path, index: &Path) -> Result<RecordIndex, IndexError> {
        let invalid = |problem| IndexError::Invalid {
            data: data.to_path_buf(),
            index: index.to_path_buf(),
            problem,
        };
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let mut fields = line.split_ascii_whitespace();
            let parsed = match (fields.next(), fields.next(), fields.next()) {
                (Some(offset), Some(size), None) => {
                    offset.parse::<u64>().ok().zip(size.parse().ok())
                }
                _ => None,
            };
            let Some(entry) = parsed else {
                return Err(invalid(IndexProblem::Malformed {
                    line: n + 1,
                    text: line.chars().take(80).collect(),
                }));
            };
            entries.push(entry);
        }
        let index = RecordIndex { entries };
        index.check_shape().map_err(invalid)?;
        Ok(index)
    }

    /// Loads the index file `index` describing `data`, and checks it against
    /// `data`'s size (see the [storage module docs](crate::storage)). Either may be a URL.
    pub fn load(data: &Path, index: &Path) -> Result<RecordIndex, IndexError> {
        let bytes = read_whole(index)?;
        let text = String::from_utf8_lossy(&bytes);
        let parsed = RecordIndex::parse(&text, data, index)?;
        let compression = Compression::from_path(data);
        let invalid = |problem| IndexError::Invalid {
            data: data.to_path_buf(),
            index: index.to_path_buf(),
            problem,
        };
        if compression != Compression::None {
            return Err(invalid(IndexProblem::Compressed { compression }));
        }
        let actual = super::size_of(data)?;
        parsed.check_size(actual).map_err(invalid)?;
        Ok(parsed)
    }

    /// The entries tile `0..end` with no gap: first at 0, each where the
    /// previous ended, none under 16 bytes.
    fn check_shape(&self) -> Result<(), IndexProblem> {
        let mut expected = 0u64;
        for (record, &(offset, size)) in self.entries.iter().enumerate() {
            let record = record as u64;
            if offset != expected {
                return Err(IndexProblem::NotContiguous {
                    record,
                    expected,
                    found: offset,
                });
            }
            if size < (HEADER_LEN + FOOTER_LEN) as u64 {
                return Err(IndexProblem::TooSmall { record, size });
            }
            expected = offset.saturating_add(size);
        }
        Ok(())
    }

    /// The entries end exactly at `actual`, the data file's size.
    pub fn check_size(&self, actual: u64) -> Result<(), IndexProblem> {
        let indexed = self.entries.last().map_or(0, |&(o, s)| o + s);
        if indexed != actual {
            return Err(IndexProblem::SizeMismatch { indexed, actual });
        }
        Ok(())
    }

    /// Records indexed.
    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `(offset, framed size)` of record `record`.
    pub fn get(&self, record: u64) -> Option<(u64, u64)> {
        self.entries.get(usize::try_from(record).ok()?).copied()
    }

    /// The byte range of the framed record `record`.
    pub fn range(&self, record: u64) -> Option<Range<u64>> {
        self.get(record).map(|(o, s)| o..o + s)
    }

    /// The entries, `(offset, framed size)` in file order.
    pub fn entries(&self) -> &[(u64, u64)] {
        &self.entries
    }

    /// The index as text, in `tfrecord2idx`'s format.
    pub fn to_text(&self) -> String {
        let mut text = String::with_capacity(self.entries.len() * 16);
        for (offset, size) in &self.entries {
            use std::fmt::Write as _;
            let _ = writeln!(text, "{offset} {size}");
        }
        text
    }

    /// Writes the index to `path` atomically (a local temporary file renamed
    /// into place, or a multipart upload for a URL).
    pub fn write(&self, path: &Path) -> Result<(), IndexError> {
        let text = self.to_text();
        if let Some(url) = url_str(path) {
            return write_object(url, text.as_bytes());
        }
        crate::atomic_file::write(path, text.as_bytes())?;
        Ok(())
    }
}

#[cfg(feature = "object-store")]
fn write_object(url: &str, bytes: &[u8]) -> Result<(), IndexError> {
    use std::io::Write as _;
    let mut writer = super::ObjectWriter::create(url, &super::ReadOptions::default())?;
    writer.write_all(bytes).map_err(|error| IndexError::Io {
        path: PathBuf::from(url),
        error,
    })?;
    writer.finish()?;
    Ok(())
}

#[cfg(not(feature = "object-store"))]
fn write_object(url: &str, _bytes: &[u8]) -> Result<(), IndexError> {
    Err(StorageError::NotBuilt {
        url: url.to_string(),
    }
    .into())
}

/// The whole of a (small) file or object.
fn read_whole(path: &Path) -> Result<Vec<u8>, IndexError> {
    match url_str(path) {
        Some(_) => {
            let size = super::size_of(path)?;
            let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            let mut reader = super::open_object(
                path.to_str().unwrap_or_default(),
                &super::ReadOptions::default(),
            )?;
            io::Read::read_to_end(&mut reader, &mut bytes).map_err(|error| IndexError::Io {
                path: path.to_path_buf(),
                error,
            })?;
            Ok(bytes)
        }
        None => std::fs::read(path).map_err(|error| IndexError::Io {
            path: path.to_path_buf(),
            error,
        }),
    }
}

fn pread_file(file: &std::fs::File, range: Range<u64>) -> io::Result<Vec<u8>> {
    let len = usize::try_from(range.end - range.start)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "range too large"))?;
    let mut buf = vec![0u8; len];
    read_exact_at(file, &mut buf, range.start)?;
    Ok(buf)
}

/// Checks a framed record read at an indexed position and returns its data
/// range within `framed`.
fn check_framed(framed: &[u8]) -> Result<Range<usize>, IndexProblem> {
    let mismatch = |reason: String| IndexProblem::RecordMismatch { reason };
    if framed.len() < HEADER_LEN + FOOTER_LEN {
        return Err(mismatch(format!(
            "{} bytes is shorter than a record frame",
            framed.len()
        )));
    }
    let header: &[u8; HEADER_LEN] = framed[..HEADER_LEN]
        .try_into()
        .map_err(|_| mismatch("short header".into()))?;
    let length = match frame::decode_header(header) {
        Header::Valid(length) => length,
        Header::BadCrc { .. } => {
            return Err(mismatch(
                "no record header here (length CRC mismatch): the index is stale".into(),
            ));
        }
    };
    let expected = (framed.len() - HEADER_LEN - FOOTER_LEN) as u64;
    if length != expected {
        return Err(mismatch(format!(
            "the header says {length} data bytes, the index {expected}: the index is stale"
        )));
    }
    let data = HEADER_LEN..framed.len() - FOOTER_LEN;
    let footer: &[u8; FOOTER_LEN] = framed[data.end..]
        .try_into()
        .map_err(|_| mismatch("short footer".into()))?;
    if let Err((stored, computed)) = frame::check_footer(&framed[data.clone()], footer) {
        return Err(mismatch(format!(
            "data CRC mismatch (stored {stored:#010x}, computed {computed:#010x})"
        )));
    }
    Ok(data)
}

/// A record's place in an [`IndexedFiles`]: the file (its index in the list)
/// and the record within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordId {
    /// Index of the file in the list.
    pub file: usize,
    /// Index of the record in the file.
    pub record: u64,
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file {} record {}", self.file, self.record)
    }
}

struct IndexedFile {
    path: PathBuf,
    /// The path interned, for the records' source positions.
    id: FileId,
    index: RecordIndex,
    /// An open handle for local files (positioned reads need no seek).
    local: Option<std::fs::File>,
}

/// TFRecord files with their indexes: random access by record, exact
/// sharding by record, and the global shuffle. Cheap to clone.
#[derive(Clone)]
pub struct IndexedFiles {
    files: Arc<[IndexedFile]>,
    /// `starts[i]`: the global number of file `i`'s first record; one extra
    /// entry holds the total.
    starts: Arc<[u64]>,
}

impl fmt::Debug for IndexedFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IndexedFiles")
            .field("files", &self.files.len())
            .field("records", &self.len())
            .finish()
    }
}

impl IndexedFiles {
    /// Opens `files` (local paths or URLs, already resolved; see
    /// [`resolve`](super::resolve)) with their index files: `FILE.idx` beside
    /// each, or `DIR/NAME.idx` with `index_dir`. Each index is checked
    /// against its file; a missing index is an error (make them with
    /// `tfpipe index` or [`RecordIndex::build`]).
    pub fn open<P: AsRef<Path>>(
        files: impl IntoIterator<Item = P>,
        index_dir: Option<&Path>,
    ) -> Result<IndexedFiles, IndexError> {
        let mut parts = Vec::new();
        for data in files {
            let data = data.as_ref();
            let index = RecordIndex::load(data, &index_path(data, index_dir))?;
            parts.push((data.to_path_buf(), index));
        }
        IndexedFiles::from_parts(parts)
    }

    /// Files with indexes already at hand (built or loaded by the caller).
    /// Local files are opened now.
    pub fn from_parts(parts: Vec<(PathBuf, RecordIndex)>) -> Result<IndexedFiles, IndexError> {
        let mut starts = Vec::with_capacity(parts.len() + 1);
        let mut total = 0u64;
        let mut files = Vec::with_capacity(parts.len());
        for (path, index) in parts {
            starts.push(total);
            total += index.len();
            let local = match url_str(&path) {
                Some(_) => None,
                None => Some(
                    std::fs::File::open(&path).map_err(|error| RecordError::Open {
                        path: path.clone(),
                        error,
                    })?,
                ),
            };
            let id = FileId::intern(&path);
            files.push(IndexedFile {
                path,
                id,
                index,
                local,
            });
        }
        starts.push(total);
        Ok(IndexedFiles {
            files: files.into(),
            starts: starts.into(),
        })
    }

    /// Records in all files.
    pub fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The files, in order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// The index of file `file`.
    pub fn index(&self, file: usize) -> Option<&RecordIndex> {
        self.files.get(file).map(|f| &f.index)
    }

    /// The position of the `global`-th record (files in order).
    pub fn position(&self, global: u64) -> Option<RecordId> {
        if global >= self.len() {
            return None;
        }
        // The last file whose first record is at or before `global`
        // (empty files share a start with the next and are skipped).
        let file = self.starts.partition_point(|&s| s <= global) - 1;
        Some(RecordId {
            file,
            record: global - self.starts[file],
        })
    }

    /// The global number of a position (the inverse of [`position`](Self::position)).
    pub fn global(&self, position: RecordId) -> Option<u64> {
        let file = self.files.get(position.file)?;
        (position.record < file.index.len()).then(|| self.starts[position.file] + position.record)
    }

    fn locate(&self, position: RecordId) -> Result<(&IndexedFile, Range<u64>), IndexError> {
        let out_of_range = || IndexError::OutOfRange {
            position,
            len: self.len(),
        };
        let file = self.files.get(position.file).ok_or_else(out_of_range)?;
        let range = file.index.range(position.record).ok_or_else(out_of_range)?;
        Ok((file, range))
    }

    /// Reads one record's data, checked against the index and its CRCs.
    pub fn read(&self, position: RecordId) -> Result<Vec<u8>, IndexError> {
        let (file, range) = self.locate(position)?;
        let framed = match &file.local {
            Some(handle) => pread_file(handle, range.clone()).map_err(|error| RecordError::Io {
                location: Location {
                    path: Some(file.path.clone()),
                    record: position.record,
                    offset: range.start,
                },
                error,
            })?,
            None => read_object_range(&file.path, range.clone())?,
        };
        let data = self.check(position, range.start, &framed)?;
        Ok(framed[data].to_vec())
    }

    fn check(
        &self,
        position: RecordId,
        offset: u64,
        framed: &[u8],
    ) -> Result<Range<usize>, IndexError> {
        check_framed(framed).map_err(|problem| IndexError::Record {
            location: Location {
                path: Some(self.files[position.file].path.clone()),
                record: position.record,
                offset,
            },
            problem,
        })
    }

    /// This shard's records, exactly: global records `index`, `index +
    /// num_shards`, ... (files in order). The shards are disjoint, cover every
    /// record, and differ in size by at most one. `None` unless
    /// `index < num_shards`.
    pub fn shard_records(&self, num_shards: u64, index: u64) -> Option<Vec<RecordId>> {
        if num_shards == 0 || index >= num_shards {
            return None;
        }
        Some(
            (index..self.len())
                .step_by(usize::try_from(num_shards).unwrap_or(usize::MAX))
                .filter_map(|g| self.position(g))
                .collect(),
        )
    }

    /// Reads `positions` in the order given, as a pipeline of records, with
    /// `read_ahead` reads in flight (ranged GETs for objects; local files are
    /// read in place with positioned reads).
    pub fn records(&self, positions: Vec<RecordId>, read_ahead: usize) -> Pipeline<Record> {
        let files = self.clone();
        let positions: Arc<[RecordId]> = positions.into();
        Pipeline::from_build(move |env: &Env| {
            let counters = env.stage(0, "indexed");
            Box::new(PositionStream::new(
                files.clone(),
                Order::Fixed(Arc::clone(&positions)),
                read_ahead,
                counters,
                env,
                "indexed",
            )) as Stream<Record>
        })
    }

    /// The global shuffle: every epoch, a full random permutation of all
    /// records across all files (drawn from `seed` and the epoch number),
    /// read by random access with no shuffle buffer. See [`GlobalShuffle`].
    pub fn global_shuffle(&self, seed: u64) -> GlobalShuffle {
        GlobalShuffle {
            files: self.clone(),
            seed,
            shard: None,
            read_ahead: 64,
        }
    }

    pub(crate) fn start_read(&self, position: RecordId) -> Result<InFlight, IndexError> {
        let (file, range) = self.locate(position)?;
        Ok(match &file.local {
            Some(handle) => {
                // Read the framed record straight into a recycled buffer.
                let mut record = Record::new();
                let buf = record.buffer_mut();
                buf.clear();
                buf.resize((range.end - range.start) as usize, 0);
                let read = read_exact_at(handle, buf, range.start).map_err(|error| {
                    IndexError::from(RecordError::Io {
                        location: Location {
                            path: Some(file.path.clone()),
                            record: position.record,
                            offset: range.start,
                        },
                        error,
                    })
                });
                InFlight::Ready(position, range.start, read.map(|()| record))
            }
            None => start_object_read(&file.path, position, range)?,
        })
    }
}

/// A record read that may still be on its way.
pub(crate) enum InFlight {
    /// The framed record, read (locally).
    Ready(RecordId, u64, Result<Record, IndexError>),
    #[cfg(feature = "object-store")]
    Remote(
        RecordId,
        u64,
        super::object::Pending<Result<bytes::Bytes, StorageError>>,
    ),
}

impl InFlight {
    /// Waits for the read, checks the frame, and returns the record's data.
    fn finish(self, files: &IndexedFiles) -> Result<Record, IndexError> {
        let (id, offset) = match &self {
            InFlight::Ready(id, offset, _) => (*id, *offset),
            #[cfg(feature = "object-store")]
            InFlight::Remote(id, offset, _) => (*id, *offset),
        };
        let record = self.finish_data(files)?;
        let file = files.files[id.file].id;
        Ok(record.with_position(RecordPosition::in_file(file, id.record, offset)))
    }

    fn finish_data(self, files: &IndexedFiles) -> Result<Record, IndexError> {
        match self {
            InFlight::Ready(position, offset, framed) => {
                let mut record = framed?;
                let data = files.check(position, offset, &record)?;
                let buf = record.buffer_mut();
                buf.truncate(data.end);
                buf.drain(..data.start);
                Ok(record)
            }
            #[cfg(feature = "object-store")]
            InFlight::Remote(position, offset, pending) => {
                let framed = pending.wait().and_then(|r| r)?;
                let data = files.check(position, offset, &framed)?;
                let mut record = Record::new();
                record.buffer_mut().clear();
                record.buffer_mut().extend_from_slice(&framed[data]);
                Ok(record)
            }
        }
    }
}

fn read_exact_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> io::Result<()> {
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

#[cfg(feature = "object-store")]
fn read_object_range(path: &Path, range: Range<u64>) -> Result<Vec<u8>, IndexError> {
    let url = path.to_str().unwrap_or_default();
    let mut parts = super::object::read_ranges(url, &[range], &super::ReadOptions::default())?;
    Ok(parts.pop().map(|b| b.to_vec()).unwrap_or_default())
}

#[cfg(not(feature = "object-store"))]
fn read_object_range(path: &Path, _range: Range<u64>) -> Result<Vec<u8>, IndexError> {
    Err(StorageError::NotBuilt {
        url: path.display().to_string(),
    }
    .into())
}

#[cfg(feature = "object-store")]
fn start_object_read(
    path: &Path,
    position: RecordId,
    range: Range<u64>,
) -> Result<InFlight, IndexError> {
    // One RangeReader per file would be cheaper; the store lookup is a hash
    // probe, small next to a GET.
    let url = path.to_str().unwrap_or_default();
    let reader = super::object::RangeReader::new(url, super::ReadOptions::default())?;
    let offset = range.start;
    Ok(InFlight::Remote(position, offset, reader.start(range)))
}

#[cfg(not(feature = "object-store"))]
fn start_object_read(
    path: &Path,
    _position: RecordId,
    _range: Range<u64>,
) -> Result<InFlight, IndexError> {
    Err(StorageError::NotBuilt {
        url: path.display().to_string(),
    }
    .into())
}

/// A global-shuffle source: each epoch reads every record (or this shard's
/// share) once, in a uniformly random order across all files, by random
/// access through the index (the Grain / ArrayRecord way). Memory is one
/// permutation (8 bytes per record) and the reads in flight, not a buffer of
/// records.
///
/// ```
/// use tfpipe::storage::{IndexedFiles, RecordIndex};
/// use tfpipe::tfrecord::{Compression, FileRecordWriter};
///
/// let dir = tempfile::tempdir()?;
/// let mut parts = Vec::new();
/// for f in 0..3u8 {
///     let path = dir.path().join(format!("part-{f}.tfrecord"));
///     let mut writer = FileRecordWriter::create(&path, Compression::None)?;
///     for r in 0..5u8 {
///         writer.write_record(&[f, r])?;
///     }
///     writer.finish()?;
///     parts.push((path.clone(), RecordIndex::build(&path)?));
/// }
/// let files = IndexedFiles::from_parts(parts)?;
/// let records: Vec<Vec<u8>> = files
///     .global_shuffle(7)
///     .pipeline()
///     .start()?
///     .map(|r| r.map(|r| r.to_vec()))
///     .collect::<Result<_, _>>()?;
/// assert_eq!(records.len(), 15);
/// let mut sorted = records.clone();
/// sorted.sort();
/// assert_ne!(records, sorted); // shuffled across files...
/// assert_eq!(sorted[0], [0, 0]); // ...and every record is there once
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct GlobalShuffle {
    files: IndexedFiles,
    seed: u64,
    shard: Option<(u64, u64)>,
    read_ahead: usize,
}

impl GlobalShuffle {
    /// Keeps shard `index` of `num_shards` of each epoch's permutation
    /// (positions `index`, `index + num_shards`, ... of it): the shards are
    /// disjoint and together read every record once per epoch. Needs
    /// `index < num_shards` (else [`Pipeline::start`] fails).
    pub fn shard(mut self, num_shards: u64, index: u64) -> GlobalShuffle {
        self.shard = Some((num_shards, index));
        self
    }

    /// Reads in flight at once. Matters for object storage, where each record
    /// is a ranged GET; local files are read in place. By default 64.
    pub fn read_ahead(mut self, reads: usize) -> GlobalShuffle {
        self.read_ahead = reads.max(1);
        self
    }

    /// The permutation of global record numbers for `epoch` (this shard's part).
    pub fn order(&self, epoch: u64) -> Vec<u64> {
        permutation(self.files.len(), self.seed, epoch, self.shard)
    }

    /// The records as a pipeline; under [`Pipeline::repeat`] each epoch draws
    /// a new permutation.
    pub fn pipeline(&self) -> Pipeline<Record> {
        let bad = matches!(self.shard, Some((n, i)) if n == 0 || i >= n);
        let shard = self.shard;
        let this = self.clone();
        Pipeline::from_build(move |env: &Env| {
            let counters = env.stage(0, "global_shuffle");
            let order = permutation(this.files.len(), this.seed, env.epoch, this.shard);
            Box::new(PositionStream::new(
                this.files.clone(),
                Order::Global(order.into()),
                this.read_ahead,
                counters,
                env,
                "global_shuffle",
            )) as Stream<Record>
        })
        .invalid_if(bad, move || {
            let (n, i) = shard.unwrap_or_default();
            format!("global_shuffle shard({n}, {i}): needs num_shards > 0 and index < num_shards")
        })
    }
}

/// A Fisher-Yates permutation of `0..len` from `(seed, epoch)`, then the
/// shard's share of it.
fn permutation(len: u64, seed: u64, epoch: u64, shard: Option<(u64, u64)>) -> Vec<u64> {
    let mut order: Vec<u64> = (0..len).collect();
    let mut rng = SplitMix64(seed ^ epoch.wrapping_mul(0xA076_1D64_78BD_642F));
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    match shard {
        Some((n, i)) if n > 0 && i < n => order
            .into_iter()
            .skip(usize::try_from(i).unwrap_or(usize::MAX))
            .step_by(usize::try_from(n).unwrap_or(usize::MAX))
            .collect(),
        _ => order,
    }
}

/// SplitMix64 (Steele, Lea and Flood, OOPSLA 2014), as in `shuffle`.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

enum Order {
    Fixed(Arc<[RecordId]>),
    Global(Arc<[u64]>),
}

/// Reads records by position, `read_ahead` in flight.
///
/// Its state is the number of records emitted: the order is fixed by the
/// positions given or by `(seed, epoch)`, so a restore starts reading at
/// that place in the order (no record is read twice or skipped).
struct PositionStream {
    files: IndexedFiles,
    order: Order,
    /// The next place in `order` to start a read for.
    next: usize,
    /// Records (and errors) returned so far, counting those before a restore.
    emitted: u64,
    stage: &'static str,
    read_ahead: usize,
    in_flight: std::collections::VecDeque<InFlight>,
    counters: Arc<crate::metrics::StageCounters>,
    env: Env,
    done: bool,
}

impl PositionStream {
    fn new(
        files: IndexedFiles,
        order: Order,
        read_ahead: usize,
        counters: Arc<crate::metrics::StageCounters>,
        env: &Env,
        stage: &'static str,
    ) -> PositionStream {
        let emitted = match env.resume_state().map(|s| s.data::<Emitted>(stage)) {
            Some(Ok(e)) => e.emitted,
            Some(Err(error)) => {
                env.restore_failed(error);
                0
            }
            None => 0,
        };
        PositionStream {
            files,
            order,
            next: usize::try_from(emitted).unwrap_or(usize::MAX),
            emitted,
            stage,
            read_ahead: read_ahead.max(1),
            in_flight: std::collections::VecDeque::new(),
            counters,
            env: env.clone(),
            done: false,
        }
    }

    fn position_at(&self, i: usize) -> Option<RecordId> {
        match &self.order {
            Order::Fixed(p) => p.get(i).copied(),
            Order::Global(g) => g.get(i).and_then(|&g| self.files.position(g)),
        }
    }

    fn len(&self) -> usize {
        match &self.order {
            Order::Fixed(p) => p.len(),
            Order::Global(g) => g.len(),
        }
    }

    fn error(&self, error: IndexError) -> Event<Record> {
        self.counters.add_error();
        Event::Item(Err(PipelineError::Index {
            stage: self.counters.name().to_string(),
            error,
        }))
    }
}

impl Iterator for PositionStream {
    type Item = Event<Record>;

    fn next(&mut self) -> Option<Event<Record>> {
        if self.done || self.env.cancelled() {
            return None;
        }
        let start = std::time::Instant::now();
        while self.in_flight.len() < self.read_ahead && self.next < self.len() {
            let Some(position) = self.position_at(self.next) else {
                break;
            };
            self.next += 1;
            match self.files.start_read(position) {
                Ok(read) => self.in_flight.push_back(read),
                Err(e) => {
                    self.done = true;
                    self.emitted += 1;
                    return Some(self.error(e));
                }
            }
        }
        let Some(read) = self.in_flight.pop_front() else {
            self.done = true;
            return None;
        };
        self.emitted += 1;
        let out = match read.finish(&self.files) {
            Ok(record) => {
                self.counters
                    .add_in(1, (record.len() + HEADER_LEN + FOOTER_LEN) as u64);
                self.counters.add_out(1, record.len() as u64);
                Event::Item(Ok(record))
            }
            Err(e) => self.error(e),
        };
        self.counters.add_busy(start.elapsed());
        Some(out)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Emitted {
    emitted: u64,
}

impl StageStream<Record> for PositionStream {
    fn save(&self) -> Result<StageState, StateError> {
        Ok(StageState::new(
            self.stage,
            serde_json::json!(Emitted {
                emitted: self.emitted
            }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tfrecord::RecordWriter;

    fn framed(records: &[&[u8]]) -> Vec<u8> {
        let mut writer = RecordWriter::new(Vec::new(), Compression::None);
        for r in records {
            writer.write_record(r).unwrap();
        }
        writer.finish().unwrap()
    }

    #[test]
    fn index_of_a_stream_tiles_it() {
        let bytes = framed(&[b"a", b"", b"hello"]);
        let reader = crate::tfrecord::RecordReader::new(&bytes[..], ReaderOptions::default());
        let index = RecordIndex::from_reader(reader).unwrap();
        assert_eq!(index.entries(), &[(0, 17), (17, 16), (33, 21)]);
        assert_eq!(index.to_text(), "0 17\n17 16\n33 21\n");
        index.check_size(bytes.len() as u64).unwrap();
        let p = Path::new("d");
        assert_eq!(RecordIndex::parse(&index.to_text(), p, p).unwrap(), index);
    }

    #[test]
    fn malformed_and_gapped_indexes_are_rejected() {
        let p = Path::new("d");
        let err = RecordIndex::parse("0 17\nx 3\n", p, p).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        let err = RecordIndex::parse("0 17\n18 16\n", p, p).unwrap_err();
        assert!(
            err.to_string().contains("entry 1 starts at byte 18"),
            "{err}"
        );
        let err = RecordIndex::parse("0 3\n", p, p).unwrap_err();
        assert!(err.to_string().contains("less than the 16 bytes"), "{err}");
        let index = RecordIndex::parse("0 17\n17 16\n", p, p).unwrap();
        let problem = index.check_size(40).unwrap_err();
        assert_eq!(
            problem,
            IndexProblem::SizeMismatch {
                indexed: 33,
                actual: 40
            }
        );
    }

    #[test]
    fn framed_records_are_checked_against_the_index() {
        let bytes = framed(&[b"abc", b"defg"]);
        assert_eq!(check_framed(&bytes[..19]).unwrap(), 12..15);
        // Off by one record: the bytes at the offset are not a header.
        assert!(check_framed(&bytes[1..20]).is_err());
        // Wrong size: the header's length disagrees.
        let err = check_framed(&bytes[..20]).unwrap_err();
        assert!(err.to_string().contains("stale"), "{err}");
        let mut corrupt = bytes[..19].to_vec();
        corrupt[13] ^= 1;
        let err = check_framed(&corrupt).unwrap_err();
        assert!(err.to_string().contains("data CRC"), "{err}");
    }

    #[test]
    fn permutations_cover_every_record_and_shards_partition_them() {
        let full = permutation(1000, 3, 0, None);
        let mut sorted = full.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(full, permutation(1000, 3, 1, None), "epochs reshuffle");
        let mut union: Vec<u64> = (0..3)
            .flat_map(|i| permutation(1000, 3, 0, Some((3, i))))
            .collect();
        union.sort_unstable();
        assert_eq!(union, sorted);
    }
}
