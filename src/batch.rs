//! Columnar batches of parsed records.
//!
//! A [`Column`] is a (possibly ragged) tensor in TensorFlow's `RaggedTensor`
//! layout: flat `values`, zero or more levels of `row_splits` from the outside
//! in, and a dense `inner_shape` for each innermost element.
//!
//! | spec layout        | `row_splits`                    | `inner_shape` |
//! |--------------------|---------------------------------|---------------|
//! | fixed `[s...]`     | none                            | `[s...]`      |
//! | var-length         | `[values per record]`           | `[]`          |
//! | fixed sequence     | `[steps per record]`            | `[s...]`      |
//! | var sequence       | `[steps per record, values per step]` | `[]`    |
//!
//! Invariants: each `row_splits` level starts at 0, is non-decreasing, and has
//! one more entry than the rows of the level above (the batch's rows for the
//! first level); the last entry of the innermost level times
//! `product(inner_shape)` is the number of values.

use std::ops::Range;

/// The values of a column, in one contiguous buffer.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// 64-bit integers.
    Int64(Vec<i64>),
    /// 32-bit floats.
    Float32(Vec<f32>),
    /// Bytes as numbers (pixels).
    Uint8(Vec<u8>),
    /// From `raw_int16` features.
    Int16(Vec<i16>),
    /// From `raw_uint16` features.
    Uint16(Vec<u16>),
    /// From `raw_int32` features.
    Int32(Vec<i32>),
    /// From `raw_float64` features.
    Float64(Vec<f64>),
    /// Byte strings: value `i` is `data[offsets[i]..offsets[i + 1]]`.
    Bytes {
        /// Every value's bytes, one after another.
        data: Vec<u8>,
        /// `offsets[i]..offsets[i + 1]` is value `i` (one more offset than values).
        offsets: Vec<usize>,
    },
    /// Values at coordinates (a `SparseFeature`, TensorFlow's `SparseTensor` per
    /// record): element `i` is `values`' element `i`, at
    /// `indices[i * size.len()..(i + 1) * size.len()]` within its record's dense
    /// tensor of shape `size`. Within a record, indices are sorted and distinct.
    Sparse {
        /// The flat positions of the values, in row-major order.
        indices: Vec<usize>,
        /// The dense shape.
        size: Vec<usize>,
        /// The values at those positions.
        values: Box<Values>,
    },
}

impl Values {
    /// The number of elements (byte strings count one each).
    pub fn len(&self) -> usize {
        match self {
            Values::Int64(v) => v.len(),
            Values::Float32(v) => v.len(),
            Values::Uint8(v) => v.len(),
            Values::Int16(v) => v.len(),
            Values::Uint16(v) => v.len(),
            Values::Int32(v) => v.len(),
            Values::Float64(v) => v.len(),
            Values::Bytes { offsets, .. } => offsets.len().saturating_sub(1),
            Values::Sparse { values, .. } => values.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One feature's values for every record of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// The feature name.
    pub name: String,
    /// The flat values.
    pub values: Values,
    /// Ragged levels, outermost first (empty for a dense column).
    pub row_splits: Vec<Vec<usize>>,
    /// The dense shape of each innermost element.
    pub inner_shape: Vec<usize>,
}

/// Parsed records as columns, in the schema's feature order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Batch {
    /// The number of records.
    pub num_rows: usize,
    /// One column per schema feature.
    pub columns: Vec<Column>,
}

impl Batch {
    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }
}

