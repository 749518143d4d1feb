//! Type inference for tabular inputs (CSV, JSON) and the schema it produces.
//!
//! Inference is a join over a small lattice, `Empty < Int < Float < Text`,
//! computed per chunk in parallel and joined in order. The first pass only
//! classifies values syntactically (cheap); the second pass parses them for
//! real. Invariant: every value classified `Int` parses with [`parse_i64`],
//! and every value classified `Int` or `Float` parses with [`parse_f32`].

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::{Map, Value as Json, json};

use super::Missing;
use super::error::{ConvertError, ConvertOption};
use super::output::{BadRows, Finished};
use crate::example::{DType, FeatureSpec, Layout, Schema, Value};

/// What the values of a column seen so far fit in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) enum Kind {
    /// No value yet (all missing).
    #[default]
    Empty,
    /// Every value is an integer that fits in i64.
    Int,
    /// Every value is a number.
    Float,
    /// Every value is a number, and some are integers beyond int64 (ids):
    /// kept exactly, as their text (bytes), since float32 would change them.
    BigInt,
    /// Anything else.
    Text,
}

impl Kind {
    pub(crate) fn join(self, other: Kind) -> Kind {
        self.max(other)
    }

    pub(crate) fn dtype(self) -> DType {
        match self {
            Kind::Int => DType::Int64,
            Kind::Float => DType::Float32,
            // A column with no value at all becomes bytes: nothing to lose.
            Kind::Empty | Kind::BigInt | Kind::Text => DType::Bytes,
        }
    }
}

/// Strips ASCII spaces and tabs around a value (numbers may be padded).
#[inline]
pub(crate) fn trim(mut b: &[u8]) -> &[u8] {
    // Fast path: nothing to trim (the common case, two compares).
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) if f != b' ' && f != b'\t' && l != b' ' && l != b'\t' => return b,
        (None, _) => return b,
        _ => {}
    }
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}

/// Parses a decimal integer (optional sign) that fits in i64.
#[inline]
pub(crate) fn parse_i64(b: &[u8]) -> Option<i64> {
    let (neg, digits) = match b {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, b),
    };
    if digits.is_empty() {
        return None;
    }
    if digits.len() <= 18 {
        // Cannot overflow: 18 digits < 2^63.
        let mut v: i64 = 0;
        for &d in digits {
            let d = d.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            v = v * 10 + d as i64;
        }
        return Some(if neg { -v } else { v });
    }
    let mut v: i64 = 0;
    for &d in digits {
        let d = d.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?;
        v = if neg {
            v.checked_sub(d as i64)?
        } else {
            v.checked_add(d as i64)?
        };
    }
    Some(v)
}

/// Parses a number as float32 (correctly rounded; also `inf`, `nan`).
#[inline]
pub(crate) fn parse_f32(b: &[u8]) -> Option<f32> {
    fast_f32(b).or_else(|| std::str::from_utf8(b).ok()?.parse::<f32>().ok())
}

/// Clinger's fast path: a plain decimal `[+-]digits[.digits]` whose digits,
/// as an integer m, are at most 2^24 with at most 10 decimals. Then m and
/// 10^k are exact in f32 and one IEEE division rounds correctly, so the
/// result equals the correctly rounded parse. `None` for anything else.
#[inline]
fn fast_f32(b: &[u8]) -> Option<f32> {
    const POW10: [f32; 11] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10];
    let (neg, digits) = match b {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 12 {
        return None;
    }
    let mut m: u64 = 0;
    let mut n = 0;
    let mut decimals = None;
    for (i, &c) in digits.iter().enumerate() {
        let d = c.wrapping_sub(b'0');
        if d <= 9 {
            m = m * 10 + u64::from(d);
            n += 1;
        } else if c == b'.' && decimals.is_none() {
            decimals = Some(digits.len() - i - 1);
        } else {
            return None;
        }
    }
    let k = decimals.unwrap_or(0);
    if n == 0 || m > (1 << 24) || k > 10 {
        return None;
    }
    let v = m as f32 / POW10[k];
    Some(if neg { -v } else { v })
}

