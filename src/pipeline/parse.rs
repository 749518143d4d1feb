//! The schema parser as a pipeline stage, named `parse`: per batch of
//! serialized records (`tf.data`'s fast arrangement: batch, then parse) or
//! per record.
//!
//! A record that does not parse costs only itself: the stage emits one
//! [`PipelineError::Parse`] per bad record (with the record's file, index
//! and byte offset when it came from a TFRecord source), then the batch of
//! the records that did parse. A consumer that stops at the first error
//! (as `tf.data` does) fails with the location; under
//! [`ignore_errors`](Pipeline::ignore_errors) the bad record is skipped,
//! counted with its location, and the rest of its batch is kept.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::partition::{PartitionPlan, Scalar};
use super::state::{self, Sequential, StageState, StageStream, StateError};
use super::{Event, MapOptions, Parallelism, Pipeline, PipelineError, Record, Stream, TimedOut};
use crate::batch::Batch;
use crate::error::Location;
use crate::example::{BatchParser, ParseError, Schema};
use crate::metrics::StageCounters;

impl<R: AsRef<[u8]> + Send + 'static> Pipeline<Vec<R>> {
    /// Parses each batch of serialized `Example`s (a [`Record`] from a
    /// TFRecord source, or any bytes) under `schema` into one columnar
    /// [`Batch`], on `parallelism` workers, each with its own
    /// [`BatchParser`] (so buffers are reused). A bad record is an `Err`
    /// item of its own, ahead of the batch of the others (see the module
    /// doc); the batch then has fewer rows.
    ///
    /// ```no_run
    /// use tfpipe::pipeline::{Parallelism, Pipeline};
    /// use tfpipe::Schema;
    /// let schema = Schema::from_feature_texts(&["image_raw:uint8:784", "label:int64"])?;
    /// let batches = Pipeline::tfrecord_files(["train-*.tfrecord"])?
    ///     .interleave(4, 16)
    ///     .shuffle(10_000, 7)
    ///     .batch(256)
    ///     .parse_batches(schema, Parallelism::Auto)
    ///     .prefetch(2)
    ///     .start()?;
    /// for batch in batches {
    ///     let batch = batch?;
    ///     assert!(batch.num_rows <= 256);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parse_batches(
        self,
        schema: Schema,
        parallelism: impl Into<Parallelism>,
    ) -> Pipeline<Batch> {
        self.parse_batches_seeded(schema, parallelism, 0)
    }

    /// [`parse_batches`](Self::parse_batches), with the random choices of
    /// image features (`random_crop`, `flip`, jitters: see
    /// [`ImageOptions::from_text`](crate::image::ImageOptions::from_text))
    /// drawn from `seed`: record `i` of an epoch (counted in this stage's
    /// input order) draws from
    /// [`element_seed`](crate::image::element_seed)`(seed, epoch, i)`.
    /// Each record's draws are thus fixed whatever the worker count, and a
    /// pipeline resumed from a [state] draws what
    /// the uninterrupted one would have. [`parse_batches`](Self::parse_batches)
    /// is this with seed 0.
    ///
    /// ```no_run
    /// use tfpipe::pipeline::{Parallelism, Pipeline};
    /// use tfpipe::Schema;
    /// let schema = Schema::from_feature_texts(&[
    ///     "image/encoded:image:224x224x3:random_crop,flip,imagenet",
    ///     "image/class/label:int64",
    /// ])?;
    /// let batches = Pipeline::tfrecord_files(["train-*"])?
    ///     .records()
    ///     .shuffle(10_000, 7)
    ///     .batch(64)
    ///     .parse_batches_seeded(schema, Parallelism::Auto, 7)
    ///     .repeat(None)
    ///     .start()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parse_batches_seeded(
        self,
        schema: Schema,
        parallelism: impl Into<Parallelism>,
        seed: u64,
    ) -> Pipeline<Batch> {
        parse_stage(
            self,
            schema,
            Target::Batch(None),
            parallelism.into(),
            seed,
            |records: &Vec<R>| records.as_slice(),
        )
    }

    /// [`parse_batches_seeded`](Self::parse_batches_seeded), parsing into
    /// the batches the consumer hands back through `recycler` (see
    /// [`BatchRecycler`]) when it holds one, instead of new ones: a batch of
    /// 64 float32 224x224x3 images is a 38.5 MB buffer, which glibc's
    /// malloc otherwise maps, faults in page by page and unmaps for every
    /// batch. The batches are the same, in the same order, as without it.
    ///
    /// ```no_run
    /// use tfpipe::pipeline::{BatchRecycler, Parallelism, Pipeline};
    /// use tfpipe::Schema;
    /// let schema = Schema::from_feature_texts(&["image/encoded:image:224x224x3:random_crop,flip,imagenet"])?;
    /// let recycler = BatchRecycler::new(4);
    /// let batches = Pipeline::tfrecord_files(["train-*"])?
    ///     .records()
    ///     .batch(64)
    ///     .parse_batches_recycled(schema, Parallelism::Auto, 7, &recycler)
    ///     .start()?;
    /// for batch in batches {
    ///     let batch = batch?;
    ///     // ... use the batch, then hand its buffers back:
    ///     recycler.recycle(batch);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parse_batches_recycled(
        self,
        schema: Schema,
        parallelism: impl Into<Parallelism>,
        seed: u64,
        recycler: &BatchRecycler,
    ) -> Pipeline<Batch> {
        parse_stage(
            self,
            schema,
            Target::Batch(Some(recycler.clone())),
            parallelism.into(),
            seed,
            |records: &Vec<R>| records.as_slice(),
        )
    }

    /// [`parse_batches`](Self::parse_batches), with the features named in
    /// `partition_features` taken from each record's file path instead of
    /// the record: the `key=value` directories of a partitioned dataset
    /// (Spark's `partitionBy`; see [`crate::storage::partition_values`]).
    /// Each is a scalar `int64`, `float32` or `bytes` feature of `schema`
    /// (a name the schema lacks is added as a `bytes` scalar after its
    /// features; anything else fails at [`start`](Pipeline::start)); a
    /// record whose path has no value for it takes the feature's default,
    /// or is a bad record.
    ///
    /// ```
    /// use tfpipe::pipeline::{Parallelism, Pipeline};
    /// use tfpipe::tfrecord::{Compression, FileRecordWriter};
    /// use tfpipe::Schema;
    /// # let dir = tempfile::tempdir()?;
    /// # let example = |x: i64| {
    /// #     use tfpipe::example::{Example, proto::{Feature, Features, Int64List, feature::Kind}};
    /// #     let f = Feature { kind: Some(Kind::Int64List(Int64List { value: vec![x] })) };
    /// #     prost::Message::encode_to_vec(&Example { features: Some(Features { feature: [("x".to_string(), f)].into() }) })
    /// # };
    /// for (year, country) in [(2023, "fr"), (2024, "us")] {
    ///     let part = dir.path().join(format!("year={year}/country={country}"));
    ///     std::fs::create_dir_all(&part)?;
    ///     let mut w = FileRecordWriter::create(part.join("part-00000"), Compression::None)?;
    ///     w.write_record(&example(1))?;
    ///     w.finish()?;
    /// }
    /// let schema = Schema::from_feature_texts(&["x:int64", "year:int64"])?;
    /// let batch = Pipeline::tfrecord_files([dir.path().display().to_string()])? // the dataset directory
    ///     .records()
    ///     .batch(2)
    ///     .parse_batches_partitioned(schema, &["year", "country"], Parallelism::Fixed(1))
    ///     .start()?
    ///     .next()
    ///     .unwrap()?;
    /// assert_eq!(batch.column("year").unwrap().as_i64(), Some(&[2023, 2024][..]));
    /// assert_eq!(batch.column("country").unwrap().bytes(1), Some(&b"us"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parse_batches_partitioned<S: AsRef<str>>(
        self,
        schema: Schema,
        partition_features: &[S],
        parallelism: impl Into<Parallelism>,
    ) -> Pipeline<Batch> {
        let (schema, target) = match PartitionPlan::split(&schema, partition_features) {
            Ok((records, plan)) => (records, Target::Partitioned(Arc::new(plan))),
            Err(message) => {
                return parse_stage(
                    self,
                    schema,
                    Target::Batch(None),
                    parallelism.into(),
                    0,
                    |r: &Vec<R>| r.as_slice(),
                )
                .invalid("parse_batches_partitioned", || message);
            }
        };
        parse_stage(
            self,
            schema,
            target,
            parallelism.into(),
            0,
            |records: &Vec<R>| records.as_slice(),
        )
    }
}

