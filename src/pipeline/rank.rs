//! Ranks: each process of a data-parallel job reads its own share of the files.
//!
//! [`TfRecordFiles::rank`] gives rank `r` of `w` a share that is disjoint
//! from every other rank's, and every rank gets the *same number of records
//! per epoch*, so that collective training (an all-reduce per step) never
//! waits forever on a rank that ran out of data:
//!
//! The files in order are one run of `n` records, cut into `w` consecutive
//! runs: rank `r`'s run starts at record `r * (n / w) + min(r, n % w)` and
//! is `n / w` records long, one more for the first `n % w` ranks. A file
//! inside a run is read whole, as a file of its own in the interleave; a
//! file that a cut falls in is read in part by the two ranks it is cut
//! between ([`ShareBy::Record`]):
//!
//! - **through the record index**, when every file is uncompressed and has
//!   one beside it (`FILE.idx`, from `tfpipe index`; see [`IndexedFiles`]):
//!   the counts are a lookup (nothing is read to plan), and a run that
//!   starts inside a file opens it at that record's offset. Each file's
//!   records are counted as they are read: a file holding other records
//!   than its index lists (rewritten in place at the same size, which the
//!   index's size check cannot see) ends in an error naming it, never in
//!   an uneven share;
//! - **else by reading and dropping** the records of that file before the
//!   run (one file's worth at most); [`RankShare::warning`] says when a
//!   rank drops more than it keeps. An index that exists but disagrees with
//!   its file (wrong size, malformed) is not used: the warning says so.
//!
//! So a rank reads its own records and at most part of one more file,
//! whatever the number of files (one file for eight ranks, or eight files
//! for three). With [`Remainder::Drop`] every rank stops after `n / w`
//! records, like PyTorch's `DistributedSampler(drop_last=True)`: the shares
//! are disjoint, equal, and together cover every record but the last record
//! of each of the first `n % w` runs, fewer than `w` records per epoch (the
//! same ones each epoch: a shuffle after this stage mixes the rest, not the
//! choice of what is dropped). [`RankShare::dropped`] and
//! [`RankShare::dropped_total`] say how many. [`Remainder::Keep`] keeps
//! every record (shares then differ by one): for prediction, where no rank
//! waits for another.
//!
//! Equal counts need the counts: without indexes, `rank` reads the framing
//! of every file once (all of them, on every rank: where the cuts fall
//! depends on every file's count).
//!
//! # Launchers
//!
//! [`Rank::from_env`] reads `RANK` and `WORLD_SIZE` as `torchrun`, Slurm
//! wrappers and Kubernetes indexed Jobs set them (and, inside an `srun`
//! step, `SLURM_PROCID`/`SLURM_NTASKS`; see [`Rank::from_vars`]), and
//! [`Rank::local_rank_from_env`] `LOCAL_RANK`, the device index on a node.
//! The command line's `--rank R --world-size W` (on `train`, `bench`,
//! `predict`) override them.
//!
//! # A multi-GPU data-parallel run (design notes; no multi-GPU code here)
//!
//! How a run on `W` GPUs would use this with candle (`candle-core`'s `nccl`
//! feature, which exposes `cudarc`'s NCCL bindings):
//!
//! 1. **Processes.** The launcher starts one process per GPU
//!    (`torchrun --nproc-per-node 8 tfpipe train ...`, `srun -n 8 ...`)
//!    with `RANK`, `WORLD_SIZE` and `LOCAL_RANK` set. Each process drives
//!    `cuda:LOCAL_RANK` (`--device cuda` picks it).
//! 2. **Each rank's pipeline.** Every process builds the *same* plan with
//!    `.rank(rank, Remainder::Drop)` right after the file list, so its
//!    batches come from its own disjoint share. The shuffle seed and its
//!    per-epoch schedule are the same on every rank: the shares are
//!    already disjoint, so equal seeds duplicate nothing, and a rank's order
//!    depends only on the seed, the epoch and its rank.
//! 3. **Equal steps.** With [`Remainder::Drop`] (PyTorch's
//!    `DistributedSampler(drop_last=True)`), every rank reads the same
//!    number of records per epoch, hence (same batch size) the same number
//!    of steps, so every rank reaches every all-reduce. An uneven share
//!    would leave the others blocked in NCCL forever. The dropped records
//!    are the last record of the longer runs, at most `W - 1` records per
//!    epoch.
//! 4. **Gradient all-reduce.** Rank 0 creates an NCCL `Id` (`cudarc::nccl::Id::new`)
//!    and hands its 128 bytes to the others out of band (a file on shared
//!    storage, or the launcher's rendezvous); each process builds its
//!    `Comm::from_rank(stream, rank, world_size, id)`. Every step each rank
//!    computes the loss on its own batch and runs backward; then, for each
//!    gradient (in the same order on every rank), `all_reduce_in_place`
//!    with `Sum` over its device buffer and a division by `W` turns the
//!    local gradients into the global mean. Every rank then applies the same
//!    optimizer update to identical weights, so the weights stay identical
//!    without being broadcast (rank 0's initial weights are broadcast once,
//!    or every rank initialises from the same seed). The batch size per
//!    step is `W` times the per-rank batch size; scale the learning rate as
//!    usual.
//! 5. **Checkpoints.** Rank 0 writes the weights and optimizer state (they
//!    are the same on every rank). Each rank's pipeline state
//!    ([`PipelineIter::state`](super::PipelineIter::state), about 150 KB
//!    for a 10k shuffle buffer) is its own, saved per rank beside them
//!    (`pipeline_state.RANK.json`), written after the same step on every
//!    rank; on resume each rank restores its own and continues its share at
//!    its next record. A restart with another `W` cannot reuse per-rank
//!    states (the shares differ): it resumes at the epoch boundary.
//! 6. **Evaluation.** Either every rank evaluates the whole validation set
//!    (the CLI's choice: identical numbers everywhere, no communication),
//!    or each its share with [`Remainder::Keep`] and the metric sums
//!    all-reduced.

