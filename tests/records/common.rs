//! Helpers shared by the record tests.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tfpipe::tfrecord::{
    Compression, FileRecordReader, ReaderOptions, RecordError, RecordReader, RecordWriter,
};

/// `testdata/tf-golden/<name>`.
pub fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/tf-golden")
        .join(name)
}

/// The parsed `<name>.json` of a golden file.
pub fn golden_json(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(golden(&format!("{name}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every record of a reader, and how it ended.
pub fn drain<R: std::io::Read>(
    reader: &mut RecordReader<R>,
) -> (Vec<Vec<u8>>, Result<(), RecordError>) {
    let mut records = Vec::new();
    let mut record = Vec::new();
    loop {
        match reader.read_record(&mut record) {
            Ok(true) => records.push(record.clone()),
            Ok(false) => return (records, Ok(())),
            Err(err) => return (records, Err(err)),
        }
    }
}

/// Every record of a file; panics on any error.
pub fn read_all(path: &Path, options: ReaderOptions) -> Vec<Vec<u8>> {
    let mut reader = FileRecordReader::open(path, options).unwrap();
    let (records, end) = drain(&mut reader);
    end.unwrap();
    records
}

/// Every record written uncompressed or compressed, finished.
pub fn write_records(records: &[Vec<u8>], compression: Compression) -> Vec<u8> {
    let mut writer = RecordWriter::new(Vec::new(), compression);
    for record in records {
        writer.write_record(record).unwrap();
    }
    writer.finish().unwrap()
}

/// The bitwise CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), written
/// from the definition so tests do not trust the code under test.
pub fn crc32c_bitwise(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// TFRecord's mask, from its definition.
#[allow(clippy::manual_rotate)] // written as the format's definition states it
pub fn masked(crc: u32) -> u32 {
    ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8)
}

/// The TFRecord framing of `records`, computed independently of the crate.
pub fn frame_independently(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for record in records {
        let len = (record.len() as u64).to_le_bytes();
        out.extend_from_slice(&len);
        out.extend_from_slice(&masked(crc32c_bitwise(&len)).to_le_bytes());
        out.extend_from_slice(record);
        out.extend_from_slice(&masked(crc32c_bitwise(record)).to_le_bytes());
    }
    out
}
