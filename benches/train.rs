//! Trainer benchmarks: an MLP 784-256-10 step at batch 256 fed from memory
//! versus fed by the tfpipe pipeline, SGD versus Adam versus AdamW, candle's
//! AdamW update versus ours (one in-place pass), checkpoint load, first
//! versus steady prediction.
//!
//! `step_parts` times each part of a step twice, before (candle's own ops:
//! `Linear`, `relu`, `loss::cross_entropy`, `Conv2d`, `max_pool2d`) and after
//! (`tfpipe::train::ops`, what the built-in models run), on the same
//! weights: the forward pass, and forward + loss + backward, for the MLP at
//! batch 256 and the LeNet-like CNN at batch 64. `cnn_lenet_step_b64` is a
//! whole CNN training step at batch 64 (Adam and SGD), tensors in memory.
//!
//! `cargo bench --bench train -- --warm-up-time 1 --measurement-time 3`
//! (one group: `cargo bench --bench train -- step_parts`)

use std::time::Duration;

use candle_core::{Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, SGD};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use prost::Message;
use tfpipe::Batch;
use tfpipe::batch::{Column, Values};
use tfpipe::example::proto::{BytesList, Feature, Features, Int64List, feature};
use tfpipe::example::{DType, Example, FeatureSpec, Layout, Schema};
use tfpipe::pipeline::{Parallelism, Pipeline};
use tfpipe::tfrecord::{Compression, FileRecordWriter};
use tfpipe::train::{
    BatchStream, BatchTensors, BoxError, BuiltinModel, Checkpoint, ImageShape, InputSpec,
    IterStream, ModelConfig, OptimizerConfig, OptimizerKind, Predictor, RunLength, Task,
    TrainConfig, Trainer, batch_to_tensors,
};

const BATCH: usize = 256;
const PIXELS: usize = 784;

fn mnist_like_batch(seed: u64) -> Batch {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let image: Vec<u8> = (0..BATCH * PIXELS).map(|_| next() as u8).collect();
    let label: Vec<i64> = (0..BATCH).map(|_| (next() % 10) as i64).collect();
    Batch {
        num_rows: BATCH,
        columns: vec![
            Column {
                name: "image_raw".into(),
                values: Values::Uint8(image),
                row_splits: vec![],
                inner_shape: vec![28, 28],
            },
            Column {
                name: "label".into(),
                values: Values::Int64(label),
                row_splits: vec![],
                inner_shape: vec![],
            },
        ],
    }
}

fn schema() -> Schema {
    Schema {
        features: vec![
            FeatureSpec {
                name: "image_raw".into(),
                dtype: DType::Uint8,
                layout: Layout::Fixed(vec![28, 28]),
                default: None,
                image: None,
            },
            FeatureSpec {
                name: "label".into(),
                dtype: DType::Int64,
                layout: Layout::Fixed(vec![]),
                default: None,
                image: None,
            },
        ],
        label: Some("label".into()),
    }
}

fn input() -> InputSpec {
    InputSpec::from_schema(&schema(), Task::Classification { classes: 10 })
        .expect("valid schema")
        .spec
}

fn mlp() -> ModelConfig {
    ModelConfig::Mlp {
        inputs: PIXELS,
        hidden: vec![256],
        classes: 10,
    }
}

fn trainer(cfg: TrainConfig, kind: OptimizerKind) -> Trainer {
    Trainer::builtin(cfg, mlp(), OptimizerConfig::default_for(kind)).expect("config")
}

fn config() -> TrainConfig {
    TrainConfig::new(input())
}

/// Writes `records` MNIST-like examples into 4 shards; returns the glob.
fn write_shards(dir: &std::path::Path, records: usize) -> String {
    let batch = mnist_like_batch(42);
    let Values::Uint8(pixels) = &batch.columns[0].values else {
        unreachable!()
    };
    let mut buf = Vec::new();
    for shard in 0..4 {
        let path = dir.join(format!("bench-{shard:05}-of-00004.tfrecord"));
        let mut w = FileRecordWriter::create(&path, Compression::None).expect("create shard");
        for i in (shard..records).step_by(4) {
            let row = i % BATCH;
            let mut f = std::collections::BTreeMap::new();
            f.insert(
                "image_raw".to_string(),
                Feature {
                    kind: Some(feature::Kind::BytesList(BytesList {
                        value: vec![pixels[row * PIXELS..(row + 1) * PIXELS].to_vec()],
                    })),
                },
            );
            f.insert(
                "label".to_string(),
                Feature {
                    kind: Some(feature::Kind::Int64List(Int64List {
                        value: vec![(i % 10) as i64],
                    })),
                },
            );
            buf.clear();
            Example {
                features: Some(Features { feature: f }),
            }
            .encode(&mut buf)
            .expect("encode");
            w.write_record(&buf).expect("write");
        }
        w.finish().expect("finish");
    }
    dir.join("bench-*.tfrecord").to_string_lossy().into_owned()
}

