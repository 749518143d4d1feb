//! `prefetch`: run the upstream on its own thread, `n` elements ahead.

use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError, bounded};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::state::{self, ANCHOR_EVERY, Anchors, StageState, StageStream, StateError};
use super::worker::Worker;
use super::{Event, Pipeline, PipelineError, Stream, TimedOut, byte_size};
use crate::metrics::StageCounters;
use crate::spawn::Cancel;

impl<T: Send + 'static> Pipeline<T> {
    /// Runs everything upstream on a new thread that keeps up to `n` elements
    /// ready in a bounded channel, so the consumer overlaps with the
    /// producer. `prefetch(0)` is a no-op.
    ///
    /// Right after a parallel map (or parse), whose workers already compute
    /// ahead into a bounded window, no thread is added: the map's window
    /// grows by `n` and the consumer takes from it directly. The extra
    /// thread would only move each element from one channel to the next, at
    /// the price of a wake-up per element (docs/benchmarks.md, "One thread
    /// hop less").
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<u32> = Pipeline::from_vec((0..4).collect()).prefetch(2).start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(v, [0, 1, 2, 3]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn prefetch(mut self, n: usize) -> Pipeline<T> {
        if n == 0 {
            return self;
        }
        if let Some(widen) = self.widen.take() {
            self.build = widen(n);
            return self.then("prefetch", |env, up, counters| {
                Box::new(Inline::new(env, up, counters)) as Stream<T>
            });
        }
        self.then("prefetch", move |env, up, counters| {
            let skip = state::restored_skip(env, "prefetch");
            // The upstream's state before any pull: the first anchor.
            let mut first = Anchors::default();
            first.offer(0, 0, &*up);
            let anchors = Arc::new(AnchorShared {
                anchors: Mutex::new(first),
                consumed: AtomicU64::new(0),
            });
            let (tx, rx) = bounded(n);
            let panic_tx = tx.clone();
            let stage = counters.name().to_string();
            let body = {
                let env = env.clone();
                let counters = counters.clone();
                let anchors = Arc::clone(&anchors);
                move |cancel: &Cancel| {
                    produce(up, &tx, &counters, cancel, || env.cancelled(), &anchors)
                }
            };
            let on_panic = move |cancel: &Cancel, message| {
                let error = PipelineError::Panic { stage, message };
                let _ = cancel.send(&panic_tx, Event::Item(Err(error)));
            };
            match Worker::spawn(env.live(), "prefetch", body, on_panic) {
                Ok(worker) => Box::new(Prefetch {
                    rx,
                    anchors,
                    consumed: 0,
                    skip,
                    _worker: worker,
                }) as Stream<T>,
                Err(err) => Box::new(std::iter::once(Event::Item(Err(err)))),
            }
        })
    }
}

/// Pulls `up` and sends each event on, timing the two waits. Returns when the
/// upstream ends, the receiver is gone, the worker is cancelled (even while
/// blocked on a full channel), or the pipeline is cancelled.
pub(crate) fn produce<T: 'static>(
    mut up: Stream<T>,
    tx: &Sender<Event<T>>,
    counters: &StageCounters,
    cancel: &Cancel,
    cancelled: impl Fn() -> bool,
    anchors: &AnchorShared,
) {
    let mut first = Some(Instant::now());
    let mut pulled = 0u64;
    loop {
        if cancelled() || cancel.is_cancelled() {
            return;
        }
        let t = Instant::now();
        let Some(event) = up.next() else { return };
        pulled += 1;
        if pulled.is_multiple_of(ANCHOR_EVERY) {
            let consumed = anchors.consumed.load(Ordering::Relaxed);
            anchors
                .anchors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .offer(pulled, consumed, &*up);
        }
        counters.add_wait_in(t.elapsed());
        count_passed(counters, &event, &mut first);
        match tx.try_send(event) {
            Ok(()) => {}
            Err(TrySendError::Full(event)) => {
                let t = Instant::now();
                let sent = cancel.send(tx, event);
                counters.add_blocked_out(t.elapsed());
                if sent.is_err() {
                    return;
                }
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// Counts an element passed on unchanged (in and out alike), and the first
/// one's time since `born` (taken then).
fn count_passed<T: 'static>(
    counters: &StageCounters,
    event: &Event<T>,
    born: &mut Option<Instant>,
) {
    if let Event::Item(Ok(item)) = event {
        let bytes = byte_size(item);
        counters.add_in(1, bytes);
        counters.add_out(1, bytes);
        if let Some(born) = born.take() {
            counters.set_first_output(born.elapsed());
        }
    }
}

/// The consumer's end. Dropping it cancels the worker, which wakes even
/// while blocked on the full channel, so the fields may drop in any order.
struct Prefetch<T> {
    rx: Receiver<Event<T>>,
    anchors: Arc<AnchorShared>,
    /// Events received (skipped ones included).
    consumed: u64,
    /// Events still to drop after a restore (they came before the state).
    skip: u64,
    _worker: Worker,
}

/// A `prefetch` after a stage that already computes ahead on its own
/// threads: it passes each event through in the caller's thread, counting
/// and timing it as the threaded one does, and keeps the threaded one's state
/// format (a `skip` over the upstream's state), so either restores the
/// other's.
struct Inline<T> {
    up: Stream<T>,
    counters: Arc<StageCounters>,
    /// Events still to drop after a restore (they came before the state).
    skip: u64,
    /// When the stage was built, until its first element.
    born: Option<Instant>,
}

impl<T: 'static> Inline<T> {
    fn new(env: &super::Env, up: Stream<T>, counters: Arc<StageCounters>) -> Inline<T> {
        Inline {
            up,
            counters,
            skip: state::restored_skip(env, "prefetch"),
            born: Some(Instant::now()),
        }
    }

    /// The upstream's next event (waiting until `deadline` if given), after
    /// any still to skip, counted.
    fn pass(&mut self, deadline: Option<Instant>) -> Result<Option<Event<T>>, TimedOut> {
        loop {
            let t = Instant::now();
            let event = state::pull(&mut self.up, deadline);
            self.counters.add_wait_in(t.elapsed());
            let Some(event) = event? else {
                return Ok(None);
            };
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            count_passed(&self.counters, &event, &mut self.born);
            return Ok(Some(event));
        }
    }
}

impl<T: 'static> Iterator for Inline<T> {
    type Item = Event<T>;

    fn next(&mut self) -> Option<Event<T>> {
        // With no deadline there is no time-out.
        self.pass(None).ok().flatten()
    }
}

impl<T: Send + 'static> StageStream<T> for Inline<T> {
    fn next_until(&mut self, deadline: Instant) -> Result<Option<Event<T>>, TimedOut> {
        self.pass(Some(deadline))
    }

    fn save(&self) -> Result<StageState, StateError> {
        Ok(
            StageState::new("prefetch", serde_json::json!({ "skip": self.skip }))
                .with_input(self.up.save()?),
        )
    }
}

