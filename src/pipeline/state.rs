//! Checkpointable iterator state: where a running pipeline stands, small
//! enough to put in every checkpoint, and a restart from it.
//!
//! [`PipelineIter::state`](super::PipelineIter::state) captures, at any
//! element boundary, one [`StageState`] per stage (a tree: interleave
//! holds its open inputs' states); [`Pipeline::start_from`](super::Pipeline::start_from)
//! rebuilds the pipeline from it, and the resumed stream equals the
//! uninterrupted one element for element (`tests/pipeline/state.rs` checks
//! this over random pipelines and cut points, parallel stages included).
//!
//! # What is stored
//!
//! Positions, not bytes:
//! - a TFRecord file: the index and uncompressed offset of the next record;
//! - `from_vec` / `from_generator`: how many elements were emitted;
//! - `shuffle`: the RNG state and counters, and the buffer as the
//!   [`RecordPosition`]s of its records (file table + `[file, record,
//!   offset]` triples), re-read on restore. About 15 bytes of JSON per
//!   buffered record (145 KB measured for a full 10k buffer over files of
//!   5,000 records; longer offsets in larger files add a few bytes);
//! - `batch`: the partial batch, as positions;
//! - `interleave`: the round-robin cursor, each open input's state, and the
//!   input position of the earliest open input (the later ones are pulled
//!   again on restore to recover their elements, the finished ones skipped);
//! - `repeat`: the epoch and the current pass's state; the pass is rebuilt
//!   at that epoch, so per-epoch seeds (`shuffle`'s reshuffle) carry on as
//!   in the uninterrupted run;
//! - `unbatch`, `rebatch`, `window`, `bucket_by_sequence_length`, `pack`
//!   (whose rows are mostly parsed data, not records): by replay, the
//!   upstream's state at an anchor before the oldest row they hold plus
//!   those rows' ids ([`rows`](super::rows));
//! - `take`, `skip`, `shard`: their counters; `map`, `filter`,
//!   `ignore_errors`: nothing of their own;
//! - parallel stages (`map_parallel`, `parse_batches`/`parse_records`,
//!   `prefetch`, parallel `interleave`): their workers run ahead of the
//!   consumer, so the upstream state *at the consumer's position* no longer
//!   exists when asked for. They keep the upstream's state at an *anchor*
//!   taken every few elements on the worker side, and store `anchor + skip`:
//!   restore rebuilds the upstream at the anchor and drops the first `skip`
//!   outputs (recomputing at most [`ANCHOR_EVERY`] elements).
//!
//! # Re-reading buffered records
//!
//! An uncompressed file is read at each stored offset with positioned
//! reads (`tfrecord::frame::read_framed_at`, the one positioned record
//! read, which the record index and the global shuffle use too). An uncompressed object (`s3://...`, any URL) is read by ranged
//! GETs at the stored offsets, all in flight at once: records less than
//! 256 KiB apart share one GET of up to 8 MiB, which a buffer filled by
//! sequential reading makes the common case (a 10k buffer of MNIST-sized
//! records is a few GETs per object), and one HEAD per object bounds the
//! ranges. A GZIP or ZLIB file or object cannot seek: its records are found by
//! decompressing it from the start up to the last offset needed (once per
//! file, all of that file's buffered records in one pass). Either way the
//! CRCs are checked, so a file changed since the checkpoint is an error, not
//! a silent difference.
//!
//! # What cannot be captured
//!
//! A state request fails with [`StateError::Unsupported`] (never a silent
//! wrong resume) for: `from_iterator` (one-shot), `cache`/`cache_file`,
//! `padded_batch` over `Vec` elements (the one over parsed batches is
//! `rebatch` + a map, and is captured), non-deterministic parallel stages, and `shuffle`/`batch` buffers of
//! elements other than [`Record`]s read from files. User closures (`map`, `filter`,
//! `map_parallel`, `interleave`'s function, generators) are assumed pure:
//! hidden state inside them is not captured, and a closure that depends on
//! it resumes differently. A state given to a pipeline of another shape is
//! rejected ([`StateError::Mismatch`]).

