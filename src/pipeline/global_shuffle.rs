//! The global shuffle, and reading records by position through a record
//! index: pipeline sources over [`IndexedFiles`].
//!
//! [`IndexedFiles::global_shuffle`] reads, every epoch, a full random
//! permutation of all records across all files (drawn from the seed and the
//! epoch number), by random access with no shuffle buffer: the Grain /
//! ArrayRecord way. [`IndexedFiles::records`] reads given positions in order
//! (exact sharding by record, see [`super::rank`]).
//!
//! Invariants: a [`PositionStream`]'s state is the number of records it has
//! emitted; the order is fixed by the positions or by `(seed, epoch)`, so a
//! restore resumes at that place with no record read twice or skipped. At
//! most `read_ahead` reads are in flight; every record is checked against the
//! index and its CRCs before it is emitted.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::state::{StageState, StageStream, StateError};
use super::{Env, Event, FileId, Pipeline, PipelineError, Record, RecordPosition, Stream};
use crate::rng::{SplitMix64, epoch_seed};
use crate::tfrecord::frame::{FOOTER_LEN, HEADER_LEN};
use crate::tfrecord::{IndexError, IndexedFiles, RecordId};

impl IndexedFiles {
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
}

/// Starts reading the record at `position`: a local file is read (and
/// checked) now, into a recycled buffer; an object's range is requested and
/// received later.
fn start_read(files: &IndexedFiles, position: RecordId) -> Result<InFlight, IndexError> {
    let (path, range) = files.framed_range(position)?;
    if !files.is_local(position) {
        return start_object_read(path, position, range);
    }
    let mut record = Record::new();
    let read = files.read_local(position, record.buffer_mut()).map(|data| {
        let buf = record.buffer_mut();
        buf.truncate(data.end);
        buf.drain(..data.start);
        record
    });
    Ok(InFlight::Ready(position, range.start, read))
}

/// A record read that may still be on its way.
enum InFlight {
    /// The record's data, read and checked (locally).
    Ready(RecordId, u64, Result<Record, IndexError>),
    #[cfg(feature = "object-store")]
    Remote(RecordId, u64, crate::storage::PendingRange),
}

impl InFlight {
    /// Waits for the read, checks the frame, and returns the record's data
    /// with its source position.
    fn finish(self, files: &IndexedFiles, ids: &[FileId]) -> Result<Record, IndexError> {
        let (id, offset) = match &self {
            InFlight::Ready(id, offset, _) => (*id, *offset),
            #[cfg(feature = "object-store")]
            InFlight::Remote(id, offset, _) => (*id, *offset),
        };
        let record = self.finish_data(files)?;
        Ok(record.with_position(RecordPosition::in_file(ids[id.file], id.record, offset)))
    }

    // Only an object's bytes are checked here; a local read was checked as it was made.
    #[cfg_attr(not(feature = "object-store"), allow(unused_variables))]
    fn finish_data(self, files: &IndexedFiles) -> Result<Record, IndexError> {
        match self {
            InFlight::Ready(_, _, record) => record,
            #[cfg(feature = "object-store")]
            InFlight::Remote(position, offset, pending) => {
                let framed = pending.wait()?;
                let data = files.check(position, offset, &framed)?;
                let mut record = Record::new();
                record.buffer_mut().clear();
                record.buffer_mut().extend_from_slice(&framed[data]);
                Ok(record)
            }
        }
    }
}

#[cfg(feature = "object-store")]
fn start_object_read(
    path: &Path,
    position: RecordId,
    range: Range<u64>,
) -> Result<InFlight, IndexError> {
    let offset = range.start;
    let pending = crate::storage::start_range(&path.to_string_lossy(), range)?;
    Ok(InFlight::Remote(position, offset, pending))
}

#[cfg(not(feature = "object-store"))]
fn start_object_read(
    path: &Path,
    _position: RecordId,
    _range: Range<u64>,
) -> Result<InFlight, IndexError> {
    Err(crate::storage::StorageError::NotBuilt {
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
/// use tfpipe::{IndexedFiles, RecordIndex};
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
        .invalid_if(bad, "global_shuffle", move || {
            let (n, i) = shard.unwrap_or_default();
            format!("shard({n}, {i}): needs num_shards > 0 and index < num_shards")
        })
    }
}

/// A Fisher-Yates permutation of `0..len` from `(seed, epoch)`, then the
/// shard's share of it.
fn permutation(len: u64, seed: u64, epoch: u64, shard: Option<(u64, u64)>) -> Vec<u64> {
    let mut order: Vec<u64> = (0..len).collect();
    let mut rng = SplitMix64(epoch_seed(seed, epoch));
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

enum Order {
    Fixed(Arc<[RecordId]>),
    Global(Arc<[u64]>),
}

/// Reads records by position, `read_ahead` in flight.
///
/// Its state is the number of records emitted: the order is fixed by the
/// positions given or by `(seed, epoch)`, so a restore starts reading at
/// that place in the order (no record is read twice or skipped).
pub(crate) struct PositionStream {
    files: IndexedFiles,
    /// What the files are, saved with the state and checked on restore.
    files_now: FileSet,
    /// Each file's path interned, for the records' source positions.
    ids: Arc<[FileId]>,
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
        let files_now = FileSet::of(&files);
        let emitted = match env.resume_state().map(|s| s.data::<Emitted>(stage)) {
            Some(Ok(e)) => match &e.files {
                // A state taken over other files: its count of records read
                // means nothing in this file set's order.
                Some(then) if *then != files_now => {
                    env.restore_failed(StateError::mismatch(
                        stage,
                        format!(
                            "the state was taken over {} file(s) of {} records, this pipeline reads {} file(s) of {} records, or other files",
                            then.files, then.records, files_now.files, files_now.records
                        ),
                    ));
                    0
                }
                _ => e.emitted,
            },
            Some(Err(error)) => {
                env.restore_failed(error);
                0
            }
            None => 0,
        };
        let ids = files.paths().map(FileId::intern).collect();
        PositionStream {
            files,
            files_now,
            ids,
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
            match start_read(&self.files, position) {
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
        let out = match read.finish(&self.files, &self.ids) {
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
    /// The file set the count is a place in (absent in older states).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    files: Option<FileSet>,
}

/// A file set as a state records it: counts to report, and a digest of
/// every file's path and record count.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct FileSet {
    files: usize,
    records: u64,
    digest: String,
}

impl FileSet {
    fn of(files: &IndexedFiles) -> FileSet {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        for (f, path) in files.paths().enumerate() {
            hash.update(path.to_string_lossy().as_bytes());
            hash.update([0]);
            let records = files.index(f).map_or(0, |i| i.len());
            hash.update(records.to_le_bytes());
        }
        let digest = hash.finalize();
        FileSet {
            files: files.paths().count(),
            records: files.len(),
            digest: digest[..16].iter().map(|b| format!("{b:02x}")).collect(),
        }
    }
}

impl StageStream<Record> for PositionStream {
    fn save(&self) -> Result<StageState, StateError> {
        Ok(StageState::new(
            self.stage,
            serde_json::json!(Emitted {
                emitted: self.emitted,
                files: Some(self.files_now.clone()),
            }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
