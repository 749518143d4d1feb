//! The dynamic batcher: one compute thread per model version that merges
//! the requests waiting for it into one forward pass and splits the
//! results back, row for row, to the requests they came from.
//!
//! # Bounds
//! The queue holds at most `max_enqueued_batches * max_batch_size` examples
//! (TF Serving's names): [`Batcher::submit`] refuses a request that would
//! overflow it at once ([`Submit::Full`], a 503), never queueing without
//! bound. A batch holds at most `max_batch_size` examples; a request larger
//! than that is refused before it gets here.
//!
//! # Merging
//! The compute thread takes the oldest request, then whatever else is
//! already queued, waiting up to `batch_timeout` after the first for more,
//! until the batch is full. A request that would overflow the batch starts
//! the next one. With batching off, each request is its own batch. A
//! request submitted as [`Wait::No`] (the server's own warm-up requests)
//! never waits for companions: its batch takes what is already queued and
//! runs at once, so the warm-up does not wait out the timeout once per
//! request before the server is ready.
//!
//! # Disconnection
//! Dropping the [`Batcher`] closes the queue; the compute thread answers
//! every request still queued, then ends, and the drop joins it. A request
//! whose client is gone is computed anyway (its reply is dropped).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

use crate::batch::Batch;
use crate::spawn::Thread;
use crate::train::{BatchTensors, Outputs, Predictor, TrainError, batch_to_tensors};

use super::ServeError;

/// How the batcher forms batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    /// Merge concurrent requests (`false`: one request per forward pass).
    pub enabled: bool,
    /// The most examples in one forward pass (and in one request).
    pub max_batch_size: usize,
    /// How long the first request of a batch waits for others.
    pub batch_timeout: Duration,
    /// The queue holds this many full batches' worth of examples.
    pub max_enqueued_batches: usize,
}

impl Default for BatchOptions {
    fn default() -> BatchOptions {
        BatchOptions {
            enabled: true,
            max_batch_size: 256,
            batch_timeout: Duration::ZERO,
            max_enqueued_batches: 64,
        }
    }
}

impl BatchOptions {
    /// The batch sizes warm-up runs: powers of two up to the maximum, and
    /// the maximum (the batches the GEMM kernels see change their blocking
    /// at these sizes; see `docs/serve.md`).
    pub fn warmup_sizes(&self) -> Vec<usize> {
        let mut sizes = Vec::new();
        let mut n = 1;
        while n < self.max_batch_size {
            sizes.push(n);
            n *= 2;
        }
        sizes.push(self.max_batch_size.max(1));
        sizes
    }
}

/// A request's answer: its rows of the batch's outputs, or why the batch failed.
pub type Reply = Result<Outputs, Arc<TrainError>>;

/// Whether a request may wait `batch_timeout` for others to share its
/// forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Up to the timeout (a client's request).
    Yes,
    /// Not at all: the batch runs with what is already queued (the
    /// server's warm-up, whose requests come one at a time, so that each
    /// would wait out the whole timeout).
    No,
}

/// One request in the queue.
struct Job {
    batch: Batch,
    reply: Sender<Reply>,
    wait: Wait,
}

/// What [`Batcher::submit`] did.
pub enum Submit {
    /// Queued: the reply comes on this channel.
    Queued(Receiver<Reply>),
    /// The queue is full: answer 503 now.
    Full,
    /// The version is shutting down.
    Closed,
}

/// Counters the metrics read.
#[derive(Debug, Default)]
pub struct BatchStats {
    /// Examples queued now.
    pub queued: AtomicUsize,
    /// Forward passes run.
    pub batches: AtomicU64,
    /// Examples predicted.
    pub examples: AtomicU64,
    /// Forward passes by size: bucket `i` counts batches of at most `2^i` examples.
    pub sizes: [AtomicU64; 16],
}

