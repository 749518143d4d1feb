//! `bucket_by_sequence_length`: batch rows of similar length together, so
//! that padding each batch costs little (`tf.data`'s
//! `Dataset.bucket_by_sequence_length`).
//!
//! Bucket `i` holds rows whose length `l` is in `[boundaries[i - 1],
//! boundaries[i])` (the first from 0, the last without an upper bound), and
//! emits a padded batch when it has `batch_sizes[i]` rows. At the end of an
//! epoch (tfpipe flushes at epoch markers; `tf.data` only at the end of its
//! input) the partial buckets are emitted in bucket order, or dropped with
//! `drop_remainder`, as `tf.data`'s `group_by_window` does.
//!
//! Resumable by replay ([`rows`](super::rows)): the buckets are saved as row
//! ids. A bucket that fills rarely keeps its oldest row, and so the replay
//! on restore reaches back to it.

use std::collections::HashMap;
use std::sync::Arc;

use super::padded_batch::{PaddedShape, Padding};
use super::rows::{self, BatchRow, Grouper, Output};
use super::state::StateError;
use super::{Pipeline, PipelineError};
use crate::batch::{Batch, Column};

/// The settings of [`Pipeline::bucket_by_sequence_length`].
///
/// ```
/// use tfpipe::pipeline::BucketOptions;
/// let options = BucketOptions::new("tokens", vec![16, 32], vec![64, 32, 16])
///     .pad_to_bucket_boundary(true);
/// assert_eq!(options.bucket_of(15), 0);
/// assert_eq!(options.bucket_of(16), 1);
/// assert_eq!(options.bucket_of(99), 2);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BucketOptions {
    feature: String,
    length_fn: Option<LengthFn>,
    boundaries: Vec<usize>,
    batch_sizes: Vec<usize>,
    padding: Padding,
    pad_to_bucket_boundary: bool,
    drop_remainder: bool,
    no_padding: bool,
}

impl BucketOptions {
    /// Buckets by the length of `feature` (its values per row, or steps per
    /// row for a sequence): `boundaries` strictly increasing and positive,
    /// and one batch size per bucket, `boundaries.len() + 1` of them.
    pub fn new(
        feature: impl Into<String>,
        boundaries: Vec<usize>,
        batch_sizes: Vec<usize>,
    ) -> Self {
        BucketOptions {
            feature: feature.into(),
            length_fn: None,
            boundaries,
            batch_sizes,
            padding: Padding::new(),
            pad_to_bucket_boundary: false,
            drop_remainder: false,
            no_padding: false,
        }
    }

    /// Measures each row with `f(batch, row)` (`row` indexes `batch`'s rows)
    /// instead of the length of the feature: `tf.data`'s
    /// `element_length_func`. Padding still pads every ragged column. By
    /// default the feature's length.
    ///
    /// ```
    /// use tfpipe::pipeline::{BucketOptions, Pipeline};
    /// use tfpipe::{Batch, Column, Values};
    /// let row = |v: Vec<i64>| Batch {
    ///     num_rows: 1,
    ///     columns: vec![Column { name: "t".into(), row_splits: vec![vec![0, v.len()]], values: Values::Int64(v), inner_shape: vec![] }],
    /// };
    /// // Bucket by the count of even values.
    /// let even = |b: &Batch, r: usize| {
    ///     let t = b.column("t").unwrap();
    ///     let (a, z) = (t.row_splits[0][r], t.row_splits[0][r + 1]);
    ///     t.as_i64().unwrap()[a..z].iter().filter(|x| *x % 2 == 0).count()
    /// };
    /// let options = BucketOptions::new("t", vec![2], vec![2, 2]).length_fn(even);
    /// let out: Vec<Batch> = Pipeline::from_vec(vec![row(vec![2, 4]), row(vec![1, 3, 5]), row(vec![6, 8, 1]), row(vec![7])])
    ///     .bucket_by_sequence_length(options)
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(out[0].columns[0].as_i64(), Some(&[2, 4, 0, 6, 8, 1][..]));
    /// assert_eq!(out[1].columns[0].as_i64(), Some(&[1, 3, 5, 7, 0, 0][..]));
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn length_fn(mut self, f: impl Fn(&Batch, usize) -> usize + Send + Sync + 'static) -> Self {
        self.length_fn = Some(LengthFn(Arc::new(f)));
        self
    }

    /// How each batch is padded (values, lengths or mask). By default
    /// [`Padding::new`]: every ragged column to the batch's longest row.
    pub fn padding(mut self, padding: Padding) -> Self {
        self.padding = padding;
        self
    }