impl Values {
    /// Whether `other` holds elements of the same type (for sparse values,
    /// sparse values of the same type).
    fn same_type(&self, other: &Values) -> bool {
        match (self, other) {
            (Values::Sparse { values: a, .. }, Values::Sparse { values: b, .. }) => a.same_type(b),
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }

    /// The `int64` values, if that is the type.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match self {
            Values::Int64(v) => Some(v),
            Values::Sparse { values, .. } => values.as_i64(),
            _ => None,
        }
    }

    /// The `float32` values, if that is the type.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Values::Float32(v) => Some(v),
            Values::Sparse { values, .. } => values.as_f32(),
            _ => None,
        }
    }

    /// The `uint8` values, if that is the type.
    pub fn as_u8(&self) -> Option<&[u8]> {
        match self {
            Values::Uint8(v) => Some(v),
            _ => None,
        }
    }

    /// Byte string `i`, if these are byte strings and `i` is in range.
    pub fn bytes(&self, i: usize) -> Option<&[u8]> {
        match self {
            Values::Bytes { data, offsets } => {
                let (&start, &end) = (offsets.get(i)?, offsets.get(i + 1)?);
                data.get(start..end)
            }
            Values::Sparse { values, .. } => values.bytes(i),
            _ => None,
        }
    }

    /// Elements `range` as new values (byte string offsets rebased to 0).
    ///
    /// # Panics
    /// If `range` is out of bounds.
    pub fn slice(&self, range: Range<usize>) -> Values {
        match self {
            Values::Int64(v) => Values::Int64(v[range].to_vec()),
            Values::Float32(v) => Values::Float32(v[range].to_vec()),
            Values::Uint8(v) => Values::Uint8(v[range].to_vec()),
            Values::Int16(v) => Values::Int16(v[range].to_vec()),
            Values::Uint16(v) => Values::Uint16(v[range].to_vec()),
            Values::Int32(v) => Values::Int32(v[range].to_vec()),
            Values::Float64(v) => Values::Float64(v[range].to_vec()),
            Values::Bytes { data, offsets } => {
                let offsets = &offsets[range.start..=range.end];
                let base = offsets[0];
                Values::Bytes {
                    data: data[base..offsets[offsets.len() - 1]].to_vec(),
                    offsets: offsets.iter().map(|o| o - base).collect(),
                }
            }
            Values::Sparse {
                indices,
                size,
                values,
            } => {
                let rank = size.len();
                Values::Sparse {
                    indices: indices[range.start * rank..range.end * rank].to_vec(),
                    size: size.clone(),
                    values: Box::new(values.slice(range)),
                }
            }
        }
    }

    /// Keeps the first `n` elements (all of them if there are fewer).
    pub fn truncate(&mut self, n: usize) {
        match self {
            Values::Int64(v) => v.truncate(n),
            Values::Float32(v) => v.truncate(n),
            Values::Uint8(v) => v.truncate(n),
            Values::Int16(v) => v.truncate(n),
            Values::Uint16(v) => v.truncate(n),
            Values::Int32(v) => v.truncate(n),
            Values::Float64(v) => v.truncate(n),
            Values::Bytes { data, offsets } => {
                offsets.truncate(n + 1);
                data.truncate(offsets.last().copied().unwrap_or(0));
            }
            Values::Sparse {
                indices,
                size,
                values,
            } => {
                indices.truncate(n.saturating_mul(size.len()));
                values.truncate(n);
            }
        }
    }

    /// Appends `other`'s elements; `false` (and nothing appended) if the types differ.
    fn extend(&mut self, other: &Values) -> bool {
        match (self, other) {
            (Values::Int64(a), Values::Int64(b)) => a.extend_from_slice(b),
            (Values::Float32(a), Values::Float32(b)) => a.extend_from_slice(b),
            (Values::Uint8(a), Values::Uint8(b)) => a.extend_from_slice(b),
            (Values::Int16(a), Values::Int16(b)) => a.extend_from_slice(b),
            (Values::Uint16(a), Values::Uint16(b)) => a.extend_from_slice(b),
            (Values::Int32(a), Values::Int32(b)) => a.extend_from_slice(b),
            (Values::Float64(a), Values::Float64(b)) => a.extend_from_slice(b),
            (
                Values::Bytes { data, offsets },
                Values::Bytes {
                    data: more,
                    offsets: more_offsets,
                },
            ) => {
                let base = data.len();
                data.extend_from_slice(more);
                offsets.extend(more_offsets.iter().skip(1).map(|o| o + base));
            }
            (
                Values::Sparse {
                    indices,
                    size,
                    values,
                },
                Values::Sparse {
                    indices: more_indices,
                    size: more_size,
                    values: more,
                },
            ) => {
                if size != more_size || !values.same_type(more) || !values.extend(more) {
                    return false;
                }
                indices.extend_from_slice(more_indices);
            }
            _ => return false,
        }
        true
    }
}

