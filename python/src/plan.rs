//! A dataset description built into a typed engine pipeline.
//!
//! The Python `Dataset` is a list of operations (JSON objects, so it pickles
//! as plain data). Building folds them over the element type the pipeline
//! has reached: files, records, record batches or parsed batches. A `parse`
//! of single records is held back until the next `batch` and applied to the
//! whole batch (`records -> parse -> shuffle -> batch` is built as `records
//! -> shuffle -> batch -> parse`, the same output, parsed in bulk); with no
//! `batch` after it, each record is parsed on its own.

use serde::Deserialize;
use tfpipe::pipeline::{
    BucketOptions, Exhausted, Interleave, PackOptions, PadValue, PaddedShape, Padding, Parallelism,
    Pipeline, PipelineError, Rank, Record, Remainder, TfRecordFiles,
};
use tfpipe::tfrecord::{Compression, ReaderOptions};
use tfpipe::{Batch, GlobalShuffle, IndexedFiles, Schema};

use crate::iter::Elem;

/// One chained method of a `Dataset`, as the Python side records it.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Op {
    Tfrecord {
        paths: Vec<String>,
        compression: String,
    },
    Shard {
        num_shards: usize,
        index: usize,
    },
    Rank {
        rank: usize,
        world_size: usize,
        remainder: String,
    },
    Interleave {
        cycle_length: usize,
        block_length: usize,
        num_parallel_calls: Option<serde_json::Value>,
        deterministic: bool,
    },
    GlobalShuffle {
        seed: u64,
    },
    Shuffle {
        buffer_size: usize,
        seed: u64,
    },
    Batch {
        batch_size: usize,
        drop_remainder: bool,
    },
    Parse {
        schema: serde_json::Value,
        num_parallel_calls: serde_json::Value,
        /// Seeds the random choices of image features (0 when absent).
        #[serde(default)]
        seed: u64,
    },
    Prefetch {
        buffer_size: usize,
    },
    Repeat {
        count: Option<u64>,
    },
    Take {
        count: u64,
    },
    Skip {
        count: u64,
    },
    IgnoreErrors,
    /// Starts a dataset: a weighted mixture of datasets.
    SampleFrom {
        datasets: Vec<Vec<Op>>,
        weights: Vec<f64>,
        seed: u64,
        stop_on_empty_dataset: bool,
    },
    /// Starts a dataset: each element from the dataset `choices` names.
    ChooseFrom {
        datasets: Vec<Vec<Op>>,
        choices: Vec<usize>,
    },
    /// Starts a dataset: tuples of the datasets' elements.
    Zip {
        datasets: Vec<Vec<Op>>,
    },
    /// Windows of consecutive elements, each as one batch.
    Window {
        size: usize,
        shift: usize,
        stride: usize,
        drop_remainder: bool,
    },
    /// The elements of another dataset after these.
    Concatenate {
        other: Vec<Op>,
    },
    /// Parsed rows one at a time.
    Unbatch,
    /// Parsed rows regrouped into batches of `batch_size` (a list: used in turn).
    Rebatch {
        batch_size: BatchSizes,
        drop_remainder: bool,
    },
    /// Parsed rows in batches of `batch_size`, ragged features padded.
    PaddedBatch {
        batch_size: usize,
        padded_shape: Option<usize>,
        padding_value: serde_json::Value,
        mask: bool,
        drop_remainder: bool,
    },
    /// Parsed rows batched by the length of `feature`.
    BucketBySequenceLength {
        feature: String,
        bucket_boundaries: Vec<usize>,
        bucket_batch_sizes: Vec<usize>,
        padding_value: serde_json::Value,
        pad_to_bucket_boundary: bool,
        drop_remainder: bool,
    },
    /// Parsed rows packed first-fit into rows of `length`.
    Pack {
        features: Vec<String>,
        length: usize,
        num_packing_bins: usize,
        padding_value: serde_json::Value,
        /// The seed of the bins' shuffle (none: not shuffled).
        #[serde(default)]
        shuffle_bins_seed: Option<u64>,
    },
}

