//! JSON: cars.json (an array with nulls) read back equal to its source;
//! JSON Lines with nesting, lists and booleans.

use tfpipe::convert::{Format, JsonOptions, Sharding};
use tfpipe::example::{DType, Layout};

use super::common::*;

#[test]
fn cars_array_with_nulls_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let input = testdata("tabular/cars.json");
    let summary = run(
        &Format::Json(JsonOptions::default()),
        std::slice::from_ref(&input),
        dir.path(),
        |o| o.sharding = Sharding::Shards(2),
    )
    .unwrap();
    assert_eq!(summary.records, 406);
    let (schema, _) = load_schema(&summary);
    let source: Vec<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_slice(&std::fs::read(&input).unwrap()).unwrap();
    let rows = read_rows(&summary);
    assert_eq!(rows.len(), source.len());
    assert_eq!(schema.feature("Horsepower").unwrap().dtype, DType::Int64);
    assert_eq!(
        schema.feature("Miles_per_Gallon").unwrap().dtype,
        DType::Float32
    );
    assert_eq!(schema.feature("Name").unwrap().dtype, DType::Bytes);
    assert!(
        schema.feature("Horsepower").unwrap().default.is_some(),
        "has nulls"
    );
    let mut nulls = 0;
    for (object, record) in source.iter().zip(&rows) {
        let mut expected = Row::new();
        for (key, value) in object {
            let dtype = schema.feature(key).unwrap().dtype;
            let feat = match (value, dtype) {
                (serde_json::Value::Null, _) => {
                    nulls += 1;
                    continue;
                }
                (serde_json::Value::String(s), DType::Bytes) => {
                    Feat::B(vec![s.as_bytes().to_vec()])
                }
                (serde_json::Value::Number(n), DType::Int64) => Feat::I(vec![n.as_i64().unwrap()]),
                (serde_json::Value::Number(n), DType::Float32) => {
                    Feat::F(vec![n.to_string().parse::<f32>().unwrap()])
                }
                other => panic!("unexpected {other:?}"),
            };
            expected.insert(key.clone(), feat);
        }
        assert_eq!(record, &expected);
    }
    assert!(nulls > 0, "cars.json has nulls");
}

#[test]
fn json_lines_with_nesting_lists_booleans_and_string_label() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"id": 1, "pos": {"x": 1.5, "y": 2}, "tags": ["a", "b"], "ok": true, "kind": "cat"}"#,
            "\n\n",
            r#"{"id": 2, "pos": {"x": -3, "y": null}, "tags": [], "ok": false, "kind": "dog", "extra": [1, 2, 3]}"#,
            "\n",
            r#"  {"kind": "cat", "id": 3, "tags": ["\u00e9"], "ok": true, "pos": {"x": 0}}  "#,
        ),
    )
    .unwrap();
    let out = dir.path().join("o");
    std::fs::create_dir(&out).unwrap();
    let format = Format::Json(JsonOptions {
        label: Some("kind".into()),
        ..JsonOptions::default()
    });
    let summary = run(&format, &[input], &out, |_| {}).unwrap();
    let (schema, meta) = load_schema(&summary);
    let names: Vec<&str> = schema.features.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["id", "pos.x", "pos.y", "tags", "ok", "kind", "extra"]
    );
    assert_eq!(schema.feature("pos.x").unwrap().dtype, DType::Float32);
    assert_eq!(schema.feature("pos.y").unwrap().dtype, DType::Int64);
    assert_eq!(schema.feature("tags").unwrap().layout, Layout::Var);
    assert_eq!(schema.feature("extra").unwrap().layout, Layout::Var);
    assert_eq!(schema.feature("ok").unwrap().dtype, DType::Int64);
    assert_eq!(schema.feature("kind").unwrap().dtype, DType::Int64);
    assert_eq!(
        meta["source"]["label_vocabulary"],
        serde_json::json!(["cat", "dog"])
    );
    let rows = read_rows(&summary);
    assert_eq!(rows[0]["pos.x"], Feat::F(vec![1.5]));
    assert_eq!(rows[0]["tags"], Feat::B(vec![b"a".to_vec(), b"b".to_vec()]));
    assert_eq!(rows[0]["ok"], Feat::I(vec![1]));
    assert_eq!(rows[0]["kind"], Feat::I(vec![0]));
    assert_eq!(rows[1]["tags"], Feat::B(vec![]));
    assert!(!rows[1].contains_key("pos.y"));
    assert_eq!(rows[1]["extra"], Feat::I(vec![1, 2, 3]));
    assert_eq!(rows[1]["kind"], Feat::I(vec![1]));
    assert_eq!(rows[2]["tags"], Feat::B(vec!["é".as_bytes().to_vec()]));
    assert_eq!(rows[2]["pos.x"], Feat::F(vec![0.0]));
}

/// JSON and CSV share one column finalisation: a text label with more
/// distinct values than a class label can have is refused in both (JSON's
/// vocabulary used to grow without bound).
#[test]
fn a_label_with_too_many_distinct_values_is_refused_in_json_as_in_csv() {
    use tfpipe::convert::CsvOptions;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("ids.jsonl");
    let csv = dir.path().join("ids.csv");
    let mut json_text = String::new();
    let mut csv_text = String::from("x,id\n");
    for i in 0..100_001 {
        json_text.push_str(&format!("{{\"x\":1,\"id\":\"v{i}\"}}\n"));
        csv_text.push_str(&format!("1,v{i}\n"));
    }
    std::fs::write(&json, json_text).unwrap();
    std::fs::write(&csv, csv_text).unwrap();
    let json_format = Format::Json(JsonOptions {
        label: Some("id".into()),
        ..JsonOptions::default()
    });
    let csv_format = Format::Csv(CsvOptions {
        label: Some("id".into()),
        ..CsvOptions::default()
    });
    for (format, input) in [(json_format, json), (csv_format, csv)] {
        let err = run(&format, std::slice::from_ref(&input), dir.path(), |_| {}).unwrap_err();
        assert!(
            err.to_string().contains("not a class label"),
            "{}: {err}",
            input.display()
        );
    }
}
