//! Reading framed records from any byte stream, checking both CRCs.
//!
//! Invariants: `buf[pos..end]` holds bytes read from the stream but not yet
//! consumed; `offset` is the uncompressed-stream offset of `buf[pos]`, which is
//! always the start of the next record. The buffer grows only as bytes actually
//! arrive, so a corrupt length never makes us allocate more than the stream holds.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::compression::Compression;
use super::frame::{self, FOOTER_LEN, HEADER_LEN, Header};
use super::{Corruption, CorruptionKind, RecordError};
use crate::error::Location;

/// What the reader does when a record is corrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnCorruption {
    /// Return the error and stop (the reader is fused afterwards). The default.
    #[default]
    Fail,
    /// Skip a record whose data CRC fails and go on (the framing is intact);
    /// a bad length CRC or a truncation ends the stream. Every skip is counted.
    Skip,
    /// End the stream quietly at the first corruption, counted: what
    /// TensorFlow's `ignore_errors()` does with a `TFRecordDataset`.
    EndStream,
}

/// How a [`RecordReader`] reads.
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    /// The compression; `None` infers it from the file name in
    /// [`RecordReader::open`] and means uncompressed for streams. By default `None`.
    pub compression: Option<Compression>,
    /// Verify the data CRC of each record. The length CRC is always checked,
    /// since a wrong length loses the framing. By default `true`.
    pub check_data_crc: bool,
    /// What to do with corrupt records. By default [`OnCorruption::Fail`].
    pub on_corruption: OnCorruption,
    /// Records longer than this are reported as corrupt rather than read.
    /// By default 1 GiB.
    pub max_record_len: u64,
    /// Bytes requested from the underlying stream per read. By default 1 MiB.
    pub buffer_size: usize,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            compression: None,
            check_data_crc: true,
            on_corruption: OnCorruption::Fail,
            max_record_len: 1 << 30,
            buffer_size: 1 << 20,
        }
    }
}

/// Where a reader stands: the index and uncompressed offset of the next record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    /// Records consumed so far, skipped ones included.
    pub record: u64,
    /// Uncompressed bytes consumed so far.
    pub offset: u64,
}

/// Reads TFRecord records from a byte stream.
///
/// ```
/// use tfpipe::tfrecord::{RecordReader, RecordWriter, Compression, ReaderOptions};
///
/// let mut writer = RecordWriter::new(Vec::new(), Compression::None);
/// writer.write_record(b"first")?;
/// writer.write_record(b"second")?;
/// let bytes = writer.finish()?;
///
/// let mut reader = RecordReader::new(&bytes[..], ReaderOptions::default());
/// let mut record = Vec::new();
/// while reader.read_record(&mut record)? {
///     println!("{} bytes", record.len());
/// }
/// assert_eq!(reader.position().record, 2);
/// # Ok::<(), tfpipe::tfrecord::RecordError>(())
/// ```
pub struct RecordReader<R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    eof: bool,
    fused: bool,
    path: Option<Arc<Path>>,
    position: Position,
    options: ReaderOptions,
    corruptions: Vec<Corruption>,
}

/// A reader over a file, decompressing as needed.
pub type FileRecordReader = RecordReader<Box<dyn Read + Send>>;

impl FileRecordReader {
    /// Opens `path`, with the compression from `options` or else from its name.
    /// `path` may also be an object-store URL (`s3://bucket/key`, see
    /// [`crate::storage`]).
    pub fn open(path: impl AsRef<Path>, options: ReaderOptions) -> Result<Self, RecordError> {
        crate::storage::open_records(path, options)
    }

    /// Opens the local file `path` (never a URL), with the compression from
    /// `options` or else from its name.
    pub fn open_local(path: impl AsRef<Path>, options: ReaderOptions) -> Result<Self, RecordError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| RecordError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let compression = options
            .compression
            .unwrap_or_else(|| Compression::from_path(path));
        let mut reader = RecordReader::new(compression.decoder(file), options);
        reader.path = Some(Arc::from(path));
        Ok(reader)
    }
}

impl<'a> RecordReader<Box<dyn Read + Send + 'a>> {
    /// Reads records from a possibly compressed stream: `options.compression`
    /// says how (`None`: uncompressed).
    pub fn decoding<R: Read + Send + 'a>(inner: R, options: ReaderOptions) -> Self {
        let compression = options.compression.unwrap_or_default();
        RecordReader::new(compression.decoder(inner), options)
    }
}

impl<R: Read> RecordReader<R> {
    /// Reads records from `inner`, which yields the framed records themselves
    /// (already decompressed; see [`RecordReader::decoding`] otherwise).
    /// `options.compression` is not used here.
    pub fn new(inner: R, options: ReaderOptions) -> Self {
        RecordReader {
            inner,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            eof: false,
            fused: false,
            path: None,
            position: Position::default(),
            options,
            corruptions: Vec::new(),
        }
    }