/// Classifies a trimmed, non-missing value.
#[inline]
pub(crate) fn classify(b: &[u8]) -> Kind {
    let n = b.len();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let int_start = i;
    while i < n && b[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = i - int_start;
    if i == n {
        return match int_digits {
            0 => Kind::Text,
            1..=18 => Kind::Int,
            _ if parse_i64(b).is_some() => Kind::Int,
            _ => Kind::BigInt,
        };
    }
    let mut frac_digits = 0;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < n && b[i].is_ascii_digit() {
            i += 1;
        }
        frac_digits = i - start;
    }
    if int_digits + frac_digits > 0 && i < n && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < n && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        let start = i;
        while i < n && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return slow_classify(b);
        }
    }
    if i == n && int_digits + frac_digits > 0 {
        Kind::Float
    } else {
        slow_classify(b)
    }
}

/// Whether a value that classifies as a number is beyond float32's range
/// (it would become infinity). Cheap for the common short plain decimal.
#[inline]
pub(crate) fn beyond_f32(b: &[u8]) -> bool {
    if b.len() < 39 && !b.iter().any(|&c| c == b'e' || c == b'E') {
        return false;
    }
    beyond_f32_slow(b)
}

#[cold]
fn beyond_f32_slow(b: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(b) else {
        return false;
    };
    let lower = text.trim_start_matches(['+', '-']).to_ascii_lowercase();
    if lower.starts_with("inf") || lower.starts_with("nan") {
        return false; // asked for by name
    }
    text.parse::<f32>().is_ok_and(|x| x.is_infinite())
}

/// The message for a value beyond float32's range.
pub(crate) fn beyond_f32_problem(raw: &[u8]) -> String {
    format!(
        "{} is beyond the range of float32 (largest magnitude {:e}); it would become infinity",
        super::error::quote(raw),
        f32::MAX
    )
}

#[cold]
fn slow_classify(b: &[u8]) -> Kind {
    if parse_f32(b).is_some() {
        Kind::Float
    } else {
        Kind::Text
    }
}

/// Parses `--column NAME:DTYPE` (DTYPE one of int64, float32, bytes).
pub(crate) fn parse_override(text: &str) -> Result<(String, DType), ConvertError> {
    let bad = |why: &str| {
        ConvertError::options(
            ConvertOption::ColumnTypes,
            format!(
                "column type {text:?}: {why} (expected NAME:DTYPE with DTYPE int64, float32 or bytes, e.g. year:int64)"
            ),
        )
    };
    let (name, dtype) = text.rsplit_once(':').ok_or_else(|| bad("no ':'"))?;
    let dtype = match dtype.trim().to_ascii_lowercase().as_str() {
        "int64" | "int" => DType::Int64,
        "float32" | "float" => DType::Float32,
        "bytes" | "string" | "str" => DType::Bytes,
        other => return Err(bad(&format!("unknown dtype {other:?}"))),
    };
    if name.is_empty() {
        return Err(bad("empty column name"));
    }
    Ok((name.to_string(), dtype))
}

/// Whether `kind` fits a declared dtype.
pub(crate) fn fits(kind: Kind, dtype: DType) -> bool {
    match dtype {
        DType::Int64 => matches!(kind, Kind::Int),
        DType::Float32 => matches!(kind, Kind::Int | Kind::Float | Kind::BigInt),
        // Only int64, float32 and bytes are inferred; the raw dtypes read bytes.
        _ => true,
    }
}

pub(crate) fn dtype_name(dtype: DType) -> &'static str {
    dtype.name()
}

/// A column as the tabular converters resolve it after the first pass.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) dtype: DType,
    /// Some record holds a list (JSON arrays): var-length.
    pub(crate) list: bool,
    pub(crate) present: u64,
    pub(crate) missing: u64,
    /// For a text label: the sorted distinct values; the record stores the index.
    pub(crate) vocab: Option<Vec<Vec<u8>>>,
}

