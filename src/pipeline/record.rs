//! [`Record`]: one serialized TFRecord record whose buffer is recycled.
//!
//! A TFRecord source copies each record out of the reader's I/O buffer once
//! (that copy is inherent: the reader's buffer is reused for the next read,
//! and avoiding it would mean mapping whole files). What it avoids is the
//! allocation: the copy goes into a buffer taken from a process-wide free
//! list, and dropping the [`Record`] (typically in the parse stage, on
//! another thread) puts the buffer back. With `Vec<u8>` records, every record
//! cost a `malloc` on the reading thread and a cross-thread `free` on the
//! parsing one.
//!
//! The free list is bounded, so recycling never holds more than
//! [`POOL_BUFFERS`] idle buffers of at most [`POOL_MAX_CAPACITY`] bytes each
//! (8 MiB in all, whatever the pipelines do), plus at most
//! [`STASH_BUFFERS`] in each thread that recycles (half a MiB a thread). A
//! buffer larger than [`POOL_MAX_CAPACITY`] (a large record's) is freed
//! normally; for records that large the allocation is small next to the
//! copy. When the list is empty a new buffer is allocated, so the list never
//! blocks anyone.
//!
//! Buffers move between threads in batches of [`STASH_BATCH`]: each thread
//! keeps a small stash, takes from it and gives to it, and only a stash that
//! runs empty or fills up touches the shared list, once per batch. A reader
//! takes a buffer for every record and the parser gives one back for every
//! record, so a shared list touched per record cost both of them an atomic
//! read-modify-write on the same cache lines each time (6-7% of a pipeline's
//! CPU in `perf`). A thread's stash is freed when the thread exits: handing
//! it to the shared list instead measured 1.5-2% more CPU in the pipeline
//! benchmark (18 alternated rounds, more in 15), so it is not done.
//!
//! # Source positions
//!
//! A record read from a file carries its [`RecordPosition`]: the file, the
//! index of the record in it and the byte offset of its frame in the
//! uncompressed stream. The position moves with the record through
//! `shuffle`, `batch`, `interleave`, `shard`, `cache` and everything else
//! that passes records on, so a later stage can say where row `i` of a batch
//! came from ([`Record::position`], then [`RecordPosition::location`]).
//!
//! A position is `Copy` and 24 bytes: the file is a [`FileId`], an index into
//! one process-wide table of the paths opened so far (interned once per file
//! open, never per record), so carrying a position costs no allocation and no
//! reference count on the hot path. The table only grows, by one path per
//! distinct file a process reads.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::num::NonZeroU32;
use std::ops::Deref;
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLock};

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::error::Location;

/// Idle buffers the free list keeps at most (a batch of 256 records
/// returns all of its buffers at once, so this leaves room for several).
pub const POOL_BUFFERS: usize = 2048;

/// The largest buffer capacity, in bytes, the free list keeps.
pub const POOL_MAX_CAPACITY: usize = 4096;

/// Buffers moved between a thread's stash and the shared free list at once.
pub const STASH_BATCH: usize = 64;

/// Idle buffers a thread's stash keeps at most: one batch to hand out and
/// one being gathered.
pub const STASH_BUFFERS: usize = 2 * STASH_BATCH;

/// The free list: a bounded lock-free array queue of batches of
/// [`STASH_BATCH`] buffers (crossbeam's array channel, used only with
/// `try_send`/`try_recv`, so nobody ever waits).
static POOL: LazyLock<FreeList> = LazyLock::new(|| bounded(POOL_BUFFERS / STASH_BATCH));

type Batch = Vec<Vec<u8>>;
type FreeList = (Sender<Batch>, Receiver<Batch>);

