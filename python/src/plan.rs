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
    Exhausted, Interleave, Parallelism, Pipeline, PipelineError, Rank, Record, Remainder,
    TfRecordFiles,
};
use tfpipe::tfrecord::{Compression, ReaderOptions};
use tfpipe::{Batch, GlobalShuffle, IndexedFiles, Schema};

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
    /// The elements of another dataset after these.
    Concatenate {
        other: Vec<Op>,
    },
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
        _ => {
            return Err(PlanError::Invalid(
                "a dataset starts with Dataset.tfrecord(...), sample_from(...) or choose_from(...)"
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
    for input in inputs {
        match input {
            Built::Records(p, _) => records.push(p),
            Built::RecordBatches(p) => record_batches.push(p),
            Built::Parsed { pipeline, .. } => parsed.push(pipeline),
            Built::Files(_) | Built::Global(_) => unreachable!("records() leaves no files"),
        }
    }
    Ok(if !records.is_empty() {
        Built::Records(how.apply(records), None)
    } else if !record_batches.is_empty() {
        Built::RecordBatches(how.apply(record_batches))
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
            pipeline: p.parse_records(parse.schema, parse.parallelism),
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
            Built::Files(_) | Built::Global(_) => unreachable!("records() leaves no files"),
        }
    };
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
                    .parse_batches(parse.schema, parse.parallelism),
                batched: true,
            },
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
                    }),
                ),
                Built::RecordBatches(p) => Built::Parsed {
                    pipeline: p.parse_batches(schema, parallelism),
                    batched: true,
                },
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
        (_, Op::SampleFrom { .. } | Op::ChooseFrom { .. }) => {
            return Err(PlanError::Invalid(
                "sample_from(...) and choose_from(...) start a dataset; they cannot follow \
                 another operation"
                    .into(),
            ));
        }
    })
}
