//! CSV: the real tabular files read back equal to their source rows.

use tfpipe::convert::{CsvOptions, Format, Missing, Sharding};
use tfpipe::example::{DType, Layout, Value};
use tfpipe::tfrecord::Compression;

use super::common::*;

/// The source rows of a CSV file, as text, with the header.
fn source(path: &std::path::Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut rdr = csv::Reader::from_path(path).unwrap();
    let header = rdr.headers().unwrap().iter().map(String::from).collect();
    let rows = rdr
        .records()
        .map(|r| r.unwrap().iter().map(String::from).collect())
        .collect();
    (header, rows)
}

#[test]
fn penguins_read_back_with_types_missing_values_and_label_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let input = testdata("tabular/penguins.csv");
    let format = Format::Csv(CsvOptions {
        label: Some("species".into()),
        ..CsvOptions::default()
    });
    let summary = run(&format, std::slice::from_ref(&input), dir.path(), |o| {
        o.sharding = Sharding::Shards(3)
    })
    .unwrap();
    assert_eq!(summary.records, 344);
    assert_eq!(summary.shards.len(), 3);
    let (schema, meta) = load_schema(&summary);

    let expected_types = [
        ("species", DType::Int64),
        ("island", DType::Bytes),
        ("bill_length_mm", DType::Float32),
        ("bill_depth_mm", DType::Float32),
        ("flipper_length_mm", DType::Int64),
        ("body_mass_g", DType::Int64),
        ("sex", DType::Bytes),
        ("year", DType::Int64),
    ];
    for (spec, (name, dtype)) in schema.features.iter().zip(expected_types) {
        assert_eq!((spec.name.as_str(), spec.dtype), (name, dtype));
        assert_eq!(spec.layout, Layout::Fixed(vec![]));
    }
    assert_eq!(schema.label.as_deref(), Some("species"));
    // Columns with NA get a default; complete ones do not; the label never.
    assert_eq!(
        schema.feature("sex").unwrap().default,
        Some(Value::Bytes(vec![vec![]]))
    );
    assert_eq!(
        schema.feature("bill_length_mm").unwrap().default,
        Some(Value::Float32(vec![0.0]))
    );
    assert_eq!(schema.feature("year").unwrap().default, None);
    assert_eq!(schema.feature("species").unwrap().default, None);
    let vocab: Vec<String> = meta["source"]["label_vocabulary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(vocab, ["Adelie", "Chinstrap", "Gentoo"]);
    assert_eq!(meta["source"]["columns"]["sex"]["missing"], 11);

    let (header, rows) = source(&input);
    let got = read_rows(&summary);
    assert_eq!(got.len(), rows.len());
    for (row, record) in rows.iter().zip(&got) {
        let mut expected = Row::new();
        for (name, text) in header.iter().zip(row) {
            if text == "NA" || text.is_empty() {
                continue;
            }
            let value = match schema.feature(name).unwrap().dtype {
                _ if name == "species" => {
                    Feat::I(vec![vocab.iter().position(|v| v == text).unwrap() as i64])
                }
                DType::Int64 => Feat::I(vec![text.parse().unwrap()]),
                DType::Float32 => Feat::F(vec![text.parse().unwrap()]),
                _ => Feat::B(vec![text.as_bytes().to_vec()]),
            };
            expected.insert(name.clone(), value);
        }
        assert_eq!(record, &expected);
    }
}

