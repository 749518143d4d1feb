//! The pipeline engine: a streaming dataset in the spirit of `tf.data`.
//!
//! A [`Pipeline<T>`] is a lazy plan: building one does no work. [`Pipeline::start`]
//! turns it into a [`PipelineIter`], an `Iterator<Item = Result<T, PipelineError>>`.
//!
//! ```
//! use tfpipe::pipeline::{Parallelism, Pipeline};
//!
//! let mut it = Pipeline::from_vec((0..1000u32).collect())
//!     .shuffle(100, 7)
//!     .batch(32)
//!     .map_parallel(Parallelism::Auto, |b: Vec<u32>| Ok::<_, std::convert::Infallible>(b.len()))
//!     .prefetch(2)
//!     .start()?;
//! let rows: usize = it.by_ref().map(|n| n.unwrap()).sum();
//! assert_eq!(rows, 1000);
//! println!("{}", it.metrics()); // one row per stage, names the bottleneck
//! # Ok::<(), tfpipe::pipeline::PipelineError>(())
//! ```
//!
//! For TFRecord files, [`Pipeline::tfrecord_files`] (paths or globs, compression
//! per file) gives a file-level builder whose [`TfRecordFiles::shard`] and
//! [`TfRecordFiles::interleave`] work on whole files, as `tf.data` recommends.
//!
//! Processes of a data-parallel job read disjoint, equal shares with
//! [`TfRecordFiles::rank`] ([`rank`] has the design notes for a multi-GPU
//! run). A running pipeline's position is saved with
//! [`PipelineIter::state`] at any element boundary and resumed with
//! [`Pipeline::start_from`], mid-epoch under `repeat` too ([`state`] says
//! what is stored: positions, not bytes).
//!
//! # Threading model
//!
//! Sequential stages (`filter`, `map`, `shuffle`, `batch`, `take`, `skip`,
//! `repeat`, `cache`, `ignore_errors`, sequential `interleave`, and the
//! combinations `zip`, `concatenate`, `sample_from`, `choose_from`, whose
//! inputs keep their own stages and threads) are fused: they
//! run as iterator adapters on whichever thread pulls them, with no channel hop.
//! Threads start only where you ask for concurrency:
//!
//! | operator | threads | buffer between threads |
//! |---|---|---|
//! | [`prefetch(n)`](Pipeline::prefetch) | 1; none right after a parallel map, whose window grows by `n` instead | channel of `n` |
//! | [`map_parallel(p, ..)`](Pipeline::map_parallel) | `p` (Auto: up to the cores) | reorder window `W = 2 * max(p) + 2` |
//! | [`interleave`](Pipeline::interleave) with parallelism `p` | one per open input (`cycle_length`), at most `p` computing at once | `cycle_length` channels of 2 chunks (>= 256 elements each) |
//!
//! Every edge between threads is a bounded crossbeam channel carrying
//! `Result<T, PipelineError>` (plus epoch markers). Thread counts are explicit:
//! fixed parallelism is what you pass; `Parallelism::Auto` never exceeds
//! `std::thread::available_parallelism()`.
//!
//! **Keeping the consumer fed on a 2-core machine.** A training loop needs its
//! core. Three things keep the pipeline from taking it: (1) bounded channels
//! make producers sleep (not spin) once they are `n` elements ahead, so a
//! pipeline faster than its consumer uses only the CPU the consumer's pace
//! needs; (2) the autotuner adds a worker only while the consumer is actually
//! waiting on the stage *and* the workers are busy, and removes one while the
//! workers are mostly blocked on a full output (the consumer is busy), so a
//! compute-bound trainer keeps its core; (3) parked workers sleep on a condition
//! variable, not in a spin loop.
//!
//! # Memory bound
//!
//! Live elements are bounded by the buffers you chose. Counting in elements of
//! each stage's own type (a batch of 256 records counts 256 source elements):
//!
//! ```text
//! live <= shuffle_buffer + 1                        (per shuffle)
//!       + batch_size                                 (per batch, the one being filled)
//!       + prefetch_n + 2                             (per prefetch: channel + one in each hand;
//!                                                   after a parallel map, `n` more in its window)
//!       + W + p                                      (per map_parallel: window + one per worker)
//!       + cycle_length * 4 * chunk                  (per parallel interleave: 2 chunks queued,
//!                                                   one being read, one being consumed;
//!                                                   chunk = block_length rounded up to >= 256)
//!       + cycle_length                               (per sequential interleave)
//!       + 1                                          (in the consumer's hand)
//! ```
//!
//! On top of the live elements, TFRecord sources recycle record buffers
//! through one process-wide free list of at most [`POOL_BUFFERS`] idle
//! buffers of at most [`POOL_MAX_CAPACITY`] bytes each (8 MiB in all, for
//! every pipeline together), plus a stash of at most [`STASH_BUFFERS`] in
//! each thread that recycles them; see [`Record`].
//!
//! `cache()` is the exception: it holds the whole dataset in memory by design.
//! `tests/pipeline/memory.rs` checks the bound with a drop-counting element.
//!
//! # Determinism
//!
//! With `deterministic = true` (the default) and a seed, the output is identical
//! for every parallelism setting and every run: parallel map tags elements with
//! sequence numbers and restores their order in the bounded reorder window;
//! parallel interleave visits its inputs round robin. With `false`, fast
//! elements may overtake slow ones (never across an epoch boundary).
//!
//! # Epochs
//!
//! [`Pipeline::repeat`] ends each pass with an epoch marker that every stage
//! forwards in order. `shuffle` and `batch` flush at a marker, so each epoch is
//! a permutation of the data and no batch straddles two epochs (unlike
//! `tf.data`, where `repeat().batch()` mixes epochs). The consumer sees markers
//! through [`PipelineIter::next_event`] or [`PipelineIter::epoch`].
//!
//! # Errors and shutdown
//!
//! An I/O or corruption error (with file, record and offset), a user function
//! returning `Err`, or a panic in a user function arrives as an `Err` item
//! naming the stage. The pipeline continues after an `Err` where it can (a
//! corrupt file ends that file), so [`Pipeline::ignore_errors`] can skip and
//! count them; a consumer that wants `tf.data`'s behaviour stops at the first.
//! Dropping the [`PipelineIter`] sets a cancel flag, drops the channels and
//! joins every thread; loops that can run long (filling a shuffle buffer,
//! reading a file) check the flag. A thread stuck inside a user function is
//! joined when that function returns.

