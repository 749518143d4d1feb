//! Errors arrive as `Err` items naming their stage; nothing hangs or aborts.

use std::io::Write;

use tfpipe::pipeline::{Parallelism, Pipeline, PipelineError, Record};
use tfpipe::tfrecord::{Compression, OnCorruption, ReaderOptions};

use crate::common::{index_record, record_index, watchdog, write_shards};

#[test]
fn user_error_in_parallel_map_names_the_stage_and_the_rest_goes_on() {
    let got = watchdog(10, || {
        Pipeline::from_vec((0..20u32).collect())
            .map_parallel(Parallelism::Fixed(3), |x: u32| {
                if x == 7 {
                    Err(format!("bad element {x}"))
                } else {
                    Ok(x)
                }
            })
            .start()
            .unwrap()
            .collect::<Vec<_>>()
    });
    assert_eq!(got.len(), 20);
    let err = got[7].as_ref().unwrap_err();
    assert!(matches!(err, PipelineError::User { .. }));
    assert_eq!(err.stage(), Some("map"));
    assert_eq!(err.to_string(), "stage map: bad element 7");
    assert_eq!(*got[8].as_ref().unwrap(), 8, "order kept after an error");
}

/// A parallelism no machine could run is refused at start, before a slot
/// is allocated per worker (10^9 workers aborted on a 288 GB allocation).
#[test]
fn absurd_parallelism_is_refused_at_start() {
    use tfpipe::pipeline::Interleave;
    let huge = Parallelism::Fixed(1_000_000_000);
    let mapped =
        Pipeline::from_vec(vec![1u32]).map_parallel(huge, Ok::<_, std::convert::Infallible>);
    let error = mapped.start().err().unwrap().to_string();
    assert!(error.contains("1 to 4096"), "{error}");
    let interleaved = Pipeline::from_vec(vec![1u32])
        .interleave(Interleave::new(2, 2).parallel(huge), |x| {
            Pipeline::from_vec(vec![x])
        });
    let error = interleaved.start().err().unwrap().to_string();
    assert!(error.contains("1 to 4096"), "{error}");
    assert!(Parallelism::Fixed(4096).is_valid() && !Parallelism::Fixed(0).is_valid());
}

#[test]
fn panic_in_map_arrives_as_err_naming_the_stage() {
    for par in [None, Some(Parallelism::Fixed(2)), Some(Parallelism::Auto)] {
        let got = watchdog(10, move || {
            let p = Pipeline::from_vec((0..10u32).collect());
            let p = match par {
                None => p.try_map(|x: u32| {
                    assert!(x != 4, "boom at {x}");
                    Ok::<_, std::convert::Infallible>(x)
                }),
                Some(par) => p.map_parallel(par, |x: u32| {
                    assert!(x != 4, "boom at {x}");
                    Ok::<_, std::convert::Infallible>(x)
                }),
            };
            p.start().unwrap().collect::<Vec<_>>()
        });
        assert_eq!(got.len(), 10);
        match &got[4] {
            Err(PipelineError::Panic { stage, message }) => {
                assert_eq!(stage, "map");
                assert!(message.contains("boom at 4"), "{message}");
            }
            other => panic!("expected a panic error, got {other:?}"),
        }
    }
}

#[test]
fn panic_in_filter_and_generator_are_errors_too() {
    let got = watchdog(10, || {
        Pipeline::from_generator(|| (0..5u32).map(|x| if x == 3 { panic!("gen died") } else { x }))
            .filter(|x| {
                assert!(*x != 1, "filter died");
                true
            })
            .start()
            .unwrap()
            .collect::<Vec<_>>()
    });
    assert_eq!(got.len(), 4);
    assert_eq!(got[1].as_ref().unwrap_err().stage(), Some("filter"));
    assert_eq!(got[3].as_ref().unwrap_err().stage(), Some("generator"));
}

