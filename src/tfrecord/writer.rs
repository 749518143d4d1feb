//! Writing framed records, optionally compressed, to any `io::Write` or,
//! atomically, to a path.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::RecordError;
use super::compression::{Compression, Encoder};
use super::frame;

/// Writes TFRecord records. Uncompressed output is byte-identical to
/// `tf.io.TFRecordWriter`'s for the same records.
///
/// ```
/// use tfpipe::tfrecord::{Compression, RecordWriter};
///
/// let mut writer = RecordWriter::new(Vec::new(), Compression::None);
/// writer.write_record(b"abc")?;
/// let bytes = writer.finish()?;
/// assert_eq!(bytes.len(), 12 + 3 + 4);
/// # Ok::<(), tfpipe::tfrecord::RecordError>(())
/// ```
pub struct RecordWriter<W: Write> {
    // Buffered before compression so the 12- and 4-byte frame pieces do not
    // each become a call into the compressor.
    out: BufWriter<Encoder<W>>,
    records: u64,
    bytes: u64,
    path: Option<PathBuf>,
}

impl<W: Write> RecordWriter<W> {
    /// Writes records into `inner`, compressed as asked.
    pub fn new(inner: W, compression: Compression) -> Self {
        RecordWriter {
            out: BufWriter::with_capacity(256 << 10, Encoder::new(inner, compression)),
            records: 0,
            bytes: 0,
            path: None,
        }
    }

    /// Writes one record.
    pub fn write_record(&mut self, data: &[u8]) -> Result<(), RecordError> {
        let header = frame::encode_header(data.len() as u64);
        let footer = frame::encode_footer(data);
        self.write_all(&header)?;
        self.write_all(data)?;
        self.write_all(&footer)?;
        self.records += 1;
        self.bytes += frame::framed_len(data.len()) as u64;
        Ok(())
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Uncompressed bytes written so far (framing included).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The underlying writer, as it is now (compressed bytes may still be buffered).
    pub fn get_ref(&self) -> &W {
        self.out.get_ref().get_ref()
    }

    /// Flushes everything, ends the compressed stream, and returns the inner writer.
    pub fn finish(self) -> Result<W, RecordError> {
        let path = self.path;
        let encoder = self
            .out
            .into_inner()
            .map_err(|e| write_error(path.clone(), e.into_error()))?;
        encoder.finish().map_err(|e| write_error(path, e))
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<(), RecordError> {
        self.out
            .write_all(bytes)
            .map_err(|e| write_error(self.path.clone(), e))
    }
}

fn write_error(path: Option<PathBuf>, source: std::io::Error) -> RecordError {
    RecordError::Write {
        path,
        error: source,
    }
}

/// Writes records to a path atomically: into a temporary file in the same
/// directory, renamed to the final name only by [`FileRecordWriter::finish`].
/// Dropped without `finish` (an error, a panic), it removes the temporary
/// file, so a half-written file never appears under the final name.
///
/// ```
/// use tfpipe::tfrecord::{Compression, FileRecordWriter};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("data.tfrecord.gz");
/// let mut writer = FileRecordWriter::create(&path, Compression::from_path(&path))?;
/// writer.write_record(b"hello")?;
/// assert!(!path.exists());
/// writer.finish()?;
/// assert!(path.exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FileRecordWriter {
    writer: RecordWriter<File>,
    temp: crate::atomic_file::Unsealed,
    path: PathBuf,
}

impl FileRecordWriter {
    /// Starts writing `path` (which appears only on `finish`).
    pub fn create(path: impl AsRef<Path>, compression: Compression) -> Result<Self, RecordError> {
        let path = path.as_ref().to_path_buf();
        let temp =
            crate::atomic_file::AtomicFile::create(&path).map_err(|e| RecordError::Create {
                path: path.clone(),
                error: e.source,
            })?;
        let (file, temp) = temp.into_parts();
        let mut writer = RecordWriter::new(file, compression);
        writer.path = Some(path.clone());
        Ok(FileRecordWriter { writer, temp, path })
    }

    /// Writes one record.
    pub fn write_record(&mut self, data: &[u8]) -> Result<(), RecordError> {
        self.writer.write_record(data)
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.writer.records()
    }

    /// Uncompressed bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.writer.bytes()
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes, closes and renames the file into place; returns its path.
    pub fn finish(self) -> Result<PathBuf, RecordError> {
        self.finish_pending()?.persist()
    }

    /// Flushes, syncs to disk and closes the file but leaves it under its
    /// temporary name, so several files can be renamed into place together
    /// once all succeeded.
    pub fn finish_pending(self) -> Result<PendingFile, RecordError> {
        let file = self.writer.finish()?;
        let pending = self.temp.seal(file).map_err(|e| RecordError::Write {
            path: Some(self.path.clone()),
            error: e.source,
        })?;
        Ok(PendingFile { pending })
    }
}

/// A completely written file still under its temporary name; removed if
/// dropped without [`PendingFile::persist`].
pub struct PendingFile {
    pending: crate::atomic_file::Pending,
}

impl PendingFile {
    /// The final path it will get.
    pub fn path(&self) -> &Path {
        self.pending.path()
    }

    /// Where it is until renamed into place.
    pub fn temp_path(&self) -> &Path {
        self.pending.temp_path()
    }

    /// Renames it to its final path (and syncs the directory).
    pub fn persist(self) -> Result<PathBuf, RecordError> {
        let path = self.pending.path().to_path_buf();
        self.pending.commit().map_err(|e| RecordError::Create {
            path,
            error: e.source,
        })
    }

    /// The sealed file, for committing together with others
    /// ([`crate::atomic_file::FileSet`]).
    pub fn into_pending(self) -> crate::atomic_file::Pending {
        self.pending
    }
}