impl<R: AsRef<[u8]> + Send + 'static> Pipeline<R> {
    /// Parses each serialized `Example` on its own into a one-row [`Batch`]
    /// (the per-example arrangement; batching first and using
    /// [`parse_batches`](Pipeline::parse_batches) is much faster). A bad
    /// record is an `Err` item in its place.
    pub fn parse_records(
        self,
        schema: Schema,
        parallelism: impl Into<Parallelism>,
    ) -> Pipeline<Batch> {
        self.parse_records_seeded(schema, parallelism, 0)
    }

    /// [`parse_records`](Self::parse_records), with the random choices of
    /// image features drawn from `seed`, the epoch and the record's index in
    /// the epoch, as in
    /// [`parse_batches_seeded`](Pipeline::parse_batches_seeded).
    pub fn parse_records_seeded(
        self,
        schema: Schema,
        parallelism: impl Into<Parallelism>,
        seed: u64,
    ) -> Pipeline<Batch> {
        parse_stage(
            self,
            schema,
            Target::Batch(None),
            parallelism.into(),
            seed,
            std::slice::from_ref,
        )
    }
}

/// Batches a consumer has finished with, handed back to the parse stage
/// that made them ([`Pipeline::parse_batches_recycled`]), whose workers
/// parse the next batches into their buffers rather than allocate new
/// ones. It holds at most `capacity` batches and drops any handed back
/// beyond that, so memory stays bounded by the pipeline's own buffering
/// plus `capacity` batches. A recycled batch is cleared and, if its columns
/// do not fit the schema, rebuilt before it is parsed into: nothing of its
/// old contents reaches a later batch. Clones share one pool.
///
/// ```
/// use tfpipe::pipeline::BatchRecycler;
/// use tfpipe::Schema;
/// let recycler = BatchRecycler::new(1);
/// let parser = tfpipe::example::BatchParser::new(Schema::from_feature_texts(&["x:int64"])?)?;
/// assert!(recycler.recycle(parser.empty_batch()));
/// assert!(!recycler.recycle(parser.empty_batch())); // full: dropped
/// assert_eq!(recycler.held(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct BatchRecycler {
    shared: Arc<Recycled>,
}

