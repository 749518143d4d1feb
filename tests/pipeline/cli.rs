//! `tfpipe bench` on small generated files.

use assert_cmd::Command;
use tfpipe::tfrecord::Compression;

use crate::common::{mnist_example, write_shards};

fn tfpipe() -> Command {
    Command::cargo_bin("tfpipe").unwrap()
}

#[test]
fn bench_needs_a_schema_source() {
    let out = tfpipe()
        .args(["bench", "--data", "x.tfrecord"])
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--feature") || stderr.contains("--schema"),
        "{stderr}"
    );
}

#[test]
fn bench_reports_missing_files() {
    let out = tfpipe()
        .args([
            "bench",
            "--data",
            "/nonexistent/*.tfrecord",
            "--feature",
            "label:int64",
        ])
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("tfpipe: /nonexistent/*.tfrecord: no such file"),
        "{stderr}"
    );
}

#[test]
fn bench_json_has_the_documented_keys() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 3, 100, Compression::None, mnist_example);
    let gz = dir.path().join("gz");
    std::fs::create_dir(&gz).unwrap();
    write_shards(&gz, 1, 50, Compression::Gzip, mnist_example);
    let out = tfpipe()
        .args(["bench", "--data"])
        .arg(dir.path().join("part-*.tfrecord"))
        .arg(gz.join("*.gz"))
        .args([
            "--feature",
            "image_raw:uint8:784",
            "--feature",
            "label:int64",
        ])
        .args([
            "--batch-size",
            "32",
            "--shuffle-buffer",
            "64",
            "--epochs",
            "2",
            "--json",
        ])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["examples"], 2 * 350);
    for key in [
        "seconds",
        "examples_per_sec",
        "mb_per_sec",
        "time_to_first_batch_s",
        "peak_rss_bytes",
    ] {
        assert!(json[key].as_f64().is_some(), "{key} in {json}");
    }
    let stages = json["stages"].as_array().unwrap();
    let names: Vec<&str> = stages.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert!(
        names.contains(&"tfrecord") && names.contains(&"parse"),
        "{names:?}"
    );
}

#[test]
fn bench_sweep_prints_a_row_per_setting() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 2, 64, Compression::None, mnist_example);
    let out = tfpipe()
        .args(["bench", "--data"])
        .arg(dir.path().join("part-*"))
        .args([
            "--feature",
            "image_raw:bytes",
            "--feature",
            "label:int64",
            "--sweep",
        ])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = stdout.lines().skip(1).collect();
    assert!(rows.len() >= 3, "{stdout}");
    assert!(
        rows.last().unwrap().trim_start().starts_with("auto"),
        "{stdout}"
    );
}
