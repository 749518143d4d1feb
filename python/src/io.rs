//! Records in and out without a pipeline: the writer, Example encoding,
//! parsing a list of records, and record indexes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use numpy::PyArrayMethods;
use prost::Message;
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};
use tfpipe::example::proto::{
    BytesList, Example, Feature, FeatureList, FeatureLists, Features, FloatList, Int64List,
    SequenceExample, feature,
};
use tfpipe::tfrecord::{Compression, RecordSink, SinkError};
use tfpipe::{BatchParser, RecordError};
use tfpipe::{IndexError, RecordIndex, index_path};

use crate::convert::batch_dict;
use crate::errors::data_error;
use crate::schema::Schema;

fn record_error(py: Python<'_>, e: RecordError) -> PyErr {
    let message = e.to_string();
    if let Some(location) = e.location() {
        return data_error(py, message, Some(location));
    }
    match e.io_error().map(std::io::Error::kind) {
        Some(std::io::ErrorKind::NotFound) => PyFileNotFoundError::new_err(message),
        _ => PyOSError::new_err(message),
    }
}

fn sink_error(py: Python<'_>, e: SinkError) -> PyErr {
    match e {
        SinkError::Record(e) => record_error(py, e),
        SinkError::Storage(e) => crate::errors::storage_error(e),
    }
}

/// Writes a TFRecord file, or an object (`s3://`, `gs://`, `az://`, by
/// multipart upload); it appears under its name only when closed without an
/// error (see `tfpipe.TFRecordWriter`).
#[pyclass(frozen, module = "tfpipe._tfpipe")]
pub(crate) struct TFRecordWriter {
    writer: Mutex<Option<RecordSink>>,
    path: PathBuf,
}

impl TFRecordWriter {
    fn take(&self) -> Option<RecordSink> {
        self.writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

#[pymethods]
impl TFRecordWriter {
    #[new]
    #[pyo3(signature = (path, compression = None))]
    fn new(py: Python<'_>, path: PathBuf, compression: Option<&str>) -> PyResult<Self> {
        let compression = match compression.map(str::to_ascii_lowercase).as_deref() {
            None | Some("none") | Some("") => Compression::None,
            Some("gzip") => Compression::Gzip,
            Some("zlib") => Compression::Zlib,
            Some("auto") => Compression::from_path(&path),
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "compression={other:?}: expected None, \"GZIP\", \"ZLIB\" or \"auto\" (from the name)"
                )));
            }
        };
        let writer = py
            .detach(|| RecordSink::create(&path, compression))
            .map_err(|e| sink_error(py, e))?;
        Ok(TFRecordWriter {
            writer: Mutex::new(Some(writer)),
            path,
        })
    }

    /// Appends one record.
    fn write(&self, py: Python<'_>, record: &[u8]) -> PyResult<()> {
        let mut guard = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let writer = guard
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("write() on a closed TFRecordWriter"))?;
        writer.write_record(record).map_err(|e| record_error(py, e))
    }

    /// Records written so far.
    #[getter]
    fn records(&self) -> u64 {
        self.writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or(0, RecordSink::records)
    }

    /// The final path or object URL.
    #[getter]
    fn path(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    /// Flushes, syncs and renames the file into place. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        match self.take() {
            Some(writer) => py
                .detach(|| writer.finish())
                .map(drop)
                .map_err(|e| sink_error(py, e)),
            None => Ok(()),
        }
    }

    /// Drops what was written: no file appears under the final name.
    fn discard(&self, py: Python<'_>) {
        // Aborting an object's upload is a request to the server.
        let writer = self.take();
        py.detach(|| drop(writer));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes on success; on an exception discards the partial file.
    #[pyo3(signature = (exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if exc_type.is_some_and(|t| !t.is_none()) {
            self.discard(py);
        } else {
            self.close(py)?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("TFRecordWriter({:?})", self.path.display().to_string())
    }
}

