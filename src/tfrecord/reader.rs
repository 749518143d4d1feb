//! Reading framed records from any byte stream, checking both CRCs.
//!
//! Invariants: `buf[pos..end]` holds bytes read from the stream but not yet
//! consumed; `offset` is the uncompressed-stream offset of `buf[pos]`, which is
//! always the start of the next record. The buffer grows only as bytes actually
//! arrive, so a corrupt length never makes us allocate more than the stream holds.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::compression::Compression;
use super::frame::{self, FOOTER_LEN, HEADER_LEN, Header};
use super::inflate::Format;
use super::{Corruption, CorruptionKind, DecodeError, RecordError};
use crate::error::Location;
use crate::storage::{self, ReadOptions, StorageError};

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
    /// Bytes requested from the underlying stream per read. By default
    /// 128 KiB: small enough that the read buffers of the files an
    /// interleave keeps open, and the records copied out of them, stay in a
    /// core's L2 cache while the kernel copies the next read in. With 1 MiB
    /// the pipeline benchmark (4 files open, 2 cores) ran 1.14x slower and
    /// spent 1.13x the CPU (docs/benchmarks.md, "Read size"); a reader alone
    /// reads as fast with either. A record longer than this grows the buffer
    /// to fit it.
    pub buffer_size: usize,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            compression: None,
            check_data_crc: true,
            on_corruption: OnCorruption::Fail,
            max_record_len: 1 << 30,
            buffer_size: 128 << 10,
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
    /// The first [`MAX_CORRUPTIONS_KEPT`] corruptions skipped or ended at.
    corruptions: Vec<Corruption>,
    /// All of them, kept or not.
    corruption_count: u64,
    /// A read error that came with (or after) bytes still buffered: returned
    /// once every complete record before it has been delivered.
    pending: Option<RecordError>,
}

/// How many skipped corruptions a reader keeps with their locations; beyond
/// that they are only counted ([`RecordReader::corruption_count`]).
pub const MAX_CORRUPTIONS_KEPT: usize = 16;

/// A reader over a file, decompressing as needed.
pub type FileRecordReader = RecordReader<Box<dyn Read + Send>>;

impl FileRecordReader {
    /// Opens `path`, with the compression from `options` or else from its
    /// name. A file whose name says uncompressed but whose content starts
    /// like GZIP or ZLIB (and not like a TFRecord header) is read as such.
    /// `path` may also be an object-store URL (`s3://bucket/key`, see
    /// [`crate::storage`]), read with [`ReadOptions::default`].
    pub fn open(path: impl AsRef<Path>, options: ReaderOptions) -> Result<Self, RecordError> {
        FileRecordReader::open_with(path, options, &ReadOptions::default())
    }

    /// [`open`](Self::open) with explicit object-read settings (range size,
    /// read-ahead, retries).
    pub fn open_with(
        path: impl AsRef<Path>,
        options: ReaderOptions,
        read: &ReadOptions,
    ) -> Result<Self, RecordError> {
        let path = path.as_ref();
        let input = storage::open(path, 0, read).map_err(|e| open_error(path, e))?;
        FileRecordReader::from_start(path, input, options)
    }

    /// [`open_with`](Self::open_with) of an object whose first GET
    /// [`storage::open_ahead`] already sent.
    pub(crate) fn open_started(
        path: &Path,
        options: ReaderOptions,
        ahead: storage::OpenAhead,
    ) -> Result<Self, RecordError> {
        let input = storage::open_started(ahead).map_err(|e| open_error(path, e))?;
        FileRecordReader::from_start(path, input, options)
    }

    /// The records of `input`, `path`'s bytes from its start: compression
    /// from `options`, else from the name, else sniffed from the first bytes.
    fn from_start(
        path: &Path,
        mut input: storage::ByteStream,
        options: ReaderOptions,
    ) -> Result<Self, RecordError> {
        let compression = match options.compression {
            Some(compression) => compression,
            None => match Compression::from_path(path) {
                Compression::None => {
                    let head = read_head(&mut input).map_err(|error| RecordError::Open {
                        path: path.to_path_buf(),
                        error,
                    })?;
                    let compression = sniff_compression(&head);
                    input = Box::new(io::Cursor::new(head).chain(input));
                    compression
                }
                named => named,
            },
        };
        let options = ReaderOptions {
            compression: Some(compression),
            ..options
        };
        Ok(FileRecordReader::decoding(input, options).with_path(path))
    }

    /// Opens `path` positioned at `position` (the index and uncompressed
    /// offset of a record's frame, as [`position`](RecordReader::position)
    /// reported): an uncompressed file or object is read from that byte on;
    /// a compressed one is decompressed from the start and the records before
    /// it are read and dropped (checking their CRCs), since a compressed
    /// stream cannot seek.
    pub fn open_at(
        path: impl AsRef<Path>,
        options: ReaderOptions,
        position: Position,
    ) -> Result<Self, RecordError> {
        FileRecordReader::open_at_with(path, options, position, &ReadOptions::default())
    }

    /// [`open_at`](Self::open_at) with explicit object-read settings.
    pub fn open_at_with(
        path: impl AsRef<Path>,
        options: ReaderOptions,
        position: Position,
        read: &ReadOptions,
    ) -> Result<Self, RecordError> {
        let path = path.as_ref();
        let compression = options
            .compression
            .unwrap_or_else(|| Compression::from_path(path));
        if compression != Compression::None || position.offset == 0 {
            let mut reader = FileRecordReader::open_with(path, options, read)?;
            while reader.position.offset < position.offset && reader.next_record()?.is_some() {}
            return Ok(reader);
        }
        let input = storage::open(path, position.offset, read).map_err(|e| open_error(path, e))?;
        let options = ReaderOptions {
            compression: Some(Compression::None),
            ..options
        };
        Ok(FileRecordReader::decoding(input, options)
            .with_path(path)
            .starting_at(position.record, position.offset))
    }
}