/// One batch size, or several used in turn.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum BatchSizes {
    One(usize),
    Many(Vec<usize>),
}

impl BatchSizes {
    fn to_vec(&self) -> Vec<usize> {
        match self {
            BatchSizes::One(n) => vec![*n],
            BatchSizes::Many(sizes) => sizes.clone(),
        }
    }
}

/// How a combining operation joins pipelines of one element type.
enum Combine<'a> {
    Sample {
        weights: &'a [f64],
        seed: u64,
        exhausted: Exhausted,
    },
    Choose {
        choices: &'a [usize],
    },
    Concatenate,
}

impl Combine<'_> {
    fn apply<T: Send + 'static>(&self, inputs: Vec<Pipeline<T>>) -> Pipeline<T> {
        match self {
            Combine::Sample {
                weights,
                seed,
                exhausted,
            } => Pipeline::sample_from(inputs, weights, *seed, *exhausted),
            Combine::Choose { choices } => {
                Pipeline::choose_from(inputs, Pipeline::from_vec(choices.to_vec()))
            }
            Combine::Concatenate => {
                let mut inputs = inputs.into_iter();
                match inputs.next() {
                    Some(first) => inputs.fold(first, Pipeline::concatenate),
                    None => Pipeline::from_iterator(Vec::new()),
                }
            }
        }
    }
}

/// Why a description cannot be built: a mistake in the chain (a Python
/// `ValueError`) or the engine's own error.
pub(crate) enum PlanError {
    Invalid(String),
    Schema(tfpipe::example::SchemaError),
    Pipeline(PipelineError),
}

impl From<PipelineError> for PlanError {
    fn from(e: PipelineError) -> PlanError {
        PlanError::Pipeline(e)
    }
}

/// A parse waiting for the next `batch`.
#[derive(Clone)]
pub(crate) struct PendingParse {
    schema: Schema,
    parallelism: Parallelism,
    seed: u64,
}

/// The pipeline built so far, by element type.
pub(crate) enum Built {
    /// TFRecord files, before any record-level operation.
    Files(TfRecordFiles),
    /// The global shuffle over indexed files (it takes `shard` and `rank`).
    Global(GlobalShuffle),
    /// Single records, maybe with a parse held back for the next `batch`.
    Records(Pipeline<Record>, Option<PendingParse>),
    /// Lists of records.
    RecordBatches(Pipeline<Vec<Record>>),
    /// Parsed columns: `batched` is false for records parsed one at a time
    /// (their arrays lose the batch dimension).
    Parsed {
        pipeline: Pipeline<Batch>,
        batched: bool,
    },
    /// Tuples of zipped datasets' elements (of any kind, tuples included).
    Tuples(Pipeline<Vec<Elem>>),
}

/// Builds the description `ops` (the first must be `tfrecord`).
pub(crate) fn build(ops: &[Op]) -> Result<Built, PlanError> {
    let mut ops = ops.iter();
    let mut built = match ops.next() {
        Some(Op::Tfrecord { paths, compression }) => {
            let options = ReaderOptions {
                compression: compression_of(compression)?,
                ..ReaderOptions::default()
            };
            Built::Files(Pipeline::tfrecord_files(paths)?.reader_options(options))
        }
        Some(Op::SampleFrom {
            datasets,
            weights,
            seed,
            stop_on_empty_dataset,
        }) => {
            let exhausted = if *stop_on_empty_dataset {
                Exhausted::Stop
            } else {
                Exhausted::Renormalize
            };
            let how = Combine::Sample {
                weights,
                seed: *seed,
                exhausted,
            };
            combine("sample_from", built_all(datasets)?, &how)?
        }
        Some(Op::ChooseFrom { datasets, choices }) => combine(
            "choose_from",
            built_all(datasets)?,
            &Combine::Choose { choices },
        )?,
        Some(Op::Zip { datasets }) => zip(built_all(datasets)?),
        _ => {
            return Err(PlanError::Invalid(
                "a dataset starts with Dataset.tfrecord(...), sample_from(...), choose_from(...) \
                 or zip(...)"
                    .into(),
            ));
        }
    };
    for op in ops {
        built = apply(built, op)?;
    }
    Ok(finish(built))
}

