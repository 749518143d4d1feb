#![no_main]
//! `tfpipe::fuzzing::serve_inputs` under libFuzzer; see `fuzz/Cargo.toml`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tfpipe::fuzzing::serve_inputs(data);
});
