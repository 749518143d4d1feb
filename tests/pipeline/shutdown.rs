//! Dropping a pipeline mid-stream stops and joins every thread, promptly.

use std::time::{Duration, Instant};

use tfpipe::pipeline::{Interleave, Parallelism, Pipeline};

use crate::common::watchdog;

#[test]
fn dropping_mid_epoch_joins_every_thread() {
    watchdog(20, || {
        let p = Pipeline::from_vec((0..40u64).collect())
            .interleave(Interleave::new(4, 8).parallel(Parallelism::Fixed(2)), |f| {
                Pipeline::from_generator(move || (0..1_000_000u64).map(move |k| f * 10_000_000 + k))
            })
            .prefetch(4)
            .shuffle(1000, 3)
            .map_parallel(Parallelism::Fixed(3), |x: u64| {
                Ok::<_, std::convert::Infallible>(x)
            })
            .batch(32)
            .prefetch(2)
            .repeat(None);
        let mut it = p.start().unwrap();
        for _ in 0..50 {
            it.next().unwrap().unwrap();
        }
        let live = it.live_threads();
        // 4 interleave producers + 2 prefetch + 3 map workers.
        assert!(live.get() >= 5, "threads are running: {}", live.get());
        let t = Instant::now();
        drop(it);
        assert_eq!(live.get(), 0, "every thread joined");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "drop took {:?}",
            t.elapsed()
        );
    });
}

#[test]
fn dropping_during_a_long_shuffle_fill_is_prompt() {
    watchdog(20, || {
        // An endless source into a huge shuffle buffer on a prefetch thread:
        // the fill would never end; the cancel flag must stop it.
        let p = Pipeline::from_generator(|| 0u64..)
            .shuffle(usize::MAX / 2, 1)
            .prefetch(1);
        let it = p.start().unwrap();
        let live = it.live_threads();
        std::thread::sleep(Duration::from_millis(30));
        let t = Instant::now();
        drop(it);
        assert_eq!(live.get(), 0);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "drop took {:?}",
            t.elapsed()
        );
    });
}

#[test]
fn dropping_with_blocked_producers_and_slow_map_is_prompt() {
    watchdog(20, || {
        let p = Pipeline::from_generator(|| 0u64..)
            .map_parallel(Parallelism::Auto, |x: u64| {
                std::thread::sleep(Duration::from_millis(1));
                Ok::<_, std::convert::Infallible>(x)
            })
            .prefetch(8);
        let mut it = p.start().unwrap();
        it.next().unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(20)); // producers fill and block
        let live = it.live_threads();
        let t = Instant::now();
        drop(it);
        assert_eq!(live.get(), 0);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "drop took {:?}",
            t.elapsed()
        );
    });
}

#[test]
fn finishing_normally_joins_every_thread() {
    watchdog(20, || {
        let mut it = Pipeline::from_vec((0..1000u32).collect())
            .map_parallel(2, |x: u32| Ok::<_, std::convert::Infallible>(x))
            .prefetch(3)
            .start()
            .unwrap();
        let live = it.live_threads();
        assert_eq!(it.by_ref().count(), 1000);
        assert_eq!(live.get(), 0, "threads joined at the end, before the drop");
    });
}

/// A stop from another thread ends a `next` that is blocked filling a shuffle
/// buffer from an endless source, and the iterator then drops promptly.
#[test]
fn stop_handle_ends_a_blocked_next_from_another_thread() {
    watchdog(20, || {
        let mut it = Pipeline::from_generator(|| 0u64..)
            .shuffle(usize::MAX / 2, 1)
            .start()
            .unwrap();
        let stop = it.stop_handle();
        let stopper = tfpipe::spawn::Thread::spawn("stopper", move |_| {
            std::thread::sleep(Duration::from_millis(30));
            stop.stop();
        })
        .unwrap();
        let t = Instant::now();
        assert!(it.next().is_none(), "a stopped stream ends");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        stopper.join().unwrap();
        let live = it.live_threads();
        drop(it);
        assert_eq!(live.get(), 0);
    });
}
