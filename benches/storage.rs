//! Reading from object storage, side by side in one run against one S3
//! server (`s3s-fs` on 127.0.0.1, started here, or another one such as
//! `moto_server`, see below):
//!
//! - `download`: a plain parallel download of every shard, the bar: one
//!   whole-object GET per shard (`object_store`'s `get`, no range), all
//!   shards at once on a 2-thread runtime, each body collected into one
//!   buffer in memory (nothing written to disk), as parallel `curl` would.
//!   It is the fastest plain download of these objects, not a typical one:
//!   `aws s3 cp --recursive` (boto3's transfer manager) splits an object
//!   over 8 MiB into 8 MiB ranged GETs, which moto serves slowly, and
//!   boto3's `get_object(...)['Body'].read()` on one thread per object
//!   spends Python's CPU per byte (docs/benchmarks.md has both measured);
//! - `bytes`: tfpipe's object reader reading every shard whole, all at once,
//!   bytes dropped (the download's work), by one streaming GET per object
//!   and by ranged GETs;
//! - `read`: tfpipe reading every record (all shards interleaved at once, as
//!   the download reads them, nothing parsed), by one streaming GET per object and by ranged GETs with
//!   read-ahead ([`ReadStrategy`], set per variant), after the strategy the
//!   server measures to ([`ReadStrategy::Auto`]) is printed;
//! - `pipeline`: tfpipe's whole pipeline from the store, read (the measured
//!   strategy, 4 files interleaved) -> shuffle(10,000) -> batch(256)
//!   -> parse -> prefetch(2);
//! - `read` and `pipeline` again with a 32 MiB stream buffer (before
//!   [`ReadOptions::stream_buffer`], each stream could hold the whole
//!   read-ahead), for the before/after in one run;
//! - `pipeline` with all 8 files interleaved instead of 4: every object in
//!   flight from the start, as reading the next objects ahead of the
//!   interleave's cycle would give;
//! - `global_shuffle`: the same pipeline fed by the index-driven global
//!   shuffle (one ranged GET per record, 64 in flight) instead of the
//!   buffered shuffle; from S3 only its first 5,000 records (it is bound by
//!   the server's GETs per second, about 1,400 here, so the whole set would
//!   take minutes), and both shuffles from local files.
//!
//! Rounds alternate the variants so a noisy machine slows them alike; the
//! table reports the best round of each and the ratio to `download`.
//!
//! ```text
//! cargo bench --bench storage
//! TFPIPE_BENCH_RECORDS=200000 TFPIPE_BENCH_ROUNDS=3 cargo bench --bench storage
//! TFPIPE_BENCH_ONLY='s3 pipeline' cargo bench --bench storage   # the download and those
//! # against moto (any access key; the bucket must exist):
//! moto_server -p 5055 &
//! python -c "import boto3; boto3.client('s3', endpoint_url='http://127.0.0.1:5055',
//!   aws_access_key_id='x', aws_secret_access_key='x', region_name='us-east-1').create_bucket(Bucket='bench')"
//! TFPIPE_BENCH_S3_ENDPOINT=http://127.0.0.1:5055 TFPIPE_BENCH_S3_BUCKET=bench cargo bench --bench storage
//! # and the server's CPU seconds per round beside tfpipe's:
//! TFPIPE_BENCH_SERVER_PID=$(pgrep -f 'moto_server -p 5055') ...
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use prost::Message;
use tfpipe::Schema;
use tfpipe::example::Example;
use tfpipe::example::proto::{BytesList, Feature, Features, Int64List, feature};
use tfpipe::pipeline::{Interleave, Parallelism, Pipeline};
use tfpipe::storage::{ReadOptions, ReadStrategy, read_strategy, set_read_strategy};
use tfpipe::tfrecord::{Compression, RecordWriter};
use tfpipe::{IndexedFiles, RecordIndex, index_path};

// The tests' S3 server, shared rather than copied (the bench uses part of it).
#[allow(dead_code)]
#[path = "../tests/storage/server.rs"]
mod server;
use server::S3Server;

const SHARDS: u64 = 8;

fn example(i: u64) -> Vec<u8> {
    let mut state = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let image: Vec<u8> = (0..784)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if state % 100 < 19 {
                (state >> 32) as u8 | 1
            } else {
                0
            }
        })
        .collect();
    let mut features = BTreeMap::new();
    features.insert(
        "image_raw".to_string(),
        Feature {
            kind: Some(feature::Kind::BytesList(BytesList { value: vec![image] })),
        },
    );
    features.insert(
        "label".to_string(),
        Feature {
            kind: Some(feature::Kind::Int64List(Int64List {
                value: vec![(i % 10) as i64],
            })),
        },
    );
    Example {
        features: Some(Features { feature: features }),
    }
    .encode_to_vec()
}

