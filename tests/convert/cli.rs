//! The command line: exit codes, messages, files.

use assert_cmd::Command;

use super::common::*;

fn stdout(assert: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&assert.get_output().stdout).into_owned()
}

fn stderr(assert: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&assert.get_output().stderr).into_owned()
}

fn tfpipe() -> Command {
    Command::cargo_bin("tfpipe").unwrap()
}

#[test]
fn converts_csv_and_prints_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("peng");
    let out = tfpipe()
        .args(["convert", "csv"])
        .arg(testdata("tabular/penguins.csv"))
        .arg("--output")
        .arg(&prefix)
        .args([
            "--shards",
            "2",
            "--label",
            "species",
            "--threads",
            "2",
            "--json",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(report["records"], 344);
    assert_eq!(report["rows_skipped"], 0);
    assert_eq!(report["shards"].as_array().unwrap().len(), 2);
    assert_eq!(
        files_in(dir.path()),
        [
            "peng-00000-of-00002.tfrecord",
            "peng-00001-of-00002.tfrecord",
            "peng.features.json"
        ]
    );
}

#[test]
fn bad_row_exits_1_with_the_location_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.csv");
    std::fs::write(&input, "a,b\n1,2\n3\n").unwrap();
    let assert = tfpipe()
        .args(["convert", "csv"])
        .arg(&input)
        .arg("-o")
        .arg(dir.path().join("out"))
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(
        stderr.contains("bad.csv: line 3 (byte 8): ragged row"),
        "{stderr}"
    );
    assert!(stderr.contains("no output was written"), "{stderr}");
    assert_eq!(files_in(dir.path()), ["bad.csv"]);
}

#[test]
fn idx_conversion_with_gzip_shards() {
    let dir = tempfile::tempdir().unwrap();
    let assert = tfpipe()
        .args(["convert", "idx"])
        .arg(testdata("mnist/test-images-idx3-ubyte.gz"))
        .arg("-o")
        .arg(dir.path().join("mnist"))
        .args(["--records-per-shard", "1000", "--compression", "gzip"])
        .assert()
        .success();
    assert!(stdout(&assert).contains("converted 2000 records"));
    assert_eq!(
        files_in(dir.path()),
        [
            "mnist-00000-of-00002.tfrecord.gz",
            "mnist-00001-of-00002.tfrecord.gz",
            "mnist.features.json"
        ]
    );
}

#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let assert = tfpipe()
        .args(["convert", "csv"])
        .arg(testdata("tabular/penguins.csv"))
        .arg("-o")
        .arg(dir.path().join("x"))
        .args(["--labels", "y"])
        .assert()
        .code(2);
    assert!(
        stderr(&assert).contains("--labels does not apply to the \"csv\" format"),
        "{}",
        stderr(&assert)
    );
    let assert = tfpipe()
        .args(["convert", "csv"])
        .arg(testdata("tabular/penguins.csv"))
        .arg("-o")
        .arg(dir.path().join("x"))
        .args(["--label", "nope"])
        .assert()
        .code(2);
    assert!(
        stderr(&assert).contains("--label \"nope\": no such column"),
        "{}",
        stderr(&assert)
    );
    assert!(files_in(dir.path()).is_empty());
}

#[cfg(not(feature = "images"))]
#[test]
fn resize_without_the_feature_says_which_feature() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("root/a")).unwrap();
    let assert = tfpipe()
        .args(["convert", "images"])
        .arg(dir.path().join("root"))
        .arg("-o")
        .arg(dir.path().join("x"))
        .args(["--resize", "8x8"])
        .assert()
        .code(2);
    assert!(
        stderr(&assert).contains("--features images"),
        "{}",
        stderr(&assert)
    );
}
