//! `interleave`: read several inner pipelines (files) at once, a block at a time.
//!
//! Up to `cycle_length` inputs are open at once, each in a *slot*. Output
//! visits the slots round robin, `block_length` elements from each in turn;
//! an exhausted slot is refilled from the next input element (in slot order,
//! as soon as it is found exhausted), so the order depends only on the data,
//! never on timing, in deterministic mode.
//!
//! Sequentially (no parallelism), slots are plain streams pulled on the
//! consumer's thread. With parallelism `p`, each open slot has a producer
//! thread filling a bounded channel of two chunks (`chunk` = whole blocks,
//! at least 256 elements: one channel operation per chunk, not per
//! element), and a
//! counting semaphore lets at most `p` of them compute at once (a producer
//! holds a permit only while pulling a block, never while blocked on a full
//! channel, so a slow consumer cannot deadlock the others). Non-deterministic
//! mode takes from whichever slot is ready first.
//!
//! An epoch marker from the input pauses refilling until the open slots are
//! drained, then passes; markers inside an inner pipeline are dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, TrySendError, bounded};

use super::autotune::Autotuner;
use super::state::{StageState, StageStream, StateError};
use super::worker::{Worker, call_user};
use super::{Env, Event, Parallelism, Pipeline, PipelineError, Stream};
use crate::metrics::StageCounters;
use crate::spawn::Cancel;

/// How [`Pipeline::interleave`] reads its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interleave {
    /// Inputs open at once. By default 4.
    pub cycle_length: usize,
    /// Consecutive elements taken from one input. By default 16.
    pub block_length: usize,
    /// Producer threads computing at once; `None` reads on the consumer's
    /// thread. By default `None`.
    pub parallelism: Option<Parallelism>,
    /// Keep the round-robin order. By default `true`.
    pub deterministic: bool,
}

impl Default for Interleave {
    fn default() -> Self {
        Interleave {
            cycle_length: 4,
            block_length: 16,
            parallelism: None,
            deterministic: true,
        }
    }
}

impl Interleave {
    /// `cycle_length` inputs, `block_length` elements each, sequential.
    pub fn new(cycle_length: usize, block_length: usize) -> Interleave {
        Interleave {
            cycle_length,
            block_length,
            ..Interleave::default()
        }
    }

    /// Read the inputs on producer threads, `parallelism` at once.
    pub fn parallel(mut self, parallelism: impl Into<Parallelism>) -> Interleave {
        self.parallelism = Some(parallelism.into());
        self
    }

    /// Whether to keep the round-robin order (by default `true`).
    pub fn deterministic(mut self, deterministic: bool) -> Interleave {
        self.deterministic = deterministic;
        self
    }
}

impl<T: Send + 'static> Pipeline<T> {
    /// Maps each element to an inner pipeline and interleaves their outputs
    /// (`tf.data`'s `interleave`; for TFRecord files see
    /// [`TfRecordFiles::interleave`](super::TfRecordFiles::interleave)).
    ///
    /// ```
    /// use tfpipe::pipeline::{Interleave, Pipeline};
    /// let v: Vec<u32> = Pipeline::from_vec(vec![0u32, 10, 20])
    ///     .interleave(Interleave::new(2, 2), |base| Pipeline::from_vec(vec![base, base + 1, base + 2]))
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(v, [0, 1, 10, 11, 2, 12, 20, 21, 22]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn interleave<U, F>(self, options: Interleave, f: F) -> Pipeline<U>
    where
        U: Send + 'static,
        F: Fn(T) -> Pipeline<U> + Send + Sync + 'static,
    {
        let bad = options.cycle_length == 0
            || options.block_length == 0
            || options.parallelism.is_some_and(|p| !p.is_valid());
        let depth = self.depth() + 1;
        let f = Arc::new(f);
        self.invalid_if(bad, "interleave", || {
            format!(
                "cycle_length and block_length must be positive, and parallelism 1 to {} \
                 (or Auto)",
                super::MAX_PARALLELISM
            )
        })
        .then("interleave", move |env, input, counters| {
            let permits = options.parallelism.map(|p| {
                let max = p.max_workers(env.shared.cores).min(options.cycle_length);
                let initial = match p {
                    Parallelism::Fixed(n) => n.min(options.cycle_length),
                    Parallelism::Auto => max.div_ceil(2),
                };
                counters.set_parallelism(initial);
                let tuner = matches!(p, Parallelism::Auto).then(|| Autotuner::new(max));
                (Arc::new(Permits::new(initial)), tuner)
            });
            let (permits, autotuner) = match permits {
                Some((p, t)) => (Some(p), t),
                None => (None, None),
            };
            let f = Arc::clone(&f);
            let open: OpenFn<T, U> = Box::new(move |x: T| f(x));
            let mut stream = InterleaveStream {
                input: Some(input),
                paused: None,
                slots: (0..options.cycle_length).map(|_| None).collect(),
                current: 0,
                in_block: 0,
                options,
                open,
                nested: env.nested(depth),
                env: env.clone(),
                counters,
                permits,
                autotuner,
                work: Arc::new(StageCounters::new("interleave producers".to_string())),
                stop: Arc::new(AtomicBool::new(false)),
                waited: Duration::ZERO,
                pulled: 0,
                meta: (0..options.cycle_length).map(|_| None).collect(),
            };
            if let Some(state) = env.resume_state()
                && let Err(error) = stream.restore(state)
            {
                env.restore_failed(error);
            }
            Box::new(stream) as Stream<U>
        })
    }
}

