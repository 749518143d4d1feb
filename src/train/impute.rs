//! Missing inputs: an error by default, or, when asked ([`Impute`]),
//! filled and flagged by a missing-indicator column ([`Imputation`]).
//!
//! Invariants: an input can be missing only when its schema spec gives it
//! a default (as `tfpipe convert` does for a column with missing values),
//! and training never uses that default
//! ([`InputSpec::from_schema`](super::InputSpec::from_schema) drops it,
//! so a record that lacks the input fails to parse, naming its file,
//! record and feature). With an imputation, the data is parsed with a
//! marker as the default ([`Imputation::parse_schema`]: NaN for float32,
//! [`MISSING_INT64`] for int64), which becomes NaN in the model's float
//! buffer; the statistics skip it; [`batch_to_tensors`](super::batch_to_tensors)
//! fills it and appends one indicator column per imputed input (1.0 where
//! the value was missing) after all the inputs. The input spec carries the
//! imputation, so checkpoints record it and prediction, serving and
//! resuming apply the same.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::Standardize;
use crate::example::{DType, Layout, Schema, Value};

/// The int64 value that marks a missing imputed input (int64 has no NaN).
/// A present value equal to it reads as missing too; real data does not
/// hold `i64::MIN`.
pub const MISSING_INT64: i64 = i64::MIN;

/// What a missing input is filled with.
///
/// ```
/// use tfpipe::train::Impute;
/// assert_eq!("mean".parse::<Impute>(), Ok(Impute::Mean));
/// assert_eq!(Impute::Zero.to_string(), "zero");
/// assert!("median".parse::<Impute>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Impute {
    /// The input's mean (the statistics of the first training batch, which
    /// standardisation uses too): 0 once standardised.
    Mean,
    /// The value 0, standardised like any other value.
    Zero,
}

impl FromStr for Impute {
    type Err = String;

    fn from_str(text: &str) -> Result<Impute, String> {
        match text {
            "mean" => Ok(Impute::Mean),
            "zero" => Ok(Impute::Zero),
            other => Err(format!("{other:?}: expected mean or zero")),
        }
    }
}

impl fmt::Display for Impute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Impute::Mean => "mean",
            Impute::Zero => "zero",
        })
    }
}

/// The inputs that may be missing and how they are filled: one indicator
/// column each, after all the inputs, in this order.
///
/// ```
/// use tfpipe::Schema;
/// use tfpipe::train::{Impute, Imputation};
///
/// let schema = Schema::from_feature_texts(&["hp:int64=0", "mpg:float32"])?;
/// let imputation = Imputation { fill: Impute::Mean, features: vec!["hp".into()] };
/// let parsed = imputation.parse_schema(&schema);
/// assert_eq!(parsed.feature("hp").unwrap().default, Some(tfpipe::example::Value::Int64(vec![i64::MIN])));
/// assert_eq!(imputation.to_string(), "missing hp filled with its mean, with an indicator column");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Imputation {
    /// What a missing value becomes.
    pub fill: Impute,
    /// The imputed inputs (fixed-shape int64 or float32 features of the
    /// input spec), in input order.
    pub features: Vec<String>,
}

impl fmt::Display for Imputation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, columns) = match self.features.len() {
            1 => ("its", "an indicator column"),
            _ => ("each one's", "indicator columns"),
        };
        let value = match self.fill {
            Impute::Mean => format!("{what} mean"),
            Impute::Zero => "0".to_string(),
        };
        write!(
            f,
            "missing {} filled with {value}, with {columns}",
            self.features.join(", ")
        )
    }
}

impl Imputation {
    /// `schema` with the missing marker as the default of each imputed
    /// feature: what the data is parsed with, so that a missing value
    /// reaches the tensor step as a marker rather than an error.
    pub fn parse_schema(&self, schema: &Schema) -> Schema {
        let mut schema = schema.clone();
        for f in &mut schema.features {
            let Layout::Fixed(shape) = &f.layout else {
                continue;
            };
            if !self.features.contains(&f.name) {
                continue;
            }
            let n = shape.iter().product::<usize>();
            f.default = match f.dtype {
                DType::Float32 => Some(Value::Float32(vec![f32::NAN; n])),
                DType::Int64 => Some(Value::Int64(vec![MISSING_INT64; n])),
                _ => continue,
            };
        }
        schema
    }

    /// `data` (`[rows, inputs]`, `features` side by side in each row, a
    /// missing value NaN) with each imputed feature's missing values
    /// filled and its indicator appended to every row.
    pub(crate) fn apply(
        &self,
        data: &[f32],
        rows: usize,
        features: &[(String, usize)],
        standardize: &[Standardize],
    ) -> Vec<f32> {
        let inputs: usize = features.iter().map(|(_, w)| w).sum();
        // (offset, width, fill) of each imputed feature, in indicator order.
        let imputed: Vec<(usize, usize, f32)> = self
            .features
            .iter()
            .filter_map(|name| {
                let i = features.iter().position(|(n, _)| n == name)?;
                let offset = features[..i].iter().map(|(_, w)| w).sum();
                let fill = match self.fill {
                    Impute::Zero => 0.0,
                    Impute::Mean => standardize.get(i).map_or(0.0, |s| s.mean),
                };
                Some((offset, features[i].1, fill))
            })
            .collect();
        let mut out = Vec::with_capacity(rows * (inputs + self.features.len()));
        for row in data.chunks_exact(inputs.max(1)).take(rows) {
            let start = out.len();
            out.extend_from_slice(row);
            for &(offset, width, fill) in &imputed {
                let mut missing = false;
                for x in &mut out[start + offset..start + offset + width] {
                    if x.is_nan() {
                        *x = fill;
                        missing = true;
                    }
                }
                out.push(if missing { 1.0 } else { 0.0 });
            }
            // An imputed name not among the features still gets its column.
            out.resize(start + inputs + self.features.len(), 0.0);
        }
        out
    }
}

/// An int64 input value as a float for the model: the missing marker
/// becomes NaN.
pub(crate) fn int_value(x: i64) -> f32 {
    if x == MISSING_INT64 {
        f32::NAN
    } else {
        x as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_values_are_filled_and_flagged_in_their_own_column() {
        let features = vec![("a".to_string(), 1), ("b".to_string(), 2)];
        let stats = [
            Standardize {
                mean: 5.0,
                std: 1.0,
            },
            Standardize {
                mean: 7.0,
                std: 2.0,
            },
        ];
        let nan = f32::NAN;
        let data = [1.0, 2.0, 3.0, nan, nan, 4.0];
        let both = |fill| Imputation {
            fill,
            features: vec!["a".into(), "b".into()],
        };
        assert_eq!(
            both(Impute::Mean).apply(&data, 2, &features, &stats),
            vec![1.0, 2.0, 3.0, 0.0, 0.0, 5.0, 7.0, 4.0, 1.0, 1.0]
        );
        assert_eq!(
            both(Impute::Zero).apply(&data, 2, &features, &stats),
            vec![1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 4.0, 1.0, 1.0]
        );
    }

    #[test]
    fn the_int64_marker_reads_as_missing() {
        assert!(int_value(MISSING_INT64).is_nan());
        assert_eq!(int_value(-3), -3.0);
    }
}
