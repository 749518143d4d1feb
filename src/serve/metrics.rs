//! Prometheus text at `/metrics`: requests by model, version and code; a
//! latency histogram per model (an hdrhistogram, as the training timings
//! keep); batch sizes and queue depth per version; load and warm-up time
//! per version; process start to ready.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::ApiError;
use super::http::Response;
use super::server::Shared;

/// Latency bucket bounds, seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// The counters the connection threads update.
#[derive(Default)]
pub(crate) struct Metrics {
    /// (model, version, code) -> requests. Requests about no model have model "".
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    /// model -> latency in microseconds.
    latency: Mutex<BTreeMap<String, Histogram<u64>>>,
}

impl Metrics {
    /// Metrics with a latency histogram for each of `models` already made:
    /// a histogram (about 180 KB of counters) is allocated once at start,
    /// not by a model's first request.
    pub fn for_models<'a>(models: impl IntoIterator<Item = &'a str>) -> Metrics {
        let metrics = Metrics::default();
        {
            let mut latency = metrics
                .latency
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for model in models {
                if let Some(h) = new_histogram() {
                    latency.insert(model.to_string(), h);
                }
            }
        }
        metrics
    }

    /// Counts one answered request.
    pub fn record(&self, labels: Option<&(String, String)>, code: u16, took: Duration) {
        let (model, version) = labels.cloned().unwrap_or_default();
        *self
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((model.clone(), version, code))
            .or_default() += 1;
        if model.is_empty() {
            return;
        }
        let mut latency = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        if !latency.contains_key(&model) {
            let Some(h) = new_histogram() else {
                return;
            };
            latency.insert(model.clone(), h);
        }
        if let Some(h) = latency.get_mut(&model) {
            h.saturating_record(took.as_micros().max(1) as u64);
        }
    }

    /// The exposition text.
    pub fn render(&self, shared: &Shared) -> Result<Response, ApiError> {
        let mut out = String::with_capacity(4096);
        self.render_requests(&mut out);
        self.render_latency(&mut out);
        render_versions(shared, &mut out);
        if let Some(ms) = shared.ready_ms.get() {
            let _ = writeln!(
                out,
                "# HELP tfpipe_serve_start_to_ready_seconds Process start to every model ready.\n# TYPE tfpipe_serve_start_to_ready_seconds gauge\ntfpipe_serve_start_to_ready_seconds {}",
                ms / 1e3
            );
        }
        Ok(Response {
            status: 200,
            content_type: "text/plain; version=0.0.4",
            body: out.into_bytes(),
        })
    }

    fn render_requests(&self, out: &mut String) {
        out.push_str("# HELP tfpipe_serve_requests_total Requests answered, by model, version and HTTP code.\n# TYPE tfpipe_serve_requests_total counter\n");
        let requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        for ((model, version, code), n) in requests.iter() {
            let _ = writeln!(
                out,
                "tfpipe_serve_requests_total{{model=\"{}\",version=\"{}\",code=\"{code}\"}} {n}",
                escape(model),
                escape(version)
            );
        }
    }

    fn render_latency(&self, out: &mut String) {
        out.push_str("# HELP tfpipe_serve_request_duration_seconds Request latency, read to written, by model.\n# TYPE tfpipe_serve_request_duration_seconds histogram\n");
        let latency = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        for (model, h) in latency.iter() {
            let model = escape(model);
            for bound in LATENCY_BUCKETS {
                let us = (bound * 1e6) as u64;
                let n = h.count_between(0, us);
                let _ = writeln!(
                    out,
                    "tfpipe_serve_request_duration_seconds_bucket{{model=\"{model}\",le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "tfpipe_serve_request_duration_seconds_bucket{{model=\"{model}\",le=\"+Inf\"}} {}\ntfpipe_serve_request_duration_seconds_sum{{model=\"{model}\"}} {}\ntfpipe_serve_request_duration_seconds_count{{model=\"{model}\"}} {}",
                h.len(),
                h.mean() * h.len() as f64 / 1e6,
                h.len()
            );
        }
    }
}

/// A latency histogram: 1 us to 1 h at 3 significant digits.
fn new_histogram() -> Option<Histogram<u64>> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).ok()
}

/// Per version: batch sizes, queue depth, load and warm-up times.
fn render_versions(shared: &Shared, out: &mut String) {
    out.push_str("# HELP tfpipe_serve_batch_size Examples per forward pass, by model and version.\n# TYPE tfpipe_serve_batch_size histogram\n");
    let mut queue = String::new();
    for model in &shared.models {
        for v in model.loaded() {
            let stats = v.batcher.stats();
            let labels = format!("model=\"{}\",version=\"{}\"", escape(&model.name), v.number);
            let mut cumulative = 0;
            for (i, bucket) in stats.sizes.iter().enumerate() {
                cumulative += bucket.load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "tfpipe_serve_batch_size_bucket{{{labels},le=\"{}\"}} {cumulative}",
                    1u64 << i
                );
            }
            let batches = stats.batches.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "tfpipe_serve_batch_size_bucket{{{labels},le=\"+Inf\"}} {batches}\ntfpipe_serve_batch_size_sum{{{labels}}} {}\ntfpipe_serve_batch_size_count{{{labels}}} {batches}",
                stats.examples.load(Ordering::Relaxed)
            );
            let _ = writeln!(
                queue,
                "tfpipe_serve_queue_examples{{{labels}}} {}",
                stats.queued.load(Ordering::Relaxed)
            );
        }
    }
    out.push_str("# HELP tfpipe_serve_queue_examples Examples waiting for the compute thread.\n# TYPE tfpipe_serve_queue_examples gauge\n");
    out.push_str(&queue);
    let mut load = String::new();
    let mut warm = String::new();
    for model in &shared.models {
        for s in model.statuses(None).unwrap_or_default() {
            let labels = format!(
                "model=\"{}\",version=\"{}\"",
                escape(&model.name),
                s.version
            );
            if let Some(ms) = s.load_ms {
                let _ = writeln!(load, "tfpipe_serve_load_seconds{{{labels}}} {}", ms / 1e3);
            }
            if let Some(ms) = s.warmup_ms {
                let _ = writeln!(warm, "tfpipe_serve_warmup_seconds{{{labels}}} {}", ms / 1e3);
            }
        }
    }
    out.push_str("# HELP tfpipe_serve_load_seconds Checkpoint load time per version.\n# TYPE tfpipe_serve_load_seconds gauge\n");
    out.push_str(&load);
    out.push_str("# HELP tfpipe_serve_warmup_seconds Warm-up time per version.\n# TYPE tfpipe_serve_warmup_seconds gauge\n");
    out.push_str(&warm);
}

/// A label value in Prometheus' escaping.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
