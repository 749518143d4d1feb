//! The atomic file writer, and bounded allocation on a lying length.

use std::time::Instant;

use tfpipe::tfrecord::{
    Compression, CorruptionKind, FileRecordWriter, ReaderOptions, RecordError, RecordReader,
};

use super::common::{crc32c_bitwise, masked, read_all};

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn dropped_without_finish_leaves_nothing_behind() {
    for compression in [Compression::None, Compression::Gzip, Compression::Zlib] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir
            .path()
            .join(format!("out.tfrecord{}", compression.suffix()));
        let mut writer = FileRecordWriter::create(&path, compression).unwrap();
        writer.write_record(&[7; 300_000]).unwrap();
        // The temporary file exists while writing, under another name.
        assert_eq!(entries(dir.path()).len(), 1);
        assert!(!path.exists());
        drop(writer);
        assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
    }
}

#[test]
fn finish_renames_into_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.tfrecord.gz");
    let mut writer = FileRecordWriter::create(&path, Compression::from_path(&path)).unwrap();
    writer.write_record(b"a").unwrap();
    writer.write_record(b"").unwrap();
    assert_eq!(writer.records(), 2);
    assert_eq!(writer.bytes(), 17 + 16);
    assert_eq!(writer.path(), path);
    assert_eq!(writer.finish().unwrap(), path);
    assert_eq!(entries(dir.path()), ["out.tfrecord.gz"]);
    assert_eq!(
        read_all(&path, ReaderOptions::default()),
        [b"a".to_vec(), Vec::new()]
    );
}

#[test]
fn pending_files_appear_only_when_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let mut pending = Vec::new();
    for i in 0..2 {
        let path = dir.path().join(format!("shard-{i}.tfrecord"));
        let mut writer = FileRecordWriter::create(&path, Compression::None).unwrap();
        writer
            .write_record(format!("record {i}").as_bytes())
            .unwrap();
        pending.push(writer.finish_pending().unwrap());
    }
    assert!(!dir.path().join("shard-0.tfrecord").exists());
    let second = pending.pop().unwrap();
    pending.pop().unwrap().persist().unwrap();
    // Dropping a pending file removes it.
    drop(second);
    assert_eq!(entries(dir.path()), ["shard-0.tfrecord"]);
}

#[test]
fn missing_directories_are_created_and_a_file_in_the_way_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing/out.tfrecord");
    FileRecordWriter::create(&path, Compression::None)
        .unwrap()
        .finish()
        .unwrap();
    assert!(path.is_file());
    std::fs::write(dir.path().join("file"), "").unwrap();
    let path = dir.path().join("file/out.tfrecord");
    let Err(err) = FileRecordWriter::create(&path, Compression::None) else {
        panic!("created a file under a file");
    };
    assert!(matches!(err, RecordError::Create { .. }));
    assert!(err.to_string().contains("file/out.tfrecord"), "{err}");
}

/// A header with a valid CRC claiming `length` data bytes.
fn header(length: u64) -> Vec<u8> {
    let len = length.to_le_bytes();
    let mut header = len.to_vec();
    header.extend_from_slice(&masked(crc32c_bitwise(&len)).to_le_bytes());
    header
}

#[test]
fn a_huge_claimed_length_allocates_only_what_the_stream_holds() {
    let mut bytes = header(1 << 40);
    bytes.extend_from_slice(&[1; 100]);
    let options = ReaderOptions {
        max_record_len: u64::MAX,
        ..ReaderOptions::default()
    };
    let started = Instant::now();
    let mut reader = RecordReader::new(&bytes[..], options);
    let err = reader.next_record().unwrap_err();
    assert_eq!(
        err.corruption(),
        Some(&CorruptionKind::TruncatedData {
            length: 1 << 40,
            available: 100
        })
    );
    assert_eq!(err.location().unwrap().offset, 0);
    // Touching (zeroing) even 1 GiB would take far longer than this.
    assert!(started.elapsed().as_secs() < 5);
}

#[test]
fn lengths_past_the_limit_or_the_address_space_are_implausible() {
    for (length, limit) in [
        (2 << 30, 1 << 30),
        (u64::MAX, u64::MAX),
        (u64::MAX - 3, u64::MAX),
    ] {
        let mut bytes = header(length);
        bytes.extend_from_slice(&[0; 32]);
        let options = ReaderOptions {
            max_record_len: limit,
            ..ReaderOptions::default()
        };
        let mut reader = RecordReader::new(&bytes[..], options);
        let err = reader.next_record().unwrap_err();
        assert!(
            matches!(err.corruption(), Some(CorruptionKind::ImplausibleLength { length: l, .. }) if *l == length),
            "{err}"
        );
        assert!(err.to_string().contains("record 0 at byte 0"), "{err}");
    }
}
