//! `pack`: first-fit packing of variable-length sequences into fixed-length
//! rows, with segment ids and positions (Grain's `FirstFitPackIterDataset`,
//! as T5 and MaxText pack).
//!
//! Rows come in order; each goes into the first of `bins` open packed rows
//! where every packed feature still has room. When a row fits nowhere and
//! all bins are open, the bins are emitted as one batch of `bins` rows and
//! the row starts a new set. At the end of an epoch (or of the input) the
//! open bins are emitted as a shorter batch.
//!
//! For each packed feature `F` the output has `F` (dense `[rows, length,
//! inner...]`, padded with the pad value), `F_segment_ids` (int32 `[rows,
//! length]`: 1, 2, ... for the sequences of a row in order, 0 for padding)
//! and `F_positions` (int32: 0, 1, ... within each sequence, 0 for padding).
//! Features not packed are dropped. A scalar feature packs as one value per
//! sequence (a per-sequence label: `label` `[rows, length]` with its own
//! segment ids, which match the other features' for the same sequence).
//!
//! With [`PackOptions::shuffle_bins`] the rows of each emitted batch come
//! in a seeded random order (Grain's `shuffle_bins`: first-fit fills the
//! first bins with the longest-waiting sequences, so without it a batch's
//! first rows are systematically older and fuller). The permutation is
//! drawn from the seed and the id of the batch's first row, so it needs no
//! state of its own and is the same after a restart.
//!
//! A sequence longer than `length` is truncated to its first `length`
//! values (steps), silently, as T5's and Grain's single-bin packers do;
//! Grain's first-fit packer refuses it instead.
//!
//! Resumable by replay ([`rows`](super::rows)): the open bins are saved as
//! row ids, so no sequence is lost or packed twice across a restart.

use std::collections::HashMap;

use super::padded_batch::{PadValue, empty_like, pad_unit, push_pad, push_range};
use super::rows::{self, BatchRow, Grouper, Output};
use super::state::StateError;
use super::{Pipeline, PipelineError};
use crate::batch::{Batch, Column, Values};
use crate::rng::SplitMix64;

/// The settings of [`Pipeline::pack`].
///
/// ```
/// use tfpipe::pipeline::{PackOptions, PadValue};
/// let options = PackOptions::new(["tokens"], 128, 32).pad_value(PadValue::Int(0));
/// assert_eq!(options.length(), 128);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PackOptions {
    features: Vec<String>,
    /// The packed length of each feature, in `features`' order.
    lengths: Vec<usize>,
    length: usize,
    bins: usize,
    pad: PadValue,
    shuffle_seed: Option<u64>,
}

impl PackOptions {
    /// Packs `features` (packed together: a row goes where all of them fit)
    /// into rows of `length` values each, with `bins` packed rows open at
    /// once (the rows of each output batch). A var-length feature's length
    /// is its values per row; a fixed sequence's, its steps; a dense
    /// feature's, its first dimension, and a scalar's, 1 (as in Grain: a
    /// per-sequence label packs as one value per sequence). Longer
    /// sequences are truncated to the length.
    pub fn new<S: Into<String>>(
        features: impl IntoIterator<Item = S>,
        length: usize,
        bins: usize,
    ) -> PackOptions {
        let features: Vec<String> = features.into_iter().map(Into::into).collect();
        PackOptions {
            lengths: vec![length; features.len()],
            features,
            length,
            bins,
            pad: PadValue::default(),
            shuffle_seed: None,
        }
    }

