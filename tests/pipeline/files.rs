//! TFRecord sources: compression per file, globs, file sharding, interleave,
//! the file cache.

use tfpipe::pipeline::{Interleave, Parallelism, Pipeline};
use tfpipe::tfrecord::Compression;

use crate::common::{index_record, record_index, watchdog, write_shards};

fn indices(p: Pipeline<impl AsRef<[u8]> + Send + 'static>) -> Vec<u64> {
    watchdog(20, move || {
        p.start()
            .unwrap()
            .map(|r| record_index(r.unwrap().as_ref()))
            .collect()
    })
}

#[test]
fn mixed_compression_glob_reads_every_record() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(&dir.path().join(""), 2, 50, Compression::None, index_record);
    let gz = dir.path().join("gz");
    std::fs::create_dir(&gz).unwrap();
    write_shards(&gz, 2, 50, Compression::Gzip, |i| index_record(i + 100));
    let patterns = [
        dir.path().join("*.tfrecord").display().to_string(),
        gz.join("*.tfrecord.gz").display().to_string(),
    ];
    let files = Pipeline::tfrecord_files(patterns).unwrap();
    assert_eq!(files.paths().len(), 4);
    let got = indices(files.records());
    assert_eq!(got, (0..200).collect::<Vec<_>>());
}

#[test]
fn interleave_is_round_robin_and_parallel_matches_sequential() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 5, 7, Compression::None, index_record);
    let pattern = dir.path().join("part-*").display().to_string();
    let files = Pipeline::tfrecord_files([pattern]).unwrap();
    let sequential = indices(files.clone().interleave_with(Interleave::new(2, 3)));
    assert_eq!(&sequential[..9], [0, 1, 2, 7, 8, 9, 3, 4, 5]);
    let mut sorted = sequential.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..35).collect::<Vec<_>>());
    for par in [
        Parallelism::Fixed(1),
        Parallelism::Fixed(2),
        Parallelism::Auto,
    ] {
        let parallel = indices(
            files
                .clone()
                .interleave_with(Interleave::new(2, 3).parallel(par)),
        );
        assert_eq!(parallel, sequential, "parallelism {par:?}");
    }
}

#[test]
fn file_shards_are_disjoint_and_cover() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), 7, 3, Compression::Zlib, index_record);
    let pattern = dir.path().join("part-*").display().to_string();
    let mut all = Vec::new();
    for i in 0..3 {
        let files = Pipeline::tfrecord_files([&pattern]).unwrap().shard(3, i);
        let part = indices(files.interleave(2, 4));
        all.extend(part);
    }
    all.sort_unstable();
    assert_eq!(all, (0..21).collect::<Vec<_>>());
}

#[test]
fn file_cache_is_written_once_then_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_shards(dir.path(), 1, 20, Compression::None, index_record);
    let cache = dir.path().join("cache.tfrecord");
    let path = paths[0].display().to_string();
    let p = Pipeline::tfrecord_files([path])
        .unwrap()
        .records()
        .cache_file(&cache)
        .repeat(Some(2));
    assert_eq!(indices(p.clone()), (0..20).chain(0..20).collect::<Vec<_>>());
    assert!(cache.is_file());
    // The source is gone; the cache still serves.
    std::fs::remove_file(&paths[0]).unwrap();
    let replay = Pipeline::from_vec(vec![b"unused".to_vec()])
        .take(0)
        .cache_file(&cache);
    assert_eq!(indices(replay), (0..20).collect::<Vec<_>>());
}

#[test]
fn an_interrupted_pass_leaves_no_cache_file() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache.tfrecord");
    let p = Pipeline::from_generator(|| (0..1000u64).map(index_record))
        .cache_file(&cache)
        .take(10);
    assert_eq!(indices(p).len(), 10);
    assert!(!cache.exists());
    let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(leftovers, 0, "no temporary file left behind");
}