use std::path::PathBuf;
use std::sync::Arc;

use super::state::{Sequential, StateError};
use super::tfrecord::FileAhead;
use super::{Env, Event, Pipeline, PipelineError, Record, Stream, TfRecordFiles};
use crate::storage::ReadOptions;
use crate::tfrecord::{Compression, FileRecordReader, Position, ReaderOptions};
use crate::tfrecord::{IndexError, IndexProblem, IndexedFiles};

/// One process's place in a data-parallel job: `rank` of `world_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    rank: usize,
    world_size: usize,
}

/// What the environment says about ranks, when it says something unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RankError {
    /// `rank >= world_size`, or a world size of 0.
    #[error("rank {rank} of world size {world_size}: needs world_size > 0 and rank < world_size")]
    OutOfRange {
        /// The rank given.
        rank: usize,
        /// The world size given.
        world_size: usize,
    },
    /// A world size beyond [`MAX_WORLD_SIZE`]: no launcher starts that many
    /// processes, and the shares' bookkeeping would not fit in memory.
    #[error("world size {world_size} is implausible (at most {max} processes)", max = MAX_WORLD_SIZE)]
    TooLarge {
        /// The world size given.
        world_size: usize,
    },
    /// A variable is not a number.
    #[error("environment variable {name}={value:?}: expected a non-negative integer")]
    NotANumber {
        /// The environment variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// Only one of `RANK` and `WORLD_SIZE` is set.
    #[error("environment variable {missing} is not set, but {set} is: set both or neither")]
    Incomplete {
        /// The variable that is set.
        set: &'static str,
        /// The variable that is missing.
        missing: &'static str,
    },
}

/// The most processes a [`Rank`] may count (2^20, ten times the largest
/// training jobs run): a larger world size is refused before anything is
/// allocated for it.
pub const MAX_WORLD_SIZE: usize = 1 << 20;

impl Rank {
    /// Rank `rank` of `world_size` processes.
    pub fn new(rank: usize, world_size: usize) -> Result<Rank, RankError> {
        if world_size > MAX_WORLD_SIZE {
            return Err(RankError::TooLarge { world_size });
        }
        if world_size == 0 || rank >= world_size {
            return Err(RankError::OutOfRange { rank, world_size });
        }
        Ok(Rank { rank, world_size })
    }

    /// This process's rank (zero-based).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The launcher's rank from the environment: `None` when no launcher
    /// set one (see [`from_vars`](Self::from_vars) for the variables).
    pub fn from_env() -> Result<Option<Rank>, RankError> {
        Rank::from_vars(|name| std::env::var(name).ok())
    }

