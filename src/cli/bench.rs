//! `tfpipe bench`: run the input pipeline (read, shuffle, batch, parse,
//! prefetch) to the end and report throughput, time to first batch, peak
//! memory and the per-stage metrics.
//!
//! The first error (a corrupt record, a record that does not parse under the
//! schema, an unreadable file) stops the run: it is printed once, with its
//! location, and no report follows (exit 1 for bad data, 2 otherwise).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tfpipe::Batch;
use tfpipe::train::{PaddingMeter, SequenceReport, Sequences, token_feature};

use anyhow::Context as _;
use serde::Serialize;
use tfpipe::Schema;
use tfpipe::metrics::{PipelineMetrics, StageMetrics};
use tfpipe::pipeline::{
    Exhausted, Interleave, MixSource, Parallelism, Pipeline, Remainder, ShuffleOptions,
    TfRecordFiles, split_by_weight,
};

use super::common::check_size;
use super::{CompressionFlag, Status};

/// Arguments of `tfpipe bench`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("schema_source").required(true).args(["feature", "schema"])))]
pub struct Args {
    /// TFRecord files, globs or dataset directories (compression from the name unless --compression).
    #[arg(long, num_args = 1.., required_unless_present = "mix", value_name = "FILE|GLOB|DIR")]
    data: Vec<String>,
    /// A weighted source FILES=WEIGHT (repeatable), instead of --data: each
    /// source's files are interleaved on their own and the sources mixed by
    /// weight (tf.data's sample_from_datasets, seeded by --seed,
    /// renormalised as sources run out), then shuffled, batched and parsed.
    #[arg(long, value_name = "FILES=WEIGHT", conflicts_with = "data")]
    mix: Vec<MixSource>,
    /// Features read from the key=value directories of each record's file
    /// (comma-separated; a Spark dataset's partition columns), typed by the
    /// --feature spec of that name if there is one, else bytes.
    #[arg(long, value_name = "A,B,...", value_delimiter = ',')]
    partition_features: Vec<String>,
    #[command(flatten)]
    compression: CompressionFlag,
    /// A feature spec `NAME:DTYPE[:SHAPE]` (repeatable), e.g. `image_raw:uint8:784`.
    #[arg(long, value_name = "SPEC")]
    feature: Vec<String>,
    /// A schema file (`PREFIX.features.json`, as written by `tfpipe convert`;
    /// `tfpipe inspect` prints the `--feature` specs to use instead).
    #[arg(long, value_name = "FILE")]
    schema: Option<PathBuf>,
    /// Examples per batch.
    #[arg(long, default_value_t = 256, value_parser = super::positive::<usize>)]
    batch_size: usize,
    /// Shuffle buffer in examples (0: no shuffle).
    #[arg(long, default_value_t = 10_000, value_parser = super::count::<usize>)]
    shuffle_buffer: usize,
    /// Emit from the shuffle buffer before it is full (faster first batch, weaker early mixing).
    #[arg(long)]
    early_start: bool,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    parse: super::ParseFlags,
    /// Files read at once (with --mix: in all, split between the sources by
    /// weight, at least one each).
    #[arg(long, default_value_t = 4, value_parser = super::positive::<usize>)]
    cycle_length: usize,
    /// Batches prefetched ahead of the consumer.
    #[arg(long, default_value_t = 2, value_parser = super::count::<usize>)]
    prefetch: usize,
    /// Passes over the data.
    #[arg(long, default_value_t = 1, value_parser = super::count::<u64>)]
    epochs: u64,
    #[command(flatten)]
    pub sequences: super::SequenceFlags,
    /// Stop after this many batches.
    #[arg(long, value_parser = super::count::<u64>)]
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
    /// How token sequences were batched and the padding it cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    sequences: Option<SequenceReport>,
    /// For a mixture: the source it waited on longest.
    #[serde(skip_serializing_if = "Option::is_none")]
    starving_input: Option<String>,
    /// Per-stage metrics, upstream first.
    stages: Vec<StageMetrics>,
    #[serde(skip)]
    metrics: PipelineMetrics,
}