/// Steady-state time of `iters` steps through `fit` (start-up and the first
/// step excluded: data wait + compute of the later steps, scaled).
fn fit_steps<S, F>(kind: OptimizerKind, iters: u64, open: F) -> Duration
where
    S: BatchStream + 'static,
    F: FnMut(u64) -> Result<S, BoxError>,
{
    let cfg = config().length(RunLength::new().steps(iters + 1));
    let mut trainer = trainer(cfg, kind);
    let report = trainer.fit(open, None).expect("fit");
    let steady_ms = report.data_wait_ms.total + report.compute_ms.total - report.first_step_ms;
    Duration::from_secs_f64(steady_ms.max(0.0) / 1e3)
}

fn step(c: &mut Criterion) {
    let mut group = c.benchmark_group("mlp_784_256_10_step_b256");
    group.throughput(Throughput::Elements(BATCH as u64));
    let tensors: BatchTensors =
        batch_to_tensors(mnist_like_batch(1), &input(), 0, &Device::Cpu).expect("tensors");
    for kind in [
        OptimizerKind::Sgd,
        OptimizerKind::Adam,
        OptimizerKind::AdamW,
    ] {
        let name = format!("{kind:?}").to_lowercase();
        let mut trainer = trainer(config(), kind);
        group.bench_function(format!("{name}/memory_tensors"), |b| {
            b.iter(|| trainer.step(&tensors).expect("step"))
        });
        let batches: Vec<Batch> = (0..8).map(mnist_like_batch).collect();
        group.bench_function(format!("{name}/memory_batches_fit"), |b| {
            b.iter_custom(|iters| {
                let batches = batches.clone();
                fit_steps(kind, iters, move |_| {
                    let n = iters as usize + 1;
                    Ok(IterStream(
                        batches
                            .clone()
                            .into_iter()
                            .cycle()
                            .take(n)
                            .map(Ok::<_, BoxError>),
                    ))
                })
            })
        });
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let glob = write_shards(dir.path(), 60_000);
    for kind in [OptimizerKind::Sgd, OptimizerKind::AdamW] {
        let name = format!("{kind:?}").to_lowercase();
        let glob = glob.clone();
        group.bench_function(format!("{name}/tfpipe_pipeline_fit"), |b| {
            b.iter_custom(|iters| {
                let glob = glob.clone();
                fit_steps(kind, iters, move |epoch| {
                    let it = Pipeline::tfrecord_files([glob.as_str()])?
                        .interleave(4, 16)
                        .shuffle(10_000, epoch)
                        .batch(BATCH)
                        .parse_batches(schema(), Parallelism::Auto)
                        .prefetch(2)
                        .start()?;
                    Ok(it)
                })
            })
        });
    }
    group.finish();
}

/// A whole training step of the LeNet-like CNN at batch 64 (forward, loss,
/// backward, Adam), tensors in memory: what `tfpipe bench-train --model
/// cnn` times per step, without the input pipeline. Compare with
/// `scripts/keras_cnn.py`'s median step.
fn cnn_step(c: &mut Criterion) {
    const ROWS: usize = 64;
    let mut group = c.benchmark_group("cnn_lenet_step_b64");
    group.throughput(Throughput::Elements(ROWS as u64));
    let all = batch_to_tensors(mnist_like_batch(9), &input(), 0, &Device::Cpu).expect("tensors");
    let tensors = BatchTensors {
        features: all.features.narrow(0, 0, ROWS).expect("rows"),
        labels: all
            .labels
            .as_ref()
            .map(|l| l.narrow(0, 0, ROWS).expect("rows")),
        rows: ROWS,
        ..all
    };
    for kind in [OptimizerKind::Adam, OptimizerKind::Sgd] {
        let optimizer = OptimizerConfig {
            weight_decay: 0.0,
            ..OptimizerConfig::default_for(kind)
        };
        let mut trainer = Trainer::builtin(
            config(),
            ModelConfig::cnn(10, ImageShape::default()),
            optimizer,
        )
        .expect("cnn");
        group.bench_function(format!("{kind}/memory_tensors"), |b| {
            b.iter(|| trainer.step(&tensors).expect("step"))
        });
    }
    group.finish();
}

/// The optimizer update alone, on the gradients of one step: candle's
/// AdamW and SGD versus one fused pass over the same parameters.
fn optimizer_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("optimizer_update_mlp_784_256_10");
    let (model, varmap) = BuiltinModel::init(mlp(), 0, &Device::Cpu).expect("model");
    let tensors =
        batch_to_tensors(mnist_like_batch(3), &input(), 0, &Device::Cpu).expect("tensors");
    let logits = model.forward_features(&tensors.features).expect("forward");
    let labels = tensors.labels.expect("labels");
    let loss = candle_nn::loss::cross_entropy(&logits, &labels).expect("loss");
    let grads = loss.backward().expect("backward");
    let params: usize = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    group.throughput(Throughput::Elements(params as u64));
    let mut adamw = AdamW::new(varmap.all_vars(), ParamsAdamW::default()).expect("adamw");
    group.bench_function("candle_adamw", |b| {
        b.iter(|| adamw.step(&grads).expect("step"))
    });
    let mut sgd = SGD::new(varmap.all_vars(), 0.01).expect("sgd");
    group.bench_function("candle_sgd", |b| b.iter(|| sgd.step(&grads).expect("step")));
    // Ours, as the trainer runs them: one pass per tensor on the variable's
    // own storage.
    for kind in [OptimizerKind::AdamW, OptimizerKind::Sgd] {
        let mut ours = OptimizerConfig::default_for(kind)
            .build(varmap.all_vars())
            .expect("optimizer");
        group.bench_function(format!("tfpipe_{kind}"), |b| {
            b.iter(|| ours.step(&grads).expect("step"))
        });
    }

    // The same AdamW arithmetic as one pass per parameter tensor: no
    // intermediate tensors, no allocation.
    let mut theta: Vec<Vec<f32>> = Vec::new();
    let mut g: Vec<Vec<f32>> = Vec::new();
    for var in varmap.all_vars() {
        theta.push(var.flatten_all().and_then(|t| t.to_vec1()).expect("vec"));
        g.push(
            grads
                .get(&var)
                .map(|t| t.flatten_all().and_then(|t| t.to_vec1()).expect("vec"))
                .unwrap_or_else(|| vec![0.0; var.elem_count()]),
        );
    }
    let mut m: Vec<Vec<f32>> = theta.iter().map(|t| vec![0.0; t.len()]).collect();
    let mut v = m.clone();
    let mut t = 0i32;
    group.bench_function("fused_adamw_loop", |b| {
        b.iter(|| {
            t += 1;
            let (lr, b1, b2, eps, wd) = (1e-3f32, 0.9f32, 0.999f32, 1e-8f32, 0.01f32);
            let (s1, s2) = (1.0 / (1.0 - b1.powi(t)), 1.0 / (1.0 - b2.powi(t)));
            for i in 0..theta.len() {
                for (((p, g), m), v) in theta[i]
                    .iter_mut()
                    .zip(&g[i])
                    .zip(m[i].iter_mut())
                    .zip(v[i].iter_mut())
                {
                    *m = b1 * *m + (1.0 - b1) * g;
                    *v = b2 * *v + (1.0 - b2) * g * g;
                    *p = *p * (1.0 - lr * wd) - lr * (*m * s1) / ((*v * s2).sqrt() + eps);
                }
            }
        })
    });
    group.finish();
}

