//! Combining pipelines: `zip` and `concatenate` (and `choose_from`) give
//! `tf.data`'s outputs on the same inputs, `sample_from` draws its
//! proportions within a stated bound and the same sequence for a seed, and
//! errors, metrics and epoch markers of the inputs behave as documented.

use std::time::Duration;

use serde_json::{Value, json};
use tfpipe::pipeline::{Event, Exhausted, Pipeline, PipelineError, Record};
use tfpipe::tfrecord::Compression;

use crate::common::{index_record, record_index, watchdog, write_shards};

fn range(a: u64, b: u64) -> Pipeline<u64> {
    Pipeline::from_vec((a..b).collect())
}

fn collect<T: Send + 'static>(p: Pipeline<T>) -> Vec<T> {
    p.start().unwrap().collect::<Result<_, _>>().unwrap()
}

/// Elements as JSON, for comparing with TensorFlow's.
fn json_of<T: Send + 'static>(p: Pipeline<T>, f: impl Fn(T) -> Value) -> Value {
    Value::Array(collect(p).into_iter().map(f).collect())
}

/// `tf.data`'s batch of pairs is a pair of batches.
fn unzip(batch: Vec<(u64, u64)>) -> Value {
    let (a, b): (Vec<u64>, Vec<u64>) = batch.into_iter().unzip();
    json!([a, b])
}

/// tfpipe's pipeline for each case of `scripts/tf_semantics_combine.py`.
fn case(name: &str) -> Value {
    let pair = |(a, b): (u64, u64)| json!([a, b]);
    let one = |x: u64| json!(x);
    let selector = |v: &[usize]| Pipeline::from_vec(v.to_vec());
    match name {
        "zip_equal" => json_of(range(0, 4).zip(range(10, 14)), pair),
        "zip_first_shorter" => json_of(range(0, 3).zip(range(10, 15)), pair),
        "zip_second_shorter" => json_of(range(0, 5).zip(range(10, 12)), pair),
        "zip_empty" => json_of(range(0, 0).zip(range(10, 12)), pair),
        "zip_nested" => json_of(
            range(0, 5).zip(range(10, 15)).zip(range(20, 23)),
            |(ab, c)| json!([pair(ab), c]),
        ),
        "zip_three" => json_of(
            Pipeline::zip_all(vec![range(0, 4), range(10, 13), range(20, 25)]),
            |v| json!(v),
        ),
        "zip_three_empty" => json_of(
            Pipeline::zip_all(vec![range(0, 4), range(10, 10), range(20, 25)]),
            |v| json!(v),
        ),
        "zip_then_batch" => json_of(range(0, 5).zip(range(10, 15)).batch(2), unzip),
        "concatenate" => json_of(range(0, 3).concatenate(range(10, 12)), one),
        "concatenate_empty_first" => json_of(range(0, 0).concatenate(range(0, 3)), one),
        "concatenate_empty_second" => json_of(range(0, 3).concatenate(range(0, 0)), one),
        "concatenate_then_batch" => json_of(range(0, 5).concatenate(range(10, 14)).batch(3), |b| {
            json!(b)
        }),
        "concatenate_repeated_input" => {
            json_of(range(0, 2).repeat(Some(2)).concatenate(range(10, 12)), one)
        }
        "concatenate_skip_take" => {
            json_of(range(0, 5).concatenate(range(10, 15)).skip(3).take(4), one)
        }
        "concatenate_chain" => json_of(
            range(0, 2)
                .concatenate(range(10, 12))
                .concatenate(range(20, 21)),
            one,
        ),
        "zip_of_concatenate" => json_of(
            range(0, 3).concatenate(range(10, 12)).zip(range(100, 110)),
            pair,
        ),
        "choose_from" => json_of(
            Pipeline::choose_from(
                vec![range(0, 3), range(10, 13)],
                selector(&[1, 0, 0, 1, 1, 0]),
            ),
            one,
        ),
        "choose_from_selector_shorter" => json_of(
            Pipeline::choose_from(vec![range(0, 3), range(10, 13)], selector(&[1, 1])),
            one,
        ),
        "choose_from_exhausted_input_stops" => json_of(
            Pipeline::choose_from(
                vec![range(0, 2), range(10, 13)],
                selector(&[0, 1, 0, 0, 1, 1]),
            ),
            one,
        ),
        other => panic!("no tfpipe pipeline for the case {other:?}: add it here"),
    }
}