/// The producer's anchors and how far the consumer is (for pruning them).
#[derive(Default)]
pub(crate) struct AnchorShared {
    anchors: Mutex<Anchors>,
    consumed: AtomicU64,
}

impl<T> Iterator for Prefetch<T> {
    type Item = Event<T>;

    fn next(&mut self) -> Option<Event<T>> {
        loop {
            let event = self.rx.recv().ok()?;
            if let Some(event) = self.accept(event) {
                return Some(event);
            }
        }
    }
}

impl<T> Prefetch<T> {
    /// Counts a received event; `None` while events before a restored state
    /// are still being dropped.
    fn accept(&mut self, event: Event<T>) -> Option<Event<T>> {
        self.consumed += 1;
        if self.consumed.is_multiple_of(ANCHOR_EVERY) {
            self.anchors
                .consumed
                .store(self.consumed, Ordering::Relaxed);
        }
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        Some(event)
    }
}

impl<T: Send> StageStream<T> for Prefetch<T> {
    fn next_until(&mut self, deadline: Instant) -> Result<Option<Event<T>>, TimedOut> {
        loop {
            let event = match self.rx.recv_deadline(deadline) {
                Ok(event) => event,
                Err(RecvTimeoutError::Timeout) => return Err(TimedOut),
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
            };
            if let Some(event) = self.accept(event) {
                return Ok(Some(event));
            }
        }
    }

