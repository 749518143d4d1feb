//! Where batches come from, and the device-prefetch stage.
//!
//! A [`BatchStream`] is anything that yields batches (a pipeline, an
//! iterator over memory, a generator) and can name its bottleneck stage.
//! [`DevicePrefetch`] pulls from it on its own thread and turns each batch
//! into tensors on the target device (on the CPU: the conversion to tensors)
//! while the training step computes, `depth` batches ahead.
//!
//! # Shutdown
//! The worker is a [`Thread`]: dropping a [`DevicePrefetch`] cancels it
//! (which wakes a worker blocked sending) and joins it, whatever the order of
//! the fields. The worker checks for cancellation between batches, so the
//! join waits at most for the stream's current `next_batch`. A panic in the
//! stream becomes [`TrainError::Panic`] naming the thread.

use std::time::{Duration, Instant};

use candle_core::Device;
use crossbeam_channel::{Receiver, bounded};

use super::TrainError;
use super::tensor::{BatchTensors, InputSpec, batch_to_tensors};
use crate::batch::Batch;
use crate::spawn::Thread;

/// A boxed error from a data source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A batch, or the end of an epoch.
#[derive(Debug)]
pub enum BatchEvent {
    /// The next batch.
    Batch(Batch),
    /// An epoch ended (a pipeline's `repeat` marker); more batches may follow.
    EpochEnd,
}

/// A source of batches for training, evaluation or prediction.
pub trait BatchStream: Send {
    /// The next batch, an error, or `None` at the end of the data.
    fn next_batch(&mut self) -> Option<Result<Batch, BoxError>>;

    /// The next batch or epoch marker. By default every item is a batch:
    /// a stream without markers is one epoch.
    fn next_event(&mut self) -> Option<Result<BatchEvent, BoxError>> {
        self.next_batch().map(|r| r.map(BatchEvent::Batch))
    }

    /// The name of the source's slowest stage, from its metrics, if it has any.
    fn bottleneck_stage(&self) -> Option<String> {
        None
    }

    /// Where the stream stands after the last event it returned, as JSON a
    /// restart can begin from (a pipeline's [`PipelineState`](crate::pipeline::PipelineState)).
    /// `None`: this kind of stream has no position (by default);
    /// `Some(Err(why))`: it has one but cannot capture it now.
    fn position(&self) -> Option<Result<serde_json::Value, String>> {
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

    fn next_event(&mut self) -> Option<Result<BatchEvent, BoxError>> {
        (**self).next_event()
    }

    fn bottleneck_stage(&self) -> Option<String> {
        (**self).bottleneck_stage()
    }

    fn position(&self) -> Option<Result<serde_json::Value, String>> {
        (**self).position()
    }
}

/// A running pipeline of batches; its bottleneck comes from its stage
/// metrics, its epoch markers end epochs.
impl BatchStream for crate::pipeline::PipelineIter<Batch> {
    fn next_batch(&mut self) -> Option<Result<Batch, BoxError>> {
        self.next().map(|r| r.map_err(Into::into))
    }

    fn next_event(&mut self) -> Option<Result<BatchEvent, BoxError>> {
        Some(match self.next_event()? {
            crate::pipeline::Event::Item(Ok(batch)) => Ok(BatchEvent::Batch(batch)),
            crate::pipeline::Event::Item(Err(e)) => Err(e.into()),
            crate::pipeline::Event::EpochEnd(_) => Ok(BatchEvent::EpochEnd),
        })
    }

    fn bottleneck_stage(&self) -> Option<String> {
        self.metrics().bottleneck_stage().map(str::to_string)
    }