    /// The launcher's rank from the variables `var` looks up:
    ///
    /// 1. `RANK` and `WORLD_SIZE` (torchrun, Kubernetes indexed Jobs with
    ///    them set, most wrappers), both or neither;
    /// 2. else, inside a Slurm job step (`srun`, which sets `SLURM_STEP_ID`),
    ///    `SLURM_PROCID` of `SLURM_NTASKS`. A batch script itself also has
    ///    `SLURM_PROCID=0` and `SLURM_NTASKS=N` without being one of `N`
    ///    cooperating tasks, so those count only in a step. Array jobs
    ///    (`SLURM_ARRAY_TASK_ID`) are often independent runs (a sweep),
    ///    so they set no rank: pass `--rank`/`--world-size` (or `Rank::new`)
    ///    explicitly to shard over an array.
    ///
    /// ```
    /// use tfpipe::pipeline::Rank;
    /// let vars = |name: &str| match name {
    ///     "RANK" => Some("3".to_string()),
    ///     "WORLD_SIZE" => Some("8".to_string()),
    ///     _ => None,
    /// };
    /// assert_eq!(Rank::from_vars(vars)?, Some(Rank::new(3, 8)?));
    /// assert_eq!(Rank::from_vars(|_| None)?, None);
    /// # Ok::<(), tfpipe::pipeline::RankError>(())
    /// ```
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Rank>, RankError> {
        if let Some(rank) = pair(&var, "RANK", "WORLD_SIZE")? {
            return Ok(Some(rank));
        }
        if var("SLURM_STEP_ID").is_some() {
            return pair(&var, "SLURM_PROCID", "SLURM_NTASKS");
        }
        Ok(None)
    }

    /// `LOCAL_RANK` from the environment (the device index on this node).
    pub fn local_rank_from_env() -> Result<Option<usize>, RankError> {
        Rank::local_rank_from_vars(|name| std::env::var(name).ok())
    }

    /// `LOCAL_RANK`, else `SLURM_LOCALID` inside a Slurm job step: the
    /// device index on this node.
    pub fn local_rank_from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<usize>, RankError> {
        if let Some(local) = number(&var, "LOCAL_RANK")? {
            return Ok(Some(local));
        }
        if var("SLURM_STEP_ID").is_some() {
            return number(&var, "SLURM_LOCALID");
        }
        Ok(None)
    }
}

/// The rank `rank_var` of `world_var`: both or neither.
fn pair(
    var: &impl Fn(&str) -> Option<String>,
    rank_var: &'static str,
    world_var: &'static str,
) -> Result<Option<Rank>, RankError> {
    match (number(var, rank_var)?, number(var, world_var)?) {
        (None, None) => Ok(None),
        (Some(rank), Some(world_size)) => Rank::new(rank, world_size).map(Some),
        (Some(_), None) => Err(RankError::Incomplete {
            set: rank_var,
            missing: world_var,
        }),
        (None, Some(_)) => Err(RankError::Incomplete {
            set: world_var,
            missing: rank_var,
        }),
    }
}

fn number(
    var: &impl Fn(&str) -> Option<String>,
    name: &'static str,
) -> Result<Option<usize>, RankError> {
    match var(name) {
        Some(value) => match value.trim().parse() {
            Ok(n) => Ok(Some(n)),
            Err(_) => Err(RankError::NotANumber { name, value }),
        },
        None => Ok(None),
    }
}

/// What to do with the records that make one share longer than another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Remainder {
    /// Every rank stops at the smallest share's count (`drop_last=True`), so
    /// all ranks run the same number of steps. The default.
    #[default]
    Drop,
    /// Keep every record; shares may differ in size (for prediction).
    Keep,
}

/// How this rank's share cuts the files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareBy {
    /// Whole files only.
    File,
    /// At least one file read in part (a cut between two ranks' runs falls
    /// inside it).
    Record,
}

/// This rank's share, as [`TfRecordFiles::rank`] planned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankShare {
    /// The rank.
    pub rank: Rank,
    /// By file or by record.
    pub by: ShareBy,
    /// Records this rank reads per epoch (after any drop).
    pub records: u64,
    /// Records in all files.
    pub total_records: u64,
    /// Records of this rank's share dropped per epoch to equalise the ranks.
    pub dropped: u64,
    /// Records dropped per epoch over all ranks.
    pub dropped_total: u64,
    /// Something the user should know about balance, if anything.
    pub warning: Option<String>,
}