fn checkpoint_and_predict(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let trainer = trainer(config(), OptimizerKind::AdamW);
    trainer.save(dir.path()).expect("save");
    let features = batch_to_tensors(mnist_like_batch(5), &input(), 0, &Device::Cpu)
        .expect("tensors")
        .features;
    let one: Tensor = features.narrow(0, 0, 32).expect("narrow");

    let mut group = c.benchmark_group("checkpoint");
    group.throughput(Throughput::Elements(1));
    group.bench_function("load_mlp_784_256_10", |b| {
        b.iter(|| Checkpoint::load(dir.path(), &Device::Cpu).expect("load"))
    });
    group.finish();

    let mut group = c.benchmark_group("predict_b32");
    group.throughput(Throughput::Elements(32));
    group.bench_function("first_after_load", |b| {
        b.iter_batched(
            || Predictor::load(dir.path(), &Device::Cpu).expect("load"),
            |p| p.predict(&one).expect("predict"),
            BatchSize::PerIteration,
        )
    });
    let warm = Predictor::load(dir.path(), &Device::Cpu).expect("load");
    warm.predict(&one).expect("predict");
    group.bench_function("steady", |b| {
        b.iter(|| warm.predict(&one).expect("predict"))
    });
    group.finish();
}

/// The built-in models as candle's own layers compute them (the "before").
enum CandleReference {
    Mlp(Vec<candle_nn::Linear>),
    Cnn(candle_nn::Conv2d, candle_nn::Conv2d, Vec<candle_nn::Linear>),
}

