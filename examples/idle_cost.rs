//! What a pause costs the work right after it, with no server, thread
//! hand-off or I/O (docs/benchmarks.md, "Where the first batch-1 request's
//! extra 20-35 µs goes").
//!
//! `cargo run --release --example idle_cost -- [ROUNDS]` (by default 200)
//! times four kinds of work, each about as long as a batch-1 forward pass
//! of the served MLP: arithmetic alone (4,000 dependent multiply-adds); one
//! read per cache line of an 800 KB array, the size of that MLP's first
//! layer; that read handed to another thread and its answer handed back
//! over channels, as `tfpipe serve` hands a request to its compute thread;
//! and the same through a second thread in between, as a request crosses
//! from the client to a connection thread to the compute thread and back.
//! In every round the work runs 20 times back to back, once more
//! timed, then once after sleeping; it prints the medians of the timed
//! back-to-back run and of the run after the pause, for pauses from 0 to
//! 20 ms. Work that runs at the same speed after a pause, where reading the
//! same memory does not, says that the pause cost the core its caches, not
//! its clock.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tfpipe::spawn::Thread;

/// Floats in the array: 800 KB.
const FLOATS: usize = 200_000;

/// One `f32` in 16: one read per 64-byte cache line.
const STRIDE: usize = 16;

fn arithmetic() -> f64 {
    let mut x = 1.0f64;
    for _ in 0..4_000 {
        x = black_box(x) * 1.000_000_1 + 0.5;
    }
    x
}

fn read_lines(weights: &[f32]) -> f32 {
    weights.iter().step_by(STRIDE).map(|&w| black_box(w)).sum()
}

fn timed(work: &mut impl FnMut()) -> Duration {
    let start = Instant::now();
    work();
    start.elapsed()
}

fn median(xs: &mut [Duration]) -> f64 {
    xs.sort();
    xs[xs.len() / 2].as_secs_f64() * 1e6
}

/// The medians, µs, of `work` back to back and right after `pause`.
fn back_to_back_and_after(rounds: usize, pause: Duration, work: &mut impl FnMut()) -> (f64, f64) {
    let mut warm = Vec::with_capacity(rounds);
    let mut after = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        for _ in 0..20 {
            work();
        }
        warm.push(timed(work));
        std::thread::sleep(pause);
        after.push(timed(work));
    }
    (median(&mut warm), median(&mut after))
}

fn main() {
    let rounds = match std::env::args().nth(1).map(|s| s.parse::<usize>()) {
        None => 200,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: idle_cost [ROUNDS]");
            std::process::exit(2);
        }
    };
    let weights: Vec<f32> = (0..FLOATS).map(|i| i as f32).collect();
    println!("| work | pause | back to back | after the pause | ratio |");
    println!("| --- | --- | --- | --- | --- |");
    report("arithmetic", rounds, &mut || {
        black_box(arithmetic());
    });
    report("800 KB, a read per line", rounds, &mut || {
        black_box(read_lines(&weights));
    });
    let (to_reader, requests) = crossbeam_channel::bounded::<()>(1);
    let (to_caller, answers) = crossbeam_channel::bounded::<f32>(1);
    let shared: Arc<[f32]> = weights.into();
    let reader = Thread::spawn("idle-cost-reader", move |_| {
        for () in requests {
            let _ = to_caller.send(read_lines(&shared));
        }
    })
    .expect("start the reading thread");
    report("the same, on another thread", rounds, &mut || {
        to_reader.send(()).expect("the reader is running");
        black_box(answers.recv().expect("the reader answers"));
    });
    // As a request goes: client to connection thread, to compute thread,
    // and back the same way.
    let (to_relay, relayed) = crossbeam_channel::bounded::<()>(1);
    let (relay_answer, relay_answers) = crossbeam_channel::bounded::<f32>(1);
    let (onward, back) = (to_reader.clone(), answers.clone());
    let relay = Thread::spawn("idle-cost-relay", move |_| {
        for () in relayed {
            let Ok(()) = onward.send(()) else { return };
            let Ok(sum) = back.recv() else { return };
            let _ = relay_answer.send(sum);
        }
    })
    .expect("start the relaying thread");
    report("the same, through a second thread", rounds, &mut || {
        to_relay.send(()).expect("the relay is running");
        black_box(relay_answers.recv().expect("the relay answers"));
    });
    drop(to_relay);
    relay.join().expect("the relay ends");
    drop(to_reader);
    reader.join().expect("the reader ends");
}

/// One table row per pause for `work`.
fn report(name: &str, rounds: usize, work: &mut impl FnMut()) {
    for us in [0u64, 50, 200, 500, 1_000, 5_000, 20_000] {
        let (warm, after) = back_to_back_and_after(rounds, Duration::from_micros(us), work);
        println!(
            "| {name} | {us} µs | {warm:.2} µs | {after:.2} µs | {:.2}x |",
            after / warm
        );
    }
}
