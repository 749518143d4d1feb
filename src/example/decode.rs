//! Schema-driven decoding of serialized `Example` / `SequenceExample` records
//! straight into columnar batch buffers.
//!
//! [`BatchParser`] walks the protobuf wire format by hand (varints and
//! length-delimited fields, no prost structs) and appends each value to its
//! column as it meets it. Features the schema does not name are skipped without
//! being decoded; names are matched against the schema by their key bytes, so
//! nothing is allocated per feature or per record once a batch's buffers have
//! grown to size ([`BatchParser::parse_into`] reuses them).
//!
//! # Accepted encodings
//!
//! Everything a conforming protobuf parser accepts: packed and unpacked repeated
//! `int64`/`float`, map entries with the value before the key, unknown fields of any
//! wire type (groups included), duplicate map keys (the last entry wins), and
//! messages split across several occurrences of a field, which protobuf merges:
//! two `features` fields of an `Example` are one map; two values in one map entry
//! are one `Feature`; within a `Feature`, the `kind` oneof follows protobuf's rules
//! (a repeated list of the same kind is appended to, a different kind replaces it).
//! Key bytes are compared as they are, without checking that they are UTF-8.
//!
//! # Semantics (TensorFlow's `parse_example` / `parse_single_sequence_example`)
//!
//! * Fixed-length: a missing key, or a `Feature` with no list set, takes the default
//!   (an error naming the feature and record if there is none). A present list must
//!   hold exactly `product(shape)` values; an empty one is an error even with a
//!   default. `uint8` needs a `bytes_list` of exactly one value of
//!   `product(shape)` bytes, copied raw.
//! * Var-length: a missing key, a kind-less `Feature` or an empty list give the row
//!   no values.
//! * `var:DIMS` (`FixedLenSequenceFeature` in an `Example`): like var-length, but the
//!   count must be a multiple of `product(DIMS)`; the column counts elements.
//! * Ragged: the values as var-length, then each partition checked against the rows
//!   inside it (see `spec.rs`); partition keys are read from the same record.
//! * Raw dtypes (`uint8`, `raw_*`): one bytes value of exactly `product(shape)` elements.
//! * A missing fixed-length feature without default is an error that suggests the
//!   record's (or else the schema's) nearest key; a default whose values cannot be
//!   allocated is an error giving the memory per record and per batch.
//! * A list of the wrong kind is an error naming the expected and the found kind.
//! * Sequences (schemas with a sequence feature parse `SequenceExample`s): the other
//!   features come from `context`, the sequence ones from `feature_lists`; a missing
//!   feature list is zero steps (TensorFlow's `allow_missing=True`). Each step of a
//!   fixed sequence must hold exactly `product(shape)` values; steps of a var
//!   sequence hold any number (a kind-less step holds none).
//! * A schema without sequence features reads field 1 of each record: that is
//!   `Example.features`, and equally `SequenceExample.context`, so such a schema
//!   also reads the context of `SequenceExample`s.
//!
//! Errors carry the record's index within the batch; malformed protobuf is
//! reported with the byte offset inside the record and never panics. After an
//! error the batch handed to `parse_into` holds partial data: parse into it again
//! (which starts from empty) or drop it.

use std::collections::HashMap;

use crate::batch::{Batch, Column, Values};
use crate::example::spec::{DType, FeatureSpec, Layout, Partition, Schema, SchemaError, Value};
use crate::image::{ImageError, ImageOptions, ImageWorker, OutputSlice, element_seed};

/// The reason of a missing feature without default (a suggestion of the
/// nearest key may follow).
const MISSING_NO_KEY: &str = "missing (no such key) and the spec has no default";
/// The reason of a kind-less `Feature` without default.
const MISSING_KINDLESS: &str = "missing (a Feature with no list set) and the spec has no default";

/// Why a record could not be parsed under the schema.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not a valid protobuf message.
    #[error("record {record}: malformed protobuf: {reason}")]
    Malformed {
        /// The record's index in the batch.
        record: usize,
        /// What is wrong.
        reason: String,
    },
    /// A feature violates its spec (missing without default, wrong kind, wrong count).
    #[error("record {record}: feature {feature:?}: {reason}")]
    Feature {
        /// The record's index in the batch.
        record: usize,
        /// The feature.
        feature: String,
        /// What is wrong.
        reason: String,
    },
    /// An image feature's bytes do not decode (corrupt, truncated, too large,
    /// or not an image).
    #[error("record {record}: feature {feature:?}: cannot decode the image")]
    Image {
        /// The record's index in the batch.
        record: usize,
        /// The feature.
        feature: String,
        /// Why.
        #[source]
        source: Box<ImageError>,
    },
}

impl ParseError {
    /// The index of the failing record within the batch.
    pub fn record(&self) -> usize {
        match self {
            ParseError::Malformed { record, .. }
            | ParseError::Feature { record, .. }
            | ParseError::Image { record, .. } => *record,
        }
    }

    /// The feature involved, if the error is about one.
    pub fn feature(&self) -> Option<&str> {
        match self {
            ParseError::Malformed { .. } => None,
            ParseError::Feature { feature, .. } | ParseError::Image { feature, .. } => {
                Some(feature)
            }
        }
    }

    /// Whether the record lacks the feature, which has no default (no
    /// such key, or a `Feature` with no list set): the record is complete
    /// but for it, unlike a malformed or mistyped one.
    ///
    /// ```
    /// use tfpipe::example::{BatchParser, Schema};
    /// let mut parser = BatchParser::new(Schema::from_feature_texts(&["label:int64"])?)?;
    /// let empty_example: &[u8] = &[];
    /// let err = parser.parse(&[empty_example]).unwrap_err();
    /// assert!(err.is_missing() && err.feature() == Some("label"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_missing(&self) -> bool {
        match self {
            ParseError::Malformed { .. } | ParseError::Image { .. } => false,
            ParseError::Feature { reason, .. } => {
                reason.starts_with(MISSING_NO_KEY) || reason == MISSING_KINDLESS
            }
        }
    }

    /// The same error with `offset` added to its record index (for callers that
    /// parse a stream in batches and want the index within the stream).
    pub fn offset_record(mut self, offset: usize) -> ParseError {
        match &mut self {
            ParseError::Malformed { record, .. }
            | ParseError::Feature { record, .. }
            | ParseError::Image { record, .. } => *record += offset,
        }
        self
    }
}

// ---------------------------------------------------------------------------
// Wire format

pub(super) const VARINT: u8 = 0;
const FIXED64: u8 = 1;
pub(super) const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
pub(super) const FIXED32: u8 = 5;

/// The most values reserved per column before parsing (more grow on demand).
const MAX_RESERVE: usize = 1 << 24;

/// Nesting limit for skipped groups (protobuf's default recursion limit).
const MAX_GROUP_DEPTH: u32 = 100;

/// A wire-format problem. `at` is the address of the offending byte until
/// [`WireError::offset_in`] turns it into an offset into the record.
#[derive(Debug, Clone, Copy)]
pub(super) struct WireError {
    pub(super) at: usize,
    pub(super) what: &'static str,
}

impl WireError {
    /// This error with `at` as an offset into `record` (which holds it).
    pub(super) fn offset_in(self, record: &[u8]) -> WireError {
        WireError {
            at: self.at.wrapping_sub(record.as_ptr() as usize),
            what: self.what,
        }
    }

    fn describe(self, record: &[u8]) -> String {
        let e = self.offset_in(record);
        format!("{} at byte {}", e.what, e.at)
    }
}

pub(super) type WireResult<T> = Result<T, WireError>;

/// A cursor over one message: `buf` is what is left of it. Sub-messages are
/// sub-slices of the record, so positions are recovered from addresses.
///
/// Two words, so cursors stay in registers on the hot path.
#[derive(Debug, Clone, Copy)]
pub(super) struct Wire<'a> {
    buf: &'a [u8],
}

