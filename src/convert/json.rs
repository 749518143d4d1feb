//! JSON Lines, or one JSON array of objects, to Examples (detected by the
//! first non-blank character: `[` is an array).
//!
//! Values: numbers (int64 if every value of the key is an integer, else
//! float32), strings (bytes), booleans (int64 0/1), `null` (the feature is left
//! out), arrays of numbers or of strings (lists: the feature becomes
//! var-length). Nested objects flatten to `a.b` keys. A small parser of our
//! own keeps the byte offset of every value, so errors name line and column.
//!
//! The first pass is sequential: it finds the records, judges each against the
//! types established so far (the first value of a key fixes it as numeric or
//! text; a later value of the other kind contradicts it), and infers. The
//! second pass re-parses the good records in parallel and encodes them.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::encode::ExampleEncoder;
use super::error::{ConvertError, SourceLocation, quote};
use super::infer::{self, Column, Kind, parse_f32, parse_i64};
use super::output::{BadRows, Chunk, Ctx, Input, finish, plan_shards};
use super::{Missing, Phase, Summary};
use crate::example::DType;

/// Options of the JSON converter.
#[derive(Debug, Clone, Default)]
pub struct JsonOptions {
    /// Key types that override inference (`--column NAME:DTYPE`).
    pub columns: Vec<(String, DType)>,
    /// The label key (`--label`).
    pub label: Option<String>,
    /// What a key missing in some records becomes in the schema.
    pub missing: Missing,
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
/// Nesting deeper than this is refused (no stack overflow on hostile input).
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

struct Syntax {
    offset: usize,
    problem: String,
}

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn err<T>(&self, offset: usize, problem: impl Into<String>) -> Result<T, Syntax> {
        Err(Syntax {
            offset,
            problem: problem.into(),
        })
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.data.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }

    fn found(&self) -> String {
        match self.peek() {
            None => "the end of the input".into(),
            Some(b) => format!("{:?}", b as char),
        }
    }