use std::any::Any;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::batch::{Batch, Values};
use crate::error::Location;
use crate::example::{ParseError, SchemaError};
use crate::metrics::{MetricsRegistry, PipelineMetrics, StageCounters};
use crate::tfrecord::RecordError;

mod autotune;
mod batch;
mod bucket;
mod cache;
mod combine;
mod filter;
mod global_shuffle;
mod ignore_errors;
mod interleave;
mod map;
mod pack;
mod padded_batch;
mod parallel_map;
mod parse;
mod partition;
mod prefetch;
pub mod rank;
mod read_ahead;
mod rebatch;
mod record;
mod repeat;
pub mod rows;
mod shard;
mod shuffle;
mod skip;
mod source;
pub mod state;
mod take;
mod tfrecord;
mod unbatch;
mod window;
mod worker;

pub use bucket::BucketOptions;
pub use combine::{Exhausted, MixSource, split_by_weight};
pub use global_shuffle::GlobalShuffle;
pub use interleave::Interleave;
pub use pack::PackOptions;
pub use padded_batch::{
    MAX_PADDED_VALUES, PadError, PadInfo, PadSpec, PadValue, PaddedBatch, PaddedShape, Padding,
};
pub use parallel_map::MapOptions;
pub use parse::BatchRecycler;
pub use rank::{MAX_WORLD_SIZE, Rank, RankError, RankShare, Remainder, ShareBy};
pub use record::{
    FileId, POOL_BUFFERS, POOL_MAX_CAPACITY, Record, RecordPosition, STASH_BATCH, STASH_BUFFERS,
};
pub use shuffle::ShuffleOptions;
use state::StageStream;
pub use state::{PipelineState, Positions, StageState, StateError};
pub use tfrecord::TfRecordFiles;
pub use worker::{LiveThreads, live_worker_threads};

