//! Records as JSON, in exactly the per-record encoding of the TensorFlow
//! golden files (`testdata/tf-golden/README.md`): what `tfpipe cat` prints and
//! what tests compare conversions against.
//!
//! One record becomes
//! `{"index": i, "raw_length": n, "raw_sha256": "<hex>", "features": {...}}` for
//! an `Example`, or `... "context": {...}, "feature_lists": {...}}` for a
//! `SequenceExample`. A feature is `{"kind": K, "values": [...]}` with `K` one
//! of `"bytes_list"`, `"float_list"`, `"int64_list"` or `null` (no list set);
//! float lists also carry `"bits"` (`"0x%08x"` per value). Bytes are standard
//! base64 with padding, int64 decimal strings, floats the f32 widened to f64
//! (shortest round-trip form) except NaN, ±infinity and -0.0, which are the
//! strings `"NaN"`, `"Infinity"`, `"-Infinity"`, `"-0.0"`. Feature keys come
//! out sorted (the prost maps are `BTreeMap`s).
//!
//! The encoding is written straight from the borrowed prost message by
//! [`serde::Serialize`] impls, with no intermediate `serde_json::Value`;
//! [`record_json_value`] builds one when a test wants to compare values.
//!
//! ```
//! use prost::Message;
//! use tfpipe::example::json::{RecordJson, RecordType};
//! use tfpipe::example::proto::{feature, Example, Feature, Features, Int64List};
//!
//! let mut example = Example::default();
//! example.features.get_or_insert_with(Features::default).feature.insert(
//!     "id".into(),
//!     Feature { kind: Some(feature::Kind::Int64List(Int64List { value: vec![7] })) },
//! );
//! let raw = example.encode_to_vec();
//! let json = RecordJson::decode(0, &raw, RecordType::Example)?;
//! let line = serde_json::to_string(&json).unwrap();
//! assert!(line.ends_with(r#""features":{"id":{"kind":"int64_list","values":["7"]}}}"#));
//! # Ok::<(), prost::DecodeError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use prost::Message;
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use sha2::{Digest, Sha256};

use super::proto::{Example, Feature, FeatureList, SequenceExample, feature};

/// Which message a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordType {
    /// `tf.train.Example`.
    Example,
    /// `tf.train.SequenceExample`.
    Sequence,
}

impl RecordType {
    /// The type a record's wire format suggests: `Sequence` when it has a
    /// top-level field 2 of wire type length-delimited (`feature_lists`; an
    /// `Example` has only field 1), otherwise `Example`. A `SequenceExample`
    /// without feature lists is wire-identical to an `Example`, so this can
    /// only ever err towards `Example`; malformed bytes also give `Example`.
    pub fn sniff(raw: &[u8]) -> RecordType {
        let mut rest = raw;
        while let Some((key, after)) = read_varint(rest) {
            let (field, wire_type) = (key >> 3, key & 7);
            if field == 2 && wire_type == 2 {
                return RecordType::Sequence;
            }
            let skipped = match wire_type {
                0 => read_varint(after).map(|(_, r)| r),
                1 => after.get(8..),
                2 => read_varint(after)
                    .and_then(|(len, r)| usize::try_from(len).ok().and_then(|len| r.get(len..))),
                5 => after.get(4..),
                _ => None,
            };
            match skipped {
                Some(r) => rest = r,
                None => break,
            }
        }
        RecordType::Example
    }

    /// The protobuf message name, e.g. `tf.train.Example`.
    pub fn message_name(self) -> &'static str {
        match self {
            RecordType::Example => "tf.train.Example",
            RecordType::Sequence => "tf.train.SequenceExample",
        }
    }
}

fn read_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

/// A decoded record, ready to serialize in the golden encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordJson {
    /// The record's index in its file.
    pub index: u64,
    /// Bytes of the serialized record.
    pub raw_length: usize,
    /// Lowercase hex SHA-256 of the serialized record.
    pub raw_sha256: String,
    /// The decoded message.
    pub body: RecordBody,
}

/// The message inside a [`RecordJson`].
#[derive(Debug, Clone, PartialEq)]
pub enum RecordBody {
    /// A `tf.train.Example`.
    Example(Example),
    /// A `tf.train.SequenceExample`.
    Sequence(SequenceExample),
}

