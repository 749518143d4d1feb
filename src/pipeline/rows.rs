//! The engine under the row-regrouping stages (`unbatch`, `rebatch`,
//! `window`, `bucket_by_sequence_length`, `pack`): split each input element
//! into rows, hand the rows one by one to a `Grouper` that holds some of
//! them and emits outputs, and make the whole thing resumable by replay.
//!
//! # State by replay
//!
//! The rows a grouper holds are usually not [`Record`](super::Record)s read
//! from files (they are parsed rows, or `Vec` items), so they cannot be
//! stored as positions the way `batch` stores its partial batch. Instead the
//! stage numbers every row it pulls (row ids, counted from the stage's
//! start) and keeps *anchors*: the upstream's state taken before every
//! [`ANCHOR_EVERY_INPUTS`]-th input element. A saved state is
//! - the newest anchor at or before the oldest row still needed (held by the
//!   grouper, or left in the input element being split),
//! - how many input events had been pulled and the id of the next row,
//! - the grouper's structure with row ids in place of rows.
//!
//! Restore rebuilds the upstream at the anchor and pulls again up to the
//! saved event count, keeping only the rows the grouper held (and the rest of
//! the element being split); every other row, error and epoch marker
//! pulled again was already delivered and is dropped. The grouper is then
//! refilled from its saved structure. So the resumed stream equals the
//! uninterrupted one (the upstream is deterministic, as every restorable
//! pipeline is), at the cost of re-reading the upstream from the anchor:
//! at most [`ANCHOR_EVERY_INPUTS`] elements, or back to the oldest held row
//! (a rarely filled bucket can make that far). Anchors between the oldest
//! needed one and the newest are thinned to at most [`MAX_ANCHORS`], so
//! their memory stays bounded whatever the grouper holds.
//!
//! Invariant: row ids increase with the upstream events that carry them, so
//! the newest anchor whose first row id is at or below a row's id was taken
//! at or before that row's event.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::state::{StageState, StageStream, StateError};
use super::{Clock, Env, Event, Pipeline, PipelineError, Stream};
use crate::batch::Batch;
use crate::metrics::StageCounters;

/// Anchors are taken before every this many input elements.
pub const ANCHOR_EVERY_INPUTS: u64 = 16;

/// At most this many anchors are kept (older middle ones are thinned out).
pub const MAX_ANCHORS: usize = 64;

/// What a grouper emits: an output or the error that took its place.
pub(crate) type Output<O> = Result<O, PipelineError>;

/// The regrouping logic of one stage, without I/O: rows in (with their
/// ids), outputs out.
pub(crate) trait Grouper: Send + 'static {
    type Row: Send + 'static;
    type Out: Send + 'static;

    /// Takes row `id`; returns an output when one is complete.
    fn push(&mut self, id: u64, row: Self::Row) -> Option<Output<Self::Out>>;

    /// At the end of an epoch or of the stream: the next output made of what
    /// is held (a remainder), or `None` once nothing is left to emit (the
    /// grouper is then empty).
    fn flush_one(&mut self) -> Option<Output<Self::Out>>;

    /// The ids of the rows held, any order.
    fn held(&self) -> Vec<u64>;

    /// The grouper's structure, with row ids for rows.
    fn save(&self) -> serde_json::Value;

    /// Refills the grouper from [`save`](Self::save)'s value, taking the
    /// rows by id from `rows`.
    fn restore(
        &mut self,
        saved: &serde_json::Value,
        rows: &mut HashMap<u64, Self::Row>,
    ) -> Result<(), StateError>;
}

/// One row of a parsed [`Batch`]: the batch is shared by all its rows, so
/// splitting one costs no copy; outputs are built with [`gather`].
#[derive(Clone)]
pub(crate) struct BatchRow {
    pub(crate) batch: Arc<Batch>,
    pub(crate) row: usize,
}

/// Splits a batch into its rows.
pub(crate) fn batch_rows(batch: Batch, out: &mut VecDeque<BatchRow>) {
    let batch = Arc::new(batch);
    out.extend((0..batch.num_rows).map(|row| BatchRow {
        batch: Arc::clone(&batch),
        row,
    }));
}

/// Splits a `Vec` into its items.
pub(crate) fn vec_rows<T>(items: Vec<T>, out: &mut VecDeque<T>) {
    out.extend(items);
}

/// One element is one row.
pub(crate) fn single_row<T>(item: T, out: &mut VecDeque<T>) {
    out.push_back(item);
}

