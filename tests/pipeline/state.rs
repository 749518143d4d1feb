//! Checkpointable iterator state: a pipeline resumed from the state taken
//! after `k` events yields exactly what the uninterrupted one yields after
//! its first `k` (elements and epoch markers), over random pipelines
//! (parallel stages, `repeat`, `take`, `skip`, `filter`, `shard` and ranks
//! included) and cut points, and over random mixtures of such pipelines.

use tfpipe::PipelineError;
use tfpipe::pipeline::{
    Event, Exhausted, Interleave, Parallelism, Pipeline, PipelineIter, PipelineState, Rank, Record,
    Remainder, StateError,
};
use tfpipe::tfrecord::Compression;

use crate::common::{index_record, record_index, watchdog, write_shards};

/// A tiny deterministic RNG for choosing pipelines (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % n
    }
}

fn ids(records: &[Record]) -> Vec<u64> {
    records.iter().map(|r| record_index(r)).collect()
}

/// A random pipeline over `pattern`, described by `desc` for failures.
fn random_pipeline(rng: &mut Rng, pattern: &str, desc: &mut String) -> Pipeline<Vec<u64>> {
    let cycle = 1 + rng.below(3) as usize;
    let block = 1 + rng.below(4) as usize;
    let mut options = Interleave::new(cycle, block);
    if rng.below(2) == 0 {
        options = options.parallel(Parallelism::Fixed(1 + rng.below(2) as usize));
    }
    let mut files = Pipeline::tfrecord_files([pattern]).unwrap();
    if rng.below(4) == 0 {
        let world = 2 + rng.below(3) as usize;
        let rank = rng.below(world as u64) as usize;
        *desc += &format!("rank({rank}, {world}).");
        files = files
            .rank(Rank::new(rank, world).unwrap(), Remainder::Drop)
            .unwrap();
    }
    *desc += &format!("interleave({options:?})");
    let mut records = files.interleave_with(options);
    match rng.below(6) {
        0 => {
            *desc += ".filter(odd)";
            records = records.filter(|r: &Record| record_index(r) % 2 == 1);
        }
        1 => {
            let n = rng.below(30);
            *desc += &format!(".skip({n})");
            records = records.skip(n);
        }
        2 => {
            let n = 1 + rng.below(120);
            *desc += &format!(".take({n})");
            records = records.take(n);
        }
        3 => {
            let k = 1 + rng.below(3) as usize;
            *desc += &format!(".shard(3, {k})");
            records = records.shard(3, k - 1);
        }
        _ => {}
    }
    let repeat_at = rng.below(4);
    if repeat_at == 0 {
        *desc += ".repeat(2)";
        records = records.repeat(Some(2));
    }
    if rng.below(3) > 0 {
        let buffer = 1 + rng.below(40) as usize;
        let seed = rng.below(1000);
        *desc += &format!(".shuffle({buffer}, {seed})");
        records = records.shuffle(buffer, seed);
    }
    if rng.below(2) == 0 {
        *desc += ".prefetch(2)";
        records = records.prefetch(2);
    }
    if repeat_at == 1 {
        *desc += ".repeat(3)";
        records = records.repeat(Some(3));
    }
    let mut out = if rng.below(3) > 0 {
        let size = 1 + rng.below(6) as usize;
        *desc += &format!(".batch({size})");
        let batches = records.batch(size);
        if rng.below(2) == 0 {
            let p = 1 + rng.below(3) as usize;
            *desc += &format!(".map_parallel({p})");
            batches.map_parallel(Parallelism::Fixed(p), |b: Vec<Record>| {
                Ok::<_, std::convert::Infallible>(ids(&b))
            })
        } else {
            *desc += ".map";
            batches.map(|b: Vec<Record>| ids(&b))
        }
    } else if rng.below(2) == 0 {
        *desc += ".map_parallel(2)";
        records.map_parallel(Parallelism::Fixed(2), |r: Record| {
            Ok::<_, std::convert::Infallible>(vec![record_index(&r)])
        })
    } else {
        *desc += ".map";
        records.map(|r: Record| vec![record_index(&r)])
    };
    if rng.below(2) == 0 {
        let n = 1 + rng.below(3) as usize;
        *desc += &format!(".prefetch({n})");
        out = out.prefetch(n);
    }
    if repeat_at == 2 {
        *desc += ".repeat(2)";
        out = out.repeat(Some(2));
    }
    out
}

