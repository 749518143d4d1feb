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

/// `bench` as rank `r` of `w` (by flags, or by `RANK`/`WORLD_SIZE` when
/// `env`): `(examples, batches)` from its JSON report.
fn bench_rank(pattern: &std::path::Path, r: usize, w: usize, env: bool) -> (u64, u64) {
    let mut cmd = tfpipe();
    cmd.args(["bench", "--data"])
        .arg(pattern)
        .args(["--feature", "label:int64", "--batch-size", "4", "--json"])
        .args(["--shuffle-buffer", "16", "--epochs", "2"])
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SLURM_STEP_ID");
    if env {
        cmd.env("RANK", r.to_string())
            .env("WORLD_SIZE", w.to_string());
    } else {
        cmd.args(["--rank", &r.to_string(), "--world-size", &w.to_string()]);
    }
    let out = cmd
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("rank {r} of {w}:")),
        "the share is reported: {stderr}"
    );
    let dropped = 105 % w;
    assert!(
        stderr.contains(&format!("{dropped} per epoch over all ranks")),
        "the drop is reported: {stderr}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        json["examples"].as_u64().unwrap(),
        json["batches"].as_u64().unwrap(),
    )
}

/// W processes: every rank the same examples and steps per epoch, the
/// shares adding up to the data less fewer than W records per epoch (5
/// files for 2, 3 and 7 ranks: files split by record where they do not
/// divide), from the flags or from the launcher's variables, and the drop
/// is printed.
#[test]
fn bench_ranks_run_equal_steps_and_share_the_data() {
    let dir = tempfile::tempdir().unwrap();
    // 5 files of 21 records: 105 records.
    write_shards(dir.path(), 5, 21, Compression::None, mnist_example);
    let pattern = dir.path().join("part-*");
    for (world, env) in [(2, false), (7, true), (3, false)] {
        let runs: Vec<(u64, u64)> = (0..world)
            .map(|r| bench_rank(&pattern, r, world, env))
            .collect();
        assert!(
            runs.iter().all(|run| *run == runs[0]),
            "world {world}: {runs:?}"
        );
        let per_epoch = runs.iter().map(|(examples, _)| examples / 2).sum::<u64>();
        // By file, 2 ranks read files {0,2,4} and {1,3}: 63 and 42, and
        // dropped 21 records per epoch.
        assert_eq!(per_epoch, 105 - 105 % world as u64, "world {world}");
    }
}

#[test]
fn rank_flags_and_variables_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 2, 10, Compression::None, mnist_example);
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = tfpipe();
        cmd.args(["bench", "--data"])
            .arg(dir.path().join("part-*"))
            .args(["--feature", "label:int64"])
            .args(args)
            .env_remove("RANK")
            .env_remove("WORLD_SIZE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd
            .timeout(std::time::Duration::from_secs(30))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, stderr) = run(&["--rank", "2", "--world-size", "2"], &[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--rank and --world-size"), "{stderr}");
    let (code, stderr) = run(&["--rank", "1"], &[]);
    assert_eq!(code, Some(2), "clap requires both: {stderr}");
    // Absurd world sizes are refused before anything is allocated for them
    // (they used to abort on an 8 TB allocation, or panic).
    for world in ["18446744073709551615", "1000000000000"] {
        let (code, stderr) = run(&["--rank", "0", "--world-size", world], &[]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("implausible"), "{stderr}");
        let (code, stderr) = run(&[], &[("RANK", "0"), ("WORLD_SIZE", world)]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("implausible"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let (code, stderr) = run(&[], &[("RANK", "1")]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("WORLD_SIZE is not set"), "{stderr}");
    // A flag overrides the launcher, and says so.
    let (code, stderr) = run(
        &["--rank", "0", "--world-size", "2"],
        &[("RANK", "1"), ("WORLD_SIZE", "4")],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("override the launcher's rank 1 of 4"),
        "{stderr}"
    );
}

/// With two ranks, an output path without `{rank}` is refused before any
/// work (the ranks would overwrite each other's files).
#[test]
fn ranks_need_their_own_output_paths() {
    let dir = tempfile::tempdir().unwrap();
    let out = tfpipe()
        .args(["predict", "--checkpoint"])
        .arg(dir.path().join("ck"))
        .args(["--data", "x.tfrecord", "--rank", "1", "--world-size", "2"])
        .arg("--output")
        .arg(dir.path().join("pred.jsonl"))
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("with 2 ranks every rank needs its own"),
        "{stderr}"
    );
    assert!(stderr.contains("pred-{rank}.jsonl"), "{stderr}");
}

/// `--mix` benches a weighted mixture of sources (every record once with
/// the default renormalising policy), a directory reads as a Spark
/// dataset, and `--partition-features` adds its `key=value` columns.
#[test]
fn bench_mixes_sources_and_reads_partition_features() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    std::fs::create_dir(&a).unwrap();
    write_shards(&a, 2, 100, Compression::None, mnist_example);
    let b = dir.path().join("b").join("year=2024");
    std::fs::create_dir_all(&b).unwrap();
    write_shards(&b, 1, 50, Compression::Gzip, mnist_example);
    std::fs::write(dir.path().join("b").join("_SUCCESS"), b"").unwrap();
    let out = tfpipe()
        .args(["bench", "--mix"])
        .arg(format!("{}=0.7", a.join("part-*").display()))
        .arg("--mix")
        .arg(format!("{}=0.3", dir.path().join("b").display()))
        .args([
            "--feature",
            "image_raw:uint8:784",
            "--feature",
            "label:int64",
            "--feature",
            "year:int64=0",
            "--partition-features",
            "year",
            "--batch-size",
            "32",
            "--shuffle-buffer",
            "64",
            "--json",
        ])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["examples"], 250, "{json}");
    let names: Vec<&str> = json["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    for name in [
        "sample_from[0]/tfrecord",
        "sample_from[1]/tfrecord",
        "sample_from[0]",
        "sample_from",
        "parse",
    ] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
    assert!(
        json["starving_input"]
            .as_str()
            .is_some_and(|s| s.starts_with("sample_from[")),
        "{json}"
    );
    assert!(json["payload_mb_per_sec"].as_f64().unwrap() > 0.0, "{json}");
    // A bad weight is refused with the expected form.
    let out = tfpipe()
        .args(["bench", "--mix", "x=heavy", "--feature", "label:int64"])
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("FILES=WEIGHT"));
}

