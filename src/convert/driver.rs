//! The one converter driver: every input format is a [`Source`] (scan,
//! encode, locate), and [`run`] does the rest once for all of them:
//!
//! 1. **scan**: the source reads and checks its inputs, infers the schema
//!    (or applies the fixed one, `--schema`) and cuts the encoding work into
//!    tasks in input order;
//! 2. **plan**: no good record is an error naming the inputs; the fixed
//!    schema must be the one the input converts to; a split picks its
//!    validation records; each set of shards gets its record counts;
//! 3. **encode in order** on the one spawner ([`Ctx::write_shards`]): tasks
//!    in parallel, results handed on in task order, so the bytes never depend
//!    on the thread count, and a panicking task is an error at its position;
//! 4. **write, then commit all or nothing** ([`finish`]): every shard and the
//!    schema file are sealed under temporary names and switched into place as
//!    one set; a failure at any step (after some renames included) leaves the
//!    previous conversion whole.
//!
//! Invariant: a source's `encode` yields, over all tasks in order, exactly
//! the good records its `scan` counted (the driver checks the count per
//! shard, so an input that changed between the passes is an error, never a
//! silently different output).

use std::path::PathBuf;

use super::error::{ConvertError, ConvertOption, SourceLocation};
use super::output::{Chunk, Ctx, Finished, SplitPlan, finish, plan_shards};
use super::{FixedSchema, Sharding, Summary};

/// One input format, as the driver sees it.
pub(crate) trait Source: Sync {
    /// A piece of encoding work: a range of rows, records or files.
    type Task: Send + Clone;

    /// Reads and checks every input, fixes the schema, counts the good
    /// records and cuts the work into tasks in input order.
    fn scan(&mut self, ctx: &Ctx<'_>) -> Result<Scanned<Self::Task>, ConvertError>;

    /// Encodes the good records of one task, in input order.
    fn encode(&self, task: Self::Task) -> Result<Chunk, ConvertError>;

    /// Where a task starts in the input (for a panic inside `encode`).
    fn locate(&self, task: &Self::Task) -> SourceLocation;
}

/// What a scan found.
pub(crate) struct Scanned<T> {
    /// Good records: `encode` yields exactly these.
    pub(crate) records: u64,
    /// The encoding work, in input order.
    pub(crate) tasks: Vec<T>,
    /// The schema, the metadata, the counts and the warnings.
    pub(crate) done: Finished,
}

/// Converts with `source`: scan, plan, encode in order, commit (see the
/// module doc). `fixed` is the schema the user asked to convert with.
pub(crate) fn run<S: Source>(
    mut source: S,
    inputs: &[PathBuf],
    fixed: Option<&FixedSchema>,
    ctx: &Ctx<'_>,
) -> Result<Summary, ConvertError> {
    let scanned = source.scan(ctx)?;
    let Scanned {
        records,
        tasks,
        done,
    } = scanned;
    if records == 0 {
        return Err(ConvertError::NoRecords {
            inputs: inputs.to_vec(),
            skipped: done.rows_skipped,
        });
    }
    if let Some(fixed) = fixed
        && done.schema != fixed.schema
    {
        return Err(ConvertError::options(
            ConvertOption::Schema,
            format!(
                "this input converts to the features {}, but the schema {} has {}: convert with matching options or another schema",
                features_text(&done.schema),
                fixed.path.display(),
                features_text(&fixed.schema)
            ),
        ));
    }
    let options = ctx.options;
    let split = options
        .split
        .map(|how| SplitPlan::new(records, how))
        .transpose()?;
    let plans: Vec<Vec<u64>> = match &split {
        None => vec![plan_shards(records, options.sharding, done.bytes_in)],
        Some(plan) => (0..2)
            .map(|s| {
                let share = plan.counts[s] as f64 / records as f64;
                let sharding = match options.sharding {
                    // The training set gets the shards asked for, the
                    // validation set its share of them (at least one).
                    Sharding::Shards(n) if s == 1 => {
                        Sharding::Shards(((n as f64 * share).ceil() as usize).max(1))
                    }
                    other => other,
                };
                let bytes = (done.bytes_in as f64 * share) as u64;
                plan_shards(plan.counts[s], sharding, bytes)
            })
            .collect(),
    };
    ctx.begin_phase(super::Phase::Encoding, done.bytes_in);
    let source = &source;
    let sets = ctx.write_shards(
        &plans,
        split.as_ref(),
        done.bytes_in,
        tasks,
        |task| source.encode(task),
        |task| source.locate(task),
    )?;
    finish(ctx, sets, options.split, done)
}

/// `a:int64, b:bytes` for messages.
fn features_text(schema: &crate::example::Schema) -> String {
    schema
        .features
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Scans and encodes with `source` without writing anything: the good
/// record count, the encoded records in order and the schema. The fuzz
/// targets run the converters through this, so they exercise exactly the
/// parsing and encoding of a real conversion, minus the disk.
pub(crate) fn dry_run<S: Source>(
    mut source: S,
    ctx: &Ctx<'_>,
) -> Result<(u64, Vec<Vec<u8>>, crate::example::Schema), ConvertError> {
    let Scanned {
        records,
        tasks,
        done,
    } = source.scan(ctx)?;
    if records == 0 {
        return Err(ConvertError::NoRecords {
            inputs: done.inputs,
            skipped: done.rows_skipped,
        });
    }
    let source = &source;
    let mut out = Vec::new();
    ctx.run_ordered(
        tasks,
        |task| source.encode(task),
        |task| source.locate(task),
        |chunk: Chunk| {
            out.extend(chunk.records().map(<[u8]>::to_vec));
            Ok(())
        },
    )?;
    Ok((records, out, done.schema))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::super::output::fail_commit_at;
    use super::super::{
        CsvOptions, Format, IdxOptions, ImagesOptions, JsonOptions, OutputOptions, Sharding,
        convert,
    };
    use super::*;

    /// Every file in `dir` with its bytes.
    fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            if entry.path().is_file() {
                out.insert(
                    entry.file_name().to_string_lossy().into_owned(),
                    std::fs::read(entry.path()).unwrap(),
                );
            }
        }
        out
    }

