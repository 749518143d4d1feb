//! `padded_batch`: batch variable-length rows into one dense, padded block,
//! for `Vec` elements ([`PaddedBatch`]) and for the ragged columns of
//! parsed batches ([`Padding`]).
//!
//! Padding a column copies each row's values and appends pad values up to
//! the width; nothing is allocated per row, and a padded column larger than
//! [`MAX_PADDED_VALUES`] is refused before its buffer is allocated.

use std::ops::Range;

use super::{Clock, Event, Pipeline, PipelineError};
use crate::batch::{Batch, Column, Values};

/// The width rows are padded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaddedShape {
    /// The longest row of each batch.
    BatchMax,
    /// This width; a longer row is an `Err` item.
    Fixed(usize),
}

/// A batch of rows padded to one width, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct PaddedBatch<E> {
    /// `rows * width` values; row `i` is `values[i * width..(i + 1) * width]`.
    pub values: Vec<E>,
    /// Each row's length before padding.
    pub lengths: Vec<usize>,
    /// The padded width.
    pub width: usize,
}

impl<E> PaddedBatch<E> {
    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.lengths.len()
    }

    /// Row `i`, padding included.
    pub fn row(&self, i: usize) -> &[E] {
        &self.values[i * self.width..(i + 1) * self.width]
    }
}

impl<E: Clone + Send + Sync + 'static> Pipeline<Vec<E>> {
    /// Batches `size` variable-length rows, padding each with `padding` to
    /// `shape` (`tf.data`'s `padded_batch`). Epochs and errors behave as in
    /// [`batch`](Pipeline::batch).
    ///
    /// ```
    /// use tfpipe::pipeline::{PaddedShape, Pipeline};
    /// let b: Vec<_> = Pipeline::from_vec(vec![vec![1, 2], vec![3], vec![4, 5, 6]])
    ///     .padded_batch(2, PaddedShape::BatchMax, 0, false)
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(b[0].values, [1, 2, 3, 0]);
    /// assert_eq!(b[0].lengths, [2, 1]);
    /// assert_eq!(b[1].values, [4, 5, 6]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn padded_batch(
        self,
        size: usize,
        shape: PaddedShape,
        padding: E,
        drop_remainder: bool,
    ) -> Pipeline<PaddedBatch<E>> {
        let batched = self.batch_with(size, drop_remainder);
        batched.then("padded_batch", move |_env, mut up, counters| {
            let padding = padding.clone();
            Box::new(std::iter::from_fn(move || {
                let mut clock = Clock::start();
                let out = match clock.pull(&mut up)? {
                    Event::Item(Ok(rows)) => {
                        counters.add_in(rows.len() as u64, 0);
                        let longest = rows.iter().map(Vec::len).max().unwrap_or(0);
                        let width = match shape {
                            PaddedShape::BatchMax => Ok(longest),
                            PaddedShape::Fixed(w) if longest <= w => Ok(w),
                            PaddedShape::Fixed(w) => Err(PipelineError::Element {
                                stage: counters.name().to_string(),
                                message: format!(
                                    "a row of length {longest} exceeds the padded shape {w}"
                                ),
                            }),
                        };
                        match width {
                            Ok(width) => {
                                let mut values = Vec::with_capacity(rows.len() * width);
                                let mut lengths = Vec::with_capacity(rows.len());
                                for row in rows {
                                    lengths.push(row.len());
                                    let pad = width - row.len();
                                    values.extend(row);
                                    values.extend(std::iter::repeat_n(padding.clone(), pad));
                                }
                                counters.add_out(1, 0);
                                Event::Item(Ok(PaddedBatch {
                                    values,
                                    lengths,
                                    width,
                                }))
                            }
                            Err(err) => {
                                counters.add_error();
                                Event::Item(Err(err))
                            }
                        }
                    }
                    Event::Item(Err(err)) => Event::Item(Err(err)),
                    Event::EpochEnd(e) => Event::EpochEnd(e),
                };
                clock.finish(&counters);
                Some(out)
            }))
        })
    }
}

/// A value to pad with, converted to each padded column's type (`as` casts
/// between numbers; byte strings pad only byte-string columns).
#[derive(Debug, Clone, PartialEq)]
pub enum PadValue {
    /// An integer (for float columns, the same number as a float).
    Int(i64),
    /// A float (for integer columns, truncated toward zero).
    Float(f64),
    /// A byte string, for byte-string columns.
    Bytes(Vec<u8>),
}

impl Default for PadValue {
    /// Zero (for byte-string columns: the empty string).
    fn default() -> PadValue {
        PadValue::Int(0)
    }
}

