//! Helpers shared by the pipeline tests.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use tfpipe::example::Example;
use tfpipe::example::proto::{BytesList, Feature, Features, Int64List, feature};
use tfpipe::tfrecord::{Compression, FileRecordWriter};

/// Runs `f` on a thread and fails the test if it takes longer than `secs`.
pub fn watchdog<R: Send + 'static>(secs: u64, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    // A raw thread, on purpose: the watchdog must be able to walk away from a
    // deadlocked body, which a `tfpipe::spawn::Thread` (joined on drop) cannot.
    #[allow(
        clippy::disallowed_methods,
        reason = "the watchdog abandons a deadlocked body instead of joining it"
    )]
    let handle = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(r) => {
            let _ = handle.join();
            r
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("test timed out after {secs} s: deadlock?"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: re-raise its panic.
            match handle.join() {
                Err(payload) => std::panic::resume_unwind(payload),
                Ok(()) => unreachable!("the body returned without sending"),
            }
        }
    }
}

/// A serialized MNIST-like `Example`: 784-byte `image_raw` and an int64 `label`.
pub fn mnist_example(i: u64) -> Vec<u8> {
    use prost::Message;
    let mut features = std::collections::BTreeMap::new();
    let image: Vec<u8> = (0..784).map(|p| ((i as usize + p) % 251) as u8).collect();
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

/// Writes `shards` files of `per_shard` records each (record `k` of shard `s`
/// is `record(s * per_shard + k)`), named `part-S.tfrecord` plus the
/// compression suffix. Returns the paths.
pub fn write_shards(
    dir: &Path,
    shards: u64,
    per_shard: u64,
    compression: Compression,
    record: impl Fn(u64) -> Vec<u8>,
) -> Vec<PathBuf> {
    (0..shards)
        .map(|s| {
            let path = dir.join(format!("part-{s}.tfrecord{}", compression.suffix()));
            let mut w = FileRecordWriter::create(&path, compression).unwrap();
            for k in 0..per_shard {
                w.write_record(&record(s * per_shard + k)).unwrap();
            }
            w.finish().unwrap()
        })
        .collect()
}

/// A record that is just its index, 8 bytes little-endian.
pub fn index_record(i: u64) -> Vec<u8> {
    i.to_le_bytes().to_vec()
}

/// The index back from an [`index_record`].
pub fn record_index(r: &[u8]) -> u64 {
    u64::from_le_bytes(r.try_into().unwrap())
}
