//! `repeat`: run the upstream again, marking each epoch's end.
//!
//! # State
//!
//! The epoch being read, whether it produced anything yet, and the
//! current pass's state (none between passes, right after an epoch
//! marker). On restore the current pass is rebuilt *at that epoch*, so a
//! `shuffle` inside it gets the same per-epoch seed as in the uninterrupted
//! run (its own state then restores its RNG and buffer), and the passes
//! after it continue the same seed schedule.

use std::sync::Arc;

use super::state::{StageState, StageStream, StateError};
use super::{Env, Event, Pipeline, Stream};
use crate::metrics::StageCounters;

impl<T: Send + 'static> Pipeline<T> {
    /// Runs the upstream `count` times (`None`: forever), rebuilding it each
    /// epoch (so `shuffle` reshuffles) and ending each pass with an epoch
    /// marker ([`Event::EpochEnd`]). Markers from an
    /// inner `repeat` are absorbed. Repeating an empty input forever ends
    /// instead of spinning.
    ///
    /// ```
    /// use tfpipe::pipeline::{Event, Pipeline};
    /// let mut it = Pipeline::from_vec(vec![1, 2]).repeat(Some(2)).start()?;
    /// let mut seen = Vec::new();
    /// while let Some(ev) = it.next_event() {
    ///     match ev {
    ///         Event::Item(x) => seen.push(x?.to_string()),
    ///         Event::EpochEnd(e) => seen.push(format!("end {e}")),
    ///     }
    /// }
    /// assert_eq!(seen, ["1", "2", "end 0", "1", "2", "end 1"]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    ///
    /// A whole training run as one pipeline, stopped mid-epoch and resumed
    /// from its [state](super::PipelineIter::state) (which a checkpoint keeps
    /// as JSON): the resumed run continues at the same epoch and element,
    /// with the same shuffle order.
    ///
    /// ```
    /// use tfpipe::pipeline::{Pipeline, PipelineState, Record};
    /// use tfpipe::tfrecord::{Compression, FileRecordWriter};
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("train.tfrecord");
    /// # let mut w = FileRecordWriter::create(&path, Compression::None)?;
    /// # for i in 0..10u8 { w.write_record(&[i])?; }
    /// # w.finish()?;
    /// // 10 one-byte records 0..10 in `path`.
    /// let run = Pipeline::tfrecord_files([path.display().to_string()])?
    ///     .records()
    ///     .shuffle(4, 7)
    ///     .batch(3)
    ///     .map(|b: Vec<Record>| b.iter().map(|r| r[0]).collect::<Vec<u8>>())
    ///     .repeat(None);
    /// let mut it = run.start()?;
    /// it.by_ref().take(5).for_each(drop); // 4 batches per epoch: into epoch 1
    /// let saved = it.state()?.to_json();
    /// let expected: Vec<Vec<u8>> = it.take(6).collect::<Result<_, _>>()?;
    ///
    /// let mut resumed = run.start_from(&PipelineState::from_json(&saved)?)?;
    /// assert_eq!(resumed.epoch(), 1);
    /// let after: Vec<Vec<u8>> = resumed.take(6).collect::<Result<_, _>>()?;
    /// assert_eq!(after, expected);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn repeat(self, count: Option<u64>) -> Pipeline<T> {
        let depth = self.depth() + 1;
        let inner = self.clone();
        let error = self.error.clone();
        let origin = self.origin.clone();
        let mut out = Pipeline::from_build(move |env: &Env| {
            let saved = env.resume_state().cloned();
            let env = env.resuming(None);
            let mut repeat = Repeat {
                inner: inner.clone(),
                env,
                count,
                epoch: 0,
                current: None,
                produced: false,
                counters: None,
            };
            match saved {
                Some(saved) => repeat.restore(&saved),
                // The first pass is built now, at start, like every other
                // stage (its threads start prefetching at once).
                None => repeat.start_pass(None),
            }
            // Registered after the first pass is built, so the metrics table
            // lists stages upstream first.
            repeat.counters = Some(repeat.env.stage(depth, "repeat"));
            Box::new(repeat) as Stream<T>
        });
        out.depth = depth;
        out.error = error;
        out.origin = origin;
        out
    }
}

struct Repeat<T> {
    inner: Pipeline<T>,
    /// The context passes are built in (without a state to restore).
    env: Env,
    count: Option<u64>,
    /// The epoch of the current (or next) pass.
    epoch: u64,
    current: Option<Stream<T>>,
    /// The current pass has produced an event (an empty pass under
    /// `repeat(None)` ends the stream).
    produced: bool,
    counters: Option<Arc<StageCounters>>,
}

/// What a `repeat` stores besides the current pass's state.
#[derive(serde::Serialize, serde::Deserialize)]
struct RepeatState {
    epoch: u64,
    produced: bool,
}

impl<T: Send + 'static> Repeat<T> {
    fn more_passes(&self) -> bool {
        self.count.is_none_or(|c| self.epoch < c)
    }

    /// Builds the pass of `self.epoch`, restoring it from `state` if given.
    fn start_pass(&mut self, state: Option<StageState>) {
        if !self.more_passes() {
            return;
        }
        let restoring = state.is_some();
        let env = self.env.with_epoch(self.epoch).resuming(state);
        self.current = Some(self.inner.build_stream(&env));
        if restoring {
            env.check_claimed("repeat's input");
        } else {
            self.produced = false;
        }
    }

    fn restore(&mut self, saved: &StageState) {
        match saved.data::<RepeatState>("repeat") {
            Ok(data) => {
                self.epoch = data.epoch;
                self.produced = data.produced;
                // No input: saved between passes; the next one starts afresh.
                self.start_pass(saved.inputs.first().cloned());
            }
            Err(error) => self.env.restore_failed(error),
        }
    }
}

impl<T: Send + 'static> Iterator for Repeat<T> {
    type Item = Event<T>;

    fn next(&mut self) -> Option<Event<T>> {
        loop {
            if self.current.is_none() {
                if !self.more_passes() || self.env.cancelled() {
                    return None;
                }
                self.start_pass(None);
            }
            match self.current.as_mut()?.next() {
                Some(Event::EpochEnd(_)) => continue,
                Some(item) => {
                    self.produced = true;
                    if let (Event::Item(Ok(_)), Some(counters)) = (&item, &self.counters) {
                        counters.add_in(1, 0);
                        counters.add_out(1, 0);
                    }
                    return Some(item);
                }
                None => {
                    // Drop the finished pass first: its threads are joined
                    // before the next pass starts any.
                    self.current = None;
                    let done = self.epoch;
                    self.epoch += 1;
                    if !self.produced && self.count.is_none() {
                        return None;
                    }
                    return Some(Event::EpochEnd(done));
                }
            }
        }
    }
}

impl<T: Send + 'static> StageStream<T> for Repeat<T> {
    fn save(&self) -> Result<StageState, StateError> {
        let data = RepeatState {
            epoch: self.epoch,
            produced: self.produced,
        };
        let state = StageState::new("repeat", serde_json::json!(data));
        match &self.current {
            Some(current) => Ok(state.with_input(current.save()?)),
            None => Ok(state),
        }
    }
}
