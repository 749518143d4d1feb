//! One input split into training and validation shards in one run: exact
//! and deterministic counts, one schema (one vocabulary) for both, every
//! record in exactly one set.

use std::collections::BTreeSet;

use tfpipe::convert::{CsvOptions, Format, JsonOptions, Sharding, Split, Summary};

use super::common::*;

fn penguins(dir: &std::path::Path, rows: usize) -> std::path::PathBuf {
    let path = dir.join("p.csv");
    let mut text = String::from("id,species,mass\n");
    for i in 0..rows {
        // The rare class appears once: a split must still know it.
        let species = if i == 7 {
            "Chinstrap"
        } else if i % 2 == 0 {
            "Adelie"
        } else {
            "Gentoo"
        };
        text.push_str(&format!("{i},{species},{}.5\n", 3 + i % 3));
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn ids(rows: &[Row]) -> BTreeSet<i64> {
    rows.iter()
        .map(|r| match &r["id"] {
            Feat::I(v) => v[0],
            other => panic!("id {other:?}"),
        })
        .collect()
}

/// The validation set read back as a summary of its own.
fn validation_rows(summary: &Summary) -> Vec<Row> {
    let v = summary.validation.as_ref().expect("a split");
    let as_summary = Summary {
        records: v.records,
        shards: v.shards.clone(),
        validation: None,
        rows_skipped: 0,
        bad_rows: Vec::new(),
        warnings: Vec::new(),
        bytes_in: 0,
        bytes_out: 0,
        schema_path: summary.schema_path.clone(),
        schema: summary.schema.clone(),
        seconds: 0.0,
        stale_shards: Vec::new(),
    };
    read_rows(&as_summary)
}

fn train_rows(summary: &Summary) -> Vec<Row> {
    let v = summary.validation.as_ref().expect("a split");
    let as_summary = Summary {
        records: summary.records - v.records,
        shards: summary.shards.clone(),
        validation: None,
        rows_skipped: 0,
        bad_rows: Vec::new(),
        warnings: Vec::new(),
        bytes_in: 0,
        bytes_out: 0,
        schema_path: summary.schema_path.clone(),
        schema: summary.schema.clone(),
        seconds: 0.0,
        stale_shards: Vec::new(),
    };
    read_rows(&as_summary)
}

#[test]
fn a_split_is_exact_deterministic_disjoint_and_shares_one_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let input = penguins(dir.path(), 200);
    let format = Format::Csv(CsvOptions {
        label: Some("species".into()),
        ..CsvOptions::default()
    });
    let split = |seed, threads| {
        let out = dir.path().join(format!("s{seed}-{threads}"));
        std::fs::create_dir_all(&out).unwrap();
        run(&format, std::slice::from_ref(&input), &out, |o| {
            o.split = Some(Split {
                fraction: 0.1,
                seed,
            });
            o.sharding = Sharding::Shards(4);
            o.threads = threads;
        })
        .unwrap()
    };
    let a = split(7, 1);
    let v = a.validation.as_ref().unwrap();
    assert_eq!(
        (a.records, v.records),
        (200, 20),
        "exactly round(200 * 0.1)"
    );
    assert_eq!(a.shards.len(), 4);
    assert_eq!(v.shards.len(), 1, "ceil(4 * 0.1) validation shards");
    assert!(
        a.shards[0]
            .to_string_lossy()
            .ends_with("out-train-00000-of-00004.tfrecord")
    );
    assert!(
        v.shards[0]
            .to_string_lossy()
            .ends_with("out-validation-00000-of-00001.tfrecord")
    );

    let (train, valid) = (ids(&train_rows(&a)), ids(&validation_rows(&a)));
    assert_eq!((train.len(), valid.len()), (180, 20));
    assert!(train.is_disjoint(&valid));
    assert_eq!(
        train.union(&valid).count(),
        200,
        "every record in exactly one set"
    );

    // The same seed gives the same split for any thread count; another seed another.
    let b = split(7, 3);
    assert_eq!(ids(&validation_rows(&b)), valid);
    assert_eq!(shard_bytes(&a), shard_bytes(&b));
    let c = split(8, 1);
    assert_ne!(ids(&validation_rows(&c)), valid);

    // One schema file, one vocabulary, with the rare class, for both sets.
    let (_, meta) = (
        (),
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(&a.schema_path).unwrap())
            .unwrap(),
    );
    assert_eq!(
        meta["source"]["label_vocabulary"],
        serde_json::json!(["Adelie", "Chinstrap", "Gentoo"])
    );
    assert_eq!(meta["split"]["sets"]["validation"]["records"], 20);
    assert_eq!(meta["split"]["sets"]["train"]["records"], 180);
    assert_eq!(
        files_in(&dir.path().join("s7-1")),
        [
            "out-train-00000-of-00004.tfrecord",
            "out-train-00001-of-00004.tfrecord",
            "out-train-00002-of-00004.tfrecord",
            "out-train-00003-of-00004.tfrecord",
            "out-validation-00000-of-00001.tfrecord",
            "out.features.json",
        ]
    );
}

#[test]
fn a_split_works_for_json_too_and_refuses_empty_sets() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("r.jsonl");
    let text: String = (0..10).map(|i| format!("{{\"id\": {i}}}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let format = Format::Json(JsonOptions::default());
    let summary = run(&format, std::slice::from_ref(&input), dir.path(), |o| {
        o.split = Some(Split {
            fraction: 0.3,
            seed: 1,
        })
    })
    .unwrap();
    assert_eq!(summary.validation.as_ref().unwrap().records, 3);
    for fraction in [0.01, 0.99, 0.0, 1.0, f64::NAN] {
        let out = dir.path().join(format!("f{fraction}"));
        std::fs::create_dir_all(&out).unwrap();
        let err = run(&format, std::slice::from_ref(&input), &out, |o| {
            o.split = Some(Split { fraction, seed: 1 })
        })
        .unwrap_err();
        assert!(
            err.to_string().contains("empty") || err.to_string().contains("between 0 and 1"),
            "{fraction}: {err}"
        );
        assert!(files_in(&out).is_empty(), "{fraction}: output left behind");
    }
}