/// One feature value from a Python object.
fn feature_of(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<Feature> {
    let kind = if let Ok(b) = value.cast::<PyBytes>() {
        feature::Kind::BytesList(BytesList {
            value: vec![b.as_bytes().to_vec()],
        })
    } else if let Ok(s) = value.cast::<PyString>() {
        feature::Kind::BytesList(BytesList {
            value: vec![s.to_cow()?.as_bytes().to_vec()],
        })
    } else if value.is_instance_of::<pyo3::types::PyBool>()
        || value.is_instance_of::<pyo3::types::PyInt>()
    {
        feature::Kind::Int64List(Int64List {
            value: vec![value.extract::<i64>()?],
        })
    } else if value.is_instance_of::<pyo3::types::PyFloat>() {
        feature::Kind::FloatList(FloatList {
            value: vec![value.extract::<f64>()? as f32],
        })
    } else if let Ok(list) = value
        .cast::<PyList>()
        .map(|l| l.clone().into_any())
        .or_else(|_| {
            value
                .cast::<pyo3::types::PyTuple>()
                .map(|t| t.clone().into_any())
        })
    {
        let first = list.get_item(0).ok();
        match first {
            // An empty list has no type: a Feature with no list set, which
            // TensorFlow reads as no values (a var-length feature's empty row;
            // a fixed-length feature's default).
            None => return Ok(Feature { kind: None }),
            Some(f) if f.is_instance_of::<PyBytes>() || f.is_instance_of::<PyString>() => {
                let mut out = Vec::new();
                for item in list.try_iter()? {
                    let item = item?;
                    out.push(match item.cast::<PyString>() {
                        Ok(s) => s.to_cow()?.as_bytes().to_vec(),
                        Err(_) => item.extract::<Vec<u8>>().map_err(|_| {
                            PyTypeError::new_err(format!(
                                "feature {name:?}: a list mixing bytes and other types"
                            ))
                        })?,
                    });
                }
                feature::Kind::BytesList(BytesList { value: out })
            }
            Some(_) => {
                let array = py.import("numpy")?.call_method1("asarray", (list,))?;
                return array_feature(py, name, &array);
            }
        }
    } else if value.hasattr("dtype")? {
        return array_feature(py, name, value);
    } else {
        return Err(PyTypeError::new_err(format!(
            "feature {name:?}: cannot encode {}: give bytes, str, int, float, a list of them or a numpy array",
            value.get_type().name()?
        )));
    };
    Ok(Feature { kind: Some(kind) })
}

/// A numpy array (or scalar): integers and booleans as `int64_list`, floats
/// as `float_list` (float32), bytes as `bytes_list`.
fn array_feature(py: Python<'_>, name: &str, array: &Bound<'_, PyAny>) -> PyResult<Feature> {
    let np = py.import("numpy")?;
    let kind: String = array.getattr("dtype")?.getattr("kind")?.extract()?;
    let flat = |dtype: &str| -> PyResult<Bound<'_, PyAny>> {
        np.call_method1("ascontiguousarray", (array, dtype))?
            .call_method0("ravel")
    };
    let kind = match kind.as_str() {
        "i" | "u" | "b" => {
            let a = flat("int64")?;
            let a = a.cast::<numpy::PyArray1<i64>>()?.readonly();
            feature::Kind::Int64List(Int64List {
                value: a.as_slice()?.to_vec(),
            })
        }
        "f" => {
            let a = flat("float32")?;
            let a = a.cast::<numpy::PyArray1<f32>>()?.readonly();
            feature::Kind::FloatList(FloatList {
                value: a.as_slice()?.to_vec(),
            })
        }
        "S" | "O" | "U" => {
            let items: Vec<Bound<'_, PyAny>> = array
                .call_method0("ravel")?
                .call_method0("tolist")?
                .extract()?;
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.push(match item.cast::<PyString>() {
                    Ok(s) => s.to_cow()?.as_bytes().to_vec(),
                    Err(_) => item.extract::<Vec<u8>>()?,
                });
            }
            feature::Kind::BytesList(BytesList { value: out })
        }
        other => {
            return Err(PyTypeError::new_err(format!(
                "feature {name:?}: numpy dtype kind {other:?} has no tf.train.Feature list \
                 (int64, float32 or bytes)"
            )));
        }
    };
    Ok(Feature { kind: Some(kind) })
}

/// `{name: value}` as `tf.train.Features`; `what` names the argument in errors.
fn features_of(py: Python<'_>, what: &str, features: &Bound<'_, PyDict>) -> PyResult<Features> {
    let mut map = BTreeMap::new();
    for (key, value) in features.iter() {
        let name: String = key
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("{what}: feature names must be str")))?;
        let feature = feature_of(py, &name, &value)?;
        map.insert(name, feature);
    }
    Ok(Features { feature: map })
}

