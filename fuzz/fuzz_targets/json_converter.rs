#![no_main]
//! `tfpipe::fuzzing::json_converter` under libFuzzer; see `fuzz/Cargo.toml`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tfpipe::fuzzing::json_converter(data);
});
