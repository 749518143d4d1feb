//! Integration tests of the pipeline engine, `tfpipe bench` and their
//! invariants. Every wait is bounded: each test body runs under
//! [`common::watchdog`], so a deadlock fails the test instead of hanging CI.

#[path = "pipeline/common.rs"]
mod common;

#[path = "pipeline/cli.rs"]
mod cli;
#[path = "pipeline/combine.rs"]
mod combine;
#[path = "pipeline/errors.rs"]
mod errors;
#[path = "pipeline/files.rs"]
mod files;
#[path = "pipeline/images.rs"]
mod images;
#[path = "pipeline/memory.rs"]
mod memory;
#[path = "pipeline/metrics.rs"]
mod metrics;
#[path = "pipeline/positions.rs"]
mod positions;
#[path = "pipeline/props.rs"]
mod props;
#[path = "pipeline/ranks.rs"]
mod ranks;
#[path = "pipeline/sequences.rs"]
mod sequences;
#[path = "pipeline/shutdown.rs"]
mod shutdown;
#[path = "pipeline/state.rs"]
mod state;
#[path = "pipeline/tf_sequences.rs"]
mod tf_sequences;
