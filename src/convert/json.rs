//! JSON Lines, or one JSON array of objects, to Examples (detected by the
//! first non-blank character: `[` is an array).
//!
//! Values: numbers (int64 if every value of the key is an integer, else
//! float32), strings (bytes), booleans (int64 0/1), `null` (the feature is left
//! out), arrays of numbers or of strings (lists: the feature becomes
//! var-length). Nested objects flatten to `a.b` keys.
//!
//! Parsing is `serde_json`'s: a record is read as its keys and raw values
//! ([`RawValue`], slices of the input), so every value keeps its byte offset
//! and errors name line and column; a number is kept as its exact text, so
//! the number rules (int64 or float32 by the whole column, integers beyond
//! int64 kept as text with a warning, values beyond float32 an error) are
//! decided on the digits, never on a lossy f64. Strings are decoded with
//! serde_json's validation: a lone surrogate (`"\ud800"`) is an error, not
//! U+FFFD. A JSON Lines record is one line (the format's rule), so a broken
//! line is reported on that line and skipping resumes on the next.
//!
//! The first pass is sequential: it finds the records, judges each against the
//! types established so far (the first value of a key fixes it as numeric or
//! text; a later value of the other kind contradicts it), and infers. The
//! second pass re-parses the good records in parallel and encodes them.
//!
//! With a fixed schema (`--schema`), the types, defaults and label vocabulary
//! are the schema's: a key outside it, a value that does not fit, a missing
//! value without a default and an unseen label are bad rows.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::driver::{Scanned, Source};
use super::encode::ExampleEncoder;
use super::error::{ConvertError, ConvertOption, SourceLocation, quote};
use super::infer::{self, Column, Kind, parse_f32, parse_i64};
use super::output::{BadRows, Chunk, Ctx, Input};
use super::{FixedSchema, Missing, Phase};
use crate::example::{DType, Layout as SpecLayout};

/// Options of the JSON converter.
#[derive(Debug, Clone, Default)]
pub struct JsonOptions {
    /// Key types that override inference (`--column NAME:DTYPE`).
    pub columns: Vec<(String, DType)>,
    /// The label key (`--label`).
    pub label: Option<String>,
    /// What a key missing in some records becomes in the schema.
    pub missing: Missing,
    /// Convert with this schema instead of inferring one (`--schema`): the
    /// same types, defaults and label vocabulary. By default `None`.
    pub schema: Option<FixedSchema>,
}

impl JsonOptions {
    /// Parses `--column NAME:DTYPE` texts into `columns`.
    pub fn with_column_texts<S: AsRef<str>>(mut self, texts: &[S]) -> Result<Self, ConvertError> {
        for t in texts {
            self.columns.push(infer::parse_override(t.as_ref())?);
        }
        Ok(self)
    }
}

/// Records per encoding task.
const RECORDS_PER_TASK: usize = 1024;
/// Objects nested deeper than this are refused: flattening recurses once per
/// level (and re-reads the level's text), so hostile nesting must stop early.
const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone)]
enum Scalar<'a> {
    /// A number, as its text.
    Num(&'a [u8]),
    Str(Cow<'a, [u8]>),
    Bool(bool),
}

impl Scalar<'_> {
    fn kind(&self) -> Kind {
        match self {
            Scalar::Num(t) => {
                if t.iter().any(|&b| matches!(b, b'.' | b'e' | b'E')) {
                    Kind::Float
                } else if parse_i64(t).is_none() {
                    // An integer beyond int64 (an id): kept exactly, as text.
                    Kind::BigInt
                } else {
                    Kind::Int
                }
            }
            Scalar::Bool(_) => Kind::Int,
            Scalar::Str(_) => Kind::Text,
        }
    }

    fn describe(&self) -> String {
        match self {
            Scalar::Num(t) => format!("the number {}", String::from_utf8_lossy(t)),
            Scalar::Str(s) => format!("the string {}", quote(s)),
            Scalar::Bool(b) => format!("the boolean {b}"),
        }
    }
}

