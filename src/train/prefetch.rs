//! Where batches come from, and the device-prefetch stage.
//!
//! A [`BatchStream`] is anything that yields batches (a pipeline, an
//! iterator over memory, a generator) and can name its bottleneck stage.
//! [`DevicePrefetch`] pulls from it on its own thread and turns each batch
//! into tensors on the target device (on the CPU: the conversion to tensors)
//! while the training step computes, `depth` batches ahead.
//!
//! # Shutdown
//! Dropping a [`DevicePrefetch`] sets its stop flag, drops the receiver (so a
//! worker blocked in `send` wakes with an error) and joins the worker. The
//! worker checks the flag between batches, so the join waits at most for the
//! stream's current `next_batch`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::Device;
use crossbeam_channel::{Receiver, bounded};

use super::tensor::{BatchTensors, InputSpec, batch_to_tensors};
use super::{TrainError, panic_text};
use crate::batch::Batch;

/// A boxed error from a data source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A source of batches for training, evaluation or prediction.
pub trait BatchStream: Send {
    /// The next batch, an error, or `None` at the end of the data.
    fn next_batch(&mut self) -> Option<Result<Batch, BoxError>>;

    /// The name of the source's slowest stage, from its metrics, if it has any.
    fn bottleneck_stage(&self) -> Option<String> {
        None
    }
}

/// Any iterator of `Result<Batch, E>` as a [`BatchStream`] without metrics.
///
/// ```
/// use tfpipe::train::{BatchStream, IterStream};
/// use tfpipe::Batch;
///
/// let batches = vec![Ok::<_, std::io::Error>(Batch::default())];
/// let mut stream = IterStream(batches.into_iter());
/// assert!(stream.next_batch().is_some());
/// assert!(stream.next_batch().is_none());
/// ```
pub struct IterStream<I>(pub I);

impl<I, E> BatchStream for IterStream<I>
where
    I: Iterator<Item = Result<Batch, E>> + Send,
    E: Into<BoxError>,
{
    fn next_batch(&mut self) -> Option<Result<Batch, BoxError>> {
        self.0.next().map(|r| r.map_err(Into::into))
    }
}

/// An iterator plus a function that reads its bottleneck stage (e.g. from a
/// pipeline's metrics).
pub struct WithBottleneck<I, F> {
    /// The batches.
    pub iter: I,
    /// Names the slowest stage of `iter`.
    pub bottleneck: F,
}

impl<I, E, F> BatchStream for WithBottleneck<I, F>
where
    I: Iterator<Item = Result<Batch, E>> + Send,
    E: Into<BoxError>,
    F: Fn(&I) -> Option<String> + Send,
{
    fn next_batch(&mut self) -> Option<Result<Batch, BoxError>> {
        self.iter.next().map(|r| r.map_err(Into::into))
    }

    fn bottleneck_stage(&self) -> Option<String> {
        (self.bottleneck)(&self.iter)
    }
}

impl<S: BatchStream + ?Sized> BatchStream for Box<S> {
    fn next_batch(&mut self) -> Option<Result<Batch, BoxError>> {
        (**self).next_batch()
    }

    fn bottleneck_stage(&self) -> Option<String> {
        (**self).bottleneck_stage()
    }
}

/// A running pipeline of batches; its bottleneck comes from its stage metrics.
impl BatchStream for crate::pipeline::PipelineIter<Batch> {
    fn next_batch(&mut self) -> Option<Result<Batch, BoxError>> {
        self.next().map(|r| r.map_err(Into::into))
    }

    fn bottleneck_stage(&self) -> Option<String> {
        self.metrics().bottleneck_stage().map(str::to_string)
    }
}

/// What the prefetch worker sends.
#[derive(Debug)]
pub(crate) enum Fetched {
    /// Tensors ready on the device, with the conversion + copy time.
    Batch {
        tensors: BatchTensors,
        copy: Duration,
        bottleneck: Option<String>,
    },
    /// The end of the stream.
    End { bottleneck: Option<String> },
}

/// How often (in batches) the worker asks the stream for its bottleneck:
/// often enough to be current when training stops mid-epoch, rarely enough
/// that snapshotting metrics costs nothing measurable.
const BOTTLENECK_EVERY: u64 = 16;

