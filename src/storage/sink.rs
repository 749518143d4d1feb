//! Where sharded output goes: a local file or an object, behind one type, so
//! a writer (the converter) never asks which.
//!
//! Invariant, for both kinds: nothing appears under its final name before
//! [`OutputSet::commit`], and an output dropped before that leaves nothing.
//! - A local shard is written under a temporary name, synced, and renamed
//!   into place with the rest of its [`FileSet`] (schema file last).
//! - An object shard is uploaded part by part with a multipart upload that is
//!   *not completed* until the commit: an incomplete upload is invisible to
//!   GET and LIST, and dropping it aborts it. The commit completes the
//!   uploads in order (the schema file last); if one fails, the objects
//!   completed before it are deleted again and the rest are aborted.
//!
//! Object stores have no multi-object transaction, so a crash *during* the
//! commit of objects (between two completions) can leave some shards without
//! their schema file; the schema file completes last so that its presence
//! means the set is whole.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::atomic_file::{self, AtomicFile, FileSet, OutputError};
use crate::tfrecord::{Compression, FileRecordWriter, RecordError};

use super::StorageError;

/// Why writing or committing an output failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// Writing a record failed (the path and record are in the error).
    #[error(transparent)]
    Record(#[from] RecordError),
    /// Creating, syncing or renaming a local output failed.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// An object-store upload failed (the URL and operation are in the error).
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A TFRecord shard being written to a local path or an object-store URL.
///
/// ```
/// use tfpipe::storage::{OutputSet, ShardSink};
/// use tfpipe::tfrecord::Compression;
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("train-00000-of-00001.tfrecord");
/// let mut shard = ShardSink::create(&path, Compression::None)?;
/// shard.write_record(b"hello")?;
/// let mut set = OutputSet::new();
/// set.push(shard.finish_pending()?);
/// assert!(!path.exists()); // nothing under the final name yet
/// assert_eq!(set.commit()?, [path.clone()]);
/// assert!(path.exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ShardSink(SinkKind);

enum SinkKind {
    File(FileRecordWriter),
    #[cfg(feature = "object-store")]
    Object(crate::tfrecord::RecordWriter<super::ObjectWriter>),
}

impl ShardSink {
    /// Starts the shard `path`: a local file under a temporary name, or (for
    /// a URL) a multipart upload.
    pub fn create(path: &Path, compression: Compression) -> Result<ShardSink, SinkError> {
        #[cfg(feature = "object-store")]
        if let Some(url) = super::resolve::url_str(path) {
            let object = super::ObjectWriter::create(url, &super::ReadOptions::default())?;
            let writer = crate::tfrecord::RecordWriter::new(object, compression);
            return Ok(ShardSink(SinkKind::Object(writer)));
        }
        #[cfg(not(feature = "object-store"))]
        if let Some(url) = super::resolve::url_str(path) {
            return Err(StorageError::NotBuilt {
                url: url.to_string(),
            }
            .into());
        }
        Ok(ShardSink(SinkKind::File(FileRecordWriter::create(
            path,
            compression,
        )?)))
    }

    /// Appends one record.
    pub fn write_record(&mut self, record: &[u8]) -> Result<(), RecordError> {
        match &mut self.0 {
            SinkKind::File(w) => w.write_record(record),
            #[cfg(feature = "object-store")]
            SinkKind::Object(w) => w.write_record(record),
        }
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        match &self.0 {
            SinkKind::File(w) => w.records(),
            #[cfg(feature = "object-store")]
            SinkKind::Object(w) => w.records(),
        }
    }

    /// Uncompressed bytes written so far.
    pub fn bytes(&self) -> u64 {
        match &self.0 {
            SinkKind::File(w) => w.bytes(),
            #[cfg(feature = "object-store")]
            SinkKind::Object(w) => w.bytes(),
        }
    }

    /// Flushes and seals the shard (synced file, or every part uploaded),
    /// still invisible under its final name.
    pub fn finish_pending(self) -> Result<PendingShard, SinkError> {
        match self.0 {
            SinkKind::File(w) => Ok(PendingShard(PendingKind::File(
                w.finish_pending()?.into_pending(),
            ))),
            #[cfg(feature = "object-store")]
            SinkKind::Object(w) => Ok(PendingShard(PendingKind::Object(
                w.finish()?.finish_pending()?,
            ))),
        }
    }
}

/// An output written in full, not yet under its final name; dropping it
/// deletes it (a file) or aborts it (an upload).
pub struct PendingShard(PendingKind);

enum PendingKind {
    File(atomic_file::Pending),
    #[cfg(feature = "object-store")]
    Object(super::PendingObject),
}

impl PendingShard {
    /// The final name: a path, or the URL as a path.
    pub fn path(&self) -> PathBuf {
        match &self.0 {
            PendingKind::File(p) => p.path().to_path_buf(),
            #[cfg(feature = "object-store")]
            PendingKind::Object(o) => PathBuf::from(o.url()),
        }
    }

    /// Its size in bytes as stored (compressed, framed).
    pub fn size(&self) -> Result<u64, SinkError> {
        match &self.0 {
            PendingKind::File(p) => std::fs::metadata(p.temp_path())
                .map(|m| m.len())
                .map_err(|source| output_error(p.path(), "read the size of", source)),
            #[cfg(feature = "object-store")]
            PendingKind::Object(o) => Ok(o.bytes()),
        }
    }
}

/// Outputs that appear together on [`commit`](Self::commit), in the order
/// pushed, or not at all.
#[derive(Default)]
pub struct OutputSet {
    files: FileSet,
    #[cfg(feature = "object-store")]
    objects: Vec<super::PendingObject>,
}

impl OutputSet {
    /// An empty set.
    pub fn new() -> OutputSet {
        OutputSet::default()
    }

    /// Adds a sealed shard.
    pub fn push(&mut self, shard: PendingShard) {
        match shard.0 {
            PendingKind::File(p) => self.files.push(p),
            #[cfg(feature = "object-store")]
            PendingKind::Object(o) => self.objects.push(o),
        }
    }

    /// Writes `bytes` as the output `path` (a path or URL) and adds it.
    pub fn push_bytes(&mut self, path: &Path, bytes: &[u8]) -> Result<(), SinkError> {
        #[cfg(feature = "object-store")]
        if let Some(url) = super::resolve::url_str(path) {
            let mut object = super::ObjectWriter::create(url, &super::ReadOptions::default())?;
            object
                .write_all(bytes)
                .map_err(|source| output_error(path, "write", source))?;
            self.objects.push(object.finish_pending()?);
            return Ok(());
        }
        let mut file = AtomicFile::create(path)?;
        file.write_all(bytes)
            .map_err(|source| output_error(path, "write", source))?;
        self.files.push(file.seal()?);
        Ok(())
    }

    /// How many outputs the set holds.
    pub fn len(&self) -> usize {
        #[cfg(feature = "object-store")]
        let objects = self.objects.len();
        #[cfg(not(feature = "object-store"))]
        let objects = 0;
        self.files.files().len() + objects
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Puts every output under its final name, in order (the last pushed
    /// last); returns the final names. On failure nothing of this set is
    /// left under a final name (local files: the previous ones are restored;
    /// objects: those completed are deleted again).
    pub fn commit(self) -> Result<Vec<PathBuf>, SinkError> {
        #[cfg(feature = "object-store")]
        let objects = commit_objects(self.objects)?;
        #[cfg(not(feature = "object-store"))]
        let objects: Vec<PathBuf> = Vec::new();
        match self.files.commit() {
            Ok(mut files) => {
                files.extend(objects);
                Ok(files)
            }
            Err(e) => {
                #[cfg(feature = "object-store")]
                delete_all(&objects);
                Err(e.into())
            }
        }
    }
}

/// Completes the uploads in order; on a failure deletes those completed
/// (the rest abort as they drop).
#[cfg(feature = "object-store")]
fn commit_objects(objects: Vec<super::PendingObject>) -> Result<Vec<PathBuf>, SinkError> {
    let mut done = Vec::with_capacity(objects.len());
    for object in objects {
        let url = PathBuf::from(object.url());
        if let Err(e) = object.complete() {
            delete_all(&done);
            return Err(e.into());
        }
        done.push(url);
    }
    Ok(done)
}

/// Best effort: the error that made us roll back is the one to report.
#[cfg(feature = "object-store")]
fn delete_all(urls: &[PathBuf]) {
    for url in urls {
        if let Some(url) = url.to_str() {
            let _ = super::delete_object(url);
        }
    }
}

fn output_error(path: &Path, action: &'static str, source: std::io::Error) -> SinkError {
    SinkError::Output(OutputError {
        path: path.to_path_buf(),
        action,
        source,
    })
}
