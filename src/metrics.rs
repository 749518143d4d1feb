//! Stage metrics: shared atomic counters that every pipeline stage updates as
//! it runs, and snapshots of them that can be taken at any moment without
//! stopping the workers.
//!
//! Each stage splits its wall time three ways:
//! - `busy_ns`: doing its own work (for a parallel stage, summed over workers,
//!   so it can exceed wall time);
//! - `wait_in_ns`: waiting for its input (for a stage fused into its
//!   downstream's thread this includes the upstream stages' work);
//! - `blocked_out_ns`: blocked on a full output buffer (downstream is slower).
//!
//! To keep the clock off the hot path (timing every record put
//! `clock_gettime` at 8-13% of `tfpipe bench`'s CPU), the per-record stages
//! sample: the TFRecord file source and a full `shuffle` time about one call
//! in 16, at random gaps, and each sample stands for the untimed calls after it
//! (unusual calls, such as opening a file or filling the shuffle buffer, are
//! always timed and stand only for themselves); see `pipeline::Sampler`. Their
//! busy / wait-in figures are estimates with exact element counts. `batch`
//! reads the clock once per batch, after its last pull: its trivial work
//! between pulls (a push) counts as waiting.
//! Cheap pass-through stages (`shard`, `take`, `skip`, `repeat`,
//! `ignore_errors`) count elements only; their time lands in their
//! downstream's wait. The autotuner reads the clock every 16th element.
//!
//! Time is *exclusive*: a stage that pulls a nested pipeline (`interleave`
//! reading files) counts that pull as waiting for input, since the nested
//! stages report the work as their own; only opening an input is its busy
//! time. So a slow file source shows up as `tfrecord`, not as the
//! `interleave` around it.
//!
//! The bottleneck is the stage with the most busy time per worker: the one that
//! limits throughput when everything upstream blocks on output and everything
//! downstream waits for input. [`PipelineMetrics::bottleneck_stage`] names it.
//!
//! Invariants: counters only grow (except the `parallelism` gauge); a snapshot
//! reads each counter once with relaxed ordering, so the fields of one stage may
//! be a few elements apart, never torn.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

/// How many skipped-error messages a stage keeps for its report.
const MAX_ERROR_SAMPLES: usize = 16;

/// The live counters of one stage. Cheap to update from many threads.
#[derive(Debug)]
pub struct StageCounters {
    name: String,
    elements_in: AtomicU64,
    elements_out: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    busy_ns: AtomicU64,
    wait_in_ns: AtomicU64,
    blocked_out_ns: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
    /// Nanoseconds from the stage's first pull to its first output (for a
    /// shuffle: the buffer fill time); 0 until the first output.
    first_output_ns: AtomicU64,
    /// Workers currently active (1 for sequential stages).
    parallelism: AtomicU64,
    samples: Mutex<Vec<String>>,
}

impl StageCounters {
    pub(crate) fn new(name: String) -> StageCounters {
        StageCounters {
            name,
            elements_in: AtomicU64::new(0),
            elements_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            wait_in_ns: AtomicU64::new(0),
            blocked_out_ns: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            first_output_ns: AtomicU64::new(0),
            parallelism: AtomicU64::new(1),
            samples: Mutex::new(Vec::new()),
        }
    }

