//! Compiles `proto/*.proto` into Rust types with prost, using the pure-Rust
//! `protox` compiler: no system `protoc`, nothing downloaded.

use std::error::Error;

const PROTOS: &[&str] = &[
    "proto/feature.proto",
    "proto/example.proto",
    "proto/summary.proto",
    "proto/event.proto",
    "proto/tensor.proto",
    "proto/prediction_log.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    prost_build::Config::new()
        // BTreeMap keeps map entries sorted by key, so our encoding is the
        // canonical (deterministic) serialization TensorFlow also produces.
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
