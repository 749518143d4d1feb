//! TFRecord sources: one file as a stream of records, and [`TfRecordFiles`],
//! the file-level builder (paths or globs, shard by file, interleave).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    Env, Event, Interleave, Parallelism, Pipeline, PipelineError, Record, Sampler, Stream,
};
use crate::metrics::StageCounters;
use crate::tfrecord::{FileRecordReader, ReaderOptions};

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
    paths: Vec<PathBuf>,
    options: ReaderOptions,
    error: Option<String>,
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
            error: None,
        })
    }

    /// The records of one file, read lazily on first pull.
    pub fn tfrecord_file(path: impl Into<PathBuf>, options: ReaderOptions) -> Pipeline<Record> {
        let path: Arc<Path> = Arc::from(path.into());
        Pipeline::from_build(move |env: &Env| {
            let counters = env.stage(0, "tfrecord");
            Box::new(FileStream {
                path: Arc::clone(&path),
                options: options.clone(),
                reader: None,
                done: false,
                last_offset: 0,
                counters,
                env: env.clone(),
                sampler: Sampler::new(),
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
    pub fn interleave_with(self, options: Interleave) -> Pipeline<Record> {
        let reader = self.options;
        let error = self.error;
        Pipeline::from_vec(self.paths)
            .invalid_if(error.is_some(), || error.clone().unwrap_or_default())
            .interleave(options, move |path| {
                Pipeline::tfrecord_file(path, reader.clone())
            })
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
    reader: Option<FileRecordReader>,
    done: bool,
    last_offset: u64,
    counters: Arc<StageCounters>,
    env: Env,
    /// Times about one record in [`Sampler::MEAN_GAP`]; opening the file is
    /// always timed (and gives the first-output time).
    sampler: Sampler,
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
            match FileRecordReader::open(&self.path, self.options.clone()) {
                Ok(reader) => self.reader = Some(reader),
                Err(source) => {
                    self.done = true;
                    self.counters.add_error();
                    return Some(Event::Item(Err(PipelineError::Record {
                        stage: self.counters.name().to_string(),
                        source,
                    })));
                }
            }
        }
        let reader = self.reader.as_mut()?;
        // The one copy, out of the reader's buffer into a recycled one.
        let mut record = Record::new();
        let result = reader
            .read_record(record.buffer_mut())
            .map(|more| more.then_some(record));
        let offset = reader.position().offset;
        let framed = offset - self.last_offset;
        self.last_offset = offset;
        let out = match result {
            Ok(Some(record)) => {
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
                None
            }
            Err(source) => {
                self.done = true;
                self.reader = None;
                self.counters.add_error();
                Some(Event::Item(Err(PipelineError::Record {
                    stage: self.counters.name().to_string(),
                    source,
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
