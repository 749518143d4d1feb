//! `tfpipe predict` from the outside: JSON Lines on stdout, class names and
//! probabilities, record keys, regression values, atomic file output under
//! signals, and label vocabularies that must match the checkpoint's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use prost::Message;
use tfpipe::example::Example;
use tfpipe::example::proto::{Feature, Features, FloatList, feature};
use tfpipe::tfrecord::{Compression, FileRecordWriter};

mod common;

fn tfpipe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tfpipe"))
}

fn ok(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Converts `csv` (penguins' columns, label `species`) under `dir/NAME`;
/// returns (schema file, data glob).
fn convert(dir: &Path, name: &str, csv: &Path) -> (PathBuf, String) {
    let prefix = dir.join(name);
    let out = tfpipe()
        .args(["convert", "csv"])
        .arg(csv)
        .args(["--label", "species", "--output"])
        .arg(&prefix)
        .output()
        .unwrap();
    ok(&out);
    (
        dir.join(format!("{name}.features.json")),
        format!("{}-*", prefix.display()),
    )
}

/// Trains a small MLP on penguins for 3 epochs into `dir/ck`, its missing
/// inputs imputed.
fn train_penguins(dir: &Path) -> (PathBuf, String) {
    let (schema, data) = convert(dir, "penguins", Path::new("testdata/tabular/penguins.csv"));
    let ck = dir.join("ck");
    let out = tfpipe()
        .arg("train")
        .arg("--schema")
        .arg(&schema)
        .args(["--data", &data, "--epochs", "3", "--batch-size", "32"])
        .args(["--impute", "mean", "--hidden", "16", "--save"])
        .arg(&ck)
        .output()
        .unwrap();
    ok(&out);
    (ck, data)
}

fn lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn predictions_go_to_stdout_as_json_lines_with_names_probabilities_and_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, data) = train_penguins(dir.path());
    let out = tfpipe()
        .arg("predict")
        .arg("--checkpoint")
        .arg(&ck)
        .args(["--data", &data, "--key", "island"])
        .output()
        .unwrap();
    let stdout = ok(&out);
    // The report goes to stderr, so stdout is the predictions alone.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("predicted  344 examples"), "{stderr}");
    let rows = lines(&stdout);
    assert_eq!(rows.len(), 344);
    let names = ["Adelie", "Chinstrap", "Gentoo"];
    for row in &rows {
        let class = row["class"].as_u64().unwrap() as usize;
        assert_eq!(row["class_name"], names[class], "{row}");
        let p: Vec<f64> = row["probabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(p.len(), 3, "{row}");
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-4, "{row}");
        // The class is the most probable one.
        assert!(p.iter().all(|&x| x <= p[class]), "{row}");
        assert!(row["label"].as_u64().unwrap() < 3, "{row}");
        let island = row["key"].as_str().unwrap();
        assert!(["Torgersen", "Biscoe", "Dream"].contains(&island), "{row}");
    }
    // Record order: the CSV's first row is an Adelie from Torgersen.
    assert_eq!(rows[0]["key"], "Torgersen");
    assert_eq!(rows[0]["label"], 0);

    // `--output -` is stdout too, byte for byte.
    let again = tfpipe()
        .arg("predict")
        .arg("--checkpoint")
        .arg(&ck)
        .args(["--data", &data, "--key", "island", "--output", "-"])
        .output()
        .unwrap();
    assert_eq!(ok(&again), stdout);
    assert!(!Path::new("-").exists());

    // A file gets the same lines; nothing else is left in its directory.
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let file = out_dir.join("pred.jsonl");
    let to_file = tfpipe()
        .arg("predict")
        .arg("--checkpoint")
        .arg(&ck)
        .args(["--data", &data, "--key", "island", "--output"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(ok(&to_file).contains("predicted  344 examples"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), stdout);
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 1);

    // TFRecord output: one Example per record, with the key.
    let records = out_dir.join("pred.tfrecord");
    let out = tfpipe()
        .arg("predict")
        .arg("--checkpoint")
        .arg(&ck)
        .args(["--data", &data, "--key", "island", "--output"])
        .arg(&records)
        .output()
        .unwrap();
    ok(&out);
    let mut reader = tfpipe::tfrecord::FileRecordReader::open(
        &records,
        tfpipe::tfrecord::ReaderOptions::default(),
    )
    .unwrap();
    let mut buf = Vec::new();
    let mut n = 0;
    while reader.read_record(&mut buf).unwrap() {
        let example = Example::decode(buf.as_slice()).unwrap();
        let f = example.features.unwrap().feature;
        let Some(feature::Kind::Int64List(class)) = &f["class"].kind else {
            panic!("{f:?}")
        };
        assert_eq!(class.value[0], rows[n]["class"].as_i64().unwrap());
        let Some(feature::Kind::BytesList(key)) = &f["key"].kind else {
            panic!("{f:?}")
        };
        assert_eq!(key.value[0], rows[n]["key"].as_str().unwrap().as_bytes());
        n += 1;
    }
    assert_eq!(n, 344);

    // A key the records do not have is an error naming it.
    let out = tfpipe()
        .arg("predict")
        .arg("--checkpoint")
        .arg(&ck)
        .args(["--data", &data, "--key", "nope"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--key \"nope\""), "{stderr}");
}

#[test]
fn a_label_vocabulary_other_than_the_checkpoints_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, _) = train_penguins(dir.path());
    // A split converted on its own: no Chinstrap, so Gentoo becomes class 1.
    let text = std::fs::read_to_string("testdata/tabular/penguins.csv").unwrap();
    let split: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("Chinstrap"))
        .collect();
    let csv = dir.path().join("split.csv");
    std::fs::write(&csv, split.join("\n") + "\n").unwrap();
    let (schema, data) = convert(dir.path(), "split", &csv);

    let out = tfpipe()
        .arg("predict")
        .arg("--checkpoint")
        .arg(&ck)
        .args(["--data", &data])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("label vocabulary") && stderr.contains("\"Chinstrap\""),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    // Resuming training on it, or validating on it, is refused too.
    for flag in ["--resume", "--validation-data"] {
        let mut cmd = tfpipe();
        cmd.args(["train", "--impute", "mean"]);
        if flag == "--resume" {
            cmd.arg("--schema").arg(&schema).args(["--data", &data]);
            cmd.arg("--resume").arg(&ck);
        } else {
            let full = dir.path().join("penguins.features.json");
            cmd.arg("--schema").arg(&full);
            cmd.args(["--data", &format!("{}/penguins-*", dir.path().display())]);
            cmd.args(["--validation-data", &data]);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains("label vocabulary"), "{flag}: {stderr}");
    }
}