impl<'a> Wire<'a> {
    #[inline(always)]
    pub(super) fn new(buf: &'a [u8]) -> Wire<'a> {
        Wire { buf }
    }

    #[inline(always)]
    pub(super) fn done(&self) -> bool {
        self.buf.is_empty()
    }

    #[inline]
    pub(super) fn err(&self, what: &'static str) -> WireError {
        WireError {
            at: self.buf.as_ptr() as usize,
            what,
        }
    }

    /// This cursor's position as (offset, len) within `record`, which holds it.
    #[inline(always)]
    pub(super) fn span_in(&self, record: &[u8]) -> (usize, usize) {
        (
            (self.buf.as_ptr() as usize).wrapping_sub(record.as_ptr() as usize),
            self.buf.len(),
        )
    }

    #[inline(always)]
    pub(super) fn varint(&mut self) -> WireResult<u64> {
        // One- and two-byte varints (tags, lengths below 16 KiB, small ints) dominate.
        match *self.buf {
            [b0, ref rest @ ..] if b0 < 0x80 => {
                self.buf = rest;
                Ok(u64::from(b0))
            }
            [b0, b1, ref rest @ ..] if b1 < 0x80 => {
                self.buf = rest;
                Ok(u64::from(b0 & 0x7f) | u64::from(b1) << 7)
            }
            _ => self.varint_slow(),
        }
    }

    #[cold]
    fn varint_slow(&mut self) -> WireResult<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&b) = self.buf.get(i) else {
                return Err(self.err("truncated varint"));
            };
            if i == 9 && b > 1 {
                return Err(self.err("varint longer than 64 bits"));
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                self.buf = &self.buf[i + 1..];
                return Ok(value);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    /// The next field's number and wire type.
    #[inline(always)]
    pub(super) fn tag(&mut self) -> WireResult<(u64, u8)> {
        let start = *self;
        let tag = self.varint()?;
        let field = tag >> 3;
        if field == 0 {
            return Err(start.err("field number 0"));
        }
        // Protobuf tags are 32-bit: field numbers end at 2^29 - 1.
        if tag > u64::from(u32::MAX) {
            return Err(start.err("field number beyond 2^29 - 1"));
        }
        Ok((field, (tag & 7) as u8))
    }

    /// A length-delimited field's contents, as a cursor.
    #[inline(always)]
    pub(super) fn sub(&mut self) -> WireResult<Wire<'a>> {
        let start = *self;
        let len = self.varint()?;
        if len > self.buf.len() as u64 {
            *self = start;
            return Err(self.err("length-delimited field runs past the end of its message"));
        }
        let (sub, rest) = self.buf.split_at(len as usize);
        self.buf = rest;
        Ok(Wire { buf: sub })
    }

    #[inline(always)]
    pub(super) fn bytes(&self) -> &'a [u8] {
        self.buf
    }

    #[inline]
    pub(super) fn fixed<const N: usize>(&mut self) -> WireResult<[u8; N]> {
        match self.buf.split_first_chunk::<N>() {
            Some((b, rest)) => {
                self.buf = rest;
                Ok(*b)
            }
            None => Err(self.err("truncated fixed-width field")),
        }
    }

    /// Skips the value of a field of wire type `wire_type` whose tag was just read.
    pub(super) fn skip(&mut self, field: u64, wire_type: u8) -> WireResult<()> {
        self.skip_depth(field, wire_type, 0)
    }

    fn skip_depth(&mut self, field: u64, wire_type: u8, depth: u32) -> WireResult<()> {
        match wire_type {
            VARINT => self.varint().map(drop),
            FIXED64 => self.fixed::<8>().map(drop),
            LEN => self.sub().map(drop),
            FIXED32 => self.fixed::<4>().map(drop),
            START_GROUP => {
                if depth >= MAX_GROUP_DEPTH {
                    return Err(self.err("groups nested too deeply"));
                }
                loop {
                    if self.done() {
                        return Err(self.err("unterminated group"));
                    }
                    let start = *self;
                    let (f, wt) = self.tag()?;
                    if wt == END_GROUP {
                        if f != field {
                            return Err(start.err("mismatched end-group tag"));
                        }
                        return Ok(());
                    }
                    self.skip_depth(f, wt, depth + 1)?;
                }
            }
            END_GROUP => Err(self.err("unexpected end-group tag")),
            _ => Err(self.err("invalid wire type")),
        }
    }

    /// Reads the next field; returns a cursor over it when it is field `want`
    /// (length-delimited), skips any other field, errors on `want` with another
    /// wire type.
    #[inline(always)]
    pub(super) fn next_len_field(&mut self, want: u64) -> WireResult<Option<Wire<'a>>> {
        let start = *self;
        let (field, wt) = self.tag()?;
        if field == want {
            if wt != LEN {
                return Err(start.err("wrong wire type for a message field"));
            }
            return self.sub().map(Some);
        }
        self.skip(field, wt)?;
        Ok(None)
    }
}

// ---------------------------------------------------------------------------
// Feature kinds

pub(super) const KIND_BYTES: u64 = 1;
pub(super) const KIND_FLOAT: u64 = 2;
pub(super) const KIND_INT64: u64 = 3;

fn kind_name(kind: u64) -> &'static str {
    match kind {
        KIND_BYTES => "bytes_list",
        KIND_FLOAT => "float_list",
        _ => "int64_list",
    }
}

fn dtype_kind(dtype: DType) -> u64 {
    match dtype {
        DType::Int64 => KIND_INT64,
        DType::Float32 => KIND_FLOAT,
        _ => KIND_BYTES,
    }
}

/// The `kind` fields (`bytes_list`/`float_list`/`int64_list`) of one `Feature`, or of
/// every `Feature` value of a map entry (which protobuf merges into one), in order.
#[derive(Debug, Clone, Copy)]
pub(super) struct Kinds<'a> {
    /// The map entry whose value fields (field 2) are still to be visited.
    entry: Option<Wire<'a>>,
    /// The `Feature` message being walked.
    feature: Option<Wire<'a>>,
}

impl<'a> Kinds<'a> {
    pub(super) fn of_entry(entry: Wire<'a>) -> Kinds<'a> {
        Kinds {
            entry: Some(entry),
            feature: None,
        }
    }

    pub(super) fn of_feature(feature: Wire<'a>) -> Kinds<'a> {
        Kinds {
            entry: None,
            feature: Some(feature),
        }
    }

    /// The next list: its kind and a cursor over the list message.
    #[inline]
    pub(super) fn next(&mut self) -> WireResult<Option<(u64, Wire<'a>)>> {
        loop {
            if let Some(feature) = &mut self.feature {
                if !feature.done() {
                    let start = *feature;
                    let (field, wt) = feature.tag()?;
                    if (KIND_BYTES..=KIND_INT64).contains(&field) {
                        if wt != LEN {
                            return Err(start.err("wrong wire type for a Feature list"));
                        }
                        return feature.sub().map(|list| Some((field, list)));
                    }
                    feature.skip(field, wt)?;
                    continue;
                }
                self.feature = None;
            }
            let Some(entry) = &mut self.entry else {
                return Ok(None);
            };
            if entry.done() {
                return Ok(None);
            }
            // Field 1 is the key, field 2 a (partial) value.
            self.feature = entry.next_len_field(2)?;
        }
    }

    /// Protobuf's oneof merge: the final kind, and how many lists to skip before
    /// the run of lists of that kind which make up its value.
    fn resolve(mut self) -> WireResult<Option<(u64, usize)>> {
        let mut kind = None;
        let mut start = 0;
        let mut index = 0;
        while let Some((k, _)) = self.next()? {
            if kind != Some(k) {
                kind = Some(k);
                start = index;
            }
            index += 1;
        }
        Ok(kind.map(|k| (k, start)))
    }
}

// ---------------------------------------------------------------------------
// Plans: what to do per feature, precomputed from the schema

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Fixed,
    Var,
    FixedSequence,
    VarSequence,
    /// `Layout::VarFixed`: decoded as `Var`, counted in elements of `len` values.
    VarFixed,
    Ragged,
    Sparse,
}

/// A ragged feature's partition, with the slot of the feature it reads.
#[derive(Debug, Clone, Copy)]
enum Part {
    Splits(usize),
    Lengths(usize),
    Uniform(usize),
}

/// A fixed-length feature's default: `product(shape)` values, or one to repeat.
#[derive(Debug, Clone)]
enum Fill {
    Int64(Vec<i64>),
    Float32(Vec<f32>),
    Uint8(Vec<u8>),
    Bytes(Vec<Vec<u8>>),
}

#[derive(Debug, Clone)]
struct Plan {
    dtype: DType,
    /// `dtype.raw_width()`: the one bytes value is decoded raw.
    raw: Option<usize>,
    shape: Shape,
    /// Values per record (`Fixed`), step (`FixedSequence`) or element (`VarFixed`,
    /// and `Ragged`: the product of its trailing uniform row lengths); 0 for var-length.
    len: usize,
    default: Option<Fill>,
    /// The slot of this feature's own key.
    slot: usize,
    /// `Ragged`: the partitions that become row splits, outermost first (trailing
    /// uniform row lengths are the column's inner shape instead).
    parts: Vec<Part>,
    /// `parts` in the text form, for messages.
    part_names: Vec<String>,
    /// An image feature: the one bytes value is decoded by this worker.
    image: Option<ImageSlot>,
}

/// A plan's image decoder. Each parser (one per pipeline worker) has its
/// own, so the mutex is never contended; it is there so that decoding,
/// which reuses the worker's buffers, can run from `&Plan`.
#[derive(Debug)]
struct ImageSlot {
    worker: std::sync::Mutex<ImageWorker>,
    /// The seed of the record being parsed (see
    /// [`BatchParser::set_image_seed`]).
    seed: u64,
}

impl ImageSlot {
    fn new(options: ImageOptions) -> Option<ImageSlot> {
        ImageWorker::new(options).ok().map(|w| ImageSlot {
            worker: std::sync::Mutex::new(w),
            seed: 0,
        })
    }

