//! Uploads appear under their final name only when complete.

use std::io::Write;

use tfpipe::storage::{ObjectWriter, ReadOptions};

use crate::server::S3Server;

#[test]
fn an_object_appears_only_when_its_upload_completes() {
    let server = S3Server::start();
    let bucket = server.bucket("write");
    let url = format!("{bucket}/out/shard-00000-of-00001.tfrecord");
    let options = ReadOptions {
        range_size: 5 << 20,
        ranges_in_flight: 2,
        ..ReadOptions::default()
    };
    let payload: Vec<u8> = (0..12u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut writer = ObjectWriter::create(&url, &options).unwrap();
    writer.write_all(&payload).unwrap();
    // Two parts are uploaded by now, and still nothing is visible.
    assert!(!server.exists(&url), "visible before completion");
    assert_eq!(writer.finish().unwrap(), payload.len() as u64);
    assert!(server.exists(&url));
    let mut back = Vec::new();
    std::io::Read::read_to_end(&mut tfpipe::storage::open_object(&url, &options).unwrap(), &mut back)
        .unwrap();
    assert!(back == payload, "round trip differs");
}

#[test]
fn a_dropped_writer_leaves_no_object() {
    let server = S3Server::start();
    let bucket = server.bucket("abort");
    let url = format!("{bucket}/out/partial.tfrecord");
    let mut writer = ObjectWriter::create(&url, &ReadOptions::default()).unwrap();
    writer.write_all(&vec![7u8; 9 << 20]).unwrap();
    drop(writer); // interrupted: the upload is aborted
    assert!(!server.exists(&url));
}
