//! The record index: `tfpipe index`, DALI's format, stale indexes, random
//! access, exact sharding and the global shuffle, locally and from S3.

use std::collections::BTreeSet;
use std::path::Path;

use assert_cmd::Command;
use tfpipe::Compression;
use tfpipe::{IndexError, IndexProblem, IndexedFiles, RecordIndex, index_path};

use crate::server::{S3Server, records, tfrecord};

fn write_files(dir: &Path, files: usize, n: usize) -> (Vec<std::path::PathBuf>, Vec<Vec<Vec<u8>>>) {
    let mut paths = Vec::new();
    let mut all = Vec::new();
    for f in 0..files {
        let recs = records(f, n, 50);
        let path = dir.join(format!("part-{f}.tfrecord"));
        std::fs::write(&path, tfrecord(&recs, Compression::None)).unwrap();
        paths.push(path);
        all.push(recs);
    }
    (paths, all)
}

fn collect(p: tfpipe::Pipeline<tfpipe::pipeline::Record>) -> Vec<Vec<u8>> {
    p.start()
        .unwrap()
        .map(|r| r.map(|r| r.to_vec()))
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn the_cli_writes_dali_format_beside_each_file_or_into_a_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, all) = write_files(dir.path(), 2, 5);
    Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("index")
        .arg(dir.path().join("part-*.tfrecord"))
        .assert()
        .success();
    // DALI's tfrecord2idx: `offset size` per record, size = 12 + len + 4.
    let text = std::fs::read_to_string(index_path(&paths[0], None)).unwrap();
    let mut offset = 0;
    let mut expected = String::new();
    for r in &all[0] {
        expected.push_str(&format!("{offset} {}\n", r.len() + 16));
        offset += r.len() + 16;
    }
    assert_eq!(text, expected);
    let out = dir.path().join("idx");
    Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["index", "--output-dir"])
        .arg(&out)
        .args(&paths)
        .assert()
        .success();
    assert!(out.join("part-1.tfrecord.idx").is_file());
    Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["index", "--check"])
        .args(&paths)
        .assert()
        .success();
}

/// After `tfpipe index`, a glob over the files' prefix (`'part-*'`) matches
/// the indexes too: every command reads the data alone and says so once.
#[test]
fn globs_over_indexed_files_skip_the_indexes_and_say_so_once() {
    use prost::Message;
    use tfpipe::example::proto::{Example, Feature, Features, Int64List, feature};
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for f in 0..2i64 {
        let recs: Vec<Vec<u8>> = (0..5i64)
            .map(|i| {
                let x = Feature {
                    kind: Some(feature::Kind::Int64List(Int64List {
                        value: vec![f * 5 + i],
                    })),
                };
                let features = Features {
                    feature: [("x".to_string(), x)].into(),
                };
                Example {
                    features: Some(features),
                }
                .encode_to_vec()
            })
            .collect();
        let path = dir.path().join(format!("part-{f}.tfrecord"));
        std::fs::write(&path, tfrecord(&recs, Compression::None)).unwrap();
        paths.push(path);
    }
    for path in &paths {
        RecordIndex::build(path)
            .unwrap()
            .write(&index_path(path, None))
            .unwrap();
    }
    let pattern = dir.path().join("part-*").to_string_lossy().into_owned();
    let files = tfpipe::Pipeline::tfrecord_files([&pattern]).unwrap();
    assert_eq!(files.paths(), paths.as_slice());
    assert_eq!(collect(files.records()).len(), 10);
    for command in [
        &["inspect"][..],
        &["cat"][..],
        &["bench", "--feature", "x:int64", "--data"][..],
        // Re-indexing: the indexes are rewritten, not indexed themselves.
        &["index"][..],
    ] {
        let out = Command::cargo_bin("tfpipe")
            .unwrap()
            .args(command)
            .arg(&pattern)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{command:?}: {stderr}");
        assert_eq!(
            stderr.matches("skipping 2 record index file(s)").count(),
            1,
            "{command:?}: {stderr}"
        );
    }
}

