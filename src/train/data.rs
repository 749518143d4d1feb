//! [`TrainData`]: the standard input pipeline of a training run, opened for
//! the run, per epoch, for validation, or at the position a checkpoint
//! recorded.
//!
//! Invariants: one seed schedule per run. The run's pipeline shuffles with
//! the run's seed inside one `repeat` (the shuffle reseeds itself each epoch
//! with [`epoch_seed`]), and a single pass opened for epoch `e` shuffles with
//! `epoch_seed(seed, e)` and no reshuffle, so both give epoch `e` the same
//! order: a run resumed without a pipeline position reads what the
//! uninterrupted run would have read. Only the read and shuffle stages
//! restart at an epoch marker; the parse workers and prefetch run on.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::batch::Values;
use crate::pipeline::{
    Exhausted, Parallelism, Pipeline, Rank, Record, Remainder, ShuffleOptions, split_by_weight,
};
use crate::rng::epoch_seed;
use crate::tfrecord::ReaderOptions;
use crate::{Batch, Schema};

use super::MissingLabels;
use super::prefetch::{BatchStream, BoxError};
use super::sequences::{PaddingMeter, Sequences};
use super::trainer::resume_pipeline;

/// Files read at once (a shuffled run's interleave); a mixture's sources
/// share them by weight.
const CYCLE_LENGTH: usize = 4;

/// The files, schema and batching of a training run: read (files
/// interleaved 4 at a time, 16 records each), shuffle, batch, parse per
/// batch, prefetch 2.
///
/// The command line, the demo and the Keras comparison's `bench-train` all
/// train through it, and so can any program:
///
/// ```no_run
/// use tfpipe::Schema;
/// use tfpipe::train::TrainData;
///
/// let schema = Schema::from_feature_texts(&["image_raw:uint8:784", "label:int64"])?;
/// let data = TrainData::new(["data/train-*.tfrecord"], schema, 256)
///     .shuffle_buffer(10_000)
///     .seed(7);
/// let validation = data.validation(["data/test-*.tfrecord"]);
/// // `trainer.fit(data.opener(None), Some(&mut || validation.open(0)))`
/// let mut epoch0 = data.open(0)?;
/// while let Some(batch) = epoch0.next_batch() {
///     let _rows = batch?.num_rows;
/// }
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// ```
#[derive(Debug, Clone)]
pub struct TrainData {
    /// Paths, globs or URLs of the TFRecord files.
    pub files: Vec<String>,
    /// How to read them. By default compression from each file's name.
    pub reader: ReaderOptions,
    /// What to parse (the model's inputs and the label).
    pub schema: Schema,
    /// Records per batch.
    pub batch_size: usize,
    /// The shuffle buffer in records; 0 reads in file order. By default 10,000.
    pub shuffle_buffer: usize,
    /// The run's seed. By default 0.
    pub seed: u64,
    /// Parse workers. By default [`Parallelism::Auto`].
    pub parallelism: Parallelism,
    /// This process's share of the files under a launcher; `None` reads
    /// them all. By default `None`.
    pub rank: Option<Rank>,
    /// For a text label: its classes, which turn each batch's label values
    /// into class ids right after parsing. By default `None` (an int64
    /// label holds class ids already).
    pub label_classes: Option<LabelClasses>,
    /// How variable-length token sequences are batched: padded per batch,
    /// bucketed by length, or packed. By default [`Sequences::Padded`].
    /// Applies to the schema's token feature (its first var-length int64
    /// feature); without one it changes nothing.
    pub sequences: Sequences,
    /// Pad tokens and all token cells of the batches read (shared by
    /// clones; [`validation`](Self::validation) data counts its own).
    pub padding: PaddingMeter,
    /// Weights that make `files` a mixture: one per entry of `files`, each
    /// entry then a source read on its own (ranked, files interleaved), the
    /// sources mixed by [`Pipeline::sample_from`] with the run's seed
    /// (renormalised when one runs out, so an epoch reads every record
    /// once; the proportions hold until the first source, relative to its
    /// weight, is done), then shuffled as one. Empty: `files` are one
    /// source. By default empty.
    pub weights: Vec<f64>,
    /// Features taken from the `key=value` directories of each record's
    /// file ([`Pipeline::parse_batches_partitioned`]). By default none.
    pub partition_features: Vec<String>,
    /// What a record without its label does: an error naming it, or
    /// skipped and counted ([`MissingLabels::skip`]). By default an error.
    pub missing_labels: MissingLabels,
}

