//! tfpipe's `unbatch`, `rebatch` (one size or several), `window`,
//! `window_rows`, `padded_batch` and `bucket_by_sequence_length` (by a
//! feature's length or a length function, one or two ragged levels)
//! against TensorFlow's answers for the same
//! inputs, in `testdata/tf-semantics/sequences.json` (written by
//! `scripts/tf_semantics_sequences.py`).

use serde_json::Value as Json;
use tfpipe::pipeline::{BucketOptions, PadValue, PaddedShape, Padding, Pipeline};
use tfpipe::{Batch, Column, Values};

const EXPECTED: &str = include_str!("../../testdata/tf-semantics/sequences.json");

fn cases(op: &str) -> Vec<Json> {
    let all: Json = serde_json::from_str(EXPECTED).unwrap();
    let cases: Vec<Json> = all["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["op"] == op)
        .cloned()
        .collect();
    assert!(!cases.is_empty(), "no {op} cases");
    cases
}

fn ints(v: &Json) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn usizes(v: &Json) -> Vec<usize> {
    ints(v).into_iter().map(|x| x as usize).collect()
}

fn int_lists(v: &Json) -> Vec<Vec<i64>> {
    v.as_array().unwrap().iter().map(ints).collect()
}

fn run<T: Send + 'static>(p: Pipeline<T>) -> Vec<T> {
    p.start().unwrap().collect::<Result<_, _>>().unwrap()
}

#[test]
fn unbatch_matches_tf() {
    for case in cases("unbatch") {
        let out = run(Pipeline::from_vec(int_lists(&case["input"])).unbatch());
        assert_eq!(out, ints(&case["expected"]), "{}", case["name"]);
    }
}

#[test]
fn rebatch_matches_tf() {
    for case in cases("rebatch") {
        let p = &case["params"];
        let drop = p["drop_remainder"].as_bool().unwrap();
        let out = run(Pipeline::from_vec(ints(&case["input"]))
            .batch(p["batch"].as_u64().unwrap() as usize)
            .rebatch(p["size"].as_u64().unwrap() as usize, drop));
        assert_eq!(out, int_lists(&case["expected"]), "{}", case["name"]);
    }
}

/// `rebatch_sizes` over `Vec`s and over parsed batches (of the same rows).
#[test]
fn rebatch_sizes_matches_tf() {
    for case in cases("rebatch_sizes") {
        let p = &case["params"];
        let drop = p["drop_remainder"].as_bool().unwrap();
        let (batch, sizes) = (p["batch"].as_u64().unwrap() as usize, usizes(&p["sizes"]));
        let out = run(Pipeline::from_vec(ints(&case["input"]))
            .batch(batch)
            .rebatch_sizes(&sizes, drop));
        assert_eq!(out, int_lists(&case["expected"]), "{}", case["name"]);
        let parsed = run(Pipeline::from_vec(ints(&case["input"]))
            .batch(batch)
            .map(|rows: Vec<i64>| int_batch(&rows))
            .rebatch_sizes(&sizes, drop));
        let rows: Vec<Vec<i64>> = parsed
            .iter()
            .map(|b| b.columns[0].as_i64().unwrap().to_vec())
            .collect();
        assert_eq!(
            rows,
            int_lists(&case["expected"]),
            "{} (parsed)",
            case["name"]
        );
    }
}

/// One int64 column `x`, a value per row.
fn int_batch(rows: &[i64]) -> Batch {
    Batch {
        num_rows: rows.len(),
        columns: vec![Column {
            name: "x".into(),
            values: Values::Int64(rows.to_vec()),
            row_splits: vec![],
            inner_shape: vec![],
        }],
    }
}

#[test]
fn window_matches_tf() {
    for case in cases("window") {
        let p = &case["params"];
        let n = |k: &str| p[k].as_u64().unwrap() as usize;
        let out = run(Pipeline::from_vec(ints(&case["input"])).window(
            n("size"),
            n("shift"),
            n("stride"),
            p["drop_remainder"].as_bool().unwrap(),
        ));
        assert_eq!(out, int_lists(&case["expected"]), "{}", case["name"]);
    }
}

