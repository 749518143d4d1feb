//! Ranks: each process of a data-parallel job reads its own share of the files.
//!
//! [`TfRecordFiles::rank`] gives rank `r` of `w` a share that is disjoint
//! from every other rank's, and every rank gets the *same number of records
//! per epoch*, so that collective training (an all-reduce per step) never
//! waits forever on a rank that ran out of data:
//!
//! - **By file** when there are at least as many files as ranks: rank `r`
//!   reads files `r, r + w, r + 2w, ...` (as [`TfRecordFiles::shard`]).
//! - **By record** otherwise: every rank reads every file in the same
//!   deterministic order and keeps records `r, r + w, ...` of that stream.
//!   Every rank then reads all the data to use `1/w` of it: a
//!   [`RankShare::warning`] says so.
//!
//! The counts per rank differ (files differ in size; `n` records do not
//! split evenly), so with [`Remainder::Drop`] every rank stops after the
//! smallest share's count, like PyTorch's `DistributedSampler(drop_last=True)`:
//! the shares are disjoint, equal, and together cover every record except
//! the dropped tail of the larger shares (the last records of each share in
//! reading order, the same ones each epoch: shuffle after this stage mixes
//! the rest, not the choice of what is dropped). [`RankShare::dropped`] says
//! how many, and the warning names them when they are more than the
//! unavoidable `< world_size` of an uneven split. [`Remainder::Keep`] keeps
//! every record (shares then differ in size): for prediction, where no rank
//! waits for another.
//!
//! Equal counts need the counts: `rank` reads the framing of every file once
//! (all of them, on every rank: the counts of the other ranks' shares decide
//! this one's). With a record index (`.idx` files) this would be a lookup.
//!
//! # Launchers
//!
//! [`Rank::from_env`] reads `RANK` and `WORLD_SIZE` as `torchrun`, Slurm
//! wrappers and Kubernetes indexed Jobs set them, and [`Rank::local_rank_from_env`]
//! `LOCAL_RANK`, the device index on a node.
//!
//! # A multi-GPU data-parallel run (design notes; no multi-GPU code here)
//!
//! Each rank is one process driving one GPU (`cuda:LOCAL_RANK`), started by
//! the launcher with `RANK`/`WORLD_SIZE` (and the NCCL rendezvous variables).
//! Each process builds the *same* pipeline plan with `.rank(Rank::from_env())`
//! right after the file list, so its batches come from its own share; the
//! per-epoch shuffle seed is the same on every rank (the shares are already
//! disjoint, so equal seeds do not duplicate data). Every step each rank
//! computes gradients on its batch, then sums them across ranks with an NCCL
//! all-reduce (candle's `cuda` backend exposes `cudarc`'s NCCL bindings: one
//! `Comm` per process from a shared `Id`, `all_reduce` over each gradient's
//! device buffer, divided by `world_size`), and every rank applies the same
//! optimizer update, so the weights stay identical without broadcasting
//! them. Because each rank has the same number of records per epoch (and the
//! same batch size), every rank runs the same number of steps and reaches
//! each all-reduce; an uneven share would leave the others blocked in NCCL
//! forever. Checkpoints: rank 0 writes the weights; each rank's pipeline
//! state (the checkpointable iterator state) is its
//! own, saved beside them per rank, so a resumed job continues each share at
//! its next record.

use std::path::PathBuf;

use super::{Pipeline, PipelineError, Record, TfRecordFiles};
use crate::tfrecord::{FileRecordReader, ReaderOptions};

/// One process's place in a data-parallel job: `rank` of `world_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    rank: usize,
    world_size: usize,
}

