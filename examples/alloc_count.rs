//! Allocations per record in each stage of the pipeline benchmark, for the
//! breakdown in docs/benchmarks.md ("Against the machine's limits").
//!
//! `cargo run --release --example alloc_count -- [--feature SPEC]... FILE...`
//! runs the benchmark's job in growing prefixes, one pass each: read
//! (interleave 4, block 16, 2 producer threads), then + shuffle 10,000, +
//! batch 256, + parse (with the `--feature` specs), + prefetch 2. For each it
//! prints heap allocations, reallocations and bytes allocated per record,
//! counted by a global allocator wrapped around the system's. A stage's cost
//! is the difference between its row and the one before.
//!
//! Counts, unlike times, do not depend on the machine's load, so this runs
//! meaningfully on a shared machine. The counts are of the whole process, all
//! threads included.

#[path = "common/args.rs"]
mod args;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tfpipe::Batch;
use tfpipe::example::Schema;
use tfpipe::pipeline::{Interleave, Parallelism, Pipeline, ShuffleOptions};

/// The system allocator, counting what passes through it.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static REALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds
// `GlobalAlloc`'s contract; the counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        REALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(
            new_size.saturating_sub(layout.size()) as u64,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counters now: (allocations, reallocations, bytes).
fn counts() -> (u64, u64, u64) {
    (
        ALLOCS.load(Ordering::Relaxed),
        REALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    )
}

/// How far into the benchmark's job a run goes.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Prefix {
    Read,
    Shuffle,
    Batch,
    Parse,
    Prefetch,
}

impl Prefix {
    const ALL: [Prefix; 5] = [
        Prefix::Read,
        Prefix::Shuffle,
        Prefix::Batch,
        Prefix::Parse,
        Prefix::Prefetch,
    ];

    fn name(self) -> &'static str {
        match self {
            Prefix::Read => "read (interleave 4x16, 2 threads)",
            Prefix::Shuffle => "+ shuffle 10,000",
            Prefix::Batch => "+ batch 256",
            Prefix::Parse => "+ parse",
            Prefix::Prefetch => "+ prefetch 2",
        }
    }
}

/// Runs the job up to `prefix`; returns the records that went through.
fn run(
    files: &[String],
    schema: &Schema,
    prefix: Prefix,
) -> Result<u64, Box<dyn std::error::Error>> {
    let records = Pipeline::tfrecord_files(files)?
        .interleave_with(Interleave::new(4, 16).parallel(Parallelism::Fixed(2)));
    let records = if prefix >= Prefix::Shuffle {
        records.shuffle_with(ShuffleOptions {
            buffer_size: 10_000,
            seed: 1,
            ..ShuffleOptions::default()
        })
    } else {
        records
    };
    if prefix == Prefix::Read || prefix == Prefix::Shuffle {
        let mut n = 0;
        for record in records.start()? {
            record?;
            n += 1;
        }
        return Ok(n);
    }
    let batches = records.batch(256);
    if prefix == Prefix::Batch {
        let mut n = 0;
        for batch in batches.start()? {
            n += batch?.len() as u64;
        }
        return Ok(n);
    }
    let parsed = batches.parse_batches(schema.clone(), Parallelism::Fixed(2));
    let parsed = if prefix == Prefix::Prefetch {
        parsed.prefetch(2)
    } else {
        parsed
    };
    let mut n = 0;
    for batch in parsed.start()? {
        let batch: Batch = batch?;
        n += batch.num_rows as u64;
    }
    Ok(n)
}

/// The files and the `--feature` specs (at least one: the job parses).
fn args() -> Result<(Vec<String>, Vec<String>), String> {
    const USAGE: &str = "usage: alloc_count --feature SPEC [--feature SPEC]... FILE...";
    let (files, specs) = args::files_and_specs(USAGE)?;
    if specs.is_empty() {
        return Err(USAGE.into());
    }
    Ok((files, specs))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (files, specs) = args()?;
    let schema = Schema::from_feature_texts(&specs)?;
    println!(
        "{:<36} {:>10} {:>12} {:>12} {:>14} {:>8}",
        "stages", "records", "allocs/rec", "reallocs/rec", "bytes/rec", "wall s"
    );
    for prefix in Prefix::ALL {
        let before = counts();
        let started = Instant::now();
        let n = run(&files, &schema, prefix)?;
        let wall = started.elapsed().as_secs_f64();
        let after = counts();
        let per = |a: u64, b: u64| (b - a) as f64 / n.max(1) as f64;
        println!(
            "{:<36} {:>10} {:>12.3} {:>12.3} {:>14.1} {:>8.3}",
            prefix.name(),
            n,
            per(before.0, after.0),
            per(before.1, after.1),
            per(before.2, after.2),
            wall
        );
    }
    Ok(())
}
