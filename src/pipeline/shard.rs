//! `shard`: keep every `num_shards`-th element, starting at `index`.
//!
//! State: the position in the current epoch.

use super::state::Sequential;
use super::{Event, Pipeline, Stream};

/// What a `shard` stores: elements seen this epoch.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct ShardState {
    position: u64,
}

impl<T: Send + 'static> Pipeline<T> {
    /// Keeps elements `index`, `index + num_shards`, ... of each epoch: the
    /// shards for `0..num_shards` are disjoint and together cover the input.
    /// Errors pass through to every shard. Needs `index < num_shards`.
    ///
    /// For TFRecord files, shard the files instead ([`TfRecordFiles::shard`](super::TfRecordFiles::shard)):
    /// each worker then reads only its own files.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<u32> = Pipeline::from_vec((0..10).collect()).shard(3, 1).start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(v, [1, 4, 7]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn shard(self, num_shards: usize, index: usize) -> Pipeline<T> {
        let checked = self.invalid_if(num_shards == 0 || index >= num_shards, "shard", || {
            format!("({num_shards}, {index}): needs num_shards > 0 and index < num_shards")
        });
        checked.then("shard", move |env, up, counters| {
            let step = move |s: &mut ShardState, up: &mut Option<Stream<T>>| {
                let up = up.as_mut()?;
                loop {
                    match up.next()? {
                        Event::Item(Ok(item)) => {
                            counters.add_in(1, 0);
                            let keep = s.position % num_shards as u64 == index as u64;
                            s.position += 1;
                            if keep {
                                counters.add_out(1, 0);
                                return Some(Event::Item(Ok(item)));
                            }
                        }
                        Event::EpochEnd(e) => {
                            s.position = 0;
                            return Some(Event::EpochEnd(e));
                        }
                        err @ Event::Item(Err(_)) => return Some(err),
                    }
                }
            };
            Box::new(Sequential::new(env, "shard", up, step)) as Stream<T>
        })
    }

    /// Records a configuration error of `operator` when `bad`.
    pub(crate) fn invalid_if(
        self,
        bad: bool,
        operator: &str,
        reason: impl FnOnce() -> String,
    ) -> Pipeline<T> {
        if bad {
            self.invalid(operator, reason)
        } else {
            self
        }
    }
}