impl TrainData {
    /// `files` parsed with `schema` into batches of `batch_size`, with the
    /// defaults the fields list.
    pub fn new<S: Into<String>>(
        files: impl IntoIterator<Item = S>,
        schema: Schema,
        batch_size: usize,
    ) -> TrainData {
        TrainData {
            files: files.into_iter().map(Into::into).collect(),
            reader: ReaderOptions::default(),
            schema,
            batch_size,
            shuffle_buffer: 10_000,
            seed: 0,
            parallelism: Parallelism::Auto,
            rank: None,
            label_classes: None,
            sequences: Sequences::Padded,
            padding: PaddingMeter::default(),
            weights: Vec::new(),
            partition_features: Vec::new(),
            missing_labels: MissingLabels::default(),
        }
    }

    /// A weighted mixture of sources (see [`weights`](Self::weights)):
    /// `(files, weight)` pairs, each `files` a path, glob or directory.
    pub fn mixture<S: Into<String>>(
        mut self,
        sources: impl IntoIterator<Item = (S, f64)>,
    ) -> TrainData {
        let (files, weights) = sources.into_iter().map(|(f, w)| (f.into(), w)).unzip();
        self.files = files;
        self.weights = weights;
        self
    }

    /// Sets how token sequences are batched.
    pub fn sequences(mut self, sequences: Sequences) -> TrainData {
        self.sequences = sequences;
        self
    }

    /// The token feature: the schema's first var-length int64 feature that
    /// is not the label (what the embedding model reads).
    pub fn token_feature(&self) -> Option<&str> {
        super::sequences::token_feature(&self.schema)
    }

    /// Sets the shuffle buffer (0: file order).
    pub fn shuffle_buffer(mut self, records: usize) -> TrainData {
        self.shuffle_buffer = records;
        self
    }

    /// Sets the run's seed.
    pub fn seed(mut self, seed: u64) -> TrainData {
        self.seed = seed;
        self
    }

    /// Sets the parse workers.
    pub fn parallelism(mut self, parallelism: Parallelism) -> TrainData {
        self.parallelism = parallelism;
        self
    }

    /// Sets the reader options (compression, CRC checks, corruption policy).
    pub fn reader(mut self, reader: ReaderOptions) -> TrainData {
        self.reader = reader;
        self
    }

    /// Reads only `rank`'s share of the files (equal on every rank).
    pub fn rank(mut self, rank: Option<Rank>) -> TrainData {
        self.rank = rank;
        self
    }

    /// Validation data read like this data, but from `files`, in file order
    /// (no shuffle) and whole on every rank (so every rank reports the same
    /// numbers).
    pub fn validation<S: Into<String>>(&self, files: impl IntoIterator<Item = S>) -> TrainData {
        TrainData {
            files: files.into_iter().map(Into::into).collect(),
            shuffle_buffer: 0,
            rank: None,
            padding: PaddingMeter::default(),
            weights: Vec::new(),
            missing_labels: self.missing_labels.fresh(),
            ..self.clone()
        }
    }