/// Producers send whole blocks, at least `CHUNK_MIN` events per message: one
/// channel operation per chunk, not per element.
struct Chunk<U> {
    /// The inner stream's state before the chunk's first event (for
    /// [`InterleaveStream::save`]); `None` for an error-only chunk.
    start: Option<Result<StageState, String>>,
    events: Vec<Event<U>>,
}

/// The smallest chunk a producer sends (fewer at the end of an input).
const CHUNK_MIN: usize = 256;

type OpenFn<T, U> = Box<dyn Fn(T) -> Pipeline<U> + Send + Sync>;

/// A counting semaphore whose limit the autotuner can change.
struct Permits {
    state: Mutex<(usize, usize)>,
    changed: Condvar,
}

impl Permits {
    fn new(limit: usize) -> Permits {
        Permits {
            state: Mutex::new((0, limit.max(1))),
            changed: Condvar::new(),
        }
    }

    /// Waits for a permit; `false` if `stop()` turned true meanwhile.
    fn acquire(&self, stop: impl Fn() -> bool) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.0 >= state.1 {
            if stop() {
                return false;
            }
            state = self
                .changed
                .wait_timeout(state, Duration::from_millis(50))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.0 += 1;
        true
    }

    fn release(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 = state.0.saturating_sub(1);
        self.changed.notify_one();
    }

    fn set_limit(&self, limit: usize) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.1 = limit.max(1);
        self.changed.notify_all();
    }
}

/// An open input: pulled in place, or by a producer thread. Dropping a
/// `Remote` cancels its producer, which wakes even while blocked on the full
/// channel, so the fields may drop in any order.
enum Slot<U> {
    Local(Stream<U>),
    Remote {
        rx: Receiver<Chunk<U>>,
        /// The rest of the chunk being consumed.
        pending: std::vec::IntoIter<Event<U>>,
        /// The inner state before the chunk being consumed (before any
        /// chunk: the state the slot was opened with, `None` for fresh),
        /// and the events taken from it since.
        start: Box<Result<Option<StageState>, String>>,
        taken: u64,
        _worker: Worker,
    },
}

/// Where an open slot's input came from: the input events pulled before it,
/// and the input's state just before it was pulled.
struct SlotMeta {
    ordinal: u64,
    input_before: Result<StageState, String>,
}

struct InterleaveStream<T, U> {
    input: Option<Stream<T>>,
    /// An input epoch marker waiting for the open slots to drain.
    paused: Option<u64>,
    slots: Vec<Option<Slot<U>>>,
    current: usize,
    in_block: usize,
    options: Interleave,
    open: OpenFn<T, U>,
    nested: Env,
    env: Env,
    counters: Arc<StageCounters>,
    permits: Option<Arc<Permits>>,
    autotuner: Option<Autotuner>,
    /// The producers' time pulling their inputs, which the nested stages
    /// report as their own: the autotuner's view of how busy the producers
    /// are, kept out of this stage's row so nothing is counted twice.
    work: Arc<StageCounters>,
    stop: Arc<AtomicBool>,
    waited: Duration,
    /// Input events pulled so far (for the state).
    pulled: u64,
    /// Per slot, where its input came from (meaningful while it is open).
    meta: Vec<Option<SlotMeta>>,
}

