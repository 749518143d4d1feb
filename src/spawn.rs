//! The one place that starts threads.
//!
//! Every thread tfpipe runs (pipeline workers, device prefetch, checkpoint
//! loading, the converter's encoders and writer, `inspect`'s scanners) is a
//! [`Thread`] started by [`Thread::spawn`]. A `Thread` is a guard with three
//! promises:
//!
//! - **A panic never vanishes.** The body runs under `catch_unwind`; a panic
//!   becomes [`Panicked`] (the thread's name and the message), returned by
//!   [`Thread::join`].
//! - **Nothing outlives its owner.** Dropping a `Thread` cancels it and then
//!   joins it.
//! - **Shutdown does not depend on field order.** Cancelling wakes a body that
//!   is blocked on a channel through [`Cancel::send`] or [`Cancel::recv`]
//!   (they select on the channel and on the cancel signal), so a worker blocked
//!   on a full channel returns even while its receiver is still alive. Long
//!   loops poll [`Cancel::is_cancelled`].
//!
//! ```
//! use tfpipe::spawn::Thread;
//!
//! let (tx, rx) = crossbeam_channel::bounded(1);
//! let producer = Thread::spawn("producer", move |cancel| {
//!     let mut sent = 0;
//!     // Blocks once `rx` is full; returns as soon as the owner cancels.
//!     while cancel.send(&tx, sent).is_ok() {
//!         sent += 1;
//!     }
//!     sent
//! })?;
//! assert_eq!(rx.recv()?, 0);
//! producer.cancel();
//! let sent = producer.join()?; // joins even though `rx` is still alive
//! assert!(sent >= 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Threads are counted process-wide ([`live_threads`]), which is how the tests
//! show that no thread outlives its owner.

use std::any::Any;
use std::fmt;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, select};

static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Threads started through [`Thread::spawn`] in this process that have not finished.
pub fn live_threads() -> usize {
    LIVE.load(Ordering::SeqCst)
}

/// A thread's body panicked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("thread {thread} panicked: {message}")]
pub struct Panicked {
    /// The thread's name as given to [`Thread::spawn`].
    pub thread: String,
    /// The panic message.
    pub message: String,
}

/// The owner stopped the thread while it waited on a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stopped {
    /// [`Thread::cancel`] was called (or the `Thread` was dropped).
    #[error("cancelled")]
    Cancelled,
    /// The other end of the channel is gone.
    #[error("channel disconnected")]
    Disconnected,
}

/// Never sent: the cancel channel only ever disconnects.
enum Never {}

/// The cancel signal, shared between a [`Thread`] and its body. Cloneable, so a
/// body can hand it to helpers of its own.
#[derive(Clone)]
pub struct Cancel {
    flag: Arc<AtomicBool>,
    // Disconnects when cancelled, which wakes every `select!` on it.
    signal: Receiver<Never>,
    trigger: Arc<Mutex<Option<Sender<Never>>>>,
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl Default for Cancel {
    fn default() -> Cancel {
        Cancel::new()
    }
}

impl Cancel {
    /// A signal not yet raised.
    pub fn new() -> Cancel {
        let (trigger, signal) = crossbeam_channel::bounded(0);
        Cancel {
            flag: Arc::new(AtomicBool::new(false)),
            signal,
            trigger: Arc::new(Mutex::new(Some(trigger))),
        }
    }

    /// Raises the signal. Idempotent.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
        // A poisoned lock still holds the sender; dropping it is all we need.
        let mut trigger = match self.trigger.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        trigger.take();
    }

    /// Whether the signal was raised.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Sends `value`, blocking while the channel is full, until it is sent,
    /// the receiver is gone, or the signal is raised.
    pub fn send<T>(&self, tx: &Sender<T>, value: T) -> Result<(), Stopped> {
        if self.is_cancelled() {
            return Err(Stopped::Cancelled);
        }
        select! {
            send(tx, value) -> sent => sent.map_err(|_| Stopped::Disconnected),
            recv(self.signal) -> _ => Err(Stopped::Cancelled),
        }
    }

