//! TFRecord sources: one file as a stream of records, and [`TfRecordFiles`],
//! the file-level builder (paths or globs, shard by file, interleave).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::rank::{self, RankPlan, Segment};
use super::read_ahead::ReadAhead;
use super::record::{FileId, RecordPosition};
use super::state::{self, StageState, StageStream, StateError};
use super::{
    Env, Event, Interleave, Parallelism, Pipeline, PipelineError, Record, Sampler, Stream,
};
use crate::metrics::StageCounters;
use crate::storage::ReadOptions;
use crate::tfrecord::frame::framed_len;
use crate::tfrecord::{Compression, FileRecordReader, Position, ReaderOptions, RecordError};

/// TFRecord files to read: the file list, before it becomes records.
///
/// Compression is per file: from [`ReaderOptions::compression`] if set, else
/// from each file's name (`.gz` GZIP, `.zlib`/`.zz` ZLIB).
///
/// ```no_run
/// use tfpipe::pipeline::{Parallelism, Pipeline};
/// let records = Pipeline::tfrecord_files(["data/train-*.tfrecord"])?
///     .shard(2, 0)              // this worker's files
///     .interleave(4, 16);       // 4 files at a time, 16 records each
/// # Ok::<(), tfpipe::pipeline::PipelineError>(())
/// ```
#[derive(Clone)]
pub struct TfRecordFiles {
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) options: ReaderOptions,
    /// How objects are fetched (object-store URLs only).
    pub(crate) read: ReadOptions,
    error: Option<String>,
    /// This rank's share, from [`TfRecordFiles::rank`].
    pub(crate) rank: Option<RankPlan>,
}

impl Pipeline<Record> {
    /// The files named by `paths`; an entry with `*`, `?` or `[` is a glob
    /// (its matches sorted). Entries may be object-store URLs, globs included
    /// (`s3://bucket/train-*.tfrecord`; see [`crate::storage`]). Fails if an
    /// entry names no file.
    pub fn tfrecord_files<P: AsRef<str>>(
        paths: impl IntoIterator<Item = P>,
    ) -> Result<TfRecordFiles, PipelineError> {
        let files = crate::storage::resolve(paths)?;
        Ok(TfRecordFiles {
            paths: files,
            options: ReaderOptions::default(),
            read: ReadOptions::default(),
            error: None,
            rank: None,
        })
    }

    /// The records of one file, read lazily on first pull.
    pub fn tfrecord_file(path: impl Into<PathBuf>, options: ReaderOptions) -> Pipeline<Record> {
        Pipeline::tfrecord_file_at(path, options, Position::default())
    }

    /// The records of one file from `start` on (a record's frame, as a
    /// record index gives it), read lazily on first pull. A restored state
    /// takes precedence: it is a position past `start`.
    pub(crate) fn tfrecord_file_at(
        path: impl Into<PathBuf>,
        options: ReaderOptions,
        start: Position,
    ) -> Pipeline<Record> {
        Pipeline::tfrecord_file_read(path, options, ReadOptions::default(), start, None)
    }

    /// [`tfrecord_file_at`](Self::tfrecord_file_at), an object fetched as
    /// `read` says, through `ahead` where it is one of an interleave's files.
    pub(crate) fn tfrecord_file_read(
        path: impl Into<PathBuf>,
        options: ReaderOptions,
        read: ReadOptions,
        start: Position,
        ahead: Option<FileAhead>,
    ) -> Pipeline<Record> {
        let path: Arc<Path> = Arc::from(path.into());
        let fresh = FileState {
            record: start.record,
            offset: start.offset,
            done: false,
        };
        Pipeline::from_build(move |env: &Env| {
            let counters = env.stage(0, "tfrecord");
            let resumed = match env.resume_state().map(|s| s.data::<FileState>("tfrecord")) {
                Some(Ok(state)) => state,
                Some(Err(error)) => {
                    env.restore_failed(error);
                    fresh.clone()
                }
                None => fresh.clone(),
            };
            Box::new(FileStream {
                path: Arc::clone(&path),
                options: options.clone(),
                read: read.clone(),
                reader: None,
                file: None,
                done: resumed.done,
                start: Position {
                    record: resumed.record,
                    offset: resumed.offset,
                },
                next: Position {
                    record: resumed.record,
                    offset: resumed.offset,
                },
                last_offset: resumed.offset,
                counters,
                env: env.clone(),
                sampler: Sampler::new(),
                spare: None,
                ahead: ahead.clone(),
            }) as Stream<Record>
        })
    }
}

impl TfRecordFiles {
    /// The files, in order.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// How each file is read (CRC checks, corruption policy, compression).
    /// By default [`ReaderOptions::default`].
    pub fn reader_options(mut self, options: ReaderOptions) -> TfRecordFiles {
        self.options = options;
        self
    }

