//! `window`: overlapping groups of consecutive elements (`tf.data`'s
//! `window(size, shift, stride, drop_remainder)`), each as a `Vec`.
//!
//! Window `k` holds the elements at `k * shift + j * stride` for `j` in
//! `0..size`, cut short at the end of the input; there is a window for every
//! start position the input reaches, so the last windows may be short
//! unless `drop_remainder`. An epoch marker ends the windows of its epoch
//! (no window spans two epochs). Resumable by replay ([`rows`](super::rows)):
//! the buffer is saved as row ids.

use std::collections::{HashMap, VecDeque};

use super::Pipeline;
use super::rows::{self, Grouper, Output};
use super::state::StateError;

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
        let bad = size == 0 || shift == 0 || stride == 0;
        self.invalid_if(bad, "window", || {
            format!("({size}, {shift}, {stride}): size, shift and stride must be positive")
        })
        .regroup("window", rows::single_row, move || Window {
            size,
            shift,
            stride,
            drop_remainder,
            buffer: VecDeque::new(),
            skip: 0,
        })
    }
}

/// The elements from the next window's start on.
struct Window<T> {
    size: usize,
    shift: usize,
    stride: usize,
    drop_remainder: bool,
    buffer: VecDeque<(u64, T)>,
    /// Elements still to drop before the next window starts (`shift` larger
    /// than what was buffered).
    skip: usize,
}

impl<T: Clone> Window<T> {
    /// The elements a full window spans.
    fn span(&self) -> usize {
        (self.size - 1)
            .saturating_mul(self.stride)
            .saturating_add(1)
    }

    /// The window starting at the buffer's front (as much of it as is
    /// buffered), then moves the start on by `shift`.
    fn emit(&mut self) -> Vec<T> {
        let window = self
            .buffer
            .iter()
            .step_by(self.stride)
            .take(self.size)
            .map(|(_, t)| t.clone())
            .collect();
        let drop = self.shift.min(self.buffer.len());
        self.buffer.drain(..drop);
        self.skip = self.shift - drop;
        window
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct WindowState {
    buffer: Vec<u64>,
    skip: usize,
}

impl<T: Clone + Send + 'static> Grouper for Window<T> {
    type Row = T;
    type Out = Vec<T>;

    fn push(&mut self, id: u64, row: T) -> Option<Output<Vec<T>>> {
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        self.buffer.push_back((id, row));
        (self.buffer.len() >= self.span()).then(|| Ok(self.emit()))
    }

    fn flush_one(&mut self) -> Option<Output<Vec<T>>> {
        if self.buffer.is_empty() || self.drop_remainder {
            self.buffer.clear();
            self.skip = 0;
            return None;
        }
        Some(Ok(self.emit()))
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