/// Builds each description of a combining operation's inputs.
fn built_all(datasets: &[Vec<Op>]) -> Result<Vec<Built>, PlanError> {
    datasets.iter().map(|ops| build(ops)).collect()
}

/// Tuples of the inputs' elements, one from each in turn.
fn zip(inputs: Vec<Built>) -> Built {
    let elements = inputs.into_iter().map(|b| elements(records(finish(b))));
    Built::Tuples(Pipeline::zip_all(elements.collect()))
}

/// A built plan's elements as the iterator hands them on.
fn elements(built: Built) -> Pipeline<Elem> {
    match built {
        Built::Records(p, _) => p.map(Elem::Record),
        Built::RecordBatches(p) => p.map(Elem::Records),
        Built::Parsed { pipeline, batched } => {
            pipeline.map(move |batch| Elem::Batch { batch, batched })
        }
        Built::Tuples(p) => p.map(Elem::Tuple),
        Built::Files(files) => files.records().map(Elem::Record),
        Built::Global(global) => global.pipeline().map(Elem::Record),
    }
}

/// Joins pipelines that yield the same kind of element.
fn combine(name: &str, inputs: Vec<Built>, how: &Combine) -> Result<Built, PlanError> {
    let inputs: Vec<Built> = inputs.into_iter().map(records).collect();
    let kinds: Vec<&str> = inputs.iter().map(kind).collect();
    let batched: Vec<bool> = inputs
        .iter()
        .filter_map(|b| match b {
            Built::Parsed { batched, .. } => Some(*batched),
            _ => None,
        })
        .collect();
    if kinds.windows(2).any(|k| k[0] != k[1]) || batched.windows(2).any(|b| b[0] != b[1]) {
        return Err(PlanError::Invalid(format!(
            "{name}(): the datasets must yield the same kind of element (here: {})",
            kinds.join(", ")
        )));
    }
    let mut records = Vec::new();
    let mut record_batches = Vec::new();
    let mut parsed = Vec::new();
    let mut tuples = Vec::new();
    for input in inputs {
        match input {
            Built::Records(p, _) => records.push(p),
            Built::RecordBatches(p) => record_batches.push(p),
            Built::Parsed { pipeline, .. } => parsed.push(pipeline),
            Built::Tuples(p) => tuples.push(p),
            Built::Files(_) | Built::Global(_) => unreachable!("records() leaves no files"),
        }
    }
    Ok(if !records.is_empty() {
        Built::Records(how.apply(records), None)
    } else if !record_batches.is_empty() {
        Built::RecordBatches(how.apply(record_batches))
    } else if !tuples.is_empty() {
        Built::Tuples(how.apply(tuples))
    } else {
        Built::Parsed {
            pipeline: how.apply(parsed),
            batched: batched.first().copied().unwrap_or(true),
        }
    })
}

/// A finished plan: a pending parse with no `batch` after it parses each record.
fn finish(built: Built) -> Built {
    match built {
        Built::Records(p, Some(parse)) => Built::Parsed {
            pipeline: p.parse_records_seeded(parse.schema, parse.parallelism, parse.seed),
            batched: false,
        },
        other => other,
    }
}

fn compression_of(name: &str) -> Result<Option<Compression>, PlanError> {
    match name.to_ascii_lowercase().as_str() {
        "auto" => Ok(None),
        "none" | "" => Ok(Some(Compression::None)),
        "gzip" => Ok(Some(Compression::Gzip)),
        "zlib" => Ok(Some(Compression::Zlib)),
        _ => Err(PlanError::Invalid(format!(
            "compression={name:?}: expected \"auto\", None, \"GZIP\" or \"ZLIB\""
        ))),
    }
}

