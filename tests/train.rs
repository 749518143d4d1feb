//! Integration tests of the trainer (candle on the CPU, tiny generated data).

use std::time::{Duration, Instant};

mod common;

use candle_core::Device;
use prost::Message;
use tfpipe::batch::{Batch, Column, Values};
use tfpipe::example::proto::{Event, event, summary};
use tfpipe::tfrecord::{FileRecordReader, ReaderOptions};
use tfpipe::train::{
    BatchStream, BoxError, Checkpoint, InputSpec, IterStream, Labels, Model, ModelConfig,
    OptimizerConfig, OptimizerKind, Outputs, Placement, PredictOptions, Predictor, Reproducibility,
    RunLength, Standardize, Task, TrainConfig, TrainError, Trainer, Verdict, WithBottleneck,
    batch_to_tensors,
};

const WIDTH: usize = 8;
const CLASSES: usize = 3;

/// `batches` batches of `rows` examples: class `c` is a noisy blob around
/// `3 * e_c` (separable, so a small MLP learns it in a few steps).
fn dataset(batches: usize, rows: usize, seed: u64) -> Vec<Batch> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut noise = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    };
    (0..batches)
        .map(|b| {
            let mut x = Vec::with_capacity(rows * WIDTH);
            let mut y = Vec::with_capacity(rows);
            for r in 0..rows {
                let class = (b * rows + r) % CLASSES;
                for j in 0..WIDTH {
                    x.push(if j == class { 3.0 } else { 0.0 } + noise());
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

/// An error and its causes, as the CLI prints them: `a: b: c`.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn input() -> InputSpec {
    InputSpec {
        features: vec![("x".into(), WIDTH)],
        label: Some("label".into()),
        task: Task::Classification { classes: CLASSES },
        standardize: vec![],
        tokens: None,
        impute: None,
    }
}

/// A run's config with the built-in model and optimizer it trains.
struct Cfg {
    run: TrainConfig,
    model: ModelConfig,
    optimizer: OptimizerConfig,
}

fn config(kind: OptimizerKind) -> Cfg {
    let model = ModelConfig::Mlp {
        inputs: WIDTH,
        hidden: vec![16],
        classes: CLASSES,
    };
    Cfg {
        run: TrainConfig::new(input()),
        model,
        optimizer: OptimizerConfig::default_for(kind),
    }
}

fn new_trainer(cfg: Cfg) -> Result<Trainer, TrainError> {
    Trainer::builtin(cfg.run, cfg.model, cfg.optimizer)
}

type Stream = IterStream<std::vec::IntoIter<Result<Batch, BoxError>>>;

fn memory(batches: Vec<Batch>) -> impl FnMut(u64) -> Result<Stream, BoxError> {
    move |_epoch| {
        Ok(IterStream(
            batches
                .clone()
                .into_iter()
                .map(Ok)
                .collect::<Vec<_>>()
                .into_iter(),
        ))
    }
}

#[test]
fn loss_falls_over_a_few_steps() {
    for kind in [
        OptimizerKind::Sgd,
        OptimizerKind::Adam,
        OptimizerKind::AdamW,
    ] {
        let mut cfg = config(kind);
        if kind != OptimizerKind::Sgd {
            cfg.optimizer.lr = 0.01;
        }
        let mut trainer = new_trainer(cfg).unwrap();
        let mut losses = Vec::new();
        for batch in dataset(30, 32, 1) {
            let t = batch_to_tensors(batch, &input(), 0, &Device::Cpu).unwrap();
            losses.push(trainer.step(&t).unwrap());
        }
        let first: f32 = losses[..3].iter().sum::<f32>() / 3.0;
        let last: f32 = losses[27..].iter().sum::<f32>() / 3.0;
        assert!(last < first * 0.5, "{kind:?}: loss {first} -> {last}");
        assert_eq!(trainer.global_step(), 30);
    }
}

#[test]
fn fit_evaluates_each_epoch_and_learns() {
    let mut cfg = config(OptimizerKind::Sgd);
    cfg.run = cfg.run.length(RunLength::new().epochs(3));
    let mut trainer = new_trainer(cfg).unwrap();
    let test = dataset(4, 32, 99);
    let mut open_test = move || -> Result<Box<dyn BatchStream>, BoxError> {
        Ok(Box::new(IterStream(
            test.clone().into_iter().map(Ok::<_, BoxError>),
        )))
    };
    let report = trainer
        .fit(memory(dataset(10, 32, 2)), Some(&mut open_test))
        .unwrap();
    assert_eq!(report.epochs.len(), 3);
    assert_eq!(report.steps, 30);
    assert_eq!(report.examples, 960);
    assert_eq!(trainer.epoch(), 3);
    assert!(report.val_accuracy.unwrap() > 0.9, "{report}");
    assert!(report.epochs[2].val_loss.unwrap() < report.epochs[0].loss);
    let json: serde_json::Value = serde_json::to_value(&report).unwrap();
    for key in [
        "examples",
        "steps",
        "wall_ms",
        "examples_per_sec",
        "stall_fraction",
        "verdict",
        "bottleneck_stage",
        "data_wait_ms",
        "copy_ms",
        "compute_ms",
        "startup_ms",
        "first_step_ms",
        "steady_step_ms_p50",
        "val_loss",
        "val_accuracy",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    for key in ["total", "p50", "p90", "p99", "max"] {
        assert!(json["compute_ms"][key].is_number());
    }
    for key in ["pipeline_built", "first_batch", "model_ready", "first_step"] {
        assert!(json["startup_ms"][key].as_f64().unwrap() > 0.0);
    }
    let s = report.startup_ms;
    assert!(
        s.pipeline_built <= s.first_batch
            && s.first_batch <= s.first_step
            && s.model_ready <= s.first_step
    );
    // The model is ready when the trainer is made, before fit opens the data.
    assert!(s.model_ready <= s.pipeline_built, "{s:?}");
    // The device's start-up, on the CPU: the weights drawn, no warm-up kernel,
    // and no device init reported by this caller.
    let d = report.device_startup_ms;
    assert!(d.weights_upload_ms.unwrap() > 0.0, "{d:?}");
    assert_eq!(d.first_kernel_ms, None);
    assert_eq!(d.device_init_ms, 0.0);
    assert!(json["device_startup_ms"]["first_kernel_ms"].is_null());
    assert!(json["device_startup_ms"]["weights_upload_ms"].is_number());
    let table = report.to_string();
    assert!(
        table.contains("device     init 0.0 ms, weights drawn and uploaded ")
            && table.contains("first kernel (warm-up) n/a"),
        "{table}"
    );
}

#[test]
fn checkpoint_round_trip_gives_identical_predictions() {
    let mut cfg = config(OptimizerKind::AdamW);
    cfg.run = cfg.run.length(RunLength::new().steps(5));
    let mut trainer = new_trainer(cfg).unwrap();
    trainer.fit(memory(dataset(5, 16, 3)), None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    trainer.save(dir.path()).unwrap();
    assert!(dir.path().join("model.safetensors").exists());

    let probe = batch_to_tensors(dataset(1, 64, 4).remove(0), &input(), 0, &Device::Cpu).unwrap();
    let before: Vec<Vec<f32>> = trainer.model().forward(&probe).unwrap().to_vec2().unwrap();
    let loaded = Checkpoint::load(dir.path(), &Device::Cpu).unwrap();
    let after: Vec<Vec<f32>> = loaded.model.forward(&probe).unwrap().to_vec2().unwrap();
    assert_eq!(before, after);
    assert_eq!(loaded.meta.step, 5);
    // The input spec, with the standardisation `fit` computed from the first batch.
    assert_eq!(&loaded.meta.input, trainer.config().input());
    assert_eq!(loaded.meta.input.features, input().features);
    assert_eq!(loaded.meta.input.standardize.len(), 1);

    let predictor = Predictor::load(dir.path(), &Device::Cpu).unwrap();
    let classes = predictor.predict(&probe.features).unwrap();
    let expected: Vec<u32> = before
        .iter()
        .map(|row| {
            row.iter()
                .enumerate()
                .fold(0, |best, (i, v)| if *v > row[best] { i } else { best }) as u32
        })
        .collect();
    assert_eq!(classes, expected);

    let mut stream = IterStream(dataset(3, 8, 5).into_iter().map(Ok::<_, BoxError>));
    let mut seen = 0;
    let options = PredictOptions {
        with_labels: true,
        warmup: 2,
        ..PredictOptions::default()
    };
    let report = predictor
        .run(&mut stream, options, &mut |p| {
            let Outputs::Classes {
                ids,
                probabilities,
                classes,
            } = &p.outputs
            else {
                panic!("not classes")
            };
            let Some(Labels::Classes(labels)) = &p.labels else {
                panic!("no labels")
            };
            assert_eq!(
                (ids.len(), labels.len(), *classes),
                (p.rows, p.rows, CLASSES)
            );
            assert_eq!(probabilities.len(), p.rows * CLASSES);
            seen += p.rows;
            Ok(())
        })
        .unwrap();
    assert_eq!((report.examples, report.batches, seen), (24, 3, 24));
    assert!(report.accuracy.is_some() && report.first_prediction_ms > 0.0);
}

#[test]
fn a_corrupt_checkpoint_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let trainer = new_trainer(config(OptimizerKind::Sgd)).unwrap();
    trainer.save(dir.path()).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), b"not safetensors").unwrap();
    let err = Checkpoint::load(dir.path(), &Device::Cpu).err().unwrap();
    assert!(chain(&err).contains("model.safetensors"), "{err}");
    std::fs::write(dir.path().join("checkpoint.json"), b"{\"format\": 3").unwrap();
    let err = Checkpoint::load(dir.path(), &Device::Cpu).err().unwrap();
    assert!(chain(&err).contains("checkpoint.json line 1"), "{err}");
}

#[test]
fn resume_continues_the_step_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(OptimizerKind::Sgd);
    cfg.run = cfg.run.length(RunLength::new().steps(7));
    let mut first = new_trainer(cfg).unwrap();
    first.fit(memory(dataset(10, 8, 6)), None).unwrap();
    first.save(dir.path()).unwrap();

    let mut cfg = config(OptimizerKind::Sgd);
    cfg.run = cfg.run.length(RunLength::new().steps(4));
    cfg.run = cfg
        .run
        .reproducibility(Reproducibility::new().resume(dir.path().to_path_buf()));
    let mut second = new_trainer(cfg).unwrap();
    // Inputs are scaled as the checkpoint's model was trained, not re-estimated.
    assert_eq!(second.config().input().standardize.len(), 1);
    assert_eq!(
        second.config().input().standardize,
        first.config().input().standardize
    );
    let report = second.fit(memory(dataset(10, 8, 7)), None).unwrap();
    assert_eq!(
        second.config().input().standardize,
        first.config().input().standardize
    );
    assert_eq!(report.steps, 4);
    assert_eq!(report.global_step, 11);
    let load = report.checkpoint_load.unwrap();
    assert!(
        load.load_ms > 0.0 && load.overlap_ms <= load.load_ms.min(load.pipeline_warmup_ms) + 1e-9
    );
    second.save(dir.path()).unwrap();
    assert_eq!(Checkpoint::read_meta(dir.path()).unwrap().step, 11);

    // A different model cannot resume from it.
    let mut cfg = config(OptimizerKind::Sgd);
    cfg.model = ModelConfig::Mlp {
        inputs: WIDTH,
        hidden: vec![4],
        classes: CLASSES,
    };
    cfg.run = cfg
        .run
        .reproducibility(Reproducibility::new().resume(dir.path().to_path_buf()));
    let err = new_trainer(cfg).err().unwrap();
    assert!(chain(&err).contains("holds mlp 8-16-3"), "{err}");
}

/// A source that sleeps `delay` before each batch, like a slow map stage.
fn slow(
    batches: Vec<Batch>,
    delay: Duration,
) -> impl FnMut(u64) -> Result<Box<dyn BatchStream>, BoxError> {
    move |_| {
        let iter = batches.clone().into_iter().map(move |b| {
            std::thread::sleep(delay);
            Ok::<_, BoxError>(b)
        });
        Ok(Box::new(WithBottleneck {
            iter,
            bottleneck: |_: &_| Some("slow_map".to_string()),
        }))
    }
}

#[test]
fn the_phases_add_up_to_the_wall_time() {
    for prefetch in [0, 2] {
        let mut cfg = config(OptimizerKind::Sgd);
        cfg.run = cfg.run.length(RunLength::new().epochs(2));
        cfg.run = cfg.run.placement(Placement::new().prefetch(prefetch));
        let mut trainer = new_trainer(cfg).unwrap();
        let start = Instant::now();
        let report = trainer
            .fit(slow(dataset(15, 16, 8), Duration::from_millis(4)), None)
            .unwrap();
        let measured = start.elapsed().as_secs_f64() * 1e3;
        // Loose bounds on purpose: CI shares 2 cores with other tests, and a
        // preempted thread must not fail the build. The identity below is exact.
        assert!(
            report.wall_ms <= measured && report.wall_ms > measured * 0.5,
            "{report}"
        );
        let copy = if report.copy_overlapped {
            0.0
        } else {
            report.copy_ms.total
        };
        let phases = report.data_wait_ms.total + copy + report.compute_ms.total + report.eval_ms;
        assert!(phases <= report.wall_ms, "{report}");
        // What the phases do not cover is start-up (first batch, model) and bookkeeping.
        assert!(
            report.wall_ms - phases < 0.5 * report.wall_ms,
            "prefetch {prefetch}: phases {phases:.1} of {:.1} ms\n{report}",
            report.wall_ms
        );
        assert!((phases + report.other_ms - report.wall_ms).abs() < 0.01);
    }
}

#[test]
fn stall_is_high_when_the_pipeline_is_slow_and_low_when_not() {
    let mut cfg = config(OptimizerKind::Sgd);
    cfg.run = cfg.run.length(RunLength::new().epochs(1));
    let mut trainer = new_trainer(cfg).unwrap();
    let report = trainer
        .fit(slow(dataset(12, 16, 9), Duration::from_millis(15)), None)
        .unwrap();
    assert!(report.stall_fraction > 0.5, "{report}");
    assert_eq!(report.verdict, Verdict::HighlyInputBound);
    assert_eq!(report.bottleneck_stage.as_deref(), Some("slow_map"));
    assert!(
        report
            .to_string()
            .contains("bottleneck stage is \"slow_map\""),
        "{report}"
    );

    // Fast data, a model with real work per step: the prefetch thread keeps up.
    let model = ModelConfig::Mlp {
        inputs: WIDTH,
        hidden: vec![512, 512],
        classes: CLASSES,
    };
    let mut cfg = Cfg {
        run: TrainConfig::new(input()),
        model,
        optimizer: OptimizerConfig::default_for(OptimizerKind::Sgd),
    };
    cfg.run = cfg.run.length(RunLength::new().epochs(1));
    let mut trainer = new_trainer(cfg).unwrap();
    let report = trainer.fit(memory(dataset(30, 256, 10)), None).unwrap();
    assert!(report.stall_fraction < 0.2, "{report}");
    assert!(
        report.data_wait_ms.total < report.compute_ms.total,
        "{report}"
    );
}

/// Every event of the one event file in `dir`: (step, tag, value).
fn read_events(dir: &std::path::Path) -> Vec<(i64, String, f32)> {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    let mut reader = FileRecordReader::open(&files[0], ReaderOptions::default()).unwrap();
    let mut buf = Vec::new();
    let mut events = Vec::new();
    while reader.read_record(&mut buf).unwrap() {
        events.push(Event::decode(buf.as_slice()).unwrap());
    }
    assert_eq!(
        events[0].what,
        Some(event::What::FileVersion("brain.Event:2".into()))
    );
    let mut out = Vec::new();
    for e in &events[1..] {
        let Some(event::What::Summary(s)) = &e.what else {
            panic!("not a summary: {e:?}")
        };
        for v in &s.value {
            let Some(summary::value::Value::SimpleValue(x)) = v.value else {
                panic!("not a simple value: {v:?}")
            };
            assert!(x.is_finite());
            out.push((e.step, v.tag.clone(), x));
        }
    }
    out
}

#[test]
fn tensorboard_writes_keras_train_and_validation_runs_by_epoch() {
    let logdir = tempfile::tempdir().unwrap();
    let mut cfg = config(OptimizerKind::Sgd);
    cfg.run = cfg.run.length(RunLength::new().epochs(2));
    let mut trainer = new_trainer(cfg).unwrap();
    trainer.observe(tfpipe::train::TensorBoard::create(logdir.path(), 2).unwrap());
    let validation = dataset(2, 8, 12);
    let mut open = move || -> Result<Box<dyn BatchStream>, BoxError> {
        Ok(Box::new(IterStream(
            validation.clone().into_iter().map(Ok::<_, BoxError>),
        )))
    };
    let report = trainer
        .fit(memory(dataset(6, 8, 11)), Some(&mut open))
        .unwrap();

    let train = read_events(&logdir.path().join("train"));
    let tags = |events: &[(i64, String, f32)], tag: &str| -> Vec<i64> {
        events.iter().filter(|e| e.1 == tag).map(|e| e.0).collect()
    };
    // Keras' epoch scalars, stepped by epoch.
    for tag in ["epoch_loss", "epoch_accuracy", "epoch_learning_rate"] {
        assert_eq!(tags(&train, tag), [0, 1], "{tag} in {train:?}");
    }
    // Ours, per step (every 2 steps, stepped by global step).
    for tag in ["batch_loss", "examples_per_sec", "stall_fraction"] {
        assert_eq!(tags(&train, tag), [2, 4, 6, 8, 10, 12], "{tag}");
    }
    let validation = read_events(&logdir.path().join("validation"));
    assert_eq!(tags(&validation, "epoch_loss"), [0, 1]);
    assert_eq!(tags(&validation, "epoch_accuracy"), [0, 1]);
    let val_loss = validation
        .iter()
        .find(|e| e.1 == "epoch_loss" && e.0 == 1)
        .unwrap()
        .2;
    assert_eq!(val_loss, report.epochs[1].val_loss.unwrap() as f32);
    let lr = train
        .iter()
        .find(|e| e.1 == "epoch_learning_rate")
        .unwrap()
        .2;
    assert_eq!(lr, 0.1);
}

#[test]
fn data_errors_arrive_as_errors() {
    let mut trainer = new_trainer(config(OptimizerKind::Sgd)).unwrap();
    let err = trainer
        .fit(
            |_| {
                Ok(IterStream(
                    vec![Err::<Batch, BoxError>(
                        "record 7 at byte 99: bad crc".into(),
                    )]
                    .into_iter(),
                ))
            },
            None,
        )
        .unwrap_err();
    assert!(chain(&err).contains("record 7 at byte 99"), "{err}");
    let mut trainer = new_trainer(config(OptimizerKind::Sgd)).unwrap();
    let err = trainer
        .fit(
            |_| {
                Ok(IterStream(
                    Vec::<Result<Batch, BoxError>>::new().into_iter(),
                ))
            },
            None,
        )
        .unwrap_err();
    assert!(chain(&err).contains("no batches"), "{err}");
}

/// Writes the dataset as TFRecord `Example`s (`x`: 8 floats, `label`: int64).
fn write_records(path: &std::path::Path, batches: &[Batch]) {
    use tfpipe::example::Example;
    use tfpipe::example::proto::{Feature, Features, FloatList, Int64List, feature};
    let mut w =
        tfpipe::tfrecord::FileRecordWriter::create(path, tfpipe::Compression::None).unwrap();
    for b in batches {
        let (Values::Float32(x), Values::Int64(y)) = (&b.columns[0].values, &b.columns[1].values)
        else {
            unreachable!()
        };
        for r in 0..b.num_rows {
            let mut f = std::collections::BTreeMap::new();
            f.insert(
                "x".to_string(),
                Feature {
                    kind: Some(feature::Kind::FloatList(FloatList {
                        value: x[r * WIDTH..(r + 1) * WIDTH].to_vec(),
                    })),
                },
            );
            f.insert(
                "label".to_string(),
                Feature {
                    kind: Some(feature::Kind::Int64List(Int64List { value: vec![y[r]] })),
                },
            );
            let example = Example {
                features: Some(Features { feature: f }),
            };
            w.write_record(&example.encode_to_vec()).unwrap();
        }
    }
    w.finish().unwrap();
}

#[test]
fn cli_train_then_predict() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_records(&d.join("train.tfrecord"), &dataset(4, 16, 20));
    write_records(&d.join("test.tfrecord"), &dataset(2, 16, 21));
    let path = |name: &str| d.join(name).to_string_lossy().into_owned();
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args([
            "train",
            "--data",
            &path("train.tfrecord"),
            "--test-data",
            &path("test.tfrecord"),
        ])
        .args([
            "--feature",
            "x:float32:8",
            "--feature",
            "label:int64",
            "--label",
            "label",
            "--classes",
            "3",
        ])
        .args([
            "--epochs",
            "2",
            "--batch-size",
            "16",
            "--hidden",
            "16",
            "--optimizer",
            "sgd",
        ])
        .args([
            "--save",
            &path("ck"),
            "--logdir",
            &path("logs"),
            "--report-json",
            &path("train.json"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("start-up") && table.contains("stall"),
        "{table}"
    );
    // The device's start-up rows, on the CPU: nothing to warm up.
    assert!(
        table.contains("device     init ")
            && table.contains("weights drawn and uploaded ")
            && table.contains("first kernel (warm-up) n/a"),
        "{table}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("train.json")).unwrap()).unwrap();
    let device = &report["device_startup_ms"];
    assert!(
        device["device_init_ms"].as_f64().unwrap() >= 0.0,
        "{report}"
    );
    assert!(
        device["weights_upload_ms"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(device["first_kernel_ms"].is_null(), "{report}");
    assert_eq!(report["steps"], 8);
    assert_eq!(report["examples"], 128);
    assert!(report["val_accuracy"].as_f64().unwrap() > 0.5, "{report}");
    assert!(report["data_wait_ms"]["p99"].is_number());

    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args([
            "predict",
            "--checkpoint",
            &path("ck"),
            "--data",
            &path("test.tfrecord"),
            "--batch-size",
            "8",
        ])
        .args([
            "--warmup",
            "1",
            "--output",
            &path("pred.jsonl"),
            "--report-json",
            &path("pred.json"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("pred.json")).unwrap()).unwrap();
    assert_eq!(report["examples"], 32);
    for key in ["load_ms", "first_prediction_ms", "accuracy"] {
        assert!(report[key].is_number(), "{key}: {report}");
    }
    assert!(
        report["steady_prediction_ms"]["p50"].is_number()
            && report["steady_prediction_ms"]["p99"].is_number()
    );
    let lines = std::fs::read_to_string(d.join("pred.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 32);
    assert!(
        lines.lines().all(|l| l.starts_with("{\"class\":")),
        "{lines}"
    );
}

#[test]
fn demo_runs_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["demo", "--epochs", "1", "--batch-size", "256", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("test accuracy"), "{stdout}");
    for file in [
        "checkpoint/model.safetensors",
        "checkpoint/checkpoint.json",
        "train-report.json",
        "predictions.jsonl",
    ] {
        assert!(dir.path().join(file).exists(), "no {file}");
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn device_cuda_without_the_feature_is_a_clear_error() {
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args([
            "train",
            "--data",
            "nothing.tfrecord",
            "--feature",
            "x:float32:8",
            "--label",
            "label",
            "--device",
            "cuda",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`cuda` feature"), "{stderr}");
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn trains_on_cuda() {
    let mut cfg = config(OptimizerKind::AdamW);
    cfg.run = cfg
        .run
        .placement(Placement::new().device(tfpipe::train::parse_device("cuda:0").unwrap()));
    cfg.run = cfg.run.length(RunLength::new().epochs(2));
    let mut trainer = new_trainer(cfg).unwrap();
    let report = trainer.fit(memory(dataset(10, 32, 12)), None).unwrap();
    assert_eq!(report.device, "cuda:0");
    assert!(report.epochs[1].loss < report.epochs[0].loss, "{report}");
    // On a GPU the warm-up kernel runs and is timed.
    assert!(
        report.device_startup_ms.first_kernel_ms.unwrap() > 0.0,
        "{report}"
    );
    assert!(
        report.device_startup_ms.weights_upload_ms.unwrap() > 0.0,
        "{report}"
    );
}

/// The bundled 2,000 test digits converted to one TFRecord shard in
/// `dir` (`image_raw` 784 bytes, `label`): its path.
fn mnist_test_shard(dir: &std::path::Path) -> std::path::PathBuf {
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["convert", "idx", "testdata/mnist/test-images-idx3-ubyte.gz"])
        .args(["--labels", "testdata/mnist/test-labels-idx1-ubyte.gz"])
        .args(["--shards", "1", "-o"])
        .arg(dir.join("m"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("m-00000-of-00001.tfrecord")
}

/// Converts `testdata/tabular/penguins.csv` (label `species`, text columns
/// `island` and `sex`, NA values) into `dir`; returns (schema file, data glob).
fn convert_penguins(dir: &std::path::Path) -> (String, String) {
    use tfpipe::convert::{CsvOptions, Format, OutputOptions, convert};
    let prefix = dir.join("penguins");
    let csv = CsvOptions {
        label: Some("species".into()),
        ..CsvOptions::default()
    };
    let summary = convert(
        &Format::Csv(csv),
        &[std::path::PathBuf::from("testdata/tabular/penguins.csv")],
        &OutputOptions::new(&prefix),
    )
    .unwrap();
    assert_eq!(summary.records, 344);
    (
        summary.schema_path.to_string_lossy().into_owned(),
        format!("{}-*", prefix.display()),
    )
}

#[test]
fn cli_trains_on_a_converted_csv_with_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (schema, data) = convert_penguins(dir.path());
    let report_path = dir.path().join("train.json");
    // Two rows lack their measurements: never a silent 0, so the run stops
    // at the first, naming it, until imputation is asked for.
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["train", "--schema", &schema, "--data", &data])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("penguins-00000-of-00001.tfrecord: record ") && stderr.contains("--impute"),
        "{stderr}"
    );
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["train", "--schema", &schema, "--data", &data])
        .args(["--impute", "mean", "--epochs", "2", "--report-json"])
        .arg(&report_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("skipped features: island (bytes), sex (bytes)"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    // 5 numeric inputs and the missing indicators of the 4 with NA values;
    // 3 classes from the label vocabulary convert recorded.
    assert_eq!(report["model"], "mlp 9-256-3", "{report}");
    assert_eq!(report["examples"], 2 * 344, "{report}");
    assert_eq!(report["skipped_features"][0]["name"], "island");
    assert_eq!(report["skipped_features"][1]["reason"], "bytes");
    assert_eq!(report["standardized"], true);
    for epoch in report["epochs"].as_array().unwrap() {
        let loss = epoch["loss"].as_f64().unwrap();
        let accuracy = epoch["accuracy"].as_f64().unwrap();
        assert!(loss.is_finite() && loss > 0.0, "{report}");
        assert!((0.0..=1.0).contains(&accuracy), "{report}");
    }

    // Too few classes: the error names the value and the flag.
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["train", "--schema", &schema, "--data", &data])
        .args(["--impute", "mean", "--classes", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("label \"species\" = 2 is outside 0..2") && stderr.contains("--classes"),
        "{stderr}"
    );
    // An integer target may be a quantity: the hint names regression too.
    assert!(stderr.contains("--task regression"), "{stderr}");
    // The label is named by its record (the first Gentoo, row 152 of the
    // CSV), not by the shuffled batch it came in.
    assert!(
        stderr.contains("penguins-00000-of-00001.tfrecord: record 152 at byte "),
        "{stderr}"
    );
    assert!(!stderr.contains("batch "), "{stderr}");
}

/// A label missing from a record is an error naming its file and record,
/// never a 0: `cars.json` has 8 records without `Miles_per_Gallon`, which the
/// conversion gave a default (it was not the label then).
#[test]
fn a_missing_label_is_an_error_naming_file_and_record_not_a_zero() {
    let dir = tempfile::tempdir().unwrap();
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args([
            "convert",
            "json",
            "testdata/tabular/cars.json",
            "--shards",
            "1",
            "-o",
        ])
        .arg(dir.path().join("cars"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("train")
        .arg("--schema")
        .arg(dir.path().join("cars.features.json"))
        .arg("--data")
        .arg(dir.path().join("cars-00000-of-00001.tfrecord"))
        .args([
            "--label",
            "Miles_per_Gallon",
            "--task",
            "regression",
            "--impute",
            "mean",
            "--epochs",
            "1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cars-00000-of-00001.tfrecord: record "),
        "{stderr}"
    );
    assert!(stderr.contains("Miles_per_Gallon"), "{stderr}");
    assert!(stderr.contains("--skip-missing-labels"), "{stderr}");

    // Asked to, the run skips the 8 records without a label, counts them
    // (once per epoch: the second epoch, read ahead, is not counted twice)
    // and trains on the others.
    let report = dir.path().join("report.json");
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("train")
        .arg("--schema")
        .arg(dir.path().join("cars.features.json"))
        .arg("--data")
        .arg(dir.path().join("cars-00000-of-00001.tfrecord"))
        .args(["--label", "Miles_per_Gallon", "--task", "regression"])
        .args(["--epochs", "2", "--skip-missing-labels", "--impute", "mean"])
        .arg("--report-json")
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("skipped    8 training records without a label per epoch"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["skipped_unlabelled"], 8, "{report}");
    assert_eq!(report["examples"], 2 * (406 - 8), "{report}");
}

/// Missing inputs are imputed only when asked: `cars.json` lacks
/// `Horsepower` in 6 records (which the conversion gave a default). Without
/// `--impute` the run stops at the first, naming file, record and feature;
/// with it, the model gets one missing-indicator column, the checkpoint
/// records the imputation, and a resume with another one is refused.
#[test]
fn missing_inputs_are_refused_unless_imputed_with_an_indicator_column() {
    let dir = tempfile::tempdir().unwrap();
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args([
            "convert",
            "json",
            "testdata/tabular/cars.json",
            "--shards",
            "1",
            "-o",
        ])
        .arg(dir.path().join("cars"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ck = dir.path().join("ck");
    let run = |skip: bool, extra: &[&str]| {
        let out = assert_cmd::Command::cargo_bin("tfpipe")
            .unwrap()
            .arg("train")
            .arg("--schema")
            .arg(dir.path().join("cars.features.json"))
            .arg("--data")
            .arg(dir.path().join("cars-00000-of-00001.tfrecord"))
            .args(["--label", "Miles_per_Gallon", "--task", "regression"])
            .args(["--epochs", "1", "--hidden", "4"])
            .args(skip.then_some("--skip-missing-labels"))
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), stderr)
    };
    let train = |extra: &[&str]| run(true, extra);
    let (code, stderr) = train(&[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("cars-00000-of-00001.tfrecord: record ")
            && stderr.contains("Horsepower")
            && stderr.contains("--impute mean|zero"),
        "{stderr}"
    );

    let ck_arg = ck.to_str().unwrap();
    let (code, stderr) = train(&["--impute", "mean", "--save", ck_arg]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("missing Horsepower filled with its mean, with an indicator column"),
        "{stderr}"
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("checkpoint.json")).unwrap()).unwrap();
    assert_eq!(
        meta["input"]["impute"],
        serde_json::json!({"fill": "mean", "features": ["Horsepower"]}),
        "{meta}"
    );
    // Cylinders, Displacement, Horsepower, Weight_in_lbs, Acceleration and
    // Horsepower's indicator.
    assert_eq!(meta["model_description"], "mlp regressor 6-4-1", "{meta}");

    // The indicator columns are part of the model: another imputation, or
    // none, cannot resume it.
    let (code, stderr) = train(&["--impute", "zero", "--resume", ck_arg]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("filled with its mean") && stderr.contains("filled with 0"),
        "{stderr}"
    );
    assert!(stderr.contains("--impute"), "{stderr}");
    let (code, stderr) = train(&["--resume", ck_arg]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("missing inputs not imputed"), "{stderr}");
    // Skipping unlabelled records is a stage of the pipeline whose
    // position the checkpoint holds: switching it is refused, naming it.
    let (code, stderr) = run(false, &["--impute", "mean", "--resume", ck_arg]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("records without a label: skipped, now an error"),
        "{stderr}"
    );
    let (code, stderr) = train(&["--impute", "mean", "--resume", ck_arg]);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn standardised_tabular_inputs_learn_and_predict_with_missing_values() {
    let dir = tempfile::tempdir().unwrap();
    let (schema, data) = convert_penguins(dir.path());
    let ck = dir.path().join("ck");
    let report_path = dir.path().join("train.json");
    // Unscaled (body mass ~4000 g next to bill depth ~17 mm), this run ended
    // at 39-73% test accuracy with a loss of 16-46 over four seeds; standardised, 98%.
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args([
            "train", "--schema", &schema, "--data", &data, "--impute", "mean",
        ])
        .args(["--test-data", &data, "--epochs", "10", "--batch-size", "32"])
        .arg("--save")
        .arg(&ck)
        .arg("--report-json")
        .arg(&report_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    let accuracy = report["val_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.9, "{report}");
    assert!(report["val_loss"].as_f64().unwrap().is_finite());

    // The checkpoint scales inputs and fills missing values (2 rows have NA
    // measurements) as training did.
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("predict")
        .arg("--checkpoint")
        .arg(&ck)
        .args(["--data", &data])
        .output()
        .unwrap();
    // The predictions go to stdout, the report to stderr.
    let stdout = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 344);
    assert!(stdout.contains("predicted  344 examples"), "{stdout}");
    let predicted: f64 = stdout
        .split("accuracy ")
        .nth(1)
        .and_then(|s| s.trim().trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| panic!("no accuracy in {stdout}"));
    assert!((predicted / 100.0 - accuracy).abs() < 1e-3, "{stdout}");
}

/// The example's model code, reused: a custom candle model trained through
/// `Trainer::fit` with validation, TensorBoard and a checkpoint.
#[path = "../examples/custom_model.rs"]
mod custom_model;

#[test]
fn a_custom_model_trains_through_fit_with_the_full_report() {
    let dir = tempfile::tempdir().unwrap();
    let report = custom_model::train(3, Some(dir.path())).unwrap();
    assert_eq!(report.model, "residual mlp 16-32-32-4");
    assert_eq!(report.epochs.len(), 3);
    assert!(report.val_accuracy.unwrap() > 0.9, "{report}");
    assert!(report.epochs[2].loss < report.epochs[0].loss, "{report}");
    assert!(
        report.optimizer.starts_with("adamw"),
        "{}",
        report.optimizer
    );
    // The observers ran: a checkpoint with optimizer state, Keras' runs.
    let meta = Checkpoint::read_meta(dir.path().join("checkpoint")).unwrap();
    assert_eq!(meta.model, None);
    assert_eq!(meta.model_description, "residual mlp 16-32-32-4");
    assert!(meta.optimizer_state);
    assert_eq!((meta.epoch, meta.step), (3, 60));
    for run in ["train", "validation"] {
        assert!(
            std::fs::read_dir(dir.path().join("logs").join(run))
                .unwrap()
                .next()
                .is_some(),
            "no {run} events"
        );
    }
}

/// Epoch `e` sees the batches rotated by `e` (a stand-in for the
/// pipeline's per-epoch shuffle).
fn rotating(batches: Vec<Batch>) -> impl FnMut(u64) -> Result<Stream, BoxError> {
    move |epoch| {
        let mut b = batches.clone();
        let n = b.len();
        b.rotate_left((tfpipe::train::epoch_seed(0, epoch) as usize) % n);
        Ok(IterStream(
            b.into_iter().map(Ok).collect::<Vec<_>>().into_iter(),
        ))
    }
}

fn weights(trainer: &Trainer) -> Vec<(String, Vec<f32>)> {
    let data = trainer.varmap().data().lock().unwrap();
    let mut out: Vec<(String, Vec<f32>)> = data
        .iter()
        .map(|(k, v)| (k.clone(), v.flatten_all().unwrap().to_vec1().unwrap()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn two_epochs_straight_equal_one_then_resume_one_bit_for_bit() {
    for kind in [
        OptimizerKind::Adam,
        OptimizerKind::AdamW,
        OptimizerKind::Sgd,
    ] {
        let data = dataset(6, 16, 21);
        let mut cfg = config(kind);
        cfg.optimizer.momentum = if kind == OptimizerKind::Sgd { 0.9 } else { 0.0 };
        cfg.run = cfg.run.length(RunLength::new().epochs(2));
        let momentum = cfg.optimizer.momentum;
        let mut straight = new_trainer(cfg).unwrap();
        let full = straight.fit(rotating(data.clone()), None).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(kind);
        cfg.optimizer.momentum = momentum;
        cfg.run = cfg.run.length(RunLength::new().epochs(1));
        let mut first = new_trainer(cfg).unwrap();
        first.fit(rotating(data.clone()), None).unwrap();
        first.save(dir.path()).unwrap();

        let mut cfg = config(kind);
        cfg.optimizer.momentum = momentum;
        cfg.run = cfg.run.length(RunLength::new().epochs(1));
        cfg.run = cfg
            .run
            .reproducibility(Reproducibility::new().resume(dir.path().to_path_buf()));
        let mut resumed = new_trainer(cfg).unwrap();
        assert!(resumed.warnings().is_empty(), "{:?}", resumed.warnings());
        let rest = resumed.fit(rotating(data.clone()), None).unwrap();

        assert_eq!(weights(&straight), weights(&resumed), "{kind}");
        // Epoch numbers carry on, and the numbers are the same.
        assert_eq!(rest.epochs[0].epoch, 1);
        assert_eq!(rest.epochs[0].loss, full.epochs[1].loss, "{kind}");
        assert_eq!(rest.epochs[0].accuracy, full.epochs[1].accuracy);
        assert_eq!((resumed.epoch(), resumed.global_step()), (2, 12));
    }
}

#[test]
fn a_foreign_optimizer_trains_and_resume_warns_its_state_is_not_saved() {
    use candle_nn::Optimizer as _;
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, candle_core::DType::F32, &Device::Cpu);
    let model = tfpipe::train::BuiltinModel::new(config(OptimizerKind::Sgd).model, vb).unwrap();
    tfpipe::train::seed_vars(&varmap, 1, &Device::Cpu).unwrap();
    let candle_sgd = candle_nn::SGD::new(varmap.all_vars(), 0.1).unwrap();
    let cfg = TrainConfig::new(input()).length(RunLength::new().epochs(2));
    let mut trainer = Trainer::new(
        cfg,
        model,
        varmap,
        tfpipe::train::Foreign::new(candle_sgd, "candle sgd"),
    )
    .unwrap();
    let report = trainer.fit(memory(dataset(10, 32, 2)), None).unwrap();
    assert!(report.epochs[1].loss < report.epochs[0].loss, "{report}");
    let dir = tempfile::tempdir().unwrap();
    trainer.save(dir.path()).unwrap();
    let meta = Checkpoint::read_meta(dir.path()).unwrap();
    assert!(!meta.optimizer_state && meta.optimizer.is_none());

    // Resuming with a foreign optimizer again: the weights load, and a warning says the rest.
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, candle_core::DType::F32, &Device::Cpu);
    let model = tfpipe::train::BuiltinModel::new(config(OptimizerKind::Sgd).model, vb).unwrap();
    let candle_sgd = candle_nn::SGD::new(varmap.all_vars(), 0.1).unwrap();
    let cfg = TrainConfig::new(input())
        .reproducibility(Reproducibility::new().resume(dir.path().to_path_buf()));
    let resumed = Trainer::new(
        cfg,
        model,
        varmap,
        tfpipe::train::Foreign::new(candle_sgd, "candle sgd"),
    )
    .unwrap();
    assert_eq!(resumed.global_step(), 20);
    assert!(
        resumed.warnings()[0].contains("does not expose its state"),
        "{:?}",
        resumed.warnings()
    );
}

#[test]
fn regression_learns_a_linear_target_with_mse_mae_rmse() {
    // y = 2 x0 - x1 + 0.5 from the blobs' features.
    let batches: Vec<Batch> = dataset(20, 32, 31)
        .into_iter()
        .map(|mut b| {
            let Values::Float32(x) = &b.columns[0].values else {
                unreachable!()
            };
            let y: Vec<f32> = x.chunks(WIDTH).map(|r| 2.0 * r[0] - r[1] + 0.5).collect();
            b.columns[1].values = Values::Float32(y);
            b
        })
        .collect();
    let input = InputSpec {
        features: vec![("x".into(), WIDTH)],
        label: Some("label".into()),
        task: Task::Regression,
        standardize: vec![],
        tokens: None,
        impute: None,
    };
    let cfg = TrainConfig::new(input).length(RunLength::new().epochs(8));
    let model = ModelConfig::mlp(WIDTH, vec![16], Task::Regression);
    let optimizer = OptimizerConfig {
        lr: 0.01,
        ..OptimizerConfig::default_for(OptimizerKind::Adam)
    };
    let mut trainer = Trainer::builtin(cfg, model, optimizer).unwrap();
    let validation = batches[..4].to_vec();
    let mut open = move || -> Result<Box<dyn BatchStream>, BoxError> {
        Ok(Box::new(IterStream(
            validation.clone().into_iter().map(Ok::<_, BoxError>),
        )))
    };
    let report = trainer.fit(memory(batches), Some(&mut open)).unwrap();
    let (first, last) = (&report.epochs[0], report.epochs.last().unwrap());
    assert!(last.loss < first.loss * 0.2, "{report}");
    assert!(last.accuracy.is_none() && last.mae.is_some() && last.rmse.is_some());
    assert!(report.val_mae.unwrap() < 0.5, "{report}");
    // RMSE is the root of the mean squared error, the loss.
    let val_loss = report.val_loss.unwrap();
    assert!((report.val_rmse.unwrap() - val_loss.sqrt()).abs() < 1e-3 * (1.0 + val_loss));
    assert!(report.to_string().contains("val_mae"), "{report}");
}

/// SIGINT (and SIGTERM) during `train --save`: the run stops after the
/// current step, saves its checkpoint, and exits 128 + the signal.
#[cfg(unix)]
#[test]
fn a_signal_during_train_saves_the_checkpoint_and_exits_128_plus_the_signal() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_records(&d.join("train.tfrecord"), &dataset(4, 16, 30));
    for (signal, code) in [("INT", 130), ("TERM", 143)] {
        let (ck, logs) = (
            d.join(format!("ck-{signal}")),
            d.join(format!("logs-{signal}")),
        );
        let child = Command::new(env!("CARGO_BIN_EXE_tfpipe"))
            .arg("train")
            .arg("--data")
            .arg(d.join("train.tfrecord"))
            .args(["--feature", "x:float32:8", "--feature", "label:int64"])
            .args(["--label", "label", "--classes", "3", "--epochs", "1000000"])
            .args(["--batch-size", "16", "--hidden", "8", "--save"])
            .arg(&ck)
            .arg("--logdir")
            .arg(&logs)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The event file grows past its header once steps or an epoch are logged.
        let logged = || {
            std::fs::read_dir(logs.join("train"))
                .ok()
                .and_then(|mut d| d.next())
                .and_then(|e| e.ok()?.metadata().ok())
                .is_some_and(|m| m.len() > 200)
        };
        let out = common::signal_when_ready(child, signal, "no steps logged", logged);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "SIG{signal}: {stderr}");
        assert!(
            stderr.contains(&format!("interrupted by SIG{signal}; checkpoint saved")),
            "{stderr}"
        );
        let meta = Checkpoint::read_meta(&ck).unwrap();
        assert!(meta.step >= 1, "{meta:?}");
        Checkpoint::load(&ck, &Device::Cpu).unwrap();
    }
}

/// The one seed scheme: a single pass seeded with `epoch_seed(seed, e)`
/// (and no per-epoch reshuffle) is epoch `e` of the whole run's pipeline,
/// `shuffle(buffer, seed).repeat(None)`. A resumed run relies on it.
#[test]
fn epoch_seed_gives_a_single_pass_the_order_of_that_epoch_under_repeat() {
    use tfpipe::pipeline::{Event, Pipeline, ShuffleOptions};
    let data: Vec<u32> = (0..50).collect();
    let mut it = Pipeline::from_vec(data.clone())
        .shuffle(8, 3)
        .repeat(None)
        .start()
        .unwrap();
    let mut epochs = vec![Vec::new()];
    while epochs.len() <= 3 {
        match it.next_event().unwrap() {
            Event::Item(x) => epochs.last_mut().unwrap().push(x.unwrap()),
            Event::EpochEnd(_) => epochs.push(Vec::new()),
        }
    }
    assert_ne!(epochs[0], epochs[1]);
    for (e, expected) in epochs.iter().take(3).enumerate() {
        let single: Vec<u32> = Pipeline::from_vec(data.clone())
            .shuffle_with(ShuffleOptions {
                buffer_size: 8,
                seed: tfpipe::train::epoch_seed(3, e as u64),
                reshuffle_each_epoch: false,
                early_start: false,
            })
            .start()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(&single, expected, "epoch {e}");
    }
}

fn tensors_of(path: &std::path::Path) -> Vec<(String, Vec<f32>)> {
    let mut all: Vec<(String, Vec<f32>)> = candle_core::safetensors::load(path, &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(k, t)| (k, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

/// `tfpipe train` on `d/train.tfrecord` with the small MLP the CLI resume
/// tests share (batch 16, shuffle buffer 32, seed 5, one compute thread),
/// plus `extra`, saving to `d/save`: the report it wrote to `d/save.json`.
fn train_small_reported(d: &std::path::Path, extra: &[&str], save: &str) -> serde_json::Value {
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("train")
        .arg("--data")
        .arg(d.join("train.tfrecord"))
        .args(["--feature", "x:float32:8", "--feature", "label:int64"])
        .args(["--label", "label", "--classes", "3", "--batch-size", "16"])
        .args(["--hidden", "8", "--shuffle-buffer", "32", "--seed", "5"])
        .args(["--compute-threads", "1", "--report-json"])
        .arg(d.join(format!("{save}.json")))
        .args(extra)
        .arg("--save")
        .arg(d.join(save))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{save}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(d.join(format!("{save}.json"))).unwrap()).unwrap()
}

/// Through the CLI, with a shuffle: 2 epochs in one run, and 1 epoch then
/// `--resume` for 1 more, end with the same weights, bit for bit.
#[test]
fn cli_two_epochs_straight_equal_one_then_resume_one_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_records(&d.join("train.tfrecord"), &dataset(6, 16, 40));
    let train = |extra: &[&str], save: &str| train_small_reported(d, extra, save);
    let straight = train(&["--epochs", "2"], "straight");
    train(&["--epochs", "1"], "half");
    let resume = d.join("half").to_string_lossy().into_owned();
    let resumed = train(&["--epochs", "1", "--resume", &resume], "resumed");
    assert_eq!(resumed["epochs"][0]["epoch"], 1);
    assert_eq!(resumed["global_step"], straight["global_step"]);
    assert_eq!(
        resumed["epochs"][0]["loss"], straight["epochs"][1]["loss"],
        "{resumed}\n{straight}"
    );
    assert_eq!(
        tensors_of(&d.join("resumed/model.safetensors")),
        tensors_of(&d.join("straight/model.safetensors"))
    );

    // Without the pipeline position (an older checkpoint, a stream that
    // cannot report one), the resumed run reads epoch 1 as a single pass
    // seeded with `epoch_seed`: the same batches, the same weights.
    let meta_path = d.join("half/checkpoint.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    assert!(meta["pipeline_state"].is_object(), "{meta}");
    meta.as_object_mut().unwrap().remove("pipeline_state");
    // Older checkpoints had no checksum of their own either (an edit is
    // refused against it).
    meta.as_object_mut().unwrap().remove("checksum");
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let fallback = train(&["--epochs", "1", "--resume", &resume], "fallback");
    assert_eq!(fallback["epochs"][0]["loss"], straight["epochs"][1]["loss"]);
    assert_eq!(
        tensors_of(&d.join("fallback/model.safetensors")),
        tensors_of(&d.join("straight/model.safetensors"))
    );
}

/// A checkpoint saved at the exact end of an epoch (a step limit on its
/// last batch) resumes into the next epoch, bit for bit; it used to fail with
/// "the training data produced no batches".
#[test]
fn cli_resume_at_an_epochs_end_goes_on_with_the_next_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_records(&d.join("train.tfrecord"), &dataset(6, 16, 42));
    let train = |extra: &[&str], save: &str| train_small_reported(d, extra, save);
    let straight = train(&["--epochs", "2"], "straight");
    // 96 records at batch 16: 6 steps are exactly one epoch.
    train(&["--steps", "6"], "end");
    let resume = d.join("end").to_string_lossy().into_owned();
    let resumed = train(&["--epochs", "1", "--resume", &resume], "resumed");
    assert_eq!(resumed["epochs"][0]["epoch"], 1, "{resumed}");
    assert_eq!(resumed["global_step"], straight["global_step"]);
    assert_eq!(
        tensors_of(&d.join("resumed/model.safetensors")),
        tensors_of(&d.join("straight/model.safetensors"))
    );
}

/// A resume with other data options would train a truncated or repeated
/// epoch: it is refused with a message naming each difference, and only a
/// different batch size may be forced (inexactly).
#[test]
fn cli_resume_with_other_data_options_is_refused_naming_each_difference() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("train.tfrecord");
    write_records(&data, &dataset(6, 16, 43));
    let train = |extra: &[&str], files: &[&std::path::Path], save: &str| {
        let mut cmd = assert_cmd::Command::cargo_bin("tfpipe").unwrap();
        cmd.arg("train");
        for f in files {
            cmd.arg("--data").arg(f);
        }
        let out = cmd
            .args(["--feature", "x:float32:8", "--feature", "label:int64"])
            .args(["--label", "label", "--classes", "3", "--hidden", "8"])
            .args(["--seed", "5", "--compute-threads", "1"])
            .args(extra)
            .arg("--save")
            .arg(d.join(save))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let base = ["--batch-size", "16", "--shuffle-buffer", "32"];
    let (code, stderr) = train(&[&base[..], &["--steps", "3"]].concat(), &[&data], "ck");
    assert_eq!(code, Some(0), "{stderr}");
    let ck = d.join("ck").to_string_lossy().into_owned();
    let resume = ["--resume", ck.as_str(), "--steps", "2"];
    let other = d.join("other.tfrecord");
    write_records(&other, &dataset(2, 16, 44));
    for (extra, files, expected) in [
        (
            vec!["--batch-size", "8", "--shuffle-buffer", "32"],
            vec![data.as_path()],
            "batch size 16, now 8",
        ),
        (
            vec!["--batch-size", "16", "--shuffle-buffer", "64"],
            vec![data.as_path()],
            "shuffle buffer 32, now 64",
        ),
        (
            base.to_vec(),
            vec![data.as_path(), other.as_path()],
            "files: 1 then, 2 now",
        ),
    ] {
        let (code, stderr) = train(&[&extra[..], &resume[..]].concat(), &files, "again");
        assert_eq!(code, Some(2), "{expected}: {stderr}");
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
    // The same file name and size with other records in it.
    let original = std::fs::read(&data).unwrap();
    write_records(&data, &dataset(6, 16, 45));
    assert_eq!(
        std::fs::metadata(&data).unwrap().len(),
        original.len() as u64
    );
    let (code, stderr) = train(&[&base[..], &resume[..]].concat(), &[&data], "again");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("content changed"), "{stderr}");
    std::fs::write(&data, &original).unwrap();
    // Another batch size may be forced: the epoch restarts, with a warning.
    let forced = [
        &[
            "--batch-size",
            "8",
            "--shuffle-buffer",
            "32",
            "--force-resume",
        ][..],
        &resume[..],
    ]
    .concat();
    let (code, stderr) = train(&forced, &[&data], "forced");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("no longer exact"), "{stderr}");
    // The same options resume as before.
    let (code, stderr) = train(&[&base[..], &resume[..]].concat(), &[&data], "same");
    assert_eq!(code, Some(0), "{stderr}");
}

/// `checkpoint.json` is covered by its own checksum and its numbers are
/// checked against their bounds; saves leave no stale temporaries behind.
#[test]
fn an_edited_checkpoint_json_is_refused_and_saves_clean_up_after_dead_ones() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("train.tfrecord");
    write_records(&data, &dataset(6, 16, 46));
    let train = |extra: &[&str]| {
        let out = assert_cmd::Command::cargo_bin("tfpipe")
            .unwrap()
            .arg("train")
            .arg("--data")
            .arg(&data)
            .args(["--feature", "x:float32:8", "--feature", "label:int64"])
            .args(["--label", "label", "--classes", "3", "--hidden", "8"])
            .args(["--batch-size", "16", "--compute-threads", "1"])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let ck = d.join("ck");
    let ck_text = ck.to_string_lossy().into_owned();
    // Leftovers of saves killed mid-way (this version's and older ones').
    std::fs::create_dir_all(&ck).unwrap();
    for stale in [
        ".ck.a1b2c3.tmp",
        ".ck.d4e5f6.old",
        ".ck.tmp-123456",
        ".ck.old-abcdef",
    ] {
        std::fs::create_dir_all(d.join(stale).join("inner")).unwrap();
    }
    let (code, stderr) = train(&["--steps", "3", "--save", &ck_text]);
    assert_eq!(code, Some(0), "{stderr}");
    let mut left: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["ck", "train.tfrecord"], "stale temporaries stay");

    let meta_path = ck.join("checkpoint.json");
    let original = std::fs::read(&meta_path).unwrap();
    let resume = ["--steps", "1", "--resume", ck_text.as_str()];
    // An edit, however small, is refused against the checksum.
    let meta: serde_json::Value = serde_json::from_slice(&original).unwrap();
    let mut edited = meta.clone();
    edited["seed"] = serde_json::json!(9);
    std::fs::write(&meta_path, serde_json::to_vec_pretty(&edited).unwrap()).unwrap();
    let (code, stderr) = train(&resume);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("modified or damaged"), "{stderr}");
    // Without a checksum (an older checkpoint), numbers are still bounded: a
    // skip of 10^15 batches used to spin for minutes.
    let mut absurd = meta.clone();
    absurd.as_object_mut().unwrap().remove("checksum");
    absurd["pipeline_state"]["skip"] = serde_json::json!(1_000_000_000_000_000u64);
    std::fs::write(&meta_path, serde_json::to_vec_pretty(&absurd).unwrap()).unwrap();
    let (code, stderr) = train(&resume);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("pipeline_state.skip"), "{stderr}");
    // The file as saved resumes.
    std::fs::write(&meta_path, &original).unwrap();
    let (code, stderr) = train(&resume);
    assert_eq!(code, Some(0), "{stderr}");
}

/// The inputs are chosen with --inputs or --exclude, and --feature
/// overrides a --schema file's spec of the same name.
#[test]
fn cli_inputs_are_chosen_and_feature_specs_override_the_schema_file() {
    let dir = tempfile::tempdir().unwrap();
    let (schema, data) = convert_penguins(dir.path());
    let train = |extra: &[&str], save: &str| {
        let out = assert_cmd::Command::cargo_bin("tfpipe")
            .unwrap()
            .args(["train", "--schema", &schema, "--data", &data])
            .args(["--impute", "zero", "--epochs", "1", "--hidden", "4"])
            .args(extra)
            .arg("--save")
            .arg(dir.path().join(save))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let meta = std::fs::read(dir.path().join(save).join("checkpoint.json"))
            .ok()
            .map(|b| serde_json::from_slice::<serde_json::Value>(&b).unwrap());
        (out.status.code(), stderr, meta)
    };
    let inputs = |meta: &serde_json::Value| -> Vec<String> {
        meta["input"]["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f[0].as_str().unwrap().to_string())
            .collect()
    };
    let (code, stderr, meta) = train(&["--inputs", "bill_length_mm,bill_depth_mm"], "only");
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(inputs(&meta.unwrap()), ["bill_length_mm", "bill_depth_mm"]);
    let (code, stderr, meta) = train(&["--exclude", "year,body_mass_g"], "without");
    assert_eq!(code, Some(0), "{stderr}");
    let without = inputs(&meta.unwrap());
    assert!(
        !without.iter().any(|n| n == "year" || n == "body_mass_g"),
        "{without:?}"
    );
    assert!(without.iter().any(|n| n == "bill_length_mm"), "{without:?}");
    let (code, stderr, _) = train(&["--exclude", "nope"], "bad");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--exclude: \"nope\" is not a feature"),
        "{stderr}"
    );
    // --feature with --schema: the file's `year` (no missing values, so no
    // default) given one, which marks it as one that may be missing.
    let (code, stderr, meta) = train(&["--feature", "year:int64=2000"], "override");
    assert_eq!(code, Some(0), "{stderr}");
    let meta = meta.unwrap();
    let imputed = &meta["input"]["impute"]["features"];
    assert!(
        imputed.as_array().unwrap().iter().any(|f| f == "year"),
        "{meta}"
    );
}

/// `dataset`'s records with their label as text (`cat`, `dog`, `bird` for
/// classes 0, 1, 2), as TensorFlow datasets often store labels.
fn write_text_labels(path: &std::path::Path, batches: &[Batch], names: &[&str]) {
    use tfpipe::example::Example;
    use tfpipe::example::proto::{BytesList, Feature, Features, FloatList, feature};
    let mut w =
        tfpipe::tfrecord::FileRecordWriter::create(path, tfpipe::Compression::None).unwrap();
    for b in batches {
        let (Values::Float32(x), Values::Int64(y)) = (&b.columns[0].values, &b.columns[1].values)
        else {
            unreachable!()
        };
        for r in 0..b.num_rows {
            let x = Feature {
                kind: Some(feature::Kind::FloatList(FloatList {
                    value: x[r * WIDTH..(r + 1) * WIDTH].to_vec(),
                })),
            };
            let label = Feature {
                kind: Some(feature::Kind::BytesList(BytesList {
                    value: vec![names[y[r] as usize].as_bytes().to_vec()],
                })),
            };
            let features = Features {
                feature: [("x".to_string(), x), ("label".to_string(), label)].into(),
            };
            let example = Example {
                features: Some(features),
            };
            w.write_record(&example.encode_to_vec()).unwrap();
        }
    }
    w.finish().unwrap();
}

/// A text label (no schema file records its classes) trains: its classes
/// are counted in one pass, saved with the checkpoint, and predict names
/// them; a value outside them is an error. (A string label could not be
/// used at all.)
#[test]
fn text_labels_train_through_classes_counted_in_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let names = ["cat", "dog", "bird"];
    write_text_labels(&d.join("train.tfrecord"), &dataset(6, 16, 47), &names);
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("train")
        .arg("--data")
        .arg(d.join("train.tfrecord"))
        .args([
            "--feature",
            "x:float32:8",
            "--feature",
            "label:bytes",
            "--label",
            "label",
        ])
        .args([
            "--epochs",
            "3",
            "--batch-size",
            "16",
            "--hidden",
            "8",
            "--save",
        ])
        .arg(d.join("ck"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("3 classes counted in one pass"), "{stderr}");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("ck/checkpoint.json")).unwrap()).unwrap();
    assert_eq!(
        meta["label_vocabulary"],
        serde_json::json!(["bird", "cat", "dog"])
    );
    let predict = |data: &std::path::Path| {
        assert_cmd::Command::cargo_bin("tfpipe")
            .unwrap()
            .arg("predict")
            .arg("--checkpoint")
            .arg(d.join("ck"))
            .arg("--data")
            .arg(data)
            .output()
            .unwrap()
    };
    let out = predict(&d.join("train.tfrecord"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    let class = first["class_name"]
        .as_str()
        .or(first["class"].as_str())
        .unwrap_or_default();
    assert!(names.contains(&class), "{first}");
    // A class the model never saw.
    write_text_labels(
        &d.join("other.tfrecord"),
        &dataset(1, 4, 48),
        &["cat", "fish", "bird"],
    );
    let out = predict(&d.join("other.tfrecord"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("\"fish\" is not one of the 3 classes"),
        "{stderr}"
    );
}

/// Records of `x` (8 floats) and a `label` of the given kind, or none
/// where `labels` gives `None`.
fn write_labels(path: &std::path::Path, labels: &[Option<tfpipe::example::proto::feature::Kind>]) {
    use tfpipe::example::Example;
    use tfpipe::example::proto::{Feature, Features, FloatList, feature};
    let mut w =
        tfpipe::tfrecord::FileRecordWriter::create(path, tfpipe::Compression::None).unwrap();
    for (i, label) in labels.iter().enumerate() {
        let x = Feature {
            kind: Some(feature::Kind::FloatList(FloatList {
                value: (0..WIDTH).map(|j| ((i * 7 + j) % 5) as f32).collect(),
            })),
        };
        let mut feature = std::collections::BTreeMap::from([("x".to_string(), x)]);
        if let Some(kind) = label {
            let y = Feature {
                kind: Some(kind.clone()),
            };
            feature.insert("label".to_string(), y);
        }
        let example = Example {
            features: Some(Features { feature }),
        };
        w.write_record(&example.encode_to_vec()).unwrap();
    }
    w.finish().unwrap();
}

/// [`write_labels`] with int64 labels.
fn write_int_labels(path: &std::path::Path, labels: &[Option<i64>]) {
    use tfpipe::example::proto::{Int64List, feature::Kind};
    let kinds: Vec<Option<Kind>> = labels
        .iter()
        .map(|y| y.map(|y| Kind::Int64List(Int64List { value: vec![y] })))
        .collect();
    write_labels(path, &kinds);
}

/// An int64 label with no class count given (no `--classes`, no schema
/// file vocabulary) takes its count from its values, counted in one pass
/// and said with the reason, instead of a silent 10; values that look like
/// a quantity (sklearn's diabetes target: 214 values from 25 to 346) are
/// refused naming `--task regression`, and train as one with it.
#[test]
fn int_labels_count_their_classes_and_a_quantity_is_refused_naming_regression() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let train = |data: &std::path::Path, extra: &[&str]| {
        assert_cmd::Command::cargo_bin("tfpipe")
            .unwrap()
            .arg("train")
            .arg("--data")
            .arg(data)
            .args(["--feature", "x:float32:8", "--feature", "label:int64"])
            .args(["--label", "label", "--epochs", "1", "--batch-size", "16"])
            .args(["--hidden", "8", "--compute-threads", "1"])
            .args(extra)
            .output()
            .unwrap()
    };
    // Classes 0..=2, and one record without a label, skipped by request:
    // the counting pass passes over it.
    let mut ids: Vec<Option<i64>> = (0..48).map(|i| Some(i % 3)).collect();
    ids[5] = None;
    write_int_labels(&d.join("ids.tfrecord"), &ids);
    let ck = d.join("ck");
    let out = train(
        &d.join("ids.tfrecord"),
        &["--skip-missing-labels", "--save", ck.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "label \"label\": 3 classes, from its values counted in one pass over the data (3 distinct values from 0 to 2 in 47 records)"
        ) && stderr.contains("--task regression"),
        "{stderr}"
    );
    let meta = Checkpoint::read_meta(&ck).unwrap();
    assert_eq!(meta.input.task, Task::Classification { classes: 3 });

    // A quantity: more than 100 distinct values.
    let target: Vec<Option<i64>> = (0..128).map(|i| Some(25 + (i * 37) % 322)).collect();
    write_int_labels(&d.join("target.tfrecord"), &target);
    let out = train(&d.join("target.tfrecord"), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("label \"label\": more than 100 distinct values from 25 to 346 in 128 records: that looks like a quantity")
            && stderr.contains("--task regression")
            && stderr.contains("--classes"),
        "{stderr}"
    );
    assert!(!stderr.contains("epoch "), "{stderr}");
    let out = train(&d.join("target.tfrecord"), &["--task", "regression"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Given, the count is taken as it is (no pass), and a label beyond it
    // names regression too.
    let out = train(&d.join("target.tfrecord"), &["--classes", "300"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is outside 0..300") && stderr.contains("--task regression"),
        "{stderr}"
    );
    // A text label's counting pass passes over a record without the label
    // too (it failed there, even with --skip-missing-labels).
    use tfpipe::example::proto::{BytesList, feature::Kind};
    let mut names: Vec<Option<Kind>> = (0..32)
        .map(|i| {
            Some(Kind::BytesList(BytesList {
                value: vec![if i % 2 == 0 {
                    b"cat".to_vec()
                } else {
                    b"dog".to_vec()
                }],
            }))
        })
        .collect();
    names[3] = None;
    write_labels(&d.join("text.tfrecord"), &names);
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("train")
        .arg("--data")
        .arg(d.join("text.tfrecord"))
        .args(["--feature", "x:float32:8", "--feature", "label:bytes"])
        .args(["--label", "label", "--epochs", "1", "--batch-size", "16"])
        .args(["--hidden", "8", "--skip-missing-labels"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("2 classes counted in one pass"), "{stderr}");
}

/// Mid-epoch exact resume through the CLI: 8 steps (into the second epoch
/// of 6 steps), then `--resume` for 4 more, ends with the weights of 12
/// steps straight, bit for bit: the checkpoint's pipeline position makes
/// the resumed run train on exactly the batches the uninterrupted one did.
#[test]
fn cli_resume_mid_epoch_continues_at_the_next_batch_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_records(&d.join("train.tfrecord"), &dataset(6, 16, 41));
    let train = |extra: &[&str], save: &str| {
        let out = assert_cmd::Command::cargo_bin("tfpipe")
            .unwrap()
            .arg("train")
            .arg("--data")
            .arg(d.join("train.tfrecord"))
            .args(["--feature", "x:float32:8", "--feature", "label:int64"])
            .args(["--label", "label", "--classes", "3", "--batch-size", "16"])
            .args(["--hidden", "8", "--shuffle-buffer", "40", "--seed", "9"])
            .args(["--compute-threads", "1"])
            .args(extra)
            .arg("--save")
            .arg(d.join(save))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    train(&["--steps", "12"], "straight");
    train(&["--steps", "8"], "half");
    let meta = Checkpoint::read_meta(d.join("half")).unwrap();
    assert_eq!((meta.step, meta.epoch), (8, 1));
    assert!(meta.pipeline_state.is_some(), "{meta:?}");
    let resume = d.join("half").to_string_lossy().into_owned();
    let stderr = train(&["--steps", "4", "--resume", &resume], "resumed");
    assert!(!stderr.contains("restarts its epoch"), "{stderr}");
    assert_eq!(Checkpoint::read_meta(d.join("resumed")).unwrap().step, 12);
    assert_eq!(
        tensors_of(&d.join("resumed/model.safetensors")),
        tensors_of(&d.join("straight/model.safetensors"))
    );
}

/// A built-in MLP that records the mode of every forward pass and scales
/// the task's loss by `scale`.
struct Recording {
    inner: tfpipe::train::BuiltinModel,
    modes: std::sync::Arc<std::sync::Mutex<Vec<bool>>>,
    scale: f64,
}

impl Model for Recording {
    fn forward(&self, _: &tfpipe::train::BatchTensors) -> candle_core::Result<candle_core::Tensor> {
        unreachable!("the trainer calls forward_t")
    }

    fn forward_t(
        &self,
        batch: &tfpipe::train::BatchTensors,
        train: bool,
    ) -> candle_core::Result<candle_core::Tensor> {
        self.modes.lock().unwrap().push(train);
        self.inner.forward(batch)
    }

    fn task(&self) -> Task {
        self.inner.task()
    }

    fn loss(
        &self,
        outputs: &candle_core::Tensor,
        labels: &candle_core::Tensor,
    ) -> candle_core::Result<candle_core::Tensor> {
        self.inner.loss(outputs, labels)? * self.scale
    }
}

/// A trainer over a [`Recording`] model seeded 1, and the modes it records.
fn recording_trainer(scale: f64) -> (Trainer, std::sync::Arc<std::sync::Mutex<Vec<bool>>>) {
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, candle_core::DType::F32, &Device::Cpu);
    let inner = tfpipe::train::BuiltinModel::new(config(OptimizerKind::Sgd).model, vb).unwrap();
    tfpipe::train::seed_vars(&varmap, 1, &Device::Cpu).unwrap();
    let optimizer = OptimizerConfig::default_for(OptimizerKind::Sgd)
        .build(varmap.all_vars())
        .unwrap();
    let modes = std::sync::Arc::default();
    let model = Recording {
        inner,
        modes: std::sync::Arc::clone(&modes),
        scale,
    };
    let trainer = Trainer::new(TrainConfig::new(input()), model, varmap, optimizer).unwrap();
    (trainer, modes)
}

#[test]
fn the_trainer_runs_forward_t_in_its_mode_and_minimises_the_models_own_loss() {
    let batch = dataset(1, 32, 5).remove(0);
    let tensors = batch_to_tensors(batch.clone(), &input(), 0, &Device::Cpu).unwrap();
    let (mut plain, _) = recording_trainer(1.0);
    let (mut tripled, modes) = recording_trainer(3.0);
    let base = plain.step(&tensors).unwrap();
    let loss = tripled.step(&tensors).unwrap();
    assert!(
        (loss - 3.0 * base).abs() <= 1e-5 * loss.abs(),
        "{loss} vs 3 x {base}"
    );
    assert_eq!(*modes.lock().unwrap(), [true]);

    let mut stream = IterStream(vec![Ok::<_, BoxError>(batch)].into_iter());
    let evaluation = tripled.evaluate(&mut stream).unwrap();
    assert_eq!(*modes.lock().unwrap(), [true, false]);
    assert!(evaluation.loss > 0.0);
}

/// The library's whole run: data from TFRecord files, validation each
/// epoch, a checkpoint and TensorBoard logs, then an exact resume from the
/// checkpoint's position through `Resume`.
#[test]
fn train_data_fit_writes_its_outputs_and_resumes_through_resume() {
    use tfpipe::train::{Resume, ResumeAt, RunOutputs, TrainData};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_records(&d.join("train.tfrecord"), &dataset(4, 16, 60));
    write_records(&d.join("valid.tfrecord"), &dataset(1, 16, 61));
    let mut schema = tfpipe::Schema::from_feature_texts(&["x:float32:8", "label:int64"]).unwrap();
    schema.label = Some("label".into());
    let data = TrainData {
        files: vec![d.join("train.tfrecord").to_string_lossy().into_owned()],
        reader: ReaderOptions::default(),
        schema,
        batch_size: 16,
        shuffle_buffer: 32,
        seed: 3,
        parallelism: tfpipe::pipeline::Parallelism::Fixed(1),
        rank: None,
        label_classes: None,
        sequences: Default::default(),
        padding: Default::default(),
        weights: Vec::new(),
        partition_features: Vec::new(),
        missing_labels: Default::default(),
    };
    let validation = TrainData {
        files: vec![d.join("valid.tfrecord").to_string_lossy().into_owned()],
        shuffle_buffer: 0,
        ..data.clone()
    };
    let mut cfg = config(OptimizerKind::Sgd);
    cfg.run = cfg.run.length(RunLength::new().steps(3));
    let mut trainer = new_trainer(cfg).unwrap();
    let outputs = RunOutputs {
        save: Some(d.join("ckpt")),
        logdir: Some(d.join("logs")),
        ..RunOutputs::default()
    };
    outputs.observe(&mut trainer).unwrap();
    let report = data.fit(&mut trainer, None, Some(&validation)).unwrap();
    assert_eq!(report.global_step, 3);
    assert!(d.join("ckpt/checkpoint.json").is_file());
    assert!(d.join("logs/train").is_dir(), "no TensorBoard run");

    let resume = Resume::read(d.join("ckpt")).unwrap();
    assert_eq!(resume.seed(), 0);
    let at = resume.position(None, false).unwrap();
    let ResumeAt::Exact(position) = at else {
        panic!("a mid-epoch checkpoint resumes exactly: {at:?}")
    };
    let mut cfg = config(OptimizerKind::Sgd);
    cfg.run = cfg
        .run
        .length(RunLength::new().steps(1))
        .reproducibility(Reproducibility::new().resume(d.join("ckpt")));
    let mut resumed = new_trainer(cfg).unwrap();
    // The epoch's fourth and last batch, then the run's step limit.
    let rest = data.fit(&mut resumed, Some(position), None).unwrap();
    assert_eq!(rest.global_step, 4);
}

/// `--mix` trains on a weighted mixture of sources: two sources over the
/// same converted files read every record of each once per epoch.
#[test]
fn cli_trains_on_a_mixture_of_sources() {
    let dir = tempfile::tempdir().unwrap();
    let (schema, data) = convert_penguins(dir.path());
    let report_path = dir.path().join("train.json");
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["train", "--schema", &schema, "--impute", "mean"])
        .args([
            "--mix",
            &format!("{data}=0.75"),
            "--mix",
            &format!("{data}=0.25"),
        ])
        .args(["--epochs", "2", "--report-json"])
        .arg(&report_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    assert_eq!(report["examples"], 2 * 2 * 344, "{report}");
    // --mix and --data name the data two ways: one of them.
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["train", "--schema", &schema, "--data", &data])
        .args(["--mix", &format!("{data}=1")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--mix"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes `batches`' rows as Examples of `x` only, each into the
/// `label=K/` partition of its class (Spark's `partitionBy("label")`): the
/// label lives in the path, not in the records.
fn write_partitioned(dir: &std::path::Path, batches: &[Batch]) {
    use tfpipe::example::Example;
    use tfpipe::example::proto::{Feature, Features, FloatList, feature};
    let mut writers: Vec<_> = (0..CLASSES)
        .map(|class| {
            let part = dir.join(format!("label={class}"));
            std::fs::create_dir_all(&part).unwrap();
            let compression = if class == 1 {
                tfpipe::Compression::Gzip
            } else {
                tfpipe::Compression::None
            };
            let name = if class == 1 {
                "part-r-00001.gz"
            } else {
                "part-r-00000"
            };
            tfpipe::tfrecord::FileRecordWriter::create(part.join(name), compression).unwrap()
        })
        .collect();
    for b in batches {
        let (Values::Float32(x), Values::Int64(y)) = (&b.columns[0].values, &b.columns[1].values)
        else {
            unreachable!()
        };
        for r in 0..b.num_rows {
            let mut f = std::collections::BTreeMap::new();
            f.insert(
                "x".to_string(),
                Feature {
                    kind: Some(feature::Kind::FloatList(FloatList {
                        value: x[r * WIDTH..(r + 1) * WIDTH].to_vec(),
                    })),
                },
            );
            let example = Example {
                features: Some(Features { feature: f }),
            };
            writers[y[r] as usize]
                .write_record(&example.encode_to_vec())
                .unwrap();
        }
    }
    for w in writers {
        w.finish().unwrap();
    }
}

/// `train --partition-features label` on a Spark-style directory whose
/// records hold no label: the label comes from each file's `label=K/`
/// directory, and the model learns it (an empty GZIP part, `_SUCCESS` and a
/// `.crc` file beside the parts are skipped).
#[test]
fn cli_trains_on_a_label_from_spark_partition_directories() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("out");
    write_partitioned(&data, &dataset(6, 16, 30));
    let test = dir.path().join("test");
    write_partitioned(&test, &dataset(2, 16, 31));
    // Spark's empty part: a GZIP stream of nothing (20 bytes).
    let empty = data.join("label=2").join("part-r-00009.gz");
    tfpipe::tfrecord::FileRecordWriter::create(&empty, tfpipe::Compression::Gzip)
        .unwrap()
        .finish()
        .unwrap();
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 20);
    std::fs::write(data.join("_SUCCESS"), b"").unwrap();
    std::fs::write(data.join("label=0").join(".part-r-00000.crc"), b"junk").unwrap();
    let report_path = dir.path().join("train.json");
    let train = |extra: &[&str]| {
        assert_cmd::Command::cargo_bin("tfpipe")
            .unwrap()
            .arg("train")
            .arg("--data")
            .arg(&data)
            .arg("--test-data")
            .arg(&test)
            .args(["--feature", "x:float32:8", "--feature", "label:int64"])
            .args(["--label", "label", "--classes", "3", "--batch-size", "16"])
            .args(["--epochs", "3", "--hidden", "16", "--seed", "3"])
            .args([
                "--optimizer",
                "sgd",
                "--compute-threads",
                "1",
                "--report-json",
            ])
            .arg(&report_path)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = train(&["--partition-features", "label"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    assert_eq!(report["examples"], 3 * 96, "{report}");
    assert!(report["val_accuracy"].as_f64().unwrap() > 0.8, "{report}");
    // Without the flag the records have no label: an error naming a file.
    let out = train(&[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("label") && stderr.contains("part-r-0000"),
        "{stderr}"
    );
}

/// uint8 inputs (MNIST's pixels) are standardised like the others by
/// default (they were always only divided by 255), and `--rescale` keeps
/// the division alone; the checkpoint records which, for `predict`.
#[test]
fn uint8_inputs_are_standardised_unless_rescale_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let tfpipe = || assert_cmd::Command::cargo_bin("tfpipe").unwrap();
    let shard = mnist_test_shard(dir.path());
    let stats = |extra: &[&str]| {
        let ck = dir.path().join(format!("ck{}", extra.len()));
        let out = tfpipe()
            .args([
                "train",
                "--feature",
                "image_raw:uint8:784",
                "--feature",
                "label:int64",
            ])
            .args(["--label", "label", "--steps", "1", "--batch-size", "64"])
            .arg("--data")
            .arg(&shard)
            .arg("--save")
            .arg(&ck)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Checkpoint::read_meta(&ck).unwrap().input.standardize
    };
    let standardised = stats(&[]);
    assert_eq!(standardised.len(), 1);
    // MNIST's pixels average about 0.13 of 255, with a std of about 0.31.
    let s = standardised[0];
    assert!(
        (0.05..0.25).contains(&s.mean) && (0.2..0.45).contains(&s.std),
        "{s:?}"
    );
    assert_eq!(stats(&["--rescale"]), vec![Standardize::IDENTITY]);
}

/// candle's elementwise kernels run on the calling thread, not on its pool
/// of spinning threads (which at load 4 on 2 cores was 37% of a CNN run's
/// CPU, see `set_compute_threads`), unless CANDLE_NUM_THREADS asks for more.
#[test]
fn bench_train_keeps_candles_elementwise_pool_to_the_calling_thread() {
    let dir = tempfile::tempdir().unwrap();
    let tfpipe = || assert_cmd::Command::cargo_bin("tfpipe").unwrap();
    let shard = mnist_test_shard(dir.path());
    let pool = |env: Option<&str>| {
        let mut cmd = tfpipe();
        cmd.env_remove("CANDLE_NUM_THREADS")
            .arg("bench-train")
            .arg(&shard)
            .args(["--model", "cnn", "--batch-size", "64", "--steps", "2"]);
        if let Some(n) = env {
            cmd.env("CANDLE_NUM_THREADS", n);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        line["candle_pool_threads"].as_u64().unwrap()
    };
    assert_eq!(pool(None), 1);
    assert_eq!(pool(Some("2")), 2);
}
