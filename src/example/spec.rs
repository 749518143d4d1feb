//! Feature specs: what a record should contain and how it becomes columns.
//!
//! The semantics are TensorFlow's (`FixedLenFeature`, `VarLenFeature`,
//! `FixedLenSequenceFeature`, `RaggedFeature`, `decode_raw`, and a var-length
//! feature per sequence step); the decoder that applies them lives in `decode.rs`.
//! Where they differ on purpose, the README's "Deliberate differences from
//! TensorFlow" says so.
//!
//! # Text form (`--feature`)
//!
//! ```text
//! SPEC    = NAME ":" DTYPE [":" SHAPE] ["=" DEFAULT]
//!         | NAME ":image:" H "x" W "x" C [":" OPTION ("," OPTION)*]
//!                                 an encoded JPEG/PNG/GIF/BMP decoded, resized to H x W,
//!                                 C = 1 or 3 channels (options: `tfpipe::image`'s `spec.rs`)
//! DTYPE   = int64 | float32 | bytes | uint8
//!         | raw_int16 | raw_uint16 | raw_int32 | raw_float32 | raw_float64
//! SHAPE   = DIMS                  fixed length: `784`, `28x28`, `0` (omitted: a scalar)
//!         | var                   var-length
//!         | var ":" DIMS          var-length list of DIMS-shaped elements (FixedLenSequenceFeature
//!                                 with allow_missing=True, in an Example)
//!         | seq [":" DIMS]        a SequenceExample feature list, each step fixed (omitted: scalar)
//!         | seq:var               a SequenceExample feature list, each step var-length
//!         | ragged (":" PART)*    RaggedFeature, partitions outermost first
//!         | sparse(KEY,...):DIMS  SparseFeature: the int64 index keys (one per dimension)
//!                                 and the dense size of each record's tensor
//! PART    = row_splits(KEY) | row_lengths(KEY) | uniform_row_length(N)
//! DIMS    = N ("x" N)*            N >= 0; N >= 1 for `var:` and `seq:` (each element or step
//!                                 must hold a value)
//! DEFAULT = VALUE ("," VALUE)*    fixed-length features only: one value (broadcast) or product(DIMS)
//! ```
//!
//! Examples: `image_raw:uint8:28x28`, `image/encoded:image:224x224x3:center`, `label:int64`, `label:int64=-1`,
//! `emb:float32:3=0`, `tags:bytes:var`, `frames:float32:seq:2`, `tokens:int64:seq:var`,
//! `lang:bytes=und`.
//!
//! * `uint8` reads a `bytes_list` holding exactly one value of `product(DIMS)` bytes and
//!   decodes it raw (TensorFlow's `decode_raw(..., tf.uint8)`); only fixed shapes
//!   (`DIMS` or `seq[:DIMS]`). Its default values are integers 0..=255. The `raw_*`
//!   dtypes do the same with `product(DIMS)` little-endian elements of 2, 4 or 8 bytes
//!   (`decode_raw(..., tf.int16)` etc.); they take no default.
//! * `ragged` reads the feature's values (any number) and splits them by its
//!   partitions, applied from the innermost out: `row_lengths(KEY)` and `row_splits(KEY)`
//!   read the int64 feature KEY of the same record (which need not be in the schema),
//!   `uniform_row_length(N)` groups N rows. Always validated (TensorFlow's
//!   `validate=True`): lengths must be >= 0 and sum to the rows inside; splits must start
//!   at 0, never decrease and end at the rows inside; a missing or empty KEY is no rows.
//!   Trailing uniform lengths become the column's inner shape.
//! * `image` reads a `bytes_list` holding exactly one encoded image and decodes it
//!   ([`crate::image`]) into a fixed `uint8` `[H, W, C]` (`float32` when normalised,
//!   `[C, H, W]` with `nchw`); in a schema file, `{"name": N, "dtype": "image",
//!   "shape": [H, W, C], "image": "OPTIONS"}`. It takes no default.
//! * Every fixed-length feature must fit in 2 GiB per record ([`MAX_FEATURE_BYTES`]).
//! * `int64` defaults are decimal integers; `float32` defaults are anything Rust's `f32`
//!   parser reads (`0.5`, `-1e-3`, `NaN`, `inf`, `-inf`; a NaN payload is not kept).
//! * `bytes` default values are text, with `\\`, `\,` and `\xHH` as escapes for a
//!   backslash, a comma and any byte; `name:bytes=` is one empty value.
//! * A NAME holding `:` or starting with `"` is written as a JSON string literal:
//!   `"a:b":int64`. The first `=` after the dtype starts the default.
//! * `Display` writes this same form, so `spec.to_string().parse()` gives `spec` back.
//!
//! # Schema file (`--schema FILE`)
//!
//! A JSON object. `features` lists the features in column order, each either an
//! object or a string in the text form above; `label` (optional) names one of them;
//! `format` (optional when reading) must be `"tfpipe-schema/1"`. Every other
//! top-level key is metadata that tools may add (e.g. counts written by `convert`);
//! it is kept by [`Schema::load_with_metadata`] and ignored by [`Schema::load`].
//!
//! ```json
//! {
//!   "format": "tfpipe-schema/1",
//!   "features": [
//!     {"name": "image_raw", "dtype": "uint8", "shape": [28, 28]},
//!     {"name": "label", "dtype": "int64", "default": [-1]},
//!     {"name": "score", "dtype": "float32", "default": ["NaN"]},
//!     {"name": "emb", "dtype": "float32", "shape": [3], "default": [0.0, 0.0, 0.0]},
//!     {"name": "lang", "dtype": "bytes", "default": ["und"]},
//!     {"name": "blob", "dtype": "bytes", "default": [{"base64": "gP8="}]},
//!     {"name": "tags", "dtype": "bytes", "layout": "var"},
//!     {"name": "frames", "dtype": "float32", "layout": "fixed_sequence", "shape": [2]},
//!     {"name": "tokens", "dtype": "int64", "layout": "var_sequence"},
//!     "counts:int64:var"
//!   ],
//!   "label": "label",
//!   "num_records": 60000
//! }
//! ```
//!
//! Feature object keys: `name` and `dtype` (required); `layout`: `"fixed"` (the default),
//! `"var"`, `"fixed_sequence"`, `"var_sequence"`, `"ragged"` or `"sparse"`; `shape`: the
//! dims for the two fixed layouts (default `[]`, a scalar), and for `"var"` the shape of
//! each element (`var:DIMS`); `partitions` for `"ragged"`: a list of one-key objects,
//! `{"row_splits": KEY}`, `{"row_lengths": KEY}` or `{"uniform_row_length": N}`;
//! `index_keys` and `size` for `"sparse"`; `default`: only for `"fixed"`, a flat list of one
//! value (broadcast) or `product(shape)` values. int64 values are JSON integers or
//! decimal strings; float32 values are numbers or the strings `"NaN"`, `"Infinity"`,
//! `"-Infinity"` (numbers are rounded to float32 once, from the digits as written, when
//! read from text or a file); bytes values are UTF-8 strings or `{"base64": "..."}` (written for
//! values that are not UTF-8). Unknown feature keys are an error (they are typos).
//!
//! # Invariants
//!
//! [`Schema::validate`] (run by the parsers and by `BatchParser::new`) rejects duplicate
//! names, zero-sized dims outside fixed shapes, raw dtypes with a var-length layout,
//! shapes over 2 GiB per record, defaults on anything but a fixed layout, defaults of
//! the wrong type or count, bad partitions or sparse keys, and a `label` naming no
//! feature.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::batch::Values;
use crate::image::ImageOptions;

/// The most elements a fixed shape may have (2^31), so sizes never overflow.
pub const MAX_SHAPE_SIZE: usize = 1 << 31;

/// The most bytes one record's values of one fixed-length feature may take in a
/// batch (2 GiB, protobuf's limit on a whole message): a larger shape could only
/// ever be filled from its default, and is refused before anything is allocated.
pub const MAX_FEATURE_BYTES: u64 = 1 << 31;

/// The `format` value of a schema file.
pub const SCHEMA_FORMAT: &str = "tfpipe-schema/1";

/// The element type of a feature, as stored in the batch.
///
/// `uint8` and the `raw_*` types read a `bytes_list` and decode its bytes raw,
/// little-endian (TensorFlow's `decode_raw(bytes, dtype)` with its default
/// `little_endian=True`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    /// Raw little-endian `int16` elements from one bytes value (`decode_raw(..., tf.int16)`).
    RawInt16,
    /// Raw little-endian `uint16` elements (`decode_raw(..., tf.uint16)`).
    RawUint16,
    /// Raw little-endian `int32` elements (`decode_raw(..., tf.int32)`).
    RawInt32,
    /// Raw little-endian `float32` elements (`decode_raw(..., tf.float32)`).
    RawFloat32,
    /// Raw little-endian `float64` elements (`decode_raw(..., tf.float64)`).
    RawFloat64,
}

// Defined here rather than in `batch`, which sits below `example` and knows
// nothing of feature specs.
impl Values {
    /// The dtype of a feature spec that parses into these values.
    pub fn dtype(&self) -> DType {
        match self {
            Values::Int64(_) => DType::Int64,
            Values::Float32(_) => DType::Float32,
            Values::Uint8(_) => DType::Uint8,
            Values::Int16(_) => DType::RawInt16,
            Values::Uint16(_) => DType::RawUint16,
            Values::Int32(_) => DType::RawInt32,
            Values::Float64(_) => DType::RawFloat64,
            Values::Bytes { .. } => DType::Bytes,
            Values::Sparse { values, .. } => values.dtype(),
        }
    }
}

/// Every dtype, in the order the docs list them.
const DTYPES: [DType; 9] = [
    DType::Int64,
    DType::Float32,
    DType::Bytes,
    DType::Uint8,
    DType::RawInt16,
    DType::RawUint16,
    DType::RawInt32,
    DType::RawFloat32,
    DType::RawFloat64,
];