/// An event as comparable data: a batch of record ids, or an epoch marker.
#[derive(Debug, PartialEq)]
enum Seen {
    Item(Vec<u64>),
    End(u64),
}

/// The next `n` events (all of them for `None`).
fn events(it: &mut PipelineIter<Vec<u64>>, n: Option<usize>) -> Vec<Seen> {
    let mut out = Vec::new();
    while n.is_none_or(|n| out.len() < n) {
        match it.next_event() {
            Some(Event::Item(item)) => out.push(Seen::Item(item.unwrap())),
            Some(Event::EpochEnd(e)) => out.push(Seen::End(e)),
            None => break,
        }
    }
    out
}

#[test]
fn resumed_stream_equals_the_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 3, 70, Compression::None, index_record);
    let gz = dir.path().join("gz");
    std::fs::create_dir(&gz).unwrap();
    write_shards(&gz, 2, 60, Compression::Gzip, |i| index_record(1000 + i));
    let plain = dir.path().join("part-*").display().to_string();
    let gzip = gz.join("part-*").display().to_string();
    watchdog(240, move || {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for case in 0..40 {
            let pattern = if case % 3 == 2 { &gzip } else { &plain };
            let mut desc = String::new();
            let pipeline = random_pipeline(&mut rng, pattern, &mut desc);
            let mut it = pipeline.start().unwrap();
            let full = events(&mut it, None);
            let epochs = it.epoch();
            let n = full.len() as u64;
            for cut in [0, 1 + rng.below(n), rng.below(n + 1), n] {
                let cut = cut.min(n) as usize;
                let mut it = pipeline.start().unwrap();
                let head = events(&mut it, Some(cut));
                assert_eq!(head, full[..cut], "{desc}");
                let epoch = it.epoch();
                let json = it
                    .state()
                    .unwrap_or_else(|e| panic!("{desc}: {e}"))
                    .to_json();
                drop(it);
                let state = PipelineState::from_json(&json).unwrap();
                let mut resumed = pipeline
                    .start_from(&state)
                    .unwrap_or_else(|e| panic!("{desc} at {cut}: {e}"));
                assert_eq!(resumed.epoch(), epoch, "{desc}, cut at {cut}");
                let rest = events(&mut resumed, None);
                assert_eq!(rest, full[cut..], "{desc}, cut at {cut} of {n}");
                assert_eq!(resumed.epoch(), epochs, "{desc}, cut at {cut}");
            }
        }
    });
}