    /// Decodes `bytes` and appends the image's values to `values`.
    fn decode(&self, bytes: &[u8], len: usize, values: &mut Values) -> Result<(), ImageError> {
        let mut worker = self
            .worker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let seed = self.seed;
        match values {
            Values::Uint8(v) => {
                let start = v.len();
                v.resize(start + len, 0);
                let r = worker.process(bytes, seed, OutputSlice::Uint8(&mut v[start..]));
                if r.is_err() {
                    v.truncate(start);
                }
                r
            }
            Values::Float32(v) => {
                let start = v.len();
                v.resize(start + len, 0.0);
                let r = worker.process(bytes, seed, OutputSlice::Float32(&mut v[start..]));
                if r.is_err() {
                    v.truncate(start);
                }
                r
            }
            // `column_fits` gives an image column uint8 or float32 values.
            _ => Ok(()),
        }
    }
}

impl Clone for ImageSlot {
    fn clone(&self) -> ImageSlot {
        let worker = self
            .worker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let options = *worker.options();
        ImageSlot::new(options).unwrap_or_else(|| unreachable!("options checked when first built"))
    }
}

impl Plan {
    fn new(spec: &FeatureSpec, slot: usize, key_slot: &dyn Fn(&str) -> usize) -> Plan {
        let shape = match spec.layout {
            Layout::Fixed(_) => Shape::Fixed,
            Layout::Var => Shape::Var,
            Layout::Sparse { .. } => Shape::Sparse,
            Layout::FixedSequence(_) => Shape::FixedSequence,
            Layout::VarSequence => Shape::VarSequence,
            Layout::VarFixed(_) => Shape::VarFixed,
            Layout::Ragged(_) => Shape::Ragged,
        };
        let (_, inner) = column_layout(&spec.layout);
        let parts = match &spec.layout {
            // A sparse feature's index keys, one per dimension, as `Lengths` slots.
            Layout::Sparse { index_keys, .. } => index_keys
                .iter()
                .map(|k| Part::Lengths(key_slot(k)))
                .collect(),
            Layout::Ragged(parts) => parts[..parts.len() - trailing_uniform(parts)]
                .iter()
                .map(|p| match p {
                    Partition::RowSplits(k) => Part::Splits(key_slot(k)),
                    Partition::RowLengths(k) => Part::Lengths(key_slot(k)),
                    Partition::UniformRowLength(n) => Part::Uniform(*n),
                })
                .collect(),
            _ => Vec::new(),
        };
        let part_names = match &spec.layout {
            Layout::Ragged(parts) => parts.iter().map(|p| p.to_string()).collect(),
            Layout::Sparse { index_keys, .. } => index_keys.clone(),
            _ => Vec::new(),
        };
        let len = match spec.layout {
            Layout::Ragged(_) => inner.iter().product(),
            _ => spec.fixed_len().unwrap_or(0),
        };
        let default = spec.default.as_ref().map(|d| match (spec.dtype, d) {
            // Validated to lie in 0..=255.
            (DType::Uint8, Value::Int64(v)) => Fill::Uint8(v.iter().map(|&x| x as u8).collect()),
            (_, Value::Int64(v)) => Fill::Int64(v.clone()),
            (_, Value::Float32(v)) => Fill::Float32(v.clone()),
            (_, Value::Bytes(v)) => Fill::Bytes(v.clone()),
        });
        let image = spec.image.and_then(ImageSlot::new);
        Plan {
            // An image is read from one bytes value, like the raw dtypes.
            dtype: if image.is_some() {
                DType::Bytes
            } else {
                spec.dtype
            },
            raw: if image.is_some() {
                Some(1)
            } else {
                spec.dtype.raw_width()
            },
            image,
            shape,
            len,
            default,
            slot,
            parts,
            part_names,
        }
    }
}

/// How many of `parts` (from the end) are uniform row lengths: those become the
/// column's inner shape.
fn trailing_uniform(parts: &[Partition]) -> usize {
    parts
        .iter()
        .rev()
        .take_while(|p| matches!(p, Partition::UniformRowLength(_)))
        .count()
}

/// A column's ragged levels and inner shape for `layout` (see `src/batch.rs`).
fn column_layout(layout: &Layout) -> (usize, Vec<usize>) {
    match layout {
        Layout::Fixed(shape) => (0, shape.clone()),
        Layout::Var | Layout::Sparse { .. } => (1, Vec::new()),
        Layout::FixedSequence(shape) | Layout::VarFixed(shape) => (1, shape.clone()),
        Layout::VarSequence => (2, Vec::new()),
        Layout::Ragged(parts) => {
            let uniform = trailing_uniform(parts);
            let inner = parts[parts.len() - uniform..]
                .iter()
                .map(|p| match p {
                    Partition::UniformRowLength(n) => *n,
                    _ => 1,
                })
                .collect();
            (1 + parts.len() - uniform, inner)
        }
    }
}

/// Schema feature names -> index, matched on key bytes without allocating.
/// (Comparing 8-byte words instead of slices measured no faster.)
#[derive(Debug, Clone)]
enum Lookup {
    /// Few names: a linear scan beats hashing.
    Scan(Vec<(Box<[u8]>, usize)>),
    Hash(HashMap<Box<[u8]>, usize>),
}

impl Lookup {
    fn new(names: Vec<(Box<[u8]>, usize)>) -> Lookup {
        if names.len() <= 8 {
            Lookup::Scan(names)
        } else {
            Lookup::Hash(names.into_iter().collect())
        }
    }

    #[inline]
    fn get(&self, key: &[u8]) -> Option<usize> {
        match self {
            Lookup::Scan(names) => names
                .iter()
                .find(|(name, _)| **name == *key)
                .map(|&(_, i)| i),
            Lookup::Hash(map) => map.get(key).copied(),
        }
    }
}

/// Internal error: malformed outside any feature, or about a feature.
enum Fail {
    Wire(WireError),
    Feature(usize, Problem),
}

impl From<WireError> for Fail {
    fn from(e: WireError) -> Fail {
        Fail::Wire(e)
    }
}

// ---------------------------------------------------------------------------
// The parser

/// Parses batches of serialized records under a schema, reusing its buffers.
///
/// ```
/// use prost::Message;
/// use tfpipe::example::{BatchParser, Example, Schema, proto};
///
/// let feature = |kind| proto::Feature { kind: Some(kind) };
/// let example = Example {
///     features: Some(proto::Features {
///         feature: [
///             ("label".to_string(), feature(proto::feature::Kind::Int64List(proto::Int64List { value: vec![7] }))),
///             ("image_raw".to_string(), feature(proto::feature::Kind::BytesList(proto::BytesList { value: vec![vec![1, 2, 3, 4]] }))),
///         ]
///         .into(),
///     }),
/// };
/// let record = example.encode_to_vec();
///
/// let schema = Schema::from_feature_texts(&["image_raw:uint8:2x2", "label:int64"]).unwrap();
/// let mut parser = BatchParser::new(schema).unwrap();
/// let batch = parser.parse(&[&record, &record]).unwrap();
/// assert_eq!(batch.num_rows, 2);
/// assert_eq!(batch.columns[0].as_u8(), Some(&[1, 2, 3, 4, 1, 2, 3, 4][..]));
/// assert_eq!(batch.columns[1].as_i64(), Some(&[7, 7][..]));
/// ```
#[derive(Debug, Clone)]
pub struct BatchParser {
    schema: Schema,
    plans: Vec<Plan>,
    /// Non-sequence features: `Example.features`, or `SequenceExample.context`.
    context: Lookup,
    /// Sequence features: `SequenceExample.feature_lists`.
    lists: Lookup,
    sequence: bool,
    /// Per record: the byte range of each key's last map entry (the features', then
    /// the other keys that ragged partitions read).
    slots: Vec<Option<Slot>>,
    /// Scratch for ragged partitions: a partition key's values, and each level's
    /// row splits for the record being parsed (kept, so nothing is allocated once warm).
    ints: Values,
    levels: Vec<Vec<usize>>,
    /// Scratch for sparse features: each index key's values, and the sort order.
    index_lists: Vec<Vec<i64>>,
    order: Vec<usize>,
    /// `(seed, epoch, index of the next call's first record)` for the
    /// random choices of image features (see [`BatchParser::set_image_seed`]).
    image_seed: (u64, u64, u64),
}

impl BatchParser {
    /// A parser for `schema`; checks the schema first.
    pub fn new(schema: Schema) -> Result<BatchParser, SchemaError> {
        schema.validate()?;
        // Slots: one per feature, then one per other context key a partition reads.
        let mut extra: Vec<String> = Vec::new();
        for f in &schema.features {
            for key in f.layout.keys() {
                let is_context_feature =
                    schema.feature(key).is_some_and(|k| !k.layout.is_sequence());
                if !is_context_feature && !extra.iter().any(|e| e == key) {
                    extra.push(key.to_string());
                }
            }
        }
        let n = schema.features.len();
        let key_slot = |key: &str| -> usize {
            match schema.index_of(key) {
                Some(i) if !schema.features[i].layout.is_sequence() => i,
                _ => n + extra.iter().position(|e| e == key).unwrap_or(0),
            }
        };
        let plans = schema
            .features
            .iter()
            .enumerate()
            .map(|(i, f)| Plan::new(f, i, &key_slot))
            .collect();
        let names = |sequence: bool| {
            let mut names: Vec<(Box<[u8]>, usize)> = schema
                .features
                .iter()
                .enumerate()
                .filter(|(_, f)| f.layout.is_sequence() == sequence)
                .map(|(i, f)| (f.name.as_bytes().into(), i))
                .collect();
            if !sequence {
                names.extend(
                    extra
                        .iter()
                        .enumerate()
                        .map(|(i, k)| (k.as_bytes().into(), n + i)),
                );
            }
            names
        };
        let max_levels = schema
            .features
            .iter()
            .map(|f| column_layout(&f.layout).0)
            .max()
            .unwrap_or(0);
        Ok(BatchParser {
            context: Lookup::new(names(false)),
            lists: Lookup::new(names(true)),
            sequence: schema.is_sequence(),
            slots: vec![None; n + extra.len()],
            ints: Values::Int64(Vec::new()),
            levels: vec![Vec::new(); max_levels],
            index_lists: vec![
                Vec::new();
                schema
                    .features
                    .iter()
                    .map(|f| match &f.layout {
                        Layout::Sparse { index_keys, .. } => index_keys.len(),
                        _ => 0,
                    })
                    .max()
                    .unwrap_or(0)
            ],
            order: Vec::new(),
            image_seed: (0, 0, 0),
            plans,
            schema,
        })
    }

