//! The floor under a shuffle buffer's fill (docs/benchmarks.md, "Issue 22,
//! item by item"): the memory alone, with no file, CRC, parse or pipeline.
//!
//! `cargo run --release --example fill_floor -- [RECORDS] [BYTES] [THREADS]`
//! (by default 100000 826 2: a 100k buffer of the benchmark's MNIST-like
//! records, filled by two readers) allocates RECORDS buffers of BYTES bytes,
//! one allocation each as the readers' records are, spread over THREADS
//! threads, and writes every byte. A fresh process's heap is fresh memory,
//! so every page is faulted in on first touch: that is what a full fill pays
//! however fast its reading is. It prints the wall time and the process's
//! CPU time (user + system).

#[path = "common/cpu.rs"]
mod cpu;

use std::time::Instant;

use tfpipe::spawn::Thread;

use cpu::cpu_seconds;

fn arg(args: &[String], i: usize, default: usize) -> Result<usize, String> {
    match args.get(i) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| {
            format!("usage: fill_floor [RECORDS] [BYTES] [THREADS]; not a count: {s}")
        }),
    }
}

/// Allocates `count` buffers of `bytes` bytes and writes each; returns them
/// so that nothing is freed (and reused) before the clock stops.
fn fill(count: usize, bytes: usize) -> Vec<Vec<u8>> {
    (0..count).map(|i| vec![i as u8 | 1; bytes]).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let records = arg(&args, 0, 100_000)?;
    let bytes = arg(&args, 1, 826)?;
    let threads = arg(&args, 2, 2)?.max(1);
    let cpu = || {
        let (user, system) = cpu_seconds();
        user + system
    };
    let (cpu0, start) = (cpu(), Instant::now());
    let workers = (0..threads)
        .map(|t| {
            let share = records / threads + usize::from(t < records % threads);
            Thread::spawn(format!("fill-{t}"), move |_| fill(share, bytes))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut held = Vec::with_capacity(threads);
    for worker in workers {
        held.push(worker.join()?);
    }
    let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu() - cpu0);
    let total: usize = held.iter().map(Vec::len).sum();
    println!(
        "{total} buffers of {bytes} bytes ({:.1} MB) on {threads} threads: {:.1} ms wall, {:.1} ms CPU",
        (total * bytes) as f64 / 1e6,
        wall * 1e3,
        cpu * 1e3
    );
    Ok(())
}
