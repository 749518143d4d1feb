//! `tfpipe.Schema`: feature specs in the CLI's grammar (`image_raw:uint8:28x28`)
//! or a schema file, with the CLI's errors.

use std::path::PathBuf;

use pyo3::exceptions::PyFileNotFoundError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::schema_error;

/// What each record holds and how it becomes columns: feature specs in the
/// `tfpipe` CLI's grammar, `NAME:DTYPE[:SHAPE][=DEFAULT]`.
///
/// DTYPE is `int64`, `float32`, `bytes`, `uint8` (one bytes value decoded raw)
/// or `raw_int16`/`raw_uint16`/`raw_int32`/`raw_float32`/`raw_float64`. SHAPE
/// is fixed (`784`, `28x28`; omitted: a scalar), `var` (any count: a `Ragged`),
/// `var:DIMS`, `seq[:DIMS]` and `seq:var` (SequenceExample feature lists),
/// `ragged:row_lengths(KEY)...` or `sparse(KEY,...):DIMS` (a `Sparse`).
///
/// >>> schema = tfpipe.Schema(["image_raw:uint8:28x28", "label:int64=-1", "tags:bytes:var"])
/// >>> schema.names
/// ['image_raw', 'label', 'tags']
///
/// `Schema.from_file(path)` reads a schema file (`PREFIX.features.json`, as
/// `tfpipe convert` writes). A bad spec raises `SchemaError` with the CLI's
/// message. `label=` names the label feature (`Schema.label`; kept in the
/// schema file).
#[pyclass(frozen, module = "tfpipe._tfpipe")]
#[derive(Clone)]
pub(crate) struct Schema {
    pub(crate) inner: tfpipe::Schema,
}

#[pymethods]
impl Schema {
    #[new]
    #[pyo3(signature = (features, label = None))]
    fn new(features: Vec<String>, label: Option<String>) -> PyResult<Schema> {
        let mut inner = tfpipe::Schema::from_feature_texts(&features).map_err(schema_error)?;
        if let Some(label) = label {
            inner = inner.with_label(label).map_err(schema_error)?;
        }
        Ok(Schema { inner })
    }

    /// Loads a schema file (`PREFIX.features.json`, as `tfpipe convert` writes).
    #[staticmethod]
    fn from_file(path: PathBuf) -> PyResult<Schema> {
        if !path.exists() {
            return Err(PyFileNotFoundError::new_err(format!(
                "{}: no such schema file",
                path.display()
            )));
        }
        let inner = tfpipe::Schema::load(&path).map_err(schema_error)?;
        Ok(Schema { inner })
    }

    /// A schema from its JSON text (the schema file's form).
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Schema> {
        let inner = tfpipe::Schema::from_json_str(text).map_err(schema_error)?;
        Ok(Schema { inner })
    }

    /// The schema file's JSON text.
    fn to_json(&self) -> String {
        self.inner.to_json_value().to_string()
    }

    /// The feature names, in column order.
    #[getter]
    fn names(&self) -> Vec<String> {
        self.inner.features.iter().map(|f| f.name.clone()).collect()
    }

    /// The features in the spec grammar (`"image_raw:uint8:28x28"`).
    #[getter]
    fn features(&self) -> Vec<String> {
        self.inner.features.iter().map(|f| f.to_string()).collect()
    }

    /// The label feature's name, if the schema names one.
    #[getter]
    fn label(&self) -> Option<String> {
        self.inner.label.clone()
    }

    fn __len__(&self) -> usize {
        self.inner.features.len()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Schema>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __repr__(&self) -> String {
        let features: Vec<String> = self.features().iter().map(|f| format!("{f:?}")).collect();
        match &self.inner.label {
            Some(label) => format!("Schema([{}], label={label:?})", features.join(", ")),
            None => format!("Schema([{}])", features.join(", ")),
        }
    }

    /// Pickles as its JSON text.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let from_json = py.get_type::<Schema>().getattr("from_json")?;
        let args = PyTuple::new(py, [slf.get().to_json()])?;
        PyTuple::new(py, [from_json.into_any(), args.into_any()])
    }
}
