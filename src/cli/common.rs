//! What several subcommands share: checking output paths and memory before
//! any work starts, sizing candle's compute threads, loading a schema from
//! `--schema`/`--feature`, the progress bar, and writing JSON reports.
//!
//! Every check here runs before the command does any work, so a bad flag
//! fails in milliseconds with the flag's name, not after a long run.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tfpipe::Schema;
use tfpipe::example::SchemaMetadata;
use tfpipe::train::{InputSpec, ModelConfig, ThreadTuner, classes_from_metadata};

/// What the schema file at `path` records besides the schema (the label
/// vocabulary, the record count, the token vocabulary size).
pub(crate) fn read_facts(path: &Path) -> anyhow::Result<SchemaMetadata> {
    Ok(Schema::load_with_facts(path)?.1)
}

/// Fails unless `path` can be a directory we write: not a file, and its
/// parent exists (or can be created) and is writable.
pub(crate) fn check_output_dir(path: Option<&Path>, flag: &str) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    if path.is_file() {
        bail!(
            "{flag} {}: is a file; a directory is needed",
            path.display()
        );
    }
    let probe_in = if path.is_dir() {
        path.to_path_buf()
    } else {
        let parent = parent_dir(path);
        std::fs::create_dir_all(&parent).with_context(|| {
            format!(
                "{flag} {}: cannot create {}",
                path.display(),
                parent.display()
            )
        })?;
        parent
    };
    probe_writable(&probe_in).with_context(|| format!("{flag} {}: not writable", path.display()))
}

/// Fails unless `path` can be a file we write: not a directory, in a
/// writable directory.
pub(crate) fn check_output_file(path: Option<&Path>, flag: &str) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    if path.is_dir() {
        bail!(
            "{flag} {}: is a directory; a file name is needed",
            path.display()
        );
    }
    let parent = parent_dir(path);
    if !parent.is_dir() {
        bail!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            parent.display()
        );
    }
    probe_writable(&parent).with_context(|| format!("{flag} {}: not writable", path.display()))
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn probe_writable(dir: &Path) -> anyhow::Result<()> {
    tempfile::Builder::new()
        .prefix(".tfpipe-probe")
        .tempfile_in(dir)
        .map(drop)
        .map_err(anyhow::Error::from)
}

/// The memory this machine has for us: MemAvailable, or 16 GiB when unknown.
fn available_memory() -> u128 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u128>().ok())
        })
        .map_or(16 << 30, |kb| kb * 1024)
}

/// Fails when `bytes` would not fit in memory, saying how much the setting needs.
pub(crate) fn check_size(what: &str, bytes: u128) -> anyhow::Result<()> {
    let available = available_memory();
    if bytes > available {
        bail!(
            "{what}: this setting needs about {} of memory, more than the {} available",
            human_bytes(bytes),
            human_bytes(available)
        );
    }
    Ok(())
}