/// `"auto"`, `None` (auto) or a positive number.
fn parallelism_of(value: Option<&serde_json::Value>, what: &str) -> Result<Parallelism, PlanError> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(Parallelism::Auto),
        Some(serde_json::Value::String(s)) if s.eq_ignore_ascii_case("auto") => {
            Ok(Parallelism::Auto)
        }
        Some(serde_json::Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => {
            Ok(Parallelism::Fixed(n.as_u64().unwrap_or(1) as usize))
        }
        Some(other) => Err(PlanError::Invalid(format!(
            "{what}={other}: expected \"auto\" or a positive number"
        ))),
    }
}

/// The element type reached, for messages.
fn kind(built: &Built) -> &'static str {
    match built {
        Built::Files(_) | Built::Global(_) => "files",
        Built::Records(..) => "records",
        Built::RecordBatches(_) => "batches of records",
        Built::Parsed { .. } => "parsed batches",
        Built::Tuples(_) => "tuples",
    }
}

/// Records from whatever file-level form the plan is in.
fn records(built: Built) -> Built {
    match built {
        Built::Files(files) => Built::Records(files.records(), None),
        Built::Global(global) => Built::Records(global.pipeline(), None),
        other => other,
    }
}

/// Applies an operation that works on any element type.
macro_rules! generic {
    ($built:expr, |$p:ident| $body:expr) => {
        match records($built) {
            Built::Records($p, parse) => Built::Records($body, parse),
            Built::RecordBatches($p) => Built::RecordBatches($body),
            Built::Parsed {
                pipeline: $p,
                batched,
            } => Built::Parsed {
                pipeline: $body,
                batched,
            },
            Built::Tuples($p) => Built::Tuples($body),
            Built::Files(_) | Built::Global(_) => unreachable!("records() leaves no files"),
        }
    };
}

/// The parsed pipeline a row stage needs (a parse still pending parses
/// each record on its own), and whether its elements are batches.
fn parsed(built: Built, op: &Op) -> Result<(Pipeline<Batch>, bool), PlanError> {
    match finish(built) {
        Built::Parsed { pipeline, batched } => Ok((pipeline, batched)),
        other => Err(PlanError::Invalid(format!(
            "{}() of {}: it regroups parsed rows; call parse() first",
            op_name(op),
            kind(&other)
        ))),
    }
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Unbatch => "unbatch",
        Op::Rebatch { .. } => "rebatch",
        Op::PaddedBatch { .. } => "padded_batch",
        Op::BucketBySequenceLength { .. } => "bucket_by_sequence_length",
        Op::Pack { .. } => "pack",
        Op::Window { .. } => "window",
        _ => "this operation",
    }
}

/// A JSON number or string as a pad value (null: zero).
fn pad_value(value: &serde_json::Value) -> Result<PadValue, PlanError> {
    Ok(match value {
        serde_json::Value::Null => PadValue::default(),
        serde_json::Value::String(s) => PadValue::Bytes(s.as_bytes().to_vec()),
        v => match (v.as_i64(), v.as_f64()) {
            (Some(i), _) => PadValue::Int(i),
            (None, Some(f)) => PadValue::Float(f),
            _ => {
                return Err(PlanError::Invalid(format!(
                    "padding_value={v}: expected a number or a string"
                )));
            }
        },
    })
}

