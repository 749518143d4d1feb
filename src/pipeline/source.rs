//! In-memory sources: a `Vec`, a one-shot iterator, a generator function.
//!
//! Sources run on the thread that pulls them. Their time counts as busy; a
//! panic in a user iterator ends the source with an `Err` item.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::state::{StageState, StageStream, StateError};
use super::worker::call_user;
use super::{Env, Event, Pipeline, Stream, byte_size};
use crate::metrics::StageCounters;

impl<T: Clone + Send + Sync + 'static> Pipeline<T> {
    /// The elements of `items`, in order; each epoch clones them again.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<u8> = Pipeline::from_vec(vec![1u8, 2, 3]).start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(v, [1, 2, 3]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn from_vec(items: Vec<T>) -> Pipeline<T> {
        vec_source(items, || <T as Clone>::clone)
    }

    /// [`from_vec`](Self::from_vec), each element paired with a value that
    /// `per_start` makes once per start of the pipeline (once per epoch under
    /// `repeat`), shared by that start's elements. The stage and its state
    /// are `from_vec`'s.
    pub(crate) fn from_vec_each_start<S: Clone + Send + 'static>(
        items: Vec<T>,
        per_start: impl Fn() -> S + Send + Sync + 'static,
    ) -> Pipeline<(T, S)> {
        vec_source(items, move || {
            let shared = per_start();
            move |item: &T| (item.clone(), shared.clone())
        })
    }
}

/// The `from_vec` stage over `items`: from the restored count on, each item
/// made into an element by the function `per_start` gives for that start.
fn vec_source<T, U, M>(
    items: Vec<T>,
    per_start: impl Fn() -> M + Send + Sync + 'static,
) -> Pipeline<U>
where
    T: Send + Sync + 'static,
    U: Send + 'static,
    M: Fn(&T) -> U + Send + 'static,
{
    let items = Arc::new(items);
    Pipeline::from_build(move |env| {
        let counters = env.stage(0, "from_vec");
        let items = Arc::clone(&items);
        let from = resume_count(env, "from_vec");
        let start = usize::try_from(from).unwrap_or(usize::MAX).min(items.len());
        let make = per_start();
        let iter = (start..items.len()).map(move |i| make(&items[i]));
        Box::new(SourceStream::new(iter, counters).restorable("from_vec", from))
    })
}

impl<T: Send + 'static> Pipeline<T> {
    /// The elements of a one-shot iterator. It can be consumed once: under
    /// [`repeat`](Self::repeat), later epochs are empty (use
    /// [`from_generator`](Self::from_generator) to re-run a source).
    pub fn from_iterator<I>(iter: I) -> Pipeline<T>
    where
        I: IntoIterator<Item = T>,
        I::IntoIter: Send + 'static,
    {
        let slot: Arc<Mutex<Option<I::IntoIter>>> = Arc::new(Mutex::new(Some(iter.into_iter())));
        Pipeline::from_build(move |env| {
            let counters = env.stage(0, "from_iter");
            let taken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            match taken {
                Some(iter) => Box::new(SourceStream::new(iter, counters)) as Stream<T>,
                None => Box::new(std::iter::empty()),
            }
        })
    }

    /// The elements of the iterator `generator()` returns, called afresh each
    /// epoch (`tf.data.Dataset.from_generator`).
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let it = Pipeline::from_generator(|| (0..3u64).map(|i| i * i)).repeat(Some(2)).start()?;
    /// let v: Vec<u64> = it.collect::<Result<_, _>>()?;
    /// assert_eq!(v, [0, 1, 4, 0, 1, 4]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn from_generator<F, I>(generator: F) -> Pipeline<T>
    where
        F: Fn() -> I + Send + Sync + 'static,
        I: IntoIterator<Item = T>,
        I::IntoIter: Send + 'static,
    {
        Pipeline::from_build(move |env| {
            let counters = env.stage(0, "generator");
            let from = resume_count(env, "generator");
            match call_user(counters.name(), &generator) {
                Ok(iter) => {
                    // Restoring re-runs the generator and drops what was
                    // emitted before (the generator must be deterministic).
                    let mut stream = SourceStream::new(iter.into_iter(), counters);
                    for _ in 0..from {
                        if stream.next().is_none() {
                            break;
                        }
                    }
                    Box::new(stream.restorable("generator", from)) as Stream<T>
                }
                Err(err) => {
                    counters.add_error();
                    Box::new(std::iter::once(Event::Item(Err(err))))
                }
            }
        })
    }
}

/// Wraps a user iterator: counts, times, and catches its panics.
struct SourceStream<I> {
    iter: Option<I>,
    counters: Arc<StageCounters>,
    born: Option<Instant>,
    first_done: bool,
    /// The stage name a state records, for sources that can restart.
    restorable: Option<&'static str>,
    /// Elements (and errors) emitted, counting those before a restore.
    emitted: u64,
}

impl<I> SourceStream<I> {
    fn new(iter: I, counters: Arc<StageCounters>) -> Self {
        SourceStream {
            iter: Some(iter),
            counters,
            born: None,
            first_done: false,
            restorable: None,
            emitted: 0,
        }
    }

    fn restorable(mut self, stage: &'static str, emitted: u64) -> Self {
        self.restorable = Some(stage);
        self.emitted = emitted;
        self
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Emitted {
    emitted: u64,
}

/// The count a restored source starts after (0 when not restoring).
fn resume_count(env: &Env, stage: &str) -> u64 {
    match env.resume_state().map(|s| s.data::<Emitted>(stage)) {
        Some(Ok(e)) => e.emitted,
        Some(Err(error)) => {
            env.restore_failed(error);
            0
        }
        None => 0,
    }
}

impl<T: 'static, I: Iterator<Item = T> + Send> StageStream<T> for SourceStream<I> {
    fn save(&self) -> Result<StageState, StateError> {
        match self.restorable {
            Some(stage) => Ok(StageState::new(
                stage,
                serde_json::json!(Emitted {
                    emitted: self.emitted
                }),
            )),
            None => Err(StateError::Unsupported {
                stage: self.counters.name().to_string(),
                why: "a one-shot iterator cannot be restarted (use from_vec or from_generator)"
                    .to_string(),
            }),
        }
    }
}

impl<T: 'static, I: Iterator<Item = T>> Iterator for SourceStream<I> {
    type Item = Event<T>;

    fn next(&mut self) -> Option<Event<T>> {
        let iter = self.iter.as_mut()?;
        let start = Instant::now();
        let born = *self.born.get_or_insert(start);
        let next = call_user(self.counters.name(), || iter.next());
        self.counters.add_busy(start.elapsed());
        if !matches!(next, Ok(None)) {
            self.emitted += 1;
        }
        match next {
            Ok(Some(item)) => {
                self.counters.add_out(1, byte_size(&item));
                if !self.first_done {
                    self.first_done = true;
                    self.counters.set_first_output(born.elapsed());
                }
                Some(Event::Item(Ok(item)))
            }
            Ok(None) => {
                self.iter = None;
                None
            }
            Err(err) => {
                self.iter = None;
                self.counters.add_error();
                Some(Event::Item(Err(err)))
            }
        }
    }
}