/// A random combination (`sample_from`, `concatenate`, `choose_from`,
/// `zip`, `zip_all`) of two or three random pipelines, itself maybe prefetched and
/// repeated.
fn random_mixture(rng: &mut Rng, patterns: [&str; 2], desc: &mut String) -> Pipeline<Vec<u64>> {
    let k = 2 + rng.below(2) as usize;
    let mut inputs = Vec::new();
    for i in 0..k {
        let pattern = patterns[rng.below(2) as usize];
        let mut d = String::new();
        inputs.push(random_pipeline(rng, pattern, &mut d));
        *desc += &format!("[{i}: {d}] ");
    }
    let mut mixed = match rng.below(4) {
        0 => {
            let weights: Vec<f64> = (0..k).map(|_| 1.0 + rng.below(4) as f64).collect();
            let seed = rng.below(1000);
            let exhausted = if rng.below(2) == 0 {
                Exhausted::Stop
            } else {
                Exhausted::Renormalize
            };
            *desc += &format!("sample_from({weights:?}, {seed}, {exhausted:?})");
            Pipeline::sample_from(inputs, &weights, seed, exhausted)
        }
        1 => {
            *desc += "concatenate";
            let mut inputs = inputs.into_iter();
            let first = inputs.next().unwrap();
            inputs.fold(first, Pipeline::concatenate)
        }
        2 => {
            let selector: Vec<usize> = (0..300).map(|_| rng.below(k as u64) as usize).collect();
            *desc += "choose_from";
            Pipeline::choose_from(inputs, Pipeline::from_vec(selector))
        }
        _ if k == 3 => {
            *desc += "zip_all";
            Pipeline::zip_all(inputs).map(|rows: Vec<Vec<u64>>| rows.concat())
        }
        _ => {
            *desc += "zip";
            let mut inputs = inputs.into_iter();
            let (a, b) = (inputs.next().unwrap(), inputs.next().unwrap());
            a.zip(b).map(|(mut a, b): (Vec<u64>, Vec<u64>)| {
                a.extend(b);
                a
            })
        }
    };
    if rng.below(2) == 0 {
        *desc += ".prefetch(2)";
        mixed = mixed.prefetch(2);
    }
    if rng.below(3) == 0 {
        *desc += ".repeat(2)";
        mixed = mixed.repeat(Some(2));
    }
    mixed
}

/// Mixtures resume exactly: each input at its own position, the sampling
/// RNG, the selector and the cursor, at random cut points.
#[test]
fn a_resumed_mixture_equals_the_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 3, 40, Compression::None, index_record);
    let gz = dir.path().join("gz");
    std::fs::create_dir(&gz).unwrap();
    write_shards(&gz, 2, 30, Compression::Gzip, |i| index_record(1000 + i));
    let plain = dir.path().join("part-*").display().to_string();
    let gzip = gz.join("part-*").display().to_string();
    watchdog(240, move || {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        for _ in 0..24 {
            let mut desc = String::new();
            let pipeline = random_mixture(&mut rng, [&plain, &gzip], &mut desc);
            let mut it = pipeline.start().unwrap();
            let full = events(&mut it, None);
            let epochs = it.epoch();
            let n = full.len() as u64;
            for cut in [1 + rng.below(n), rng.below(n + 1), rng.below(n + 1)] {
                let cut = cut.min(n) as usize;
                let mut it = pipeline.start().unwrap();
                let head = events(&mut it, Some(cut));
                assert_eq!(head, full[..cut], "{desc}");
                let json = it
                    .state()
                    .unwrap_or_else(|e| panic!("{desc}: {e}"))
                    .to_json();
                drop(it);
                let state = PipelineState::from_json(&json).unwrap();
                let mut resumed = pipeline
                    .start_from(&state)
                    .unwrap_or_else(|e| panic!("{desc} at {cut}: {e}"));
                let rest = events(&mut resumed, None);
                assert_eq!(rest, full[cut..], "{desc}, cut at {cut} of {n}");
                assert_eq!(resumed.epoch(), epochs, "{desc}, cut at {cut}");
            }
        }
    });
}

#[test]
fn a_state_for_a_10k_shuffle_buffer_is_small() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 4, 5_000, Compression::None, index_record);
    let pattern = dir.path().join("part-*").display().to_string();
    let pipeline = Pipeline::tfrecord_files([pattern])
        .unwrap()
        .interleave(4, 16)
        .shuffle(10_000, 1)
        .batch(32);
    let (json, rest, expected) = watchdog(60, move || {
        let full: Vec<Vec<Record>> = pipeline.start().unwrap().map(|b| b.unwrap()).collect();
        let mut it = pipeline.start().unwrap();
        it.by_ref().take(10).for_each(drop);
        let json = it.state().unwrap().to_json();
        drop(it);
        let rest: Vec<Vec<u64>> = pipeline
            .start_from(&PipelineState::from_json(&json).unwrap())
            .unwrap()
            .map(|b| ids(&b.unwrap()))
            .collect();
        let expected: Vec<Vec<u64>> = full[10..].iter().map(|b| ids(b)).collect();
        (json, rest, expected)
    });
    assert_eq!(rest, expected);
    // Positions, not bytes: about 16 bytes of JSON per buffered record.
    eprintln!(
        "state for a 10k shuffle buffer: {} bytes of JSON",
        json.len()
    );
    assert!(json.len() < 300_000, "{}", json.len());
}

