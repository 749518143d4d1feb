//! Integration tests of the trainer (candle on the CPU, tiny generated data).

use std::time::{Duration, Instant};

use candle_core::Device;
use prost::Message;
use tfpipe::batch::{Batch, Column, Values};
use tfpipe::example::proto::{Event, event, summary};
use tfpipe::tfrecord::{FileRecordReader, ReaderOptions};
use tfpipe::train::{
    BatchStream, BoxError, Checkpoint, InputSpec, IterStream, ModelConfig, OptimizerConfig,
    OptimizerKind, Predictor, TrainConfig, Trainer, Verdict, WithBottleneck, batch_to_tensors,
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

fn input() -> InputSpec {
    InputSpec {
        features: vec![("x".into(), WIDTH)],
        label: Some("label".into()),
        classes: CLASSES,
        standardize: vec![],
    }
}

fn config(kind: OptimizerKind) -> TrainConfig {
    let model = ModelConfig::Mlp {
        inputs: WIDTH,
        hidden: vec![16],
        classes: CLASSES,
    };
    TrainConfig::new(model, OptimizerConfig::default_for(kind), input())
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
        OptimizerKind::AdamW,
        OptimizerKind::AdamWFused,
    ] {
        let mut cfg = config(kind);
        if kind != OptimizerKind::Sgd {
            cfg.optimizer.lr = 0.01;
        }
        let mut trainer = Trainer::new(cfg).unwrap();
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
    cfg.epochs = Some(3);
    let mut trainer = Trainer::new(cfg).unwrap();
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
    assert!(report.test_accuracy.unwrap() > 0.9, "{report}");
    assert!(report.epochs[2].test_loss.unwrap() < report.epochs[0].train_loss);
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
        "test_loss",
        "test_accuracy",
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
}

#[test]
fn checkpoint_round_trip_gives_identical_predictions() {
    let mut cfg = config(OptimizerKind::AdamW);
    cfg.steps = Some(5);
    let mut trainer = Trainer::new(cfg).unwrap();
    trainer.fit(memory(dataset(5, 16, 3)), None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    trainer.save(dir.path()).unwrap();
    assert!(dir.path().join("model.safetensors").exists());

    let probe = batch_to_tensors(dataset(1, 64, 4).remove(0), &input(), 0, &Device::Cpu).unwrap();
    let before: Vec<Vec<f32>> = trainer
        .model()
        .unwrap()
        .forward(&probe.features)
        .unwrap()
        .to_vec2()
        .unwrap();
    let loaded = Checkpoint::load(dir.path(), &Device::Cpu).unwrap();
    let after: Vec<Vec<f32>> = loaded
        .model
        .forward(&probe.features)
        .unwrap()
        .to_vec2()
        .unwrap();
    assert_eq!(before, after);
    assert_eq!(loaded.meta.step, 5);
    // The input spec, with the standardisation `fit` computed from the first batch.
    assert_eq!(loaded.meta.input, trainer.config().input);
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
    let report = predictor
        .run(&mut stream, true, 2, &mut |p, l| {
            assert_eq!(p.len(), l.unwrap().len());
            seen += p.len();
            Ok(())
        })
        .unwrap();
    assert_eq!((report.examples, report.batches, seen), (24, 3, 24));
    assert!(report.accuracy.is_some() && report.first_prediction_ms > 0.0);
}

#[test]
fn a_corrupt_checkpoint_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = Trainer::new(config(OptimizerKind::Sgd)).unwrap();
    trainer.prepare().unwrap();
    trainer.save(dir.path()).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), b"not safetensors").unwrap();
    let err = Checkpoint::load(dir.path(), &Device::Cpu).err().unwrap();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    std::fs::write(dir.path().join("checkpoint.json"), b"{\"format\": 3").unwrap();
    let err = Checkpoint::load(dir.path(), &Device::Cpu).err().unwrap();
    assert!(err.to_string().contains("checkpoint.json: line 1"), "{err}");
}

#[test]
fn resume_continues_the_step_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(OptimizerKind::Sgd);
    cfg.steps = Some(7);
    let mut first = Trainer::new(cfg).unwrap();
    first.fit(memory(dataset(10, 8, 6)), None).unwrap();
    first.save(dir.path()).unwrap();

    let mut cfg = config(OptimizerKind::Sgd);
    cfg.steps = Some(4);
    cfg.resume = Some(dir.path().to_path_buf());
    let mut second = Trainer::new(cfg).unwrap();
    // Inputs are scaled as the checkpoint's model was trained, not re-estimated.
    assert_eq!(second.config().input.standardize.len(), 1);
    assert_eq!(
        second.config().input.standardize,
        first.config().input.standardize
    );
    let report = second.fit(memory(dataset(10, 8, 7)), None).unwrap();
    assert_eq!(
        second.config().input.standardize,
        first.config().input.standardize
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
    cfg.resume = Some(dir.path().to_path_buf());
    let err = Trainer::new(cfg)
        .unwrap()
        .fit(memory(dataset(1, 8, 7)), None)
        .unwrap_err();
    assert!(err.to_string().contains("holds mlp 8-16-3"), "{err}");
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
        cfg.epochs = Some(2);
        cfg.prefetch = prefetch;
        let mut trainer = Trainer::new(cfg).unwrap();
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
    cfg.epochs = Some(1);
    let mut trainer = Trainer::new(cfg).unwrap();
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
    let mut cfg = TrainConfig::new(
        model,
        OptimizerConfig::default_for(OptimizerKind::Sgd),
        input(),
    );
    cfg.epochs = Some(1);
    let mut trainer = Trainer::new(cfg).unwrap();
    let report = trainer.fit(memory(dataset(30, 256, 10)), None).unwrap();
    assert!(report.stall_fraction < 0.2, "{report}");
    assert!(
        report.data_wait_ms.total < report.compute_ms.total,
        "{report}"
    );
}