    /// Emits the rows of each batch in a random order drawn from `seed`
    /// (Grain's `shuffle_bins`; see the module doc). By default the bins'
    /// order (the first opened first).
    ///
    /// ```
    /// use tfpipe::pipeline::{PackOptions, Pipeline};
    /// use tfpipe::{Batch, Column, Values};
    /// let rows = |n: usize| Batch {
    ///     num_rows: n,
    ///     columns: vec![Column { name: "t".into(), values: Values::Int64((1..=n as i64 * 3).collect()), row_splits: vec![(0..=n).map(|i| 3 * i).collect()], inner_shape: vec![] }],
    /// };
    /// let packed = |options: PackOptions| -> Vec<i64> {
    ///     let out: Vec<Batch> = Pipeline::from_vec(vec![rows(8)]).pack(options).start().unwrap().map(|b| b.unwrap()).collect();
    ///     out[0].column("t").unwrap().as_i64().unwrap().to_vec()
    /// };
    /// let (plain, shuffled) = (packed(PackOptions::new(["t"], 3, 8)), packed(PackOptions::new(["t"], 3, 8).shuffle_bins(7)));
    /// assert_eq!(plain, (1..=24).collect::<Vec<i64>>());
    /// assert_ne!(shuffled, plain);
    /// let rows_of = |v: &[i64]| { let mut r: Vec<Vec<i64>> = v.chunks(3).map(<[i64]>::to_vec).collect(); r.sort(); r };
    /// assert_eq!(rows_of(&shuffled), rows_of(&plain));
    /// ```
    pub fn shuffle_bins(mut self, seed: u64) -> PackOptions {
        self.shuffle_seed = Some(seed);
        self
    }

    /// Packs feature `name` to `length` values instead of the common length.
    pub fn feature_length(mut self, name: &str, length: usize) -> PackOptions {
        if let Some(i) = self.features.iter().position(|f| f == name) {
            self.lengths[i] = length;
        }
        self
    }

    /// The pad value. By default zero.
    pub fn pad_value(mut self, pad: PadValue) -> PackOptions {
        self.pad = pad;
        self
    }

    /// The packed length.
    pub fn length(&self) -> usize {
        self.length
    }

    /// Fails (as [`Pipeline::start`] would) when the settings make no sense.
    pub fn check(&self) -> Result<(), PipelineError> {
        PipelineError::config_check(STAGE, self.problem())
    }

    fn problem(&self) -> Option<String> {
        if self.features.is_empty() {
            return Some("no feature to pack".into());
        }
        let longest = self.lengths.iter().copied().max().unwrap_or(0);
        if self.lengths.contains(&0) || self.bins == 0 {
            return Some(format!(
                "lengths {:?} and bins {} must be positive",
                self.lengths, self.bins
            ));
        }
        if longest.saturating_mul(self.bins) > super::MAX_PADDED_VALUES {
            return Some(format!(
                "{} bins of length {longest} is too large",
                self.bins
            ));
        }
        None
    }
}

const STAGE: &str = "pack";

/// Mixes the batch's first row id into the shuffle seed.
const PACK_SALT: u64 = 0x9E6C_63D0_676A_9A99;

impl Pipeline<Batch> {
    /// Packs the rows of incoming parsed batches first-fit into batches of
    /// `bins` rows of `length` values, with segment ids and positions per
    /// packed feature (see [`PackOptions`] and the module doc). A row whose
    /// packed feature is missing or not variable-length is an `Err` item.
    ///
    /// ```
    /// use tfpipe::pipeline::{PackOptions, Pipeline};
    /// use tfpipe::{Batch, Column, Values};
    /// let rows = Batch {
    ///     num_rows: 3,
    ///     columns: vec![Column {
    ///         name: "t".into(),
    ///         values: Values::Int64(vec![1, 2, 3, 4, 5, 6]),
    ///         row_splits: vec![vec![0, 3, 5, 6]],
    ///         inner_shape: vec![],
    ///     }],
    /// };
    /// let out: Vec<Batch> = Pipeline::from_vec(vec![rows])
    ///     .pack(PackOptions::new(["t"], 4, 2))
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// let packed = &out[0];
    /// assert_eq!(packed.column("t").unwrap().as_i64(), Some(&[1, 2, 3, 6, 4, 5, 0, 0][..]));
    /// let segments = packed.column("t_segment_ids").unwrap();
    /// assert_eq!(segments.values, Values::Int32(vec![1, 1, 1, 2, 1, 1, 0, 0]));
    /// let positions = packed.column("t_positions").unwrap();
    /// assert_eq!(positions.values, Values::Int32(vec![0, 1, 2, 0, 0, 1, 0, 0]));
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn pack(self, options: PackOptions) -> Pipeline<Batch> {
        let pipeline = match options.problem() {
            Some(p) => self.invalid("pack", || p),
            None => self,
        };
        pipeline.regroup(STAGE, rows::batch_rows, move || Packer {
            options: options.clone(),
            bins: Vec::new(),
        })
    }
}

