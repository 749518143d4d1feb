//! TensorFlow 2.21's answers for the semantics cases in
//! `testdata/tf-semantics/expected.json` (made by `make.py` beside it): tfpipe
//! must give the same answer, except for the deliberate differences listed in
//! `DIFFERENCES` (and in the README's "Deliberate differences from TensorFlow"),
//! where this test checks our answer and that TensorFlow's is still the other one.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::Value as Json;
use tfpipe::example::{BatchParser, ParseError, Schema};
use tfpipe::{Batch, Column, Values};

const EXPECTED: &str = include_str!("../../testdata/tf-semantics/expected.json");

/// What tfpipe does where it deliberately differs from TensorFlow.
enum Ours {
    /// Parses; the check looks at the batch.
    Ok(fn(&Batch)),
    /// A malformed-protobuf error (of the record, or inside the feature).
    Malformed,
    /// An error about the feature.
    FeatureError(&'static str),
}

/// (case, whether TensorFlow succeeds, what tfpipe does)
const DIFFERENCES: &[(&str, bool, Ours)] = &[
    (
        "sequence_context_kindless_feature",
        false,
        Ours::Ok(|b| assert_eq!(b.columns[0].as_i64(), Some(&[7][..]))),
    ),
    (
        "sequence_empty_batch",
        false,
        Ours::Ok(|b| assert_eq!(b.num_rows, 0)),
    ),
    (
        "float_default_long_decimal",
        true,
        // The decimal lies above the midpoint of 1.0 and the next float32: one
        // rounding gives 0x3f800001; TF's Python float (f64) then float32 gives 1.0.
        Ours::Ok(|b| {
            let x = b.columns[0].as_f32().unwrap();
            assert_eq!(x[0].to_bits(), 0x3f80_0001);
        }),
    ),
    ("overlong_varint", true, Ours::Malformed),
    ("packed_float_not_multiple_of_4", true, Ours::Malformed),
    ("example_field_1_varint", true, Ours::Malformed),
    (
        "zero_size_default_empty_list",
        false,
        Ours::Ok(|b| {
            assert_eq!(b.num_rows, 1);
            assert_eq!(b.columns[0].as_f32(), Some(&[][..]));
            assert_eq!(b.columns[0].inner_shape, vec![0]);
        }),
    ),
    (
        "ragged_splits_bad_start",
        true,
        Ours::FeatureError("row split 0 is 1"),
    ),
    (
        "ragged_validate_false_bad_sum",
        true,
        Ours::FeatureError("row lengths sum to 2, but there are 3 rows"),
    ),
    (
        "sparse_index_out_of_range",
        true,
        Ours::FeatureError("index 0 is 8, outside 0..8"),
    ),
    (
        "sparse_index_negative",
        true,
        Ours::FeatureError("index 0 is -1, outside 0..8"),
    ),
    (
        "sparse_index_twice",
        true,
        Ours::FeatureError("values 0 and 1 have the same index [1]"),
    ),
];

fn schema_of(case: &Json) -> Schema {
    match case["specs"].as_array() {
        Some(specs) => {
            let texts: Vec<&str> = specs.iter().map(|s| s.as_str().unwrap()).collect();
            Schema::from_feature_texts(&texts).unwrap()
        }
        // The one case only the schema file can state: a default of no values.
        None => Schema::from_json_str(
            r#"{"features": [{"name": "x", "dtype": "float32", "shape": [0], "default": []}]}"#,
        )
        .unwrap(),
    }
}

fn encode(values: &Values) -> Vec<Json> {
    let ints = |v: Vec<i64>| v.into_iter().map(Json::from).collect();
    match values {
        Values::Int64(v) => ints(v.clone()),
        Values::Uint8(v) => ints(v.iter().map(|&x| i64::from(x)).collect()),
        Values::Int16(v) => ints(v.iter().map(|&x| i64::from(x)).collect()),
        Values::Uint16(v) => ints(v.iter().map(|&x| i64::from(x)).collect()),
        Values::Int32(v) => ints(v.iter().map(|&x| i64::from(x)).collect()),
        Values::Float32(v) => v
            .iter()
            .map(|x| Json::from(format!("{:08x}", x.to_bits())))
            .collect(),
        Values::Float64(v) => v
            .iter()
            .map(|x| Json::from(format!("{:016x}", x.to_bits())))
            .collect(),
        Values::Sparse { values, .. } => encode(values),
        Values::Bytes { .. } => (0..values.len())
            .map(|i| Json::from(BASE64.encode(values.bytes(i).unwrap())))
            .collect(),
    }
}

/// Our ragged column padded to TensorFlow's dense `[rows, max, inner...]` with
/// zeros (empty strings), as `FixedLenSequenceFeature` returns it.
fn padded(column: &Column, shape: &[usize]) -> Vec<Json> {
    let values = encode(&column.values);
    let zero = match column.values {
        Values::Float32(_) => Json::from("00000000"),
        Values::Bytes { .. } => Json::from(""),
        _ => Json::from(0),
    };
    let inner = column.inner_len();
    let max = shape.get(1).copied().unwrap_or(0);
    let mut out = Vec::new();
    for row in 0..column.num_rows() {
        let range = column.row_range(row).unwrap();
        out.extend_from_slice(&values[range.clone()]);
        out.extend(std::iter::repeat_n(zero.clone(), max * inner - range.len()));
    }
    out
}

fn compare(name: &str, batch: &Batch, tf: &Json) {
    for (feature, want) in tf.as_object().unwrap() {
        let column = batch.column(feature).unwrap();
        if let Some(indices) = want.get("sparse_indices") {
            assert_eq!(
                Json::from(column.sparse_indices()),
                *indices,
                "{name}: {feature}"
            );
            assert_eq!(
                Json::from(encode(&column.values)),
                want["values"],
                "{name}: {feature}"
            );
            let shape: Vec<usize> = serde_json::from_value(want["dense_shape"].clone()).unwrap();
            assert_eq!(column.dense_shape(), shape, "{name}: {feature}");
            continue;
        }
        if let Some(dense) = want.get("padded") {
            let shape: Vec<usize> = serde_json::from_value(want["shape"].clone()).unwrap();
            assert_eq!(column.dense_shape(), shape, "{name}: {feature}");
            assert_eq!(
                &Json::from(padded(column, &shape)),
                dense,
                "{name}: {feature}"
            );
            continue;
        }
        assert_eq!(
            Json::from(encode(&column.values)),
            want["values"],
            "{name}: {feature} values"
        );
        let splits: Vec<Vec<usize>> = serde_json::from_value(want["row_splits"].clone()).unwrap();
        assert_eq!(column.row_splits, splits, "{name}: {feature} row_splits");
        let inner: Vec<usize> = serde_json::from_value(want["inner_shape"].clone()).unwrap();
        assert_eq!(column.inner_shape, inner, "{name}: {feature} inner_shape");
    }
}

#[test]
fn tfpipe_gives_tensorflows_answers_except_the_documented_differences() {
    let expected: Json = serde_json::from_str(EXPECTED).unwrap();
    assert_eq!(expected["tensorflow"], "2.21.0");
    let cases = expected["cases"].as_array().unwrap();
    let mut differences_seen = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let records: Vec<Vec<u8>> = case["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| BASE64.decode(r.as_str().unwrap()).unwrap())
            .collect();
        let mut parser = BatchParser::new(schema_of(case)).unwrap();
        let ours = parser.parse(&records);
        let tf = &case["tf"];
        if let Some((_, tf_ok, want)) = DIFFERENCES.iter().find(|(n, ..)| *n == name) {
            differences_seen += 1;
            assert_eq!(
                tf.get("ok").is_some(),
                *tf_ok,
                "{name}: TensorFlow's answer changed: {tf}"
            );
            match (want, ours) {
                (Ours::Ok(check), Ok(batch)) => check(&batch),
                (Ours::Malformed, Err(err)) if err.to_string().contains("malformed protobuf") => {}
                (Ours::FeatureError(needle), Err(err @ ParseError::Feature { .. })) => {
                    assert!(err.to_string().contains(needle), "{name}: {err}")
                }
                (_, other) => panic!("{name}: unexpected {other:?}"),
            }
            continue;
        }
        match (tf.get("ok"), ours) {
            (Some(want), Ok(batch)) => {
                assert_eq!(batch.num_rows, records.len(), "{name}");
                compare(name, &batch, want);
            }
            (None, Err(_)) => {}
            (want, ours) => panic!("{name}: TensorFlow gives {want:?} ({tf}), tfpipe {ours:?}"),
        }
    }
    assert_eq!(differences_seen, DIFFERENCES.len());
    assert!(cases.len() >= 40);
}

/// The JSON schema file parses a float32 default straight to f32, like the text form.
#[test]
fn float_defaults_are_rounded_once_in_both_forms() {
    let decimal = "1.00000005960464477560746544742179795794254798";
    let text = Schema::from_feature_texts(&[format!("x:float32={decimal}")]).unwrap();
    let json = Schema::from_json_str(&format!(
        r#"{{"features": [{{"name": "x", "dtype": "float32", "default": [{decimal}]}}]}}"#
    ))
    .unwrap();
    assert_eq!(text, json);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    std::fs::write(
        &path,
        format!(
            r#"{{"features": [{{"name": "x", "dtype": "float32", "shape": [2], "default": [{decimal}, 0.1]}}]}}"#
        ),
    )
    .unwrap();
    let loaded = Schema::load(&path).unwrap();
    assert_eq!(
        loaded.features[0].default,
        Some(tfpipe::example::Value::Float32(vec![
            f32::from_bits(0x3f80_0001),
            0.1
        ]))
    );
}