/// `window_rows` over parsed batches of the same input, split into batches
/// of 3 rows: each window one batch, the same rows as `tf.data`'s windows.
#[test]
fn window_rows_matches_tf() {
    for case in cases("window") {
        let p = &case["params"];
        let n = |k: &str| p[k].as_u64().unwrap() as usize;
        let batches: Vec<Batch> = ints(&case["input"]).chunks(3).map(int_batch).collect();
        let out = run(Pipeline::from_vec(batches).window_rows(
            n("size"),
            n("shift"),
            n("stride"),
            p["drop_remainder"].as_bool().unwrap(),
        ));
        let rows: Vec<Vec<i64>> = out
            .iter()
            .map(|b| b.columns[0].as_i64().unwrap().to_vec())
            .collect();
        assert_eq!(rows, int_lists(&case["expected"]), "{}", case["name"]);
    }
}

/// One input element of a padded_batch case as a one-row batch.
fn row(layout: &str, dtype: &str, inner: &[usize], element: &Json) -> Batch {
    let items = element.as_array().unwrap();
    let (values, row_splits) = match layout {
        "bytes" => {
            let mut data = Vec::new();
            let mut offsets = vec![0];
            for s in items {
                data.extend(s.as_str().unwrap().bytes());
                offsets.push(data.len());
            }
            (Values::Bytes { data, offsets }, vec![vec![0, items.len()]])
        }
        "var_sequence" => {
            let steps: Vec<Vec<i64>> = int_lists(element);
            let mut splits = vec![0];
            for s in &steps {
                splits.push(splits.last().unwrap() + s.len());
            }
            (
                Values::Int64(steps.concat()),
                vec![vec![0, steps.len()], splits],
            )
        }
        _ => {
            let per = inner.iter().product::<usize>().max(1);
            let values = match dtype {
                "float32" => {
                    Values::Float32(items.iter().map(|x| x.as_f64().unwrap() as f32).collect())
                }
                _ => Values::Int64(ints(element)),
            };
            (values, vec![vec![0, items.len() / per]])
        }
    };
    Batch {
        num_rows: 1,
        columns: vec![Column {
            name: "x".into(),
            values,
            row_splits,
            inner_shape: inner.to_vec(),
        }],
    }
}

/// A padded column as TF writes it: flat values (as JSON) and the shape.
fn as_tf(column: &Column, rows: usize) -> (Vec<Json>, Vec<usize>) {
    let values = match &column.values {
        Values::Int64(v) => v.iter().map(|x| Json::from(*x)).collect(),
        Values::Float32(v) => v.iter().map(|x| Json::from(*x as f64)).collect(),
        Values::Bytes { .. } => (0..column.values.len())
            .map(|i| Json::from(String::from_utf8(column.bytes(i).unwrap().to_vec()).unwrap()))
            .collect(),
        other => panic!("{other:?}"),
    };
    let mut shape = vec![rows];
    shape.extend_from_slice(&column.inner_shape);
    (values, shape)
}

#[test]
fn padded_batch_matches_tf() {
    for case in cases("padded_batch") {
        let p = &case["params"];
        let (layout, dtype) = (p["layout"].as_str().unwrap(), p["dtype"].as_str().unwrap());
        let inner = usizes(&p["inner"]);
        let rows: Vec<Batch> = case["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| row(layout, dtype, &inner, e))
            .collect();
        let pad = match &p["pad"] {
            Json::String(s) => PadValue::Bytes(s.as_bytes().to_vec()),
            v if v.is_i64() => PadValue::Int(v.as_i64().unwrap()),
            v => PadValue::Float(v.as_f64().unwrap()),
        };
        let shape = match p["width"].as_u64() {
            Some(w) => PaddedShape::Fixed(w as usize),
            None => PaddedShape::BatchMax,
        };
        let padding = Padding::new().shape(shape).value(pad);
        let size = p["size"].as_u64().unwrap() as usize;
        let out = run(Pipeline::from_vec(rows).padded_batch(
            size,
            padding,
            p["drop_remainder"].as_bool().unwrap(),
        ));
        let got: Vec<(Vec<Json>, Vec<usize>)> = out
            .iter()
            .map(|b| as_tf(&b.columns[0], b.num_rows))
            .collect();
        let expected: Vec<(Vec<Json>, Vec<usize>)> = case["expected"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["values"].as_array().unwrap().clone(), usizes(&b["shape"])))
            .collect();
        assert_eq!(got, expected, "{}", case["name"]);
    }
}

