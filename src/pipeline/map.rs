//! Sequential `map` and `try_map`, fused into the pulling thread.

use std::sync::Arc;

use super::state::{StageState, StageStream, StateError};
use super::worker::call_user;
use super::{BoxError, Clock, Event, Pipeline, Stream, byte_size, user_error};
use crate::metrics::StageCounters;

impl<T: Send + 'static> Pipeline<T> {
    /// Applies `f` to every element on the pulling thread. For parallel work
    /// use [`map_parallel`](Self::map_parallel).
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<String> = Pipeline::from_vec(vec![1, 2]).map(|x: i32| x.to_string()).start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(v, ["1", "2"]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn map<U, F>(self, f: F) -> Pipeline<U>
    where
        U: Send + 'static,
        F: Fn(T) -> U + Send + Sync + 'static,
    {
        self.try_map(move |x| Ok::<U, std::convert::Infallible>(f(x)))
    }

    /// Applies a fallible `f`; an `Err` (or a panic) becomes an `Err` item
    /// naming the stage, and the pipeline goes on with the next element.
    pub fn try_map<U, E, F>(self, f: F) -> Pipeline<U>
    where
        U: Send + 'static,
        E: Into<BoxError>,
        F: Fn(T) -> Result<U, E> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.then("map", move |env, up, counters| {
            let f = Arc::clone(&f);
            // A map holds nothing between elements: its state is its upstream's.
            if let Some(state) = env.resume_state()
                && !state.data.is_null()
            {
                env.restore_failed(StateError::mismatch(
                    "map",
                    "a parallel map's state given to a sequential map",
                ));
            }
            Box::new(MapStream {
                up,
                counters,
                f: move |item| f(item),
            }) as Stream<U>
        })
    }
}

struct MapStream<T, F> {
    up: Stream<T>,
    counters: Arc<StageCounters>,
    f: F,
}

impl<T: Send + 'static, U: Send + 'static, E: Into<BoxError>, F> Iterator for MapStream<T, F>
where
    F: Fn(T) -> Result<U, E> + Send,
{
    type Item = Event<U>;

    fn next(&mut self) -> Option<Event<U>> {
        let counters = &self.counters;
        let mut clock = Clock::start();
        let out = match clock.pull(&mut self.up)? {
            Event::Item(Ok(item)) => {
                counters.add_in(1, byte_size(&item));
                let result = match call_user(counters.name(), || (self.f)(item)) {
                    Ok(Ok(value)) => {
                        counters.add_out(1, byte_size(&value));
                        Ok(value)
                    }
                    Ok(Err(err)) => {
                        counters.add_error();
                        Err(user_error(counters, err))
                    }
                    Err(panic) => {
                        counters.add_error();
                        Err(panic)
                    }
                };
                Event::Item(result)
            }
            Event::Item(Err(err)) => Event::Item(Err(err)),
            Event::EpochEnd(e) => Event::EpochEnd(e),
        };
        clock.finish(counters);
        Some(out)
    }
}

impl<T: Send + 'static, U: Send + 'static, E: Into<BoxError>, F> StageStream<U> for MapStream<T, F>
where
    F: Fn(T) -> Result<U, E> + Send,
{
    fn save(&self) -> Result<StageState, StateError> {
        Ok(StageState::new("map", serde_json::Value::Null).with_input(self.up.save()?))
    }
}