    /// How objects (URLs) are fetched: strategy, range size, and how much
    /// may be buffered ahead of the reader per object
    /// ([`ReadOptions::stream_buffer`], within `range_size *
    /// ranges_in_flight`); with `cycle_length` files interleaved, up to
    /// `cycle_length` times that. By default [`ReadOptions::default`].
    /// Local files ignore it.
    ///
    /// ```no_run
    /// use tfpipe::pipeline::Pipeline;
    /// use tfpipe::storage::ReadOptions;
    /// let records = Pipeline::tfrecord_files(["s3://bucket/train-*.tfrecord"])?
    ///     .read_options(ReadOptions { stream_buffer: 8 << 20, ..ReadOptions::default() })
    ///     .interleave(4, 16);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn read_options(mut self, read: ReadOptions) -> TfRecordFiles {
        self.read = read;
        self
    }

    /// Keeps files `index`, `index + num_shards`, ...: the shards are
    /// disjoint and cover the files. Needs `index < num_shards` (else
    /// [`Pipeline::start`] fails).
    pub fn shard(mut self, num_shards: usize, index: usize) -> TfRecordFiles {
        if num_shards == 0 || index >= num_shards {
            self.error.get_or_insert_with(|| {
                format!("shard({num_shards}, {index}): needs num_shards > 0 and index < num_shards")
            });
            self.paths.clear();
            return self;
        }
        self.paths = self
            .paths
            .into_iter()
            .skip(index)
            .step_by(num_shards)
            .collect();
        self
    }

    /// Reads `cycle_length` files at once on producer threads (one per open
    /// file, up to the cores computing), `block_length` records from each in
    /// turn, deterministically.
    pub fn interleave(self, cycle_length: usize, block_length: usize) -> Pipeline<Record> {
        self.interleave_with(
            Interleave::new(cycle_length, block_length).parallel(Parallelism::Auto),
        )
    }

    /// Reads the files with these interleave settings.
    ///
    /// After [`rank`](Self::rank), the records are this rank's share: its
    /// files, the first and last possibly in part.
    pub fn interleave_with(self, options: Interleave) -> Pipeline<Record> {
        let reader = self.options;
        let read = self.read;
        let error = self.error;
        let origin = self.paths.first().cloned();
        let segments: Vec<Segment> = match &self.rank {
            Some(plan) => plan.segments.clone(),
            None => self.paths.into_iter().map(Segment::whole_file).collect(),
        };
        // Each start (each epoch) sends its own GETs ahead, and drops them.
        let files: Arc<[_]> = segments.iter().map(Segment::opens_ahead).collect();
        let (budget, ahead_read) = (options.cycle_length, read.clone());
        let per_start = move || ReadAhead::new(Arc::clone(&files), budget, ahead_read.clone());
        let numbered = segments.into_iter().enumerate().collect();
        let records = Pipeline::from_vec_each_start(numbered, per_start)
            .invalid_if(error.is_some(), "tfrecord_files", || {
                error.clone().unwrap_or_default()
            })
            .interleave(options, move |((index, segment), ahead)| {
                let ahead = ahead.map(|ahead| FileAhead { index, ahead });
                segment.records(&reader, &read, ahead)
            })
            .with_origin(origin.as_deref());
        match &self.rank {
            Some(plan) => rank::apply(plan, records),
            None => records,
        }
    }

    /// Reads the files one after another on the pulling thread.
    pub fn records(self) -> Pipeline<Record> {
        self.interleave_with(Interleave::new(1, 1))
    }
}

impl From<TfRecordFiles> for Pipeline<Record> {
    fn from(files: TfRecordFiles) -> Pipeline<Record> {
        files.records()
    }
}

/// One file's records. Opens on the first pull; ends after an error (the
/// reader is fused), so a corrupt file ends that file, not the pipeline.
struct FileStream {
    path: Arc<Path>,
    options: ReaderOptions,
    read: ReadOptions,
    reader: Option<FileRecordReader>,
    /// The file's interned id, for the positions of its records.
    file: Option<FileId>,
    done: bool,
    /// Where reading starts (not at 0 when restored from a state).
    start: Position,
    /// The reader's position after the last record returned.
    next: Position,
    last_offset: u64,
    counters: Arc<StageCounters>,
    env: Env,
    /// Times about one record in [`Sampler::MEAN_GAP`]; opening the file is
    /// always timed (and gives the first-output time).
    sampler: Sampler,
    /// The buffer the next record is copied into, taken one record ahead
    /// (see [`Record::prefetch_for_write`]).
    spare: Option<Record>,
    /// The interleave's read-ahead, where this file is one of its files.
    ahead: Option<FileAhead>,
}

