//! Listing, reading plain and gzip objects, range boundaries, retries and
//! the errors: missing objects, refused credentials, corrupt data.

use std::io::{self, Read as _};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tfpipe::Compression;
use tfpipe::pipeline::{Pipeline, PipelineError};
use tfpipe::storage::{self, ReadOptions, ReadStrategy, StorageError};
use tfpipe::tfrecord::{FileRecordReader, ReaderOptions, RecordError};

use crate::server::{S3Server, assert_open_error, records, tfrecord};

fn read_all(url: &str, read: &ReadOptions) -> Result<Vec<Vec<u8>>, RecordError> {
    let reader = FileRecordReader::open_with(url, ReaderOptions::default(), read)?;
    reader.into_records().collect()
}

/// A URL ending in `/` is a dataset directory, as a local directory is:
/// its `part-*` objects through `key=value/` prefixes, without markers,
/// checksums or work prefixes; empty parts (the 20-byte GZIP stream of
/// nothing) read as empty.
#[test]
fn a_url_ending_in_a_slash_reads_a_spark_dataset() {
    let server = S3Server::start();
    let bucket = server.bucket("spark");
    let empty_gzip = vec![
        0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let data = records(0, 3, 10);
    for (key, bytes) in [
        (
            "out/day=1/part-r-00000.gz",
            tfrecord(&data, Compression::Gzip),
        ),
        ("out/day=1/part-r-00001.gz", empty_gzip),
        ("out/day=2/part-r-00000", tfrecord(&data, Compression::None)),
        ("out/day=2/.part-r-00000.crc", b"x".to_vec()),
        ("out/_SUCCESS", Vec::new()),
        ("out/_temporary/0/part-r-00000", b"x".to_vec()),
        ("other/part-r-00000", b"x".to_vec()),
    ] {
        server.put(&format!("{bucket}/{key}"), bytes);
    }
    let found = storage::resolve([format!("{bucket}/out/")]).unwrap();
    let names: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
    assert_eq!(
        names,
        [
            format!("{bucket}/out/day=1/part-r-00000.gz"),
            format!("{bucket}/out/day=1/part-r-00001.gz"),
            format!("{bucket}/out/day=2/part-r-00000"),
        ]
    );
    let read: Vec<Vec<u8>> = Pipeline::tfrecord_files([format!("{bucket}/out/")])
        .unwrap()
        .records()
        .start()
        .unwrap()
        .map(|r| r.unwrap().to_vec())
        .collect();
    assert_eq!(read, [data.clone(), data].concat());
    let err = storage::resolve([format!("{bucket}/nothing/")]).unwrap_err();
    assert!(matches!(err, StorageError::NoMatch { .. }), "{err}");
}

#[test]
fn globs_list_by_prefix_then_match_keys() {
    let server = S3Server::start();
    let bucket = server.bucket("glob");
    for key in [
        "train/part-1.tfrecord",
        "train/part-0.tfrecord",
        "train/part-2.tfrecord.gz",
        "train/notes.txt",
        "train/sub/part-9.tfrecord",
        "eval/part-0.tfrecord",
    ] {
        server.put(&format!("{bucket}/{key}"), b"x".to_vec());
    }
    let found = storage::resolve([format!("{bucket}/train/part-*")]).unwrap();
    let names: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
    assert_eq!(
        names,
        [
            format!("{bucket}/train/part-0.tfrecord"),
            format!("{bucket}/train/part-1.tfrecord"),
            format!("{bucket}/train/part-2.tfrecord.gz"),
        ],
        "`*` does not cross `/`, matches are sorted"
    );
    let found = storage::resolve([format!("{bucket}/*/part-0.tfrecord")]).unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    let found = storage::resolve([format!("{bucket}/train/sub/part-?.tfrecord")]).unwrap();
    assert_eq!(found.len(), 1);
    // A plain URL must exist; a glob must match.
    let err = storage::resolve([format!("{bucket}/train/part-7.tfrecord")]).unwrap_err();
    assert!(matches!(err, StorageError::NoMatch { .. }), "{err}");
    let err = Pipeline::tfrecord_files([format!("{bucket}/test-*.tfrecord")])
        .err()
        .unwrap();
    assert!(matches!(err, PipelineError::NoFiles { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("{bucket}/test-*.tfrecord")),
        "{err}"
    );
}

#[test]
fn plain_and_gzip_shards_read_through_the_pipeline() {
    let server = S3Server::start();
    let bucket = server.bucket("read");
    let mut expected = Vec::new();
    for f in 0..4 {
        let recs = records(f, 300, 200);
        let compression = if f % 2 == 0 {
            Compression::None
        } else {
            Compression::Gzip
        };
        let key = format!("{bucket}/data/part-{f}.tfrecord{}", compression.suffix());
        server.put(&key, tfrecord(&recs, compression));
        expected.extend(recs);
    }
    let got: Vec<Vec<u8>> = Pipeline::tfrecord_files([format!("{bucket}/data/part-*")])
        .unwrap()
        .interleave(3, 7)
        .start()
        .unwrap()
        .map(|r| r.map(|r| r.to_vec()))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(got.len(), expected.len());
    let (mut got, mut expected) = (got, expected);
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
}

#[test]
fn records_split_across_range_boundaries_read_whole() {
    let server = S3Server::start();
    let bucket = server.bucket("ranges");
    // Ranges of 1000 bytes (an odd size, so records straddle them), 3 in
    // flight, over 400 records; and ranges smaller than one record over 40
    // (each range is a GET: 97-byte ranges over all 400 took 20 s).
    for (count, range_size) in [(400, 1000), (40, 97)] {
        let recs = records(0, count, 300);
        for compression in [Compression::None, Compression::Gzip, Compression::Zlib] {
            let url = format!("{bucket}/r{count}.tfrecord{}", compression.suffix());
            server.put(&url, tfrecord(&recs, compression));
            for strategy in [ReadStrategy::Ranges, ReadStrategy::Stream] {
                let read = ReadOptions {
                    range_size,
                    ranges_in_flight: 3,
                    strategy,
                    ..ReadOptions::default()
                };
                let got = read_all(&url, &read).unwrap();
                assert_eq!(got, recs, "{url} {range_size} {strategy:?}");
            }
        }
    }
}

/// What a read has received but not yet consumed is bounded by the
/// read-ahead the options chose, for one stream as for ranges: a reader
/// that stops reading stops the GETs (a 16 MiB object, 2 MiB of read-ahead,
/// all of which an unbounded stream would have buffered).
#[test]
fn a_reader_buffers_no_more_than_its_read_ahead() {
    let server = S3Server::start();
    let bucket = server.bucket("bounded");
    let url = format!("{bucket}/big.bin");
    let bytes: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
    server.put(&url, bytes.clone());
    for strategy in [ReadStrategy::Stream, ReadStrategy::Ranges] {
        let read = ReadOptions {
            range_size: 1 << 20,
            ranges_in_flight: 2,
            strategy,
            ..ReadOptions::default()
        };
        let mut reader = storage::open_object(&url, &read).unwrap();
        let mut got = vec![0u8; 1];
        reader.read_exact(&mut got).unwrap();
        // Time for the GETs to fetch whatever they are allowed to.
        std::thread::sleep(Duration::from_millis(300));
        // The read-ahead, and the rest of the 1 MiB piece being read.
        assert!(
            reader.buffered() <= 3 << 20,
            "{strategy:?}: {} bytes buffered",
            reader.buffered()
        );
        reader.read_to_end(&mut got).unwrap();
        assert!(got == bytes, "{strategy:?}: the bytes differ");
    }
}

/// A whole-object stream holds at most its `stream_buffer` (4 MiB by
/// default), not the whole read-ahead (32 MiB): with 8 objects streaming,
/// a quarter of a gigabyte of fresh body buffers cost a reader of the
/// records a third of its CPU in page faults (docs/storage.md). Before,
/// this 16 MiB object was buffered whole.
#[test]
fn a_stream_holds_no_more_than_its_stream_buffer() {
    let server = S3Server::start();
    let bucket = server.bucket("stream-buffer");
    let url = format!("{bucket}/big.bin");
    let bytes: Vec<u8> = (0..16u32 << 20).map(|i| (i % 241) as u8).collect();
    server.put(&url, bytes.clone());
    for (stream_buffer, most) in [(None, 5 << 20), (Some(2 << 20), 3 << 20)] {
        let defaults = ReadOptions::default();
        let read = ReadOptions {
            strategy: ReadStrategy::Stream,
            stream_buffer: stream_buffer.unwrap_or(defaults.stream_buffer),
            ..defaults
        };
        let mut reader = storage::open_object(&url, &read).unwrap();
        let mut got = vec![0u8; 1];
        reader.read_exact(&mut got).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        // The stream's buffer, and the rest of the 1 MiB piece being read.
        assert!(
            reader.buffered() <= most,
            "{stream_buffer:?}: {} bytes buffered",
            reader.buffered()
        );
        assert!(reader.buffered() > 0, "nothing read ahead");
        reader.read_to_end(&mut got).unwrap();
        assert!(got == bytes, "the bytes differ");
    }
}

/// `Auto` measures the server on the first object of at least the
/// read-ahead's size, records the choice for the bucket, and reads the
/// object whole either way; a smaller object is streamed without measuring.
#[test]
fn auto_measures_the_server_once_per_bucket() {
    let server = S3Server::start();
    let bucket = server.bucket("auto");
    let small = format!("{bucket}/small.bin");
    let big = format!("{bucket}/big.bin");
    let bytes: Vec<u8> = (0..4u32 << 20).map(|i| (i % 253) as u8).collect();
    server.put(&small, bytes[..1 << 20].to_vec());
    server.put(&big, bytes.clone());
    let read = ReadOptions {
        range_size: 1 << 20,
        ranges_in_flight: 2,
        ..ReadOptions::default()
    };
    let read_whole = |url: &str| {
        let mut got = Vec::new();
        storage::open_object(url, &read)
            .unwrap()
            .read_to_end(&mut got)
            .unwrap();
        got
    };
    assert_eq!(read_whole(&small), bytes[..1 << 20]);
    assert_eq!(storage::read_strategy(&bucket), None);
    assert!(read_whole(&big) == bytes);
    let chosen = storage::read_strategy(&bucket);
    assert!(chosen.is_some(), "no strategy recorded");
    eprintln!("s3s-fs: {chosen:?}");
}

/// Cut by ranges (`Auto` measures this server) and by one stream, whose
/// GET was sent at open, before any byte was read.
#[test]
fn a_connection_dropped_mid_read_is_retried() {
    let server = S3Server::start();
    let recs = records(0, 500, 400);
    for strategy in [ReadStrategy::Auto, ReadStrategy::Stream] {
        let (endpoint, cut) = server.cutting_proxy(3, 5000);
        let bucket = server.bucket_at("cut", &endpoint, crate::server::SECRET_KEY);
        let url = format!("{bucket}/big.tfrecord");
        server.put(&url, tfrecord(&recs, Compression::None));
        let read = ReadOptions {
            range_size: 64 << 10,
            ranges_in_flight: 2,
            backoff: std::time::Duration::from_millis(10),
            strategy,
            ..ReadOptions::default()
        };
        assert_eq!(read_all(&url, &read).unwrap(), recs, "{strategy:?}");
        assert!(
            cut.load(Ordering::SeqCst) >= 1,
            "{strategy:?}: the proxy never cut a connection"
        );
    }
}

/// `TfRecordFiles::read_options` reaches the pipeline's object reads: with a
/// read-ahead of 128 KiB, a 200 KB object is large enough for `Auto` to
/// measure the server (it records a strategy for the bucket), and `Stream`
/// skips the measurement; with the default options (32 MiB) neither would.
#[test]
fn read_options_reach_the_pipelines_objects() {
    let server = S3Server::start();
    let bucket = server.bucket("read-options");
    let url = format!("{bucket}/small.tfrecord");
    let recs = records(0, 500, 400);
    server.put(&url, tfrecord(&recs, Compression::None));
    for strategy in [ReadStrategy::Stream, ReadStrategy::Auto] {
        let read = ReadOptions {
            range_size: 64 << 10,
            ranges_in_flight: 2,
            strategy,
            ..ReadOptions::default()
        };
        let got: Vec<Vec<u8>> = Pipeline::tfrecord_files([url.as_str()])
            .unwrap()
            .read_options(read)
            .interleave(2, 4)
            .start()
            .unwrap()
            .map(|r| r.map(|r| r.to_vec()))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got, recs, "{strategy:?}");
        let measured = storage::read_strategy(&bucket);
        match strategy {
            ReadStrategy::Stream => assert_eq!(measured, None, "measured though told to stream"),
            _ => assert!(
                measured.is_some(),
                "the pipeline's options did not reach the reader"
            ),
        }
    }
}

#[test]
fn a_missing_object_is_named_and_not_found() {
    let server = S3Server::start();
    let bucket = server.bucket("missing");
    let url = format!("{bucket}/nope.tfrecord");
    let err = FileRecordReader::open(&url, ReaderOptions::default())
        .err()
        .unwrap();
    match &err {
        RecordError::Open {
            path,
            error: source,
        } => {
            assert_eq!(path.to_str(), Some(url.as_str()));
            assert_eq!(source.kind(), io::ErrorKind::NotFound, "{err}");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains(&url), "{err}");
}

#[test]
fn a_bad_credential_fails_at_once_naming_the_url() {
    let server = S3Server::start();
    let bucket = server.bucket_at("badcred", &server.endpoint(), "not-the-secret");
    let url = format!("{bucket}/x.tfrecord");
    server.put(&url, tfrecord(&records(0, 3, 10), Compression::None));
    let err = FileRecordReader::open(&url, ReaderOptions::default())
        .err()
        .unwrap();
    assert_open_error(&err, io::ErrorKind::PermissionDenied, &url);
    let err = storage::resolve([format!("{bucket}/*.tfrecord")]).unwrap_err();
    assert_eq!(err.io_kind(), io::ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains(&bucket), "{err}");
}

#[test]
fn corruption_in_an_object_is_located_by_url_record_and_offset() {
    let server = S3Server::start();
    let bucket = server.bucket("corrupt");
    let recs = records(0, 50, 100);
    let mut bytes = tfrecord(&recs, Compression::None);
    // Flip a data byte of record 10.
    let offset: usize = recs[..10].iter().map(|r| r.len() + 16).sum();
    bytes[offset + 12] ^= 0xff;
    let url = format!("{bucket}/c.tfrecord");
    server.put(&url, bytes);
    let read = ReadOptions {
        range_size: 512,
        ..ReadOptions::default()
    };
    let err = read_all(&url, &read).unwrap_err();
    let location = err.location().expect("a location");
    assert_eq!(
        location.path.as_deref().and_then(|p| p.to_str()),
        Some(url.as_str())
    );
    assert_eq!(location.record, 10);
    assert_eq!(location.offset, offset as u64 + 12);
    assert!(
        err.to_string()
            .starts_with(&format!("{url}: record 10 at byte")),
        "{err}"
    );
}