/// `rows` as one batch, in order. Runs of consecutive rows of one batch are
/// copied as one slice.
pub(crate) fn gather(stage: &str, rows: &[BatchRow]) -> Output<Batch> {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let first = &rows[i];
        let mut end = first.row + 1;
        let mut j = i + 1;
        while j < rows.len() && Arc::ptr_eq(&rows[j].batch, &first.batch) && rows[j].row == end {
            end += 1;
            j += 1;
        }
        parts.push(first.batch.slice(first.row..end));
        i = j;
    }
    if parts.len() == 1 {
        return Ok(parts.pop().unwrap_or_default());
    }
    Batch::concat(&parts).map_err(|error| PipelineError::Element {
        stage: stage.to_string(),
        message: format!("rows of different batches do not fit together: {error}"),
    })
}

/// `(first event index, first row id, upstream state)` before an input.
struct Anchor {
    event: u64,
    row: u64,
    state: Result<StageState, String>,
}

/// Where the stage stands when flushing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Flush {
    /// Not flushing: pulling rows.
    No,
    /// Flushing before the marker of epoch `n`.
    Epoch(u64),
    /// Flushing at the end of the stream.
    End,
}

/// What [`RegroupStream`] saves (besides the anchor as its input).
#[derive(Serialize, Deserialize)]
struct Saved {
    done: bool,
    /// The anchor's event index and first row id.
    anchor_event: u64,
    anchor_row: u64,
    /// Input events pulled when saved.
    events: u64,
    /// The id of the next row of the element being split; rows from it to
    /// `rows` are still to be pushed.
    next_id: u64,
    /// Rows pulled when saved.
    rows: u64,
    flush: Flush,
    held: Vec<u64>,
    grouper: serde_json::Value,
}

/// Splits inputs into rows, feeds a grouper, and saves by replay (see the
/// module doc).
pub(crate) struct RegroupStream<I, G: Grouper> {
    name: &'static str,
    up: Option<Stream<I>>,
    split: fn(I, &mut VecDeque<G::Row>),
    grouper: G,
    counters: Arc<StageCounters>,
    /// Rows of the current element not pushed yet; the first has id `next_id`.
    current: VecDeque<G::Row>,
    next_id: u64,
    /// Rows pulled so far (the id of the next element's first row).
    rows: u64,
    /// Input events pulled so far.
    events: u64,
    anchors: VecDeque<Anchor>,
    flush: Flush,
    done: bool,
}

