//! Optimizers: candle-nn's AdamW and SGD behind one enum, with their
//! settings as a serializable [`OptimizerConfig`] (stored in checkpoints).

use candle_core::{Tensor, Var};
use candle_nn::{AdamW, Optimizer as _, ParamsAdamW, SGD};
use serde::{Deserialize, Serialize};

use super::TrainError;

/// Which optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Adam with decoupled weight decay (candle-nn's `AdamW`).
    AdamW,
    /// Plain stochastic gradient descent, no momentum (candle-nn's `SGD`).
    Sgd,
}

impl std::str::FromStr for OptimizerKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "adamw" | "adam" => Ok(OptimizerKind::AdamW),
            "sgd" => Ok(OptimizerKind::Sgd),
            _ => Err(format!("unknown optimizer {s:?} (expected adamw or sgd)")),
        }
    }
}

/// Optimizer settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// AdamW or SGD.
    pub kind: OptimizerKind,
    /// The learning rate.
    pub lr: f64,
    /// AdamW's decoupled weight decay (ignored by SGD).
    pub weight_decay: f64,
}

impl OptimizerConfig {
    /// The usual defaults for `kind`: AdamW lr 0.001 and weight decay 0.01
    /// (candle's and Keras' defaults), SGD lr 0.1.
    pub fn default_for(kind: OptimizerKind) -> OptimizerConfig {
        match kind {
            OptimizerKind::AdamW => OptimizerConfig {
                kind,
                lr: 1e-3,
                weight_decay: 0.01,
            },
            OptimizerKind::Sgd => OptimizerConfig {
                kind,
                lr: 0.1,
                weight_decay: 0.0,
            },
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), TrainError> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(TrainError::Config(format!(
                "learning rate {} must be a positive number (e.g. --lr 0.001)",
                self.lr
            )));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(TrainError::Config(format!(
                "weight decay {} must be >= 0",
                self.weight_decay
            )));
        }
        Ok(())
    }
}

/// A live optimizer over a model's variables.
pub(crate) enum Optim {
    AdamW(AdamW),
    Sgd(SGD),
}

impl Optim {
    pub(crate) fn new(config: &OptimizerConfig, vars: Vec<Var>) -> Result<Optim, TrainError> {
        config.validate()?;
        let err = TrainError::candle("creating the optimizer");
        Ok(match config.kind {
            OptimizerKind::AdamW => Optim::AdamW(
                AdamW::new(
                    vars,
                    ParamsAdamW {
                        lr: config.lr,
                        weight_decay: config.weight_decay,
                        ..ParamsAdamW::default()
                    },
                )
                .map_err(err)?,
            ),
            OptimizerKind::Sgd => Optim::Sgd(SGD::new(vars, config.lr).map_err(err)?),
        })
    }

    /// Backward pass and update.
    pub(crate) fn backward_step(&mut self, loss: &Tensor) -> candle_core::Result<()> {
        match self {
            Optim::AdamW(o) => o.backward_step(loss),
            Optim::Sgd(o) => o.backward_step(loss),
        }
    }
}