/// Runs `tfpipe bench`.
pub fn run(mut args: Args) -> anyhow::Result<Status> {
    // This rank's share (every rank the same count: drop_last).
    let rank = args.rank.resolve()?;
    let weights = super::mix_into_data(&mut args.data, &args.mix);
    super::note_skipped_indexes(&args.data)?;
    // One source of all the files, or one per `--mix`.
    let groups: Vec<Vec<String>> = if weights.is_empty() {
        vec![args.data.clone()]
    } else {
        args.data.iter().map(|p| vec![p.clone()]).collect()
    };
    let sources = groups
        .iter()
        .map(|patterns| {
            let files = Pipeline::tfrecord_files(patterns)?
                .reader_options(args.compression.reader_options());
            super::rank::share(files, rank, Remainder::Drop, true)
        })
        .collect::<anyhow::Result<Vec<TfRecordFiles>>>()?;
    let (schema, _) = super::common::load_schema(&args.feature, args.schema.as_deref(), None)?;
    check_sizes(&args, &schema)?;
    let file_bytes: u64 = sources
        .iter()
        .flat_map(|files| files.paths())
        .map(|p| tfpipe::storage::size_of(p).unwrap_or(0))
        .sum();
    let settings = if args.sweep {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut s: Vec<Parallelism> = (1..=cores.max(2)).map(Parallelism::Fixed).collect();
        s.push(Parallelism::Auto);
        s
    } else {
        vec![args.parse.num_parallel_calls]
    };
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut reports = Vec::new();
    for parallelism in settings {
        let report = run_once(
            &args,
            (&sources, &weights),
            &schema,
            parallelism,
            file_bytes,
        )?;
        if !args.json {
            if args.sweep {
                if reports.is_empty() {
                    writeln!(
                        out,
                        "{:>8} {:>12} {:>9} {:>14} {:>8} {:>12}",
                        "parallel", "examples/s", "MB/s", "first batch ms", "tuned", "peak RSS MB"
                    )?;
                }
                let tuned = report.metrics.stage("parse").map_or(0, |s| s.parallelism);
                writeln!(
                    out,
                    "{:>8} {:>12.0} {:>9.1} {:>14.2} {:>8} {:>12.1}",
                    report.num_parallel_calls,
                    report.examples_per_sec,
                    report.mb_per_sec,
                    report.time_to_first_batch_s * 1e3,
                    tuned,
                    report.peak_rss_bytes.unwrap_or(0) as f64 / 1e6
                )?;
            } else {
                print_report(&mut out, &report)?;
            }
            out.flush()?;
        }
        reports.push(report);
    }
    if args.json {
        let json = if args.sweep {
            serde_json::to_string_pretty(&reports)?
        } else {
            serde_json::to_string_pretty(&reports[0])?
        };
        writeln!(out, "{json}")?;
    }
    out.flush().context("writing to stdout")?;
    Ok(Status::Ok)
}

/// Fails, before anything is allocated, when a setting would need more
/// memory than the machine has. The estimate is a lower bound: the parsed
/// size of the schema's fixed-length features (8 bytes for the row split of
/// each variable-length one) plus the record handle, per example.
fn check_sizes(args: &Args, schema: &Schema) -> anyhow::Result<()> {
    let example_bytes: u128 = schema
        .features
        .iter()
        // Variable-length features: at least their row split.
        .map(|f| f.bytes_per_record().map_or(8, u128::from))
        .sum::<u128>()
        + std::mem::size_of::<tfpipe::pipeline::Record>() as u128;
    let batch = (args.batch_size as u128).saturating_mul(example_bytes);
    check_size(
        &format!(
            "--batch-size {} ({example_bytes} bytes per example)",
            args.batch_size
        ),
        batch,
    )?;
    // Batches in flight: the prefetch buffer, plus one being built and one
    // being read.
    check_size(
        &format!(
            "--prefetch {} with --batch-size {} (the prefetched batches and the two being built and read)",
            args.prefetch, args.batch_size
        ),
        (args.prefetch as u128)
            .saturating_add(2)
            .saturating_mul(batch),
    )?;
    check_size(
        &format!(
            "--shuffle-buffer {} (the record handles alone, before their bytes)",
            args.shuffle_buffer
        ),
        (args.shuffle_buffer as u128)
            .saturating_mul(std::mem::size_of::<tfpipe::pipeline::Record>() as u128),
    )?;
    Ok(())
}

