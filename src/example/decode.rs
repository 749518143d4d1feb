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
//! * A list of the wrong kind is an error naming the expected and the found kind.
//! * Sequences (schemas with a sequence feature parse `SequenceExample`s): the other
//!   features come from `context`, the sequence ones from `feature_lists`; a missing
//!   feature list is zero steps (TensorFlow's `allow_missing=True`). Each step of a
//!   fixed sequence must hold exactly `product(shape)` values; steps of a var
//!   sequence hold any number (a kind-less step holds none).
//!
//! Errors carry the record's index within the batch; malformed protobuf is
//! reported with the byte offset inside the record and never panics. After an
//! error the batch handed to `parse_into` holds partial data: parse into it again
//! (which starts from empty) or drop it.

use std::collections::HashMap;

use crate::batch::{Batch, Column, Values};
use crate::example::spec::{DType, FeatureSpec, Layout, Schema, SchemaError, Value};

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

impl ParseError {
    /// The index of the failing record within the batch.
    pub fn record(&self) -> usize {
        match self {
            ParseError::Malformed { record, .. } | ParseError::Feature { record, .. } => *record,
        }
    }

    /// The feature involved, if the error is about one.
    pub fn feature(&self) -> Option<&str> {
        match self {
            ParseError::Malformed { .. } => None,
            ParseError::Feature { feature, .. } => Some(feature),
        }
    }

    /// The same error with `offset` added to its record index (for callers that
    /// parse a stream in batches and want the index within the stream).
    pub fn offset_record(mut self, offset: usize) -> ParseError {
        match &mut self {
            ParseError::Malformed { record, .. } | ParseError::Feature { record, .. } => {
                *record += offset
            }
        }
        self
    }
}

// ---------------------------------------------------------------------------
// Wire format

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// Nesting limit for skipped groups (protobuf's default recursion limit).
const MAX_GROUP_DEPTH: u32 = 100;

/// A wire-format problem at a byte offset of the record.
#[derive(Debug, Clone, Copy)]
struct WireError {
    at: usize,
    what: &'static str,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.what, self.at)
    }
}

type WireResult<T> = Result<T, WireError>;

