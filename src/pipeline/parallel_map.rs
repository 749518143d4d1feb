//! `map_parallel`: a user function on several worker threads.
//!
//! Workers share the upstream behind a mutex: each takes the lock, pulls one
//! element and tags it with a sequence number (and the epoch it belongs to),
//! releases the lock and applies the function. Before pulling, a worker takes
//! a token from a bounded channel of `W` tokens; the consumer returns a token
//! each time the front of its reorder ring advances. So at most `W` elements
//! are in flight (in workers, in the output channel, or waiting in the ring),
//! and the output channel (capacity `W`) never blocks.
//!
//! Deterministic mode emits strictly by sequence number. Otherwise an element
//! is emitted as soon as it arrives, unless it belongs to a later epoch than
//! the last marker emitted: markers are barriers, so no element crosses an
//! epoch boundary.
//!
//! Invariant: `ring[i]` holds sequence number `base + i`; every sequence number
//! below `base` has been emitted (or was a `Done` slot).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError, bounded};

use super::autotune::Autotuner;
use super::state::{self, ANCHOR_EVERY, Anchors, StageState, StageStream, StateError};
use super::worker::{Worker, call_user};
use super::{
    BoxError, Env, Event, MAX_PARALLELISM, Parallelism, Pipeline, PipelineError, Stream, TimedOut,
    byte_size, user_error,
};
use crate::metrics::StageCounters;
use crate::spawn::Cancel;

/// How [`Pipeline::map_parallel_with`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapOptions {
    /// Workers. By default [`Parallelism::Auto`].
    pub parallelism: Parallelism,
    /// Keep the input order. By default `true`.
    pub deterministic: bool,
}

impl Default for MapOptions {
    fn default() -> Self {
        MapOptions {
            parallelism: Parallelism::Auto,
            deterministic: true,
        }
    }
}

impl<T: Send + 'static> Pipeline<T> {
    /// Applies a fallible `f` on `parallelism` worker threads, keeping the
    /// input order. An `Err` or a panic becomes an `Err` item naming the stage.
    ///
    /// ```
    /// use tfpipe::pipeline::{Parallelism, Pipeline};
    /// let v: Vec<u64> = Pipeline::from_vec((0..100u64).collect())
    ///     .map_parallel(Parallelism::Fixed(4), |x| Ok::<_, std::convert::Infallible>(x * 2))
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(v, (0..100).map(|x| x * 2).collect::<Vec<_>>());
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn map_parallel<U, E, F>(self, parallelism: impl Into<Parallelism>, f: F) -> Pipeline<U>
    where
        U: Send + 'static,
        E: Into<BoxError>,
        F: Fn(T) -> Result<U, E> + Send + Sync + 'static,
    {
        let options = MapOptions {
            parallelism: parallelism.into(),
            deterministic: true,
        };
        self.map_parallel_with(options, || (), move |_, x| f(x))
    }

    /// The general form: each worker builds its own state with `init` (on its
    /// own thread, so the state need not be `Send`: a reusable parser, a
    /// scratch buffer) and calls `f(&mut state, element)`.
    pub fn map_parallel_with<S, U, E, I, F>(self, options: MapOptions, init: I, f: F) -> Pipeline<U>
    where
        S: 'static,
        U: Send + 'static,
        E: Into<BoxError>,
        I: Fn() -> S + Send + Sync + 'static,
        F: Fn(&mut S, T) -> Result<U, E> + Send + Sync + 'static,
    {
        self.map_parallel_named("map", options, init, f)
    }

    /// [`map_parallel_with`](Self::map_parallel_with) as a stage called `name`.
    pub(crate) fn map_parallel_named<S, U, E, I, F>(
        self,
        name: &'static str,
        options: MapOptions,
        init: I,
        f: F,
    ) -> Pipeline<U>
    where
        S: 'static,
        U: Send + 'static,
        E: Into<BoxError>,
        I: Fn() -> S + Send + Sync + 'static,
        F: Fn(&mut S, T) -> Result<U, E> + Send + Sync + 'static,
    {
        let bad = !options.parallelism.is_valid();
        let job = Arc::new(Job { init, f });
        let parallelism = options.parallelism;
        self.invalid_if(bad, "map_parallel", move || {
            format!("parallelism {parallelism:?}: needs 1 to {MAX_PARALLELISM} workers (or Auto)")
        })
        .then_widening(name, move |extra, env, up, counters| {
            start_map(name, env, up, counters, options, extra, Arc::clone(&job))
        })
    }
}

struct Job<I, F> {
    init: I,
    f: F,
}

/// The upstream and its sequence numbering, shared by the workers.
struct Upstream<T> {
    stream: Stream<T>,
    next_seq: u64,
    epoch: u64,
    /// The upstream's state every few pulls, for [`MapStream::save`].
    anchors: Anchors,
}

