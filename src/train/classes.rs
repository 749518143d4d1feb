//! The number of classes of an int64 label that nothing else gives: its
//! values counted in one pass over the data ([`IntLabels`]), taken as class
//! ids `0..=max` only when they look like class ids.
//!
//! Invariant: the count is never a silent default. Values that look like a
//! quantity rather than class ids (negative, more than
//! [`MAX_INFERRED_CLASSES`] distinct, or fewer than half of the ids below
//! the largest) are refused with a [`TrainError::LabelValues`] that says
//! why, and a front end names both ways out (give the count, or train a
//! regression).

use std::collections::HashSet;
use std::fmt;

use crate::Batch;
use crate::batch::Values;
use crate::pipeline::{Parallelism, Pipeline, PipelineIter};
use crate::tfrecord::ReaderOptions;

use super::TrainError;
use super::prefetch::BoxError;

/// The most classes taken from the data alone: more distinct values are
/// more often a quantity (a count, a measurement, a year) than class ids,
/// and a larger class count must be given.
pub const MAX_INFERRED_CLASSES: usize = 100;

/// What one pass over the data found in an int64 label.
///
/// ```
/// use tfpipe::train::IntLabels;
///
/// let digits = IntLabels { label: "digit".into(), values: 8000, min: 0, max: 9, distinct: 10 };
/// assert_eq!(digits.classes()?, 10);
/// // sklearn's diabetes target: a quantity, not 347 classes.
/// let target = IntLabels { label: "target".into(), values: 442, min: 25, max: 346, distinct: 101 };
/// let err = target.classes().unwrap_err().to_string();
/// assert!(err.contains("more than 100 distinct values from 25 to 346"), "{err}");
/// # Ok::<(), tfpipe::train::TrainError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntLabels {
    /// The label feature.
    pub label: String,
    /// The label values seen (records without the label count none).
    pub values: u64,
    /// The smallest value (0 when there are none).
    pub min: i64,
    /// The largest value (0 when there are none).
    pub max: i64,
    /// Distinct values, counted up to `MAX_INFERRED_CLASSES + 1`.
    pub distinct: usize,
}

impl IntLabels {
    /// Counts the int64 label `label` in `files` in one pass (read with
    /// `reader`; a label among `partition_features` comes from the files'
    /// `key=value` directories, as in training). A record without the
    /// label is passed over (training decides what becomes of it); a bad
    /// record fails, naming it.
    pub fn count(
        files: &[String],
        reader: ReaderOptions,
        label: &str,
        partition_features: &[String],
    ) -> Result<IntLabels, BoxError> {
        let mut counted = IntLabels {
            label: label.to_string(),
            values: 0,
            min: 0,
            max: 0,
            distinct: 0,
        };
        let mut seen = HashSet::new();
        for batch in label_batches(files, reader, label, "int64", partition_features)? {
            let batch = batch?;
            if let Some(Values::Int64(values)) = batch.column(label).map(|c| &c.values) {
                counted.add(values, &mut seen);
            }
        }
        Ok(counted)
    }

    fn add(&mut self, values: &[i64], seen: &mut HashSet<i64>) {
        for &x in values {
            if self.values == 0 {
                (self.min, self.max) = (x, x);
            }
            self.values += 1;
            self.min = self.min.min(x);
            self.max = self.max.max(x);
            // Past the cap the exact count changes nothing.
            if seen.len() <= MAX_INFERRED_CLASSES {
                seen.insert(x);
            }
        }
        self.distinct = seen.len();
    }