/// A cursor over one message: `data[pos..end]`, where `data` is the whole record,
/// so every position is an offset into the record.
#[derive(Clone, Copy)]
struct Wire<'a> {
    data: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Wire<'a> {
    fn new(data: &'a [u8]) -> Wire<'a> {
        Wire {
            data,
            pos: 0,
            end: data.len(),
        }
    }

    #[inline]
    fn at(data: &'a [u8], start: usize, end: usize) -> Wire<'a> {
        Wire {
            data,
            pos: start,
            end,
        }
    }

    #[inline]
    fn done(&self) -> bool {
        self.pos >= self.end
    }

    #[inline]
    fn err(&self, what: &'static str) -> WireError {
        WireError { at: self.pos, what }
    }

    #[inline]
    fn varint(&mut self) -> WireResult<u64> {
        // One-byte varints (tags, short lengths) dominate.
        if let Some(&b) = self.data[..self.end].get(self.pos)
            && b < 0x80
        {
            self.pos += 1;
            return Ok(u64::from(b));
        }
        self.varint_slow()
    }

    #[cold]
    fn varint_slow(&mut self) -> WireResult<u64> {
        let start = self.pos;
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&b) = self.data[..self.end].get(self.pos) else {
                self.pos = start;
                return Err(self.err("truncated varint"));
            };
            self.pos += 1;
            if i == 9 && b > 1 {
                self.pos = start;
                return Err(self.err("varint longer than 64 bits"));
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(value);
            }
        }
        self.pos = start;
        Err(self.err("varint longer than 10 bytes"))
    }

    /// The next field's number and wire type.
    #[inline]
    fn tag(&mut self) -> WireResult<(u64, u8)> {
        let start = self.pos;
        let tag = self.varint()?;
        let field = tag >> 3;
        if field == 0 {
            self.pos = start;
            return Err(self.err("field number 0"));
        }
        Ok((field, (tag & 7) as u8))
    }

    /// A length-delimited field's contents, as a cursor.
    #[inline]
    fn sub(&mut self) -> WireResult<Wire<'a>> {
        let start = self.pos;
        let len = self.varint()?;
        if len > (self.end - self.pos) as u64 {
            self.pos = start;
            return Err(self.err("length-delimited field runs past the end of its message"));
        }
        let sub = Wire::at(self.data, self.pos, self.pos + len as usize);
        self.pos = sub.end;
        Ok(sub)
    }

    #[inline]
    fn bytes(&self) -> &'a [u8] {
        &self.data[self.pos..self.end]
    }

    #[inline]
    fn fixed<const N: usize>(&mut self) -> WireResult<[u8; N]> {
        match self.data[..self.end].get(self.pos..self.pos + N) {
            Some(b) => {
                self.pos += N;
                let mut out = [0; N];
                out.copy_from_slice(b);
                Ok(out)
            }
            None => Err(self.err("truncated fixed-width field")),
        }
    }

    /// Skips the value of a field of wire type `wire_type` whose tag was just read.
    fn skip(&mut self, field: u64, wire_type: u8) -> WireResult<()> {
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
                    let start = self.pos;
                    let (f, wt) = self.tag()?;
                    if wt == END_GROUP {
                        if f != field {
                            self.pos = start;
                            return Err(self.err("mismatched end-group tag"));
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
    #[inline]
    fn next_len_field(&mut self, want: u64) -> WireResult<Option<Wire<'a>>> {
        let start = self.pos;
        let (field, wt) = self.tag()?;
        if field == want {
            if wt != LEN {
                self.pos = start;
                return Err(self.err("wrong wire type for a message field"));
            }
            return self.sub().map(Some);
        }
        self.skip(field, wt)?;
        Ok(None)
    }
}

// ---------------------------------------------------------------------------
// Feature kinds

const KIND_BYTES: u64 = 1;
const KIND_FLOAT: u64 = 2;
const KIND_INT64: u64 = 3;

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
        DType::Bytes | DType::Uint8 => KIND_BYTES,
    }
}

/// The `kind` fields (`bytes_list`/`float_list`/`int64_list`) of one `Feature`, or of
/// every `Feature` value of a map entry (which protobuf merges into one), in order.
struct Kinds<'a> {
    /// The map entry whose value fields (field 2) are still to be visited.
    entry: Option<Wire<'a>>,
    /// The `Feature` message being walked.
    feature: Option<Wire<'a>>,
}