#[test]
fn stages_that_cannot_be_captured_say_so() {
    let p = Pipeline::from_vec((0..10u32).collect())
        .cache()
        .filter(|x| x % 2 == 0);
    let mut it = p.start().unwrap();
    it.next();
    match it.state() {
        Err(PipelineError::State(StateError::Unsupported { stage, .. })) => {
            assert_eq!(stage, "cache")
        }
        other => panic!("{other:?}"),
    }
    // A state for another pipeline is refused, not silently misapplied.
    let mut it = Pipeline::from_vec((0..10u32).collect()).start().unwrap();
    it.next();
    let state = it.state().unwrap();
    let other = Pipeline::from_vec((0..10u32).collect()).shuffle(3, 1);
    assert!(other.start_from(&state).is_err());
}

/// A record with one int64 feature `id` = `i`, or (every 23rd) bytes that
/// are no protobuf, so the parser emits an error before its batch.
fn id_example(i: u64) -> Vec<u8> {
    use prost::Message;
    use tfpipe::example::Example;
    use tfpipe::example::proto::{Feature, Features, Int64List, feature};
    if i % 23 == 5 {
        return b"\x0a\x05\xff\xff\xff\xff\xff".to_vec();
    }
    let mut features = std::collections::BTreeMap::new();
    features.insert(
        "id".to_string(),
        Feature {
            kind: Some(feature::Kind::Int64List(Int64List {
                value: vec![i as i64],
            })),
        },
    );
    Example {
        features: Some(Features { feature: features }),
    }
    .encode_to_vec()
}

/// What the trainer consumes, as comparable data.
#[derive(Debug, PartialEq)]
enum Step {
    Batch(Vec<i64>),
    Error(String),
    End(u64),
}

fn steps(it: &mut PipelineIter<tfpipe::Batch>, n: Option<usize>) -> Vec<Step> {
    let mut out = Vec::new();
    while n.is_none_or(|n| out.len() < n) {
        match it.next_event() {
            Some(Event::Item(Ok(batch))) => {
                out.push(Step::Batch(batch.columns[0].as_i64().unwrap().to_vec()))
            }
            Some(Event::Item(Err(e))) => out.push(Step::Error(e.to_string())),
            Some(Event::EpochEnd(e)) => out.push(Step::End(e)),
            None => break,
        }
    }
    out
}

