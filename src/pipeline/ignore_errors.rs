//! `ignore_errors`: skip failing elements, counting them and where they were.
//!
//! State: none of its own, only the upstream's.

use super::state::Sequential;
use super::{Event, Pipeline, Stream};

impl<T: Send + 'static> Pipeline<T> {
    /// Drops `Err` items. Each one is counted in this stage's `skipped`
    /// metric, and the first few messages (with their file, record and offset)
    /// are kept in its `skipped_samples`.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let mut it = Pipeline::from_vec(vec![1, 0, 2])
    ///     .try_map(|x: i32| if x == 0 { Err("zero") } else { Ok(10 / x) })
    ///     .ignore_errors()
    ///     .start()?;
    /// let v: Vec<i32> = it.by_ref().collect::<Result<_, _>>()?;
    /// assert_eq!(v, [10, 5]);
    /// assert_eq!(it.metrics().stage("ignore_errors").unwrap().skipped, 1);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn ignore_errors(self) -> Pipeline<T> {
        self.then("ignore_errors", move |env, up, counters| {
            let step = move |_: &mut (), up: &mut Option<Stream<T>>| {
                let up = up.as_mut()?;
                loop {
                    match up.next()? {
                        Event::Item(Err(err)) => counters.add_skipped(err.to_string()),
                        event => {
                            if let Event::Item(Ok(_)) = event {
                                counters.add_in(1, 0);
                                counters.add_out(1, 0);
                            }
                            return Some(event);
                        }
                    }
                }
            };
            Box::new(Sequential::new(env, "ignore_errors", up, step)) as Stream<T>
        })
    }
}
