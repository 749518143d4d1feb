//! `prefetch`: run the upstream on its own thread, `n` elements ahead.

use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};

use super::worker::Worker;
use super::{Event, Pipeline, PipelineError, Stream, byte_size};
use crate::metrics::StageCounters;

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
            let (tx, rx) = bounded(n);
            let panic_tx = tx.clone();
            let stage = counters.name().to_string();
            let body = {
                let env = env.clone();
                let counters = counters.clone();
                move || produce(up, tx, &counters, || env.cancelled())
            };
            let on_panic = move |message| {
                let _ = panic_tx.send(Event::Item(Err(PipelineError::Panic { stage, message })));
            };
            match Worker::spawn(env.live(), "prefetch", body, on_panic) {
                Ok(worker) => Box::new(Prefetch {
                    rx,
                    _worker: worker,
                }) as Stream<T>,
                Err(err) => Box::new(std::iter::once(Event::Item(Err(err)))),
            }
        })
    }
}

/// Pulls `up` and sends each event on, timing the two waits. Returns when the
/// upstream ends, the receiver is gone, or the pipeline is cancelled.
pub(crate) fn produce<T: 'static>(
    mut up: Stream<T>,
    tx: Sender<Event<T>>,
    counters: &StageCounters,
    cancelled: impl Fn() -> bool,
) {
    let mut first = Some(Instant::now());
    loop {
        if cancelled() {
            return;
        }
        let t = Instant::now();
        let Some(event) = up.next() else { return };
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
                let sent = tx.send(event);
                counters.add_blocked_out(t.elapsed());
                if sent.is_err() {
                    return;
                }
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// The consumer's end. Field order matters: the receiver drops before the
/// worker is joined, so a worker blocked in `send` wakes up and exits.
struct Prefetch<T> {
    rx: Receiver<Event<T>>,
    _worker: Worker,
}

impl<T> Iterator for Prefetch<T> {
    type Item = Event<T>;

    fn next(&mut self) -> Option<Event<T>> {
        self.rx.recv().ok()
    }
}
