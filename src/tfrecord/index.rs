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
//! use tfpipe::{IndexedFiles, RecordIndex};
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
//! index.write(&tfpipe::index_path(&path, None))?;
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

use super::frame::{self, FOOTER_LEN, HEADER_LEN, ReadAtError};
use super::{
    Compression, CorruptionKind, FileRecordReader, ReaderOptions, RecordError, RecordReader,
};
use crate::error::Location;
use crate::storage::{self, StorageError};

/// What is wrong with an index, or with a record read through one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexProblem {
    /// A line is not `OFFSET SIZE`.
    #[error("line {line}: expected `OFFSET SIZE`, found {text:?}")]
    Malformed {
        /// The line, from 1.
        line: usize,
        /// The line as it is.
        text: String,
    },
    /// An entry does not start where the previous one ended.
    #[error(
        "entry {record} starts at byte {found}, but the previous record ends at byte {expected}"
    )]
    NotContiguous {
        /// The record's index.
        record: u64,
        /// The offset the previous record ends at.
        expected: u64,
        /// The offset the index records.
        found: u64,
    },
    /// An entry ends beyond 2^64 bytes.
    #[error("entry {record} ends beyond 2^64 bytes")]
    Overflow {
        /// The record's index.
        record: u64,
    },
    /// An entry is smaller than an empty record's 16 bytes.
    #[error("entry {record} has size {size}, less than the 16 bytes of an empty record")]
    TooSmall {
        /// The record's index.
        record: u64,
        /// The size the index records.
        size: u64,
    },
    /// The entries do not end where the data file does.
    #[error(
        "the index covers {indexed} bytes but the data file has {actual} (stale index, or truncated data or index)"
    )]
    SizeMismatch {
        /// The file size the index records.
        indexed: u64,
        /// The file size now.
        actual: u64,
    },
    /// The record at an indexed offset does not match the index.
    #[error("the record at the indexed offset does not match the index: {reason}")]
    RecordMismatch {
        /// What is wrong.
        reason: String,
    },
    /// The data file holds another number of records than the index
    /// lists (rewritten in place at the same size).
    #[error(
        "the index lists {indexed} records from record {first} on, but the data file has {found} (stale index: rebuild it)"
    )]
    CountMismatch {
        /// The first record counted.
        first: u64,
        /// The records the index lists from there.
        indexed: u64,
        /// The records read from there.
        found: u64,
    },
    /// The data file is compressed.
    #[error(
        "{compression}-compressed files cannot be indexed (there are no byte offsets to seek to)"
    )]
    Compressed {
        /// The compression found.
        compression: Compression,
    },
}

/// Errors building, loading, checking or using a record index.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// The index disagrees with itself or with its data file.
    #[error("{}: {problem} (index {})", data.display(), index.display())]
    Invalid {
        /// The data file.
        data: PathBuf,
        /// The index file.
        index: PathBuf,
        /// What is wrong.
        problem: IndexProblem,
    },
    /// A record read through the index is not where or what the index says.
    #[error("{location}: {problem}")]
    Record {
        /// The record.
        location: Location,
        /// What is wrong.
        problem: IndexProblem,
    },
    /// The index file could not be read or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: io::Error,
    },
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
    OutOfRange {
        /// The position asked for.
        position: RecordId,
        /// The number of records there are.
        len: u64,
    },
}

impl IndexError {
    /// Whether the error is about the data or its index (a corrupt or
    /// misplaced record, a malformed or stale index) rather than the system
    /// (a file that cannot be read): the command line exits 1 for these.
    pub fn is_data_error(&self) -> bool {
        match self {
            IndexError::Invalid { .. } | IndexError::Record { .. } => true,
            IndexError::Read(e) => e.is_corruption(),
            _ => false,
        }
    }

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
/// an uncompressed TFRecord file and how long it is, in DALI's `tfrecord2idx`
/// format. An index is checked against its data file before use (the
/// entries must tile it exactly), and every record read through it is checked
/// again (header, length and data CRC), so a stale index is an error, never
/// trusted.
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
        mut reader: RecordReader<R>,
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
    /// `data`'s size. Either may be a URL.
    pub fn load(data: &Path, index: &Path) -> Result<RecordIndex, IndexError> {
        let bytes = storage::read_whole(index)?;
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
        let actual = storage::size_of(data)?;
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
            expected = offset
                .checked_add(size)
                .ok_or(IndexProblem::Overflow { record })?;
        }
        Ok(())
    }

    /// The entries end exactly at `actual`, the data file's size.
    pub fn check_size(&self, actual: u64) -> Result<(), IndexProblem> {
        // Every entry ends before 2^64 (`check_shape`, or a real file's records).
        let indexed = self.entries.last().map_or(0, |&(o, s)| o.saturating_add(s));
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
        self.get(record)
            .and_then(|(o, s)| Some(o..o.checked_add(s)?))
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
        if storage::is_url(path) {
            return write_object(path, text.as_bytes());
        }
        crate::atomic_file::write(path, text.as_bytes())?;
        Ok(())
    }
}

/// Uploads a small index to the object at `path`.
#[cfg(feature = "object-store")]
fn write_object(path: &Path, bytes: &[u8]) -> Result<(), IndexError> {
    storage::PendingObject::upload(&path.to_string_lossy(), bytes)?.complete()?;
    Ok(())
}

