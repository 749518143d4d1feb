//! `filter`: keep the elements a predicate accepts.
//!
//! State: none of its own (the predicate is assumed pure), only the
//! upstream's.

use super::state::Sequential;
use super::worker::call_user;
use super::{Clock, Event, Pipeline, Stream, byte_size};

impl<T: Send + 'static> Pipeline<T> {
    /// Keeps the elements for which `predicate` returns `true`. A panic in the
    /// predicate becomes an `Err` item naming the stage.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<u32> = Pipeline::from_vec((0..6).collect()).filter(|x| x % 2 == 0).start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(v, [0, 2, 4]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn filter<F>(self, predicate: F) -> Pipeline<T>
    where
        F: Fn(&T) -> bool + Send + Sync + 'static,
    {
        let predicate = std::sync::Arc::new(predicate);
        self.then("filter", move |env, up, counters| {
            let predicate = std::sync::Arc::clone(&predicate);
            let step = move |_: &mut (), up: &mut Option<Stream<T>>| {
                let up = up.as_mut()?;
                let mut clock = Clock::start();
                let out = loop {
                    match clock.pull(up) {
                        Some(Event::Item(Ok(item))) => {
                            counters.add_in(1, 0);
                            match call_user(counters.name(), || predicate(&item)) {
                                Ok(true) => {
                                    counters.add_out(1, byte_size(&item));
                                    break Some(Event::Item(Ok(item)));
                                }
                                Ok(false) => {}
                                Err(err) => {
                                    counters.add_error();
                                    break Some(Event::Item(Err(err)));
                                }
                            }
                        }
                        other => break other,
                    }
                };
                clock.finish(&counters);
                out
            };
            Box::new(Sequential::new(env, "filter", up, step)) as Stream<T>
        })
    }
}