/// `1.5 GiB`, `3.2e6 TiB`.
pub(crate) fn human_bytes(bytes: u128) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else if value >= 1e6 {
        format!("{value:.2e} {}", units[unit])
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// Checks the model's weights (with gradients and two optimizer moments)
/// and a step's batches and activations against the memory there is,
/// before anything is allocated.
pub(crate) fn check_model_size(
    model: &ModelConfig,
    input: &InputSpec,
    batch_size: usize,
    prefetch: usize,
) -> anyhow::Result<()> {
    let f32s = |n: u128| n.saturating_mul(4);
    check_size(
        "--hidden / --classes (the model's weights, gradients and optimizer moments)",
        f32s(model.parameters().saturating_mul(4)),
    )?;
    let batch = batch_size as u128;
    // The batches in flight (pipeline and device prefetch), and one step's activations.
    let inflight = (prefetch as u128 + 4)
        .saturating_mul(batch)
        .saturating_mul(input.inputs() as u128);
    let activations = batch.saturating_mul(4 * model.widest_layer() as u128);
    check_size(
        "--batch-size / --prefetch (the batches in flight and a step's activations)",
        f32s(inflight.saturating_add(activations)),
    )
}

/// The schema from `--schema` or `--feature`s, with `--label` applied, and
/// the number of classes the schema file records for its label (when
/// `--label` names another feature, that count does not apply).
pub(crate) fn load_schema(
    features: &[String],
    schema: Option<&Path>,
    label: Option<&str>,
) -> anyhow::Result<(Schema, Option<usize>)> {
    let (mut schema, classes) = match schema {
        Some(path) => {
            let (mut schema, metadata) = Schema::load_with_metadata(path)?;
            // `--feature` specs override the file's (or add to them).
            for spec in Schema::from_feature_texts(features)?.features {
                match schema.features.iter_mut().find(|f| f.name == spec.name) {
                    Some(existing) => *existing = spec,
                    None => schema.features.push(spec),
                }
            }
            (schema, classes_from_metadata(&metadata))
        }
        None if features.is_empty() => {
            bail!("no features: give --schema FILE or --feature NAME:DTYPE[:SHAPE]...")
        }
        None => (Schema::from_feature_texts(features)?, None),
    };
    let classes = classes.filter(|_| label.is_none() || label == schema.label.as_deref());
    if let Some(label) = label {
        if schema.feature(label).is_none() {
            bail!(
                "--label {label:?} is not a feature (features: {})",
                schema
                    .features
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        schema.label = Some(label.to_string());
    }
    Ok((schema, classes))
}

/// Sets how many threads candle's CPU kernels use, and says whether the
/// trainer should tune the count by measurement. candle sizes its rayon
/// pool (which the fused kernels' GEMMs share) from `RAYON_NUM_THREADS`.
///
/// With `--compute-threads N` (or `RAYON_NUM_THREADS`): N, fixed. By
/// default the pool gets every core and a [`ThreadTuner`] picks how many
/// the GEMMs use by timing the steps (every core while the pipeline needs
/// little CPU, fewer when the steps start waiting for data): measured on 2
/// cores, a fixed half of them made the MLP step slower (README,
/// "Training speed").
///
/// candle's own elementwise pool gets 1 thread (the caller) unless
/// `CANDLE_NUM_THREADS` says otherwise (see the comment inside).
///
/// Must run before any other thread exists or candle's pool is built: call
/// it first in a command (the demo calls it after conversion, whose
/// threads have all finished).
pub(crate) fn set_compute_threads(threads: Option<usize>) -> anyhow::Result<ComputeThreads> {
    if threads == Some(0) {
        bail!("--compute-threads must be at least 1");
    }
    // candle runs its elementwise kernels of 64k values or more (the
    // gradient sums of backprop: the CNN's largest is 301k) on a pool of
    // CANDLE_NUM_THREADS - 1 threads (RAYON_NUM_THREADS when unset) that
    // wait by spinning, the caller spinning too until all are done. On a
    // shared machine that spin waits on a descheduled thread: at load 4 on
    // 2 cores, 37% of a tuned CNN run's CPU was that spinning, and its
    // median step 9.5 / 10.2 / 6.3 ms against 7.8 / 6.2 / 7.4 ms with the
    // pool off (docs/benchmarks.md, "The CNN step against Keras"). Our
    // fused kernels do the model's math on the compute threads; candle's
    // leftover elementwise passes (memory-bound) run on the calling thread
    // unless the user sets CANDLE_NUM_THREADS.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: as for RAYON_NUM_THREADS below.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
    let from_env = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let (n, tune) = match (threads, from_env) {
        (Some(n), _) => (n, false),
        (None, Some(n)) if n > 0 => {
            return Ok(ComputeThreads {
                threads: n,
                tune: false,
            });
        }
        _ => (
            std::thread::available_parallelism().map_or(1, |c| c.get()),
            true,
        ),
    };
    // SAFETY: called before this process starts threads that could read
    // the environment concurrently (see above); nothing else writes it.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    Ok(ComputeThreads { threads: n, tune })
}

/// The compute threads a command runs with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ComputeThreads {
    /// candle's pool: the most the model's math uses.
    pub threads: usize,
    /// Whether a [`ThreadTuner`] chooses how many of them the GEMMs use.
    pub tune: bool,
}

impl ComputeThreads {
    /// The tuner to observe the run with, when tuning.
    pub(crate) fn tuner(&self) -> Option<ThreadTuner> {
        self.tune.then(|| ThreadTuner::new(self.threads))
    }
}

impl std::fmt::Display for ComputeThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.tune {
            write!(f, "up to {} (tuned)", self.threads)
        } else {
            write!(f, "{}", self.threads)
        }
    }
}

/// A progress bar on stderr, hidden when stderr is not a terminal.
pub(crate) fn progress_bar(len: Option<u64>) -> ProgressBar {
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::no_length(),
    };
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        let template = if len.is_some() {
            "{spinner} step {pos}/{len} [{elapsed_precise}] {wide_bar} {msg}"
        } else {
            "{spinner} step {pos} [{elapsed_precise}] {msg}"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(200));
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar
}

