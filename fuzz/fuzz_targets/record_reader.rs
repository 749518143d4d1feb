#![no_main]
//! `tfpipe::fuzzing::record_reader` under libFuzzer; see `fuzz/Cargo.toml`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tfpipe::fuzzing::record_reader(data));