#[test]
fn a_cancelled_pass_leaves_no_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache.tfrecord");
    // The prefetch thread is inside an endless `skip` when the iterator is
    // dropped; the skip sees the cancel flag and ends early, and the cache
    // below it must not take that for a complete pass.
    let p = Pipeline::from_generator(|| (0u64..).map(index_record))
        .skip(u64::MAX)
        .cache_file(&cache)
        .prefetch(1);
    watchdog(20, move || {
        let it = p.start().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(it);
    });
    assert!(!cache.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// A cache file cut at a record boundary (or at any byte) is an error
/// before anything is replayed, not a silent partial epoch.
#[test]
fn a_truncated_cache_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache.tfrecord");
    let full = Pipeline::from_generator(|| (0..1000u64).map(index_record)).cache_file(&cache);
    assert_eq!(indices(full.clone()).len(), 1000);
    let bytes = std::fs::read(&cache).unwrap();
    // Every record of the cache is framed the same: cut after 600 of them,
    // and in the middle of the footer.
    let framed = (bytes.len() - (12 + 28 + 4)) / 1000;
    for cut in [600 * framed, bytes.len() - 10] {
        std::fs::write(&cache, &bytes[..cut]).unwrap();
        let items: Vec<_> = full.start().unwrap().collect();
        assert_eq!(items.len(), 1, "cut at {cut}: nothing replayed");
        let err = items.into_iter().next().unwrap().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("incomplete cache file"), "{text}");
        assert!(text.contains("cache.tfrecord"), "{text}");
    }
    // A whole record dropped from the middle: the count no longer adds up.
    let mut spliced = bytes[..framed * 10].to_vec();
    spliced.extend_from_slice(&bytes[framed * 11..]);
    std::fs::write(&cache, &spliced).unwrap();
    let items: Vec<_> = full.start().unwrap().collect();
    assert_eq!(items.iter().filter(|r| r.is_ok()).count(), 999);
    let err = items.last().unwrap().as_ref().unwrap_err();
    assert!(err.to_string().contains("promises 1000 records"), "{err}");
}

/// A directory is read as a dataset the way Spark (and
/// linkedin/spark-tfrecord) writes one: `part-*` files through `key=value/`
/// partitions, GZIP by name or by sniffing, empty parts (0 bytes, or the
/// 20-byte GZIP stream of nothing) read as empty, and markers, checksums,
/// hidden files and other directories left out.
#[test]
fn a_spark_output_directory_reads_as_a_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("out");
    let write = |sub: &str, first: u64, n: u64, compression: Compression, name: &str| {
        let d = root.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let written = write_shards(tmp.path(), 1, n, compression, |i| index_record(first + i));
        std::fs::rename(&written[0], d.join(name)).unwrap();
    };
    write(
        "year=2023/country=fr",
        0,
        5,
        Compression::Gzip,
        "part-r-00000.gz",
    );
    write(
        "year=2023/country=us",
        5,
        4,
        Compression::None,
        "part-r-00000",
    );
    // GZIP without the suffix: sniffed from the first bytes.
    write(
        "year=2024/country=fr",
        9,
        3,
        Compression::Gzip,
        "part-00001-9f3a.tfrecord",
    );
    write("year=2024", 12, 2, Compression::None, "part-r-00007");
    // Java's GZIPOutputStream with nothing written: 20 bytes.
    let empty_gzip = [
        0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    std::fs::write(
        root.join("year=2023/country=fr/part-r-00001.gz"),
        empty_gzip,
    )
    .unwrap();
    std::fs::write(root.join("year=2024/part-r-00008"), b"").unwrap();
    std::fs::write(root.join("year=2024/part-r-00009.gz"), b"").unwrap();
    // Not data: markers, checksums, hidden files, work directories.
    for junk in [
        "_SUCCESS",
        "_committed_1234",
        "_started_1234",
        "year=2023/country=us/.part-r-00000.crc",
        "year=2023/country=us/part-r-00000.crc",
        ".hidden",
        "_temporary/0/part-r-00000",
        "year=2024/_temporary/part-r-00003",
        "notes/part-r-00000",
    ] {
        let path = root.join(junk);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"not a tfrecord").unwrap();
    }
    let files = Pipeline::tfrecord_files([root.display().to_string()]).unwrap();
    let relative: Vec<String> = files
        .paths()
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert_eq!(
        relative,
        [
            "year=2023/country=fr/part-r-00000.gz",
            "year=2023/country=fr/part-r-00001.gz",
            "year=2023/country=us/part-r-00000",
            "year=2024/country=fr/part-00001-9f3a.tfrecord",
            "year=2024/part-r-00007",
            "year=2024/part-r-00008",
            "year=2024/part-r-00009.gz",
        ]
    );
    assert_eq!(indices(files.records()), (0..14).collect::<Vec<_>>());
    // A directory without parts says what it looked for.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join("_SUCCESS"), b"").unwrap();
    let error = Pipeline::tfrecord_files([empty.display().to_string()])
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("part-* files"), "{error}");
}