impl RecordJson {
    /// Decodes `raw` (the bytes of record `index`) as `record_type`.
    pub fn decode(
        index: u64,
        raw: &[u8],
        record_type: RecordType,
    ) -> Result<RecordJson, prost::DecodeError> {
        let body = match record_type {
            RecordType::Example => RecordBody::Example(Example::decode(raw)?),
            RecordType::Sequence => RecordBody::Sequence(SequenceExample::decode(raw)?),
        };
        Ok(RecordJson {
            index,
            raw_length: raw.len(),
            raw_sha256: sha256_hex(raw),
            body,
        })
    }
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for b in digest {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// `raw` (record `index`) decoded as `record_type`, as a JSON value.
pub fn record_json_value(
    index: u64,
    raw: &[u8],
    record_type: RecordType,
) -> Result<serde_json::Value, prost::DecodeError> {
    let record = RecordJson::decode(index, raw, record_type)?;
    // Serializing these types into a Value cannot fail: all map keys are strings
    // and all numbers are finite.
    Ok(serde_json::to_value(&record).unwrap_or(serde_json::Value::Null))
}

impl Serialize for RecordJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("index", &self.index)?;
        map.serialize_entry("raw_length", &self.raw_length)?;
        map.serialize_entry("raw_sha256", &self.raw_sha256)?;
        match &self.body {
            RecordBody::Example(example) => {
                let features = example.features.as_ref().map(|f| &f.feature);
                map.serialize_entry("features", &FeatureMap(features))?;
            }
            RecordBody::Sequence(sequence) => {
                let context = sequence.context.as_ref().map(|f| &f.feature);
                map.serialize_entry("context", &FeatureMap(context))?;
                let lists = sequence.feature_lists.as_ref().map(|l| &l.feature_list);
                map.serialize_entry("feature_lists", &FeatureListMap(lists))?;
            }
        }
        map.end()
    }
}

/// A `Features` map (absent serializes as `{}`, as TensorFlow reads it).
struct FeatureMap<'a>(Option<&'a BTreeMap<String, Feature>>);

impl Serialize for FeatureMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(self.0.map(BTreeMap::len))?;
        for (key, feature) in self.0.into_iter().flatten() {
            map.serialize_entry(key, &FeatureJson(feature))?;
        }
        map.end()
    }
}

struct FeatureListMap<'a>(Option<&'a BTreeMap<String, FeatureList>>);

impl Serialize for FeatureListMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(self.0.map(BTreeMap::len))?;
        for (key, list) in self.0.into_iter().flatten() {
            map.serialize_entry(key, &Steps(&list.feature))?;
        }
        map.end()
    }
}

struct Steps<'a>(&'a [Feature]);

impl Serialize for Steps<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for feature in self.0 {
            seq.serialize_element(&FeatureJson(feature))?;
        }
        seq.end()
    }
}

/// One `Feature`: `{"kind": ..., "values": [...]}` (+ `"bits"` for floats).
struct FeatureJson<'a>(&'a Feature);

impl Serialize for FeatureJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        match &self.0.kind {
            None => {
                map.serialize_entry("kind", &())?;
                map.serialize_entry("values", &[(); 0])?;
            }
            Some(feature::Kind::BytesList(list)) => {
                map.serialize_entry("kind", "bytes_list")?;
                map.serialize_entry("values", &BytesValues(&list.value))?;
            }
            Some(feature::Kind::FloatList(list)) => {
                map.serialize_entry("kind", "float_list")?;
                map.serialize_entry("values", &FloatValues(&list.value))?;
                map.serialize_entry("bits", &FloatBits(&list.value))?;
            }
            Some(feature::Kind::Int64List(list)) => {
                map.serialize_entry("kind", "int64_list")?;
                map.serialize_entry("values", &Int64Values(&list.value))?;
            }
        }
        map.end()
    }
}

struct BytesValues<'a>(&'a [Vec<u8>]);

impl Serialize for BytesValues<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for value in self.0 {
            seq.serialize_element(&BASE64.encode(value))?;
        }
        seq.end()
    }
}

struct Int64Values<'a>(&'a [i64]);