    /// The records, shuffled or not: of the files, or of the mixture the
    /// weights make of them (mixed before the one shuffle, so the memory
    /// bound is the same).
    fn records(
        &self,
        shuffle_seed: u64,
        reshuffle_each_epoch: bool,
    ) -> Result<Pipeline<Record>, BoxError> {
        let interleave = self.shuffle_buffer > 0;
        let read = if self.weights.is_empty() {
            self.source(&self.files, interleave, CYCLE_LENGTH)?
        } else {
            if self.weights.len() != self.files.len() {
                return Err(format!(
                    "{} weights for {} sources: one weight per entry of the files",
                    self.weights.len(),
                    self.files.len()
                )
                .into());
            }
            // The sources share the files open at once, by weight.
            let cycles = split_by_weight(CYCLE_LENGTH, &self.weights);
            let sources = self
                .files
                .iter()
                .zip(cycles)
                .map(|(files, cycle)| self.source(std::slice::from_ref(files), interleave, cycle))
                .collect::<Result<Vec<_>, _>>()?;
            // Seeded like the shuffle: epoch `e` of the run and a pass
            // opened for epoch `e` draw the same sequence.
            Pipeline::sample_from(sources, &self.weights, shuffle_seed, Exhausted::Renormalize)
        };
        Ok(if self.shuffle_buffer > 0 {
            read.shuffle_with(ShuffleOptions {
                buffer_size: self.shuffle_buffer,
                seed: shuffle_seed,
                reshuffle_each_epoch,
                early_start: false,
            })
        } else {
            read
        })
    }

    /// The records of `patterns` (this rank's share), `cycle` files
    /// interleaved or read in order.
    fn source(
        &self,
        patterns: &[String],
        interleave: bool,
        cycle: usize,
    ) -> Result<Pipeline<Record>, BoxError> {
        let mut files = Pipeline::tfrecord_files(patterns)?.reader_options(self.reader.clone());
        if let Some(rank) = self.rank {
            files = files.rank(rank, Remainder::Drop)?;
        }
        Ok(if interleave {
            files.interleave(cycle, 16)
        } else {
            files.records()
        })
    }

    /// `records` batched and parsed; `epoch` is the run's epoch they start in.
    fn batches(&self, records: Pipeline<Record>, epoch: u64) -> Pipeline<Batch> {
        let batches = records.batch(self.batch_size);
        let parsed = if self.partition_features.is_empty() {
            // Image features with random options draw from the run's seed.
            batches.parse_batches_seeded(self.schema.clone(), self.parallelism, self.seed)
        } else {
            batches.parse_batches_partitioned(
                self.schema.clone(),
                &self.partition_features,
                self.parallelism,
            )
        };
        let parsed = self
            .missing_labels
            .apply(self.schema.label.as_deref(), epoch, parsed);
        let parsed = match &self.label_classes {
            Some(classes) => classes.apply(parsed),
            None => parsed,
        };
        let Some(tokens) = self.token_feature().map(str::to_string) else {
            return parsed.prefetch(2);
        };
        let label = self.schema.label.as_deref();
        let meter = self.padding.clone();
        self.sequences
            .apply(parsed, &tokens, label, self.batch_size)
            .map(move |batch: Batch| {
                meter.record(&batch, &tokens);
                batch
            })
            .prefetch(2)
    }

    /// The whole run's pipeline: read, shuffle with the run's seed, `repeat`
    /// forever (an epoch marker ends each pass), batch (never across an
    /// epoch), parse per batch, prefetch.
    pub fn run_pipeline(&self) -> Result<Pipeline<Batch>, BoxError> {
        let records = self.records(self.seed, true)?.repeat(None);
        Ok(self.batches(records, 0))
    }

    /// The whole run from its start.
    pub fn open_run(&self) -> Result<Box<dyn BatchStream>, BoxError> {
        Ok(Box::new(self.run_pipeline()?.start()?))
    }

    /// One pass over the data, in the order the whole run's pipeline gives
    /// epoch `epoch`: validation data (epoch 0, unshuffled), and each epoch
    /// of a run resumed without a pipeline position.
    pub fn open(&self, epoch: u64) -> Result<Box<dyn BatchStream>, BoxError> {
        let records = self.records(epoch_seed(self.seed, epoch), false)?;
        Ok(Box::new(self.batches(records, epoch).start()?))
    }