thread_local! {
    /// This thread's idle buffers, at most [`STASH_BUFFERS`].
    static STASH: RefCell<Batch> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer from this thread's stash (see [`take_from`]); a new one
/// while the thread is exiting and its stash is gone.
fn take_buffer() -> Vec<u8> {
    STASH
        .try_with(|stash| take_from(&mut stash.borrow_mut(), &POOL))
        .unwrap_or_default()
}

/// Keeps `buf` for reuse in this thread's stash (see [`give_to`]); frees it
/// while the thread is exiting.
fn give_buffer(buf: Vec<u8>) {
    let _ = STASH.try_with(|stash| give_to(&mut stash.borrow_mut(), &POOL, buf));
}

/// An empty buffer from `stash`, refilled by one batch from `pool` when it
/// is empty; a new (unallocated) one when both are.
fn take_from(stash: &mut Batch, pool: &FreeList) -> Vec<u8> {
    if stash.is_empty()
        && let Ok(batch) = pool.1.try_recv()
    {
        // The batch's vector becomes the stash (one free of the spent one
        // per batch; giving a batch allocates its vector).
        *stash = batch;
    }
    stash.pop().unwrap_or_default()
}

/// Keeps `buf`, cleared, in `stash`; a full stash first hands a batch of
/// [`STASH_BATCH`] to `pool`, or frees it when `pool` is full too.
fn give_to(stash: &mut Batch, pool: &FreeList, mut buf: Vec<u8>) {
    buf.clear();
    if stash.len() >= STASH_BUFFERS {
        let batch: Batch = stash.drain(STASH_BATCH..).collect();
        // A full list frees the batch (the error hands it back).
        let _ = pool.0.try_send(batch);
    }
    stash.push(buf);
}

/// A file a [`RecordPosition`] points into: an index into the process-wide
/// table of files opened so far (see [`RecordPosition`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(NonZeroU32);

/// The interned paths: `paths[id - 1]` is the path of `FileId(id)`.
struct FileTable {
    paths: RwLock<Vec<Arc<Path>>>,
    ids: Mutex<HashMap<Arc<Path>, FileId>>,
}

static FILES: LazyLock<FileTable> = LazyLock::new(|| FileTable {
    paths: RwLock::new(Vec::new()),
    ids: Mutex::new(HashMap::new()),
});

impl FileId {
    /// The id of `path`, interning it on first use (once per file open, not
    /// per record: it takes a lock).
    pub fn intern(path: &Path) -> FileId {
        let mut ids = FILES.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = ids.get(path) {
            return *id;
        }
        let mut paths = FILES.paths.write().unwrap_or_else(PoisonError::into_inner);
        let path: Arc<Path> = Arc::from(path);
        paths.push(Arc::clone(&path));
        // More than 4 billion distinct files in one process would wrap; the
        // table would run out of memory long before.
        let n = u32::try_from(paths.len()).unwrap_or(u32::MAX);
        let id = FileId(NonZeroU32::new(n).unwrap_or(NonZeroU32::MAX));
        ids.insert(path, id);
        id
    }

    /// The file's path.
    pub fn path(self) -> Arc<Path> {
        let paths = FILES.paths.read().unwrap_or_else(PoisonError::into_inner);
        // Every FileId comes from `intern`, which pushed its path first.
        match paths.get(self.0.get() as usize - 1) {
            Some(path) => Arc::clone(path),
            None => Arc::from(Path::new("<unknown file>")),
        }
    }
}

/// Where a [`Record`] came from: its file, its index in the file (skipped
/// corrupt records included, as the reader counts) and the byte offset of its
/// frame in the file's *uncompressed* stream (what TensorFlow reports).
///
/// A position is `Copy` and 24 bytes: the file is a [`FileId`], an index into
/// one process-wide table of the paths opened so far (interned once per file
/// open, never per record), so carrying a position costs no allocation and no
/// reference count on the hot path. The table only grows, by one path per
/// distinct file a process reads. The position moves with its record through
/// `shuffle`, `batch`, `interleave`, `shard`, `cache` and every other stage
/// that passes records on.
///
/// ```
/// use std::path::Path;
/// use tfpipe::Location;
/// use tfpipe::pipeline::{Record, RecordPosition};
///
/// let position = RecordPosition::new(Path::new("data/train.tfrecord"), 3, 120);
/// let record = Record::from(&b"bytes"[..]).with_position(position);
/// let location: Location = record.position().unwrap().location();
/// assert_eq!(location.to_string(), "data/train.tfrecord: record 3 at byte 120");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordPosition {
    file: FileId,
    record: u64,
    offset: u64,
}

impl RecordPosition {
    /// The position of record `record`, whose frame starts at byte `offset`
    /// of `path`'s uncompressed stream (interns `path`).
    pub fn new(path: &Path, record: u64, offset: u64) -> RecordPosition {
        RecordPosition::in_file(FileId::intern(path), record, offset)
    }

    /// The position of record `record` at `offset` in an interned file.
    pub fn in_file(file: FileId, record: u64, offset: u64) -> RecordPosition {
        RecordPosition {
            file,
            record,
            offset,
        }
    }

    /// The file.
    pub fn file(&self) -> FileId {
        self.file
    }

    /// The file's path.
    pub fn path(&self) -> Arc<Path> {
        self.file.path()
    }

    /// Zero-based index of the record in its file.
    pub fn record(&self) -> u64 {
        self.record
    }

    /// Byte offset of the record's frame in the uncompressed stream.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The position as the [`Location`] errors carry.
    pub fn location(&self) -> Location {
        Location {
            path: Some(self.path().to_path_buf()),
            record: self.record,
            offset: self.offset,
        }
    }
}

