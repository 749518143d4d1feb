//! TensorFlow's own parses of the golden files, reproduced.

use serde_json::Value as Json;
use tfpipe::example::{BatchParser, Schema};
use tfpipe::{Batch, Column, Values};

use super::common::*;

fn examples_schema(expected: &Json) -> Schema {
    let specs = expected["feature_spec"].as_object().unwrap();
    Schema {
        features: specs
            .iter()
            .map(|(name, spec)| tf_spec(name, spec, false))
            .collect(),
        label: None,
    }
}

#[test]
fn parse_expected_in_batches_of_8() {
    let expected = read_json("parse_expected.json");
    let records = read_records("examples.tfrecord");
    assert_eq!(records.len(), 50);
    let mut parser = BatchParser::new(examples_schema(&expected)).unwrap();
    let batch_size = expected["batch_size"].as_u64().unwrap() as usize;
    let batches = expected["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 7);
    // One batch reused throughout, as the pipeline does (parse_into); and `parse`.
    let mut reused = Batch::default();
    for (b, (chunk, want)) in records.chunks(batch_size).zip(batches).enumerate() {
        let first = usizes(&want["records"])[0];
        assert_eq!(first, b * batch_size);
        parser.parse_into(chunk, &mut reused).unwrap();
        let fresh = parser.parse(chunk).unwrap();
        assert_eq!(format!("{fresh:?}"), format!("{reused:?}"));
        assert_eq!(reused.num_rows, chunk.len());
        let features = want["features"].as_object().unwrap();
        assert_eq!(features.len(), reused.columns.len());
        for (name, tensor) in features {
            let column = reused.column(name).unwrap();
            assert_tensor(&format!("batch {b} {name}"), column, tensor, false);
            if tensor["sparse"] == true {
                // And back: TensorFlow's sparse view rebuilds the same column.
                let indices: Vec<[usize; 2]> = tensor["indices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| {
                        let i = usizes(i);
                        [i[0], i[1]]
                    })
                    .collect();
                let rows = usizes(&tensor["dense_shape"])[0];
                let rebuilt =
                    Column::from_sparse(name, column.values.clone(), &indices, rows).unwrap();
                // (Debug, not ==: NaN != NaN.)
                assert_eq!(
                    format!("{rebuilt:?}"),
                    format!("{column:?}"),
                    "batch {b} {name}"
                );
            }
        }
    }
}

/// The float values of `examples.tfrecord.json` carry their exact bits (NaN
/// payloads included): every present float must come through bit for bit.
#[test]
fn float_bits_survive() {
    let expected = read_json("parse_expected.json");
    let content = read_json("examples.tfrecord.json");
    let records = read_records("examples.tfrecord");
    let mut parser = BatchParser::new(examples_schema(&expected)).unwrap();
    let batch = parser.parse(&records).unwrap();
    let mut checked = 0;
    for (i, record) in content["records"].as_array().unwrap().iter().enumerate() {
        for name in ["score", "emb", "weights"] {
            let Some(feature) = record["features"].get(name) else {
                continue;
            };
            if feature["kind"] != "float_list" {
                continue;
            }
            let column = batch.column(name).unwrap();
            let range = column.row_range(i).unwrap();
            let ours: Vec<String> = column.as_f32().unwrap()[range]
                .iter()
                .map(|x| format!("0x{:08x}", x.to_bits()))
                .collect();
            let want: Vec<&str> = feature["bits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_str().unwrap())
                .collect();
            assert_eq!(ours, want, "record {i} {name}");
            checked += want.len();
        }
    }
    assert!(checked > 50, "only {checked} floats checked");
}

#[test]
fn parse_sequence_expected_per_record() {
    let expected = read_json("parse_sequence_expected.json");
    let records = read_records("sequence.tfrecord");
    assert_eq!(records.len(), 20);
    let mut features = Vec::new();
    for (name, spec) in expected["context_spec"].as_object().unwrap() {
        features.push(tf_spec(name, spec, false));
    }
    for (name, spec) in expected["sequence_spec"].as_object().unwrap() {
        features.push(tf_spec(name, spec, true));
    }
    let mut parser = BatchParser::new(Schema {
        features,
        label: None,
    })
    .unwrap();
    let wants = expected["records"].as_array().unwrap();
    assert_eq!(wants.len(), records.len());
    for (record, want) in records.iter().zip(wants) {
        let index = want["index"].as_u64().unwrap();
        let batch = parser.parse_one(record).unwrap();
        assert_eq!(batch.num_rows, 1);
        for part in ["context", "sequence"] {
            for (name, tensor) in want[part].as_object().unwrap() {
                let column = batch.column(name).unwrap();
                assert_tensor(&format!("record {index} {name}"), column, tensor, true);
            }
        }
    }
    // The whole file as one batch is the concatenation of the single records.
    let all = parser.parse(&records).unwrap();
    let singles: Vec<Batch> = records
        .iter()
        .map(|r| parser.parse_one(r).unwrap())
        .collect();
    let concat = Batch::concat(&singles).unwrap();
    assert_eq!(format!("{all:?}"), format!("{concat:?}"));
    for (i, single) in singles.iter().enumerate() {
        assert_eq!(format!("{:?}", all.slice(i..i + 1)), format!("{single:?}"));
    }
}

/// Batch slicing and concatenation are inverse on the examples file.
#[test]
fn slice_and_concat_round_trip() {
    let expected = read_json("parse_expected.json");
    let records = read_records("examples.tfrecord");
    let mut parser = BatchParser::new(examples_schema(&expected)).unwrap();
    let all = parser.parse(&records).unwrap();
    let parts = [
        all.slice(0..7),
        all.slice(7..7),
        all.slice(7..31),
        all.slice(31..50),
    ];
    let back = Batch::concat(&parts).unwrap();
    assert_eq!(format!("{back:?}"), format!("{all:?}"));
    let tags = all.column("tags").unwrap();
    let Values::Bytes { offsets, .. } = &parts[2].column("tags").unwrap().values else {
        panic!("tags are bytes");
    };
    assert_eq!(offsets[0], 0);
    assert_eq!(tags.num_rows(), 50);
}

/// A schema of context features only reads `SequenceExample` contexts too.
#[test]
fn context_only_schema_reads_sequence_examples() {
    let expected = read_json("parse_sequence_expected.json");
    let records = read_records("sequence.tfrecord");
    let features = expected["context_spec"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, spec)| tf_spec(name, spec, false))
        .collect();
    let mut parser = BatchParser::new(Schema {
        features,
        label: None,
    })
    .unwrap();
    for (record, want) in records.iter().zip(expected["records"].as_array().unwrap()) {
        let batch = parser.parse_one(record).unwrap();
        for (name, tensor) in want["context"].as_object().unwrap() {
            assert_tensor(name, batch.column(name).unwrap(), tensor, true);
        }
    }
}