#[derive(Debug)]
struct Recycled {
    batches: Mutex<Vec<Batch>>,
    capacity: usize,
}

impl BatchRecycler {
    /// A recycler that keeps up to `capacity` batches (the pipeline's
    /// prefetch depth plus its workers is enough to reuse every buffer).
    pub fn new(capacity: usize) -> BatchRecycler {
        BatchRecycler {
            shared: Arc::new(Recycled {
                batches: Mutex::new(Vec::with_capacity(capacity)),
                capacity,
            }),
        }
    }

    /// Hands `batch` back for a later batch to be parsed into. Returns
    /// whether it was kept (`false`: the recycler was full and dropped it).
    pub fn recycle(&self, batch: Batch) -> bool {
        let mut batches = self.lock();
        if batches.len() >= self.shared.capacity {
            return false;
        }
        batches.push(batch);
        true
    }

    /// How many batches it holds now.
    pub fn held(&self) -> usize {
        self.lock().len()
    }

    /// A batch handed back, if any.
    fn take(&self) -> Option<Batch> {
        self.lock().pop()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Batch>> {
        // A panic while holding the lock leaves a valid Vec behind.
        self.shared
            .batches
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What a worker makes of one element: the errors of its bad records, in
/// order, and the batch of the others (`None` when every record was bad).
struct Parsed {
    bad: Vec<PipelineError>,
    batch: Option<Batch>,
}

/// An element with the epoch and the in-epoch index of its first record,
/// from which its images' random choices are seeded.
struct Seeded<T> {
    epoch: u64,
    first: u64,
    element: T,
}

/// What the `image_seed` stage stores: the epoch, and the records it has
/// passed in the epoch.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct SeedCount {
    epoch: u64,
    next: u64,
}

/// The parse stage; with image features that draw random choices, behind
/// an `image_seed` stage that numbers the records of each epoch.
fn parse_stage<T: Send + 'static, R: AsRef<[u8]> + 'static>(
    pipeline: Pipeline<T>,
    schema: Schema,
    target: Target,
    parallelism: Parallelism,
    seed: u64,
    records: fn(&T) -> &[R],
) -> Pipeline<Batch> {
    let random = BatchParser::new(schema.clone()).is_ok_and(|p| p.has_random_images());
    if !random {
        return parse_map(
            pipeline,
            schema,
            target,
            parallelism,
            move |element: &T| records(element),
            |_: &T| None,
        );
    }
    let seeded = pipeline.then("image_seed", move |env, up, _| {
        let step = move |s: &mut SeedCount, up: &mut Option<Stream<T>>| {
            Some(match up.as_mut()?.next()? {
                Event::Item(Ok(element)) => {
                    let first = s.next;
                    s.next += records(&element).len() as u64;
                    Event::Item(Ok(Seeded {
                        epoch: s.epoch,
                        first,
                        element,
                    }))
                }
                Event::Item(Err(err)) => Event::Item(Err(err)),
                Event::EpochEnd(e) => {
                    s.epoch += 1;
                    s.next = 0;
                    Event::EpochEnd(e)
                }
            })
        };
        let initial = SeedCount {
            epoch: env.epoch,
            next: 0,
        };
        Box::new(Sequential::starting_at(
            env,
            "image_seed",
            up,
            initial,
            step,
        )) as Stream<Seeded<T>>
    });
    parse_map(
        seeded,
        schema,
        target,
        parallelism,
        move |s: &Seeded<T>| records(&s.element),
        move |s: &Seeded<T>| Some((seed, s.epoch, s.first)),
    )
}

/// What a parse worker parses each element into.
enum Target {
    /// Columns split by each record's file path ([`parse_partitioned`]).
    Partitioned(Arc<PartitionPlan>),
    /// One batch: one the consumer handed back to the recycler when it
    /// holds one, else a new one.
    Batch(Option<BatchRecycler>),
}

/// The parallel parse of each element's records into `target`, then
/// [`Split`].
fn parse_map<E, R, F, S>(
    pipeline: Pipeline<E>,
    schema: Schema,
    target: Target,
    parallelism: Parallelism,
    records: F,
    seeds: S,
) -> Pipeline<Batch>
where
    E: Send + 'static,
    R: AsRef<[u8]> + 'static,
    F: Fn(&E) -> &[R] + Send + Sync + 'static,
    S: Fn(&E) -> Option<(u64, u64, u64)> + Send + Sync + 'static,
{
    // Check the schema now, so a bad one fails at `start`, not per element.
    let pipeline = match BatchParser::new(schema.clone()) {
        Ok(_) => pipeline,
        Err(_) => {
            let schema = schema.clone();
            pipeline.invalid_with(move || match BatchParser::new(schema.clone()) {
                Err(err) => PipelineError::Schema(err),
                Ok(_) => PipelineError::Config {
                    operator: "parse".into(),
                    reason: "the schema became valid".into(),
                },
            })
        }
    };
    let options = MapOptions {
        parallelism,
        deterministic: true,
    };
    pipeline
        .map_parallel_named(
            "parse",
            options,
            move || BatchParser::new(schema.clone()),
            move |parser, element: E| match parser {
                Ok(parser) => Ok({
                    if let Some((seed, epoch, first)) = seeds(&element) {
                        parser.set_image_seed(seed, epoch, first);
                    }
                    match &target {
                        Target::Partitioned(plan) => {
                            parse_partitioned(parser, plan, records(&element))
                        }
                        Target::Batch(recycler) => {
                            let batch = recycler.as_ref().and_then(BatchRecycler::take);
                            parse_element(parser, records(&element), batch)
                        }
                    }
                }),
                // Unreachable in practice: the same schema was checked above.
                Err(err) => Err(err.to_string()),
            },
        )
        .then_quiet(PENDING, |env, depth, up, saved| {
            let counters = env.stage(depth, "parse");
            let skip = match saved.map(|s| s.data::<Pending>(PENDING)) {
                Some(Ok(pending)) => pending.emitted,
                Some(Err(error)) => {
                    env.restore_failed(error);
                    0
                }
                None => 0,
            };
            Box::new(Split {
                up,
                counters,
                queue: VecDeque::new(),
                emitted: 0,
                skip,
            }) as Stream<Batch>
        })
}

/// The state name of a [`Split`] saved between the events of one element.
const PENDING: &str = "parse_pending";

/// What a [`Split`] stores when saved between the events of one element.
#[derive(serde::Serialize, serde::Deserialize)]
struct Pending {
    /// The element's events already returned.
    emitted: u64,
}

/// Turns each parsed element into its events: one error per bad record,
/// then the batch of the others.
///
/// State: with no events queued, the upstream's state as it is. Saved
/// between the events of one element, the upstream's state *before* that
/// element and how many of its events were returned: restore parses it
/// again and drops those.
struct Split {
    up: Stream<Parsed>,
    counters: Arc<StageCounters>,
    queue: VecDeque<Event<Batch>>,
    /// Events of the current element returned so far.
    emitted: u64,
    /// After a restore: events of the first element to drop.
    skip: u64,
}

impl Split {
    /// The next event, waiting on the upstream until `deadline` if one is
    /// given.
    fn next_by(&mut self, deadline: Option<Instant>) -> Result<Option<Event<Batch>>, TimedOut> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                self.emitted += 1;
                if self.skip > 0 {
                    self.skip -= 1;
                    continue;
                }
                return Ok(Some(event));
            }
            self.emitted = 0;
            let Some(next) = state::pull(&mut self.up, deadline)? else {
                return Ok(None);
            };
            match next {
                Event::Item(Ok(parsed)) => {
                    for err in parsed.bad {
                        self.counters.add_error();
                        self.queue.push_back(Event::Item(Err(err)));
                    }
                    if let Some(batch) = parsed.batch {
                        self.queue.push_back(Event::Item(Ok(batch)));
                    }
                }
                // Only a parsed element has events to skip.
                Event::Item(Err(err)) => {
                    self.skip = 0;
                    return Ok(Some(Event::Item(Err(err))));
                }
                Event::EpochEnd(e) => {
                    self.skip = 0;
                    return Ok(Some(Event::EpochEnd(e)));
                }
            }
        }
    }
}

