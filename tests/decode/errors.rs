//! TensorFlow's error semantics, and malformed input.

use prost::Message;
use tfpipe::example::proto::{self, feature::Kind};
use tfpipe::example::{BatchParser, Example, ParseError, Schema};

use super::common::*;

fn parser(texts: &[&str]) -> BatchParser {
    BatchParser::new(Schema::from_feature_texts(texts).unwrap()).unwrap()
}

fn example(features: &[(&str, Option<Kind>)]) -> Vec<u8> {
    Example {
        features: Some(proto::Features {
            feature: features
                .iter()
                .map(|(k, kind)| (k.to_string(), proto::Feature { kind: kind.clone() }))
                .collect(),
        }),
    }
    .encode_to_vec()
}

fn ints(v: &[i64]) -> Option<Kind> {
    Some(Kind::Int64List(proto::Int64List { value: v.to_vec() }))
}

fn floats(v: &[f32]) -> Option<Kind> {
    Some(Kind::FloatList(proto::FloatList { value: v.to_vec() }))
}

fn byte_values(v: &[&[u8]]) -> Option<Kind> {
    Some(Kind::BytesList(proto::BytesList {
        value: v.iter().map(|b| b.to_vec()).collect(),
    }))
}

fn feature_error(err: ParseError) -> (usize, String, String) {
    match err {
        ParseError::Feature {
            record,
            feature,
            reason,
        } => (record, feature, reason),
        other => panic!("expected a feature error, got {other}"),
    }
}

#[test]
fn present_but_empty_fixed_is_an_error_even_with_default() {
    let ok = example(&[("x", ints(&[1]))]);
    let empty = example(&[("x", ints(&[]))]);
    let mut p = parser(&["x:int64=5"]);
    let (record, feature, reason) = feature_error(p.parse(&[&ok, &ok, &empty]).unwrap_err());
    assert_eq!((record, feature.as_str()), (2, "x"));
    assert!(reason.contains("present but empty"), "{reason}");
    // Var-length: an empty list is no values.
    let batch = parser(&["x:int64:var"]).parse(&[&ok, &empty]).unwrap();
    assert_eq!(batch.columns[0].row_splits, vec![vec![0, 1, 1]]);
}

#[test]
fn golden_empty_lists_under_fixed_specs() {
    // `tags` holds an empty bytes_list in some golden records.
    let content = read_json("examples.tfrecord.json");
    let first_empty = content["records"]
        .as_array()
        .unwrap()
        .iter()
        .position(|r| {
            r["features"].get("tags").is_some_and(|t| {
                t["values"].as_array().unwrap().is_empty() && t["kind"] == "bytes_list"
            })
        })
        .unwrap();
    let records = read_records("examples.tfrecord");
    let err = parser(&["tags:bytes=x"])
        .parse(&records[first_empty..])
        .unwrap_err();
    let (record, feature, reason) = feature_error(err);
    assert_eq!((record, feature.as_str()), (0, "tags"));
    assert!(reason.contains("present but empty"), "{reason}");
}

#[test]
fn wrong_kind_names_expected_and_found() {
    let records = read_records("examples.tfrecord");
    let err = parser(&["id:float32"]).parse(&records).unwrap_err();
    assert_eq!(err.record(), 0);
    let message = err.to_string();
    assert!(message.contains("record 0: feature \"id\""), "{message}");
    assert!(
        message.contains("expected float_list (dtype float32), found int64_list"),
        "{message}"
    );
    let err = parser(&["x:uint8:2"])
        .parse(&[example(&[("x", ints(&[1, 2]))])])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("expected bytes_list (dtype uint8), found int64_list"),
        "{err}"
    );
}

