//! Sequential `map` and `try_map`, fused into the pulling thread.

use std::sync::Arc;

use super::worker::call_user;
use super::{BoxError, Clock, Event, Pipeline, byte_size, user_error};

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
        self.then("map", move |_env, mut up, counters| {
            let f = Arc::clone(&f);
            Box::new(std::iter::from_fn(move || {
                let mut clock = Clock::start();
                let out = match clock.pull(&mut up)? {
                    Event::Item(Ok(item)) => {
                        counters.add_in(1, byte_size(&item));
                        let result = match call_user(counters.name(), || f(item)) {
                            Ok(Ok(value)) => {
                                counters.add_out(1, byte_size(&value));
                                Ok(value)
                            }
                            Ok(Err(err)) => {
                                counters.add_error();
                                Err(user_error(&counters, err))
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
                clock.finish(&counters);
                Some(out)
            }))
        })
    }
}
