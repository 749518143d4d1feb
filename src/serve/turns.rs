//! Whose turn it is to accept: the connection thread idle most recently.
//!
//! Threads blocked in `accept` on one socket are woken longest-waiting
//! first. With the default 128 connection threads, a client's first
//! connections therefore each met a thread that had never served a
//! request, and paid for it: the first batch-256 `:predict` after ready
//! took 1.20-1.36x the steady p50 (up to 99 minor page faults in that
//! request), against 1.04-1.06x (no faults) when the thread that ran the
//! warm-up served it (`--max-connections 1`; docs/benchmarks.md, "Serving").
//!
//! So the threads take turns (leader/followers): one at a time holds the
//! turn and waits in `accept`; the others wait on a stack. The holder, once
//! it has a connection, passes the turn to the thread on top of the stack,
//! the one that went idle last, and serves its connection; a thread done
//! with its connection goes back on top. A client's connections then go to
//! the threads that served the last ones, whose memory is warm.
//!
//! Invariants: at most one thread holds the turn; a thread waits only while
//! another holds it; after [`Turns::stop`], every waiting thread is woken
//! and [`Turns::take`] returns `false` at once.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The turn to accept, and the threads waiting for it.
#[derive(Default)]
pub(crate) struct Turns {
    state: Mutex<State>,
    /// Signalled whenever a thread starts waiting (for [`Turns::wait_idle`]).
    idle: Condvar,
}

#[derive(Default)]
struct State {
    /// Whether a thread holds the turn.
    taken: bool,
    /// Threads waiting for the turn, the one idle most recently last.
    waiting: Vec<Arc<Waiter>>,
    stopped: bool,
}

/// One connection thread's place in the stack.
#[derive(Default)]
pub(crate) struct Waiter {
    /// Set when the turn (or the stop) is handed to this thread.
    woken: Mutex<bool>,
    wake: Condvar,
}

impl Turns {
    /// Blocks until `me` holds the turn; `false` once the server stops.
    pub(crate) fn take(&self, me: &Arc<Waiter>) -> bool {
        {
            let mut state = self.lock();
            if state.stopped {
                return false;
            }
            if !state.taken {
                state.taken = true;
                return true;
            }
            state.waiting.push(Arc::clone(me));
            self.idle.notify_all();
        }
        let mut woken = lock(&me.woken);
        while !*woken {
            woken = me.wake.wait(woken).unwrap_or_else(PoisonError::into_inner);
        }
        *woken = false;
        drop(woken);
        !self.lock().stopped
    }

    /// Passes the turn to the thread idle most recently, or frees it.
    pub(crate) fn pass(&self) {
        let next = {
            let mut state = self.lock();
            let next = state.waiting.pop();
            if next.is_none() {
                state.taken = false;
            }
            next
        };
        if let Some(next) = next {
            next.hand_over();
        }
    }

    /// Wakes every waiting thread; [`take`](Self::take) returns `false`
    /// from now on.
    pub(crate) fn stop(&self) {
        let waiting = {
            let mut state = self.lock();
            state.stopped = true;
            std::mem::take(&mut state.waiting)
        };
        for waiter in waiting {
            waiter.hand_over();
        }
    }

    /// Threads waiting for the turn now.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Waits until `threads` threads wait for the turn (each done with its
    /// connection), at most `timeout`; returns whether they do.
    pub(crate) fn wait_idle(&self, threads: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        while state.waiting.len() < threads && !state.stopped {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .idle
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.waiting.len() >= threads
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl Waiter {
    fn hand_over(&self) {
        *lock(&self.woken) = true;
        self.wake.notify_one();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spawn::Thread;

    /// Each thread records, in order, which turns it took; the turn goes to
    /// the thread that waited last, not first.
    #[test]
    fn the_turn_goes_to_the_thread_idle_most_recently() {
        let turns = Arc::new(Turns::default());
        let me = Arc::new(Waiter::default());
        assert!(turns.take(&me), "a free turn is taken at once");
        let order = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<Thread<()>> = (0..3)
            .map(|i| {
                let (mine, order) = (Arc::clone(&turns), Arc::clone(&order));
                let thread = Thread::spawn(format!("turn-{i}"), move |_| {
                    let me = Arc::new(Waiter::default());
                    while mine.take(&me) {
                        order.lock().unwrap().push(i);
                        mine.pass();
                    }
                })
                .unwrap();
                // In order: 0 waits first, 2 last.
                assert!(turns.wait_idle(i + 1, Duration::from_secs(10)));
                thread
            })
            .collect();
        turns.pass();
        // 2 takes it and passes to 1, ... each goes back on top when done,
        // so the most recent waiters keep the turn between them.
        let deadline = Instant::now() + Duration::from_secs(10);
        while order.lock().unwrap().len() < 6 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        turns.stop();
        for thread in threads {
            thread.join().unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(
            order[0], 2,
            "the last to wait takes the turn first: {order:?}"
        );
        assert!(!turns.take(&me), "no turn after stop");
    }

    #[test]
    fn stop_wakes_every_waiting_thread() {
        let turns = Arc::new(Turns::default());
        let me = Arc::new(Waiter::default());
        assert!(turns.take(&me));
        let threads: Vec<Thread<bool>> = (0..4)
            .map(|i| {
                let turns = Arc::clone(&turns);
                Thread::spawn(format!("stop-{i}"), move |_| {
                    turns.take(&Arc::new(Waiter::default()))
                })
                .unwrap()
            })
            .collect();
        assert!(turns.wait_idle(4, Duration::from_secs(10)));
        turns.stop();
        for thread in threads {
            assert!(!thread.join().unwrap(), "a stopped turn is not taken");
        }
    }
}
