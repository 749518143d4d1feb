//! The shared machinery of every converter: loading inputs, the ordered
//! parallel encoder, sharding (and the training/validation split), and the
//! all-or-nothing finish. [`super::driver`] runs them in order for every format.
//!
//! Determinism: work is cut into tasks (chunks of rows, ranges of images) in
//! input order; a window of tasks is encoded in parallel on worker threads,
//! and the results are handed on in task order to the writer threads, each of
//! which owns a fixed set of shards and writes the `n`-th record of a set if
//! it belongs to shard `n % shards`. So the bytes written never depend on the
//! thread count or on scheduling.
//!
//! The output seam: a shard is written through a [`RecordSink`] and sealed
//! into a [`PendingRecords`], and [`commit`] makes the whole set visible. Object
//! storage (an `s3://...` prefix, feature `object-store`) is one variant in
//! each and one arm in `commit`: an uncompleted multipart upload per shard,
//! completed at the commit in order (schema last), those completed deleted
//! again if a later one fails, the others aborted on drop; nothing else in
//! the converters knows where the bytes go.
//!
//! Safety: every local shard is written under a
//! temporary name and sealed (synced to disk) with `finish_pending`; only when
//! all shards and the schema file are complete are they switched into place
//! together as one [`FileSet`], the schema file last. On any error (or
//! cancellation) before that the pending files are dropped, which deletes
//! them; a failure during the switch puts the previous conversion's files
//! back.

use std::fs;
use std::io::{Read, Write};
use std::ops::Deref;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;

use serde_json::{Map, Value as Json, json};

use super::error::{ConvertError, ConvertOption, SourceLocation};
use super::{OutputOptions, Phase, Progress, Sharding, Split, SplitSummary, Summary};
use crate::atomic_file::{AtomicFile, FileSet};
use crate::example::Schema;
use crate::spawn::{self, Cancel, Panicked, Stopped};
use crate::tfrecord::{Compression, PendingRecords, RecordSink};

/// How often a conversion waiting for its workers looks at the cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// How many bad-row errors a conversion keeps to report (the rest are counted).
pub(crate) const BAD_ROWS_KEPT: usize = 5;

/// A whole input file in memory, decompressed when it starts with the gzip
/// magic bytes.
///
/// Inputs are read, not memory-mapped: a mapped file truncated by another
/// process while being converted kills the process with SIGBUS, with no
/// message and temporary shards left behind. Reading costs one copy at
/// memory speed (a few percent of a CSV conversion) and a file that changes
/// size while it is read is an error naming it.
pub(crate) struct Input(Vec<u8>);

impl Deref for Input {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Input {
    /// Loads `path`; gzip input (by its magic bytes, not its name) is
    /// decompressed, so byte offsets in errors are in the uncompressed data.
    pub(crate) fn load(path: &Path) -> Result<Input, ConvertError> {
        let mut file = fs::File::open(path).map_err(|e| ConvertError::read(path, e))?;
        let meta = file.metadata().map_err(|e| ConvertError::read(path, e))?;
        let len = meta.len();
        let mut magic = [0u8; 2];
        let n = file
            .read(&mut magic)
            .map_err(|e| ConvertError::read(path, e))?;
        if n == 2 && magic == [0x1f, 0x8b] {
            let file = fs::File::open(path).map_err(|e| ConvertError::read(path, e))?;
            let mut out = Vec::with_capacity((len as usize).saturating_mul(4));
            let mut decoder = flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file));
            decoder
                .read_to_end(&mut out)
                .map_err(|source| ConvertError::Gzip {
                    path: path.to_path_buf(),
                    offset: out.len() as u64,
                    source,
                })?;
            return Ok(Input(out));
        }
        let mut out = Vec::with_capacity(if meta.is_file() { len as usize } else { 0 });
        out.extend_from_slice(&magic[..n]);
        file.read_to_end(&mut out)
            .map_err(|e| ConvertError::read(path, e))?;
        if meta.is_file() && out.len() as u64 != len {
            return Err(ConvertError::Changed {
                path: path.to_path_buf(),
                expected: len,
                read: out.len() as u64,
            });
        }
        Ok(Input(out))
    }
}