use std::collections::HashMap;
use std::fs::File;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::PoisonError;

use serde::{Deserialize, Serialize};

use super::record::{FileId, Record, RecordPosition};
use super::{Env, Event, Stream, TimedOut};
use crate::tfrecord::frame::{self, ReadAtError};
use crate::tfrecord::{Compression, CorruptionKind, FileRecordReader, ReaderOptions, RecordError};

/// Parallel stages take an upstream anchor every this many elements.
pub const ANCHOR_EVERY: u64 = 64;

/// The stage name of a finished pipeline's state.
pub(crate) const END: &str = "end";

/// The format version of [`PipelineState`].
pub const STATE_VERSION: u32 = 1;

/// Why a state could not be captured or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// A stage whose position cannot be captured.
    #[error("stage {stage}: its state cannot be captured ({why})")]
    Unsupported {
        /// The stage.
        stage: String,
        /// Why it cannot.
        why: String,
    },
    /// The state does not fit this pipeline: which stage, and why.
    #[error("the state does not fit this pipeline: stage {stage}: {reason}")]
    Mismatch {
        /// The stage (or operator) the state does not fit.
        stage: String,
        /// Why it does not.
        reason: String,
    },
    /// A stage's saved data does not decode as that stage's state.
    #[error("the state does not fit this pipeline: stage {stage}: its data does not decode")]
    Decode {
        /// The stage.
        stage: String,
        /// Why it does not decode.
        #[source]
        source: serde_json::Error,
    },
    /// No record starts any more where a buffered record was read: the
    /// file changed since the state was taken.
    #[error("{position}: no record starts there any more (the file changed?)")]
    Moved {
        /// The buffered record's position.
        position: String,
    },
    /// A buffered record could not be read back.
    #[error("re-reading a buffered record")]
    Reread(#[source] RecordError),
    /// A state written by another version.
    #[error("pipeline state version {found}, this build reads version {STATE_VERSION}")]
    Version {
        /// The state's version.
        found: u32,
    },
    /// The JSON is not a pipeline state.
    #[error("pipeline state")]
    Json(#[from] serde_json::Error),
}

/// One stage's state: its name, its own data, and its inputs' states
/// (the upstream stage; for `interleave`, also the open inputs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageState {
    /// The stage's name, checked on restore.
    pub stage: String,
    /// The stage's own fields.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub data: serde_json::Value,
    /// Records the stage holds (shuffle buffer, partial batch), by position.
    #[serde(default, skip_serializing_if = "Positions::is_empty")]
    pub records: Positions,
    /// The states of the stage's inputs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<StageState>,
}

impl StateError {
    /// A [`Mismatch`](StateError::Mismatch) of `stage`.
    pub(crate) fn mismatch(stage: impl Into<String>, reason: impl Into<String>) -> StateError {
        StateError::Mismatch {
            stage: stage.into(),
            reason: reason.into(),
        }
    }
}

impl StageState {
    pub(crate) fn new(stage: &str, data: serde_json::Value) -> StageState {
        StageState {
            stage: stage.to_string(),
            data,
            records: Positions::default(),
            inputs: Vec::new(),
        }
    }

    pub(crate) fn with_input(mut self, input: StageState) -> StageState {
        self.inputs.push(input);
        self
    }

    /// This stage's data as `D`, after checking the name.
    pub(crate) fn data<D: for<'de> Deserialize<'de>>(&self, stage: &str) -> Result<D, StateError> {
        if self.stage != stage {
            return Err(StateError::mismatch(
                stage,
                format!("the state is for stage {}", self.stage),
            ));
        }
        serde_json::from_value(self.data.clone()).map_err(|source| StateError::Decode {
            stage: stage.to_string(),
            source,
        })
    }
}