    /// Whether an image feature makes random choices (a random crop or an
    /// augmentation), which [`set_image_seed`](Self::set_image_seed) seeds.
    pub fn has_random_images(&self) -> bool {
        self.schema
            .features
            .iter()
            .any(|f| f.image.is_some_and(|o| o.is_random()))
    }

    /// Seeds the random choices of image features for the next `parse*`
    /// call: record `i` of its records draws from
    /// [`element_seed`](crate::image::element_seed)`(seed, epoch, first + i)`.
    /// Until set, `seed`, `epoch` and `first` are 0. The pipeline's parse
    /// stage sets them per element from its seed, the epoch and the
    /// record's index in the epoch.
    ///
    /// ```
    /// use tfpipe::{BatchParser, Schema};
    /// let schema = Schema::from_feature_texts(&["image/encoded:image:8x8x3:random_crop,flip"])?;
    /// let mut parser = BatchParser::new(schema)?;
    /// assert!(parser.has_random_images());
    /// parser.set_image_seed(42, 0, 1000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_image_seed(&mut self, seed: u64, epoch: u64, first: u64) {
        self.image_seed = (seed, epoch, first);
    }

    /// Gives each image feature the seed of record `index` of this call.
    fn seed_images(&mut self, index: usize) {
        let (seed, epoch, first) = self.image_seed;
        for plan in &mut self.plans {
            if let Some(image) = &mut plan.image {
                image.seed = element_seed(seed, epoch, first.wrapping_add(index as u64));
            }
        }
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// An empty batch with this schema's columns (what `parse(&[])` returns).
    pub fn empty_batch(&self) -> Batch {
        Batch {
            num_rows: 0,
            columns: self.schema.features.iter().map(empty_column).collect(),
        }
    }

    /// Parses `records` (each one serialized record) into one batch.
    pub fn parse<R: AsRef<[u8]>>(&mut self, records: &[R]) -> Result<Batch, ParseError> {
        let mut batch = self.empty_batch();
        self.parse_into(records, &mut batch)?;
        Ok(batch)
    }

    /// Parses one serialized record into a batch of one row.
    pub fn parse_one(&mut self, record: &[u8]) -> Result<Batch, ParseError> {
        self.parse(&[record])
    }

    /// Parses `records` into `batch`, replacing its contents but keeping its buffers'
    /// capacity: once `batch` has held a batch this size, nothing is allocated.
    /// A batch of another schema is reset to this one's columns first.
    ///
    /// On error `batch` holds partial data (see the module doc).
    pub fn parse_into<R: AsRef<[u8]>>(
        &mut self,
        records: &[R],
        batch: &mut Batch,
    ) -> Result<(), ParseError> {
        self.reset(batch, records.len());
        for (index, record) in records.iter().enumerate() {
            let record = record.as_ref();
            self.seed_images(index);
            self.parse_record(record, &mut batch.columns)
                .map_err(|fail| self.error(fail, index, record, records.len()))?;
            batch.num_rows = index + 1;
        }
        Ok(())
    }

    /// Parses `records` into `batch`, leaving out each record that fails:
    /// its partial values are rolled back, and `on_bad` gets its index in
    /// `records` and the error. `batch` holds the good records, in order.
    pub fn parse_into_skipping<R: AsRef<[u8]>>(
        &mut self,
        records: &[R],
        batch: &mut Batch,
        mut on_bad: impl FnMut(usize, ParseError),
    ) {
        self.reset(batch, records.len());
        for (index, record) in records.iter().enumerate() {
            if let Some(next) = records.get(index + 1) {
                prefetch(next.as_ref());
            }
            let record = record.as_ref();
            self.seed_images(index);
            match self.parse_record(record, &mut batch.columns) {
                Ok(()) => batch.num_rows += 1,
                Err(fail) => {
                    batch.truncate_rows(batch.num_rows);
                    on_bad(index, self.error(fail, index, record, records.len()));
                }
            }
        }
    }

    fn error(&self, fail: Fail, index: usize, record: &[u8], rows: usize) -> ParseError {
        match fail {
            Fail::Wire(e) => ParseError::Malformed {
                record: index,
                reason: e.describe(record),
            },
            Fail::Feature(feature, Problem::Image(source)) => ParseError::Image {
                record: index,
                feature: self.schema.features[feature].name.clone(),
                source,
            },
            Fail::Feature(feature, problem) => {
                let name = &self.schema.features[feature].name;
                let reason = match problem {
                    Problem::NoSuchKey => {
                        let mut reason = Problem::NoSuchKey.describe(record);
                        if let Some(near) = nearest_key(record, name, &self.schema) {
                            reason.push_str(&format!(" (did you mean {near:?}?)"));
                        }
                        reason
                    }
                    Problem::OutOfMemory(len, dtype) => {
                        let per_record = (len as u64).saturating_mul(dtype.element_bytes() as u64);
                        format!(
                            "{} ({} for a batch of {rows} records)",
                            Problem::OutOfMemory(len, dtype).describe(record),
                            crate::example::spec::human_bytes(
                                per_record.saturating_mul(rows as u64)
                            ),
                        )
                    }
                    other => other.describe(record),
                };
                ParseError::Feature {
                    record: index,
                    feature: name.clone(),
                    reason,
                }
            }
        }
    }

    /// Empties `batch` for `rows` records, keeping (and growing) its buffers.
    fn reset(&self, batch: &mut Batch, rows: usize) {
        for column in &mut batch.columns {
            if let Values::Sparse {
                indices, values, ..
            } = &mut column.values
            {
                indices.clear();
                clear_values(values);
            }
        }
        let fits = batch.columns.len() == self.schema.features.len()
            && batch
                .columns
                .iter()
                .zip(&self.schema.features)
                .all(|(c, f)| column_fits(c, f));
        if !fits {
            *batch = self.empty_batch();
        }
        batch.num_rows = 0;
        for (column, plan) in batch.columns.iter_mut().zip(&self.plans) {
            // Bounded: a huge declared shape must not reserve memory up front.
            let fixed_values = if plan.shape == Shape::Fixed {
                rows.saturating_mul(plan.len).min(MAX_RESERVE)
            } else {
                0
            };
            match &mut column.values {
                Values::Int64(v) => reset_vec(v, fixed_values),
                Values::Float32(v) => reset_vec(v, fixed_values),
                Values::Uint8(v) => reset_vec(v, fixed_values),
                Values::Int16(v) => reset_vec(v, fixed_values),
                Values::Uint16(v) => reset_vec(v, fixed_values),
                Values::Int32(v) => reset_vec(v, fixed_values),
                Values::Float64(v) => reset_vec(v, fixed_values),
                Values::Bytes { data, offsets } => {
                    data.clear();
                    reset_vec(offsets, fixed_values + 1);
                    offsets.push(0);
                }
                // Cleared above.
                Values::Sparse { .. } => {}
            }
            for (level, splits) in column.row_splits.iter_mut().enumerate() {
                reset_vec(splits, if level == 0 { rows + 1 } else { 0 });
                splits.push(0);
            }
        }
    }

    fn parse_record(&mut self, record: &[u8], columns: &mut [Column]) -> Result<(), Fail> {
        self.slots.fill(None);
        let mut message = Wire::new(record);
        while !message.done() {
            let start = message;
            let (field, wt) = message.tag()?;
            let lookup = match field {
                // Example.features and SequenceExample.context: both `Features` in field 1.
                1 => &self.context,
                // SequenceExample.feature_lists, only for schemas with sequences (an
                // `Example` has no field 2; skip it as unknown otherwise).
                2 if self.sequence => &self.lists,
                _ => {
                    message.skip(field, wt)?;
                    continue;
                }
            };
            if wt != LEN {
                return Err(start.err("wrong wire type for a message field").into());
            }
            let mut map = message.sub()?;
            while !map.done() {
                let Some(entry) = map.next_len_field(1)? else {
                    continue;
                };
                let (key, slot) = scan_entry(entry, record)?;
                if let Some(index) = lookup.get(key) {
                    // A later entry with the same key replaces it, as in a protobuf map.
                    self.slots[index] = Some(slot);
                }
            }
        }
        for (index, (plan, column)) in self.plans.iter().zip(columns.iter_mut()).enumerate() {
            let slot = self.slots[plan.slot];
            let result = match plan.shape {
                Shape::Fixed | Shape::Var | Shape::VarFixed => {
                    decode_feature(plan, record, slot, column)
                }
                Shape::FixedSequence | Shape::VarSequence => {
                    decode_list(plan, slot.map(|s| s.entry(record)), column)
                }
                Shape::Ragged => decode_ragged(
                    plan,
                    record,
                    &self.slots,
                    column,
                    &mut self.ints,
                    &mut self.levels,
                ),
                Shape::Sparse => decode_sparse(
                    plan,
                    record,
                    &self.slots,
                    column,
                    &mut self.ints,
                    &mut self.index_lists,
                    &mut self.order,
                ),
            };
            result.map_err(|reason| Fail::Feature(index, reason))?;
        }
        Ok(())
    }
}

/// The key nearest to `name` by edit distance among `record`'s features (its
/// `features` / `context` map), else among `schema`'s other features: only a
/// plausible typo (distance at most a third of the name's length, at least 1).
fn nearest_key(record: &[u8], name: &str, schema: &Schema) -> Option<String> {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut message = Wire::new(record);
    while !message.done() {
        let Ok(Some(mut map)) = message.next_len_field(1) else {
            break;
        };
        while !map.done() {
            match map.next_len_field(1) {
                Ok(Some(entry)) => {
                    if let Ok((key, _)) = scan_entry(entry, record) {
                        keys.push(key.to_vec());
                    }
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
    }
    let from_record = keys.iter().filter_map(|k| std::str::from_utf8(k).ok());
    crate::example::spec::nearest(name, from_record)
        .or_else(|| {
            crate::example::spec::nearest(
                name,
                schema
                    .features
                    .iter()
                    .map(|f| f.name.as_str())
                    .filter(|n| *n != name),
            )
        })
        .map(str::to_string)
}

/// Cache lines of the next record asked for while the current one parses.
const PREFETCH_LINES: usize = 16;

/// Asks the CPU to bring the start of `record` (up to [`PREFETCH_LINES`]
/// cache lines) into cache. Records reach the parser in shuffled order from
/// a buffer larger than the caches, so each one would otherwise stall on
/// its first bytes; parsing the previous record hides the wait.
#[inline(always)]
fn prefetch(record: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in record.chunks(64).take(PREFETCH_LINES) {
        // SAFETY: prefetching is a hint with no architectural effect; the
        // address is inside a live slice.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = record;
}

fn reset_vec<T>(v: &mut Vec<T>, capacity: usize) {
    v.clear();
    v.reserve(capacity);
}

/// Where a schema feature's map entry lies in the record.
#[derive(Debug, Clone, Copy)]
struct Slot {
    entry: (usize, usize),
    /// The last value field (field 2) of the entry.
    value: (usize, usize),
    /// How many value fields the entry has (protobuf merges them when > 1).
    values: u32,
}

impl Slot {
    fn entry<'a>(&self, record: &'a [u8]) -> Wire<'a> {
        Wire::new(&record[self.entry.0..self.entry.0 + self.entry.1])
    }

    fn value<'a>(&self, record: &'a [u8]) -> Wire<'a> {
        Wire::new(&record[self.value.0..self.value.0 + self.value.1])
    }
}

/// A map entry's key (field 1; the last one wins; empty when absent), and its slot.
#[inline(always)]
fn scan_entry<'a>(mut entry: Wire<'a>, record: &[u8]) -> WireResult<(&'a [u8], Slot)> {
    let mut key: &[u8] = &[];
    let mut slot = Slot {
        entry: entry.span_in(record),
        value: (0, 0),
        values: 0,
    };
    while !entry.done() {
        let start = entry;
        let (field, wt) = entry.tag()?;
        match (field, wt) {
            (1, LEN) => key = entry.sub()?.bytes(),
            (2, LEN) => {
                let value = entry.sub()?;
                slot.value = value.span_in(record);
                slot.values += 1;
            }
            (1 | 2, _) => {
                return Err(start.err("wrong wire type for a map entry field"));
            }
            _ => entry.skip(field, wt)?,
        }
    }
    Ok((key, slot))
}