#[test]
fn seattle_weather_dates_stay_strings_and_gzip_shards_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let input = testdata("tabular/seattle-weather.csv");
    let summary = run(
        &Format::Csv(CsvOptions::default()),
        std::slice::from_ref(&input),
        dir.path(),
        |o| {
            o.sharding = Sharding::RecordsPerShard(500);
            o.compression = Compression::Gzip;
        },
    )
    .unwrap();
    assert_eq!(summary.records, 1461);
    assert_eq!(summary.shards.len(), 3);
    assert!(
        summary.shards[2]
            .to_string_lossy()
            .ends_with("-00002-of-00003.tfrecord.gz")
    );
    let (schema, _) = load_schema(&summary);
    let dtypes: Vec<DType> = schema.features.iter().map(|f| f.dtype).collect();
    use DType::*;
    assert_eq!(dtypes, [Bytes, Float32, Float32, Float32, Float32, Bytes]);
    let (header, rows) = source(&input);
    for (row, record) in rows.iter().zip(read_rows(&summary)) {
        assert_eq!(record["date"], Feat::B(vec![row[0].as_bytes().to_vec()]));
        for (i, name) in header.iter().enumerate().skip(1).take(4) {
            assert_eq!(
                record[name],
                Feat::F(vec![row[i].parse().unwrap()]),
                "{name}"
            );
        }
        assert_eq!(record["weather"], Feat::B(vec![row[5].as_bytes().to_vec()]));
    }
}

#[test]
fn overrides_na_values_delimiter_quotes_and_var_missing() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.tsv");
    std::fs::write(
        &input,
        "id\tscore\tnote\tzip\n1\t2.5\t\"multi\nline\"\t01234\n2\t-\t\"tab\there\"\t\n3\t7\tplain\t99999\n",
    )
    .unwrap();
    let format = Format::Csv(CsvOptions {
        delimiter: b'\t',
        na: vec!["-".into()],
        columns: vec![("zip".into(), DType::Bytes), ("id".into(), DType::Float32)],
        missing: Missing::Var,
        ..CsvOptions::default()
    });
    let out = dir.path().join("o");
    std::fs::create_dir(&out).unwrap();
    let summary = run(&format, &[input], &out, |_| {}).unwrap();
    let (schema, _) = load_schema(&summary);
    assert_eq!(schema.feature("id").unwrap().dtype, DType::Float32);
    assert_eq!(schema.feature("zip").unwrap().dtype, DType::Bytes);
    assert_eq!(schema.feature("score").unwrap().layout, Layout::Var);
    assert_eq!(
        schema.feature("note").unwrap().layout,
        Layout::Fixed(vec![])
    );
    let rows = read_rows(&summary);
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["note"], Feat::B(vec![b"multi\nline".to_vec()]));
    assert_eq!(rows[0]["zip"], Feat::B(vec![b"01234".to_vec()]));
    assert_eq!(rows[0]["id"], Feat::F(vec![1.0]));
    assert!(!rows[1].contains_key("score"));
    assert!(!rows[1].contains_key("zip"));
    assert_eq!(rows[1]["note"], Feat::B(vec![b"tab\there".to_vec()]));
    assert_eq!(rows[2]["score"], Feat::F(vec![7.0]));
}

#[test]
fn output_is_byte_identical_for_any_thread_count() {
    // Large enough for many chunks: the penguins rows repeated.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(testdata("tabular/penguins.csv")).unwrap();
    let (head, body) = text.split_once('\n').unwrap();
    let mut big = format!("{head}\n");
    while big.len() < 3 << 20 {
        big.push_str(body);
    }
    let input = dir.path().join("big.csv");
    std::fs::write(&input, &big).unwrap();
    let mut outputs = Vec::new();
    for threads in [1, 2, 3, 8] {
        let out = dir.path().join(format!("t{threads}"));
        std::fs::create_dir(&out).unwrap();
        let summary = run(
            &Format::Csv(CsvOptions {
                label: Some("species".into()),
                ..CsvOptions::default()
            }),
            std::slice::from_ref(&input),
            &out,
            |o| {
                o.threads = threads;
                o.sharding = Sharding::Shards(5);
            },
        )
        .unwrap();
        outputs.push((summary.records, shard_bytes(&summary)));
    }
    assert!(outputs[0].0 > 10_000);
    for o in &outputs[1..] {
        assert!(o == &outputs[0], "output differs between thread counts");
    }
}