fn apply(built: Built, op: &Op) -> Result<Built, PlanError> {
    Ok(match (built, op) {
        (_, Op::Tfrecord { .. }) => {
            return Err(PlanError::Invalid(
                "tfrecord(...) starts a dataset; it cannot follow another operation".into(),
            ));
        }
        (Built::Files(files), Op::Shard { num_shards, index }) => {
            Built::Files(files.shard(*num_shards, *index))
        }
        (Built::Global(g), Op::Shard { num_shards, index }) => {
            Built::Global(g.shard(*num_shards as u64, *index as u64))
        }
        (built, Op::Shard { num_shards, index }) => {
            generic!(built, |p| p.shard(*num_shards, *index))
        }
        (
            Built::Files(files),
            Op::Rank {
                rank,
                world_size,
                remainder,
            },
        ) => {
            let remainder = match remainder.as_str() {
                "drop" => Remainder::Drop,
                "keep" => Remainder::Keep,
                other => {
                    return Err(PlanError::Invalid(format!(
                        "remainder={other:?}: expected \"drop\" or \"keep\""
                    )));
                }
            };
            if *world_size <= 1 {
                Built::Files(files)
            } else {
                let rank = Rank::new(*rank, *world_size)
                    .map_err(|e| PlanError::Invalid(format!("rank: {e}")))?;
                Built::Files(files.rank(rank, remainder)?)
            }
        }
        (
            Built::Global(g),
            Op::Rank {
                rank, world_size, ..
            },
        ) => {
            if *rank >= *world_size {
                return Err(PlanError::Invalid(format!(
                    "rank={rank}, world_size={world_size}: needs rank < world_size"
                )));
            }
            Built::Global(g.shard(*world_size as u64, *rank as u64))
        }
        (built, Op::Rank { .. }) => {
            return Err(PlanError::Invalid(format!(
                "rank() shares whole files or the global shuffle: call it right after \
                 tfrecord(...) (here the dataset yields {})",
                kind(&built)
            )));
        }
        (
            Built::Files(files),
            Op::Interleave {
                cycle_length,
                block_length,
                num_parallel_calls,
                deterministic,
            },
        ) => {
            let mut options =
                Interleave::new(*cycle_length, *block_length).deterministic(*deterministic);
            if num_parallel_calls.is_some() {
                options = options.parallel(parallelism_of(
                    num_parallel_calls.as_ref(),
                    "num_parallel_calls",
                )?);
            }
            Built::Records(files.interleave_with(options), None)
        }
        (built, Op::Interleave { .. }) => {
            return Err(PlanError::Invalid(format!(
                "interleave() reads several files at once: call it after tfrecord(...) \
                 (and shard/rank), before anything else (here the dataset yields {})",
                kind(&built)
            )));
        }
        (Built::Files(files), Op::GlobalShuffle { seed }) => {
            let indexed = IndexedFiles::open(files.paths(), None).map_err(|error| {
                PlanError::Pipeline(PipelineError::Index {
                    stage: "global_shuffle".into(),
                    error,
                })
            })?;
            Built::Global(indexed.global_shuffle(*seed))
        }
        (built, Op::GlobalShuffle { .. }) => {
            return Err(PlanError::Invalid(format!(
                "global_shuffle() reads indexed files by record: call it right after \
                 tfrecord(...) (here the dataset yields {})",
                kind(&built)
            )));
        }
        (built, Op::Shuffle { buffer_size, seed }) => {
            generic!(built, |p| p.shuffle(*buffer_size, *seed))
        }
        (
            built,
            Op::Batch {
                batch_size,
                drop_remainder,
            },
        ) => match records(built) {
            Built::Records(p, None) => {
                Built::RecordBatches(p.batch_with(*batch_size, *drop_remainder))
            }
            Built::Records(p, Some(parse)) => Built::Parsed {
                pipeline: p
                    .batch_with(*batch_size, *drop_remainder)
                    .parse_batches_seeded(parse.schema, parse.parallelism, parse.seed),
                batched: true,
            },
            Built::Tuples(p) => Built::Tuples(
                p.batch_with(*batch_size, *drop_remainder)
                    .try_map(batch_tuples),
            ),
            other => {
                return Err(PlanError::Invalid(format!(
                    "batch() of {}: batch once, before or after parse()",
                    kind(&other)
                )));
            }
        },
        (
            built,
            Op::Parse {
                schema,
                num_parallel_calls,
                seed,
            },
        ) => {
            let schema = Schema::from_json_value(schema).map_err(PlanError::Schema)?;
            let parallelism = parallelism_of(Some(num_parallel_calls), "num_parallel_calls")?;
            match records(built) {
                Built::Records(p, None) => Built::Records(
                    p,
                    Some(PendingParse {
                        schema,
                        parallelism,
                        seed: *seed,
                    }),
                ),
                Built::RecordBatches(p) => Built::Parsed {
                    pipeline: p.parse_batches_seeded(schema, parallelism, *seed),
                    batched: true,
                },
                Built::Tuples(_) => return Err(of_tuples("parse")),
                other => {
                    return Err(PlanError::Invalid(format!(
                        "parse() of {}: the dataset is parsed already",
                        kind(&other)
                    )));
                }
            }
        }
        (built, Op::Prefetch { buffer_size }) => generic!(built, |p| p.prefetch(*buffer_size)),
        (built, Op::Repeat { count }) => generic!(built, |p| p.repeat(*count)),
        (built, Op::Take { count }) => generic!(built, |p| p.take(*count)),
        (built, Op::Skip { count }) => generic!(built, |p| p.skip(*count)),
        (built, Op::IgnoreErrors) => generic!(built, |p| p.ignore_errors()),
        (built, Op::Concatenate { other }) => combine(
            "concatenate",
            vec![finish(built), build(other)?],
            &Combine::Concatenate,
        )?,
        (built, op @ (Op::Unbatch | Op::Rebatch { .. } | Op::PaddedBatch { .. })) => {
            let (pipeline, batched) = parsed(built, op)?;
            match op {
                Op::Unbatch => Built::Parsed {
                    pipeline: pipeline.unbatch(),
                    batched: false,
                },
                Op::Rebatch {
                    batch_size,
                    drop_remainder,
                } => Built::Parsed {
                    pipeline: pipeline.rebatch_sizes(&batch_size.to_vec(), *drop_remainder),
                    batched: true,
                },
                Op::PaddedBatch {
                    batch_size,
                    padded_shape,
                    padding_value,
                    mask,
                    drop_remainder,
                } => {
                    let mut padding = Padding::new().value(pad_value(padding_value)?);
                    if let Some(width) = padded_shape {
                        padding = padding.shape(PaddedShape::Fixed(*width));
                    }
                    if *mask {
                        padding = padding.mask();
                    }
                    Built::Parsed {
                        pipeline: pipeline.padded_batch(*batch_size, padding, *drop_remainder),
                        batched: true,
                    }
                }
                _ => Built::Parsed { pipeline, batched },
            }
        }
        (
            built,
            op @ Op::BucketBySequenceLength {
                feature,
                bucket_boundaries,
                bucket_batch_sizes,
                padding_value,
                pad_to_bucket_boundary,
                drop_remainder,
            },
        ) => {
            let (pipeline, _) = parsed(built, op)?;
            let options = BucketOptions::new(
                feature.clone(),
                bucket_boundaries.clone(),
                bucket_batch_sizes.clone(),
            )
            .padding(Padding::new().value(pad_value(padding_value)?))
            .pad_to_bucket_boundary(*pad_to_bucket_boundary)
            .drop_remainder(*drop_remainder);
            options.check()?;
            Built::Parsed {
                pipeline: pipeline.bucket_by_sequence_length(options),
                batched: true,
            }
        }
        (
            built,
            op @ Op::Pack {
                features,
                length,
                num_packing_bins,
                padding_value,
                shuffle_bins_seed,
            },
        ) => {
            let (pipeline, _) = parsed(built, op)?;
            let mut options = PackOptions::new(features.clone(), *length, *num_packing_bins)
                .pad_value(pad_value(padding_value)?);
            if let Some(seed) = shuffle_bins_seed {
                options = options.shuffle_bins(*seed);
            }
            options.check()?;
            Built::Parsed {
                pipeline: pipeline.pack(options),
                batched: true,
            }
        }
        (
            built,
            op @ Op::Window {
                size,
                shift,
                stride,
                drop_remainder,
            },
        ) => window(built, op, [*size, *shift, *stride], *drop_remainder)?,
        (_, Op::SampleFrom { .. } | Op::ChooseFrom { .. } | Op::Zip { .. }) => {
            return Err(PlanError::Invalid(
                "sample_from(...), choose_from(...) and zip(...) start a dataset; they cannot \
                 follow another operation"
                    .into(),
            ));
        }
    })
}

