//! Feature specs: what a record should contain and how it becomes columns.
//!
//! The semantics are TensorFlow's (`FixedLenFeature`, `VarLenFeature`,
//! `FixedLenSequenceFeature`, and a var-length feature per sequence step).

use serde::{Deserialize, Serialize};

/// The element type of a feature, as stored in the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// From an `int64_list`.
    Int64,
    /// From a `float_list`.
    Float32,
    /// From a `bytes_list`, as byte strings.
    Bytes,
    /// From a `bytes_list` holding one value whose bytes are decoded raw as
    /// `uint8` elements (TensorFlow's `decode_raw(..., tf.uint8)`).
    Uint8,
}

/// How many values a feature has per record, and how they are shaped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Exactly `product(shape)` values per record (`[]` is a scalar).
    Fixed(Vec<usize>),
    /// Any number of values per record.
    Var,
    /// A `SequenceExample` feature list: any number of steps, each of exactly
    /// `product(shape)` values.
    FixedSequence(Vec<usize>),
    /// A `SequenceExample` feature list: any number of steps, each of any
    /// number of values.
    VarSequence,
}

impl Layout {
    /// Whether the feature lives in a `SequenceExample`'s feature lists.
    pub fn is_sequence(&self) -> bool {
        matches!(self, Layout::FixedSequence(_) | Layout::VarSequence)
    }
}

/// A default value (flattened), used when a fixed-length feature is missing.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int64(Vec<i64>),
    Float32(Vec<f32>),
    Bytes(Vec<Vec<u8>>),
}

/// One feature of a [`Schema`].
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureSpec {
    /// The feature's key in the record.
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// Fixed, var-length, or per sequence step.
    pub layout: Layout,
    /// For `Layout::Fixed`: the value of a missing feature (flattened,
    /// `product(shape)` values, or one value broadcast). Without one, a
    /// missing feature is an error.
    pub default: Option<Value>,
}

/// The features to parse, in column order, and which one is the label.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Schema {
    /// The features, in the order of the batch's columns.
    pub features: Vec<FeatureSpec>,
    /// The label feature's name, if the data has one.
    pub label: Option<String>,
}

impl Schema {
    /// Whether records are `SequenceExample`s (some feature is a sequence).
    pub fn is_sequence(&self) -> bool {
        self.features.iter().any(|f| f.layout.is_sequence())
    }

    /// The feature named `name`.
    pub fn feature(&self, name: &str) -> Option<&FeatureSpec> {
        self.features.iter().find(|f| f.name == name)
    }
}

/// An invalid feature spec or schema file.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A `--feature NAME:DTYPE[:SHAPE]` text that does not parse.
    #[error(
        "invalid feature spec {spec:?}: {reason} (expected NAME:DTYPE[:SHAPE], e.g. image:uint8:28x28, label:int64, tags:bytes:var)"
    )]
    Text { spec: String, reason: String },
    /// A schema file that cannot be read or parsed.
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    /// A schema that is inconsistent (duplicate names, bad default size, ...).
    #[error("invalid schema: {0}")]
    Invalid(String),
}

impl std::str::FromStr for FeatureSpec {
    type Err = SchemaError;

    /// Parses `NAME:DTYPE[:SHAPE]`.
    fn from_str(_text: &str) -> Result<Self, Self::Err> {
        todo!("feature spec text form")
    }
}

impl Schema {
    /// A schema from `--feature` texts.
    pub fn from_feature_texts<S: AsRef<str>>(_texts: &[S]) -> Result<Schema, SchemaError> {
        todo!("schema from feature texts")
    }

    /// Reads a schema file (`--schema FILE`).
    pub fn load(_path: impl AsRef<std::path::Path>) -> Result<Schema, SchemaError> {
        todo!("schema file")
    }

    /// Writes this schema as a schema file, with `metadata` as extra top-level keys.
    pub fn save(
        &self,
        _path: impl AsRef<std::path::Path>,
        _metadata: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), SchemaError> {
        todo!("schema file")
    }
}