impl Column {
    /// Values per innermost element: `product(inner_shape)`.
    pub fn inner_len(&self) -> usize {
        self.inner_shape.iter().product()
    }

    /// The number of rows (records).
    pub fn num_rows(&self) -> usize {
        match self.row_splits.first() {
            Some(splits) => splits.len().saturating_sub(1),
            None => self.values.len() / self.inner_len().max(1),
        }
    }

    /// The `int64` values, if that is the type.
    pub fn as_i64(&self) -> Option<&[i64]> {
        self.values.as_i64()
    }

    /// The `float32` values, if that is the type.
    pub fn as_f32(&self) -> Option<&[f32]> {
        self.values.as_f32()
    }

    /// The `uint8` values, if that is the type.
    pub fn as_u8(&self) -> Option<&[u8]> {
        self.values.as_u8()
    }

    /// Byte string `i` (a flat value index), if these are byte strings.
    pub fn bytes(&self, i: usize) -> Option<&[u8]> {
        self.values.bytes(i)
    }

    /// The range of flat value indices holding row `row`, through every ragged level;
    /// `None` if `row` is out of range.
    ///
    /// ```
    /// # use tfpipe::{Column, Values};
    /// let tags = Column {
    ///     name: "counts".into(),
    ///     values: Values::Int64(vec![1, 2, 3]),
    ///     row_splits: vec![vec![0, 2, 2, 3]],
    ///     inner_shape: vec![],
    /// };
    /// assert_eq!(tags.row_range(0), Some(0..2));
    /// assert_eq!(tags.row_range(1), Some(2..2));
    /// assert_eq!(&tags.as_i64().unwrap()[tags.row_range(2).unwrap()], &[3]);
    /// ```
    pub fn row_range(&self, row: usize) -> Option<Range<usize>> {
        if row >= self.num_rows() {
            return None;
        }
        let (mut lo, mut hi) = (row, row + 1);
        for splits in &self.row_splits {
            (lo, hi) = (*splits.get(lo)?, *splits.get(hi)?);
        }
        let inner = self.inner_len();
        Some(lo * inner..hi * inner)
    }

    /// Drops every row from `rows` on, through every ragged level, keeping
    /// the buffers' capacity: how a parser rolls back a row that failed
    /// half-way (its values may be partly appended). Rows already complete
    /// are untouched; a column with fewer rows is left as it is.
    pub fn truncate_rows(&mut self, rows: usize) {
        let mut n = rows;
        for splits in &mut self.row_splits {
            splits.truncate(n + 1);
            n = splits.last().copied().unwrap_or(0);
        }
        let n = n.saturating_mul(self.inner_len());
        self.values.truncate(n);
    }

    /// Rows `rows` as a new column.
    ///
    /// # Panics
    /// If `rows` is out of bounds.
    pub fn slice(&self, rows: Range<usize>) -> Column {
        let (mut lo, mut hi) = (rows.start, rows.end);
        let mut row_splits = Vec::with_capacity(self.row_splits.len());
        for splits in &self.row_splits {
            let level = &splits[lo..=hi];
            let base = level[0];
            row_splits.push(level.iter().map(|s| s - base).collect());
            (lo, hi) = (level[0], level[level.len() - 1]);
        }
        let inner = self.inner_len();
        Column {
            name: self.name.clone(),
            values: self.values.slice(lo * inner..hi * inner),
            row_splits,
            inner_shape: self.inner_shape.clone(),
        }
    }

