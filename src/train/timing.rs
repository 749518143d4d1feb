//! Step-phase timing: an hdrhistogram per phase plus an exact total.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// The longest duration a histogram resolves (longer ones saturate): one hour.
const MAX_NS: u64 = 3_600_000_000_000;

/// One phase's durations (data wait, copy, compute, ...), in nanoseconds with
/// three significant digits, and their exact sum.
#[derive(Debug, Clone)]
pub struct Phase {
    hist: Histogram<u64>,
    total: Duration,
}

impl Default for Phase {
    fn default() -> Self {
        Phase::new()
    }
}

impl Phase {
    /// An empty phase.
    pub fn new() -> Phase {
        Phase {
            // Constant bounds that hdrhistogram accepts (no input reaches
            // this); `auto` grows the histogram rather than drop a value.
            hist: {
                let mut h =
                    Histogram::new_with_bounds(1, MAX_NS, 3).expect("valid constant bounds");
                h.auto(true);
                h
            },
            total: Duration::ZERO,
        }
    }

    /// Records one duration.
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.hist.saturating_record(ns);
        self.total += d;
    }

    /// The number of recorded durations.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The exact sum of the recorded durations.
    pub fn total(&self) -> Duration {
        self.total
    }

    /// The value at `quantile` (0..=1), or zero when empty.
    pub fn quantile(&self, quantile: f64) -> Duration {
        if self.hist.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.hist.value_at_quantile(quantile))
    }

    /// Total, p50, p90, p99 and max in milliseconds.
    pub fn summary(&self) -> PhaseSummary {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        PhaseSummary {
            total: ms(self.total),
            p50: ms(self.quantile(0.5)),
            p90: ms(self.quantile(0.9)),
            p99: ms(self.quantile(0.99)),
            max: if self.hist.is_empty() {
                0.0
            } else {
                ms(Duration::from_nanos(self.hist.max()))
            },
        }
    }
}

/// A phase in milliseconds, as the report prints it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseSummary {
    /// The sum over all steps.
    pub total: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// The longest.
    pub max: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_total() {
        let mut p = Phase::new();
        for ms in 1..=100u64 {
            p.record(Duration::from_millis(ms));
        }
        let s = p.summary();
        assert_eq!(p.count(), 100);
        assert!((s.total - 5050.0).abs() < 1e-6);
        assert!((s.p50 - 50.0).abs() < 0.1, "{s:?}");
        assert!((s.p99 - 99.0).abs() < 0.1, "{s:?}");
        assert!((s.max - 100.0).abs() < 0.1, "{s:?}");
        assert_eq!(Phase::new().summary(), PhaseSummary::default());
    }
}