impl DType {
    /// The name used in the text form and schema files (`int64`, `float32`, `bytes`,
    /// `uint8`, `raw_int16`, `raw_uint16`, `raw_int32`, `raw_float32`, `raw_float64`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Int64 => "int64",
            DType::Float32 => "float32",
            DType::Bytes => "bytes",
            DType::Uint8 => "uint8",
            DType::RawInt16 => "raw_int16",
            DType::RawUint16 => "raw_uint16",
            DType::RawInt32 => "raw_int32",
            DType::RawFloat32 => "raw_float32",
            DType::RawFloat64 => "raw_float64",
        }
    }

    /// The `Feature` list kind a record must hold for this dtype.
    pub fn kind_name(self) -> &'static str {
        match self {
            DType::Int64 => "int64_list",
            DType::Float32 => "float_list",
            _ => "bytes_list",
        }
    }

    /// For the raw dtypes (`uint8`, `raw_*`): the width of one element in bytes.
    pub fn raw_width(self) -> Option<usize> {
        match self {
            DType::Int64 | DType::Float32 | DType::Bytes => None,
            DType::Uint8 => Some(1),
            DType::RawInt16 | DType::RawUint16 => Some(2),
            DType::RawInt32 | DType::RawFloat32 => Some(4),
            DType::RawFloat64 => Some(8),
        }
    }

    /// Bytes one element takes in a batch (a byte string counts its offset only).
    pub fn element_bytes(self) -> usize {
        match self {
            DType::Int64 | DType::Bytes => 8,
            DType::Float32 => 4,
            raw => raw.raw_width().unwrap_or(8),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = crate::error::UnknownName;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "raw_uint8" {
            return Ok(DType::Uint8);
        }
        DTYPES
            .into_iter()
            .find(|d| d.name() == text)
            .ok_or_else(|| crate::error::UnknownName {
                what: "dtype",
                name: text.to_string(),
                expected: "int64, float32, bytes, uint8, raw_int16, raw_uint16, raw_int32, raw_float32 or raw_float64",
            })
    }
}

/// One row partition of a [`Layout::Ragged`] feature (TensorFlow's
/// `RaggedFeature.RowSplits`, `.RowLengths`, `.UniformRowLength`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Partition {
    /// The int64 feature `key` holds row splits: `0`, non-decreasing, ending at the
    /// number of inner rows.
    RowSplits(String),
    /// The int64 feature `key` holds row lengths: each `>= 0`, summing to the number
    /// of inner rows.
    RowLengths(String),
    /// Every row holds exactly this many inner rows (`>= 1`).
    UniformRowLength(usize),
}

impl Partition {
    /// The feature this partition reads, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Partition::RowSplits(k) | Partition::RowLengths(k) => Some(k),
            Partition::UniformRowLength(_) => None,
        }
    }

    /// The name used in the text form and schema files.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Partition::RowSplits(_) => "row_splits",
            Partition::RowLengths(_) => "row_lengths",
            Partition::UniformRowLength(_) => "uniform_row_length",
        }
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Partition::RowSplits(k) | Partition::RowLengths(k) => {
                write!(f, "{}({k})", self.kind_name())
            }
            Partition::UniformRowLength(n) => write!(f, "uniform_row_length({n})"),
        }
    }
}

/// How many values a feature has per record, and how they are shaped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Exactly `product(shape)` values per record (`[]` is a scalar; a zero
    /// dimension means no values).
    Fixed(Vec<usize>),
    /// Any number of values per record.
    Var,
    /// A `SequenceExample` feature list: any number of steps, each of exactly
    /// `product(shape)` values.
    FixedSequence(Vec<usize>),
    /// A `SequenceExample` feature list: any number of steps, each of any
    /// number of values.
    VarSequence,
    /// Any number of elements per record, each of exactly `product(shape)` values
    /// (`shape` not empty): the record's list holds a multiple of that
    /// (TensorFlow's `FixedLenSequenceFeature(shape, allow_missing=True)` in an `Example`).
    VarFixed(Vec<usize>),
    /// A ragged tensor per record (TensorFlow's `RaggedFeature`): the feature's
    /// values, split into rows by `partitions` (outermost first), each reading
    /// another int64 feature of the record or a uniform length.
    Ragged(Vec<Partition>),
    /// A sparse tensor of dense shape `size` per record (TensorFlow's
    /// `SparseFeature`): the feature's values sit at the coordinates held by the
    /// int64 features `index_keys` (one per dimension of `size`).
    Sparse {
        /// The features holding each value's index along each dimension.
        index_keys: Vec<String>,
        /// The dense shape of each record's tensor.
        size: Vec<usize>,
    },
}

impl Layout {
    /// Whether the feature lives in a `SequenceExample`'s feature lists.
    pub fn is_sequence(&self) -> bool {
        matches!(self, Layout::FixedSequence(_) | Layout::VarSequence)
    }

    /// The dense shape of each record (`Fixed`), step (`FixedSequence`) or element
    /// (`VarFixed`).
    pub fn fixed_shape(&self) -> Option<&[usize]> {
        match self {
            Layout::Fixed(shape) | Layout::FixedSequence(shape) | Layout::VarFixed(shape) => {
                Some(shape)
            }
            Layout::Var | Layout::VarSequence | Layout::Ragged(_) | Layout::Sparse { .. } => None,
        }
    }

    /// The name used in schema files (`fixed`, `var`, `fixed_sequence`, `var_sequence`,
    /// `ragged`, `sparse`; `VarFixed` is `var` with a `shape`).
    pub fn name(&self) -> &'static str {
        match self {
            Layout::Fixed(_) => "fixed",
            Layout::Var | Layout::VarFixed(_) => "var",
            Layout::FixedSequence(_) => "fixed_sequence",
            Layout::VarSequence => "var_sequence",
            Layout::Ragged(_) => "ragged",
            Layout::Sparse { .. } => "sparse",
        }
    }

    /// The other features of the record this layout reads (ragged partitions,
    /// sparse indices).
    pub fn keys(&self) -> Vec<&str> {
        match self {
            Layout::Ragged(parts) => parts.iter().filter_map(Partition::key).collect(),
            Layout::Sparse { index_keys, .. } => index_keys.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }
}

/// A default value (flattened), used when a fixed-length feature is missing.
///
/// A `uint8` feature's default is `Int64` with every value in `0..=255`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// 64-bit integers.
    Int64(Vec<i64>),
    /// 32-bit floats.
    Float32(Vec<f32>),
    /// Byte strings.
    Bytes(Vec<Vec<u8>>),
}

impl Value {
    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            Value::Int64(v) => v.len(),
            Value::Float32(v) => v.len(),
            Value::Bytes(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One feature of a [`Schema`].
///
/// ```
/// use tfpipe::example::{DType, FeatureSpec, Layout};
/// let spec: FeatureSpec = "image_raw:uint8:28x28".parse().unwrap();
/// assert_eq!(spec.dtype, DType::Uint8);
/// assert_eq!(spec.layout, Layout::Fixed(vec![28, 28]));
/// assert_eq!(spec.to_string(), "image_raw:uint8:28x28");
/// ```
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
    /// For an encoded image (`NAME:image:HxWxC[:OPTIONS]`): how its one bytes
    /// value is decoded into the fixed `dtype` (`uint8`, or `float32` when
    /// normalised) of shape `layout` (`[H, W, C]`, or `[C, H, W]`).
    pub image: Option<ImageOptions>,
}

impl FeatureSpec {
    /// A fixed-length feature of `shape` (`&[]` for a scalar), without default.
    pub fn fixed(name: impl Into<String>, dtype: DType, shape: &[usize]) -> FeatureSpec {
        FeatureSpec {
            name: name.into(),
            dtype,
            layout: Layout::Fixed(shape.to_vec()),
            default: None,
            image: None,
        }
    }

    /// A var-length feature.
    pub fn var(name: impl Into<String>, dtype: DType) -> FeatureSpec {
        FeatureSpec {
            name: name.into(),
            dtype,
            layout: Layout::Var,
            default: None,
            image: None,
        }
    }

    /// This spec with `default` as its default value.
    pub fn with_default(mut self, default: Value) -> FeatureSpec {
        self.default = Some(default);
        self
    }

    /// An encoded image feature decoded to `options` (the spec
    /// `NAME:image:HxWxC[:OPTIONS]`): dtype `uint8` (or `float32` for a
    /// normalised output), layout fixed at the output shape.
    ///
    /// ```
    /// use tfpipe::example::{DType, FeatureSpec, Layout};
    /// use tfpipe::image::ImageOptions;
    /// let spec = FeatureSpec::image("image/encoded", ImageOptions::new(28, 28, 1));
    /// assert_eq!(spec.dtype, DType::Uint8);
    /// assert_eq!(spec.layout, Layout::Fixed(vec![28, 28, 1]));
    /// assert_eq!(spec.to_string(), "image/encoded:image:28x28x1");
    /// assert_eq!(spec.to_string().parse::<FeatureSpec>().unwrap(), spec);
    /// ```
    pub fn image(name: impl Into<String>, options: ImageOptions) -> FeatureSpec {
        FeatureSpec {
            name: name.into(),
            dtype: image_dtype(&options),
            layout: Layout::Fixed(options.shape().to_vec()),
            default: None,
            image: Some(options),
        }
    }

    /// An image spec's own checks: its dtype and layout follow its options,
    /// and it has no default (a missing image is an error).
    fn validate_image(&self, image: &ImageOptions) -> Result<(), String> {
        image.check().map_err(|e| e.to_string())?;
        if self.dtype != image_dtype(image) || self.layout != Layout::Fixed(image.shape().to_vec())
        {
            return Err(format!(
                "an image feature decodes to {} of shape {:?}, not {} of layout {:?}",
                image_dtype(image),
                image.shape(),
                self.dtype,
                self.layout
            ));
        }
        if self.default.is_some() {
            return Err("an image feature takes no default".into());
        }
        Ok(())
    }