    /// The number of classes these values are ids of, `max + 1`; refused
    /// when there are none, or when they look like a quantity: a negative
    /// value, more than [`MAX_INFERRED_CLASSES`] distinct ones, or fewer
    /// than half of the ids `0..=max` present.
    pub fn classes(&self) -> Result<usize, TrainError> {
        let refuse = |why: String| TrainError::LabelValues {
            label: self.label.clone(),
            found: self.to_string(),
            why,
        };
        if self.values == 0 {
            return Err(refuse("the number of classes cannot be counted".into()));
        }
        if self.min < 0 {
            return Err(refuse("class ids are 0 or more".into()));
        }
        if self.distinct > MAX_INFERRED_CLASSES {
            return Err(refuse(format!(
                "that looks like a quantity rather than class ids (more than {MAX_INFERRED_CLASSES} classes are not taken from the data alone)"
            )));
        }
        let classes = usize::try_from(self.max)
            .ok()
            .and_then(|m| m.checked_add(1))
            .unwrap_or(usize::MAX);
        if self.distinct.saturating_mul(2) < classes {
            return Err(refuse(format!(
                "that looks like a quantity rather than class ids (fewer than half of the ids 0 to {} occur)",
                self.max
            )));
        }
        Ok(classes)
    }
}

impl fmt::Display for IntLabels {
    /// `7 distinct values from 3 to 9 in 1599 records`, for messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.values == 0 {
            return f.write_str("no values in the data");
        }
        let distinct = if self.distinct > MAX_INFERRED_CLASSES {
            format!("more than {MAX_INFERRED_CLASSES}")
        } else {
            self.distinct.to_string()
        };
        write!(
            f,
            "{distinct} distinct values from {} to {} in {} records",
            self.min, self.max, self.values
        )
    }
}

/// The label column alone of every record in `files`, for a counting
/// pass: variable-length, so a record without the label parses to no value
/// (a partition feature is a scalar taken from the path).
pub(crate) fn label_batches(
    files: &[String],
    reader: ReaderOptions,
    label: &str,
    dtype: &str,
    partition_features: &[String],
) -> Result<PipelineIter<Batch>, BoxError> {
    let batches = Pipeline::tfrecord_files(files)?
        .reader_options(reader)
        .records()
        .batch(1024);
    let parsed = if partition_features.iter().any(|f| f == label) {
        let schema = crate::Schema::from_feature_texts(&[format!("{label}:{dtype}")])?;
        batches.parse_batches_partitioned(schema, &[label], Parallelism::Auto)
    } else {
        let schema = crate::Schema::from_feature_texts(&[format!("{label}:{dtype}:var")])?;
        batches.parse_batches(schema, Parallelism::Auto)
    };
    Ok(parsed.start()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(values: &[i64]) -> IntLabels {
        let mut labels = IntLabels {
            label: "y".into(),
            values: 0,
            min: 0,
            max: 0,
            distinct: 0,
        };
        labels.add(values, &mut HashSet::new());
        labels
    }

    #[test]
    fn class_ids_give_their_count_and_quantities_are_refused() {
        assert_eq!(counted(&[0, 1, 1, 0]).classes().unwrap(), 2);
        assert_eq!(counted(&[3, 4, 5, 6, 7, 8, 9]).classes().unwrap(), 10);
        assert_eq!(counted(&[1, 2, 3]).classes().unwrap(), 4); // 1-based ids
        let all: Vec<i64> = (0..100).collect();
        assert_eq!(counted(&all).classes().unwrap(), 100);
        for (values, why) in [
            (vec![], "no values in the data: the number"),
            (vec![-1, 0, 1], "class ids are 0 or more"),
            ((0..101).collect(), "more than 100 classes"),
            (
                vec![1990, 2000, 2020],
                "fewer than half of the ids 0 to 2020",
            ),
        ] {
            let err = counted(&values).classes().unwrap_err().to_string();
            assert!(err.contains(why), "{values:?}: {err}");
            assert!(err.starts_with("label \"y\": "), "{err}");
        }
    }

    #[test]
    fn extremes_do_not_overflow() {
        let err = counted(&[0, i64::MAX]).classes().unwrap_err().to_string();
        assert!(err.contains("fewer than half"), "{err}");
        assert!(counted(&[i64::MIN]).classes().is_err());
    }
}
