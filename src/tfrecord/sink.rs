//! A TFRecord writer for a local path or an object-store URL, chosen by the
//! target's name: what `tfpipe convert` writes its shards through and what
//! the Python package's `TFRecordWriter` wraps.
//!
//! Invariant: nothing appears under the target's name until the writer is
//! finished. A local file is written under a temporary name beside its final
//! one and renamed into place; an object is a multipart upload completed
//! only at the end. Dropping an unfinished [`RecordSink`] (or an uncommitted
//! [`PendingRecords`]) removes the temporary file or aborts the upload.

use std::path::{Path, PathBuf};

use super::{Compression, FileRecordWriter, PendingFile, RecordError};
use crate::storage::StorageError;

/// Why a [`RecordSink`] could not be created or finished.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The local file could not be created, written or renamed.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The object could not be uploaded or completed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Writes TFRecords to a local file or to an object (`s3://`, `gs://`,
/// `az://`), which appears under its name only when finished.
///
/// ```
/// use tfpipe::tfrecord::{Compression, RecordSink};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("data.tfrecord");
/// let mut sink = RecordSink::create(&path, Compression::None)?;
/// sink.write_record(b"hello")?;
/// assert!(!path.exists());
/// assert_eq!(sink.finish()?, path);
/// assert!(path.exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub enum RecordSink {
    /// A local file under a temporary name beside its final one.
    File(FileRecordWriter),
    /// An object by multipart upload, not completed (so invisible) until
    /// finished.
    #[cfg(feature = "object-store")]
    Object(super::RecordWriter<crate::storage::ObjectWriter>),
}

/// Records written in full and not yet visible under their final name:
/// several can be made visible together once all succeeded.
pub enum PendingRecords {
    /// Synced to disk under its temporary name.
    File(PendingFile),
    /// Every part uploaded, the upload not completed; dropping it aborts it.
    #[cfg(feature = "object-store")]
    Object(crate::storage::PendingObject),
}

impl RecordSink {
    /// Starts writing `target`: an object when it is an object-store URL
    /// ([`crate::storage::is_url`]), else a local file.
    pub fn create(target: impl AsRef<Path>, compression: Compression) -> Result<Self, SinkError> {
        let target = target.as_ref();
        match target.to_str().filter(|_| crate::storage::is_url(target)) {
            Some(url) => object_sink(url, compression),
            None => Ok(RecordSink::File(FileRecordWriter::create(
                target,
                compression,
            )?)),
        }
    }

    /// Writes one record.
    pub fn write_record(&mut self, record: &[u8]) -> Result<(), RecordError> {
        match self {
            RecordSink::File(w) => w.write_record(record),
            #[cfg(feature = "object-store")]
            RecordSink::Object(w) => w.write_record(record),
        }
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        match self {
            RecordSink::File(w) => w.records(),
            #[cfg(feature = "object-store")]
            RecordSink::Object(w) => w.records(),
        }
    }

    /// Uncompressed bytes written so far, framing included.
    pub fn bytes(&self) -> u64 {
        match self {
            RecordSink::File(w) => w.bytes(),
            #[cfg(feature = "object-store")]
            RecordSink::Object(w) => w.bytes(),
        }
    }

    /// Writes what is buffered and makes the records visible under the
    /// target's name; returns that name.
    pub fn finish(self) -> Result<PathBuf, SinkError> {
        self.finish_pending()?.commit()
    }

    /// Writes what is buffered but leaves the records invisible until
    /// [`PendingRecords::commit`].
    pub fn finish_pending(self) -> Result<PendingRecords, SinkError> {
        match self {
            RecordSink::File(w) => Ok(PendingRecords::File(w.finish_pending()?)),
            #[cfg(feature = "object-store")]
            RecordSink::Object(w) => Ok(PendingRecords::Object(w.finish()?.finish_pending()?)),
        }
    }
}

impl PendingRecords {
    /// Makes the records visible under their final name, which it returns.
    pub fn commit(self) -> Result<PathBuf, SinkError> {
        match self {
            PendingRecords::File(file) => Ok(file.persist()?),
            #[cfg(feature = "object-store")]
            PendingRecords::Object(object) => {
                let url = PathBuf::from(object.url());
                object.complete()?;
                Ok(url)
            }
        }
    }
}

#[cfg(feature = "object-store")]
fn object_sink(url: &str, compression: Compression) -> Result<RecordSink, SinkError> {
    let object =
        crate::storage::ObjectWriter::create(url, &crate::storage::ReadOptions::default())?;
    Ok(RecordSink::Object(super::RecordWriter::new(
        object,
        compression,
    )))
}

#[cfg(not(feature = "object-store"))]
fn object_sink(url: &str, _compression: Compression) -> Result<RecordSink, SinkError> {
    Err(StorageError::NotBuilt {
        url: url.to_string(),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_sink_leaves_nothing_under_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.tfrecord");
        let mut sink = RecordSink::create(&path, Compression::None).unwrap();
        sink.write_record(b"abc").unwrap();
        drop(sink);
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn pending_records_appear_only_on_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.tfrecord.gz");
        let mut sink = RecordSink::create(&path, Compression::Gzip).unwrap();
        sink.write_record(b"abc").unwrap();
        assert_eq!((sink.records(), sink.bytes()), (1, 3 + 16));
        let pending = sink.finish_pending().unwrap();
        assert!(!path.exists());
        assert_eq!(pending.commit().unwrap(), path);
        let records: Vec<Vec<u8>> =
            crate::tfrecord::FileRecordReader::open(&path, Default::default())
                .unwrap()
                .into_records()
                .map(Result::unwrap)
                .collect();
        assert_eq!(records, vec![b"abc".to_vec()]);
    }
}