    /// What [`Trainer::fit`](super::Trainer::fit) calls to open each epoch's
    /// data: the whole run's pipeline from its start, or from `position`,
    /// the pipeline position a resumed checkpoint recorded (the next batch
    /// the interrupted run would have trained on). A checkpoint without one
    /// resumes at the start of its epoch, with one pass per epoch
    /// ([`open`](Self::open)).
    pub fn opener(
        &self,
        position: Option<serde_json::Value>,
    ) -> impl FnMut(u64) -> Result<Box<dyn BatchStream>, BoxError> + use<> {
        let data = self.clone();
        let mut resume_at = position;
        move |epoch: u64| {
            if let Some(saved) = resume_at.take() {
                let pipeline = data.run_pipeline()?;
                return resume_pipeline(&pipeline, &saved).map_err(|e| {
                    format!("{e} (resume with the data options the checkpoint was trained with)")
                        .into()
                });
            }
            if epoch == 0 {
                data.open_run()
            } else {
                data.open(epoch)
            }
        }
    }
}

impl TrainData {
    /// What the pipeline's shape depends on, for a checkpoint to record: a
    /// resume is exact only with the same batch size, shuffle buffer, seed,
    /// ranks and files (see [`DataFingerprint::differences`]). Resolves the
    /// files and reads a small sample of each local one.
    pub fn fingerprint(&self) -> Result<DataFingerprint, BoxError> {
        let files = crate::storage::resolve(&self.files)?
            .iter()
            .map(|path| FileFingerprint::of(path))
            .collect::<Result<_, _>>()?;
        Ok(DataFingerprint {
            batch_size: self.batch_size,
            shuffle_buffer: self.shuffle_buffer,
            seed: self.seed,
            rank: self.rank.map(|r| (r.rank(), r.world_size())),
            files,
            mixture: self
                .files
                .iter()
                .zip(&self.weights)
                .map(|(files, weight)| format!("{files}={weight}"))
                .collect(),
            sequences: match &self.sequences {
                Sequences::Padded => String::new(),
                other => other.describe(),
            },
            skip_missing_labels: self.missing_labels.skips(),
        })
    }
}

/// What a training pipeline's order depends on, recorded in checkpoints so
/// that a resume with other data options is refused rather than training a
/// truncated or repeated epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFingerprint {
    /// Records per batch.
    pub batch_size: usize,
    /// The shuffle buffer in records.
    pub shuffle_buffer: usize,
    /// The run's seed.
    pub seed: u64,
    /// `(rank, world_size)` under a launcher.
    pub rank: Option<(usize, usize)>,
    /// Every file, in reading order.
    pub files: Vec<FileFingerprint>,
    /// For a mixture, its sources as `FILES=WEIGHT` ([`TrainData::weights`]);
    /// empty for one source (and in checkpoints from before mixtures).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mixture: Vec<String>,
    /// How token sequences are batched when not padded per batch
    /// ([`Sequences::describe`]); empty for padding (and in checkpoints
    /// from before bucketing and packing).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sequences: String,
    /// Whether records without a label are skipped ([`MissingLabels`]):
    /// the skip is a stage of the pipeline, so its position holds it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_missing_labels: bool,
}

/// One data file as a checkpoint saw it: its path, size and, for a local
/// file, a hash of its first and last 4 KiB (cheap, and different for any
/// other shard of the same size). Objects are known by path and size alone
/// (reading them would cost two requests each).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileFingerprint {
    /// The path or URL.
    pub path: String,
    /// The size in bytes.
    pub size: u64,
    /// SHA-256 (hex) of the first and last 4 KiB, for a local file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<String>,
}

/// Bytes hashed at each end of a local file.
const SAMPLE_BYTES: u64 = 4096;