#[cfg(not(feature = "object-store"))]
fn write_object(path: &Path, _bytes: &[u8]) -> Result<(), IndexError> {
    Err(StorageError::NotBuilt {
        url: path.display().to_string(),
    }
    .into())
}

/// Checks a framed record read at an indexed position and returns its data
/// range within `framed`.
fn check_framed(framed: &[u8]) -> Result<Range<usize>, IndexProblem> {
    let mismatch = |reason: String| IndexProblem::RecordMismatch { reason };
    let indexed = framed.len().saturating_sub(HEADER_LEN + FOOTER_LEN);
    let stale = |length: u64| {
        mismatch(format!(
            "the header says {length} data bytes, the index {indexed}: the index is stale"
        ))
    };
    let data = frame::parse_framed(framed, u64::MAX).map_err(|kind| match kind {
        CorruptionKind::TruncatedHeader { .. } => mismatch(format!(
            "{} bytes is shorter than a record frame",
            framed.len()
        )),
        CorruptionKind::LengthCrc { .. } => {
            mismatch("no record header here (length CRC mismatch): the index is stale".into())
        }
        CorruptionKind::TruncatedData { length, .. } => stale(length),
        CorruptionKind::DataCrc {
            stored, computed, ..
        } => mismatch(format!(
            "data CRC mismatch (stored {stored:#010x}, computed {computed:#010x})"
        )),
        other => mismatch(other.to_string()),
    })?;
    if data.end + FOOTER_LEN != framed.len() {
        return Err(stale(data.len() as u64));
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
    index: RecordIndex,
    /// An open handle for local files (positioned reads need no seek).
    local: Option<std::fs::File>,
}

/// TFRecord files with their indexes: random access by record, exact
/// sharding by record, and (in the pipeline layer) the global shuffle,
/// [`IndexedFiles::global_shuffle`].
/// Cheap to clone.
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
    /// [`resolve`](crate::storage::resolve)) with their index files: `FILE.idx` beside
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
            let local = match storage::is_url(&path) {
                true => None,
                false => Some(
                    std::fs::File::open(&path).map_err(|error| RecordError::Open {
                        path: path.clone(),
                        error,
                    })?,
                ),
            };
            files.push(IndexedFile { path, index, local });
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

    /// The file holding `position` and the byte range of its framed record.
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
        let mut framed = Vec::new();
        let data = match file.local {
            Some(_) => self.read_local(position, &mut framed)?,
            None => {
                framed = storage::read_ranges(&file.path, std::slice::from_ref(&range))?
                    .pop()
                    .unwrap_or_default();
                self.check(position, range.start, &framed)?
            }
        };
        framed.truncate(data.end);
        framed.drain(..data.start);
        Ok(framed)
    }

    /// Whether the file holding `position` is local (read in place by
    /// [`read_local`](Self::read_local)) rather than an object.
    pub(crate) fn is_local(&self, position: RecordId) -> bool {
        self.files
            .get(position.file)
            .is_some_and(|f| f.local.is_some())
    }

    /// Reads the framed record at `position` of a local file into `buf`
    /// (resized to it) with one positioned read, checks it against the index
    /// and its CRCs, and returns the data's range within `buf`. For an object,
    /// the caller reads the range itself and calls [`check`](Self::check).
    pub(crate) fn read_local(
        &self,
        position: RecordId,
        buf: &mut Vec<u8>,
    ) -> Result<Range<usize>, IndexError> {
        let (file, range) = self.locate(position)?;
        let location = || Location {
            path: Some(file.path.clone()),
            record: position.record,
            offset: range.start,
        };
        let Some(handle) = &file.local else {
            let error = io::Error::new(io::ErrorKind::Unsupported, "not a local file");
            return Err(RecordError::Io {
                location: location(),
                error,
            }
            .into());
        };
        let framed_len = range.end - range.start;
        match frame::read_framed_at(handle, range.start, Some(framed_len), u64::MAX, buf) {
            // The index's size must be the record's too.
            Ok(data) if data.end + FOOTER_LEN == buf.len() => Ok(data),
            // `check` says what is wrong, as the index sees it.
            Ok(_) | Err(ReadAtError::Corrupt(_)) => self.check(position, range.start, buf),
            Err(ReadAtError::Io(error)) => Err(RecordError::Io {
                location: location(),
                error,
            }
            .into()),
        }
    }

    /// The byte range of the framed record at `position`, and the path of its file.
    pub(crate) fn framed_range(
        &self,
        position: RecordId,
    ) -> Result<(&Path, Range<u64>), IndexError> {
        self.locate(position).map(|(f, r)| (f.path.as_path(), r))
    }

    /// Checks a framed record read at `offset` for `position`; the data's range in it.
    pub(crate) fn check(
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
}

#[cfg(test)]
mod tests {
    use super::super::RecordWriter;
    use super::*;

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
        let reader = RecordReader::new(&bytes[..], ReaderOptions::default());
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
        // Entries that overflow 64 bits used to pass and then panic on read.
        let err = RecordIndex::parse("0 18446744073709551615\n18446744073709551615 17\n", p, p)
            .unwrap_err();
        assert!(err.to_string().contains("beyond 2^64"), "{err}");
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
}
