//! In-memory sources: a `Vec`, a one-shot iterator, a generator function.
//!
//! Sources run on the thread that pulls them. Their time counts as busy; a
//! panic in a user iterator ends the source with an `Err` item.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::worker::call_user;
use super::{Event, Pipeline, Stream, byte_size};
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
        let items = Arc::new(items);
        Pipeline::from_build(move |env| {
            let counters = env.stage(0, "from_vec");
            let items = Arc::clone(&items);
            let iter = (0..items.len()).map(move |i| items[i].clone());
            Box::new(SourceStream::new(iter, counters))
        })
    }
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
            match call_user(counters.name(), &generator) {
                Ok(iter) => Box::new(SourceStream::new(iter.into_iter(), counters)) as Stream<T>,
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
}

impl<I> SourceStream<I> {
    fn new(iter: I, counters: Arc<StageCounters>) -> Self {
        SourceStream {
            iter: Some(iter),
            counters,
            born: None,
            first_done: false,
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