/// A serialized `tf.train.Example` from `{name: value}`.
#[pyfunction]
pub(crate) fn encode_example<'py>(
    py: Python<'py>,
    features: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyBytes>> {
    let example = Example {
        features: Some(features_of(py, "encode_example", features)?),
    };
    Ok(PyBytes::new(py, &example.encode_to_vec()))
}

/// One feature list from a sequence of steps: a list or tuple of step
/// values, or an array whose first axis is the steps.
fn feature_list_of(py: Python<'_>, name: &str, steps: &Bound<'_, PyAny>) -> PyResult<FeatureList> {
    if steps.is_instance_of::<PyBytes>() || steps.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "feature list {name:?}: give a list of steps, not one {}",
            steps.get_type().name()?
        )));
    }
    let is_array = steps.hasattr("ndim")?;
    if is_array && steps.getattr("ndim")?.extract::<usize>()? == 0 {
        return Err(PyTypeError::new_err(format!(
            "feature list {name:?}: a 0-d array has no steps; give an array whose first axis is the steps"
        )));
    }
    let mut feature = Vec::new();
    for step in steps.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "feature list {name:?}: give a list of steps or an array, not {}",
            steps
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })? {
        feature.push(feature_of(py, name, &step?)?);
    }
    Ok(FeatureList { feature })
}

/// A serialized `tf.train.SequenceExample` from its context features and
/// feature lists.
#[pyfunction]
#[pyo3(signature = (context = None, feature_lists = None))]
pub(crate) fn encode_sequence_example<'py>(
    py: Python<'py>,
    context: Option<&Bound<'py, PyDict>>,
    feature_lists: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let context = context
        .map(|c| features_of(py, "encode_sequence_example: context", c))
        .transpose()?;
    let feature_lists = match feature_lists {
        Some(lists) => {
            let mut map = BTreeMap::new();
            for (key, steps) in lists.iter() {
                let name: String = key.extract().map_err(|_| {
                    PyTypeError::new_err("encode_sequence_example: feature list names must be str")
                })?;
                let list = feature_list_of(py, &name, &steps)?;
                map.insert(name, list);
            }
            Some(FeatureLists { feature_list: map })
        }
        None => None,
    };
    let example = SequenceExample {
        context,
        feature_lists,
    };
    Ok(PyBytes::new(py, &example.encode_to_vec()))
}

/// Parses serialized Examples as one batch, as the pipeline's `parse` does.
#[pyfunction]
pub(crate) fn parse_examples<'py>(
    py: Python<'py>,
    records: Vec<Vec<u8>>,
    schema: &Bound<'py, Schema>,
) -> PyResult<Bound<'py, PyDict>> {
    let schema = schema.get().inner.clone();
    let parsed = py.detach(|| {
        let mut parser = BatchParser::new(schema).map_err(Err)?;
        parser.parse(&records).map_err(Ok)
    });
    let batch = match parsed {
        Ok(batch) => batch,
        Err(Err(schema)) => return Err(crate::errors::schema_error(schema)),
        // The record number is the index in `records`; there is no file.
        Err(Ok(parse)) => {
            let location = tfpipe::Location {
                path: None,
                record: parse.record() as u64,
                offset: 0,
            };
            let err = data_error(py, parse.to_string(), Some(&location));
            err.value(py).setattr("offset", py.None())?;
            return Err(err);
        }
    };
    batch_dict(py, batch, true)
}

fn index_error(py: Python<'_>, e: IndexError) -> PyErr {
    let message = e.to_string();
    match e.location() {
        Some(location) => data_error(py, message, Some(location)),
        None => PyOSError::new_err(message),
    }
}

/// Writes `FILE.idx` beside each file (paths or globs); returns the index paths.
#[pyfunction]
pub(crate) fn index(py: Python<'_>, paths: Vec<String>) -> PyResult<Vec<PathBuf>> {
    let files = py
        .detach(|| tfpipe::storage::resolve(&paths))
        .map_err(|e| {
            let message = e.to_string();
            match e.io_kind() {
                std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(message),
                _ => PyOSError::new_err(message),
            }
        })?;
    let mut written = Vec::with_capacity(files.len());
    for file in files {
        let out = index_path(&file, None);
        py.detach(|| RecordIndex::build(&file).and_then(|index| index.write(&out)))
            .map_err(|e| index_error(py, e))?;
        written.push(out);
    }
    if written.is_empty() {
        return Err(PyRuntimeError::new_err("index(): no files given"));
    }
    Ok(written)
}
