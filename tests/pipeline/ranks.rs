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
fn shares_are_disjoint_equal_and_drop_less_than_one_record_per_rank() {
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
            // Runs of 55 / world records fall on file bounds for 1 and 5 only.
            let whole = world == 1 || world == 5;
            assert_eq!(
                by,
                if whole {
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
        // Nothing lost but the remainder that equal counts require, fewer
        // than one record per rank (by file, 2 ranks dropped 11).
        assert_eq!(seen.len() as u64 + dropped, 55, "world {world}");
        assert_eq!(dropped, 55 % world as u64, "world {world}");
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
    // 21 records: rank 0 reads file 0 (10 records; its run of 11 would
    // take file 1's first), rank 1 the rest of file 1 and file 9.
    let files = Pipeline::tfrecord_files([&pattern])
        .unwrap()
        .rank(Rank::new(0, 2).unwrap(), Remainder::Drop)
        .unwrap();
    let s = files.rank_share().unwrap();
    assert_eq!((s.records, s.dropped, s.dropped_total), (10, 1, 1));
    assert!(s.warning.is_none(), "{:?}", s.warning);
    // One file for four ranks, no index: rank 3 reads and drops 8 records
    // to keep 2, with a warning.
    let one = dir.path().join("part-0.tfrecord").display().to_string();
    let files = Pipeline::tfrecord_files([&one])
        .unwrap()
        .rank(Rank::new(3, 4).unwrap(), Remainder::Drop)
        .unwrap();
    let warning = files.rank_share().unwrap().warning.clone().unwrap();
    assert!(warning.contains("reads and drops 8 records"), "{warning}");
    let got: Vec<u64> = files
        .records()
        .start()
        .unwrap()
        .map(|r| record_index(&r.unwrap()))
        .collect();
    assert_eq!(got, [8, 9]);
    assert!(Rank::new(2, 2).is_err());
}

/// A run's pipeline per rank (share, interleave, shuffle, repeat, batch):
/// in every epoch the ranks' records are disjoint, every rank runs the same
/// number of steps, and together they cover the data but the documented
/// drop of fewer than one record per rank (4 files for 3 and for 6 ranks).
#[test]
fn every_epoch_the_ranks_split_the_data_and_step_together() {
    use tfpipe::pipeline::Event;
    let dir = tempfile::tempdir().unwrap();
    // Files of 9, 10, 11 and 12 records.
    for (s, n) in [9u64, 10, 11, 12].into_iter().enumerate() {
        let path = dir.path().join(format!("part-{s}.tfrecord"));
        let mut w = tfpipe::tfrecord::FileRecordWriter::create(&path, Compression::None).unwrap();
        for k in 0..n {
            w.write_record(&index_record(100 * s as u64 + k)).unwrap();
        }
        w.finish().unwrap();
    }
    let pattern = dir.path().join("part-*").display().to_string();
    for world in [3usize, 6] {
        // per_rank[r][epoch] = (records, batches)
        let mut per_rank: Vec<Vec<(Vec<u64>, usize)>> = Vec::new();
        let mut dropped = 0;
        for rank in 0..world {
            let files = Pipeline::tfrecord_files([&pattern])
                .unwrap()
                .rank(Rank::new(rank, world).unwrap(), Remainder::Drop)
                .unwrap();
            dropped = files.rank_share().unwrap().dropped_total;
            let pipeline = files
                .interleave(2, 3)
                .shuffle(7, 11)
                .repeat(Some(3))
                .batch(4);
            let epochs = watchdog(20, move || {
                let mut it = pipeline.start().unwrap();
                let mut epochs = vec![(Vec::new(), 0usize)];
                while let Some(event) = it.next_event() {
                    match event {
                        Event::Item(batch) => {
                            let current = epochs.last_mut().unwrap();
                            current
                                .0
                                .extend(batch.unwrap().iter().map(|r| record_index(r)));
                            current.1 += 1;
                        }
                        Event::EpochEnd(_) => epochs.push((Vec::new(), 0)),
                    }
                }
                epochs.pop(); // after the last marker
                epochs
            });
            assert_eq!(epochs.len(), 3);
            per_rank.push(epochs);
        }
        for epoch in 0..3 {
            let mut seen = BTreeSet::new();
            for (rank, epochs) in per_rank.iter().enumerate() {
                let (records, batches) = &epochs[epoch];
                assert_eq!(*batches, per_rank[0][epoch].1, "world {world} rank {rank}");
                assert_eq!(records.len(), per_rank[0][epoch].0.len());
                for i in records {
                    assert!(seen.insert(*i), "record {i} twice in epoch {epoch}");
                }
            }
            assert_eq!(seen.len() as u64 + dropped, 42, "world {world}");
            assert!(dropped < world as u64, "world {world}: {dropped}");
        }
        // The shuffle differs by epoch (the seed schedule carries on).
        assert_ne!(per_rank[0][0].0, per_rank[0][1].0);
    }
}

/// 8 files for 3 ranks (the case): by file, rank 2 read 2 files
/// and a quarter of the data was never trained on; now every rank reads 26
/// of the 80 records, 2 dropped per epoch.
#[test]
fn files_that_do_not_divide_among_the_ranks_are_split_by_record() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 8, 10, Compression::None, index_record);
    let pattern = dir.path().join("part-*").display().to_string();
    let mut seen = BTreeSet::new();
    for rank in 0..3 {
        let files = Pipeline::tfrecord_files([&pattern])
            .unwrap()
            .rank(Rank::new(rank, 3).unwrap(), Remainder::Drop)
            .unwrap();
        let s = files.rank_share().unwrap().clone();
        assert_eq!((s.records, s.dropped_total), (26, 2), "rank {rank}");
        assert!(s.warning.is_none(), "{:?}", s.warning);
        let got: Vec<u64> = files
            .interleave(3, 2)
            .start()
            .unwrap()
            .map(|r| record_index(&r.unwrap()))
            .collect();
        assert_eq!(got.len(), 26);
        seen.extend(got);
    }
    assert_eq!(seen.len(), 78);
}