    /// For every flat value, its index in the padded dense tensor of shape
    /// [`dense_shape`](Self::dense_shape): `[row, ...]` as in TensorFlow's
    /// `SparseTensor.indices` (`[row, position]` for var-length, `[row, step, position]`
    /// for a var-length sequence, `[row, step, i...]` for a fixed sequence).
    pub fn sparse_indices(&self) -> Vec<Vec<usize>> {
        if let Values::Sparse { indices, size, .. } = &self.values {
            // `[row, index...]`: the row from the splits, the rest as stored.
            let rank = size.len().max(1);
            let mut out = Vec::with_capacity(self.values.len());
            if let Some(splits) = self.row_splits.first() {
                for (row, w) in splits.windows(2).enumerate() {
                    for i in w[0]..w[1] {
                        let mut index = vec![row];
                        index.extend_from_slice(
                            indices.get(i * rank..(i + 1) * rank).unwrap_or(&[]),
                        );
                        out.push(index);
                    }
                }
            }
            return out;
        }
        let inner = self.inner_len().max(1);
        // Position of each innermost element within its parent, level by level.
        let mut indices: Vec<Vec<usize>> = (0..self.num_rows()).map(|r| vec![r]).collect();
        for splits in &self.row_splits {
            let mut next = Vec::with_capacity(splits.last().copied().unwrap_or(0));
            for (parent, w) in indices.iter().zip(splits.windows(2)) {
                for pos in 0..w[1] - w[0] {
                    let mut index = parent.clone();
                    index.push(pos);
                    next.push(index);
                }
            }
            indices = next;
        }
        let mut out = Vec::with_capacity(indices.len() * inner);
        for index in indices {
            for flat in 0..inner {
                let mut full = index.clone();
                let mut rest = flat;
                let mut dims = Vec::with_capacity(self.inner_shape.len());
                for &d in self.inner_shape.iter().rev() {
                    dims.push(rest % d);
                    rest /= d;
                }
                full.extend(dims.into_iter().rev());
                out.push(full);
            }
        }
        out
    }

    /// A var-length column from TensorFlow's `SparseTensor` view of one
    /// (`VarLenFeature`): `values`, their `[row, position]` indices (row-major, each
    /// row's positions 0, 1, ...) and the number of rows (`dense_shape[0]`).
    /// The inverse of [`sparse_indices`](Self::sparse_indices) for var-length columns.
    ///
    /// ```
    /// # use tfpipe::{Column, Values};
    /// let column = Column::from_sparse("counts", Values::Int64(vec![5, 6, 7]), &[[0, 0], [0, 1], [2, 0]], 3).unwrap();
    /// assert_eq!(column.row_splits, vec![vec![0, 2, 2, 3]]);
    /// assert_eq!(column.sparse_indices(), vec![vec![0, 0], vec![0, 1], vec![2, 0]]);
    /// ```
    pub fn from_sparse(
        name: impl Into<String>,
        values: Values,
        indices: &[[usize; 2]],
        num_rows: usize,
    ) -> Result<Column, BatchError> {
        if values.len() != indices.len() {
            return Err(BatchError::Sparse(format!(
                "{} values but {} indices",
                values.len(),
                indices.len()
            )));
        }
        let mut splits = Vec::with_capacity(num_rows + 1);
        splits.push(0);
        for (i, &[row, position]) in indices.iter().enumerate() {
            if row >= num_rows || row + 1 < splits.len() {
                return Err(BatchError::Sparse(format!(
                    "index {i} [{row}, {position}]: rows must be ascending and below {num_rows}"
                )));
            }
            while splits.len() <= row {
                splits.push(i);
            }
            if position != i - splits[row] {
                return Err(BatchError::Sparse(format!(
                    "index {i} [{row}, {position}]: expected position {}",
                    i - splits[row]
                )));
            }
        }
        while splits.len() <= num_rows {
            splits.push(indices.len());
        }
        Ok(Column {
            name: name.into(),
            values,
            row_splits: vec![splits],
            inner_shape: Vec::new(),
        })
    }