fn shard_bytes(s: u64, per_shard: u64, records: u64) -> Vec<u8> {
    let mut w = RecordWriter::new(Vec::new(), Compression::None);
    for k in s * per_shard..((s + 1) * per_shard).min(records) {
        w.write_record(&example(k)).expect("write");
    }
    w.finish().expect("finish")
}

/// Every object of `urls` read whole through tfpipe's object reader, all at
/// once (one thread each), bytes dropped: the download's work, by `strategy`.
fn read_bytes(urls: &[String], strategy: ReadStrategy) {
    let read = ReadOptions {
        strategy,
        ..ReadOptions::default()
    };
    std::thread::scope(|scope| {
        let threads: Vec<_> = urls
            .iter()
            .map(|url| {
                let read = &read;
                tfpipe::spawn::scoped(
                    scope,
                    "bench-read",
                    tfpipe::spawn::Cancel::new(),
                    move |_| {
                        let mut object = tfpipe::storage::open_object(url, read).expect("open");
                        std::io::copy(&mut object, &mut std::io::sink()).expect("read")
                    },
                )
                .expect("thread")
            })
            .collect();
        for t in threads {
            t.join().expect("reader");
        }
    });
}

fn run_to_end<T: Send + 'static>(p: &Pipeline<T>) {
    for item in p.start().expect("start") {
        item.expect("no errors");
    }
}

/// User plus system CPU seconds of this process so far (Linux's
/// `/proc/self/stat`; NaN elsewhere).
fn cpu_seconds() -> f64 {
    process_cpu_seconds("self")
}

/// The CPU seconds of the server process `TFPIPE_BENCH_SERVER_PID` (a
/// separate server such as moto), NaN without one: how much of the
/// machine the server took while tfpipe read from it.
fn server_cpu_seconds() -> f64 {
    match std::env::var("TFPIPE_BENCH_SERVER_PID") {
        Ok(pid) => process_cpu_seconds(&pid),
        Err(_) => f64::NAN,
    }
}

/// User plus system CPU seconds of process `pid` (`self` or a number) so
/// far, from `/proc/PID/stat` (its threads included); NaN elsewhere.
fn process_cpu_seconds(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields overall, in clock ticks (100 per second on Linux).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return f64::NAN;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => f64::NAN,
    }
}

/// A named run of the benchmark and the records it reads.
type Variant<'a> = (&'static str, u64, Box<dyn Fn() + 'a>);

/// Records the S3 global shuffle reads (see the module docs).
const GLOBAL_SAMPLE: u64 = 5_000;

/// The S3 server read from: the tests' `s3s-fs`, or one at
/// `TFPIPE_BENCH_S3_ENDPOINT` with the bucket `TFPIPE_BENCH_S3_BUCKET`.
enum Backend {
    Local(S3Server),
    External {
        endpoint: String,
        bucket: String,
        runtime: tokio::runtime::Runtime,
    },
}