    fn idx(dims: &[u32], payload: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, 8, dims.len() as u8];
        for d in dims {
            out.extend_from_slice(&d.to_be_bytes());
        }
        out.extend_from_slice(payload);
        out
    }

    fn png() -> Vec<u8> {
        let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        png.extend_from_slice(&2u32.to_be_bytes());
        png.extend_from_slice(&3u32.to_be_bytes());
        png
    }

    /// Each format with two inputs' worth of data: version `v` of the input
    /// (the second conversion converts other data, so its shards differ).
    fn inputs(dir: &Path, format: &str, v: u8) -> (Format, Vec<PathBuf>) {
        let data = dir.join(format!("data-{format}"));
        std::fs::create_dir_all(&data).unwrap();
        match format {
            "csv" => {
                let p = data.join("in.csv");
                std::fs::write(&p, format!("a,b\n{v},x\n2,y\n3,z\n")).unwrap();
                (Format::Csv(CsvOptions::default()), vec![p])
            }
            "json" => {
                let p = data.join("in.jsonl");
                std::fs::write(&p, format!("{{\"a\": {v}}}\n{{\"a\": 2}}\n{{\"a\": 3}}\n"))
                    .unwrap();
                (Format::Json(JsonOptions::default()), vec![p])
            }
            "idx" => {
                let images = data.join("t-images-idx3-ubyte");
                let labels = data.join("t-labels-idx1-ubyte");
                std::fs::write(&images, idx(&[3, 1, 2], &[v, 1, 2, 3, 4, 5])).unwrap();
                std::fs::write(&labels, idx(&[3], &[0, 1, v % 10])).unwrap();
                (Format::Idx(IdxOptions::default()), vec![images])
            }
            _ => {
                for (class, n) in [("cat", 2), ("dog", 1)] {
                    std::fs::create_dir_all(data.join(class)).unwrap();
                    for i in 0..n {
                        let mut bytes = png();
                        bytes.push(v);
                        std::fs::write(data.join(class).join(format!("{i}.png")), bytes).unwrap();
                    }
                }
                (Format::Images(ImagesOptions::default()), vec![data])
            }
        }
    }

    #[test]
    fn a_commit_failing_after_some_renames_never_destroys_the_previous_set() {
        for format in ["csv", "json", "idx", "images"] {
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("out");
            std::fs::create_dir_all(&out).unwrap();
            let options = OutputOptions {
                sharding: Sharding::Shards(2),
                ..OutputOptions::new(out.join("p"))
            };
            let (f, files) = inputs(dir.path(), format, 1);
            convert(&f, &files, &options).unwrap();
            let good = snapshot(&out);
            assert_eq!(good.len(), 3, "{format}: 2 shards and the schema file");
            // Renames: shard 0, shard 1, schema file. Fail before each of them,
            // after 0, 1 and 2 files have been switched.
            for at in 0..3 {
                let (f, files) = inputs(dir.path(), format, 2 + at as u8);
                fail_commit_at(Some(at));
                let result = convert(&f, &files, &options);
                fail_commit_at(None);
                let err = result.expect_err("the injected failure");
                assert!(
                    format!("{err}: {:?}", std::error::Error::source(&err)).contains("injected"),
                    "{format} at {at}: {err}"
                );
                assert_eq!(
                    snapshot(&out),
                    good,
                    "{format}: failing before rename {at} changed the previous set"
                );
            }
            // And without a failure the new set replaces the old one whole.
            let (f, files) = inputs(dir.path(), format, 9);
            let summary = convert(&f, &files, &options).unwrap();
            assert_eq!(summary.shards.len(), 2);
            let new = snapshot(&out);
            assert_eq!(new.len(), 3, "{format}: no backup left over");
            assert_ne!(new, good, "{format}: the new data is in place");
        }
    }
}