/// A boxed error from a user function.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why the pipeline could not deliver an element. Every variant names the
/// stage; errors about input data also carry file, record and offset
/// ([`location`](PipelineError::location)).
///
/// Each message is complete (it includes the text of the error inside), so
/// that inner error is not also returned by
/// [`source`](std::error::Error::source): an error chain (anyhow's `{:#}`)
/// prints each cause once. The inner errors stay typed:
/// [`record_error`](PipelineError::record_error),
/// [`user_error`](PipelineError::user_error),
/// [`parse_error`](PipelineError::parse_error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// Reading a TFRecord file failed (I/O, corruption; with the location).
    #[error("stage {stage}: {error}")]
    Record {
        /// The stage, as the metrics name it.
        stage: String,
        /// The error.
        error: RecordError,
    },
    /// A path or glob names no file.
    #[error("{pattern}: no such file (or no file matches the pattern)")]
    NoFiles {
        /// The glob pattern.
        pattern: String,
    },
    /// A glob pattern is malformed.
    #[error("{pattern}: bad glob pattern: {reason}")]
    BadGlob {
        /// The glob pattern.
        pattern: String,
        /// Why it does not parse.
        reason: String,
    },
    /// A user function returned `Err`. A self-contained message: the
    /// user's error and each of its causes, once.
    #[error("stage {stage}: {}", crate::error::display_chain(error.as_ref()))]
    User {
        /// The stage, as the metrics name it.
        stage: String,
        /// The error.
        error: BoxError,
    },
    /// A user function panicked.
    #[error("stage {stage}: panicked: {message}")]
    Panic {
        /// The stage, as the metrics name it.
        stage: String,
        /// What went wrong.
        message: String,
    },
    /// A record could not be parsed under the schema. `location` is the
    /// record's place in its file (for records from a TFRecord source);
    /// `error` is the parser's error, whose record index counts within the
    /// batch. The message leads with the location and prints the cause once.
    #[error("stage {stage}: {}", parse_message(location.as_ref(), error))]
    Parse {
        /// The stage, as the metrics name it.
        stage: String,
        /// The record's place in its file, when it comes from one.
        location: Option<Location>,
        /// The error.
        error: ParseError,
    },
    /// The schema given to a parse stage is invalid.
    #[error("invalid schema")]
    Schema(#[source] SchemaError),
    /// An element does not fit the stage (e.g. longer than a padded shape).
    #[error("stage {stage}: {message}")]
    Element {
        /// The stage, as the metrics name it.
        stage: String,
        /// What went wrong.
        message: String,
    },
    /// A cache file could not be written or read.
    #[error("stage {stage}: cache file: {error}")]
    Cache {
        /// The stage, as the metrics name it.
        stage: String,
        /// The error.
        error: RecordError,
    },
    /// A worker thread could not be started.
    #[error("stage {stage}: cannot start a thread: {error}")]
    Spawn {
        /// The stage, as the metrics name it.
        stage: String,
        /// The error.
        error: io::Error,
    },
    /// An operator was given a setting that makes no sense: which
    /// operator, and why.
    #[error("invalid pipeline: {operator}: {reason}")]
    Config {
        /// The operator (`batch`, `shuffle`, `sample_from`, ...).
        operator: String,
        /// What is wrong with its settings.
        reason: String,
    },
    /// Listing or opening object storage failed (not a missing file: that is
    /// [`NoFiles`](Self::NoFiles)).
    #[error(transparent)]
    Storage(crate::storage::StorageError),
    /// Reading a record through a record index failed, or the index is
    /// stale (with the location).
    #[error("stage {stage}: {error}")]
    Index {
        /// The stage, as the metrics name it.
        stage: String,
        /// The error.
        error: crate::tfrecord::IndexError,
    },
    /// The iterator state could not be captured, or a pipeline not restored from it.
    #[error(transparent)]
    State(#[from] StateError),
    /// An input of a combined pipeline ([`Pipeline::zip`],
    /// [`concatenate`](Pipeline::concatenate), [`sample_from`](Pipeline::sample_from),
    /// [`choose_from`](Pipeline::choose_from)) failed. `input` names it as
    /// its stages appear in the metrics (`sample_from[1]`, `choose_from[selector]`);
    /// `origin` is the input's first file, where it reads files. The
    /// accessors ([`location`](Self::location), [`stage`](Self::stage), ...)
    /// see through to `error`.
    #[error("{input}{}: {}", origin.as_ref().map(|o| format!(" (reading {o}, ...)")).unwrap_or_default(), crate::error::display_chain(error.as_ref()))]
    Source {
        /// The input, as its stages appear in the metrics.
        input: String,
        /// The input's first file, where it reads files.
        origin: Option<String>,
        /// The error.
        error: Box<PipelineError>,
    },
}

impl From<crate::storage::StorageError> for PipelineError {
    fn from(error: crate::storage::StorageError) -> PipelineError {
        use crate::storage::StorageError;
        match error {
            StorageError::NoMatch { pattern } => PipelineError::NoFiles { pattern },
            StorageError::BadGlob { pattern, reason } => PipelineError::BadGlob { pattern, reason },
            other => PipelineError::Storage(other),
        }
    }
}

impl PipelineError {
    /// `Err(Config)` of `operator` when there is a `problem` with its
    /// settings (as [`Pipeline::start`] would report it).
    pub(crate) fn config_check(
        operator: &str,
        problem: Option<String>,
    ) -> Result<(), PipelineError> {
        match problem {
            Some(reason) => Err(PipelineError::Config {
                operator: operator.to_string(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// The error itself, under the [`Source`](Self::Source) wrappers of
    /// combined pipelines (which name the input it came from).
    pub fn innermost(&self) -> &PipelineError {
        match self {
            PipelineError::Source { error, .. } => error.innermost(),
            other => other,
        }
    }

    /// The stage the error arose in, where there is one.
    pub fn stage(&self) -> Option<&str> {
        match self.innermost() {
            PipelineError::Record { stage, .. }
            | PipelineError::User { stage, .. }
            | PipelineError::Panic { stage, .. }
            | PipelineError::Parse { stage, .. }
            | PipelineError::Element { stage, .. }
            | PipelineError::Cache { stage, .. }
            | PipelineError::Spawn { stage, .. }
            | PipelineError::Index { stage, .. } => Some(stage),
            _ => None,
        }
    }

    /// File, record index and byte offset, for errors reading or parsing
    /// records.
    pub fn location(&self) -> Option<&Location> {
        match self.innermost() {
            PipelineError::Record { error, .. } | PipelineError::Cache { error, .. } => {
                error.location()
            }
            PipelineError::Index { error, .. } => error.location(),
            PipelineError::Parse { location, .. } => location.as_ref(),
            _ => None,
        }
    }

    /// The reader's error, for a failure reading records or a cache file.
    pub fn record_error(&self) -> Option<&RecordError> {
        match self.innermost() {
            PipelineError::Record { error, .. } | PipelineError::Cache { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The user function's error, for an `Err` it returned.
    pub fn user_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self.innermost() {
            PipelineError::User { error, .. } => Some(error.as_ref()),
            _ => None,
        }
    }

    /// The parser's error, for a record that did not parse.
    pub fn parse_error(&self) -> Option<&ParseError> {
        match self.innermost() {
            PipelineError::Parse { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether the error is about the input data (a corrupt or unparsable
    /// record) rather than the system or the program.
    pub fn is_data_error(&self) -> bool {
        match self.innermost() {
            PipelineError::Record { error, .. } => error.is_corruption(),
            PipelineError::Parse { .. } => true,
            PipelineError::Index { error, .. } => error.is_data_error(),
            _ => false,
        }
    }
}

/// `LOCATION: what failed` when the record's place is known; the parser's
/// own message (with the record's index in its batch) otherwise.
fn parse_message(location: Option<&Location>, error: &ParseError) -> String {
    let Some(location) = location else {
        return format!("{error} (counting within its batch)");
    };
    match error {
        ParseError::Malformed { reason, .. } => {
            format!("{location}: malformed protobuf: {reason}")
        }
        ParseError::Feature {
            feature, reason, ..
        } => format!("{location}: feature {feature:?}: {reason}"),
        ParseError::Image {
            feature, source, ..
        } => format!(
            "{location}: feature {feature:?}: cannot decode the image: {}",
            crate::error::display_chain(&**source)
        ),
    }
}

impl From<SchemaError> for PipelineError {
    fn from(error: SchemaError) -> PipelineError {
        PipelineError::Schema(error)
    }
}

/// Why [`Pipeline::start`] refuses a plan: made afresh at each start.
#[derive(Clone)]
pub(crate) struct Invalid(Arc<dyn Fn() -> PipelineError + Send + Sync>);

impl Invalid {
    pub(crate) fn error(&self) -> PipelineError {
        (self.0)()
    }
}

/// The most workers a parallel stage may have: a larger
/// [`Parallelism::Fixed`] is refused (a stage keeps a slot per worker, and
/// no machine runs more threads usefully), before anything is allocated.
pub const MAX_PARALLELISM: usize = 4096;

/// How many workers a parallel stage uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallelism {
    /// Exactly this many (1 to [`MAX_PARALLELISM`]).
    Fixed(usize),
    /// Tuned while running from the stage metrics, between 1 and the cores
    /// available, starting at half the cores (`tf.data.AUTOTUNE`).
    Auto,
}

impl From<usize> for Parallelism {
    fn from(n: usize) -> Parallelism {
        Parallelism::Fixed(n)
    }
}

impl std::str::FromStr for Parallelism {
    type Err = crate::error::UnknownName;

    /// `auto` or a number from 1 to [`MAX_PARALLELISM`].
    ///
    /// ```
    /// use tfpipe::Parallelism;
    /// assert_eq!("8".parse::<Parallelism>(), Ok(Parallelism::Fixed(8)));
    /// assert_eq!("AUTO".parse::<Parallelism>(), Ok(Parallelism::Auto));
    /// assert!("0".parse::<Parallelism>().is_err());
    /// assert!("1000000000".parse::<Parallelism>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Parallelism, Self::Err> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Parallelism::Auto);
        }
        match s.parse::<usize>().map(Parallelism::Fixed) {
            Ok(p) if p.is_valid() => Ok(p),
            _ => Err(crate::error::UnknownName {
                what: "parallelism",
                name: s.to_string(),
                expected: "`auto` or a number from 1 to 4096",
            }),
        }
    }
}

impl Parallelism {
    /// Whether a stage accepts it: `Auto`, or 1 to [`MAX_PARALLELISM`].
    pub fn is_valid(self) -> bool {
        match self {
            Parallelism::Fixed(n) => (1..=MAX_PARALLELISM).contains(&n),
            Parallelism::Auto => true,
        }
    }

    /// The most workers this setting can use on `cores` cores.
    pub(crate) fn max_workers(self, cores: usize) -> usize {
        match self {
            Parallelism::Fixed(n) => n.max(1),
            Parallelism::Auto => cores.max(1),
        }
    }
}

/// What a pipeline yields: an element (or error), or the end of an epoch.
#[derive(Debug)]
pub enum Event<T> {
    /// An element or the error that took its place.
    Item(Result<T, PipelineError>),
    /// Epoch `n` (zero-based) of a [`Pipeline::repeat`] is complete.
    EpochEnd(u64),
}

/// A started stage: events in order, `None` at the end.
pub(crate) type Stream<T> = Box<dyn StageStream<T>>;

type BuildFn<T> = dyn Fn(&Env) -> Stream<T> + Send + Sync;

/// An adapter's build function as [`Pipeline::then_quiet`] makes it.
fn quiet_build<T: Send + 'static, U: Send + 'static>(
    up: Arc<BuildFn<T>>,
    depth: usize,
    own: &'static str,
    f: Arc<QuietFn<T, U>>,
) -> Arc<BuildFn<U>> {
    Arc::new(move |env: &Env| {
        let mine = env.peek_resume().filter(|s| s.stage == own).cloned();
        match mine {
            Some(state) => {
                env.resume_state();
                let up_env = env.resuming(state.inputs.first().cloned());
                let stream = up(&up_env);
                up_env.check_claimed("upstream");
                f(&env.resuming(None), depth, stream, Some(state))
            }
            None => f(env, depth, up(env), None),
        }
    })
}

/// What [`Pipeline::then_quiet`] calls: context, depth, upstream, own state.
type QuietFn<T, U> = dyn Fn(&Env, usize, Stream<T>, Option<StageState>) -> Stream<U> + Send + Sync;

/// Rebuilds a pipeline's last stage with its look-ahead widened by `n`.
type WidenFn<T> = dyn Fn(usize) -> Arc<BuildFn<T>> + Send + Sync;

/// A stage's build function as [`Pipeline::then`] makes it: the upstream is
/// built from its share of the resume state, then `f` over it.
fn stage_build<T: Send + 'static, U: Send + 'static>(
    up: Arc<BuildFn<T>>,
    depth: usize,
    name: &'static str,
    f: impl Fn(&Env, Stream<T>, Arc<StageCounters>) -> Stream<U> + Send + Sync + 'static,
) -> Arc<BuildFn<U>> {
    Arc::new(move |env: &Env| {
        let (own, upstream) = env.split_resume(name);
        let up_env = env.resuming(upstream);
        let stream = up(&up_env);
        up_env.check_claimed("upstream");
        let counters = env.stage(depth, name);
        let env = env.resuming(own);
        let stream = f(&env, stream, counters);
        env.check_claimed(name);
        stream
    })
}

/// What every stage of one started pipeline shares.
pub(crate) struct Shared {
    pub(crate) cancel: AtomicBool,
    pub(crate) metrics: MetricsRegistry,
    pub(crate) live: LiveThreads,
    pub(crate) cores: usize,
    /// The first error restoring from a state ([`Pipeline::start_from`]).
    pub(crate) restore_error: std::sync::Mutex<Option<StateError>>,
}

/// The state a stage being built restores from, and whether it did.
pub(crate) struct ResumeSlot {
    state: StageState,
    claimed: AtomicBool,
}

/// The context a stage is built in: the shared state, the epoch being built
/// (so `shuffle` can reseed), and a key prefix for stages inside an
/// `interleave`'s inputs.
#[derive(Clone)]
pub(crate) struct Env {
    pub(crate) shared: Arc<Shared>,
    pub(crate) epoch: u64,
    prefix: Arc<str>,
    /// Put before stage names: the input of a combined pipeline the stages
    /// belong to (`sample_from[1]/`), empty elsewhere.
    label: Arc<str>,
    /// Set only while building a stage restored from a state.
    resume: Option<Arc<ResumeSlot>>,
}

impl Env {
    /// The counters of the stage at `depth` of the plan.
    pub(crate) fn stage(&self, depth: usize, name: &str) -> Arc<StageCounters> {
        if self.label.is_empty() {
            return self
                .shared
                .metrics
                .stage(&format!("{}{depth}", self.prefix), name);
        }
        self.shared.metrics.stage(
            &format!("{}{depth}", self.prefix),
            &format!("{}{name}", self.label),
        )
    }

    /// The context for input `index` of the combined pipeline at `depth`
    /// (`input` names it: `sample_from[1]`): its stages get keys of their
    /// own and names that start with `input/`.
    pub(crate) fn input(&self, depth: usize, index: usize, input: &str) -> Env {
        Env {
            prefix: format!("{}{depth}/{index}/", self.prefix).into(),
            label: format!("{}{input}/", self.label).into(),
            resume: None,
            ..self.clone()
        }
    }

    /// The metrics row of input `index` of the combined pipeline at
    /// `depth`: what the combining stage took from it and waited on it.
    /// Listed after the input's own stages.
    pub(crate) fn input_row(&self, depth: usize, index: usize, input: &str) -> Arc<StageCounters> {
        self.shared.metrics.stage(
            &format!("{}{depth}/{index}", self.prefix),
            &format!("{}{input}", self.label),
        )
    }

    pub(crate) fn cancelled(&self) -> bool {
        self.shared.cancel.load(Ordering::Relaxed)
    }

    pub(crate) fn with_epoch(&self, epoch: u64) -> Env {
        Env {
            epoch,
            resume: None,
            ..self.clone()
        }
    }

    /// The context for pipelines nested in the stage at `depth`.
    pub(crate) fn nested(&self, depth: usize) -> Env {
        Env {
            prefix: format!("{}{depth}/", self.prefix).into(),
            resume: None,
            ..self.clone()
        }
    }

    /// This context, building a stage that restores from `state` (or
    /// starts afresh with `None`).
    pub(crate) fn resuming(&self, state: Option<StageState>) -> Env {
        Env {
            resume: state.map(|state| {
                Arc::new(ResumeSlot {
                    state,
                    claimed: AtomicBool::new(false),
                })
            }),
            ..self.clone()
        }
    }

    /// The state the stage being built restores from (claiming it).
    pub(crate) fn resume_state(&self) -> Option<&StageState> {
        let slot = self.resume.as_ref()?;
        slot.claimed.store(true, Ordering::Relaxed);
        Some(&slot.state)
    }

    /// The state the stage being built restores from, without claiming it.
    pub(crate) fn peek_resume(&self) -> Option<&StageState> {
        self.resume.as_ref().map(|slot| &slot.state)
    }

    /// Whether a state was given that no stage took (its stage cannot restore).
    pub(crate) fn check_claimed(&self, stage: &str) {
        if let Some(slot) = &self.resume
            && !slot.claimed.load(Ordering::Relaxed)
        {
            self.restore_failed(StateError::Unsupported {
                stage: stage.to_string(),
                why: format!(
                    "it cannot restore (the state names stage {})",
                    slot.state.stage
                ),
            });
        }
    }

    /// Records why restoring failed; [`Pipeline::start_from`] returns it.
    pub(crate) fn restore_failed(&self, error: StateError) {
        let mut slot = self
            .shared
            .restore_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slot.get_or_insert(error);
    }

    /// The state for a `then` stage named `name`: `(own, upstream's)`.
    fn split_resume(&self, name: &str) -> (Option<StageState>, Option<StageState>) {
        let Some(state) = self.resume_state() else {
            return (None, None);
        };
        if state.stage != name {
            self.restore_failed(StateError::mismatch(
                name,
                format!("the state is for stage {}", state.stage),
            ));
            return (None, None);
        }
        (Some(state.clone()), state.inputs.first().cloned())
    }

    pub(crate) fn live(&self) -> &LiveThreads {
        &self.shared.live
    }
}

/// A lazy, re-runnable plan of stages producing elements of type `T`.
///
/// Cloning is cheap (the plan is shared). See the [module docs](self).
pub struct Pipeline<T> {
    build: Arc<BuildFn<T>>,
    /// Where the last stage already computes ahead on worker threads into a
    /// bounded window (a parallel map): the same pipeline with that window
    /// widened by `n` elements. [`prefetch`](Self::prefetch) uses it instead
    /// of a thread of its own.
    widen: Option<Arc<WidenFn<T>>>,
    depth: usize,
    error: Option<Invalid>,
    /// The first file the pipeline reads, where known: errors from an input
    /// of a combined pipeline name it.
    origin: Option<Arc<str>>,
}

impl<T> Clone for Pipeline<T> {
    fn clone(&self) -> Self {
        Pipeline {
            build: Arc::clone(&self.build),
            widen: self.widen.clone(),
            depth: self.depth,
            error: self.error.clone(),
            origin: self.origin.clone(),
        }
    }
}

impl<T: Send + 'static> Pipeline<T> {
    /// A pipeline from a build function (the source stage).
    pub(crate) fn from_build(build: impl Fn(&Env) -> Stream<T> + Send + Sync + 'static) -> Self {
        Pipeline {
            build: Arc::new(build),
            widen: None,
            depth: 0,
            error: None,
            origin: None,
        }
    }

    /// Appends a stage named `name`: `f` gets the upstream stream and the
    /// stage's counters when the pipeline starts (and again each epoch under
    /// `repeat`).
    pub(crate) fn then<U: Send + 'static>(
        self,
        name: &'static str,
        f: impl Fn(&Env, Stream<T>, Arc<StageCounters>) -> Stream<U> + Send + Sync + 'static,
    ) -> Pipeline<U> {
        let depth = self.depth + 1;
        Pipeline {
            build: stage_build(self.build, depth, name, f),
            widen: None,
            depth,
            error: self.error,
            origin: self.origin,
        }
    }

    /// Like [`then`](Self::then), for a stage that computes ahead on worker
    /// threads into a window: `f` also gets how many elements to widen that
    /// window by, 0 unless a [`prefetch`](Self::prefetch) follows.
    pub(crate) fn then_widening<U: Send + 'static>(
        self,
        name: &'static str,
        f: impl Fn(usize, &Env, Stream<T>, Arc<StageCounters>) -> Stream<U> + Send + Sync + 'static,
    ) -> Pipeline<U> {
        let depth = self.depth + 1;
        let up = self.build;
        let f = Arc::new(f);
        let widen = move |extra: usize| {
            let f = Arc::clone(&f);
            stage_build(
                Arc::clone(&up),
                depth,
                name,
                move |env, stream, counters| f(extra, env, stream, counters),
            )
        };
        Pipeline {
            build: widen(0),
            widen: Some(Arc::new(widen)),
            depth,
            error: self.error,
            origin: self.origin,
        }
    }

    /// Like [`then`](Self::then), but `f` decides whether to build the
    /// upstream at all (a cache replaying its copy does not).
    pub(crate) fn then_lazy<U: Send + 'static>(
        self,
        name: &'static str,
        f: impl Fn(&Env, &dyn Fn() -> Stream<T>, Arc<StageCounters>) -> Stream<U>
        + Send
        + Sync
        + 'static,
    ) -> Pipeline<U> {
        let depth = self.depth + 1;
        let up = self.build;
        Pipeline {
            build: Arc::new(move |env: &Env| {
                let counters = env.stage(depth, name);
                // Lazy stages (cache) do not restore: a state for one fails.
                env.check_claimed(name);
                let env = env.resuming(None);
                f(&env, &|| up(&env), counters)
            }),
            widen: None,
            depth,
            error: self.error,
            origin: self.origin,
        }
    }

    /// Appends an adapter that is not a stage of its own: no metrics row, the
    /// same depth. `f` gets the context and the upstream (whose counters it
    /// can look up with `env.stage(depth, name)`), and, when restoring, the
    /// adapter's own state: a saved state named `own` is the adapter's (its
    /// input is the upstream's); any other is the upstream's, as the
    /// adapter saves only its upstream's state when it holds nothing.
    pub(crate) fn then_quiet<U: Send + 'static>(
        self,
        own: &'static str,
        f: impl Fn(&Env, usize, Stream<T>, Option<StageState>) -> Stream<U> + Send + Sync + 'static,
    ) -> Pipeline<U> {
        let depth = self.depth;
        let f: Arc<QuietFn<T, U>> = Arc::new(f);
        // An adapter adds no thread: a stage before it that can widen its
        // look-ahead still can, the adapter wrapped around it again.
        let widen = self.widen.map(|widen| {
            let f = Arc::clone(&f);
            Arc::new(move |extra: usize| quiet_build(widen(extra), depth, own, Arc::clone(&f)))
                as Arc<WidenFn<U>>
        });
        Pipeline {
            build: quiet_build(self.build, depth, own, f),
            widen,
            depth,
            error: self.error,
            origin: self.origin,
        }
    }

    /// Records a configuration error of `operator`, reported by
    /// [`start`](Self::start).
    pub(crate) fn invalid(self, operator: &str, reason: impl FnOnce() -> String) -> Self {
        let (operator, reason) = (operator.to_string(), reason());
        self.invalid_with(move || PipelineError::Config {
            operator: operator.clone(),
            reason: reason.clone(),
        })
    }

    /// Records an error that `make` builds (at each [`start`](Self::start)),
    /// for errors that are not a plain message, such as an invalid schema.
    pub(crate) fn invalid_with(
        mut self,
        make: impl Fn() -> PipelineError + Send + Sync + 'static,
    ) -> Self {
        if self.error.is_none() {
            self.error = Some(Invalid(Arc::new(make)));
        }
        self
    }

    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// Records the first file the pipeline reads (for errors naming an input).
    pub(crate) fn with_origin(mut self, origin: Option<&std::path::Path>) -> Self {
        self.origin = origin.map(|p| Arc::from(p.display().to_string()));
        self
    }

    pub(crate) fn build_stream(&self, env: &Env) -> Stream<T> {
        (self.build)(env)
    }

    /// Starts the pipeline: spawns its threads and returns the iterator.
    /// Fails if an operator was given a setting that makes no sense.
    pub fn start(&self) -> Result<PipelineIter<T>, PipelineError> {
        self.start_with(None)
    }

    /// Starts the pipeline where [`PipelineIter::state`] captured `state`:
    /// the stream it yields equals the rest of the one the state was taken
    /// from, element for element. Fails if the state does not fit this
    /// pipeline (another shape, a stage that cannot restore, a buffered
    /// record that cannot be re-read). See [`state`] for what is stored.
    ///
    /// ```
    /// use tfpipe::pipeline::{Pipeline, PipelineState};
    /// let p = Pipeline::from_vec((0..10u32).collect()).map(|x| x * 2);
    /// let mut it = p.start()?;
    /// let first: Vec<u32> = it.by_ref().take(3).collect::<Result<_, _>>()?;
    /// let saved = it.state()?.to_json();
    /// let rest: Vec<u32> = p.start_from(&PipelineState::from_json(&saved)?)?.collect::<Result<_, _>>()?;
    /// assert_eq!((first, rest), (vec![0, 2, 4], vec![6, 8, 10, 12, 14, 16, 18]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start_from(&self, state: &PipelineState) -> Result<PipelineIter<T>, PipelineError> {
        self.start_with(Some(state))
    }

    fn start_with(&self, state: Option<&PipelineState>) -> Result<PipelineIter<T>, PipelineError> {
        if let Some(invalid) = &self.error {
            return Err(invalid.error());
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let shared = Arc::new(Shared {
            cancel: AtomicBool::new(false),
            metrics: MetricsRegistry::new(),
            live: LiveThreads::default(),
            cores,
            restore_error: std::sync::Mutex::new(None),
        });
        let env = Env {
            shared: Arc::clone(&shared),
            epoch: 0,
            prefix: "".into(),
            label: "".into(),
            resume: None,
        };
        let Some(state) = state else {
            let stream = (self.build)(&env);
            return Ok(PipelineIter {
                stream: Some(stream),
                shared,
                epoch: 0,
            });
        };
        if state.version != state::STATE_VERSION {
            return Err(StateError::Version {
                found: state.version,
            }
            .into());
        }
        if state.stage.stage == state::END {
            return Ok(PipelineIter {
                stream: None,
                shared,
                epoch: state.epoch,
            });
        }
        let env = env.resuming(Some(state.stage.clone()));
        let stream = (self.build)(&env);
        env.check_claimed("the first");
        let failed = shared
            .restore_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(error) = failed {
            // Dropping the stream cancels and joins whatever it started.
            shared.cancel.store(true, Ordering::SeqCst);
            drop(stream);
            return Err(error.into());
        }
        Ok(PipelineIter {
            stream: Some(stream),
            shared,
            epoch: state.epoch,
        })
    }
}

/// [`PipelineIter::next_timeout`] found no element within its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

/// A running pipeline: an iterator of elements (or errors naming their stage).
///
/// Dropping it cancels the pipeline and joins every thread.
pub struct PipelineIter<T> {
    stream: Option<Stream<T>>,
    shared: Arc<Shared>,
    epoch: u64,
}

impl<T> PipelineIter<T> {
    /// The next element, error or epoch marker.
    pub fn next_event(&mut self) -> Option<Event<T>> {
        let event = self.stream.as_mut()?.next();
        self.count(event)
    }

    /// The next element or error, or [`TimedOut`] if none came within
    /// `timeout`; call it again to go on waiting (nothing is lost).
    ///
    /// The wait is bounded only where the pipeline ends in
    /// [`prefetch`](Pipeline::prefetch), whose thread (or, right after a
    /// parallel map, the map's workers) computes the elements: other last
    /// stages compute in the caller's thread and return when done. A front
    /// end that must stay responsive while it waits (to signals, say) ends
    /// its pipeline in `prefetch` and waits here in slices, with no thread
    /// of its own in between.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tfpipe::pipeline::Pipeline;
    /// let mut it = Pipeline::from_vec(vec![1u32, 2]).prefetch(1).start()?;
    /// let mut got = Vec::new();
    /// loop {
    ///     match it.next_timeout(Duration::from_millis(20)) {
    ///         Ok(Some(item)) => got.push(item?),
    ///         Ok(None) => break,
    ///         Err(tfpipe::pipeline::TimedOut) => continue, // check for Ctrl-C here
    ///     }
    /// }
    /// assert_eq!(got, [1, 2]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn next_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Result<T, PipelineError>>, TimedOut> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return Ok(None);
            };
            let event = stream.next_until(deadline)?;
            match self.count(event) {
                Some(Event::Item(item)) => return Ok(Some(item)),
                // Passes may end back to back without an element (an empty
                // file repeated): the timeout still holds.
                Some(Event::EpochEnd(_)) if Instant::now() >= deadline => return Err(TimedOut),
                Some(Event::EpochEnd(_)) => continue,
                None => return Ok(None),
            }
        }
    }

    /// Keeps the epoch count (and drops the finished stages) as events pass.
    fn count(&mut self, event: Option<Event<T>>) -> Option<Event<T>> {
        match &event {
            Some(Event::EpochEnd(_)) => self.epoch += 1,
            Some(Event::Item(_)) => {}
            // Finished: drop the stages now, joining their threads.
            None => self.stream = None,
        }
        event
    }

    /// Where the pipeline stands, after the last element (or marker)
    /// returned: restart from it with [`Pipeline::start_from`]. Fails with
    /// [`StateError::Unsupported`] if a stage cannot capture its position
    /// (see [`state`]).
    pub fn state(&self) -> Result<PipelineState, PipelineError> {
        let stage = match &self.stream {
            Some(stream) => stream.save()?,
            None => StageState::new(state::END, serde_json::Value::Null),
        };
        Ok(PipelineState {
            version: state::STATE_VERSION,
            epoch: self.epoch,
            stage,
        })
    }

    /// Epochs completed so far (the epoch of the next element).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A snapshot of every stage's metrics, taken without stopping anything.
    pub fn metrics(&self) -> PipelineMetrics {
        self.shared.metrics.snapshot()
    }

    /// A handle to read the metrics from another thread, or after the
    /// iterator is gone.
    pub fn metrics_handle(&self) -> MetricsHandle {
        MetricsHandle(Arc::clone(&self.shared))
    }

    /// The count of this pipeline's live worker threads.
    pub fn live_threads(&self) -> LiveThreads {
        self.shared.live.clone()
    }

    /// A handle that stops this pipeline from another thread (the Python
    /// package's Ctrl-C and `close()` stop a pipeline that another thread
    /// may be waiting on).
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// // An endless source into a buffer that never fills: `next` would block.
    /// let mut it = Pipeline::from_generator(|| 0u64..).shuffle(usize::MAX / 2, 1).start()?;
    /// let stop = it.stop_handle();
    /// stop.stop(); // from any thread, before or during `next`
    /// assert!(it.next().is_none());
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(Arc::clone(&self.shared))
    }
}