#[derive(Debug)]
enum FieldValue<'a> {
    Null,
    One(Scalar<'a>),
    List(Vec<(Scalar<'a>, usize)>),
}

#[derive(Debug)]
struct Field<'a> {
    key: Cow<'a, str>,
    value: FieldValue<'a>,
    /// Byte offset of the value.
    offset: usize,
}

/// A syntax error at a byte offset of the input.
#[derive(Debug)]
struct Syntax {
    offset: usize,
    problem: String,
}

/// A string that borrows from the input when it has no escapes.
struct Text<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Text<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// An object's members in input order (duplicates kept, so they can be
/// reported), each value raw.
struct Members<'de>(Vec<(Cow<'de, str>, &'de RawValue)>);

impl<'de> de::Deserialize<'de> for Members<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object {...}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some((Text(key), value)) = map.next_entry::<Text<'de>, &'de RawValue>()? {
                    out.push((key, value));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// An array's elements, each raw.
struct Elements<'de>(Vec<&'de RawValue>);

impl<'de> de::Deserialize<'de> for Elements<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Elements<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON array [...]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Elements<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(value) = seq.next_element::<&'de RawValue>()? {
                    out.push(value);
                }
                Ok(Elements(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// Reads one complete value of type `T` from `data[start..end]`; a syntax
/// error is located in the whole input. serde_json's own message is kept,
/// without its "at line L column C" (the location says it better), and a
/// lone surrogate gets a message of its own at its escape.
fn parse_at<'a, T: de::Deserialize<'a>>(
    data: &'a [u8],
    start: usize,
    end: usize,
) -> Result<T, Syntax> {
    let slice = &data[start..end];
    let mut de = serde_json::Deserializer::from_slice(slice);
    // Depth is bounded by serde_json's recursion limit (128): hostile nesting
    // is an error, never a stack overflow.
    let value = T::deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    value.map_err(|e| syntax_error(data, start, slice, &e))
}

fn syntax_error(data: &[u8], start: usize, slice: &[u8], e: &serde_json::Error) -> Syntax {
    let at = start + offset_of(slice, e.line(), e.column());
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = text.strip_suffix(&suffix).unwrap_or(&text);
    if message.contains("surrogate") || message.contains("hex escape") {
        let escape = lone_surrogate_before(data, start, at);
        return Syntax {
            offset: escape.unwrap_or(at),
            problem: "JSON string: lone surrogate (half of a UTF-16 pair, not a character; the text would be changed)".into(),
        };
    }
    Syntax {
        offset: at,
        problem: format!("JSON syntax error: {message}"),
    }
}

/// The byte offset in `slice` of serde_json's 1-based line and column (the
/// column counts bytes and points at or just past the offending byte).
fn offset_of(slice: &[u8], line: usize, column: usize) -> usize {
    let mut line_start = 0;
    for _ in 1..line {
        match memchr::memchr(b'\n', &slice[line_start..]) {
            Some(i) => line_start += i + 1,
            None => break,
        }
    }
    (line_start + column.saturating_sub(1)).min(slice.len())
}

/// The last `\uXXXX` escape of a surrogate (D800-DFFF) in `data[start..at]`.
fn lone_surrogate_before(data: &[u8], start: usize, at: usize) -> Option<usize> {
    let window = &data[start..(at + 1).min(data.len())];
    memchr::memmem::rfind_iter(window, b"\\u").find_map(|i| {
        let hex = std::str::from_utf8(window.get(i + 2..i + 6)?).ok()?;
        let code = u32::from_str_radix(hex, 16).ok()?;
        (0xD800..0xE000).contains(&code).then_some(start + i)
    })
}

/// The offset of a raw value (a slice of `data`) in `data`.
fn offset_in(data: &[u8], raw: &RawValue) -> usize {
    (raw.get().as_ptr() as usize).saturating_sub(data.as_ptr() as usize)
}

/// One record at `data[start..end]` (an object), flattened into `fields`.
fn parse_record<'a>(
    data: &'a [u8],
    start: usize,
    end: usize,
    fields: &mut Vec<Field<'a>>,
) -> Result<(), Syntax> {
    let first = data[start..end]
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .map_or(end, |i| start + i);
    if data.get(first) != Some(&b'{') {
        return Err(Syntax {
            offset: first,
            problem: format!(
                "expected a JSON object {{...}} as a record, found {}",
                match data.get(first) {
                    Some(&b) if first < end => format!("{:?}", b as char),
                    _ => "the end of the input".into(),
                }
            ),
        });
    }
    let members: Members<'a> = parse_at(data, start, end)?;
    flatten(data, None, members, fields, 0)
}

fn flatten<'a>(
    data: &'a [u8],
    prefix: Option<&str>,
    members: Members<'a>,
    fields: &mut Vec<Field<'a>>,
    depth: usize,
) -> Result<(), Syntax> {
    for (key, raw) in members.0 {
        let key = match prefix {
            Some(p) => Cow::Owned(format!("{p}.{key}")),
            None => key,
        };
        let at = offset_in(data, raw);
        let end = at + raw.get().len();
        match raw.get().as_bytes().first() {
            Some(b'{') => {
                if depth >= MAX_DEPTH {
                    return Err(Syntax {
                        offset: at,
                        problem: format!("objects nested deeper than {MAX_DEPTH} levels"),
                    });
                }
                let nested: Members<'a> = parse_at(data, at, end)?;
                flatten(data, Some(key.as_ref()), nested, fields, depth + 1)?;
            }
            Some(b'[') => {
                let Elements(items) = parse_at(data, at, end)?;
                let mut list = Vec::with_capacity(items.len());
                for item in items {
                    let item_at = offset_in(data, item);
                    match scalar(data, item)? {
                        Some(s) => list.push((s, item_at)),
                        None => {
                            return Err(Syntax {
                                offset: item_at,
                                problem:
                                    "null inside an array: expected a number, string or boolean"
                                        .into(),
                            });
                        }
                    }
                }
                fields.push(Field {
                    key,
                    value: FieldValue::List(list),
                    offset: at,
                });
            }
            _ => {
                let value = match scalar(data, raw)? {
                    Some(s) => FieldValue::One(s),
                    None => FieldValue::Null,
                };
                fields.push(Field {
                    key,
                    value,
                    offset: at,
                });
            }
        }
    }
    Ok(())
}