/// The CLI trainer's pipeline (interleave, shuffle, batch, parse per
/// batch on two workers, prefetch) as one pipeline for the whole run under
/// `repeat` (where the CLI puts it, and elsewhere): resumed at every cut
/// point (between an error and its batch too), it continues exactly, with
/// the same epoch numbers and per-epoch shuffle.
#[test]
fn the_trainers_pipeline_under_repeat_resumes_at_every_event() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 4, 50, Compression::None, id_example);
    let pattern = dir.path().join("part-*").display().to_string();
    watchdog(240, move || {
        let schema = tfpipe::Schema::from_feature_texts(&["id:int64"]).unwrap();
        // Without the final prefetch, the state is taken at the parser
        // itself at every cut (with it, at prefetch's anchors).
        // `repeat` after the files, after the shuffle (the CLI trainer's
        // `DataOptions::run_pipeline`), or at the end.
        for (repeat_at, prefetch) in [(1, 2), (0, 2), (2, 2), (1, 0)] {
            let mut records = Pipeline::tfrecord_files([&pattern])
                .unwrap()
                .interleave(4, 16);
            if repeat_at == 0 {
                records = records.repeat(Some(3));
            }
            records = records.shuffle(100, 3);
            if repeat_at == 1 {
                records = records.repeat(Some(3));
            }
            let mut pipeline = records
                .batch(16)
                .parse_batches(schema.clone(), Parallelism::Fixed(2))
                .prefetch(prefetch);
            if repeat_at == 2 {
                pipeline = pipeline.repeat(Some(3));
            }
            let full = steps(&mut pipeline.start().unwrap(), None);
            assert!(full.iter().filter(|s| matches!(s, Step::End(_))).count() == 3);
            assert!(full.iter().any(|s| matches!(s, Step::Error(_))));
            for cut in 0..=full.len() {
                let mut it = pipeline.start().unwrap();
                let head = steps(&mut it, Some(cut));
                assert_eq!(head, full[..cut]);
                let json = it
                    .state()
                    .unwrap_or_else(|e| panic!("cut {cut}: {e}"))
                    .to_json();
                drop(it);
                let state = PipelineState::from_json(&json).unwrap();
                let mut resumed = pipeline
                    .start_from(&state)
                    .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
                let rest = steps(&mut resumed, None);
                assert_eq!(rest, full[cut..], "repeat at {repeat_at}, cut {cut}");
            }
        }
    });
}

/// A state names its rank: restoring it on another rank (whose files
/// differ) or into an unranked pipeline is refused, not resumed on the
/// wrong records, and the error says so (3 files for 2 ranks: rank 0 also
/// drops its surplus, so the shapes differ too).
#[test]
fn a_state_is_refused_on_another_rank() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 3, 20, Compression::None, index_record);
    let pattern = dir.path().join("part-*").display().to_string();
    let ranked = |r: usize| {
        Pipeline::tfrecord_files([&pattern])
            .unwrap()
            .rank(Rank::new(r, 2).unwrap(), Remainder::Drop)
            .unwrap()
            .interleave(2, 4)
            .shuffle(8, 1)
    };
    let (zero, one) = (ranked(0), ranked(1));
    let unranked = Pipeline::tfrecord_files([&pattern])
        .unwrap()
        .interleave(2, 4)
        .shuffle(8, 1);
    watchdog(30, move || {
        let take5 = |p: &Pipeline<Record>| {
            let mut it = p.start().unwrap();
            it.by_ref().take(5).for_each(drop);
            it.state().unwrap()
        };
        let (from_zero, from_one, plain) = (take5(&zero), take5(&one), take5(&unranked));
        // Its own rank takes it.
        assert!(zero.start_from(&from_zero).is_ok());
        assert!(one.start_from(&from_one).is_ok());
        for (pipeline, state, taken) in [
            (&one, &from_zero, "rank 0 of 2"),
            (&zero, &from_one, "rank 1 of 2"),
        ] {
            match pipeline.start_from(state) {
                Err(PipelineError::State(StateError::Mismatch { reason: why, .. })) => {
                    assert!(why.contains(&format!("taken on {taken}")), "{why}")
                }
                other => panic!("{:?}", other.err()),
            }
        }
        assert!(one.start_from(&plain).is_err());
        // A state of an earlier version, whose shares were whole files
        // round robin, would resume on other records: refused.
        let json = from_zero.to_json();
        assert!(json.contains(r#""runs":true"#), "{json}");
        let old = PipelineState::from_json(&json.replace(r#","runs":true"#, "")).unwrap();
        match zero.start_from(&old) {
            Err(PipelineError::State(StateError::Mismatch { reason: why, .. })) => {
                assert!(why.contains("earlier version"), "{why}")
            }
            other => panic!("{:?}", other.err()),
        }
    });
}
