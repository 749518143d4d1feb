//! Feature specs: what a record should contain and how it becomes columns.
//!
//! The semantics are TensorFlow's (`FixedLenFeature`, `VarLenFeature`,
//! `FixedLenSequenceFeature`, and a var-length feature per sequence step);
//! the decoder that applies them lives in `decode.rs`.
//!
//! # Text form (`--feature`)
//!
//! ```text
//! SPEC    = NAME ":" DTYPE [":" SHAPE] ["=" DEFAULT]
//! DTYPE   = int64 | float32 | bytes | uint8
//! SHAPE   = DIMS                  fixed length: `784`, `28x28` (omitted: a scalar)
//!         | var                   var-length
//!         | seq [":" DIMS]        a SequenceExample feature list, each step fixed (omitted: scalar)
//!         | seq:var               a SequenceExample feature list, each step var-length
//! DIMS    = N ("x" N)*            every N >= 1
//! DEFAULT = VALUE ("," VALUE)*    fixed-length features only: one value (broadcast) or product(DIMS)
//! ```
//!
//! Examples: `image_raw:uint8:28x28`, `label:int64`, `label:int64=-1`,
//! `emb:float32:3=0`, `tags:bytes:var`, `frames:float32:seq:2`, `tokens:int64:seq:var`,
//! `lang:bytes=und`.
//!
//! * `uint8` reads a `bytes_list` holding exactly one value of `product(DIMS)` bytes and
//!   decodes it raw (TensorFlow's `decode_raw(..., tf.uint8)`); only fixed shapes
//!   (`DIMS` or `seq[:DIMS]`). Its default values are integers 0..=255.
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
//! `"var"`, `"fixed_sequence"` or `"var_sequence"`; `shape`: the dims for the two fixed
//! layouts (default `[]`, a scalar); `default`: only for `"fixed"`, a flat list of one
//! value (broadcast) or `product(shape)` values. int64 values are JSON integers or
//! decimal strings; float32 values are numbers or the strings `"NaN"`, `"Infinity"`,
//! `"-Infinity"`; bytes values are UTF-8 strings or `{"base64": "..."}` (written for
//! values that are not UTF-8). Unknown feature keys are an error (they are typos).
//!
//! # Invariants
//!
//! [`Schema::validate`] (run by the parsers and by `BatchParser::new`) rejects duplicate
//! names, zero-sized dims, `uint8` with a var-length layout, defaults on anything but a
//! fixed layout, defaults of the wrong type or count, and a `label` naming no feature.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// The most elements a fixed shape may have (2^31), so sizes never overflow.
pub const MAX_SHAPE_SIZE: usize = 1 << 31;

/// The `format` value of a schema file.
pub const SCHEMA_FORMAT: &str = "tfpipe-schema/1";

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

impl DType {
    /// The name used in the text form and schema files (`int64`, `float32`, `bytes`, `uint8`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Int64 => "int64",
            DType::Float32 => "float32",
            DType::Bytes => "bytes",
            DType::Uint8 => "uint8",
        }
    }

    /// The `Feature` list kind a record must hold for this dtype.
    pub fn kind_name(self) -> &'static str {
        match self {
            DType::Int64 => "int64_list",
            DType::Float32 => "float_list",
            DType::Bytes | DType::Uint8 => "bytes_list",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "int64" => Ok(DType::Int64),
            "float32" => Ok(DType::Float32),
            "bytes" => Ok(DType::Bytes),
            "uint8" => Ok(DType::Uint8),
            _ => Err(format!(
                "unknown dtype {text:?} (expected int64, float32, bytes or uint8)"
            )),
        }
    }
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

    /// The dense shape of each record (`Fixed`) or step (`FixedSequence`).
    pub fn fixed_shape(&self) -> Option<&[usize]> {
        match self {
            Layout::Fixed(shape) | Layout::FixedSequence(shape) => Some(shape),
            Layout::Var | Layout::VarSequence => None,
        }
    }

    /// The name used in schema files (`fixed`, `var`, `fixed_sequence`, `var_sequence`).
    pub fn name(&self) -> &'static str {
        match self {
            Layout::Fixed(_) => "fixed",
            Layout::Var => "var",
            Layout::FixedSequence(_) => "fixed_sequence",
            Layout::VarSequence => "var_sequence",
        }
    }
}

