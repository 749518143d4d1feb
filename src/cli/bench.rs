//! `tfpipe bench`: run the input pipeline (read, shuffle, batch, parse,
//! prefetch) to the end and report throughput, time to first batch, peak
//! memory and the per-stage metrics.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use tfpipe::Schema;
use tfpipe::metrics::{PipelineMetrics, StageMetrics};
use tfpipe::pipeline::{
    Interleave, Parallelism, Pipeline, Remainder, ShuffleOptions, TfRecordFiles,
};

use super::Status;

/// Arguments of `tfpipe bench`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("schema_source").required(true).args(["feature", "schema"])))]
pub struct Args {
    /// TFRecord files or globs (compression from the name: .gz, .zlib).
    #[arg(long, num_args = 1.., required = true, value_name = "FILE|GLOB")]
    data: Vec<String>,
    /// A feature spec `NAME:DTYPE[:SHAPE]` (repeatable), e.g. `image_raw:uint8:784`.
    #[arg(long, value_name = "SPEC")]
    feature: Vec<String>,
    /// A schema file (as written by `tfpipe inspect` or `convert`).
    #[arg(long, value_name = "FILE")]
    schema: Option<PathBuf>,
    /// Examples per batch.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// Shuffle buffer in examples (0: no shuffle).
    #[arg(long, default_value_t = 10_000)]
    shuffle_buffer: usize,
    /// Emit from the shuffle buffer before it is full (faster first batch, weaker early mixing).
    #[arg(long)]
    early_start: bool,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Workers for reading and parsing: a number or `auto`.
    #[arg(long, default_value = "auto")]
    num_parallel_calls: Parallelism,
    /// Files read at once.
    #[arg(long, default_value_t = 4)]
    cycle_length: usize,
    /// Batches prefetched ahead of the consumer.
    #[arg(long, default_value_t = 2)]
    prefetch: usize,
    /// Passes over the data.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Stop after this many batches.
    #[arg(long)]
    take: Option<u64>,
    /// Print one JSON object (with --sweep: one per setting, as an array).
    #[arg(long)]
    json: bool,
    /// Run once per parallelism setting (1, 2, ... cores, auto), one row each.
    #[arg(long)]
    sweep: bool,
    #[command(flatten)]
    rank: super::rank::RankArgs,
}

/// What one run measured.
#[derive(Debug, Serialize)]
struct Report {
    num_parallel_calls: String,
    examples: u64,
    batches: u64,
    errors: u64,
    seconds: f64,
    examples_per_sec: f64,
    /// File bytes on disk (compressed, if the files are) per second.
    mb_per_sec: f64,
    /// Record payload bytes per second.
    payload_mb_per_sec: f64,
    /// From pipeline construction to the first batch.
    time_to_first_batch_s: f64,
    /// From process start (entry to `main`) to the first batch.
    time_to_first_batch_from_process_start_s: f64,
    shuffle_fill_s: f64,
    peak_rss_bytes: Option<u64>,
    bottleneck: Option<String>,
    /// Per-stage metrics, upstream first.
    stages: Vec<StageMetrics>,
    #[serde(skip)]
    metrics: PipelineMetrics,
}

/// Runs `tfpipe bench`.
pub fn run(args: Args) -> anyhow::Result<Status> {
    if args.batch_size == 0 {
        bail!("--batch-size must be positive");
    }
    if args.cycle_length == 0 {
        bail!("--cycle-length must be positive");
    }
    // This rank's share (every rank the same count: drop_last).
    let rank = args.rank.resolve()?;
    let files = super::rank::share(
        Pipeline::tfrecord_files(&args.data)?,
        rank,
        Remainder::Drop,
        true,
    )?;
    let (schema, _) = super::train::load_schema(&args.feature, args.schema.as_deref(), None)?;
    let file_bytes: u64 = files
        .paths()
        .iter()
        .map(|p| tfpipe::storage::size_of(p).unwrap_or(0))
        .sum();
    let settings = if args.sweep {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut s: Vec<Parallelism> = (1..=cores.max(2)).map(Parallelism::Fixed).collect();
        s.push(Parallelism::Auto);
        s
    } else {
        vec![args.num_parallel_calls]
    };
    let mut reports = Vec::new();
    for parallelism in settings {
        let report = run_once(&args, &files, &schema, parallelism, file_bytes)?;
        if !args.json {
            if args.sweep {
                if reports.is_empty() {
                    println!(
                        "{:>8} {:>12} {:>9} {:>14} {:>8} {:>12}",
                        "parallel", "examples/s", "MB/s", "first batch ms", "tuned", "peak RSS MB"
                    );
                }
                let tuned = report.metrics.stage("parse").map_or(0, |s| s.parallelism);
                println!(
                    "{:>8} {:>12.0} {:>9.1} {:>14.2} {:>8} {:>12.1}",
                    report.num_parallel_calls,
                    report.examples_per_sec,
                    report.mb_per_sec,
                    report.time_to_first_batch_s * 1e3,
                    tuned,
                    report.peak_rss_bytes.unwrap_or(0) as f64 / 1e6
                );
            } else {
                print_report(&report);
            }
        }
        reports.push(report);
    }
    if args.json {
        let json = if args.sweep {
            serde_json::to_string_pretty(&reports)?
        } else {
            serde_json::to_string_pretty(&reports[0])?
        };
        println!("{json}");
    }
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    Ok(if errors > 0 {
        Status::Problems
    } else {
        Status::Ok
    })
}

