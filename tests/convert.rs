//! Integration tests of `tfpipe convert`: every format read back against its
//! source, bad input with exact locations and no output left behind,
//! determinism across thread counts, and the command line.

mod convert {
    mod bad_input;
    mod cli;
    pub mod common;
    mod csv;
    mod fuzz;
    mod idx;
    mod images;
    mod json;
    mod outputs;
    mod schema;
    mod split;
}
