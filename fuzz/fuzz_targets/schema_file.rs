#![no_main]
//! `tfpipe::fuzzing::schema_file` under libFuzzer; see `fuzz/Cargo.toml`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tfpipe::fuzzing::schema_file(data));