impl Column {
    /// The dtype stored in the records (a vocabulary label is int64).
    pub(crate) fn stored_dtype(&self) -> DType {
        if self.vocab.is_some() {
            DType::Int64
        } else {
            self.dtype
        }
    }
}

/// Resolves the label column: a text label gets a vocabulary (`values`: the
/// distinct values seen in the first pass).
pub(crate) fn vocabulary(values: BTreeSet<Vec<u8>>) -> Vec<Vec<u8>> {
    values.into_iter().collect()
}

/// The most distinct text values a label column may have: more is not a
/// class label (an id, free text), and its vocabulary would grow without
/// bound. The same for every tabular format.
pub(crate) const MAX_CLASSES: usize = 100_000;

/// Notes one text label value, keeping at most [`MAX_CLASSES`] + 1
/// distinct ones: enough to tell that the cap is passed, and no more memory.
pub(crate) fn note_label(labels: &mut BTreeSet<Vec<u8>>, value: &[u8]) {
    if labels.len() <= MAX_CLASSES && !labels.contains(value) {
        labels.insert(value.to_vec());
    }
}

/// The vocabulary of the text label column `column` (its distinct values,
/// sorted), or an error when it has more than [`MAX_CLASSES`].
pub(crate) fn label_vocabulary(
    column: &str,
    labels: BTreeSet<Vec<u8>>,
) -> Result<Vec<Vec<u8>>, ConvertError> {
    if labels.len() > MAX_CLASSES {
        return Err(ConvertError::options(
            ConvertOption::Label,
            format!(
                "label column {column:?}: more than {MAX_CLASSES} distinct text values; that is not a class label"
            ),
        ));
    }
    Ok(vocabulary(labels))
}

/// The schema of tabular columns, in input column order.
pub(crate) fn tabular_schema(columns: &[Column], label: Option<&str>, missing: Missing) -> Schema {
    let features = columns
        .iter()
        .map(|c| {
            let dtype = c.stored_dtype();
            let is_label = label == Some(c.name.as_str());
            let (layout, default) =
                if c.list || (!is_label && c.missing > 0 && missing == Missing::Var) {
                    (Layout::Var, None)
                } else if c.missing > 0 && !is_label {
                    let default = match dtype {
                        DType::Int64 => Value::Int64(vec![0]),
                        DType::Float32 => Value::Float32(vec![0.0]),
                        // Only int64, float32 and bytes are inferred.
                        _ => Value::Bytes(vec![Vec::new()]),
                    };
                    (Layout::Fixed(Vec::new()), Some(default))
                } else {
                    (Layout::Fixed(Vec::new()), None)
                };
            FeatureSpec {
                name: c.name.clone(),
                dtype,
                layout,
                default,
                image: None,
            }
        })
        .collect();
    Schema {
        features,
        label: label.map(str::to_string),
    }
}

/// What a tabular conversion (csv, json) hands to `finish`: the schema and
/// per-column metadata inferred from `columns`, with the counts.
pub(crate) struct TabularDone<'a> {
    pub(crate) format: &'static str,
    pub(crate) columns: &'a [Column],
    pub(crate) label: Option<&'a str>,
    pub(crate) missing: Missing,
    pub(crate) inputs: &'a [PathBuf],
    pub(crate) bytes_in: u64,
    pub(crate) bad: BadRows,
    /// For the summary (integers beyond int64 kept as text, ...).
    pub(crate) warnings: Vec<String>,
    /// The schema converted with (`--schema`): written out as it is.
    pub(crate) fixed: Option<&'a Schema>,
}

