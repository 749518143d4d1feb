//! Learning-rate schedules: the rate of each step from the optimizer's base
//! rate, the global step and the epoch (so a resumed run continues the
//! schedule where it stopped). The trainer sets the rate before every step.

use serde::{Deserialize, Serialize};

use super::{Setting, TrainError};

/// How the learning rate changes over training, after an optional linear warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Decay {
    /// The base rate throughout.
    Constant,
    /// Multiplied by `gamma` every `epochs` epochs (PyTorch's `StepLR`).
    Step {
        /// Epochs between drops.
        epochs: u64,
        /// The factor at each drop.
        gamma: f64,
    },
    /// Cosine from the base rate down to `min_lr` over `steps` steps (after
    /// the warm-up), then `min_lr` (Keras' `CosineDecay`).
    Cosine {
        /// Steps of the decay.
        steps: u64,
        /// The final rate.
        min_lr: f64,
    },
}

/// A learning-rate schedule.
///
/// ```
/// use tfpipe::train::{Decay, LrSchedule};
/// let s = LrSchedule { decay: Decay::Cosine { steps: 100, min_lr: 0.0 }, warmup_steps: 10 };
/// assert_eq!(s.rate(1.0, 0, 0), 0.1); // warm-up: step 0 runs at 1/10
/// assert_eq!(s.rate(1.0, 10, 0), 1.0); // then the cosine starts at the base rate
/// assert!((s.rate(1.0, 60, 0) - 0.5).abs() < 1e-12);
/// assert_eq!(s.rate(1.0, 500, 0), 0.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// The decay after the warm-up.
    pub decay: Decay,
    /// Steps of linear warm-up from `base / warmup_steps` to `base`. 0: none.
    pub warmup_steps: u64,
}

impl Default for LrSchedule {
    /// Constant, no warm-up.
    fn default() -> LrSchedule {
        LrSchedule {
            decay: Decay::Constant,
            warmup_steps: 0,
        }
    }
}

impl LrSchedule {
    /// The rate of global step `step` (zero-based) in epoch `epoch`.
    pub fn rate(&self, base: f64, step: u64, epoch: u64) -> f64 {
        if step < self.warmup_steps {
            return base * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.decay {
            Decay::Constant => base,
            Decay::Step { epochs, gamma } => {
                let drops = epoch / epochs.max(1);
                base * gamma.powi(i32::try_from(drops).unwrap_or(i32::MAX))
            }
            Decay::Cosine { steps, min_lr } => {
                let t = (step - self.warmup_steps).min(steps) as f64 / steps.max(1) as f64;
                min_lr + (base - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }
        }
    }

    /// Whether the rate never changes.
    pub fn is_constant(&self) -> bool {
        self.decay == Decay::Constant && self.warmup_steps == 0
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), TrainError> {
        match self.decay {
            Decay::Constant => Ok(()),
            Decay::Step { epochs, gamma } => {
                if epochs == 0 || !(gamma.is_finite() && gamma > 0.0) {
                    Err(TrainError::config(
                        Setting::LrSchedule,
                        format!(
                            "step decay every {epochs} epochs by {gamma}: needs at least 1 epoch and a positive factor"
                        ),
                    ))
                } else {
                    Ok(())
                }
            }
            Decay::Cosine { steps, min_lr } => {
                if steps == 0 || !(min_lr.is_finite() && min_lr >= 0.0) {
                    Err(TrainError::config(
                        Setting::LrSchedule,
                        format!(
                            "cosine decay over {steps} steps to {min_lr}: needs at least 1 step and a rate >= 0"
                        ),
                    ))
                } else {
                    Ok(())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_decay_drops_by_epoch() {
        let s = LrSchedule {
            decay: Decay::Step {
                epochs: 2,
                gamma: 0.5,
            },
            warmup_steps: 0,
        };
        let rates: Vec<f64> = (0..5).map(|e| s.rate(0.8, 100, e)).collect();
        assert_eq!(rates, [0.8, 0.8, 0.4, 0.4, 0.2]);
        assert!(LrSchedule::default().is_constant());
        assert!(
            LrSchedule {
                decay: Decay::Cosine {
                    steps: 0,
                    min_lr: 0.0
                },
                warmup_steps: 0
            }
            .validate()
            .is_err()
        );
    }
}
