//! Helpers shared by the decode tests: reading golden files, TF-spec -> Schema,
//! and comparing our columns with TensorFlow's dense/sparse JSON tensors.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::Value as Json;
use tfpipe::example::{DType, FeatureSpec, Layout, Value};
use tfpipe::tfrecord::{FileRecordReader, ReaderOptions};
use tfpipe::{Column, Values};

pub fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/tf-golden")
        .join(name)
}

pub fn read_json(name: &str) -> Json {
    let text = std::fs::read_to_string(golden(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn read_records(name: &str) -> Vec<Vec<u8>> {
    let mut reader = FileRecordReader::open(golden(name), ReaderOptions::default()).unwrap();
    let mut records = Vec::new();
    let mut record = Vec::new();
    while reader.read_record(&mut record).unwrap() {
        records.push(record.clone());
    }
    records
}

fn tf_dtype(dtype: &Json) -> DType {
    match dtype.as_str().unwrap() {
        "int64" => DType::Int64,
        "float32" => DType::Float32,
        "string" => DType::Bytes,
        other => panic!("dtype {other}"),
    }
}

pub fn int(v: &Json) -> i64 {
    v.as_str().unwrap().parse().unwrap()
}

/// A float in the golden encoding, as its f32 bit pattern (NaN as the canonical
/// quiet NaN: the golden tensors carry no NaN payload).
pub fn float_bits(v: &Json) -> u32 {
    match v {
        Json::Number(n) => (n.as_f64().unwrap() as f32).to_bits(),
        Json::String(s) => match s.as_str() {
            "NaN" => f32::NAN.to_bits(),
            "Infinity" => f32::INFINITY.to_bits(),
            "-Infinity" => f32::NEG_INFINITY.to_bits(),
            "-0.0" => (-0.0f32).to_bits(),
            other => panic!("float {other}"),
        },
        other => panic!("float {other}"),
    }
}

pub fn bytes(v: &Json) -> Vec<u8> {
    BASE64.decode(v.as_str().unwrap()).unwrap()
}

/// A TensorFlow feature spec from the golden JSON (`FixedLenFeature`, `VarLenFeature`,
/// `FixedLenSequenceFeature`); `sequence` marks specs from a `sequence_spec`.
pub fn tf_spec(name: &str, spec: &Json, sequence: bool) -> FeatureSpec {
    let dtype = tf_dtype(&spec["dtype"]);
    let shape = || -> Vec<usize> {
        spec["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect()
    };
    let layout = match (spec["type"].as_str().unwrap(), sequence) {
        ("FixedLenFeature", false) => Layout::Fixed(shape()),
        ("VarLenFeature", false) => Layout::Var,
        ("FixedLenSequenceFeature", true) => Layout::FixedSequence(shape()),
        ("VarLenFeature", true) => Layout::VarSequence,
        (other, _) => panic!("spec type {other}"),
    };
    let default = spec
        .get("default_value")
        .and_then(Json::as_array)
        .map(|values| match dtype {
            DType::Int64 => Value::Int64(values.iter().map(int).collect()),
            DType::Float32 => Value::Float32(
                values
                    .iter()
                    .map(|v| f32::from_bits(float_bits(v)))
                    .collect(),
            ),
            _ => Value::Bytes(values.iter().map(bytes).collect()),
        });
    FeatureSpec {
        name: name.to_string(),
        dtype,
        layout,
        default,
        image: None,
    }
}

/// Checks that `values` (a golden tensor's flat values) equal `column`'s.
pub fn assert_values(what: &str, column: &Column, values: &Json) {
    let values = values.as_array().unwrap();
    assert_eq!(column.values.len(), values.len(), "{what}: value count");
    match &column.values {
        Values::Int64(ours) => {
            let want: Vec<i64> = values.iter().map(int).collect();
            assert_eq!(ours, &want, "{what}");
        }
        Values::Float32(ours) => {
            for (i, (ours, want)) in ours.iter().zip(values).enumerate() {
                let want = float_bits(want);
                if f32::from_bits(want).is_nan() {
                    assert!(ours.is_nan(), "{what}[{i}]: {ours} is not NaN");
                } else {
                    assert_eq!(ours.to_bits(), want, "{what}[{i}]: {ours}");
                }
            }
        }
        Values::Bytes { .. } => {
            for (i, want) in values.iter().enumerate() {
                assert_eq!(column.bytes(i).unwrap(), bytes(want), "{what}[{i}]");
            }
        }
        other => panic!("{what}: no {} in the golden files", other.dtype()),
    }
}

pub fn usizes(v: &Json) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

/// Checks `column` against a golden `<tensor>` (dense or sparse). With
/// `drop_row`, the tensor is of a single record (parse_single_*): the batch's row
/// dimension is left out of its shapes and indices.
pub fn assert_tensor(what: &str, column: &Column, tensor: &Json, drop_row: bool) {
    let skip = usize::from(drop_row);
    if tensor["sparse"].as_bool().unwrap() {
        let indices: Vec<Vec<usize>> = column
            .sparse_indices()
            .into_iter()
            .map(|i| i[skip..].to_vec())
            .collect();
        let want: Vec<Vec<usize>> = tensor["indices"]
            .as_array()
            .unwrap()
            .iter()
            .map(usizes)
            .collect();
        assert_eq!(indices, want, "{what}: indices");
        assert_eq!(
            &column.dense_shape()[skip..],
            usizes(&tensor["dense_shape"]),
            "{what}: dense_shape"
        );
    } else {
        assert_eq!(
            &column.dense_shape()[skip..],
            usizes(&tensor["shape"]),
            "{what}: shape"
        );
    }
    assert_values(what, column, &tensor["values"]);
}
