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
//! How: after `warmup` steps, each candidate (all the rayon pool's threads,
//! then half, a quarter, ..., 1) runs for a window of `window` steps, timed
//! by the wall clock from one step's end to the next (data wait included,
//! so a starved pipeline counts against the setting that starves it). The
//! fastest candidate is kept; the round repeats every `reprobe` steps so
//! that a change in the pipeline's load is followed.
//!
//! Invariant: between rounds the thread count is the last round's winner;
//! the tuner never sets more threads than candidates[0], the pool's size.

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
/// assert_eq!(tuner.candidates(), &[4, 2, 1]);
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
    /// Examples in the current window.
    examples: u64,
    /// The round's winner.
    chosen: usize,
    /// Each finished round: the candidates' rates and the winner.
    history: Vec<(Vec<f64>, usize)>,
}

impl ThreadTuner {
    /// A tuner over `max_threads`, then half of it, and so on down to 1;
    /// 30 warm-up steps, windows of 40 steps, a new round every 2,000 steps.
    pub fn new(max_threads: usize) -> ThreadTuner {
        let mut candidates = vec![max_threads.max(1)];
        while let Some(&last) = candidates.last()
            && last > 1
        {
            candidates.push(last / 2);
        }
        ThreadTuner {
            chosen: candidates[0],
            candidates,
            warmup: 30,
            window: 40,
            reprobe: 2_000,
            steps: 0,
            probe: None,
            rates: Vec::new(),
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

    /// The thread counts tried, largest first.
    pub fn candidates(&self) -> &[usize] {
        &self.candidates
    }

    /// The thread count in force: the last round's winner (the largest before any round).
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
        if n < self.window {
            self.probe = Some((i, since, n));
            return Ok(());
        }
        let seconds = since.elapsed().as_secs_f64().max(1e-9);
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

    #[test]
    fn candidates_halve_down_to_one() {
        assert_eq!(ThreadTuner::new(16).candidates(), &[16, 8, 4, 2, 1]);
        assert_eq!(ThreadTuner::new(3).candidates(), &[3, 1]);
        assert_eq!(ThreadTuner::new(1).candidates(), &[1]);
        assert_eq!(ThreadTuner::new(0).candidates(), &[1]);
    }

    /// A round times every candidate for one window and keeps the fastest:
    /// here the candidate whose steps sleep least.
    #[test]
    fn a_round_keeps_the_fastest_candidate() {
        let mut tuner = ThreadTuner::new(2).with_schedule(1, 3, 1_000);
        let info = RunInfo {
            epochs: None,
            steps: None,
            examples_per_epoch: None,
            first_epoch: 0,
            first_step: 0,
            task: super::super::Task::Regression,
        };
        tuner.on_train_begin(&info).unwrap();
        // Warm-up step; the round starts.
        tuner.on_step(&progress(8)).unwrap();
        for _ in 0..3 {
            // Two threads: slow steps.
            std::thread::sleep(std::time::Duration::from_millis(4));
            tuner.on_step(&progress(8)).unwrap();
        }
        for _ in 0..3 {
            // One thread: fast steps.
            tuner.on_step(&progress(8)).unwrap();
        }
        assert_eq!(tuner.rounds().len(), 1);
        let (rates, chosen) = &tuner.rounds()[0];
        assert_eq!(rates.len(), 2);
        assert!(rates[1] > rates[0], "{rates:?}");
        assert_eq!(*chosen, 1);
        assert_eq!(ops::compute_threads(), 1);
        ops::set_compute_threads(0);
    }
}
