//! `ignore_errors`: skip failing elements, counting them and where they were.
//!
//! State: none of its own, only the upstream's.

use super::state::Sequential;
use super::{Event, Pipeline, PipelineError, Stream};

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
        self.ignore_errors_if(|_, _| true)
    }

    /// Drops the `Err` items for which `skip(error, epoch)` is true, counted
    /// as [`ignore_errors`](Self::ignore_errors) counts them; the others
    /// pass. `epoch` is the epoch being read as the markers tell it: 0
    /// until the first marker passes this stage (also in a pipeline without
    /// `repeat`), `n + 1` after the marker of epoch `n`.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let got: Vec<Result<i32, String>> = Pipeline::from_vec(vec![1, 0, -1, 2])
    ///     .try_map(|x: i32| match x {
    ///         0 => Err("zero"),
    ///         x if x < 0 => Err("negative"),
    ///         x => Ok(x),
    ///     })
    ///     .ignore_errors_if(|e, _epoch| e.to_string().contains("zero"))
    ///     .start()?
    ///     .map(|r| r.map_err(|e| e.to_string()))
    ///     .collect();
    /// assert_eq!(got.len(), 3);
    /// assert!(got[1].as_ref().unwrap_err().contains("negative"));
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn ignore_errors_if(
        self,
        skip: impl Fn(&PipelineError, u64) -> bool + Send + Sync + 'static,
    ) -> Pipeline<T> {
        let skip = std::sync::Arc::new(skip);
        self.then("ignore_errors", move |env, up, counters| {
            let skip = std::sync::Arc::clone(&skip);
            let mut epoch = 0;
            let step = move |_: &mut (), up: &mut Option<Stream<T>>| {
                let up = up.as_mut()?;
                loop {
                    match up.next()? {
                        Event::Item(Err(err)) if skip(&err, epoch) => {
                            counters.add_skipped(err.to_string())
                        }
                        Event::EpochEnd(e) => {
                            epoch = e + 1;
                            return Some(Event::EpochEnd(e));
                        }
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