#[test]
fn with_an_index_a_share_starts_inside_a_file_without_reading_before_it() {
    use tfpipe::{RecordIndex, index_path};
    let dir = tempfile::tempdir().unwrap();
    // 2 files of 11 records for 4 ranks: runs 0..5, 6..11, 12..17, 17..22.
    let paths = write_shards(dir.path(), 2, 11, Compression::None, index_record);
    for p in &paths {
        RecordIndex::build(p)
            .unwrap()
            .write(&index_path(p, None))
            .unwrap();
    }
    let pattern = dir.path().join("part-*.tfrecord").display().to_string();
    let world = 4;
    let starts = [0u64, 6, 12, 17];
    let read = |rank| {
        Pipeline::tfrecord_files([&pattern])
            .unwrap()
            .rank(Rank::new(rank, world).unwrap(), Remainder::Drop)
            .unwrap()
            .interleave(2, 3)
            .start()
            .unwrap()
            .map(|r| r.map(|r| record_index(&r)))
            .collect::<Result<Vec<u64>, _>>()
    };
    for (rank, &start) in starts.iter().enumerate() {
        let files = Pipeline::tfrecord_files([&pattern])
            .unwrap()
            .rank(Rank::new(rank, world).unwrap(), Remainder::Drop)
            .unwrap();
        let s = files.rank_share().unwrap().clone();
        assert_eq!(s.by, ShareBy::Record);
        assert_eq!((s.records, s.total_records, s.dropped_total), (5, 22, 2));
        assert!(s.warning.is_none(), "{:?}", s.warning);
        let expected: Vec<u64> = (start..start + 5).collect();
        assert_eq!(read(rank).unwrap(), expected, "rank {rank}");
    }

    // Corrupt record 2 of file 1 (global 13, in rank 2's run): rank 3
    // starts at file 1's record 6 by its offset, so it never reads the bad
    // record and its share reads cleanly; rank 2 fails at it, located.
    let index = RecordIndex::build(&paths[1]).unwrap();
    let (offset, _) = index.get(2).unwrap();
    let original = std::fs::read(&paths[1]).unwrap();
    let mut bytes = original.clone();
    bytes[offset as usize + 12] ^= 0xff;
    std::fs::write(&paths[1], &bytes).unwrap();
    assert_eq!(read(3).unwrap(), [17, 18, 19, 20, 21]);
    let error = read(2).unwrap_err().to_string();
    assert!(
        error.contains("part-1.tfrecord") && error.contains("record 2"),
        "{error}"
    );

    // A stale index (wrong size) is not used, and the warning says why.
    std::fs::write(&paths[1], &original).unwrap();
    std::fs::write(index_path(&paths[0], None), "0 24\n").unwrap();
    let files = Pipeline::tfrecord_files([&pattern])
        .unwrap()
        .rank(Rank::new(0, world).unwrap(), Remainder::Drop)
        .unwrap();
    let warning = files.rank_share().unwrap().warning.clone().unwrap();
    assert!(warning.contains("not using the record index"), "{warning}");
}

/// A rank of a rank (a data loader's worker within a process's share)
/// splits that share's run of records: the workers' parts are disjoint and
/// together exactly the share, also where the share starts inside a file.
#[test]
fn a_rank_of_a_rank_splits_that_share() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 3, 10, Compression::None, index_record);
    let pattern = dir.path().join("part-*").display().to_string();
    let ranked = |r: usize| {
        Pipeline::tfrecord_files([&pattern])
            .unwrap()
            .rank(Rank::new(r, 2).unwrap(), Remainder::Drop)
            .unwrap()
    };
    let read = |files: tfpipe::pipeline::TfRecordFiles| -> Vec<u64> {
        files
            .records()
            .start()
            .unwrap()
            .map(|r| record_index(&r.unwrap()))
            .collect()
    };
    for r in 0..2 {
        let share = read(ranked(r));
        assert_eq!(share.len(), 15);
        let mut parts = Vec::new();
        for k in 0..4 {
            let files = ranked(r)
                .rank(Rank::new(k, 4).unwrap(), Remainder::Keep)
                .unwrap();
            assert_eq!(files.rank_share().unwrap().total_records, 15);
            parts.extend(read(files));
        }
        assert_eq!(parts, share, "rank {r}");
    }
}
