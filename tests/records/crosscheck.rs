//! Edge records against the framing computed from TensorFlow's definition
//! (`common::frame_independently`: a bitwise CRC-32C, not the crate's), in
//! both directions, and TensorFlow's own file against that framing.
//!
//! These once ran against the third-party `tfrecord` crate. Its build script
//! pulled an HTTP client, a TLS stack, `tar` and a second prost-build into
//! every cold build for these two tests; the two references here are the
//! ones that define the format (TensorFlow's bytes, and its layout), and
//! `props.rs` checks random records the same way.

use tfpipe::tfrecord::{Compression, ReaderOptions, RecordReader};

use super::common::{drain, frame_independently, golden, read_all, write_records};

/// The golden records plus an empty one, one longer than the reader's first
/// buffer (the default read size, so the buffer has to grow for it) and one
/// of every byte value.
fn edge_records() -> Vec<Vec<u8>> {
    let mut records = read_all(&golden("examples.tfrecord"), ReaderOptions::default());
    records.push(Vec::new());
    records.push(vec![0xab; ReaderOptions::default().buffer_size + 1]);
    records.push((0..=255).collect());
    records
}

#[test]
fn edge_records_framed_from_the_definition_read_back_through_ours() {
    let records = edge_records();
    let bytes = frame_independently(&records);
    let mut reader = RecordReader::new(&bytes[..], ReaderOptions::default());
    let (ours, end) = drain(&mut reader);
    end.unwrap();
    assert_eq!(ours, records);
}

#[test]
fn edge_records_written_by_us_are_the_framing_of_the_definition() {
    let records = edge_records();
    assert_eq!(
        write_records(&records, Compression::None),
        frame_independently(&records)
    );
}

#[test]
fn tensorflows_file_is_the_framing_of_the_records_we_read_from_it() {
    let file = std::fs::read(golden("examples.tfrecord")).unwrap();
    let records = read_all(&golden("examples.tfrecord"), ReaderOptions::default());
    assert!(!records.is_empty());
    assert_eq!(frame_independently(&records), file);
}