    /// Receives a value, blocking until one arrives, every sender is gone, or
    /// the signal is raised.
    pub fn recv<T>(&self, rx: &Receiver<T>) -> Result<T, Stopped> {
        if self.is_cancelled() {
            return Err(Stopped::Cancelled);
        }
        select! {
            recv(rx) -> got => got.map_err(|_| Stopped::Disconnected),
            recv(self.signal) -> _ => Err(Stopped::Cancelled),
        }
    }
}

/// Decrements the live count when a body is over, panic or not.
struct LiveGuard;

impl Drop for LiveGuard {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running thread: cancelled and joined when dropped. See the module doc.
#[derive(Debug)]
pub struct Thread<T> {
    name: String,
    cancel: Cancel,
    handle: Option<JoinHandle<Result<T, Panicked>>>,
}

impl<T: Send + 'static> Thread<T> {
    /// Starts `body` on a thread named `tfpipe-NAME`. The body gets the
    /// thread's [`Cancel`] signal; its return value (or its panic) comes back
    /// from [`join`](Thread::join).
    ///
    /// Fails only when the operating system cannot start a thread.
    pub fn spawn(
        name: impl Into<String>,
        body: impl FnOnce(&Cancel) -> T + Send + 'static,
    ) -> io::Result<Thread<T>> {
        Thread::spawn_with(name, Cancel::new(), body)
    }

    /// Like [`spawn`](Thread::spawn), with a signal shared with other threads,
    /// so one [`Cancel::cancel`] stops a whole group.
    pub fn spawn_with(
        name: impl Into<String>,
        cancel: Cancel,
        body: impl FnOnce(&Cancel) -> T + Send + 'static,
    ) -> io::Result<Thread<T>> {
        let name = name.into();
        let thread_name = name.clone();
        let body_cancel = cancel.clone();
        LIVE.fetch_add(1, Ordering::SeqCst);
        let guard = LiveGuard;
        #[allow(clippy::disallowed_methods)] // the one place allowed to spawn
        let handle = std::thread::Builder::new()
            .name(format!("tfpipe-{name}"))
            .spawn(move || {
                let _guard = guard;
                catch_unwind(AssertUnwindSafe(|| body(&body_cancel))).map_err(|payload| Panicked {
                    thread: thread_name,
                    message: panic_message(payload.as_ref()),
                })
            })?;
        // On a spawn error the closure, and the guard in it, was dropped: the count is right.
        Ok(Thread {
            name,
            cancel,
            handle: Some(handle),
        })
    }
}

impl<T> Thread<T> {
    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The thread's cancel signal.
    pub fn cancel_signal(&self) -> &Cancel {
        &self.cancel
    }

    /// Raises the cancel signal; the thread stops at its next check.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Whether the body has returned (or panicked).
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the body and returns its value, or its panic.
    pub fn join(mut self) -> Result<T, Panicked> {
        self.join_inner()
    }

    fn join_inner(&mut self) -> Result<T, Panicked> {
        joined(&self.name, self.handle.take().map(JoinHandle::join))
    }
}

/// The body's value or its panic, from joining the thread `name`
/// (`None`: it was joined before).
fn joined<T>(
    name: &str,
    join: Option<std::thread::Result<Result<T, Panicked>>>,
) -> Result<T, Panicked> {
    let panicked = |message: String| Panicked {
        thread: name.to_string(),
        message,
    };
    match join {
        None => Err(panicked("already joined".to_string())),
        Some(Ok(result)) => result,
        // The body cannot unwind past catch_unwind; keep a message anyway.
        Some(Err(payload)) => Err(panicked(panic_message(payload.as_ref()))),
    }
}

impl<T> Drop for Thread<T> {
    fn drop(&mut self) {
        if self.handle.is_some() {
            self.cancel.cancel();
            let _ = self.join_inner();
        }
    }
}

