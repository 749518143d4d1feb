//! `skip`: drop the first `n` elements.

use super::{Event, Pipeline};

impl<T: Send + 'static> Pipeline<T> {
    /// Drops the first `n` elements (errors pass and do not count).
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<u32> = Pipeline::from_vec((0..5).collect()).skip(3).start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(v, [3, 4]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn skip(self, n: u64) -> Pipeline<T> {
        self.then("skip", move |env, mut up, counters| {
            let mut skipped = 0u64;
            let env = env.clone();
            Box::new(std::iter::from_fn(move || {
                loop {
                    let event = up.next()?;
                    if let Event::Item(Ok(_)) = &event {
                        counters.add_in(1, 0);
                        if skipped < n {
                            skipped += 1;
                            if skipped.is_multiple_of(1024) && env.cancelled() {
                                return None;
                            }
                            continue;
                        }
                        counters.add_out(1, 0);
                    }
                    return Some(event);
                }
            }))
        })
    }
}