impl BatchStats {
    fn record(&self, rows: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.examples.fetch_add(rows as u64, Ordering::Relaxed);
        let bucket = (usize::BITS - rows.saturating_sub(1).leading_zeros()) as usize;
        self.sizes[bucket.min(15)].fetch_add(1, Ordering::Relaxed);
    }
}

/// The queue and the compute thread of one model version.
pub struct Batcher {
    tx: Option<Sender<Job>>,
    capacity: usize,
    stats: Arc<BatchStats>,
    thread: Option<Thread<()>>,
}

impl Batcher {
    /// Starts the compute thread, which first runs `prepare` (load the
    /// model and warm it up, so whatever a first call pays is paid on the
    /// thread that will compute), then serves the queue. Returns once
    /// `prepare` is done, with what it returned beside the predictor.
    pub fn start<T: Send + 'static>(
        name: String,
        options: BatchOptions,
        prepare: impl FnOnce() -> Result<(Predictor, T), ServeError> + Send + 'static,
    ) -> Result<(Batcher, T), ServeError> {
        let capacity = options
            .max_enqueued_batches
            .saturating_mul(options.max_batch_size)
            .max(1);
        let (tx, rx) = crossbeam_channel::bounded(capacity);
        let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
        let stats = Arc::new(BatchStats::default());
        let thread_stats = stats.clone();
        let thread = Thread::spawn(name, move |_cancel| match prepare() {
            Ok((predictor, info)) => {
                let _ = ready_tx.send(Ok(info));
                drop(ready_tx);
                compute(&predictor, &rx, options, &thread_stats);
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|e| ServeError::Spawn("compute", e))?;
        match ready_rx.recv() {
            Ok(Ok(info)) => Ok((
                Batcher {
                    tx: Some(tx),
                    capacity,
                    stats,
                    thread: Some(thread),
                },
                info,
            )),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            // The body panicked before it answered.
            Err(_) => Err(match thread.join() {
                Err(panicked) => ServeError::Panic(panicked),
                Ok(()) => ServeError::Panic(crate::spawn::Panicked {
                    thread: "compute".into(),
                    message: "ended without loading the model".into(),
                }),
            }),
        }
    }

    /// Queues `batch`, unless the queue is full; `wait`: whether its batch
    /// may wait for companions.
    pub fn submit(&self, batch: Batch, wait: Wait) -> Submit {
        let Some(tx) = &self.tx else {
            return Submit::Closed;
        };
        let rows = batch.num_rows;
        let before = self.stats.queued.fetch_add(rows, Ordering::SeqCst);
        if before + rows > self.capacity {
            self.stats.queued.fetch_sub(rows, Ordering::SeqCst);
            return Submit::Full;
        }
        let (reply, answer) = crossbeam_channel::bounded(1);
        match tx.try_send(Job { batch, reply, wait }) {
            Ok(()) => Submit::Queued(answer),
            Err(e) => {
                self.stats.queued.fetch_sub(rows, Ordering::SeqCst);
                match e {
                    TrySendError::Full(_) => Submit::Full,
                    TrySendError::Disconnected(_) => Submit::Closed,
                }
            }
        }
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<BatchStats> {
        &self.stats
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        // Close the queue first: the thread answers what is queued, then ends.
        self.tx.take();
        if let Some(thread) = self.thread.take() {
            // A panic in the compute thread was already answered as errors.
            let _ = thread.join();
        }
    }
}

/// The compute thread's loop: until the queue closes and empties.
fn compute(predictor: &Predictor, rx: &Receiver<Job>, options: BatchOptions, stats: &BatchStats) {
    let mut carried: Option<Job> = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let mut jobs = vec![first];
        if options.enabled {
            carried = gather(rx, &mut jobs, options);
        }
        run(predictor, jobs, stats);
    }
}

/// Adds queued jobs to `jobs` up to the batch size, waiting up to the
/// timeout unless a job may not wait; returns a job that did not fit (it
/// starts the next batch).
fn gather(rx: &Receiver<Job>, jobs: &mut Vec<Job>, options: BatchOptions) -> Option<Job> {
    let deadline = Instant::now() + options.batch_timeout;
    let mut rows: usize = jobs.iter().map(|j| j.batch.num_rows).sum();
    while rows < options.max_batch_size {
        let hurry = jobs.iter().any(|j| j.wait == Wait::No);
        let next = match rx.try_recv() {
            Ok(job) => job,
            Err(_) if options.batch_timeout.is_zero() || hurry => return None,
            Err(_) => match rx.recv_deadline(deadline) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            },
        };
        if rows + next.batch.num_rows > options.max_batch_size {
            return Some(next);
        }
        rows += next.batch.num_rows;
        jobs.push(next);
    }
    None
}