/// What one `Feature` message holds, after protobuf's oneof merging.
enum Found<'a> {
    /// No list set.
    Nothing,
    /// One list (the usual case).
    One(u64, Wire<'a>),
    /// Several lists of the final kind, after skipping the first `.1` lists of
    /// the message (walk them again with [`Kinds`]).
    Merged(u64, usize),
}

#[inline(always)]
fn resolve_feature(mut feature: Wire<'_>) -> WireResult<Found<'_>> {
    let mut kind = 0;
    let mut run_start = 0;
    let mut index = 0;
    let mut first = feature;
    while !feature.done() {
        let start = feature;
        let (field, wt) = feature.tag()?;
        if (KIND_BYTES..=KIND_INT64).contains(&field) {
            if wt != LEN {
                return Err(start.err("wrong wire type for a Feature list"));
            }
            let list = feature.sub()?;
            if field != kind {
                kind = field;
                run_start = index;
                first = list;
            }
            index += 1;
        } else {
            feature.skip(field, wt)?;
        }
    }
    Ok(match index - run_start {
        _ if kind == 0 => Found::Nothing,
        1 => Found::One(kind, first),
        _ => Found::Merged(kind, run_start),
    })
}

fn empty_values_for(spec: &FeatureSpec) -> Values {
    match &spec.layout {
        Layout::Sparse { size, .. } => Values::Sparse {
            indices: Vec::new(),
            size: size.clone(),
            values: Box::new(empty_values(spec.dtype)),
        },
        _ => empty_values(spec.dtype),
    }
}

fn empty_values(dtype: DType) -> Values {
    match dtype {
        DType::Int64 => Values::Int64(Vec::new()),
        DType::Float32 | DType::RawFloat32 => Values::Float32(Vec::new()),
        DType::Uint8 => Values::Uint8(Vec::new()),
        DType::RawInt16 => Values::Int16(Vec::new()),
        DType::RawUint16 => Values::Uint16(Vec::new()),
        DType::RawInt32 => Values::Int32(Vec::new()),
        DType::RawFloat64 => Values::Float64(Vec::new()),
        DType::Bytes => Values::Bytes {
            data: Vec::new(),
            offsets: vec![0],
        },
    }
}

/// An empty column for `spec`, in the layout `src/batch.rs` documents.
fn empty_column(spec: &FeatureSpec) -> Column {
    let (levels, inner_shape) = column_layout(&spec.layout);
    Column {
        name: spec.name.clone(),
        values: empty_values_for(spec),
        row_splits: vec![vec![0]; levels],
        inner_shape,
    }
}

/// Whether `column` has `spec`'s layout (checked on every `parse_into`: allocates nothing).
fn column_fits(column: &Column, spec: &FeatureSpec) -> bool {
    let values_fit = match (&column.values, &spec.layout) {
        (Values::Sparse { size, values, .. }, Layout::Sparse { size: want, .. }) => {
            size == want && values_fit(values, spec.dtype)
        }
        (Values::Sparse { .. }, _) | (_, Layout::Sparse { .. }) => false,
        (values, _) => values_fit(values, spec.dtype),
    };
    let (levels, inner_fits) = match &spec.layout {
        Layout::Ragged(parts) => {
            let uniform = &parts[parts.len() - trailing_uniform(parts)..];
            let fits = column.inner_shape.len() == uniform.len()
                && column
                    .inner_shape
                    .iter()
                    .zip(uniform)
                    .all(|(d, p)| matches!(p, Partition::UniformRowLength(n) if n == d));
            (1 + parts.len() - uniform.len(), fits)
        }
        layout => (
            column_layout_levels(layout),
            column.inner_shape == layout.fixed_shape().unwrap_or(&[]),
        ),
    };
    values_fit && inner_fits && column.name == spec.name && column.row_splits.len() == levels
}

/// Whether `values` is the buffer a column of `dtype` holds.
fn values_fit(values: &Values, dtype: DType) -> bool {
    matches!(
        (values, dtype),
        (Values::Int64(_), DType::Int64)
            | (Values::Float32(_), DType::Float32 | DType::RawFloat32)
            | (Values::Uint8(_), DType::Uint8)
            | (Values::Int16(_), DType::RawInt16)
            | (Values::Uint16(_), DType::RawUint16)
            | (Values::Int32(_), DType::RawInt32)
            | (Values::Float64(_), DType::RawFloat64)
            | (Values::Bytes { .. }, DType::Bytes)
    )
}

/// [`column_layout`]'s level count, for layouts other than `Ragged`.
fn column_layout_levels(layout: &Layout) -> usize {
    match layout {
        Layout::Fixed(_) => 0,
        Layout::VarSequence => 2,
        Layout::Ragged(parts) => 1 + parts.len() - trailing_uniform(parts),
        _ => 1,
    }
}

/// Why a feature could not be decoded.
enum Problem {
    Wire(WireError),
    Text(String),
    /// A fixed-length feature without default whose key the record lacks.
    NoSuchKey,
    /// Filling the default (this many values of this dtype) could not allocate.
    OutOfMemory(usize, DType),
    /// An image feature's bytes do not decode.
    Image(Box<ImageError>),
}

impl Problem {
    fn in_partition(self, name: &str) -> Problem {
        match self {
            Problem::Text(t) => Problem::Text(format!("partition {name}: {t}")),
            other => other,
        }
    }

    fn in_step(self, index: usize) -> Problem {
        match self {
            Problem::Text(t) => Problem::Text(format!("step {index}: {t}")),
            other => other,
        }
    }

    fn describe(self, record: &[u8]) -> String {
        match self {
            Problem::Wire(e) => format!("malformed protobuf: {}", e.describe(record)),
            Problem::Text(t) => t,
            Problem::NoSuchKey => MISSING_NO_KEY.into(),
            Problem::Image(e) => crate::error::display_chain(&*e),
            Problem::OutOfMemory(len, dtype) => format!(
                "missing, and its default of {len} values needs {} per record: out of memory",
                crate::example::spec::human_bytes(
                    (len as u64).saturating_mul(dtype.element_bytes() as u64)
                )
            ),
        }
    }
}

fn text(t: String) -> Problem {
    Problem::Text(t)
}

fn wrong_kind(dtype: DType, found: u64) -> String {
    format!(
        "expected {} (dtype {dtype}), found {}",
        dtype.kind_name(),
        kind_name(found)
    )
}

/// Appends the values of the lists in `kinds` (skipping the first `skip`) to
/// `values`; returns how many values were appended. For `Uint8` the one bytes
/// value is checked and copied raw.
#[inline]
fn append_lists(
    plan: &Plan,
    mut kinds: Kinds<'_>,
    skip: usize,
    values: &mut Values,
) -> Result<usize, Problem> {
    let mut index = 0;
    let mut count = 0;
    let mut raw: &[u8] = &[];
    while let Some((_, list)) = kinds.next().map_err(Problem::Wire)? {
        index += 1;
        if index <= skip {
            continue;
        }
        count += append_list(plan, list, values, &mut raw)?;
    }
    finish_list(plan, count, raw, values)
}

/// Appends one list's values; returns how many. For `Uint8` nothing is appended:
/// the values are counted and the last kept in `raw` for [`finish_list`].
#[inline(always)]
fn append_list<'a>(
    plan: &Plan,
    list: Wire<'a>,
    values: &mut Values,
    raw: &mut &'a [u8],
) -> Result<usize, Problem> {
    match (plan.raw, values) {
        (Some(_), _) => {
            let mut n = 0;
            let mut list = list;
            while !list.done() {
                if let Some(value) = list.next_len_field(1).map_err(Problem::Wire)? {
                    *raw = value.bytes();
                    n += 1;
                }
            }
            Ok(n)
        }
        (_, Values::Int64(v)) => append_int64(list, v).map_err(Problem::Wire),
        (_, Values::Float32(v)) => append_float(list, v).map_err(Problem::Wire),
        (_, Values::Bytes { data, offsets }) => {
            append_bytes(list, data, offsets).map_err(Problem::Wire)
        }
        // Raw dtypes are handled above; `column_fits` keeps the other pairs apart.
        _ => Ok(0),
    }
}