impl<T: Send + 'static, U: Send + 'static> InterleaveStream<T, U> {
    /// Opens inputs into empty slots, in slot order. Returns an error item
    /// from the input, if one came.
    fn fill(&mut self) -> Option<Event<U>> {
        if self.paused.is_some() {
            return None;
        }
        for index in 0..self.slots.len() {
            if self.slots[index].is_some() {
                continue;
            }
            let input = self.input.as_mut()?;
            let before = input.save().map_err(|e| e.to_string());
            let event = input.next();
            if event.is_some() {
                self.pulled += 1;
            }
            match event {
                Some(Event::Item(Ok(x))) => {
                    self.meta[index] = Some(SlotMeta {
                        ordinal: self.pulled - 1,
                        input_before: before,
                    });
                    self.counters.add_in(1, 0);
                    // Opening an input is this stage's own work.
                    let counters = Arc::clone(&self.counters);
                    let _busy = counters.busy_timer();
                    match call_user(self.counters.name(), || (self.open)(x)) {
                        Ok(pipeline) => match self.start_slot(pipeline, None, 0) {
                            Ok(slot) => self.slots[index] = Some(slot),
                            Err(err) => return Some(Event::Item(Err(err))),
                        },
                        Err(err) => return Some(Event::Item(Err(err))),
                    }
                }
                Some(Event::Item(Err(err))) => return Some(Event::Item(Err(err))),
                Some(Event::EpochEnd(e)) => {
                    self.paused = Some(e);
                    return None;
                }
                None => {
                    self.input = None;
                    return None;
                }
            }
        }
        None
    }

    /// Starts an inner pipeline; restored from `resume` (then dropping its
    /// first `skip` events, markers aside) when given.
    fn start_slot(
        &self,
        pipeline: Pipeline<U>,
        resume: Option<StageState>,
        skip: u64,
    ) -> Result<Slot<U>, PipelineError> {
        if let Some(invalid) = &pipeline.error {
            return Err(invalid.error());
        }
        let env = self.nested.resuming(resume.clone());
        let mut stream = pipeline.build_stream(&env);
        env.check_claimed("interleave input");
        let Some(permits) = &self.permits else {
            let mut left = skip;
            while left > 0 {
                match stream.next() {
                    Some(Event::EpochEnd(_)) => {}
                    Some(_) => left -= 1,
                    None => break,
                }
            }
            return Ok(Slot::Local(stream));
        };
        // Whole blocks per chunk, at least CHUNK_MIN elements: a handoff
        // between threads can cost a scheduler time slice on a busy machine,
        // so each one should move plenty of work.
        let block = self.options.block_length * CHUNK_MIN.div_ceil(self.options.block_length);
        spawn_producer(
            stream,
            resume,
            skip,
            self.nested.clone(),
            Arc::clone(permits),
            Arc::clone(&self.stop),
            [Arc::clone(&self.counters), Arc::clone(&self.work)],
            block,
        )
    }

    /// The next element of slot `index`; `None` when it is exhausted.
    fn pull_slot(&mut self, index: usize) -> Option<Event<U>> {
        loop {
            let event = match self.slots[index].as_mut()? {
                Slot::Local(stream) => {
                    // The nested stages count their own work; here it is
                    // waiting for input (exclusive time per stage).
                    let t = Instant::now();
                    let e = stream.next();
                    self.counters.add_wait_in(t.elapsed());
                    e
                }
                Slot::Remote {
                    rx,
                    pending,
                    start,
                    taken,
                    ..
                } => match pending.next() {
                    Some(e) => {
                        *taken += 1;
                        Some(e)
                    }
                    None => {
                        let chunk = match rx.try_recv() {
                            Ok(c) => Ok(c),
                            Err(_) => {
                                let t = Instant::now();
                                let c = rx.recv();
                                self.waited += t.elapsed();
                                c
                            }
                        };
                        match chunk {
                            Ok(chunk) => {
                                if let Some(at) = chunk.start {
                                    **start = at.map(Some);
                                    *taken = 0;
                                }
                                *pending = chunk.events.into_iter();
                                continue;
                            }
                            Err(_) => None,
                        }
                    }
                },
            };
            match event {
                Some(Event::EpochEnd(_)) => continue,
                Some(event) => return Some(event),
                None => {
                    self.slots[index] = None; // joins a producer thread
                    return None;
                }
            }
        }
    }