impl FileFingerprint {
    fn of(path: &Path) -> Result<FileFingerprint, BoxError> {
        let size = crate::storage::size_of(path)?;
        let sample = if crate::storage::is_url(path) {
            None
        } else {
            let head = 0..size.min(SAMPLE_BYTES);
            let tail = size.saturating_sub(SAMPLE_BYTES)..size;
            let mut hash = Sha256::new();
            for part in crate::storage::read_ranges(path, &[head, tail])? {
                hash.update(&part);
            }
            Some(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
        };
        Ok(FileFingerprint {
            path: path.to_string_lossy().into_owned(),
            size,
            sample,
        })
    }
}

impl DataFingerprint {
    /// How `now` differs from this recorded fingerprint, one line per
    /// difference (empty: the same data, read the same way).
    ///
    /// ```
    /// use tfpipe::train::DataFingerprint;
    /// let then = DataFingerprint { batch_size: 64, shuffle_buffer: 10_000, seed: 0, rank: None, files: vec![], mixture: vec![], sequences: String::new(), skip_missing_labels: false };
    /// let now = DataFingerprint { batch_size: 32, ..then.clone() };
    /// assert_eq!(then.differences(&now), ["batch size 64, now 32"]);
    /// ```
    pub fn differences(&self, now: &DataFingerprint) -> Vec<String> {
        let mut out = Vec::new();
        let mut differ = |what: &str, then: String, now: String| {
            if then != now {
                out.push(format!("{what} {then}, now {now}"));
            }
        };
        differ(
            "batch size",
            self.batch_size.to_string(),
            now.batch_size.to_string(),
        );
        differ(
            "shuffle buffer",
            self.shuffle_buffer.to_string(),
            now.shuffle_buffer.to_string(),
        );
        differ("seed", self.seed.to_string(), now.seed.to_string());
        let rank = |r: Option<(usize, usize)>| match r {
            Some((r, w)) => format!("rank {r} of {w}"),
            None => "no ranks".to_string(),
        };
        differ("ranks:", rank(self.rank), rank(now.rank));
        let mixture = |m: &[String]| match m {
            [] => "none".to_string(),
            sources => sources.join(" "),
        };
        differ("mixture", mixture(&self.mixture), mixture(&now.mixture));
        let sequences = |s: &str| match s {
            "" => "padded".to_string(),
            mode => mode.to_string(),
        };
        differ(
            "token batching",
            sequences(&self.sequences),
            sequences(&now.sequences),
        );
        let unlabelled = |skip: bool| match skip {
            true => "skipped",
            false => "an error",
        };
        differ(
            "records without a label:",
            unlabelled(self.skip_missing_labels).into(),
            unlabelled(now.skip_missing_labels).into(),
        );
        let paths = |f: &[FileFingerprint]| f.iter().map(|f| f.path.clone()).collect::<Vec<_>>();
        if paths(&self.files) != paths(&now.files) {
            out.push(format!(
                "files: {} then, {} now ({})",
                self.files.len(),
                now.files.len(),
                list_change(&paths(&self.files), &paths(&now.files))
            ));
            return out;
        }
        for (then, now) in self.files.iter().zip(&now.files) {
            if then.size != now.size {
                out.push(format!(
                    "{}: {} bytes, now {}",
                    then.path, then.size, now.size
                ));
            } else if then.sample.is_some() && now.sample.is_some() && then.sample != now.sample {
                out.push(format!("{}: its content changed (same size)", then.path));
            }
        }
        out
    }

    /// Whether the only difference from `now` is the batch size: a resume
    /// that may be forced, at the cost of exactness.
    pub fn only_batch_size_differs(&self, now: &DataFingerprint) -> bool {
        self.batch_size != now.batch_size
            && DataFingerprint {
                batch_size: now.batch_size,
                ..self.clone()
            }
            .differences(now)
            .is_empty()
    }
}

/// `+added, -removed` (the first of each), or `reordered`.
fn list_change(then: &[String], now: &[String]) -> String {
    let added: Vec<&String> = now.iter().filter(|p| !then.contains(p)).collect();
    let removed: Vec<&String> = then.iter().filter(|p| !now.contains(p)).collect();
    let mut parts = Vec::new();
    if let Some(first) = added.first() {
        parts.push(format!("{} added, first {first}", added.len()));
    }
    if let Some(first) = removed.first() {
        parts.push(format!("{} removed, first {first}", removed.len()));
    }
    if parts.is_empty() {
        "the same files in another order".to_string()
    } else {
        parts.join("; ")
    }
}

/// The classes of a text label (`bytes` in the records, such as TensorFlow
/// datasets' `"cat"`/`"dog"` labels): the class names in class-id order, and
/// the mapping that replaces a batch's label values by their ids.
///
/// ```
/// use tfpipe::batch::{Batch, Column, Values};
/// use tfpipe::train::LabelClasses;
///
/// let classes = LabelClasses::new("label", vec!["cat".into(), "dog".into()]);
/// let batch = Batch {
///     num_rows: 2,
///     columns: vec![Column {
///         name: "label".into(),
///         values: Values::Bytes { data: b"dogcat".to_vec(), offsets: vec![0, 3, 6] },
///         row_splits: vec![],
///         inner_shape: vec![],
///     }],
/// };
/// let ids = classes.relabel(batch)?;
/// assert_eq!(ids.column("label").unwrap().as_i64(), Some(&[1, 0][..]));
/// # Ok::<(), tfpipe::train::UnknownLabel>(())
/// ```
#[derive(Debug, Clone)]
pub struct LabelClasses {
    label: String,
    names: Arc<[String]>,
    ids: Arc<HashMap<Vec<u8>, i64>>,
}

/// A text label value that is not one of the classes.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "label {label:?} = {value:?} is not one of the {classes} classes the model was trained with ({known})"
)]
pub struct UnknownLabel {
    /// The label feature.
    pub label: String,
    /// The value found.
    pub value: String,
    /// How many classes there are.
    pub classes: usize,
    /// The first few of them, for the message.
    pub known: String,
}

