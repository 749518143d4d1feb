//! `tfpipe._tfpipe`: the native half of the Python package.
//!
//! The thin Python package `tfpipe` (in `python/tfpipe/`) holds the public
//! names, their docstrings and the framework adapters; this module holds what
//! must be native:
//!
//! | file | what lives there |
//! |---|---|
//! | `plan.rs` | a dataset description (JSON ops from Python) built into a typed [`tfpipe::Pipeline`] |
//! | `iter.rs` | the running iterator: `next()` waits on the pipeline's last prefetch stage with the GIL released |
//! | `convert.rs` | batches to `dict[str, numpy.ndarray]`, moved out of Rust without a copy |
//! | `io.rs` | the record writer, `encode_example`, `encode_sequence_example`, `parse_examples`, `index` |
//! | `errors.rs` | engine errors to Python exceptions (`DataError` with its location) |
//!
//! Invariants: no thread starts here except through [`tfpipe::spawn`]; no
//! Python object is touched without the GIL; every array handed to numpy owns
//! its memory (a `Vec` moved into it, never a view of an engine buffer).

use pyo3::prelude::*;

mod convert;
mod errors;
mod io;
mod iter;
mod plan;
mod schema;

/// Threads started by tfpipe in this process that have not finished (the
/// engine's own count): how the tests show that dropping an iterator joins
/// its threads.
#[pyfunction]
fn live_threads() -> usize {
    tfpipe::spawn::live_threads()
}

/// Sets `object_store` options for one bucket (`s3://name`), applied after
/// the environment: `set_bucket_options("s3://b", {"aws_endpoint": "http://127.0.0.1:9000"})`.
#[pyfunction]
fn set_bucket_options(base: &str, options: std::collections::HashMap<String, String>) {
    tfpipe::storage::set_bucket_options(base, options);
}

#[pymodule]
fn _tfpipe(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DataError", py.get_type::<errors::DataError>())?;
    m.add("SchemaError", py.get_type::<errors::SchemaError>())?;
    m.add_class::<schema::Schema>()?;
    m.add_class::<iter::Iterator>()?;
    m.add_class::<io::TFRecordWriter>()?;
    m.add_function(wrap_pyfunction!(iter::start, m)?)?;
    m.add_function(wrap_pyfunction!(io::encode_example, m)?)?;
    m.add_function(wrap_pyfunction!(io::encode_sequence_example, m)?)?;
    m.add_function(wrap_pyfunction!(io::parse_examples, m)?)?;
    m.add_function(wrap_pyfunction!(io::index, m)?)?;
    m.add_function(wrap_pyfunction!(live_threads, m)?)?;
    m.add_function(wrap_pyfunction!(set_bucket_options, m)?)?;
    m.add_function(wrap_pyfunction!(iter::rank_from_env, m)?)?;
    Ok(())
}
