//! `rebatch`: regroup the rows of incoming batches into batches of a new
//! size (`tf.data`'s `rebatch(batch_size, drop_remainder)`), without
//! splitting into elements first.
//!
//! Resumable by replay ([`rows`](super::rows)): the partial batch is saved
//! as row ids.

use std::collections::HashMap;

use super::Pipeline;
use super::rows::{self, BatchRow, Grouper, Output};
use super::state::StateError;
use crate::batch::Batch;

impl<T: Send + 'static> Pipeline<Vec<T>> {
    /// Regroups the items of incoming `Vec`s into `Vec`s of `size` (the
    /// last of an epoch shorter, or dropped when `drop_remainder`):
    /// `unbatch().batch(size)` in one stage, which is `tf.data`'s `rebatch`.
    /// An epoch marker flushes the partial batch first.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<Vec<u32>> = Pipeline::from_vec(vec![vec![1, 2, 3], vec![4], vec![5, 6]])
    ///     .rebatch(4, false)
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(v, [vec![1, 2, 3, 4], vec![5, 6]]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn rebatch(self, size: usize, drop_remainder: bool) -> Pipeline<Vec<T>> {
        self.invalid_if(size == 0, "rebatch", || {
            "the batch size must be positive (0 given)".into()
        })
        .regroup("rebatch", rows::vec_rows, move || {
            Rebatch::new(size, drop_remainder, Ok)
        })
    }
}

impl Pipeline<Batch> {
    /// Regroups the rows of incoming parsed batches into batches of `size`
    /// rows (the last of an epoch shorter, or dropped when
    /// `drop_remainder`). Rows of one input batch are copied as one slice.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// use tfpipe::{Batch, Column, Values};
    /// let batch = |v: Vec<i64>| Batch {
    ///     num_rows: v.len(),
    ///     columns: vec![Column { name: "x".into(), values: Values::Int64(v), row_splits: vec![], inner_shape: vec![] }],
    /// };
    /// let out: Vec<Batch> = Pipeline::from_vec(vec![batch(vec![1, 2, 3]), batch(vec![4, 5])])
    ///     .rebatch(4, false)
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(out, [batch(vec![1, 2, 3, 4]), batch(vec![5])]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn rebatch(self, size: usize, drop_remainder: bool) -> Pipeline<Batch> {
        self.invalid_if(size == 0, "rebatch", || {
            "the batch size must be positive (0 given)".into()
        })
        .regroup("rebatch", rows::batch_rows, move || {
            Rebatch::new(size, drop_remainder, |rows: Vec<BatchRow>| {
                rows::gather("rebatch", &rows)
            })
        })
    }
}

/// A partial batch of rows, emitted when full.
pub(crate) struct Rebatch<R, O> {
    size: usize,
    drop_remainder: bool,
    rows: Vec<(u64, R)>,
    build: fn(Vec<R>) -> Output<O>,
}

impl<R, O> Rebatch<R, O> {
    pub(crate) fn new(size: usize, drop_remainder: bool, build: fn(Vec<R>) -> Output<O>) -> Self {
        Rebatch {
            size,
            drop_remainder,
            rows: Vec::with_capacity(size.min(1 << 16)),
            build,
        }
    }

    fn emit(&mut self) -> Output<O> {
        let rows = std::mem::take(&mut self.rows);
        (self.build)(rows.into_iter().map(|(_, r)| r).collect())
    }
}

impl<R: Send + 'static, O: Send + 'static> Grouper for Rebatch<R, O> {
    type Row = R;
    type Out = O;

    fn push(&mut self, id: u64, row: R) -> Option<Output<O>> {
        self.rows.push((id, row));
        (self.rows.len() >= self.size).then(|| self.emit())
    }

    fn flush_one(&mut self) -> Option<Output<O>> {
        if self.rows.is_empty() {
            return None;
        }
        if self.drop_remainder {
            self.rows.clear();
            return None;
        }
        Some(self.emit())
    }

    fn held(&self) -> Vec<u64> {
        self.rows.iter().map(|(id, _)| *id).collect()
    }

    fn save(&self) -> serde_json::Value {
        serde_json::json!(self.held())
    }

    fn restore(
        &mut self,
        saved: &serde_json::Value,
        rows: &mut HashMap<u64, R>,
    ) -> Result<(), StateError> {
        let ids: Vec<u64> = serde_json::from_value(saved.clone())?;
        self.rows = rows::take_rows("rebatch", &ids, rows)?;
        Ok(())
    }
}