/// What a padded column gets beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PadInfo {
    /// Nothing. The default.
    #[default]
    None,
    /// `NAME_length`: each row's length before padding (int64, `[rows]`; for
    /// a two-level column, the steps per row).
    Lengths,
    /// `NAME_mask`: 1 for a real value, 0 for padding (uint8, the padded
    /// column's shape without its fixed inner dimensions).
    Mask,
}

/// How one column is padded.
#[derive(Debug, Clone, PartialEq)]
pub struct PadSpec {
    /// The width of the outer ragged dimension. By default
    /// [`PaddedShape::BatchMax`].
    pub shape: PaddedShape,
    /// The width of a second ragged level (the values of each step of a
    /// var-length sequence). By default [`PaddedShape::BatchMax`], the
    /// batch's longest step.
    pub step_shape: PaddedShape,
    /// The pad value. By default zero (the empty byte string).
    pub value: PadValue,
    /// Lengths or a mask beside the column. By default none.
    pub info: PadInfo,
}

impl Default for PadSpec {
    fn default() -> PadSpec {
        PadSpec {
            shape: PaddedShape::BatchMax,
            step_shape: PaddedShape::BatchMax,
            value: PadValue::default(),
            info: PadInfo::None,
        }
    }
}

/// How the ragged columns of a parsed [`Batch`] become dense: one
/// [`PadSpec`] for every column, with per-feature overrides
/// (`tf.data`'s `padded_shapes` and `padding_values`).
///
/// Dense columns are left as they are; so are sparse ones (TensorFlow's
/// `padded_batch` cannot pad a `SparseTensor` either). A var-length column
/// `[rows][len]` becomes `[rows, width]`; a fixed sequence `[rows][steps, s...]`
/// becomes `[rows, width, s...]`; a var-length sequence becomes
/// `[rows, width, longest step]`.
///
/// ```
/// use tfpipe::pipeline::{PadValue, PaddedShape, Padding};
/// use tfpipe::{Batch, Column, Values};
/// let batch = Batch {
///     num_rows: 2,
///     columns: vec![Column {
///         name: "tokens".into(),
///         values: Values::Int64(vec![5, 6, 7]),
///         row_splits: vec![vec![0, 2, 3]],
///         inner_shape: vec![],
///     }],
/// };
/// let padded = Padding::new().value(PadValue::Int(-1)).lengths().apply(&batch)?;
/// let tokens = padded.column("tokens").unwrap();
/// assert_eq!(tokens.as_i64(), Some(&[5, 6, 7, -1][..]));
/// assert_eq!(tokens.inner_shape, [2]);
/// assert_eq!(padded.column("tokens_length").unwrap().as_i64(), Some(&[2, 1][..]));
/// let fixed = Padding::new().shape(PaddedShape::Fixed(3)).mask().apply(&batch)?;
/// assert_eq!(fixed.column("tokens_mask").unwrap().as_u8(), Some(&[1, 1, 0, 1, 0, 0][..]));
/// # Ok::<(), tfpipe::pipeline::PadError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Padding {
    default: PadSpec,
    features: Vec<(String, PadSpec)>,
}

/// Why a batch could not be padded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PadError {
    /// A row is longer than the fixed padded width.
    #[error(
        "feature {feature:?}: row {row} has length {length}, longer than the padded shape {width}"
    )]
    TooLong {
        /// The feature.
        feature: String,
        /// The row within the batch.
        row: usize,
        /// The row's length.
        length: usize,
        /// The fixed padded width.
        width: usize,
    },
    /// A step of a var-length sequence holds more values than the fixed
    /// padded step width.
    #[error(
        "feature {feature:?}: a step of row {row} has {length} values, more than the padded step shape {width}"
    )]
    StepTooLong {
        /// The feature.
        feature: String,
        /// The row within the batch.
        row: usize,
        /// The step's values.
        length: usize,
        /// The fixed padded step width.
        width: usize,
    },
    /// The pad value does not fit the column's type.
    #[error("feature {feature:?}: cannot pad {kind} values with {value:?}")]
    Value {
        /// The feature.
        feature: String,
        /// The column's value type.
        kind: &'static str,
        /// The pad value given.
        value: PadValue,
    },
    /// A padded shape too large to allocate.
    #[error("feature {feature:?}: padding to {elements} values is too large")]
    TooLarge {
        /// The feature.
        feature: String,
        /// The values the padded column would hold.
        elements: usize,
    },
}

/// The most values one padded column may hold (2^31): a larger one is a
/// mistake in the padded shape, refused before allocating.
pub const MAX_PADDED_VALUES: usize = 1 << 31;