/// Stops a running pipeline from any thread (`Send + Sync + Clone`); made by
/// [`PipelineIter::stop_handle`].
///
/// [`stop`](StopHandle::stop) raises the cancel flag that dropping the
/// iterator raises: a `next` blocked in a stage returns soon after (the
/// stages check the flag while filling a buffer or reading a file), and
/// the stream ends early. The elements after a stop are not the dataset's:
/// drop the iterator, which joins the threads.
#[derive(Clone)]
pub struct StopHandle(Arc<Shared>);

impl StopHandle {
    /// Raises the cancel flag. Idempotent.
    pub fn stop(&self) {
        self.0.cancel.store(true, Ordering::SeqCst);
    }

    /// Whether [`stop`](Self::stop) was called or the iterator dropped.
    pub fn is_stopped(&self) -> bool {
        self.0.cancel.load(Ordering::SeqCst)
    }
}

impl<T> Iterator for PipelineIter<T> {
    type Item = Result<T, PipelineError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.next_event()? {
                Event::Item(item) => return Some(item),
                Event::EpochEnd(_) => continue,
            }
        }
    }
}

impl<T> Drop for PipelineIter<T> {
    fn drop(&mut self) {
        self.shared.cancel.store(true, Ordering::SeqCst);
        // Dropping the stream drops every receiver before joining its worker.
        self.stream = None;
    }
}

