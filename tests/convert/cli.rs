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
        stderr(&assert).contains("label column \"nope\": no such column"),
        "{}",
        stderr(&assert)
    );
    assert!(files_in(dir.path()).is_empty());
}

#[test]
fn negative_or_zero_counts_get_a_plain_message() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value) in [
        ("--shards", "-3"),
        ("--shards", "0"),
        ("--records-per-shard", "-1"),
        ("--threads", "0"),
    ] {
        let assert = tfpipe()
            .args(["convert", "csv"])
            .arg(testdata("tabular/penguins.csv"))
            .arg("-o")
            .arg(dir.path().join("x"))
            .args([flag, value])
            .assert()
            .code(2);
        let err = stderr(&assert);
        assert!(err.contains("is not a whole number of at least 1"), "{err}");
        assert!(!err.contains("-- "), "no hint about `--`: {err}");
    }
}

/// An IDX images file with the given sizes (no pixels unless `pixels`).
fn idx_images(count: u32, rows: u32, cols: u32, pixels: &[u8]) -> Vec<u8> {
    let mut data = vec![0, 0, 8, 3];
    for d in [count, rows, cols] {
        data.extend_from_slice(&d.to_be_bytes());
    }
    data.extend_from_slice(pixels);
    data
}

fn idx_labels(labels: &[u8]) -> Vec<u8> {
    let mut data = vec![0, 0, 8, 1];
    data.extend_from_slice(&(labels.len() as u32).to_be_bytes());
    data.extend_from_slice(labels);
    data
}

#[test]
fn idx_corrupt_gzip_exits_1_with_an_offset_and_0x0_images_are_rejected() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let images = idx_images(50, 28, 28, &vec![7u8; 50 * 784]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&images).unwrap();
    let mut gz = gz.finish().unwrap();
    let n = gz.len();
    gz[n - 6] ^= 0xff; // the CRC-32 trailer
    std::fs::write(dir.path().join("t-images-idx3-ubyte.gz"), &gz).unwrap();
    std::fs::write(dir.path().join("t-labels-idx1-ubyte"), idx_labels(&[1; 50])).unwrap();
    let assert = tfpipe()
        .args(["convert", "idx"])
        .arg(dir.path().join("t-images-idx3-ubyte.gz"))
        .arg("-o")
        .arg(dir.path().join("out/m"))
        .assert()
        .code(1);
    let err = stderr(&assert);
    assert!(
        err.contains("t-images-idx3-ubyte.gz: corrupt gzip data after"),
        "{err}"
    );
    assert!(!dir.path().join("out").exists());

    std::fs::write(
        dir.path().join("z-images-idx3-ubyte"),
        idx_images(2, 0, 0, &[]),
    )
    .unwrap();
    std::fs::write(dir.path().join("z-labels-idx1-ubyte"), idx_labels(&[1, 2])).unwrap();
    let assert = tfpipe()
        .args(["convert", "idx"])
        .arg(dir.path().join("z-images-idx3-ubyte"))
        .arg("-o")
        .arg(dir.path().join("out/z"))
        .assert()
        .code(1);
    let err = stderr(&assert);
    assert!(
        err.contains("z-images-idx3-ubyte: byte 8: IDX images of size 0x0"),
        "{err}"
    );
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

#[test]
fn csv_read_back_through_tfpipe_cat_equals_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let input = testdata("tabular/seattle-weather.csv");
    tfpipe()
        .args(["convert", "csv"])
        .arg(&input)
        .arg("-o")
        .arg(dir.path().join("sw"))
        .args(["--shards", "2", "--compression", "zlib"])
        .assert()
        .success();
    let mut shards: Vec<_> = files_in(dir.path())
        .into_iter()
        .filter(|n| n.ends_with(".tfrecord.zlib"))
        .map(|n| dir.path().join(n))
        .collect();
    shards.sort();
    assert_eq!(shards.len(), 2);
    // Record i is in shard i % 2: read them round-robin.
    let texts: Vec<String> = shards
        .iter()
        .map(|shard| stdout(&tfpipe().arg("cat").arg(shard).assert().success()))
        .collect();
    let mut per_shard: Vec<_> = texts.iter().map(|t| t.lines()).collect();
    let mut source = csv::Reader::from_path(&input).unwrap();
    let header: Vec<String> = source.headers().unwrap().iter().map(String::from).collect();
    for (i, row) in source.records().enumerate() {
        let row = row.unwrap();
        let line = per_shard[i % 2].next().unwrap();
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        let features = &record["features"];
        for (name, value) in header.iter().zip(row.iter()) {
            let feature = &features[name.as_str()];
            match name.as_str() {
                "date" | "weather" => {
                    assert_eq!(feature["kind"], "bytes_list");
                    use base64::Engine;
                    let b64 = base64::engine::general_purpose::STANDARD.encode(value);
                    assert_eq!(feature["values"][0], b64.as_str());
                }
                _ => {
                    assert_eq!(feature["kind"], "float_list", "{name}");
                    let bits = format!("{:#010x}", value.parse::<f32>().unwrap().to_bits());
                    assert_eq!(feature["bits"][0], bits.as_str(), "{name} {value}");
                }
            }
        }
    }
    assert!(per_shard.iter_mut().all(|l| l.next().is_none()));
}

