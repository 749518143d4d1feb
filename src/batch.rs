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

/// The values of a column, in one contiguous buffer.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    Int64(Vec<i64>),
    Float32(Vec<f32>),
    Uint8(Vec<u8>),
    /// Byte strings: value `i` is `data[offsets[i]..offsets[i + 1]]`.
    Bytes {
        data: Vec<u8>,
        offsets: Vec<usize>,
    },
}

impl Values {
    /// The number of elements (byte strings count one each).
    pub fn len(&self) -> usize {
        match self {
            Values::Int64(v) => v.len(),
            Values::Float32(v) => v.len(),
            Values::Uint8(v) => v.len(),
            Values::Bytes { offsets, .. } => offsets.len().saturating_sub(1),
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
