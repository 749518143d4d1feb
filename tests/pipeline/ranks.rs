//! Ranks: disjoint shares, every record once, the same count on every rank.

use std::collections::BTreeSet;

use tfpipe::pipeline::{Pipeline, Rank, Remainder, ShareBy};
use tfpipe::tfrecord::Compression;

use crate::common::{index_record, record_index, watchdog, write_shards};

fn share(pattern: &str, rank: usize, world: usize, remainder: Remainder) -> (Vec<u64>, ShareBy) {
    let files = Pipeline::tfrecord_files([pattern])
        .unwrap()
        .rank(Rank::new(rank, world).unwrap(), remainder)
        .unwrap();
    let by = files.rank_share().unwrap().by;
    let records = files.interleave(2, 3);
    let got = watchdog(20, move || {
        records
            .start()
            .unwrap()
            .map(|r| record_index(&r.unwrap()))
            .collect()
    });
    (got, by)
}

#[test]
fn shares_are_disjoint_equal_and_cover_by_file_and_by_record() {
    let dir = tempfile::tempdir().unwrap();
    // 5 files of 11 records (55 records).
    write_shards(dir.path(), 5, 11, Compression::None, index_record);
    let pattern = dir.path().join("part-*").display().to_string();
    for world in [1, 2, 3, 5, 7, 8] {
        let mut seen = BTreeSet::new();
        let mut counts = Vec::new();
        let mut dropped = 0;
        for rank in 0..world {
            let (got, by) = share(&pattern, rank, world, Remainder::Drop);
            assert_eq!(
                by,
                if world <= 5 {
                    ShareBy::File
                } else {
                    ShareBy::Record
                }
            );
            counts.push(got.len());
            for i in got {
                assert!(seen.insert(i), "record {i} in two shares (world {world})");
            }
            let files = Pipeline::tfrecord_files([&pattern])
                .unwrap()
                .rank(Rank::new(rank, world).unwrap(), Remainder::Drop)
                .unwrap();
            let s = files.rank_share().unwrap().clone();
            assert_eq!(s.records as usize, counts[rank]);
            assert_eq!(s.total_records, 55);
            dropped = s.dropped_total;
        }
        // Every rank the same count, so the same number of steps.
        assert!(counts.iter().all(|&c| c == counts[0]), "{counts:?}");
        // Nothing lost but the remainder that equal counts require.
        assert_eq!(seen.len() as u64 + dropped, 55, "world {world}");
        if world > 5 {
            assert!(dropped < world as u64);
        }
        // Keep: every record exactly once.
        let mut all = BTreeSet::new();
        for rank in 0..world {
            for i in share(&pattern, rank, world, Remainder::Keep).0 {
                assert!(all.insert(i));
            }
        }
        assert_eq!(all.len(), 55);
    }
}

#[test]
fn uneven_files_warn_and_bad_ranks_fail() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 2, 10, Compression::None, index_record);
    let extra = dir.path().join("part-9.tfrecord");
    let mut w = tfpipe::tfrecord::FileRecordWriter::create(&extra, Compression::None).unwrap();
    w.write_record(&index_record(100)).unwrap();
    w.finish().unwrap();
    let pattern = dir.path().join("part-*").display().to_string();
    // Files 0 and 9 go to rank 0 (11 records), file 1 to rank 1 (10).
    let files = Pipeline::tfrecord_files([&pattern])
        .unwrap()
        .rank(Rank::new(0, 2).unwrap(), Remainder::Drop)
        .unwrap();
    let s = files.rank_share().unwrap();
    assert_eq!((s.records, s.dropped, s.dropped_total), (10, 1, 1));
    assert!(s.warning.is_none(), "{:?}", s.warning);
    // One file for two ranks: by record, with a warning.
    let one = dir.path().join("part-0.tfrecord").display().to_string();
    let files = Pipeline::tfrecord_files([one])
        .unwrap()
        .rank(Rank::new(1, 2).unwrap(), Remainder::Drop)
        .unwrap();
    assert!(
        files
            .rank_share()
            .unwrap()
            .warning
            .as_deref()
            .unwrap()
            .contains("by record")
    );
    assert!(Rank::new(2, 2).is_err());
}