impl<I: Send + 'static, G: Grouper> RegroupStream<I, G> {
    /// The stage over `up`, restored if `env` carries a state.
    pub(crate) fn build(
        env: &Env,
        name: &'static str,
        up: Stream<I>,
        counters: Arc<StageCounters>,
        split: fn(I, &mut VecDeque<G::Row>),
        grouper: G,
    ) -> Stream<G::Out> {
        let mut stream = RegroupStream {
            name,
            up: Some(up),
            split,
            grouper,
            counters,
            current: VecDeque::new(),
            next_id: 0,
            rows: 0,
            events: 0,
            anchors: VecDeque::new(),
            flush: Flush::No,
            done: false,
        };
        if let Some(state) = env.resume_state()
            && let Err(error) = stream.restore(state)
        {
            env.restore_failed(error);
        }
        Box::new(stream)
    }

    /// The oldest row id a restore needs.
    fn needed(&self) -> u64 {
        let held = self.grouper.held().into_iter().min().unwrap_or(u64::MAX);
        let current = if self.current.is_empty() {
            self.rows
        } else {
            self.next_id
        };
        held.min(current)
    }

    /// Before pulling input event `self.events`: takes an anchor when due,
    /// drops those no restore can need and thins the middle ones.
    fn anchor(&mut self, prune: bool) {
        let Some(up) = &self.up else { return };
        if self.events.is_multiple_of(ANCHOR_EVERY_INPUTS) || self.anchors.is_empty() {
            self.anchors.push_back(Anchor {
                event: self.events,
                row: self.rows,
                state: up.save().map_err(|e| e.to_string()),
            });
        }
        if !prune {
            return;
        }
        let needed = self.needed();
        while self.anchors.len() > 1 && self.anchors[1].row <= needed {
            self.anchors.pop_front();
        }
        if self.anchors.len() > MAX_ANCHORS {
            // Keep the first (the one a save needs now) and the last; drop
            // every other one between them.
            let last = self.anchors.len() - 1;
            let mut i = 0;
            self.anchors.retain(|_| {
                i += 1;
                i == 1 || i - 1 == last || i % 2 == 0
            });
        }
    }

    /// Pulls the next input event into `current`, or starts a flush; an
    /// error is returned to pass on.
    fn pull(&mut self, clock: &mut Clock) -> Option<PipelineError> {
        self.anchor(true);
        let Some(up) = &mut self.up else {
            self.flush = Flush::End;
            return None;
        };
        match clock.pull(up) {
            None => self.flush = Flush::End,
            Some(event) => {
                self.events += 1;
                match event {
                    Event::Item(Ok(input)) => {
                        self.next_id = self.rows;
                        (self.split)(input, &mut self.current);
                        self.rows += self.current.len() as u64;
                    }
                    Event::Item(Err(error)) => return Some(error),
                    Event::EpochEnd(e) => self.flush = Flush::Epoch(e),
                }
            }
        }
        None
    }

    fn step(&mut self, clock: &mut Clock) -> Option<Event<G::Out>> {
        loop {
            match self.flush {
                Flush::No => {}
                Flush::Epoch(e) => match self.grouper.flush_one() {
                    Some(out) => return Some(Event::Item(out)),
                    None => {
                        self.flush = Flush::No;
                        return Some(Event::EpochEnd(e));
                    }
                },
                Flush::End => match self.grouper.flush_one() {
                    Some(out) => return Some(Event::Item(out)),
                    None => {
                        self.done = true;
                        self.up = None;
                        self.anchors.clear();
                        return None;
                    }
                },
            }
            if self.done {
                return None;
            }
            if let Some(row) = self.current.pop_front() {
                let id = self.next_id;
                self.next_id += 1;
                self.counters.add_in(1, 0);
                if let Some(out) = self.grouper.push(id, row) {
                    return Some(Event::Item(out));
                }
                continue;
            }
            if let Some(error) = self.pull(clock) {
                return Some(Event::Item(Err(error)));
            }
        }
    }

    fn restore(&mut self, state: &StageState) -> Result<(), StateError> {
        let saved: Saved = state.data(self.name)?;
        if saved.done {
            self.done = true;
            self.up = None;
            return Ok(());
        }
        self.events = saved.anchor_event;
        self.rows = saved.anchor_row;
        let wanted: HashSet<u64> = saved.held.iter().copied().collect();
        let mut kept: HashMap<u64, G::Row> = HashMap::new();
        let name = self.name;
        let mismatch = |what: String| StateError::mismatch(name, what);
        // The anchor restored from stays first: the held rows need it.
        let input = state
            .inputs
            .first()
            .cloned()
            .ok_or_else(|| mismatch("no input state".to_string()))?;
        self.anchors.push_back(Anchor {
            event: saved.anchor_event,
            row: saved.anchor_row,
            state: Ok(input),
        });
        while self.events < saved.events {
            if self.events > saved.anchor_event {
                self.anchor(false);
            }
            let Some(event) = self.up.as_mut().and_then(|up| up.next()) else {
                return Err(mismatch(format!(
                    "the input ended after {} of the {} elements pulled before",
                    self.events, saved.events
                )));
            };
            self.events += 1;
            let Event::Item(Ok(input)) = event else {
                continue;
            };
            let mut rows = VecDeque::new();
            (self.split)(input, &mut rows);
            let first = self.rows;
            self.rows += rows.len() as u64;
            let last_event = self.events == saved.events;
            for (id, row) in (first..).zip(rows) {
                if last_event && id >= saved.next_id {
                    if self.current.is_empty() {
                        self.next_id = id;
                    }
                    self.current.push_back(row);
                } else if wanted.contains(&id) {
                    kept.insert(id, row);
                }
            }
        }
        if self.rows != saved.rows {
            return Err(mismatch(format!(
                "{} rows pulled again, {} before",
                self.rows, saved.rows
            )));
        }
        if self.current.is_empty() {
            self.next_id = self.rows;
        }
        self.grouper.restore(&saved.grouper, &mut kept)?;
        self.flush = saved.flush;
        Ok(())
    }
}

impl<I: Send + 'static, G: Grouper> Iterator for RegroupStream<I, G> {
    type Item = Event<G::Out>;

    fn next(&mut self) -> Option<Event<G::Out>> {
        let mut clock = Clock::start();
        let out = self.step(&mut clock);
        match &out {
            Some(Event::Item(Ok(_))) => self.counters.add_out(1, 0),
            Some(Event::Item(Err(_))) => self.counters.add_error(),
            _ => {}
        }
        clock.finish(&self.counters);
        out
    }
}