/// What a conversion shares with its workers: the thread count, the cancel flag, and
/// the progress counters.
pub(crate) struct Ctx<'a> {
    pub(crate) options: &'a OutputOptions,
    pub(crate) threads: usize,
    started: Instant,
    bytes_done: AtomicU64,
    records_done: AtomicU64,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(options: &'a OutputOptions) -> Result<Self, ConvertError> {
        let threads = if options.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            options.threads
        };
        Ok(Ctx {
            options,
            threads,
            started: Instant::now(),
            bytes_done: AtomicU64::new(0),
            records_done: AtomicU64::new(0),
        })
    }

    pub(crate) fn check_cancel(&self) -> Result<(), ConvertError> {
        match &self.options.cancel {
            Some(flag) if flag.load(Ordering::Relaxed) => Err(ConvertError::Interrupted),
            _ => Ok(()),
        }
    }

    /// Starts a phase of `bytes_total` input bytes.
    pub(crate) fn begin_phase(&self, phase: Phase, bytes_total: u64) {
        self.bytes_done.store(0, Ordering::Relaxed);
        self.records_done.store(0, Ordering::Relaxed);
        self.report(phase, bytes_total);
    }

    /// Counts work done and tells the progress callback.
    pub(crate) fn advance(&self, phase: Phase, bytes_total: u64, bytes: u64, records: u64) {
        self.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        self.records_done.fetch_add(records, Ordering::Relaxed);
        self.report(phase, bytes_total);
    }

    fn report(&self, phase: Phase, bytes_total: u64) {
        if let Some(callback) = &self.options.progress {
            callback(&Progress {
                phase,
                bytes_done: self.bytes_done.load(Ordering::Relaxed),
                bytes_total,
                records: self.records_done.load(Ordering::Relaxed),
            });
        }
    }

    pub(crate) fn elapsed_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Runs `work` over `tasks` on `threads` worker threads and hands the
    /// results to `consume` in task order on the calling thread. At most a
    /// window of tasks is in flight (taken but not yet consumed), which bounds
    /// memory; within it a worker takes the next task as soon as it is free,
    /// so no thread waits for a whole batch to finish (a barrier per batch
    /// left a core idle at every batch end). Stops at the first error (from
    /// `work`, in task order, or from `consume`) or on cancel.
    ///
    /// No hang is possible: every task taken yields exactly one result, a
    /// panic in `work` included (it becomes [`ConvertError::Panicked`] at the
    /// input position `locate` gives for the task), and the wait for results
    /// wakes on the cancel flag.
    pub(crate) fn run_ordered<T, R, F, L, C>(
        &self,
        tasks: Vec<T>,
        work: F,
        locate: L,
        mut consume: C,
    ) -> Result<(), ConvertError>
    where
        T: Send + Clone,
        R: Send,
        F: Fn(T) -> Result<R, ConvertError> + Sync + Send,
        L: Fn(&T) -> SourceLocation + Sync + Send,
        C: FnMut(R) -> Result<(), ConvertError> + Send,
    {
        let window = (self.threads * 4).max(2);
        let (work, locate) = (&work, &locate);
        let stop = Cancel::new();
        std::thread::scope(|scope| {
            // Both channels hold at most `window` items: never more are in flight,
            // so no worker ever blocks on sending a result.
            let (task_tx, task_rx) = crossbeam_channel::bounded::<(usize, T)>(window);
            let (done_tx, done_rx) =
                crossbeam_channel::bounded::<(usize, Result<R, ConvertError>)>(window);
            let mut workers = Vec::with_capacity(self.threads);
            for i in 0..self.threads {
                let (task_rx, done_tx) = (task_rx.clone(), done_tx.clone());
                let worker =
                    spawn::scoped(scope, format!("convert-{i}"), stop.clone(), move |stop| {
                        while let Ok((index, task)) = stop.recv(&task_rx) {
                            let kept = task.clone();
                            let result = catch_unwind(AssertUnwindSafe(|| work(task)))
                                .unwrap_or_else(|payload| {
                                    Err(ConvertError::Panicked {
                                        location: Box::new(locate(&kept)),
                                        source: Box::new(Panicked {
                                            thread: format!("convert-{i}"),
                                            message: spawn::panic_message(payload.as_ref()),
                                        }),
                                    })
                                });
                            if stop.send(&done_tx, (index, result)).is_err() {
                                break;
                            }
                        }
                    })
                    .map_err(|source| ConvertError::Spawn {
                        threads: self.threads,
                        source,
                    })?;
                workers.push(worker);
            }
            drop((task_rx, done_tx));
            let mut tasks = tasks.into_iter().enumerate();
            let mut in_flight = 0usize;
            let mut next = 0usize;
            let mut early = std::collections::BTreeMap::new();
            let result = loop {
                if let Err(e) = self.check_cancel() {
                    break Err(e);
                }
                while in_flight < window {
                    let Some(task) = tasks.next() else { break };
                    // Cannot block: the channel has room for `window`.
                    if task_tx.send(task).is_err() {
                        break;
                    }
                    in_flight += 1;
                }
                if in_flight == 0 {
                    break Ok(());
                }
                let (index, result) = match done_rx.recv_timeout(CANCEL_POLL) {
                    Ok(got) => got,
                    // Look at the cancel flag again.
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break Err(ConvertError::WorkersGone),
                };
                // Held until its turn: only the first error in task order counts.
                early.insert(index, result);
                let mut failed = None;
                while let Some(result) = early.remove(&next) {
                    next += 1;
                    in_flight -= 1;
                    if let Err(e) = result.and_then(&mut consume) {
                        failed = Some(e);
                        break;
                    }
                }
                if let Some(e) = failed {
                    break Err(e);
                }
            };
            stop.cancel();
            drop(task_tx);
            drop(done_rx);
            for worker in workers {
                // Bodies cannot panic outside `work`, which is caught above.
                if let Err(panicked) = worker.join()
                    && result.is_ok()
                {
                    return Err(ConvertError::Thread(panicked));
                }
            }
            result
        })
    }
}