    /// Values per record (`Fixed`) or per step (`FixedSequence`): `product(shape)`.
    pub fn fixed_len(&self) -> Option<usize> {
        self.layout.fixed_shape().map(|s| s.iter().product())
    }

    /// Bytes one record's values of this feature take in a batch, when that is fixed
    /// by the spec (`Fixed` layouts; `None` otherwise or on overflow).
    pub fn bytes_per_record(&self) -> Option<u64> {
        let Layout::Fixed(shape) = &self.layout else {
            return None;
        };
        let n = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))?;
        n.checked_mul(self.dtype.element_bytes() as u64)
    }

    /// Checks this spec on its own (see the module doc's invariants).
    pub fn validate(&self) -> Result<(), SchemaError> {
        let bad = |reason: String| {
            Err(SchemaError::Feature {
                name: self.name.clone(),
                spec: self.to_string(),
                reason,
            })
        };
        if let Some(image) = &self.image {
            return self.validate_image(image).or_else(bad);
        }
        if let Some(shape) = self.layout.fixed_shape() {
            let size = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            if size.is_none_or(|n| n > MAX_SHAPE_SIZE) {
                return bad(format!(
                    "shape {shape:?} has more than {MAX_SHAPE_SIZE} elements"
                ));
            }
            if !matches!(self.layout, Layout::Fixed(_)) && shape.contains(&0) {
                return bad(format!(
                    "shape {shape:?} has a zero dimension: each {} must hold at least one value",
                    if self.layout.is_sequence() {
                        "step"
                    } else {
                        "element"
                    }
                ));
            }
        }
        if let Some(bytes) = self.bytes_per_record()
            && bytes > MAX_FEATURE_BYTES
        {
            return bad(format!(
                "needs {} per record ({} bytes per {} value), more than the {} a record may decode to",
                human_bytes(bytes),
                self.dtype.element_bytes(),
                self.dtype,
                human_bytes(MAX_FEATURE_BYTES)
            ));
        }
        match &self.layout {
            Layout::VarFixed(shape) if shape.is_empty() => {
                return bad(
                    "a var-length layout with an empty element shape is `Layout::Var`".into(),
                );
            }
            Layout::Ragged(parts) => {
                for part in parts {
                    match part {
                        Partition::UniformRowLength(0) => {
                            return bad("uniform_row_length must be at least 1".into());
                        }
                        Partition::RowSplits(k) | Partition::RowLengths(k) if *k == self.name => {
                            return bad(format!("partition {part} reads the feature's own values"));
                        }
                        _ => {}
                    }
                }
            }
            Layout::Sparse { index_keys, size } => {
                if index_keys.is_empty() || index_keys.len() != size.len() {
                    return bad(format!(
                        "a sparse feature needs one index key per dimension of its size, found {} keys for size {size:?}",
                        index_keys.len()
                    ));
                }
                if size
                    .iter()
                    .try_fold(1usize, |n, &d| n.checked_mul(d))
                    .is_none()
                {
                    return bad(format!("size {size:?} overflows"));
                }
                for (i, key) in index_keys.iter().enumerate() {
                    if *key == self.name || index_keys[..i].contains(key) {
                        return bad(format!(
                            "index key {key:?} is the value key or listed twice"
                        ));
                    }
                }
            }
            _ => {}
        }
        if self.dtype.raw_width().is_some()
            && !matches!(self.layout, Layout::Fixed(_) | Layout::FixedSequence(_))
        {
            return bad(format!(
                "{} needs a fixed shape (e.g. `:784`, `:28x28` or `:seq:4`), not layout {}",
                self.dtype,
                self.layout.name()
            ));
        }
        let Some(default) = &self.default else {
            return Ok(());
        };
        let Layout::Fixed(shape) = &self.layout else {
            return bad(format!(
                "a default is only allowed on a fixed-length feature, not on layout {}",
                self.layout.name()
            ));
        };
        let want: usize = shape.iter().product();
        let type_ok = match (self.dtype, default) {
            (DType::Int64, Value::Int64(_))
            | (DType::Float32, Value::Float32(_))
            | (DType::Bytes, Value::Bytes(_)) => true,
            (DType::Uint8, Value::Int64(v)) => {
                if let Some(x) = v.iter().find(|x| !(0..=255).contains(*x)) {
                    return bad(format!("uint8 default value {x} is outside 0..=255"));
                }
                true
            }
            (raw, _) if raw.raw_width().is_some() && raw != DType::Uint8 => {
                return bad(format!("{raw} features take no default"));
            }
            _ => false,
        };
        if !type_ok {
            let found = match default {
                Value::Int64(_) => "int64",
                Value::Float32(_) => "float32",
                Value::Bytes(_) => "bytes",
            };
            return bad(format!(
                "default holds {found} values, expected {}",
                match self.dtype {
                    DType::Uint8 => "integers 0..=255",
                    other => other.name(),
                }
            ));
        }
        if default.len() != 1 && default.len() != want {
            return bad(format!(
                "default has {} values, expected 1 (broadcast) or {want} (the shape's size)",
                default.len()
            ));
        }
        Ok(())
    }
}