impl From<RecordPosition> for Location {
    fn from(position: RecordPosition) -> Location {
        position.location()
    }
}

impl From<&RecordPosition> for Location {
    fn from(position: &RecordPosition) -> Location {
        position.location()
    }
}

impl fmt::Display for RecordPosition {
    /// As [`Location`]: `PATH: record N at byte M`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.location(), f)
    }
}

/// A serialized record, as read from a TFRecord file: bytes you read through
/// `Deref<Target = [u8]>` / `AsRef<[u8]>`, whose buffer goes back to a
/// bounded free list when dropped (through this thread's stash), and the
/// [`RecordPosition`] it was read from, if it was read from a file.
///
/// Convert from and to `Vec<u8>` with `From`/[`into_vec`](Record::into_vec);
/// it compares equal to byte slices and vectors with the same bytes. Equality
/// and hashing look at the bytes only, not at the position.
///
/// ```
/// use tfpipe::pipeline::Record;
/// let r = Record::from(&b"abc"[..]);
/// assert_eq!(r, b"abc"[..]);
/// assert_eq!(r.len(), 3);
/// assert_eq!(r.into_vec(), b"abc".to_vec());
/// ```
pub struct Record {
    buf: Vec<u8>,
    position: Option<RecordPosition>,
}

impl Record {
    /// An empty record whose buffer comes from this thread's stash or the
    /// free list when either has one.
    pub fn new() -> Record {
        Record {
            buf: take_buffer(),
            position: None,
        }
    }

    /// Where the record was read from; `None` for records made from bytes.
    pub fn position(&self) -> Option<&RecordPosition> {
        self.position.as_ref()
    }

    /// The record, saying it was read from `position`.
    pub fn with_position(mut self, position: RecordPosition) -> Record {
        self.position = Some(position);
        self
    }

    /// Sets (or clears) where the record was read from.
    pub fn set_position(&mut self, position: Option<RecordPosition>) {
        self.position = position;
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// The buffer to fill (for a reader's `read_record`); cleared by whoever
    /// fills it.
    pub(crate) fn buffer_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Asks the CPU for the buffer's cache lines in a writable state, up to
    /// 2 KiB. A recycled buffer was last read by another thread (the
    /// parser), so copying a record into it would stall on each line; a
    /// file source takes its next record's buffer one record ahead and asks
    /// for it then, which hides the wait.
    pub(crate) fn prefetch_for_write(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            let start = self.buf.as_ptr();
            let bytes = self.buf.capacity().min(2048);
            for offset in (0..bytes).step_by(64) {
                // SAFETY: `prefetchw` is a hint: it never faults and changes
                // no register, flag or memory the program can see (CPUs
                // without it run it as a no-op); the address is inside the
                // buffer's allocation.
                unsafe {
                    std::arch::asm!(
                        "prefetchw [{0}]",
                        in(reg) start.wrapping_add(offset),
                        options(nostack, preserves_flags, readonly)
                    );
                }
            }
        }
    }