/// A record index the ranks' cut relies on is never trusted: one whose
/// entries overflow 64 bits (which used to pass and then panic with
/// "capacity overflow", naming no file) is set aside with a warning naming
/// it, and the records are counted by reading; a stale one (the file
/// rewritten at the same size with other records) is found as the file is
/// read, and is bad data like a corrupt record: exit 1, naming the file
/// (errors through an index exited 2).
#[test]
fn a_bad_index_under_ranks_is_set_aside_or_exits_1_naming_it() {
    use prost::Message;
    use tfpipe::example::Example;
    use tfpipe::example::proto::{BytesList, Feature, Features, Int64List, feature};
    use tfpipe::{RecordIndex, index_path};
    let dir = tempfile::tempdir().unwrap();
    let paths = write_shards(dir.path(), 2, 2, Compression::None, mnist_example);
    let index = |p: &std::path::Path| {
        RecordIndex::build(p)
            .unwrap()
            .write(&index_path(p, None))
            .unwrap()
    };
    paths.iter().for_each(|p| index(p));
    let bench = || {
        let out = tfpipe()
            .args(["bench", "--data"])
            .arg(dir.path().join("part-*"))
            .args(["--feature", "label:int64"])
            .args(["--rank", "0", "--world-size", "2"])
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .timeout(std::time::Duration::from_secs(30))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{stderr}");
        (out.status.code(), stderr)
    };
    let overflow = "0 18446744073709551615\n18446744073709551615 17\n";
    std::fs::write(index_path(&paths[0], None), overflow).unwrap();
    let (code, stderr) = bench();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("not using the record index")
            && stderr.contains("part-0.tfrecord: entry 1 ends beyond 2^64 bytes"),
        "{stderr}"
    );
    // Part 0 rewritten as one record as long as its two: same size, one
    // record where the index counts two.
    index(&paths[0]);
    let two = std::fs::metadata(&paths[0]).unwrap().len() as usize;
    let record = |extra: usize| {
        let kind = |k| Feature { kind: Some(k) };
        let image = vec![7u8; 784 + extra];
        let features = [
            (
                "image_raw".to_string(),
                kind(feature::Kind::BytesList(BytesList { value: vec![image] })),
            ),
            (
                "label".to_string(),
                kind(feature::Kind::Int64List(Int64List { value: vec![1] })),
            ),
        ];
        Example {
            features: Some(Features {
                feature: features.into(),
            }),
        }
        .encode_to_vec()
    };
    let one = (0..2 * two)
        .map(record)
        .find(|r| r.len() + 16 == two)
        .unwrap();
    let mut w = tfpipe::tfrecord::FileRecordWriter::create(&paths[0], Compression::None).unwrap();
    w.write_record(&one).unwrap();
    w.finish().unwrap();
    assert_eq!(std::fs::metadata(&paths[0]).unwrap().len() as usize, two);
    let (code, stderr) = bench();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("part-0.tfrecord") && stderr.contains("stale index"),
        "{stderr}"
    );
}