/// A numeric CSV big enough that a debug build encodes it for a while.
fn big_csv(path: &std::path::Path, rows: usize) {
    let mut text = String::with_capacity(rows * 48);
    text.push_str("a,b,c,d,e,f\n");
    for i in 0..rows {
        text.push_str(&format!(
            "{i},{},{}.25,{},{}.5,{}\n",
            i * 7,
            i % 97,
            i * 3,
            i % 13,
            i ^ 5
        ));
    }
    std::fs::write(path, text).unwrap();
}

/// Waits until `dir` holds a temporary shard (the conversion is encoding),
/// or the child has ended; true if a temporary shard was seen.
#[cfg(unix)]
fn wait_for_temp_shard(dir: &std::path::Path, child: &mut std::process::Child) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if files_in(dir).iter().any(|n| n.ends_with(".tmp")) {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    false
}

/// SIGTERM in the middle of encoding (temporary shards exist) stops the
/// conversion with 143 and leaves no temporary file and no output.
#[cfg(unix)]
#[test]
fn sigterm_while_encoding_leaves_no_temporary_shard() {
    use std::process::{Command as StdCommand, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("big.csv");
    big_csv(&input, 400_000);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let mut child = StdCommand::new(env!("CARGO_BIN_EXE_tfpipe"))
        .args([
            "convert",
            "csv",
            "--shards",
            "8",
            "--threads",
            "2",
            "--output",
        ])
        .arg(out.join("p"))
        .arg(&input)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let encoding = wait_for_temp_shard(&out, &mut child);
    eprintln!("temporary shard seen before the signal: {encoding}");
    let killed = StdCommand::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !encoding {
        // Finished before a temporary shard was seen (a very fast machine):
        // nothing to interrupt, but never a partial file.
        assert!(files_in(&out).iter().all(|n| !n.ends_with(".tmp")));
        return;
    }
    assert!(killed.success());
    assert_eq!(output.status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("interrupted by SIGTERM"), "{stderr}");
    assert_eq!(files_in(&out), Vec::<String>::new(), "{stderr}");
}

/// Truncating the input while it is being converted is never a crash
/// (inputs are read, not memory-mapped: a mapped file cut short kills the
/// process with SIGBUS): the conversion either finishes from what it read,
/// or fails with an error naming the file, and leaves no temporary shard.
#[cfg(unix)]
#[test]
fn truncating_the_input_during_a_conversion_is_never_a_crash() {
    use std::process::{Command as StdCommand, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("big.csv");
    big_csv(&input, 400_000);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let child = StdCommand::new(env!("CARGO_BIN_EXE_tfpipe"))
        .args([
            "convert",
            "csv",
            "--shards",
            "4",
            "--threads",
            "2",
            "--output",
        ])
        .arg(out.join("p"))
        .arg(&input)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = child;
    let encoding = wait_for_temp_shard(&out, &mut child);
    eprintln!("temporary shard seen before the truncation: {encoding}");
    // Cut the file while the shards are being encoded from it.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&input)
        .unwrap()
        .set_len(100)
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let code = output.status.code();
    assert!(
        code.is_some(),
        "killed by a signal: {:?} {stderr}",
        output.status
    );
    match code {
        Some(0) => {
            assert!(encoding || files_in(&out).len() == 5);
            let summary = files_in(&out);
            assert_eq!(summary.len(), 5, "4 shards and the schema: {summary:?}");
        }
        _ => {
            assert!(
                stderr.contains("big.csv"),
                "the error names the input: {stderr}"
            );
            assert_eq!(files_in(&out), Vec::<String>::new(), "{stderr}");
        }
    }
    assert!(files_in(&out).iter().all(|n| !n.ends_with(".tmp")));
}

/// A headerless CSV read with a header gets a warning naming the flags that
/// read it whole; with `--no-header` every row is a record.
#[test]
fn a_data_like_header_is_warned_about_with_the_flags_that_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("iris.csv");
    std::fs::write(
        &input,
        "5.1,3.5,setosa\n4.9,3.0,setosa\n6.3,2.9,virginica\n",
    )
    .unwrap();
    let assert = tfpipe()
        .args(["convert", "csv"])
        .arg(&input)
        .arg("-o")
        .arg(dir.path().join("first/out"))
        .assert()
        .success();
    let err = stderr(&assert);
    assert!(
        err.contains("looks like data") && err.contains("--no-header or --names"),
        "{err}"
    );
    let assert = tfpipe()
        .args(["convert", "csv", "--no-header", "--json"])
        .arg(&input)
        .arg("-o")
        .arg(dir.path().join("whole/out"))
        .assert()
        .success();
    let summary: serde_json::Value = serde_json::from_str(&stdout(&assert)).unwrap();
    assert_eq!(summary["records"], 3, "{summary}");
}