    /// Non-deterministic: the first ready element of any slot (all slots
    /// are remote in parallel mode).
    fn pull_any(&mut self) -> Option<Event<U>> {
        loop {
            // First what was already received, from the current slot on.
            let n = self.slots.len();
            for k in 0..n {
                let i = (self.current + k) % n;
                if let Some(Slot::Remote { pending, .. }) = &mut self.slots[i] {
                    for event in pending.by_ref() {
                        if !matches!(event, Event::EpochEnd(_)) {
                            self.current = i;
                            return Some(event);
                        }
                    }
                }
            }
            let open: Vec<(usize, Receiver<Chunk<U>>)> = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, slot)| match slot {
                    Some(Slot::Remote { rx, .. }) => Some((i, rx.clone())),
                    _ => None,
                })
                .collect();
            if open.is_empty() {
                return None;
            }
            let mut select = Select::new();
            for (_, rx) in &open {
                select.recv(rx);
            }
            let t = Instant::now();
            let op = select.select();
            self.waited += t.elapsed();
            let (index, rx) = &open[op.index()];
            let index = *index;
            match op.recv(rx) {
                Ok(chunk) => {
                    if let Some(Slot::Remote { pending, .. }) = &mut self.slots[index] {
                        *pending = chunk.events.into_iter();
                    }
                    self.current = index;
                }
                Err(_) => {
                    drop(open);
                    self.slots[index] = None; // joins the producer
                    if let Some(err) = self.fill() {
                        return Some(err);
                    }
                }
            }
        }
    }

    fn tune(&mut self) {
        if let (Some(tuner), Some(permits)) = (self.autotuner.as_mut(), &self.permits) {
            let current = permits
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .1;
            if let Some(new) = tuner.tick(&self.work, self.waited, current) {
                permits.set_limit(new);
                self.counters.set_parallelism(new);
            }
        }
    }

    fn step(&mut self) -> Option<Event<U>> {
        loop {
            if let Some(err) = self.fill() {
                return Some(err);
            }
            if self.slots.iter().all(Option::is_none) {
                if let Some(marker) = self.paused.take() {
                    // Each epoch starts the round robin afresh, so every
                    // epoch comes out in the same order.
                    self.current = 0;
                    self.in_block = 0;
                    return Some(Event::EpochEnd(marker));
                }
                self.input.as_ref()?;
                continue;
            }
            if self.permits.is_some() && !self.options.deterministic {
                match self.pull_any() {
                    Some(event) => return Some(event),
                    None => continue,
                }
            }
            let index = self.current;
            if self.slots[index].is_none() {
                self.current = (index + 1) % self.slots.len();
                self.in_block = 0;
                continue;
            }
            match self.pull_slot(index) {
                Some(event) => {
                    self.in_block += 1;
                    if self.in_block >= self.options.block_length {
                        self.current = (index + 1) % self.slots.len();
                        self.in_block = 0;
                    }
                    return Some(event);
                }
                None => {
                    self.current = (index + 1) % self.slots.len();
                    self.in_block = 0;
                }
            }
        }
    }
}