/// One run over `sources` (one, or a mixture with these weights).
fn run_once(
    args: &Args,
    (sources, weights): (&[TfRecordFiles], &[f64]),
    schema: &Schema,
    parallelism: Parallelism,
    file_bytes: u64,
) -> anyhow::Result<Report> {
    let constructed = Instant::now();
    let read = |files: &TfRecordFiles, cycle_length: usize| {
        let cycle = cycle_length.min(files.paths().len()).max(1);
        files
            .clone()
            .interleave_with(Interleave::new(cycle, 16).parallel(parallelism))
    };
    let read = match sources {
        [one] if weights.is_empty() => read(one, args.cycle_length),
        _ => {
            // The sources share the files open at once, by weight.
            let cycles = split_by_weight(args.cycle_length, weights);
            Pipeline::sample_from(
                sources
                    .iter()
                    .zip(cycles)
                    .map(|(s, c)| read(s, c))
                    .collect(),
                weights,
                args.seed,
                Exhausted::Renormalize,
            )
        }
    };
    let mut records = read.repeat(Some(args.epochs));
    if args.shuffle_buffer > 0 {
        records = records.shuffle_with(ShuffleOptions {
            buffer_size: args.shuffle_buffer,
            seed: args.seed,
            early_start: args.early_start,
            ..ShuffleOptions::default()
        });
    }
    let batches = records.batch(args.batch_size);
    let parsed = if args.partition_features.is_empty() {
        // Image features with random options draw from --seed.
        batches.parse_batches_seeded(schema.clone(), parallelism, args.seed)
    } else {
        batches.parse_batches_partitioned(schema.clone(), &args.partition_features, parallelism)
    };
    // Sequences regrouped as asked; `rows_in` counts the examples going in
    // (packed rows hold several).
    let sequences = args.sequences.resolve(args.batch_size)?;
    let (meter, rows_in) = (PaddingMeter::default(), Arc::new(AtomicU64::new(0)));
    let parsed = match token_feature(schema) {
        Some(tokens) => {
            let (tokens, counted, m) = (tokens.to_string(), Arc::clone(&rows_in), meter.clone());
            let counted = parsed.map(move |b: Batch| {
                counted.fetch_add(b.num_rows as u64, Ordering::Relaxed);
                b
            });
            sequences
                .apply(counted, &tokens, schema.label.as_deref(), args.batch_size)
                .map(move |b: Batch| {
                    m.record(&b, &tokens);
                    b
                })
        }
        None if sequences == Sequences::Padded => parsed,
        None => anyhow::bail!(
            "--bucket-boundaries and --pack need a variable-length int64 feature (token ids) in the schema"
        ),
    };
    let mut batches = parsed.prefetch(args.prefetch);
    if let Some(n) = args.take {
        batches = batches.take(n);
    }
    let mut it = batches.start()?;
    let mut first: Option<(Duration, Duration)> = None;
    let (mut examples, mut count) = (0u64, 0u64);
    for batch in it.by_ref() {
        if first.is_none() {
            first = Some((constructed.elapsed(), super::process_elapsed()));
        }
        // The first error ends the run; it is the command's error.
        let batch = batch?;
        examples += batch.num_rows as u64;
        count += 1;
    }
    let seconds = constructed.elapsed().as_secs_f64();
    if let Sequences::Packed { .. } = sequences {
        examples = rows_in.load(Ordering::Relaxed);
    }
    let stages = it.metrics();
    drop(it);
    // Every file source: `tfrecord`, or each input's `sample_from[i]/tfrecord`.
    let payload: u64 = stages
        .stages
        .iter()
        .filter(|s| s.name == "tfrecord" || s.name.ends_with("/tfrecord"))
        .map(|s| s.bytes_out)
        .sum();
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
        seconds,
        examples_per_sec: per_sec(examples as f64),
        mb_per_sec: per_sec(file_bytes as f64 * passes / 1e6),
        payload_mb_per_sec: per_sec(payload as f64 / 1e6),
        time_to_first_batch_s: first_built.as_secs_f64(),
        time_to_first_batch_from_process_start_s: first_process.as_secs_f64(),
        shuffle_fill_s: stages.stage("shuffle").map_or(0, |s| s.first_output_ns) as f64 / 1e9,
        peak_rss_bytes: peak_rss_bytes(),
        bottleneck: stages.bottleneck_stage().map(str::to_string),
        sequences: SequenceReport::new(&sequences, &meter),
        starving_input: stages.starving_input().map(|s| s.name.clone()),
        stages: stages.stages.clone(),
        metrics: stages,
    })
}

fn print_report(out: &mut impl Write, r: &Report) -> io::Result<()> {
    writeln!(
        out,
        "{} examples in {} batches, {:.3} s: {:.0} examples/s, {:.1} MB/s file, {:.1} MB/s payload",
        r.examples, r.batches, r.seconds, r.examples_per_sec, r.mb_per_sec, r.payload_mb_per_sec
    )?;
    writeln!(
        out,
        "first batch: {:.2} ms after pipeline construction, {:.2} ms after process start (shuffle fill {:.2} ms)",
        r.time_to_first_batch_s * 1e3,
        r.time_to_first_batch_from_process_start_s * 1e3,
        r.shuffle_fill_s * 1e3
    )?;
    if let Some(s) = &r.sequences {
        writeln!(out, "sequences {s}")?;
    }
    match r.peak_rss_bytes {
        Some(b) => writeln!(out, "peak RSS: {:.1} MB", b as f64 / 1e6)?,
        None => writeln!(out, "peak RSS: unknown (no /proc/self/status)")?,
    }
    writeln!(out)?;
    writeln!(out, "{}", r.metrics)
}

/// Peak resident set size (`VmHWM` in `/proc/self/status`), on Linux.
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