impl Padding {
    /// Every ragged column to the batch's longest row, with zeros, nothing beside.
    pub fn new() -> Padding {
        Padding::default()
    }

    /// The width for every column without an override.
    pub fn shape(mut self, shape: PaddedShape) -> Padding {
        self.default.shape = shape;
        self
    }

    /// The width of the second ragged level (a var-length sequence's
    /// steps) for every column without an override.
    pub fn step_shape(mut self, shape: PaddedShape) -> Padding {
        self.default.step_shape = shape;
        self
    }

    /// The pad value for every column without an override.
    pub fn value(mut self, value: PadValue) -> Padding {
        self.default.value = value;
        self
    }

    /// Adds `NAME_length` beside every padded column without an override.
    pub fn lengths(mut self) -> Padding {
        self.default.info = PadInfo::Lengths;
        self
    }

    /// Adds `NAME_mask` beside every padded column without an override.
    pub fn mask(mut self) -> Padding {
        self.default.info = PadInfo::Mask;
        self
    }

    /// Pads the column `name` as `spec` says.
    pub fn feature(mut self, name: impl Into<String>, spec: PadSpec) -> Padding {
        let name = name.into();
        self.features.retain(|(n, _)| *n != name);
        self.features.push((name, spec));
        self
    }

    /// The spec for column `name`.
    pub fn spec(&self, name: &str) -> &PadSpec {
        self.features
            .iter()
            .find(|(n, _)| n == name)
            .map_or(&self.default, |(_, s)| s)
    }

    /// `batch` with its ragged columns padded dense (and the lengths or
    /// masks asked for placed right after their columns).
    pub fn apply(&self, batch: &Batch) -> Result<Batch, PadError> {
        let mut columns = Vec::with_capacity(batch.columns.len());
        for column in &batch.columns {
            let spec = self.spec(&column.name);
            if column.row_splits.is_empty() || matches!(column.values, Values::Sparse { .. }) {
                columns.push(column.clone());
                continue;
            }
            let (padded, info) = pad_column(column, spec)?;
            columns.push(padded);
            columns.extend(info);
        }
        Ok(Batch {
            num_rows: batch.num_rows,
            columns,
        })
    }
}

/// Lengths of each item of one ragged level.
fn lengths(splits: &[usize]) -> impl Iterator<Item = usize> + '_ {
    splits.windows(2).map(|w| w[1] - w[0])
}

/// The width a second ragged level pads to: its longest step, or a fixed
/// width no step may exceed (the error names the step's row).
fn step_width(
    name: &str,
    outer: &[usize],
    steps: &[usize],
    shape: PaddedShape,
) -> Result<usize, PadError> {
    let longest = lengths(steps).max().unwrap_or(0);
    let PaddedShape::Fixed(width) = shape else {
        return Ok(longest);
    };
    if let Some((step, length)) = lengths(steps).enumerate().find(|(_, l)| *l > width) {
        return Err(PadError::StepTooLong {
            feature: name.to_string(),
            row: outer
                .partition_point(|&start| start <= step)
                .saturating_sub(1),
            length,
            width,
        });
    }
    Ok(width)
}

