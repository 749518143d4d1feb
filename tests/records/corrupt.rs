//! The corrupt golden files: the error kind, record index and offset
//! `corrupt/README.txt` states, and the records each policy yields.

use tfpipe::tfrecord::{
    CorruptionKind, FileRecordReader, OnCorruption, ReaderOptions, RecordError,
};

use super::common::{drain, golden, read_all};

struct Case {
    file: &'static str,
    /// Record index and offset TensorFlow reports.
    record: u64,
    offset: u64,
    /// Records TensorFlow yields before the error (and with `ignore_errors()`).
    tf_records: usize,
    kind: fn(&CorruptionKind) -> bool,
}

const CASES: [Case; 3] = [
    Case {
        file: "corrupt/data_crc_mismatch.tfrecord",
        record: 10,
        offset: 2220,
        tf_records: 10,
        kind: |k| matches!(k, CorruptionKind::DataCrc { length: 174, .. }),
    },
    Case {
        file: "corrupt/length_crc_mismatch.tfrecord",
        record: 20,
        offset: 4348,
        tf_records: 20,
        kind: |k| matches!(k, CorruptionKind::LengthCrc { length: 114, .. }),
    },
    Case {
        file: "corrupt/truncated.tfrecord",
        record: 49,
        offset: 9549,
        tf_records: 49,
        kind: |k| {
            matches!(
                k,
                CorruptionKind::TruncatedData {
                    length: 135,
                    available: 67
                }
            )
        },
    },
];

fn open(file: &str, on_corruption: OnCorruption) -> FileRecordReader {
    let options = ReaderOptions {
        on_corruption,
        ..ReaderOptions::default()
    };
    FileRecordReader::open(golden(file), options).unwrap()
}

#[test]
fn failing_reader_reports_kind_record_and_offset() {
    let good = read_all(&golden("examples.tfrecord"), ReaderOptions::default());
    for case in &CASES {
        let mut reader = open(case.file, OnCorruption::Fail);
        let (records, end) = drain(&mut reader);
        assert_eq!(records.len(), case.tf_records, "{}", case.file);
        assert_eq!(records[..], good[..case.tf_records]);
        let err = end.unwrap_err();
        let RecordError::Corrupt { location, kind } = &err else {
            panic!("{}: not a corruption: {err}", case.file);
        };
        assert!((case.kind)(kind), "{}: {kind:?}", case.file);
        assert!(err.is_corruption());
        assert_eq!(location.record, case.record, "{}", case.file);
        assert_eq!(location.offset, case.offset, "{}", case.file);
        assert_eq!(location.path.as_deref(), Some(golden(case.file).as_path()));
        let message = err.to_string();
        assert!(message.contains(case.file), "{message}");
        assert!(
            message.contains(&format!("record {} at byte {}", case.record, case.offset)),
            "{message}"
        );
        // Fused: nothing more, no second error.
        assert!(matches!(reader.next_record(), Ok(None)));
        assert!(reader.corruptions().is_empty());
    }
}

#[test]
fn end_stream_yields_what_tensorflow_ignore_errors_yields() {
    for case in &CASES {
        let mut reader = open(case.file, OnCorruption::EndStream);
        let (records, end) = drain(&mut reader);
        end.unwrap();
        assert_eq!(records.len(), case.tf_records, "{}", case.file);
        let [corruption] = reader.corruptions() else {
            panic!("{}: {:?}", case.file, reader.corruptions());
        };
        assert!((case.kind)(&corruption.kind));
        assert_eq!(corruption.location.record, case.record);
        assert_eq!(corruption.location.offset, case.offset);
    }
}

#[test]
fn skip_passes_over_a_bad_data_crc_and_ends_at_lost_framing() {
    let good = read_all(&golden("examples.tfrecord"), ReaderOptions::default());
    for (case, expected) in CASES.iter().zip([49, 20, 49]) {
        let mut reader = open(case.file, OnCorruption::Skip);
        let (records, end) = drain(&mut reader);
        end.unwrap();
        assert_eq!(records.len(), expected, "{}", case.file);
        let [corruption] = reader.corruptions() else {
            panic!("{}: {:?}", case.file, reader.corruptions());
        };
        assert!((case.kind)(&corruption.kind));
        assert_eq!(corruption.location.record, case.record);
        assert_eq!(corruption.location.offset, case.offset);
        assert!(corruption.to_string().contains(&format!(
            "{}: record {} at byte {}",
            golden(case.file).display(),
            case.record,
            case.offset
        )));
        if expected == 49 && case.record == 10 {
            // Exactly record 10 is missing; the index counts it.
            let mut want = good.clone();
            want.remove(10);
            assert_eq!(records, want);
            assert_eq!(reader.position().record, 50);
        }
    }
}

#[test]
fn data_crc_check_can_be_turned_off() {
    let options = ReaderOptions {
        check_data_crc: false,
        ..ReaderOptions::default()
    };
    let records = read_all(&golden("corrupt/data_crc_mismatch.tfrecord"), options);
    assert_eq!(records.len(), 50);
    // The length CRC is still checked.
    let options = ReaderOptions {
        check_data_crc: false,
        ..ReaderOptions::default()
    };
    let mut reader =
        FileRecordReader::open(golden("corrupt/length_crc_mismatch.tfrecord"), options).unwrap();
    let (records, end) = drain(&mut reader);
    assert_eq!(records.len(), 20);
    assert!(end.is_err());
}

/// Yields `data`, then fails.
struct FailingRead<'a> {
    data: &'a [u8],
}

impl std::io::Read for FailingRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.data.is_empty() {
            return Err(std::io::Error::other("disk on fire"));
        }
        let n = buf.len().min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn read_errors_name_the_position_and_fuse_the_reader() {
    let bytes = std::fs::read(golden("examples.tfrecord")).unwrap();
    // Cut inside record 3 (records 0-2 end at byte 546 in this file).
    let good = read_all(&golden("examples.tfrecord"), ReaderOptions::default());
    let end_of_2: usize = good[..3].iter().map(|r| r.len() + 16).sum();
    let source = FailingRead {
        data: &bytes[..end_of_2 + 20],
    };
    let options = ReaderOptions {
        buffer_size: 64,
        ..ReaderOptions::default()
    };
    let mut reader = tfpipe::tfrecord::RecordReader::new(source, options).with_path("in.tfrecord");
    let (records, end) = drain(&mut reader);
    assert_eq!(records, good[..3]);
    let err = end.unwrap_err();
    assert!(matches!(err, RecordError::Io { .. }));
    assert!(!err.is_corruption());
    let location = err.location().unwrap();
    assert_eq!((location.record, location.offset), (3, end_of_2 as u64));
    assert!(
        err.to_string().starts_with(&format!(
            "in.tfrecord: record 3 at byte {end_of_2}: read failed: disk on fire"
        )),
        "{err}"
    );
    assert!(matches!(reader.next_record(), Ok(None)));
}

#[test]
fn owned_record_iterator_stops_after_an_error() {
    let reader = open("corrupt/length_crc_mismatch.tfrecord", OnCorruption::Fail);
    let results: Vec<_> = reader.into_records().collect();
    assert_eq!(results.len(), 21);
    assert!(results[..20].iter().all(Result::is_ok));
    assert!(results[20].as_ref().unwrap_err().is_corruption());
}