fn float(value: Vec<f32>) -> Feature {
    Feature {
        kind: Some(feature::Kind::FloatList(FloatList { value })),
    }
}

/// `n` records: `x` two floats, `y = 2 x0 - x1 + 1`.
fn write_linear(path: &Path, n: usize) {
    let mut w = FileRecordWriter::create(path, Compression::None).unwrap();
    let mut buf = Vec::new();
    for i in 0..n {
        let (a, b) = ((i % 17) as f32 / 17.0, (i % 5) as f32 / 5.0);
        let example = Example {
            features: Some(Features {
                feature: [
                    ("x".to_string(), float(vec![a, b])),
                    ("y".to_string(), float(vec![2.0 * a - b + 1.0])),
                ]
                .into_iter()
                .collect(),
            }),
        };
        buf.clear();
        example.encode(&mut buf).unwrap();
        w.write_record(&buf).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn regression_predictions_carry_the_value_and_the_report_the_mae() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("lin.tfrecord");
    write_linear(&data, 256);
    let ck = dir.path().join("ck");
    let out = tfpipe()
        .arg("train")
        .arg("--data")
        .arg(&data)
        .args(["--feature", "x:float32:2", "--feature", "y:float32"])
        .args(["--label", "y", "--epochs", "20", "--batch-size", "32"])
        .args(["--hidden", "16", "--lr", "0.01", "--save"])
        .arg(&ck)
        .output()
        .unwrap();
    ok(&out);
    let report = dir.path().join("pred.json");
    let out = tfpipe()
        .arg("predict")
        .arg("--checkpoint")
        .arg(&ck)
        .arg("--data")
        .arg(&data)
        .arg("--report-json")
        .arg(&report)
        .output()
        .unwrap();
    let rows = lines(&ok(&out));
    assert_eq!(rows.len(), 256);
    let mut abs = 0.0;
    for row in &rows {
        assert!(row.get("class").is_none() && row.get("probabilities").is_none());
        abs += (row["value"].as_f64().unwrap() - row["label"].as_f64().unwrap()).abs();
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let mae = report["mae"].as_f64().unwrap();
    assert!((mae - abs / 256.0).abs() < 1e-4, "{report}");
    assert!(mae < 0.2, "{report}");
    assert!(report["accuracy"].is_null(), "{report}");
}

/// SIGTERM while predicting into a file: exit 143, and neither the file nor
/// its temporary exists. (A long `--warmup` keeps the run busy after the
/// temporary file exists; the warm-up polls the flag.)
#[cfg(unix)]
#[test]
fn a_signal_while_predicting_into_a_file_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("lin.tfrecord");
    write_linear(&data, 64);
    let ck = dir.path().join("ck");
    let out = tfpipe()
        .arg("train")
        .arg("--data")
        .arg(&data)
        .args(["--feature", "x:float32:2", "--feature", "y:float32"])
        .args(["--label", "y", "--steps", "2", "--hidden", "4", "--save"])
        .arg(&ck)
        .output()
        .unwrap();
    ok(&out);
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    for (signal, code) in [("TERM", 143), ("INT", 130)] {
        let child = tfpipe()
            .arg("predict")
            .arg("--checkpoint")
            .arg(&ck)
            .arg("--data")
            .arg(&data)
            .args(["--warmup", "1000000", "--output"])
            .arg(out_dir.join("pred.jsonl"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = || std::fs::read_dir(&out_dir).unwrap().count() > 0;
        let out = common::signal_when_ready(child, signal, "no temporary file", started);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "SIG{signal}: {stderr}");
        assert!(
            stderr.contains(&format!("interrupted by SIG{signal}")),
            "{stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(&out_dir).unwrap().collect();
        assert!(left.is_empty(), "SIG{signal} left {left:?}");
    }
}

#[test]
fn a_missing_checkpoint_prints_its_io_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-checkpoint");
    let out = tfpipe()
        .arg("predict")
        .arg("--checkpoint")
        .arg(&missing)
        .args(["--data", "testdata/tabular/none-*"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    // The io error is the cause of the checkpoint error, never also in its
    // message: the chain names it once.
    let io_text = std::fs::read(&missing).unwrap_err().to_string();
    assert_eq!(stderr.matches(io_text.as_str()).count(), 1, "{stderr}");
    assert!(stderr.contains("no-such-checkpoint"), "{stderr}");
    assert!(stderr.contains("cannot read checkpoint.json"), "{stderr}");
}