/// One ragged column, padded; with its lengths or mask column.
fn pad_column(column: &Column, spec: &PadSpec) -> Result<(Column, Option<Column>), PadError> {
    let name = &column.name;
    let outer = &column.row_splits[0];
    let rows = outer.len().saturating_sub(1);
    let longest = lengths(outer).max().unwrap_or(0);
    let width = match spec.shape {
        PaddedShape::BatchMax => longest,
        PaddedShape::Fixed(width) => {
            if let Some((row, length)) = lengths(outer).enumerate().find(|(_, l)| *l > width) {
                return Err(PadError::TooLong {
                    feature: name.clone(),
                    row,
                    length,
                    width,
                });
            }
            width
        }
    };
    let step_width = match column.row_splits.get(1) {
        Some(steps) => step_width(name, outer, steps, spec.step_shape)?,
        None => 1,
    };
    let inner = column.inner_len();
    let cells = rows.saturating_mul(width).saturating_mul(step_width);
    let total = cells.saturating_mul(inner.max(1));
    if total > MAX_PADDED_VALUES {
        return Err(PadError::TooLarge {
            feature: name.clone(),
            elements: total,
        });
    }
    let pad = pad_unit(column, &spec.value)?;
    let mut values = empty_like(&column.values, total);
    let mut mask = Vec::with_capacity(if spec.info == PadInfo::Mask { cells } else { 0 });
    for row in 0..rows {
        let steps = outer[row]..outer[row + 1];
        match column.row_splits.get(1) {
            None => {
                let n = steps.len();
                push_range(
                    &mut values,
                    &column.values,
                    steps.start * inner..steps.end * inner,
                );
                push_pad(&mut values, &pad, (width - n) * inner);
                if spec.info == PadInfo::Mask {
                    mask.extend(std::iter::repeat_n(1u8, n));
                    mask.extend(std::iter::repeat_n(0u8, width - n));
                }
            }
            Some(inner_splits) => {
                for step in steps.clone() {
                    let (a, b) = (inner_splits[step], inner_splits[step + 1]);
                    push_range(&mut values, &column.values, a * inner..b * inner);
                    push_pad(&mut values, &pad, (step_width - (b - a)) * inner);
                    if spec.info == PadInfo::Mask {
                        mask.extend(std::iter::repeat_n(1u8, b - a));
                        mask.extend(std::iter::repeat_n(0u8, step_width - (b - a)));
                    }
                }
                let missing = width - steps.len();
                push_pad(&mut values, &pad, missing * step_width * inner);
                if spec.info == PadInfo::Mask {
                    mask.extend(std::iter::repeat_n(0u8, missing * step_width));
                }
            }
        }
    }
    let mut inner_shape = vec![width];
    if column.row_splits.len() > 1 {
        inner_shape.push(step_width);
    }
    let info_shape = inner_shape.clone();
    inner_shape.extend_from_slice(&column.inner_shape);
    let info = match spec.info {
        PadInfo::None => None,
        PadInfo::Lengths => Some(Column {
            name: format!("{name}_length"),
            values: Values::Int64(lengths(outer).map(|l| l as i64).collect()),
            row_splits: Vec::new(),
            inner_shape: Vec::new(),
        }),
        PadInfo::Mask => Some(Column {
            name: format!("{name}_mask"),
            values: Values::Uint8(mask),
            row_splits: Vec::new(),
            inner_shape: info_shape,
        }),
    };
    let padded = Column {
        name: name.clone(),
        values,
        row_splits: Vec::new(),
        inner_shape,
    };
    Ok((padded, info))
}

/// The pad value as one value of `column`'s type.
pub(crate) fn pad_unit(column: &Column, value: &PadValue) -> Result<Values, PadError> {
    let mismatch = |kind| PadError::Value {
        feature: column.name.clone(),
        kind,
        value: value.clone(),
    };
    let (int, float) = match value {
        PadValue::Int(i) => (*i, *i as f64),
        PadValue::Float(f) => (*f as i64, *f),
        PadValue::Bytes(b) => {
            return match &column.values {
                Values::Bytes { .. } => Ok(Values::Bytes {
                    data: b.clone(),
                    offsets: vec![0, b.len()],
                }),
                _ => Err(mismatch("numeric")),
            };
        }
    };
    Ok(match &column.values {
        Values::Int64(_) => Values::Int64(vec![int]),
        Values::Float32(_) => Values::Float32(vec![float as f32]),
        Values::Uint8(_) => Values::Uint8(vec![int as u8]),
        Values::Int16(_) => Values::Int16(vec![int as i16]),
        Values::Uint16(_) => Values::Uint16(vec![int as u16]),
        Values::Int32(_) => Values::Int32(vec![int as i32]),
        Values::Float64(_) => Values::Float64(vec![float]),
        // Zero pads a byte string column with the empty string.
        Values::Bytes { .. } if int == 0 && float == 0.0 => Values::Bytes {
            data: Vec::new(),
            offsets: vec![0, 0],
        },
        Values::Bytes { .. } => return Err(mismatch("byte string")),
        Values::Sparse { .. } => return Err(mismatch("sparse")),
    })
}

/// Empty values of `like`'s type, with room for `capacity`.
pub(crate) fn empty_like(like: &Values, capacity: usize) -> Values {
    match like {
        Values::Int64(_) => Values::Int64(Vec::with_capacity(capacity)),
        Values::Float32(_) => Values::Float32(Vec::with_capacity(capacity)),
        Values::Uint8(_) => Values::Uint8(Vec::with_capacity(capacity)),
        Values::Int16(_) => Values::Int16(Vec::with_capacity(capacity)),
        Values::Uint16(_) => Values::Uint16(Vec::with_capacity(capacity)),
        Values::Int32(_) => Values::Int32(Vec::with_capacity(capacity)),
        Values::Float64(_) => Values::Float64(Vec::with_capacity(capacity)),
        Values::Bytes { .. } => Values::Bytes {
            data: Vec::new(),
            offsets: {
                let mut o = Vec::with_capacity(capacity + 1);
                o.push(0);
                o
            },
        },
        Values::Sparse { size, values, .. } => Values::Sparse {
            indices: Vec::new(),
            size: size.clone(),
            values: Box::new(empty_like(values, capacity)),
        },
    }
}

