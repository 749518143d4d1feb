//! Helpers: run a conversion into a temp dir and read every record back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prost::Message;
use tfpipe::convert::{self, ConvertError, Format, OutputOptions, Summary};
use tfpipe::example::proto::feature::Kind;
use tfpipe::example::{Example, Schema};
use tfpipe::tfrecord::{FileRecordReader, ReaderOptions};

/// A feature's values as read back.
#[derive(Debug, Clone, PartialEq)]
pub enum Feat {
    I(Vec<i64>),
    F(Vec<f32>),
    B(Vec<Vec<u8>>),
}

pub type Row = BTreeMap<String, Feat>;

pub fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(rel)
}

/// Converts into `dir/out` with `tweak` applied to the default options.
pub fn run(
    format: &Format,
    inputs: &[PathBuf],
    dir: &Path,
    tweak: impl FnOnce(&mut OutputOptions),
) -> Result<Summary, ConvertError> {
    let mut options = OutputOptions::new(dir.join("out"));
    tweak(&mut options);
    convert::convert(format, inputs, &options)
}

/// Every record, in source order, checking that each record is the
/// canonical (prost) encoding of what it decodes to. Record `i` is in shard
/// `i % shards` (as `Dataset.shard` splits), so reading the shards round-robin
/// restores the source order.
pub fn read_rows(summary: &Summary) -> Vec<Row> {
    let mut shards = Vec::new();
    for shard in &summary.shards {
        let mut rows = Vec::new();
        let mut reader = FileRecordReader::open(shard, ReaderOptions::default()).unwrap();
        let mut buf = Vec::new();
        while reader.read_record(&mut buf).unwrap() {
            let example = Example::decode(buf.as_slice()).unwrap();
            assert_eq!(example.encode_to_vec(), buf, "record is not canonical");
            let mut row = Row::new();
            for (key, feature) in example.features.unwrap_or_default().feature {
                let value = match feature.kind.expect("feature without a kind") {
                    Kind::Int64List(l) => Feat::I(l.value),
                    Kind::FloatList(l) => Feat::F(l.value),
                    Kind::BytesList(l) => Feat::B(l.value),
                };
                row.insert(key, value);
            }
            rows.push(row);
        }
        shards.push(rows.into_iter());
    }
    let total: usize = shards.iter().map(|s| s.len()).sum();
    assert_eq!(total as u64, summary.records);
    let n = shards.len();
    let rows: Vec<Row> = (0..total).map(|i| shards[i % n].next().unwrap()).collect();
    assert!(shards.iter_mut().all(|s| s.next().is_none()));
    rows
}

/// The schema file reads back to the schema the converter reported, and its metadata.
pub fn load_schema(summary: &Summary) -> (Schema, serde_json::Value) {
    let schema = Schema::load(&summary.schema_path).unwrap();
    assert_eq!(schema, summary.schema);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary.schema_path).unwrap()).unwrap();
    assert_eq!(meta["records"].as_u64(), Some(summary.records));
    let per_shard: u64 = meta["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["records"].as_u64().unwrap())
        .sum();
    assert_eq!(per_shard, summary.records);
    (schema, meta)
}

/// Names of the files in `dir`, sorted (temp files included, so a leftover shows).
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Asserts that `dir` holds only `inputs` (no output, no temp file).
pub fn assert_no_output(dir: &Path, inputs: &[&str]) {
    let mut expected: Vec<String> = inputs.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(files_in(dir), expected, "output left behind");
}

/// All shard bytes, concatenated in order.
pub fn shard_bytes(summary: &Summary) -> Vec<u8> {
    summary
        .shards
        .iter()
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect()
}