struct Shared<T> {
    upstream: Mutex<Upstream<T>>,
    /// Workers allowed to pull; the others park.
    target: AtomicUsize,
    /// The consumer is gone, or the upstream is exhausted.
    stop: AtomicBool,
    exhausted: AtomicBool,
    /// Elements the consumer has emitted (updated now and then, for pruning anchors).
    consumed: AtomicU64,
    park: Mutex<()>,
    wake: Condvar,
}

impl<T> Shared<T> {
    fn wake_all(&self) {
        let _guard = self.park.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_all();
    }
}

/// `(sequence number, epoch, event)`.
type Tagged<U> = (u64, u64, Event<U>);

/// The sequence number of an engine error that belongs to no element.
const UNTAGGED: u64 = u64::MAX;

fn start_map<T, S, U, E, I, F>(
    name: &'static str,
    env: &Env,
    up: Stream<T>,
    counters: Arc<StageCounters>,
    options: MapOptions,
    extra_window: usize,
    job: Arc<Job<I, F>>,
) -> Stream<U>
where
    T: Send + 'static,
    S: 'static,
    U: Send + 'static,
    E: Into<BoxError>,
    I: Fn() -> S + Send + Sync + 'static,
    F: Fn(&mut S, T) -> Result<U, E> + Send + Sync + 'static,
{
    let max = options.parallelism.max_workers(env.shared.cores);
    let initial = match options.parallelism {
        Parallelism::Fixed(n) => n.max(1),
        Parallelism::Auto => max.div_ceil(2),
    };
    // A `prefetch` right after this stage adds its depth here rather than
    // a thread of its own (`extra_window`).
    let window = (2 * max + 2).saturating_add(extra_window);
    // Saved under the stage's own name (`map`, or `parse` for the parser).
    let skip = state::restored_skip(env, name);
    let mut anchors = Anchors::default();
    anchors.offer(0, 0, &*up);
    let shared = Arc::new(Shared {
        upstream: Mutex::new(Upstream {
            stream: up,
            next_seq: 0,
            epoch: 0,
            anchors,
        }),
        target: AtomicUsize::new(initial),
        stop: AtomicBool::new(false),
        exhausted: AtomicBool::new(false),
        consumed: AtomicU64::new(0),
        park: Mutex::new(()),
        wake: Condvar::new(),
    });
    counters.set_parallelism(initial);
    let (out_tx, out_rx) = bounded::<Tagged<U>>(window);
    let (token_tx, token_rx) = bounded::<()>(window);
    let mut workers = Vec::with_capacity(max);
    let mut spawn_error = None;
    for index in 0..max {
        let ctx = WorkerCtx {
            index,
            env: env.clone(),
            shared: Arc::clone(&shared),
            counters: Arc::clone(&counters),
            out: out_tx.clone(),
            tokens: token_tx.clone(),
        };
        let panic_tx = out_tx.clone();
        let stage = counters.name().to_string();
        let job = Arc::clone(&job);
        let on_panic = move |cancel: &Cancel, message| {
            // A bug in the engine, not in the user function: report it first.
            let error = PipelineError::Panic { stage, message };
            let _ = cancel.send(&panic_tx, (UNTAGGED, 0, Event::Item(Err(error))));
        };
        let body = move |cancel: &Cancel| ctx.run(&job, cancel);
        match Worker::spawn(env.live(), "map", body, on_panic) {
            Ok(w) => workers.push(w),
            Err(err) => {
                spawn_error = Some(err);
                break;
            }
        }
    }
    drop(out_tx);
    drop(token_tx);
    let autotuner = matches!(options.parallelism, Parallelism::Auto).then(|| Autotuner::new(max));
    let stream = MapStream {
        name,
        out: Some(out_rx),
        tokens: Some(token_rx),
        ring: VecDeque::with_capacity(window),
        untagged: VecDeque::new(),
        base: 0,
        epoch: 0,
        deterministic: options.deterministic,
        disconnected: false,
        shared,
        counters,
        autotuner,
        waited: Duration::ZERO,
        skip,
        workers,
    };
    match spawn_error {
        Some(err) => Box::new(std::iter::once(Event::Item(Err(err))).chain(stream)),
        None => Box::new(stream),
    }
}

struct WorkerCtx<T, U> {
    index: usize,
    env: Env,
    shared: Arc<Shared<T>>,
    counters: Arc<StageCounters>,
    out: Sender<Tagged<U>>,
    tokens: Sender<()>,
}

impl<T: Send + 'static, U: Send + 'static> WorkerCtx<T, U> {
    fn stopping(&self, cancel: &Cancel) -> bool {
        cancel.is_cancelled()
            || self.shared.stop.load(Ordering::Relaxed)
            || self.shared.exhausted.load(Ordering::Relaxed)
            || self.env.cancelled()
    }

