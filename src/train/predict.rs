//! Prediction from a checkpoint, and its latency: load time, the first
//! prediction against the steady state (p50/p99), with optional warm-up.

use std::path::Path;
use std::time::Instant;

use candle_core::{D, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::TrainError;
use super::checkpoint::{Checkpoint, CheckpointMeta};
use super::model::BuiltinModel;
use super::prefetch::BatchStream;
use super::tensor::{InputSpec, batch_to_tensors};
use super::timing::Phase;

/// Steady-state latency per batch, ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PredictionLatency {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// What `tfpipe predict` reports. Times in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictReport {
    /// Checkpoint load: read the files, build the model.
    pub load_ms: f64,
    /// Warm-up passes run on the first batch before timing.
    pub warmup: usize,
    /// Their total time.
    pub warmup_ms: f64,
    /// The first timed prediction (a batch: forward, arg-max, result on the host).
    pub first_prediction_ms: f64,
    /// The later batches.
    pub steady_prediction_ms: PredictionLatency,
    /// Examples predicted.
    pub examples: u64,
    /// Batches predicted.
    pub batches: u64,
    /// Fraction predicted correctly, when the data has labels.
    pub accuracy: Option<f64>,
}

impl std::fmt::Display for PredictReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "load       {:.1} ms (checkpoint read, model built)",
            self.load_ms
        )?;
        if self.warmup > 0 {
            writeln!(
                f,
                "warm-up    {} passes in {:.1} ms",
                self.warmup, self.warmup_ms
            )?;
        }
        writeln!(
            f,
            "latency    first {:.3} ms, steady p50 {:.3} ms, p99 {:.3} ms (per batch)",
            self.first_prediction_ms, self.steady_prediction_ms.p50, self.steady_prediction_ms.p99
        )?;
        write!(
            f,
            "predicted  {} examples in {} batches",
            self.examples, self.batches
        )?;
        match self.accuracy {
            Some(a) => writeln!(f, ", accuracy {:.2}%", a * 100.0),
            None => writeln!(f),
        }
    }
}

/// Receives each batch's predicted class ids and, when known, its labels.
pub type PredictionSink<'a> = dyn FnMut(&[u32], Option<&[u32]>) -> Result<(), TrainError> + 'a;

/// A model loaded for prediction.
pub struct Predictor {
    model: BuiltinModel,
    meta: CheckpointMeta,
    device: Device,
    load_ms: f64,
}

impl Predictor {
    /// Loads the checkpoint in `dir`, timing the load.
    pub fn load(dir: impl AsRef<Path>, device: &Device) -> Result<Predictor, TrainError> {
        let start = Instant::now();
        let c = Checkpoint::load(dir, device)?;
        Ok(Predictor {
            model: c.model,
            meta: c.meta,
            device: device.clone(),
            load_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// The checkpoint's metadata.
    pub fn meta(&self) -> &CheckpointMeta {
        &self.meta
    }

    /// How long [`load`](Self::load) took, ms.
    pub fn load_ms(&self) -> f64 {
        self.load_ms
    }

    /// Class ids for `features` (`[batch, inputs]`), on the host.
    pub fn predict(&self, features: &Tensor) -> Result<Vec<u32>, TrainError> {
        self.model
            .forward_features(features)
            .and_then(|l| l.argmax(D::Minus1))
            .and_then(|p| p.to_vec1::<u32>())
            .map_err(TrainError::candle("prediction"))
    }

    /// Predicts every batch of `stream`, after `warmup` untimed passes over
    /// the first, and hands each batch's predictions (and labels, when
    /// `with_labels`) to `sink`.
    pub fn run(
        &self,
        stream: &mut dyn BatchStream,
        with_labels: bool,
        warmup: usize,
        sink: &mut PredictionSink<'_>,
    ) -> Result<PredictReport, TrainError> {
        let input = InputSpec {
            label: if with_labels {
                self.meta.input.label.clone()
            } else {
                None
            },
            ..self.meta.input.clone()
        };
        let mut steady = Phase::new();
        let (mut first_ms, mut warmup_ms) = (0.0, 0.0);
        let (mut examples, mut batches, mut hits) = (0u64, 0u64, 0u64);
        while let Some(batch) = stream.next_batch() {
            let tensors = batch_to_tensors(
                batch.map_err(TrainError::data)?,
                &input,
                batches,
                &self.device,
            )?;
            if batches == 0 && warmup > 0 {
                let start = Instant::now();
                for _ in 0..warmup {
                    self.predict(&tensors.features)?;
                }
                warmup_ms = start.elapsed().as_secs_f64() * 1e3;
            }
            // `predict` ends with the result on the host: the clock reads
            // after the device has finished.
            let start = Instant::now();
            let predicted = self.predict(&tensors.features)?;
            let took = start.elapsed();
            if batches == 0 {
                first_ms = took.as_secs_f64() * 1e3;
            } else {
                steady.record(took);
            }
            let labels = match &tensors.labels {
                Some(l) => Some(
                    l.to_vec1::<u32>()
                        .map_err(TrainError::candle("reading labels"))?,
                ),
                None => None,
            };
            if let Some(labels) = &labels {
                hits += predicted.iter().zip(labels).filter(|(p, l)| p == l).count() as u64;
            }
            sink(&predicted, labels.as_deref())?;
            examples += tensors.rows as u64;
            batches += 1;
        }
        let s = steady.summary();
        Ok(PredictReport {
            load_ms: self.load_ms,
            warmup,
            warmup_ms,
            first_prediction_ms: first_ms,
            steady_prediction_ms: PredictionLatency {
                p50: s.p50,
                p99: s.p99,
            },
            examples,
            batches,
            accuracy: (with_labels && examples > 0).then(|| hits as f64 / examples as f64),
        })
    }
}