#[test]
fn bucket_by_sequence_length_matches_tf() {
    for case in cases("bucket_by_sequence_length") {
        let p = &case["params"];
        let rows: Vec<Batch> = usizes(&case["input"])
            .into_iter()
            .enumerate()
            .map(|(i, n)| {
                let values: Vec<i64> = (0..n).map(|j| (i * 1000 + j + 1) as i64).collect();
                Batch {
                    num_rows: 1,
                    columns: vec![
                        Column {
                            name: "t".into(),
                            values: Values::Int64(values),
                            row_splits: vec![vec![0, n]],
                            inner_shape: vec![],
                        },
                        Column {
                            name: "id".into(),
                            values: Values::Int64(vec![i as i64]),
                            row_splits: vec![],
                            inner_shape: vec![],
                        },
                    ],
                }
            })
            .collect();
        let mut options =
            BucketOptions::new("t", usizes(&p["boundaries"]), usizes(&p["batch_sizes"]))
                .pad_to_bucket_boundary(p["pad_to_bucket_boundary"].as_bool().unwrap())
                .drop_remainder(p["drop_remainder"].as_bool().unwrap());
        match p["length"].as_str() {
            None => {}
            Some("even") => options = options.length_fn(even_values),
            Some(other) => panic!("no length function {other:?}"),
        }
        let out = run(Pipeline::from_vec(rows).bucket_by_sequence_length(options));
        let got: Vec<(Vec<i64>, Vec<i64>, Vec<usize>)> = out
            .iter()
            .map(|b| {
                let t = b.column("t").unwrap();
                let mut shape = vec![b.num_rows];
                shape.extend_from_slice(&t.inner_shape);
                (
                    b.column("id").unwrap().as_i64().unwrap().to_vec(),
                    t.as_i64().unwrap().to_vec(),
                    shape,
                )
            })
            .collect();
        let expected: Vec<(Vec<i64>, Vec<i64>, Vec<usize>)> = case["expected"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (ints(&b["ids"]), ints(&b["values"]), usizes(&b["shape"])))
            .collect();
        assert_eq!(got, expected, "{}", case["name"]);
    }
}

/// The script's `"even"` length function: the count of even values of `t`.
fn even_values(batch: &Batch, row: usize) -> usize {
    let t = batch.column("t").unwrap();
    let (a, b) = (t.row_splits[0][row], t.row_splits[0][row + 1]);
    t.as_i64().unwrap()[a..b]
        .iter()
        .filter(|x| *x % 2 == 0)
        .count()
}

/// Bucketing a two-level column (`[steps][values]`): with
/// `pad_to_bucket_boundary` both levels pad to the boundary, as in `tf.data`.
#[test]
fn bucketing_a_two_level_column_matches_tf() {
    for case in cases("bucket_two_level") {
        let p = &case["params"];
        let rows: Vec<Batch> = case["input"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, steps)| {
                let mut t = row("var_sequence", "int64", &[], steps);
                t.columns[0].name = "t".into();
                t.columns.push(Column {
                    name: "id".into(),
                    values: Values::Int64(vec![i as i64]),
                    row_splits: vec![],
                    inner_shape: vec![],
                });
                t
            })
            .collect();
        let options = BucketOptions::new("t", usizes(&p["boundaries"]), usizes(&p["batch_sizes"]))
            .pad_to_bucket_boundary(p["pad_to_bucket_boundary"].as_bool().unwrap());
        let out = run(Pipeline::from_vec(rows).bucket_by_sequence_length(options));
        let got: Vec<(Vec<i64>, Vec<i64>, Vec<usize>)> = out
            .iter()
            .map(|b| {
                let t = b.column("t").unwrap();
                let mut shape = vec![b.num_rows];
                shape.extend_from_slice(&t.inner_shape);
                (
                    b.column("id").unwrap().as_i64().unwrap().to_vec(),
                    t.as_i64().unwrap().to_vec(),
                    shape,
                )
            })
            .collect();
        let expected: Vec<(Vec<i64>, Vec<i64>, Vec<usize>)> = case["expected"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (ints(&b["ids"]), ints(&b["values"]), usizes(&b["shape"])))
            .collect();
        assert_eq!(got, expected, "{}", case["name"]);
    }
    // A step longer than the boundary is an error naming its row.
    let long = row(
        "var_sequence",
        "int64",
        &[],
        &serde_json::json!([[1, 2, 3, 4]]),
    );
    let mut long = long;
    long.columns[0].name = "t".into();
    let options = BucketOptions::new("t", vec![3], vec![1, 1]).pad_to_bucket_boundary(true);
    let err = Pipeline::from_vec(vec![long])
        .bucket_by_sequence_length(options)
        .start()
        .unwrap()
        .next()
        .unwrap()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("a step of row 0 has 4 values, more than the padded step shape 2"),
        "{err}"
    );
}
