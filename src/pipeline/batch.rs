//! `batch`: group consecutive elements into `Vec`s.

use std::sync::Arc;

use super::state::{self, StageState, StageStream, StateError};
use super::{Clock, Event, Pipeline, Stream};
use crate::metrics::StageCounters;

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
        self.invalid_if(size == 0, "batch", || {
            "the batch size must be positive (0 given)".into()
        })
        .then("batch", move |env, up, counters| {
            let mut stream = BatchStream {
                up,
                counters,
                size,
                drop_remainder,
                pending_marker: None,
                done: false,
                batch: Vec::with_capacity(size),
            };
            if let Some(state) = env.resume_state()
                && let Err(error) = stream.restore(state)
            {
                env.restore_failed(error);
            }
            Box::new(stream) as Stream<Vec<T>>
        })
    }
}

/// Groups elements; the batch being filled survives an error returned mid-fill.
struct BatchStream<T> {
    up: Stream<T>,
    counters: Arc<StageCounters>,
    size: usize,
    drop_remainder: bool,
    pending_marker: Option<u64>,
    done: bool,
    batch: Vec<T>,
}

impl<T: Send + 'static> Iterator for BatchStream<T> {
    type Item = Event<Vec<T>>;

    fn next(&mut self) -> Option<Event<Vec<T>>> {
        if let Some(marker) = self.pending_marker.take() {
            return Some(Event::EpochEnd(marker));
        }
        if self.done {
            return None;
        }
        let size = self.size;
        let mut clock = Clock::start();
        let out = loop {
            // One clock read per batch, after its last pull, not one
            // per pull: pushes between pulls count as waiting anyway.
            let event = self.up.next();
            if self.batch.len() + 1 >= size || !matches!(event, Some(Event::Item(Ok(_)))) {
                clock.mark_waited();
            }
            match event {
                Some(Event::Item(Ok(item))) => {
                    self.batch.push(item);
                    if self.batch.len() == size {
                        let full = std::mem::replace(&mut self.batch, Vec::with_capacity(size));
                        break Some(Event::Item(Ok(full)));
                    }
                }
                // An error goes ahead of the batch being filled.
                Some(Event::Item(Err(err))) => break Some(Event::Item(Err(err))),
                Some(Event::EpochEnd(e)) => {
                    if self.batch.is_empty() || self.drop_remainder {
                        self.batch.clear();
                        break Some(Event::EpochEnd(e));
                    }
                    self.pending_marker = Some(e);
                    break Some(Event::Item(Ok(std::mem::take(&mut self.batch))));
                }
                None => {
                    self.done = true;
                    if self.batch.is_empty() || self.drop_remainder {
                        self.batch = Vec::new();
                        break None;
                    }
                    break Some(Event::Item(Ok(std::mem::take(&mut self.batch))));
                }
            }
        };
        if let Some(Event::Item(Ok(b))) = &out {
            self.counters.add_in(b.len() as u64, 0);
            self.counters.add_out(1, 0);
        }
        clock.finish(&self.counters);
        out
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct BatchState {
    pending_marker: Option<u64>,
    done: bool,
}

impl<T: Send + 'static> StageStream<Vec<T>> for BatchStream<T> {
    fn save(&self) -> Result<StageState, StateError> {
        let data = BatchState {
            pending_marker: self.pending_marker,
            done: self.done,
        };
        let mut state = StageState::new("batch", serde_json::json!(data));
        state.records = state::positions_of("batch", &self.batch)?;
        if !self.done {
            state = state.with_input(self.up.save()?);
        }
        Ok(state)
    }
}

impl<T: 'static> BatchStream<T> {
    fn restore(&mut self, state: &StageState) -> Result<(), StateError> {
        let data: BatchState = state.data("batch")?;
        self.pending_marker = data.pending_marker;
        self.done = data.done;
        self.batch = state::reread("batch", &state.records)?;
        self.batch
            .reserve(self.size.saturating_sub(self.batch.len()));
        Ok(())
    }
}
