//! Schema-driven decoding of serialized `Example` / `SequenceExample` records
//! straight into columnar batch buffers.

use crate::batch::Batch;
use crate::example::spec::{Schema, SchemaError};

/// Why a record could not be parsed under the schema.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not a valid protobuf message.
    #[error("record {record}: malformed protobuf: {reason}")]
    Malformed { record: usize, reason: String },
    /// A feature violates its spec (missing without default, wrong kind, wrong count).
    #[error("record {record}: feature {feature:?}: {reason}")]
    Feature {
        record: usize,
        feature: String,
        reason: String,
    },
}

/// Parses batches of serialized records under a schema, reusing its buffers.
pub struct BatchParser {
    schema: Schema,
}

impl BatchParser {
    /// A parser for `schema`; checks the schema first.
    pub fn new(schema: Schema) -> Result<BatchParser, SchemaError> {
        Ok(BatchParser { schema })
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Parses `records` (each one serialized record) into one batch.
    pub fn parse<R: AsRef<[u8]>>(&mut self, _records: &[R]) -> Result<Batch, ParseError> {
        todo!("schema-driven decode")
    }
}