    /// The shape of the padded dense tensor: `[rows, (max count per ragged level)..., inner_shape...]`.
    pub fn dense_shape(&self) -> Vec<usize> {
        let mut shape = vec![self.num_rows()];
        if let Values::Sparse { size, .. } = &self.values {
            shape.extend_from_slice(size);
            return shape;
        }
        for splits in &self.row_splits {
            shape.push(splits.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0));
        }
        shape.extend_from_slice(&self.inner_shape);
        shape
    }
}

/// Batches that cannot be concatenated, or columns that cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// Columns differ in count, name, type or layout.
    #[error("cannot concatenate batches: {0}")]
    Mismatch(String),
    /// A sparse (indices + values) view that is not a var-length column.
    #[error("invalid sparse tensor: {0}")]
    Sparse(String),
}

impl Batch {
    /// The index of the column named `name`.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// Rows `rows` as a new batch.
    ///
    /// # Panics
    /// If `rows` is out of bounds.
    pub fn slice(&self, rows: Range<usize>) -> Batch {
        assert!(
            rows.start <= rows.end && rows.end <= self.num_rows,
            "rows {rows:?} out of 0..{}",
            self.num_rows
        );
        Batch {
            num_rows: rows.len(),
            columns: self.columns.iter().map(|c| c.slice(rows.clone())).collect(),
        }
    }

    /// Keeps the first `rows` rows of every column (see
    /// [`Column::truncate_rows`]) and sets `num_rows` to match.
    pub fn truncate_rows(&mut self, rows: usize) {
        for column in &mut self.columns {
            column.truncate_rows(rows);
        }
        self.num_rows = self.num_rows.min(rows);
    }