/// The rank setting a [`TfRecordFiles`] applies when it becomes records.
#[derive(Debug, Clone)]
pub(crate) struct RankPlan {
    pub(crate) share: RankShare,
    /// This rank's run of records, file by file, in order.
    pub(crate) segments: Vec<Segment>,
    /// The files' record indexes, when every file has one.
    indexed: Option<IndexedFiles>,
    /// The ranks whose shares this one splits further (a rank of a rank,
    /// such as a data loader's worker within a process's share), outermost
    /// first.
    outer: Vec<Rank>,
}

/// The part of one file a share reads: `len` records from record `first`
/// on (to the file's end when `to_end`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    /// The file's place in the file list (for its record index).
    file: usize,
    /// The first record of the share in this file.
    first: u64,
    /// Where record `first` starts, from the record index; `None` when the
    /// records before it are read and dropped.
    start: Option<Position>,
    /// Records to read.
    len: u64,
    /// Whether they run to the file's end (then the file is read to its
    /// end, not cut at `len`).
    to_end: bool,
    /// Whether `len` comes from the file's record index: the records read
    /// are then checked to be exactly `len`, so that a stale index (a file
    /// rewritten at the same size) fails instead of unbalancing the ranks.
    indexed: bool,
}

impl Segment {
    /// All of `path` (its record count unknown: a file not ranked).
    pub(crate) fn whole_file(path: PathBuf) -> Segment {
        Segment {
            path,
            file: 0,
            first: 0,
            start: None,
            len: 0,
            to_end: true,
            indexed: false,
        }
    }

    /// The segment's records, its file read as `read` says, through the
    /// interleave's read-ahead where there is one.
    pub(crate) fn records(
        &self,
        options: &ReaderOptions,
        read: &ReadOptions,
        ahead: Option<FileAhead>,
    ) -> Pipeline<Record> {
        let from = |start| {
            let (options, read, ahead) = (options.clone(), read.clone(), ahead.clone());
            Pipeline::tfrecord_file_read(&self.path, options, read, start, ahead)
        };
        let records = match self.start {
            Some(start) => from(start),
            None if self.first > 0 => from(Position::default()).skip(self.first),
            None => from(Position::default()),
        };
        let records = match self.to_end {
            true => records,
            false => records.take(self.len),
        };
        match self.indexed {
            true => expect_count(records, self.path.clone(), self.first, self.len),
            false => records,
        }
    }

    /// Its path, where its file may be opened ahead of its turn: an object
    /// read from its start (a segment a record index starts past it opens
    /// with a `HEAD` and a ranged GET instead).
    pub(crate) fn opens_ahead(&self) -> Option<PathBuf> {
        let object = crate::storage::is_url(&self.path);
        (object && self.start.is_none()).then(|| self.path.clone())
    }

    /// Whether the segment is a whole file.
    fn whole(&self) -> bool {
        self.first == 0 && self.to_end
    }
}

/// The run of records `[from, to)` of `base` (segments in order), as one
/// segment per segment it touches: a segment wholly inside the run is kept,
/// the first and last may be cut.
fn cut(base: &[Segment], indexed: Option<&IndexedFiles>, (from, to): (u64, u64)) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut seg_start = 0u64;
    for s in base {
        let seg_end = seg_start + s.len;
        let (lo, hi) = (from.max(seg_start), to.min(seg_end));
        if lo < hi {
            let skip = lo - seg_start;
            let first = s.first + skip;
            let start = match skip {
                0 => s.start,
                _ => indexed
                    .and_then(|i| i.index(s.file))
                    .and_then(|i| i.get(first))
                    .map(|(offset, _)| Position {
                        record: first,
                        offset,
                    }),
            };
            out.push(Segment {
                path: s.path.clone(),
                file: s.file,
                first,
                start,
                len: hi - lo,
                to_end: s.to_end && hi == seg_end,
                indexed: s.indexed,
            });
        }
        seg_start = seg_end;
    }
    out
}