/// The most distinct values a counted text label may have (as the
/// converters' cap): more is an id or free text, not a class label.
const MAX_TEXT_CLASSES: usize = 100_000;

impl LabelClasses {
    /// The label feature.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The classes of `label`, in class-id order.
    pub fn new(label: impl Into<String>, names: Vec<String>) -> LabelClasses {
        let ids = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_bytes().to_vec(), i as i64))
            .collect();
        LabelClasses {
            label: label.into(),
            names: names.into(),
            ids: Arc::new(ids),
        }
    }

    /// Counts the distinct values of the text label `label` in `files` in
    /// one pass, and takes them, sorted, as the classes: for data that no
    /// schema file describes (TensorFlow-written records). A label among
    /// `partition_features` comes from the files' `key=value` directories,
    /// as in training. A record without the label is passed over (training
    /// decides what becomes of it: an error, or skipped with
    /// [`MissingLabels::skip`]). Fails on a bad record or more than 100,000
    /// values.
    pub fn count(
        files: &[String],
        reader: crate::tfrecord::ReaderOptions,
        label: &str,
        partition_features: &[String],
    ) -> Result<LabelClasses, BoxError> {
        let batches =
            super::classes::label_batches(files, reader, label, "bytes", partition_features)?;
        let mut seen = BTreeSet::new();
        for batch in batches {
            let batch = batch?;
            let Some(column) = batch.column(label) else {
                continue;
            };
            for i in 0..column.values.len() {
                if let Some(value) = column.values.bytes(i)
                    && !seen.contains(value)
                {
                    if seen.len() == MAX_TEXT_CLASSES {
                        return Err(format!(
                            "label {label:?}: more than {MAX_TEXT_CLASSES} distinct text values; that is not a class label"
                        )
                        .into());
                    }
                    seen.insert(value.to_vec());
                }
            }
        }
        let names = seen
            .into_iter()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .collect();
        Ok(LabelClasses::new(label, names))
    }

    /// The class names, in class-id order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// `batch` with its text label column replaced by the class ids.
    pub fn relabel(&self, mut batch: Batch) -> Result<Batch, UnknownLabel> {
        let Some(column) = batch.columns.iter_mut().find(|c| c.name == self.label) else {
            return Ok(batch);
        };
        let Values::Bytes { data, offsets } = &column.values else {
            return Ok(batch);
        };
        let ids = offsets
            .windows(2)
            .map(|w| {
                let value = &data[w[0]..w[1]];
                self.ids
                    .get(value)
                    .copied()
                    .ok_or_else(|| self.unknown(value))
            })
            .collect::<Result<Vec<i64>, UnknownLabel>>()?;
        column.values = Values::Int64(ids);
        Ok(batch)
    }

    fn unknown(&self, value: &[u8]) -> UnknownLabel {
        let mut known: Vec<&str> = self.names.iter().take(5).map(String::as_str).collect();
        if self.names.len() > 5 {
            known.push("...");
        }
        UnknownLabel {
            label: self.label.clone(),
            value: String::from_utf8_lossy(value).into_owned(),
            classes: self.names.len(),
            known: known.join(", "),
        }
    }

    /// `batches` with their text labels turned into class ids.
    pub fn apply(&self, batches: Pipeline<Batch>) -> Pipeline<Batch> {
        let classes = self.clone();
        batches.try_map(move |batch| classes.relabel(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::Example;
    use crate::example::proto::{Feature, Features, Int64List, feature};
    use crate::tfrecord::{Compression, FileRecordWriter};
    use crate::train::BatchEvent;

    fn write(path: &Path, ids: std::ops::Range<i64>) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut w = FileRecordWriter::create(path, Compression::None).unwrap();
        for id in ids {
            let f = Feature {
                kind: Some(feature::Kind::Int64List(Int64List { value: vec![id] })),
            };
            let example = Example {
                features: Some(Features {
                    feature: [("id".to_string(), f)].into(),
                }),
            };
            w.write_record(&prost::Message::encode_to_vec(&example))
                .unwrap();
        }
        w.finish().unwrap();
    }

    fn ids(batch: &Batch) -> Vec<i64> {
        batch.columns[0].as_i64().unwrap().to_vec()
    }

    /// A mixture reads every record of every source once per epoch, a new
    /// order each epoch, and one pass opened for epoch `e` (a run resumed
    /// without a position) reads what the whole run reads in epoch `e`.
    #[test]
    fn the_token_batching_mode_is_part_of_the_fingerprint() {
        let then = DataFingerprint {
            batch_size: 32,
            shuffle_buffer: 0,
            seed: 0,
            rank: None,
            files: vec![],
            mixture: vec![],
            sequences: String::new(),
            skip_missing_labels: false,
        };
        let skipping = DataFingerprint {
            skip_missing_labels: true,
            ..then.clone()
        };
        assert_eq!(
            then.differences(&skipping),
            ["records without a label: an error, now skipped"]
        );
        let packed = DataFingerprint {
            sequences: Sequences::Packed { length: 64 }.describe(),
            ..then.clone()
        };
        assert_eq!(
            then.differences(&packed),
            ["token batching padded, now packed into rows of 64 tokens"]
        );
        assert!(!then.only_batch_size_differs(&packed));
        // A checkpoint from before the field reads as padded.
        let mut json = serde_json::to_value(&then).unwrap();
        json.as_object_mut().unwrap().remove("sequences");
        let old: DataFingerprint = serde_json::from_value(json).unwrap();
        assert!(old.differences(&then).is_empty());
    }

    /// Another seed or another rank is another stream: a resume with
    /// either is refused, naming it (the CLI keeps the checkpoint's seed,
    /// so a library caller is the one who can change it).
    #[test]
    fn the_seed_and_the_ranks_are_part_of_the_fingerprint() {
        let then = DataFingerprint {
            batch_size: 32,
            shuffle_buffer: 100,
            seed: 1,
            rank: Some((0, 2)),
            files: vec![],
            mixture: vec![],
            sequences: String::new(),
            skip_missing_labels: false,
        };
        let now = DataFingerprint {
            seed: 2,
            rank: Some((1, 3)),
            ..then.clone()
        };
        assert_eq!(
            then.differences(&now),
            ["seed 1, now 2", "ranks: rank 0 of 2, now rank 1 of 3"]
        );
        let alone = DataFingerprint {
            rank: None,
            ..then.clone()
        };
        assert_eq!(
            then.differences(&alone),
            ["ranks: rank 0 of 2, now no ranks"]
        );
        assert!(!then.only_batch_size_differs(&now));
    }

    /// The run's seed reaches the parse stage: random image options draw
    /// from it (they drew from seed 0 whatever `--seed` said).
    #[test]
    fn random_image_options_draw_from_the_runs_seed() {
        use crate::example::proto::BytesList;
        let jpeg = std::fs::read("testdata/images/china_q90.jpg").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("part-0");
        let mut w = FileRecordWriter::create(&path, Compression::None).unwrap();
        for _ in 0..4 {
            let image = Feature {
                kind: Some(feature::Kind::BytesList(BytesList {
                    value: vec![jpeg.clone()],
                })),
            };
            let example = Example {
                features: Some(Features {
                    feature: [("image".to_string(), image)].into(),
                }),
            };
            w.write_record(&prost::Message::encode_to_vec(&example))
                .unwrap();
        }
        w.finish().unwrap();
        let schema = Schema::from_feature_texts(&["image:image:6x6x3:random_crop,flip"]).unwrap();
        let first_batch = |seed: u64| {
            let data = TrainData::new([path.display().to_string()], schema.clone(), 4)
                .shuffle_buffer(0)
                .seed(seed);
            let mut it = data.run_pipeline().unwrap().start().unwrap();
            let batch = it.next().unwrap().unwrap();
            batch.columns[0].as_u8().unwrap().to_vec()
        };
        assert_eq!(first_batch(1), first_batch(1));
        assert_ne!(first_batch(1), first_batch(2));
    }

    #[test]
    fn a_mixture_reads_every_record_each_epoch_in_the_runs_seed_schedule() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("a/part-0"), 0..30);
        write(&dir.path().join("a/part-1"), 30..40);
        write(&dir.path().join("b/part-0"), 100..140);
        let schema = Schema::from_feature_texts(&["id:int64"]).unwrap();
        let sources = [
            (dir.path().join("a").display().to_string(), 1.0),
            (dir.path().join("b/part-*").display().to_string(), 2.0),
        ];
        let data = TrainData::new(Vec::<String>::new(), schema, 8)
            .shuffle_buffer(16)
            .seed(3)
            .mixture(sources);
        let mut run = data.open_run().unwrap();
        let mut epochs = vec![Vec::new()];
        while epochs.len() < 3 {
            match run.next_event().unwrap().unwrap() {
                BatchEvent::Batch(b) => epochs.last_mut().unwrap().extend(ids(&b)),
                BatchEvent::EpochEnd => epochs.push(Vec::new()),
            }
        }
        let all: Vec<i64> = (0..40).chain(100..140).collect();
        for epoch in &epochs[..2] {
            let mut sorted = epoch.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, all);
        }
        assert_ne!(epochs[0], epochs[1]);
        let mut pass = data.open(1).unwrap();
        let mut one = Vec::new();
        while let Some(batch) = pass.next_batch() {
            one.extend(ids(&batch.unwrap()));
        }
        assert_eq!(one, epochs[1]);
        // Validation data is one source again.
        assert!(data.validation(["x"]).weights.is_empty());
    }

    /// A resume with other weights (or one source instead of a mixture) is
    /// a different data option, as another seed is.
    #[test]
    fn a_mixtures_sources_and_weights_are_in_its_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("a/part-0"), 0..3);
        write(&dir.path().join("b/part-0"), 3..5);
        let schema = Schema::from_feature_texts(&["id:int64"]).unwrap();
        let (a, b) = (
            dir.path().join("a").display().to_string(),
            dir.path().join("b").display().to_string(),
        );
        let mixed = |w: f64| {
            TrainData::new(Vec::<String>::new(), schema.clone(), 8)
                .mixture([(a.clone(), 1.0), (b.clone(), w)])
                .fingerprint()
                .unwrap()
        };
        assert!(mixed(1.0).differences(&mixed(1.0)).is_empty());
        assert_eq!(
            mixed(1.0).differences(&mixed(3.0)),
            [format!("mixture {a}=1 {b}=1, now {a}=1 {b}=3")]
        );
        let one = TrainData::new([a.clone(), b.clone()], schema.clone(), 8)
            .fingerprint()
            .unwrap();
        assert_eq!(
            one.differences(&mixed(1.0)),
            [format!("mixture none, now {a}=1 {b}=1")]
        );
        // A fingerprint without a mixture has no such key (as before mixtures).
        assert!(serde_json::to_value(&one).unwrap().get("mixture").is_none());
    }
}