#[test]
fn corrupt_file_reports_file_record_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_shards(dir.path(), 2, 10, Compression::None, index_record);
    // Flip a data byte of record 3 of the first file (each record is 8 + 16 bytes).
    let mut bytes = std::fs::read(&paths[0]).unwrap();
    bytes[3 * 24 + 12] ^= 0xFF;
    std::fs::File::create(&paths[0])
        .unwrap()
        .write_all(&bytes)
        .unwrap();

    let pattern = dir.path().join("part-*.tfrecord").display().to_string();
    let got = watchdog(10, move || {
        Pipeline::tfrecord_files([pattern])
            .unwrap()
            .records()
            .start()
            .unwrap()
            .collect::<Vec<_>>()
    });
    // 3 good records, the error (the corrupt file ends there), then file 2.
    assert_eq!(got.len(), 3 + 1 + 10);
    let err = got[3].as_ref().unwrap_err();
    assert_eq!(err.stage(), Some("tfrecord"));
    let loc = err.location().expect("a location");
    assert_eq!(loc.path.as_deref(), Some(paths[0].as_path()));
    assert_eq!(loc.record, 3);
    assert_eq!(loc.offset, 3 * 24 + 12);
    assert!(err.to_string().contains("record 3 at byte 84"), "{err}");
    assert_eq!(record_index(got[4].as_ref().unwrap()), 10);
}

#[test]
fn ignore_errors_counts_with_locations() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_shards(dir.path(), 1, 10, Compression::None, index_record);
    let mut bytes = std::fs::read(&paths[0]).unwrap();
    bytes[5 * 24 + 12] ^= 0xFF;
    std::fs::write(&paths[0], &bytes).unwrap();
    let path = paths[0].display().to_string();
    let (got, metrics) = watchdog(10, move || {
        let mut it = Pipeline::tfrecord_files([path])
            .unwrap()
            .records()
            .try_map(|r: Record| {
                let i = u64::from_le_bytes(r[..].try_into().unwrap());
                if i == 1 { Err("one is odd") } else { Ok(i) }
            })
            .ignore_errors()
            .start()
            .unwrap();
        let got: Vec<u64> = it.by_ref().map(|r| r.unwrap()).collect();
        (got, it.metrics())
    });
    assert_eq!(got, [0, 2, 3, 4]);
    let stage = metrics.stage("ignore_errors").unwrap();
    assert_eq!(stage.skipped, 2);
    assert!(stage.skipped_samples[0].contains("one is odd"));
    assert!(
        stage.skipped_samples[1].contains("record 5 at byte 132"),
        "{:?}",
        stage.skipped_samples
    );
}

#[test]
fn reader_skip_policy_counts_corruptions_on_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_shards(dir.path(), 1, 10, Compression::None, index_record);
    let mut bytes = std::fs::read(&paths[0]).unwrap();
    bytes[2 * 24 + 12] ^= 0xFF;
    std::fs::write(&paths[0], &bytes).unwrap();
    let path = paths[0].display().to_string();
    let (n, metrics) = watchdog(10, move || {
        let options = ReaderOptions {
            on_corruption: OnCorruption::Skip,
            ..ReaderOptions::default()
        };
        let mut it = Pipeline::tfrecord_files([path])
            .unwrap()
            .reader_options(options)
            .records()
            .start()
            .unwrap();
        let mut n = 0;
        for r in it.by_ref() {
            r.unwrap();
            n += 1;
        }
        (n, it.metrics())
    });
    assert_eq!(n, 9);
    let source = metrics.stage("tfrecord").unwrap();
    assert_eq!(source.skipped, 1);
    assert!(
        source.skipped_samples[0].contains("record 2"),
        "{:?}",
        source.skipped_samples
    );
}

#[test]
fn missing_files_and_bad_globs_fail_up_front() {
    let err = Pipeline::tfrecord_files(["/nonexistent/x.tfrecord"])
        .err()
        .unwrap();
    assert!(matches!(err, PipelineError::NoFiles { .. }), "{err}");
    let err = Pipeline::tfrecord_files(["/nonexistent/*.tfrecord"])
        .err()
        .unwrap();
    assert!(matches!(err, PipelineError::NoFiles { .. }), "{err}");
    let err = Pipeline::tfrecord_files(["[z-a"]).err().unwrap();
    assert!(matches!(err, PipelineError::BadGlob { .. }), "{err}");
}