/// `bytes` as `N bytes`, `N KiB`, `N MiB`, `N GiB` or `N TiB` (one decimal when not whole).
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn text_error(spec: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError::Text {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

fn parse_dims(text: &str) -> Result<Vec<usize>, String> {
    text.split('x')
        .map(|d| {
            d.parse::<usize>().map_err(|_| {
                format!(
                    "invalid shape {text:?} (expected N or NxMx..., `var`, `var:N...`, `seq`, `seq:N...`, `seq:var`, `ragged[:PARTITION...]` or `sparse(KEY,...):N...`)"
                )
            })
        })
        .collect()
}

/// `KIND(ARG)` -> (`KIND`, `ARG`).
fn call(text: &str) -> Option<(&str, &str)> {
    let (kind, rest) = text.split_once('(')?;
    Some((kind, rest.strip_suffix(')')?))
}

fn parse_partition(text: &str) -> Result<Partition, String> {
    let bad = || {
        format!(
            "invalid partition {text:?} (expected row_splits(KEY), row_lengths(KEY) or uniform_row_length(N))"
        )
    };
    match call(text).ok_or_else(bad)? {
        ("row_splits", key) if !key.is_empty() => Ok(Partition::RowSplits(key.to_string())),
        ("row_lengths", key) if !key.is_empty() => Ok(Partition::RowLengths(key.to_string())),
        ("uniform_row_length", n) => n
            .parse()
            .map(Partition::UniformRowLength)
            .map_err(|_| bad()),
        _ => Err(bad()),
    }
}

fn parse_layout(text: Option<&str>) -> Result<Layout, String> {
    let Some(text) = text else {
        return Ok(Layout::Fixed(Vec::new()));
    };
    match text {
        "var" => return Ok(Layout::Var),
        "seq" => return Ok(Layout::FixedSequence(Vec::new())),
        "seq:var" => return Ok(Layout::VarSequence),
        "ragged" => return Ok(Layout::Ragged(Vec::new())),
        _ => {}
    }
    if let Some(parts) = text.strip_prefix("ragged:") {
        return parts
            .split(':')
            .map(parse_partition)
            .collect::<Result<_, _>>()
            .map(Layout::Ragged);
    }
    if text.starts_with("sparse(") {
        let bad = || {
            format!(
                "invalid sparse shape {text:?} (expected sparse(INDEX_KEY,...):N..., e.g. sparse(ix):100)"
            )
        };
        let (keys, dims) = text.split_once("):").ok_or_else(bad)?;
        let keys = keys.strip_prefix("sparse(").ok_or_else(bad)?;
        return Ok(Layout::Sparse {
            index_keys: keys.split(',').map(str::to_string).collect(),
            size: parse_dims(dims)?,
        });
    }
    if let Some(dims) = text.strip_prefix("seq:") {
        return Ok(Layout::FixedSequence(parse_dims(dims)?));
    }
    if let Some(dims) = text.strip_prefix("var:") {
        return Ok(Layout::VarFixed(parse_dims(dims)?));
    }
    Ok(Layout::Fixed(parse_dims(text)?))
}

/// Splits on commas not escaped by a backslash.
fn split_default(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let bytes = text.as_bytes();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b',' => {
                parts.push(&text[start..i]);
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    parts.push(&text[start.min(text.len())..]);
    parts
}

fn unescape_bytes(text: &str) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        match bytes.get(i + 1) {
            Some(b'\\') => out.push(b'\\'),
            Some(b',') => out.push(b','),
            Some(b'x') => {
                let hex = text.get(i + 2..i + 4).unwrap_or("");
                let byte = u8::from_str_radix(hex, 16)
                    .ok()
                    .filter(|_| hex.len() == 2)
                    .ok_or_else(|| {
                        format!("invalid escape in {text:?}: `\\x` needs two hex digits")
                    })?;
                out.push(byte);
                i += 4;
                continue;
            }
            _ => {
                return Err(format!(
                    "invalid escape in {text:?} (valid: `\\\\`, `\\,`, `\\xHH`)"
                ));
            }
        }
        i += 2;
    }
    Ok(out)
}

fn escape_bytes(value: &[u8], out: &mut String) {
    for chunk in value.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                ',' => out.push_str("\\,"),
                c if c.is_control() => {
                    let mut buf = [0; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
}

fn parse_default(dtype: DType, text: &str) -> Result<Value, String> {
    let parts = split_default(text);
    match dtype {
        DType::RawInt16
        | DType::RawUint16
        | DType::RawInt32
        | DType::RawFloat32
        | DType::RawFloat64 => Err(format!("{dtype} features take no default")),
        DType::Int64 | DType::Uint8 => parts
            .iter()
            .map(|p| {
                p.trim().parse::<i64>().map_err(|_| {
                    format!("invalid {dtype} default value {p:?} (expected an integer)")
                })
            })
            .collect::<Result<_, _>>()
            .map(Value::Int64),
        DType::Float32 => parts
            .iter()
            .map(|p| {
                p.trim().parse::<f32>().map_err(|_| {
                    format!(
                        "invalid float32 default value {p:?} (expected e.g. 0.5, -1e3, NaN, inf)"
                    )
                })
            })
            .collect::<Result<_, _>>()
            .map(Value::Float32),
        DType::Bytes => parts
            .iter()
            .map(|p| unescape_bytes(p))
            .collect::<Result<_, _>>()
            .map(Value::Bytes),
    }
}

/// The dtype an image feature decodes to.
fn image_dtype(options: &ImageOptions) -> DType {
    match options.output {
        crate::image::OutputType::Uint8 => DType::Uint8,
        crate::image::OutputType::Float32 { .. } => DType::Float32,
    }
}

/// `NAME:image:HxWxC[:OPTIONS]` after the name: `shape` is `HxWxC[:OPTIONS]`.
fn parse_image(
    name: String,
    shape: Option<&str>,
    default: Option<&str>,
) -> Result<FeatureSpec, String> {
    if default.is_some() {
        return Err("an image feature takes no default".into());
    }
    let shape =
        shape.ok_or("an image feature needs its size, e.g. `image/encoded:image:224x224x3`")?;
    let (size, options) = shape.split_once(':').unwrap_or((shape, ""));
    Ok(FeatureSpec::image(
        name,
        ImageOptions::from_text(size, options)?,
    ))
}

impl FromStr for FeatureSpec {
    type Err = SchemaError;

    /// Parses `NAME:DTYPE[:SHAPE][=DEFAULT]` (see the module doc) and validates it.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (name, rest) = if text.starts_with('"') {
            let mut stream = serde_json::Deserializer::from_str(text).into_iter::<String>();
            let name = match stream.next() {
                Some(Ok(name)) => name,
                _ => return Err(text_error(text, "unterminated or invalid quoted NAME")),
            };
            let rest = &text[stream.byte_offset()..];
            let Some(rest) = rest.strip_prefix(':') else {
                return Err(text_error(text, "expected `:` after the quoted NAME"));
            };
            (name, rest)
        } else {
            let Some((name, rest)) = text.split_once(':') else {
                return Err(text_error(text, "missing `:DTYPE`"));
            };
            (name.to_string(), rest)
        };
        let (typed, default) = match rest.split_once('=') {
            Some((typed, default)) => (typed, Some(default)),
            None => (rest, None),
        };
        let (dtype, shape) = match typed.split_once(':') {
            Some((dtype, shape)) => (dtype, Some(shape)),
            None => (typed, None),
        };
        if dtype == "image" {
            return parse_image(name, shape, default).map_err(|e| text_error(text, e));
        }
        let dtype: DType = dtype
            .parse()
            .map_err(|e: crate::error::UnknownName| text_error(text, e.to_string()))?;
        let layout = parse_layout(shape).map_err(|e| text_error(text, e))?;
        let default = default
            .map(|d| parse_default(dtype, d))
            .transpose()
            .map_err(|e| text_error(text, e))?;
        let spec = FeatureSpec {
            name,
            dtype,
            layout,
            default,
            image: None,
        };
        spec.validate().map_err(|e| match e {
            SchemaError::Feature { reason, .. } => text_error(text, reason),
            other => other,
        })?;
        Ok(spec)
    }
}

fn write_dims(f: &mut fmt::Formatter<'_>, dims: &[usize]) -> fmt::Result {
    for (i, d) in dims.iter().enumerate() {
        if i > 0 {
            f.write_str("x")?;
        }
        write!(f, "{d}")?;
    }
    Ok(())
}

impl fmt::Display for FeatureSpec {
    /// The text form, `NAME:DTYPE[:SHAPE][=DEFAULT]`; parses back to `self`
    /// (except for NaN payloads in float defaults).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.contains(':') || self.name.starts_with('"') {
            write!(f, "{}", Json::String(self.name.clone()))?;
        } else {
            f.write_str(&self.name)?;
        }
        if let Some(image) = &self.image {
            write!(
                f,
                ":image:{}x{}x{}",
                image.height, image.width, image.channels
            )?;
            let options = image.options_text();
            if !options.is_empty() {
                write!(f, ":{options}")?;
            }
            return Ok(());
        }
        write!(f, ":{}", self.dtype)?;
        match &self.layout {
            Layout::Fixed(shape) if shape.is_empty() => {}
            Layout::Fixed(shape) => {
                f.write_str(":")?;
                write_dims(f, shape)?;
            }
            Layout::Var => f.write_str(":var")?,
            Layout::FixedSequence(shape) if shape.is_empty() => f.write_str(":seq")?,
            Layout::FixedSequence(shape) => {
                f.write_str(":seq:")?;
                write_dims(f, shape)?;
            }
            Layout::VarSequence => f.write_str(":seq:var")?,
            Layout::VarFixed(shape) => {
                f.write_str(":var:")?;
                write_dims(f, shape)?;
            }
            Layout::Ragged(parts) => {
                f.write_str(":ragged")?;
                for part in parts {
                    write!(f, ":{part}")?;
                }
            }
            Layout::Sparse { index_keys, size } => {
                write!(f, ":sparse({}):", index_keys.join(","))?;
                write_dims(f, size)?;
            }
        }
        if let Some(default) = &self.default {
            f.write_str("=")?;
            let mut text = String::new();
            match default {
                Value::Int64(v) => {
                    let parts: Vec<String> = v.iter().map(|x| x.to_string()).collect();
                    text = parts.join(",");
                }
                Value::Float32(v) => {
                    let parts: Vec<String> = v.iter().map(|x| x.to_string()).collect();
                    text = parts.join(",");
                }
                Value::Bytes(v) => {
                    for (i, b) in v.iter().enumerate() {
                        if i > 0 {
                            text.push(',');
                        }
                        escape_bytes(b, &mut text);
                    }
                }
            }
            f.write_str(&text)?;
        }
        Ok(())
    }
}

/// The features to parse, in column order, and which one is the label.
///
/// ```
/// use tfpipe::Schema;
/// let schema = Schema::from_feature_texts(&["image_raw:uint8:28x28", "label:int64"])
///     .unwrap()
///     .with_label("label")
///     .unwrap();
/// let json = schema.to_json_value().to_string();
/// assert_eq!(Schema::from_json_str(&json).unwrap(), schema);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Schema {
    /// The features, in the order of the batch's columns.
    pub features: Vec<FeatureSpec>,
    /// The label feature's name, if the data has one.
    pub label: Option<String>,
}