/// Reads a pipeline's metrics from anywhere (`Send + Sync + Clone`).
#[derive(Clone)]
pub struct MetricsHandle(Arc<Shared>);

impl MetricsHandle {
    /// A snapshot of every stage.
    pub fn snapshot(&self) -> PipelineMetrics {
        self.0.metrics.snapshot()
    }
}

/// The payload size of an element, for the byte counters: records, record
/// batches, strings and [`Batch`]es are measured; other types count 0.
pub(crate) fn byte_size<T: 'static>(element: &T) -> u64 {
    let any = element as &dyn Any;
    if let Some(r) = any.downcast_ref::<Record>() {
        r.len() as u64
    } else if let Some(v) = any.downcast_ref::<Vec<Record>>() {
        v.iter().map(|r| r.len() as u64).sum()
    } else if let Some(v) = any.downcast_ref::<Vec<u8>>() {
        v.len() as u64
    } else if let Some(v) = any.downcast_ref::<Vec<Vec<u8>>>() {
        v.iter().map(|r| r.len() as u64).sum()
    } else if let Some(b) = any.downcast_ref::<Batch>() {
        b.columns
            .iter()
            .map(|c| match &c.values {
                Values::Int64(v) => 8 * v.len() as u64,
                Values::Float32(v) => 4 * v.len() as u64,
                Values::Uint8(v) => v.len() as u64,
                Values::Int16(v) => 2 * v.len() as u64,
                Values::Uint16(v) => 2 * v.len() as u64,
                Values::Int32(v) => 4 * v.len() as u64,
                Values::Float64(v) => 8 * v.len() as u64,
                Values::Bytes { data, .. } => data.len() as u64,
                // Estimated: 8 bytes per index and per value.
                Values::Sparse {
                    indices, values, ..
                } => 8 * (indices.len() + values.len()) as u64,
            })
            .sum()
    } else if let Some(s) = any.downcast_ref::<String>() {
        s.len() as u64
    } else {
        0
    }
}