impl Backend {
    fn start() -> Backend {
        let Ok(endpoint) = std::env::var("TFPIPE_BENCH_S3_ENDPOINT") else {
            return Backend::Local(S3Server::start());
        };
        let bucket = std::env::var("TFPIPE_BENCH_S3_BUCKET").expect("TFPIPE_BENCH_S3_BUCKET");
        tfpipe::storage::set_bucket_options(
            &format!("s3://{bucket}"),
            [
                ("aws_endpoint", endpoint.as_str()),
                ("aws_allow_http", "true"),
                ("aws_access_key_id", "bench"),
                ("aws_secret_access_key", "bench"),
                ("aws_region", "us-east-1"),
            ],
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        Backend::External {
            endpoint,
            bucket,
            runtime,
        }
    }

    /// `s3://BUCKET`.
    fn bucket(&self) -> String {
        match self {
            Backend::Local(server) => server.bucket("bench"),
            Backend::External { bucket, .. } => format!("s3://{bucket}"),
        }
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        match self {
            Backend::Local(server) => &server.runtime,
            Backend::External { runtime, .. } => runtime,
        }
    }

    fn direct_store(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        match self {
            Backend::Local(server) => server.direct_store(bucket),
            Backend::External { endpoint, .. } => {
                tfpipe::storage::install_crypto_provider();
                object_store::aws::AmazonS3Builder::new()
                    .with_bucket_name(bucket)
                    .with_endpoint(endpoint)
                    .with_allow_http(true)
                    .with_access_key_id("bench")
                    .with_secret_access_key("bench")
                    .with_region("us-east-1")
                    .build()
                    .expect("store")
            }
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is parsed.
    let records: u64 = std::env::var("TFPIPE_BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let rounds: usize = std::env::var("TFPIPE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let local = tempfile::tempdir().expect("tempdir");
    // The tests' server (s3s-fs on its own 2-thread runtime), or another.
    let server = Backend::start();
    let bucket = server.bucket();
    let bucket_name = bucket.trim_start_matches("s3://").to_string();
    let store: Arc<dyn ObjectStore> = Arc::new(server.direct_store(&bucket_name));

    // Upload the shards (and their indexes) through the API; keep local copies.
    let t = Instant::now();
    let per_shard = records.div_ceil(SHARDS);
    let mut total_bytes = 0u64;
    let mut urls = Vec::new();
    let mut locals = Vec::new();
    for s in 0..SHARDS {
        let bytes = shard_bytes(s, per_shard, records);
        total_bytes += bytes.len() as u64;
        let name = format!("mnist-{s:02}.tfrecord");
        let path = local.path().join(&name);
        std::fs::write(&path, &bytes).expect("local shard");
        let index = RecordIndex::build(&path).expect("index");
        index.write(&index_path(&path, None)).expect("local index");
        let url = format!("{bucket}/{name}");
        server
            .runtime()
            .block_on(store.put(&ObjectPath::from(name.as_str()), bytes.into()))
            .expect("put");
        index
            .write(&index_path(std::path::Path::new(&url), None))
            .expect("index upload");
        urls.push(url);
        locals.push(path);
    }
    let mb = total_bytes as f64 / 1e6;
    eprintln!(
        "{records} records, {SHARDS} shards, {mb:.0} MB, uploaded in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // What the server measures to: opening the first shard measures it.
    set_read_strategy(&bucket, ReadStrategy::Auto);
    let t = Instant::now();
    drop(tfpipe::storage::open_object(&urls[0], &ReadOptions::default()).expect("open"));
    let took = t.elapsed().as_secs_f64();
    let measured = match read_strategy(&bucket) {
        Some(strategy) => {
            eprintln!(
                "measured strategy: {strategy:?} (opening with the measurement took {took:.2} s)"
            );
            strategy
        }
        None => {
            eprintln!(
                "not measured: the shards are smaller than the read-ahead (32 MiB); streamed"
            );
            ReadStrategy::Stream
        }
    };

    let schema =
        Schema::from_feature_texts(&["image_raw:uint8:784", "label:int64"]).expect("schema");
    let buffered_with = |files: Vec<String>, read: ReadOptions| {
        Pipeline::tfrecord_files(files)
            .expect("files")
            .read_options(read)
            .interleave_with(Interleave::new(4, 16).parallel(Parallelism::Auto))
            .shuffle(10_000, 42)
            .batch(256)
            .parse_batches(schema.clone(), Parallelism::Auto)
            .prefetch(2)
    };
    let buffered = |files: Vec<String>| buffered_with(files, ReadOptions::default());
    // Before the stream had its own buffer: the whole read-ahead per stream.
    let before = ReadOptions {
        stream_buffer: 32 << 20,
        ..ReadOptions::default()
    };
    // Every shard at once, as the download reads them.
    let read_with = |files: Vec<String>, read: ReadOptions| {
        Pipeline::tfrecord_files(files)
            .expect("files")
            .read_options(read)
            .interleave_with(Interleave::new(SHARDS as usize, 16).parallel(Parallelism::Auto))
    };
    let read = |files: Vec<String>| read_with(files, ReadOptions::default());
    let global = |files: &[String], take: u64| {
        let indexed = IndexedFiles::open(files, None).expect("indexes");
        indexed
            .global_shuffle(42)
            .read_ahead(64)
            .pipeline()
            .take(take)
            .batch(256)
            .parse_batches(schema.clone(), Parallelism::Auto)
            .prefetch(2)
    };
    let local_names: Vec<String> = locals.iter().map(|p| p.display().to_string()).collect();
    let variants: Vec<Variant<'_>> = vec![
        (
            "download (parallel whole-object GETs)",
            records,
            Box::new(|| {
                let store = Arc::clone(&store);
                server.runtime().block_on(async move {
                    let mut tasks = Vec::new();
                    for s in 0..SHARDS {
                        let store = Arc::clone(&store);
                        tasks.push(tokio::spawn(async move {
                            let path = ObjectPath::from(format!("mnist-{s:02}.tfrecord"));
                            let bytes = store.get(&path).await.expect("get").bytes().await;
                            bytes.expect("body").len()
                        }));
                    }
                    for t in tasks {
                        t.await.expect("task");
                    }
                })
            }),
        ),
        ("s3 bytes, one stream per object", records, {
            let (urls, bucket) = (urls.clone(), bucket.clone());
            Box::new(move || {
                set_read_strategy(&bucket, ReadStrategy::Stream);
                read_bytes(&urls, ReadStrategy::Auto)
            })
        }),
        ("s3 bytes, ranges (8 MiB, 4 in flight)", records, {
            let (urls, bucket) = (urls.clone(), bucket.clone());
            Box::new(move || {
                set_read_strategy(&bucket, ReadStrategy::Ranges);
                read_bytes(&urls, ReadStrategy::Auto)
            })
        }),
        ("s3 read, one stream per object", records, {
            let p = read(urls.clone());
            let bucket = bucket.clone();
            Box::new(move || {
                set_read_strategy(&bucket, ReadStrategy::Stream);
                run_to_end(&p)
            })
        }),
        (
            "s3 read, one stream, 32 MiB stream buffer (before)",
            records,
            {
                let p = read_with(urls.clone(), before.clone());
                let bucket = bucket.clone();
                Box::new(move || {
                    set_read_strategy(&bucket, ReadStrategy::Stream);
                    run_to_end(&p)
                })
            },
        ),
        ("s3 read, ranges (8 MiB, 4 in flight)", records, {
            let p = read(urls.clone());
            let bucket = bucket.clone();
            Box::new(move || {
                set_read_strategy(&bucket, ReadStrategy::Ranges);
                run_to_end(&p)
            })
        }),
        ("s3 pipeline, shuffle(10000)", records, {
            let p = buffered(urls.clone());
            let bucket = bucket.clone();
            Box::new(move || {
                set_read_strategy(&bucket, measured);
                run_to_end(&p)
            })
        }),
        (
            "s3 pipeline, shuffle(10000), 32 MiB stream buffer (before)",
            records,
            {
                let p = buffered_with(urls.clone(), before.clone());
                let bucket = bucket.clone();
                Box::new(move || {
                    set_read_strategy(&bucket, measured);
                    run_to_end(&p)
                })
            },
        ),
        (
            "s3 pipeline, shuffle(10000), 8 files interleaved",
            records,
            {
                // Every object in flight from the start: what reading the next
                // objects ahead of the interleave's cycle (4) would give.
                let p = Pipeline::tfrecord_files(urls.clone())
                    .expect("files")
                    .interleave_with(
                        Interleave::new(SHARDS as usize, 16).parallel(Parallelism::Auto),
                    )
                    .shuffle(10_000, 42)
                    .batch(256)
                    .parse_batches(schema.clone(), Parallelism::Auto)
                    .prefetch(2);
                let bucket = bucket.clone();
                Box::new(move || {
                    set_read_strategy(&bucket, measured);
                    run_to_end(&p)
                })
            },
        ),
        (
            "s3 pipeline, global shuffle (sample)",
            records.min(GLOBAL_SAMPLE),
            {
                let p = global(&urls, GLOBAL_SAMPLE);
                Box::new(move || run_to_end(&p))
            },
        ),
        ("local pipeline, shuffle(10000)", records, {
            let p = buffered(local_names.clone());
            Box::new(move || run_to_end(&p))
        }),
        ("local pipeline, global shuffle", records, {
            let p = global(&local_names, records);
            Box::new(move || run_to_end(&p))
        }),
    ];
    // `TFPIPE_BENCH_ONLY=text` keeps the download and the variants whose
    // name contains `text` (or one of `a|b`; for profiling one).
    let mut variants = variants;
    if let Ok(only) = std::env::var("TFPIPE_BENCH_ONLY") {
        let mut index = 0;
        variants.retain(|(name, _, _)| {
            index += 1;
            index == 1 || only.split('|').any(|part| name.contains(part))
        });
    }
    // Best seconds per record of each variant, and the CPU seconds (the
    // server's and tfpipe's together: they share the machine) in that round.
    // With a separate server (`TFPIPE_BENCH_SERVER_PID`), its CPU seconds
    // in the same round: the two share the machine's cores.
    let mut best = vec![(f64::INFINITY, f64::NAN, f64::NAN); variants.len()];
    for round in 0..rounds {
        for (i, (name, read, run)) in variants.iter().enumerate() {
            let (cpu, server_cpu) = (cpu_seconds(), server_cpu_seconds());
            let t = Instant::now();
            run();
            let wall = t.elapsed().as_secs_f64();
            let per_record = wall / *read as f64;
            let cpu = cpu_seconds() - cpu;
            let server_cpu = server_cpu_seconds() - server_cpu;
            eprintln!(
                "round {round}: {name}: {:.0} MB/s, {wall:.2} s, {cpu:.2} CPU s, server {server_cpu:.2} CPU s",
                mb / (per_record * records as f64)
            );
            if per_record < best[i].0 {
                best[i] = (per_record, cpu, server_cpu);
            }
        }
    }
    println!("| variant | MB/s | records/s | CPU s (this process) | server CPU s | vs download |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, (name, _, _)) in variants.iter().enumerate() {
        let (per_record, cpu, server_cpu) = best[i];
        println!(
            "| {name} | {:.0} | {:.0} | {cpu:.2} | {server_cpu:.2} | {:.2}x |",
            mb / (per_record * records as f64),
            1.0 / per_record,
            best[0].0 / per_record
        );
    }
}