impl<'a> Kinds<'a> {
    fn of_entry(entry: Wire<'a>) -> Kinds<'a> {
        Kinds {
            entry: Some(entry),
            feature: None,
        }
    }

    fn of_feature(feature: Wire<'a>) -> Kinds<'a> {
        Kinds {
            entry: None,
            feature: Some(feature),
        }
    }

    /// The next list: its kind and a cursor over the list message.
    #[inline]
    fn next(&mut self) -> WireResult<Option<(u64, Wire<'a>)>> {
        loop {
            if let Some(feature) = &mut self.feature {
                if !feature.done() {
                    let start = feature.pos;
                    let (field, wt) = feature.tag()?;
                    if (KIND_BYTES..=KIND_INT64).contains(&field) {
                        if wt != LEN {
                            feature.pos = start;
                            return Err(feature.err("wrong wire type for a Feature list"));
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
}

/// A fixed-length feature's default, expanded to `product(shape)` values.
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
    shape: Shape,
    /// Values per record (`Fixed`) or step (`FixedSequence`); 0 for var-length.
    len: usize,
    default: Option<Fill>,
}

fn expand<T: Clone>(values: &[T], len: usize) -> Vec<T> {
    if values.len() == 1 {
        vec![values[0].clone(); len]
    } else {
        values.to_vec()
    }
}

impl Plan {
    fn new(spec: &FeatureSpec) -> Plan {
        let shape = match spec.layout {
            Layout::Fixed(_) => Shape::Fixed,
            Layout::Var => Shape::Var,
            Layout::FixedSequence(_) => Shape::FixedSequence,
            Layout::VarSequence => Shape::VarSequence,
        };
        let len = spec.fixed_len().unwrap_or(0);
        let default = spec.default.as_ref().map(|d| match (spec.dtype, d) {
            (DType::Uint8, Value::Int64(v)) => {
                // Validated to lie in 0..=255.
                Fill::Uint8(expand(v, len).into_iter().map(|x| x as u8).collect())
            }
            (_, Value::Int64(v)) => Fill::Int64(expand(v, len)),
            (_, Value::Float32(v)) => Fill::Float32(expand(v, len)),
            (_, Value::Bytes(v)) => Fill::Bytes(expand(v, len)),
        });
        Plan {
            dtype: spec.dtype,
            shape,
            len,
            default,
        }
    }
}

/// Schema feature names -> index, matched on key bytes without allocating.
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
    Feature(usize, String),
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
    /// Per record: the byte range of each feature's last map entry.
    slots: Vec<Option<(usize, usize)>>,
}

impl BatchParser {
    /// A parser for `schema`; checks the schema first.
    pub fn new(schema: Schema) -> Result<BatchParser, SchemaError> {
        schema.validate()?;
        let plans = schema.features.iter().map(Plan::new).collect();
        let names = |sequence: bool| {
            schema
                .features
                .iter()
                .enumerate()
                .filter(|(_, f)| f.layout.is_sequence() == sequence)
                .map(|(i, f)| (f.name.as_bytes().into(), i))
                .collect::<Vec<_>>()
        };
        Ok(BatchParser {
            context: Lookup::new(names(false)),
            lists: Lookup::new(names(true)),
            sequence: schema.is_sequence(),
            slots: vec![None; schema.features.len()],
            plans,
            schema,
        })
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
            self.parse_record(record.as_ref(), &mut batch.columns)
                .map_err(|fail| match fail {
                    Fail::Wire(e) => ParseError::Malformed {
                        record: index,
                        reason: e.to_string(),
                    },
                    Fail::Feature(feature, reason) => ParseError::Feature {
                        record: index,
                        feature: self.schema.features[feature].name.clone(),
                        reason,
                    },
                })?;
            batch.num_rows = index + 1;
        }
        Ok(())
    }

    /// Empties `batch` for `rows` records, keeping (and growing) its buffers.
    fn reset(&self, batch: &mut Batch, rows: usize) {
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
            let fixed_values = if plan.shape == Shape::Fixed {
                rows * plan.len
            } else {
                0
            };
            match &mut column.values {
                Values::Int64(v) => reset_vec(v, fixed_values),
                Values::Float32(v) => reset_vec(v, fixed_values),
                Values::Uint8(v) => reset_vec(v, fixed_values),
                Values::Bytes { data, offsets } => {
                    data.clear();
                    reset_vec(offsets, fixed_values + 1);
                    offsets.push(0);
                }
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
            let start = message.pos;
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
                message.pos = start;
                return Err(message.err("wrong wire type for a message field").into());
            }
            let mut map = message.sub()?;
            while !map.done() {
                let Some(entry) = map.next_len_field(1)? else {
                    continue;
                };
                if let Some(index) = lookup.get(entry_key(entry)?) {
                    self.slots[index] = Some((entry.pos, entry.end));
                }
            }
        }
        for (index, (plan, column)) in self.plans.iter().zip(columns.iter_mut()).enumerate() {
            let entry = self.slots[index].map(|(start, end)| Wire::at(record, start, end));
            let result = match plan.shape {
                Shape::Fixed | Shape::Var => decode_feature(plan, entry, column),
                Shape::FixedSequence | Shape::VarSequence => decode_list(plan, entry, column),
            };
            result.map_err(|reason| Fail::Feature(index, reason))?;
        }
        Ok(())
    }
}

fn reset_vec<T>(v: &mut Vec<T>, capacity: usize) {
    v.clear();
    v.reserve(capacity);
}

/// A map entry's key (field 1; the last one wins; empty when absent).
#[inline]
fn entry_key(mut entry: Wire<'_>) -> WireResult<&[u8]> {
    let mut key: &[u8] = &[];
    while !entry.done() {
        if let Some(k) = entry.next_len_field(1)? {
            key = k.bytes();
        }
    }
    Ok(key)
}

fn empty_values(dtype: DType) -> Values {
    match dtype {
        DType::Int64 => Values::Int64(Vec::new()),
        DType::Float32 => Values::Float32(Vec::new()),
        DType::Uint8 => Values::Uint8(Vec::new()),
        DType::Bytes => Values::Bytes {
            data: Vec::new(),
            offsets: vec![0],
        },
    }
}

fn ragged_levels(layout: &Layout) -> usize {
    match layout {
        Layout::Fixed(_) => 0,
        Layout::Var | Layout::FixedSequence(_) => 1,
        Layout::VarSequence => 2,
    }
}

/// An empty column for `spec`, in the layout `src/batch.rs` documents.
fn empty_column(spec: &FeatureSpec) -> Column {
    Column {
        name: spec.name.clone(),
        values: empty_values(spec.dtype),
        row_splits: vec![vec![0]; ragged_levels(&spec.layout)],
        inner_shape: spec.layout.fixed_shape().unwrap_or(&[]).to_vec(),
    }
}

fn column_fits(column: &Column, spec: &FeatureSpec) -> bool {
    let dtype_fits = matches!(
        (&column.values, spec.dtype),
        (Values::Int64(_), DType::Int64)
            | (Values::Float32(_), DType::Float32)
            | (Values::Uint8(_), DType::Uint8)
            | (Values::Bytes { .. }, DType::Bytes)
    );
    dtype_fits
        && column.name == spec.name
        && column.row_splits.len() == ragged_levels(&spec.layout)
        && column.inner_shape == spec.layout.fixed_shape().unwrap_or(&[])
}

fn malformed(e: WireError) -> String {
    format!("malformed protobuf: {e}")
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
) -> Result<usize, String> {
    let mut index = 0;
    let mut count = 0;
    // For uint8: the single bytes value (its count is checked after merging).
    let mut raw: Option<&[u8]> = None;
    while let Some((_, list)) = kinds.next().map_err(malformed)? {
        index += 1;
        if index <= skip {
            continue;
        }
        count += match (plan.dtype, &mut *values) {
            (DType::Uint8, _) => {
                let mut n = 0;
                let mut list = list;
                while !list.done() {
                    if let Some(value) = list.next_len_field(1).map_err(malformed)? {
                        raw = Some(value.bytes());
                        n += 1;
                    }
                }
                n
            }
            (_, Values::Int64(v)) => append_int64(list, v).map_err(malformed)?,
            (_, Values::Float32(v)) => append_float(list, v).map_err(malformed)?,
            (_, Values::Bytes { data, offsets }) => {
                append_bytes(list, data, offsets).map_err(malformed)?
            }
            (_, Values::Uint8(_)) => 0,
        };
    }
    if plan.dtype == DType::Uint8 {
        if let (1, Some(raw), Values::Uint8(v)) = (count, raw, values) {
            if raw.len() != plan.len {
                return Err(format!(
                    "uint8 value has {} bytes, expected {} (the shape's size)",
                    raw.len(),
                    plan.len
                ));
            }
            v.extend_from_slice(raw);
            return Ok(plan.len);
        }
        if count == 0 {
            return Err(format!(
                "present but empty list, expected one bytes value of {} bytes",
                plan.len
            ));
        }
        return Err(format!(
            "uint8 needs exactly one bytes value of {} bytes, found {count} values",
            plan.len
        ));
    }
    Ok(count)
}

#[inline]
fn append_int64(mut list: Wire<'_>, out: &mut Vec<i64>) -> WireResult<usize> {
    let before = out.len();
    while !list.done() {
        let start = list.pos;
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
                list.pos = start;
                return Err(list.err("wrong wire type for int64_list values"));
            }
            _ => list.skip(field, wt)?,
        }
    }
    Ok(out.len() - before)
}

#[inline]
fn append_float(mut list: Wire<'_>, out: &mut Vec<f32>) -> WireResult<usize> {
    let before = out.len();
    while !list.done() {
        let start = list.pos;
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
                list.pos = start;
                return Err(list.err("wrong wire type for float_list values"));
            }
            _ => list.skip(field, wt)?,
        }
    }
    Ok(out.len() - before)
}

