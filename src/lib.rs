#![warn(missing_docs)]
//! tfpipe: a streaming dataset engine with first-class TFRecord support, the
//! input pipeline ML people wish `tf.data` were: fast, bounded, and honest
//! about where the time goes.
//!
//! # The map
//!
//! Data flows through these modules, each a layer on the ones before it; a
//! module imports only from layers below its own:
//!
//! ```text
//! storage  <  tfrecord, batch, image  <  example  <  pipeline  <  train, convert  <  cli
//! (bytes)     (records) (columns) (pixels) (parsing)   (streams)    (models) (raw data) (the binary)
//! ```
//!
//! | module | what lives there |
//! |---|---|
//! | [`storage`] | bytes: local paths, `s3://` / `gs://` / `az://` / `http(s)://` URLs and globs; opening (at an offset), sizes, ranged reads |
//! | [`tfrecord`] | framing, masked CRC32C, GZIP/ZLIB, [`RecordReader`] / [`RecordWriter`], the record index ([`IndexedFiles`]) |
//! | [`example`] | `tf.train.Example` / `SequenceExample` from `proto/`, feature specs ([`Schema`]), the schema-driven [`BatchParser`] |
//! | [`batch`] | columnar [`Batch`]es: dense, bytes (data + offsets), ragged (values + row splits) |
//! | [`image`] | JPEG/PNG/GIF/BMP decoding, crops, resizing and augmentation to fixed-size pixels (beside `batch`, below `example`) |
//! | [`pipeline`] | the streaming engine: sources, interleave, shard, map, shuffle, batch, prefetch, ... on bounded channels; ranks, the global shuffle ([`GlobalShuffle`]) and resumable iterator state |
//! | [`metrics`] | per-stage counters and timers, readable while the pipeline runs; the bottleneck stage |
//! | [`train`] | the candle training loop, stall-versus-compute and start-up reports, checkpoints, prediction |
//! | [`convert`] | CSV, JSON, MNIST IDX and image folders to sharded TFRecord with a schema file |
//!
//! # An example
//!
//! Write a few `tf.train.Example`s, then read them back as shuffled, parsed batches:
//!
//! ```
//! use prost::Message;
//! use tfpipe::example::proto::{feature, Example, Feature, Features, Int64List};
//! use tfpipe::pipeline::{Parallelism, Pipeline};
//! use tfpipe::tfrecord::{Compression, FileRecordWriter};
//! use tfpipe::Schema;
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("data.tfrecord");
//! let mut writer = FileRecordWriter::create(&path, Compression::None)?;
//! for i in 0..100i64 {
//!     let value = Feature { kind: Some(feature::Kind::Int64List(Int64List { value: vec![i] })) };
//!     let features = Features { feature: [("id".to_string(), value)].into() };
//!     writer.write_record(&Example { features: Some(features) }.encode_to_vec())?;
//! }
//! writer.finish()?;
//!
//! let schema = Schema::from_feature_texts(&["id:int64"])?;
//! let batches = Pipeline::tfrecord_files([path.to_string_lossy()])?
//!     .records()
//!     .shuffle(50, 42)
//!     .batch(32)
//!     .parse_batches(schema, Parallelism::Auto)
//!     .prefetch(2)
//!     .start()?;
//! let mut rows = 0;
//! for batch in batches {
//!     rows += batch?.num_rows;
//! }
//! assert_eq!(rows, 100);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Threads, memory and errors
//!
//! Threads start only where a stage asks for concurrency (parallel map and
//! interleave, prefetch, device prefetch, checkpoint loading); each is joined
//! when its owner is dropped, and every edge between threads is a bounded
//! channel, so memory is bounded by the buffers you chose (the formula is in
//! [`pipeline`]). Errors carry their position ([`Location`]: file, record,
//! byte offset) and arrive as `Err` items; a panic in user code becomes an
//! error, never an abort. Each area has its own error enum
//! ([`RecordError`], [`example::ParseError`], [`PipelineError`],
//! [`train::TrainError`], [`convert::ConvertError`]).
//!
//! # Features
//!
//! - `train` (default): the [`train`] module, the candle training loop,
//!   checkpoints and prediction.
//! - `cli` (default, implies `train` and `serve`): the `tfpipe` command and
//!   what only it needs (clap, indicatif, signal handling).
//! - `serve` (default through `cli`, implies `train`): the [`serve`] module,
//!   the model server behind `tfpipe serve`.
//! - `cuda`: train and predict on NVIDIA GPUs through candle's CUDA backend.
//! - `object-store` (default): reading and writing `s3://`, `gs://`, `az://`
//!   and `http(s)://` URLs through the `object_store` crate.
//! - `images` (default): the [`image`] module (decoding, resizing and
//!   augmenting JPEG, PNG, GIF and BMP) and `tfpipe convert images --resize`.
//!
//! With `default-features = false` the crate is the engine alone (records,
//! examples, the pipeline, metrics, converters), without candle or any
//! command-line crate:
//!
//! ```toml
//! tfpipe = { version = "0.1", default-features = false }
//! ```

// Not API: shared with the `tfpipe` binary, the Python crate and the fuzz
// targets (which must start threads through `spawn`, write outputs through
// `atomic_file`, and drive `fuzzing`), so public but hidden from the docs;
// they may change in any release.
#[doc(hidden)]
pub mod atomic_file;
pub mod batch;
pub mod convert;
pub mod error;
pub mod example;
#[doc(hidden)]
pub mod fuzzing;
pub mod image;
pub mod metrics;
pub mod pipeline;
mod rng;
#[cfg(feature = "serve")]
pub mod serve;
#[doc(hidden)]
pub mod spawn;
pub mod storage;
pub mod tfrecord;
#[cfg(feature = "train")]
pub mod train;

pub use batch::{Batch, BatchError, Column, Values};
pub use error::Location;
pub use example::{BatchParser, DType, FeatureSpec, Layout, Schema};
pub use metrics::{PipelineMetrics, StageMetrics};
pub use pipeline::GlobalShuffle;
pub use pipeline::{Parallelism, Pipeline, PipelineError, PipelineIter};
pub use tfrecord::{Compression, RecordError, RecordReader, RecordWriter};
pub use tfrecord::{IndexError, IndexProblem, IndexedFiles, RecordId, RecordIndex, index_path};

/// The Rust snippets of the README and of `docs/` compile as doctests, so
/// that they cannot go stale.
#[cfg(doctest)]
mod doc_snippets {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/pipeline.md")]
    struct Pipeline;
    #[doc = include_str!("../docs/storage.md")]
    struct Storage;
    #[doc = include_str!("../docs/train.md")]
    struct Train;
}
