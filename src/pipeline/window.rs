//! `window`: overlapping groups of consecutive elements (`tf.data`'s
//! `window(size, shift, stride, drop_remainder)`), each as a `Vec`, and
//! [`window_rows`](Pipeline::window_rows): the same over the rows of parsed
//! batches, each window one batch.
//!
//! Window `k` holds the elements at `k * shift + j * stride` for `j` in
//! `0..size`, cut short at the end of the input; there is a window for every
//! start position the input reaches, so the last windows may be short
//! unless `drop_remainder`. An epoch marker ends the windows of its epoch
//! (no window spans two epochs). Resumable by replay ([`rows`](super::rows)):
//! the buffer is saved as row ids.

use std::collections::{HashMap, VecDeque};

use super::rows::{self, BatchRow, Grouper, Output};
use super::state::StateError;
use super::{Pipeline, PipelineError};
use crate::batch::Batch;

impl<T: Clone + Send + 'static> Pipeline<T> {
    /// Groups elements into windows of `size`, a new window every `shift`
    /// elements, taking every `stride`-th element (`tf.data`'s `window`,
    /// whose `shift` defaults to `size` and `stride` to 1). Elements that
    /// fall in several windows are cloned.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let w: Vec<Vec<u32>> = Pipeline::from_vec((0..7).collect())
    ///     .window(3, 2, 1, false)
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(w, [vec![0, 1, 2], vec![2, 3, 4], vec![4, 5, 6], vec![6]]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn window(
        self,
        size: usize,
        shift: usize,
        stride: usize,
        drop_remainder: bool,
    ) -> Pipeline<Vec<T>> {
        self.invalid_if(bad_window(size, shift, stride), "window", || {
            window_problem(size, shift, stride)
        })
        .regroup("window", rows::single_row, move || {
            Window::new([size, shift, stride], drop_remainder, Ok)
        })
    }
}

impl Pipeline<Batch> {
    /// Windows over the rows of parsed batches (each batch split into its
    /// rows, as [`unbatch`](Self::unbatch) splits it), each window one
    /// batch of its rows: `tf.data`'s `window` over a dataset of feature
    /// dicts followed by batching each window (`ds.window(size, shift,
    /// stride).flat_map(lambda w: Dataset.zip(w).batch(size))`). Rows of
    /// one input batch are copied as one slice; a row in several windows is
    /// copied into each.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// use tfpipe::{Batch, Column, Values};
    /// let batch = |v: Vec<i64>| Batch {
    ///     num_rows: v.len(),
    ///     columns: vec![Column { name: "x".into(), values: Values::Int64(v), row_splits: vec![], inner_shape: vec![] }],
    /// };
    /// let windows: Vec<Batch> = Pipeline::from_vec(vec![batch(vec![0, 1, 2]), batch(vec![3, 4])])
    ///     .window_rows(3, 2, 1, true)
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(windows, [batch(vec![0, 1, 2]), batch(vec![2, 3, 4])]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn window_rows(
        self,
        size: usize,
        shift: usize,
        stride: usize,
        drop_remainder: bool,
    ) -> Pipeline<Batch> {
        self.invalid_if(bad_window(size, shift, stride), "window", || {
            window_problem(size, shift, stride)
        })
        .regroup("window", rows::batch_rows, move || {
            Window::new(
                [size, shift, stride],
                drop_remainder,
                |rows: Vec<BatchRow>| rows::gather("window", &rows),
            )
        })
    }
}

fn bad_window(size: usize, shift: usize, stride: usize) -> bool {
    size == 0 || shift == 0 || stride == 0
}

fn window_problem(size: usize, shift: usize, stride: usize) -> String {
    format!("({size}, {shift}, {stride}): size, shift and stride must be positive")
}

/// The elements from the next window's start on; `build` makes a window's
/// output of its rows.
struct Window<T, O> {
    size: usize,
    shift: usize,
    stride: usize,
    drop_remainder: bool,
    buffer: VecDeque<(u64, T)>,
    /// Elements still to drop before the next window starts (`shift` larger
    /// than what was buffered).
    skip: usize,
    build: fn(Vec<T>) -> Result<O, PipelineError>,
}

impl<T: Clone, O> Window<T, O> {
    fn new(
        [size, shift, stride]: [usize; 3],
        drop_remainder: bool,
        build: fn(Vec<T>) -> Result<O, PipelineError>,
    ) -> Self {
        Window {
            size,
            shift,
            stride,
            drop_remainder,
            buffer: VecDeque::new(),
            skip: 0,
            build,
        }
    }

    /// The elements a full window spans.
    fn span(&self) -> usize {
        (self.size - 1)
            .saturating_mul(self.stride)
            .saturating_add(1)
    }

    /// The window starting at the buffer's front (as much of it as is
    /// buffered), then moves the start on by `shift`.
    fn emit(&mut self) -> Output<O> {
        let window: Vec<T> = self
            .buffer
            .iter()
            .step_by(self.stride)
            .take(self.size)
            .map(|(_, t)| t.clone())
            .collect();
        let drop = self.shift.min(self.buffer.len());
        self.buffer.drain(..drop);
        self.skip = self.shift - drop;
        (self.build)(window)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct WindowState {
    buffer: Vec<u64>,
    skip: usize,
}

impl<T: Clone + Send + 'static, O: Send + 'static> Grouper for Window<T, O> {
    type Row = T;
    type Out = O;

    fn push(&mut self, id: u64, row: T) -> Option<Output<O>> {
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        self.buffer.push_back((id, row));
        (self.buffer.len() >= self.span()).then(|| self.emit())
    }

    fn flush_one(&mut self) -> Option<Output<O>> {
        if self.buffer.is_empty() || self.drop_remainder {
            self.buffer.clear();
            self.skip = 0;
            return None;
        }
        Some(self.emit())
    }

    fn held(&self) -> Vec<u64> {
        self.buffer.iter().map(|(id, _)| *id).collect()
    }

    fn save(&self) -> serde_json::Value {
        serde_json::json!(WindowState {
            buffer: self.held(),
            skip: self.skip,
        })
    }

    fn restore(
        &mut self,
        saved: &serde_json::Value,
        rows: &mut HashMap<u64, T>,
    ) -> Result<(), StateError> {
        let state: WindowState = serde_json::from_value(saved.clone())?;
        self.buffer = rows::take_rows("window", &state.buffer, rows)?.into();
        self.skip = state.skip;
        Ok(())
    }
}
