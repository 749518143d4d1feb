//! `convert --schema`: converting with an earlier conversion's schema keeps
//! its types, defaults and label vocabulary; what does not fit is a located
//! bad row.

use tfpipe::convert::{ConvertError, CsvOptions, FixedSchema, Format};

use super::common::*;

fn csv_with_schema(
    dir: &std::path::Path,
    name: &str,
    text: &str,
    schema: &FixedSchema,
    skip: bool,
) -> Result<tfpipe::convert::Summary, ConvertError> {
    let input = dir.join(name);
    std::fs::write(&input, text).unwrap();
    let format = Format::Csv(CsvOptions {
        schema: Some(schema.clone()),
        ..CsvOptions::default()
    });
    let out = dir.join(format!("{name}.out"));
    std::fs::create_dir_all(&out).unwrap();
    run(&format, &[input], &out, |o| o.skip_bad_rows = skip)
}

#[test]
fn a_split_converted_with_the_training_schema_keeps_classes_types_and_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.csv");
    std::fs::write(
        &train,
        "species,mass,note\nAdelie,3.5,a\nChinstrap,4.25,\nGentoo,5.5,c\n",
    )
    .unwrap();
    let format = Format::Csv(CsvOptions {
        label: Some("species".into()),
        ..CsvOptions::default()
    });
    let summary = run(&format, &[train], dir.path(), |_| {}).unwrap();
    let fixed = FixedSchema::load(&summary.schema_path).unwrap();
    assert_eq!(
        fixed.vocabulary.as_deref(),
        Some(&["Adelie".to_string(), "Chinstrap".into(), "Gentoo".into()][..])
    );

    // The test split lacks Chinstrap, has whole-number masses and no missing note.
    let test = csv_with_schema(
        dir.path(),
        "test.csv",
        "species,mass,note\nGentoo,5,x\nAdelie,3,y\n",
        &fixed,
        false,
    )
    .unwrap();
    assert_eq!(
        test.schema, fixed.schema,
        "the schema file is the given one"
    );
    let rows = read_rows(&test);
    assert_eq!(
        rows[0]["species"],
        Feat::I(vec![2]),
        "Gentoo is class 2 in both"
    );
    assert_eq!(rows[1]["species"], Feat::I(vec![0]));
    assert_eq!(rows[0]["mass"], Feat::F(vec![5.0]), "float32 stays float32");
    let (_, meta) = load_schema(&test);
    assert_eq!(
        meta["source"]["label_vocabulary"]
            .as_array()
            .map(|v| v.len()),
        Some(3)
    );
}

#[test]
fn what_does_not_fit_the_schema_is_a_located_bad_row() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.csv");
    std::fs::write(&train, "y,x,n\na,1.5,1\nb,2.5,2\n").unwrap();
    let format = Format::Csv(CsvOptions {
        label: Some("y".into()),
        ..CsvOptions::default()
    });
    let summary = run(&format, &[train], dir.path(), |_| {}).unwrap();
    let fixed = FixedSchema::load(&summary.schema_path).unwrap();

    for (text, line, column, what) in [
        (
            "y,x,n\na,1,1\nc,2,2\n",
            3,
            1,
            "not in the schema's vocabulary",
        ),
        ("y,x,n\na,1,1\nb,zz,2\n", 3, 2, "is not float32"),
        ("y,x,n\na,1,1.5\n", 2, 3, "is not int64"),
        ("y,x,n\na,,1\n", 2, 2, "no default"),
    ] {
        let err = csv_with_schema(dir.path(), "t.csv", text, &fixed, false).unwrap_err();
        let loc = err.location().expect("located");
        assert_eq!((loc.line, loc.column), (Some(line), Some(column)), "{err}");
        assert!(err.to_string().contains(what), "{err}");
    }
    let summary = csv_with_schema(
        dir.path(),
        "t.csv",
        "y,x,n\na,1,1\nc,2,2\nb,3,3\n",
        &fixed,
        true,
    )
    .unwrap();
    assert_eq!((summary.records, summary.rows_skipped), (2, 1));

    let err = csv_with_schema(dir.path(), "t.csv", "y,x\na,1\n", &fixed, false).unwrap_err();
    assert!(
        err.to_string().contains("missing from the input: [\"n\"]"),
        "{err}"
    );
}

/// Every row of every shard under `dir` matching `prefix-*`, sorted.
fn all_rows(dir: &std::path::Path, prefix: &str) -> (Vec<String>, Vec<String>) {
    use prost::Message;
    let mut names = Vec::new();
    let mut rows = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with(&format!("{prefix}-")) {
            continue;
        }
        names.push(name);
        let mut reader =
            tfpipe::tfrecord::FileRecordReader::open(&path, Default::default()).unwrap();
        let mut buf = Vec::new();
        while reader.read_record(&mut buf).unwrap() {
            let example = tfpipe::example::Example::decode(buf.as_slice()).unwrap();
            rows.push(format!(
                "{:?}",
                example
                    .features
                    .unwrap()
                    .feature
                    .into_iter()
                    .collect::<std::collections::BTreeMap<_, _>>()
            ));
        }
    }
    names.sort();
    rows.sort();
    (names, rows)
}

