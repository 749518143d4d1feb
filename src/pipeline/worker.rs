//! Pipeline worker threads, on the crate's one spawner ([`crate::spawn`]).
//!
//! A [`Worker`] is a [`Thread`] plus the pipeline's thread count: dropping it
//! cancels the thread and joins it. A worker body blocks only through its
//! [`Cancel`] ([`Cancel::send`], [`Cancel::recv`]) or in waits that poll
//! [`Cancel::is_cancelled`], so cancelling wakes it wherever it waits. That is
//! why shutdown does not depend on the order in which a stage's fields drop:
//! a worker blocked on a full channel returns even while the stage still
//! holds the receiving end.
//!
//! Each body runs under `catch_unwind`; a panic that escapes the body (a bug
//! in tfpipe: user functions are caught where they are called) is handed to
//! `on_panic`, which forwards it downstream as an `Err` item, so a panic
//! never vanishes and never aborts the process.
//!
//! Live threads are counted per pipeline ([`LiveThreads`]) and process-wide
//! ([`live_worker_threads`]), which is how the tests show that no thread
//! outlives its pipeline.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::PipelineError;
use crate::spawn::{Cancel, Thread, panic_message};

static LIVE_WORKERS: AtomicUsize = AtomicUsize::new(0);

/// Worker threads of all pipelines in this process that have not finished.
pub fn live_worker_threads() -> usize {
    LIVE_WORKERS.load(Ordering::SeqCst)
}

/// A count of one pipeline's worker threads still running. It outlives the
/// pipeline, so a test can check it after dropping the iterator.
#[derive(Debug, Clone, Default)]
pub struct LiveThreads(pub(crate) Arc<AtomicUsize>);

impl LiveThreads {
    /// Threads started and not yet finished.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Decrements both counters when the thread's body is over, panic or not.
struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
        LIVE_WORKERS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running worker: cancelled, then joined, when dropped.
#[derive(Debug)]
pub(crate) struct Worker {
    thread: Thread<()>,
}

impl Worker {
    /// Spawns `body` on a named thread counted in `live`; `on_panic` gets the
    /// message of a panic that escapes `body` (and the thread's signal, to
    /// send it on without blocking past a cancel).
    pub(crate) fn spawn(
        live: &LiveThreads,
        name: &str,
        body: impl FnOnce(&Cancel) + Send + 'static,
        on_panic: impl FnOnce(&Cancel, String) + Send + 'static,
    ) -> Result<Worker, PipelineError> {
        live.0.fetch_add(1, Ordering::SeqCst);
        LIVE_WORKERS.fetch_add(1, Ordering::SeqCst);
        let guard = LiveGuard(Arc::clone(&live.0));
        let spawned = Thread::spawn(name, move |cancel: &Cancel| {
            let _guard = guard;
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| body(cancel))) {
                on_panic(cancel, panic_message(payload.as_ref()));
            }
        });
        match spawned {
            Ok(thread) => Ok(Worker { thread }),
            // The closure (and the guard in it) was dropped: the counts are right.
            Err(source) => Err(PipelineError::Spawn {
                stage: name.to_string(),
                error: source,
            }),
        }
    }

    /// Raises the worker's cancel signal without waiting for it.
    pub(crate) fn cancel(&self) {
        self.thread.cancel();
    }
}

/// Runs a user function, turning a panic into a [`PipelineError::Panic`]
/// naming `stage`.
pub(crate) fn call_user<R>(stage: &str, f: impl FnOnce() -> R) -> Result<R, PipelineError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| PipelineError::Panic {
        stage: stage.to_string(),
        message: panic_message(payload.as_ref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_cancels_a_sender_blocked_on_a_live_receiver() {
        let live = LiveThreads::default();
        let (tx, rx) = crossbeam_channel::bounded::<u32>(1);
        let w = Worker::spawn(
            &live,
            "t",
            move |cancel| {
                let mut n = 0;
                while cancel.send(&tx, n).is_ok() {
                    n += 1;
                }
            },
            |_, _| {},
        )
        .unwrap();
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(5)), Ok(0));
        // The receiver is still alive: only the cancel signal can wake it.
        drop(w);
        assert_eq!(live.get(), 0);
        drop(rx);
    }

    #[test]
    fn escaped_panic_reaches_on_panic() {
        let live = LiveThreads::default();
        let (tx, rx) = crossbeam_channel::bounded::<String>(1);
        let w = Worker::spawn(
            &live,
            "p",
            |_| panic!("boom"),
            move |_, m| {
                let _ = tx.send(m);
            },
        )
        .unwrap();
        drop(w);
        assert_eq!(rx.try_recv().unwrap(), "boom");
        assert_eq!(live.get(), 0);
    }
}