/// The first record of rank `k`'s run when `total` records split into
/// `w` runs of `total / w`, the first `total % w` runs one longer.
fn run_start(k: u64, total: u64, w: u64) -> u64 {
    k * (total / w) + k.min(total % w)
}

impl TfRecordFiles {
    /// Reads only this rank's share of the records: the files in order are
    /// one run of records, cut into `world_size` consecutive runs whose
    /// lengths differ by at most one; a file inside a run is read whole, a
    /// file a cut falls in is read in part (from its record index where one
    /// is beside it, else by reading and dropping the records before the
    /// share). With [`Remainder::Drop`] every rank reads the same number of
    /// records per epoch, and fewer than `world_size` are dropped (see the
    /// [module docs](crate::pipeline::rank)). Reads the framing of every
    /// file once, now, to count records, unless every file has a record
    /// index (with the reader options set so far: set
    /// [`reader_options`](Self::reader_options) first), and fails on a file
    /// that cannot be read. Ranked again, the files split this share's run
    /// the same way (a data loader's workers within a process's share).
    ///
    /// Under a launcher (`RANK`/`WORLD_SIZE` set), this process's share; a
    /// single process reads everything (and counts nothing):
    ///
    /// ```no_run
    /// use tfpipe::pipeline::{Pipeline, Rank, Remainder};
    /// let mut files = Pipeline::tfrecord_files(["data/train-*.tfrecord"])?;
    /// if let Some(rank) = Rank::from_env()? {
    ///     files = files.rank(rank, Remainder::Drop)?;
    ///     if let Some(warning) = files.rank_share().and_then(|s| s.warning.as_deref()) {
    ///         eprintln!("warning: {warning}");
    ///     }
    /// }
    /// let records = files.interleave(4, 16).shuffle(10_000, 7).batch(256);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Two ranks of a job over three files of 3, 3 and 2 records: 4 records
    /// each, the second file split between them:
    ///
    /// ```
    /// use tfpipe::pipeline::{Pipeline, Rank, Remainder, ShareBy};
    /// use tfpipe::tfrecord::{Compression, FileRecordWriter};
    /// let dir = tempfile::tempdir()?;
    /// for (f, n) in [(0, 3), (1, 3), (2, 2)] {
    ///     let mut w = FileRecordWriter::create(dir.path().join(format!("part-{f}.tfrecord")), Compression::None)?;
    ///     for i in 0..n { w.write_record(&[10 * f + i])?; }
    ///     w.finish()?;
    /// }
    /// let pattern = dir.path().join("part-*").display().to_string();
    /// let share = |r| -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    ///     let files = Pipeline::tfrecord_files([&pattern])?.rank(Rank::new(r, 2)?, Remainder::Drop)?;
    ///     assert_eq!(files.rank_share().map(|s| s.by), Some(ShareBy::Record));
    ///     Ok(files.records().start()?.map(|r| r.map(|r| r[0])).collect::<Result<_, _>>()?)
    /// };
    /// assert_eq!(share(0)?, [0, 1, 2, 10]);
    /// assert_eq!(share(1)?, [11, 12, 20, 21]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rank(
        mut self,
        rank: Rank,
        remainder: Remainder,
    ) -> Result<TfRecordFiles, PipelineError> {
        let (r, w) = (rank.rank as u64, rank.world_size as u64);
        let mut warnings = Vec::new();
        // A ranked list is split further: this share is a run of the
        // earlier share's records.
        let (base, indexed, outer) = match self.rank.take() {
            Some(plan) => {
                let mut outer = plan.outer;
                outer.push(plan.share.rank);
                (plan.segments, plan.indexed, outer)
            }
            None => {
                let (base, indexed) = self.whole_files(&mut warnings)?;
                (base, indexed, Vec::new())
            }
        };
        let total: u64 = base.iter().map(|s| s.len).sum();
        let (smallest, extra) = (total / w, total % w);
        let from = run_start(r, total, w);
        let mine = run_start(r + 1, total, w) - from;
        let (records, dropped, dropped_total) = match remainder {
            Remainder::Drop => (smallest, mine - smallest, extra),
            Remainder::Keep => (mine, 0, 0),
        };
        let segments = cut(&base, indexed.as_ref(), (from, from + records));
        let by = if segments.iter().all(Segment::whole) {
            ShareBy::File
        } else {
            ShareBy::Record
        };
        let discarded: u64 = segments
            .iter()
            .filter(|s| s.start.is_none())
            .map(|s| s.first)
            .sum();
        if discarded > records {
            warnings.push(format!(
                "{} file(s) for {w} ranks: this rank reads and drops {discarded} records to reach \
                 its share of {records} (a record index beside each file lets it start there)",
                self.paths.len()
            ));
        }
        let share = RankShare {
            rank,
            by,
            records,
            total_records: total,
            dropped,
            dropped_total,
            warning: (!warnings.is_empty()).then(|| warnings.join("; ")),
        };
        self.paths = segments.iter().map(|s| s.path.clone()).collect();
        self.rank = Some(RankPlan {
            share,
            segments,
            indexed,
            outer,
        });
        Ok(self)
    }

    /// Every file as a segment, with its record count (from the record
    /// indexes when every file has one, else by reading the framing), and
    /// the indexes.
    fn whole_files(
        &self,
        warnings: &mut Vec<String>,
    ) -> Result<(Vec<Segment>, Option<IndexedFiles>), PipelineError> {
        // An index beside every file makes the counts a lookup and lets a
        // share start inside a file without reading what comes before.
        let indexed = open_indexes(&self.paths, &self.options, warnings);
        let counts = match &indexed {
            Some(indexed) => (0..self.paths.len())
                .map(|f| indexed.index(f).map_or(0, |i| i.len()))
                .collect(),
            None => self
                .paths
                .iter()
                .map(|path| count_records(path, &self.options))
                .collect::<Result<Vec<u64>, PipelineError>>()?,
        };
        let segments = self
            .paths
            .iter()
            .zip(counts)
            .enumerate()
            .map(|(file, (path, len))| Segment {
                path: path.clone(),
                file,
                first: 0,
                start: None,
                len,
                to_end: true,
                indexed: indexed.is_some(),
            })
            .collect();
        Ok((segments, indexed))
    }

    /// The share [`rank`](Self::rank) planned, if it was called.
    pub fn rank_share(&self) -> Option<&RankShare> {
        self.rank.as_ref().map(|plan| &plan.share)
    }
}