#[test]
fn fanned_out_workers_together_write_what_one_process_writes() {
    use tfpipe::convert::{self, Fanout, OutputOptions, Sharding};
    let dir = tempfile::tempdir().unwrap();
    let mut inputs = Vec::new();
    for f in 0..5 {
        let path = dir.path().join(format!("part{f}.csv"));
        let mut text = String::from("y,x\n");
        for r in 0..7 {
            text.push_str(&format!(
                "{},{}.5\n",
                ["a", "b", "c"][(f + r) % 3],
                f * 100 + r
            ));
        }
        std::fs::write(&path, text).unwrap();
        inputs.push(path);
    }
    // The schema comes first, from one conversion (of everything, here).
    let one = dir.path().join("one");
    let format = Format::Csv(CsvOptions {
        label: Some("y".into()),
        ..CsvOptions::default()
    });
    let summary = convert::convert(
        &format,
        &inputs,
        &OutputOptions {
            sharding: Sharding::Shards(3),
            ..OutputOptions::new(one.join("d"))
        },
    )
    .unwrap();
    let fixed = FixedSchema::load(&summary.schema_path).unwrap();
    let format = Format::Csv(CsvOptions {
        schema: Some(fixed.clone()),
        ..CsvOptions::default()
    });

    let many = dir.path().join("many");
    for index in [2, 0, 1] {
        let options = OutputOptions {
            sharding: Sharding::Shards(2),
            fanout: Some(Fanout { workers: 3, index }),
            ..OutputOptions::new(many.join("d"))
        };
        let part = convert::convert(&format, &inputs, &options).unwrap();
        assert_eq!(part.shards.len(), 2);
        assert_eq!(
            part.shards[0].file_name().unwrap().to_string_lossy(),
            format!("d-{:05}-of-00006.tfrecord", index * 2)
        );
    }
    let (names, rows) = all_rows(&many, "d");
    assert_eq!(names.len(), 6, "{names:?}");
    assert!(
        names.iter().all(|n| n.ends_with("-of-00006.tfrecord")),
        "{names:?}"
    );
    assert_eq!(rows.len(), 35);
    assert_eq!(
        rows,
        all_rows(&one, "d").1,
        "the same records as one process"
    );
    assert_eq!(
        FixedSchema::load(many.join("d.features.json"))
            .unwrap()
            .schema,
        fixed.schema
    );

    // Without a fixed schema, or with too few files: refused up front.
    let options = OutputOptions {
        sharding: Sharding::Shards(2),
        fanout: Some(Fanout {
            workers: 9,
            index: 0,
        }),
        ..OutputOptions::new(dir.path().join("x/d"))
    };
    assert!(
        convert::convert(&format, &inputs, &options)
            .unwrap_err()
            .to_string()
            .contains("at least as many files")
    );
    let plain = Format::Csv(CsvOptions::default());
    let options = OutputOptions {
        fanout: Some(Fanout {
            workers: 2,
            index: 0,
        }),
        ..options
    };
    assert!(
        convert::convert(&plain, &inputs, &options)
            .unwrap_err()
            .to_string()
            .contains("fixed schema")
    );
    assert!(!dir.path().join("x").exists());
}