impl Ctx<'_> {
    /// Encodes `tasks` with `work` (in parallel, see [`Ctx::run_ordered`])
    /// and writes the records to the shard sets of `plans` (one set, or the
    /// training and validation sets of a split): good record `g` goes to set
    /// `split.set_of(g)` (set 0 without a split), and the `n`-th record of
    /// set `s` to its shard `n % shards`. Writer threads (up to one per
    /// encoding thread) each own some shards and compress and write them in
    /// parallel; each gets every chunk, in order, and writes the records of
    /// its shards. Returns the closed shards per set, in shard order, still
    /// under temporary names.
    pub(crate) fn write_shards<T, F, L>(
        &self,
        plans: &[Vec<u64>],
        split: Option<&SplitPlan>,
        bytes_total: u64,
        tasks: Vec<T>,
        work: F,
        locate: L,
    ) -> Result<Vec<Vec<ShardDone>>, ConvertError>
    where
        T: Send + Clone,
        F: Fn(T) -> Result<Chunk, ConvertError> + Sync + Send,
        L: Fn(&T) -> SourceLocation + Sync + Send,
    {
        let sizes: Vec<usize> = plans.iter().map(Vec::len).collect();
        let flat: usize = sizes.iter().sum();
        let writers = self.threads.clamp(1, flat.max(1));
        let stop = Cancel::new();
        std::thread::scope(|scope| {
            let mut senders = Vec::with_capacity(writers);
            let mut handles = Vec::with_capacity(writers);
            for w in 0..writers {
                let (tx, rx) = crossbeam_channel::bounded::<(u64, Arc<Chunk>)>(4);
                senders.push(tx);
                let job = WriterJob {
                    options: self.options,
                    sizes: &sizes,
                    writers,
                    w,
                    split,
                };
                let writer = spawn::scoped(
                    scope,
                    format!("convert-writer-{w}"),
                    stop.clone(),
                    move |stop| job.run(rx, stop),
                )
                .map_err(|source| ConvertError::Spawn {
                    threads: writers,
                    source,
                })?;
                handles.push(writer);
            }
            let mut next = 0u64;
            let encoded = self.run_ordered(tasks, work, locate, |chunk: Chunk| {
                let (records, bytes) = (chunk.ends.len() as u64, chunk.bytes_in);
                let chunk = Arc::new(chunk);
                for tx in &senders {
                    // A closed channel means that writer failed; its error wins below.
                    stop.send(tx, (next, chunk.clone()))
                        .map_err(|_| ConvertError::WorkersGone)?;
                }
                next += records;
                self.advance(Phase::Encoding, bytes_total, bytes, records);
                Ok(())
            });
            if encoded.is_err() {
                stop.cancel();
            }
            drop(senders);
            let mut done: Vec<Vec<Option<ShardDone>>> = sizes
                .iter()
                .map(|&n| (0..n).map(|_| None).collect())
                .collect();
            let mut failed = None;
            for handle in handles {
                match handle.join() {
                    Ok(Ok(list)) => {
                        for ((s, k), shard) in list {
                            done[s][k] = Some(shard);
                        }
                    }
                    // A writer stopped by `stop` after the encoder failed
                    // reports Interrupted: not the cause. But when the
                    // encoder failed only because a writer had gone (its
                    // send found the channel closed), that writer's error is
                    // the cause, Interrupted included (it saw the user's
                    // cancel first).
                    Ok(Err(ConvertError::Interrupted))
                        if encoded
                            .as_ref()
                            .is_err_and(|e| !matches!(e, ConvertError::WorkersGone)) => {}
                    Ok(Err(e)) => {
                        failed.get_or_insert(e);
                    }
                    Err(panicked) => {
                        failed.get_or_insert(ConvertError::Thread(panicked));
                    }
                }
            }
            match (encoded, failed) {
                (Err(ConvertError::Interrupted), _) => return Err(ConvertError::Interrupted),
                (_, Some(e)) => return Err(e),
                (Err(e), None) => return Err(e),
                (Ok(()), None) => {}
            }
            let mut out = Vec::with_capacity(plans.len());
            for (plan, set) in plans.iter().zip(done) {
                let mut shards = Vec::with_capacity(plan.len());
                for (k, shard) in set.into_iter().enumerate() {
                    match shard {
                        Some(shard) if shard.records == plan[k] => shards.push(shard),
                        _ => return Err(ConvertError::CountChanged),
                    }
                }
                out.push(shards);
            }
            Ok(out)
        })
    }
}

