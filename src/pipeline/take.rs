//! `take`: the first `n` elements, then the end.
//!
//! State: how many were taken (and, once the upstream is dropped, no
//! upstream state: a restored `take` that was done stays done).

use super::state::Sequential;
use super::{Event, Pipeline, Stream};

/// What a `take` stores: elements taken so far.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Taken {
    taken: u64,
}

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
        self.then("take", move |env, up, counters| {
            let step = move |s: &mut Taken, up: &mut Option<Stream<T>>| {
                if s.taken >= n {
                    *up = None;
                    return None;
                }
                let event = up.as_mut()?.next();
                match &event {
                    Some(Event::Item(Ok(_))) => {
                        s.taken += 1;
                        counters.add_in(1, 0);
                        counters.add_out(1, 0);
                    }
                    None => *up = None,
                    _ => {}
                }
                event
            };
            Box::new(Sequential::new(env, "take", up, step)) as Stream<T>
        })
    }
}