    fn save(&self) -> Result<StageState, StateError> {
        self.anchors
            .anchors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .at("prefetch", self.consumed + self.skip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::LiveThreads;
    use crate::spawn::Thread;
    use std::time::Duration;

    /// `next_timeout` returns within its timeout even while the pipeline
    /// ends pass after pass with no element (an empty file repeated), and
    /// the passes it went through are counted.
    #[test]
    fn next_timeout_holds_through_empty_passes() {
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let test = Thread::spawn("prefetch-test", move |_| {
            // A finite count: repeating an empty input forever ends at once.
            let mut it = Pipeline::from_vec(Vec::<u32>::new())
                .repeat(Some(u64::MAX))
                .prefetch(2)
                .start()
                .unwrap();
            let waited = std::time::Instant::now();
            let timed_out = it.next_timeout(Duration::from_millis(20)).is_err();
            let _ = done_tx.send((timed_out, waited.elapsed(), it.epoch()));
        })
        .unwrap();
        let Ok((timed_out, waited, epochs)) = done_rx.recv_timeout(Duration::from_secs(20)) else {
            std::mem::forget(test);
            panic!("next_timeout did not return through empty passes");
        };
        assert!(timed_out);
        assert!(waited < Duration::from_secs(5), "waited {waited:?}");
        assert!(epochs > 0);
    }

    /// Over a pipeline whose one element, 7, takes 200 ms: the first wait
    /// times out, a later one delivers it, then the end.
    fn times_out_then_delivers(mut it: crate::pipeline::PipelineIter<u32>) {
        assert!(matches!(
            it.next_timeout(Duration::from_millis(1)),
            Err(crate::pipeline::TimedOut)
        ));
        let mut got = None;
        while got.is_none() {
            if let Ok(item) = it.next_timeout(Duration::from_millis(20)) {
                got = Some(item.map(|r| r.unwrap()));
            }
        }
        assert_eq!(got, Some(Some(7)));
        assert!(matches!(it.next_timeout(Duration::from_secs(5)), Ok(None)));
    }

    /// A slow upstream: the wait times out, then the element comes.
    #[test]
    fn next_timeout_times_out_then_delivers() {
        let it = Pipeline::from_vec(vec![7u32])
            .map(|x| {
                std::thread::sleep(Duration::from_millis(200));
                x
            })
            .prefetch(1)
            .start()
            .unwrap();
        times_out_then_delivers(it);
    }

    /// After a parallel map, `prefetch` adds no thread of its own: the map's
    /// workers are the only ones, and the elements come in order.
    #[test]
    fn a_prefetch_after_a_parallel_map_adds_no_thread() {
        let mut it = Pipeline::from_vec((0..100u64).collect())
            .map_parallel(2, |x| Ok::<_, std::convert::Infallible>(x * 2))
            .prefetch(3)
            .start()
            .unwrap();
        let first = it.next().unwrap().unwrap();
        assert_eq!(it.live_threads().get(), 2);
        let rest: Vec<u64> = it.map(Result::unwrap).collect();
        assert_eq!(first, 0);
        assert_eq!(rest, (1..100).map(|x| x * 2).collect::<Vec<_>>());
        // Anything else still gets its thread.
        let it = Pipeline::from_vec(vec![1u32])
            .map(|x| x)
            .prefetch(3)
            .start()
            .unwrap();
        assert_eq!(it.live_threads().get(), 1);
    }

    /// The map's window grows by the prefetch's depth instead: with one
    /// worker (a window of 4) and `prefetch(3)`, 7 elements are computed
    /// ahead of the consumer, and no more.
    #[test]
    fn the_window_grows_by_the_prefetch_depth() {
        let calls = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&calls);
        let mut it = Pipeline::from_vec((0..100u64).collect())
            .map_parallel(1, move |x| {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(x)
            })
            .prefetch(3)
            .start()
            .unwrap();
        assert_eq!(it.next().unwrap().unwrap(), 0);
        let waited = std::time::Instant::now();
        while calls.load(Ordering::SeqCst) < 8 && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(calls.load(Ordering::SeqCst), 8);
    }

    /// A state in the threaded prefetch's form, a `skip` over its upstream's
    /// state, restores into the inline one: the skipped elements are dropped.
    #[test]
    fn an_inline_prefetch_restores_a_skip() {
        let pipeline = Pipeline::from_vec((0..50u64).collect())
            .map_parallel(2, Ok::<_, std::convert::Infallible>)
            .prefetch(2);
        let mut it = pipeline.start().unwrap();
        for _ in 0..10 {
            it.next().unwrap().unwrap();
        }
        let mut state = it.state().unwrap();
        assert_eq!(state.stage.stage, "prefetch");
        assert_eq!(state.stage.data, serde_json::json!({ "skip": 0 }));
        state.stage.data = serde_json::json!({ "skip": 3 });
        let rest: Vec<u64> = pipeline
            .start_from(&state)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(rest, (13..50).collect::<Vec<_>>());
    }

    /// `next_timeout` still times out where the map's workers are slow,
    /// then delivers.
    #[test]
    fn next_timeout_holds_after_a_parallel_map() {
        let it = Pipeline::from_vec(vec![7u32])
            .map_parallel(1, |x| {
                std::thread::sleep(Duration::from_millis(200));
                Ok::<_, std::convert::Infallible>(x)
            })
            .prefetch(1)
            .start()
            .unwrap();
        times_out_then_delivers(it);
    }

    /// The worker is joined while the receiver is still alive and the
    /// producer is blocked on the full channel: it must still return.
    #[test]
    fn joining_the_worker_first_does_not_hang() {
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let test = Thread::spawn("prefetch-test", move |_| {
            let live = LiveThreads::default();
            let (tx, rx) = bounded(1);
            let counters = StageCounters::new("prefetch".into());
            let mut i = 0u64;
            let up: Stream<u64> = Box::new(std::iter::from_fn(move || {
                i += 1;
                Some(Event::Item(Ok(i)))
            }));
            let worker = Worker::spawn(
                &live,
                "prefetch",
                move |cancel: &Cancel| {
                    produce(
                        up,
                        &tx,
                        &counters,
                        cancel,
                        || false,
                        &AnchorShared::default(),
                    )
                },
                |_, _| {},
            )
            .unwrap();
            let prefetch = Prefetch {
                rx,
                anchors: Arc::default(),
                consumed: 0,
                skip: 0,
                _worker: worker,
            };
            // Let the producer fill the channel and block.
            while !prefetch.rx.is_full() {
                std::thread::yield_now();
            }
            let Prefetch { rx, _worker, .. } = prefetch;
            drop(_worker); // joins, with `rx` alive
            let _ = done_tx.send(live.get());
            drop(rx);
        })
        .unwrap();
        let live = done_rx.recv_timeout(Duration::from_secs(20));
        if live.is_err() {
            std::mem::forget(test); // a hung thread cannot be joined; fail instead
            panic!("joining the prefetch worker with its receiver alive hung");
        }
        assert_eq!(live, Ok(0));
    }
}