#[inline]
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

fn fill_default(fill: &Fill, values: &mut Values) {
    match (fill, values) {
        (Fill::Int64(d), Values::Int64(v)) => v.extend_from_slice(d),
        (Fill::Float32(d), Values::Float32(v)) => v.extend_from_slice(d),
        (Fill::Uint8(d), Values::Uint8(v)) => v.extend_from_slice(d),
        (Fill::Bytes(d), Values::Bytes { data, offsets }) => {
            for b in d {
                data.extend_from_slice(b);
                offsets.push(data.len());
            }
        }
        // `column_fits` and `Plan::new` keep fill and column types equal.
        _ => {}
    }
}

/// A fixed-length or var-length feature of one record, from its map entry.
#[inline]
fn decode_feature(plan: &Plan, entry: Option<Wire<'_>>, column: &mut Column) -> Result<(), String> {
    let resolved = match entry {
        Some(entry) => Kinds::of_entry(entry)
            .resolve()
            .map_err(malformed)?
            .map(|found| (found, entry)),
        None => None,
    };
    let count = match resolved {
        Some(((kind, skip), entry)) => {
            if kind != dtype_kind(plan.dtype) {
                return Err(wrong_kind(plan.dtype, kind));
            }
            append_lists(plan, Kinds::of_entry(entry), skip, &mut column.values)?
        }
        None if plan.shape == Shape::Fixed => match &plan.default {
            Some(fill) => {
                fill_default(fill, &mut column.values);
                plan.len
            }
            None => {
                return Err(format!(
                    "missing ({}) and the spec has no default",
                    if entry.is_some() {
                        "a Feature with no list set"
                    } else {
                        "no such key"
                    }
                ));
            }
        },
        None => 0,
    };
    match plan.shape {
        Shape::Fixed if count != plan.len => Err(if count == 0 {
            format!(
                "present but empty list, expected {} values (TensorFlow rejects this even with a default)",
                plan.len
            )
        } else {
            format!("has {count} values, expected {}", plan.len)
        }),
        Shape::Fixed => Ok(()),
        _ => {
            let total = column.values.len();
            if let Some(splits) = column.row_splits.first_mut() {
                splits.push(total);
            }
            Ok(())
        }
    }
}

/// A sequence feature of one record, from its `FeatureLists` map entry.
fn decode_list(plan: &Plan, entry: Option<Wire<'_>>, column: &mut Column) -> Result<(), String> {
    let mut steps = 0usize;
    if let Some(mut entry) = entry {
        // Every value field (field 2) of the entry is a partial `FeatureList`; merged,
        // their `feature` fields (field 1) are the steps, in order.
        while !entry.done() {
            let Some(mut list) = entry.next_len_field(2).map_err(malformed)? else {
                continue;
            };
            while !list.done() {
                let Some(step) = list.next_len_field(1).map_err(malformed)? else {
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
) -> Result<(), String> {
    let count = match Kinds::of_feature(step).resolve().map_err(malformed)? {
        Some((kind, skip)) => {
            if kind != dtype_kind(plan.dtype) {
                return Err(format!("step {index}: {}", wrong_kind(plan.dtype, kind)));
            }
            append_lists(plan, Kinds::of_feature(step), skip, &mut column.values)
                .map_err(|e| format!("step {index}: {e}"))?
        }
        None => 0,
    };
    match plan.shape {
        Shape::FixedSequence if count != plan.len => Err(format!(
            "step {index} has {count} values, expected {}",
            plan.len
        )),
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