/// After a feature's lists: for `Uint8`, checks there was exactly one bytes value
/// of the right size and copies it raw. Returns the feature's value count.
#[inline(always)]
fn finish_list(
    plan: &Plan,
    count: usize,
    raw: &[u8],
    values: &mut Values,
) -> Result<usize, Problem> {
    if let Some(image) = &plan.image {
        return match count {
            1 => image
                .decode(raw, plan.len, values)
                .map(|()| plan.len)
                .map_err(|e| Problem::Image(Box::new(e))),
            0 => Err(text(
                "present but empty list, expected one encoded image".into(),
            )),
            n => Err(text(format!(
                "an image feature needs exactly one bytes value (an encoded image), found {n} values"
            ))),
        };
    }
    if let Some(width) = plan.raw {
        let want = plan.len * width;
        if count == 1 {
            if raw.len() != want {
                return Err(text(format!(
                    "{} value has {} bytes, expected {want} ({} values of {width} bytes, the shape's size)",
                    plan.dtype,
                    raw.len(),
                    plan.len
                )));
            }
            decode_raw(raw, values);
            return Ok(plan.len);
        }
        if count == 0 {
            return Err(text(format!(
                "present but empty list, expected one bytes value of {want} bytes"
            )));
        }
        return Err(text(format!(
            "{} needs exactly one bytes value of {want} bytes, found {count} values",
            plan.dtype
        )));
    }
    Ok(count)
}

/// Appends `raw` (of a whole number of elements) decoded little-endian.
#[inline(always)]
fn decode_raw(raw: &[u8], values: &mut Values) {
    match values {
        Values::Uint8(v) => v.extend_from_slice(raw),
        Values::Int16(v) => v.extend(
            raw.chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]])),
        ),
        Values::Uint16(v) => v.extend(
            raw.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        ),
        Values::Int32(v) => v.extend(
            raw.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        Values::Float32(v) => v.extend(
            raw.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        Values::Float64(v) => v.extend(
            raw.chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
        ),
        // Raw dtypes only have the columns above.
        Values::Int64(_) | Values::Bytes { .. } | Values::Sparse { .. } => {}
    }
}

#[inline(always)]
fn append_int64(mut list: Wire<'_>, out: &mut Vec<i64>) -> WireResult<usize> {
    let before = out.len();
    while !list.done() {
        let start = list;
        let (field, wt) = list.tag()?;
        match (field, wt) {
            (1, LEN) => {
                let mut packed = list.sub()?;
                while !packed.done() {
                    out.push(packed.varint()? as i64);
                }
            }
            (1, VARINT) => out.push(list.varint()? as i64),
            (1, _) => {
                return Err(start.err("wrong wire type for int64_list values"));
            }
            _ => list.skip(field, wt)?,
        }
    }
    Ok(out.len() - before)
}