/// SIGINT and SIGTERM stop `tfpipe index` between two files with 128 + the
/// signal; every index it wrote is complete and no temporary file is left
/// (it had no handler, and a signal left `.NAME.idx.*.tmp` behind).
#[cfg(unix)]
#[test]
fn a_signal_stops_index_between_files_and_leaves_no_temporary() {
    use std::process::Stdio;
    for (signal, code) in [("INT", 130), ("TERM", 143)] {
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), 400, 40);
        let child = std::process::Command::new(assert_cmd::cargo::cargo_bin("tfpipe"))
            .arg("index")
            .arg(dir.path().join("part-*.tfrecord"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".idx"))
        };
        let out = crate::common::signal_when_ready(child, signal, "no index written", started);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "SIG{signal}: {stderr}");
        assert!(
            stderr.contains(&format!("interrupted by SIG{signal}")),
            "{stderr}"
        );
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                name.ends_with(".tfrecord") || name.ends_with(".tfrecord.idx"),
                "SIG{signal} left {name}"
            );
            if let Some(data) = name.strip_suffix(".idx") {
                RecordIndex::load(&dir.path().join(data), &dir.path().join(&name))
                    .expect("every index written is complete");
            }
        }
    }
}

#[test]
fn stale_and_truncated_indexes_are_reported_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = write_files(dir.path(), 1, 20);
    let data = &paths[0];
    let idx = index_path(data, None);
    RecordIndex::build(data).unwrap().write(&idx).unwrap();
    IndexedFiles::open([data], None).unwrap();

    // Data appended after indexing: the sizes disagree.
    let mut bytes = std::fs::read(data).unwrap();
    let original = bytes.clone();
    bytes.extend_from_slice(&tfrecord(&[b"late".to_vec()], Compression::None));
    std::fs::write(data, &bytes).unwrap();
    let err = IndexedFiles::open([data], None).unwrap_err();
    assert!(
        matches!(
            &err,
            IndexError::Invalid {
                problem: IndexProblem::SizeMismatch { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("part-0.tfrecord"), "{err}");

    // A truncated index (the last lines lost).
    std::fs::write(data, &original).unwrap();
    let text = std::fs::read_to_string(&idx).unwrap();
    let short: String = text.lines().take(15).map(|l| format!("{l}\n")).collect();
    std::fs::write(&idx, short).unwrap();
    assert!(IndexedFiles::open([data], None).is_err());

    // Same size, different records (rewritten with other lengths): the size
    // check passes and the first misplaced record is reported with its location.
    RecordIndex::build(data).unwrap().write(&idx).unwrap();
    let mut recs = records(0, 20, 50);
    recs[3].push(b'!');
    recs[4].pop();
    std::fs::write(data, tfrecord(&recs, Compression::None)).unwrap();
    assert_eq!(
        std::fs::metadata(data).unwrap().len(),
        original.len() as u64
    );
    let files = IndexedFiles::open([data], None).unwrap();
    let err = files.read(files.position(4).unwrap()).unwrap_err();
    let location = err.location().expect("location");
    assert_eq!(location.record, 4);
    assert!(err.to_string().contains("stale"), "{err}");
    // ... and `tfpipe index --check` exits 1 naming the file.
    let assert = Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["index", "--check"])
        .arg(data)
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("part-0.tfrecord: record 3"), "{stderr}");
}

#[test]
fn random_access_and_exact_sharding_by_record() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, all) = write_files(dir.path(), 3, 7);
    let parts = paths
        .iter()
        .map(|p| (p.clone(), RecordIndex::build(p).unwrap()))
        .collect();
    let files = IndexedFiles::from_parts(parts).unwrap();
    assert_eq!(files.len(), 21);
    let p = files.position(9).unwrap();
    assert_eq!((p.file, p.record), (1, 2));
    assert_eq!(files.read(p).unwrap(), all[1][2]);
    // 4 shards of 21 records: disjoint, covering, sizes 6/5/5/5.
    let mut seen = BTreeSet::new();
    for i in 0..4 {
        let shard = files.shard_records(4, i).unwrap();
        assert_eq!(shard.len(), if i == 0 { 6 } else { 5 });
        let got = collect(files.records(shard.clone(), 4));
        for (pos, rec) in shard.iter().zip(&got) {
            assert_eq!(rec, &all[pos.file][pos.record as usize]);
            assert!(seen.insert(*pos));
        }
    }
    assert_eq!(seen.len(), 21);
    assert!(files.shard_records(4, 4).is_none());
}

