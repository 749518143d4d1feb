//! Engine errors as Python exceptions.
//!
//! `DataError` (a `ValueError`) is a bad record, with `.path`, `.record` and
//! `.offset` set from the engine's [`Location`] wherever in the pipeline it
//! was found; `SchemaError` (a `ValueError`) a bad spec; a missing file is
//! Python's own `FileNotFoundError`. The message is the engine's, which
//! already holds every cause once.

use std::io;

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tfpipe::{Location, PipelineError};

pyo3::create_exception!(
    tfpipe,
    DataError,
    PyValueError,
    "A record is corrupt or does not parse: `.path`, `.record` and `.offset` say where."
);
pyo3::create_exception!(
    tfpipe,
    SchemaError,
    PyValueError,
    "A feature spec or schema file is invalid."
);

/// A `DataError` carrying `location` (all three attributes `None` without one).
pub(crate) fn data_error(py: Python<'_>, message: String, location: Option<&Location>) -> PyErr {
    let err = DataError::new_err(message);
    let value = err.value(py);
    let (path, record, offset) = match location {
        Some(l) => (
            l.path.as_ref().map(|p| p.display().to_string()),
            Some(l.record),
            Some(l.offset),
        ),
        None => (None, None, None),
    };
    // Setting attributes on a fresh exception instance cannot fail in practice;
    // if it did, the message still says where.
    let _ = value.setattr("path", path);
    let _ = value.setattr("record", record);
    let _ = value.setattr("offset", offset);
    err
}

/// The Python exception for an engine error.
pub(crate) fn pipeline_error(py: Python<'_>, error: PipelineError) -> PyErr {
    // The whole chain: each cause once (the engine's errors never repeat their source).
    let message = tfpipe::error::display_chain(&error);
    if let Some(location) = error.location() {
        return data_error(py, message, Some(location));
    }
    if error.is_data_error() {
        return data_error(py, message, None);
    }
    // The kind of a combined pipeline's input error is its inner error's.
    match error.innermost() {
        PipelineError::NoFiles { .. } => PyFileNotFoundError::new_err(message),
        PipelineError::Schema(_) => SchemaError::new_err(message),
        PipelineError::Config { .. } | PipelineError::BadGlob { .. } | PipelineError::State(_) => {
            PyValueError::new_err(message)
        }
        PipelineError::Storage(s) if s.io_kind() == io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(message)
        }
        PipelineError::Storage(_) => PyOSError::new_err(message),
        PipelineError::Record { error, .. } => match error.io_error().map(io::Error::kind) {
            Some(io::ErrorKind::NotFound) => PyFileNotFoundError::new_err(message),
            _ => PyOSError::new_err(message),
        },
        _ => PyRuntimeError::new_err(message),
    }
}

/// An object-store error: `FileNotFoundError` for a missing object or
/// bucket, else `OSError`.
pub(crate) fn storage_error(error: tfpipe::storage::StorageError) -> PyErr {
    let message = tfpipe::error::display_chain(&error);
    if error.io_kind() == io::ErrorKind::NotFound {
        PyFileNotFoundError::new_err(message)
    } else {
        PyOSError::new_err(message)
    }
}

/// A schema error as `SchemaError`.
pub(crate) fn schema_error(error: tfpipe::example::SchemaError) -> PyErr {
    SchemaError::new_err(tfpipe::error::display_chain(&error))
}