/// Starts a producer thread that pulls `pipeline` a chunk of `block` events
/// at a time, holding a permit only while pulling.
#[allow(clippy::too_many_arguments)]
fn spawn_producer<U: Send + 'static>(
    mut stream: Stream<U>,
    resume: Option<StageState>,
    skip: u64,
    nested: Env,
    permits: Arc<Permits>,
    stop: Arc<AtomicBool>,
    [counters, work]: [Arc<StageCounters>; 2],
    block: usize,
) -> Result<Slot<U>, PipelineError> {
    let (tx, rx) = bounded::<Chunk<U>>(2);
    let panic_tx = tx.clone();
    let stage = counters.name().to_string();
    let live = nested.live().clone();
    let body = move |cancel: &Cancel| {
        let stopping =
            || stop.load(Ordering::Relaxed) || nested.cancelled() || cancel.is_cancelled();
        let mut left = skip;
        while left > 0 && !stopping() {
            match stream.next() {
                Some(Event::EpochEnd(_)) => {}
                Some(_) => left -= 1,
                None => break,
            }
        }
        let mut chunk = Vec::with_capacity(block);
        let mut ended = false;
        let mut chunk_start = None;
        while !ended {
            let t = Instant::now();
            if !permits.acquire(stopping) {
                return;
            }
            let t1 = Instant::now();
            counters.add_wait_in(t1 - t);
            work.add_wait_in(t1 - t);
            if chunk.is_empty() {
                chunk_start = Some(stream.save().map_err(|e| e.to_string()));
            }
            while chunk.len() < block {
                match stream.next() {
                    Some(Event::EpochEnd(_)) => {}
                    Some(event) => chunk.push(event),
                    None => {
                        ended = true;
                        break;
                    }
                }
            }
            permits.release();
            // The nested stages report this work as theirs.
            let pulled = t1.elapsed();
            counters.add_wait_in(pulled);
            work.add_busy(pulled);
            if chunk.is_empty() {
                continue;
            }
            let full = Chunk {
                start: chunk_start.take(),
                events: std::mem::replace(&mut chunk, Vec::with_capacity(block)),
            };
            match tx.try_send(full) {
                Ok(()) => {}
                Err(TrySendError::Full(full)) => {
                    let t = Instant::now();
                    let sent = cancel.send(&tx, full);
                    counters.add_blocked_out(t.elapsed());
                    work.add_blocked_out(t.elapsed());
                    if sent.is_err() {
                        return;
                    }
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
    };
    let on_panic = move |cancel: &Cancel, message| {
        let error = PipelineError::Panic { stage, message };
        let chunk = Chunk {
            start: None,
            events: vec![Event::Item(Err(error))],
        };
        let _ = cancel.send(&panic_tx, chunk);
    };
    let worker = Worker::spawn(&live, "interleave", body, on_panic)?;
    Ok(Slot::Remote {
        rx,
        pending: Vec::new().into_iter(),
        start: Box::new(Ok(resume)),
        taken: skip,
        _worker: worker,
    })
}

impl<T: Send + 'static, U: Send + 'static> Iterator for InterleaveStream<T, U> {
    type Item = Event<U>;

    fn next(&mut self) -> Option<Event<U>> {
        if self.env.cancelled() {
            return None;
        }
        let event = self.step();
        if let Some(Event::Item(Ok(_))) = &event {
            self.counters.add_out(1, 0);
        }
        self.tune();
        event
    }
}

impl<T, U> Drop for InterleaveStream<T, U> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(permits) = &self.permits {
            permits.set_limit(usize::MAX);
        }
        // Cancel every producer before joining any (each slot's drop joins).
        for slot in self.slots.iter().flatten() {
            if let Slot::Remote { _worker, .. } = slot {
                _worker.cancel();
            }
        }
        self.slots.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MetricsRegistry;
    use crate::pipeline::{LiveThreads, Shared};
    use crate::spawn::Thread;

    /// A producer blocked on its full channel is joined while the slot's
    /// receiver is still alive: it must still return.
    #[test]
    fn joining_a_producer_before_dropping_its_receiver_does_not_hang() {
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let test = Thread::spawn("interleave-test", move |_| {
            let env = Env {
                shared: Arc::new(Shared {
                    cancel: AtomicBool::new(false),
                    metrics: MetricsRegistry::new(),
                    live: LiveThreads::default(),
                    cores: 2,
                    restore_error: std::sync::Mutex::new(None),
                }),
                epoch: 0,
                prefix: "".into(),
                label: "".into(),
                resume: None,
            };
            let slot = spawn_producer(
                Pipeline::from_generator(|| 0u64..).build_stream(&env.nested(1)),
                None,
                0,
                env.nested(1),
                Arc::new(Permits::new(1)),
                Arc::new(AtomicBool::new(false)),
                [env.stage(1, "interleave"), env.stage(2, "work")],
                CHUNK_MIN,
            )
            .unwrap();
            let Slot::Remote { rx, _worker, .. } = slot else {
                unreachable!("a producer slot")
            };
            while !rx.is_full() {
                std::thread::yield_now();
            }
            drop(_worker); // joins, with `rx` alive
            let _ = done_tx.send(env.live().get());
            drop(rx);
        })
        .unwrap();
        let live = done_rx.recv_timeout(Duration::from_secs(20));
        if live.is_err() {
            std::mem::forget(test); // a hung thread cannot be joined; fail instead
            panic!("joining an interleave producer with its receiver alive hung");
        }
        assert_eq!(live, Ok(0));
    }
}

/// An interleave's own state; the input's state is its first input.
#[derive(serde::Serialize, serde::Deserialize)]
struct InterleaveState {
    current: usize,
    in_block: usize,
    paused: Option<u64>,
    input_done: bool,
    pulled: u64,
    slots: Vec<Option<SlotState>>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SlotState {
    /// The input event this slot's pipeline came from.
    ordinal: u64,
    /// The inner pipeline's state (`None`: from its start), and the
    /// events after it already delivered.
    inner: Option<StageState>,
    skip: u64,
}

impl<T: Send + 'static, U: Send + 'static> StageStream<U> for InterleaveStream<T, U> {
    fn save(&self) -> Result<StageState, StateError> {
        let unsupported = |why: String| StateError::Unsupported {
            stage: self.counters.name().to_string(),
            why,
        };
        if self.permits.is_some() && !self.options.deterministic {
            return Err(unsupported(
                "a non-deterministic interleave has no repeatable order".to_string(),
            ));
        }
        let mut slots = Vec::with_capacity(self.slots.len());
        let mut earliest: Option<&SlotMeta> = None;
        for (slot, meta) in self.slots.iter().zip(&self.meta) {
            let (Some(slot), Some(meta)) = (slot, meta) else {
                slots.push(None);
                continue;
            };
            let (inner, skip) = match slot {
                Slot::Local(stream) => (Some(stream.save()?), 0),
                Slot::Remote { start, taken, .. } => {
                    ((**start).clone().map_err(unsupported)?, *taken)
                }
            };
            if earliest.is_none_or(|e| meta.ordinal < e.ordinal) {
                earliest = Some(meta);
            }
            slots.push(Some(SlotState {
                ordinal: meta.ordinal,
                inner,
                skip,
            }));
        }
        let data = InterleaveState {
            current: self.current,
            in_block: self.in_block,
            paused: self.paused,
            input_done: self.input.is_none(),
            pulled: self.pulled,
            slots,
        };
        let mut state = StageState::new("interleave", serde_json::json!(data));
        // The input as it was before the earliest open slot's element: the
        // later ones are pulled again on restore.
        let input = match (earliest, &self.input) {
            (Some(meta), _) => Some(meta.input_before.clone().map_err(unsupported)?),
            (None, Some(input)) => Some(input.save()?),
            (None, None) => None,
        };
        if let Some(input) = input {
            state = state.with_input(input);
        }
        Ok(state)
    }
}

impl<T: Send + 'static, U: Send + 'static> InterleaveStream<T, U> {
    /// Restores from a state: the input was built at the earliest open
    /// slot's element; pull the elements up to where the state was taken,
    /// reopening the open slots' pipelines and dropping the rest.
    fn restore(&mut self, state: &StageState) -> Result<(), StateError> {
        let data: InterleaveState = state.data("interleave")?;
        if data.slots.len() != self.slots.len() {
            return Err(StateError::mismatch(
                "interleave",
                format!(
                    "{} slots in the state, cycle_length {}",
                    data.slots.len(),
                    self.slots.len()
                ),
            ));
        }
        let first = data.slots.iter().flatten().map(|s| s.ordinal).min();
        let mut by_ordinal: std::collections::HashMap<u64, (usize, &SlotState)> = data
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (s.ordinal, (i, s))))
            .collect();
        if let Some(first) = first {
            for ordinal in first..data.pulled {
                let Some(input) = self.input.as_mut() else {
                    return Err(StateError::mismatch("interleave", "the input ended early"));
                };
                let before = input.save().map_err(|e| e.to_string());
                let event = input.next();
                let Some((index, slot)) = by_ordinal.remove(&ordinal) else {
                    continue;
                };
                let Some(Event::Item(Ok(x))) = event else {
                    return Err(StateError::mismatch(
                        "interleave",
                        format!("input {ordinal} is no longer an element"),
                    ));
                };
                let pipeline = call_user(self.counters.name(), || (self.open)(x)).map_err(|e| {
                    StateError::mismatch(
                        "interleave",
                        format!(
                            "reopening input {ordinal}: {}",
                            crate::error::display_chain(&e)
                        ),
                    )
                })?;
                let opened = self
                    .start_slot(pipeline, slot.inner.clone(), slot.skip)
                    .map_err(|e| {
                        StateError::mismatch(
                            "interleave",
                            format!(
                                "restarting input {ordinal}: {}",
                                crate::error::display_chain(&e)
                            ),
                        )
                    })?;
                self.slots[index] = Some(opened);
                self.meta[index] = Some(SlotMeta {
                    ordinal,
                    input_before: before,
                });
            }
        }
        self.current = data.current;
        self.in_block = data.in_block;
        self.paused = data.paused;
        self.pulled = data.pulled;
        if data.input_done {
            self.input = None;
        }
        Ok(())
    }
}