    fn expect(&mut self, byte: u8, what: &str) -> Result<(), Syntax> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            self.err(
                self.pos,
                format!("JSON syntax error: expected {what}, found {}", self.found()),
            )
        }
    }

    /// One object, flattened into `fields`.
    fn record(&mut self, fields: &mut Vec<Field<'a>>) -> Result<(), Syntax> {
        self.ws();
        if self.peek() != Some(b'{') {
            return self.err(
                self.pos,
                format!(
                    "expected a JSON object {{...}} as a record, found {}",
                    self.found()
                ),
            );
        }
        self.object(None, fields, 0)
    }

    fn object(
        &mut self,
        prefix: Option<&str>,
        fields: &mut Vec<Field<'a>>,
        depth: usize,
    ) -> Result<(), Syntax> {
        if depth > MAX_DEPTH {
            return self.err(
                self.pos,
                format!("objects nested deeper than {MAX_DEPTH} levels"),
            );
        }
        self.expect(b'{', "'{'")?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.ws();
            let key_at = self.pos;
            if self.peek() != Some(b'"') {
                return self.err(
                    key_at,
                    format!(
                        "JSON syntax error: expected a key string, found {}",
                        self.found()
                    ),
                );
            }
            let raw = self.string()?;
            let key: Cow<'a, str> = match raw {
                Cow::Borrowed(b) => match std::str::from_utf8(b) {
                    Ok(s) => Cow::Borrowed(s),
                    Err(_) => return self.err(key_at, "key is not valid UTF-8"),
                },
                Cow::Owned(b) => match String::from_utf8(b) {
                    Ok(s) => Cow::Owned(s),
                    Err(_) => return self.err(key_at, "key is not valid UTF-8"),
                },
            };
            let key = match prefix {
                Some(p) => Cow::Owned(format!("{p}.{key}")),
                None => key,
            };
            self.ws();
            self.expect(b':', "':' after the key")?;
            self.ws();
            let at = self.pos;
            match self.peek() {
                Some(b'{') => self.object(Some(&key), fields, depth + 1)?,
                Some(b'[') => {
                    let list = self.array()?;
                    fields.push(Field {
                        key,
                        value: FieldValue::List(list),
                        offset: at,
                    });
                }
                _ => {
                    let value = match self.scalar()? {
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
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => {
                    return self.err(
                        self.pos,
                        format!(
                            "JSON syntax error: expected ',' or '}}' in an object, found {}",
                            self.found()
                        ),
                    );
                }
            }
        }
    }

    fn array(&mut self) -> Result<Vec<(Scalar<'a>, usize)>, Syntax> {
        self.expect(b'[', "'['")?;
        let mut out = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(out);
        }
        loop {
            self.ws();
            let at = self.pos;
            match self.peek() {
                Some(b'{' | b'[') => {
                    return self.err(
                        at,
                        "arrays may hold numbers, strings or booleans, not objects or arrays",
                    );
                }
                _ => match self.scalar()? {
                    Some(s) => out.push((s, at)),
                    None => {
                        return self.err(
                            at,
                            "null inside an array: expected a number, string or boolean",
                        );
                    }
                },
            }
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(out);
                }
                _ => {
                    return self.err(
                        self.pos,
                        format!(
                            "JSON syntax error: expected ',' or ']' in an array, found {}",
                            self.found()
                        ),
                    );
                }
            }
        }
    }

    /// A scalar; `None` for null.
    fn scalar(&mut self) -> Result<Option<Scalar<'a>>, Syntax> {
        let at = self.pos;
        match self.peek() {
            Some(b'"') => Ok(Some(Scalar::Str(self.string()?))),
            Some(b't') => self.literal(b"true").map(|_| Some(Scalar::Bool(true))),
            Some(b'f') => self.literal(b"false").map(|_| Some(Scalar::Bool(false))),
            Some(b'n') => self.literal(b"null").map(|_| None),
            Some(b'-' | b'0'..=b'9') => Ok(Some(Scalar::Num(self.number()?))),
            _ => self.err(
                at,
                format!(
                    "JSON syntax error: expected a value, found {}",
                    self.found()
                ),
            ),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Syntax> {
        if self.data[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            self.err(
                self.pos,
                format!(
                    "JSON syntax error: expected `{}`, found {}",
                    String::from_utf8_lossy(word),
                    quote(&self.data[self.pos..(self.pos + word.len()).min(self.data.len())])
                ),
            )
        }
    }

    fn number(&mut self) -> Result<&'a [u8], Syntax> {
        let start = self.pos;
        let d = self.data;
        let mut i = self.pos;
        if d.get(i) == Some(&b'-') {
            i += 1;
        }
        let digits = |i: &mut usize| {
            let s = *i;
            while d.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i - s
        };
        if digits(&mut i) == 0 {
            return self.err(start, "JSON syntax error: a number needs digits");
        }
        if d.get(i) == Some(&b'.') {
            i += 1;
            if digits(&mut i) == 0 {
                return self.err(i, "JSON syntax error: expected digits after '.'");
            }
        }
        if matches!(d.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(d.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if digits(&mut i) == 0 {
                return self.err(i, "JSON syntax error: expected digits in the exponent");
            }
        }
        self.pos = i;
        Ok(&d[start..i])
    }

    /// A string at `pos` (which is a quote); borrowed when it has no escapes.
    fn string(&mut self) -> Result<Cow<'a, [u8]>, Syntax> {
        let start = self.pos + 1;
        let d = self.data;
        let mut i = start;
        while let Some(&b) = d.get(i) {
            match b {
                b'"' => {
                    self.pos = i + 1;
                    return Ok(Cow::Borrowed(&d[start..i]));
                }
                b'\\' => return self.escaped_string(start, i),
                0..=0x1f => return self.err(i, "JSON syntax error: control character in a string"),
                _ => i += 1,
            }
        }
        self.err(self.pos, "JSON syntax error: unterminated string")
    }

    fn escaped_string(
        &mut self,
        start: usize,
        first_escape: usize,
    ) -> Result<Cow<'a, [u8]>, Syntax> {
        let d = self.data;
        let mut out = d[start..first_escape].to_vec();
        let mut i = first_escape;
        loop {
            let Some(&b) = d.get(i) else {
                return self.err(start - 1, "JSON syntax error: unterminated string");
            };
            match b {
                b'"' => {
                    self.pos = i + 1;
                    return Ok(Cow::Owned(out));
                }
                b'\\' => {
                    let Some(&e) = d.get(i + 1) else {
                        return self.err(i, "JSON syntax error: unterminated escape");
                    };
                    i += 2;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let at = i - 2;
                            let hi = self.hex4(i)?;
                            i += 4;
                            let lone = |code: u32| {
                                self.err(
                                    at,
                                    format!(
                                        "JSON string: lone surrogate \\u{code:04x} (half of a UTF-16 pair, not a character; the text would be changed)"
                                    ),
                                )
                            };
                            if (0xD800..0xDC00).contains(&hi) {
                                if d.get(i) != Some(&b'\\') || d.get(i + 1) != Some(&b'u') {
                                    return lone(hi);
                                }
                                let lo = self.hex4(i + 2)?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return lone(hi);
                                }
                                i += 6;
                                let code = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                                match char::from_u32(code) {
                                    Some(c) => c,
                                    None => return lone(hi),
                                }
                            } else {
                                match char::from_u32(hi) {
                                    Some(c) => c,
                                    None => return lone(hi),
                                }
                            }
                        }
                        _ => {
                            return self.err(
                                i - 2,
                                format!("JSON syntax error: invalid escape \\{}", e as char),
                            );
                        }
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => return self.err(i, "JSON syntax error: control character in a string"),
                _ => {
                    out.push(b);
                    i += 1;
                }
            }
        }
    }

    fn hex4(&self, at: usize) -> Result<u32, Syntax> {
        let digits = self
            .data
            .get(at..at + 4)
            .and_then(|h| std::str::from_utf8(h).ok());
        match digits.and_then(|h| u32::from_str_radix(h, 16).ok()) {
            Some(v) => Ok(v),
            None => self.err(at, "JSON syntax error: expected 4 hex digits after \\u"),
        }
    }
}

