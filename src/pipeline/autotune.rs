//! The autotuner behind [`Parallelism::Auto`](super::Parallelism::Auto): it
//! sets a parallel stage's active workers from the stage's own metrics.
//!
//! Every [`TICK`] (the first time after [`FIRST_TICK`]) it looks at the
//! last interval:
//! - *grow* (up to the cores) when the downstream spent more than 5% of the
//!   interval waiting for this stage and the workers were busy with their own
//!   work more than 25% of the time: more workers would overlap that work;
//! - *shrink* (down to 1) when the downstream hardly waited (under 1%) and
//!   the workers spent most of the interval blocked on a full output: the
//!   consumer is busy (a training step), so a worker gives its core back;
//!   this must hold for five ticks in a row, since growing back costs time.
//!
//! This is a metric-driven rule, not a fixed guess: it follows the load as it
//! changes. It is deliberately simple; `tf.data` fits an analytical model of
//! the whole pipeline instead.

use std::time::{Duration, Instant};

use crate::metrics::StageCounters;

/// How often the autotuner looks.
pub(crate) const TICK: Duration = Duration::from_millis(20);

/// When it first looks: a stage starts with one worker, and at start-up
/// (a shuffle buffer filling) the downstream waits on it from the first
/// millisecond, so waiting a whole tick for the second worker cost a
/// fifth of a 100k buffer's fill.
const FIRST_TICK: Duration = Duration::from_millis(2);

/// Consecutive ticks calling for a shrink before it happens (100 ms).
const SHRINK_AFTER: u32 = 5;

pub(crate) struct Autotuner {
    max: usize,
    /// Calls since the clock was last read: the clock is read every 16th
    /// call only, since a per-element stage calls this per element.
    calls: u32,
    /// Consecutive ticks that called for one worker fewer.
    shrink_votes: u32,
    last: Instant,
    /// [`FIRST_TICK`] until the first look, then [`TICK`].
    interval: Duration,
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
            shrink_votes: 0,
            last: Instant::now(),
            interval: FIRST_TICK,
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
        if interval < self.interval {
            return None;
        }
        self.interval = TICK;
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
            self.shrink_votes = 0;
            Some(current + 1)
        } else if waited < 0.01 && blocked_frac > 0.5 && current > 1 {
            // Shrink only when it persists: a full output buffer for a
            // moment is normal, and a wrong shrink costs throughput at once.
            self.shrink_votes += 1;
            (self.shrink_votes >= SHRINK_AFTER).then(|| {
                self.shrink_votes = 0;
                current - 1
            })
        } else {
            self.shrink_votes = 0;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls `tick` 16 times (it reads the clock every 16th call) after
    /// `after` of a downstream that waited all along on a busy worker.
    fn look(tuner: &mut Autotuner, counters: &StageCounters, after: Duration) -> Option<usize> {
        std::thread::sleep(after);
        counters.add_busy(after);
        let waited = tuner.downstream_wait + after;
        (0..16).find_map(|_| tuner.tick(counters, waited, 1))
    }

    /// A stage that starts starved gets its second worker after the first
    /// few milliseconds, not after a whole tick; later looks keep the tick.
    #[test]
    fn the_first_look_comes_early_and_later_ones_every_tick() {
        let counters = StageCounters::new("test".into());
        let mut tuner = Autotuner::new(4);
        assert_eq!(look(&mut tuner, &counters, FIRST_TICK * 2), Some(2));
        assert_eq!(look(&mut tuner, &counters, FIRST_TICK * 2), None);
    }
}
