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
    std::io::Read::read_to_end(
        &mut tfpipe::storage::open_object(&url, &options).unwrap(),
        &mut back,
    )
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

#[test]
fn convert_output_to_s3_appears_only_on_success() {
    use tfpipe::convert::{self, CsvOptions, Format, OutputOptions, Sharding};
    let server = S3Server::start();
    let bucket = server.bucket("convert");
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.csv");
    let mut text = String::from("a,b\n");
    for i in 0..500 {
        text.push_str(&format!("{i},{}\n", i * 2));
    }
    std::fs::write(&good, &text).unwrap();
    let format = Format::Csv(CsvOptions::default());
    let mut options = OutputOptions::new(format!("{bucket}/out/data"));
    options.sharding = Sharding::Shards(3);
    let summary = convert::convert(&format, std::slice::from_ref(&good), &options).unwrap();
    assert_eq!(summary.records, 500);
    assert_eq!(summary.shards.len(), 3);
    assert!(server.exists(&format!("{bucket}/out/data.features.json")));
    // The shards read back through the pipeline, every record once.
    let got = tfpipe::Pipeline::tfrecord_files([format!("{bucket}/out/data-*.tfrecord")])
        .unwrap()
        .records()
        .start()
        .unwrap()
        .count();
    assert_eq!(got, 500);

    // A conversion that fails leaves no object under its final names.
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "a,b\n1,2\n3\n").unwrap();
    let mut options = OutputOptions::new(format!("{bucket}/failed/data"));
    options.sharding = Sharding::Shards(2);
    convert::convert(&format, &[bad], &options).unwrap_err();
    let err = tfpipe::storage::resolve([format!("{bucket}/failed/*")]).unwrap_err();
    assert!(
        matches!(err, tfpipe::storage::StorageError::NoMatch { .. }),
        "{err}"
    );
}

#[test]
fn an_interrupted_convert_to_s3_leaves_no_object() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tfpipe::convert::{self, CsvOptions, Format, OutputOptions, Phase, Sharding};
    let server = S3Server::start();
    let bucket = server.bucket("interrupt");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("big.csv");
    let mut text = String::from("a,b\n");
    for i in 0..200_000 {
        text.push_str(&format!("{i},{}\n", i % 7));
    }
    std::fs::write(&input, &text).unwrap();
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    let mut options = OutputOptions::new(format!("{bucket}/out/data"));
    options.sharding = Sharding::Shards(2);
    options.threads = 2;
    options.cancel = Some(Arc::clone(&cancel));
    // Interrupt once encoding (and so the uploads) has begun.
    options.progress = Some(Arc::new(move |p: &tfpipe::convert::Progress| {
        if p.phase == Phase::Encoding && p.records > 0 {
            flag.store(true, Ordering::SeqCst);
        }
    }));
    let err =
        convert::convert(&Format::Csv(CsvOptions::default()), &[input], &options).unwrap_err();
    assert!(matches!(err, convert::ConvertError::Interrupted), "{err}");
    assert!(cancel.load(Ordering::SeqCst));
    let err = tfpipe::storage::resolve([format!("{bucket}/out/*")]).unwrap_err();
    assert!(
        matches!(err, tfpipe::storage::StorageError::NoMatch { .. }),
        "{err}"
    );
}