fn open_error(path: &Path, error: StorageError) -> RecordError {
    RecordError::Open {
        path: path.to_path_buf(),
        error: error.into_io(),
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
            corruption_count: 0,
            pending: None,
        }
    }

    /// Names the stream in error messages (for a reader not made by `open`).
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(Arc::from(path.into()));
        self
    }

    /// Counts records and offsets from `record` at `offset`: for a reader
    /// whose stream was positioned there (a file seeked to a record's frame),
    /// so its positions and errors name the file's real ones.
    pub fn starting_at(mut self, record: u64, offset: u64) -> Self {
        self.position = Position { record, offset };
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

    /// The first [`MAX_CORRUPTIONS_KEPT`] corrupt records skipped so far
    /// under [`OnCorruption::Skip`] or [`OnCorruption::EndStream`], with
    /// their locations; [`corruption_count`](Self::corruption_count) counts
    /// them all.
    pub fn corruptions(&self) -> &[Corruption] {
        &self.corruptions
    }

    /// How many corruptions were skipped (or ended the stream) so far.
    pub fn corruption_count(&self) -> u64 {
        self.corruption_count
    }

    fn note(&mut self, corruption: Corruption) {
        self.corruption_count += 1;
        if self.corruptions.len() < MAX_CORRUPTIONS_KEPT {
            self.corruptions.push(corruption);
        }
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
                return self.end_of_data();
            }
            if available < HEADER_LEN {
                self.fail_pending()?;
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
                    let what = (record_start == 0).then(|| what_it_is(header)).flatten();
                    let kind = match what {
                        Some(what) => CorruptionKind::NotTfRecord { what },
                        None => CorruptionKind::LengthCrc {
                            length,
                            stored,
                            computed,
                        },
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
                // A decompressor error cut the record short: report that.
                self.fail_pending()?;
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
                        self.note(Corruption { location, kind });
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
                self.note(Corruption { location, kind });
                Ok(())
            }
        }
    }

    /// At the end of the buffered data: the clean end, or the read error
    /// that came after the last complete record.
    fn end_of_data(&mut self) -> Result<Option<&[u8]>, RecordError> {
        self.fail_pending()?;
        Ok(None)
    }

    /// Returns the pending read error, if any, at the next record's position
    /// (the first record not delivered), fusing the reader. Under
    /// [`OnCorruption::EndStream`], and for bytes after a compressed stream's
    /// end under [`OnCorruption::Skip`], the error is counted instead.
    fn fail_pending(&mut self) -> Result<(), RecordError> {
        let Some(mut err) = self.pending.take() else {
            return Ok(());
        };
        self.fused = true;
        if let RecordError::Io {
            location,
            error: source,
        } = &mut err
        {
            *location = self.location(self.position.offset);
            let trailing = matches!(
                DecodeError::of(source),
                Some(DecodeError::TrailingData { .. })
            );
            let quiet = match self.options.on_corruption {
                OnCorruption::Fail => false,
                OnCorruption::Skip => trailing,
                OnCorruption::EndStream => err.is_corruption(),
            };
            if quiet {
                if let RecordError::Io {
                    location,
                    error: source,
                } = err
                {
                    let kind = CorruptionKind::Compressed {
                        reason: source.to_string(),
                    };
                    self.note(Corruption { location, kind });
                }
                return Ok(());
            }
        }
        Err(err)
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
                    // Deliver the complete records already buffered first;
                    // the location is fixed when the error is returned.
                    self.eof = true;
                    let location = self.location(self.position.offset);
                    self.pending = Some(RecordError::Io {
                        location,
                        error: source,
                    });
                }
            }
        }
        Ok(self.end - self.pos)
    }
}

/// The first [`HEADER_LEN`] bytes of `file` (fewer if it is shorter).
fn read_head<R: Read>(file: &mut R) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(HEADER_LEN);
    file.by_ref()
        .take(HEADER_LEN as u64)
        .read_to_end(&mut head)?;
    Ok(head)
}

/// The compression the first bytes of a stream show: GZIP or ZLIB if they
/// start such a stream and are not a valid TFRecord header.
fn sniff_compression(head: &[u8]) -> Compression {
    if let Ok(header) = <&[u8; HEADER_LEN]>::try_from(head)
        && matches!(frame::decode_header(header), Header::Valid(_))
    {
        return Compression::None;
    }
    if Format::Gzip.starts(head) {
        Compression::Gzip
    } else if Format::Zlib.starts(head) {
        Compression::Zlib
    } else {
        Compression::None
    }
}

/// What a stream that fails its first header looks like instead, when that
/// is clear from its first bytes.
fn what_it_is(head: &[u8]) -> Option<&'static str> {
    let text = |b: &u8| b.is_ascii_graphic() || b.is_ascii_whitespace();
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("a PNG image")
    } else if head.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("a JPEG image")
    } else if head.starts_with(&[0x1f, 0x8b, 0x08]) {
        Some("GZIP-compressed data (read it with compression GZIP)")
    } else if head.starts_with(b"PK\x03\x04") {
        Some("a ZIP archive")
    } else if head.iter().all(text) {
        match head.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{' | b'[') => Some("JSON text"),
            _ => Some("text (CSV or similar)"),
        }
    } else {
        None
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