/// One open packed row: its sequences and how full each feature is.
struct Bin {
    rows: Vec<(u64, BatchRow)>,
    fill: Vec<usize>,
}

/// The open bins.
struct Packer {
    options: PackOptions,
    bins: Vec<Bin>,
}

fn element_error(message: String) -> PipelineError {
    PipelineError::Element {
        stage: STAGE.to_string(),
        message,
    }
}

impl Packer {
    /// The packed (truncated) length of each feature of `row`.
    fn lengths(&self, row: &BatchRow) -> Result<Vec<usize>, PipelineError> {
        self.options
            .features
            .iter()
            .zip(&self.options.lengths)
            .map(|(name, &length)| {
                let column = super::bucket::column_of(STAGE, row, name)?;
                Ok(sequence_of(column, row.row)?.len.min(length))
            })
            .collect()
    }

    fn fits(&self, bin: &Bin, lengths: &[usize]) -> bool {
        bin.fill
            .iter()
            .zip(lengths)
            .zip(&self.options.lengths)
            .all(|((f, l), max)| f + l <= *max)
    }

    fn add(bin: &mut Bin, id: u64, row: BatchRow, lengths: &[usize]) {
        bin.rows.push((id, row));
        bin.fill.iter_mut().zip(lengths).for_each(|(f, l)| *f += l);
    }

