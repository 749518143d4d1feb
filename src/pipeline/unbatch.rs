//! `unbatch`: split each batch back into its rows (`tf.data`'s `unbatch`).
//!
//! Resumable by replay ([`rows`](super::rows)): a state taken half-way
//! through an element stores the anchor before it and the next row's id.

use std::collections::HashMap;

use super::Pipeline;
use super::rows::{self, BatchRow, Grouper, Output};
use super::state::StateError;
use crate::batch::Batch;

impl<T: Send + 'static> Pipeline<Vec<T>> {
    /// Emits the items of each `Vec` one by one (`tf.data`'s `unbatch`).
    /// Errors and epoch markers pass through in order.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<u32> = Pipeline::from_vec(vec![vec![1, 2], vec![], vec![3]])
    ///     .unbatch()
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(v, [1, 2, 3]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn unbatch(self) -> Pipeline<T> {
        self.regroup("unbatch", rows::vec_rows, || Unbatch { make: Ok })
    }
}

impl Pipeline<Batch> {
    /// Splits each parsed batch into one-row batches (`tf.data`'s
    /// `unbatch` on a dataset of parsed features).
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// use tfpipe::{Batch, Column, Values};
    /// let batch = Batch {
    ///     num_rows: 2,
    ///     columns: vec![Column {
    ///         name: "t".into(),
    ///         values: Values::Int64(vec![1, 2, 3]),
    ///         row_splits: vec![vec![0, 2, 3]],
    ///         inner_shape: vec![],
    ///     }],
    /// };
    /// let rows: Vec<Batch> = Pipeline::from_vec(vec![batch]).unbatch().start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(rows.len(), 2);
    /// assert_eq!(rows[1].columns[0].as_i64(), Some(&[3][..]));
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn unbatch(self) -> Pipeline<Batch> {
        self.regroup("unbatch", rows::batch_rows, || Unbatch {
            make: |r: BatchRow| Ok(r.batch.slice(r.row..r.row + 1)),
        })
    }
}

/// Emits every row at once; holds nothing.
struct Unbatch<R, O> {
    make: fn(R) -> Output<O>,
}

impl<R: Send + 'static, O: Send + 'static> Grouper for Unbatch<R, O> {
    type Row = R;
    type Out = O;

    fn push(&mut self, _id: u64, row: R) -> Option<Output<O>> {
        Some((self.make)(row))
    }

    fn flush_one(&mut self) -> Option<Output<O>> {
        None
    }

    fn held(&self) -> Vec<u64> {
        Vec::new()
    }

    fn save(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    fn restore(
        &mut self,
        _: &serde_json::Value,
        _: &mut HashMap<u64, R>,
    ) -> Result<(), StateError> {
        Ok(())
    }
}
