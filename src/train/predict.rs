//! Prediction from a checkpoint, and its latency: load time, the first
//! prediction against the steady state (p50/p99), with optional warm-up.
//!
//! [`Predictor::run`] hands every batch's [`PredictedBatch`] to a sink: for
//! classification the arg-max class ids and the softmax probabilities, for
//! regression the predicted values; the labels when the data has them; and
//! the record-key column when one was asked for. The CLI writes them as JSON
//! Lines (see `tfpipe predict --help` and the README).
//!
//! A [`Predictor`] holds any [`Model`]: [`Predictor::load`] rebuilds a
//! built-in model from its checkpoint alone; [`Predictor::load_with`] builds
//! a custom one from code and loads its weights (checksums verified), and
//! [`Predictor::new`] takes a model already in memory.
//!
//! Invariant: the timed part of a prediction ends with the outputs on the
//! host, so on a GPU the clock reads after the device has finished.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use candle_core::{D, DType as CDType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use serde::{Deserialize, Serialize};

use super::TrainError;
use super::checkpoint::{Checkpoint, CheckpointMeta};
use super::model::{Model, Task};
use super::prefetch::BatchStream;
use super::tensor::{BatchTensors, InputSpec, batch_to_tensors};
use super::timing::Phase;
use crate::batch::Column;

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
    /// Fraction predicted correctly, when the data has labels (classification).
    pub accuracy: Option<f64>,
    /// Mean absolute error, when the data has labels (regression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mae: Option<f64>,
    /// A stop flag was raised (a signal): the data was not all predicted.
    #[serde(default)]
    pub interrupted: bool,
}

impl PredictReport {
    /// The report of a run that predicted nothing (yet).
    pub fn empty(load_ms: f64) -> PredictReport {
        PredictReport {
            load_ms,
            warmup: 0,
            warmup_ms: 0.0,
            first_prediction_ms: 0.0,
            steady_prediction_ms: PredictionLatency::default(),
            examples: 0,
            batches: 0,
            accuracy: None,
            mae: None,
            interrupted: false,
        }
    }
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
        match (self.accuracy, self.mae) {
            (Some(a), _) => writeln!(f, ", accuracy {:.2}%", a * 100.0),
            (None, Some(mae)) => writeln!(f, ", MAE {mae:.4}"),
            (None, None) => writeln!(f),
        }
    }
}

/// What the model predicted for one batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Outputs {
    /// Classification.
    Classes {
        /// The arg-max class id of each row.
        ids: Vec<u32>,
        /// Softmax probabilities, `classes` per row, row after row.
        probabilities: Vec<f32>,
        /// The number of classes.
        classes: usize,
    },
    /// Regression: one value per row.
    Values(Vec<f32>),
}

impl Outputs {
    /// Row `row`'s probabilities (classification), else `None`.
    pub fn probabilities(&self, row: usize) -> Option<&[f32]> {
        match self {
            Outputs::Classes {
                probabilities,
                classes,
                ..
            } => probabilities.get(row * classes..(row + 1) * classes),
            Outputs::Values(_) => None,
        }
    }
}

/// A batch's labels, as the task reads them.
#[derive(Debug, Clone, PartialEq)]
pub enum Labels {
    /// Class ids.
    Classes(Vec<u32>),
    /// Regression targets.
    Values(Vec<f32>),
}

/// One batch's predictions, handed to a [`PredictionSink`].
#[derive(Debug, Clone, PartialEq)]
pub struct PredictedBatch {
    /// The number of examples.
    pub rows: usize,
    /// The predictions.
    pub outputs: Outputs,
    /// The labels, when the data has them.
    pub labels: Option<Labels>,
    /// The record-key column ([`PredictOptions::key`]), as parsed.
    pub key: Option<Column>,
}

/// Receives each batch's predictions.
pub type PredictionSink<'a> = dyn FnMut(&PredictedBatch) -> Result<(), TrainError> + 'a;

/// How [`Predictor::run`] goes.
#[derive(Debug, Clone, Copy, Default)]
pub struct PredictOptions<'a> {
    /// The data has the label column: report accuracy (or MAE) and hand
    /// the labels to the sink.
    pub with_labels: bool,
    /// Untimed passes over the first batch before timing.
    pub warmup: usize,
    /// A column of the parsed batches to hand to the sink beside each
    /// prediction (a record key). It must be in the stream's batches.
    pub key: Option<&'a str>,
    /// Raised (by a signal handler), prediction stops after the current
    /// batch and the report says `interrupted`.
    pub stop: Option<&'a AtomicBool>,
}

/// A model loaded for prediction: any [`Model`], built-in or custom.
pub struct Predictor {
    model: Box<dyn Model>,
    meta: CheckpointMeta,
    device: Device,
    load_ms: f64,
}