/// A shard's place: (set, shard index in the set).
type ShardAt = (usize, usize);

/// One writer thread's share: of all shards of all sets, numbered in one
/// flat sequence (set 0's shards first), it owns those with
/// `flat % writers == w`.
struct WriterJob<'a> {
    options: &'a OutputOptions,
    /// Shards per set.
    sizes: &'a [usize],
    writers: usize,
    w: usize,
    split: Option<&'a SplitPlan>,
}

impl WriterJob<'_> {
    /// Writes, from every chunk, the records that fall in this writer's
    /// shards; returns them sealed as `((set, shard), done)`.
    fn run(
        self,
        rx: crossbeam_channel::Receiver<(u64, Arc<Chunk>)>,
        stop: &Cancel,
    ) -> Result<Vec<(ShardAt, ShardDone)>, ConvertError> {
        let offsets: Vec<usize> = self
            .sizes
            .iter()
            .scan(0, |acc, &n| {
                let at = *acc;
                *acc += n;
                Some(at)
            })
            .collect();
        let mut files: Vec<Option<(ShardAt, RecordSink)>> = Vec::new();
        for (s, &n) in self.sizes.iter().enumerate() {
            for k in 0..n {
                let flat = offsets[s] + k;
                files.push(if flat % self.writers == self.w {
                    let path = self.options.shard_file(s, k, n);
                    Some(((s, k), RecordSink::create(&path, self.options.compression)?))
                } else {
                    None
                });
            }
        }
        // Records so far per set: every writer sees every record in order.
        let mut seen = vec![0u64; self.sizes.len()];
        loop {
            let (first, chunk) = match stop.recv(&rx) {
                Ok(got) => got,
                Err(Stopped::Disconnected) => break,
                Err(Stopped::Cancelled) => return Err(ConvertError::Interrupted),
            };
            if let Some(flag) = &self.options.cancel
                && flag.load(Ordering::Relaxed)
            {
                return Err(ConvertError::Interrupted);
            }
            for (j, record) in chunk.records().enumerate() {
                let s = self.split.map_or(0, |p| p.set_of(first + j as u64));
                let k = (seen[s] % self.sizes[s] as u64) as usize;
                seen[s] += 1;
                if let Some(Some((_, file))) = files.get_mut(offsets[s] + k) {
                    file.write_record(record)?;
                }
            }
        }
        let mut done = Vec::new();
        for (at, file) in files.into_iter().flatten() {
            let (records, bytes) = (file.records(), file.bytes());
            let pending = file.finish_pending()?;
            done.push((
                at,
                ShardDone {
                    pending,
                    records,
                    bytes,
                },
            ));
        }
        Ok(done)
    }
}

/// Encoded records of one task, in order: `data[ends[i-1]..ends[i]]` is record i.
#[derive(Debug, Default)]
pub(crate) struct Chunk {
    pub(crate) data: Vec<u8>,
    pub(crate) ends: Vec<usize>,
    /// Input bytes this chunk covered (for progress).
    pub(crate) bytes_in: u64,
}

impl Chunk {
    pub(crate) fn records(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let record = &self.data[start..end];
            start = end;
            record
        })
    }

    /// Takes the records an encoder produced.
    pub(crate) fn fill(&mut self, encoder: super::encode::ExampleEncoder) {
        (self.data, self.ends) = encoder.into_parts();
    }
}