/// The device-prefetch stage: a worker thread that converts batches to
/// device tensors `depth` ahead of the consumer.
pub(crate) struct DevicePrefetch {
    rx: Option<Receiver<Result<Fetched, TrainError>>>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

impl DevicePrefetch {
    /// Starts the worker. `first_index` numbers batches for error messages.
    pub(crate) fn spawn<S: BatchStream + 'static>(
        mut stream: S,
        spec: InputSpec,
        device: Device,
        depth: usize,
        first_index: u64,
    ) -> Result<DevicePrefetch, TrainError> {
        let (tx, rx) = bounded(depth.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let worker = std::thread::Builder::new()
            .name("tfpipe-device-prefetch".into())
            .spawn(move || {
                let mut index = first_index;
                while !flag.load(Ordering::Relaxed) {
                    let item = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        match stream.next_batch() {
                            None => Ok(Fetched::End {
                                bottleneck: stream.bottleneck_stage(),
                            }),
                            Some(Err(e)) => Err(TrainError::Data(e)),
                            Some(Ok(batch)) => {
                                let start = Instant::now();
                                let tensors = batch_to_tensors(batch, &spec, index, &device)?;
                                // On CUDA the copy is asynchronous: time it to completion.
                                device
                                    .synchronize()
                                    .map_err(TrainError::candle("host-to-device copy"))?;
                                let copy = start.elapsed();
                                let bottleneck = if (index - first_index) % BOTTLENECK_EVERY == 0 {
                                    stream.bottleneck_stage()
                                } else {
                                    None
                                };
                                Ok(Fetched::Batch {
                                    tensors,
                                    copy,
                                    bottleneck,
                                })
                            }
                        }
                    }))
                    .unwrap_or_else(|p| Err(TrainError::Panic("data source", panic_text(&*p))));
                    index += 1;
                    let last = !matches!(item, Ok(Fetched::Batch { .. }));
                    // A failed send means the consumer is gone: stop quietly.
                    if tx.send(item).is_err() || last {
                        break;
                    }
                }
            })
            .map_err(|e| TrainError::Panic("device prefetch", format!("cannot start: {e}")))?;
        Ok(DevicePrefetch {
            rx: Some(rx),
            stop,
            worker: Some(worker),
        })
    }

    /// The next item; blocks while the worker is behind (that is the data wait).
    pub(crate) fn recv(&self) -> Result<Fetched, TrainError> {
        match self.rx.as_ref().map(|rx| rx.recv()) {
            Some(Ok(item)) => item,
            // The worker ended without an End item: only after a panic that
            // escaped catch_unwind, which join reports.
            _ => Err(TrainError::Panic(
                "device prefetch",
                "worker ended early".into(),
            )),
        }
    }
}

impl Drop for DevicePrefetch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Drop the receiver first: a worker blocked in `send` then returns.
        self.rx = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Column, Values};

    fn batch(rows: usize) -> Batch {
        Batch {
            num_rows: rows,
            columns: vec![Column {
                name: "x".into(),
                values: Values::Float32(vec![0.5; rows]),
                row_splits: vec![],
                inner_shape: vec![1],
            }],
        }
    }

    fn spec() -> InputSpec {
        InputSpec {
            features: vec![("x".into(), 1)],
            label: None,
            classes: 2,
            standardize: vec![],
        }
    }

    #[test]
    fn delivers_then_ends_with_bottleneck() {
        let stream = WithBottleneck {
            iter: (0..3).map(|_| Ok::<_, std::io::Error>(batch(2))),
            bottleneck: |_: &_| Some("parse".to_string()),
        };
        let p = DevicePrefetch::spawn(stream, spec(), Device::Cpu, 2, 0).unwrap();
        for _ in 0..3 {
            assert!(
                matches!(p.recv().unwrap(), Fetched::Batch { tensors, .. } if tensors.rows == 2)
            );
        }
        assert!(matches!(p.recv().unwrap(), Fetched::End { bottleneck: Some(s) } if s == "parse"));
    }

    #[test]
    fn errors_and_panics_arrive_as_errors() {
        let items = vec![Err(std::io::Error::other("disk on fire"))];
        let p = DevicePrefetch::spawn(IterStream(items.into_iter()), spec(), Device::Cpu, 1, 0)
            .unwrap();
        assert!(p.recv().unwrap_err().to_string().contains("disk on fire"));

        let panicking = (0..1).map(|_| -> Result<Batch, std::io::Error> { panic!("boom") });
        let p = DevicePrefetch::spawn(IterStream(panicking), spec(), Device::Cpu, 1, 0).unwrap();
        assert!(p.recv().unwrap_err().to_string().contains("boom"));
    }

    #[test]
    fn drop_mid_stream_joins_promptly() {
        let endless = std::iter::repeat_with(|| Ok::<_, std::io::Error>(batch(1)));
        let p = DevicePrefetch::spawn(IterStream(endless), spec(), Device::Cpu, 1, 0).unwrap();
        assert!(p.recv().is_ok());
        let start = Instant::now();
        drop(p);
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