impl Iterator for Split {
    type Item = Event<Batch>;

    fn next(&mut self) -> Option<Event<Batch>> {
        // With no deadline there is no time-out.
        self.next_by(None).ok().flatten()
    }
}

impl StageStream<Batch> for Split {
    fn next_until(&mut self, deadline: Instant) -> Result<Option<Event<Batch>>, TimedOut> {
        self.next_by(Some(deadline))
    }

    fn save(&self) -> Result<StageState, StateError> {
        if self.queue.is_empty() {
            return self.up.save();
        }
        let data = serde_json::json!(Pending {
            emitted: self.emitted
        });
        Ok(StageState::new(PENDING, data).with_input(self.up.save_before_last()?))
    }
}

/// Parses `records` into `batch` (its buffers reused), or a new batch.
fn parse_element<R: AsRef<[u8]> + 'static>(
    parser: &mut BatchParser,
    records: &[R],
    batch: Option<Batch>,
) -> Parsed {
    let mut batch = batch.unwrap_or_else(|| parser.empty_batch());
    let mut bad = Vec::new();
    parser.parse_into_skipping(records, &mut batch, |index, error| {
        bad.push(PipelineError::Parse {
            stage: "parse".to_string(),
            location: records.get(index).and_then(record_location),
            error,
        });
    });
    let keep = batch.num_rows > 0 || bad.is_empty();
    Parsed {
        bad,
        batch: keep.then_some(batch),
    }
}