/// Records per shard for `total` records. Record `i` goes to shard
/// `i % shards` (as `tf.data.Dataset.shard` splits), so the counts differ by
/// at most one.
pub(crate) fn plan_shards(total: u64, sharding: Sharding, bytes_in: u64) -> Vec<u64> {
    let shards = match sharding {
        Sharding::Shards(n) => n.max(1) as u64,
        Sharding::RecordsPerShard(r) => total.div_ceil(r.max(1)).max(1),
        // About 128 MiB of input per shard, at least 1 shard.
        Sharding::Auto => bytes_in.div_ceil(128 << 20).clamp(1, 1024),
    };
    (0..shards)
        .map(|k| total / shards + u64::from(k < total % shards))
        .collect()
}

/// The name of shard `index` of `count`: `PREFIX-00003-of-00008.tfrecord[.gz]`.
pub fn shard_path(prefix: &Path, index: usize, count: usize, compression: Compression) -> PathBuf {
    let mut name = prefix.as_os_str().to_os_string();
    name.push(format!(
        "-{index:05}-of-{count:05}.tfrecord{}",
        compression.suffix()
    ));
    PathBuf::from(name)
}

/// The schema file's name: `PREFIX.features.json`.
pub fn schema_path(prefix: &Path) -> PathBuf {
    let mut name = prefix.as_os_str().to_os_string();
    name.push(".features.json");
    PathBuf::from(name)
}

/// The schema file a conversion wrote beside a shard named as
/// [`shard_path`] names them (`PREFIX-NNNNN-of-NNNNN.tfrecord[.gz|.zlib]`):
/// [`schema_path`]`(PREFIX)`, when it exists.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let shard = dir.path().join("train-00001-of-00004.tfrecord.gz");
/// assert_eq!(tfpipe::convert::schema_file_beside(&shard), None); // no schema file yet
/// std::fs::write(dir.path().join("train.features.json"), "{}")?;
/// assert_eq!(tfpipe::convert::schema_file_beside(&shard), Some(dir.path().join("train.features.json")));
/// assert_eq!(tfpipe::convert::schema_file_beside(&dir.path().join("other.tfrecord")), None);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn schema_file_beside(shard: &Path) -> Option<PathBuf> {
    let name = shard.file_name()?.to_str()?;
    let stem = name
        .strip_suffix(".gz")
        .or_else(|| name.strip_suffix(".zlib"))
        .unwrap_or(name)
        .strip_suffix(".tfrecord")?;
    // `-00003-of-00008`: 15 ASCII characters.
    let cut = stem.len().checked_sub(15)?;
    let (prefix, suffix) = (stem.get(..cut)?, stem.get(cut..)?);
    let b = suffix.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if !(b[0] == b'-' && digits(1..6) && &suffix[6..10] == "-of-" && digits(10..15)) {
        return None;
    }
    let path = schema_path(&shard.with_file_name(prefix));
    path.is_file().then_some(path)
}

/// A shard closed under its temporary name.
pub(crate) struct ShardDone {
    pending: PendingRecords,
    records: u64,
    bytes: u64,
}

/// Which good records go to the validation set of a split
/// (`--validation-fraction`): exactly `round(records * fraction)` of them,
/// chosen by selection sampling (Knuth's algorithm S) from a seeded
/// generator, so the choice depends only on the record count, the fraction
/// and the seed, never on threads or timing.
#[derive(Debug, Clone)]
pub(crate) struct SplitPlan {
    /// Bit `g` set: good record `g` is in the validation set.
    bits: Vec<u64>,
    /// Records per set: training, validation.
    pub(crate) counts: [u64; 2],
}

impl SplitPlan {
    pub(crate) fn new(records: u64, split: Split) -> Result<SplitPlan, ConvertError> {
        if !(split.fraction > 0.0 && split.fraction < 1.0) {
            return Err(ConvertError::options(
                ConvertOption::ValidationSplit,
                format!(
                    "validation fraction {}: expected a number between 0 and 1 (exclusive)",
                    split.fraction
                ),
            ));
        }
        let want = (records as f64 * split.fraction).round() as u64;
        if want == 0 || want == records {
            return Err(ConvertError::options(
                ConvertOption::ValidationSplit,
                format!(
                    "a validation fraction of {} of {records} records leaves the {} set empty",
                    split.fraction,
                    if want == 0 { "validation" } else { "training" }
                ),
            ));
        }
        let words = usize::try_from(records.div_ceil(64)).map_err(|_| {
            ConvertError::options(
                ConvertOption::ValidationSplit,
                format!("{records} records are too many to split"),
            )
        })?;
        let mut bits = vec![0u64; words];
        let mut rng = crate::rng::SplitMix64(split.seed);
        let mut chosen = 0u64;
        for g in 0..records {
            // Choose with probability (still wanted) / (still left).
            if rng.below(records - g) < want - chosen {
                bits[(g / 64) as usize] |= 1 << (g % 64);
                chosen += 1;
            }
        }
        Ok(SplitPlan {
            bits,
            counts: [records - want, want],
        })
    }

