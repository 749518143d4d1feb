//! Batches to tensors: features as float32 `[batch, inputs]` (uint8 scaled to
//! [0,1]), labels as u32 class ids `[batch]`.
//!
//! A single float32 feature moves its `Vec` into the tensor (`Tensor::from_vec`
//! takes ownership on the CPU): no copy. Other dtypes need one conversion pass,
//! which writes straight into the tensor's buffer. Nothing else is copied.

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::TrainError;
use crate::batch::{Batch, Column, Values};
use crate::example::{DType, Layout, Schema};

/// Which columns feed the model, how wide each is, and the label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSpec {
    /// Feature columns in input order, with their values per example.
    pub features: Vec<(String, usize)>,
    /// The label column (int64 class ids in `0..classes`), if any.
    pub label: Option<String>,
    /// The number of classes: labels must be below it.
    pub classes: usize,
}

impl InputSpec {
    /// Every fixed-shape numeric feature of `schema` except the label feeds the
    /// model; the label is `schema.label`.
    pub fn from_schema(schema: &Schema, classes: usize) -> Result<InputSpec, TrainError> {
        let mut features = Vec::new();
        for f in &schema.features {
            if Some(&f.name) == schema.label.as_ref() {
                if f.dtype != DType::Int64
                    || !matches!(&f.layout, Layout::Fixed(s) if s.iter().product::<usize>() == 1)
                {
                    return Err(TrainError::Config(format!(
                        "label {:?} must be one int64 per example (e.g. --feature {}:int64)",
                        f.name, f.name
                    )));
                }
                continue;
            }
            match (&f.layout, f.dtype) {
                (Layout::Fixed(shape), DType::Int64 | DType::Float32 | DType::Uint8) => {
                    features.push((f.name.clone(), shape.iter().product()));
                }
                _ => {
                    return Err(TrainError::Config(format!(
                        "feature {:?} is not a fixed-shape number (the models take dense int64, float32 or uint8 features)",
                        f.name
                    )));
                }
            }
        }
        if let Some(label) = &schema.label {
            if schema.feature(label).is_none() {
                return Err(TrainError::Config(format!(
                    "label {label:?} is not one of the schema's features"
                )));
            }
        }
        if features.is_empty() {
            return Err(TrainError::Config(
                "no input features besides the label".into(),
            ));
        }
        Ok(InputSpec {
            features,
            label: schema.label.clone(),
            classes,
        })
    }

    /// The number of input values per example.
    pub fn inputs(&self) -> usize {
        self.features.iter().map(|(_, w)| w).sum()
    }
}

/// One batch as tensors on a device.
#[derive(Debug, Clone)]
pub struct BatchTensors {
    /// `[rows, inputs]` float32.
    pub features: Tensor,
    /// `[rows]` u32 class ids, when the spec has a label.
    pub labels: Option<Tensor>,
    /// The number of examples.
    pub rows: usize,
}

/// Converts `batch` (consumed, so its buffers can move into tensors) for the
/// model. `index` names the batch in errors.
pub fn batch_to_tensors(
    mut batch: Batch,
    spec: &InputSpec,
    index: u64,
    device: &Device,
) -> Result<BatchTensors, TrainError> {
    let rows = batch.num_rows;
    let bad = |reason: String| TrainError::Input {
        batch: index,
        reason,
    };
    let labels = match &spec.label {
        None => None,
        Some(name) => {
            let col = take_column(&mut batch, name)
                .ok_or_else(|| bad(format!("no label column {name:?}")))?;
            check_dense(&col, rows, 1).map_err(&bad)?;
            let Values::Int64(values) = &col.values else {
                return Err(bad(format!("label {name:?} is not int64")));
            };
            let mut ids = Vec::with_capacity(rows);
            for (row, &v) in values.iter().enumerate() {
                if v < 0 || v as u64 >= spec.classes as u64 {
                    return Err(bad(format!(
                        "row {row}: label {name:?} = {v} is outside 0..{}",
                        spec.classes
                    )));
                }
                ids.push(v as u32);
            }
            Some(
                Tensor::from_vec(ids, rows, &Device::Cpu)
                    .map_err(TrainError::candle("label tensor"))?,
            )
        }
    };
    let inputs = spec.inputs();
    let data: Vec<f32> = if let [(name, width)] = spec.features.as_slice() {
        let col = take_column(&mut batch, name)
            .ok_or_else(|| bad(format!("no feature column {name:?}")))?;
        check_dense(&col, rows, *width).map_err(&bad)?;
        match col.values {
            // The zero-copy case: the parser's buffer becomes the tensor's.
            Values::Float32(v) => v,
            other => {
                let mut out = Vec::with_capacity(rows * width);
                append_f32(&other, &mut out);
                out
            }
        }
    } else {
        // Several features: interleave them row by row into one buffer.
        let mut cols = Vec::with_capacity(spec.features.len());
        for (name, width) in &spec.features {
            let col = batch
                .column(name)
                .ok_or_else(|| bad(format!("no feature column {name:?}")))?;
            check_dense(col, rows, *width).map_err(&bad)?;
            cols.push((col, *width));
        }
        let mut out = Vec::with_capacity(rows * inputs);
        for row in 0..rows {
            for (col, width) in &cols {
                append_row_f32(&col.values, row * width, *width, &mut out);
            }
        }
        out
    };
    let features = Tensor::from_vec(data, (rows, inputs), &Device::Cpu)
        .map_err(TrainError::candle("feature tensor"))?;
    let (features, labels) = if device.is_cpu() {
        (features, labels)
    } else {
        let copy = TrainError::candle("host-to-device copy");
        (
            features.to_device(device).map_err(copy)?,
            match labels {
                Some(l) => Some(
                    l.to_device(device)
                        .map_err(TrainError::candle("host-to-device copy"))?,
                ),
                None => None,
            },
        )
    };
    Ok(BatchTensors {
        features,
        labels,
        rows,
    })
}

