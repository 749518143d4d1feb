//! Bad input: each error names its exact location, quotes the value, and
//! leaves no output behind; `--skip-bad-rows` skips and reports instead.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tfpipe::convert::{ConvertError, CsvOptions, Format, IdxOptions, JsonOptions};
use tfpipe::example::DType;

use super::common::*;

/// Writes `name` with `text` in a fresh dir and converts it there.
fn convert_text(
    name: &str,
    text: &[u8],
    format: Format,
    skip: bool,
) -> (
    tempfile::TempDir,
    Result<tfpipe::convert::Summary, ConvertError>,
) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join(name);
    std::fs::write(&input, text).unwrap();
    let result = run(&format, &[input], dir.path(), |o| o.skip_bad_rows = skip);
    (dir, result)
}

#[test]
fn ragged_csv_row() {
    let (dir, result) = convert_text(
        "r.csv",
        b"a,b,c\n1,2,3\n4,5\n6,7,8\n",
        Format::Csv(CsvOptions::default()),
        false,
    );
    let err = result.unwrap_err();
    let path = dir.path().join("r.csv");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: line 3 (byte 12): ragged row: expected 3 fields (as the header), found 2 (row starts \"4\", \"5\")",
            path.display()
        )
    );
    assert!(err.is_bad_row());
    assert_no_output(dir.path(), &["r.csv"]);
}

#[test]
fn ragged_rows_deep_in_a_large_file_have_absolute_lines() {
    let mut text = String::from("a,b\n");
    for i in 0..200_000 {
        text.push_str(&format!("{i},{}\n", i * 2));
    }
    text.push_str("oops\n");
    let (dir, result) = convert_text(
        "big.csv",
        text.as_bytes(),
        Format::Csv(CsvOptions::default()),
        false,
    );
    let err = result.unwrap_err().to_string();
    assert!(err.contains(": line 200002 (byte "), "{err}");
    assert_no_output(dir.path(), &["big.csv"]);
}

#[test]
fn skip_bad_rows_counts_and_reports_locations() {
    let (_dir, result) = convert_text(
        "r.csv",
        b"a,b\n1,2\n3\n4,5\n6,7,8\n9,x\n",
        Format::Csv(CsvOptions {
            columns: vec![("b".into(), DType::Int64)],
            ..CsvOptions::default()
        }),
        true,
    );
    let summary = result.unwrap();
    assert_eq!((summary.records, summary.rows_skipped), (2, 3));
    let reported: Vec<String> = summary.bad_rows.iter().map(|e| e.to_string()).collect();
    assert!(reported[0].contains("line 3 (byte 8)"), "{reported:?}");
    assert!(reported[1].contains("line 5"), "{reported:?}");
    assert!(
        reported[2].contains("line 6, field 2 (\"b\")"),
        "{reported:?}"
    );
    let rows = read_rows(&summary);
    assert_eq!(rows[1]["b"], Feat::I(vec![5]));
    let (_, meta) = load_schema(&summary);
    assert_eq!(meta["source"]["rows_skipped"], 3);
}

#[test]
fn non_numeric_value_in_a_float32_column() {
    let (dir, result) = convert_text(
        "f.csv",
        b"name,score\nx,1.5\ny,2\nz,high\n",
        Format::Csv(CsvOptions {
            columns: vec![("score".into(), DType::Float32)],
            ..CsvOptions::default()
        }),
        false,
    );
    let err = result.unwrap_err().to_string();
    let path = dir.path().join("f.csv");
    assert_eq!(
        err,
        format!(
            "{}: line 4, field 2 (\"score\") (byte 23): \"high\" is not float32 (the column is declared float32; expected a number like 3.25, or a missing value: empty or NA)",
            path.display()
        )
    );
    assert_no_output(dir.path(), &["f.csv"]);
}

#[test]
fn truncated_idx_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(testdata("mnist/test-images-idx3-ubyte.gz")).unwrap(),
    )
    .read_to_end(&mut images)
    .unwrap();
    let path = dir.path().join("t-images-idx3-ubyte");
    std::fs::write(&path, &images[..16 + 784 * 3 + 100]).unwrap();
    std::fs::copy(
        testdata("mnist/test-labels-idx1-ubyte.gz"),
        dir.path().join("t-labels-idx1-ubyte"),
    )
    .unwrap();
    let err = run(
        &Format::Idx(IdxOptions::default()),
        std::slice::from_ref(&path),
        dir.path(),
        |_| {},
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: byte 2468: truncated IDX images file: the header promises 2000 images of 784 bytes (1568000 bytes after the 16-byte header), the file ends after 2452 (inside images item 3)",
            path.display()
        )
    );
    assert_no_output(dir.path(), &["t-images-idx3-ubyte", "t-labels-idx1-ubyte"]);
}

