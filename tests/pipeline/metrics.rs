//! Stage metrics: counts, the bottleneck, autotuning.

use std::time::Duration;

use tfpipe::pipeline::{Parallelism, Pipeline};

use crate::common::watchdog;

#[test]
fn counts_and_bottleneck_name_the_slow_stage() {
    let metrics = watchdog(20, || {
        let mut it = Pipeline::from_vec((0..200u32).collect())
            .shuffle(20, 1)
            .map(|x: u32| {
                std::thread::sleep(Duration::from_micros(300));
                x
            })
            .batch(10)
            .prefetch(2)
            .start()
            .unwrap();
        let batches = it.by_ref().count();
        assert_eq!(batches, 20);
        it.metrics()
    });
    let names: Vec<&str> = metrics.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["from_vec", "shuffle", "map", "batch", "prefetch"]);
    let shuffle = metrics.stage("shuffle").unwrap();
    assert_eq!((shuffle.elements_in, shuffle.elements_out), (200, 200));
    assert!(shuffle.first_output_ns > 0, "fill time recorded");
    let batch = metrics.stage("batch").unwrap();
    assert_eq!((batch.elements_in, batch.elements_out), (200, 20));
    assert!(metrics.stage("map").unwrap().busy_ns >= 200 * 300_000);
    assert_eq!(metrics.bottleneck_stage(), Some("map"));
    let table = metrics.to_string();
    assert!(table.contains("bottleneck: map"), "{table}");
    assert!(metrics.stage("prefetch").unwrap().wait_in_ns > 0);
}

#[test]
fn metrics_are_readable_while_running_and_after() {
    watchdog(20, || {
        let mut it = Pipeline::from_generator(|| 0u64..)
            .map_parallel(2, |x: u64| Ok::<_, std::convert::Infallible>(x))
            .prefetch(4)
            .start()
            .unwrap();
        let handle = it.metrics_handle();
        for _ in 0..1000 {
            it.next().unwrap().unwrap();
        }
        let during = handle.snapshot();
        assert!(during.stage("map").unwrap().elements_out >= 1000);
        drop(it);
        let after = handle.snapshot();
        assert!(
            after.stage("map").unwrap().elements_out >= during.stage("map").unwrap().elements_out
        );
    });
}

#[test]
fn duplicate_stage_names_are_numbered() {
    let metrics = watchdog(10, || {
        let mut it = Pipeline::from_vec(vec![1u8])
            .map(|x| x)
            .map(|x| x)
            .start()
            .unwrap();
        it.by_ref().for_each(drop);
        it.metrics()
    });
    assert!(metrics.stage("map").is_some() && metrics.stage("map.2").is_some());
}

#[test]
fn auto_parallelism_grows_for_a_slow_map() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (parallelism, n) = watchdog(20, || {
        let mut it = Pipeline::from_generator(|| 0u64..400)
            .map_parallel(Parallelism::Auto, |x: u64| {
                std::thread::sleep(Duration::from_millis(1));
                Ok::<_, std::convert::Infallible>(x)
            })
            .start()
            .unwrap();
        let n = it.by_ref().count();
        (it.metrics().stage("map").unwrap().parallelism, n)
    });
    assert_eq!(n, 400);
    assert!(parallelism as usize <= cores.max(1));
    if cores >= 2 {
        // The consumer always waits on a sleeping map: Auto must add workers.
        assert!(
            parallelism >= 2,
            "autotuned to {parallelism} on {cores} cores"
        );
    }
}

/// Exclusive time: interleave does not count its inputs' work as its own,
/// so the bottleneck is the slow nested source, in both modes.
#[test]
fn bottleneck_is_the_nested_source_not_the_interleave() {
    use tfpipe::pipeline::Interleave;
    for options in [
        Interleave::new(2, 4),
        Interleave::new(2, 4).parallel(Parallelism::Fixed(2)),
    ] {
        let metrics = watchdog(20, move || {
            let mut it = Pipeline::from_vec(vec![0u64, 1, 2, 3])
                .interleave(options, |f| {
                    Pipeline::from_generator(move || {
                        (0..50u64).map(move |k| {
                            std::thread::sleep(Duration::from_micros(200));
                            f * 100 + k
                        })
                    })
                })
                .start()
                .unwrap();
            assert_eq!(it.by_ref().count(), 200);
            it.metrics()
        });
        let generator = metrics.stage("generator").unwrap();
        let interleave = metrics.stage("interleave").unwrap();
        assert!(generator.busy_ns >= 200 * 200_000, "{metrics}");
        assert!(
            interleave.busy_ns < generator.busy_ns / 4,
            "interleave counted its inputs' time: {metrics}"
        );
        assert_eq!(metrics.bottleneck_stage(), Some("generator"), "{metrics}");
    }
}