/// A thread started by [`scoped`]: like [`Thread`], for a body that borrows
/// from the caller's stack. Dropping it cancels it; the enclosing
/// [`std::thread::scope`] joins it.
#[derive(Debug)]
pub struct ScopedThread<'scope, T> {
    name: String,
    cancel: Cancel,
    handle: Option<std::thread::ScopedJoinHandle<'scope, Result<T, Panicked>>>,
}

/// Starts `body` on a thread named `tfpipe-NAME` inside `scope`, with the
/// shared signal `cancel`, under the same guard as [`Thread::spawn_with`]: a
/// panic becomes [`Panicked`], and the thread is counted in [`live_threads`].
/// For workers that borrow the caller's data (the converter's encoders).
///
/// ```
/// use tfpipe::spawn::{Cancel, scoped};
///
/// let data = vec![1, 2, 3];
/// let sum = std::thread::scope(|s| {
///     let t = scoped(s, "summer", Cancel::new(), |_| data.iter().sum::<i32>())?;
///     Ok::<_, Box<dyn std::error::Error>>(t.join()?)
/// })?;
/// assert_eq!(sum, 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn scoped<'scope, 'env, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    name: impl Into<String>,
    cancel: Cancel,
    body: impl FnOnce(&Cancel) -> T + Send + 'scope,
) -> io::Result<ScopedThread<'scope, T>> {
    let name = name.into();
    let thread_name = name.clone();
    let body_cancel = cancel.clone();
    LIVE.fetch_add(1, Ordering::SeqCst);
    let guard = LiveGuard;
    #[allow(clippy::disallowed_methods)] // the one place allowed to spawn
    let handle = std::thread::Builder::new()
        .name(format!("tfpipe-{name}"))
        .spawn_scoped(scope, move || {
            let _guard = guard;
            catch_unwind(AssertUnwindSafe(|| body(&body_cancel))).map_err(|payload| Panicked {
                thread: thread_name,
                message: panic_message(payload.as_ref()),
            })
        })?;
    Ok(ScopedThread {
        name,
        cancel,
        handle: Some(handle),
    })
}

impl<T> ScopedThread<'_, T> {
    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Raises the cancel signal; the thread stops at its next check.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Waits for the body and returns its value, or its panic.
    pub fn join(mut self) -> Result<T, Panicked> {
        joined(&self.name, self.handle.take().map(|h| h.join()))
    }
}

impl<T> Drop for ScopedThread<'_, T> {
    fn drop(&mut self) {
        if self.handle.is_some() {
            self.cancel.cancel();
        }
    }
}

/// The text of a panic payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn panic_becomes_an_error_with_the_thread_name() {
        let t = Thread::spawn("boom", |_| -> u32 { panic!("kaput") }).unwrap();
        let err = t.join().unwrap_err();
        assert_eq!(err.thread, "boom");
        assert_eq!(err.message, "kaput");
    }

    #[test]
    fn drop_wakes_a_sender_blocked_on_a_live_receiver() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let returned = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&returned);
        let t = Thread::spawn("blocked", move |cancel| {
            let mut n = 0u32;
            while cancel.send(&tx, n).is_ok() {
                n += 1;
            }
            flag.store(true, Ordering::SeqCst);
        })
        .unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(0));
        drop(t); // rx is still alive: only the cancel signal can wake the sender
        assert!(returned.load(Ordering::SeqCst));
        drop(rx);
    }

    #[test]
    fn recv_returns_on_cancel_and_on_disconnect() {
        let (tx, rx) = crossbeam_channel::bounded::<u32>(1);
        let cancel = Cancel::new();
        let waiter = {
            let rx = rx.clone();
            Thread::spawn_with("waiter", cancel.clone(), move |c| c.recv(&rx)).unwrap()
        };
        cancel.cancel();
        assert_eq!(waiter.join().unwrap(), Err(Stopped::Cancelled));
        drop(tx);
        assert_eq!(Cancel::new().recv(&rx), Err(Stopped::Disconnected));
    }
}