#[test]
fn global_shuffle_reads_a_permutation_across_files_each_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, all) = write_files(dir.path(), 4, 25);
    for p in &paths {
        RecordIndex::build(p)
            .unwrap()
            .write(&index_path(p, None))
            .unwrap();
    }
    let files = IndexedFiles::open(&paths, None).unwrap();
    let mut expected: Vec<Vec<u8>> = all.concat();
    expected.sort();
    let shuffle = files.global_shuffle(11);
    let epochs = collect(shuffle.pipeline().repeat(Some(2)));
    let (first, second) = epochs.split_at(100);
    for epoch in [first, second] {
        let mut sorted = epoch.to_vec();
        sorted.sort();
        assert_eq!(
            sorted, expected,
            "each epoch is a permutation of all records"
        );
    }
    assert_ne!(first, second, "each epoch draws a new order");
    // The first 25 records come from more than one file: no per-file order.
    let files_in_head: BTreeSet<&[u8]> = first[..25].iter().map(|r| &r[..6]).collect();
    assert!(files_in_head.len() > 1);
    // Same seed, same order; shards partition an epoch.
    assert_eq!(collect(shuffle.pipeline()), first);
    let mut union: Vec<Vec<u8>> = (0..3)
        .flat_map(|i| collect(files.global_shuffle(11).shard(3, i).pipeline()))
        .collect();
    union.sort();
    assert_eq!(union, expected);
    assert!(
        files
            .global_shuffle(1)
            .shard(2, 2)
            .pipeline()
            .start()
            .is_err()
    );
}

#[test]
fn index_and_global_shuffle_from_object_storage() {
    let server = S3Server::start();
    let bucket = server.bucket("index");
    let mut expected = Vec::new();
    let mut urls = Vec::new();
    for f in 0..3 {
        let recs = records(f, 40, 120);
        let url = format!("{bucket}/part-{f}.tfrecord");
        server.put(&url, tfrecord(&recs, Compression::None));
        expected.extend(recs);
        urls.push(url);
    }
    // Index the objects and upload the indexes beside them.
    for url in &urls {
        let index = RecordIndex::build(url).unwrap();
        assert_eq!(index.len(), 40);
        index.write(&index_path(Path::new(url), None)).unwrap();
    }
    assert!(server.exists(&format!("{}.idx", urls[0])));
    let files = IndexedFiles::open(&urls, None).unwrap();
    let mut got = collect(files.global_shuffle(5).read_ahead(16).pipeline());
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
}

#[test]
fn a_global_shuffle_resumes_from_its_state_at_the_next_record() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = write_files(dir.path(), 3, 30);
    let parts = paths
        .iter()
        .map(|p| (p.clone(), RecordIndex::build(p).unwrap()))
        .collect();
    let files = IndexedFiles::from_parts(parts).unwrap();
    let pipeline = files.global_shuffle(3).read_ahead(8).pipeline();
    let whole = collect(pipeline.clone());
    for cut in [0, 1, 37, 89, 90] {
        let mut it = pipeline.start().unwrap();
        let mut got: Vec<Vec<u8>> = it.by_ref().take(cut).map(|r| r.unwrap().to_vec()).collect();
        let state = it.state().unwrap();
        let json = state.to_json();
        assert!(
            json.len() < 200,
            "the state is a count, not records: {json}"
        );
        drop(it);
        let state = tfpipe::pipeline::PipelineState::from_json(&json).unwrap();
        let rest = pipeline.start_from(&state).unwrap();
        got.extend(rest.map(|r| r.unwrap().to_vec()));
        assert_eq!(got, whole, "cut at {cut}");
    }
    // A state restored into another file set would re-deliver or skip
    // records (its count is a place in the old set's order): refused.
    let mut it = pipeline.start().unwrap();
    it.by_ref().take(10).for_each(drop);
    let state = it.state().unwrap();
    drop(it);
    let fewer = paths[..2]
        .iter()
        .map(|p| (p.clone(), RecordIndex::build(p).unwrap()))
        .collect();
    let fewer = IndexedFiles::from_parts(fewer).unwrap();
    let err = fewer
        .global_shuffle(3)
        .read_ahead(8)
        .pipeline()
        .start_from(&state)
        .err()
        .expect("restoring into other files must fail");
    assert!(err.to_string().contains("other files"), "{err}");
}

#[test]
fn records_read_by_index_carry_their_source_position() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, all) = write_files(dir.path(), 2, 6);
    let parts = paths
        .iter()
        .map(|p| (p.clone(), RecordIndex::build(p).unwrap()))
        .collect();
    let files = IndexedFiles::from_parts(parts).unwrap();
    for record in files.global_shuffle(9).pipeline().start().unwrap() {
        let record = record.unwrap();
        let position = record.position().expect("a source position");
        let file = paths.iter().position(|p| *p == *position.path()).unwrap();
        let index = files.index(file).unwrap();
        assert_eq!(index.get(position.record()).unwrap().0, position.offset());
        assert_eq!(record.as_slice(), all[file][position.record() as usize]);
    }
}