#[test]
fn label_count_differs_from_image_count() {
    let dir = tempfile::tempdir().unwrap();
    let labels = testdata("mnist/train-labels-idx1-ubyte.gz");
    let images = testdata("mnist/test-images-idx3-ubyte.gz");
    let format = Format::Idx(IdxOptions {
        labels: Some(labels.clone()),
        as_float: false,
        ..IdxOptions::default()
    });
    let err = run(&format, std::slice::from_ref(&images), dir.path(), |_| {}).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: byte 4: the labels file has 8000 labels, but the images file {} has 2000 images (expected one label per image)",
            labels.display(),
            images.display()
        )
    );
    assert!(files_in(dir.path()).is_empty());
}

#[test]
fn json_syntax_error() {
    let (dir, result) = convert_text(
        "s.json",
        b"[{\"a\": 1},\n {\"a\": 2,, \"b\": 3}]\n",
        Format::Json(JsonOptions::default()),
        true,
    );
    let err = result.unwrap_err();
    let path = dir.path().join("s.json");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: line 2, column 10 (byte 20): JSON syntax error: key must be a string",
            path.display()
        )
    );
    // In an array, a syntax error cannot be skipped: the rest cannot be trusted.
    assert!(!err.is_bad_row());
    assert_no_output(dir.path(), &["s.json"]);
}

#[test]
fn json_value_contradicting_the_column_type() {
    let text =
        b"{\"a\": 1, \"b\": \"x\"}\n{\"a\": 2.5, \"b\": \"y\"}\n{\"a\": \"three\", \"b\": \"z\"}\n";
    let (dir, result) = convert_text("c.jsonl", text, Format::Json(JsonOptions::default()), false);
    let err = result.unwrap_err().to_string();
    let path = dir.path().join("c.jsonl");
    assert_eq!(
        err,
        format!(
            "{}: line 3, column 7 (byte 46): the string \"three\" contradicts key \"a\", which holds numbers (first at line 1, column 7): expected a number or a boolean, or null",
            path.display()
        )
    );
    assert_no_output(dir.path(), &["c.jsonl"]);
    let (_dir, result) = convert_text("c.jsonl", text, Format::Json(JsonOptions::default()), true);
    let summary = result.unwrap();
    assert_eq!((summary.records, summary.rows_skipped), (2, 1));
    assert_eq!(summary.schema.feature("a").unwrap().dtype, DType::Float32);
}

#[test]
fn json_lines_syntax_error_is_skippable() {
    let text = b"{\"a\": 1}\n{\"a\": }\n{\"a\": 3}\n";
    let (dir, result) = convert_text("l.jsonl", text, Format::Json(JsonOptions::default()), false);
    let err = result.unwrap_err().to_string();
    assert!(
        err.ends_with("l.jsonl: line 2, column 7 (byte 15): JSON syntax error: expected value"),
        "{err}"
    );
    assert_no_output(dir.path(), &["l.jsonl"]);
    let (_dir, result) = convert_text("l.jsonl", text, Format::Json(JsonOptions::default()), true);
    let summary = result.unwrap();
    assert_eq!((summary.records, summary.rows_skipped), (2, 1));
    assert_eq!(read_rows(&summary)[1]["a"], Feat::I(vec![3]));
}

#[test]
fn cancelled_conversion_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cancel = Arc::new(AtomicBool::new(true));
    let input: PathBuf = testdata("tabular/penguins.csv");
    let err = run(
        &Format::Csv(CsvOptions::default()),
        &[input],
        dir.path(),
        |o| o.cancel = Some(cancel),
    )
    .unwrap_err();
    assert!(matches!(err, ConvertError::Interrupted));
    assert!(files_in(dir.path()).is_empty());
}

#[test]
fn empty_and_header_only_inputs() {
    let (dir, result) = convert_text("e.csv", b"", Format::Csv(CsvOptions::default()), false);
    assert!(
        result
            .unwrap_err()
            .to_string()
            .contains("empty file: expected a header row")
    );
    assert_no_output(dir.path(), &["e.csv"]);
    let (dir, result) = convert_text("h.csv", b"a,b\n", Format::Csv(CsvOptions::default()), false);
    let err = result.unwrap_err();
    assert!(matches!(err, ConvertError::NoRecords { skipped: 0, .. }));
    assert!(
        err.to_string().starts_with(&format!(
            "{}: no records",
            dir.path().join("h.csv").display()
        )),
        "{err}"
    );
    for text in [&b""[..], b"[]", b"[ ]\n"] {
        let (dir, result) =
            convert_text("e.json", text, Format::Json(JsonOptions::default()), false);
        let err = result.unwrap_err();
        assert!(
            err.to_string().contains("e.json: no records to write"),
            "{err}"
        );
        assert_no_output(dir.path(), &["e.json"]);
    }
}

