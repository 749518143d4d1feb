//! Integration tests of the TFRecord layer: TensorFlow golden files, corrupt
//! files, edge records against the framing computed from its definition, property tests,
//! and the atomic file writer. One test binary; the areas live in `records/`.

#[path = "records/common.rs"]
mod common;
#[path = "records/compressed.rs"]
mod compressed;
#[path = "records/corrupt.rs"]
mod corrupt;
#[path = "records/crosscheck.rs"]
mod crosscheck;
#[path = "records/fuzz.rs"]
mod fuzz;
#[path = "records/golden.rs"]
mod golden;
#[path = "records/props.rs"]
mod props;
#[path = "records/writer.rs"]
mod writer;