/// One forward pass over `jobs`, the results split back to each.
fn run(predictor: &Predictor, jobs: Vec<Job>, stats: &BatchStats) {
    let rows: Vec<usize> = jobs.iter().map(|j| j.batch.num_rows).collect();
    let total: usize = rows.iter().sum();
    let (batches, replies): (Vec<Batch>, Vec<Sender<Reply>>) =
        jobs.into_iter().map(|j| (j.batch, j.reply)).unzip();
    let result = forward(predictor, batches);
    stats.queued.fetch_sub(total, Ordering::SeqCst);
    stats.record(total);
    match result {
        Ok(outputs) => {
            let mut start = 0;
            for (reply, n) in replies.into_iter().zip(rows) {
                // A client that gave up has dropped its receiver: nothing to do.
                let _ = reply.send(Ok(slice(&outputs, start..start + n)));
                start += n;
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// The model's outputs for the rows of `batches`, in order.
pub fn forward(predictor: &Predictor, mut batches: Vec<Batch>) -> Result<Outputs, TrainError> {
    let batch = if batches.len() == 1 {
        batches.pop().unwrap_or_default()
    } else {
        Batch::concat(&batches).map_err(|e| TrainError::Input {
            batch: 0,
            reason: e.to_string(),
        })?
    };
    let tensors = to_tensors(predictor, batch)?;
    predictor.outputs(&tensors)
}

/// A batch as the model's tensors (no label: requests carry none).
pub fn to_tensors(predictor: &Predictor, batch: Batch) -> Result<BatchTensors, TrainError> {
    let spec = crate::train::InputSpec {
        label: None,
        ..predictor.meta().input.clone()
    };
    batch_to_tensors(batch, &spec, 0, predictor.device())
}

/// Rows `range` of `outputs`.
pub fn slice(outputs: &Outputs, range: std::ops::Range<usize>) -> Outputs {
    match outputs {
        Outputs::Classes {
            ids,
            probabilities,
            classes,
        } => Outputs::Classes {
            ids: ids[range.clone()].to_vec(),
            probabilities: probabilities[range.start * classes..range.end * classes].to_vec(),
            classes: *classes,
        },
        Outputs::Values(v) => Outputs::Values(v[range].to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_sizes_cover_powers_of_two_and_the_maximum() {
        let sizes = |max| {
            BatchOptions {
                max_batch_size: max,
                ..BatchOptions::default()
            }
            .warmup_sizes()
        };
        assert_eq!(sizes(1), vec![1]);
        assert_eq!(sizes(8), vec![1, 2, 4, 8]);
        assert_eq!(sizes(100), vec![1, 2, 4, 8, 16, 32, 64, 100]);
    }

    #[test]
    fn slices_split_rows_exactly() {
        let out = Outputs::Classes {
            ids: vec![0, 1, 2],
            probabilities: vec![1.0, 0.0, 0.5, 0.5, 0.0, 1.0],
            classes: 2,
        };
        assert_eq!(
            slice(&out, 1..3),
            Outputs::Classes {
                ids: vec![1, 2],
                probabilities: vec![0.5, 0.5, 0.0, 1.0],
                classes: 2
            }
        );
        assert_eq!(
            slice(&Outputs::Values(vec![1.0, 2.0]), 0..1),
            Outputs::Values(vec![1.0])
        );
    }
}
