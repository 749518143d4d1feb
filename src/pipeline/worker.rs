//! The one place that spawns threads.
//!
//! A [`Worker`] is a guard: dropping it joins its thread. Every stage that runs
//! work on a thread owns the guards of its threads *after* the receiving ends
//! of their channels, so on drop the receiver goes first (a worker blocked in
//! `send` wakes with a disconnection error and returns) and the join second.
//! Joining first would deadlock a worker blocked on a full channel.
//!
//! Each thread runs its body under `catch_unwind`; a panic that escapes the
//! body (a bug in tfpipe: user functions are caught where they are called) is
//! handed to `on_panic`, which forwards it downstream as an `Err` item, so a
//! panic never vanishes and never aborts the process.
//!
//! Live threads are counted per pipeline ([`LiveThreads`]) and process-wide
//! ([`live_worker_threads`]), which is how the tests show that no thread
//! outlives its pipeline.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};

use super::PipelineError;

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

/// A running thread, joined when dropped.
#[derive(Debug)]
pub(crate) struct Worker {
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    /// Spawns `body` on a named thread counted in `live`; `on_panic` gets the
    /// message of a panic that escapes `body`.
    pub(crate) fn spawn(
        live: &LiveThreads,
        name: &str,
        body: impl FnOnce() + Send + 'static,
        on_panic: impl FnOnce(String) + Send + 'static,
    ) -> Result<Worker, PipelineError> {
        live.0.fetch_add(1, Ordering::SeqCst);
        LIVE_WORKERS.fetch_add(1, Ordering::SeqCst);
        let guard = LiveGuard(Arc::clone(&live.0));
        let spawned = thread::Builder::new()
            .name(format!("tfpipe-{name}"))
            .spawn(move || {
                let _guard = guard;
                if let Err(payload) = catch_unwind(AssertUnwindSafe(body)) {
                    on_panic(panic_message(payload.as_ref()));
                }
            });
        match spawned {
            Ok(handle) => Ok(Worker {
                handle: Some(handle),
            }),
            // The closure (and the guard in it) was dropped: the counts are right.
            Err(source) => Err(PipelineError::Spawn {
                stage: name.to_string(),
                source,
            }),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            // The body cannot panic out of catch_unwind; a join error is impossible.
            let _ = handle.join();
        }
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
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
    fn drop_joins_and_counts() {
        let live = LiveThreads::default();
        let (tx, rx) = crossbeam_channel::bounded::<u32>(1);
        let w = Worker::spawn(
            &live,
            "t",
            move || {
                let _ = tx.send(1);
                let _ = tx.send(2);
                let _ = tx.send(3); // blocks until rx is dropped
            },
            |_| {},
        )
        .unwrap();
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(5)), Ok(1));
        drop(rx);
        drop(w);
        assert_eq!(live.get(), 0);
    }

    #[test]
    fn escaped_panic_reaches_on_panic() {
        let live = LiveThreads::default();
        let (tx, rx) = crossbeam_channel::bounded::<String>(1);
        let w = Worker::spawn(
            &live,
            "p",
            || panic!("boom"),
            move |m| {
                let _ = tx.send(m);
            },
        )
        .unwrap();
        drop(w);
        assert_eq!(rx.try_recv().unwrap(), "boom");
        assert_eq!(live.get(), 0);
    }
}
