//! Engine elements to Python objects.
//!
//! Numeric values leave Rust by moving their `Vec` into numpy (rust-numpy's
//! `into_pyarray`, shaped on the way through an `ndarray::ArrayD`): no copy,
//! and the array's base is the Rust owner, never a view of a buffer the
//! engine reuses. Bytes become Python `bytes` (Python must own them). A
//! batched column keeps the batch as its first dimension; a record parsed on
//! its own has none.

use numpy::IntoPyArray;
use numpy::ndarray::{ArrayD, IxDyn};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple, PyType};
use tfpipe::{Batch, Column, Values};

use crate::iter::Elem;

/// A Python object for an element.
pub(crate) fn elem(py: Python<'_>, elem: Elem) -> PyResult<Bound<'_, PyAny>> {
    match elem {
        Elem::Record(record) => Ok(PyBytes::new(py, &record).into_any()),
        Elem::Records(records) => {
            let items = records.iter().map(|r| PyBytes::new(py, r));
            Ok(PyList::new(py, items)?.into_any())
        }
        Elem::Batch { batch, batched } => Ok(batch_dict(py, batch, batched)?.into_any()),
        Elem::Tuple(elems) => {
            let items = elems
                .into_iter()
                .map(|e| self::elem(py, e))
                .collect::<PyResult<Vec<_>>>()?;
            Ok(PyTuple::new(py, items)?.into_any())
        }
    }
}

/// `{feature name: array, Ragged, Sparse or bytes}` for a batch.
pub(crate) fn batch_dict(
    py: Python<'_>,
    batch: Batch,
    batched: bool,
) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    let rows = batch.num_rows;
    for column in batch.columns {
        let name = column.name.clone();
        dict.set_item(name, column_object(py, column, rows, batched)?)?;
    }
    Ok(dict)
}

fn column_object(
    py: Python<'_>,
    column: Column,
    rows: usize,
    batched: bool,
) -> PyResult<Bound<'_, PyAny>> {
    if matches!(column.values, Values::Sparse { .. }) {
        return sparse(py, column, batched);
    }
    if column.row_splits.is_empty() {
        let mut shape = Vec::with_capacity(column.inner_shape.len() + 1);
        if batched {
            shape.push(rows);
        }
        shape.extend_from_slice(&column.inner_shape);
        return values_object(py, column.values, &shape);
    }
    // Ragged: the innermost values, then one Ragged per level, innermost first.
    let levels = column.row_splits;
    let inner = levels.last().and_then(|s| s.last()).copied().unwrap_or(0);
    let mut shape = vec![inner];
    shape.extend_from_slice(&column.inner_shape);
    let mut object = values_object(py, column.values, &shape)?;
    let ragged = ragged_type(py)?;
    // A record on its own has one row: its outermost level is dropped.
    let keep = if batched {
        levels.len()
    } else {
        levels.len() - 1
    };
    for splits in levels.into_iter().rev().take(keep) {
        let splits: Vec<i64> = splits.into_iter().map(|s| s as i64).collect();
        object = ragged.call1((object, splits.into_pyarray(py)))?;
    }
    Ok(object)
}

/// An array of `shape` (or nested lists of bytes) owning `values`.
fn values_object<'py>(
    py: Python<'py>,
    values: Values,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    fn array<'py, T: numpy::Element>(
        py: Python<'py>,
        v: Vec<T>,
        shape: &[usize],
    ) -> PyResult<Bound<'py, PyAny>> {
        let a = ArrayD::from_shape_vec(IxDyn(shape), v)
            .map_err(|e| PyValueError::new_err(format!("internal: column shape: {e}")))?;
        Ok(a.into_pyarray(py).into_any())
    }
    match values {
        Values::Int64(v) => array(py, v, shape),
        Values::Float32(v) => array(py, v, shape),
        Values::Uint8(v) => array(py, v, shape),
        Values::Int16(v) => array(py, v, shape),
        Values::Uint16(v) => array(py, v, shape),
        Values::Int32(v) => array(py, v, shape),
        Values::Float64(v) => array(py, v, shape),
        Values::Bytes { data, offsets } => {
            let items: Vec<Bound<'py, PyAny>> = offsets
                .windows(2)
                .map(|w| PyBytes::new(py, &data[w[0]..w[1]]).into_any())
                .collect();
            nest(py, items, shape)
        }
        Values::Sparse { .. } => Err(PyValueError::new_err("internal: nested sparse values")),
    }
}

/// Nested lists of `shape` from a flat list (a scalar for an empty shape).
fn nest<'py>(
    py: Python<'py>,
    mut items: Vec<Bound<'py, PyAny>>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    match shape {
        [] => items
            .pop()
            .ok_or_else(|| PyValueError::new_err("internal: empty scalar")),
        [_] => Ok(PyList::new(py, items)?.into_any()),
        [n, rest @ ..] => {
            let per = rest.iter().product::<usize>();
            let mut out = Vec::with_capacity(*n);
            let mut items = items.into_iter();
            for _ in 0..*n {
                let chunk: Vec<_> = items.by_ref().take(per).collect();
                out.push(nest(py, chunk, rest)?);
            }
            Ok(PyList::new(py, out)?.into_any())
        }
    }
}

/// `tfpipe.Sparse(indices, values, dense_shape)`, TensorFlow's layout.
fn sparse(py: Python<'_>, column: Column, batched: bool) -> PyResult<Bound<'_, PyAny>> {
    let indices = column.sparse_indices();
    let mut dense_shape: Vec<i64> = column.dense_shape().into_iter().map(|d| d as i64).collect();
    let skip = usize::from(!batched);
    if !batched && !dense_shape.is_empty() {
        dense_shape.remove(0);
    }
    let width = indices
        .first()
        .map_or(dense_shape.len(), |i| i.len() - skip);
    let flat: Vec<i64> = indices
        .iter()
        .flat_map(|i| i[skip..].iter().map(|&x| x as i64))
        .collect();
    let nnz = indices.len();
    let indices = ArrayD::from_shape_vec(IxDyn(&[nnz, width]), flat)
        .map_err(|e| PyValueError::new_err(format!("internal: sparse indices: {e}")))?
        .into_pyarray(py);
    let Values::Sparse { values, .. } = column.values else {
        return Err(PyValueError::new_err("internal: not a sparse column"));
    };
    let values = values_object(py, *values, &[nnz])?;
    sparse_type(py)?.call1((indices, values, dense_shape.into_pyarray(py)))
}

fn python_type<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, "tfpipe._types", name)
}

fn ragged_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static RAGGED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    python_type(py, &RAGGED, "Ragged")
}

fn sparse_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static SPARSE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    python_type(py, &SPARSE, "Sparse")
}
