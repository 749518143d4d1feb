//! `tfpipe cat` and `tfpipe inspect`, run as the real binary.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};

use assert_cmd::Command;
use serde_json::Value;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/tf-golden")
        .join(name)
}

fn golden_records(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(golden(&format!("{name}.json"))).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    json["records"].as_array().unwrap().clone()
}

fn tfpipe() -> Command {
    Command::cargo_bin("tfpipe").unwrap()
}

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Output {
    let output = tfpipe().args(args).output().unwrap();
    Output {
        code: output.status.code().unwrap(),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn path(name: &str) -> String {
    golden(name).to_str().unwrap().to_string()
}

#[test]
fn cat_prints_exactly_the_golden_records() {
    for name in [
        "examples.tfrecord",
        "examples.tfrecord.gz",
        "examples.tfrecord.zlib",
        "sequence.tfrecord",
    ] {
        let out = run(&["cat", &path(name)]);
        assert_eq!(out.code, 0, "{name}: {}", out.stderr);
        assert!(out.stderr.is_empty(), "{}", out.stderr);
        let got = lines(&out.stdout);
        let want = golden_records(name);
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(got, want, "{name} record {i}");
        }
    }
}

#[test]
fn cat_with_explicit_type_and_compression() {
    let dir = tempfile::tempdir().unwrap();
    let renamed = dir.path().join("records.bin");
    std::fs::copy(golden("examples.tfrecord.zlib"), &renamed).unwrap();
    let out = run(&[
        "cat",
        "--compression",
        "zlib",
        "--type",
        "example",
        renamed.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(lines(&out.stdout), golden_records("examples.tfrecord"));

    let out = run(&["cat", "--type", "sequence", &path("sequence.tfrecord")]);
    assert_eq!(lines(&out.stdout), golden_records("sequence.tfrecord"));
}

#[test]
fn cat_limit_counts_over_all_files_and_indexes_restart_per_file() {
    let out = run(&["cat", "--limit", "3", &path("examples.tfrecord")]);
    assert_eq!(out.code, 0);
    assert_eq!(lines(&out.stdout), golden_records("examples.tfrecord")[..3]);

    let out = run(&[
        "cat",
        "--limit",
        "52",
        &path("examples.tfrecord"),
        &path("sequence.tfrecord"),
    ]);
    let got = lines(&out.stdout);
    assert_eq!(got.len(), 52);
    assert_eq!(got[50], golden_records("sequence.tfrecord")[0]);
    assert_eq!(got[51]["index"], 1);
}

#[test]
fn cat_reads_stdin() {
    let bytes = std::fs::read(golden("examples.tfrecord.gz")).unwrap();
    let output = tfpipe()
        .args(["cat", "--compression", "gzip", "-"])
        .write_stdin(bytes)
        .output()
        .unwrap();
    assert!(output.status.success());
    let got = lines(std::str::from_utf8(&output.stdout).unwrap());
    assert_eq!(got, golden_records("examples.tfrecord"));
}

#[test]
fn cat_prints_good_records_then_the_error_and_exits_1() {
    for (name, good, location) in [
        (
            "corrupt/data_crc_mismatch.tfrecord",
            10,
            "record 10 at byte 2220: data CRC",
        ),
        (
            "corrupt/length_crc_mismatch.tfrecord",
            20,
            "record 20 at byte 4348: length CRC",
        ),
        (
            "corrupt/truncated.tfrecord",
            49,
            "record 49 at byte 9549: truncated record",
        ),
    ] {
        let out = run(&["cat", &path(name)]);
        assert_eq!(out.code, 1, "{name}");
        assert_eq!(
            lines(&out.stdout),
            golden_records("examples.tfrecord")[..good],
            "{name}"
        );
        assert!(out.stderr.contains(&path(name)), "{}", out.stderr);
        assert!(out.stderr.contains(location), "{}", out.stderr);
    }
    // Later files are still printed.
    let out = run(&[
        "cat",
        &path("corrupt/truncated.tfrecord"),
        &path("sequence.tfrecord"),
    ]);
    assert_eq!(out.code, 1);
    assert_eq!(lines(&out.stdout).len(), 49 + 20);
}

#[test]
fn cat_reports_a_record_that_is_not_a_protobuf() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("junk.tfrecord");
    let mut writer = tfpipe::tfrecord::RecordWriter::new(Vec::new(), Default::default());
    writer.write_record(b"\x0a\x05ab").unwrap(); // field 1 claims 5 bytes, has 2
    std::fs::write(&file, writer.finish().unwrap()).unwrap();
    let out = run(&["cat", file.to_str().unwrap()]);
    assert_eq!(out.code, 1);
    assert!(out.stdout.is_empty());
    assert!(
        out.stderr
            .contains("record 0 at byte 0: not a valid tf.train.Example"),
        "{}",
        out.stderr
    );
}

#[test]
fn cat_missing_file_and_bad_usage_exit_2() {
    let out = run(&["cat", "/nonexistent/x.tfrecord"]);
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains("/nonexistent/x.tfrecord: cannot open"),
        "{}",
        out.stderr
    );
    assert_eq!(run(&["cat"]).code, 2);
    assert_eq!(
        run(&["cat", "--type", "json", &path("examples.tfrecord")]).code,
        2
    );
}

#[test]
fn cat_into_a_closed_pipe_exits_0() {
    // Enough records that the output overflows a pipe buffer.
    let records: Vec<Vec<u8>> = {
        let mut reader = tfpipe::tfrecord::FileRecordReader::open(
            golden("examples.tfrecord"),
            Default::default(),
        )
        .unwrap();
        let mut all = Vec::new();
        let mut record = Vec::new();
        while reader.read_record(&mut record).unwrap() {
            all.push(record.clone());
        }
        all
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("many.tfrecord");
    let mut writer = tfpipe::tfrecord::RecordWriter::new(Vec::new(), Default::default());
    for _ in 0..100 {
        for record in &records {
            writer.write_record(record).unwrap();
        }
    }
    std::fs::write(&file, writer.finish().unwrap()).unwrap();

    let mut child = StdCommand::new(assert_cmd::cargo::cargo_bin("tfpipe"))
        .args(["cat", file.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("{\"index\":0,"));
    drop(stdout);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn inspect_infers_feature_specs() {
    let out = run(&["inspect", &path("examples.tfrecord")]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let text = &out.stdout;
    assert!(
        text.contains(
            "tf.train.Example, 50 records, 9700 bytes, compression none, 0 skipped, 0 corrupt"
        ),
        "{text}"
    );
    for spec in [
        "--feature counts:int64:var ",
        // Fixed-length features missing from some records get a default,
        // so the pasted spec parses every record.
        "--feature emb:float32:3=0 ",
        "--feature id:int64 ",
        "--feature label:bytes= ",
        "--feature score:float32=0 ",
        "--feature tags:bytes:var ",
        "--feature weights:float32:var ",
    ] {
        assert!(text.contains(spec), "{spec} missing from\n{text}");
    }
    let line = |spec: &str| {
        text.lines()
            .find(|l| l.contains(&format!("--feature {spec} ")))
            .unwrap_or_else(|| panic!("{spec} missing from\n{text}"))
            .to_string()
    };
    assert!(line("id:int64").ends_with("  # int64_list in 50/50 records, 1 value"));
    assert!(line("emb:float32:3=0").ends_with("  # float_list in 46/50 records, 3 values"));
    assert!(
        line("flag:int64=0")
            .ends_with("  # int64_list in 16/50 records, 1 value, no list set in 2/50")
    );
    assert!(
        text.contains("# nokind: no dtype to infer, no list set in 2/50"),
        "{text}"
    );

    let out = run(&["inspect", &path("examples.tfrecord.gz")]);
    assert!(
        out.stdout
            .contains("3806 bytes (9700 uncompressed), compression gzip"),
        "{}",
        out.stdout
    );
}

#[test]
fn inspect_detects_sequence_examples() {
    let out = run(&["inspect", &path("sequence.tfrecord")]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let text = &out.stdout;
    assert!(
        text.contains("tf.train.SequenceExample, 20 records"),
        "{text}"
    );
    assert!(text.contains("--feature seq_id:int64 "), "{text}");
    assert!(
        text.contains(
            "--feature frames:float32:seq:2  # float_list in 14/20 records, 1-5 steps, 2 values per step"
        ),
        "{text}"
    );
    assert!(
        text.contains("# empty_list: no steps in 1/20 records, 0 steps"),
        "{text}"
    );
}

#[test]
fn inspect_json_reports_every_file_in_order_and_the_total() {
    let files = [
        path("sequence.tfrecord"),
        path("examples.tfrecord"),
        path("examples.tfrecord.zlib"),
        path("corrupt/data_crc_mismatch.tfrecord"),
    ];
    let mut args = vec!["inspect", "--json"];
    args.extend(files.iter().map(String::as_str));
    let out = run(&args);
    assert_eq!(out.code, 1);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    let reported: Vec<&str> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(reported, files);
    let corrupt = &report["files"][3];
    assert_eq!(corrupt["records"], 49);
    assert_eq!(corrupt["skipped"], 1);
    assert_eq!(corrupt["corrupt"], 1);
    assert_eq!(report["files"][2]["compression"], "zlib");
    assert_eq!(
        report["files"][0]["record_type"],
        "tf.train.SequenceExample"
    );
    assert_eq!(report["total"]["records"], 20 + 50 + 50 + 49);
    assert_eq!(report["total"]["corrupt"], 1);
    let emb = report["files"][1]["schema"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "emb")
        .unwrap();
    assert_eq!(emb["spec"], "emb:float32:3=0");
    assert_eq!(emb["present"], 46);
    assert_eq!(emb["min_values"], 3);
    assert_eq!(emb["max_values"], 3);
}

#[test]
fn inspect_reports_each_corruption_and_exits_1() {
    let out = run(&[
        "inspect",
        &path("corrupt/length_crc_mismatch.tfrecord"),
        &path("corrupt/truncated.tfrecord"),
    ]);
    assert_eq!(out.code, 1);
    let expected = [
        format!(
            "{}: record 20 at byte 4348: length CRC mismatch",
            path("corrupt/length_crc_mismatch.tfrecord")
        ),
        format!(
            "{}: record 49 at byte 9549: truncated record",
            path("corrupt/truncated.tfrecord")
        ),
    ];
    let stderr: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(stderr.len(), 2, "{}", out.stderr);
    for (line, want) in stderr.iter().zip(&expected) {
        assert!(line.starts_with(want), "{line}");
    }
    assert!(out.stdout.contains("20 records"));
    assert!(
        out.stdout.contains("total: 2 files, 69 records"),
        "{}",
        out.stdout
    );
}

#[test]
fn inspect_io_errors_exit_2() {
    let out = run(&[
        "inspect",
        &path("examples.tfrecord"),
        "/nonexistent/y.tfrecord",
    ]);
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains("/nonexistent/y.tfrecord"),
        "{}",
        out.stderr
    );
    // The readable file is still reported.
    assert!(out.stdout.contains("50 records"));
    assert_eq!(run(&["inspect"]).code, 2);
}

/// The `--feature` texts `inspect` printed, with their "in N/M records" counts.
fn printed_specs(text: &str) -> Vec<(String, u64, u64)> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("--feature ")?;
            let (spec, note) = rest.split_once("  # ")?;
            let counts = note.split(" in ").nth(1)?.split(' ').next()?;
            let (n, m) = counts.split_once('/')?;
            Some((spec.trim().to_string(), n.parse().ok()?, m.parse().ok()?))
        })
        .collect()
}

#[test]
fn inferred_specs_parse_and_decode_the_files_they_came_from() {
    for (name, expected) in [("examples.tfrecord", 8), ("sequence.tfrecord", 6)] {
        let out = run(&["inspect", &path(name)]);
        let specs = printed_specs(&out.stdout);
        assert_eq!(specs.len(), expected, "{}", out.stdout);
        for (spec, _, _) in &specs {
            let parsed: tfpipe::FeatureSpec = spec.parse().unwrap();
            assert_eq!(&parsed.to_string(), spec);
        }
        // Fixed-length features missing from some records come with a
        // default, so every printed spec decodes every record as it is.
        let usable: Vec<&str> = specs.iter().map(|(spec, _, _)| spec.as_str()).collect();
        let schema = tfpipe::Schema::from_feature_texts(&usable).unwrap();
        let mut parser = tfpipe::BatchParser::new(schema).unwrap();
        let mut reader =
            tfpipe::tfrecord::FileRecordReader::open(golden(name), Default::default()).unwrap();
        let mut records = Vec::new();
        let mut record = Vec::new();
        while reader.read_record(&mut record).unwrap() {
            records.push(record.clone());
        }
        let batch = parser.parse(&records).unwrap();
        assert_eq!(batch.num_rows, records.len());
    }
}

#[test]
fn cat_auto_never_drops_feature_lists_that_appear_late() {
    use prost::Message;
    use tfpipe::example::proto::{FeatureList, FeatureLists, SequenceExample};
    let mut writer = tfpipe::tfrecord::RecordWriter::new(Vec::new(), Default::default());
    // 70 records with context only (wire-identical to Examples), then one with lists.
    for _ in 0..70 {
        writer
            .write_record(&SequenceExample::default().encode_to_vec())
            .unwrap();
    }
    let mut lists = FeatureLists::default();
    lists
        .feature_list
        .insert("steps".into(), FeatureList { feature: vec![] });
    let last = SequenceExample {
        context: None,
        feature_lists: Some(lists),
    };
    writer.write_record(&last.encode_to_vec()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("late.tfrecord");
    std::fs::write(&file, writer.finish().unwrap()).unwrap();
    let out = run(&["cat", file.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let got = lines(&out.stdout);
    assert_eq!(got.len(), 71);
    assert_eq!(got[0]["features"], serde_json::json!({}));
    assert_eq!(got[70]["feature_lists"], serde_json::json!({"steps": []}));
}