#[test]
fn wrong_count() {
    let mut p = parser(&["x:float32:3"]);
    let err = p
        .parse(&[example(&[("x", floats(&[1.0, 2.0]))])])
        .unwrap_err();
    assert!(
        err.to_string().contains("has 2 values, expected 3"),
        "{err}"
    );
    let mut p = parser(&["img:uint8:2x2"]);
    let err = p
        .parse(&[example(&[("img", byte_values(&[b"abc"]))])])
        .unwrap_err();
    assert!(err.to_string().contains("3 bytes, expected 4"), "{err}");
    let err = p
        .parse(&[example(&[("img", byte_values(&[b"ab", b"cd"]))])])
        .unwrap_err();
    assert!(err.to_string().contains("found 2 values"), "{err}");
    let err = p
        .parse(&[example(&[("img", byte_values(&[]))])])
        .unwrap_err();
    assert!(err.to_string().contains("present but empty"), "{err}");
}

#[test]
fn missing_without_default_names_feature_and_record() {
    let content = read_json("examples.tfrecord.json");
    let first_missing = content["records"]
        .as_array()
        .unwrap()
        .iter()
        .position(|r| r["features"].get("label").is_none())
        .unwrap();
    let records = read_records("examples.tfrecord");
    let err = parser(&["id:int64", "label:bytes"])
        .parse(&records)
        .unwrap_err();
    let (record, feature, reason) = feature_error(err);
    assert_eq!((record, feature.as_str()), (first_missing, "label"));
    assert!(reason.contains("no default"), "{reason}");
    // Records 13 and 27 hold a kind-less `nokind`: missing too.
    let mut p = parser(&["nokind:int64"]);
    let err = p.parse(&records[13..14]).unwrap_err();
    assert!(
        err.to_string().contains("a Feature with no list set"),
        "{err}"
    );
    let batch = parser(&["nokind:int64=9"]).parse(&records).unwrap();
    assert_eq!(batch.columns[0].as_i64().unwrap(), &[9; 50][..]);
}

#[test]
fn uint8_default_and_missing() {
    let mut p = parser(&["img:uint8:3=7", "n:int64"]);
    let batch = p
        .parse(&[
            example(&[("n", ints(&[1]))]),
            example(&[("img", byte_values(&[b"abc"])), ("n", ints(&[2]))]),
        ])
        .unwrap();
    assert_eq!(
        batch.columns[0].as_u8().unwrap(),
        &[7, 7, 7, b'a', b'b', b'c']
    );
}

