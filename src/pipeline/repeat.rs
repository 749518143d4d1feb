//! `repeat`: run the upstream again, marking each epoch's end.

use super::{Env, Event, Pipeline, Stream};

impl<T: Send + 'static> Pipeline<T> {
    /// Runs the upstream `count` times (`None`: forever), rebuilding it each
    /// epoch (so `shuffle` reshuffles) and ending each pass with an epoch
    /// marker ([`Event::EpochEnd`]). Markers from an
    /// inner `repeat` are absorbed. Repeating an empty input forever ends
    /// instead of spinning.
    ///
    /// ```
    /// use tfpipe::pipeline::{Event, Pipeline};
    /// let mut it = Pipeline::from_vec(vec![1, 2]).repeat(Some(2)).start()?;
    /// let mut seen = Vec::new();
    /// while let Some(ev) = it.next_event() {
    ///     match ev {
    ///         Event::Item(x) => seen.push(x?.to_string()),
    ///         Event::EpochEnd(e) => seen.push(format!("end {e}")),
    ///     }
    /// }
    /// assert_eq!(seen, ["1", "2", "end 0", "1", "2", "end 1"]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn repeat(self, count: Option<u64>) -> Pipeline<T> {
        let depth = self.depth() + 1;
        let inner = self.clone();
        let error = self.error.clone();
        let mut out = Pipeline::from_build(move |env: &Env| {
            let inner = inner.clone();
            let env = env.clone();
            let mut epoch = 0u64;
            // The first pass is built now, at start, like every other stage
            // (its threads start prefetching at once).
            let mut current: Option<Stream<T>> =
                (count != Some(0)).then(|| inner.build_stream(&env.with_epoch(0)));
            let mut produced = false;
            // Registered after the first pass is built, so the metrics table
            // lists stages upstream first.
            let counters = env.stage(depth, "repeat");
            Box::new(std::iter::from_fn(move || {
                loop {
                    if current.is_none() {
                        if count.is_some_and(|c| epoch >= c) || env.cancelled() {
                            return None;
                        }
                        current = Some(inner.build_stream(&env.with_epoch(epoch)));
                        produced = false;
                    }
                    match current.as_mut()?.next() {
                        Some(Event::EpochEnd(_)) => continue,
                        Some(item) => {
                            produced = true;
                            if let Event::Item(Ok(_)) = &item {
                                counters.add_in(1, 0);
                                counters.add_out(1, 0);
                            }
                            return Some(item);
                        }
                        None => {
                            // Drop the finished pass first: its threads are joined
                            // before the next pass starts any.
                            current = None;
                            let done = epoch;
                            epoch += 1;
                            if !produced && count.is_none() {
                                return None;
                            }
                            return Some(Event::EpochEnd(done));
                        }
                    }
                }
            })) as Stream<T>
        });
        out.depth = depth;
        out.error = error;
        out
    }
}
