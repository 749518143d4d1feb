//! The memory bound of the module docs, shown with a drop-counting element.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tfpipe::pipeline::{Parallelism, Pipeline};

use crate::common::watchdog;

/// Counts live instances and the peak.
#[derive(Default)]
struct Census {
    live: AtomicUsize,
    peak: AtomicUsize,
    created: AtomicUsize,
}

struct Counted {
    census: Arc<Census>,
}

impl Counted {
    fn new(census: &Arc<Census>) -> Counted {
        let live = census.live.fetch_add(1, Ordering::SeqCst) + 1;
        census.peak.fetch_max(live, Ordering::SeqCst);
        census.created.fetch_add(1, Ordering::SeqCst);
        Counted {
            census: Arc::clone(census),
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.census.live.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn live_elements_stay_within_the_documented_bound() {
    let census = Arc::new(Census::default());
    let c = Arc::clone(&census);
    let (shuffle, workers, batch, prefetch) = (64usize, 2usize, 8usize, 3usize);
    let window = 2 * workers + 2;
    let p = Pipeline::from_generator(move || {
        let c = Arc::clone(&c);
        (0..5_000).map(move |_| Counted::new(&c))
    })
    .shuffle(shuffle, 9)
    .map_parallel(Parallelism::Fixed(workers), |x: Counted| {
        Ok::<_, std::convert::Infallible>(x)
    })
    .batch(batch)
    .prefetch(prefetch);
    let count = watchdog(20, move || {
        let mut n = 0;
        for (i, b) in p.start().unwrap().enumerate() {
            n += b.unwrap().len();
            if i < 40 {
                // A slow consumer: every buffer fills up.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        n
    });
    assert_eq!(count, 5_000);
    // The formula from the module docs, term by term.
    let bound = (shuffle + 1) + batch + (prefetch + 2) * batch + (window + workers) + batch;
    let peak = census.peak.load(Ordering::SeqCst);
    assert!(peak <= bound, "peak {peak} live elements > bound {bound}");
    assert!(peak > shuffle, "the buffers did fill (peak {peak})");
    assert_eq!(
        census.live.load(Ordering::SeqCst),
        0,
        "every element dropped exactly once"
    );
    assert_eq!(census.created.load(Ordering::SeqCst), 5_000);
}

#[test]
fn dropping_mid_stream_drops_every_buffered_element() {
    let census = Arc::new(Census::default());
    let c = Arc::clone(&census);
    let p = Pipeline::from_generator(move || {
        let c = Arc::clone(&c);
        (0..100_000).map(move |_| Counted::new(&c))
    })
    .shuffle(500, 1)
    .map_parallel(Parallelism::Auto, |x: Counted| {
        Ok::<_, std::convert::Infallible>(x)
    })
    .prefetch(10);
    watchdog(20, move || {
        let mut it = p.start().unwrap();
        for _ in 0..100 {
            it.next().unwrap().unwrap();
        }
    });
    assert_eq!(census.live.load(Ordering::SeqCst), 0);
}
