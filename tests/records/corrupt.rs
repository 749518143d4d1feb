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