/// What the environment says about ranks, when it says something unusable.
#[derive(Debug, thiserror::Error)]
pub enum RankError {
    /// `rank >= world_size`, or a world size of 0.
    #[error("rank {rank} of world size {world_size}: needs world_size > 0 and rank < world_size")]
    OutOfRange { rank: usize, world_size: usize },
    /// A variable is not a number.
    #[error("environment variable {name}={value:?}: expected a non-negative integer")]
    NotANumber { name: &'static str, value: String },
    /// Only one of `RANK` and `WORLD_SIZE` is set.
    #[error("environment variable {missing} is not set, but {set} is: set both or neither")]
    Incomplete {
        set: &'static str,
        missing: &'static str,
    },
}

impl Rank {
    /// Rank `rank` of `world_size` processes.
    pub fn new(rank: usize, world_size: usize) -> Result<Rank, RankError> {
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

    /// `RANK` and `WORLD_SIZE` from the environment: `None` if neither is set.
    pub fn from_env() -> Result<Option<Rank>, RankError> {
        let rank = env_number("RANK")?;
        let world = env_number("WORLD_SIZE")?;
        match (rank, world) {
            (None, None) => Ok(None),
            (Some(rank), Some(world_size)) => Rank::new(rank, world_size).map(Some),
            (Some(_), None) => Err(RankError::Incomplete {
                set: "RANK",
                missing: "WORLD_SIZE",
            }),
            (None, Some(_)) => Err(RankError::Incomplete {
                set: "WORLD_SIZE",
                missing: "RANK",
            }),
        }
    }

    /// `LOCAL_RANK` from the environment (the device index on this node).
    pub fn local_rank_from_env() -> Result<Option<usize>, RankError> {
        env_number("LOCAL_RANK")
    }
}

fn env_number(name: &'static str) -> Result<Option<usize>, RankError> {
    match std::env::var(name) {
        Ok(value) => match value.trim().parse() {
            Ok(n) => Ok(Some(n)),
            Err(_) => Err(RankError::NotANumber { name, value }),
        },
        Err(_) => Ok(None),
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

/// How the data is split between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareBy {
    /// Whole files per rank.
    File,
    /// Every `world_size`-th record of the whole stream.
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
    /// Every file, in order (for by-record shares).
    pub(crate) all_paths: Vec<PathBuf>,
}

impl TfRecordFiles {
    /// Reads only this rank's share of the records: by file when there are
    /// at least as many files as ranks, else by record; with
    /// [`Remainder::Drop`] every rank reads the same number of records per
    /// epoch (see the [module docs](crate::pipeline::rank)). Reads the
    /// framing of every file once, now, to count records (with the reader
    /// options set so far: set [`reader_options`](Self::reader_options)
    /// first), and fails on a file that cannot be read.
    ///
    /// ```no_run
    /// use tfpipe::pipeline::{Pipeline, Rank, Remainder};
    /// let rank = Rank::from_env()?.unwrap_or(Rank::new(0, 1)?);
    /// let files = Pipeline::tfrecord_files(["data/train-*.tfrecord"])?.rank(rank, Remainder::Drop)?;
    /// if let Some(warning) = files.rank_share().and_then(|s| s.warning.clone()) {
    ///     eprintln!("warning: {warning}");
    /// }
    /// let records = files.interleave(4, 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rank(
        mut self,
        rank: Rank,
        remainder: Remainder,
    ) -> Result<TfRecordFiles, PipelineError> {
        let counts = self
            .paths
            .iter()
            .map(|path| count_records(path, &self.options))
            .collect::<Result<Vec<u64>, PipelineError>>()?;
        let (r, w) = (rank.rank, rank.world_size);
        let total: u64 = counts.iter().sum();
        let files = self.paths.len();
        let (by, shares): (ShareBy, Vec<u64>) = if files >= w {
            let shares = (0..w)
                .map(|k| counts.iter().skip(k).step_by(w).sum())
                .collect();
            (ShareBy::File, shares)
        } else {
            let shares = (0..w as u64)
                .map(|k| (total + (w as u64 - 1 - k)) / w as u64)
                .collect();
            (ShareBy::Record, shares)
        };
        let smallest = shares.iter().copied().min().unwrap_or(0);
        let mine = shares[r];
        let (records, dropped, dropped_total) = match remainder {
            Remainder::Drop => (
                smallest,
                mine - smallest,
                shares.iter().map(|s| s - smallest).sum(),
            ),
            Remainder::Keep => (mine, 0, 0),
        };
        let mut warnings = Vec::new();
        if by == ShareBy::Record {
            warnings.push(format!(
                "{files} file(s) for {w} ranks: sharding by record, so every rank reads all \
                 {total} records to keep 1/{w} of them; give at least {w} files to shard by file"
            ));
        }
        if dropped_total >= w as u64 {
            warnings.push(format!(
                "the ranks' shares are uneven ({} to {} records): {dropped_total} records per \
                 epoch are dropped so that every rank reads {smallest} ({dropped} of this rank's)",
                smallest,
                shares.iter().copied().max().unwrap_or(0)
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
        let all_paths = self.paths.clone();
        if by == ShareBy::File {
            self.paths = self.paths.into_iter().skip(r).step_by(w).collect();
        }
        self.rank = Some(RankPlan { share, all_paths });
        Ok(self)
    }

    /// The share [`rank`](Self::rank) planned, if it was called.
    pub fn rank_share(&self) -> Option<&RankShare> {
        self.rank.as_ref().map(|plan| &plan.share)
    }
}

/// Applies a rank plan to the records of the files (`records` reads the
/// rank's files for a by-file share, every file for a by-record one).
pub(crate) fn apply(plan: &RankPlan, records: Pipeline<Record>) -> Pipeline<Record> {
    let share = &plan.share;
    let records = match share.by {
        ShareBy::File => records,
        ShareBy::Record => records.shard(share.rank.world_size, share.rank.rank),
    };
    if share.dropped > 0 {
        records.take(share.records)
    } else {
        records
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