/// A scalar value; `None` for null. Objects and arrays are refused here
/// (they may not sit inside arrays).
fn scalar<'a>(data: &'a [u8], raw: &'a RawValue) -> Result<Option<Scalar<'a>>, Syntax> {
    let text = raw.get();
    let at = offset_in(data, raw);
    Ok(Some(match text.as_bytes().first() {
        Some(b'"') => {
            let Text(s) = parse_at(data, at, at + text.len())?;
            Scalar::Str(match s {
                Cow::Borrowed(b) => Cow::Borrowed(b.as_bytes()),
                Cow::Owned(o) => Cow::Owned(o.into_bytes()),
            })
        }
        Some(b't') => Scalar::Bool(true),
        Some(b'f') => Scalar::Bool(false),
        Some(b'n') => return Ok(None),
        Some(b'{' | b'[') => {
            return Err(Syntax {
                offset: at,
                problem: "arrays may hold numbers, strings or booleans, not objects or arrays"
                    .into(),
            });
        }
        // serde_json validated it: a number, kept as its exact text.
        _ => Scalar::Num(text.as_bytes()),
    }))
}

/// How the records of a file are laid out.
enum Layout {
    Lines,
    Array,
}

/// A column's state during the first pass.
#[derive(Debug, Default)]
struct ColState {
    kind: Kind,
    /// Byte offset of the first value, fixing the column as numeric or text.
    first: Option<(usize, bool)>,
    list: bool,
    present: u64,
    labels: BTreeSet<Vec<u8>>,
    /// The first number beyond float32's range (file, byte): an error if
    /// the column is float32.
    beyond_f32: Option<(usize, usize)>,
    /// The first integer beyond int64 (file, byte), for the warning.
    big_int: Option<(usize, usize)>,
}

/// Judges records against the declared (or fixed) types and those seen so far.
struct Judge<'o> {
    path: &'o Path,
    data: &'o [u8],
    declared: &'o HashMap<String, DType>,
    label: Option<&'o str>,
    /// A fixed schema: its keys, layouts, defaults and label vocabulary.
    fixed: Option<&'o Fixed>,
}

/// What a fixed schema (`--schema`) says about the keys.
struct Fixed {
    source: FixedSchema,
    /// Per feature: var-length (lists allowed), may be missing.
    keys: HashMap<String, (bool, bool)>,
    vocab: Option<Vec<Vec<u8>>>,
}

impl Fixed {
    fn new(source: &FixedSchema) -> Result<(Fixed, HashMap<String, DType>), ConvertError> {
        let mut keys = HashMap::new();
        let mut declared = HashMap::new();
        let vocab: Option<Vec<Vec<u8>>> = source
            .vocabulary
            .as_ref()
            .map(|v| v.iter().map(|s| s.as_bytes().to_vec()).collect());
        for f in &source.schema.features {
            let (dtype, may_miss) = source.column(&f.name)?;
            keys.insert(
                f.name.clone(),
                (matches!(f.layout, SpecLayout::Var), may_miss),
            );
            let is_vocab_label =
                vocab.is_some() && source.schema.label.as_deref() == Some(f.name.as_str());
            if !is_vocab_label {
                declared.insert(f.name.clone(), dtype);
            }
        }
        Ok((
            Fixed {
                source: source.clone(),
                keys,
                vocab,
            },
            declared,
        ))
    }
}