    fn run<S, E, I, F>(&self, job: &Job<I, F>, cancel: &Cancel)
    where
        E: Into<BoxError>,
        I: Fn() -> S,
        F: Fn(&mut S, T) -> Result<U, E>,
    {
        // If the state cannot be built, every element this worker takes
        // becomes an error saying why.
        let mut state = call_user(self.counters.name(), &job.init).map_err(|e| e.to_string());
        loop {
            if self.stopping(cancel) {
                return;
            }
            if self.index >= self.shared.target.load(Ordering::Relaxed) {
                let guard = self
                    .shared
                    .park
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if self.index >= self.shared.target.load(Ordering::Relaxed)
                    && !self.stopping(cancel)
                {
                    let _ = self
                        .shared
                        .wake
                        .wait_timeout(guard, Duration::from_millis(50))
                        .unwrap_or_else(PoisonError::into_inner);
                }
                continue;
            }
            // Take a window slot.
            match self.tokens.try_send(()) {
                Ok(()) => {}
                Err(TrySendError::Full(())) => {
                    let t = Instant::now();
                    let sent = cancel.send(&self.tokens, ());
                    self.counters.add_blocked_out(t.elapsed());
                    if sent.is_err() {
                        return;
                    }
                }
                Err(TrySendError::Disconnected(())) => return,
            }
            let t = Instant::now();
            let (seq, epoch, event) = {
                let mut up = self
                    .shared
                    .upstream
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if self.shared.exhausted.load(Ordering::Relaxed) {
                    return;
                }
                let Some(event) = up.stream.next() else {
                    self.shared.exhausted.store(true, Ordering::Relaxed);
                    drop(up);
                    self.shared.wake_all();
                    return;
                };
                let tag = (up.next_seq, up.epoch);
                up.next_seq += 1;
                if up.next_seq.is_multiple_of(ANCHOR_EVERY) {
                    let consumed = self.shared.consumed.load(Ordering::Relaxed);
                    let Upstream {
                        stream,
                        next_seq,
                        anchors,
                        ..
                    } = &mut *up;
                    anchors.offer(*next_seq, consumed, &**stream);
                }
                if let Event::EpochEnd(_) = event {
                    up.epoch += 1;
                }
                (tag.0, tag.1, event)
            };
            self.counters.add_wait_in(t.elapsed());
            let event = match event {
                Event::Item(Ok(item)) => {
                    let t = Instant::now();
                    self.counters.add_in(1, byte_size(&item));
                    let result = match state.as_mut() {
                        Ok(state) => match call_user(self.counters.name(), || (job.f)(state, item))
                        {
                            Ok(Ok(value)) => {
                                self.counters.add_out(1, byte_size(&value));
                                Ok(value)
                            }
                            Ok(Err(err)) => {
                                self.counters.add_error();
                                Err(user_error(&self.counters, err))
                            }
                            Err(panic) => {
                                self.counters.add_error();
                                Err(panic)
                            }
                        },
                        Err(why) => {
                            self.counters.add_error();
                            Err(PipelineError::Element {
                                stage: self.counters.name().to_string(),
                                message: format!("worker state could not be built: {why}"),
                            })
                        }
                    };
                    self.counters.add_busy(t.elapsed());
                    Event::Item(result)
                }
                Event::Item(Err(err)) => Event::Item(Err(err)),
                Event::EpochEnd(e) => Event::EpochEnd(e),
            };
            // Never full in practice: a window token was taken for this element.
            match self.out.try_send((seq, epoch, event)) {
                Ok(()) => {}
                Err(TrySendError::Full(message)) => {
                    if cancel.send(&self.out, message).is_err() {
                        return;
                    }
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
    }
}

enum Slot<U> {
    Pending,
    Ready(u64, Event<U>),
    Done,
}

/// The consumer's end: restores order, returns window tokens, runs the
/// autotuner. Dropping it cancels the workers, which wake wherever they
/// wait, so the fields may drop in any order.
struct MapStream<T, U> {
    /// The stage's name in the plan (`map`, `parse`), which its state carries.
    name: &'static str,
    out: Option<Receiver<Tagged<U>>>,
    tokens: Option<Receiver<()>>,
    ring: VecDeque<Slot<U>>,
    untagged: VecDeque<Event<U>>,
    base: u64,
    /// Markers emitted so far.
    epoch: u64,
    deterministic: bool,
    disconnected: bool,
    shared: Arc<Shared<T>>,
    counters: Arc<StageCounters>,
    autotuner: Option<Autotuner>,
    /// Time this consumer spent waiting for the workers.
    waited: Duration,
    /// Events still to drop after a restore (they came before the state).
    skip: u64,
    workers: Vec<Worker>,
}

impl<T, U> MapStream<T, U> {
    fn advance(&mut self) {
        self.ring.pop_front();
        self.base += 1;
        if self.base.is_multiple_of(ANCHOR_EVERY) {
            self.shared.consumed.store(self.base, Ordering::Relaxed);
        }
        if let Some(tokens) = &self.tokens {
            let _ = tokens.try_recv();
        }
    }

    fn pop(&mut self) -> Option<Event<U>> {
        if let Some(event) = self.untagged.pop_front() {
            return Some(event);
        }
        while let Some(Slot::Done) = self.ring.front() {
            self.advance();
        }
        if let Some(Slot::Ready(..)) = self.ring.front() {
            let slot = self.ring.pop_front();
            self.ring.push_front(Slot::Pending);
            self.advance();
            if let Some(Slot::Ready(_, event)) = slot {
                if let Event::EpochEnd(_) = event {
                    self.epoch += 1;
                }
                return Some(event);
            }
        }
        if !self.deterministic {
            let epoch = self.epoch;
            let found = self
                .ring
                .iter()
                .position(|slot| matches!(slot, Slot::Ready(e, Event::Item(_)) if *e == epoch))?;
            if let Slot::Ready(_, event) = std::mem::replace(&mut self.ring[found], Slot::Done) {
                return Some(event);
            }
        }
        None
    }

    fn insert(&mut self, (seq, epoch, event): Tagged<U>) {
        if seq == UNTAGGED {
            self.untagged.push_back(event);
            return;
        }
        let index = (seq - self.base) as usize;
        while self.ring.len() <= index {
            self.ring.push_back(Slot::Pending);
        }
        self.ring[index] = Slot::Ready(epoch, event);
    }

    fn tune(&mut self) {
        if let Some(tuner) = self.autotuner.as_mut() {
            let current = self.shared.target.load(Ordering::Relaxed);
            if let Some(new) = tuner.tick(&self.counters, self.waited, current) {
                self.shared.target.store(new, Ordering::Relaxed);
                self.counters.set_parallelism(new);
                self.shared.wake_all();
            }
        }
    }
}

impl<T: Send, U: Send> StageStream<U> for MapStream<T, U> {
    fn next_until(&mut self, deadline: Instant) -> Result<Option<Event<U>>, TimedOut> {
        self.next_by(Some(deadline))
    }

    fn save(&self) -> Result<StageState, StateError> {
        if !self.deterministic {
            return Err(StateError::Unsupported {
                stage: self.counters.name().to_string(),
                why: "a non-deterministic parallel map has no repeatable order".to_string(),
            });
        }
        let up = self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Every sequence number below `base` has been emitted (or skipped).
        up.anchors.at(self.name, self.base)
    }

    fn save_before_last(&self) -> Result<StageState, StateError> {
        if !self.deterministic {
            return self.save();
        }
        let up = self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The last element returned had sequence number `base - 1`.
        match self.base.checked_sub(1) {
            Some(before) => up.anchors.at(self.name, before),
            None => Err(StateError::Unsupported {
                stage: self.counters.name().to_string(),
                why: "nothing was returned yet".to_string(),
            }),
        }
    }
}

impl<T, U> MapStream<T, U> {
    /// The next event, waiting on the workers until `deadline` if one is
    /// given.
    fn next_by(&mut self, deadline: Option<Instant>) -> Result<Option<Event<U>>, TimedOut> {
        loop {
            if let Some(event) = self.pop() {
                if self.skip > 0 {
                    self.skip -= 1;
                    continue;
                }
                return Ok(Some(event));
            }
            if self.disconnected {
                return Ok(None);
            }
            let Some(out) = self.out.as_ref() else {
                return Ok(None);
            };
            let message = match out.try_recv() {
                Ok(m) => Ok(m),
                Err(TryRecvError::Disconnected) => Err(()),
                Err(TryRecvError::Empty) => {
                    let t = Instant::now();
                    let m = match deadline {
                        None => out.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        Some(deadline) => out.recv_deadline(deadline),
                    };
                    self.waited += t.elapsed();
                    match m {
                        Ok(m) => Ok(m),
                        Err(RecvTimeoutError::Timeout) => return Err(TimedOut),
                        Err(RecvTimeoutError::Disconnected) => Err(()),
                    }
                }
            };
            match message {
                Ok(m) => self.insert(m),
                Err(()) => self.disconnected = true,
            }
            self.tune();
        }
    }
}

impl<T, U> Iterator for MapStream<T, U> {
    type Item = Event<U>;

    fn next(&mut self) -> Option<Event<U>> {
        // With no deadline there is no time-out.
        self.next_by(None).ok().flatten()
    }
}

impl<T, U> Drop for MapStream<T, U> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.out = None;
        self.tokens = None;
        self.shared.wake_all();
        // Cancel them all before joining any, so none waits on another.
        for worker in &self.workers {
            worker.cancel();
        }
        self.workers.clear();
    }
}
