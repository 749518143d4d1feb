//! The autotuner behind [`Parallelism::Auto`](super::Parallelism::Auto): it
//! sets a parallel stage's active workers from the stage's own metrics.
//!
//! Every [`TICK`] it looks at the last interval:
//! - *grow* (up to the cores) when the downstream spent more than 5% of the
//!   interval waiting for this stage and the workers were busy with their own
//!   work more than 25% of the time: more workers would overlap that work;
//! - *shrink* (down to 1) when the downstream hardly waited (under 1%) and
//!   the workers spent most of the interval blocked on a full output: the
//!   consumer is busy (a training step), so a worker gives its core back.
//!
//! This is a metric-driven rule, not a fixed guess: it follows the load as it
//! changes. It is deliberately simple; `tf.data` fits an analytical model of
//! the whole pipeline instead.

use std::time::{Duration, Instant};

use crate::metrics::StageCounters;

/// How often the autotuner looks.
pub(crate) const TICK: Duration = Duration::from_millis(20);

pub(crate) struct Autotuner {
    max: usize,
    /// Calls since the clock was last read: the clock is read every 16th
    /// call only, since a per-element stage calls this per element.
    calls: u32,
    last: Instant,
    busy_ns: u64,
    wait_in_ns: u64,
    blocked_out_ns: u64,
    downstream_wait: Duration,
}

impl Autotuner {
    pub(crate) fn new(max: usize) -> Autotuner {
        Autotuner {
            max: max.max(1),
            calls: 0,
            last: Instant::now(),
            busy_ns: 0,
            wait_in_ns: 0,
            blocked_out_ns: 0,
            downstream_wait: Duration::ZERO,
        }
    }

    /// The new worker count, if it should change. `downstream_wait` is the
    /// total time the downstream has waited for this stage so far.
    pub(crate) fn tick(
        &mut self,
        counters: &StageCounters,
        downstream_wait: Duration,
        current: usize,
    ) -> Option<usize> {
        self.calls += 1;
        if self.calls < 16 {
            return None;
        }
        self.calls = 0;
        let now = Instant::now();
        let interval = now.duration_since(self.last);
        if interval < TICK {
            return None;
        }
        let (busy, wait_in, blocked) = (
            counters.busy_ns(),
            counters.wait_in_ns(),
            counters.blocked_out_ns(),
        );
        let workers = current.max(1) as f64;
        let span = interval.as_nanos() as f64;
        let waited =
            (downstream_wait.saturating_sub(self.downstream_wait)).as_nanos() as f64 / span;
        let busy_frac = busy.saturating_sub(self.busy_ns) as f64 / (span * workers);
        let _input_frac = wait_in.saturating_sub(self.wait_in_ns) as f64 / (span * workers);
        let blocked_frac = blocked.saturating_sub(self.blocked_out_ns) as f64 / (span * workers);
        self.last = now;
        self.busy_ns = busy;
        self.wait_in_ns = wait_in;
        self.blocked_out_ns = blocked;
        self.downstream_wait = downstream_wait;
        if waited > 0.05 && busy_frac > 0.25 && current < self.max {
            Some(current + 1)
        } else if waited < 0.01 && blocked_frac > 0.5 && current > 1 {
            Some(current - 1)
        } else {
            None
        }
    }
}