/// A file's place in an interleave's read-ahead.
#[derive(Clone)]
pub(crate) struct FileAhead {
    /// The file's place in the interleave's file list.
    pub(crate) index: usize,
    pub(crate) ahead: Arc<ReadAhead>,
}

impl FileStream {
    /// Opens the file at its start position, from the GET sent ahead for it
    /// if there is one; once open, sends the next file's GET ahead.
    fn open(&self) -> Result<FileRecordReader, RecordError> {
        let sent = self.ahead.as_ref().and_then(|a| a.ahead.claim(a.index));
        let options = self.options.clone();
        let opened = if self.start != Position::default() {
            // A GET sent ahead read from byte 0: dropped here, unread.
            FileRecordReader::open_at_with(&self.path, options, self.start, &self.read)
        } else if let Some(sent) = sent {
            FileRecordReader::open_started(&self.path, options, sent)
        } else {
            FileRecordReader::open_with(&self.path, options, &self.read)
        }?;
        if let Some(a) = &self.ahead {
            a.ahead.opened(a.index);
        }
        Ok(opened)
    }
}

impl Iterator for FileStream {
    type Item = Event<Record>;

    fn next(&mut self) -> Option<Event<Record>> {
        if self.done || self.env.cancelled() {
            return None;
        }
        // The first call opens the file: timed exactly, not a sample of the rest.
        let first = self.reader.is_none();
        let clock = self.sampler.clock(first);
        if first {
            match self.open() {
                Ok(reader) => {
                    self.reader = Some(reader);
                    let file = FileId::intern(&self.path);
                    self.file = Some(file);
                    let compression = self
                        .options
                        .compression
                        .unwrap_or_else(|| Compression::from_path(&self.path));
                    state::set_compression(file, compression);
                }
                Err(source) => {
                    self.done = true;
                    self.counters.add_error();
                    return Some(Event::Item(Err(PipelineError::Record {
                        stage: self.counters.name().to_string(),
                        error: source,
                    })));
                }
            }
        }
        let reader = self.reader.as_mut()?;
        // The one copy, out of the reader's buffer into a recycled one.
        let mut record = self.spare.take().unwrap_or_default();
        let result = reader
            .read_record(record.buffer_mut())
            .map(|more| more.then_some(record));
        let after = reader.position();
        let offset = after.offset;
        let framed = offset - self.last_offset;
        self.last_offset = offset;
        let out = match result {
            Ok(Some(mut record)) => {
                self.next = after;
                // A recycled buffer was last read on another thread; asking
                // for its lines a whole record ahead hides that wait.
                let spare = Record::new();
                spare.prefetch_for_write();
                self.spare = Some(spare);
                // The reader stands after the record just read (skipped
                // corrupt records before it are counted in `after.record`).
                if let Some(file) = self.file {
                    let framed_len = framed_len(record.len()) as u64;
                    record.set_position(Some(RecordPosition::in_file(
                        file,
                        after.record.saturating_sub(1),
                        offset.saturating_sub(framed_len),
                    )));
                }
                self.counters.add_in(1, framed);
                self.counters.add_out(1, record.len() as u64);
                if first {
                    self.counters.set_first_output(clock.elapsed());
                }
                Some(Event::Item(Ok(record)))
            }
            Ok(None) => {
                self.counters.add_in(0, framed);
                // Corrupt records the reader skipped (OnCorruption::Skip or
                // EndStream) are counted here, with their locations.
                for corruption in reader.corruptions() {
                    self.counters.add_skipped(corruption.to_string());
                }
                // Beyond the first few, the reader only counts them.
                let kept = reader.corruptions().len() as u64;
                self.counters
                    .add_skipped_uncited(reader.corruption_count().saturating_sub(kept));
                self.done = true;
                self.reader = None;
                self.spare = None;
                None
            }
            Err(source) => {
                self.done = true;
                self.reader = None;
                self.counters.add_error();
                Some(Event::Item(Err(PipelineError::Record {
                    stage: self.counters.name().to_string(),
                    error: source,
                })))
            }
        };
        self.sampler.finish(clock, first, &self.counters);
        if self.done {
            self.sampler.flush(&self.counters);
        }
        out
    }
}

/// A file source's state: where the next record starts, or that it is done.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct FileState {
    record: u64,
    offset: u64,
    done: bool,
}

impl StageStream<Record> for FileStream {
    fn save(&self) -> Result<StageState, StateError> {
        let state = FileState {
            record: self.next.record,
            offset: self.next.offset,
            done: self.done,
        };
        Ok(StageState::new("tfrecord", serde_json::json!(state)))
    }
}
