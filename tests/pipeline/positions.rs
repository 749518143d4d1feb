//! Every record keeps its source position (file, record index, byte offset)
//! through the stages that move records around.

use std::path::PathBuf;

use tfpipe::pipeline::{Interleave, Parallelism, Pipeline, Record};
use tfpipe::tfrecord::Compression;
use tfpipe::tfrecord::framed_len;

use crate::common::{index_record, record_index, watchdog, write_shards};

const PER_SHARD: u64 = 40;

/// Checks that each record's position names the file, index and frame
/// offset that `write_shards` gave it: record `i` is record `i % PER_SHARD`
/// of file `i / PER_SHARD`, at byte `(i % PER_SHARD) * framed_len(8)`.
fn check(paths: &[PathBuf], record: &Record) {
    let i = record_index(record);
    let position = record
        .position()
        .expect("a record read from a file has a position");
    assert_eq!(&*position.path(), paths[(i / PER_SHARD) as usize].as_path());
    assert_eq!(position.record(), i % PER_SHARD);
    assert_eq!(position.offset(), (i % PER_SHARD) * framed_len(8) as u64);
    let location = position.location();
    assert_eq!(location.record, position.record());
    assert_eq!(location.path.as_deref(), Some(&*position.path()));
}

#[test]
fn positions_survive_interleave_shard_shuffle_batch_prefetch() {
    let dir = tempfile::tempdir().unwrap();
    for compression in [Compression::None, Compression::Gzip] {
        let sub = dir.path().join(compression.tf_name());
        std::fs::create_dir(&sub).unwrap();
        let paths = write_shards(&sub, 4, PER_SHARD, compression, index_record);
        let pattern = sub.join("part-*").display().to_string();
        let pipeline = Pipeline::tfrecord_files([pattern])
            .unwrap()
            .interleave_with(Interleave::new(3, 5).parallel(Parallelism::Fixed(2)))
            .shard(2, 1)
            .shuffle(17, 3)
            .batch(7)
            .prefetch(2);
        let batches: Vec<Vec<Record>> = watchdog(20, move || {
            pipeline.start().unwrap().map(|b| b.unwrap()).collect()
        });
        let rows: usize = batches.iter().map(Vec::len).sum();
        assert_eq!(rows as u64, 4 * PER_SHARD / 2);
        for record in batches.iter().flatten() {
            check(&paths, record);
        }
    }
}

#[test]
fn positions_survive_cache_and_cache_file_points_at_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_shards(dir.path(), 2, PER_SHARD, Compression::None, index_record);
    let pattern = dir.path().join("part-*").display().to_string();
    let files = Pipeline::tfrecord_files([pattern]).unwrap();
    // In memory: the replayed epochs keep the original positions.
    let memory = files.clone().records().cache().repeat(Some(3));
    let got: Vec<Record> = watchdog(20, move || {
        memory.start().unwrap().map(|r| r.unwrap()).collect()
    });
    assert_eq!(got.len() as u64, 3 * 2 * PER_SHARD);
    for record in &got {
        check(&paths, record);
    }
    // A cache file: the first pass keeps the source positions; a later run
    // replays from the cache file and its records are located there.
    let cache = dir.path().join("cache.tfrecord");
    let cached = files.records().cache_file(&cache);
    let first: Vec<Record> = watchdog(20, {
        let cached = cached.clone();
        move || cached.start().unwrap().map(|r| r.unwrap()).collect()
    });
    for record in &first {
        check(&paths, record);
    }
    let replay: Vec<Record> = watchdog(20, move || {
        cached.start().unwrap().map(|r| r.unwrap()).collect()
    });
    assert_eq!(replay.len(), first.len());
    for (k, record) in replay.iter().enumerate() {
        let position = record.position().unwrap();
        assert_eq!(&*position.path(), cache.as_path());
        assert_eq!(position.record(), k as u64);
        assert_eq!(position.offset(), k as u64 * framed_len(8) as u64);
    }
}