    fn position(&self) -> Option<Result<serde_json::Value, String>> {
        Some(
            self.state()
                .map_err(|e| e.to_string())
                .and_then(|s| serde_json::to_value(s).map_err(|e| e.to_string())),
        )
    }
}

/// What the prefetch worker sends.
#[derive(Debug)]
pub(crate) enum Fetched {
    /// Tensors ready on the device, with the conversion + copy time, and
    /// now and then the stream's position after this batch.
    Batch {
        tensors: BatchTensors,
        copy: Duration,
        bottleneck: Option<String>,
        position: Option<Result<serde_json::Value, String>>,
    },
    /// An epoch marker, with the stream's position after it.
    EpochEnd {
        position: Option<Result<serde_json::Value, String>>,
    },
    /// The end of the stream.
    End { bottleneck: Option<String> },
}

/// How often (in batches) the worker asks the stream for its bottleneck:
/// often enough to be current when training stops mid-epoch, rarely enough
/// that snapshotting metrics costs nothing measurable.
const BOTTLENECK_EVERY: u64 = 16;

/// How often (in events) the stream's position is captured, besides at
/// every epoch marker. A restart begins at the last capture and skips the
/// events after it, so this bounds the work redone on resume; capturing a
/// pipeline's state with a 10k shuffle buffer costs about as much as a few
/// small training steps, so it is not done every step.
pub(crate) const POSITION_EVERY: u64 = 64;

/// Captures a stream's position now and then: at the first event, every
/// [`POSITION_EVERY`] events, and at epoch markers.
#[derive(Debug, Default)]
pub(crate) struct PositionTaker {
    since: Option<u64>,
}

impl PositionTaker {
    /// The position after the event just taken from `stream`, when due.
    pub(crate) fn take(
        &mut self,
        stream: &dyn BatchStream,
        marker: bool,
    ) -> Option<Result<serde_json::Value, String>> {
        let due = marker || self.since.is_none_or(|n| n + 1 >= POSITION_EVERY);
        if !due {
            self.since = self.since.map(|n| n + 1);
            return None;
        }
        self.since = Some(0);
        stream.position()
    }
}

/// The device-prefetch stage: a worker thread that converts batches to
/// device tensors `depth` ahead of the consumer.
pub(crate) struct DevicePrefetch {
    rx: Receiver<Result<Fetched, TrainError>>,
    worker: Option<Thread<()>>,
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
        let worker = Thread::spawn("tfpipe-device-prefetch", move |cancel| {
            let mut index = first_index;
            let mut positions = PositionTaker::default();
            while !cancel.is_cancelled() {
                let item = match stream.next_event() {
                    None => Ok(Fetched::End {
                        bottleneck: stream.bottleneck_stage(),
                    }),
                    Some(Err(e)) => Err(TrainError::data(e)),
                    Some(Ok(BatchEvent::EpochEnd)) => Ok(Fetched::EpochEnd {
                        position: positions.take(&stream, true),
                    }),
                    Some(Ok(BatchEvent::Batch(batch))) => {
                        let position = positions.take(&stream, false);
                        convert(batch, &spec, &device, index).map(|(tensors, copy)| {
                            let bottleneck =
                                if (index - first_index).is_multiple_of(BOTTLENECK_EVERY) {
                                    stream.bottleneck_stage()
                                } else {
                                    None
                                };
                            Fetched::Batch {
                                tensors,
                                copy,
                                bottleneck,
                                position,
                            }
                        })
                    }
                };
                index += 1;
                let last = !matches!(item, Ok(Fetched::Batch { .. } | Fetched::EpochEnd { .. }));
                // A failed send: the consumer is gone or cancelled; stop quietly.
                if cancel.send(&tx, item).is_err() || last {
                    break;
                }
            }
        })
        .map_err(|e| TrainError::Spawn("device prefetch", e))?;
        Ok(DevicePrefetch {
            rx,
            worker: Some(worker),
        })
    }

    /// The next item; blocks while the worker is behind (that is the data wait).
    pub(crate) fn recv(&mut self) -> Result<Fetched, TrainError> {
        match self.rx.recv() {
            Ok(item) => item,
            // The worker ended without an End item: it panicked.
            Err(_) => match self.worker.take().map(Thread::join) {
                Some(Err(panicked)) => Err(TrainError::Panic(panicked)),
                _ => Err(TrainError::Panic(crate::spawn::Panicked {
                    thread: "tfpipe-device-prefetch".into(),
                    message: "ended without a result".into(),
                })),
            },
        }
    }
}

/// One batch to device tensors, timed to completion (on CUDA the copy is
/// asynchronous).
fn convert(
    batch: Batch,
    spec: &InputSpec,
    device: &Device,
    index: u64,
) -> Result<(BatchTensors, Duration), TrainError> {
    let start = Instant::now();
    let tensors = batch_to_tensors(batch, spec, index, device)?;
    device
        .synchronize()
        .map_err(TrainError::candle("host-to-device copy"))?;
    Ok((tensors, start.elapsed()))
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
            task: crate::train::Task::Regression,
            standardize: vec![],
            tokens: None,
            impute: None,
        }
    }

    #[test]
    fn delivers_then_ends_with_bottleneck() {
        let stream = WithBottleneck {
            iter: (0..3).map(|_| Ok::<_, std::io::Error>(batch(2))),
            bottleneck: |_: &_| Some("parse".to_string()),
        };
        let mut p = DevicePrefetch::spawn(stream, spec(), Device::Cpu, 2, 0).unwrap();
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
        let mut p = DevicePrefetch::spawn(IterStream(items.into_iter()), spec(), Device::Cpu, 1, 0)
            .unwrap();
        // The data error is the cause, not part of the trainer's message.
        let err = p.recv().unwrap_err();
        let cause = std::error::Error::source(&err).map(|c| c.to_string());
        assert!(cause.unwrap_or_default().contains("disk on fire"), "{err}");

        let panicking = (0..1).map(|_| -> Result<Batch, std::io::Error> { panic!("boom") });
        let mut p =
            DevicePrefetch::spawn(IterStream(panicking), spec(), Device::Cpu, 1, 0).unwrap();
        assert!(p.recv().unwrap_err().to_string().contains("boom"));
    }

    #[test]
    fn drop_mid_stream_joins_promptly() {
        let endless = std::iter::repeat_with(|| Ok::<_, std::io::Error>(batch(1)));
        let mut p = DevicePrefetch::spawn(IterStream(endless), spec(), Device::Cpu, 1, 0).unwrap();
        assert!(p.recv().is_ok());
        let start = Instant::now();
        drop(p);
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
