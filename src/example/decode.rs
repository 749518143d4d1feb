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

/// The most values reserved per column before parsing (more grow on demand).
const MAX_RESERVE: usize = 1 << 24;

/// Nesting limit for skipped groups (protobuf's default recursion limit).
const MAX_GROUP_DEPTH: u32 = 100;

/// A wire-format problem. `at` is the address of the offending byte until
/// [`WireError::offset_in`] turns it into an offset into the record.
#[derive(Debug, Clone, Copy)]
struct WireError {
    at: usize,
    what: &'static str,
}

impl WireError {
    /// This error with `at` as an offset into `record` (which holds it).
    fn offset_in(self, record: &[u8]) -> WireError {
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

type WireResult<T> = Result<T, WireError>;

/// A cursor over one message: `buf` is what is left of it. Sub-messages are
/// sub-slices of the record, so positions are recovered from addresses.
///
/// Two words, so cursors stay in registers on the hot path.
#[derive(Clone, Copy)]
struct Wire<'a> {
    buf: &'a [u8],
}

impl<'a> Wire<'a> {
    #[inline(always)]
    fn new(buf: &'a [u8]) -> Wire<'a> {
        Wire { buf }
    }

    #[inline(always)]
    fn done(&self) -> bool {
        self.buf.is_empty()
    }

    #[inline]
    fn err(&self, what: &'static str) -> WireError {
        WireError {
            at: self.buf.as_ptr() as usize,
            what,
        }
    }

    /// This cursor's position as (offset, len) within `record`, which holds it.
    #[inline(always)]
    fn span_in(&self, record: &[u8]) -> (usize, usize) {
        (
            (self.buf.as_ptr() as usize).wrapping_sub(record.as_ptr() as usize),
            self.buf.len(),
        )
    }

    #[inline(always)]
    fn varint(&mut self) -> WireResult<u64> {
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
    fn tag(&mut self) -> WireResult<(u64, u8)> {
        let start = *self;
        let tag = self.varint()?;
        let field = tag >> 3;
        if field == 0 {
            return Err(start.err("field number 0"));
        }
        Ok((field, (tag & 7) as u8))
    }

    /// A length-delimited field's contents, as a cursor.
    #[inline(always)]
    fn sub(&mut self) -> WireResult<Wire<'a>> {
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
    fn bytes(&self) -> &'a [u8] {
        self.buf
    }

    #[inline]
    fn fixed<const N: usize>(&mut self) -> WireResult<[u8; N]> {
        match self.buf.split_first_chunk::<N>() {
            Some((b, rest)) => {
                self.buf = rest;
                Ok(*b)
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
    fn next_len_field(&mut self, want: u64) -> WireResult<Option<Wire<'a>>> {
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
    shape: Shape,
    /// Values per record (`Fixed`) or step (`FixedSequence`); 0 for var-length.
    len: usize,
    default: Option<Fill>,
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
            // Validated to lie in 0..=255.
            (DType::Uint8, Value::Int64(v)) => Fill::Uint8(v.iter().map(|&x| x as u8).collect()),
            (_, Value::Int64(v)) => Fill::Int64(v.clone()),
            (_, Value::Float32(v)) => Fill::Float32(v.clone()),
            (_, Value::Bytes(v)) => Fill::Bytes(v.clone()),
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
    /// Per record: the byte range of each feature's last map entry.
    slots: Vec<Option<Slot>>,
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
            let record = record.as_ref();
            self.parse_record(record, &mut batch.columns)
                .map_err(|fail| self.error(fail, index, record))?;
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
            let record = record.as_ref();
            match self.parse_record(record, &mut batch.columns) {
                Ok(()) => batch.num_rows += 1,
                Err(fail) => {
                    batch.truncate_rows(batch.num_rows);
                    on_bad(index, self.error(fail, index, record));
                }
            }
        }
    }

    fn error(&self, fail: Fail, index: usize, record: &[u8]) -> ParseError {
        match fail {
            Fail::Wire(e) => ParseError::Malformed {
                record: index,
                reason: e.describe(record),
            },
            Fail::Feature(feature, problem) => ParseError::Feature {
                record: index,
                feature: self.schema.features[feature].name.clone(),
                reason: problem.describe(record),
            },
        }
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
            let slot = self.slots[index];
            let result = match plan.shape {
                Shape::Fixed | Shape::Var => decode_feature(plan, record, slot, column),
                Shape::FixedSequence | Shape::VarSequence => {
                    decode_list(plan, slot.map(|s| s.entry(record)), column)
                }
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

/// Why a feature could not be decoded.
enum Problem {
    Wire(WireError),
    Text(String),
}

impl Problem {
    fn in_step(self, index: usize) -> Problem {
        match self {
            Problem::Text(t) => Problem::Text(format!("step {index}: {t}")),
            wire => wire,
        }
    }

    fn describe(self, record: &[u8]) -> String {
        match self {
            Problem::Wire(e) => format!("malformed protobuf: {}", e.describe(record)),
            Problem::Text(t) => t,
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
    match (plan.dtype, values) {
        (DType::Uint8, _) => {
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
        (_, Values::Uint8(_)) => Ok(0),
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
    if plan.dtype == DType::Uint8 {
        if let (1, Values::Uint8(v)) = (count, values) {
            if raw.len() != plan.len {
                return Err(text(format!(
                    "uint8 value has {} bytes, expected {} (the shape's size)",
                    raw.len(),
                    plan.len
                )));
            }
            v.extend_from_slice(raw);
            return Ok(plan.len);
        }
        if count == 0 {
            return Err(text(format!(
                "present but empty list, expected one bytes value of {} bytes",
                plan.len
            )));
        }
        return Err(text(format!(
            "uint8 needs exactly one bytes value of {} bytes, found {count} values",
            plan.len
        )));
    }
    Ok(count)
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
                fill_default(fill, plan.len, &mut column.values);
                plan.len
            }
            None => {
                return Err(text(format!(
                    "missing ({}) and the spec has no default",
                    if slot.is_some() {
                        "a Feature with no list set"
                    } else {
                        "no such key"
                    }
                )));
            }
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
