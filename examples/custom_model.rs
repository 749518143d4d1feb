//! Train your own candle model through tfpipe: a residual MLP, defined
//! here, trained by [`Trainer::fit`] with validation, TensorBoard, a
//! checkpoint and the full report.
//!
//! ```text
//! cargo run --release --example custom_model
//! ```
//!
//! Three things make a model trainable by tfpipe: it implements
//! [`tfpipe::train::Model`] (a forward pass from the batch's tensors, and the
//! task, which picks the loss and the metrics), its variables live in a
//! `VarMap`, and an optimizer works on them (ours, from
//! [`OptimizerConfig::build`], or any `candle_nn::Optimizer` in a
//! [`Foreign`](tfpipe::train::Foreign)). The data here is generated in memory;
//! a [`Pipeline`](tfpipe::pipeline::Pipeline) over TFRecord files plugs in the
//! same way (see the `Trainer` docs).

// candle through tfpipe's re-exports: the versions tfpipe trains with,
// without naming candle in your own Cargo.toml.
use tfpipe::batch::{Batch, Column, Values};
use tfpipe::train::candle_core::{self, DType, Device, Module, Tensor};
use tfpipe::train::candle_nn::{self, Linear, VarBuilder, VarMap};
use tfpipe::train::{
    BatchStream, BatchTensors, BoxError, Checkpointer, InputSpec, IterStream, Model,
    OptimizerConfig, OptimizerKind, RunLength, Task, TensorBoard, TrainConfig, TrainError,
    TrainReport, Trainer, seed_vars,
};

/// Input width and classes of the generated data.
pub const WIDTH: usize = 16;
pub const CLASSES: usize = 4;

/// `x -> relu(W0 x) -> h + relu(W1 h) -> W2 (.)`: one residual block.
pub struct ResidualMlp {
    input: Linear,
    block: Linear,
    output: Linear,
    classes: usize,
}

impl ResidualMlp {
    /// Builds the layers in `vb`, `hidden` wide.
    pub fn new(
        inputs: usize,
        hidden: usize,
        classes: usize,
        vb: VarBuilder,
    ) -> candle_core::Result<ResidualMlp> {
        Ok(ResidualMlp {
            input: candle_nn::linear(inputs, hidden, vb.pp("input"))?,
            block: candle_nn::linear(hidden, hidden, vb.pp("block"))?,
            output: candle_nn::linear(hidden, classes, vb.pp("output"))?,
            classes,
        })
    }
}

impl Model for ResidualMlp {
    fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor> {
        let h = self.input.forward(&batch.features)?.relu()?;
        let h = (&h + self.block.forward(&h)?.relu()?)?;
        self.output.forward(&h)
    }

    fn task(&self) -> Task {
        Task::Classification {
            classes: self.classes,
        }
    }

    fn describe(&self) -> String {
        format!("residual mlp {WIDTH}-32-32-{}", self.classes)
    }
}

/// `batches` batches of `rows` examples: class `c` is a noisy blob around
/// `2 * e_c`.
pub fn blobs(batches: usize, rows: usize, seed: u64) -> Vec<Batch> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    (0..batches)
        .map(|b| {
            let mut x = Vec::with_capacity(rows * WIDTH);
            let mut y = Vec::with_capacity(rows);
            for r in 0..rows {
                let class = (b * rows + r) % CLASSES;
                for j in 0..WIDTH {
                    x.push(if j == class { 2.0 } else { 0.0 } + noise());
                }
                y.push(class as i64);
            }
            Batch {
                num_rows: rows,
                columns: vec![
                    Column {
                        name: "x".into(),
                        values: Values::Float32(x),
                        row_splits: vec![],
                        inner_shape: vec![WIDTH],
                    },
                    Column {
                        name: "label".into(),
                        values: Values::Int64(y),
                        row_splits: vec![],
                        inner_shape: vec![],
                    },
                ],
            }
        })
        .collect()
}

fn stream(batches: &[Batch]) -> IterStream<std::vec::IntoIter<Result<Batch, BoxError>>> {
    IterStream(
        batches
            .iter()
            .cloned()
            .map(Ok)
            .collect::<Vec<_>>()
            .into_iter(),
    )
}

/// Trains the residual MLP for `epochs` epochs on generated data, with
/// validation after each, TensorBoard events and a checkpoint when `out`
/// is given.
pub fn train(epochs: u64, out: Option<&std::path::Path>) -> Result<TrainReport, TrainError> {
    let device = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let model = ResidualMlp::new(WIDTH, 32, CLASSES, vb).map_err(|source| TrainError::Candle {
        context: "building the model",
        source,
    })?;
    // Seeded weights: the same run gives the same model.
    seed_vars(&varmap, 7, &device)?;
    let optimizer = OptimizerConfig {
        lr: 0.01,
        ..OptimizerConfig::default_for(OptimizerKind::AdamW)
    }
    .build(varmap.all_vars())?;

    let input = InputSpec {
        features: vec![("x".into(), WIDTH)],
        label: Some("label".into()),
        task: model.task(),
        standardize: vec![],
        tokens: None,
        impute: None,
    };
    let config = TrainConfig::new(input).length(RunLength::new().epochs(epochs));
    let mut trainer = Trainer::new(config, model, varmap, optimizer)?;
    if let Some(out) = out {
        trainer.observe(TensorBoard::create(out.join("logs"), 10)?);
        trainer.observe(Checkpointer::new(out.join("checkpoint")));
    }
    let train = blobs(20, 32, 1);
    let validation = blobs(4, 32, 2);
    let mut open_validation =
        move || -> Result<Box<dyn BatchStream>, BoxError> { Ok(Box::new(stream(&validation))) };
    trainer.fit(move |_epoch| Ok(stream(&train)), Some(&mut open_validation))
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::temp_dir().join("tfpipe-custom-model");
    let report = train(5, Some(&out))?;
    print!("{report}");
    println!(
        "checkpoint in {}, TensorBoard: tensorboard --logdir {}",
        out.join("checkpoint").display(),
        out.join("logs").display()
    );
    Ok(())
}