/// An invalid feature spec or schema file.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A `--feature NAME:DTYPE[:SHAPE]` text that does not parse.
    #[error(
        "invalid feature spec {spec:?}: {reason} (expected NAME:DTYPE[:SHAPE][=DEFAULT], e.g. image:uint8:28x28, label:int64=-1, tags:bytes:var, tokens:int64:seq:var)"
    )]
    Text {
        /// The text given.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// A feature spec that is inconsistent on its own (a shape too large,
    /// a default of the wrong size, ...).
    #[error("feature {name:?} ({spec}): {reason}")]
    Feature {
        /// The feature.
        name: String,
        /// Its spec, as text.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A name that is not one of the schema's features.
    #[error("{name:?} is not a feature (features: {})", features.join(", "))]
    UnknownFeature {
        /// The name given.
        name: String,
        /// The schema's feature names.
        features: Vec<String>,
    },
    /// Two features share a name.
    #[error("feature {name:?} is listed twice (names must be unique)")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// The label names no feature.
    #[error("label {label:?} names no feature (features: {features:?}{})", did_you_mean(nearest.as_deref()))]
    UnknownLabel {
        /// The label given.
        label: String,
        /// The schema's feature names.
        features: Vec<String>,
        /// The feature name closest to the label, if one is close.
        nearest: Option<String>,
    },
    /// Metadata given under a key the schema format reserves.
    #[error("metadata key {key:?} is reserved (reserved: format, features, label)")]
    ReservedKey {
        /// The key.
        key: String,
    },
    /// Schema JSON of the wrong shape (the `features` list missing, a
    /// feature that does not parse, ...): a self-contained message.
    #[error("invalid schema JSON: {reason}")]
    Json {
        /// What is wrong, and where in the JSON.
        reason: String,
    },
    /// Text that is not JSON at all.
    #[error("invalid JSON")]
    Syntax(#[source] serde_json::Error),
    /// A schema file's metadata with a bad value (`records`, `source`, ...).
    #[error("metadata: {reason}")]
    Metadata {
        /// Which key, and what is wrong with its value.
        reason: String,
    },
    /// A schema file that cannot be used: the file, with the problem as
    /// the source.
    #[error("{}", path.display())]
    File {
        /// The schema file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<SchemaError>,
    },
    /// A schema file that cannot be read or written.
    #[error("{}: cannot {action}", path.display())]
    Io {
        /// The schema file.
        path: std::path::PathBuf,
        /// What was being done (`read`, `create a temporary file`, ...).
        action: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl SchemaError {
    /// This error, as a problem of the schema file at `path`.
    fn in_file(self, path: &Path) -> SchemaError {
        SchemaError::File {
            path: path.to_path_buf(),
            source: Box::new(self),
        }
    }
}

/// `; did you mean "x"?` when there is a near name.
fn did_you_mean(nearest: Option<&str>) -> String {
    nearest
        .map(|n| format!("; did you mean {n:?}?"))
        .unwrap_or_default()
}

/// What a schema file records besides its features, as `tfpipe convert` and
/// the token-set generator write it: the one reader of those keys, for every
/// consumer (training, prediction, a conversion reusing a schema).
///
/// ```
/// use tfpipe::example::SchemaMetadata;
/// let json = serde_json::json!({
///     "records": 344,
///     "source": {"label_vocabulary": ["Adelie", "Chinstrap", "Gentoo"]}
/// });
/// let facts = SchemaMetadata::from_json(json.as_object().unwrap()).unwrap();
/// assert_eq!(facts.records, Some(344));
/// assert_eq!(facts.classes(), Some(3));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemaMetadata {
    /// The records converted (`records`).
    pub records: Option<u64>,
    /// The label's class names in class-id order: `source.label_vocabulary`
    /// (a tabular conversion's text label) or `source.classes` (an image
    /// folder's class directories).
    pub label_vocabulary: Option<Vec<String>>,
    /// Token ids are below this (`vocab_size`, top level or under `source`).
    pub vocab_size: Option<usize>,
}

impl SchemaMetadata {
    /// Reads the metadata keys of a schema file (from
    /// [`Schema::load_with_metadata`]). A key of the wrong type is an error
    /// naming it; a missing key is `None`.
    pub fn from_json(metadata: &Map<String, Json>) -> Result<SchemaMetadata, String> {
        let source = metadata.get("source").and_then(Json::as_object);
        let records = match metadata.get("records") {
            None => None,
            Some(r) => Some(r.as_u64().ok_or("records is not a count")?),
        };
        let vocabulary = source.and_then(|s| {
            [
                ("label_vocabulary", s.get("label_vocabulary")),
                ("classes", s.get("classes")),
            ]
            .into_iter()
            .find_map(|(key, value)| value.map(|v| (key, v)))
        });
        let label_vocabulary = match vocabulary {
            None => None,
            Some((key, Json::Array(items))) => Some(
                items
                    .iter()
                    .map(|item| item.as_str().map(str::to_string))
                    .collect::<Option<Vec<String>>>()
                    .ok_or_else(|| format!("source.{key} holds a non-string"))?,
            ),
            Some((key, _)) => return Err(format!("source.{key} is not a list")),
        };
        let vocab_size = match metadata
            .get("vocab_size")
            .or_else(|| source.and_then(|s| s.get("vocab_size")))
        {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|v| usize::try_from(v).ok())
                    .ok_or("vocab_size is not a count")?,
            ),
        };
        Ok(SchemaMetadata {
            records,
            label_vocabulary,
            vocab_size,
        })
    }

    /// The number of classes the label vocabulary holds, when there is one.
    pub fn classes(&self) -> Option<usize> {
        self.label_vocabulary
            .as_ref()
            .map(Vec::len)
            .filter(|&n| n > 0)
    }
}

const RESERVED_KEYS: [&str; 3] = ["format", "features", "label"];
const FEATURE_KEYS: [&str; 9] = [
    "name",
    "image",
    "dtype",
    "layout",
    "shape",
    "default",
    "partitions",
    "index_keys",
    "size",
];

fn float_to_json(x: f32) -> Json {
    if x.is_nan() {
        Json::from("NaN")
    } else if x == f32::INFINITY {
        Json::from("Infinity")
    } else if x == f32::NEG_INFINITY {
        Json::from("-Infinity")
    } else {
        // f32 -> f64 is exact, and serde_json writes the shortest f64 that reads back.
        Json::from(f64::from(x))
    }
}

fn feature_to_json(spec: &FeatureSpec) -> Json {
    let mut obj = Map::new();
    obj.insert("name".into(), Json::from(spec.name.clone()));
    if let Some(image) = &spec.image {
        obj.insert("dtype".into(), Json::from("image"));
        let size = vec![image.height, image.width, image.channels];
        obj.insert("shape".into(), Json::from(size));
        let options = image.options_text();
        if !options.is_empty() {
            obj.insert("image".into(), Json::from(options));
        }
        return Json::Object(obj);
    }
    obj.insert("dtype".into(), Json::from(spec.dtype.name()));
    if !matches!(spec.layout, Layout::Fixed(_)) {
        obj.insert("layout".into(), Json::from(spec.layout.name()));
    }
    if let Some(shape) = spec.layout.fixed_shape()
        && !shape.is_empty()
    {
        obj.insert("shape".into(), Json::from(shape.to_vec()));
    }
    match &spec.layout {
        Layout::Ragged(parts) => {
            let parts = parts
                .iter()
                .map(|p| {
                    let arg = match p {
                        Partition::RowSplits(k) | Partition::RowLengths(k) => Json::from(k.clone()),
                        Partition::UniformRowLength(n) => Json::from(*n),
                    };
                    let mut one = Map::new();
                    one.insert(p.kind_name().into(), arg);
                    Json::Object(one)
                })
                .collect();
            obj.insert("partitions".into(), Json::Array(parts));
        }
        Layout::Sparse { index_keys, size } => {
            obj.insert("index_keys".into(), Json::from(index_keys.clone()));
            obj.insert("size".into(), Json::from(size.clone()));
        }
        _ => {}
    }
    if let Some(default) = &spec.default {
        let values: Vec<Json> = match default {
            Value::Int64(v) => v.iter().map(|&x| Json::from(x)).collect(),
            Value::Float32(v) => v.iter().map(|&x| float_to_json(x)).collect(),
            Value::Bytes(v) => v
                .iter()
                .map(|b| match std::str::from_utf8(b) {
                    Ok(s) => Json::from(s),
                    Err(_) => serde_json::json!({ "base64": BASE64.encode(b) }),
                })
                .collect(),
        };
        obj.insert("default".into(), Json::Array(values));
    }
    Json::Object(obj)
}

fn json_default(dtype: DType, values: &[Json]) -> Result<Value, String> {
    match dtype {
        DType::RawInt16
        | DType::RawUint16
        | DType::RawInt32
        | DType::RawFloat32
        | DType::RawFloat64 => Err(format!("{dtype} features take no default")),
        DType::Int64 | DType::Uint8 => values
            .iter()
            .map(|v| match v {
                Json::Number(n) => n.as_i64(),
                Json::String(s) => s.parse().ok(),
                _ => None,
            }
            .ok_or_else(|| format!("invalid {dtype} default value {v} (expected an integer or a decimal string)")))
            .collect::<Result<_, _>>()
            .map(Value::Int64),
        DType::Float32 => values
            .iter()
            .map(|v| match v {
                Json::Number(n) => n.as_f64().map(|x| x as f32),
                Json::String(s) => s.parse().ok(),
                _ => None,
            }
            .ok_or_else(|| format!("invalid float32 default value {v} (expected a number, \"NaN\", \"Infinity\" or \"-Infinity\")")))
            .collect::<Result<_, _>>()
            .map(Value::Float32),
        DType::Bytes => values
            .iter()
            .map(|v| match v {
                Json::String(s) => Some(s.as_bytes().to_vec()),
                Json::Object(o) if o.len() == 1 => o
                    .get("base64")
                    .and_then(Json::as_str)
                    .and_then(|b| BASE64.decode(b).ok()),
                _ => None,
            }
            .ok_or_else(|| format!("invalid bytes default value {v} (expected a string or {{\"base64\": \"...\"}})")))
            .collect::<Result<_, _>>()
            .map(Value::Bytes),
    }
}

fn partition_from_json(value: &Json) -> Result<Partition, String> {
    let bad = || {
        format!(
            "invalid partition {value} (expected {{\"row_splits\": KEY}}, {{\"row_lengths\": KEY}} or {{\"uniform_row_length\": N}})"
        )
    };
    let Json::Object(one) = value else {
        return Err(bad());
    };
    let mut entries = one.iter();
    let (Some((kind, arg)), None) = (entries.next(), entries.next()) else {
        return Err(bad());
    };
    match (kind.as_str(), arg) {
        ("row_splits", Json::String(k)) => Ok(Partition::RowSplits(k.clone())),
        ("row_lengths", Json::String(k)) => Ok(Partition::RowLengths(k.clone())),
        ("uniform_row_length", n) => n
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Partition::UniformRowLength)
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// `{"name": N, "dtype": "image", "shape": [H, W, C], "image": "OPTIONS"}`.
fn image_from_json(name: String, obj: &Map<String, Json>) -> Result<FeatureSpec, String> {
    if let Some(key) = obj
        .keys()
        .find(|k| !["name", "dtype", "shape", "image"].contains(&k.as_str()))
    {
        return Err(format!(
            "{key:?} is not allowed on an image feature (valid: name, dtype, shape, image)"
        ));
    }
    let size = match obj.get("shape").and_then(Json::as_array) {
        Some(dims) if dims.len() == 3 && dims.iter().all(|d| d.as_u64().is_some()) => {
            let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
            dims.join("x")
        }
        _ => return Err("an image feature needs \"shape\": [H, W, C], e.g. [224, 224, 3]".into()),
    };
    let options = match obj.get("image") {
        None => "",
        Some(Json::String(options)) => options.as_str(),
        Some(other) => {
            return Err(format!(
                "invalid \"image\" {other} (expected options such as \"center,area\")"
            ));
        }
    };
    Ok(FeatureSpec::image(
        name,
        ImageOptions::from_text(&size, options)?,
    ))
}

fn feature_from_json(value: &Json) -> Result<FeatureSpec, String> {
    let obj = match value {
        Json::String(text) => return text.parse().map_err(|e: SchemaError| e.to_string()),
        Json::Object(obj) => obj,
        other => {
            return Err(format!(
                "expected an object or a NAME:DTYPE[:SHAPE] string, found {other}"
            ));
        }
    };
    if let Some(key) = obj.keys().find(|k| !FEATURE_KEYS.contains(&k.as_str())) {
        return Err(format!(
            "unknown key {key:?} (valid: name, dtype, layout, shape, default, partitions, index_keys, size, image)"
        ));
    }
    let name = obj
        .get("name")
        .and_then(Json::as_str)
        .ok_or("missing or non-string \"name\"")?
        .to_string();
    if obj.get("dtype").and_then(Json::as_str) == Some("image") {
        return image_from_json(name, obj);
    }
    if obj.contains_key("image") {
        return Err("\"image\" options need \"dtype\": \"image\"".into());
    }
    let dtype: DType = obj
        .get("dtype")
        .and_then(Json::as_str)
        .ok_or("missing or non-string \"dtype\" (int64, float32, bytes, uint8 or raw_*)")?
        .parse()
        .map_err(|e: crate::error::UnknownName| e.to_string())?;
    let dims = |key: &str| -> Result<Option<Vec<usize>>, String> {
        let bad = |v: &Json| format!("invalid {key:?} {v} (expected a list of integers >= 0)");
        match obj.get(key) {
            None => Ok(None),
            Some(Json::Array(dims)) => dims
                .iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect::<Option<Vec<usize>>>()
                .map(Some)
                .ok_or_else(|| bad(&obj[key])),
            Some(other) => Err(bad(other)),
        }
    };
    let shape = dims("shape")?;
    let layout_name = match obj.get("layout") {
        None => "fixed",
        Some(Json::String(l)) => l.as_str(),
        Some(other) => return Err(format!("invalid \"layout\" {other} (expected a string)")),
    };
    let allowed: &[&str] = match layout_name {
        "fixed" | "fixed_sequence" | "var" => &["shape"],
        "ragged" => &["partitions"],
        "sparse" => &["index_keys", "size"],
        _ => &[],
    };
    for key in ["shape", "partitions", "index_keys", "size"] {
        if obj.contains_key(key) && !allowed.contains(&key) {
            return Err(format!(
                "{key:?} is not allowed with layout {layout_name:?}"
            ));
        }
    }
    let layout = match layout_name {
        "fixed" => Layout::Fixed(shape.unwrap_or_default()),
        "fixed_sequence" => Layout::FixedSequence(shape.unwrap_or_default()),
        "var" => match shape {
            Some(shape) if !shape.is_empty() => Layout::VarFixed(shape),
            _ => Layout::Var,
        },
        "var_sequence" => Layout::VarSequence,
        "ragged" => {
            let parts = match obj.get("partitions") {
                None => Vec::new(),
                Some(Json::Array(parts)) => parts
                    .iter()
                    .map(partition_from_json)
                    .collect::<Result<_, _>>()?,
                Some(other) => {
                    return Err(format!(
                        "invalid \"partitions\" {other} (expected a list such as [{{\"row_lengths\": \"KEY\"}}])"
                    ));
                }
            };
            Layout::Ragged(parts)
        }
        "sparse" => {
            let index_keys = match obj.get("index_keys") {
                Some(Json::Array(keys)) => keys
                    .iter()
                    .map(|k| k.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>(),
                _ => None,
            }
            .ok_or("a sparse feature needs \"index_keys\": a list of feature names")?;
            let size = dims("size")?
                .ok_or("a sparse feature needs \"size\": its dense shape, e.g. [100]")?;
            Layout::Sparse { index_keys, size }
        }
        other => {
            return Err(format!(
                "invalid \"layout\" {other:?} (expected \"fixed\", \"var\", \"fixed_sequence\", \"var_sequence\", \"ragged\" or \"sparse\")"
            ));
        }
    };
    let default = match obj.get("default") {
        None | Some(Json::Null) => None,
        Some(Json::Array(values)) => Some(json_default(dtype, values)?),
        Some(other) => {
            return Err(format!(
                "invalid \"default\" {other} (expected a flat list of values)"
            ));
        }
    };
    let spec = FeatureSpec {
        name,
        dtype,
        layout,
        default,
        image: None,
    };
    spec.validate().map_err(|e| match e {
        SchemaError::Feature { reason, .. } => reason,
        other => other.to_string(),
    })?;
    Ok(spec)
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

    /// The index (column position) of the feature named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.features.iter().position(|f| f.name == name)
    }

    /// Keeps, besides the label, only the features `names` lists (`keep`),
    /// or all but them (`!keep`). A name that is not a feature is an error,
    /// and the schema is left as it was.
    ///
    /// ```
    /// let mut schema = tfpipe::Schema::from_feature_texts(&["a:int64", "b:float32", "y:int64"])?;
    /// schema.label = Some("y".into());
    /// schema.select(&["b".to_string()], false)?;
    /// assert_eq!(schema.features.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["a", "y"]);
    /// assert!(schema.select(&["nope".to_string()], true).is_err());
    /// # Ok::<(), tfpipe::example::SchemaError>(())
    /// ```
    pub fn select(&mut self, names: &[String], keep: bool) -> Result<(), SchemaError> {
        if let Some(name) = names.iter().find(|n| self.feature(n).is_none()) {
            return Err(SchemaError::UnknownFeature {
                name: name.clone(),
                features: self.features.iter().map(|f| f.name.clone()).collect(),
            });
        }
        let label = self.label.clone();
        self.features
            .retain(|f| Some(&f.name) == label.as_ref() || names.contains(&f.name) == keep);
        Ok(())
    }

    /// This schema with `label` as its label; the feature must exist.
    pub fn with_label(mut self, label: impl Into<String>) -> Result<Schema, SchemaError> {
        self.label = Some(label.into());
        self.validate()?;
        Ok(self)
    }

    /// Checks every feature, duplicate names, and that the label names a feature.
    pub fn validate(&self) -> Result<(), SchemaError> {
        for (i, spec) in self.features.iter().enumerate() {
            spec.validate()?;
            if self.features[..i].iter().any(|f| f.name == spec.name) {
                return Err(SchemaError::Duplicate {
                    name: spec.name.clone(),
                });
            }
        }
        if let Some(label) = &self.label
            && self.feature(label).is_none()
        {
            let names: Vec<&str> = self.features.iter().map(|f| f.name.as_str()).collect();
            return Err(SchemaError::UnknownLabel {
                label: label.clone(),
                nearest: nearest(label, names.iter().copied()).map(str::to_string),
                features: names.into_iter().map(str::to_string).collect(),
            });
        }
        Ok(())
    }

    /// A schema from `--feature` texts (see the module doc), validated.
    pub fn from_feature_texts<S: AsRef<str>>(texts: &[S]) -> Result<Schema, SchemaError> {
        let schema = Schema {
            features: texts
                .iter()
                .map(|t| t.as_ref().parse())
                .collect::<Result<_, _>>()?,
            label: None,
        };
        schema.validate()?;
        Ok(schema)
    }

    /// The schema as a schema-file JSON object (without metadata).
    pub fn to_json_value(&self) -> Json {
        Json::Object(self.to_json_map())
    }

    fn to_json_map(&self) -> Map<String, Json> {
        let mut obj = Map::new();
        obj.insert("format".into(), Json::from(SCHEMA_FORMAT));
        obj.insert(
            "features".into(),
            Json::Array(self.features.iter().map(feature_to_json).collect()),
        );
        if let Some(label) = &self.label {
            obj.insert("label".into(), Json::from(label.clone()));
        }
        obj
    }

    /// A schema from a schema-file JSON value, plus its metadata (the other top-level keys).
    pub fn from_json_value_with_metadata(
        value: &Json,
    ) -> Result<(Schema, Map<String, Json>), SchemaError> {
        let invalid = |reason: String| SchemaError::Json { reason };
        let Json::Object(obj) = value else {
            return Err(invalid(format!(
                "expected a JSON object with a \"features\" list, found {}",
                json_kind(value)
            )));
        };
        match obj.get("format") {
            None => {}
            Some(Json::String(f)) if f == SCHEMA_FORMAT => {}
            Some(other) => {
                return Err(invalid(format!(
                    "unsupported \"format\" {other} (expected \"{SCHEMA_FORMAT}\")"
                )));
            }
        }
        let Some(Json::Array(features)) = obj.get("features") else {
            return Err(invalid(
                "missing \"features\" list (e.g. \"features\": [\"label:int64\"])".into(),
            ));
        };
        let features = features
            .iter()
            .enumerate()
            .map(|(i, f)| {
                feature_from_json(f).map_err(|reason| {
                    let name = f.get("name").and_then(Json::as_str).unwrap_or("");
                    invalid(format!("features[{i}] {name:?}: {reason}"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let label = match obj.get("label") {
            None | Some(Json::Null) => None,
            Some(Json::String(l)) => Some(l.clone()),
            Some(other) => {
                return Err(invalid(format!(
                    "invalid \"label\" {other} (expected a feature name)"
                )));
            }
        };
        let schema = Schema { features, label };
        schema.validate()?;
        let metadata = obj
            .iter()
            .filter(|(k, _)| !RESERVED_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok((schema, metadata))
    }

    /// A schema from a schema-file JSON value (metadata keys are ignored).
    pub fn from_json_value(value: &Json) -> Result<Schema, SchemaError> {
        Self::from_json_value_with_metadata(value).map(|(schema, _)| schema)
    }

    /// A schema from schema-file JSON text (metadata keys are ignored).
    pub fn from_json_str(text: &str) -> Result<Schema, SchemaError> {
        let mut value: Json = serde_json::from_str(text).map_err(SchemaError::Syntax)?;
        exact_float_defaults(text, &mut value);
        Self::from_json_value(&value)
    }

    /// Reads a schema file (`--schema FILE`), ignoring its metadata.
    pub fn load(path: impl AsRef<Path>) -> Result<Schema, SchemaError> {
        Self::load_with_metadata(path).map(|(schema, _)| schema)
    }

    /// Reads a schema file and returns its metadata (the top-level keys other than
    /// `format`, `features` and `label`) too.
    pub fn load_with_metadata(
        path: impl AsRef<Path>,
    ) -> Result<(Schema, Map<String, Json>), SchemaError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| SchemaError::Io {
            path: path.to_path_buf(),
            action: "read",
            source,
        })?;
        let mut value: Json =
            serde_json::from_str(&text).map_err(|e| SchemaError::Syntax(e).in_file(path))?;
        exact_float_defaults(&text, &mut value);
        Self::from_json_value_with_metadata(&value).map_err(|e| e.in_file(path))
    }

    /// Reads a schema file and what its metadata records, typed
    /// ([`SchemaMetadata`]).
    pub fn load_with_facts(
        path: impl AsRef<Path>,
    ) -> Result<(Schema, SchemaMetadata), SchemaError> {
        let path = path.as_ref();
        let (schema, metadata) = Self::load_with_metadata(path)?;
        let facts = SchemaMetadata::from_json(&metadata)
            .map_err(|reason| SchemaError::Metadata { reason }.in_file(path))?;
        Ok((schema, facts))
    }

    /// Writes this schema as a schema file, with `metadata` as extra top-level keys
    /// (which must not be `format`, `features` or `label`). The file is written to a
    /// temporary file in the same directory and renamed, so it is never half-written.
    pub fn save(
        &self,
        path: impl AsRef<Path>,
        metadata: &Map<String, Json>,
    ) -> Result<(), SchemaError> {
        let path = path.as_ref();
        let text = self.to_file_text(metadata)?;
        crate::atomic_file::write(path, text.as_bytes()).map_err(|e| SchemaError::Io {
            path: path.to_path_buf(),
            action: e.action,
            source: e.source,
        })?;
        Ok(())
    }

    /// The text of this schema's schema file, with `metadata` as extra
    /// top-level keys (see [`Schema::save`]).
    pub(crate) fn to_file_text(&self, metadata: &Map<String, Json>) -> Result<String, SchemaError> {
        self.validate()?;
        let mut obj = self.to_json_map();
        for (key, value) in metadata {
            if RESERVED_KEYS.contains(&key.as_str()) {
                return Err(SchemaError::ReservedKey { key: key.clone() });
            }
            obj.insert(key.clone(), value.clone());
        }
        let mut text =
            serde_json::to_string_pretty(&Json::Object(obj)).map_err(SchemaError::Syntax)?;
        text.push('\n');
        Ok(text)
    }
}

/// Replaces each number in a float32 feature's `default` by its text as written, so
/// that it is parsed straight to `f32` (one rounding) instead of through `f64`.
/// `value` is `text` parsed; anything unexpected is left alone for the
/// validation to report.
fn exact_float_defaults(text: &str, value: &mut Json) {
    use serde_json::value::RawValue;
    #[derive(Deserialize)]
    struct File<'a> {
        #[serde(borrow)]
        features: Option<Vec<&'a RawValue>>,
    }
    #[derive(Deserialize)]
    struct Feature<'a> {
        #[serde(borrow)]
        default: Option<Vec<&'a RawValue>>,
    }
    let Ok(File {
        features: Some(raw_features),
    }) = serde_json::from_str::<File<'_>>(text)
    else {
        return;
    };
    let Some(Json::Array(features)) = value.get_mut("features") else {
        return;
    };
    for (feature, raw) in features.iter_mut().zip(raw_features) {
        if feature.get("dtype").and_then(Json::as_str) != Some("float32") {
            continue;
        }
        let Ok(Feature {
            default: Some(raw_default),
        }) = serde_json::from_str::<Feature<'_>>(raw.get())
        else {
            continue;
        };
        let Some(Json::Array(default)) = feature.get_mut("default") else {
            continue;
        };
        for (v, raw) in default.iter_mut().zip(raw_default) {
            if v.is_number() {
                *v = Json::String(raw.get().trim().to_string());
            }
        }
    }
}

/// Edit distance between `a` and `b` by chars: insertions, deletions,
/// substitutions and transpositions of neighbours each count 1 (optimal string
/// alignment), so `lable` is 1 from `label`.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let width = b.len() + 1;
    // Three rows of the (a.len()+1) x (b.len()+1) table: i-2, i-1 and i.
    let mut rows = vec![vec![0usize; width]; 3];
    rows[0] = (0..width).collect();
    for i in 1..=a.len() {
        let (cur, prev, prev2) = (i % 3, (i - 1) % 3, (i + 1) % 3);
        rows[cur][0] = i;
        for j in 1..width {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[prev][j - 1] + cost)
                .min(rows[prev][j] + 1)
                .min(rows[cur][j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[prev2][j - 2] + 1);
            }
            rows[cur][j] = d;
        }
    }
    rows[a.len() % 3][b.len()]
}

/// The candidate nearest to `name` by edit distance, if it is a plausible typo:
/// at most a third of `name`'s length away (at least 1), never `name` itself.
/// Ties go to the first candidate.
pub fn nearest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    let mut best: Option<(usize, &'a str)> = None;
    for candidate in candidates {
        if candidate == name {
            continue;
        }
        let d = edit_distance(name, candidate);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, candidate));
        }
    }
    best.map(|(_, c)| c)
}