/// Where a whole pipeline stands: the epoch and the last stage's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// Epochs completed (as [`PipelineIter::epoch`](super::PipelineIter::epoch)).
    pub epoch: u64,
    /// The last stage's state (which holds the others).
    pub stage: StageState,
}

impl PipelineState {
    /// The state as compact JSON.
    pub fn to_json(&self) -> String {
        // A tree of strings, numbers and arrays always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A state from [`to_json`](Self::to_json)'s output.
    pub fn from_json(text: &str) -> Result<PipelineState, StateError> {
        let state: PipelineState = serde_json::from_str(text)?;
        if state.version != STATE_VERSION {
            return Err(StateError::Version {
                found: state.version,
            });
        }
        Ok(state)
    }
}

/// Record positions, serialised as a file table and `[file, record, offset]`
/// triples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Positions(pub Vec<RecordPosition>);

impl Positions {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[derive(Serialize, Deserialize)]
struct PositionsRepr {
    files: Vec<FileRepr>,
    at: Vec<(u32, u64, u64)>,
}

#[derive(Serialize, Deserialize)]
struct FileRepr {
    path: PathBuf,
    /// `none`, `gzip` or `zlib`.
    compression: String,
}

impl Serialize for Positions {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut index: HashMap<FileId, u32> = HashMap::new();
        let mut files = Vec::new();
        let at = self
            .0
            .iter()
            .map(|p| {
                let f = *index.entry(p.file()).or_insert_with(|| {
                    let path = p.path();
                    files.push(FileRepr {
                        compression: compression_of(p.file(), &path).to_string(),
                        path: path.to_path_buf(),
                    });
                    files.len() as u32 - 1
                });
                (f, p.record(), p.offset())
            })
            .collect();
        PositionsRepr { files, at }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Positions {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Positions, D::Error> {
        let repr = PositionsRepr::deserialize(d)?;
        let ids: Vec<FileId> = repr
            .files
            .iter()
            .map(|f| {
                let id = FileId::intern(&f.path);
                let compression = f.compression.parse().map_err(serde::de::Error::custom)?;
                set_compression(id, compression);
                Ok(id)
            })
            .collect::<Result<_, D::Error>>()?;
        repr.at
            .into_iter()
            .map(|(f, record, offset)| match ids.get(f as usize) {
                Some(id) => Ok(RecordPosition::in_file(*id, record, offset)),
                None => Err(serde::de::Error::custom(format!(
                    "file index {f} out of range"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Positions)
    }
}

/// The compression each interned file was read with (set when a source
/// opens it), for re-reading its records.
static COMPRESSION: Mutex<Option<HashMap<FileId, Compression>>> = Mutex::new(None);

pub(crate) fn set_compression(file: FileId, compression: Compression) {
    COMPRESSION
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .insert(file, compression);
}

fn compression_of(file: FileId, path: &Path) -> Compression {
    COMPRESSION
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .and_then(|m| m.get(&file).copied())
        .unwrap_or_else(|| Compression::from_path(path))
}

/// The positions of buffered elements, if they are records read from files.
pub(crate) fn positions_of<T: 'static>(stage: &str, items: &[T]) -> Result<Positions, StateError> {
    let unsupported = |why: &str| StateError::Unsupported {
        stage: stage.to_string(),
        why: why.to_string(),
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let record = (item as &dyn std::any::Any)
            .downcast_ref::<Record>()
            .ok_or_else(|| {
                unsupported("it buffers elements that are not records read from files")
            })?;
        out.push(
            *record
                .position()
                .ok_or_else(|| unsupported("it buffers a record that was not read from a file"))?,
        );
    }
    Ok(Positions(out))
}

/// Reads the records at `positions` back (in that order) as `T` (which
/// must be [`Record`], as [`positions_of`] checked when saving).
pub(crate) fn reread<T: 'static>(stage: &str, positions: &Positions) -> Result<Vec<T>, StateError> {
    let mut by_file: HashMap<FileId, Vec<usize>> = HashMap::new();
    for (i, p) in positions.0.iter().enumerate() {
        by_file.entry(p.file()).or_default().push(i);
    }
    let mut slots: Vec<Option<Record>> = (0..positions.0.len()).map(|_| None).collect();
    for (file, mut wanted) in by_file {
        let path = file.path();
        wanted.sort_by_key(|&i| positions.0[i].offset());
        let compression = compression_of(file, &path);
        let options = ReaderOptions {
            compression: Some(compression),
            buffer_size: 4096,
            ..ReaderOptions::default()
        };
        if compression == Compression::None
            && let Some(url) = crate::storage::url_str(&path)
        {
            reread_object(url, &wanted, positions, options, &mut slots)?;
        } else if compression == Compression::None {
            let handle = File::open(&*path).map_err(|source| {
                StateError::Reread(RecordError::Open {
                    path: path.to_path_buf(),
                    error: source,
                })
            })?;
            for i in wanted {
                let p = positions.0[i];
                let mut record = Record::new();
                let buf = record.buffer_mut();
                let data =
                    frame::read_framed_at(&handle, p.offset(), None, options.max_record_len, buf)
                        .map_err(|e| match e {
                        ReadAtError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                            missing(&p)
                        }
                        ReadAtError::Io(error) => StateError::Reread(RecordError::Io {
                            location: p.location(),
                            error,
                        }),
                        ReadAtError::Corrupt(kind) => corrupt(&p, kind),
                    })?;
                keep_data(buf, data);
                slots[i] = Some(record.with_position(p));
            }
        } else {
            let mut reader = FileRecordReader::open(&*path, options).map_err(StateError::Reread)?;
            let mut next = 0;
            while next < wanted.len() {
                let at = reader.position().offset;
                let mut record = Record::new();
                if !reader
                    .read_record(record.buffer_mut())
                    .map_err(StateError::Reread)?
                {
                    return Err(missing(&positions.0[wanted[next]]));
                }
                while next < wanted.len() && positions.0[wanted[next]].offset() == at {
                    let p = positions.0[wanted[next]];
                    slots[wanted[next]] = Some(record.clone().with_position(p));
                    next += 1;
                }
                if next < wanted.len() && positions.0[wanted[next]].offset() < at {
                    return Err(missing(&positions.0[wanted[next]]));
                }
            }
        }
    }
    slots
        .into_iter()
        .map(|r| {
            let boxed: Box<dyn std::any::Any> = Box::new(r.unwrap_or_default());
            boxed
                .downcast::<T>()
                .map(|b| *b)
                .map_err(|_| StateError::Unsupported {
                    stage: stage.to_string(),
                    why: "it buffers elements that are not records".to_string(),
                })
        })
        .collect()
}

/// Ranges of an object closer together than this are read by one GET (the
/// bytes between them are cheaper than another round trip).
const SPAN_GAP: u64 = 256 << 10;
/// The most bytes one GET of buffered records covers.
const SPAN_MAX: u64 = 8 << 20;
/// Bytes read past a span's last record start: the record itself, unless it
/// is longer (then it is read again, whole, in a second round).
const SPAN_TAIL: u64 = 64 << 10;

/// Re-reads the records at `wanted` (indices into `positions`, sorted by
/// offset) of the uncompressed object at `url` by ranged GETs, all in
/// flight at once: nearby records share one GET ([`SPAN_GAP`]), and a
/// record longer than the [`SPAN_TAIL`] read past its start is read again
/// whole. Every record is CRC-checked as a local re-read is.
fn reread_object(
    url: &str,
    wanted: &[usize],
    positions: &Positions,
    options: ReaderOptions,
    slots: &mut [Option<Record>],
) -> Result<(), StateError> {
    let Some(first) = wanted.first().map(|&i| positions.0[i]) else {
        return Ok(());
    };
    let open_error = |error: crate::storage::StorageError| {
        StateError::Reread(RecordError::Open {
            path: PathBuf::from(url),
            error: error.into_io(),
        })
    };
    // The size bounds every GET: a range past the end would be a short read.
    let size = crate::storage::size_of(Path::new(url)).map_err(open_error)?;
    let mut spans: Vec<(std::ops::Range<u64>, Vec<usize>)> = Vec::new();
    let mut last = first.offset();
    for &i in wanted {
        let offset = positions.0[i].offset();
        match spans.last_mut() {
            Some((range, members))
                if offset - last <= SPAN_GAP && offset - range.start <= SPAN_MAX =>
            {
                range.end = size.min(offset.saturating_add(SPAN_TAIL));
                members.push(i);
            }
            _ => spans.push((offset..size.min(offset.saturating_add(SPAN_TAIL)), vec![i])),
        }
        last = offset;
    }
    let ranges: Vec<_> = spans.iter().map(|(r, _)| r.clone()).collect();
    let bytes = crate::storage::read_ranges(Path::new(url), &ranges).map_err(open_error)?;
    let mut longer = Vec::new();
    for ((range, members), bytes) in spans.iter().zip(&bytes) {
        for &i in members {
            let p = positions.0[i];
            let from = usize::try_from(p.offset() - range.start).unwrap_or(usize::MAX);
            let here = bytes.get(from..).unwrap_or_default();
            match frame::parse_framed(here, options.max_record_len) {
                Err(CorruptionKind::TruncatedData { length, .. })
                    if p.offset().saturating_add(framed(length)) <= size =>
                {
                    longer.push((i, p.offset()..p.offset() + framed(length)));
                }
                parsed => slots[i] = Some(record_from(here, parsed, p)?),
            }
        }
    }
    if longer.is_empty() {
        return Ok(());
    }
    let ranges: Vec<_> = longer.iter().map(|(_, r)| r.clone()).collect();
    let bytes = crate::storage::read_ranges(Path::new(url), &ranges).map_err(open_error)?;
    for ((i, _), bytes) in longer.iter().zip(&bytes) {
        let parsed = frame::parse_framed(bytes, options.max_record_len);
        slots[*i] = Some(record_from(bytes, parsed, positions.0[*i])?);
    }
    Ok(())
}

/// The framed size of a record of `length` data bytes.
fn framed(length: u64) -> u64 {
    length.saturating_add((frame::HEADER_LEN + frame::FOOTER_LEN) as u64)
}

/// The record at `p`, from `bytes` read there and what
/// [`frame::parse_framed`] made of them.
fn record_from(
    bytes: &[u8],
    parsed: Result<std::ops::Range<usize>, CorruptionKind>,
    p: RecordPosition,
) -> Result<Record, StateError> {
    let data = parsed.map_err(|kind| corrupt(&p, kind))?;
    let mut record = Record::new();
    record.buffer_mut().extend_from_slice(&bytes[data]);
    Ok(record.with_position(p))
}

/// Keeps only the data of the framed record in `buf`.
fn keep_data(buf: &mut Vec<u8>, data: std::ops::Range<usize>) {
    buf.truncate(data.end);
    buf.drain(..data.start);
}

/// A buffered record that is no longer intact where it was read.
fn corrupt(p: &RecordPosition, kind: CorruptionKind) -> StateError {
    StateError::Reread(RecordError::Corrupt {
        location: p.location(),
        kind,
    })
}

fn missing(p: &RecordPosition) -> StateError {
    StateError::Moved {
        position: p.to_string(),
    }
}

/// A started stage: events in order, and where it stands.
pub(crate) trait StageStream<T>: Iterator<Item = Event<T>> + Send {
    /// The next event, waiting no later than `deadline` where the stage
    /// waits on a channel (`prefetch`); every other stage computes its next
    /// event in the caller's thread and ignores the deadline.
    fn next_until(&mut self, deadline: std::time::Instant) -> Result<Option<Event<T>>, TimedOut> {
        let _ = deadline;
        Ok(self.next())
    }

    /// The state after the last event returned.
    fn save(&self) -> Result<StageState, StateError> {
        Err(StateError::Unsupported {
            stage: stage_of(std::any::type_name::<Self>()),
            why: "this stage does not record its position".to_string(),
        })
    }

    /// The state *before* the last event returned (so that a restored
    /// stream returns that event again), for an adapter that splits one
    /// element into several events and is saved between them. Only
    /// deterministic parallel maps can (from the anchor they keep for it).
    fn save_before_last(&self) -> Result<StageState, StateError> {
        Err(StateError::Unsupported {
            stage: stage_of(std::any::type_name::<Self>()),
            why: "this stage cannot step back one element".to_string(),
        })
    }
}

/// The pipeline module a stream type comes from (`take`, `cache`, ...).
fn stage_of(type_name: &str) -> String {
    type_name
        .split("pipeline::")
        .nth(1)
        .and_then(|rest| rest.split("::").next())
        .unwrap_or("unknown")
        .to_string()
}

impl<T, F: FnMut() -> Option<Event<T>> + Send> StageStream<T> for std::iter::FromFn<F> {}
impl<T: Send> StageStream<T> for std::iter::Once<Event<T>> {}
impl<T: Send> StageStream<T> for std::iter::Empty<Event<T>> {}
impl<T, A: Iterator<Item = Event<T>> + Send, B: Iterator<Item = Event<T>> + Send> StageStream<T>
    for std::iter::Chain<A, B>
{
}

/// A sequential stage whose whole state is a small serialisable value `S`
/// plus its upstream's: `take`'s count, `shard`'s position, nothing at all
/// for `filter`. `step` makes the next event from the upstream, and may drop
/// the upstream (set it to `None`) once the stage is done with it.
///
/// Saved as `S` with the upstream's state as the one input, or with no
/// input once the upstream is dropped: a stage restored without one drops
/// the freshly built upstream at once, so it never reads its input again.
pub(crate) struct Sequential<T, U, S, F> {
    name: &'static str,
    up: Option<Stream<T>>,
    state: S,
    step: F,
    _out: PhantomData<fn() -> U>,
}

impl<T, U, S, F> Sequential<T, U, S, F>
where
    T: 'static,
    S: Serialize + for<'de> Deserialize<'de> + Default + Send,
    F: FnMut(&mut S, &mut Option<Stream<T>>) -> Option<Event<U>> + Send,
{
    /// The stage `name` over `up`, restored if `env` carries a state for it
    /// (else starting from `S::default()`).
    pub(crate) fn new(env: &Env, name: &'static str, up: Stream<T>, step: F) -> Self {
        Sequential::starting_at(env, name, up, S::default(), step)
    }

    /// [`new`](Self::new), starting from `initial` when not restored.
    pub(crate) fn starting_at(
        env: &Env,
        name: &'static str,
        up: Stream<T>,
        initial: S,
        step: F,
    ) -> Self {
        let mut up = Some(up);
        let state = match env.resume_state() {
            Some(saved) => {
                if saved.inputs.is_empty() {
                    up = None;
                }
                saved.data::<S>(name).unwrap_or_else(|error| {
                    env.restore_failed(error);
                    S::default()
                })
            }
            None => initial,
        };
        Sequential {
            name,
            up,
            state,
            step,
            _out: PhantomData,
        }
    }
}

impl<T, U, S, F> Iterator for Sequential<T, U, S, F>
where
    F: FnMut(&mut S, &mut Option<Stream<T>>) -> Option<Event<U>>,
{
    type Item = Event<U>;

    fn next(&mut self) -> Option<Event<U>> {
        (self.step)(&mut self.state, &mut self.up)
    }
}

impl<T, U, S, F> StageStream<U> for Sequential<T, U, S, F>
where
    T: 'static,
    S: Serialize + Send,
    F: FnMut(&mut S, &mut Option<Stream<T>>) -> Option<Event<U>> + Send,
{
    fn save(&self) -> Result<StageState, StateError> {
        let state = StageState::new(self.name, serde_json::to_value(&self.state)?);
        match &self.up {
            Some(up) => Ok(state.with_input(up.save()?)),
            None => Ok(state),
        }
    }
}

/// Upstream states a parallel stage's worker side takes every
/// [`ANCHOR_EVERY`] elements: `(elements pulled before it, state)`.
#[derive(Default)]
pub(crate) struct Anchors {
    list: std::collections::VecDeque<(u64, Result<StageState, String>)>,
}

impl Anchors {
    /// Called by the worker side after pulling `pulled` elements in all;
    /// `consumed` is how many the consumer has taken (older anchors go, but
    /// one strictly before `consumed` stays, for
    /// [`StageStream::save_before_last`]).
    pub(crate) fn offer<T>(&mut self, pulled: u64, consumed: u64, up: &dyn StageStream<T>) {
        if !pulled.is_multiple_of(ANCHOR_EVERY) && pulled != 0 {
            return;
        }
        self.list
            .push_back((pulled, up.save().map_err(|e| e.to_string())));
        while self.list.len() > 1 && self.list[1].0 < consumed {
            self.list.pop_front();
        }
    }

    /// The state at `consumed`: the newest anchor at or before it, and how
    /// many elements after it to skip.
    pub(crate) fn at(&self, stage: &str, consumed: u64) -> Result<StageState, StateError> {
        let (pulled, state) = self
            .list
            .iter()
            .rev()
            .find(|(pulled, _)| *pulled <= consumed)
            .ok_or_else(|| StateError::Unsupported {
                stage: stage.to_string(),
                why: "no anchor at or before the consumer's position".to_string(),
            })?;
        let state = state.clone().map_err(|why| StateError::Unsupported {
            stage: stage.to_string(),
            why,
        })?;
        Ok(
            StageState::new(stage, serde_json::json!({ "skip": consumed - pulled }))
                .with_input(state),
        )
    }
}

/// The number of leading events a restored parallel stage drops.
pub(crate) fn skip_of(state: &StageState, stage: &str) -> Result<u64, StateError> {
    #[derive(Deserialize)]
    struct Skip {
        skip: u64,
    }
    Ok(state.data::<Skip>(stage)?.skip)
}

/// The events a stage named `stage` being built drops after a restore: its
/// saved `skip`, or 0 when not restoring (or when the state is not its own,
/// which is reported through `env` as a failed restore).
pub(crate) fn restored_skip(env: &Env, stage: &str) -> u64 {
    match env.resume_state().map(|s| skip_of(s, stage)) {
        Some(Ok(skip)) => skip,
        Some(Err(error)) => {
            env.restore_failed(error);
            0
        }
        None => 0,
    }
}

/// The next event of `up`, waiting no later than `deadline` where one is
/// given ([`StageStream::next_until`]).
pub(crate) fn pull<T>(
    up: &mut Stream<T>,
    deadline: Option<std::time::Instant>,
) -> Result<Option<Event<T>>, TimedOut> {
    match deadline {
        Some(deadline) => up.next_until(deadline),
        None => Ok(up.next()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_through_json() {
        let a = RecordPosition::new(Path::new("/s/a.tfrecord.gz"), 3, 99);
        let b = RecordPosition::new(Path::new("/s/b.tfrecord"), 0, 0);
        let p = Positions(vec![a, b, a]);
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains("gzip"), "{json}");
        let back: Positions = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
        assert_eq!(
            stage_of("core::iter::FromFn<tfpipe::pipeline::take::X>"),
            "take"
        );
    }
}