#[test]
fn zip_concatenate_and_choose_from_give_tf_datas_outputs() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/tf-semantics/combine.json"
    );
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 17, "{}", cases.len());
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let ours = watchdog(10, {
            let name = name.to_string();
            move || case(&name)
        });
        assert_eq!(ours, c["expected"], "case {name}");
    }
}

/// Every draw of a 3-way mixture lands on input `i` with probability
/// `p_i`, independently: over `n` draws the count is binomial, and a count
/// more than 5 standard deviations from `n p_i` has probability below
/// 6e-7. With a fixed seed the test is deterministic; the bound says that
/// the draws are weighted as asked.
#[test]
fn sample_from_draws_each_input_in_proportion_to_its_weight() {
    let weights = [0.5, 0.3, 0.2];
    let n = 100_000u64;
    let counts = watchdog(60, move || {
        let inputs = (0..3u64)
            .map(|i| Pipeline::from_generator(move || std::iter::repeat(i)))
            .collect();
        let mut counts = [0u64; 3];
        for x in Pipeline::sample_from(inputs, &weights, 2024, Exhausted::Stop)
            .take(n)
            .start()
            .unwrap()
        {
            counts[x.unwrap() as usize] += 1;
        }
        counts
    });
    assert_eq!(counts.iter().sum::<u64>(), n);
    let total: f64 = weights.iter().sum();
    for (i, w) in weights.iter().enumerate() {
        let p = w / total;
        let mean = n as f64 * p;
        let sigma = (n as f64 * p * (1.0 - p)).sqrt();
        let off = (counts[i] as f64 - mean).abs();
        assert!(
            off <= 5.0 * sigma,
            "input {i}: {} draws, expected {mean} +- 5 * {sigma:.1}",
            counts[i]
        );
    }
}

fn mixture(seed: u64, exhausted: Exhausted) -> Pipeline<u64> {
    Pipeline::sample_from(
        vec![range(0, 100), range(1000, 1010), range(2000, 2300)],
        &[1.0, 2.0, 1.0],
        seed,
        exhausted,
    )
}