#[test]
fn cancel_in_the_middle_removes_open_shards() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("a,b,c\n");
    for i in 0..300_000 {
        text.push_str(&format!("{i},{}.5,x{i}\n", i % 97));
    }
    let input = dir.path().join("big.csv");
    std::fs::write(&input, &text).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // Cancel as soon as the encoding phase has written something: shard
    // files are open under temporary names at that point.
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen_in = seen.clone();
    let err = run(&Format::Csv(CsvOptions::default()), &[input], &out, |o| {
        o.cancel = Some(cancel);
        o.threads = 2;
        o.sharding = tfpipe::convert::Sharding::Shards(4);
        o.progress = Some(Arc::new(move |p: &tfpipe::convert::Progress| {
            if p.phase == tfpipe::convert::Phase::Encoding && p.records > 0 {
                seen_in.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    })
    .unwrap_err();
    assert!(matches!(err, ConvertError::Interrupted), "{err}");
    assert!(
        seen.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "cancelled mid-encoding"
    );
    assert!(files_in(&out).is_empty(), "{:?}", files_in(&out));
}

#[test]
fn several_csv_files_share_one_schema_and_report_their_own_lines() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.csv");
    let b = dir.path().join("b.csv");
    std::fs::write(&a, "x,y\n1,2\n3,4\n").unwrap();
    std::fs::write(&b, "x,y\n5,6.5\n7\n").unwrap();
    let format = Format::Csv(CsvOptions::default());
    let err = run(&format, &[a.clone(), b.clone()], dir.path(), |_| {}).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("{}: line 3 (byte 10): ragged row", b.display())),
        "{err}"
    );
    assert_no_output(dir.path(), &["a.csv", "b.csv"]);
    let summary = run(&format, &[a, b.clone()], dir.path(), |o| {
        o.skip_bad_rows = true
    })
    .unwrap();
    assert_eq!((summary.records, summary.rows_skipped), (3, 1));
    assert_eq!(summary.schema.feature("y").unwrap().dtype, DType::Float32);
    let rows = read_rows(&summary);
    assert_eq!(rows[2]["y"], Feat::F(vec![6.5]));
    std::fs::write(&b, "x,z\n1,2\n").unwrap();
    let err = run(&format, &[dir.path().join("a.csv"), b], dir.path(), |_| {}).unwrap_err();
    assert!(
        err.to_string().contains("differs from the first file's"),
        "{err}"
    );
}

#[test]
fn json_array_elements_must_be_objects() {
    let (dir, result) = convert_text(
        "n.json",
        b"[{\"a\": 1}, 2]",
        Format::Json(JsonOptions::default()),
        true,
    );
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("n.json: line 1, column 12 (byte 11): expected a JSON object"),
        "{err}"
    );
    assert_no_output(dir.path(), &["n.json"]);
}

#[test]
fn an_unterminated_quote_is_an_error_at_the_line_where_it_opened() {
    for skip in [false, true] {
        let (dir, result) = convert_text(
            "q.csv",
            b"a,b\n1,\"never closed\n2,3\n4,5\n",
            Format::Csv(CsvOptions::default()),
            skip,
        );
        let err = result.unwrap_err();
        let loc = err.location().expect("located");
        assert_eq!(
            (loc.line, loc.column, loc.byte),
            (Some(2), Some(3), 6),
            "{err}"
        );
        assert!(err.to_string().contains("never closed"), "{err}");
        assert_no_output(dir.path(), &["q.csv"]);
    }
}