fn take_column(batch: &mut Batch, name: &str) -> Option<Column> {
    let i = batch.columns.iter().position(|c| c.name == name)?;
    Some(batch.columns.swap_remove(i))
}

fn check_dense(col: &Column, rows: usize, width: usize) -> Result<(), String> {
    if !col.row_splits.is_empty() {
        return Err(format!(
            "column {:?} is variable-length; the models need a fixed shape",
            col.name
        ));
    }
    if matches!(col.values, Values::Bytes { .. }) {
        return Err(format!(
            "column {:?} holds byte strings, not numbers",
            col.name
        ));
    }
    if col.values.len() != rows * width {
        return Err(format!(
            "column {:?} has {} values for {rows} rows; expected {width} per row",
            col.name,
            col.values.len()
        ));
    }
    Ok(())
}

fn append_f32(values: &Values, out: &mut Vec<f32>) {
    append_row_f32(values, 0, values.len(), out)
}

fn append_row_f32(values: &Values, start: usize, len: usize, out: &mut Vec<f32>) {
    match values {
        Values::Float32(v) => out.extend_from_slice(&v[start..start + len]),
        // uint8 pixels to [0, 1], as Keras' Rescaling(1/255) does.
        Values::Uint8(v) => out.extend(v[start..start + len].iter().map(|&b| f32::from(b) / 255.0)),
        Values::Int64(v) => out.extend(v[start..start + len].iter().map(|&x| x as f32)),
        // Refused by check_dense before we get here.
        Values::Bytes { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, values: Values, width: usize) -> Column {
        Column {
            name: name.into(),
            values,
            row_splits: vec![],
            inner_shape: vec![width],
        }
    }

    fn spec(features: &[(&str, usize)]) -> InputSpec {
        InputSpec {
            features: features.iter().map(|(n, w)| (n.to_string(), *w)).collect(),
            label: Some("label".into()),
            classes: 3,
        }
    }

    #[test]
    fn uint8_scaled_and_labels_as_ids() {
        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("image", Values::Uint8(vec![0, 255, 51, 102]), 2),
                col("label", Values::Int64(vec![2, 0]), 1),
            ],
        };
        let t = batch_to_tensors(batch, &spec(&[("image", 2)]), 0, &Device::Cpu).unwrap();
        let x: Vec<Vec<f32>> = t.features.to_vec2().unwrap();
        assert_eq!(x, vec![vec![0.0, 1.0], vec![0.2, 0.4]]);
        assert_eq!(t.labels.unwrap().to_vec1::<u32>().unwrap(), vec![2, 0]);
    }

    #[test]
    fn float32_moves_without_copy_and_features_interleave() {
        let data = vec![1.0f32, 2.0, 3.0, 4.0];
        let ptr = data.as_ptr();
        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("x", Values::Float32(data), 2),
                col("label", Values::Int64(vec![1, 1]), 1),
            ],
        };
        let t = batch_to_tensors(batch, &spec(&[("x", 2)]), 0, &Device::Cpu).unwrap();
        let (storage, _) = t.features.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else {
            panic!("not cpu")
        };
        assert_eq!(cpu.as_slice::<f32>().unwrap().as_ptr(), ptr);
        drop(storage);

        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("a", Values::Float32(vec![1.0, 2.0]), 1),
                col("b", Values::Int64(vec![10, 20, 30, 40]), 2),
                col("label", Values::Int64(vec![0, 1]), 1),
            ],
        };
        let t = batch_to_tensors(batch, &spec(&[("a", 1), ("b", 2)]), 0, &Device::Cpu).unwrap();
        let x: Vec<Vec<f32>> = t.features.to_vec2().unwrap();
        assert_eq!(x, vec![vec![1.0, 10.0, 20.0], vec![2.0, 30.0, 40.0]]);
    }

    #[test]
    fn bad_batches_name_the_problem() {
        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("x", Values::Float32(vec![1.0; 4]), 2),
                col("label", Values::Int64(vec![1, 7]), 1),
            ],
        };
        let err = batch_to_tensors(batch, &spec(&[("x", 2)]), 5, &Device::Cpu).unwrap_err();
        assert_eq!(
            err.to_string(),
            "batch 5: row 1: label \"label\" = 7 is outside 0..3"
        );
        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("x", Values::Float32(vec![1.0; 3]), 2),
                col("label", Values::Int64(vec![1, 1]), 1),
            ],
        };
        let err = batch_to_tensors(batch, &spec(&[("x", 2)]), 0, &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("has 3 values for 2 rows"), "{err}");
    }
}
