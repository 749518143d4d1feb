//! Step accounting: each step's data wait, copy and compute, the steady
//! step time, per-epoch sums and the start-up milestones.
//!
//! Invariant: the run's first step is start-up (its wait includes the
//! pipeline's own start), so it is in the start-up breakdown and never in
//! the data wait, the steady step time or the stall fraction.

use std::time::{Duration, Instant};

use super::report::Startup;
use super::timing::Phase;

/// Step accounting for a whole run: the three phases per step, the steady
/// step time, start-up milestones.
pub(super) struct RunClock {
    pub(super) origin: Instant,
    pub(super) inline: bool,
    pub(super) data_wait: Phase,
    pub(super) copy: Phase,
    pub(super) compute: Phase,
    pub(super) steady: Phase,
    pub(super) startup: Startup,
    pub(super) first_step_ms: f64,
    pub(super) steps: u64,
    pub(super) examples: u64,
}

/// One epoch's data wait and busy time (the first step of the run excluded).
#[derive(Default)]
pub(super) struct EpochClock {
    pub(super) wait: Duration,
    pub(super) busy: Duration,
    pub(super) steps: u64,
    pub(super) examples: u64,
}

impl RunClock {
    pub(super) fn new(origin: Instant, inline: bool) -> RunClock {
        RunClock {
            origin,
            inline,
            data_wait: Phase::new(),
            copy: Phase::new(),
            compute: Phase::new(),
            steady: Phase::new(),
            startup: Startup::default(),
            first_step_ms: 0.0,
            steps: 0,
            examples: 0,
        }
    }

    pub(super) fn since_origin(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64() * 1e3
    }

    /// Records a step that waited `wait` for its batch, whose batch took
    /// `copy` to convert, and that computed for `busy` (ending now).
    pub(super) fn record_step(
        &mut self,
        wait: Duration,
        copy: Duration,
        busy: Duration,
        ep: &mut EpochClock,
    ) {
        let now = Instant::now();
        let step_busy = if self.inline { busy + copy } else { busy };
        self.copy.record(copy);
        self.compute.record(busy);
        if self.steps == 0 {
            // The first batch's wait is start-up, not data wait.
            let arrived = now - busy;
            self.startup.first_batch = self.since_origin(arrived);
            self.startup.first_step = self.since_origin(now);
            self.first_step_ms = step_busy.as_secs_f64() * 1e3;
        } else {
            self.data_wait.record(wait);
            self.steady.record(step_busy);
            ep.wait += wait;
            ep.busy += step_busy;
        }
        self.steps += 1;
    }

    /// Data wait over step time (wait + compute, + copy when it is not overlapped).
    pub(super) fn stall_fraction(&self) -> f64 {
        let copy = if self.inline {
            self.copy.total()
        } else {
            Duration::ZERO
        };
        let wait = self.data_wait.total();
        ratio(wait, wait + copy + self.compute.total())
    }
}

pub(super) fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        0.0
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_first_step_is_start_up_and_the_rest_is_stall_or_compute() {
        let mut clock = RunClock::new(Instant::now(), false);
        let mut epoch = EpochClock::default();
        clock.record_step(100 * MS, MS, 10 * MS, &mut epoch);
        assert_eq!((clock.data_wait.count(), epoch.steps), (0, 0));
        assert!(clock.startup.first_step >= clock.startup.first_batch);
        assert_eq!(clock.stall_fraction(), 0.0, "a start-up wait is no stall");
        clock.record_step(5 * MS, MS, 15 * MS, &mut epoch);
        clock.record_step(5 * MS, MS, 15 * MS, &mut epoch);
        assert_eq!(clock.steps, 3);
        assert_eq!((epoch.wait, epoch.busy), (10 * MS, 30 * MS));
        // The copy overlaps compute on the prefetch thread: not step time.
        let computed = 10 * MS + 30 * MS;
        assert!((clock.stall_fraction() - ratio(10 * MS, 10 * MS + computed)).abs() < 1e-12);
    }

    #[test]
    fn an_inline_copy_is_part_of_the_step() {
        let mut clock = RunClock::new(Instant::now(), true);
        let mut epoch = EpochClock::default();
        clock.record_step(Duration::ZERO, Duration::ZERO, MS, &mut epoch);
        clock.record_step(2 * MS, 3 * MS, 5 * MS, &mut epoch);
        assert_eq!(epoch.busy, 8 * MS);
        assert_eq!(ratio(MS, Duration::ZERO), 0.0, "no time: no ratio");
    }
}