    /// Names the stream in error messages (for a reader not made by `open`).
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(Arc::from(path.into()));
        self
    }

    /// The file this reader reads, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The index and offset of the next record.
    pub fn position(&self) -> Position {
        self.position
    }

    /// The corrupt records skipped so far under [`OnCorruption::Skip`] or
    /// [`OnCorruption::EndStream`].
    pub fn corruptions(&self) -> &[Corruption] {
        &self.corruptions
    }

    /// Reads the next record into `record` (cleared first). `Ok(false)` at the
    /// end of the stream. Once `record` has grown to the largest record, this
    /// allocates nothing.
    pub fn read_record(&mut self, record: &mut Vec<u8>) -> Result<bool, RecordError> {
        record.clear();
        match self.next_record()? {
            Some(data) => {
                record.extend_from_slice(data);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The next record, borrowed from the reader's buffer until the next call:
    /// the zero-copy path. `Ok(None)` at the end of the stream.
    pub fn next_record(&mut self) -> Result<Option<&[u8]>, RecordError> {
        loop {
            if self.fused {
                return Ok(None);
            }
            let record_start = self.position.offset;
            let available = self.fill(HEADER_LEN)?;
            if available == 0 {
                return Ok(None);
            }
            if available < HEADER_LEN {
                self.corrupt(record_start, CorruptionKind::TruncatedHeader { available })?;
                continue;
            }
            let header: &[u8; HEADER_LEN] = self.buf[self.pos..self.pos + HEADER_LEN]
                .try_into()
                .expect("header slice");
            let length = match frame::decode_header(header) {
                Header::Valid(length) => length,
                Header::BadCrc {
                    length,
                    stored,
                    computed,
                } => {
                    let kind = CorruptionKind::LengthCrc {
                        length,
                        stored,
                        computed,
                    };
                    self.corrupt(record_start, kind)?;
                    continue;
                }
            };
            // The framed size must fit in memory at all, whatever the limit says.
            let fits = usize::try_from(length)
                .ok()
                .filter(|&len| len <= usize::MAX - HEADER_LEN - FOOTER_LEN);
            let (len, framed) = match fits {
                Some(len) if length <= self.options.max_record_len => (len, frame::framed_len(len)),
                _ => {
                    let limit = self
                        .options
                        .max_record_len
                        .min((usize::MAX - HEADER_LEN - FOOTER_LEN) as u64);
                    self.corrupt(
                        record_start,
                        CorruptionKind::ImplausibleLength { length, limit },
                    )?;
                    continue;
                }
            };
            let available = self.fill(framed)?;
            if available < framed {
                let kind = CorruptionKind::TruncatedData {
                    length,
                    available: available.saturating_sub(HEADER_LEN) as u64,
                };
                self.corrupt(record_start, kind)?;
                continue;
            }
            let data_start = self.pos + HEADER_LEN;
            let data_end = data_start + len;
            if self.options.check_data_crc {
                let data = &self.buf[data_start..data_end];
                let footer: &[u8; FOOTER_LEN] = self.buf[data_end..data_end + FOOTER_LEN]
                    .try_into()
                    .expect("footer slice");
                if let Err((stored, computed)) = frame::check_footer(data, footer) {
                    let kind = CorruptionKind::DataCrc {
                        length,
                        stored,
                        computed,
                    };
                    // TensorFlow reports a data CRC failure at the data's offset.
                    let data_offset = record_start + HEADER_LEN as u64;
                    if self.options.on_corruption == OnCorruption::Skip {
                        let location = self.location(data_offset);
                        self.corruptions.push(Corruption { location, kind });
                        self.consume(framed);
                    } else {
                        self.corrupt(data_offset, kind)?;
                    }
                    continue;
                }
            }
            self.consume(framed);
            return Ok(Some(&self.buf[data_start..data_end]));
        }
    }

    /// Consumes the reader, yielding owned records.
    pub fn into_records(self) -> Records<R> {
        Records { reader: self }
    }

    fn consume(&mut self, framed: usize) {
        self.pos += framed;
        self.position.offset += framed as u64;
        self.position.record += 1;
    }

    fn location(&self, offset: u64) -> Location {
        Location {
            path: self.path.as_deref().map(Path::to_path_buf),
            record: self.position.record,
            offset,
        }
    }

    /// Fuses the reader and either fails or records the corruption, by policy.
    fn corrupt(&mut self, offset: u64, kind: CorruptionKind) -> Result<(), RecordError> {
        self.fused = true;
        let location = self.location(offset);
        match self.options.on_corruption {
            OnCorruption::Fail => Err(RecordError::Corrupt { location, kind }),
            OnCorruption::Skip | OnCorruption::EndStream => {
                self.corruptions.push(Corruption { location, kind });
                Ok(())
            }
        }
    }

    /// Reads until `need` unconsumed bytes are buffered or the stream ends;
    /// returns how many are buffered.
    fn fill(&mut self, need: usize) -> Result<usize, RecordError> {
        while self.end - self.pos < need && !self.eof {
            if self.pos.saturating_add(need) > self.buf.len() && self.pos > 0 {
                self.buf.copy_within(self.pos..self.end, 0);
                self.end -= self.pos;
                self.pos = 0;
            }
            if self.end == self.buf.len() {
                // Grow by at most what is buffered (or one read), so the
                // allocation tracks the bytes that really arrived.
                let step = self.buf.len().max(self.options.buffer_size.max(HEADER_LEN));
                let target = self.pos.saturating_add(need).max(self.options.buffer_size);
                let new_len = target.min(self.buf.len().saturating_add(step));
                self.buf.resize(new_len, 0);
            }
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    self.fused = true;
                    let location = self.location(self.position.offset);
                    return Err(RecordError::Io { location, source });
                }
            }
        }
        Ok(self.end - self.pos)
    }
}

/// An iterator of owned records; see [`RecordReader::into_records`].
pub struct Records<R> {
    reader: RecordReader<R>,
}

impl<R> Records<R> {
    /// The reader, for its position and corruption counts.
    pub fn reader(&self) -> &RecordReader<R> {
        &self.reader
    }
}

impl<R: Read> Iterator for Records<R> {
    type Item = Result<Vec<u8>, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.reader
            .next_record()
            .map(|record| record.map(<[u8]>::to_vec))
            .transpose()
    }
}