/// `a string`, `an object`, ... for messages about JSON values.
pub(crate) fn json_kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> FeatureSpec {
        match text.parse() {
            Ok(spec) => spec,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    #[test]
    fn text_forms() {
        let s = spec("image_raw:uint8:28x28");
        assert_eq!(
            (s.dtype, s.layout.clone()),
            (DType::Uint8, Layout::Fixed(vec![28, 28]))
        );
        assert_eq!(spec("label:int64").layout, Layout::Fixed(vec![]));
        assert_eq!(spec("x:float32:784").layout, Layout::Fixed(vec![784]));
        assert_eq!(spec("tags:bytes:var").layout, Layout::Var);
        assert_eq!(spec("f:float32:seq").layout, Layout::FixedSequence(vec![]));
        assert_eq!(
            spec("f:float32:seq:2x3").layout,
            Layout::FixedSequence(vec![2, 3])
        );
        assert_eq!(spec("t:int64:seq:var").layout, Layout::VarSequence);
        assert_eq!(spec("l:int64=-1").default, Some(Value::Int64(vec![-1])));
        assert_eq!(
            spec("e:float32:3=0,NaN,-inf").default.map(|d| d.len()),
            Some(3)
        );
        assert_eq!(spec("l:bytes=").default, Some(Value::Bytes(vec![vec![]])));
        assert_eq!(
            spec(r"l:bytes:2=a\,b\\,c\x80").default,
            Some(Value::Bytes(vec![b"a,b\\".to_vec(), b"c\x80".to_vec()]))
        );
        assert_eq!(spec("a=b:int64").name, "a=b");
        assert_eq!(spec("\"a:b\":int64").name, "a:b");
        assert_eq!(spec(":int64").name, "");
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "image_raw:uint8:28x28",
            "label:int64",
            "label:int64=-1",
            "emb:float32:3=0,NaN,-inf",
            "score:float32=-0",
            "tags:bytes:var",
            "frames:float32:seq:2",
            "f:int64:seq",
            "tokens:int64:seq:var",
            "lang:bytes=und",
            r"odd:bytes:3=a\,b,\\,\x80\x00",
            "label:bytes=",
            "\"a:b\":int64",
            "img:uint8:4=7",
            "empty:float32:0",
            "e:int64:2x0x3=1",
            "pairs:float32:var:2",
            "cube:int64:var:2x2",
            "v:int64:ragged",
            "v:bytes:ragged:row_lengths(lens):row_splits(s):uniform_row_length(2)",
            "pcm:raw_int16:16000",
            "m:raw_float64:2x2",
            "u:raw_uint16:seq:3",
            "i:raw_int32:1",
            "f:raw_float32:4",
            "sp:float32:sparse(i,j):100x0",
        ] {
            let s = spec(text);
            assert_eq!(s.to_string(), text);
            // Debug, since NaN != NaN.
            assert_eq!(format!("{:?}", spec(&s.to_string())), format!("{s:?}"));
        }
    }

    #[test]
    fn text_errors_quote_the_text() {
        for (text, needle) in [
            ("label", "missing `:DTYPE`"),
            ("label:int32", "unknown dtype"),
            ("x:float32:seq:0x3", "zero dimension"),
            ("x:float32:var:2x0", "zero dimension"),
            ("x:raw_int16:var", "raw_int16 needs a fixed shape"),
            ("x:raw_float32:4=0", "take no default"),
            ("x:int64:ragged:uniform_row_length(0)", "at least 1"),
            ("x:int64:ragged:row_lengths()", "invalid partition"),
            ("x:int64:ragged:rows(l)", "invalid partition"),
            ("x:int64:ragged:row_splits(x)", "own values"),
            ("x:int64:ragged=1", "only allowed on a fixed-length"),
            ("x:int64:sparse(i,j):4", "one index key per dimension"),
            ("x:int64:sparse(i:4", "invalid sparse shape"),
            ("x:float32:2147483648=0", "needs 8 GiB per record"),
            ("x:float32:65536x65536", "more than 2147483648 elements"),
            ("x:float32:99999999999x99999999999", "more than"),
            ("x:float32:3y", "invalid shape"),
            ("x:uint8:var", "uint8 needs a fixed shape"),
            ("x:uint8:seq:var", "uint8 needs a fixed shape"),
            ("x:int64:var=1", "only allowed on a fixed-length"),
            ("x:int64:3=1,2", "expected 1 (broadcast) or 3"),
            ("x:int64=a", "invalid int64 default"),
            ("x:uint8=256", "outside 0..=255"),
            ("x:bytes=\\q", "invalid escape"),
            ("\"x:int64", "quoted NAME"),
        ] {
            let err = text.parse::<FeatureSpec>().unwrap_err().to_string();
            assert!(err.contains(&format!("{text:?}")), "{err}");
            assert!(err.contains(needle), "{text}: {err}");
            assert!(err.contains("expected NAME:DTYPE"), "{err}");
        }
    }

    #[test]
    fn schema_validation() {
        let dup = Schema::from_feature_texts(&["a:int64", "a:float32"]).unwrap_err();
        assert!(dup.to_string().contains("listed twice"), "{dup}");
        let schema = Schema::from_feature_texts(&["a:int64"]).unwrap();
        let err = schema.clone().with_label("b").unwrap_err();
        assert!(
            err.to_string().contains("label \"b\" names no feature"),
            "{err}"
        );
        assert!(schema.with_label("a").is_ok());
        let wrong_type =
            FeatureSpec::fixed("x", DType::Int64, &[2]).with_default(Value::Float32(vec![1.0]));
        assert!(
            wrong_type
                .validate()
                .unwrap_err()
                .to_string()
                .contains("default holds float32")
        );
    }

    fn full_schema() -> Schema {
        Schema::from_feature_texts(&[
            "image_raw:uint8:28x28=0",
            "label:int64=-1",
            "score:float32=NaN",
            "emb:float32:3=0,-0,inf",
            "lang:bytes=und",
            "blob:bytes:2=\\x80\\xff,",
            "tags:bytes:var",
            "frames:float32:seq:2",
            "tokens:int64:seq:var",
            "pairs:float32:var:2",
            "v:int64:ragged:row_splits(s):row_lengths(l):uniform_row_length(3)",
            "pcm:raw_int16:2x0",
            "sp:int64:sparse(i):7",
        ])
        .unwrap()
        .with_label("label")
        .unwrap()
    }

    #[test]
    fn new_layouts_in_json() {
        let value: Json = serde_json::from_str(
            r#"{"features": [
                {"name": "pairs", "dtype": "float32", "layout": "var", "shape": [2]},
                {"name": "plain", "dtype": "float32", "layout": "var", "shape": []},
                {"name": "v", "dtype": "int64", "layout": "ragged",
                 "partitions": [{"row_lengths": "l"}, {"uniform_row_length": 2}]},
                {"name": "sp", "dtype": "bytes", "layout": "sparse", "index_keys": ["i", "j"], "size": [3, 4]},
                {"name": "pcm", "dtype": "raw_int16", "shape": [0]}
            ]}"#,
        )
        .unwrap();
        let schema = Schema::from_json_value(&value).unwrap();
        let texts: Vec<String> = schema.features.iter().map(|f| f.to_string()).collect();
        assert_eq!(
            texts,
            [
                "pairs:float32:var:2",
                "plain:float32:var",
                "v:int64:ragged:row_lengths(l):uniform_row_length(2)",
                "sp:bytes:sparse(i,j):3x4",
                "pcm:raw_int16:0"
            ]
        );
        for (json, needle) in [
            (
                r#"{"name": "v", "dtype": "int64", "layout": "ragged", "partitions": [{"row_lengths": 3}]}"#,
                "invalid partition",
            ),
            (
                r#"{"name": "v", "dtype": "int64", "layout": "ragged", "shape": [2]}"#,
                "not allowed",
            ),
            (
                r#"{"name": "v", "dtype": "int64", "layout": "sparse", "size": [2]}"#,
                "index_keys",
            ),
            (
                r#"{"name": "v", "dtype": "int64", "layout": "var", "partitions": []}"#,
                "not allowed",
            ),
        ] {
            let err = Schema::from_json_str(&format!(r#"{{"features": [{json}]}}"#))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }

    /// Issue 12 item 13: sizes are checked before anything is allocated, and the
    /// error says how much memory the setting needs.
    #[test]
    fn absurd_sizes_say_how_much_memory() {
        let err = "x:float32:2147483648=0"
            .parse::<FeatureSpec>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("needs 8 GiB per record (4 bytes per float32 value)"),
            "{err}"
        );
        let err = Schema::from_json_str(
            r#"{"features": [{"name": "x", "dtype": "int64", "shape": [1073741824], "default": [0]}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("needs 8 GiB per record"), "{err}");
        assert!(err.contains("more than the 2 GiB"), "{err}");
        // The largest allowed: 2 GiB of uint8.
        let big: FeatureSpec = "x:uint8:2147483648".parse().unwrap();
        assert_eq!(big.bytes_per_record(), Some(1 << 31));
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12), "12 bytes");
    }

    #[test]
    fn nearest_names() {
        for (a, b, d) in [
            ("", "ab", 2),
            ("abc", "abc", 0),
            ("lable", "label", 1),
            ("ca", "abc", 3),
            ("kitten", "sitting", 3),
            ("ab", "", 2),
        ] {
            assert_eq!(edit_distance(a, b), d, "{a} {b}");
        }
        let names = ["image_raw", "label", "id"];
        assert_eq!(nearest("image_rw", names), Some("image_raw"));
        assert_eq!(nearest("lable", names), Some("label"));
        assert_eq!(nearest("ix", names), Some("id"));
        assert_eq!(nearest("weights", names), None);
        assert_eq!(nearest("label", names), None);
        let err = Schema::from_feature_texts(&["label:int64"])
            .unwrap()
            .with_label("lable")
            .unwrap_err();
        assert!(err.to_string().contains("did you mean \"label\"?"), "{err}");
    }

    #[test]
    fn json_round_trips() {
        let schema = full_schema();
        let value = schema.to_json_value();
        let back = Schema::from_json_value(&value).unwrap();
        // NaN != NaN: compare through the text form.
        assert_eq!(format!("{back:?}"), format!("{schema:?}"));
        let blob = &value["features"][5]["default"][0];
        assert_eq!(blob["base64"], "gP8=");
    }

    #[test]
    fn documented_example_file_loads() {
        let doc = include_str!("spec.rs");
        let start = doc.find("//! ```json\n").unwrap() + 12;
        let end = start + doc[start..].find("//! ```").unwrap();
        let json: String = doc[start..end]
            .lines()
            .map(|l| l.trim_start_matches("//!").trim_start())
            .collect::<Vec<_>>()
            .join("\n");
        let (schema, metadata) =
            Schema::from_json_value_with_metadata(&serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(schema.features.len(), 10);
        assert_eq!(schema.label.as_deref(), Some("label"));
        assert_eq!(metadata["num_records"], 60000);
        assert_eq!(schema.features[9], FeatureSpec::var("counts", DType::Int64));
    }

    #[test]
    fn json_errors() {
        for (json, needle) in [
            ("[]", "expected a JSON object"),
            ("{}", "missing \"features\""),
            (
                r#"{"features": [{"name": "a", "dtype": "int64", "shap": [1]}]}"#,
                "unknown key \"shap\"",
            ),
            (
                r#"{"features": [{"name": "a", "dtype": "int8"}]}"#,
                "unknown dtype",
            ),
            (
                r#"{"features": [{"name": "a", "dtype": "int64", "layout": "var_sequence", "shape": [2]}]}"#,
                "not allowed",
            ),
            (
                r#"{"features": [{"name": "a", "dtype": "int64", "shape": [2], "default": [1, 2, 3]}]}"#,
                "default has 3 values",
            ),
            (
                r#"{"features": ["a:int64"], "label": "b"}"#,
                "names no feature",
            ),
            (
                r#"{"format": "x", "features": []}"#,
                "unsupported \"format\"",
            ),
            ("{", "EOF"),
        ] {
            let err = crate::error::display_chain(&Schema::from_json_str(json).unwrap_err());
            assert!(err.contains(needle), "{json}: {err}");
        }
    }

    #[test]
    fn save_and_load_with_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("schema.json");
        let mut metadata = Map::new();
        metadata.insert("num_records".into(), Json::from(42));
        let schema = Schema::from_feature_texts(&["image_raw:uint8:28x28", "label:int64"])
            .unwrap()
            .with_label("label")
            .unwrap();
        schema.save(&path, &metadata).unwrap();
        let (back, meta) = Schema::load_with_metadata(&path).unwrap();
        assert_eq!(back, schema);
        assert_eq!(meta, metadata);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
        let mut reserved = Map::new();
        reserved.insert("label".into(), Json::from(1));
        assert!(schema.save(&path, &reserved).is_err());
        let err = Schema::load(dir.path().join("missing.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.json"), "{err}");
    }

    #[test]
    fn image_specs_parse_print_and_round_trip_through_schema_files() {
        let spec = spec("image/encoded:image:8x6x3:center,float32,nchw");
        assert_eq!(spec.dtype, DType::Float32);
        assert_eq!(spec.layout, Layout::Fixed(vec![3, 8, 6]));
        assert_eq!(
            spec.to_string(),
            "image/encoded:image:8x6x3:center,float32,nchw"
        );
        let schema = Schema {
            features: vec![spec, "label:int64".parse().unwrap()],
            label: Some("label".into()),
        };
        let json = schema.to_json_value();
        assert_eq!(
            json["features"][0],
            serde_json::json!({"name": "image/encoded", "dtype": "image", "shape": [8, 6, 3], "image": "center,float32,nchw"})
        );
        assert_eq!(Schema::from_json_value(&json).unwrap(), schema);
        let plain: Json = serde_json::json!({"features": [{"name": "img", "dtype": "image", "shape": [28, 28, 1]}]});
        let plain = Schema::from_json_value(&plain).unwrap();
        assert_eq!(plain.features[0].to_string(), "img:image:28x28x1");
    }

    #[test]
    fn image_spec_mistakes_are_explained() {
        let err = |text: &str| text.parse::<FeatureSpec>().unwrap_err().to_string();
        assert!(
            err("img:image").contains("needs its size"),
            "{}",
            err("img:image")
        );
        assert!(err("img:image:28x28x1=0").contains("takes no default"));
        assert!(err("img:image:28x28x1:bicubic").contains("unknown image option"));
        let random = crate::image::ImageOptions {
            crop: crate::image::Crop::Random(Default::default()),
            dct_scale: true, // the spec text's default with random_crop
            ..crate::image::ImageOptions::new(4, 4, 3)
        };
        // Random options are seeded by the parse stage, so a spec takes them.
        let spec = FeatureSpec::image("img", random);
        spec.validate().unwrap();
        assert_eq!(spec.to_string(), "img:image:4x4x3:random_crop");
        assert_eq!(spec.to_string().parse::<FeatureSpec>().unwrap(), spec);
        let json =
            serde_json::json!({"features": [{"name": "img", "dtype": "image", "shape": [28, 28]}]});
        assert!(
            Schema::from_json_value(&json)
                .unwrap_err()
                .to_string()
                .contains("[H, W, C]")
        );
    }
}
