//! `skip`: drop the first `n` elements.
//!
//! State: how many were skipped so far.

use super::state::Sequential;
use super::{Event, Pipeline, Stream};

/// What a `skip` stores: elements dropped so far.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Skipped {
    skipped: u64,
}

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
        self.then("skip", move |env, up, counters| {
            let cancel = env.clone();
            let step = move |s: &mut Skipped, up: &mut Option<Stream<T>>| {
                loop {
                    let event = up.as_mut()?.next()?;
                    if let Event::Item(Ok(_)) = &event {
                        counters.add_in(1, 0);
                        if s.skipped < n {
                            s.skipped += 1;
                            if s.skipped.is_multiple_of(1024) && cancel.cancelled() {
                                return None;
                            }
                            continue;
                        }
                        counters.add_out(1, 0);
                    }
                    return Some(event);
                }
            };
            Box::new(Sequential::new(env, "skip", up, step)) as Stream<T>
        })
    }
}