    /// 0 (training) or 1 (validation) for good record `g`.
    #[inline]
    pub(crate) fn set_of(&self, g: u64) -> usize {
        self.bits
            .get((g / 64) as usize)
            .map_or(0, |w| ((w >> (g % 64)) & 1) as usize)
    }
}

/// The names of the sets of a split, as they appear in shard names.
pub(crate) const SET_NAMES: [&str; 2] = ["train", "validation"];

/// What a format hands to [`finish`] besides the shards.
pub(crate) struct Finished {
    pub(crate) schema: Schema,
    pub(crate) format: &'static str,
    pub(crate) inputs: Vec<PathBuf>,
    pub(crate) bytes_in: u64,
    pub(crate) rows_skipped: u64,
    pub(crate) bad_rows: Vec<ConvertError>,
    /// Format-specific metadata (missing counts, label vocabulary, ...).
    pub(crate) extra: Map<String, Json>,
    /// Things the user should hear about (see [`Summary::warnings`]).
    pub(crate) warnings: Vec<String>,
}

/// Seals the schema file (with the counts as metadata) beside the shards and
/// switches shards and schema file into place together, the schema file last
/// ([`commit`]): all or nothing, and a failure at any step leaves the
/// previous conversion's files as they were.
pub(crate) fn finish(
    ctx: &Ctx<'_>,
    sets: Vec<Vec<ShardDone>>,
    split: Option<Split>,
    finished: Finished,
) -> Result<Summary, ConvertError> {
    ctx.check_cancel()?;
    let options = ctx.options;
    let mut per_set = Vec::with_capacity(sets.len());
    let mut shard_meta = Vec::new();
    let mut pending = Vec::new();
    let mut bytes_out = 0;
    let mut uncompressed = 0;
    for (s, shards) in sets.into_iter().enumerate() {
        let records: u64 = shards.iter().map(|d| d.records).sum();
        per_set.push((records, shards.len()));
        for shard in shards {
            let (name, size) = shard.pending.describe()?;
            bytes_out += size;
            uncompressed += shard.bytes;
            let mut meta = json!({
                "file": name,
                "records": shard.records,
                "bytes": shard.bytes,
                "file_bytes": size,
            });
            if split.is_some() {
                meta["split"] = json!(SET_NAMES[s]);
            }
            shard_meta.push(meta);
            pending.push((s, shard.pending));
        }
    }
    let records: u64 = per_set.iter().map(|p| p.0).sum();
    let mut metadata = Map::new();
    metadata.insert("records".into(), json!(records));
    metadata.insert("bytes".into(), json!(uncompressed));
    metadata.insert("file_bytes".into(), json!(bytes_out));
    metadata.insert("compression".into(), json!(options.compression.to_string()));
    metadata.insert("shards".into(), Json::Array(shard_meta));
    let mut source = Map::new();
    source.insert("format".into(), json!(finished.format));
    source.insert(
        "inputs".into(),
        json!(
            finished
                .inputs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
        ),
    );
    source.insert("bytes".into(), json!(finished.bytes_in));
    source.insert("rows_skipped".into(), json!(finished.rows_skipped));
    for (key, value) in finished.extra {
        source.insert(key, value);
    }
    metadata.insert("source".into(), Json::Object(source));
    if let Some(how) = split {
        let mut sets = Map::new();
        for (s, &(records, shards)) in per_set.iter().enumerate() {
            sets.insert(
                SET_NAMES[s].into(),
                json!({
                    "records": records,
                    "shards": shards,
                    "pattern": format!("{}-*", options.set_prefix(s).display()),
                }),
            );
        }
        metadata.insert(
            "split".into(),
            json!({ "validation_fraction": how.fraction, "seed": how.seed, "sets": sets }),
        );
    }
    if let Some(f) = options.fanout {
        metadata.insert(
            "fanout".into(),
            json!({
                "workers": f.workers,
                "total_shards": f.workers * pending.len(),
                "note": "records, bytes and shards above describe worker 0's part only",
            }),
        );
    }

    let schema_file = schema_path(&options.prefix);
    // In a fan-out, worker 0 writes the schema file (the fixed schema: the
    // same for every worker); the others write shards only.
    let writes_schema = options.fanout.is_none_or(|f| f.index == 0);
    let schema_text = if writes_schema {
        Some(finished.schema.to_file_text(&metadata)?)
    } else {
        None
    };
    ctx.check_cancel()?;
    let (sets_of, files): (Vec<usize>, Vec<PendingRecords>) = pending.into_iter().unzip();
    let paths = commit(
        files,
        schema_text
            .as_ref()
            .map(|t| (schema_file.as_path(), t.as_bytes())),
        &mut |_| Ok(()),
    )?;
    let mut shards_by_set: Vec<Vec<PathBuf>> = vec![Vec::new(); per_set.len()];
    for (s, path) in sets_of.into_iter().zip(paths) {
        shards_by_set[s].push(path);
    }
    let stale = if options.fanout.is_some() {
        Vec::new() // the other workers' shards match the pattern too
    } else {
        shards_by_set
            .iter()
            .enumerate()
            .flat_map(|(s, current)| stale_shards(&options.set_prefix(s), current))
            .collect()
    };
    let mut sets = shards_by_set.into_iter();
    let shards = sets.next().unwrap_or_default();
    let validation = sets.next().map(|shards| SplitSummary {
        records: per_set.get(1).map_or(0, |p| p.0),
        shards,
    });
    Ok(Summary {
        stale_shards: stale,
        records,
        rows_skipped: finished.rows_skipped,
        bad_rows: finished.bad_rows,
        warnings: finished.warnings,
        bytes_in: finished.bytes_in,
        bytes_out,
        shards,
        validation,
        schema_path: schema_file,
        schema: finished.schema,
        seconds: ctx.elapsed_secs(),
    })
}

