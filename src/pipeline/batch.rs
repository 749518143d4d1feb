//! `batch`: group consecutive elements into `Vec`s.

use super::{Clock, Event, Pipeline};

impl<T: Send + 'static> Pipeline<T> {
    /// Groups `size` consecutive elements into a `Vec`; the last batch of an
    /// epoch may be shorter. Errors pass through at once; an epoch marker
    /// flushes the partial batch first, so no batch straddles two epochs.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<Vec<u32>> = Pipeline::from_vec((0..5).collect()).batch(2).start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(v, [vec![0, 1], vec![2, 3], vec![4]]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn batch(self, size: usize) -> Pipeline<Vec<T>> {
        self.batch_with(size, false)
    }

    /// [`batch`](Self::batch), dropping each epoch's short last batch when
    /// `drop_remainder` (`tf.data`'s `drop_remainder=True`).
    pub fn batch_with(self, size: usize, drop_remainder: bool) -> Pipeline<Vec<T>> {
        self.invalid_if(size == 0, || {
            "batch(0): the batch size must be positive".into()
        })
        .then("batch", move |_env, mut up, counters| {
            let mut pending_marker = None;
            let mut done = false;
            // The batch being filled survives an error returned mid-fill.
            let mut batch: Vec<T> = Vec::with_capacity(size);
            Box::new(std::iter::from_fn(move || {
                if let Some(marker) = pending_marker.take() {
                    return Some(Event::EpochEnd(marker));
                }
                if done {
                    return None;
                }
                let mut clock = Clock::start();
                let out = loop {
                    // One clock read per batch, after its last pull, not one
                    // per pull: pushes between pulls count as waiting anyway.
                    let event = up.next();
                    if batch.len() + 1 >= size || !matches!(event, Some(Event::Item(Ok(_)))) {
                        clock.mark_waited();
                    }
                    match event {
                        Some(Event::Item(Ok(item))) => {
                            batch.push(item);
                            if batch.len() == size {
                                let full = std::mem::replace(&mut batch, Vec::with_capacity(size));
                                break Some(Event::Item(Ok(full)));
                            }
                        }
                        // An error goes ahead of the batch being filled.
                        Some(Event::Item(Err(err))) => break Some(Event::Item(Err(err))),
                        Some(Event::EpochEnd(e)) => {
                            if batch.is_empty() || drop_remainder {
                                batch.clear();
                                break Some(Event::EpochEnd(e));
                            }
                            pending_marker = Some(e);
                            break Some(Event::Item(Ok(std::mem::take(&mut batch))));
                        }
                        None => {
                            done = true;
                            if batch.is_empty() || drop_remainder {
                                batch = Vec::new();
                                break None;
                            }
                            break Some(Event::Item(Ok(std::mem::take(&mut batch))));
                        }
                    }
                };
                if let Some(Event::Item(Ok(b))) = &out {
                    counters.add_in(b.len() as u64, 0);
                    counters.add_out(1, 0);
                }
                clock.finish(&counters);
                out
            }))
        })
    }
}