impl Judge<'_> {
    fn bad(&self, offset: usize, problem: String) -> ConvertError {
        ConvertError::BadRow {
            location: SourceLocation::in_text(self.path, self.data, offset),
            problem,
        }
    }

    /// Checks one value against the column; `Err` is the problem.
    fn check(
        &self,
        key: &str,
        state: Option<&ColState>,
        value: &Scalar<'_>,
        offset: usize,
    ) -> Result<(), ConvertError> {
        let kind = value.kind();
        if let Some(vocab) = self.fixed.and_then(|f| f.vocab.as_deref())
            && self.label == Some(key)
        {
            let known = match value {
                Scalar::Str(s) => vocab.binary_search_by(|v| v.as_slice().cmp(s)).is_ok(),
                _ => false,
            };
            if !known {
                return Err(self.bad(
                    offset,
                    format!(
                        "label {} is not in the schema's vocabulary of {} classes",
                        value.describe(),
                        vocab.len()
                    ),
                ));
            }
            return Ok(());
        }
        if let Some(&dtype) = self.declared.get(key) {
            let ok = match dtype {
                DType::Int64 => kind == Kind::Int,
                DType::Float32 => kind <= Kind::BigInt,
                // Numbers keep their exact text in a bytes key (as inference
                // does for integers beyond int64), booleans their name.
                _ => true,
            };
            if ok
                && dtype == DType::Float32
                && let Scalar::Num(t) = value
                && infer::beyond_f32(t)
            {
                return Err(self.bad(offset, infer::beyond_f32_problem(t)));
            }
            if !ok {
                return Err(self.bad(
                    offset,
                    format!(
                        "{} in key {key:?}, which is declared {}: expected {}, or null",
                        value.describe(),
                        infer::dtype_name(dtype),
                        match dtype {
                            DType::Int64 => "an integer or a boolean",
                            DType::Float32 => "a number or a boolean",
                            _ => "a string",
                        }
                    ),
                ));
            }
            return Ok(());
        }
        if let Some(ColState {
            first: Some((at, numeric)),
            ..
        }) = state
            && *numeric != (kind != Kind::Text)
        {
            let first = SourceLocation::in_text(self.path, self.data, *at);
            return Err(self.bad(
                offset,
                format!(
                    "{} contradicts key {key:?}, which holds {} (first at line {}, column {}): expected {}, or null",
                    value.describe(),
                    if *numeric { "numbers" } else { "strings" },
                    first.line.unwrap_or(0),
                    first.column.unwrap_or(0),
                    if *numeric { "a number or a boolean" } else { "a string" },
                ),
            ));
        }
        Ok(())
    }

    /// The fixed schema's rules for one field: a known key, a list only
    /// where the feature is var-length.
    fn check_fixed(&self, field: &Field<'_>) -> Result<(), ConvertError> {
        let Some(fixed) = self.fixed else {
            return Ok(());
        };
        let key: &str = &field.key;
        match fixed.keys.get(key) {
            None => Err(self.bad(
                field.offset,
                format!(
                    "key {key:?} is not in the schema {}",
                    fixed.source.path.display()
                ),
            )),
            Some((false, _)) if matches!(field.value, FieldValue::List(_)) => Err(self.bad(
                field.offset,
                format!("a list in key {key:?}, which the schema has as one value"),
            )),
            Some(_) => Ok(()),
        }
    }

    /// A fixed schema's features without a default must be in every record.
    fn check_required(&self, fields: &[Field<'_>], record_at: usize) -> Result<(), ConvertError> {
        let Some(fixed) = self.fixed else {
            return Ok(());
        };
        for f in &fixed.source.schema.features {
            let Some(&(_, may_miss)) = fixed.keys.get(&f.name) else {
                continue;
            };
            let present = fields
                .iter()
                .any(|g| g.key == f.name && !matches!(g.value, FieldValue::Null));
            if !may_miss && !present && self.label != Some(f.name.as_str()) {
                return Err(self.bad(
                    record_at,
                    format!(
                        "this record has no value for key {:?}, and the schema gives it no default",
                        f.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The JSON converter as a [`Source`].
pub(crate) struct JsonSource<'a> {
    inputs: &'a [PathBuf],
    options: &'a JsonOptions,
    files: Vec<Input>,
    /// The good records: (file, start, end).
    records: Vec<(usize, usize, usize)>,
    columns: Vec<Column>,
    index: HashMap<String, usize>,
}

impl<'a> JsonSource<'a> {
    pub(crate) fn new(inputs: &'a [PathBuf], options: &'a JsonOptions) -> Self {
        JsonSource {
            inputs,
            options,
            files: Vec::new(),
            records: Vec::new(),
            columns: Vec::new(),
            index: HashMap::new(),
        }
    }
}

/// What the first pass collects.
#[derive(Default)]
struct Pass {
    order: Vec<String>,
    states: HashMap<String, ColState>,
    records: Vec<(usize, usize, usize)>,
    bad: BadRows,
}

impl Pass {
    /// Takes a good record's values into the column states.
    fn note(&mut self, fi: usize, fields: &[Field<'_>], label: Option<&str>) {
        for f in fields {
            let key: &str = &f.key;
            if !self.states.contains_key(key) {
                self.order.push(key.to_string());
                self.states.insert(key.to_string(), ColState::default());
            }
            let Some(state) = self.states.get_mut(key) else {
                continue;
            };
            let note = |s: &Scalar<'_>, at: usize, state: &mut ColState| {
                let kind = s.kind();
                state.kind = state.kind.join(kind);
                if state.first.is_none() {
                    state.first = Some((at, kind != Kind::Text));
                }
                if let Scalar::Num(t) = s {
                    if kind == Kind::Float && state.beyond_f32.is_none() && infer::beyond_f32(t) {
                        state.beyond_f32 = Some((fi, at));
                    }
                    if kind == Kind::BigInt && state.big_int.is_none() {
                        state.big_int = Some((fi, at));
                    }
                }
                if label == Some(key)
                    && let Scalar::Str(text) = s
                {
                    infer::note_label(&mut state.labels, text.as_ref());
                }
            };
            match &f.value {
                FieldValue::Null => continue,
                FieldValue::One(s) => note(s, f.offset, state),
                FieldValue::List(items) => {
                    state.list = true;
                    for (s, at) in items {
                        note(s, *at, state);
                    }
                }
            }
            state.present += 1;
        }
    }
}

/// The records of one file: `(start, end)` of each line (JSON Lines) or
/// array element, or a syntax error that spoils the whole file.
fn record_spans(path: &Path, data: &[u8]) -> Result<(Layout, Vec<(usize, usize)>), ConvertError> {
    let first = data.iter().position(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|i| data[i] == b'[') {
        let Elements(items) =
            parse_at(data, 0, data.len()).map_err(|s| ConvertError::BadInput {
                location: SourceLocation::in_text(path, data, s.offset),
                problem: s.problem,
            })?;
        let spans = items
            .iter()
            .map(|raw| {
                let at = offset_in(data, raw);
                (at, at + raw.get().len())
            })
            .collect();
        return Ok((Layout::Array, spans));
    }
    let mut spans = Vec::new();
    let mut start = 0;
    while start < data.len() {
        let end = memchr::memchr(b'\n', &data[start..]).map_or(data.len(), |i| start + i);
        if data[start..end].iter().any(|b| !b.is_ascii_whitespace()) {
            spans.push((start, end));
        }
        start = end + 1;
    }
    Ok((Layout::Lines, spans))
}

impl Source for JsonSource<'_> {
    /// A run of good records.
    type Task = (usize, usize);

    fn scan(&mut self, ctx: &Ctx<'_>) -> Result<Scanned<Self::Task>, ConvertError> {
        let (inputs, options) = (self.inputs, self.options);
        self.files = inputs
            .iter()
            .map(|p| Input::load(p))
            .collect::<Result<_, _>>()?;
        let files = &self.files;
        let bytes_total: u64 = files.iter().map(|f| f.len() as u64).sum();
        let skip = ctx.options.skip_bad_rows;
        ctx.begin_phase(Phase::Scanning, bytes_total);
        let (fixed, declared) = match &options.schema {
            Some(schema) => {
                let (fixed, declared) = Fixed::new(schema)?;
                (Some(fixed), declared)
            }
            None => (None, options.columns.iter().cloned().collect()),
        };
        let label = match &options.schema {
            Some(schema) => schema.label_for(options.label.as_deref())?,
            None => options.label.clone(),
        };

        // Pass 1 (sequential): records, bad rows, inference.
        let mut pass = Pass::default();
        let mut fields = Vec::new();
        for (fi, (path, data)) in inputs.iter().zip(files).enumerate() {
            let judge = Judge {
                path,
                data,
                declared: &declared,
                label: label.as_deref(),
                fixed: fixed.as_ref(),
            };
            let (layout, spans) = record_spans(path, data)?;
            let mut last_report = 0;
            for (start, end) in spans {
                ctx.check_cancel()?;
                fields.clear();
                let verdict = match parse_record(data, start, end, &mut fields) {
                    Err(s) => {
                        let location = SourceLocation::in_text(path, data, s.offset);
                        match layout {
                            // A line is a record: skippable on its own.
                            Layout::Lines => Err(ConvertError::BadRow {
                                location,
                                problem: s.problem,
                            }),
                            // In an array, the rest cannot be trusted.
                            Layout::Array => {
                                return Err(ConvertError::BadInput {
                                    location,
                                    problem: s.problem,
                                });
                            }
                        }
                    }
                    Ok(()) => judge_record(&judge, &fields, &pass.states, start),
                };
                if let Err(e) = verdict {
                    if !skip {
                        return Err(e);
                    }
                    pass.bad.push(e);
                    continue;
                }
                pass.note(fi, &fields, label.as_deref());
                pass.records.push((fi, start, end));
                if end - last_report > (4 << 20) {
                    ctx.advance(Phase::Scanning, bytes_total, (end - last_report) as u64, 0);
                    last_report = end;
                }
            }
        }
        let (columns, warnings) = self.resolve(&mut pass, &declared, label.as_deref())?;
        let total = pass.records.len() as u64;
        self.index = columns
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        let done = infer::TabularDone {
            format: "json",
            columns: &columns,
            label: label.as_deref(),
            missing: options.missing,
            inputs,
            bytes_in: bytes_total,
            bad: std::mem::take(&mut pass.bad),
            warnings,
            fixed: options.schema.as_ref().map(|f| &f.schema),
        }
        .finished();
        self.columns = columns;
        self.records = pass.records;
        let tasks = (0..self.records.len())
            .step_by(RECORDS_PER_TASK)
            .map(|from| (from, (from + RECORDS_PER_TASK).min(self.records.len())))
            .collect();
        Ok(Scanned {
            records: total,
            tasks,
            done,
        })
    }

    fn encode(&self, (from, to): Self::Task) -> Result<Chunk, ConvertError> {
        encode(
            &self.records[from..to],
            self.inputs,
            &self.files,
            &self.columns,
            &self.index,
        )
    }

    fn locate(&self, &(from, _): &Self::Task) -> SourceLocation {
        let (fi, start) = self
            .records
            .get(from)
            .map_or((0, 0), |&(fi, start, _)| (fi, start));
        match (self.inputs.get(fi), self.files.get(fi)) {
            (Some(path), Some(data)) => SourceLocation::in_text(path, data, start),
            _ => SourceLocation::at_byte(Path::new(""), 0),
        }
    }
}

impl JsonSource<'_> {
    /// The columns after the first pass: inferred types (or the fixed
    /// schema's), with the checks that need the whole input.
    fn resolve(
        &self,
        pass: &mut Pass,
        declared: &HashMap<String, DType>,
        label: Option<&str>,
    ) -> Result<(Vec<Column>, Vec<String>), ConvertError> {
        let (inputs, files, options) = (self.inputs, &self.files, self.options);
        let total = pass.records.len() as u64;
        let order = &pass.order;
        if options.schema.is_none() {
            for (name, _) in &options.columns {
                if !pass.states.contains_key(name) && total > 0 {
                    return Err(ConvertError::options(
                        ConvertOption::ColumnTypes,
                        format!(
                            "column type for {name:?}: no such key in the input (keys: {order:?})"
                        ),
                    ));
                }
            }
            if let Some(label) = label
                && !pass.states.contains_key(label)
                && total > 0
            {
                return Err(ConvertError::options(
                    ConvertOption::Label,
                    format!("label column {label:?}: no such key in the input (keys: {order:?})"),
                ));
            }
        }
        // With a fixed schema, every feature is a column, in the schema's order.
        let names: Vec<String> = match &options.schema {
            Some(fixed) => fixed
                .schema
                .features
                .iter()
                .map(|f| f.name.clone())
                .collect(),
            None => order.clone(),
        };
        let mut columns = Vec::with_capacity(names.len());
        let mut warnings = Vec::new();
        for name in &names {
            let state = pass.states.remove(name).unwrap_or_default();
            let dtype = declared
                .get(name.as_str())
                .copied()
                .unwrap_or(state.kind.dtype());
            let at =
                |(fi, byte): (usize, usize)| SourceLocation::in_text(&inputs[fi], &files[fi], byte);
            if dtype == DType::Float32
                && let Some(first) = state.beyond_f32
            {
                let location = at(first);
                let raw = number_at(&files[first.0], first.1);
                // Not skippable: the first pass could not know the key's type yet.
                return Err(ConvertError::BadRow {
                    location,
                    problem: format!("key {name:?}: {}", infer::beyond_f32_problem(raw)),
                });
            }
            if state.kind == Kind::BigInt
                && dtype == DType::Bytes
                && let Some(first) = state.big_int
            {
                warnings.push(format!(
                    "key {name:?} holds integers beyond int64, kept exactly as text (bytes): first at {}",
                    at(first)
                ));
            }
            let is_label = label == Some(name.as_str());
            if is_label && state.list {
                return Err(ConvertError::options(
                    ConvertOption::Label,
                    format!(
                        "label column {name:?}: the key holds lists; a label must be one value"
                    ),
                ));
            }
            let fixed_vocab = options.schema.as_ref().and_then(|f| f.vocabulary.as_ref());
            let list = match &options.schema {
                Some(fixed) => fixed
                    .schema
                    .feature(name)
                    .is_some_and(|f| matches!(f.layout, SpecLayout::Var)),
                None => state.list,
            };
            let vocab = match fixed_vocab {
                Some(v) if is_label => Some(v.iter().map(|s| s.as_bytes().to_vec()).collect()),
                _ if is_label && dtype == DType::Bytes => {
                    Some(infer::label_vocabulary(name, state.labels)?)
                }
                _ => None,
            };
            columns.push(Column {
                name: name.clone(),
                dtype: if vocab.is_some() { DType::Bytes } else { dtype },
                list,
                present: state.present,
                missing: total - state.present,
                vocab,
            });
        }
        if let Some(label) = label
            && let Some(c) = columns.iter().find(|c| c.name == label)
            && c.missing > 0
        {
            // A label must be in every record; find the first record without it.
            return Err(missing_label(inputs, files, &pass.records, label));
        }
        Ok((columns, warnings))
    }
}
/// The JSON number starting at `at` in `data`.
fn number_at(data: &[u8], at: usize) -> &[u8] {
    let rest = data.get(at..).unwrap_or_default();
    let len = rest
        .iter()
        .position(|&b| !(b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.' | b'e' | b'E')))
        .unwrap_or(rest.len());
    &rest[..len]
}

fn judge_record(
    judge: &Judge<'_>,
    fields: &[Field<'_>],
    states: &HashMap<String, ColState>,
    record_at: usize,
) -> Result<(), ConvertError> {
    for (i, f) in fields.iter().enumerate() {
        let key: &str = &f.key;
        if fields[..i].iter().any(|g| g.key == f.key) {
            return Err(judge.bad(
                f.offset,
                format!("duplicate key {key:?} in this record (after flattening nested objects)"),
            ));
        }
        judge.check_fixed(f)?;
        let state = states.get(key);
        match &f.value {
            FieldValue::Null => {
                if judge.label == Some(key) {
                    return Err(judge.bad(
                        f.offset,
                        format!("the label {key:?} is null: every record needs a label"),
                    ));
                }
            }
            FieldValue::One(s) => judge.check(key, state, s, f.offset)?,
            FieldValue::List(items) => {
                if judge.label == Some(key) {
                    return Err(judge.bad(
                        f.offset,
                        format!("the label {key:?} is a list: expected one value"),
                    ));
                }
                let mut numeric = None;
                for (s, at) in items {
                    judge.check(key, state, s, *at)?;
                    let n = s.kind() != Kind::Text;
                    if *numeric.get_or_insert(n) != n {
                        return Err(judge.bad(
                            *at,
                            format!(
                                "{} in a list of {}: lists must hold only numbers or only strings",
                                s.describe(),
                                if n { "strings" } else { "numbers" }
                            ),
                        ));
                    }
                }
            }
        }
    }
    if let Some(label) = judge.label
        && !fields.iter().any(|f| f.key == label)
    {
        return Err(judge.bad(
            record_at,
            format!("this record has no label {label:?}: every record needs a label"),
        ));
    }
    judge.check_required(fields, record_at)
}

fn missing_label(
    inputs: &[PathBuf],
    files: &[Input],
    records: &[(usize, usize, usize)],
    label: &str,
) -> ConvertError {
    // judge_record refuses records without a label, so this is unreachable in
    // practice; it stays an error rather than a panic.
    let (fi, start, _) = records.first().copied().unwrap_or((0, 0, 0));
    ConvertError::BadRow {
        location: SourceLocation::in_text(&inputs[fi], &files[fi], start),
        problem: format!("a record has no label {label:?}"),
    }
}

fn encode(
    task: &[(usize, usize, usize)],
    inputs: &[PathBuf],
    files: &[Input],
    columns: &[Column],
    index: &HashMap<String, usize>,
) -> Result<Chunk, ConvertError> {
    let mut chunk = Chunk::default();
    let mut enc = ExampleEncoder::default();
    let mut fields: Vec<Field<'_>> = Vec::new();
    let mut ints: Vec<i64> = Vec::new();
    let mut floats: Vec<f32> = Vec::new();
    let mut texts: Vec<Vec<u8>> = Vec::new();
    for &(fi, start, end) in task {
        let data: &[u8] = &files[fi];
        chunk.bytes_in += (end - start) as u64;
        fields.clear();
        let changed = |offset: usize, what: &str| ConvertError::BadRow {
            location: SourceLocation::in_text(&inputs[fi], data, offset),
            problem: format!("{what} although the first pass accepted it: did the file change?"),
        };
        if parse_record(data, start, end, &mut fields).is_err() {
            return Err(changed(start, "the record does not parse"));
        }
        fields.sort_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
        enc.begin();
        for f in &fields {
            let Some(&ci) = index.get(f.key.as_ref()) else {
                continue;
            };
            let col = &columns[ci];
            let key = f.key.as_bytes();
            let one;
            let items: &[(Scalar<'_>, usize)] = match &f.value {
                FieldValue::Null => continue,
                FieldValue::One(s) => {
                    one = [(s.clone(), f.offset)];
                    &one
                }
                FieldValue::List(items) => items,
            };
            match (&col.vocab, col.dtype) {
                (Some(vocab), _) => {
                    let Some((Scalar::Str(s), at)) = items.first() else {
                        return Err(changed(f.offset, "the label is not a string"));
                    };
                    match vocab.binary_search_by(|v| v.as_slice().cmp(s.as_ref())) {
                        Ok(i) => enc.int64(key, i as i64),
                        Err(_) => return Err(changed(*at, "the label is not in the vocabulary")),
                    }
                }
                (None, DType::Int64) => {
                    ints.clear();
                    for (s, at) in items {
                        ints.push(match s {
                            Scalar::Bool(b) => i64::from(*b),
                            Scalar::Num(t) => parse_i64(t)
                                .ok_or_else(|| changed(*at, "an integer does not parse"))?,
                            Scalar::Str(_) => {
                                return Err(changed(*at, "a string in a numeric key"));
                            }
                        });
                    }
                    enc.int64s(key, &ints);
                }
                (None, DType::Float32) => {
                    floats.clear();
                    for (s, at) in items {
                        floats.push(match s {
                            Scalar::Bool(b) => f32::from(u8::from(*b)),
                            Scalar::Num(t) => parse_f32(t)
                                .ok_or_else(|| changed(*at, "a number does not parse"))?,
                            Scalar::Str(_) => {
                                return Err(changed(*at, "a string in a numeric key"));
                            }
                        });
                    }
                    enc.floats(key, &floats);
                }
                (None, _) => {
                    texts.clear();
                    for (s, at) in items {
                        match s {
                            Scalar::Str(t) => texts.push(t.to_vec()),
                            // Integers beyond int64 (and what shares their key) as their text.
                            Scalar::Num(t) => texts.push(t.to_vec()),
                            Scalar::Bool(b) => texts.push(b.to_string().into_bytes()),
                        }
                        let _ = at;
                    }
                    enc.bytes_list(key, texts.iter().map(Vec::as_slice));
                }
            }
        }
        enc.end();
    }
    chunk.fill(enc);
    Ok(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<(String, String)>, String> {
        let data = text.as_bytes();
        let mut fields = Vec::new();
        parse_record(data, 0, data.len(), &mut fields)
            .map_err(|s| format!("{}: {}", s.offset, s.problem))?;
        Ok(fields
            .iter()
            .map(|f| (f.key.to_string(), format!("{:?}", f.value)))
            .collect())
    }

    #[test]
    fn flattens_nested_objects_and_decodes_escapes() {
        let fields = parse(r#"{"a": {"b": 1, "c": {"d": "x\ny\u00e9\ud83d\ude00"}}, "e": [1, 2.5], "f": null, "g": true}"#).unwrap();
        let keys: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a.b", "a.c.d", "e", "f", "g"]);
        assert!(
            fields[1].1.contains(r#"x\ny\xc3\xa9\xf0\x9f\x98\x80"#)
                || fields[1].1.contains("[120, 10, 121"),
            "{}",
            fields[1].1
        );
    }

    #[test]
    fn numbers_keep_their_exact_text() {
        let fields =
            parse(r#"{"id": 12345678901234567890, "x": 1.0, "y": -0, "z": 1e400}"#).unwrap();
        assert!(fields[0].1.contains("Num([49, 50, 51"), "{}", fields[0].1);
        let text = |i: usize| fields[i].1.clone();
        assert!(text(1).contains("[49, 46, 48]"), "{}", text(1));
        assert!(
            text(3).contains("[49, 101, 52, 48, 48]"),
            "1e400 kept as text: {}",
            text(3)
        );
    }

    #[test]
    fn syntax_errors_have_offsets() {
        let err = parse(r#"{"a": 1 "b": 2}"#).unwrap_err();
        assert!(err.starts_with("8: "), "{err}");
        let err = parse(r#"{"a": tru}"#).unwrap_err();
        // At the byte that cannot continue `tru`.
        assert!(err.starts_with("9: "), "{err}");
        let err = parse(r#"{"a": [1, {"b": 2}]}"#).unwrap_err();
        assert!(err.contains("not objects"), "{err}");
        assert!(parse(r#"{"a": "unterminated}"#).is_err());
        assert!(parse(r#"{"a": 01x}"#).is_err());
        let err = parse(r#"{"s": "\ud800b"}"#).unwrap_err();
        assert!(
            err.starts_with("7: ") && err.contains("lone surrogate"),
            "{err}"
        );
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let open = format!("{}{}", r#"{"a":"#.repeat(10_000), "1");
        assert!(parse(&open).unwrap_err().contains("EOF"));
        let closed = format!("{open}{}", "}".repeat(10_000));
        let err = parse(&closed).unwrap_err();
        assert!(err.contains("nested deeper than 64"), "{err}");
        let fine = format!("{}1{}", r#"{"a":"#.repeat(64), "}".repeat(64));
        assert!(parse(&fine).is_ok());
    }
}