/// A batch of tuples as a tuple of batches (`tf.data`'s `batch` of a
/// zipped dataset): the `i`-th elements of the tuples batched together.
fn batch_tuples(tuples: Vec<Vec<Elem>>) -> Result<Vec<Elem>, String> {
    let width = tuples.first().map_or(0, Vec::len);
    let mut parts: Vec<Vec<Elem>> = (0..width)
        .map(|_| Vec::with_capacity(tuples.len()))
        .collect();
    for tuple in tuples {
        // A zip's tuples all have one element per input.
        for (part, elem) in parts.iter_mut().zip(tuple) {
            part.push(elem);
        }
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(i, part)| batch_elems(i, part))
        .collect()
}

/// Elements of one kind as one batch: records as a list, parsed single
/// rows as a parsed batch, tuples as a tuple of batches.
fn batch_elems(i: usize, elems: Vec<Elem>) -> Result<Elem, String> {
    let already = || {
        format!(
            "batch() of tuples: element {i} of each tuple is a batch already (a list of \
             records or a batched dict); batch each dataset before zip(), or none of them"
        )
    };
    match elems.first() {
        None | Some(Elem::Record(_)) => elems
            .into_iter()
            .map(|e| match e {
                Elem::Record(r) => Ok(r),
                _ => Err(already()),
            })
            .collect::<Result<_, _>>()
            .map(Elem::Records),
        Some(Elem::Batch { batched: false, .. }) => {
            let rows = elems
                .into_iter()
                .map(|e| match e {
                    Elem::Batch {
                        batch,
                        batched: false,
                    } => Ok(batch),
                    _ => Err(already()),
                })
                .collect::<Result<Vec<Batch>, _>>()?;
            let batch = Batch::concat(&rows)
                .map_err(|e| format!("batch() of tuples: element {i}'s rows differ: {e}"))?;
            Ok(Elem::Batch {
                batch,
                batched: true,
            })
        }
        Some(Elem::Tuple(_)) => {
            let inner = elems
                .into_iter()
                .map(|e| match e {
                    Elem::Tuple(t) => Ok(t),
                    _ => Err(already()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            batch_tuples(inner).map(Elem::Tuple)
        }
        Some(_) => Err(already()),
    }
}

/// `op()` does not apply to tuples: it belongs before the `zip`.
fn of_tuples(op: &str) -> PlanError {
    PlanError::Invalid(format!(
        "{op}() of tuples: zip() yields tuples of its datasets' elements; call {op}() on each \
         dataset before zipping them"
    ))
}

/// Windows of records (lists of records, parsed as one batch when a parse
/// is pending) or of parsed rows (each window one batch).
fn window(
    built: Built,
    op: &Op,
    [size, shift, stride]: [usize; 3],
    drop_remainder: bool,
) -> Result<Built, PlanError> {
    Ok(match records(built) {
        Built::Records(p, parse) => {
            let windows = p.window(size, shift, stride, drop_remainder);
            match parse {
                None => Built::RecordBatches(windows),
                Some(parse) => Built::Parsed {
                    pipeline: windows.parse_batches_seeded(
                        parse.schema,
                        parse.parallelism,
                        parse.seed,
                    ),
                    batched: true,
                },
            }
        }
        Built::Parsed {
            pipeline,
            batched: false,
        } => Built::Parsed {
            pipeline: pipeline.window_rows(size, shift, stride, drop_remainder),
            batched: true,
        },
        Built::Tuples(_) => return Err(of_tuples("window")),
        other => {
            return Err(PlanError::Invalid(format!(
                "{}() of {}: it groups single records or parsed rows; window before batch(), \
                 or unbatch() first",
                op_name(op),
                kind(&other)
            )));
        }
    })
}
