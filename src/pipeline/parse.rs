//! The schema parser as a pipeline stage: per batch of serialized records
//! (`tf.data`'s fast arrangement: batch, then parse) or per record.

use super::{MapOptions, Parallelism, Pipeline, PipelineError};
use crate::batch::Batch;
use crate::example::{BatchParser, Schema};

impl<R: AsRef<[u8]> + Send + 'static> Pipeline<Vec<R>> {
    /// Parses each batch of serialized `Example`s (a [`Record`](super::Record)
    /// from a TFRecord source, or any bytes) under `schema` into one
    /// columnar [`Batch`], on `parallelism` workers, each with its own
    /// [`BatchParser`] (so buffers are reused). A bad record is an `Err` item
    /// naming this stage and the record within the batch.
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
        parse_stage(
            self,
            schema,
            parallelism.into(),
            |parser, records: Vec<R>| parser.parse(&records),
        )
    }
}

impl<R: AsRef<[u8]> + Send + 'static> Pipeline<R> {
    /// Parses each serialized `Example` on its own into a one-row [`Batch`]
    /// (the per-example arrangement; batching first and using
    /// [`parse_batches`](Pipeline::parse_batches) is much faster).
    pub fn parse_records(
        self,
        schema: Schema,
        parallelism: impl Into<Parallelism>,
    ) -> Pipeline<Batch> {
        parse_stage(self, schema, parallelism.into(), |parser, record: R| {
            parser.parse(std::slice::from_ref(&record))
        })
    }
}

fn parse_stage<T: Send + 'static>(
    pipeline: Pipeline<T>,
    schema: Schema,
    parallelism: Parallelism,
    parse: fn(&mut BatchParser, T) -> Result<Batch, crate::example::ParseError>,
) -> Pipeline<Batch> {
    // Check the schema now, so a bad one fails at `start`, not per element.
    let checked = BatchParser::new(schema.clone()).map_err(PipelineError::from);
    let error = checked.as_ref().err().map(ToString::to_string);
    let pipeline = pipeline.invalid_if(error.is_some(), || error.clone().unwrap_or_default());
    let options = MapOptions {
        parallelism,
        deterministic: true,
    };
    pipeline.map_parallel_with(
        options,
        move || BatchParser::new(schema.clone()),
        move |parser, element| match parser {
            Ok(parser) => parse(parser, element),
            // Unreachable in practice: the same schema was checked above.
            Err(err) => Err(crate::example::ParseError::Malformed {
                record: 0,
                reason: err.to_string(),
            }),
        },
    )
}
