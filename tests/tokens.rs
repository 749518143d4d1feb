//! Variable-length token ids: padding with a mask, the built-in embedding
//! model, and the generated token-classification set it learns.

use candle_core::Device;
use tfpipe::batch::{Batch, Column, Values};
use tfpipe::train::{
    BatchTensors, InputSpec, Model, ModelConfig, Task, TokenSet, TokenSpec, batch_to_tensors,
};

fn spec(vocab: Option<usize>) -> InputSpec {
    InputSpec {
        features: vec![],
        label: Some("label".into()),
        task: Task::Classification { classes: 2 },
        standardize: vec![],
        tokens: Some(TokenSpec {
            name: "tokens".into(),
            vocab,
        }),
        impute: None,
    }
}

/// Rows of 2, 0 and 3 ids.
fn ragged() -> Batch {
    Batch {
        num_rows: 3,
        columns: vec![
            Column {
                name: "tokens".into(),
                values: Values::Int64(vec![5, 6, 7, 8, 9]),
                row_splits: vec![vec![0, 2, 2, 5]],
                inner_shape: vec![],
            },
            Column {
                name: "label".into(),
                values: Values::Int64(vec![0, 1, 0]),
                row_splits: vec![],
                inner_shape: vec![],
            },
        ],
    }
}

#[test]
fn token_ids_are_padded_per_batch_with_a_mask() {
    let t = batch_to_tensors(ragged(), &spec(Some(10)), 0, &Device::Cpu).unwrap();
    let ids: Vec<Vec<u32>> = t.tokens.unwrap().to_vec2().unwrap();
    let mask: Vec<Vec<f32>> = t.mask.unwrap().to_vec2().unwrap();
    assert_eq!(ids, vec![vec![5, 6, 0], vec![0, 0, 0], vec![7, 8, 9]]);
    assert_eq!(
        mask,
        vec![vec![1.0, 1.0, 0.0], vec![0.0; 3], vec![1.0, 1.0, 1.0]]
    );
    assert_eq!(t.features.dims(), &[3, 0]);

    // An id beyond the vocabulary is an input error naming batch and row.
    let err = batch_to_tensors(ragged(), &spec(Some(8)), 4, &Device::Cpu).unwrap_err();
    assert_eq!(
        err.to_string(),
        "batch 4: row 2: token id 8 in \"tokens\" is outside 0..8 (the vocabulary size)"
    );
}

/// Masked mean pooling: padding never changes a row's output.
#[test]
fn padding_does_not_change_the_embedding_models_output() {
    let config = ModelConfig::Embedding {
        vocab: 10,
        dim: 4,
        inputs: 0,
        hidden: vec![8],
        classes: 2,
    };
    let (model, _) = tfpipe::train::BuiltinModel::init(config, 3, &Device::Cpu).unwrap();
    let out = |batch: Batch| -> Vec<Vec<f32>> {
        let t: BatchTensors = batch_to_tensors(batch, &spec(Some(10)), 0, &Device::Cpu).unwrap();
        model.forward(&t).unwrap().to_vec2().unwrap()
    };
    let together = out(ragged());
    // Row 0 alone has no padding at all.
    let mut alone = ragged().slice(0..1);
    alone.columns[0].row_splits = vec![vec![0, 2]];
    alone.columns[0].values = Values::Int64(vec![5, 6]);
    assert_eq!(out(alone)[0], together[0]);
    assert_eq!(together.len(), 3);
}

#[test]
fn the_generated_token_set_is_deterministic_and_in_range() {
    let set = TokenSet::default();
    let mut lengths = std::collections::BTreeSet::new();
    for i in 0..500 {
        let (tokens, label) = set.record(i);
        assert_eq!(set.record(i), (tokens.clone(), label));
        assert!((0..4).contains(&label));
        assert!(tokens.iter().all(|&t| (0..200).contains(&t)));
        lengths.insert(tokens.len());
    }
    assert_eq!(lengths.first(), Some(&8));
    assert_eq!(lengths.last(), Some(&32));
}

/// `tfpipe train` picks the embedding model from the schema (a
/// variable-length int64 feature) and the vocabulary size from the schema
/// file, and learns the set: over 90% validation accuracy in 5 epochs.
#[test]
fn tfpipe_train_picks_the_embedding_model_and_learns_the_token_set() {
    let dir = tempfile::tempdir().unwrap();
    let set = TokenSet::default();
    let train = set.write(&dir.path().join("train"), 0, 3000).unwrap();
    let validation = set.write(&dir.path().join("val"), 3000, 300).unwrap();
    let report_path = dir.path().join("report.json");
    let ck = dir.path().join("ck");
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("train")
        .arg("--schema")
        .arg(&train.schema)
        .arg("--data")
        .arg(&train.data)
        .arg("--validation-data")
        .arg(&validation.data)
        .args(["--epochs", "5", "--batch-size", "32", "--report-json"])
        .arg(&report_path)
        .arg("--save")
        .arg(&ck)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    assert_eq!(
        report["model"], "embedding 200x32 mean-pooled -> mlp 32-64-4",
        "{report}"
    );
    // The choice is said, with its reason, never made silently.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("model embedding 200x32 mean-pooled -> mlp 32-64-4 because \"tokens\" is a variable-length int64 feature"),
        "{stderr}"
    );
    let accuracy = report["val_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.9, "{report}");

    // Predict names the classes the schema file recorded.
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("predict")
        .arg("--checkpoint")
        .arg(&ck)
        .arg("--data")
        .arg(&validation.data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 300);
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(
        first["class_name"].as_str().unwrap().starts_with("topic-"),
        "{first}"
    );
}