    /// The stage's name as shown in reports.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn add_in(&self, elements: u64, bytes: u64) {
        self.elements_in.fetch_add(elements, Ordering::Relaxed);
        if bytes > 0 {
            self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub(crate) fn add_out(&self, elements: u64, bytes: u64) {
        self.elements_out.fetch_add(elements, Ordering::Relaxed);
        if bytes > 0 {
            self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub(crate) fn add_busy(&self, d: Duration) {
        self.busy_ns.fetch_add(nanos(d), Ordering::Relaxed);
    }

    pub(crate) fn add_wait_in(&self, d: Duration) {
        self.wait_in_ns.fetch_add(nanos(d), Ordering::Relaxed);
    }

    pub(crate) fn add_blocked_out(&self, d: Duration) {
        self.blocked_out_ns.fetch_add(nanos(d), Ordering::Relaxed);
    }

    pub(crate) fn add_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_skipped(&self, message: String) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        if samples.len() < MAX_ERROR_SAMPLES {
            samples.push(message);
        }
    }

    /// Counts `n` skipped errors whose messages were not kept.
    pub(crate) fn add_skipped_uncited(&self, n: u64) {
        if n > 0 {
            self.skipped.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_first_output(&self, d: Duration) {
        // Only the first caller wins; later outputs keep the first time.
        let _ = self.first_output_ns.compare_exchange(
            0,
            nanos(d).max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    pub(crate) fn set_parallelism(&self, n: usize) {
        self.parallelism.store(n as u64, Ordering::Relaxed);
    }

    /// A guard that adds the time until it is dropped to this stage's busy
    /// time: the stage's own work, so nothing nested may run inside it.
    pub(crate) fn busy_timer(&self) -> BusyTimer<'_> {
        BusyTimer {
            counters: self,
            start: Instant::now(),
        }
    }

    pub(crate) fn busy_ns(&self) -> u64 {
        self.busy_ns.load(Ordering::Relaxed)
    }

    pub(crate) fn wait_in_ns(&self) -> u64 {
        self.wait_in_ns.load(Ordering::Relaxed)
    }

    pub(crate) fn blocked_out_ns(&self) -> u64 {
        self.blocked_out_ns.load(Ordering::Relaxed)
    }

    /// A consistent-enough copy of the counters.
    pub fn snapshot(&self) -> StageMetrics {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StageMetrics {
            name: self.name.clone(),
            elements_in: get(&self.elements_in),
            elements_out: get(&self.elements_out),
            bytes_in: get(&self.bytes_in),
            bytes_out: get(&self.bytes_out),
            busy_ns: get(&self.busy_ns),
            wait_in_ns: get(&self.wait_in_ns),
            blocked_out_ns: get(&self.blocked_out_ns),
            errors: get(&self.errors),
            skipped: get(&self.skipped),
            first_output_ns: get(&self.first_output_ns),
            parallelism: get(&self.parallelism),
            skipped_samples: self
                .samples
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }
}

/// Records the time from [`StageCounters::busy_timer`] to its drop as busy
/// time, on every path out of the scope (early returns and `?` included).
#[must_use = "the time is recorded when the timer is dropped"]
pub(crate) struct BusyTimer<'a> {
    counters: &'a StageCounters,
    start: Instant,
}

impl Drop for BusyTimer<'_> {
    fn drop(&mut self) {
        self.counters.add_busy(self.start.elapsed());
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A snapshot of one stage's counters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageMetrics {
    /// The stage's name (`tfrecord`, `shuffle`, `map`, ...; a repeated name
    /// gets a `.2`, `.3` suffix).
    pub name: String,
    /// Elements pulled from upstream.
    pub elements_in: u64,
    /// Elements handed downstream (a batch counts once).
    pub elements_out: u64,
    /// Bytes in (for a TFRecord source: framed bytes of the uncompressed stream).
    pub bytes_in: u64,
    /// Bytes out (payload bytes of records and batches; 0 for other types).
    pub bytes_out: u64,
    /// Time doing the stage's own work, summed over its workers.
    pub busy_ns: u64,
    /// Time waiting for input, summed over workers.
    pub wait_in_ns: u64,
    /// Time blocked on a full output buffer, summed over workers.
    pub blocked_out_ns: u64,
    /// `Err` items that passed through or started here.
    pub errors: u64,
    /// Errors skipped by `ignore_errors`.
    pub skipped: u64,
    /// From the first pull to the first output (a shuffle's fill time); 0 before.
    pub first_output_ns: u64,
    /// Workers active now (autotuned stages change this while running).
    pub parallelism: u64,
    /// The first few skipped errors, with their locations.
    pub skipped_samples: Vec<String>,
}

impl StageMetrics {
    /// Busy time per active worker: the bottleneck score.
    pub fn busy_per_worker_ns(&self) -> u64 {
        self.busy_ns / self.parallelism.max(1)
    }
}

/// Every stage of a running pipeline, upstream first.
#[derive(Debug)]
pub(crate) struct MetricsRegistry {
    start: Instant,
    stages: Mutex<Vec<(String, Arc<StageCounters>)>>,
}

impl MetricsRegistry {
    pub(crate) fn new() -> MetricsRegistry {
        MetricsRegistry {
            start: Instant::now(),
            stages: Mutex::new(Vec::new()),
        }
    }

    /// The counters for the stage with this key, created on first use so a
    /// stage rebuilt every epoch (or per file) keeps one row.
    pub(crate) fn stage(&self, key: &str, name: &str) -> Arc<StageCounters> {
        let mut stages = self.stages.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, counters)) = stages.iter().find(|(k, _)| k == key) {
            return Arc::clone(counters);
        }
        let same = stages
            .iter()
            .filter(|(_, c)| base_name(c.name()) == name)
            .count();
        let display = if same == 0 {
            name.to_string()
        } else {
            format!("{name}.{}", same + 1)
        };
        let counters = Arc::new(StageCounters::new(display));
        stages.push((key.to_string(), Arc::clone(&counters)));
        counters
    }

    pub(crate) fn snapshot(&self) -> PipelineMetrics {
        let stages = self.stages.lock().unwrap_or_else(PoisonError::into_inner);
        let mut ordered: Vec<&(String, Arc<StageCounters>)> = stages.iter().collect();
        ordered.sort_by(|a, b| upstream_first(&a.0, &b.0));
        PipelineMetrics {
            elapsed_ns: nanos(self.start.elapsed()),
            stages: ordered.iter().map(|(_, c)| c.snapshot()).collect(),
        }
    }
}

/// Orders stage keys (`depth`, or `depth/depth/...` inside an interleave's
/// inputs) upstream first: by depth, and a stage nested in another before it.
fn upstream_first(a: &str, b: &str) -> std::cmp::Ordering {
    let parse = |k: &str| -> Vec<u64> { k.split('/').filter_map(|d| d.parse().ok()).collect() };
    let (a, b) = (parse(a), parse(b));
    for (x, y) in a.iter().zip(&b) {
        if x != y {
            return x.cmp(y);
        }
    }
    // One is nested in the other: the nested (longer) key comes first.
    b.len().cmp(&a.len())
}

fn base_name(name: &str) -> &str {
    name.split_once('.').map_or(name, |(base, _)| base)
}

/// Whether a row is an input of a combined pipeline (`sample_from[1]`,
/// `choose_from[selector]`) rather than a stage: stage names never end in `]`.
fn is_input_row(name: &str) -> bool {
    base_name(name).ends_with(']')
}

/// A snapshot of every stage, upstream first.
///
/// `Display` prints a table with one row per stage and names the bottleneck:
///
/// ```text
/// stage        in      out   MB out  par  busy ms  wait-in ms  blocked ms  first ms
/// tfrecord     0   500000    392.0    1     310.2        0.0       80.1       0.1
/// ...
/// bottleneck: tfrecord (busiest per worker; upstream blocks on it, downstream waits)
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelineMetrics {
    /// Since the pipeline started.
    pub elapsed_ns: u64,
    /// One entry per stage, upstream first.
    pub stages: Vec<StageMetrics>,
}

impl PipelineMetrics {
    /// The stage with the most busy time per worker, if any stage did work.
    pub fn bottleneck(&self) -> Option<&StageMetrics> {
        self.stages
            .iter()
            .filter(|s| s.busy_ns > 0 && !is_input_row(&s.name))
            .max_by_key(|s| s.busy_per_worker_ns())
    }

    /// The bottleneck stage's name (what the trainer's stall verdict names).
    pub fn bottleneck_stage(&self) -> Option<&str> {
        self.bottleneck().map(|s| s.name.as_str())
    }

    /// Of the inputs of combined pipelines (`zip`, `concatenate`,
    /// `sample_from`, `choose_from`), the one the combining stage waited on
    /// longest: the input that starves the mixture. Its row (named like
    /// `sample_from[1]`) counts the elements taken from that input and the
    /// time spent waiting for them; the input's own stages are the rows
    /// named `sample_from[1]/...`, and the busiest of them is why.
    pub fn starving_input(&self) -> Option<&StageMetrics> {
        self.stages
            .iter()
            .filter(|s| is_input_row(&s.name) && s.wait_in_ns > 0)
            .max_by_key(|s| s.wait_in_ns)
    }

    /// The stage named `name`.
    pub fn stage(&self, name: &str) -> Option<&StageMetrics> {
        self.stages.iter().find(|s| s.name == name)
    }
}

impl fmt::Display for PipelineMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |ns: u64| ns as f64 / 1e6;
        let width = self
            .stages
            .iter()
            .map(|s| s.name.len())
            .max()
            .unwrap_or(5)
            .max(5);
        writeln!(
            f,
            "{:<width$} {:>10} {:>10} {:>9} {:>3} {:>10} {:>10} {:>10} {:>9} {:>6}",
            "stage",
            "in",
            "out",
            "MB out",
            "par",
            "busy ms",
            "wait-in ms",
            "blocked ms",
            "first ms",
            "errors"
        )?;
        for s in &self.stages {
            writeln!(
                f,
                "{:<width$} {:>10} {:>10} {:>9.1} {:>3} {:>10.1} {:>10.1} {:>10.1} {:>9.2} {:>6}",
                s.name,
                s.elements_in,
                s.elements_out,
                s.bytes_out as f64 / 1e6,
                s.parallelism,
                ms(s.busy_ns),
                ms(s.wait_in_ns),
                ms(s.blocked_out_ns),
                ms(s.first_output_ns),
                s.errors + s.skipped,
            )?;
        }
        match self.bottleneck() {
            Some(b) => write!(
                f,
                "bottleneck: {} ({:.1} ms busy per worker of {:.1} ms)",
                b.name,
                ms(b.busy_per_worker_ns()),
                ms(self.elapsed_ns)
            ),
            None => write!(f, "bottleneck: none yet (no stage has done work)"),
        }?;
        if let Some(input) = self.starving_input() {
            let busiest = self
                .stages
                .iter()
                .filter(|s| s.name.starts_with(&format!("{}/", input.name)))
                .max_by_key(|s| s.busy_per_worker_ns());
            write!(
                f,
                "\nstarving: input {} ({:.1} ms waited on it{})",
                input.name,
                ms(input.wait_in_ns),
                busiest.map_or(String::new(), |s| format!(
                    "; its busiest stage is {}",
                    s.name
                )),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_reuses_keys_and_numbers_repeated_names() {
        let r = MetricsRegistry::new();
        let a = r.stage("0", "map");
        let b = r.stage("1", "map");
        let a2 = r.stage("0", "map");
        assert!(Arc::ptr_eq(&a, &a2));
        assert_eq!(b.name(), "map.2");
        a.add_busy(Duration::from_millis(5));
        b.add_busy(Duration::from_millis(7));
        let snap = r.snapshot();
        assert_eq!(snap.stages.len(), 2);
        assert_eq!(snap.bottleneck_stage(), Some("map.2"));
        let table = snap.to_string();
        assert!(table.contains("bottleneck: map.2"), "{table}");
    }

    #[test]
    fn snapshot_lists_stages_upstream_first() {
        let r = MetricsRegistry::new();
        for (key, name) in [
            ("2", "map"),
            ("1", "interleave"),
            ("0", "files"),
            ("1/0", "tfrecord"),
        ] {
            r.stage(key, name);
        }
        let names: Vec<String> = r.snapshot().stages.into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["files", "tfrecord", "interleave", "map"]);
    }

    #[test]
    fn bottleneck_divides_by_workers() {
        let r = MetricsRegistry::new();
        let a = r.stage("0", "read");
        let b = r.stage("1", "parse");
        a.add_busy(Duration::from_millis(6));
        b.add_busy(Duration::from_millis(10));
        b.set_parallelism(2);
        assert_eq!(r.snapshot().bottleneck_stage(), Some("read"));
    }

    #[test]
    fn first_output_keeps_the_first() {
        let c = StageCounters::new("s".into());
        c.set_first_output(Duration::from_millis(3));
        c.set_first_output(Duration::from_millis(9));
        assert_eq!(c.snapshot().first_output_ns, 3_000_000);
    }
}
