//! `cache`: keep the first complete pass (in memory, or in a TFRecord file)
//! and replay it in later epochs.
//!
//! A pass is kept only if it ran to the end without an error; otherwise the
//! next epoch reads the upstream again (so an error is not silently frozen
//! into the cache, and a pass cut short by `take` or a drop is not kept).

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use std::io::{Read, Seek, SeekFrom};

use super::record::{FileId, Record, RecordPosition};
use super::state::StageStream;
use super::{Event, Pipeline, PipelineError, Stream};
use crate::error::Location;
use crate::metrics::StageCounters;
use crate::tfrecord::frame::{FOOTER_LEN, HEADER_LEN};
use crate::tfrecord::{
    Compression, FileRecordReader, FileRecordWriter, ReaderOptions, RecordError, RecordReader,
};

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
    ///
    /// The file ends with a footer record holding the record count and a
    /// CRC-32C of every record's bytes, so it proves it is complete: a cache
    /// that was cut short (or has no footer) is an error before anything is
    /// replayed, and one whose records do not add up to its footer is an
    /// error at its end. If writing the cache fails, the elements still flow
    /// on (each exactly once) and the failure is one `Err` item after the
    /// element that could not be written; no cache file is left.
    pub fn cache_file(self, path: impl Into<PathBuf>) -> Pipeline<R> {
        let path: Arc<Path> = Arc::from(path.into());
        self.then_lazy("cache_file", move |env, upstream, counters| {
            let stage = counters.name().to_string();
            if path.is_file() {
                return match Replay::open(&path, stage, counters, env.clone()) {
                    Ok(replay) => Box::new(replay) as Stream<R>,
                    Err(err) => Box::new(std::iter::once(Event::Item(Err(err)))),
                };
            }
            let mut up = upstream();
            let env = env.clone();
            let mut writer = match FileRecordWriter::create(&path, Compression::None) {
                Ok(w) => Some(CacheWriter {
                    writer: w,
                    footer: Footer::default(),
                }),
                Err(source) => {
                    return Box::new(
                        std::iter::once(Event::Item(Err(PipelineError::Cache {
                            stage,
                            error: source,
                        })))
                        .chain(up),
                    );
                }
            };
            // A write error waits here until its element has gone out.
            let mut failed: Option<PipelineError> = None;
            Box::new(std::iter::from_fn(move || {
                if let Some(err) = failed.take() {
                    return Some(Event::Item(Err(err)));
                }
                let event = up.next();
                match &event {
                    Some(Event::Item(Ok(record))) => {
                        let len = record.as_ref().len() as u64;
                        counters.add_in(1, len);
                        counters.add_out(1, len);
                        if let Some(w) = writer.as_mut()
                            && let Err(source) = w.write(record.as_ref())
                        {
                            // Dropping the writer removes its temporary file.
                            writer = None;
                            counters.add_error();
                            failed = Some(PipelineError::Cache {
                                stage: stage.clone(),
                                error: source,
                            });
                        }
                    }
                    // An incomplete pass is not kept: dropping the writer
                    // removes its temporary file.
                    Some(Event::Item(Err(_))) => writer = None,
                    Some(Event::EpochEnd(_)) => {}
                    // A pass cut short by cancellation ends early too.
                    None if env.cancelled() => writer = None,
                    None => {
                        if let Some(w) = writer.take()
                            && let Err(source) = w.finish()
                        {
                            counters.add_error();
                            return Some(Event::Item(Err(PipelineError::Cache {
                                stage: stage.clone(),
                                error: source,
                            })));
                        }
                    }
                }
                event
            }))
        })
    }
}

/// The last record of a cache file: a magic tag, the record count and a
/// CRC-32C over the bytes of every record, in order.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Footer {
    records: u64,
    crc: u32,
}

impl Footer {
    const MAGIC: &'static [u8; 16] = b"tfpipe-cache-v1\0";
    const LEN: usize = 16 + 8 + 4;
    /// The footer's framed size in the file.
    const FRAMED: u64 = (HEADER_LEN + Footer::LEN + FOOTER_LEN) as u64;