impl Serialize for Int64Values<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        let mut text = String::with_capacity(20);
        for value in self.0 {
            text.clear();
            let _ = write!(text, "{value}");
            seq.serialize_element(text.as_str())?;
        }
        seq.end()
    }
}

struct FloatValues<'a>(&'a [f32]);

impl Serialize for FloatValues<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for &value in self.0 {
            match float_text(value) {
                Some(text) => seq.serialize_element(text)?,
                // serde_json writes f64 in the shortest form that reads back
                // as the same f64, which is what the golden files hold.
                None => seq.serialize_element(&f64::from(value))?,
            }
        }
        seq.end()
    }
}

/// The string form of a float that JSON numbers cannot carry (or would lose
/// the sign of): NaN, ±infinity, -0.0.
pub fn float_text(value: f32) -> Option<&'static str> {
    if value.is_nan() {
        Some("NaN")
    } else if value == f32::INFINITY {
        Some("Infinity")
    } else if value == f32::NEG_INFINITY {
        Some("-Infinity")
    } else if value == 0.0 && value.is_sign_negative() {
        Some("-0.0")
    } else {
        None
    }
}

struct FloatBits<'a>(&'a [f32]);

impl Serialize for FloatBits<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        let mut text = String::with_capacity(10);
        for value in self.0 {
            text.clear();
            let _ = write!(text, "{:#010x}", value.to_bits());
            seq.serialize_element(text.as_str())?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::proto::{BytesList, FeatureLists, Features, FloatList, Int64List};

    fn feature(kind: feature::Kind) -> Feature {
        Feature { kind: Some(kind) }
    }

    #[test]
    fn encodes_every_kind_and_special_float() {
        let mut features = Features::default();
        features.feature.insert(
            "f".into(),
            feature(feature::Kind::FloatList(FloatList {
                value: vec![f32::NAN, f32::NEG_INFINITY, -0.0, 0.0, 0.1, f32::MAX],
            })),
        );
        features.feature.insert(
            "b".into(),
            feature(feature::Kind::BytesList(BytesList {
                value: vec![vec![], vec![0xff, 0], b"hi".to_vec()],
            })),
        );
        features.feature.insert(
            "i".into(),
            feature(feature::Kind::Int64List(Int64List {
                value: vec![i64::MIN, -1],
            })),
        );
        features.feature.insert("n".into(), Feature { kind: None });
        let raw = Example {
            features: Some(features),
        }
        .encode_to_vec();
        let value = record_json_value(3, &raw, RecordType::Example).unwrap();
        let expected = serde_json::json!({
            "index": 3,
            "raw_length": raw.len(),
            "raw_sha256": sha256_hex(&raw),
            "features": {
                "b": {"kind": "bytes_list", "values": ["", "/wA=", "aGk="]},
                "f": {"kind": "float_list",
                      "values": ["NaN", "-Infinity", "-0.0", 0.0, 0.10000000149011612, 3.4028234663852886e38],
                      "bits": ["0x7fc00000", "0xff800000", "0x80000000", "0x00000000", "0x3dcccccd", "0x7f7fffff"]},
                "i": {"kind": "int64_list", "values": ["-9223372036854775808", "-1"]},
                "n": {"kind": null, "values": []},
            }
        });
        assert_eq!(value, expected);
    }

    #[test]
    fn sniffs_sequence_examples() {
        let mut lists = FeatureLists::default();
        lists
            .feature_list
            .insert("t".into(), FeatureList { feature: vec![] });
        let sequence = SequenceExample {
            context: Some(Features::default()),
            feature_lists: Some(lists),
        };
        let raw = sequence.encode_to_vec();
        assert_eq!(RecordType::sniff(&raw), RecordType::Sequence);
        let value = record_json_value(0, &raw, RecordType::Sequence).unwrap();
        assert_eq!(value["context"], serde_json::json!({}));
        assert_eq!(value["feature_lists"], serde_json::json!({"t": []}));
        assert_eq!(
            RecordType::sniff(&Example::default().encode_to_vec()),
            RecordType::Example
        );
        assert_eq!(RecordType::sniff(&[0xff, 0xff]), RecordType::Example);
    }

    #[test]
    fn sha256_of_empty_input() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