#[test]
fn tensorboard_file_reads_back_as_events() {
    let logdir = tempfile::tempdir().unwrap();
    let mut cfg = config(OptimizerKind::Sgd);
    cfg.epochs = Some(2);
    cfg.log_every = 2;
    cfg.logdir = Some(logdir.path().to_path_buf());
    let mut trainer = Trainer::new(cfg).unwrap();
    trainer.fit(memory(dataset(6, 8, 11)), None).unwrap();

    let files: Vec<_> = std::fs::read_dir(logdir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
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
    let mut tags = Vec::new();
    for e in &events[1..] {
        let Some(event::What::Summary(s)) = &e.what else {
            panic!("not a summary: {e:?}")
        };
        for v in &s.value {
            assert!(
                matches!(v.value, Some(summary::value::Value::SimpleValue(x)) if x.is_finite())
            );
            tags.push((e.step, v.tag.clone()));
        }
    }
    for tag in [
        "train/loss",
        "train/examples_per_sec",
        "train/stall_fraction",
        "epoch/train_accuracy",
    ] {
        assert!(tags.iter().any(|(_, t)| t == tag), "no {tag} in {tags:?}");
    }
    assert!(tags.contains(&(6, "train/loss".to_string())));
    assert!(tags.contains(&(12, "epoch/train_loss".to_string())));
}

#[test]
fn data_errors_arrive_as_errors() {
    let mut trainer = Trainer::new(config(OptimizerKind::Sgd)).unwrap();
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
    assert!(err.to_string().contains("record 7 at byte 99"), "{err}");
    let mut trainer = Trainer::new(config(OptimizerKind::Sgd)).unwrap();
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
    assert!(err.to_string().contains("no batches"), "{err}");
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
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("train.json")).unwrap()).unwrap();
    assert_eq!(report["steps"], 8);
    assert_eq!(report["examples"], 128);
    assert!(report["test_accuracy"].as_f64().unwrap() > 0.5, "{report}");
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
        lines.lines().all(|l| l.starts_with("{\"prediction\":")),
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
    cfg.device = tfpipe::train::parse_device("cuda:0").unwrap();
    cfg.epochs = Some(2);
    let mut trainer = Trainer::new(cfg).unwrap();
    let report = trainer.fit(memory(dataset(10, 32, 12)), None).unwrap();
    assert_eq!(report.device, "cuda:0");
    assert!(
        report.epochs[1].train_loss < report.epochs[0].train_loss,
        "{report}"
    );
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
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["train", "--schema", &schema, "--data", &data])
        .args(["--epochs", "2", "--report-json"])
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
    // 5 numeric inputs; 3 classes from the label vocabulary convert recorded.
    assert_eq!(report["model"], "mlp 5-256-3", "{report}");
    assert_eq!(report["examples"], 2 * 344, "{report}");
    assert_eq!(report["skipped_features"][0]["name"], "island");
    assert_eq!(report["skipped_features"][1]["reason"], "bytes");
    assert_eq!(report["standardized"], true);
    for epoch in report["epochs"].as_array().unwrap() {
        let loss = epoch["train_loss"].as_f64().unwrap();
        let accuracy = epoch["train_accuracy"].as_f64().unwrap();
        assert!(loss.is_finite() && loss > 0.0, "{report}");
        assert!((0.0..=1.0).contains(&accuracy), "{report}");
    }

    // Too few classes: the error names the value and the flag.
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .args(["train", "--schema", &schema, "--data", &data])
        .args(["--classes", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("label \"species\" = 2 is outside 0..2") && stderr.contains("--classes"),
        "{stderr}"
    );
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
        .args(["train", "--schema", &schema, "--data", &data])
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
    let accuracy = report["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.9, "{report}");
    assert!(report["test_loss"].as_f64().unwrap().is_finite());

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
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("predicted  344 examples"), "{stdout}");
    let predicted: f64 = stdout
        .split("accuracy ")
        .nth(1)
        .and_then(|s| s.trim().trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| panic!("no accuracy in {stdout}"));
    assert!((predicted / 100.0 - accuracy).abs() < 1e-3, "{stdout}");
}
