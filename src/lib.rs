//! tfpipe: a streaming dataset engine with first-class TFRecord support.

pub mod batch;
pub mod convert;
pub mod error;
pub mod example;
pub mod metrics;
pub mod pipeline;
pub mod tfrecord;
pub mod train;

pub use batch::{Batch, BatchError, Column, Values};
pub use error::Location;
pub use example::{BatchParser, DType, FeatureSpec, Layout, Schema};
pub use metrics::{PipelineMetrics, StageMetrics};
pub use pipeline::{Parallelism, Pipeline, PipelineError, PipelineIter};
pub use tfrecord::{Compression, RecordError, RecordReader, RecordWriter};