/// [`parse_element`], adding the partition columns of `plan` from each
/// record's path. A record without its partition values is a bad record
/// (before the parser sees it); errors come in record order.
fn parse_partitioned<R: AsRef<[u8]> + 'static>(
    parser: &mut BatchParser,
    plan: &PartitionPlan,
    records: &[R],
) -> Parsed {
    let mut bad: Vec<(usize, PipelineError)> = Vec::new();
    let mut kept: Vec<(usize, &[u8], Vec<Scalar>)> = Vec::with_capacity(records.len());
    let mut last: Option<(Location, Vec<Scalar>)> = None;
    for (i, record) in records.iter().enumerate() {
        let location = record_location(record);
        // Records of one file share their values: look the path up once.
        let cached = match (&last, &location) {
            (Some((at, values)), Some(here)) if at.path == here.path => Some(values.clone()),
            _ => None,
        };
        let values = match cached {
            Some(values) => Ok(values),
            None => plan.values(location.as_ref().and_then(|l| l.path.as_deref())),
        };
        match values {
            Ok(values) => {
                if let Some(here) = &location {
                    last = Some((here.clone(), values.clone()));
                }
                kept.push((i, record.as_ref(), values));
            }
            Err((feature, reason)) => bad.push((
                i,
                PipelineError::Parse {
                    stage: "parse".to_string(),
                    location,
                    error: ParseError::Feature {
                        record: i,
                        feature,
                        reason,
                    },
                },
            )),
        }
    }
    let bytes: Vec<&[u8]> = kept.iter().map(|(_, b, _)| *b).collect();
    let mut batch = parser.empty_batch();
    let mut failed = vec![false; kept.len()];
    parser.parse_into_skipping(&bytes, &mut batch, |k, error| {
        failed[k] = true;
        let i = kept[k].0;
        bad.push((
            i,
            PipelineError::Parse {
                stage: "parse".to_string(),
                location: records.get(i).and_then(record_location),
                error: error.offset_record(i - k),
            },
        ));
    });
    let rows: Vec<Vec<Scalar>> = kept
        .into_iter()
        .zip(&failed)
        .filter(|(_, failed)| !**failed)
        .map(|((_, _, values), _)| values)
        .collect();
    plan.insert(&mut batch, &rows);
    bad.sort_by_key(|(i, _)| *i);
    let keep = batch.num_rows > 0 || bad.is_empty();
    Parsed {
        bad: bad.into_iter().map(|(_, e)| e).collect(),
        batch: keep.then_some(batch),
    }
}

/// Where a record came from, for records from a TFRecord source.
fn record_location<R: 'static>(record: &R) -> Option<Location> {
    let record = (record as &dyn Any).downcast_ref::<Record>()?;
    record.position().map(|p| p.location())
}