impl<I: Send + 'static, G: Grouper> StageStream<G::Out> for RegroupStream<I, G> {
    fn save(&self) -> Result<StageState, StateError> {
        if self.done {
            let saved = Saved {
                done: true,
                anchor_event: 0,
                anchor_row: 0,
                events: 0,
                next_id: 0,
                rows: 0,
                flush: Flush::End,
                held: Vec::new(),
                grouper: serde_json::Value::Null,
            };
            return Ok(StageState::new(self.name, serde_json::to_value(saved)?));
        }
        let needed = self.needed();
        let unsupported = |why: String| StateError::Unsupported {
            stage: self.name.to_string(),
            why,
        };
        // Before the first pull there is no anchor: the upstream as it is.
        let (event, row, input) = match self.anchors.iter().rev().find(|a| a.row <= needed) {
            Some(anchor) => (
                anchor.event,
                anchor.row,
                anchor.state.clone().map_err(unsupported)?,
            ),
            None if self.events == 0 => match &self.up {
                Some(up) => (0, 0, up.save()?),
                None => return Err(unsupported("its input is gone".to_string())),
            },
            None => return Err(unsupported("no anchor before its oldest row".to_string())),
        };
        let saved = Saved {
            done: false,
            anchor_event: event,
            anchor_row: row,
            events: self.events,
            next_id: self.next_id,
            rows: self.rows,
            flush: self.flush,
            held: self.grouper.held(),
            grouper: self.grouper.save(),
        };
        Ok(StageState::new(self.name, serde_json::to_value(saved)?).with_input(input))
    }
}

impl<T: Send + 'static> Pipeline<T> {
    /// Appends a regrouping stage named `name`.
    pub(crate) fn regroup<G: Grouper>(
        self,
        name: &'static str,
        split: fn(T, &mut VecDeque<G::Row>),
        grouper: impl Fn() -> G + Send + Sync + 'static,
    ) -> Pipeline<G::Out> {
        self.then(name, move |env, up, counters| {
            RegroupStream::build(env, name, up, counters, split, grouper())
        })
    }
}

/// Takes the rows named by `ids` out of `rows`, in order.
pub(crate) fn take_rows<R>(
    stage: &str,
    ids: &[u64],
    rows: &mut HashMap<u64, R>,
) -> Result<Vec<(u64, R)>, StateError> {
    ids.iter()
        .map(|id| {
            rows.remove(id).map(|r| (*id, r)).ok_or_else(|| {
                StateError::mismatch(stage, format!("row {id} was not pulled again"))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Saved mid-stream, `unbatch` replays from at most
    /// `ANCHOR_EVERY_INPUTS` elements back, and anchors stay bounded while a
    /// grouper holds an old row (here: a bucket that never fills).
    #[test]
    fn anchors_are_recent_and_bounded() {
        let p = Pipeline::from_vec((0..2000u64).map(|i| vec![i, i]).collect()).unbatch();
        let mut it = p.start().unwrap();
        for _ in 0..1001 {
            it.next().unwrap().unwrap();
        }
        let state = it.state().unwrap();
        let saved: Saved = serde_json::from_value(state.stage.data.clone()).unwrap();
        assert_eq!(saved.events, 501);
        assert!(
            saved.anchor_event + ANCHOR_EVERY_INPUTS >= 500,
            "{}",
            saved.anchor_event
        );
        // A rebatch to 10,000 holds its first row for all 4,000 pulls.
        let mut n = 0u64;
        let source = std::iter::from_fn(move || {
            n += 1;
            (n <= 5000).then(|| Event::Item(Ok(n)))
        });
        let mut stream = RegroupStream {
            name: "window",
            up: Some(Box::new(source) as Stream<u64>),
            split: single_row,
            grouper: super::super::rebatch::Rebatch::new(vec![10_000], false, Ok),
            counters: Arc::new(StageCounters::new("window".into())),
            current: VecDeque::new(),
            next_id: 0,
            rows: 0,
            events: 0,
            anchors: VecDeque::new(),
            flush: Flush::No,
            done: false,
        };
        let mut clock = Clock::off();
        for _ in 0..4000 {
            assert!(stream.pull(&mut clock).is_none());
            while let Some(row) = stream.current.pop_front() {
                stream.next_id += 1;
                assert!(stream.grouper.push(stream.next_id - 1, row).is_none());
            }
            assert!(
                stream.anchors.len() <= MAX_ANCHORS + 1,
                "{}",
                stream.anchors.len()
            );
        }
        assert_eq!(stream.anchors[0].event, 0);
    }
}