impl PendingRecords {
    /// The final file name and the size on disk.
    fn describe(&self) -> Result<(Option<String>, u64), ConvertError> {
        match self {
            PendingRecords::File(file) => {
                let size = fs::metadata(file.temp_path())
                    .map_err(|source| ConvertError::Output {
                        path: file.path().to_path_buf(),
                        source,
                    })?
                    .len();
                let name = file
                    .path()
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned());
                Ok((name, size))
            }
            #[cfg(feature = "object-store")]
            PendingRecords::Object(object) => {
                let name = Path::new(object.url())
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned());
                Ok((name, object.bytes()))
            }
        }
    }
}

/// The commit: switches every shard and then the schema file (when this
/// conversion writes one) into place as one [`FileSet`], all or nothing;
/// returns the shards' final paths. `before` is called before each rename
/// with its index; tests fail there (see [`fail_commit_at`]) to check that a
/// failure at any step, after some renames included, leaves the previous
/// conversion whole.
pub(crate) fn commit(
    shards: Vec<PendingRecords>,
    schema: Option<(&Path, &[u8])>,
    before: &mut dyn FnMut(usize) -> std::io::Result<()>,
) -> Result<Vec<PathBuf>, ConvertError> {
    let mut set = FileSet::new();
    #[cfg(feature = "object-store")]
    let mut objects = Vec::new();
    let count = shards.len();
    for shard in shards {
        match shard {
            PendingRecords::File(file) => set.push(file.into_pending()),
            #[cfg(feature = "object-store")]
            PendingRecords::Object(object) => objects.push(object),
        }
    }
    // An object-store prefix: shards and schema are objects, completed in
    // order (the schema last); a failure deletes those completed.
    #[cfg(feature = "object-store")]
    if !objects.is_empty() {
        if let Some((path, text)) = schema {
            let url = path.to_string_lossy();
            objects.push(crate::storage::PendingObject::upload(&url, text)?);
        }
        let mut paths = crate::storage::commit_objects(objects, &mut |i| {
            before(i).and_then(|()| injected_failure(i))
        })?;
        paths.truncate(count);
        return Ok(paths);
    }
    if let Some((path, text)) = schema {
        let mut out = AtomicFile::create(path)?;
        out.write_all(text).map_err(|source| ConvertError::Output {
            path: path.to_path_buf(),
            source,
        })?;
        set.push(out.seal()?);
    }
    let mut paths = set.commit_with(|i| before(i).and_then(|()| injected_failure(i)))?;
    paths.truncate(count);
    Ok(paths)
}

