//! Cross-checks with the independent `tfrecord` crate.

use tfpipe::tfrecord::{Compression, ReaderOptions, RecordReader, RecordWriter};

use super::common::{drain, golden, read_all};

fn sample_records() -> Vec<Vec<u8>> {
    let mut records = read_all(&golden("examples.tfrecord"), ReaderOptions::default());
    records.push(Vec::new());
    records.push(vec![0xab; 100_000]);
    records.push((0..=255).collect());
    records
}

#[test]
fn records_written_by_the_tfrecord_crate_read_back_through_ours() {
    let records = sample_records();
    let mut bytes = Vec::new();
    let mut writer = tfrecord::BytesWriter::from_writer(&mut bytes).unwrap();
    for record in &records {
        writer.send(record.clone()).unwrap();
    }
    writer.flush().unwrap();
    let mut reader = RecordReader::new(&bytes[..], ReaderOptions::default());
    let (ours, end) = drain(&mut reader);
    end.unwrap();
    assert_eq!(ours, records);
}

#[test]
fn records_written_by_us_read_back_through_the_tfrecord_crate() {
    let records = sample_records();
    let mut writer = RecordWriter::new(Vec::new(), Compression::None);
    for record in &records {
        writer.write_record(record).unwrap();
    }
    let bytes = writer.finish().unwrap();
    let theirs: Vec<Vec<u8>> = tfrecord::BytesIter::from_reader(
        &bytes[..],
        tfrecord::RecordReaderConfig {
            check_integrity: true,
        },
    )
    .collect::<Result<_, _>>()
    .unwrap();
    assert_eq!(theirs, records);
    // And both agree on the golden file itself.
    let file = std::fs::read(golden("examples.tfrecord")).unwrap();
    let theirs: Vec<Vec<u8>> =
        tfrecord::BytesIter::from_reader(&file[..], tfrecord::RecordReaderConfig::default())
            .collect::<Result<_, _>>()
            .unwrap();
    let mut ours = RecordReader::new(&file[..], ReaderOptions::default());
    let (ours, end) = drain(&mut ours);
    end.unwrap();
    assert_eq!(theirs, ours);
}
