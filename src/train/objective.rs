//! What training minimises and reports: the task's default loss
//! ([`task_loss`], which [`Model::loss`](super::Model::loss) uses unless a
//! model overrides it), correct-prediction counts, and the sums behind an
//! [`Evaluation`] (loss, accuracy; MAE and RMSE for regression).
//!
//! Invariant: every mean is per example, weighting each batch by its rows,
//! so a short last batch counts for what it holds.

use candle_core::{D, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::TrainError;
use super::model::{Model, Task};
use super::prefetch::BatchStream;
use super::tensor::{InputSpec, batch_to_tensors};

/// Loss and the task's metrics over a data set (or an epoch of training).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Mean loss per example: the model's [`Model::loss`](super::Model::loss) (by default cross-entropy for classification, squared error for regression).
    pub loss: f64,
    /// Fraction classified correctly (classification).
    pub accuracy: Option<f64>,
    /// Mean absolute error (regression).
    pub mae: Option<f64>,
    /// Root mean squared error (regression).
    pub rmse: Option<f64>,
    /// Examples seen.
    pub examples: u64,
}

impl Evaluation {
    /// The task's headline metric: accuracy or MAE.
    pub fn metric(&self) -> f64 {
        self.accuracy.or(self.mae).unwrap_or(f64::NAN)
    }
}

/// Sums behind an [`Evaluation`], one batch at a time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Totals {
    task: Task,
    loss: f64,
    correct: u64,
    abs_err: f64,
    sq_err: f64,
    examples: u64,
}

impl Totals {
    pub(crate) fn new(task: Task) -> Totals {
        Totals {
            task,
            loss: 0.0,
            correct: 0,
            abs_err: 0.0,
            sq_err: 0.0,
            examples: 0,
        }
    }

    /// Adds a batch: its mean `loss`, the model's `outputs`, the `labels`.
    pub(crate) fn add(
        &mut self,
        loss: f32,
        outputs: &Tensor,
        labels: &Tensor,
        rows: usize,
    ) -> Result<(), TrainError> {
        self.loss += f64::from(loss) * rows as f64;
        self.examples += rows as u64;
        match self.task {
            Task::Classification { .. } => self.correct += correct(outputs, labels)?,
            Task::Regression => {
                let err = TrainError::candle("regression metrics");
                let diff = regression_output(outputs, rows)
                    .and_then(|o| o.sub(labels))
                    .map_err(err)?;
                let abs = diff
                    .abs()
                    .and_then(|d| d.sum_all())
                    .and_then(|d| d.to_scalar::<f32>());
                let sq = diff
                    .sqr()
                    .and_then(|d| d.sum_all())
                    .and_then(|d| d.to_scalar::<f32>());
                self.abs_err += f64::from(abs.map_err(TrainError::candle("regression metrics"))?);
                self.sq_err += f64::from(sq.map_err(TrainError::candle("regression metrics"))?);
            }
        }
        Ok(())
    }

    pub(crate) fn evaluation(&self) -> Evaluation {
        let n = self.examples as f64;
        let mean = |x: f64| if self.examples == 0 { f64::NAN } else { x / n };
        let (accuracy, mae, rmse) = match self.task {
            Task::Classification { .. } => (Some(mean(self.correct as f64)), None, None),
            Task::Regression => (
                None,
                Some(mean(self.abs_err)),
                Some(mean(self.sq_err).sqrt()),
            ),
        };
        Evaluation {
            loss: mean(self.loss),
            accuracy,
            mae,
            rmse,
            examples: self.examples,
        }
    }
}

/// A regression model's outputs as `[rows]`.
fn regression_output(outputs: &Tensor, rows: usize) -> candle_core::Result<Tensor> {
    if outputs.dims() == [rows] {
        Ok(outputs.clone())
    } else {
        outputs.reshape(rows)
    }
}

/// The task's loss: softmax cross-entropy on logits, or mean squared error.
pub(crate) fn task_loss(
    task: Task,
    outputs: &Tensor,
    labels: &Tensor,
) -> candle_core::Result<Tensor> {
    match task {
        Task::Classification { .. } => super::ops::softmax_cross_entropy(outputs, labels),
        Task::Regression => {
            let rows = labels.dim(0)?;
            candle_nn::loss::mse(&regression_output(outputs, rows)?, labels)
        }
    }
}