/// Splits a fused stage's time into busy and waiting-for-input.
///
/// A clock from [`Clock::off`] reads no time at all: [`Sampler`] hands those
/// out for the calls it does not sample.
pub(crate) struct Clock {
    /// `(start, last)`: `last` is the last time read, where a
    /// [`pull_next`](Self::pull_next) starts. `None` for an off clock.
    times: Option<(Instant, Instant)>,
    waited: Duration,
}

impl Clock {
    pub(crate) fn start() -> Clock {
        let now = Instant::now();
        Clock {
            times: Some((now, now)),
            waited: Duration::ZERO,
        }
    }

    /// A clock that never reads the time; [`finish`](Self::finish) adds nothing.
    pub(crate) fn off() -> Clock {
        Clock {
            times: None,
            waited: Duration::ZERO,
        }
    }

    /// Pulls from upstream, counting the time as waiting for input.
    pub(crate) fn pull<T>(&mut self, upstream: &mut Stream<T>) -> Option<Event<T>> {
        let Some((_, last)) = &mut self.times else {
            return upstream.next();
        };
        let t = Instant::now();
        let event = upstream.next();
        *last = Instant::now();
        self.waited += *last - t;
        event
    }

    /// Like [`pull`](Self::pull) with one clock read instead of two: the
    /// wait is counted from the previous reading, so the stage's own work
    /// since then counts as waiting. Only for stages whose work between pulls
    /// is trivial (batch's push, shuffle's buffer insert): on the hot path a
    /// clock read costs about as much as that work.
    pub(crate) fn pull_next<T>(&mut self, upstream: &mut Stream<T>) -> Option<Event<T>> {
        let event = upstream.next();
        self.mark_waited();
        event
    }