/// Finds the records: `(start, end)` of each, or a syntax error.
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

struct Judge<'o> {
    path: &'o Path,
    data: &'o [u8],
    declared: HashMap<&'o str, DType>,
    label: Option<&'o str>,
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
        if let Some(&dtype) = self.declared.get(key) {
            let ok = match dtype {
                DType::Int64 => kind == Kind::Int,
                DType::Float32 => kind <= Kind::BigInt,
                _ => kind == Kind::Text,
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
}

pub(crate) fn convert(
    inputs: &[PathBuf],
    options: &JsonOptions,
    ctx: &Ctx<'_>,
) -> Result<Summary, ConvertError> {
    let files: Vec<Input> = inputs
        .iter()
        .map(|p| Input::load(p))
        .collect::<Result<_, _>>()?;
    let bytes_total: u64 = files.iter().map(|f| f.len() as u64).sum();
    let skip = ctx.options.skip_bad_rows;
    ctx.begin_phase(Phase::Scanning, bytes_total);

    // Pass 1 (sequential): records, bad rows, inference.
    let mut order: Vec<String> = Vec::new();
    let mut states: HashMap<String, ColState> = HashMap::new();
    let mut records: Vec<(usize, usize, usize)> = Vec::new(); // (file, start, end)
    let mut bad = BadRows::default();
    let mut fields = Vec::new();
    for (fi, (path, data)) in inputs.iter().zip(&files).enumerate() {
        let judge = Judge {
            path,
            data,
            declared: options
                .columns
                .iter()
                .map(|(n, d)| (n.as_str(), *d))
                .collect(),
            label: options.label.as_deref(),
        };
        let mut p = Parser { data, pos: 0 };
        p.ws();
        let layout = if p.peek() == Some(b'[') {
            p.pos += 1;
            Layout::Array
        } else {
            Layout::Lines
        };
        let syntax = |s: Syntax, row: bool| {
            let location = SourceLocation::in_text(path, data, s.offset);
            if row {
                ConvertError::BadRow {
                    location,
                    problem: s.problem,
                }
            } else {
                ConvertError::BadInput {
                    location,
                    problem: s.problem,
                }
            }
        };
        let mut first = true;
        let mut last_report = 0;
        loop {
            ctx.check_cancel()?;
            p.ws();
            match layout {
                Layout::Array => {
                    if p.peek() == Some(b']') {
                        p.pos += 1;
                        p.ws();
                        if p.pos != data.len() {
                            return Err(syntax(
                                Syntax {
                                    offset: p.pos,
                                    problem: format!(
                                        "JSON syntax error: unexpected {} after the closing ']'",
                                        p.found()
                                    ),
                                },
                                false,
                            ));
                        }
                        break;
                    }
                    if !first {
                        if let Err(s) = p.expect(b',', "',' or ']' between array elements") {
                            return Err(syntax(s, false));
                        }
                        p.ws();
                    }
                }
                Layout::Lines => {
                    if p.pos >= data.len() {
                        break;
                    }
                }
            }
            first = false;
            let start = p.pos;
            fields.clear();
            let parsed = p.record(&mut fields);
            let row_bad = match parsed {
                Err(s) => match layout {
                    Layout::Lines => {
                        // The broken record is the one on the line where it
                        // starts: an error found lines later (an object left
                        // open reads on into the next lines) is reported
                        // within that line, and skipping resumes on the next.
                        let line_end =
                            memchr::memchr(b'\n', &data[start..]).map_or(data.len(), |i| start + i);
                        let s = if s.offset > line_end {
                            let mut on_line = Parser {
                                data: &data[..line_end],
                                pos: start,
                            };
                            let mut scratch = Vec::new();
                            on_line.record(&mut scratch).err().unwrap_or(s)
                        } else {
                            s
                        };
                        if !skip {
                            return Err(syntax(s, true));
                        }
                        bad.push(syntax(s, true));
                        p.pos = (line_end + 1).min(data.len());
                        continue;
                    }
                    Layout::Array => return Err(syntax(s, false)),
                },
                Ok(()) => judge_record(&judge, &fields, &states),
            };
            if matches!(layout, Layout::Lines) {
                // Only blanks may follow an object on its line.
                let rest = p.pos;
                while let Some(b' ' | b'\t' | b'\r') = data.get(p.pos) {
                    p.pos += 1;
                }
                if !matches!(data.get(p.pos), None | Some(b'\n')) {
                    let s = Syntax {
                        offset: p.pos,
                        problem: format!(
                            "JSON syntax error: unexpected {} after the object on this line",
                            p.found()
                        ),
                    };
                    if skip {
                        bad.push(syntax(s, true));
                        p.pos = data[rest..]
                            .iter()
                            .position(|&b| b == b'\n')
                            .map_or(data.len(), |i| rest + i + 1);
                        continue;
                    }
                    return Err(syntax(s, true));
                }
            }
            if let Err(e) = row_bad {
                if !skip {
                    return Err(e);
                }
                bad.push(e);
                continue;
            }
            for f in &fields {
                let key: &str = &f.key;
                if !states.contains_key(key) {
                    order.push(key.to_string());
                    states.insert(key.to_string(), ColState::default());
                }
                let Some(state) = states.get_mut(key) else {
                    continue;
                };
                let note = |s: &Scalar<'_>, at: usize, state: &mut ColState| {
                    let kind = s.kind();
                    state.kind = state.kind.join(kind);
                    if state.first.is_none() {
                        state.first = Some((at, kind != Kind::Text));
                    }
                    if let Scalar::Num(t) = s {
                        if kind == Kind::Float && state.beyond_f32.is_none() && infer::beyond_f32(t)
                        {
                            state.beyond_f32 = Some((fi, at));
                        }
                        if kind == Kind::BigInt && state.big_int.is_none() {
                            state.big_int = Some((fi, at));
                        }
                    }
                    if judge.label == Some(key)
                        && let Scalar::Str(text) = s
                        && !state.labels.contains(text.as_ref())
                    {
                        state.labels.insert(text.to_vec());
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
            records.push((fi, start, p.pos));
            if p.pos - last_report > (4 << 20) {
                ctx.advance(
                    Phase::Scanning,
                    bytes_total,
                    (p.pos - last_report) as u64,
                    0,
                );
                last_report = p.pos;
            }
        }
    }
    let total = records.len() as u64;
    if total == 0 {
        return Err(ConvertError::NoRecords {
            inputs: inputs.to_vec(),
            skipped: bad.count,
        });
    }
    for (name, _) in &options.columns {
        if !states.contains_key(name) {
            return Err(ConvertError::Options(format!(
                "column type for {name:?}: no such key in the input (keys: {order:?})"
            )));
        }
    }
    if let Some(label) = &options.label
        && !states.contains_key(label)
    {
        return Err(ConvertError::Options(format!(
            "label column {label:?}: no such key in the input (keys: {order:?})"
        )));
    }
    let declared: HashMap<&str, DType> = options
        .columns
        .iter()
        .map(|(n, d)| (n.as_str(), *d))
        .collect();
    let mut columns = Vec::with_capacity(order.len());
    let mut warnings = Vec::new();
    for name in &order {
        let Some(state) = states.remove(name) else {
            continue;
        };
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
        let is_label = options.label.as_deref() == Some(name.as_str());
        if is_label && state.list {
            return Err(ConvertError::Options(format!(
                "label column {name:?}: the key holds lists; a label must be one value"
            )));
        }
        let vocab = (is_label && dtype == DType::Bytes).then(|| infer::vocabulary(state.labels));
        columns.push(Column {
            name: name.clone(),
            dtype,
            list: state.list,
            present: state.present,
            missing: total - state.present,
            vocab,
        });
    }
    if let Some(label) = &options.label
        && let Some(c) = columns.iter().find(|c| &c.name == label)
        && c.missing > 0
    {
        // A label must be in every record; find the first record without it.
        return Err(missing_label(inputs, &files, &records, label));
    }

    // Pass 2: re-parse the good records in parallel and encode.
    let index: HashMap<&str, usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), i))
        .collect();
    let plan = plan_shards(total, ctx.options.sharding, bytes_total);
    ctx.begin_phase(Phase::Encoding, bytes_total);
    let tasks: Vec<&[(usize, usize, usize)]> = records.chunks(RECORDS_PER_TASK).collect();
    let shards = ctx.write_shards(
        &plan,
        bytes_total,
        tasks,
        |task| encode(task, inputs, &files, &columns, &index),
        |task| {
            let (fi, start) = task.first().map_or((0, 0), |&(fi, start, _)| (fi, start));
            SourceLocation::in_text(&inputs[fi], &files[fi], start)
        },
    )?;
    let done = infer::TabularDone {
        format: "json",
        columns: &columns,
        label: options.label.as_deref(),
        missing: options.missing,
        inputs,
        bytes_in: bytes_total,
        bad,
        warnings,
        fixed: None,
    };
    finish(ctx, shards, done.finished())
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
) -> Result<(), ConvertError> {
    for (i, f) in fields.iter().enumerate() {
        let key: &str = &f.key;
        if fields[..i].iter().any(|g| g.key == f.key) {
            return Err(judge.bad(
                f.offset,
                format!("duplicate key {key:?} in this record (after flattening nested objects)"),
            ));
        }
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
        let at = fields.first().map_or(0, |f| f.offset);
        return Err(judge.bad(
            at,
            format!("this record has no label {label:?}: every record needs a label"),
        ));
    }
    Ok(())
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
    index: &HashMap<&str, usize>,
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
        let mut p = Parser {
            data: &data[..end],
            pos: start,
        };
        fields.clear();
        let changed = |offset: usize, what: &str| ConvertError::BadRow {
            location: SourceLocation::in_text(&inputs[fi], data, offset),
            problem: format!("{what} although the first pass accepted it: did the file change?"),
        };
        if p.record(&mut fields).is_err() {
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
        let mut p = Parser {
            data: text.as_bytes(),
            pos: 0,
        };
        let mut fields = Vec::new();
        p.record(&mut fields)
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
    fn syntax_errors_have_offsets() {
        let err = parse(r#"{"a": 1 "b": 2}"#).unwrap_err();
        assert!(err.starts_with("8: "), "{err}");
        let err = parse(r#"{"a": tru}"#).unwrap_err();
        assert!(err.starts_with("6: "), "{err}");
        let err = parse(r#"{"a": [1, {"b": 2}]}"#).unwrap_err();
        assert!(err.contains("not objects"), "{err}");
        assert!(parse(r#"{"a": "unterminated}"#).is_err());
        assert!(parse(r#"{"a": 01x}"#).is_err());
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let text = format!("{}{}", r#"{"a":"#.repeat(10_000), "1");
        assert!(parse(&text).unwrap_err().contains("nested deeper"));
    }
}