impl TabularDone<'_> {
    pub(crate) fn finished(self) -> Finished {
        Finished {
            schema: match self.fixed {
                Some(schema) => schema.clone(),
                None => tabular_schema(self.columns, self.label, self.missing),
            },
            format: self.format,
            inputs: self.inputs.to_vec(),
            bytes_in: self.bytes_in,
            rows_skipped: self.bad.count,
            bad_rows: self.bad.kept,
            extra: columns_metadata(self.columns),
            warnings: self.warnings,
        }
    }
}

/// Per-column metadata for the schema file: present and missing counts.
pub(crate) fn columns_metadata(columns: &[Column]) -> Map<String, Json> {
    let mut out = Map::new();
    let mut cols = Map::new();
    for c in columns {
        cols.insert(
            c.name.clone(),
            json!({ "present": c.present, "missing": c.missing, "source_dtype": dtype_name(c.dtype) }),
        );
    }
    out.insert("columns".into(), Json::Object(cols));
    if let Some(c) = columns.iter().find(|c| c.vocab.is_some())
        && let Some(vocab) = &c.vocab
    {
        out.insert(
            "label_vocabulary".into(),
            json!(
                vocab
                    .iter()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect::<Vec<_>>()
            ),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_numbers_and_text() {
        for (text, kind) in [
            ("0", Kind::Int),
            ("-12", Kind::Int),
            ("+7", Kind::Int),
            ("9223372036854775807", Kind::Int),
            ("9223372036854775808", Kind::BigInt),
            ("1.5", Kind::Float),
            ("-.5", Kind::Float),
            ("3.", Kind::Float),
            ("1e5", Kind::Float),
            ("2.5E-3", Kind::Float),
            ("inf", Kind::Float),
            ("NaN", Kind::Float),
            ("1e", Kind::Text),
            ("-", Kind::Text),
            (".", Kind::Text),
            ("2012/01/01", Kind::Text),
            ("male", Kind::Text),
            ("1,5", Kind::Text),
        ] {
            assert_eq!(classify(text.as_bytes()), kind, "{text}");
            // The invariant the second pass relies on.
            if kind == Kind::Int {
                assert!(parse_i64(text.as_bytes()).is_some(), "{text}");
            }
            if kind <= Kind::Float {
                assert!(parse_f32(text.as_bytes()).is_some(), "{text}");
            }
        }
    }

    #[test]
    fn parses_integers_with_overflow_checks() {
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"12a"), None);
        assert_eq!(parse_i64(b""), None);
        assert_eq!(parse_i64(b"-"), None);
    }

    #[test]
    fn trims_spaces_and_tabs() {
        assert_eq!(trim(b"  1.5\t"), b"1.5");
        assert_eq!(trim(b"   "), b"");
    }

    #[test]
    fn parses_overrides() {
        assert_eq!(
            parse_override("year:int64").unwrap(),
            ("year".into(), DType::Int64)
        );
        assert_eq!(
            parse_override("a:b:float32").unwrap(),
            ("a:b".into(), DType::Float32)
        );
        assert!(parse_override("year").is_err());
        assert!(
            parse_override("year:int32")
                .unwrap_err()
                .to_string()
                .contains("int32")
        );
    }

    proptest::proptest! {
        #[test]
        fn fast_float_parse_equals_std(text in "[-+]?[0-9]{0,9}(\\.[0-9]{0,10})?") {
            let std = std::str::from_utf8(text.as_bytes()).unwrap().parse::<f32>().ok();
            proptest::prop_assert_eq!(parse_f32(text.as_bytes()).map(f32::to_bits), std.map(f32::to_bits));
        }

        #[test]
        fn classification_agrees_with_parsers(text in "[-+]?[0-9]{0,20}(\\.[0-9]{0,5})?([eE][-+]?[0-9]{0,3})?") {
            let kind = classify(text.as_bytes());
            proptest::prop_assert_eq!(kind == Kind::Int, parse_i64(text.as_bytes()).is_some());
            proptest::prop_assert_eq!(kind <= Kind::BigInt, parse_f32(text.as_bytes()).is_some());
        }
    }
}
