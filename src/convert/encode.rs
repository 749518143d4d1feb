//! Hand-written protobuf encoding of `tf.train.Example`, straight from row
//! values into a reused buffer: no prost structs, no per-feature allocation.
//!
//! Invariant: features must be added in increasing key order (byte order).
//! The result is then exactly prost's canonical encoding of the same Example
//! (prost, configured with `BTreeMap` maps, writes map entries sorted by key;
//! a unit test and a property test check the equality byte for byte). The
//! wire layout, per feature:
//!
//! ```text
//! Features.feature entry: 0x0a len { 0x0a len key, 0x12 len Feature }
//! Feature:                0x0a len BytesList | 0x12 len FloatList | 0x1a len Int64List
//! BytesList:              (0x0a len bytes)*          (repeated, unpacked)
//! FloatList / Int64List:  0x0a len (f32 LE | varint)* (packed; omitted when empty)
//! Example:                0x0a len Features
//! ```

/// Builds one serialized Example at a time. Reuse it for every record.
#[derive(Debug, Default)]
pub(crate) struct ExampleEncoder {
    /// The encoded map entries of the Example being built.
    features: Vec<u8>,
    #[cfg(debug_assertions)]
    last_key: Vec<u8>,
}

#[inline]
pub(crate) fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

#[inline]
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

impl ExampleEncoder {
    /// Starts a new Example.
    #[inline]
    pub(crate) fn begin(&mut self) {
        self.features.clear();
        #[cfg(debug_assertions)]
        self.last_key.clear();
    }

    #[inline]
    fn entry_header(&mut self, key: &[u8], kind_tag: u8, list_len: usize) {
        #[cfg(debug_assertions)]
        {
            debug_assert!(
                self.last_key.is_empty() || self.last_key.as_slice() < key,
                "feature keys must be added in increasing order"
            );
            self.last_key.clear();
            self.last_key.extend_from_slice(key);
        }
        // Feature = tag + len + list.
        let feature_len = 1 + varint_len(list_len as u64) + list_len;
        // prost omits a map key equal to the default (the empty string).
        let key_part = if key.is_empty() {
            0
        } else {
            1 + varint_len(key.len() as u64) + key.len()
        };
        let entry_len = key_part + 1 + varint_len(feature_len as u64) + feature_len;
        let out = &mut self.features;
        out.push(0x0a);
        put_varint(out, entry_len as u64);
        if !key.is_empty() {
            out.push(0x0a);
            put_varint(out, key.len() as u64);
            out.extend_from_slice(key);
        }
        out.push(0x12);
        put_varint(out, feature_len as u64);
        out.push(kind_tag);
        put_varint(out, list_len as u64);
    }

    /// Adds an `int64_list` feature.
    #[inline]
    pub(crate) fn int64s(&mut self, key: &[u8], values: &[i64]) {
        let payload: usize = values.iter().map(|&v| varint_len(v as u64)).sum();
        let list_len = if values.is_empty() {
            0
        } else {
            1 + varint_len(payload as u64) + payload
        };
        self.entry_header(key, 0x1a, list_len);
        if !values.is_empty() {
            self.features.push(0x0a);
            put_varint(&mut self.features, payload as u64);
            for &v in values {
                put_varint(&mut self.features, v as u64);
            }
        }
    }

    /// Adds an `int64_list` feature with one value.
    #[inline]
    pub(crate) fn int64(&mut self, key: &[u8], value: i64) {
        self.int64s(key, &[value]);
    }

    /// Adds a `float_list` feature.
    #[inline]
    pub(crate) fn floats(&mut self, key: &[u8], values: &[f32]) {
        self.floats_from(key, values.len(), values.iter().copied());
    }

    /// Adds a `float_list` feature of `n` values taken from `values`.
    #[inline]
    pub(crate) fn floats_from(&mut self, key: &[u8], n: usize, values: impl Iterator<Item = f32>) {
        let payload = 4 * n;
        let list_len = if n == 0 {
            0
        } else {
            1 + varint_len(payload as u64) + payload
        };
        self.entry_header(key, 0x12, list_len);
        if n != 0 {
            self.features.push(0x0a);
            put_varint(&mut self.features, payload as u64);
            let start = self.features.len();
            for v in values.take(n) {
                self.features.extend_from_slice(&v.to_le_bytes());
            }
            debug_assert_eq!(self.features.len() - start, payload);
        }
    }