/// Writes `value` as pretty JSON to `path`, atomically (temporary file,
/// fsync, rename: see `tfpipe::atomic_file`).
pub(crate) fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut json = serde_json::to_vec_pretty(value)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    json.push(b'\n');
    tfpipe::atomic_file::write(path, &json)?;
    Ok(())
}

/// Fails when both label vocabularies are known and differ: the same class
/// id would mean another label (issue: a test split converted alone records
/// only the labels it has).
pub(crate) fn check_vocabulary(
    trained: Option<&[String]>,
    found: Option<&[String]>,
    trained_what: &str,
    found_what: &str,
) -> anyhow::Result<()> {
    if let (Some(trained), Some(found)) = (trained, found)
        && trained != found
    {
        bail!(
            "{trained_what} has the label vocabulary {trained:?}, but {found_what} records {found:?}: class ids would mean other labels (convert the data with the training schema: `tfpipe convert --schema FILE`)"
        );
    }
    Ok(())
}

/// Milliseconds since `since`.
pub(crate) fn ms_since(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Below this size glibc's malloc serves an allocation from its heap, not
/// from a fresh `mmap` (see [`keep_large_buffers`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: usize = 64 << 20;

/// Keeps glibc's malloc from handing out large buffers as fresh `mmap`s
/// that `free` unmaps again: every training step allocates the same
/// megabyte-sized tensors (the CNN's first feature map and its gradient
/// sums, 1.2 MB each at batch 64), and a fresh mapping is page-faulted in
/// on first touch, every step. By default only buffers under 128 KB (the
/// threshold rising to at most 32 MB as mapped ones are freed) come from
/// the heap. Here anything under 64 MB does, and up to 128 MB of free heap
/// top stays mapped. Measured: the CNN's median step (`bench-train --model
/// cnn --steps 300`, load about 1) 7.10 / 6.76 ms before, 5.10 / 4.04 ms
/// after; peak RSS 50 -> 55 MB. For a server this also keeps the memory
/// its warm-up grew for the requests after it (a batch-256 request: a
/// 270 KB body, its JSON, 800 KB of floats). Left alone when the user tunes
/// malloc (see [`malloc_tuned_by_user`]); does nothing elsewhere.
pub(crate) fn keep_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if !malloc_tuned_by_user() {
        // SAFETY: mallopt only sets allocator parameters; called first
        // thing in main, and glibc serialises it against allocation.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
            libc::mallopt(libc::M_TRIM_THRESHOLD, (2 * MMAP_THRESHOLD) as libc::c_int);
        }
    }
}

/// Puts every thread on one glibc malloc arena, for `tfpipe serve`. By
/// default each connection thread may get an arena of its own (up to 8 per
/// core), and an arena the warm-up did not grow pays its page faults on a
/// client's first request: with two arenas a client whose connection
/// thread drew the other one paid 100-370 page faults on its first
/// batch-256 request, none with one (docs/benchmarks.md, "Serving"). The
/// price is one lock for every allocation: on two cores at most two
/// threads contend for it; on a many-core machine under load it may cost
/// throughput (not measured here), and `MALLOC_ARENA_MAX` overrides it.
/// Call before the server starts its threads.
pub(crate) fn share_one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if !malloc_tuned_by_user() {
        // SAFETY: mallopt only sets allocator parameters; it takes the
        // arena lock itself.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

/// Whether the environment sets glibc's malloc parameters: then tfpipe
/// leaves them to the user.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn malloc_tuned_by_user() -> bool {
    [
        "GLIBC_TUNABLES",
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_ARENA_MAX",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// A 40 MB buffer (above glibc's largest default threshold, 32 MB)
    /// comes from the heap once [`super::keep_large_buffers`] ran, not
    /// from a new mapping.
    #[test]
    fn large_buffers_come_from_the_heap() {
        if std::env::var_os("GLIBC_TUNABLES").is_some() {
            return;
        }
        super::keep_large_buffers();
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let mapped = || unsafe { libc::mallinfo2() }.hblkhd;
        let before = mapped();
        let buffer = std::hint::black_box(vec![1u8; 40 << 20]);
        let during = mapped();
        drop(buffer);
        assert!(
            during < before + (40 << 20),
            "{before} -> {during} bytes mapped"
        );
    }
}