#[test]
fn sample_from_is_the_same_for_a_seed_and_differs_for_another() {
    let (a, b, c) = watchdog(10, || {
        (
            collect(mixture(7, Exhausted::Renormalize)),
            collect(mixture(7, Exhausted::Renormalize)),
            collect(mixture(8, Exhausted::Renormalize)),
        )
    });
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn renormalize_yields_every_element_and_stop_ends_at_the_first_exhausted_draw() {
    let (renormalized, stopped) = watchdog(10, || {
        (
            collect(mixture(3, Exhausted::Renormalize)),
            collect(mixture(3, Exhausted::Stop)),
        )
    });
    let mut sorted = renormalized.clone();
    sorted.sort_unstable();
    let all: Vec<u64> = (0..100).chain(1000..1010).chain(2000..2300).collect();
    assert_eq!(sorted, all, "every element once");
    // Each input keeps its own order.
    for (lo, hi) in [(0, 100), (1000, 1010), (2000, 2300)] {
        let own: Vec<u64> = renormalized
            .iter()
            .copied()
            .filter(|x| (lo..hi).contains(x))
            .collect();
        assert_eq!(own, (lo..hi).collect::<Vec<_>>());
    }
    // The input of 10 (weight 1/2) runs out after about 20 draws; `Stop`
    // ends there, having drawn all 10 of it and no element twice.
    assert!(stopped.len() < 60, "{}", stopped.len());
    assert_eq!(
        stopped.iter().filter(|x| (1000..1010).contains(*x)).count(),
        10
    );
    // Up to the stop, both policies drew the same (the RNG is the same).
    assert_eq!(stopped, renormalized[..stopped.len()]);
}

#[test]
fn configuration_errors_are_reported_at_start() {
    let bad = [
        Pipeline::sample_from(vec![range(0, 1)], &[1.0, 1.0], 0, Exhausted::Stop),
        Pipeline::sample_from(
            vec![range(0, 1), range(0, 1)],
            &[0.0, 0.0],
            0,
            Exhausted::Stop,
        ),
        Pipeline::sample_from(vec![range(0, 1)], &[-1.0], 0, Exhausted::Stop),
        Pipeline::sample_from(Vec::new(), &[], 0, Exhausted::Stop),
        Pipeline::choose_from(Vec::new(), Pipeline::from_vec(vec![0usize])),
        range(0, 2).concatenate(range(0, 2).batch(0).map(|b| b[0])),
    ];
    for (i, p) in bad.iter().enumerate() {
        match p.start() {
            Err(PipelineError::Config { reason, .. }) => assert!(!reason.is_empty()),
            Err(other) => panic!("case {i}: {other}"),
            Ok(_) => panic!("case {i}: started"),
        }
    }
}

#[test]
fn choose_from_reports_a_selector_value_out_of_range_and_goes_on() {
    let got: Vec<Result<u64, PipelineError>> = watchdog(10, || {
        Pipeline::choose_from(
            vec![range(0, 3), range(10, 13)],
            Pipeline::from_vec(vec![0usize, 5, 1]),
        )
        .start()
        .unwrap()
        .collect()
    });
    assert_eq!(got.len(), 3);
    assert_eq!(*got[0].as_ref().unwrap(), 0);
    let message = got[1].as_ref().unwrap_err().to_string();
    assert!(
        message.contains("selector value 5 is out of range for 2 inputs"),
        "{message}"
    );
    assert_eq!(*got[2].as_ref().unwrap(), 10);
}

/// An error from one input names that input and its first file, keeps its
/// location, and the mixture goes on with the other input.
#[test]
fn an_input_error_names_its_source_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = write_shards(dir.path(), 1, 20, Compression::None, index_record);
    let bad = dir.path().join("bad.tfrecord");
    let mut bytes = std::fs::read(&good[0]).unwrap();
    bytes.truncate(24 * 5 + 5); // five whole records (24 bytes framed), then a cut header
    std::fs::write(&bad, &bytes).unwrap();
    let open = |p: &std::path::Path| {
        Pipeline::tfrecord_files([p.display().to_string()])
            .unwrap()
            .records()
    };
    let mixed = Pipeline::sample_from(
        vec![open(&good[0]), open(&bad)],
        &[1.0, 1.0],
        5,
        Exhausted::Renormalize,
    );
    let got: Vec<Result<Record, PipelineError>> =
        watchdog(10, move || mixed.start().unwrap().collect());
    let errors: Vec<&PipelineError> = got.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    let error = errors[0];
    let PipelineError::Source { input, origin, .. } = error else {
        panic!("not a source error: {error:?}");
    };
    assert_eq!(input, "sample_from[1]");
    assert_eq!(origin.as_deref(), Some(bad.display().to_string().as_str()));
    assert_eq!(error.location().map(|l| l.record), Some(5));
    assert_eq!(error.stage(), Some("sample_from[1]/tfrecord"));
    assert!(matches!(error.innermost(), PipelineError::Record { .. }));
    let message = error.to_string();
    assert!(message.starts_with("sample_from[1] (reading "), "{message}");
    assert_eq!(
        got.iter().filter(|r| r.is_ok()).count(),
        25,
        "the other input reads on"
    );
}