    /// The bytes as a `Vec<u8>`, taking the buffer out of recycling.
    pub fn into_vec(mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

impl Default for Record {
    fn default() -> Self {
        Record::new()
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let cap = self.buf.capacity();
        if cap != 0 && cap <= POOL_MAX_CAPACITY {
            give_buffer(std::mem::take(&mut self.buf));
        }
    }
}

impl Deref for Record {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl AsRef<[u8]> for Record {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Borrow<[u8]> for Record {
    fn borrow(&self) -> &[u8] {
        &self.buf
    }
}

impl Clone for Record {
    /// Copies the bytes (into a recycled buffer) and the position.
    fn clone(&self) -> Record {
        let mut record = Record::from(self.as_slice());
        record.position = self.position;
        record
    }
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut t = f.debug_tuple("Record");
        t.field(&self.as_slice());
        if let Some(position) = &self.position {
            t.field(&format_args!("{position}"));
        }
        t.finish()
    }
}

impl PartialEq for Record {
    fn eq(&self, other: &Record) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Record {}

impl Hash for Record {
    // Same as `[u8]`'s, as `Borrow<[u8]>` requires.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state)
    }
}

impl PartialEq<[u8]> for Record {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_slice() == other
    }
}

impl PartialEq<Vec<u8>> for Record {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl PartialEq<Record> for Vec<u8> {
    fn eq(&self, other: &Record) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl From<Vec<u8>> for Record {
    /// Wraps the vector (no copy); its buffer is recycled on drop.
    fn from(buf: Vec<u8>) -> Record {
        Record {
            buf,
            position: None,
        }
    }
}

impl From<&[u8]> for Record {
    fn from(bytes: &[u8]) -> Record {
        let mut record = Record::new();
        record.buf.extend_from_slice(bytes);
        record
    }
}

impl From<Record> for Vec<u8> {
    fn from(record: Record) -> Vec<u8> {
        record.into_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_and_equality() {
        let r = Record::from(vec![1u8, 2, 3]);
        assert_eq!(r, [1u8, 2, 3][..]);
        assert_eq!(r, vec![1u8, 2, 3]);
        assert_eq!(vec![1u8, 2, 3], r);
        assert_eq!(r.clone(), r);
        assert_eq!(&r[1..], &[2, 3]);
        assert_eq!(format!("{r:?}"), "Record([1, 2, 3])");
        assert_eq!(Vec::from(r), vec![1, 2, 3]);
        assert!(Record::new().is_empty());
    }

    #[test]
    fn recycled_buffers_come_back_empty() {
        // Other tests share the free list, so only properties that hold
        // whatever they do are checked.
        for _ in 0..100 {
            let mut r = Record::from(&[7u8; 100][..]);
            r.buffer_mut().push(8);
            assert_eq!(r.len(), 101);
            drop(r);
            assert!(Record::new().is_empty());
        }
        // An oversized buffer is not kept (and dropping it is fine).
        drop(Record::from(vec![0u8; POOL_MAX_CAPACITY + 1]));
        assert!(POOL.0.len() <= POOL_BUFFERS / STASH_BATCH);
        assert!(STASH.with(|stash| stash.borrow().len()) <= STASH_BUFFERS);
    }

    #[test]
    fn buffers_cross_threads_by_the_batch_and_stay_bounded() {
        let pool: FreeList = bounded(2);
        let mut giver = Batch::new();
        for _ in 0..STASH_BUFFERS {
            give_to(&mut giver, &pool, Vec::with_capacity(100));
        }
        assert!(pool.1.is_empty(), "the stash fills before it hands out");
        give_to(&mut giver, &pool, vec![1; 7]);
        assert_eq!(giver.len(), STASH_BATCH + 1);
        assert_eq!(pool.1.len(), 1);
        assert_eq!(pool.1.try_recv().map(|b| b.len()).ok(), Some(STASH_BATCH));
        // The stash never holds more than its bound, and a full pool frees.
        for _ in 0..10 * STASH_BUFFERS {
            give_to(&mut giver, &pool, Vec::with_capacity(100));
            assert!(giver.len() <= STASH_BUFFERS);
        }
        assert_eq!(pool.1.len(), 2);
        // Another thread's empty stash takes a whole batch, emptied buffers.
        let mut taker = Batch::new();
        let first = take_from(&mut taker, &pool);
        assert!(first.is_empty() && first.capacity() >= 100);
        assert_eq!(taker.len(), STASH_BATCH - 1);
        assert_eq!(pool.1.len(), 1);
        // Given buffers come back cleared.
        let mut own = Batch::new();
        give_to(&mut own, &pool, vec![1; 7]);
        let back = take_from(&mut own, &pool);
        assert!(back.is_empty() && back.capacity() >= 7);
        // Nothing anywhere: a new, unallocated buffer.
        let empty: FreeList = bounded(1);
        assert_eq!(take_from(&mut Batch::new(), &empty).capacity(), 0);
    }

    #[test]
    fn positions_are_small_interned_and_cloned() {
        assert_eq!(std::mem::size_of::<RecordPosition>(), 24);
        assert_eq!(std::mem::size_of::<Option<RecordPosition>>(), 24);
        let a = RecordPosition::new(Path::new("/x/a.tfrecord"), 1, 16);
        let b = RecordPosition::new(Path::new("/x/a.tfrecord"), 2, 40);
        let c = RecordPosition::new(Path::new("/x/c.tfrecord"), 0, 0);
        assert_eq!(a.file(), b.file());
        assert_ne!(a.file(), c.file());
        assert_eq!(&*c.path(), Path::new("/x/c.tfrecord"));
        let r = Record::from(vec![1u8]).with_position(b);
        assert_eq!(r.clone().position(), Some(&b));
        // Equality is about bytes only.
        assert_eq!(r, Record::from(vec![1u8]).with_position(c));
        assert_eq!(
            Location::from(b),
            Location {
                path: Some("/x/a.tfrecord".into()),
                record: 2,
                offset: 40
            }
        );
        assert_eq!(
            format!("{r:?}"),
            "Record([1], /x/a.tfrecord: record 2 at byte 40)"
        );
    }
}