#[test]
fn json_with_a_fixed_schema_keeps_classes_and_types_and_locates_misfits() {
    use tfpipe::convert::JsonOptions;
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.jsonl");
    std::fs::write(
        &train,
        "{\"kind\": \"a\", \"x\": 1.5}\n{\"kind\": \"b\", \"x\": 2.5}\n{\"kind\": \"c\", \"x\": 3.5}\n",
    )
    .unwrap();
    let format = Format::Json(JsonOptions {
        label: Some("kind".into()),
        ..JsonOptions::default()
    });
    let summary = run(&format, &[train], dir.path(), |_| {}).unwrap();
    let fixed = FixedSchema::load(&summary.schema_path).unwrap();
    let with = |name: &str, text: &str, skip: bool| {
        let input = dir.path().join(name);
        std::fs::write(&input, text).unwrap();
        let out = dir.path().join(format!("{name}.out"));
        std::fs::create_dir_all(&out).unwrap();
        let format = Format::Json(JsonOptions {
            schema: Some(fixed.clone()),
            ..JsonOptions::default()
        });
        run(&format, &[input], &out, |o| o.skip_bad_rows = skip)
    };
    // Whole numbers stay float32, c stays class 2.
    let test = with("t.jsonl", "{\"kind\": \"c\", \"x\": 4}\n", false).unwrap();
    assert_eq!(test.schema, fixed.schema);
    let rows = read_rows(&test);
    assert_eq!(rows[0]["kind"], Feat::I(vec![2]));
    assert_eq!(rows[0]["x"], Feat::F(vec![4.0]));
    // An unseen label, a key outside the schema, a value that does not fit:
    // errors with line and column, or counted under --skip-bad-rows.
    let text = "{\"kind\": \"a\", \"x\": 1}\n{\"kind\": \"zebra\", \"x\": 1}\n{\"kind\": \"b\", \"y\": 1, \"x\": 2}\n{\"kind\": \"b\", \"x\": \"big\"}\n";
    let err = with("u.jsonl", text, false).unwrap_err();
    let loc = err.location().unwrap();
    assert_eq!((loc.line, loc.column), (Some(2), Some(10)), "{err}");
    assert!(
        err.to_string().contains("not in the schema's vocabulary"),
        "{err}"
    );
    let summary = with("u.jsonl", text, true).unwrap();
    assert_eq!((summary.records, summary.rows_skipped), (1, 3));
    let problems: Vec<String> = summary.bad_rows.iter().map(|e| e.to_string()).collect();
    assert!(
        problems[1].contains("line 3, column 20")
            && problems[1].contains("\"y\" is not in the schema"),
        "{problems:?}"
    );
    assert!(problems[2].contains("line 4, column 20"), "{problems:?}");
}

#[test]
fn idx_and_images_with_a_fixed_schema() {
    use tfpipe::convert::{IdxOptions, ImagesOptions};
    let dir = tempfile::tempdir().unwrap();
    // IDX: the test split with the training schema converts; --as-float against
    // a uint8 schema is refused before anything is written.
    let images = testdata("mnist/train-images-idx3-ubyte.gz");
    let train = run(
        &Format::Idx(IdxOptions::default()),
        std::slice::from_ref(&images),
        dir.path(),
        |_| {},
    )
    .unwrap();
    let fixed = FixedSchema::load(&train.schema_path).unwrap();
    let out = dir.path().join("idx-test");
    std::fs::create_dir_all(&out).unwrap();
    let test = run(
        &Format::Idx(IdxOptions {
            schema: Some(fixed.clone()),
            ..IdxOptions::default()
        }),
        &[testdata("mnist/test-images-idx3-ubyte.gz")],
        &out,
        |_| {},
    )
    .unwrap();
    assert_eq!(test.schema, fixed.schema);
    let out = dir.path().join("idx-float");
    std::fs::create_dir_all(&out).unwrap();
    let err = run(
        &Format::Idx(IdxOptions {
            schema: Some(fixed),
            as_float: true,
            ..IdxOptions::default()
        }),
        &[testdata("mnist/test-images-idx3-ubyte.gz")],
        &out,
        |_| {},
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("converts to the features"),
        "{err}"
    );
    assert!(files_in(&out).is_empty());

    // Images: a test folder without "cat" keeps dog as class 1; an unseen
    // class folder is a bad row naming its files.
    let png = {
        let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        png.extend_from_slice(&4u32.to_be_bytes());
        png.extend_from_slice(&4u32.to_be_bytes());
        png
    };
    let tree = |root: &std::path::Path, classes: &[&str]| {
        for class in classes {
            std::fs::create_dir_all(root.join(class)).unwrap();
            std::fs::write(root.join(class).join("1.png"), &png).unwrap();
        }
    };
    let train_root = dir.path().join("img-train");
    tree(&train_root, &["cat", "dog", "emu"]);
    let out = dir.path().join("img-out");
    std::fs::create_dir_all(&out).unwrap();
    let train = run(
        &Format::Images(ImagesOptions::default()),
        &[train_root],
        &out,
        |_| {},
    )
    .unwrap();
    let fixed = FixedSchema::load(&train.schema_path).unwrap();
    assert_eq!(fixed.vocabulary.as_ref().map(Vec::len), Some(3));
    let test_root = dir.path().join("img-test");
    tree(&test_root, &["dog", "yak"]);
    let format = Format::Images(ImagesOptions {
        schema: Some(fixed),
        ..ImagesOptions::default()
    });
    let out = dir.path().join("img-test-out");
    std::fs::create_dir_all(&out).unwrap();
    let err = run(&format, std::slice::from_ref(&test_root), &out, |_| {}).unwrap_err();
    assert!(
        err.to_string().contains("yak") && err.to_string().contains("1.png"),
        "{err}"
    );
    let summary = run(&format, &[test_root], &out, |o| o.skip_bad_rows = true).unwrap();
    assert_eq!((summary.records, summary.rows_skipped), (1, 1));
    assert_eq!(read_rows(&summary)[0]["label"], Feat::I(vec![1]));
}
