//! Outputs: all-or-nothing, durable, created where asked, and never at the
//! cost of the previous good conversion.

use std::collections::BTreeMap;
use std::path::Path;

use tfpipe::convert::{self, CsvOptions, Format, OutputOptions, Sharding};

/// Every file under `dir` (recursively) with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            for (k, v) in snapshot(&path) {
                out.insert(
                    format!("{}/{k}", path.file_name().unwrap().to_string_lossy()),
                    v,
                );
            }
        } else {
            out.insert(
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&path).unwrap(),
            );
        }
    }
    out
}

#[test]
fn missing_output_directories_are_created_and_removed_again_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.csv");
    std::fs::write(&input, "a,b\n1,2\n3,4\n").unwrap();
    let format = Format::Csv(CsvOptions::default());
    let options = OutputOptions::new(dir.path().join("out/deep/x"));
    let summary = convert::convert(&format, std::slice::from_ref(&input), &options).unwrap();
    assert_eq!(summary.records, 2);
    assert!(dir.path().join("out/deep/x.features.json").is_file());

    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "a,b\n1,2\n3\n").unwrap();
    let options = OutputOptions::new(dir.path().join("new/deep/x"));
    convert::convert(&format, &[bad], &options).unwrap_err();
    assert!(
        !dir.path().join("new").exists(),
        "created directories are removed"
    );

    std::fs::write(dir.path().join("file"), "").unwrap();
    let options = OutputOptions::new(dir.path().join("file/x"));
    let err = convert::convert(&format, &[input], &options).unwrap_err();
    assert!(err.to_string().contains("is a file"), "{err}");
}

#[test]
fn a_failing_conversion_leaves_the_previous_set_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let good = dir.path().join("good.csv");
    std::fs::write(&good, "a,b\n1,2\n3,4\n5,6\n").unwrap();
    let format = Format::Csv(CsvOptions::default());
    let options = OutputOptions {
        sharding: Sharding::Shards(2),
        ..OutputOptions::new(out.join("p"))
    };
    convert::convert(&format, std::slice::from_ref(&good), &options).unwrap();
    let before = snapshot(&out);
    assert_eq!(before.len(), 3);

    // A bad row late in the input fails the second conversion.
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "a,b\n7,8\n9,10\n11\n").unwrap();
    convert::convert(&format, &[bad], &options).unwrap_err();
    assert_eq!(snapshot(&out), before, "nothing changed, nothing left over");

    // A good one replaces the set, leaving no temporary or backup files.
    std::fs::write(&good, "a,b\n7,8\n9,10\n").unwrap();
    let summary = convert::convert(&format, &[good], &options).unwrap();
    let after = snapshot(&out);
    assert_eq!(after.len(), 3);
    assert!(after.keys().all(|k| !k.starts_with('.')), "{after:?}");
    assert_eq!(summary.records, 2);
}
