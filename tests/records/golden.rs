//! The TensorFlow-written golden files read back exactly, and our writer
//! reproduces them.

use tfpipe::example::json::{RecordType, record_json_value};
use tfpipe::tfrecord::{Compression, ReaderOptions, RecordReader, RecordWriter};

use super::common::{drain, golden, golden_json, read_all, sha256_hex};

const FILES: [&str; 4] = [
    "examples.tfrecord",
    "examples.tfrecord.gz",
    "examples.tfrecord.zlib",
    "sequence.tfrecord",
];

fn check_against_json(name: &str, records: &[Vec<u8>]) {
    let expected = golden_json(name);
    let bytes = std::fs::read(golden(name)).unwrap();
    assert_eq!(bytes.len() as u64, expected["file_bytes"].as_u64().unwrap());
    assert_eq!(
        sha256_hex(&bytes),
        expected["file_sha256"].as_str().unwrap()
    );
    assert_eq!(
        records.len() as u64,
        expected["num_records"].as_u64().unwrap(),
        "{name}"
    );
    let want = expected["records"].as_array().unwrap();
    assert_eq!(records.len(), want.len());
    for (i, (record, want)) in records.iter().zip(want).enumerate() {
        assert_eq!(want["index"].as_u64().unwrap(), i as u64);
        assert_eq!(
            record.len() as u64,
            want["raw_length"].as_u64().unwrap(),
            "{name} record {i}"
        );
        assert_eq!(
            sha256_hex(record),
            want["raw_sha256"].as_str().unwrap(),
            "{name} record {i}"
        );
    }
}

#[test]
fn every_golden_file_reads_back_to_its_json() {
    for name in FILES {
        // Compression inferred from the name.
        let records = read_all(&golden(name), ReaderOptions::default());
        check_against_json(name, &records);
    }
}

#[test]
fn explicit_compression_overrides_the_name() {
    // A gzip file under a name without `.gz`.
    let dir = tempfile::tempdir().unwrap();
    let renamed = dir.path().join("data.bin");
    std::fs::copy(golden("examples.tfrecord.gz"), &renamed).unwrap();
    let options = ReaderOptions {
        compression: Some(Compression::Gzip),
        ..ReaderOptions::default()
    };
    let records = read_all(&renamed, options);
    check_against_json("examples.tfrecord.gz", &records);
}

#[test]
fn zero_copy_and_buffered_paths_agree_on_golden_files() {
    for name in FILES {
        let compression = Compression::from_path(name);
        let bytes = std::fs::read(golden(name)).unwrap();
        let options = ReaderOptions {
            compression: Some(compression),
            ..ReaderOptions::default()
        };
        let mut reader = RecordReader::decoding(&bytes[..], options);
        let mut zero_copy = Vec::new();
        while let Some(record) = reader.next_record().unwrap() {
            zero_copy.push(record.to_vec());
        }
        assert_eq!(zero_copy, read_all(&golden(name), ReaderOptions::default()));
        // Position: every record consumed, offset = uncompressed length.
        let framed: usize = zero_copy.iter().map(|r| r.len() + 16).sum();
        assert_eq!(reader.position().record, zero_copy.len() as u64);
        assert_eq!(reader.position().offset, framed as u64);
        if name.starts_with("examples") {
            assert_eq!(framed, 9700);
        }
    }
}

#[test]
fn rewriting_uncompressed_is_byte_identical_to_tensorflow() {
    for name in ["examples.tfrecord", "sequence.tfrecord"] {
        let records = read_all(&golden(name), ReaderOptions::default());
        let mut writer = RecordWriter::new(Vec::new(), Compression::None);
        for record in &records {
            writer.write_record(record).unwrap();
        }
        assert_eq!(writer.records(), records.len() as u64);
        let bytes = writer.finish().unwrap();
        assert_eq!(
            bytes.len() as u64,
            std::fs::metadata(golden(name)).unwrap().len()
        );
        assert_eq!(
            sha256_hex(&bytes),
            golden_json(name)["file_sha256"].as_str().unwrap()
        );
    }
}

#[test]
fn gzip_and_zlib_written_by_us_read_back_identically() {
    let records = read_all(&golden("examples.tfrecord"), ReaderOptions::default());
    for compression in [Compression::Gzip, Compression::Zlib] {
        let mut writer = RecordWriter::new(Vec::new(), compression);
        for record in &records {
            writer.write_record(record).unwrap();
        }
        assert_eq!(writer.bytes(), 9700);
        let bytes = writer.finish().unwrap();
        assert!(bytes.len() < 9700, "{compression} did not compress");
        // Through a file with the matching suffix, compression inferred.
        let dir = tempfile::tempdir().unwrap();
        let path = dir
            .path()
            .join(format!("out.tfrecord{}", compression.suffix()));
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read_all(&path, ReaderOptions::default()), records);
        // And the TensorFlow-written compressed files hold the same records.
        let theirs = golden(&format!("examples.tfrecord{}", compression.suffix()));
        assert_eq!(read_all(&theirs, ReaderOptions::default()), records);
    }
}

#[test]
fn record_json_encoding_matches_golden_records() {
    for (name, record_type) in [
        ("examples.tfrecord", RecordType::Example),
        ("examples.tfrecord.gz", RecordType::Example),
        ("examples.tfrecord.zlib", RecordType::Example),
        ("sequence.tfrecord", RecordType::Sequence),
    ] {
        let records = read_all(&golden(name), ReaderOptions::default());
        let expected = golden_json(name);
        let want = expected["records"].as_array().unwrap();
        assert_eq!(records.len(), want.len());
        for (i, (record, want)) in records.iter().zip(want).enumerate() {
            assert_eq!(RecordType::sniff(record), record_type, "{name} record {i}");
            let got = record_json_value(i as u64, record, record_type).unwrap();
            assert_eq!(&got, want, "{name} record {i}");
        }
    }
}

#[test]
fn empty_stream_has_no_records() {
    let mut reader = RecordReader::new(&[][..], ReaderOptions::default());
    let (records, end) = drain(&mut reader);
    assert!(records.is_empty() && end.is_ok());
}
