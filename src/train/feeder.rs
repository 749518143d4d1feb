//! The trainer's source of device batches: through the device-prefetch
//! thread (converting and copying the next batch while this one computes),
//! or inline when prefetch is 0. Either way each batch comes with the
//! stream position after it, so a checkpoint can resume exactly there.

use std::time::Instant;

use candle_core::Device;

use super::TrainError;
use super::config::Placement;
use super::prefetch::{BatchEvent, BatchStream, DevicePrefetch, Fetched, PositionTaker};
use super::tensor::{InputSpec, batch_to_tensors};

/// Feeds batches: through the device-prefetch thread, or inline.
pub(super) enum Feeder {
    Thread(DevicePrefetch),
    Inline {
        stream: Box<dyn BatchStream>,
        input: InputSpec,
        device: Device,
        ended: bool,
        positions: PositionTaker,
    },
}

impl Feeder {
    pub(super) fn new<S: BatchStream + 'static>(
        stream: S,
        input: &InputSpec,
        placement: &Placement,
        first_index: u64,
    ) -> Result<Feeder, TrainError> {
        if placement.prefetch == 0 {
            Ok(Feeder::Inline {
                stream: Box::new(stream),
                input: input.clone(),
                device: placement.device.clone(),
                ended: false,
                positions: PositionTaker::default(),
            })
        } else {
            Ok(Feeder::Thread(DevicePrefetch::spawn(
                stream,
                input.clone(),
                placement.device.clone(),
                placement.prefetch,
                first_index,
            )?))
        }
    }

    /// The next item.
    pub(super) fn next(&mut self, index: u64) -> Result<Fetched, TrainError> {
        match self {
            Feeder::Thread(p) => p.recv(),
            Feeder::Inline {
                stream,
                input,
                device,
                ended,
                positions,
            } => {
                if *ended {
                    return Ok(Fetched::End {
                        bottleneck: stream.bottleneck_stage(),
                    });
                }
                match stream.next_event() {
                    None => {
                        *ended = true;
                        Ok(Fetched::End {
                            bottleneck: stream.bottleneck_stage(),
                        })
                    }
                    Some(Err(e)) => Err(TrainError::data(e)),
                    Some(Ok(BatchEvent::EpochEnd)) => Ok(Fetched::EpochEnd {
                        position: positions.take(stream.as_ref(), true),
                    }),
                    Some(Ok(BatchEvent::Batch(batch))) => {
                        let position = positions.take(stream.as_ref(), false);
                        let start = Instant::now();
                        let tensors = batch_to_tensors(batch, input, index, device)?;
                        device
                            .synchronize()
                            .map_err(TrainError::candle("host-to-device copy"))?;
                        Ok(Fetched::Batch {
                            tensors,
                            copy: start.elapsed(),
                            bottleneck: None,
                            position,
                        })
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Batch, Column, Values};
    use crate::train::{IterStream, Task};

    fn batch(x: f32) -> Batch {
        let column = |name: &str, values| Column {
            name: name.into(),
            values,
            row_splits: vec![],
            inner_shape: vec![1],
        };
        Batch {
            num_rows: 1,
            columns: vec![
                column("x", Values::Float32(vec![x])),
                column("label", Values::Int64(vec![1])),
            ],
        }
    }

    fn input() -> InputSpec {
        InputSpec {
            features: vec![("x".into(), 1)],
            label: Some("label".into()),
            task: Task::Classification { classes: 2 },
            standardize: vec![],
            tokens: None,
            impute: None,
        }
    }

    /// The values of every batch fed, then whether the end came.
    fn drain(mut feeder: Feeder) -> (Vec<f32>, bool) {
        let mut seen = Vec::new();
        for index in 0..10 {
            match feeder.next(index).unwrap() {
                Fetched::Batch { tensors, .. } => seen.extend(
                    tensors
                        .features
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap(),
                ),
                Fetched::EpochEnd { .. } => {}
                Fetched::End { .. } => return (seen, true),
            }
        }
        (seen, false)
    }

    #[test]
    fn inline_and_threaded_feeders_give_the_same_batches_in_order() {
        for prefetch in [0, 2] {
            let stream = IterStream(
                vec![Ok::<_, crate::train::BoxError>(batch(1.0)), Ok(batch(2.0))].into_iter(),
            );
            let placement = Placement::new().prefetch(prefetch);
            let feeder = Feeder::new(stream, &input(), &placement, 0).unwrap();
            assert!(matches!(feeder, Feeder::Inline { .. }) == (prefetch == 0));
            assert_eq!(drain(feeder), (vec![1.0, 2.0], true), "prefetch {prefetch}");
        }
    }

    #[test]
    fn a_batch_that_does_not_fit_the_input_is_an_error_naming_its_index() {
        let mut bad = batch(1.0);
        bad.columns.pop();
        let stream = IterStream(vec![Ok::<_, crate::train::BoxError>(bad)].into_iter());
        let mut feeder = Feeder::new(stream, &input(), &Placement::new().prefetch(0), 0).unwrap();
        let Err(TrainError::Input { batch, .. }) = feeder.next(7) else {
            panic!("accepted a batch without its label");
        };
        assert_eq!(batch, 7);
    }
}