/// Partition directories become features: typed per the schema (a name the
/// schema lacks is a bytes feature after the others), Hive's escapes
/// decoded, its null taking the default, and a record without a value (and
/// no default) reported as a bad record with its location.
#[test]
fn partition_values_become_features_per_row() {
    use tfpipe::Schema;
    use tfpipe::pipeline::{Parallelism, PipelineError};

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("out");
    for (sub, first, n) in [
        ("year=2023/country=fr", 0, 3),
        ("year=2024/country=S%C3%A3o%20Tom%C3%A9", 3, 2),
        ("year=__HIVE_DEFAULT_PARTITION__/country=us", 5, 2),
    ] {
        let d = root.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let written = write_shards(tmp.path(), 1, n, Compression::None, |i| {
            crate::common::mnist_example(first + i)
        });
        std::fs::rename(&written[0], d.join("part-00000")).unwrap();
    }
    let read = |specs: &[&str], partitions: &[&str]| {
        let schema = Schema::from_feature_texts(specs).unwrap();
        let pipeline = Pipeline::tfrecord_files([root.display().to_string()])
            .unwrap()
            .records()
            .batch(4)
            .parse_batches_partitioned(schema, partitions, Parallelism::Fixed(2));
        watchdog(20, move || {
            pipeline.start().map(|it| it.collect::<Vec<_>>())
        })
    };
    let batches = read(&["label:int64", "year:int64=-1"], &["year", "country"]).unwrap();
    let batches: Vec<tfpipe::Batch> = batches.into_iter().map(Result::unwrap).collect();
    let names: Vec<&str> = batches[0].columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["label", "year", "country"]);
    let ints = |name: &str| -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| b.column(name).unwrap().as_i64().unwrap().to_vec())
            .collect()
    };
    let countries: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            let c = b.column("country").unwrap();
            (0..b.num_rows).map(|i| String::from_utf8(c.bytes(i).unwrap().to_vec()).unwrap())
        })
        .collect();
    assert_eq!(ints("label"), [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(ints("year"), [2023, 2023, 2023, 2024, 2024, -1, -1]);
    assert_eq!(
        countries,
        ["fr", "fr", "fr", "São Tomé", "São Tomé", "us", "us"]
    );

    // Without a default, the null partition's records are bad records.
    let items = read(&["label:int64", "year:int64"], &["year"]).unwrap();
    let errors: Vec<&PipelineError> = items.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    let location = errors[0].location().unwrap();
    assert!(
        location
            .path
            .as_ref()
            .unwrap()
            .to_string_lossy()
            .contains("__HIVE_DEFAULT_PARTITION__")
    );
    assert_eq!(location.record, 0);
    assert!(
        errors[0].to_string().contains("Hive's null"),
        "{}",
        errors[0]
    );
    let rows: usize = items
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|b| b.num_rows)
        .sum();
    assert_eq!(rows, 5);

    // A partition value is one value: anything else fails at start.
    let error = read(&["label:int64", "year:int64:2"], &["year"])
        .err()
        .unwrap();
    assert!(matches!(error, PipelineError::Config { .. }), "{error}");
}