    /// The rows of `batches`, in order, as one batch. All must have the same columns
    /// (names, types, ragged levels and inner shapes).
    pub fn concat(batches: &[Batch]) -> Result<Batch, BatchError> {
        let Some(first) = batches.first() else {
            return Ok(Batch::default());
        };
        let mut out = first.clone();
        for (b, batch) in batches.iter().enumerate().skip(1) {
            if batch.columns.len() != out.columns.len() {
                return Err(BatchError::Mismatch(format!(
                    "batch {b} has {} columns, batch 0 has {}",
                    batch.columns.len(),
                    out.columns.len()
                )));
            }
            for (column, more) in out.columns.iter_mut().zip(&batch.columns) {
                let same = column.name == more.name
                    && column.inner_shape == more.inner_shape
                    && column.row_splits.len() == more.row_splits.len()
                    && column.values.same_type(&more.values);
                if !same || !column.values.extend(&more.values) {
                    return Err(BatchError::Mismatch(format!(
                        "column {:?} of batch {b} differs from column {:?} of batch 0",
                        more.name, column.name
                    )));
                }
                for (splits, more_splits) in column.row_splits.iter_mut().zip(&more.row_splits) {
                    let base = splits.last().copied().unwrap_or(0);
                    splits.extend(more_splits.iter().skip(1).map(|s| s + base));
                }
            }
            out.num_rows += batch.num_rows;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rolling back to `rows` gives the same column as slicing the first
    /// `rows`, for dense, ragged, two-level and byte columns, even with a
    /// half-appended row after them.
    #[test]
    fn truncate_rows_matches_slice_with_a_partial_row_after() {
        let columns = [
            Column {
                name: "dense".into(),
                values: Values::Float32(vec![1., 2., 3., 4., 5., 6., 7.]),
                row_splits: vec![],
                inner_shape: vec![2],
            },
            Column {
                name: "ragged".into(),
                values: Values::Int64(vec![1, 2, 3, 4, 5]),
                row_splits: vec![vec![0, 2, 2, 4, 5]],
                inner_shape: vec![],
            },
            Column {
                name: "seq".into(),
                values: Values::Int64(vec![1, 2, 3, 4, 5, 6]),
                row_splits: vec![vec![0, 1, 3, 4], vec![0, 2, 2, 5, 6]],
                inner_shape: vec![],
            },
            Column {
                name: "bytes".into(),
                values: Values::Bytes {
                    data: b"abcdefg".to_vec(),
                    offsets: vec![0, 1, 3, 6, 7],
                },
                row_splits: vec![vec![0, 1, 3, 4]],
                inner_shape: vec![],
            },
        ];
        for column in columns {
            for rows in 0..=2 {
                let mut cut = column.clone();
                cut.truncate_rows(rows);
                assert_eq!(cut, column.slice(0..rows), "{} to {rows}", column.name);
            }
        }
    }

    #[test]
    fn from_sparse_rejects_bad_indices() {
        let values = || Values::Int64(vec![1, 2]);
        assert!(Column::from_sparse("x", values(), &[[0, 0]], 1).is_err());
        assert!(Column::from_sparse("x", values(), &[[1, 0], [0, 0]], 2).is_err());
        assert!(Column::from_sparse("x", values(), &[[0, 0], [0, 2]], 2).is_err());
        assert!(Column::from_sparse("x", values(), &[[0, 0], [2, 0]], 2).is_err());
        let ok = Column::from_sparse("x", values(), &[[1, 0], [1, 1]], 3).unwrap();
        assert_eq!(ok.row_splits, vec![vec![0, 0, 2, 2]]);
        assert_eq!(ok.dense_shape(), vec![3, 2]);
        assert_eq!(ok.row_range(1), Some(0..2));
        assert_eq!(ok.row_range(3), None);
    }

    #[test]
    fn ragged_slice_concat_and_indices() {
        // Two rows of a var-length sequence: [[1, 2], []], [[3]].
        let column = Column {
            name: "t".into(),
            values: Values::Int64(vec![1, 2, 3]),
            row_splits: vec![vec![0, 2, 3], vec![0, 2, 2, 3]],
            inner_shape: vec![],
        };
        assert_eq!(column.dense_shape(), vec![2, 2, 2]);
        assert_eq!(
            column.sparse_indices(),
            vec![vec![0, 0, 0], vec![0, 0, 1], vec![1, 0, 0]]
        );
        assert_eq!(column.row_range(1), Some(2..3));
        let second = column.slice(1..2);
        assert_eq!(second.row_splits, vec![vec![0, 1], vec![0, 1]]);
        assert_eq!(second.as_i64(), Some(&[3][..]));
        let batch = Batch {
            num_rows: 2,
            columns: vec![column],
        };
        let back = Batch::concat(&[batch.slice(0..1), batch.slice(1..2)]).unwrap();
        assert_eq!(back, batch);
        let other = Batch {
            num_rows: 0,
            columns: vec![],
        };
        assert!(Batch::concat(&[batch, other]).is_err());
        // Fixed inner shapes index every element.
        let fixed = Column {
            name: "f".into(),
            values: Values::Float32(vec![0.0; 8]),
            row_splits: vec![vec![0, 0, 2]],
            inner_shape: vec![2, 2],
        };
        assert_eq!(fixed.dense_shape(), vec![2, 2, 2, 2]);
        assert_eq!(fixed.sparse_indices()[7], vec![1, 1, 1, 1]);
        let bytes = Values::Bytes {
            data: b"abcd".to_vec(),
            offsets: vec![0, 1, 1, 4],
        };
        assert_eq!(bytes.bytes(2), Some(&b"bcd"[..]));
        assert_eq!(bytes.bytes(3), None);
        assert_eq!(
            bytes.slice(1..3),
            Values::Bytes {
                data: b"bcd".to_vec(),
                offsets: vec![0, 0, 3]
            }
        );
    }
}