#[test]
fn malformed_records_are_errors_with_an_offset() {
    let good = example(&[("x", ints(&[1, 2, 3])), ("y", byte_values(&[b"hello"]))]);
    let mut p = parser(&["x:int64:var", "y:bytes:var"]);
    assert!(p.parse(&[&good]).is_ok());
    for cut in 1..good.len() {
        match p.parse(&[&good, &good[..cut].to_vec()]) {
            Ok(_) => panic!("truncated at {cut} parsed"),
            Err(err) => {
                assert_eq!(err.record(), 1, "{err}");
                assert!(err.to_string().contains("at byte"), "{err}");
            }
        }
    }
    let err = p.parse(&[&[0x0au8, 0x05, 0x0a][..]]).unwrap_err();
    assert!(
        matches!(err, ParseError::Malformed { record: 0, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("runs past the end"), "{err}");
    let err = p.parse(&[&[0x18u8, 0xff, 0xff][..]]).unwrap_err();
    assert!(
        err.to_string().contains("truncated varint at byte 1"),
        "{err}"
    );
    let err = p.parse(&[&[0x00u8][..]]).unwrap_err();
    assert!(err.to_string().contains("field number 0"), "{err}");
    // Example.features with a varint wire type.
    let err = p.parse(&[&[0x08u8, 0x01][..]]).unwrap_err();
    assert!(err.to_string().contains("wrong wire type"), "{err}");
}

#[test]
fn missing_feature_suggests_the_nearest_key() {
    let record = example(&[
        ("image_raw", byte_values(&[b"abcd"])),
        ("label", ints(&[1])),
    ]);
    let err = parser(&["image_rw:uint8:4", "label:int64"])
        .parse(&[&record])
        .unwrap_err()
        .to_string();
    assert!(err.contains("did you mean \"image_raw\"?"), "{err}");
    // Nothing near: no suggestion; a typo of another schema feature is suggested.
    let err = parser(&["weights:float32"])
        .parse(&[&record])
        .unwrap_err()
        .to_string();
    assert!(!err.contains("did you mean"), "{err}");
    let empty = example(&[]);
    let err = parser(&["labels:int64", "label:int64=0"])
        .parse(&[&empty])
        .unwrap_err()
        .to_string();
    assert!(err.contains("did you mean \"label\"?"), "{err}");
}

/// Library messages never name CLI flags (the CLI adds the hint).
#[test]
fn messages_name_no_cli_flags() {
    let record = example(&[("x", floats(&[1.0, 2.0, 3.0])), ("l", ints(&[2]))]);
    let mut messages = Vec::new();
    for specs in [
        &["y:int64"][..],
        &["x:int64"],
        &["x:float32:2"],
        &["x:float32:var:2"],
        &["x:float32:ragged:row_lengths(l)"],
        &["x:raw_float32:2"],
    ] {
        messages.push(parser(specs).parse(&[&record]).unwrap_err().to_string());
    }
    for text in [
        "x",
        "x:int32",
        "x:float32:2147483648=0",
        "x:int64:ragged:rows(l)",
    ] {
        messages.push(Schema::from_feature_texts(&[text]).unwrap_err().to_string());
    }
    messages.push(Schema::from_json_str("{}").unwrap_err().to_string());
    for m in messages {
        assert!(!m.contains("--"), "{m}");
    }
}

#[test]
fn ragged_and_var_fixed_errors_name_the_partition_and_the_record() {
    let good = example(&[("v", ints(&[1, 2, 3])), ("l", ints(&[2, 1]))]);
    let negative = example(&[("v", ints(&[1, 2, 3])), ("l", ints(&[4, -1]))]);
    let mut p = parser(&["v:int64:ragged:row_lengths(l)"]);
    let (record, feature, reason) = feature_error(p.parse(&[&good, &negative]).unwrap_err());
    assert_eq!((record, feature.as_str()), (1, "v"));
    assert!(
        reason.contains("partition row_lengths(l): row length 1 is -1"),
        "{reason}"
    );
    let floats_for_lengths = example(&[("v", ints(&[1])), ("l", floats(&[1.0]))]);
    let (_, _, reason) = feature_error(p.parse(&[&floats_for_lengths]).unwrap_err());
    assert!(
        reason.contains("partition row_lengths(l): expected int64_list"),
        "{reason}"
    );
    let batch = p.parse(&[&good, &good]).unwrap();
    assert_eq!(
        batch.columns[0].row_splits,
        vec![vec![0, 2, 4], vec![0, 2, 3, 5, 6]]
    );
    // The partition key may also be a column of its own.
    let mut both = parser(&["l:int64:var", "v:int64:ragged:row_lengths(l)"]);
    let batch = both.parse(&[&good]).unwrap();
    assert_eq!(batch.columns[0].as_i64(), Some(&[2, 1][..]));
    assert_eq!(batch.columns[1].row_splits, vec![vec![0, 2], vec![0, 2, 3]]);
    // Sparse: indices sorted with their values, across records and buffer reuse.
    let mut sparse = parser(&["v:bytes:sparse(i,j):2x3"]);
    let a = example(&[
        ("v", byte_values(&[b"x", b"yy", b"z"])),
        ("i", ints(&[1, 0, 1])),
        ("j", ints(&[0, 2, 1])),
    ]);
    let mut batch = sparse.parse(&[&example(&[]), &a]).unwrap();
    sparse.parse_into(&[&a, &a], &mut batch).unwrap();
    let column = &batch.columns[0];
    assert_eq!(column.dense_shape(), vec![2, 2, 3]);
    assert_eq!(
        column.sparse_indices()[..3],
        [vec![0, 0, 2], vec![0, 1, 0], vec![0, 1, 1]]
    );
    let values: Vec<&[u8]> = (0..column.values.len())
        .map(|i| column.bytes(i).unwrap())
        .collect();
    assert_eq!(values, [&b"yy"[..], b"x", b"z", b"yy", b"x", b"z"]);
    assert_eq!(column.row_splits, vec![vec![0, 3, 6]]);
}