#[inline(always)]
fn append_float(mut list: Wire<'_>, out: &mut Vec<f32>) -> WireResult<usize> {
    let before = out.len();
    while !list.done() {
        let start = list;
        let (field, wt) = list.tag()?;
        match (field, wt) {
            (1, LEN) => {
                let packed = list.sub()?;
                let bytes = packed.bytes();
                if bytes.len() % 4 != 0 {
                    return Err(packed.err("packed float_list length is not a multiple of 4"));
                }
                out.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
            (1, FIXED32) => out.push(f32::from_le_bytes(list.fixed::<4>()?)),
            (1, _) => {
                return Err(start.err("wrong wire type for float_list values"));
            }
            _ => list.skip(field, wt)?,
        }
    }
    Ok(out.len() - before)
}

#[inline(always)]
fn append_bytes(
    mut list: Wire<'_>,
    data: &mut Vec<u8>,
    offsets: &mut Vec<usize>,
) -> WireResult<usize> {
    let mut count = 0;
    while !list.done() {
        if let Some(value) = list.next_len_field(1)? {
            data.extend_from_slice(value.bytes());
            offsets.push(data.len());
            count += 1;
        }
    }
    Ok(count)
}

/// Reserves room for `additional` more values; `false` if that cannot be allocated.
fn try_reserve(values: &mut Values, additional: usize) -> bool {
    match values {
        Values::Int64(v) => v.try_reserve(additional).is_ok(),
        Values::Float32(v) => v.try_reserve(additional).is_ok(),
        Values::Uint8(v) => v.try_reserve(additional).is_ok(),
        Values::Int16(v) => v.try_reserve(additional).is_ok(),
        Values::Uint16(v) => v.try_reserve(additional).is_ok(),
        Values::Int32(v) => v.try_reserve(additional).is_ok(),
        Values::Float64(v) => v.try_reserve(additional).is_ok(),
        Values::Bytes { offsets, .. } => offsets.try_reserve(additional).is_ok(),
        Values::Sparse { values, .. } => try_reserve(values, additional),
    }
}

/// Empties `values` (a byte-string buffer keeps its leading 0 offset).
fn clear_values(values: &mut Values) {
    match values {
        Values::Int64(v) => v.clear(),
        Values::Float32(v) => v.clear(),
        Values::Uint8(v) => v.clear(),
        Values::Int16(v) => v.clear(),
        Values::Uint16(v) => v.clear(),
        Values::Int32(v) => v.clear(),
        Values::Float64(v) => v.clear(),
        Values::Bytes { data, offsets } => {
            data.clear();
            offsets.clear();
            offsets.push(0);
        }
        Values::Sparse {
            indices, values, ..
        } => {
            indices.clear();
            clear_values(values);
        }
    }
}

/// Reorders the last `order.len()` values of `values` so that new position `i`
/// holds old tail position `order[i]`.
fn permute_tail(values: &mut Values, order: &[usize]) {
    fn permute<T: Copy>(v: &mut [T], order: &[usize]) {
        let tail: Vec<T> = v.to_vec();
        for (slot, &from) in v.iter_mut().zip(order) {
            *slot = tail[from];
        }
    }
    let n = order.len();
    match values {
        Values::Int64(v) => {
            let at = v.len() - n;
            permute(&mut v[at..], order)
        }
        Values::Float32(v) => {
            let at = v.len() - n;
            permute(&mut v[at..], order)
        }
        Values::Bytes { data, offsets } => {
            let first = offsets.len() - 1 - n;
            let base = offsets[first];
            let old_data = data[base..].to_vec();
            let old: Vec<usize> = offsets[first..].iter().map(|o| o - base).collect();
            data.truncate(base);
            offsets.truncate(first + 1);
            for &from in order {
                data.extend_from_slice(&old_data[old[from]..old[from + 1]]);
                offsets.push(data.len());
            }
        }
        // Sparse values are int64, float32 or bytes (validated).
        _ => {}
    }
}

/// A sparse feature of one record (TensorFlow's `SparseFeature`): its values, and
/// for each one an index per dimension from the index keys; sorted by index, with
/// every index inside the size and none twice.
#[allow(clippy::too_many_arguments)]
fn decode_sparse(
    plan: &Plan,
    record: &[u8],
    slots: &[Option<Slot>],
    column: &mut Column,
    ints: &mut Values,
    index_lists: &mut [Vec<i64>],
    order: &mut Vec<usize>,
) -> Result<(), Problem> {
    let Values::Sparse {
        indices,
        size,
        values,
    } = &mut column.values
    else {
        return Ok(());
    };
    let count = var_values(plan, record, slots[plan.slot], values)?;
    for (dim, part) in plan.parts.iter().enumerate() {
        let (Part::Lengths(slot), Values::Int64(v)) = (part, &mut *ints) else {
            continue;
        };
        v.clear();
        let key = part_name(plan, dim);
        var_values(&PARTITION_PLAN, record, slots[*slot], ints)
            .map_err(|e| e.in_partition(&format!("index key {key:?}")))?;
        let Values::Int64(v) = &*ints else {
            continue;
        };
        if v.len() != count {
            return Err(text(format!(
                "index key {key:?} holds {} indices for {count} values",
                v.len()
            )));
        }
        if let Some((i, &x)) = v
            .iter()
            .enumerate()
            .find(|&(_, &x)| usize::try_from(x).map_or(true, |x| x >= size[dim]))
        {
            return Err(text(format!(
                "index key {key:?}: index {i} is {x}, outside 0..{} (size {size:?})",
                size[dim]
            )));
        }
        index_lists[dim].clear();
        index_lists[dim].extend_from_slice(v);
    }
    let lists = &index_lists[..plan.parts.len()];
    order.clear();
    order.extend(0..count);
    let sorted = (1..count).all(|i| {
        lists
            .iter()
            .map(|l| l[i - 1])
            .cmp(lists.iter().map(|l| l[i]))
            .is_lt()
    });
    if !sorted {
        order.sort_unstable_by(|&a, &b| {
            lists
                .iter()
                .map(|l| l[a])
                .cmp(lists.iter().map(|l| l[b]))
                .then(a.cmp(&b))
        });
        if let Some(w) = order
            .windows(2)
            .find(|w| lists.iter().all(|l| l[w[0]] == l[w[1]]))
        {
            let at: Vec<i64> = lists.iter().map(|l| l[w[1]]).collect();
            return Err(text(format!(
                "values {} and {} have the same index {at:?}",
                w[0].min(w[1]),
                w[0].max(w[1])
            )));
        }
        permute_tail(values, order);
    }
    for &i in order.iter() {
        // In 0..size: checked above.
        indices.extend(lists.iter().map(|l| l[i] as usize));
    }
    let total = values.len();
    if let Some(splits) = column.row_splits.first_mut() {
        splits.push(total);
    }
    Ok(())
}

fn fill<T: Copy>(out: &mut Vec<T>, default: &[T], len: usize) {
    match default {
        [one] => out.extend(std::iter::repeat_n(*one, len)),
        all => out.extend_from_slice(all),
    }
}

fn fill_default(fill_with: &Fill, len: usize, values: &mut Values) {
    match (fill_with, values) {
        (Fill::Int64(d), Values::Int64(v)) => fill(v, d, len),
        (Fill::Float32(d), Values::Float32(v)) => fill(v, d, len),
        (Fill::Uint8(d), Values::Uint8(v)) => fill(v, d, len),
        (Fill::Bytes(d), Values::Bytes { data, offsets }) => {
            for i in 0..len {
                // One value broadcast, or `len` values (never empty: validated).
                if let Some(b) = d.get(i % d.len().max(1)) {
                    data.extend_from_slice(b);
                }
                offsets.push(data.len());
            }
        }
        // `column_fits` and `Plan::new` keep fill and column types equal.
        _ => {}
    }
}

/// The values of a present `Feature` (a single message, or the merged values of
/// an entry), appended to `values`; `None` for a kind-less `Feature`.
#[inline(always)]
fn append_feature(
    plan: &Plan,
    found: Found<'_>,
    source: Kinds<'_>,
    values: &mut Values,
) -> Result<Option<usize>, Problem> {
    match found {
        Found::Nothing => Ok(None),
        Found::One(kind, _) | Found::Merged(kind, _) if kind != dtype_kind(plan.dtype) => {
            Err(text(wrong_kind(plan.dtype, kind)))
        }
        Found::One(_, list) => {
            let mut raw: &[u8] = &[];
            let count = append_list(plan, list, values, &mut raw)?;
            finish_list(plan, count, raw, values).map(Some)
        }
        Found::Merged(_, skip) => append_lists(plan, source, skip, values).map(Some),
    }
}

/// A fixed-length or var-length feature of one record, from its map entry.
#[inline]
fn decode_feature(
    plan: &Plan,
    record: &[u8],
    slot: Option<Slot>,
    column: &mut Column,
) -> Result<(), Problem> {
    let count = match slot {
        None => None,
        Some(slot) if slot.values == 1 => {
            let value = slot.value(record);
            let found = resolve_feature(value).map_err(Problem::Wire)?;
            append_feature(plan, found, Kinds::of_feature(value), &mut column.values)?
        }
        Some(slot) => {
            // No value (an empty Feature), or several that protobuf merges.
            let entry = slot.entry(record);
            let found = match Kinds::of_entry(entry).resolve().map_err(Problem::Wire)? {
                None => Found::Nothing,
                Some((kind, skip)) => Found::Merged(kind, skip),
            };
            append_feature(plan, found, Kinds::of_entry(entry), &mut column.values)?
        }
    };
    let count = match count {
        Some(count) => count,
        None if plan.shape == Shape::Fixed => match &plan.default {
            Some(fill) => {
                if !try_reserve(&mut column.values, plan.len) {
                    return Err(Problem::OutOfMemory(plan.len, plan.dtype));
                }
                fill_default(fill, plan.len, &mut column.values);
                plan.len
            }
            None if slot.is_some() => {
                return Err(text(MISSING_KINDLESS.into()));
            }
            None => return Err(Problem::NoSuchKey),
        },
        None => 0,
    };
    match plan.shape {
        Shape::Fixed if count != plan.len => Err(text(if count == 0 {
            format!(
                "present but empty list, expected {} values (TensorFlow rejects this even with a default)",
                plan.len
            )
        } else {
            format!("has {count} values, expected {}", plan.len)
        })),
        Shape::Fixed => Ok(()),
        Shape::VarFixed => {
            // `len` >= 1: validated.
            let len = plan.len.max(1);
            if count % len != 0 {
                return Err(text(format!(
                    "has {count} values, not a multiple of {len} (the element shape's size)"
                )));
            }
            let total = column.values.len() / len;
            if let Some(splits) = column.row_splits.first_mut() {
                splits.push(total);
            }
            Ok(())
        }
        _ => {
            let total = column.values.len();
            if let Some(splits) = column.row_splits.first_mut() {
                splits.push(total);
            }
            Ok(())
        }
    }
}

/// The values of a var-length feature (or partition key) of one record, appended
/// to `values`; returns how many (0 when missing or kind-less).
fn var_values(
    plan: &Plan,
    record: &[u8],
    slot: Option<Slot>,
    values: &mut Values,
) -> Result<usize, Problem> {
    let count = match slot {
        None => None,
        Some(slot) if slot.values == 1 => {
            let value = slot.value(record);
            let found = resolve_feature(value).map_err(Problem::Wire)?;
            append_feature(plan, found, Kinds::of_feature(value), values)?
        }
        Some(slot) => {
            let entry = slot.entry(record);
            let found = match Kinds::of_entry(entry).resolve().map_err(Problem::Wire)? {
                None => Found::Nothing,
                Some((kind, skip)) => Found::Merged(kind, skip),
            };
            append_feature(plan, found, Kinds::of_entry(entry), values)?
        }
    };
    Ok(count.unwrap_or(0))
}

/// The plan of a partition key: any number of int64 values.
const PARTITION_PLAN: Plan = Plan {
    dtype: DType::Int64,
    raw: None,
    shape: Shape::Var,
    len: 0,
    default: None,
    slot: 0,
    parts: Vec::new(),
    part_names: Vec::new(),
    image: None,
};

/// A ragged feature of one record (TensorFlow's `RaggedFeature` with `validate=True`):
/// its values, then its partitions from the innermost out, each checked against
/// the rows inside it.
fn decode_ragged(
    plan: &Plan,
    record: &[u8],
    slots: &[Option<Slot>],
    column: &mut Column,
    ints: &mut Values,
    levels: &mut [Vec<usize>],
) -> Result<(), Problem> {
    let count = var_values(plan, record, slots[plan.slot], &mut column.values)?;
    // Trailing uniform row lengths: the inner shape, `len` values per innermost row.
    let len = plan.len.max(1);
    if count % len != 0 {
        return Err(text(format!(
            "has {count} values, not a multiple of {len} (the product of its trailing uniform_row_length partitions)"
        )));
    }
    let mut rows = count / len;
    for (level, part) in plan.parts.iter().enumerate().rev() {
        let splits = &mut levels[level];
        splits.clear();
        splits.push(0);
        match *part {
            Part::Uniform(n) => {
                if !rows.is_multiple_of(n) {
                    return Err(text(format!(
                        "partition uniform_row_length({n}): the the {rows} rows inside it are not a multiple of {n}"
                    )));
                }
                splits.extend((1..=rows / n).map(|i| i * n));
            }
            Part::Lengths(slot) | Part::Splits(slot) => {
                let Values::Int64(v) = ints else {
                    return Ok(());
                };
                v.clear();
                var_values(&PARTITION_PLAN, record, slots[slot], ints)
                    .map_err(|e| e.in_partition(part_name(plan, level)))?;
                let Values::Int64(v) = ints else {
                    return Ok(());
                };
                let name = || part_name(plan, level);
                if let Part::Lengths(_) = part {
                    let mut total = 0usize;
                    for (i, &l) in v.iter().enumerate() {
                        let l = usize::try_from(l).map_err(|_| {
                            text(format!(
                                "partition {}: row length {i} is {l}, below 0",
                                name()
                            ))
                        })?;
                        total = total.saturating_add(l);
                        splits.push(total);
                    }
                    if total != rows {
                        return Err(text(format!(
                            "partition {}: row lengths sum to {total}, but there are {rows} rows inside it",
                            name()
                        )));
                    }
                } else {
                    // An empty list is no rows (as TensorFlow reads it).
                    let mut last = 0usize;
                    for (i, &x) in v.iter().enumerate() {
                        let ok = usize::try_from(x)
                            .ok()
                            .filter(|&x| (i > 0 || x == 0) && x >= last && x <= rows);
                        let Some(x) = ok else {
                            return Err(text(format!(
                                "partition {}: row split {i} is {x}; splits must start at 0, never decrease and end at the {rows} rows inside it",
                                name()
                            )));
                        };
                        if i > 0 {
                            splits.push(x);
                        }
                        last = x;
                    }
                    if last != rows {
                        return Err(text(format!(
                            "partition {}: row splits end at {last}, but there are {rows} rows inside it",
                            name()
                        )));
                    }
                }
            }
        }
        rows = splits.len() - 1;
    }
    // Append this record's levels to the batch's: level 0 counts its outermost rows.
    for (level, splits) in column.row_splits.iter_mut().enumerate() {
        let base = splits.last().copied().unwrap_or(0);
        match level.checked_sub(1).and_then(|l| levels.get(l)) {
            None => splits.push(base + rows),
            Some(local) => splits.extend(local.iter().skip(1).map(|s| s + base)),
        }
    }
    Ok(())
}

/// The text form of a ragged plan's partition `level` (for messages).
fn part_name(plan: &Plan, level: usize) -> &str {
    plan.part_names.get(level).map_or("", String::as_str)
}

/// A sequence feature of one record, from its `FeatureLists` map entry.
fn decode_list(plan: &Plan, entry: Option<Wire<'_>>, column: &mut Column) -> Result<(), Problem> {
    let mut steps = 0usize;
    if let Some(mut entry) = entry {
        // Every value field (field 2) of the entry is a partial `FeatureList`; merged,
        // their `feature` fields (field 1) are the steps, in order.
        while !entry.done() {
            let Some(mut list) = entry.next_len_field(2).map_err(Problem::Wire)? else {
                continue;
            };
            while !list.done() {
                let Some(step) = list.next_len_field(1).map_err(Problem::Wire)? else {
                    continue;
                };
                decode_step(plan, step, steps, column)?;
                steps += 1;
            }
        }
    }
    let total_steps = column
        .row_splits
        .first()
        .and_then(|s| s.last())
        .copied()
        .unwrap_or(0)
        + steps;
    if let Some(splits) = column.row_splits.first_mut() {
        splits.push(total_steps);
    }
    Ok(())
}

fn decode_step(
    plan: &Plan,
    step: Wire<'_>,
    index: usize,
    column: &mut Column,
) -> Result<(), Problem> {
    let found = resolve_feature(step).map_err(Problem::Wire)?;
    let count = append_feature(plan, found, Kinds::of_feature(step), &mut column.values)
        .map_err(|e| e.in_step(index))?
        .unwrap_or(0);
    match plan.shape {
        Shape::FixedSequence if count != plan.len => Err(text(format!(
            "step {index} has {count} values, expected {}",
            plan.len
        ))),
        Shape::VarSequence => {
            let total = column.values.len();
            if let Some(splits) = column.row_splits.get_mut(1) {
                splits.push(total);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint_of(bytes: &[u8]) -> WireResult<u64> {
        Wire::new(bytes).varint()
    }

    #[test]
    fn varints() {
        assert_eq!(varint_of(&[0x00]).unwrap(), 0);
        assert_eq!(varint_of(&[0x96, 0x01]).unwrap(), 150);
        assert_eq!(varint_of(&[0x80, 0x80, 0x01]).unwrap(), 1 << 14);
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(varint_of(&max).unwrap(), u64::MAX);
        let mut over = max;
        over[9] = 0x02;
        assert_eq!(
            varint_of(&over).unwrap_err().what,
            "varint longer than 64 bits"
        );
        assert_eq!(
            varint_of(&[0x80; 11]).unwrap_err().what,
            "varint longer than 64 bits"
        );
        assert_eq!(
            varint_of(&[0x80, 0x80]).unwrap_err().what,
            "truncated varint"
        );
        assert_eq!(varint_of(&[]).unwrap_err().what, "truncated varint");
    }

    #[test]
    fn groups_are_skipped_and_checked() {
        // Field 3 group holding field 1 varint 7, then the end-group tag.
        let mut group = Wire::new(&[0x08, 0x07, 0x1c]);
        assert!(group.skip(3, START_GROUP).is_ok());
        assert!(group.done());
        let mut mismatched = Wire::new(&[0x08, 0x07, 0x24]);
        assert_eq!(
            mismatched.skip(3, START_GROUP).unwrap_err().what,
            "mismatched end-group tag"
        );
        let mut open = Wire::new(&[0x08, 0x07]);
        assert_eq!(
            open.skip(3, START_GROUP).unwrap_err().what,
            "unterminated group"
        );
        // Deep nesting is bounded, not a stack overflow.
        let deep: Vec<u8> = std::iter::repeat_n(0x1b, 10_000).collect();
        assert_eq!(
            Wire::new(&deep).skip(3, START_GROUP).unwrap_err().what,
            "groups nested too deeply"
        );
        assert_eq!(
            Wire::new(&[]).skip(1, 7).unwrap_err().what,
            "invalid wire type"
        );
    }

    #[test]
    fn name_lookup_compares_every_byte() {
        let names = [
            "",
            "a",
            "abcdefgh",
            "abcdefghi",
            "abcdefghijklmnop",
            "abcdefghijklmnopq",
            "abcdefghXjklmnopq",
        ];
        let lookup = Lookup::new(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.as_bytes().into(), i))
                .collect(),
        );
        for (i, n) in names.iter().enumerate() {
            assert_eq!(lookup.get(n.as_bytes()), Some(i), "{n:?}");
        }
        for miss in [
            "b",
            "abcdefgi",
            "abcdefghj",
            "abcdefghijklmnoq",
            "abcdefghijklmnopr",
            "abcdefghYjklmnopq",
            "a\0",
        ] {
            assert_eq!(lookup.get(miss.as_bytes()), None, "{miss:?}");
        }
    }

    /// More than 8 features use the hash lookup; the result is the same.
    #[test]
    fn many_features_use_the_hash_lookup() {
        use crate::example::proto::{self, feature::Kind};
        use prost::Message;

        let names: Vec<String> = (0..12).map(|i| format!("f{i}")).collect();
        let texts: Vec<String> = names.iter().map(|n| format!("{n}:int64")).collect();
        let mut parser = BatchParser::new(Schema::from_feature_texts(&texts).unwrap()).unwrap();
        assert!(matches!(parser.context, Lookup::Hash(_)));
        let example = crate::example::Example {
            features: Some(proto::Features {
                feature: names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        let list = proto::Int64List {
                            value: vec![i as i64],
                        };
                        (
                            n.clone(),
                            proto::Feature {
                                kind: Some(Kind::Int64List(list)),
                            },
                        )
                    })
                    .collect(),
            }),
        };
        let batch = parser.parse_one(&example.encode_to_vec()).unwrap();
        for (i, column) in batch.columns.iter().enumerate() {
            assert_eq!(column.as_i64(), Some(&[i as i64][..]));
        }
    }
}
