//! `rebatch`: regroup the rows of incoming batches into batches of a new
//! size, or of sizes used in turn (`tf.data`'s `rebatch(batch_size,
//! drop_remainder)`, whose `batch_size` may be a list), without splitting
//! into elements first.
//!
//! Resumable by replay ([`rows`](super::rows)): the partial batch is saved
//! as row ids (with the turn in the list of sizes, when there are several).
//! Each epoch starts again at the first size.

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
        self.rebatch_sizes(&[size], drop_remainder)
    }

    /// [`rebatch`](Self::rebatch) to `sizes` in turn (`tf.data`'s
    /// `rebatch` with a list of sizes, cycled through), starting again at
    /// the first size each epoch.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<Vec<u32>> = Pipeline::from_vec(vec![vec![1, 2, 3], vec![4, 5, 6, 7]])
    ///     .rebatch_sizes(&[1, 2], false)
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(v, [vec![1], vec![2, 3], vec![4], vec![5, 6], vec![7]]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn rebatch_sizes(self, sizes: &[usize], drop_remainder: bool) -> Pipeline<Vec<T>> {
        let sizes = sizes.to_vec();
        self.invalid_if(bad_sizes(&sizes), "rebatch", || sizes_problem(&sizes))
            .regroup("rebatch", rows::vec_rows, move || {
                Rebatch::new(sizes.clone(), drop_remainder, Ok)
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
        self.rebatch_sizes(&[size], drop_remainder)
    }

    /// [`rebatch`](Self::rebatch) to `sizes` in turn (`tf.data`'s
    /// `rebatch` with a list of sizes, cycled through), starting again at
    /// the first size each epoch.
    pub fn rebatch_sizes(self, sizes: &[usize], drop_remainder: bool) -> Pipeline<Batch> {
        let sizes = sizes.to_vec();
        self.invalid_if(bad_sizes(&sizes), "rebatch", || sizes_problem(&sizes))
            .regroup("rebatch", rows::batch_rows, move || {
                Rebatch::new(sizes.clone(), drop_remainder, |rows: Vec<BatchRow>| {
                    rows::gather("rebatch", &rows)
                })
            })
    }
}

fn bad_sizes(sizes: &[usize]) -> bool {
    sizes.is_empty() || sizes.contains(&0)
}

fn sizes_problem(sizes: &[usize]) -> String {
    format!("the batch sizes {sizes:?} must be positive, at least one")
}

/// A partial batch of rows, emitted when full.
pub(crate) struct Rebatch<R, O> {
    /// The sizes, used in turn; never empty (checked before start).
    sizes: Vec<usize>,
    /// The turn of the batch being filled: its size is `sizes[turn]`.
    turn: usize,
    drop_remainder: bool,
    rows: Vec<(u64, R)>,
    build: fn(Vec<R>) -> Output<O>,
}

/// A rebatch's saved state: the partial batch's row ids, and the turn when
/// there are several sizes (a single size saves the ids alone, as before
/// lists of sizes).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum RebatchState {
    Rows(Vec<u64>),
    Turn { rows: Vec<u64>, turn: usize },
}

impl<R, O> Rebatch<R, O> {
    pub(crate) fn new(
        sizes: Vec<usize>,
        drop_remainder: bool,
        build: fn(Vec<R>) -> Output<O>,
    ) -> Self {
        let first = sizes.first().copied().unwrap_or(1);
        Rebatch {
            sizes,
            turn: 0,
            drop_remainder,
            rows: Vec::with_capacity(first.min(1 << 16)),
            build,
        }
    }

    fn size(&self) -> usize {
        self.sizes.get(self.turn).copied().unwrap_or(1)
    }

    fn emit(&mut self) -> Output<O> {
        let rows = std::mem::take(&mut self.rows);
        self.turn = (self.turn + 1) % self.sizes.len().max(1);
        (self.build)(rows.into_iter().map(|(_, r)| r).collect())
    }
}

impl<R: Send + 'static, O: Send + 'static> Grouper for Rebatch<R, O> {
    type Row = R;
    type Out = O;

    fn push(&mut self, id: u64, row: R) -> Option<Output<O>> {
        self.rows.push((id, row));
        (self.rows.len() >= self.size()).then(|| self.emit())
    }

    fn flush_one(&mut self) -> Option<Output<O>> {
        if self.rows.is_empty() || self.drop_remainder {
            self.rows.clear();
            self.turn = 0;
            return None;
        }
        let out = self.emit();
        // The next epoch starts at the first size.
        self.turn = 0;
        Some(out)
    }

    fn held(&self) -> Vec<u64> {
        self.rows.iter().map(|(id, _)| *id).collect()
    }

    fn save(&self) -> serde_json::Value {
        let rows = self.held();
        if self.sizes.len() == 1 {
            serde_json::json!(RebatchState::Rows(rows))
        } else {
            serde_json::json!(RebatchState::Turn {
                rows,
                turn: self.turn
            })
        }
    }

    fn restore(
        &mut self,
        saved: &serde_json::Value,
        rows: &mut HashMap<u64, R>,
    ) -> Result<(), StateError> {
        let (ids, turn) = match serde_json::from_value(saved.clone())? {
            RebatchState::Rows(ids) => (ids, 0),
            RebatchState::Turn { rows, turn } => (rows, turn),
        };
        if turn >= self.sizes.len() {
            return Err(StateError::mismatch(
                "rebatch",
                format!("turn {turn} saved, {} sizes configured", self.sizes.len()),
            ));
        }
        self.rows = rows::take_rows("rebatch", &ids, rows)?;
        self.turn = turn;
        Ok(())
    }
}
