//! Damaged and unusual GZIP/ZLIB streams: every record decoded before the
//! damage is delivered, then the error at the right record with both
//! offsets; empty files, concatenated streams and trailing bytes; content
//! that does not match its file name.

use std::io::Write;

use tfpipe::tfrecord::{
    Compression, CorruptionKind, DecodeError, FileRecordReader, MAX_CORRUPTIONS_KEPT, OnCorruption,
    ReaderOptions, RecordReader,
};

use crate::common::{drain, golden, read_all, write_records};

fn options(compression: Compression) -> ReaderOptions {
    ReaderOptions {
        compression: Some(compression),
        ..ReaderOptions::default()
    }
}

fn numbered(n: usize, len: usize) -> Vec<Vec<u8>> {
    // Mildly compressible, different per record.
    (0..n)
        .map(|i| {
            (0..len)
                .map(|k| ((i * 31 + k * 7) % 251) as u8 ^ (k as u8 / 3))
                .collect()
        })
        .collect()
}

fn read_bytes(
    bytes: &[u8],
    options: ReaderOptions,
) -> (Vec<Vec<u8>>, Result<(), tfpipe::tfrecord::RecordError>, u64) {
    let mut reader = RecordReader::decoding(bytes, options);
    let (records, end) = drain(&mut reader);
    let count = reader.corruption_count();
    (records, end, count)
}

fn tmp_file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    path
}