    /// Pads bucket `i`'s ragged columns to `boundaries[i] - 1` instead of the
    /// batch's longest row, both levels of a var-length sequence (the steps
    /// and each step's values), as `tf.data` pads every unknown dimension; a
    /// row as long as the last boundary (or a longer step) is then an
    /// error, as in `tf.data`. By default off.
    pub fn pad_to_bucket_boundary(mut self, on: bool) -> Self {
        self.pad_to_bucket_boundary = on;
        self
    }

    /// Drops each epoch's partial buckets instead of emitting them. By default off.
    pub fn drop_remainder(mut self, on: bool) -> Self {
        self.drop_remainder = on;
        self
    }

    /// Emits each bucket's rows as they are, ragged columns unpadded
    /// (`tf.data`'s `no_padding=True`), for a consumer that pads per batch
    /// itself. By default off.
    pub fn no_padding(mut self, on: bool) -> Self {
        self.no_padding = on;
        self
    }

    /// The bucket a row of length `length` goes to.
    pub fn bucket_of(&self, length: usize) -> usize {
        self.boundaries.partition_point(|&b| b <= length)
    }

    /// Fails (as [`Pipeline::start`] would) when the settings make no sense.
    pub fn check(&self) -> Result<(), PipelineError> {
        PipelineError::config_check(STAGE, self.problem())
    }

    /// Why these settings make no sense, if they do not.
    fn problem(&self) -> Option<String> {
        let b = &self.boundaries;
        if self.batch_sizes.len() != b.len() + 1 {
            return Some(format!(
                "{} boundaries need {} batch sizes, got {}",
                b.len(),
                b.len() + 1,
                self.batch_sizes.len()
            ));
        }
        if b.first() == Some(&0) || b.windows(2).any(|w| w[0] >= w[1]) {
            return Some(format!(
                "the boundaries {b:?} must be positive and strictly increasing"
            ));
        }
        if self.batch_sizes.contains(&0) {
            return Some(format!(
                "the batch sizes {:?} must be positive",
                self.batch_sizes
            ));
        }
        if self.pad_to_bucket_boundary && b.is_empty() {
            return Some("padding to the bucket boundary needs at least one boundary".into());
        }
        None
    }
}

/// `f(batch, row)`: the length of row `row` of `batch`.
type RowLengthFn = dyn Fn(&Batch, usize) -> usize + Send + Sync;

/// A user's row length function (`tf.data`'s `element_length_func`).
#[derive(Clone)]
struct LengthFn(Arc<RowLengthFn>);

impl std::fmt::Debug for LengthFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LengthFn(..)")
    }
}

impl PartialEq for LengthFn {
    /// The same function (the same `Arc`).
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The length of `feature` in one row: values (or steps) at the first
/// ragged level; the first dimension of a dense column.
pub(crate) fn row_length(column: &Column, row: usize) -> usize {
    match column.row_splits.first() {
        Some(splits) => splits[row + 1] - splits[row],
        None => column.inner_shape.first().copied().unwrap_or(1),
    }
}

/// The column `name` of `row`'s batch, or the error naming it.
pub(crate) fn column_of<'a>(
    stage: &str,
    row: &'a BatchRow,
    name: &str,
) -> Result<&'a Column, PipelineError> {
    row.batch
        .column(name)
        .ok_or_else(|| PipelineError::Element {
            stage: stage.to_string(),
            message: format!("no feature {name:?} in the parsed batch"),
        })
}

impl Pipeline<Batch> {
    /// Splits incoming parsed batches into rows and batches rows of similar
    /// `feature` length together, padded (`tf.data`'s
    /// `bucket_by_sequence_length`; see [`BucketOptions`] and the module
    /// doc). A row without the feature, or too long for the last boundary
    /// under `pad_to_bucket_boundary`, is an `Err` item.
    ///
    /// ```
    /// use tfpipe::pipeline::{BucketOptions, Pipeline};
    /// use tfpipe::{Batch, Column, Values};
    /// let row = |n: usize| Batch {
    ///     num_rows: 1,
    ///     columns: vec![Column { name: "t".into(), values: Values::Int64(vec![7; n]), row_splits: vec![vec![0, n]], inner_shape: vec![] }],
    /// };
    /// let rows = vec![row(1), row(5), row(2), row(6), row(3)];
    /// let out: Vec<Batch> = Pipeline::from_vec(rows)
    ///     .bucket_by_sequence_length(BucketOptions::new("t", vec![4], vec![2, 2]))
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// let shapes: Vec<_> = out.iter().map(|b| (b.num_rows, b.columns[0].inner_shape.clone())).collect();
    /// assert_eq!(shapes, [(2, vec![2]), (2, vec![6]), (1, vec![3])]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn bucket_by_sequence_length(self, options: BucketOptions) -> Pipeline<Batch> {
        let problem = options.problem();
        let pipeline = match problem {
            Some(p) => self.invalid("bucket_by_sequence_length", || p),
            None => self,
        };
        pipeline.regroup(STAGE, rows::batch_rows, move || Buckets {
            buckets: vec![Vec::new(); options.batch_sizes.len()],
            options: options.clone(),
        })
    }
}