impl CandleReference {
    fn new(config: &ModelConfig, varmap: &candle_nn::VarMap) -> CandleReference {
        let vb = candle_nn::VarBuilder::from_varmap(varmap, candle_core::DType::F32, &Device::Cpu);
        let linear = |i: &str, a, b| candle_nn::linear(a, b, vb.pp(i)).expect("layer");
        match config {
            ModelConfig::Cnn { classes, .. } => {
                let padded = candle_nn::Conv2dConfig {
                    padding: 2,
                    ..Default::default()
                };
                let c1 = candle_nn::conv2d(1, 6, 5, padded, vb.pp("conv1")).expect("conv1");
                let c2 =
                    candle_nn::conv2d(6, 16, 5, Default::default(), vb.pp("conv2")).expect("conv2");
                let fc = vec![
                    linear("fc1", 400, 120),
                    linear("fc2", 120, 84),
                    linear("fc3", 84, *classes),
                ];
                CandleReference::Cnn(c1, c2, fc)
            }
            _ => CandleReference::Mlp(vec![linear("fc0", PIXELS, 256), linear("fc1", 256, 10)]),
        }
    }

    fn forward(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        use candle_core::Module;
        match self {
            CandleReference::Cnn(c1, c2, fc) => {
                let b = xs.dim(0)?;
                let h = xs.reshape((b, 1, 28, 28))?;
                let h = c1.forward(&h)?.relu()?.max_pool2d(2)?;
                let h = c2.forward(&h)?.relu()?.max_pool2d(2)?.flatten_from(1)?;
                let h = fc[0].forward(&h)?.relu()?;
                let h = fc[1].forward(&h)?.relu()?;
                fc[2].forward(&h)
            }
            CandleReference::Mlp(layers) => {
                let h = layers[0].forward(xs)?.relu()?;
                layers[1].forward(&h)
            }
        }
    }
}

/// Each part of a step, candle's ops ("candle") against the fused ones
/// ("tfpipe"), on the same weights and batch.
fn step_parts(c: &mut Criterion) {
    let cases = [
        ("mlp_784_256_10_b256", mlp(), BATCH),
        (
            "cnn_lenet_b64",
            ModelConfig::cnn(10, ImageShape::default()),
            64,
        ),
    ];
    for (name, config, rows) in cases {
        let mut group = c.benchmark_group(format!("step_parts_{name}"));
        group.throughput(Throughput::Elements(rows as u64));
        let (model, varmap) = BuiltinModel::init(config.clone(), 0, &Device::Cpu).expect("model");
        let reference = CandleReference::new(&config, &varmap);
        let tensors =
            batch_to_tensors(mnist_like_batch(7), &input(), 0, &Device::Cpu).expect("tensors");
        let xs = tensors.features.narrow(0, 0, rows).expect("rows");
        let labels = tensors
            .labels
            .expect("labels")
            .narrow(0, 0, rows)
            .expect("rows");
        group.bench_function("forward/candle", |b| {
            b.iter(|| reference.forward(&xs).expect("forward"))
        });
        group.bench_function("forward/tfpipe", |b| {
            b.iter(|| model.forward_features(&xs).expect("forward"))
        });
        group.bench_function("forward_loss_backward/candle", |b| {
            b.iter(|| {
                let logits = reference.forward(&xs).expect("forward");
                let loss = candle_nn::loss::cross_entropy(&logits, &labels).expect("loss");
                loss.backward().expect("backward")
            })
        });
        group.bench_function("forward_loss_backward/tfpipe", |b| {
            b.iter(|| {
                let logits = model.forward_features(&xs).expect("forward");
                let loss =
                    tfpipe::train::ops::softmax_cross_entropy(&logits, &labels).expect("loss");
                loss.backward().expect("backward")
            })
        });
        group.finish();
    }
}