/// A headerless file: `--no-header` keeps its first row as data (it used to
/// become the column names), `--names` names the columns, and a first row of
/// numbers in columns of numbers read as a header gets a warning that says
/// how to read the file instead (sklearn's `iris.csv` starts `150,4,...`).
#[test]
fn headerless_files_keep_their_first_row_and_a_data_like_header_is_warned_about() {
    use tfpipe::convert::Header;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("iris.csv");
    std::fs::write(
        &input,
        "5.1 3.5 setosa\n4.9 3.0 setosa\n6.3 2.9 virginica\n",
    )
    .unwrap();
    let csv = |header: Header| {
        Format::Csv(CsvOptions {
            delimiter: b' ',
            header,
            ..CsvOptions::default()
        })
    };
    // Read as if it had a header: two records, and a warning naming the options.
    let out = dir.path().join("first-row");
    let summary = run(
        &csv(Header::FirstRow),
        std::slice::from_ref(&input),
        &out,
        |_| {},
    )
    .unwrap();
    assert_eq!(summary.records, 2);
    assert!(
        summary
            .warnings
            .iter()
            .any(|w| w.contains("looks like data") && w.contains("headerless")),
        "{:?}",
        summary.warnings
    );
    // --no-header: every row, named column_1..3.
    let out = dir.path().join("no-header");
    let summary = run(
        &csv(Header::None),
        std::slice::from_ref(&input),
        &out,
        |_| {},
    )
    .unwrap();
    assert_eq!(summary.records, 3);
    let (schema, _) = load_schema(&summary);
    assert!(schema.feature("column_1").is_some() && schema.feature("column_3").is_some());
    let rows = read_rows(&summary);
    assert_eq!(rows[0]["column_1"], Feat::F(vec![5.1]));
    // --names: every row, named as given; duplicates are refused.
    let names = |n: &[&str]| Header::Names(n.iter().map(|s| s.to_string()).collect());
    let out = dir.path().join("names");
    let summary = run(
        &csv(names(&["sepal_length", "sepal_width", "species"])),
        std::slice::from_ref(&input),
        &out,
        |_| {},
    )
    .unwrap();
    assert_eq!(summary.records, 3);
    assert!(
        summary
            .warnings
            .iter()
            .all(|w| !w.contains("looks like data"))
    );
    let rows = read_rows(&summary);
    assert_eq!(rows[2]["species"], Feat::B(vec![b"virginica".to_vec()]));
    let out = dir.path().join("dup");
    let err = run(
        &csv(names(&["a", "a", "b"])),
        std::slice::from_ref(&input),
        &out,
        |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("duplicate column name"), "{err}");
}

/// The column-name rules: a name twice in a CSV header (or in `--names`)
/// is refused naming it, as is a JSON key that flattening makes twice
/// (`"a.b"` beside `{"a": {"b": ...}}`); nothing is renamed or dropped.
#[test]
fn duplicate_column_names_are_refused_naming_them() {
    use tfpipe::convert::JsonOptions;
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("dup.csv");
    std::fs::write(&csv, "x,y,x\n1,2,3\n").unwrap();
    let err = run(
        &Format::Csv(CsvOptions::default()),
        std::slice::from_ref(&csv),
        &dir.path().join("csv"),
        |_| {},
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("duplicate column name \"x\" in the header")
            && message.contains("dup.csv"),
        "{message}"
    );
    let json = dir.path().join("dup.jsonl");
    std::fs::write(&json, "{\"a\": {\"b\": 1}, \"a.b\": 2}\n").unwrap();
    let err = run(
        &Format::Json(JsonOptions::default()),
        std::slice::from_ref(&json),
        &dir.path().join("json"),
        |_| {},
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("duplicate key \"a.b\" in this record (after flattening nested objects)")
            && message.contains("dup.jsonl"),
        "{message}"
    );
}
