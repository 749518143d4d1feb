//! Compute threads chosen by measurement: [`ThreadTuner`], an
//! [`Observer`] that times the training steps at a few thread counts for
//! the fused kernels' GEMMs ([`ops::set_compute_threads`]) and keeps the
//! fastest.
//!
//! Why measure: the model's math and the input pipeline share the cores.
//! Giving the GEMMs every core is fastest while the pipeline needs little
//! CPU; when it needs more, the steps start waiting for data and fewer
//! compute threads win. Which one wins depends on the machine, the model,
//! the batch size and the data, so the tuner tries them on the real run.
//!
//! How: after `warmup` steps, each candidate (1 thread, then 2, 4, ... up
//! to all the rayon pool's threads) runs for a window of `window` steps,
//! timed by the wall clock from one step's end to the next (data wait
//! included, so a starved pipeline counts against the setting that starves
//! it). The fastest candidate is kept; the round repeats every `reprobe`
//! steps so that a change in the pipeline's load is followed.
//!
//! What a round costs: every step run at a losing count is a slow step of
//! the real run. So the warm-up and the first window run at 1 thread (the
//! count that never waits on a descheduled partner thread, which on a
//! shared machine is often the winner: the LeNet-like CNN's step was 2.4x
//! slower on 2 threads than on 1 at load 3 on 2 cores), and a window ends
//! as soon as it has taken as long as the fastest whole window so far: by
//! then it has run fewer steps in the same time, so it cannot win, and its
//! rate over the steps it ran is recorded. Before, the warm-up and the
//! first window ran on every thread and each window ran to the end: 70 of
//! a 150-step CNN run's steps at the losing count.
//!
//! Invariant: between rounds the thread count is the last round's winner
//! (1 before the first round ends); the tuner never sets more threads than
//! the last candidate, the pool's size.

use std::time::Instant;

use super::TrainError;
use super::observer::{Observer, RunInfo};
use super::ops;
use super::trainer::Progress;

/// Chooses the fused kernels' thread count by timing steps (see the module doc).
///
/// ```
/// use tfpipe::train::ThreadTuner;
///
/// let tuner = ThreadTuner::new(4);
/// assert_eq!(tuner.candidates(), &[1, 2, 4]);
/// assert_eq!(tuner.chosen(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct ThreadTuner {
    candidates: Vec<usize>,
    warmup: u64,
    window: u64,
    reprobe: u64,
    /// Steps seen.
    steps: u64,
    /// The round in progress: (candidate index, window start, steps in it).
    probe: Option<(usize, Instant, u64)>,
    /// Examples per second of each candidate in the current round.
    rates: Vec<f64>,
    /// The current round's shortest whole window, in seconds: a window
    /// still running when this much time has passed cannot win.
    fastest_window: Option<f64>,
    /// Examples in the current window.
    examples: u64,
    /// The round's winner.
    chosen: usize,
    /// Each finished round: the candidates' rates and the winner.
    history: Vec<(Vec<f64>, usize)>,
}

impl ThreadTuner {
    /// A tuner over 1 thread, then 2, 4, ... (halvings of `max_threads`,
    /// taken smallest first) up to `max_threads`; 30 warm-up steps, windows
    /// of 40 steps, a new round every 2,000 steps.
    pub fn new(max_threads: usize) -> ThreadTuner {
        let mut candidates = vec![max_threads.max(1)];
        while let Some(&last) = candidates.last()
            && last > 1
        {
            candidates.push(last / 2);
        }
        candidates.reverse();
        ThreadTuner {
            chosen: candidates[0],
            candidates,
            warmup: 30,
            window: 40,
            reprobe: 2_000,
            steps: 0,
            probe: None,
            rates: Vec::new(),
            fastest_window: None,
            examples: 0,
            history: Vec::new(),
        }
    }

    /// Sets the warm-up, the window and the steps between rounds (each at least 1).
    pub fn with_schedule(mut self, warmup: u64, window: u64, reprobe: u64) -> ThreadTuner {
        self.warmup = warmup;
        self.window = window.max(1);
        self.reprobe = reprobe.max(1);
        self
    }

    /// The thread counts tried, in the order tried: smallest first.
    pub fn candidates(&self) -> &[usize] {
        &self.candidates
    }

    /// The thread count in force: the last round's winner (1 before any round ends).
    pub fn chosen(&self) -> usize {
        self.chosen
    }

    /// Each finished round: examples per second per candidate, and the winner.
    pub fn rounds(&self) -> &[(Vec<f64>, usize)] {
        &self.history
    }

    /// Starts timing candidate `i` from now.
    fn start(&mut self, i: usize) {
        ops::set_compute_threads(self.candidates[i]);
        self.probe = Some((i, Instant::now(), 0));
        self.examples = 0;
    }

    fn finish_round(&mut self) {
        let best = self
            .rates
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i);
        self.chosen = self.candidates[best];
        ops::set_compute_threads(self.chosen);
        self.history
            .push((std::mem::take(&mut self.rates), self.chosen));
        self.probe = None;
        self.fastest_window = None;
    }
}