#[cfg(test)]
thread_local! {
    static FAIL_AT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Makes conversions on this thread fail just before rename `at` of their
/// commit (`None`: not at all). Tests only.
#[cfg(test)]
pub(crate) fn fail_commit_at(at: Option<usize>) {
    FAIL_AT.with(|cell| cell.set(at));
}

#[cfg(test)]
fn injected_failure(i: usize) -> std::io::Result<()> {
    match FAIL_AT.with(|at| at.get()) {
        Some(n) if n == i => Err(std::io::Error::other("injected commit failure")),
        _ => Ok(()),
    }
}

#[cfg(not(test))]
fn injected_failure(_i: usize) -> std::io::Result<()> {
    Ok(())
}

/// Shards of an earlier conversion under the same prefix with another shard
/// count: they would match `PREFIX-*` too, so the caller warns about them
/// (they are not ours to delete).
fn stale_shards(prefix: &Path, current: &[PathBuf]) -> Vec<PathBuf> {
    let pattern = format!(
        "{}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].tfrecord*",
        glob::Pattern::escape(&prefix.to_string_lossy())
    );
    match glob::glob(&pattern) {
        Ok(paths) => paths
            .filter_map(Result::ok)
            .filter(|p| !current.contains(p))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Collects bad rows under `--skip-bad-rows`: keeps the first few, counts all.
#[derive(Debug, Default)]
pub(crate) struct BadRows {
    pub(crate) count: u64,
    pub(crate) kept: Vec<ConvertError>,
}

impl BadRows {
    pub(crate) fn push(&mut self, error: ConvertError) {
        self.count += 1;
        if self.kept.len() < BAD_ROWS_KEPT {
            self.kept.push(error);
        }
    }

    pub(crate) fn merge(&mut self, other: BadRows) {
        self.count += other.count;
        for e in other.kept {
            if self.kept.len() < BAD_ROWS_KEPT {
                self.kept.push(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_task_is_an_error_at_its_position_and_never_a_hang() {
        for threads in [1, 2, 4] {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let _driver = crate::spawn::Thread::spawn("test-driver", move |_| {
                let options = OutputOptions {
                    threads,
                    ..OutputOptions::new("unused")
                };
                let Ok(ctx) = Ctx::new(&options) else { return };
                let mut seen = Vec::new();
                let result = ctx.run_ordered(
                    (0..100u64).collect(),
                    |t| {
                        if t == 37 {
                            panic!("boom at {t}")
                        } else {
                            Ok(t)
                        }
                    },
                    |&t| SourceLocation::at_byte(Path::new("in.bin"), t * 10),
                    |t| {
                        seen.push(t);
                        Ok(())
                    },
                );
                let _ = tx.send((result, seen));
            })
            .expect("spawn");
            let (result, seen) = rx
                .recv_timeout(Duration::from_secs(120))
                .expect("run_ordered hung after a panic");
            assert_eq!(seen, (0..37).collect::<Vec<_>>(), "{threads} threads");
            match result {
                Err(ConvertError::Panicked { location, source }) => {
                    assert_eq!(location.byte, 370);
                    assert!(source.message.contains("boom at 37"), "{source}");
                }
                other => panic!("expected a panic error, got {other:?}"),
            }
        }
    }

    #[test]
    fn shard_plans_cover_every_record() {
        assert_eq!(plan_shards(10, Sharding::Shards(3), 0), vec![4, 3, 3]);
        assert_eq!(plan_shards(2, Sharding::Shards(3), 0), vec![1, 1, 0]);
        assert_eq!(
            plan_shards(10, Sharding::RecordsPerShard(4), 0),
            vec![4, 3, 3]
        );
        assert_eq!(plan_shards(8, Sharding::RecordsPerShard(4), 0), vec![4, 4]);
        assert_eq!(plan_shards(5, Sharding::Auto, 1000), vec![5]);
        assert_eq!(plan_shards(0, Sharding::Shards(2), 0), vec![0, 0]);
    }

    #[test]
    fn shard_names() {
        let p = shard_path(Path::new("out/mnist"), 3, 8, Compression::Gzip);
        assert_eq!(p, PathBuf::from("out/mnist-00003-of-00008.tfrecord.gz"));
        assert_eq!(
            schema_path(Path::new("out/mnist")),
            PathBuf::from("out/mnist.features.json")
        );
    }
}