/// One malformed record among ten, after shuffle and batch: the other nine
/// still arrive (in a batch of nine), and the bad one is one error from the
/// stage `parse`, which ignore_errors skips and counts with its message.
#[test]
fn one_bad_record_costs_only_itself() {
    use tfpipe::Schema;
    let dir = tempfile::tempdir().unwrap();
    let bad = 6u64;
    let paths = write_shards(dir.path(), 1, 10, Compression::None, |i| {
        if i == bad {
            b"\x0a\x05\xff\xff\xff\xff\xff".to_vec()
        } else {
            crate::common::mnist_example(i)
        }
    });
    let schema = Schema::from_feature_texts(&["label:int64"]).unwrap();
    let pipeline = Pipeline::tfrecord_files([paths[0].display().to_string()])
        .unwrap()
        .records()
        .shuffle(4, 1)
        .batch(10)
        .parse_batches(schema, Parallelism::Fixed(2));
    let items: Vec<_> = watchdog(20, {
        let pipeline = pipeline.clone();
        move || pipeline.start().unwrap().collect()
    });
    assert_eq!(items.len(), 2, "an error, then the batch of the others");
    let err = items[0].as_ref().unwrap_err();
    assert_eq!(err.stage(), Some("parse"));
    assert!(err.is_data_error());
    assert!(err.parse_error().is_some());
    assert!(err.to_string().contains("malformed protobuf"), "{err}");
    // Located in its file, after shuffle and batch: record 6, at its frame.
    let location = err.location().expect("a parse error is located");
    assert_eq!(location.path.as_deref(), Some(paths[0].as_path()));
    assert_eq!(location.record, bad);
    let framed = |i: u64| (crate::common::mnist_example(i).len() + 16) as u64;
    assert_eq!(location.offset, (0..bad).map(framed).sum::<u64>());
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "stage parse: {}: record 6 at byte ",
            paths[0].display()
        )),
        "{text}"
    );
    let batch = items[1].as_ref().unwrap();
    assert_eq!(batch.num_rows, 9);
    let mut labels = batch.columns[0].as_i64().unwrap().to_vec();
    labels.sort_unstable();
    assert_eq!(labels, [0, 1, 2, 3, 4, 5, 7, 8, 9]);

    let (rows, skipped) = watchdog(20, move || {
        let mut it = pipeline.ignore_errors().start().unwrap();
        let rows: usize = it.by_ref().map(|b| b.unwrap().num_rows).sum();
        let m = it.metrics();
        (rows, m.stage("ignore_errors").unwrap().skipped)
    });
    assert_eq!((rows, skipped), (9, 1));
}

/// An invalid schema is a typed `Schema` error at start.
#[test]
fn an_invalid_schema_fails_at_start_as_a_schema_error() {
    use tfpipe::Schema;
    let mut schema = Schema::from_feature_texts(&["label:int64"]).unwrap();
    schema.features.push(schema.features[0].clone()); // a duplicate name
    let err = Pipeline::from_vec(vec![vec![Vec::<u8>::new()]])
        .parse_batches(schema, 1)
        .start()
        .err()
        .unwrap();
    assert!(matches!(err, PipelineError::Schema(_)), "{err}");
}

/// What anyhow's `{:#}` prints: every error of the chain, joined.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(err), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// A corrupt record read through the pipeline: the chain names the stage,
/// the file, the record and the offset, each once, and location() works.
#[test]
fn an_error_chain_prints_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_shards(dir.path(), 1, 5, Compression::Gzip, index_record);
    let mut bytes = std::fs::read(&paths[0]).unwrap();
    let cut = bytes.len() - 12;
    bytes.truncate(cut); // the gzip stream is cut short
    std::fs::write(&paths[0], &bytes).unwrap();
    let items: Vec<_> = watchdog(10, {
        let p = paths[0].display().to_string();
        move || {
            Pipeline::tfrecord_files([p])
                .unwrap()
                .records()
                .start()
                .unwrap()
                .collect()
        }
    });
    let err = items.last().unwrap().as_ref().unwrap_err();
    let location = err.location().expect("located");
    let text = chain(err);
    assert_eq!(text.matches("stage tfrecord").count(), 1, "{text}");
    assert_eq!(
        text.matches(&format!("record {} at byte", location.record))
            .count(),
        1,
        "{text}"
    );
    assert_eq!(text.matches("cut short").count(), 1, "{text}");
    assert!(err.record_error().unwrap().io_error().is_some());

    // A user error: its text once.
    let err = Pipeline::from_vec(vec![1u32])
        .try_map(|_| Err::<u32, _>("no good"))
        .start()
        .unwrap()
        .next()
        .unwrap()
        .unwrap_err();
    let text = chain(&err);
    assert_eq!(text.matches("no good").count(), 1, "{text}");
    assert_eq!(err.user_error().unwrap().to_string(), "no good");
}