impl Observer for ThreadTuner {
    fn on_train_begin(&mut self, _run: &RunInfo) -> Result<(), TrainError> {
        ops::set_compute_threads(self.chosen);
        Ok(())
    }

    fn on_step(&mut self, progress: &Progress) -> Result<(), TrainError> {
        self.steps += 1;
        if self.candidates.len() < 2 {
            return Ok(());
        }
        let Some((i, since, n)) = self.probe else {
            let due = self.steps == self.warmup.max(1)
                || (self.steps > self.warmup
                    && (self.steps - self.warmup).is_multiple_of(self.reprobe));
            if due {
                // The window starts at this step's end.
                self.start(0);
            }
            return Ok(());
        };
        // The window's first step is timed from the previous step's end.
        self.examples += progress.rows as u64;
        let n = n + 1;
        let seconds = since.elapsed().as_secs_f64().max(1e-9);
        let lost = self.fastest_window.is_some_and(|f| seconds >= f);
        if n < self.window && !lost {
            self.probe = Some((i, since, n));
            return Ok(());
        }
        if n == self.window {
            self.fastest_window = Some(self.fastest_window.map_or(seconds, |f| f.min(seconds)));
        }
        self.rates.push(self.examples as f64 / seconds);
        if i + 1 < self.candidates.len() {
            self.start(i + 1);
        } else {
            self.finish_round();
        }
        Ok(())
    }

    fn on_train_end(
        &mut self,
        _trainer: &super::Trainer,
        _interrupted: bool,
    ) -> Result<(), TrainError> {
        // A run that ended inside a round keeps the last winner.
        if self.probe.take().is_some() {
            self.rates.clear();
            self.fastest_window = None;
            ops::set_compute_threads(self.chosen);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(rows: usize) -> Progress {
        Progress {
            step: 0,
            run_steps: 0,
            epoch: 0,
            epoch_steps: 0,
            epoch_examples: 0,
            loss: 0.0,
            learning_rate: 0.0,
            rows,
            examples_per_sec: 0.0,
            stall_fraction: 0.0,
        }
    }

    fn run_info() -> RunInfo {
        RunInfo {
            epochs: None,
            steps: None,
            examples_per_epoch: None,
            first_epoch: 0,
            first_step: 0,
            task: super::super::Task::Regression,
        }
    }

    /// `steps` steps of 8 rows, each taking at least `ms` milliseconds.
    fn steps(tuner: &mut ThreadTuner, steps: usize, ms: u64) {
        for _ in 0..steps {
            std::thread::sleep(std::time::Duration::from_millis(ms));
            tuner.on_step(&progress(8)).unwrap();
        }
    }

    #[test]
    fn candidates_are_the_halvings_smallest_first() {
        assert_eq!(ThreadTuner::new(16).candidates(), &[1, 2, 4, 8, 16]);
        assert_eq!(ThreadTuner::new(3).candidates(), &[1, 3]);
        assert_eq!(ThreadTuner::new(1).candidates(), &[1]);
        assert_eq!(ThreadTuner::new(0).candidates(), &[1]);
    }

    /// A round times every candidate and keeps the fastest: here the
    /// candidate whose steps sleep least, two threads, which runs its
    /// whole window because it is winning.
    #[test]
    fn a_round_keeps_the_fastest_candidate() {
        let mut tuner = ThreadTuner::new(2).with_schedule(1, 3, 1_000);
        tuner.on_train_begin(&run_info()).unwrap();
        // The warm-up runs at one thread.
        assert_eq!(tuner.chosen(), 1);
        steps(&mut tuner, 1, 0);
        // One thread: slow steps; then two threads: fast steps.
        steps(&mut tuner, 3, 4);
        assert!(tuner.rounds().is_empty());
        steps(&mut tuner, 3, 0);
        assert_eq!(tuner.rounds().len(), 1);
        let (rates, chosen) = &tuner.rounds()[0];
        assert_eq!(rates.len(), 2);
        assert!(rates[1] > rates[0], "{rates:?}");
        assert_eq!(*chosen, 2);
        assert_eq!(tuner.chosen(), 2);
    }

    /// A window that has taken as long as the fastest whole window so far
    /// ends there: the losing two threads run one step, not three.
    #[test]
    fn a_losing_window_ends_when_it_cannot_win() {
        let mut tuner = ThreadTuner::new(2).with_schedule(1, 3, 1_000);
        tuner.on_train_begin(&run_info()).unwrap();
        steps(&mut tuner, 1, 0);
        // One thread: three steps of 1 ms; then one step of 50 ms at two.
        steps(&mut tuner, 3, 1);
        steps(&mut tuner, 1, 50);
        assert_eq!(
            tuner.rounds().len(),
            1,
            "the round ended after one slow step"
        );
        let (rates, chosen) = &tuner.rounds()[0];
        assert!(rates[0] > rates[1], "{rates:?}");
        assert_eq!(*chosen, 1);
        // The next steps run at the winner, outside any round.
        steps(&mut tuner, 3, 0);
        assert_eq!(tuner.rounds().len(), 1);
        assert_eq!(tuner.chosen(), 1);
    }
}