    fn add(&mut self, record: &[u8]) {
        self.records += 1;
        self.crc = crc32c::crc32c_append(self.crc, record);
    }

    fn encode(&self) -> [u8; Footer::LEN] {
        let mut out = [0u8; Footer::LEN];
        out[..16].copy_from_slice(Footer::MAGIC);
        out[16..24].copy_from_slice(&self.records.to_le_bytes());
        out[24..].copy_from_slice(&self.crc.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Footer> {
        if bytes.len() != Footer::LEN || !bytes.starts_with(Footer::MAGIC) {
            return None;
        }
        let records = u64::from_le_bytes(bytes[16..24].try_into().ok()?);
        let crc = u32::from_le_bytes(bytes[24..].try_into().ok()?);
        Some(Footer { records, crc })
    }
}

struct CacheWriter {
    writer: FileRecordWriter,
    footer: Footer,
}

impl CacheWriter {
    fn write(&mut self, record: &[u8]) -> Result<(), RecordError> {
        #[cfg(test)]
        tests::injected_failure(self.footer.records)?;
        self.writer.write_record(record)?;
        self.footer.add(record);
        Ok(())
    }

    fn finish(mut self) -> Result<PathBuf, RecordError> {
        self.writer.write_record(&self.footer.encode())?;
        self.writer.finish()
    }
}

/// Replays a cache file, one record behind the reader so that the last
/// record (the footer) is never handed out, and checks the footer at the end.
struct Replay<R> {
    reader: FileRecordReader,
    expected: Footer,
    seen: Footer,
    /// The record read ahead.
    held: Option<R>,
    done: bool,
    path: Arc<Path>,
    /// The cache file, for the positions of replayed [`Record`]s.
    file: FileId,
    stage: String,
    counters: Arc<StageCounters>,
    env: super::Env,
}

impl<R: AsRef<[u8]> + for<'a> From<&'a [u8]>> Replay<R> {
    /// Opens the cache and reads its footer first, so a cut-short file fails
    /// before any record is replayed.
    fn open(
        path: &Arc<Path>,
        stage: String,
        counters: Arc<StageCounters>,
        env: super::Env,
    ) -> Result<Replay<R>, PipelineError> {
        let cache_error = |source| PipelineError::Cache {
            stage: stage.clone(),
            error: source,
        };
        let expected = read_footer(path).map_err(cache_error)?;
        let options = ReaderOptions {
            compression: Some(Compression::None),
            ..ReaderOptions::default()
        };
        let reader = FileRecordReader::open(path, options).map_err(cache_error)?;
        Ok(Replay {
            reader,
            expected,
            seen: Footer::default(),
            held: None,
            done: false,
            path: Arc::clone(path),
            file: FileId::intern(path),
            stage,
            counters,
            env,
        })
    }

    fn error(&mut self, source: RecordError) -> Option<Event<R>> {
        self.done = true;
        self.counters.add_error();
        Some(Event::Item(Err(PipelineError::Cache {
            stage: self.stage.clone(),
            error: source,
        })))
    }
}

impl<R: AsRef<[u8]> + for<'a> From<&'a [u8]> + 'static> Iterator for Replay<R> {
    type Item = Event<R>;

    fn next(&mut self) -> Option<Event<R>> {
        loop {
            if self.done || self.env.cancelled() {
                return None;
            }
            let start = self.reader.position();
            match self.reader.next_record() {
                Ok(Some(r)) => {
                    let mut record = R::from(r);
                    // A replayed `Record` is located in the cache file, where
                    // its bytes now come from (the cache reader fails on
                    // corruption, so nothing is skipped and `start` is its frame).
                    if let Some(record) = (&mut record as &mut dyn Any).downcast_mut::<Record>() {
                        record.set_position(Some(RecordPosition::in_file(
                            self.file,
                            start.record,
                            start.offset,
                        )));
                    }
                    let Some(previous) = self.held.replace(record) else {
                        continue;
                    };
                    self.seen.add(previous.as_ref());
                    self.counters.add_out(1, previous.as_ref().len() as u64);
                    return Some(Event::Item(Ok(previous)));
                }
                Ok(None) => {
                    let footer = self.held.take().and_then(|f| Footer::decode(f.as_ref()));
                    if footer != Some(self.seen) || self.seen != self.expected {
                        let source = incomplete(
                            &self.path,
                            format!(
                                "its footer promises {} records (CRC-32C {:#010x}); replay found {} (CRC-32C {:#010x})",
                                self.expected.records,
                                self.expected.crc,
                                self.seen.records,
                                self.seen.crc
                            ),
                        );
                        return self.error(source);
                    }
                    self.done = true;
                    return None;
                }
                Err(source) => return self.error(source),
            }
        }
    }
}

/// A cache replays from its own file or memory, which a state cannot name.
impl<R: AsRef<[u8]> + for<'a> From<&'a [u8]> + Send + 'static> StageStream<R> for Replay<R> {}

/// The footer of the cache file at `path`, read from its end.
fn read_footer(path: &Path) -> Result<Footer, RecordError> {
    let open = |source| RecordError::Open {
        path: path.to_path_buf(),
        error: source,
    };
    let mut file = std::fs::File::open(path).map_err(open)?;
    let len = file.metadata().map_err(open)?.len();
    let missing = || {
        incomplete(
            path,
            "it has no footer: it was cut short, or written by another program".to_string(),
        )
    };
    if len < Footer::FRAMED {
        return Err(missing());
    }
    let mut framed = [0u8; Footer::FRAMED as usize];
    let read = file
        .seek(SeekFrom::Start(len - Footer::FRAMED))
        .and_then(|_| file.read_exact(&mut framed));
    read.map_err(|source| RecordError::Io {
        location: Location {
            path: Some(path.to_path_buf()),
            record: 0,
            offset: len - Footer::FRAMED,
        },
        error: source,
    })?;
    let mut reader = RecordReader::new(&framed[..], ReaderOptions::default());
    match reader.next_record() {
        Ok(Some(bytes)) => Footer::decode(bytes).ok_or_else(missing),
        _ => Err(missing()),
    }
}

/// The error for a cache file that does not prove it is complete.
fn incomplete(path: &Path, why: String) -> RecordError {
    RecordError::Io {
        location: Location {
            path: Some(path.to_path_buf()),
            record: 0,
            offset: 0,
        },
        error: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("incomplete cache file ({why}); delete it to rebuild the cache"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        /// Fail the cache write of this record index on this thread.
        static FAIL_AT: Cell<Option<u64>> = const { Cell::new(None) };
    }

    pub(super) fn injected_failure(index: u64) -> Result<(), RecordError> {
        if FAIL_AT.with(Cell::get) == Some(index) {
            return Err(RecordError::Write {
                path: None,
                error: std::io::Error::other("injected: disk full"),
            });
        }
        Ok(())
    }

    /// A failed cache write costs no element: each one comes out exactly
    /// once, the failure is one error item, and no cache file is left.
    #[test]
    fn a_failed_cache_write_keeps_every_element() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("c.tfrecord");
        let records: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 3]).collect();
        FAIL_AT.with(|f| f.set(Some(4)));
        let items: Vec<_> = Pipeline::from_vec(records.clone())
            .cache_file(&cache)
            .start()
            .unwrap()
            .collect();
        FAIL_AT.with(|f| f.set(None));
        let errors = items.iter().filter(|r| r.is_err()).count();
        let good: Vec<Vec<u8>> = items.into_iter().filter_map(Result::ok).collect();
        assert_eq!(good, records);
        assert_eq!(errors, 1);
        assert!(!cache.exists());
        // Under ignore_errors nothing vanishes either.
        FAIL_AT.with(|f| f.set(Some(0)));
        let good: Vec<Vec<u8>> = Pipeline::from_vec(records.clone())
            .cache_file(&cache)
            .ignore_errors()
            .start()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        FAIL_AT.with(|f| f.set(None));
        assert_eq!(good, records);
    }

    #[test]
    fn footer_round_trips() {
        let mut f = Footer::default();
        f.add(b"abc");
        f.add(b"");
        assert_eq!(Footer::decode(&f.encode()), Some(f));
        assert_eq!(Footer::decode(b"tfpipe-cache-v1"), None);
    }
}