/// The golden zlib file with its Adler-32 trailer flipped: all 50 records,
/// then the error at record 50, naming the compressed offset.
#[test]
fn golden_zlib_with_a_bad_adler32_delivers_all_50_then_fails() {
    let expected = read_all(&golden("examples.tfrecord"), ReaderOptions::default());
    let mut bytes = std::fs::read(golden("examples.tfrecord.zlib")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    let (records, end, _) = read_bytes(&bytes, options(Compression::Zlib));
    assert_eq!(records, expected);
    let err = end.unwrap_err();
    assert!(err.is_corruption(), "{err}");
    let location = err.location().unwrap();
    assert_eq!(location.record, 50);
    let text = err.to_string();
    assert!(text.contains("record 50"), "{text}");
    assert!(text.contains("compressed byte"), "{text}");
}

#[test]
fn golden_gzip_with_a_bad_crc_delivers_all_50_then_fails() {
    let expected = read_all(&golden("examples.tfrecord"), ReaderOptions::default());
    let mut bytes = std::fs::read(golden("examples.tfrecord.gz")).unwrap();
    let crc = bytes.len() - 8; // CRC32 then ISIZE
    bytes[crc] ^= 0x55;
    let (records, end, _) = read_bytes(&bytes, options(Compression::Gzip));
    assert_eq!(records, expected);
    assert_eq!(end.unwrap_err().location().unwrap().record, 50);
}

/// Damage in the middle of a long stream: the records before it come out
/// intact, the error names the first record not delivered, and the
/// uncompressed offset of the damage is at or after that record's start.
#[test]
fn damage_mid_stream_keeps_the_records_before_it() {
    let records = numbered(2000, 300);
    for compression in [Compression::Zlib, Compression::Gzip] {
        let mut bytes = write_records(&records, compression);
        let at = bytes.len() * 3 / 5;
        bytes[at] ^= 0xff;
        let (read, end, _) = read_bytes(&bytes, options(compression));
        assert!(
            read.len() > 1000,
            "{compression}: only {} records",
            read.len()
        );
        assert_eq!(read[..], records[..read.len()], "{compression}");
        let Err(err) = end else {
            panic!("{compression}: damage not reported");
        };
        let location = err.location().unwrap();
        assert_eq!(location.record, read.len() as u64, "{err}");
        let start = read.len() as u64 * (300 + 16);
        if err.corruption().is_some() {
            // The damage decoded into wrong bytes: the record CRCs catch it.
            assert!((start..start + 16).contains(&location.offset), "{err}");
            continue;
        }
        assert_eq!(location.offset, start, "{err}");
        let io = err.io_error().unwrap();
        match DecodeError::of(io) {
            Some(DecodeError::Corrupt {
                compressed,
                uncompressed,
                ..
            }) => {
                assert!(*compressed <= at as u64 + 1, "{err}");
                assert!(*uncompressed >= location.offset, "{err}");
            }
            other => panic!("{compression}: {other:?}: {err}"),
        }
    }
}

/// A stream cut short: the records before the cut come out, then the
/// truncation at the first record not delivered, with both offsets.
#[test]
fn a_cut_stream_keeps_the_records_before_the_cut() {
    let records = numbered(2000, 300);
    for compression in [Compression::Zlib, Compression::Gzip] {
        let bytes = write_records(&records, compression);
        let cut = bytes.len() * 3 / 5;
        let (read, end, _) = read_bytes(&bytes[..cut], options(compression));
        assert!(
            read.len() > 1000,
            "{compression}: only {} records",
            read.len()
        );
        assert_eq!(read[..], records[..read.len()], "{compression}");
        let err = end.unwrap_err();
        let location = err.location().unwrap();
        assert_eq!(location.record, read.len() as u64, "{err}");
        assert_eq!(location.offset, read.len() as u64 * (300 + 16), "{err}");
        let io = err.io_error().unwrap();
        match DecodeError::of(io) {
            Some(DecodeError::Truncated {
                compressed,
                uncompressed,
                ..
            }) => {
                assert_eq!(*compressed, cut as u64, "{err}");
                // Less than one record's worth past the last delivered one.
                assert!(
                    (location.offset..location.offset + 316).contains(uncompressed),
                    "{err}"
                );
            }
            other => panic!("{compression}: {other:?}: {err}"),
        }
    }
}

/// TensorFlow reads an empty file as GZIP or ZLIB as 0 records; so do we.
#[test]
fn an_empty_compressed_file_has_no_records() {
    for compression in [Compression::Gzip, Compression::Zlib] {
        let (records, end, _) = read_bytes(&[], options(compression));
        assert!(records.is_empty());
        end.unwrap();
    }
}

/// Concatenated ZLIB streams are read to the end of the last one, as
/// multi-member GZIP files are (TensorFlow stops after the first).
#[test]
fn concatenated_streams_are_all_read() {
    let records = numbered(100, 40);
    for compression in [Compression::Zlib, Compression::Gzip] {
        let mut bytes = write_records(&records[..50], compression);
        bytes.extend(write_records(&records[50..], compression));
        let (read, end, _) = read_bytes(&bytes, options(compression));
        end.unwrap();
        assert_eq!(read, records, "{compression}");
    }
}

/// A member that decompresses to nothing does not end the file (TensorFlow
/// stops there).
#[test]
fn an_empty_member_does_not_end_the_stream() {
    let records = numbered(20, 40);
    for compression in [Compression::Zlib, Compression::Gzip] {
        let mut bytes = write_records(&records[..10], compression);
        bytes.extend(write_records(&[], compression));
        bytes.extend(write_records(&records[10..], compression));
        let (read, end, _) = read_bytes(&bytes, options(compression));
        end.unwrap();
        assert_eq!(read, records, "{compression}");
    }
}

/// Bytes after the end of the stream: every record, then an error (or,
/// under `Skip`, a counted corruption).
#[test]
fn trailing_bytes_are_an_error_or_a_counted_skip() {
    let records = numbered(30, 40);
    for compression in [Compression::Zlib, Compression::Gzip] {
        for (tail, zeros) in [(&b"garbage!"[..], false), (&[0u8; 512][..], true)] {
            let mut bytes = write_records(&records, compression);
            let end_of_stream = bytes.len() as u64;
            bytes.extend_from_slice(tail);
            let (read, end, _) = read_bytes(&bytes, options(compression));
            assert_eq!(read, records);
            let err = end.unwrap_err();
            assert_eq!(err.location().unwrap().record, 30);
            let io = err.io_error().unwrap();
            assert_eq!(
                DecodeError::of(io),
                Some(&DecodeError::TrailingData {
                    format: tfpipe::tfrecord::Format::of_compression(compression).unwrap(),
                    compressed: end_of_stream,
                    bytes: tail.len() as u64,
                    zeros,
                }),
                "{err}"
            );
            let skip = ReaderOptions {
                on_corruption: OnCorruption::Skip,
                ..options(compression)
            };
            let (read, end, count) = read_bytes(&bytes, skip);
            end.unwrap();
            assert_eq!(read, records);
            assert_eq!(count, 1);
        }
    }
}

/// GZIP or ZLIB content in a file named as uncompressed is read as such;
/// a JSON or PNG file is named for what it is.
#[test]
fn content_is_sniffed_when_the_name_says_uncompressed() {
    let dir = tempfile::tempdir().unwrap();
    let records = numbered(10, 40);
    for compression in [Compression::Gzip, Compression::Zlib] {
        let path = tmp_file(&dir, "x.tfrecord", &write_records(&records, compression));
        assert_eq!(read_all(&path, ReaderOptions::default()), records);
    }
    // Uncompressed stays uncompressed.
    let path = tmp_file(
        &dir,
        "y.tfrecord",
        &write_records(&records, Compression::None),
    );
    assert_eq!(read_all(&path, ReaderOptions::default()), records);

    let cases: [(&[u8], &str); 3] = [
        (b"{\"image\": [1, 2, 3], \"label\": 4}\n", "JSON"),
        (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10", "PNG"),
        (b"a,b,c\n1,2,3\n4,5,6\n", "text"),
    ];
    for (bytes, what) in cases {
        let path = tmp_file(&dir, "z.tfrecord", bytes);
        let mut reader = FileRecordReader::open(&path, ReaderOptions::default()).unwrap();
        let (read, end) = drain(&mut reader);
        assert!(read.is_empty());
        let err = end.unwrap_err();
        assert!(
            matches!(err.corruption(), Some(CorruptionKind::NotTfRecord { .. })),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains(what) && text.contains("z.tfrecord"), "{text}");
    }
}

/// Under `Skip`, a reader keeps the first few corruptions with their
/// locations and counts the rest.
#[test]
fn skipped_corruptions_are_counted_and_the_list_is_bounded() {
    let records = numbered(200, 20);
    let mut bytes = write_records(&records, Compression::None);
    // Flip one data byte in every other record.
    let framed = 20 + 16;
    for i in (0..200).step_by(2) {
        bytes[i * framed + 12] ^= 1;
    }
    let skip = ReaderOptions {
        on_corruption: OnCorruption::Skip,
        ..ReaderOptions::default()
    };
    let mut reader = RecordReader::new(&bytes[..], skip);
    let (read, end) = drain(&mut reader);
    end.unwrap();
    assert_eq!(read.len(), 100);
    assert_eq!(reader.corruption_count(), 100);
    assert_eq!(reader.corruptions().len(), MAX_CORRUPTIONS_KEPT);
    assert_eq!(reader.corruptions()[1].location.record, 2);
}