/// The number of rows whose arg-max logit is the label.
pub(crate) fn correct(logits: &Tensor, labels: &Tensor) -> Result<u64, TrainError> {
    let err = TrainError::candle("counting correct predictions");
    let hits = logits
        .argmax(D::Minus1)
        .and_then(|p| p.eq(labels))
        .and_then(|h| h.to_dtype(candle_core::DType::U32))
        .and_then(|h| h.sum_all())
        .and_then(|s| s.to_scalar::<u32>())
        .map_err(err)?;
    Ok(u64::from(hits))
}

/// Loss and metrics of `model` over `stream`.
pub(crate) fn evaluate(
    model: &dyn Model,
    stream: &mut dyn BatchStream,
    input: &InputSpec,
    device: &Device,
) -> Result<Evaluation, TrainError> {
    let mut totals = Totals::new(input.task);
    let mut index = 0u64;
    while let Some(batch) = stream.next_batch() {
        let tensors = batch_to_tensors(batch.map_err(TrainError::data)?, input, index, device)?;
        index += 1;
        let labels = tensors.labels.as_ref().ok_or_else(|| TrainError::Input {
            batch: index - 1,
            reason: "no labels: evaluation needs the label column".into(),
        })?;
        let err = || TrainError::candle("evaluation");
        let outputs = model.forward_t(&tensors, false).map_err(err())?;
        let loss = model
            .loss(&outputs, labels)
            .and_then(|l| l.to_scalar::<f32>())
            .map_err(err())?;
        totals.add(loss, &outputs, labels, tensors.rows)?;
    }
    Ok(totals.evaluation())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(values: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_slice(values, shape, &Device::Cpu).unwrap()
    }

    fn ids(values: &[u32]) -> Tensor {
        Tensor::from_slice(values, values.len(), &Device::Cpu).unwrap()
    }

    #[test]
    fn the_default_losses_are_cross_entropy_and_mean_squared_error() {
        let two_classes = Task::Classification { classes: 2 };
        let even = task_loss(two_classes, &tensor(&[0.0, 0.0], &[1, 2]), &ids(&[0])).unwrap();
        assert!((even.to_scalar::<f32>().unwrap() - std::f32::consts::LN_2).abs() < 1e-6);
        // `[rows, 1]` outputs are taken as `[rows]`.
        let outputs = tensor(&[1.0, 3.0], &[2, 1]);
        let mse = task_loss(Task::Regression, &outputs, &tensor(&[0.0, 0.0], &[2])).unwrap();
        assert_eq!(mse.to_scalar::<f32>().unwrap(), 5.0);
    }

    #[test]
    fn correct_counts_rows_whose_largest_logit_is_the_label() {
        let logits = tensor(&[2.0, 1.0, 0.0, 5.0, 3.0, 1.0], &[3, 2]);
        assert_eq!(correct(&logits, &ids(&[0, 0, 0])).unwrap(), 2);
    }

    #[test]
    fn totals_weight_each_batch_by_its_rows() {
        let mut totals = Totals::new(Task::Classification { classes: 2 });
        assert!(totals.evaluation().loss.is_nan(), "no examples: no mean");
        totals
            .add(1.0, &tensor(&[1.0, 0.0], &[1, 2]), &ids(&[0]), 1)
            .unwrap();
        let logits = tensor(&[0.0, 1.0, 0.0, 1.0, 1.0, 0.0], &[3, 2]);
        totals.add(4.0, &logits, &ids(&[1, 0, 1]), 3).unwrap();
        let e = totals.evaluation();
        assert_eq!((e.loss, e.accuracy, e.examples), (3.25, Some(0.5), 4));

        let mut totals = Totals::new(Task::Regression);
        let outputs = tensor(&[1.0, -2.0], &[2]);
        totals
            .add(0.0, &outputs, &tensor(&[0.0, 0.0], &[2]), 2)
            .unwrap();
        let e = totals.evaluation();
        assert_eq!((e.mae, e.accuracy), (Some(1.5), None));
        assert!((e.rmse.unwrap() - 2.5f64.sqrt()).abs() < 1e-12);
        assert_eq!(e.metric(), 1.5);
    }
}