/// A packed batch gives one example per sequence, each pooled over its own
/// tokens only: the model's outputs equal those of the unpacked batch.
#[test]
fn packed_sequences_pool_on_their_own() {
    use tfpipe::pipeline::Pipeline;
    use tfpipe::train::Sequences;
    let config = ModelConfig::Embedding {
        vocab: 10,
        dim: 4,
        inputs: 0,
        hidden: vec![8],
        classes: 2,
    };
    let (model, _) = tfpipe::train::BuiltinModel::init(config, 3, &Device::Cpu).unwrap();
    let out = |batch: Batch| -> (Vec<Vec<f32>>, Vec<u32>) {
        let t = batch_to_tensors(batch, &spec(Some(10)), 0, &Device::Cpu).unwrap();
        let labels = t.labels.as_ref().unwrap().to_vec1().unwrap();
        (model.forward(&t).unwrap().to_vec2().unwrap(), labels)
    };
    let (plain, plain_labels) = out(ragged());
    let packed: Vec<Batch> = Sequences::Packed { length: 4 }
        .apply(
            Pipeline::from_vec(vec![ragged()]),
            "tokens",
            Some("label"),
            8,
        )
        .start()
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(packed.len(), 1);
    // Rows of 2 + 0 tokens, then 3 tokens: two packed rows of 4.
    assert_eq!(packed[0].num_rows, 2);
    let (outputs, labels) = out(packed[0].clone());
    assert_eq!(labels, plain_labels);
    assert_eq!(outputs.len(), 3);
    for (a, b) in outputs.iter().flatten().zip(plain.iter().flatten()) {
        assert!((a - b).abs() < 1e-5, "{outputs:?} vs {plain:?}");
    }
}

/// The three batchings of the token set through `TrainData`: every record
/// arrives once (as an example), and the padding fraction falls from padded
/// to bucketed to packed.
#[test]
fn bucketing_and_packing_cut_the_padding_of_the_token_set() {
    use tfpipe::train::{Sequences, TrainData};
    let dir = tempfile::tempdir().unwrap();
    let files = TokenSet::default()
        .write(&dir.path().join("t"), 0, 2000)
        .unwrap();
    let schema = tfpipe::Schema::load(&files.schema).unwrap();
    let input = InputSpec {
        task: Task::Classification { classes: 4 },
        ..spec(Some(200))
    };
    let mut fractions = Vec::new();
    for sequences in [
        Sequences::Padded,
        Sequences::bucketed(vec![12, 16, 20, 24, 28], 32),
        Sequences::Packed { length: 64 },
    ] {
        let data = TrainData::new([files.data.display().to_string()], schema.clone(), 32)
            .shuffle_buffer(500)
            .sequences(sequences.clone());
        let mut stream = data.open(0).unwrap();
        let mut examples = 0;
        while let Some(batch) = stream.next_batch() {
            let t = batch_to_tensors(batch.unwrap(), &input, 0, &Device::Cpu).unwrap();
            examples += t.rows;
        }
        assert_eq!(examples, 2000, "{sequences:?}");
        fractions.push(data.padding.fraction().unwrap());
    }
    assert!(fractions[0] > 0.2, "{fractions:?}");
    assert!(fractions[1] < fractions[0] / 2.0, "{fractions:?}");
    assert!(fractions[2] < fractions[1], "{fractions:?}");
}

/// `tfpipe train --pack` and `--bucket-boundaries`: the embedding model
/// learns the token set from packed and from bucketed batches, and the
/// report gives each mode's padding fraction; `tfpipe bench` reports it too.
#[test]
fn tfpipe_train_and_bench_pack_and_bucket_the_token_set() {
    let dir = tempfile::tempdir().unwrap();
    let set = TokenSet::default();
    let train = set.write(&dir.path().join("train"), 0, 3000).unwrap();
    let validation = set.write(&dir.path().join("val"), 3000, 300).unwrap();
    let mut fractions = Vec::new();
    for (mode, flags) in [
        ("padded", vec![]),
        ("bucketed", vec!["--bucket-boundaries", "12,16,20,24,28"]),
        ("packed", vec!["--pack", "64"]),
    ] {
        let report_path = dir.path().join(format!("{mode}.json"));
        let out = assert_cmd::Command::cargo_bin("tfpipe")
            .unwrap()
            .arg("train")
            .arg("--schema")
            .arg(&train.schema)
            .arg("--data")
            .arg(&train.data)
            .arg("--validation-data")
            .arg(&validation.data)
            .args(["--epochs", "5", "--batch-size", "32", "--report-json"])
            .arg(&report_path)
            .args(&flags)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("sequences  {mode}: padding")),
            "{stdout}"
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
        assert_eq!(report["sequences"]["mode"], mode, "{report}");
        // Every epoch trains on every record, packed or not.
        assert_eq!(report["examples"], 15_000, "{mode}: {report}");
        let accuracy = report["val_accuracy"].as_f64().unwrap();
        assert!(accuracy > 0.85, "{mode}: {report}");
        fractions.push(report["sequences"]["padding_fraction"].as_f64().unwrap());
    }
    assert!(
        fractions[2] < fractions[1] && fractions[1] < fractions[0],
        "{fractions:?}"
    );

    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("bench")
        .arg("--schema")
        .arg(&train.schema)
        .arg("--data")
        .arg(&train.data)
        .args(["--batch-size", "32", "--pack", "64", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["examples"], 3000, "{report}");
    assert_eq!(report["sequences"]["mode"], "packed", "{report}");
    // A bad setting is refused before any work, naming the flags.
    let out = assert_cmd::Command::cargo_bin("tfpipe")
        .unwrap()
        .arg("bench")
        .arg("--schema")
        .arg(&train.schema)
        .arg("--data")
        .arg(&train.data)
        .args(["--bucket-boundaries", "20,10"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--bucket-boundaries"),
        "{stderr}"
    );
}