const STAGE: &str = "bucket_by_sequence_length";

/// The partial buckets.
struct Buckets {
    options: BucketOptions,
    buckets: Vec<Vec<(u64, BatchRow)>>,
}

impl Buckets {
    /// Bucket `i` as one padded batch.
    fn emit(&mut self, i: usize) -> Output<Batch> {
        let rows: Vec<BatchRow> = std::mem::take(&mut self.buckets[i])
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        let batch = rows::gather(STAGE, &rows)?;
        if self.options.no_padding {
            return Ok(batch);
        }
        let mut padding = self.options.padding.clone();
        if self.options.pad_to_bucket_boundary {
            let width = PaddedShape::Fixed(self.options.boundaries[i] - 1);
            padding = padding.shape(width).step_shape(width);
        }
        padding
            .apply(&batch)
            .map_err(|error| PipelineError::Element {
                stage: STAGE.to_string(),
                message: error.to_string(),
            })
    }

    fn place(&self, row: &BatchRow) -> Result<usize, PipelineError> {
        let (length, measured) = match &self.options.length_fn {
            Some(f) => (
                (f.0)(&row.batch, row.row),
                "the length function gives".to_string(),
            ),
            None => {
                let column = column_of(STAGE, row, &self.options.feature)?;
                let what = format!("feature {:?} has length", self.options.feature);
                (row_length(column, row.row), what)
            }
        };
        let bucket = self.options.bucket_of(length);
        if self.options.pad_to_bucket_boundary && bucket == self.options.boundaries.len() {
            return Err(PipelineError::Element {
                stage: STAGE.to_string(),
                message: format!(
                    "{measured} {length}: padding to the bucket boundary needs lengths below the last boundary {}",
                    self.options.boundaries.last().copied().unwrap_or(0)
                ),
            });
        }
        Ok(bucket)
    }
}

impl Grouper for Buckets {
    type Row = BatchRow;
    type Out = Batch;

    fn push(&mut self, id: u64, row: BatchRow) -> Option<Output<Batch>> {
        let bucket = match self.place(&row) {
            Ok(bucket) => bucket,
            Err(error) => return Some(Err(error)),
        };
        self.buckets[bucket].push((id, row));
        (self.buckets[bucket].len() >= self.options.batch_sizes[bucket]).then(|| self.emit(bucket))
    }

    fn flush_one(&mut self) -> Option<Output<Batch>> {
        if self.options.drop_remainder {
            self.buckets.iter_mut().for_each(Vec::clear);
            return None;
        }
        let i = self.buckets.iter().position(|b| !b.is_empty())?;
        Some(self.emit(i))
    }

    fn held(&self) -> Vec<u64> {
        self.buckets.iter().flatten().map(|(id, _)| *id).collect()
    }

    fn save(&self) -> serde_json::Value {
        let ids: Vec<Vec<u64>> = self
            .buckets
            .iter()
            .map(|b| b.iter().map(|(id, _)| *id).collect())
            .collect();
        serde_json::json!(ids)
    }

    fn restore(
        &mut self,
        saved: &serde_json::Value,
        rows: &mut HashMap<u64, BatchRow>,
    ) -> Result<(), StateError> {
        let ids: Vec<Vec<u64>> = serde_json::from_value(saved.clone())?;
        if ids.len() != self.buckets.len() {
            return Err(StateError::mismatch(
                STAGE,
                format!(
                    "{} buckets saved, {} configured",
                    ids.len(),
                    self.buckets.len()
                ),
            ));
        }
        for (bucket, ids) in self.buckets.iter_mut().zip(&ids) {
            *bucket = rows::take_rows(STAGE, ids, rows)?;
        }
        Ok(())
    }
}
