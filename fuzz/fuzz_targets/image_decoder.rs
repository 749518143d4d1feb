#![no_main]
//! `tfpipe::fuzzing::image_decoder` under libFuzzer; see `fuzz/Cargo.toml`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tfpipe::fuzzing::image_decoder(data);
});
