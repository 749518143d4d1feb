//! `cache`: keep the first complete pass (in memory, or in a TFRecord file)
//! and replay it in later epochs.
//!
//! A pass is kept only if it ran to the end without an error; otherwise the
//! next epoch reads the upstream again (so an error is not silently frozen
//! into the cache, and a pass cut short by `take` or a drop is not kept).

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::record::{FileId, Record, RecordPosition};
use super::{Event, Pipeline, PipelineError, Stream};
use crate::tfrecord::{Compression, FileRecordReader, FileRecordWriter, ReaderOptions};

impl<T: Clone + Send + Sync + 'static> Pipeline<T> {
    /// Keeps the elements of the first complete pass in memory and replays
    /// them (cloned) in later epochs. Memory grows with the dataset: this is
    /// the one stage outside the memory bound.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use tfpipe::pipeline::Pipeline;
    /// let calls = Arc::new(AtomicUsize::new(0));
    /// let c = calls.clone();
    /// let v: Vec<u32> = Pipeline::from_generator(move || { c.fetch_add(1, Ordering::SeqCst); 0..3u32 })
    ///     .cache()
    ///     .repeat(Some(3))
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(v, [0, 1, 2, 0, 1, 2, 0, 1, 2]);
    /// assert_eq!(calls.load(Ordering::SeqCst), 1);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn cache(self) -> Pipeline<T> {
        let kept: Arc<Mutex<Option<Arc<Vec<T>>>>> = Arc::new(Mutex::new(None));
        self.then_lazy("cache", move |env, upstream, counters| {
            let full = kept.lock().unwrap_or_else(PoisonError::into_inner).clone();
            if let Some(items) = full {
                let mut i = 0;
                return Box::new(std::iter::from_fn(move || {
                    let item = items.get(i)?.clone();
                    i += 1;
                    counters.add_out(1, 0);
                    Some(Event::Item(Ok(item)))
                })) as Stream<T>;
            }
            let mut up = upstream();
            let kept = Arc::clone(&kept);
            let env = env.clone();
            let mut recording = Some(Vec::new());
            Box::new(std::iter::from_fn(move || {
                let event = up.next();
                match &event {
                    Some(Event::Item(Ok(item))) => {
                        counters.add_in(1, 0);
                        counters.add_out(1, 0);
                        if let Some(r) = recording.as_mut() {
                            r.push(item.clone());
                        }
                    }
                    Some(Event::Item(Err(_))) => recording = None,
                    Some(Event::EpochEnd(_)) => {}
                    // A pass cut short by cancellation ends early too: not kept.
                    None if env.cancelled() => recording = None,
                    None => {
                        if let Some(r) = recording.take() {
                            *kept.lock().unwrap_or_else(PoisonError::into_inner) =
                                Some(Arc::new(r));
                        }
                    }
                }
                event
            }))
        })
    }
}

impl<R> Pipeline<R>
where
    R: AsRef<[u8]> + for<'a> From<&'a [u8]> + Send + 'static,
{
    /// Keeps the records ([`Record`]s, `Vec<u8>`s, any bytes)
    /// of the first complete pass in the TFRecord file
    /// `path` (written to a temporary file, renamed into place when the pass
    /// completes) and reads them from there in later epochs and later runs.
    /// Delete the file to refresh the cache.
    pub fn cache_file(self, path: impl Into<PathBuf>) -> Pipeline<R> {
        let path: Arc<Path> = Arc::from(path.into());
        self.then_lazy("cache_file", move |env, upstream, counters| {
            let stage = counters.name().to_string();
            if path.is_file() {
                let options = ReaderOptions {
                    compression: Some(Compression::None),
                    ..ReaderOptions::default()
                };
                let mut reader = match FileRecordReader::open(&path, options) {
                    Ok(r) => r,
                    Err(source) => {
                        return Box::new(std::iter::once(Event::Item(Err(PipelineError::Cache {
                            stage,
                            source,
                        })))) as Stream<R>;
                    }
                };
                let mut failed = false;
                let env = env.clone();
                let file = FileId::intern(&path);
                return Box::new(std::iter::from_fn(move || {
                    if failed || env.cancelled() {
                        return None;
                    }
                    let start = reader.position();
                    match reader.next_record() {
                        Ok(Some(r)) => {
                            counters.add_out(1, r.len() as u64);
                            let mut record = R::from(r);
                            // A replayed `Record` is located in the cache
                            // file, where its bytes now come from (the cache
                            // reader fails on corruption, so nothing is
                            // skipped before it and `start` is its frame).
                            if let Some(record) =
                                (&mut record as &mut dyn Any).downcast_mut::<Record>()
                            {
                                record.set_position(Some(RecordPosition::in_file(
                                    file,
                                    start.record,
                                    start.offset,
                                )));
                            }
                            Some(Event::Item(Ok(record)))
                        }
                        Ok(None) => None,
                        Err(source) => {
                            failed = true;
                            Some(Event::Item(Err(PipelineError::Cache {
                                stage: stage.clone(),
                                source,
                            })))
                        }
                    }
                }));
            }
            let mut up = upstream();
            let env = env.clone();
            let mut writer = match FileRecordWriter::create(&path, Compression::None) {
                Ok(w) => Some(w),
                Err(source) => {
                    return Box::new(
                        std::iter::once(Event::Item(Err(PipelineError::Cache { stage, source })))
                            .chain(up),
                    );
                }
            };
            Box::new(std::iter::from_fn(move || {
                let event = up.next();
                match &event {
                    Some(Event::Item(Ok(record))) => {
                        let len = record.as_ref().len() as u64;
                        counters.add_in(1, len);
                        counters.add_out(1, len);
                        if let Some(w) = writer.as_mut() {
                            if let Err(source) = w.write_record(record.as_ref()) {
                                writer = None;
                                return Some(Event::Item(Err(PipelineError::Cache {
                                    stage: stage.clone(),
                                    source,
                                })));
                            }
                        }
                    }
                    // An incomplete pass is not kept: dropping the writer
                    // removes its temporary file.
                    Some(Event::Item(Err(_))) => writer = None,
                    Some(Event::EpochEnd(_)) => {}
                    // A pass cut short by cancellation ends early too.
                    None if env.cancelled() => writer = None,
                    None => {
                        if let Some(w) = writer.take() {
                            if let Err(source) = w.finish() {
                                return Some(Event::Item(Err(PipelineError::Cache {
                                    stage: stage.clone(),
                                    source,
                                })));
                            }
                        }
                    }
                }
                event
            }))
        })
    }
}