/// A default value (flattened), used when a fixed-length feature is missing.
///
/// A `uint8` feature's default is `Int64` with every value in `0..=255`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int64(Vec<i64>),
    Float32(Vec<f32>),
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
}

impl FeatureSpec {
    /// A fixed-length feature of `shape` (`&[]` for a scalar), without default.
    pub fn fixed(name: impl Into<String>, dtype: DType, shape: &[usize]) -> FeatureSpec {
        FeatureSpec {
            name: name.into(),
            dtype,
            layout: Layout::Fixed(shape.to_vec()),
            default: None,
        }
    }

    /// A var-length feature.
    pub fn var(name: impl Into<String>, dtype: DType) -> FeatureSpec {
        FeatureSpec {
            name: name.into(),
            dtype,
            layout: Layout::Var,
            default: None,
        }
    }

    /// This spec with `default` as its default value.
    pub fn with_default(mut self, default: Value) -> FeatureSpec {
        self.default = Some(default);
        self
    }

    /// Values per record (`Fixed`) or per step (`FixedSequence`): `product(shape)`.
    pub fn fixed_len(&self) -> Option<usize> {
        self.layout.fixed_shape().map(|s| s.iter().product())
    }

    /// Checks this spec on its own (see the module doc's invariants).
    pub fn validate(&self) -> Result<(), SchemaError> {
        let bad = |reason: String| {
            Err(SchemaError::Invalid(format!(
                "feature {:?} ({self}): {reason}",
                self.name
            )))
        };
        if let Some(shape) = self.layout.fixed_shape() {
            if shape.contains(&0) {
                return bad(format!(
                    "shape {shape:?} has a zero dimension (every dimension must be >= 1)"
                ));
            }
            let size = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            if size.is_none_or(|n| n > MAX_SHAPE_SIZE) {
                return bad(format!(
                    "shape {shape:?} has more than {MAX_SHAPE_SIZE} elements"
                ));
            }
        }
        if self.dtype == DType::Uint8 && self.layout.fixed_shape().is_none() {
            return bad(
                "uint8 needs a fixed shape (e.g. `:784`, `:28x28` or `:seq:4`), not a var-length one"
                    .into(),
            );
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

fn text_error(spec: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError::Text {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

fn parse_dims(text: &str) -> Result<Vec<usize>, String> {
    text.split('x')
        .map(|d| match d.parse::<usize>() {
            Ok(0) => Err(format!(
                "shape {text:?} has a zero dimension (every dimension must be >= 1)"
            )),
            Ok(n) => Ok(n),
            Err(_) => Err(format!(
                "invalid shape {text:?} (expected N or NxMx..., `var`, `seq`, `seq:N...` or `seq:var`)"
            )),
        })
        .collect()
}

fn parse_layout(text: Option<&str>) -> Result<Layout, String> {
    let Some(text) = text else {
        return Ok(Layout::Fixed(Vec::new()));
    };
    match text {
        "var" => Ok(Layout::Var),
        "seq" => Ok(Layout::FixedSequence(Vec::new())),
        "seq:var" => Ok(Layout::VarSequence),
        _ => match text.strip_prefix("seq:") {
            Some(dims) => Ok(Layout::FixedSequence(parse_dims(dims)?)),
            None => Ok(Layout::Fixed(parse_dims(text)?)),
        },
    }
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
        let dtype: DType = dtype.parse().map_err(|e: String| text_error(text, e))?;
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
        };
        spec.validate().map_err(|e| match e {
            SchemaError::Invalid(reason) => text_error(text, reason),
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
    Text { spec: String, reason: String },
    /// A schema file that cannot be read or parsed.
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    /// A schema that is inconsistent (duplicate names, bad default size, ...).
    #[error("invalid schema: {0}")]
    Invalid(String),
    /// Schema JSON (not from a file) that does not parse.
    #[error("invalid schema JSON: {0}")]
    Json(String),
}

const RESERVED_KEYS: [&str; 3] = ["format", "features", "label"];
const FEATURE_KEYS: [&str; 5] = ["name", "dtype", "layout", "shape", "default"];

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
    obj.insert("dtype".into(), Json::from(spec.dtype.name()));
    if !matches!(spec.layout, Layout::Fixed(_)) {
        obj.insert("layout".into(), Json::from(spec.layout.name()));
    }
    if let Some(shape) = spec.layout.fixed_shape()
        && !shape.is_empty()
    {
        obj.insert("shape".into(), Json::from(shape.to_vec()));
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
            "unknown key {key:?} (valid: name, dtype, layout, shape, default)"
        ));
    }
    let name = obj
        .get("name")
        .and_then(Json::as_str)
        .ok_or("missing or non-string \"name\"")?
        .to_string();
    let dtype: DType = obj
        .get("dtype")
        .and_then(Json::as_str)
        .ok_or("missing or non-string \"dtype\" (int64, float32, bytes or uint8)")?
        .parse()?;
    let shape = match obj.get("shape") {
        None => None,
        Some(Json::Array(dims)) => Some(
            dims.iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| {
                    format!(
                        "invalid \"shape\" {} (expected a list of positive integers)",
                        Json::Array(dims.clone())
                    )
                })?,
        ),
        Some(other) => {
            return Err(format!(
                "invalid \"shape\" {other} (expected a list of positive integers)"
            ));
        }
    };
    let layout = match obj.get("layout").map(|l| l.as_str()) {
        None | Some(Some("fixed")) => Layout::Fixed(shape.clone().unwrap_or_default()),
        Some(Some("fixed_sequence")) => Layout::FixedSequence(shape.clone().unwrap_or_default()),
        Some(Some(l @ ("var" | "var_sequence"))) => {
            if shape.is_some() {
                return Err(format!("\"shape\" is not allowed with layout {l:?}"));
            }
            if l == "var" {
                Layout::Var
            } else {
                Layout::VarSequence
            }
        }
        Some(_) => {
            return Err(format!(
                "invalid \"layout\" {} (expected \"fixed\", \"var\", \"fixed_sequence\" or \"var_sequence\")",
                obj["layout"]
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
    };
    spec.validate().map_err(|e| match e {
        SchemaError::Invalid(reason) => reason,
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
                return Err(SchemaError::Invalid(format!(
                    "feature {:?} is listed twice (names must be unique)",
                    spec.name
                )));
            }
        }
        if let Some(label) = &self.label
            && self.feature(label).is_none()
        {
            let names: Vec<&str> = self.features.iter().map(|f| f.name.as_str()).collect();
            return Err(SchemaError::Invalid(format!(
                "label {label:?} names no feature (features: {names:?})"
            )));
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
        let invalid = |reason: String| SchemaError::Json(reason);
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
        let value: Json =
            serde_json::from_str(text).map_err(|e| SchemaError::Json(e.to_string()))?;
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
        let file_error = |reason: String| SchemaError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        let value: Json =
            serde_json::from_str(&text).map_err(|e| file_error(format!("invalid JSON: {e}")))?;
        Self::from_json_value_with_metadata(&value).map_err(|e| match e {
            SchemaError::Json(reason) | SchemaError::Invalid(reason) => file_error(reason),
            other => file_error(other.to_string()),
        })
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
        let file_error = |reason: String| SchemaError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = self.to_file_text(metadata).map_err(|e| match e {
            SchemaError::Json(reason) => file_error(reason),
            other => other,
        })?;
        crate::atomic_file::write(path, text.as_bytes())
            .map_err(|e| file_error(format!("cannot {}: {}", e.action, e.source)))?;
        Ok(())
    }

    /// The text of this schema's schema file, with `metadata` as extra
    /// top-level keys (see [`Schema::save`]).
    pub(crate) fn to_file_text(&self, metadata: &Map<String, Json>) -> Result<String, SchemaError> {
        self.validate()?;
        let mut obj = self.to_json_map();
        for (key, value) in metadata {
            if RESERVED_KEYS.contains(&key.as_str()) {
                return Err(SchemaError::Invalid(format!(
                    "metadata key {key:?} is reserved (reserved: format, features, label)"
                )));
            }
            obj.insert(key.clone(), value.clone());
        }
        let mut text = serde_json::to_string_pretty(&Json::Object(obj))
            .map_err(|e| SchemaError::Json(e.to_string()))?;
        text.push('\n');
        Ok(text)
    }
}

fn json_kind(value: &Json) -> &'static str {
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
            ("x:float32:0x3", "zero dimension"),
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
        ])
        .unwrap()
        .with_label("label")
        .unwrap()
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
                r#"{"features": [{"name": "a", "dtype": "int64", "layout": "var", "shape": [2]}]}"#,
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
            let err = Schema::from_json_str(json).unwrap_err().to_string();
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
}
