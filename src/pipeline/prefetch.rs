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
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<u32> = Pipeline::from_vec((0..4).collect()).prefetch(2).start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(v, [0, 1, 2, 3]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn prefetch(self, n: usize) -> Pipeline<T> {
        if n == 0 {
            return self;
        }
        self.then("prefetch", move |env, up, counters| {
            let skip = match env.resume_state().map(|s| state::skip_of(s, "prefetch")) {
                Some(Ok(skip)) => skip,
                Some(Err(error)) => {
                    env.restore_failed(error);
                    0
                }
                None => 0,
            };
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
        if let Event::Item(Ok(item)) = &event {
            let bytes = byte_size(item);
            counters.add_in(1, bytes);
            counters.add_out(1, bytes);
            if let Some(born) = first.take() {
                counters.set_first_output(born.elapsed());
            }
        }
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

    /// A slow upstream: the wait times out, then the element comes.
    #[test]
    fn next_timeout_times_out_then_delivers() {
        let mut it = Pipeline::from_vec(vec![7u32])
            .map(|x| {
                std::thread::sleep(Duration::from_millis(200));
                x
            })
            .prefetch(1)
            .start()
            .unwrap();
        assert!(matches!(
            it.next_timeout(Duration::from_millis(1)),
            Err(crate::pipeline::TimedOut)
        ));
        let mut got = None;
        while got.is_none() {
            match it.next_timeout(Duration::from_millis(20)) {
                Ok(item) => got = Some(item.map(|r| r.unwrap())),
                Err(_) => continue,
            }
        }
        assert_eq!(got, Some(Some(7)));
        assert!(matches!(it.next_timeout(Duration::from_secs(5)), Ok(None)));
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
