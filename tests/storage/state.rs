//! Iterator state over URLs: a shuffle buffer (and a partial batch) of
//! records read from S3 is stored as positions and re-read on restore by
//! ranged GETs, and the resumed stream equals the uninterrupted one.

use tfpipe::Compression;
use tfpipe::pipeline::{Interleave, Parallelism, Pipeline, PipelineState, Record};

use crate::server::{S3Server, records, tfrecord};

/// Uploads three shards: two plain (one with records longer than the 64 KiB
/// a re-read reads past a record's start, so those are read again whole),
/// one GZIP (re-read by decoding from the start). Returns the glob URL.
fn upload(server: &S3Server) -> String {
    let bucket = server.bucket("state");
    let mut long = records(1, 12, 50);
    for (i, r) in long.iter_mut().enumerate() {
        if i % 3 == 0 {
            r.resize(70_000 + i, b'z');
        }
    }
    let shards = [
        (records(0, 150, 40), Compression::None, "part-0.tfrecord"),
        (long, Compression::None, "part-1.tfrecord"),
        (records(2, 90, 60), Compression::Gzip, "part-2.tfrecord.gz"),
    ];
    for (recs, compression, name) in shards {
        server.put(&format!("{bucket}/{name}"), tfrecord(&recs, compression));
    }
    format!("{bucket}/part-*")
}

fn bytes(records: &[Record]) -> Vec<Vec<u8>> {
    records.iter().map(|r| r.to_vec()).collect()
}

/// Takes `cut` elements, saves the state as JSON, restores it into a new
/// run and returns everything read, plus the JSON's length.
fn cut_and_resume<T: Send + 'static>(pipeline: &Pipeline<T>, cut: usize) -> (Vec<T>, usize) {
    let mut it = pipeline.start().unwrap();
    let mut got: Vec<T> = it.by_ref().take(cut).map(|r| r.unwrap()).collect();
    let json = it.state().unwrap().to_json();
    drop(it);
    let state = PipelineState::from_json(&json).unwrap();
    got.extend(pipeline.start_from(&state).unwrap().map(|r| r.unwrap()));
    (got, json.len())
}

#[test]
fn a_shuffle_buffer_read_from_s3_resumes_element_for_element() {
    let server = S3Server::start();
    let pattern = upload(&server);
    let pipeline = Pipeline::tfrecord_files([&pattern])
        .unwrap()
        .interleave(3, 4)
        .shuffle(100, 11);
    let whole: Vec<Record> = pipeline.start().unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(whole.len(), 252);
    for cut in [0, 1, 5, 60, 150, 251, 252] {
        let (got, json_len) = cut_and_resume(&pipeline, cut);
        assert_eq!(bytes(&got), bytes(&whole), "cut at {cut}");
        // Positions, not bytes: the buffer holds up to 100 records of which
        // several are 70 KB long.
        assert!(json_len < 4_000, "cut at {cut}: a {json_len}-byte state");
    }
}

#[test]
fn parallel_stages_and_partial_batches_over_s3_resume_too() {
    let server = S3Server::start();
    let pattern = upload(&server);
    let pipeline = Pipeline::tfrecord_files([&pattern])
        .unwrap()
        .interleave_with(Interleave::new(2, 8).parallel(Parallelism::Fixed(2)))
        .shuffle(64, 3)
        .batch(10)
        .prefetch(2);
    let whole: Vec<Vec<Vec<u8>>> = pipeline
        .start()
        .unwrap()
        .map(|b| bytes(&b.unwrap()))
        .collect();
    assert_eq!(whole.len(), 26);
    for cut in [0, 3, 13, 25, 26] {
        let (got, _) = cut_and_resume(&pipeline, cut);
        let got: Vec<Vec<Vec<u8>>> = got.iter().map(|b| bytes(b)).collect();
        assert_eq!(got, whole, "cut at {cut}");
    }
}

#[test]
fn a_changed_object_fails_the_restore_with_its_location() {
    let server = S3Server::start();
    let bucket = server.bucket("state-changed");
    let url = format!("{bucket}/part-0.tfrecord");
    server.put(&url, tfrecord(&records(0, 40, 30), Compression::None));
    let pipeline = Pipeline::tfrecord_files([&url])
        .unwrap()
        .records()
        .shuffle(20, 5);
    let mut it = pipeline.start().unwrap();
    let _ = it.next().unwrap().unwrap();
    let state = it.state().unwrap();
    drop(it);
    // Same size, other bytes: every stored offset now points into garbage.
    let mut changed = tfrecord(&records(0, 40, 30), Compression::None);
    for b in changed.iter_mut().skip(20) {
        *b ^= 0x5a;
    }
    server.put(&url, changed);
    let error = match pipeline.start_from(&state) {
        Ok(mut it) => it
            .next()
            .and_then(Result::err)
            .map(|e| tfpipe::error::display_chain(&e)),
        Err(e) => Some(tfpipe::error::display_chain(&e)),
    };
    let error = error.expect("the restore fails");
    assert!(error.contains(&url), "{error}");
}