/// Appends `src[range]` to `dst` (same type, checked by the caller).
pub(crate) fn push_range(dst: &mut Values, src: &Values, range: Range<usize>) {
    match (dst, src) {
        (Values::Int64(d), Values::Int64(s)) => d.extend_from_slice(&s[range]),
        (Values::Float32(d), Values::Float32(s)) => d.extend_from_slice(&s[range]),
        (Values::Uint8(d), Values::Uint8(s)) => d.extend_from_slice(&s[range]),
        (Values::Int16(d), Values::Int16(s)) => d.extend_from_slice(&s[range]),
        (Values::Uint16(d), Values::Uint16(s)) => d.extend_from_slice(&s[range]),
        (Values::Int32(d), Values::Int32(s)) => d.extend_from_slice(&s[range]),
        (Values::Float64(d), Values::Float64(s)) => d.extend_from_slice(&s[range]),
        (
            Values::Bytes { data, offsets },
            Values::Bytes {
                data: sd,
                offsets: so,
            },
        ) => {
            let (a, b) = (so[range.start], so[range.end]);
            let base = data.len();
            data.extend_from_slice(&sd[a..b]);
            offsets.extend(so[range.start + 1..=range.end].iter().map(|o| o - a + base));
        }
        (dst, src) => {
            // Sparse values are never padded; other pairs are the caller's bug.
            debug_assert!(false, "push_range: {dst:?} from {src:?}");
        }
    }
}

/// Appends `n` copies of the one value in `unit` (same type as `dst`).
pub(crate) fn push_pad(dst: &mut Values, unit: &Values, n: usize) {
    if n == 0 {
        return;
    }
    match (dst, unit) {
        (Values::Int64(d), Values::Int64(u)) => d.extend(std::iter::repeat_n(u[0], n)),
        (Values::Float32(d), Values::Float32(u)) => d.extend(std::iter::repeat_n(u[0], n)),
        (Values::Uint8(d), Values::Uint8(u)) => d.extend(std::iter::repeat_n(u[0], n)),
        (Values::Int16(d), Values::Int16(u)) => d.extend(std::iter::repeat_n(u[0], n)),
        (Values::Uint16(d), Values::Uint16(u)) => d.extend(std::iter::repeat_n(u[0], n)),
        (Values::Int32(d), Values::Int32(u)) => d.extend(std::iter::repeat_n(u[0], n)),
        (Values::Float64(d), Values::Float64(u)) => d.extend(std::iter::repeat_n(u[0], n)),
        (dst @ Values::Bytes { .. }, unit @ Values::Bytes { .. }) => {
            for _ in 0..n {
                push_range(dst, unit, 0..1);
            }
        }
        (dst, unit) => debug_assert!(false, "push_pad: {dst:?} with {unit:?}"),
    }
}

impl Pipeline<Batch> {
    /// Regroups the rows of incoming parsed batches into batches of `size`
    /// rows ([`rebatch`](Pipeline::rebatch)) and pads their ragged columns
    /// as `padding` says: `tf.data`'s `padded_batch` over parsed features.
    /// A row longer than a fixed padded width is an `Err` item in its
    /// batch's place.
    ///
    /// ```
    /// use tfpipe::pipeline::{Padding, Pipeline};
    /// use tfpipe::{Batch, Column, Values};
    /// let row = |v: Vec<i64>| Batch {
    ///     num_rows: 1,
    ///     columns: vec![Column { name: "t".into(), row_splits: vec![vec![0, v.len()]], values: Values::Int64(v), inner_shape: vec![] }],
    /// };
    /// let out: Vec<Batch> = Pipeline::from_vec(vec![row(vec![1]), row(vec![2, 3]), row(vec![4])])
    ///     .padded_batch(2, Padding::new(), false)
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(out[0].columns[0].as_i64(), Some(&[1, 0, 2, 3][..]));
    /// assert_eq!(out[1].columns[0].as_i64(), Some(&[4][..]));
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn padded_batch(
        self,
        size: usize,
        padding: Padding,
        drop_remainder: bool,
    ) -> Pipeline<Batch> {
        self.rebatch(size, drop_remainder).pad(padding)
    }

    /// Pads the ragged columns of each batch as it is (no regrouping): the
    /// fast arrangement after [`parse_batches`](Pipeline::parse_batches).
    pub fn pad(self, padding: Padding) -> Pipeline<Batch> {
        self.try_map(move |batch: Batch| padding.apply(&batch))
    }
}
