//! `padded_batch`: batch variable-length rows into one dense, padded block.

use super::{Clock, Event, Pipeline, PipelineError};

/// The width rows are padded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaddedShape {
    /// The longest row of each batch.
    BatchMax,
    /// This width; a longer row is an `Err` item.
    Fixed(usize),
}

/// A batch of rows padded to one width, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct PaddedBatch<E> {
    /// `rows * width` values; row `i` is `values[i * width..(i + 1) * width]`.
    pub values: Vec<E>,
    /// Each row's length before padding.
    pub lengths: Vec<usize>,
    /// The padded width.
    pub width: usize,
}

impl<E> PaddedBatch<E> {
    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.lengths.len()
    }

    /// Row `i`, padding included.
    pub fn row(&self, i: usize) -> &[E] {
        &self.values[i * self.width..(i + 1) * self.width]
    }
}

impl<E: Clone + Send + Sync + 'static> Pipeline<Vec<E>> {
    /// Batches `size` variable-length rows, padding each with `padding` to
    /// `shape` (`tf.data`'s `padded_batch`). Epochs and errors behave as in
    /// [`batch`](Pipeline::batch).
    ///
    /// ```
    /// use tfpipe::pipeline::{PaddedShape, Pipeline};
    /// let b: Vec<_> = Pipeline::from_vec(vec![vec![1, 2], vec![3], vec![4, 5, 6]])
    ///     .padded_batch(2, PaddedShape::BatchMax, 0, false)
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(b[0].values, [1, 2, 3, 0]);
    /// assert_eq!(b[0].lengths, [2, 1]);
    /// assert_eq!(b[1].values, [4, 5, 6]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn padded_batch(
        self,
        size: usize,
        shape: PaddedShape,
        padding: E,
        drop_remainder: bool,
    ) -> Pipeline<PaddedBatch<E>> {
        let batched = self.batch_with(size, drop_remainder);
        batched.then("padded_batch", move |_env, mut up, counters| {
            let padding = padding.clone();
            Box::new(std::iter::from_fn(move || {
                let mut clock = Clock::start();
                let out = match clock.pull(&mut up)? {
                    Event::Item(Ok(rows)) => {
                        counters.add_in(rows.len() as u64, 0);
                        let longest = rows.iter().map(Vec::len).max().unwrap_or(0);
                        let width = match shape {
                            PaddedShape::BatchMax => Ok(longest),
                            PaddedShape::Fixed(w) if longest <= w => Ok(w),
                            PaddedShape::Fixed(w) => Err(PipelineError::Element {
                                stage: counters.name().to_string(),
                                message: format!(
                                    "a row of length {longest} exceeds the padded shape {w}"
                                ),
                            }),
                        };
                        match width {
                            Ok(width) => {
                                let mut values = Vec::with_capacity(rows.len() * width);
                                let mut lengths = Vec::with_capacity(rows.len());
                                for row in rows {
                                    lengths.push(row.len());
                                    let pad = width - row.len();
                                    values.extend(row);
                                    values.extend(std::iter::repeat_n(padding.clone(), pad));
                                }
                                counters.add_out(1, 0);
                                Event::Item(Ok(PaddedBatch {
                                    values,
                                    lengths,
                                    width,
                                }))
                            }
                            Err(err) => {
                                counters.add_error();
                                Event::Item(Err(err))
                            }
                        }
                    }
                    Event::Item(Err(err)) => Event::Item(Err(err)),
                    Event::EpochEnd(e) => Event::EpochEnd(e),
                };
                clock.finish(&counters);
                Some(out)
            }))
        })
    }
}
