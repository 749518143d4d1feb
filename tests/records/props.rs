//! Property tests: round trips, TensorFlow framing, and corruption anywhere
//! reported at the right place without a panic, whatever the buffer size.

use std::io::Write;

use proptest::prelude::*;
use tfpipe::tfrecord::{Compression, CorruptionKind, ReaderOptions, RecordError, RecordReader};

use super::common::{drain, frame_independently, write_records};

fn records() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..600), 0..12)
}

fn compression() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::None),
        Just(Compression::Gzip),
        Just(Compression::Zlib)
    ]
}

fn options(buffer_size: usize) -> ReaderOptions {
    ReaderOptions {
        buffer_size,
        ..ReaderOptions::default()
    }
}

/// Start offset of each record, and the end of the last.
fn boundaries(records: &[Vec<u8>]) -> Vec<usize> {
    let mut starts = vec![0];
    for record in records {
        starts.push(starts.last().unwrap() + 12 + record.len() + 4);
    }
    starts
}

fn buffer_size() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..40, Just(1 << 20)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn records_round_trip_under_each_compression(
        records in records(),
        compression in compression(),
        buffer_size in buffer_size(),
    ) {
        let bytes = write_records(&records, compression);
        let options = ReaderOptions { compression: Some(compression), ..options(buffer_size) };
        let mut reader = RecordReader::decoding(&bytes[..], options);
        let (read, end) = drain(&mut reader);
        prop_assert!(end.is_ok());
        prop_assert_eq!(&read, &records);
        prop_assert_eq!(reader.position().record, records.len() as u64);
        prop_assert_eq!(reader.position().offset, *boundaries(&records).last().unwrap() as u64);
    }

    #[test]
    fn uncompressed_output_is_tensorflow_framing(records in records()) {
        prop_assert_eq!(write_records(&records, Compression::None), frame_independently(&records));
    }

    #[test]
    fn truncation_is_reported_at_the_cut_record(
        records in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..8),
        cut in any::<prop::sample::Index>(),
        buffer_size in buffer_size(),
    ) {
        let bytes = write_records(&records, Compression::None);
        let cut = cut.index(bytes.len() + 1);
        let starts = boundaries(&records);
        let mut reader = RecordReader::new(&bytes[..cut], options(buffer_size));
        let (read, end) = drain(&mut reader);
        // Records that end at or before the cut come back intact.
        let whole = starts[1..].iter().filter(|&&end| end <= cut).count();
        prop_assert_eq!(&read[..], &records[..whole]);
        if starts.contains(&cut) {
            prop_assert!(end.is_ok());
        } else {
            let err = end.unwrap_err();
            let location = err.location().unwrap();
            prop_assert_eq!(location.record, whole as u64);
            prop_assert_eq!(location.offset, starts[whole] as u64);
            prop_assert!(location.offset <= cut as u64);
            let into = cut - starts[whole];
            match err.corruption().unwrap() {
                CorruptionKind::TruncatedHeader { available } => {
                    prop_assert!(into < 12);
                    prop_assert_eq!(*available, into);
                }
                CorruptionKind::TruncatedData { length, available } => {
                    prop_assert!(into >= 12);
                    prop_assert_eq!(*length, records[whole].len() as u64);
                    prop_assert_eq!(*available, (into - 12) as u64);
                }
                other => prop_assert!(false, "unexpected {:?}", other),
            }
        }
    }

    #[test]
    fn a_flipped_byte_is_caught_at_its_record(
        records in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..8),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        buffer_size in buffer_size(),
    ) {
        let mut bytes = write_records(&records, Compression::None);
        let at = at.index(bytes.len());
        bytes[at] ^= flip;
        let starts = boundaries(&records);
        let k = starts.iter().rposition(|&s| s <= at).unwrap();
        let mut reader = RecordReader::new(&bytes[..], options(buffer_size));
        let (read, end) = drain(&mut reader);
        prop_assert_eq!(&read[..], &records[..k]);
        let err = end.unwrap_err();
        let location = err.location().unwrap();
        prop_assert_eq!(location.record, k as u64);
        prop_assert!(location.offset < bytes.len() as u64);
        match err.corruption().unwrap() {
            CorruptionKind::LengthCrc { .. } => {
                prop_assert!(at < starts[k] + 12);
                prop_assert_eq!(location.offset, starts[k] as u64);
            }
            CorruptionKind::DataCrc { .. } => {
                prop_assert!(at >= starts[k] + 12);
                prop_assert_eq!(location.offset, starts[k] as u64 + 12);
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn any_bytes_read_the_same_with_any_buffer_size(
        records in records(),
        junk in prop::collection::vec(any::<u8>(), 0..64),
        buffer_size in 1usize..64,
    ) {
        let mut bytes = write_records(&records, Compression::None);
        bytes.extend_from_slice(&junk);
        let outcome = |buffer_size| {
            let mut reader = RecordReader::new(&bytes[..], options(buffer_size));
            let (read, end) = drain(&mut reader);
            let end = end.map_err(|e| match e {
                RecordError::Corrupt { location, kind } => (location, kind),
                other => panic!("not a corruption: {other}"),
            });
            (read, end, reader.position())
        };
        let small = outcome(buffer_size);
        let big = outcome(1 << 20);
        if let Err((location, _)) = &big.1 {
            prop_assert!(location.offset <= bytes.len() as u64);
        }
        prop_assert_eq!(small, big);
    }

    #[test]
    fn junk_alone_never_panics(junk in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut reader = RecordReader::new(&junk[..], options(7));
        let (_, end) = drain(&mut reader);
        if let Err(err) = end {
            prop_assert!(err.location().unwrap().offset <= junk.len() as u64);
        }
    }

    #[test]
    fn a_damaged_compressed_stream_never_panics(
        records in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..6),
        compression in prop_oneof![Just(Compression::Gzip), Just(Compression::Zlib)],
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        cut in any::<bool>(),
    ) {
        let mut bytes = write_records(&records, compression);
        let at = at.index(bytes.len());
        if cut {
            bytes.truncate(at);
        } else {
            bytes[at] ^= flip;
        }
        let options = ReaderOptions { compression: Some(compression), ..options(1 << 20) };
        let mut reader = RecordReader::decoding(&bytes[..], options);
        let (read, end) = drain(&mut reader);
        // Whatever comes back before the damage is a prefix of the records,
        // and damage is reported as corruption, not as a system error. (A flip
        // in a gzip header's unused fields, e.g. its mtime, goes unnoticed.)
        prop_assert!(read.len() <= records.len());
        prop_assert_eq!(&read[..], &records[..read.len()]);
        if let Err(err) = end {
            prop_assert!(err.is_corruption(), "{}", err);
            let framed: usize = records.iter().map(|r| r.len() + 16).sum();
            prop_assert!(err.location().unwrap().offset <= framed as u64);
        }
    }

    #[test]
    fn multi_member_gzip_reads_fully(records in records(), split in any::<prop::sample::Index>()) {
        let split = split.index(records.len() + 1);
        let mut bytes = write_records(&records[..split], Compression::Gzip);
        bytes.extend(write_records(&records[split..], Compression::Gzip));
        let options = ReaderOptions { compression: Some(Compression::Gzip), ..options(1 << 20) };
        let mut reader = RecordReader::decoding(&bytes[..], options);
        let (read, end) = drain(&mut reader);
        prop_assert!(end.is_ok());
        prop_assert_eq!(read, records);
    }
}

#[test]
fn multi_member_gzip_file_reads_fully() {
    // Two members written by flate2 directly, the way `cat a.gz b.gz` joins files.
    let first = [b"one".to_vec(), b"two".to_vec()];
    let second = [b"three".to_vec()];
    let mut bytes = Vec::new();
    for part in [&first[..], &second[..]] {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&frame_independently(part)).unwrap();
        bytes.extend(gz.finish().unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("joined.tfrecord.gz");
    std::fs::write(&path, &bytes).unwrap();
    let read = super::common::read_all(&path, ReaderOptions::default());
    assert_eq!(read, [&first[..], &second[..]].concat());
}