fn run_once(
    args: &Args,
    files: &TfRecordFiles,
    schema: &Schema,
    parallelism: Parallelism,
    file_bytes: u64,
) -> anyhow::Result<Report> {
    let constructed = Instant::now();
    let files = files.clone();
    let cycle = args.cycle_length.min(files.paths().len()).max(1);
    let mut records = files
        .interleave_with(Interleave::new(cycle, 16).parallel(parallelism))
        .repeat(Some(args.epochs));
    if args.shuffle_buffer > 0 {
        records = records.shuffle_with(ShuffleOptions {
            buffer_size: args.shuffle_buffer,
            seed: args.seed,
            early_start: args.early_start,
            ..ShuffleOptions::default()
        });
    }
    let mut batches = records
        .batch(args.batch_size)
        .parse_batches(schema.clone(), parallelism)
        .prefetch(args.prefetch);
    if let Some(n) = args.take {
        batches = batches.take(n);
    }
    let mut it = batches.start()?;
    let mut first: Option<(Duration, Duration)> = None;
    let (mut examples, mut count, mut errors) = (0u64, 0u64, 0u64);
    for batch in it.by_ref() {
        if first.is_none() {
            first = Some((constructed.elapsed(), super::process_elapsed()));
        }
        match batch {
            Ok(batch) => {
                examples += batch.num_rows as u64;
                count += 1;
            }
            Err(err) => {
                errors += 1;
                if errors <= 5 {
                    eprintln!("tfpipe: {err}");
                }
            }
        }
    }
    let seconds = constructed.elapsed().as_secs_f64();
    let stages = it.metrics();
    drop(it);
    let payload: u64 = stages.stage("tfrecord").map_or(0, |s| s.bytes_out);
    let (first_built, first_process) = first.unwrap_or_default();
    let per_sec = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
    let passes = match args.take {
        Some(_) => 1.0_f64.min(args.epochs as f64),
        None => args.epochs as f64,
    };
    Ok(Report {
        num_parallel_calls: match parallelism {
            Parallelism::Fixed(n) => n.to_string(),
            Parallelism::Auto => "auto".into(),
        },
        examples,
        batches: count,
        errors,
        seconds,
        examples_per_sec: per_sec(examples as f64),
        mb_per_sec: per_sec(file_bytes as f64 * passes / 1e6),
        payload_mb_per_sec: per_sec(payload as f64 / 1e6),
        time_to_first_batch_s: first_built.as_secs_f64(),
        time_to_first_batch_from_process_start_s: first_process.as_secs_f64(),
        shuffle_fill_s: stages.stage("shuffle").map_or(0, |s| s.first_output_ns) as f64 / 1e9,
        peak_rss_bytes: peak_rss_bytes(),
        bottleneck: stages.bottleneck_stage().map(str::to_string),
        stages: stages.stages.clone(),
        metrics: stages,
    })
}

fn print_report(r: &Report) {
    println!(
        "{} examples in {} batches, {:.3} s: {:.0} examples/s, {:.1} MB/s file, {:.1} MB/s payload",
        r.examples, r.batches, r.seconds, r.examples_per_sec, r.mb_per_sec, r.payload_mb_per_sec
    );
    println!(
        "first batch: {:.2} ms after pipeline construction, {:.2} ms after process start (shuffle fill {:.2} ms)",
        r.time_to_first_batch_s * 1e3,
        r.time_to_first_batch_from_process_start_s * 1e3,
        r.shuffle_fill_s * 1e3
    );
    match r.peak_rss_bytes {
        Some(b) => println!("peak RSS: {:.1} MB", b as f64 / 1e6),
        None => println!("peak RSS: unknown (no /proc/self/status)"),
    }
    if r.errors > 0 {
        println!("errors: {}", r.errors);
    }
    println!();
    println!("{}", r.metrics);
}

/// Peak resident set size (`VmHWM` in `/proc/self/status`), on Linux.
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