#[test]
fn numbers_never_change_silently() {
    // Beyond float32: an error at the value, for inferred and declared columns.
    for (name, text) in [
        ("f.csv", &b"a,b\n1.5,x\n1e39,y\n"[..]),
        ("g.csv", b"a,b\n1.5,x\n1e400,y\n"),
    ] {
        let (dir, result) = convert_text(name, text, Format::Csv(CsvOptions::default()), false);
        let err = result.unwrap_err();
        let loc = err.location().expect("located");
        assert_eq!((loc.line, loc.column), (Some(3), Some(1)), "{err}");
        assert!(
            err.to_string().contains("beyond the range of float32"),
            "{err}"
        );
        assert_no_output(dir.path(), &[name]);
    }
    let declared = CsvOptions::default()
        .with_column_texts(&["a:float32"])
        .unwrap();
    let (_dir, result) = convert_text(
        "d.csv",
        b"a\n1\n2e39\n",
        Format::Csv(declared.clone()),
        false,
    );
    assert!(result.unwrap_err().to_string().contains("line 3"));
    let (_dir, result) = convert_text("d.csv", b"a\n1\n2e39\n", Format::Csv(declared), true);
    let summary = result.unwrap();
    assert_eq!((summary.records, summary.rows_skipped), (1, 1));
    // JSON too.
    let (_dir, result) = convert_text(
        "f.jsonl",
        b"{\"a\": 1.5}\n{\"a\": 1e39}\n",
        Format::Json(JsonOptions::default()),
        false,
    );
    let err = result.unwrap_err();
    assert_eq!(err.location().and_then(|l| l.line), Some(2), "{err}");

    // Beyond int64: kept exactly as text, with a warning; int64 max stays int64.
    let (_dir, result) = convert_text(
        "ids.csv",
        b"id,max\n1,9223372036854775807\n12345678901234567890,1\n",
        Format::Csv(CsvOptions::default()),
        false,
    );
    let summary = result.unwrap();
    let rows = read_rows(&summary);
    assert_eq!(rows[0]["id"], Feat::B(vec![b"1".to_vec()]));
    assert_eq!(
        rows[1]["id"],
        Feat::B(vec![b"12345678901234567890".to_vec()])
    );
    assert_eq!(rows[0]["max"], Feat::I(vec![i64::MAX]));
    assert_eq!(summary.warnings.len(), 1, "{:?}", summary.warnings);
    assert!(
        summary.warnings[0].contains("\"id\""),
        "{:?}",
        summary.warnings
    );
    assert!(
        summary.warnings[0].contains("line 3"),
        "{:?}",
        summary.warnings
    );
    let (_dir, result) = convert_text(
        "ids.jsonl",
        b"{\"id\": 1, \"x\": 1}\n{\"id\": 12345678901234567890, \"x\": 1.0}\n",
        Format::Json(JsonOptions::default()),
        false,
    );
    let summary = result.unwrap();
    let rows = read_rows(&summary);
    assert_eq!(rows[0]["id"], Feat::B(vec![b"1".to_vec()]));
    assert_eq!(
        rows[1]["id"],
        Feat::B(vec![b"12345678901234567890".to_vec()])
    );
    assert_eq!(rows[0]["x"], Feat::F(vec![1.0]));
    assert_eq!(summary.warnings.len(), 1, "{:?}", summary.warnings);
}

#[test]
fn a_broken_json_line_is_reported_on_its_own_line_and_skipped_alone() {
    let text = b"{\"a\": 1}\n{\"a\": 2}\n{\"a\": 3,\n{\"a\": 4}\n{\"a\": 5}\n";
    let (_dir, result) = convert_text("b.jsonl", text, Format::Json(JsonOptions::default()), false);
    let err = result.unwrap_err();
    assert_eq!(err.location().and_then(|l| l.line), Some(3), "{err}");
    let (_dir, result) = convert_text("b.jsonl", text, Format::Json(JsonOptions::default()), true);
    let summary = result.unwrap();
    assert_eq!((summary.records, summary.rows_skipped), (4, 1));
    let values: Vec<Feat> = read_rows(&summary)
        .into_iter()
        .map(|r| r["a"].clone())
        .collect();
    assert_eq!(values, [1, 2, 4, 5].map(|v| Feat::I(vec![v])));
}

#[test]
fn a_lone_surrogate_is_an_error_not_a_replacement_character() {
    for text in [
        &br#"{"s": "\ud800b"}"#[..],
        br#"{"s": "\udc00"}"#,
        br#"{"s": "\ud800\u0041"}"#,
    ] {
        let (_dir, result) =
            convert_text("s.jsonl", text, Format::Json(JsonOptions::default()), false);
        let err = result.unwrap_err();
        assert!(err.to_string().contains("lone surrogate"), "{err}");
        assert_eq!(err.location().and_then(|l| l.column), Some(8), "{err}");
    }
    // A proper pair is one character.
    let (_dir, result) = convert_text(
        "p.jsonl",
        br#"{"s": "\ud83d\ude00"}"#,
        Format::Json(JsonOptions::default()),
        false,
    );
    let rows = read_rows(&result.unwrap());
    assert_eq!(rows[0]["s"], Feat::B(vec!["😀".as_bytes().to_vec()]));
}