/// Tags a rank's records with a stage `rank` that names the rank in the
/// pipeline's state.
pub(crate) fn apply(plan: &RankPlan, records: Pipeline<Record>) -> Pipeline<Record> {
    let outer = plan.outer.iter().map(|r| (r.rank, r.world_size)).collect();
    tag(records, plan.share.rank, outer)
}

/// What an `index_count` stage stores: the records passed so far.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Passed {
    passed: u64,
}

/// `records` (of `path` from record `first` on), which must be exactly
/// `len`, the count the record index gave: fewer (or, read to the file's
/// end, more) end in an error naming the file and the index.
fn expect_count(
    records: Pipeline<Record>,
    path: PathBuf,
    first: u64,
    len: u64,
) -> Pipeline<Record> {
    records.then("index_count", move |env, up, _counters| {
        let path = path.clone();
        let mut reported = false;
        let step = move |s: &mut Passed, up: &mut Option<Stream<Record>>| {
            let event = up.as_mut()?.next();
            match &event {
                Some(Event::Item(Ok(_))) => s.passed += 1,
                None if s.passed != len && !reported => {
                    reported = true;
                    let error = IndexError::Invalid {
                        data: path.clone(),
                        index: crate::tfrecord::index_path(&path, None),
                        problem: IndexProblem::CountMismatch {
                            first,
                            indexed: len,
                            found: s.passed,
                        },
                    };
                    return Some(Event::Item(Err(PipelineError::Index {
                        stage: "rank".to_string(),
                        error,
                    })));
                }
                _ => {}
            }
            event
        };
        Box::new(Sequential::new(env, "index_count", up, step)) as Stream<Record>
    })
}

/// What the `rank` stage stores: whose share the state is.
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct RankTag {
    rank: usize,
    world_size: usize,
    /// Whether the shares are consecutive runs of records; states of
    /// earlier versions, which shared whole files round robin, lack it and
    /// would resume on other records.
    #[serde(default)]
    runs: bool,
    /// The ranks whose share this one splits, outermost first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    outer: Vec<(usize, usize)>,
}