    /// The open bins as one batch (in a seeded random order when asked).
    fn emit(&mut self) -> Output<Batch> {
        let mut bins = std::mem::take(&mut self.bins);
        if let Some(seed) = self.options.shuffle_seed {
            let first = bins.first().and_then(|b| b.rows.first()).map_or(0, |r| r.0);
            let mut rng = SplitMix64(seed ^ first.wrapping_mul(PACK_SALT));
            for i in (1..bins.len()).rev() {
                bins.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        let mut columns = Vec::with_capacity(3 * self.options.features.len());
        for (name, &length) in self.options.features.iter().zip(&self.options.lengths) {
            columns.extend(self.pack_feature(name, length, &bins)?);
        }
        Ok(Batch {
            num_rows: bins.len(),
            columns,
        })
    }

    /// Feature `name` of `bins`: values, segment ids, positions.
    fn pack_feature(
        &self,
        name: &str,
        length: usize,
        bins: &[Bin],
    ) -> Result<[Column; 3], PipelineError> {
        let (first, first_row) = bins
            .iter()
            .flat_map(|b| b.rows.first())
            .next()
            .map(|(_, r)| {
                Ok::<_, PipelineError>((super::bucket::column_of(STAGE, r, name)?, r.row))
            })
            .transpose()?
            .ok_or_else(|| element_error("no rows to pack".into()))?;
        let unit_shape = sequence_of(first, first_row)?.unit_shape;
        let inner: usize = unit_shape.iter().product();
        let unit = pad_unit(first, &self.options.pad).map_err(|e| element_error(e.to_string()))?;
        let cells = bins.len() * length;
        let mut values = empty_like(&first.values, cells * inner);
        let mut segments = Vec::with_capacity(cells);
        let mut positions = Vec::with_capacity(cells);
        for bin in bins {
            let mut used = 0;
            for (segment, (_, row)) in bin.rows.iter().enumerate() {
                let column = super::bucket::column_of(STAGE, row, name)?;
                let sequence = sequence_of(column, row.row)?;
                if std::mem::discriminant(&column.values) != std::mem::discriminant(&first.values)
                    || sequence.unit_shape != unit_shape
                {
                    return Err(element_error(format!(
                        "feature {name:?} differs in type or shape between rows"
                    )));
                }
                let start = sequence.start;
                let n = sequence.len.min(length);
                push_range(
                    &mut values,
                    &column.values,
                    start * inner..(start + n) * inner,
                );
                segments.extend(std::iter::repeat_n(segment as i32 + 1, n));
                positions.extend(0..n as i32);
                used += n;
            }
            push_pad(&mut values, &unit, (length - used) * inner);
            segments.extend(std::iter::repeat_n(0, length - used));
            positions.extend(std::iter::repeat_n(0, length - used));
        }
        let mut inner_shape = vec![length];
        inner_shape.extend_from_slice(&unit_shape);
        let dense = |name: String, values| Column {
            name,
            values,
            row_splits: Vec::new(),
            inner_shape: vec![length],
        };
        Ok([
            Column {
                name: name.to_string(),
                values,
                row_splits: Vec::new(),
                inner_shape,
            },
            dense(format!("{name}_segment_ids"), Values::Int32(segments)),
            dense(format!("{name}_positions"), Values::Int32(positions)),
        ])
    }
}

/// Where one row's sequence of a feature lies: units `start..start + len`
/// of the flat values, each unit `unit_shape` values.
struct Sequence {
    start: usize,
    len: usize,
    unit_shape: Vec<usize>,
}

/// Row `row` of `column` as a sequence: a var-length or fixed-sequence row
/// (its values or steps), a dense row (its first dimension), a scalar (one
/// value).
fn sequence_of(column: &Column, row: usize) -> Result<Sequence, PipelineError> {
    match column.row_splits.as_slice() {
        _ if matches!(column.values, Values::Sparse { .. }) => Err(element_error(format!(
            "feature {:?} is sparse and cannot be packed",
            column.name
        ))),
        [splits] => Ok(Sequence {
            start: splits[row],
            len: splits[row + 1] - splits[row],
            unit_shape: column.inner_shape.clone(),
        }),
        [] => match column.inner_shape.split_first() {
            None => Ok(Sequence {
                start: row,
                len: 1,
                unit_shape: Vec::new(),
            }),
            Some((&first, rest)) => Ok(Sequence {
                start: row * first,
                len: first,
                unit_shape: rest.to_vec(),
            }),
        },
        _ => Err(element_error(format!(
            "feature {:?} has two ragged levels and cannot be packed",
            column.name
        ))),
    }
}

impl Grouper for Packer {
    type Row = BatchRow;
    type Out = Batch;

    fn push(&mut self, id: u64, row: BatchRow) -> Option<Output<Batch>> {
        let lengths = match self.lengths(&row) {
            Ok(lengths) => lengths,
            Err(error) => return Some(Err(error)),
        };
        if let Some(i) = self.bins.iter().position(|b| self.fits(b, &lengths)) {
            Self::add(&mut self.bins[i], id, row, &lengths);
            return None;
        }
        let empty = || Bin {
            rows: Vec::new(),
            fill: vec![0; lengths.len()],
        };
        let out = if self.bins.len() >= self.options.bins {
            Some(self.emit())
        } else {
            None
        };
        let mut bin = empty();
        Self::add(&mut bin, id, row, &lengths);
        self.bins.push(bin);
        out
    }

    fn flush_one(&mut self) -> Option<Output<Batch>> {
        (!self.bins.is_empty()).then(|| self.emit())
    }

    fn held(&self) -> Vec<u64> {
        self.bins
            .iter()
            .flat_map(|b| b.rows.iter().map(|(id, _)| *id))
            .collect()
    }

    fn save(&self) -> serde_json::Value {
        let ids: Vec<Vec<u64>> = self
            .bins
            .iter()
            .map(|b| b.rows.iter().map(|(id, _)| *id).collect())
            .collect();
        serde_json::json!(ids)
    }

    fn restore(
        &mut self,
        saved: &serde_json::Value,
        rows: &mut HashMap<u64, BatchRow>,
    ) -> Result<(), StateError> {
        let ids: Vec<Vec<u64>> = serde_json::from_value(saved.clone())?;
        self.bins.clear();
        for ids in ids {
            let mut bin = Bin {
                rows: Vec::new(),
                fill: vec![0; self.options.features.len()],
            };
            for (id, row) in rows::take_rows(STAGE, &ids, rows)? {
                let lengths = self.lengths(&row).map_err(|e| {
                    StateError::mismatch(STAGE, format!("a saved row no longer packs: {e}"))
                })?;
                Self::add(&mut bin, id, row, &lengths);
            }
            self.bins.push(bin);
        }
        Ok(())
    }
}
