//! Records without a label: an error by default, or skipped and counted
//! when the user asks ([`MissingLabels::skip`]).
//!
//! A label is never filled in with a default (see `InputSpec::from_schema`),
//! so a record that lacks it fails to parse, naming its file and record.
//! Skipping drops exactly those errors (a missing label, nothing else: a
//! malformed record or a mistyped label still stops the run) and counts
//! them, so the report says how many records the run did not train on.

use std::sync::{Arc, Mutex, PoisonError};

use crate::batch::Batch;
use crate::pipeline::{Pipeline, PipelineError};

/// What a record without its label does to a run: an error naming it (the
/// default), or, with [`skip`](Self::skip), skipped and counted. Clones
/// share the count.
///
/// ```
/// use tfpipe::train::MissingLabels;
/// let policy = MissingLabels::skip();
/// assert!(policy.skips() && !MissingLabels::default().skips());
/// assert_eq!(policy.skipped(), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct MissingLabels {
    skip: bool,
    /// The epoch counted (the first one a skipped record came from) and
    /// the records skipped in it.
    count: Arc<Mutex<(Option<u64>, u64)>>,
}

impl MissingLabels {
    /// Records without a label are skipped and counted.
    pub fn skip() -> MissingLabels {
        MissingLabels {
            skip: true,
            count: Arc::default(),
        }
    }

    /// Whether records without a label are skipped.
    pub fn skips(&self) -> bool {
        self.skip
    }

    /// Records skipped for lacking their label in one epoch: the first
    /// epoch read that had any (for a run resumed inside an epoch, the part
    /// of it read). Every epoch reads the same records, so the others skip
    /// as many; the pipeline reads ahead into the next epoch, so counting
    /// every skip would count some twice.
    pub fn skipped(&self) -> u64 {
        self.lock().1
    }

    /// The same policy with a count of its own (for other data, such as
    /// validation data, counted apart).
    pub fn fresh(&self) -> MissingLabels {
        MissingLabels {
            skip: self.skip,
            count: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<u64>, u64)> {
        self.count.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a skip in `epoch`.
    fn count(&self, epoch: u64) {
        let mut count = self.lock();
        let counted = *count.0.get_or_insert(epoch);
        if counted == epoch {
            count.1 += 1;
        }
    }

    /// `batches` parsed with `label` as their label, with the records that
    /// lack it skipped and counted when this policy skips them; `first` is
    /// the run's epoch the pipeline starts in (it counts its own from 0).
    pub(crate) fn apply(
        &self,
        label: Option<&str>,
        first: u64,
        batches: Pipeline<Batch>,
    ) -> Pipeline<Batch> {
        let (true, Some(label)) = (self.skip, label) else {
            return batches;
        };
        let label = label.to_string();
        let policy = self.clone();
        batches.ignore_errors_if(move |error, epoch| {
            let missing = is_missing(error, &label);
            if missing {
                policy.count(first + epoch);
            }
            missing
        })
    }
}

/// Whether `error` is a record that lacks the feature `label`.
pub(crate) fn is_missing(error: &PipelineError, label: &str) -> bool {
    error
        .parse_error()
        .is_some_and(|e| e.is_missing() && e.feature() == Some(label))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_epoch_is_counted_and_clones_share_it_but_fresh_ones_do_not() {
        let policy = MissingLabels::skip();
        let clone = policy.clone();
        // The first epoch with a skip is the one counted (a resumed run
        // may start in epoch 3); read-ahead into epoch 4 is not counted.
        policy.count(3);
        clone.count(3);
        policy.count(4);
        assert_eq!(policy.skipped(), 2);
        let fresh = policy.fresh();
        assert!(fresh.skips());
        assert_eq!(fresh.skipped(), 0);
        assert!(!MissingLabels::default().skips());
    }
}