    /// Counts everything since the previous reading as waiting for input:
    /// [`pull_next`](Self::pull_next) without the pull, for a stage that
    /// pulls several times and reads the clock only after the last pull.
    pub(crate) fn mark_waited(&mut self) {
        if let Some((_, last)) = &mut self.times {
            let now = Instant::now();
            self.waited += now - *last;
            *last = now;
        }
    }

    /// Time since the clock started (zero for an off clock).
    pub(crate) fn elapsed(&self) -> Duration {
        self.times
            .map_or(Duration::ZERO, |(start, _)| start.elapsed())
    }

    /// `(busy, waited)` since the clock started; `None` for an off clock.
    fn split(self) -> Option<(Duration, Duration)> {
        let (start, _) = self.times?;
        let total = start.elapsed();
        Some((total.saturating_sub(self.waited), self.waited))
    }

    pub(crate) fn finish(self, counters: &StageCounters) {
        if let Some((busy, waited)) = self.split() {
            counters.add_wait_in(waited);
            counters.add_busy(busy);
        }
    }
}

/// What timing a call adds to it: a [`Clock::start`]-to-[`Clock::finish`]
/// span with nothing between measures about one clock read. Measured once
/// per process (the least of a few tries, so a preemption cannot inflate it).
fn clock_read_cost() -> Duration {
    static COST: OnceLock<Duration> = OnceLock::new();
    *COST.get_or_init(|| {
        (0..64)
            .map(|_| Instant::now().elapsed())
            .min()
            .unwrap_or(Duration::ZERO)
    })
}

