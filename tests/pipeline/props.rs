//! Property tests: permutations, batch shapes, epochs, shards, determinism.

use proptest::prelude::*;
use tfpipe::pipeline::{Event, Interleave, MapOptions, Parallelism, Pipeline, ShuffleOptions};

use crate::common::watchdog;

fn collect<T: Send + 'static>(p: Pipeline<T>) -> Vec<T> {
    watchdog(20, move || p.start().unwrap().map(|r| r.unwrap()).collect())
}

/// Elements per epoch, split at the epoch markers.
fn epochs<T: Send + 'static>(p: Pipeline<T>) -> Vec<Vec<T>> {
    watchdog(20, move || {
        let mut it = p.start().unwrap();
        let mut out = vec![Vec::new()];
        while let Some(ev) = it.next_event() {
            match ev {
                Event::Item(x) => out.last_mut().unwrap().push(x.unwrap()),
                Event::EpochEnd(e) => {
                    assert_eq!(e as usize, out.len() - 1, "epochs are numbered in order");
                    out.push(Vec::new());
                }
            }
        }
        assert!(
            out.pop().unwrap().is_empty(),
            "nothing after the last marker"
        );
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn shuffle_batch_is_a_permutation_per_epoch(
        n in 0u32..400, buffer in 1usize..300, seed: u64, batch in 1usize..50, early: bool,
    ) {
        let p = Pipeline::from_vec((0..n).collect())
            .shuffle_with(ShuffleOptions { buffer_size: buffer, seed, early_start: early, ..Default::default() })
            .batch(batch)
            .repeat(Some(2));
        let got = epochs(p);
        prop_assert_eq!(got.len(), 2);
        for epoch in &got {
            let mut flat: Vec<u32> = epoch.iter().flatten().copied().collect();
            flat.sort_unstable();
            prop_assert_eq!(flat, (0..n).collect::<Vec<_>>());
        }
        if n > 20 && buffer > 5 {
            prop_assert_ne!(&got[0], &got[1], "reshuffled each epoch");
        }
    }

    #[test]
    fn batch_sizes_and_remainders(n in 0usize..300, size in 1usize..40, drop_remainder: bool) {
        let got = collect(Pipeline::from_vec((0..n).collect()).batch_with(size, drop_remainder));
        let full = n / size;
        let rem = n % size;
        let expect = full + usize::from(rem > 0 && !drop_remainder);
        prop_assert_eq!(got.len(), expect);
        for (i, b) in got.iter().enumerate() {
            let want = if i < full { size } else { rem };
            prop_assert_eq!(b.len(), want);
            prop_assert_eq!(b[0], i * size);
        }
    }

    #[test]
    fn repeat_marks_every_epoch(n in 0u32..50, count in 1u64..5, size in 1usize..8) {
        let got = epochs(Pipeline::from_vec((0..n).collect()).batch(size).repeat(Some(count)));
        prop_assert_eq!(got.len() as u64, count);
        for epoch in got {
            prop_assert_eq!(epoch.into_iter().flatten().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
        }
    }

    #[test]
    fn shards_are_disjoint_and_cover(n in 0u32..200, shards in 1usize..9) {
        let mut all = Vec::new();
        for i in 0..shards {
            let part = collect(Pipeline::from_vec((0..n).collect()).shard(shards, i));
            prop_assert!(part.iter().all(|x| *x as usize % shards == i));
            all.extend(part);
        }
        all.sort_unstable();
        prop_assert_eq!(all, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn order_is_identical_for_every_parallelism(seed: u64, n in 0u64..600, jitter in 0u64..3) {
        let run = |par: Parallelism, ipar: Option<Parallelism>| {
            let mut inter = Interleave::new(3, 4);
            inter.parallelism = ipar;
            let p = Pipeline::from_vec((0..7u64).collect())
                .interleave(inter, move |f| Pipeline::from_vec((0..n / 7 + f).map(|k| f * 1000 + k).collect()))
                .shuffle(50, seed)
                .map_parallel_with(
                    MapOptions { parallelism: par, deterministic: true },
                    || (),
                    move |_, x: u64| {
                        if jitter > 0 && x.is_multiple_of(7) {
                            std::thread::sleep(std::time::Duration::from_micros(x % 50));
                        }
                        Ok::<_, std::convert::Infallible>(x * 3)
                    },
                )
                .batch(16)
                .prefetch(2);
            collect(p)
        };
        let reference = run(Parallelism::Fixed(1), None);
        prop_assert_eq!(&run(Parallelism::Fixed(1), None), &reference, "same every run");
        prop_assert_eq!(&run(Parallelism::Fixed(3), Some(Parallelism::Fixed(2))), &reference);
        prop_assert_eq!(&run(Parallelism::Auto, Some(Parallelism::Auto)), &reference);
    }
}

#[test]
fn nondeterministic_map_keeps_every_element_and_epoch() {
    let p = Pipeline::from_vec((0..500u32).collect())
        .repeat(Some(3))
        .map_parallel_with(
            MapOptions {
                parallelism: Parallelism::Fixed(4),
                deterministic: false,
            },
            || (),
            |_, x: u32| {
                if x.is_multiple_of(13) {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                Ok::<_, std::convert::Infallible>(x)
            },
        );
    let got = epochs(p);
    assert_eq!(got.len(), 3);
    for mut epoch in got {
        epoch.sort_unstable();
        assert_eq!(epoch, (0..500).collect::<Vec<_>>());
    }
}

#[test]
fn nondeterministic_interleave_keeps_every_element() {
    let inter = Interleave::new(4, 2).parallel(3).deterministic(false);
    let p = Pipeline::from_vec((0..10u32).collect()).interleave(inter, |f| {
        Pipeline::from_vec((0..37).map(|k| f * 100 + k).collect())
    });
    let mut got = collect(p);
    got.sort_unstable();
    let mut want: Vec<u32> = (0..10)
        .flat_map(|f| (0..37).map(move |k| f * 100 + k))
        .collect();
    want.sort_unstable();
    assert_eq!(got, want);
}

#[test]
fn take_skip_filter_compose() {
    let got = collect(
        Pipeline::from_generator(|| 0..100u32)
            .filter(|x| x % 3 == 0)
            .skip(2)
            .take(4)
            .map(|x| x + 1),
    );
    assert_eq!(got, [7, 10, 13, 16]);
}

#[test]
fn take_after_forever_repeat_ends() {
    let got = collect(Pipeline::from_vec(vec![1u8, 2]).repeat(None).take(5));
    assert_eq!(got, [1, 2, 1, 2, 1]);
}

#[test]
fn one_shot_iterator_runs_once_under_repeat() {
    let got = collect(Pipeline::from_iterator(vec![1, 2]).repeat(Some(3)));
    assert_eq!(got, [1, 2]);
}

#[test]
fn padded_batch_pads_to_fixed_shape_and_rejects_longer_rows() {
    use tfpipe::pipeline::PaddedShape;
    let got = watchdog(10, || {
        Pipeline::from_vec(vec![vec![1u8], vec![2, 3], vec![4, 5, 6, 7]])
            .padded_batch(2, PaddedShape::Fixed(3), 9, false)
            .start()
            .unwrap()
            .collect::<Vec<_>>()
    });
    let first = got[0].as_ref().unwrap();
    assert_eq!(first.values, [1, 9, 9, 2, 3, 9]);
    assert_eq!(first.row(1), [2, 3, 9]);
    let err = got[1].as_ref().unwrap_err();
    assert_eq!(err.stage(), Some("padded_batch"));
}

#[test]
fn invalid_settings_fail_at_start() {
    assert!(Pipeline::from_vec(vec![1]).batch(0).start().is_err());
    assert!(Pipeline::from_vec(vec![1]).shuffle(0, 1).start().is_err());
    assert!(Pipeline::from_vec(vec![1]).shard(2, 2).start().is_err());
    let err = Pipeline::from_vec(vec![1])
        .map_parallel(0, |x: i32| Ok::<_, std::convert::Infallible>(x))
        .start()
        .err()
        .unwrap();
    assert!(err.to_string().contains("parallelism"), "{err}");
}

#[test]
fn memory_cache_replays_without_rereading() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let got = collect(
        Pipeline::from_generator(move || {
            c.fetch_add(1, Ordering::SeqCst);
            0..4u32
        })
        .cache()
        .shuffle(4, 1)
        .repeat(Some(3)),
    );
    assert_eq!(got.len(), 12);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn handles_can_move_between_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<tfpipe::pipeline::PipelineIter<tfpipe::Batch>>();
    send_sync::<tfpipe::pipeline::MetricsHandle>();
    send_sync::<Pipeline<tfpipe::Batch>>();
}

#[test]
fn early_start_shuffle_emits_before_the_buffer_is_full() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Normal mode fills the 1,000 slots, then the 1,001st pull swaps out the first output.
    for (early_start, max_pulls_before_first) in [(true, 2), (false, 1001)] {
        let pulls = Arc::new(AtomicUsize::new(0));
        let p2 = Arc::clone(&pulls);
        let p = Pipeline::from_generator(move || {
            let p2 = Arc::clone(&p2);
            (0..5000u32).inspect(move |_| {
                p2.fetch_add(1, Ordering::SeqCst);
            })
        })
        .shuffle_with(ShuffleOptions {
            buffer_size: 1000,
            seed: 5,
            early_start,
            ..Default::default()
        });
        let (seen, all) = watchdog(10, move || {
            let mut it = p.start().unwrap();
            it.next().unwrap().unwrap();
            let seen = pulls.load(Ordering::SeqCst);
            let mut all: Vec<u32> = it.map(|r| r.unwrap()).collect();
            all.push(0); // stand-in for the first; only the count matters
            (seen, all.len())
        });
        assert_eq!(seen, max_pulls_before_first, "early_start = {early_start}");
        assert_eq!(all, 5000);
    }
}

#[test]
fn interleave_after_repeat_keeps_epochs_apart() {
    for parallelism in [None, Some(Parallelism::Fixed(2)), Some(Parallelism::Auto)] {
        let mut options = Interleave::new(3, 2);
        options.parallelism = parallelism;
        let p = Pipeline::from_vec((0..5u32).collect())
            .repeat(Some(3))
            .interleave(options, |f| {
                Pipeline::from_vec((0..7).map(|k| f * 10 + k).collect())
            })
            .map_parallel(2, |x: u32| Ok::<_, std::convert::Infallible>(x));
        let got = epochs(p);
        assert_eq!(got.len(), 3, "{parallelism:?}");
        assert!(got.iter().all(|e| e == &got[0]), "every epoch alike");
        let mut first = got[0].clone();
        first.sort_unstable();
        let want: Vec<u32> = (0..5)
            .flat_map(|f| (0..7).map(move |k| f * 10 + k))
            .collect();
        assert_eq!(first, want);
    }
}