impl Predictor {
    /// Loads the checkpoint of a built-in model in `dir`, timing the load.
    pub fn load(dir: impl AsRef<Path>, device: &Device) -> Result<Predictor, TrainError> {
        let start = Instant::now();
        let c = Checkpoint::load(dir, device)?;
        Ok(Predictor {
            model: Box::new(c.model),
            meta: c.meta,
            device: device.clone(),
            load_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Loads the checkpoint in `dir` into a model that `build` makes (a
    /// custom [`Model`], whose code the checkpoint cannot hold), timing the
    /// load. `build` gets a `VarBuilder` on fresh variables and the
    /// checkpoint's metadata; the weights are then loaded into those
    /// variables by name, after their checksum is verified
    /// ([`Checkpoint::load_weights`]).
    ///
    /// ```no_run
    /// use candle_core::{Device, Module, Tensor};
    /// use candle_nn::Linear;
    /// use tfpipe::train::{BatchTensors, Model, Predictor, Task};
    ///
    /// struct Logistic(Linear);
    /// impl Model for Logistic {
    ///     fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor> {
    ///         self.0.forward(&batch.features)
    ///     }
    ///     fn task(&self) -> Task {
    ///         Task::Classification { classes: 2 }
    ///     }
    /// }
    ///
    /// let predictor = Predictor::load_with("ckpt", &Device::Cpu, |vb, meta| {
    ///     let inputs = meta.input.inputs();
    ///     Ok(Logistic(candle_nn::linear(inputs, 2, vb.pp("fc"))?))
    /// })?;
    /// assert_eq!(predictor.task(), Task::Classification { classes: 2 });
    /// # Ok::<(), tfpipe::train::TrainError>(())
    /// ```
    pub fn load_with<M, F>(
        dir: impl AsRef<Path>,
        device: &Device,
        build: F,
    ) -> Result<Predictor, TrainError>
    where
        M: Model + 'static,
        F: FnOnce(VarBuilder<'_>, &CheckpointMeta) -> candle_core::Result<M>,
    {
        let dir = dir.as_ref();
        let start = Instant::now();
        let meta = Checkpoint::read_meta(dir)?;
        let varmap = VarMap::new();
        let model = build(VarBuilder::from_varmap(&varmap, CDType::F32, device), &meta)
            .map_err(TrainError::candle("building the model"))?;
        let meta = Checkpoint::load_weights(dir, &varmap)?;
        let mut predictor = Predictor::new(model, meta, device);
        predictor.load_ms = start.elapsed().as_secs_f64() * 1e3;
        Ok(predictor)
    }

    /// A predictor for `model`, already built and holding its weights, with
    /// `meta` describing its inputs (the checkpoint's metadata, or one made
    /// in code). Its load time is 0.
    pub fn new(model: impl Model + 'static, meta: CheckpointMeta, device: &Device) -> Predictor {
        Predictor {
            model: Box::new(model),
            meta,
            device: device.clone(),
            load_ms: 0.0,
        }
    }

    /// What the model learns.
    pub fn task(&self) -> Task {
        self.model.task()
    }

    /// The model's one-line description (e.g. `mlp 784-256-10`).
    pub fn describe(&self) -> String {
        self.model.describe()
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The checkpoint's metadata.
    pub fn meta(&self) -> &CheckpointMeta {
        &self.meta
    }

    /// How long [`load`](Self::load) took, ms.
    pub fn load_ms(&self) -> f64 {
        self.load_ms
    }

    /// The class name of class `id`, from the label vocabulary the
    /// checkpoint recorded (none when it recorded none).
    pub fn class_name(&self, id: u32) -> Option<&str> {
        self.meta
            .label_vocabulary
            .as_ref()?
            .get(id as usize)
            .map(String::as_str)
    }

    /// Class ids for `features` (`[batch, inputs]`), on the host.
    pub fn predict(&self, features: &Tensor) -> Result<Vec<u32>, TrainError> {
        let batch = BatchTensors {
            features: features.clone(),
            labels: None,
            tokens: None,
            mask: None,
            pool: None,
            rows: features.dim(0).map_err(TrainError::candle("prediction"))?,
        };
        self.model
            .forward_t(&batch, false)
            .and_then(|l| l.argmax(D::Minus1))
            .and_then(|p| p.to_vec1::<u32>())
            .map_err(TrainError::candle("prediction"))
    }

    /// Warm-up: `passes` untimed forward passes over `batch`, each ending
    /// with its outputs on the host, as [`outputs`](Self::outputs) does, so
    /// that the first timed call costs what later ones cost. What a first
    /// call pays is the process's and the calling thread's: the model's
    /// buffers allocated and faulted in, the GEMM packing, the thread
    /// pool's start (without warm-up the first prediction of `tfpipe
    /// predict` costs 17-20x the steady median at batch 1, 3x at 256;
    /// docs/benchmarks.md, "First prediction"). Run it on the thread that
    /// will predict, at the batch sizes it will see. `tfpipe predict` runs
    /// it before timing its first batch and `tfpipe serve` before a version
    /// takes traffic (at every batch size the batcher forms). Stops early
    /// when `stop` goes up. Returns the passes' wall time, ms.
    ///
    /// ```no_run
    /// # use tfpipe::train::{Predictor, BatchTensors};
    /// # fn f(predictor: &Predictor, batch: &BatchTensors) -> Result<(), tfpipe::train::TrainError> {
    /// let ms = predictor.warm_up(batch, 10, None)?;
    /// let outputs = predictor.outputs(batch)?; // costs what the steady state costs
    /// # Ok(()) }
    /// ```
    pub fn warm_up(
        &self,
        batch: &BatchTensors,
        passes: usize,
        stop: Option<&AtomicBool>,
    ) -> Result<f64, TrainError> {
        let start = Instant::now();
        for _ in 0..passes {
            if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                break;
            }
            std::hint::black_box(self.outputs(batch)?);
        }
        Ok(start.elapsed().as_secs_f64() * 1e3)
    }

    /// The model's outputs for `batch`, on the host: class ids and
    /// probabilities, or values.
    pub fn outputs(&self, batch: &BatchTensors) -> Result<Outputs, TrainError> {
        let err = TrainError::candle("prediction");
        let out = self.model.forward_t(batch, false).map_err(err)?;
        match self.model.task() {
            Task::Classification { classes } => {
                let probs = candle_nn::ops::softmax_last_dim(&out)
                    .map_err(TrainError::candle("prediction"))?;
                let ids = probs
                    .argmax(D::Minus1)
                    .and_then(|p| p.to_vec1::<u32>())
                    .map_err(TrainError::candle("prediction"))?;
                let probabilities = probs
                    .flatten_all()
                    .and_then(|p| p.to_vec1::<f32>())
                    .map_err(TrainError::candle("prediction"))?;
                Ok(Outputs::Classes {
                    ids,
                    probabilities,
                    classes,
                })
            }
            Task::Regression => out
                .flatten_all()
                .and_then(|v| v.to_vec1::<f32>())
                .map(Outputs::Values)
                .map_err(TrainError::candle("prediction")),
        }
    }

    /// Predicts every batch of `stream`, after `options.warmup` untimed
    /// passes over the first, and hands each batch's predictions to `sink`.
    pub fn run(
        &self,
        stream: &mut dyn BatchStream,
        options: PredictOptions<'_>,
        sink: &mut PredictionSink<'_>,
    ) -> Result<PredictReport, TrainError> {
        let input = InputSpec {
            label: if options.with_labels {
                self.meta.input.label.clone()
            } else {
                None
            },
            ..self.meta.input.clone()
        };
        let mut steady = Phase::new();
        let (mut first_ms, mut warmup_ms) = (0.0, 0.0);
        let (mut examples, mut batches) = (0u64, 0u64);
        let mut score = Score::default();
        let mut interrupted = false;
        // The first bad record, returned once every readable record is
        // predicted: the pipeline reads on after it (the next file, or the
        // rest of a batch cut short by it), and no good record is lost.
        let mut bad_data: Option<TrainError> = None;
        while let Some(batch) = stream.next_batch() {
            if options.stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                interrupted = true;
                break;
            }
            let batch = match batch.map_err(TrainError::data) {
                Ok(batch) => batch,
                Err(e) if e.is_data_error() => {
                    bad_data.get_or_insert(e);
                    continue;
                }
                Err(e) => return Err(bad_data.unwrap_or(e)),
            };
            let key = match options.key {
                Some(name) => {
                    Some(
                        batch
                            .column(name)
                            .cloned()
                            .ok_or_else(|| TrainError::Input {
                                batch: batches,
                                reason: format!("no key column {name:?}"),
                            })?,
                    )
                }
                None => None,
            };
            let tensors = batch_to_tensors(batch, &input, batches, &self.device)?;
            if batches == 0 && options.warmup > 0 {
                warmup_ms = self.warm_up(&tensors, options.warmup, options.stop)?;
            }
            // `outputs` ends with the result on the host: the clock reads
            // after the device has finished.
            let start = Instant::now();
            let outputs = self.outputs(&tensors)?;
            let took = start.elapsed();
            if batches == 0 {
                first_ms = took.as_secs_f64() * 1e3;
            } else {
                steady.record(took);
            }
            let labels = match &tensors.labels {
                Some(l) => Some(host_labels(l, self.model.task())?),
                None => None,
            };
            let predicted = PredictedBatch {
                rows: tensors.rows,
                outputs,
                labels,
                key,
            };
            score.add(&predicted);
            sink(&predicted)?;
            examples += tensors.rows as u64;
            batches += 1;
        }
        if let Some(e) = bad_data {
            return Err(e);
        }
        let s = steady.summary();
        let scored = options.with_labels && examples > 0;
        let (accuracy, mae) = match self.model.task() {
            Task::Classification { .. } => (scored.then(|| score.hits / examples as f64), None),
            Task::Regression => (None, scored.then(|| score.abs_err / examples as f64)),
        };
        Ok(PredictReport {
            load_ms: self.load_ms,
            warmup: options.warmup,
            warmup_ms,
            first_prediction_ms: first_ms,
            steady_prediction_ms: PredictionLatency {
                p50: s.p50,
                p99: s.p99,
            },
            examples,
            batches,
            accuracy,
            mae,
            interrupted,
        })
    }
}

/// Correct predictions and absolute errors, summed over batches.
#[derive(Default)]
struct Score {
    hits: f64,
    abs_err: f64,
}

impl Score {
    fn add(&mut self, b: &PredictedBatch) {
        match (&b.outputs, &b.labels) {
            (Outputs::Classes { ids, .. }, Some(Labels::Classes(labels))) => {
                self.hits += ids.iter().zip(labels).filter(|(p, l)| p == l).count() as f64;
            }
            (Outputs::Values(values), Some(Labels::Values(labels))) => {
                self.abs_err += values
                    .iter()
                    .zip(labels)
                    .map(|(p, l)| f64::from((p - l).abs()))
                    .sum::<f64>();
            }
            _ => {}
        }
    }
}

fn host_labels(labels: &Tensor, task: Task) -> Result<Labels, TrainError> {
    let err = TrainError::candle("reading labels");
    match task {
        Task::Classification { .. } => labels.to_vec1::<u32>().map(Labels::Classes).map_err(err),
        Task::Regression => labels.to_vec1::<f32>().map(Labels::Values).map_err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::checkpoint::FORMAT;
    use crate::train::tensor::InputSpec;
    use candle_core::Module;
    use candle_nn::Linear;

    /// A model the checkpoint cannot rebuild by itself.
    struct Custom(Linear);

    impl Model for Custom {
        fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor> {
            self.0.forward(&batch.features)
        }
        fn task(&self) -> Task {
            Task::Classification { classes: 3 }
        }
        fn describe(&self) -> String {
            "custom linear 2-3".into()
        }
    }

    /// Built from JSON, so fields later versions add (all optional) keep their defaults.
    fn meta() -> CheckpointMeta {
        let input = InputSpec {
            features: vec![("x".into(), 2)],
            label: None,
            task: Task::Classification { classes: 3 },
            standardize: Vec::new(),
            tokens: None,
            impute: None,
        };
        serde_json::from_value(serde_json::json!({
            "format": FORMAT,
            "step": 1,
            "epoch": 0,
            "model": null,
            "model_description": "custom linear 2-3",
            "optimizer": null,
            "optimizer_state": false,
            "input": input,
            "schema": null,
            "seed": 0,
        }))
        .unwrap()
    }

    /// A custom model saved, then served by `load_with`, predicts what the
    /// model in memory predicts; `load` refuses it with the way out.
    #[test]
    fn custom_models_load_and_predict() {
        let dir = tempfile::tempdir().unwrap();
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, CDType::F32, &Device::Cpu);
        let model = Custom(candle_nn::linear(2, 3, vb.pp("fc")).unwrap());
        crate::train::seed_vars(&varmap, 9, &Device::Cpu).unwrap();
        Checkpoint::save(dir.path(), &varmap, None, &meta()).unwrap();
        let xs = Tensor::new(&[[0.5f32, -1.0], [2.0, 0.25]], &Device::Cpu).unwrap();
        let expected = model.0.forward(&xs).unwrap().argmax(D::Minus1).unwrap();
        let expected: Vec<u32> = expected.to_vec1().unwrap();

        let loaded = Predictor::load_with(dir.path(), &Device::Cpu, |vb, meta| {
            Ok(Custom(candle_nn::linear(
                meta.input.inputs(),
                3,
                vb.pp("fc"),
            )?))
        })
        .unwrap();
        assert_eq!(loaded.predict(&xs).unwrap(), expected);
        assert_eq!(loaded.describe(), "custom linear 2-3");
        let in_memory = Predictor::new(model, meta(), &Device::Cpu);
        assert_eq!(in_memory.predict(&xs).unwrap(), expected);

        let err = Predictor::load(dir.path(), &Device::Cpu).err().unwrap();
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(cause.contains("custom model"), "{cause}");
    }
}