/// Times one call in about [`Sampler::MEAN_GAP`] of a per-element stage and
/// attributes each sampled call's busy / wait-in split to the unsampled calls
/// that follow it.
///
/// Why: a clock read costs ~20-25 ns, the same order as the per-record work
/// of the file source and `shuffle`; timing every call put `clock_gettime`
/// at 8-13% of the CPU of `tfpipe bench`. The gaps are random (uniform in
/// `1..=2 * MEAN_GAP - 1`, from a fixed seed) so a periodic cost, such as a
/// buffer refill every N records, is sampled at its true rate instead of
/// always or never. Calls that are not like their neighbours (opening a file,
/// filling a shuffle buffer, the first output) are `forced`: timed exactly,
/// counted only for themselves. Unsampled calls are added when the next
/// sample or [`flush`](Self::flush) comes, so a snapshot can lag by a few
/// elements' time, as it already may lag by a few elements.
pub(crate) struct Sampler {
    rng: u64,
    /// Calls until the next sample; 0 means the next call is sampled.
    countdown: u32,
    /// Unsampled calls not yet added.
    pending: u32,
    /// The last sample's `(busy, waited)`, which the pending calls get.
    last: (Duration, Duration),
}

impl Sampler {
    /// The mean number of calls per sample.
    pub(crate) const MEAN_GAP: u32 = 16;

    pub(crate) fn new() -> Sampler {
        Sampler {
            rng: 0x2545_F491_4F6C_DD1D,
            countdown: 0,
            pending: 0,
            last: (Duration::ZERO, Duration::ZERO),
        }
    }

    /// The clock for this call: running if the call is sampled or `forced`.
    pub(crate) fn clock(&mut self, forced: bool) -> Clock {
        if forced || self.countdown == 0 {
            Clock::start()
        } else {
            Clock::off()
        }
    }

    /// Ends a call begun with [`clock`](Self::clock) with the same `forced`.
    pub(crate) fn finish(&mut self, clock: Clock, forced: bool, counters: &StageCounters) {
        match clock.split() {
            Some((busy, waited)) => {
                counters.add_busy(busy);
                counters.add_wait_in(waited);
                if !forced {
                    self.flush(counters);
                    // A sampled call measures its own clock reads; the
                    // unsampled calls it stands for made none.
                    self.last = (busy.saturating_sub(clock_read_cost()), waited);
                    // xorshift64: the gap only has to be independent of the work.
                    self.rng ^= self.rng << 13;
                    self.rng ^= self.rng >> 7;
                    self.rng ^= self.rng << 17;
                    self.countdown = 1 + (self.rng % u64::from(2 * Self::MEAN_GAP - 1)) as u32;
                }
            }
            None => {
                self.pending += 1;
                self.countdown -= 1;
            }
        }
    }

    /// Adds the unsampled calls since the last sample (at the end of the stream).
    pub(crate) fn flush(&mut self, counters: &StageCounters) {
        if self.pending > 0 {
            counters.add_busy(self.last.0 * self.pending);
            counters.add_wait_in(self.last.1 * self.pending);
            self.pending = 0;
        }
    }
}

/// The error a stage reports for a user function's `Err`.
pub(crate) fn user_error(stage: &StageCounters, err: impl Into<BoxError>) -> PipelineError {
    PipelineError::User {
        stage: stage.name().to_string(),
        error: err.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples about one call in `MEAN_GAP`, and every call is counted once
    /// the sampler is flushed: the estimate covers all calls, each sample
    /// standing for the calls after it.
    #[test]
    fn sampler_times_about_one_call_in_mean_gap_and_counts_all() {
        let counters = StageCounters::new("s".to_string());
        let mut sampler = Sampler::new();
        let calls = 16_000;
        let mut timed = 0;
        for _ in 0..calls {
            let clock = sampler.clock(false);
            if clock.times.is_some() {
                timed += 1;
                std::thread::sleep(Duration::from_micros(1));
            }
            sampler.finish(clock, false, &counters);
        }
        assert!((calls / 24..calls / 10).contains(&timed), "{timed}");
        sampler.flush(&counters);
        assert_eq!(sampler.pending, 0);
        // Every call, sampled or not, is counted with a sample's >= 1 us.
        assert!(
            counters.busy_ns() >= calls * 1_000,
            "{}",
            counters.busy_ns()
        );
    }

    /// A forced call is timed exactly and is not a sample for the others.
    #[test]
    fn forced_calls_count_only_for_themselves() {
        let counters = StageCounters::new("s".to_string());
        let mut sampler = Sampler::new();
        let clock = sampler.clock(true);
        std::thread::sleep(Duration::from_millis(20));
        sampler.finish(clock, true, &counters);
        let forced = counters.busy_ns();
        assert!(forced >= 20_000_000);
        // The first unforced call is sampled; the ones after it get its
        // (tiny) time, not the forced call's 20 ms.
        for _ in 0..10 {
            let clock = sampler.clock(false);
            sampler.finish(clock, false, &counters);
        }
        sampler.flush(&counters);
        assert!(
            counters.busy_ns() - forced < 10_000_000,
            "{}",
            counters.busy_ns()
        );
    }
}
