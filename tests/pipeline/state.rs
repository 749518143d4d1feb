//! Checkpointable iterator state: a pipeline resumed from the state taken
//! after `k` elements yields exactly what the uninterrupted one yields after
//! its first `k`, over random pipelines (parallel stages included) and cut
//! points.

use tfpipe::PipelineError;
use tfpipe::pipeline::{Interleave, Parallelism, Pipeline, PipelineState, Record, StateError};
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
    *desc += &format!("interleave({options:?})");
    let mut records = Pipeline::tfrecord_files([pattern])
        .unwrap()
        .interleave_with(options);
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
        for case in 0..24 {
            let pattern = if case % 3 == 2 { &gzip } else { &plain };
            let mut desc = String::new();
            let pipeline = random_pipeline(&mut rng, pattern, &mut desc);
            let full: Vec<Vec<u64>> = pipeline.start().unwrap().map(|b| b.unwrap()).collect();
            let n = full.len() as u64;
            for cut in [0, 1 + rng.below(n), rng.below(n + 1), n] {
                let cut = cut.min(n) as usize;
                let mut it = pipeline.start().unwrap();
                let head: Vec<Vec<u64>> = it.by_ref().take(cut).map(|b| b.unwrap()).collect();
                assert_eq!(head, full[..cut], "{desc}");
                let json = it
                    .state()
                    .unwrap_or_else(|e| panic!("{desc}: {e}"))
                    .to_json();
                drop(it);
                let state = PipelineState::from_json(&json).unwrap();
                let rest: Vec<Vec<u64>> = pipeline
                    .start_from(&state)
                    .unwrap_or_else(|e| panic!("{desc} at {cut}: {e}"))
                    .map(|b| b.unwrap())
                    .collect();
                assert_eq!(rest, full[cut..], "{desc}, cut at {cut} of {n}");
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
    let p = Pipeline::from_vec((0..10u32).collect()).filter(|x| x % 2 == 0);
    let mut it = p.start().unwrap();
    it.next();
    match it.state() {
        Err(PipelineError::State(StateError::Unsupported { stage, .. })) => {
            assert_eq!(stage, "filter")
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