/// Each input's stages are listed under its own name, and the report names
/// the input the mixture waited on longest (here the one with a slow map).
#[test]
fn metrics_name_each_inputs_stages_and_the_starving_input() {
    let metrics = watchdog(20, || {
        let fast = range(0, 10_000).map(|x| x + 1);
        let slow = range(0, 10_000).map(|x| {
            std::thread::sleep(Duration::from_micros(200));
            x
        });
        let mut it = Pipeline::sample_from(vec![fast, slow], &[0.5, 0.5], 1, Exhausted::Stop)
            .take(400)
            .start()
            .unwrap();
        it.by_ref().for_each(|x| {
            x.unwrap();
        });
        it.metrics()
    });
    let names: Vec<&str> = metrics.stages.iter().map(|s| s.name.as_str()).collect();
    for name in [
        "sample_from[0]/from_vec",
        "sample_from[0]/map",
        "sample_from[0]",
        "sample_from[1]/map",
        "sample_from[1]",
        "sample_from",
        "take",
    ] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
    // Upstream first: an input's stages, then its row, then the mixture.
    let at = |n: &str| names.iter().position(|x| *x == n).unwrap();
    assert!(at("sample_from[0]/map") < at("sample_from[0]"));
    assert!(at("sample_from[1]") < at("sample_from"));
    let taken: u64 = ["sample_from[0]", "sample_from[1]"]
        .iter()
        .map(|n| metrics.stage(n).unwrap().elements_out)
        .sum();
    assert_eq!(taken, 400);
    // Each input's row: what the mixture took from it, in and out; the
    // mixture's own row: every element it took in and handed on.
    for input in ["sample_from[0]", "sample_from[1]"] {
        let row = metrics.stage(input).unwrap();
        assert!(
            row.elements_in == row.elements_out && row.elements_in > 100,
            "{row:?}"
        );
    }
    let mix = metrics.stage("sample_from").unwrap();
    assert_eq!((mix.elements_in, mix.elements_out), (400, 400), "{mix:?}");
    assert_eq!(
        metrics.starving_input().map(|s| s.name.as_str()),
        Some("sample_from[1]")
    );
    assert_eq!(metrics.bottleneck_stage(), Some("sample_from[1]/map"));
    let table = metrics.to_string();
    assert!(
        table.contains("starving: input sample_from[1]")
            && table.contains("its busiest stage is sample_from[1]/map"),
        "{table}"
    );
}

/// Inputs' epoch markers are not forwarded; a repeated mixture marks its
/// own epochs, and each epoch draws a new sequence.
#[test]
fn inputs_epoch_markers_are_dropped_and_the_mixture_marks_its_own() {
    let events = watchdog(10, || {
        let inputs = vec![range(0, 3).repeat(Some(2)), range(10, 12)];
        let mut it = Pipeline::sample_from(inputs, &[1.0, 1.0], 9, Exhausted::Renormalize)
            .repeat(Some(2))
            .start()
            .unwrap();
        let mut events = Vec::new();
        while let Some(event) = it.next_event() {
            events.push(match event {
                Event::Item(x) => Some(x.unwrap()),
                Event::EpochEnd(_) => None,
            });
        }
        events
    });
    let ends: Vec<usize> = (0..events.len()).filter(|&i| events[i].is_none()).collect();
    assert_eq!(ends, [8, 17], "{events:?}");
    let first: Vec<u64> = events[..8].iter().flatten().copied().collect();
    let second: Vec<u64> = events[9..17].iter().flatten().copied().collect();
    let sorted = |mut v: Vec<u64>| {
        v.sort_unstable();
        v
    };
    assert_eq!(sorted(first.clone()), [0, 0, 1, 1, 2, 2, 10, 11]);
    assert_eq!(sorted(second.clone()), [0, 0, 1, 1, 2, 2, 10, 11]);
    assert_ne!(first, second, "each epoch draws anew");
}

/// A mixture over TFRecord sources with their own parallel interleave and
/// prefetch threads: every thread is joined when the iterator is dropped
/// early.
#[test]
fn dropping_a_mixture_early_joins_its_inputs_threads() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 4, 500, Compression::None, index_record);
    let pattern = dir.path().join("part-*").display().to_string();
    let live = watchdog(20, move || {
        let source = |seed| {
            Pipeline::tfrecord_files([pattern.as_str()])
                .unwrap()
                .interleave(2, 4)
                .shuffle(50, seed)
                .prefetch(4)
        };
        let mut it =
            Pipeline::sample_from(vec![source(1), source(2)], &[0.5, 0.5], 3, Exhausted::Stop)
                .start()
                .unwrap();
        let first: Vec<u64> = it
            .by_ref()
            .take(10)
            .map(|r| record_index(&r.unwrap()))
            .collect();
        assert_eq!(first.len(), 10);
        let live = it.live_threads();
        assert!(live.get() > 0);
        drop(it);
        live.get()
    });
    assert_eq!(live, 0);
}