impl RankTag {
    /// `rank R of W`, and the shares it splits.
    fn describe(&self) -> String {
        let mut text = format!("rank {} of {}", self.rank, self.world_size);
        for (rank, world_size) in self.outer.iter().rev() {
            text += &format!(" within rank {rank} of {world_size}");
        }
        text
    }
}

/// A pass-through stage whose state says which rank it was taken on, so
/// that a state restored on another rank (whose files differ) or into an
/// unranked pipeline is refused instead of resuming on the wrong records.
/// The rank is checked before the stages under it restore, so the error
/// names the rank rather than a difference in shape the ranks may have.
fn tag(records: Pipeline<Record>, rank: Rank, outer: Vec<(usize, usize)>) -> Pipeline<Record> {
    let expected = Arc::new(move || RankTag {
        rank: rank.rank,
        world_size: rank.world_size,
        runs: true,
        outer: outer.clone(),
    });
    let initial = Arc::clone(&expected);
    let tagged = records.then("rank", move |env, up, counters| {
        let step = move |_: &mut RankTag, up: &mut Option<Stream<Record>>| {
            let event = up.as_mut()?.next();
            if let Some(Event::Item(Ok(record))) = &event {
                counters.add_in(1, record.len() as u64);
                counters.add_out(1, record.len() as u64);
            }
            event
        };
        Box::new(Sequential::starting_at(env, "rank", up, initial(), step)) as Stream<Record>
    });
    let inner = Arc::clone(&tagged.build);
    Pipeline {
        build: Arc::new(move |env: &Env| {
            let saved = env.peek_resume().filter(|s| s.stage == "rank");
            if let Some(Ok(found)) = saved.map(|s| s.data::<RankTag>("rank"))
                && found != expected()
            {
                let reason = if found.runs {
                    format!(
                        "the state was taken on {}, this pipeline reads the share of {}",
                        found.describe(),
                        expected().describe()
                    )
                } else {
                    "the state was taken by an earlier version, which shared whole files among \
                     the ranks; shares are now runs of records"
                        .to_string()
                };
                env.restore_failed(StateError::mismatch("rank", reason));
            }
            inner(env)
        }),
        widen: None,
        depth: tagged.depth,
        error: tagged.error,
        origin: tagged.origin,
    }
}

/// The files with their indexes (`FILE.idx` beside each), if every file is
/// uncompressed and has one. A missing index means "not indexed" (`None`,
/// quietly); an index that exists but disagrees with its file is not used,
/// and `warnings` says which and why (the share is then counted by reading).
fn open_indexes(
    paths: &[PathBuf],
    options: &ReaderOptions,
    warnings: &mut Vec<String>,
) -> Option<IndexedFiles> {
    let compressed = |path: &PathBuf| {
        options
            .compression
            .unwrap_or_else(|| Compression::from_path(path))
            != Compression::None
    };
    if paths.is_empty() || paths.iter().any(compressed) {
        return None;
    }
    match IndexedFiles::open(paths, None) {
        Ok(indexed) => Some(indexed),
        Err(e) if index_missing(&e) => None,
        Err(e) => {
            warnings.push(format!(
                "not using the record index: {e}; counting the records by reading them"
            ));
            None
        }
    }
}

/// Whether loading an index failed because there is no index file.
fn index_missing(error: &IndexError) -> bool {
    match error {
        IndexError::Io { error, .. } => error.kind() == std::io::ErrorKind::NotFound,
        IndexError::Storage(e) => e.io_kind() == std::io::ErrorKind::NotFound,
        _ => false,
    }
}

/// The number of records in `path` as the pipeline would read them.
fn count_records(path: &std::path::Path, options: &ReaderOptions) -> Result<u64, PipelineError> {
    let record_error = |source| PipelineError::Record {
        stage: "rank".to_string(),
        error: source,
    };
    let mut reader = FileRecordReader::open(path, options.clone()).map_err(record_error)?;
    let mut n = 0u64;
    while reader.next_record().map_err(record_error)?.is_some() {
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_bounds() {
        assert!(Rank::new(0, 0).is_err());
        assert!(Rank::new(2, 2).is_err());
        let r = Rank::new(1, 2).unwrap();
        assert_eq!((r.rank(), r.world_size()), (1, 2));
    }
}
