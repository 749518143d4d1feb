//! `take`: the first `n` elements, then the end.

use super::{Event, Pipeline};

impl<T: Send + 'static> Pipeline<T> {
    /// The first `n` elements (errors pass and do not count), then the end:
    /// the upstream stages are dropped (and their threads joined) at once.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<u32> = Pipeline::from_vec((0..10).collect()).take(3).start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(v, [0, 1, 2]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn take(self, n: u64) -> Pipeline<T> {
        self.then("take", move |_env, up, counters| {
            let mut up = Some(up);
            let mut taken = 0u64;
            Box::new(std::iter::from_fn(move || {
                if taken >= n {
                    up = None;
                    return None;
                }
                let event = up.as_mut()?.next();
                match &event {
                    Some(Event::Item(Ok(_))) => {
                        taken += 1;
                        counters.add_in(1, 0);
                        counters.add_out(1, 0);
                    }
                    None => up = None,
                    _ => {}
                }
                event
            }))
        })
    }
}