    /// Adds a `float_list` feature with one value.
    #[inline]
    pub(crate) fn float(&mut self, key: &[u8], value: f32) {
        self.floats(key, &[value]);
    }

    /// Adds a `bytes_list` feature.
    #[inline]
    pub(crate) fn bytes_list<'v>(
        &mut self,
        key: &[u8],
        values: impl Iterator<Item = &'v [u8]> + Clone,
    ) {
        let list_len: usize = values
            .clone()
            .map(|v| 1 + varint_len(v.len() as u64) + v.len())
            .sum();
        self.entry_header(key, 0x0a, list_len);
        for v in values {
            self.features.push(0x0a);
            put_varint(&mut self.features, v.len() as u64);
            self.features.extend_from_slice(v);
        }
    }

    /// Adds a `bytes_list` feature with one value.
    #[inline]
    pub(crate) fn bytes(&mut self, key: &[u8], value: &[u8]) {
        self.bytes_list(key, std::iter::once(value));
    }

    /// Appends the finished Example to `out`; returns its length.
    #[inline]
    pub(crate) fn finish_into(&self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.push(0x0a);
        put_varint(out, self.features.len() as u64);
        out.extend_from_slice(&self.features);
        out.len() - start
    }

    /// The finished Example as a new vector (tests, small inputs).
    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.finish_into(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::example::proto::{
        BytesList, Example, Feature, Features, FloatList, Int64List, feature,
    };

    #[derive(Debug, Clone)]
    enum Val {
        I(Vec<i64>),
        F(Vec<f32>),
        B(Vec<Vec<u8>>),
    }

    fn both(features: &BTreeMap<String, Val>) -> (Vec<u8>, Vec<u8>) {
        let mut enc = ExampleEncoder::default();
        enc.begin();
        let mut map = BTreeMap::new();
        for (key, val) in features {
            let kind = match val {
                Val::I(v) => {
                    enc.int64s(key.as_bytes(), v);
                    feature::Kind::Int64List(Int64List { value: v.clone() })
                }
                Val::F(v) => {
                    enc.floats(key.as_bytes(), v);
                    feature::Kind::FloatList(FloatList { value: v.clone() })
                }
                Val::B(v) => {
                    enc.bytes_list(key.as_bytes(), v.iter().map(|b| b.as_slice()));
                    feature::Kind::BytesList(BytesList { value: v.clone() })
                }
            };
            map.insert(key.clone(), Feature { kind: Some(kind) });
        }
        let example = Example {
            features: Some(Features { feature: map }),
        };
        (enc.to_vec(), example.encode_to_vec())
    }

    #[test]
    fn equals_prost_on_a_typical_row() {
        let mut f = BTreeMap::new();
        f.insert("age".to_string(), Val::I(vec![42]));
        f.insert("neg".to_string(), Val::I(vec![-1, i64::MIN, 0]));
        f.insert("score".to_string(), Val::F(vec![1.5, f32::NAN]));
        f.insert("name".to_string(), Val::B(vec![b"x".to_vec(), Vec::new()]));
        f.insert("empty_i".to_string(), Val::I(vec![]));
        f.insert("empty_f".to_string(), Val::F(vec![]));
        f.insert("empty_b".to_string(), Val::B(vec![]));
        f.insert(String::new(), Val::I(vec![7]));
        let (ours, theirs) = both(&f);
        assert_eq!(ours, theirs);
        // And it decodes back.
        let back = Example::decode(ours.as_slice()).unwrap();
        assert_eq!(back.features.unwrap().feature.len(), 8);
    }

    #[test]
    fn empty_example_equals_prost() {
        let (ours, theirs) = both(&BTreeMap::new());
        assert_eq!(ours, theirs);
    }

    fn val() -> impl Strategy<Value = Val> {
        prop_oneof![
            prop::collection::vec(any::<i64>(), 0..5).prop_map(Val::I),
            prop::collection::vec(any::<f32>(), 0..40).prop_map(Val::F),
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 0..4)
                .prop_map(Val::B),
        ]
    }

    proptest! {
        #[test]
        fn hand_encoding_equals_prost(features in prop::collection::btree_map(".{0,12}", val(), 0..8)) {
            let (ours, theirs) = both(&features);
            // Compare bits: NaN payloads must survive too.
            prop_assert_eq!(ours, theirs);
        }
    }
}