/// The observer machinery's cost per step (train lane): what `fit` does
/// after every step besides the step itself, i.e. calling `on_step` on
/// each observer, for the observers `tfpipe train` attaches (TensorBoard
/// writing its per-step scalars every 10 steps, checkpointing and early
/// stopping, which act at epoch ends), and for four no-op observers (the
/// dispatch alone). Compare with a step (`mlp_784_256_10_step_b256`,
/// `embedding_step_b256`).
fn observers(c: &mut Criterion) {
    use tfpipe::train::{Checkpointer, EarlyStopping, Monitor, Observer, Progress, TensorBoard};
    struct Noop;
    impl Observer for Noop {}
    let dir = tempfile::tempdir().expect("tempdir");
    let mut progress = Progress {
        step: 0,
        run_steps: 0,
        epoch: 0,
        epoch_steps: 0,
        epoch_examples: 0,
        loss: 0.5,
        learning_rate: 1e-3,
        rows: BATCH,
        examples_per_sec: 1e5,
        stall_fraction: 0.01,
    };
    let mut group = c.benchmark_group("observers_on_step");
    group.throughput(Throughput::Elements(1));
    let mut noops: Vec<Box<dyn Observer>> = (0..4).map(|_| Box::new(Noop) as _).collect();
    group.bench_function("dispatch_4_noop", |b| {
        b.iter(|| {
            progress.step += 1;
            for o in noops.iter_mut() {
                o.on_step(&progress).expect("on_step");
            }
        })
    });
    let mut cli_set: Vec<Box<dyn Observer>> = vec![
        Box::new(TensorBoard::create(dir.path().join("logs"), 10).expect("logdir")),
        Box::new(Checkpointer::new(dir.path().join("ck")).every(1000)),
        Box::new(EarlyStopping::new(Monitor::Loss, 3)),
    ];
    group.bench_function("tensorboard_checkpointer_early_stopping", |b| {
        b.iter(|| {
            progress.step += 1;
            progress.run_steps += 1;
            for o in cli_set.iter_mut() {
                o.on_step(&progress).expect("on_step");
            }
        })
    });
    group.finish();
}

/// The built-in embedding model's training step (train lane): token ids
/// from `TokenSet` (lengths 8-32, padded per batch), embedding 200x32 ->
/// masked mean pooling -> MLP 32-64-4, AdamW, batch 256, tensors in memory.
fn embedding_step(c: &mut Criterion) {
    use tfpipe::train::TokenSet;
    let set = TokenSet::default();
    let (mut ids, mut splits, mut labels) = (Vec::new(), vec![0usize], Vec::new());
    for i in 0..BATCH as u64 {
        let (tokens, label) = set.record(i);
        ids.extend(tokens);
        splits.push(ids.len());
        labels.push(label);
    }
    let batch = Batch {
        num_rows: BATCH,
        columns: vec![
            Column {
                name: "tokens".into(),
                values: Values::Int64(ids),
                row_splits: vec![splits],
                inner_shape: vec![],
            },
            Column {
                name: "label".into(),
                values: Values::Int64(labels),
                row_splits: vec![],
                inner_shape: vec![],
            },
        ],
    };
    let task = Task::Classification { classes: 4 };
    let input = InputSpec::from_schema(&set.schema(), task)
        .expect("schema")
        .spec;
    let model = ModelConfig::Embedding {
        vocab: set.vocab,
        dim: 32,
        inputs: 0,
        hidden: vec![64],
        classes: 4,
    };
    let mut trainer = Trainer::builtin(
        TrainConfig::new(input.clone()),
        model,
        OptimizerConfig::default_for(OptimizerKind::AdamW),
    )
    .expect("config");
    let mut spec = input;
    spec.tokens = trainer.config().input().tokens.clone();
    let tensors = batch_to_tensors(batch, &spec, 0, &Device::Cpu).expect("tensors");
    let mut group = c.benchmark_group("embedding_step_b256");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("adamw/memory_tensors", |b| {
        b.iter(|| trainer.step(&tensors).expect("step"))
    });
    group.finish();
}

criterion_group!(
    benches,
    step_parts,
    cnn_step,
    step,
    optimizer_update,
    checkpoint_and_predict
);
criterion_group!(train_lane, observers, embedding_step);
criterion_main!(benches, train_lane);
