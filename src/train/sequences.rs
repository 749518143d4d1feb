//! How a training run batches variable-length token sequences, and what
//! padding that costs.
//!
//! [`Sequences::Padded`] (the default) batches records in order and pads
//! each batch to its longest row (at the tensor conversion);
//! [`Sequences::Bucketed`] batches rows of similar length together
//! ([`Pipeline::bucket_by_sequence_length`], rows left ragged for the same
//! conversion); [`Sequences::Packed`] packs several sequences into each row
//! of a fixed length ([`Pipeline::pack`]), with the label packed beside the
//! tokens so that each sequence keeps its own (the embedding model then
//! pools per sequence, by segment id).
//!
//! [`PaddingMeter`] counts, over the batches that reach the trainer, the pad
//! tokens and all token cells: a ragged batch costs `rows * longest` cells
//! (what the conversion pads it to), a packed one `rows * length`, with the
//! cells whose segment id is 0 as padding.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Batch;
use crate::batch::Values;
use crate::pipeline::{BucketOptions, PackOptions, Pipeline};

/// How token sequences are batched; see the module doc.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Sequences {
    /// In order, each batch padded to its longest row. The default.
    #[default]
    Padded,
    /// By length: bucket `i` holds lengths in `[boundaries[i - 1],
    /// boundaries[i])` and emits batches of `batch_sizes[i]`
    /// (`boundaries.len() + 1` of them).
    Bucketed {
        /// Bucket boundaries, positive and strictly increasing.
        boundaries: Vec<usize>,
        /// One batch size per bucket.
        batch_sizes: Vec<usize>,
    },
    /// First-fit packed into rows of `length` tokens, batch-size rows per
    /// batch.
    Packed {
        /// Tokens per packed row.
        length: usize,
    },
}

impl Sequences {
    /// Buckets with one batch size for every bucket.
    pub fn bucketed(boundaries: Vec<usize>, batch_size: usize) -> Sequences {
        let batch_sizes = vec![batch_size; boundaries.len() + 1];
        Sequences::Bucketed {
            boundaries,
            batch_sizes,
        }
    }

    /// The mode with its settings, as checkpoints record it:
    /// `bucketed by [12, 16] into batches of [32, 32, 32]`, `packed into
    /// rows of 64 tokens`, or `padded`.
    pub fn describe(&self) -> String {
        match self {
            Sequences::Padded => "padded".to_string(),
            Sequences::Bucketed {
                boundaries,
                batch_sizes,
            } => format!("bucketed by {boundaries:?} into batches of {batch_sizes:?}"),
            Sequences::Packed { length } => format!("packed into rows of {length} tokens"),
        }
    }

    /// A word for reports: `padded`, `bucketed` or `packed`.
    pub fn mode(&self) -> &'static str {
        match self {
            Sequences::Padded => "padded",
            Sequences::Bucketed { .. } => "bucketed",
            Sequences::Packed { .. } => "packed",
        }
    }

    /// `parsed` regrouped as this mode says: `tokens` is the token feature,
    /// `label` the label (packed beside the tokens), `batch_size` the packed
    /// rows per batch.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// use tfpipe::train::Sequences;
    /// use tfpipe::{Batch, Column, Values};
    /// let batch = Batch {
    ///     num_rows: 2,
    ///     columns: vec![
    ///         Column { name: "tokens".into(), values: Values::Int64(vec![1, 2, 3]), row_splits: vec![vec![0, 2, 3]], inner_shape: vec![] },
    ///         Column { name: "label".into(), values: Values::Int64(vec![0, 1]), row_splits: vec![], inner_shape: vec![] },
    ///     ],
    /// };
    /// let packed = Sequences::Packed { length: 4 }.apply(Pipeline::from_vec(vec![batch]), "tokens", Some("label"), 8);
    /// let out: Vec<Batch> = packed.start()?.collect::<Result<_, _>>()?;
    /// assert_eq!(out[0].num_rows, 1);
    /// assert_eq!(out[0].column("label").unwrap().as_i64(), Some(&[0, 1, 0, 0][..]));
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn apply(
        &self,
        parsed: Pipeline<Batch>,
        tokens: &str,
        label: Option<&str>,
        batch_size: usize,
    ) -> Pipeline<Batch> {
        match self {
            Sequences::Padded => parsed,
            Sequences::Bucketed {
                boundaries,
                batch_sizes,
            } => parsed.bucket_by_sequence_length(
                BucketOptions::new(tokens, boundaries.clone(), batch_sizes.clone())
                    .no_padding(true),
            ),
            Sequences::Packed { length } => {
                let features = std::iter::once(tokens).chain(label);
                parsed.pack(PackOptions::new(features, *length, batch_size))
            }
        }
    }
}

/// The token feature of `schema`: its first var-length int64 feature that
/// is not the label (what the embedding model reads and what
/// [`Sequences`] regroups by).
pub fn token_feature(schema: &crate::Schema) -> Option<&str> {
    use crate::example::{DType, Layout};
    schema
        .features
        .iter()
        .find(|f| {
            f.layout == Layout::Var
                && f.dtype == DType::Int64
                && schema.label.as_deref() != Some(f.name.as_str())
        })
        .map(|f| f.name.as_str())
}

/// What a run's sequence batching cost, for its report.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SequenceReport {
    /// `padded`, `bucketed` or `packed`.
    pub mode: String,
    /// Pad tokens over all token cells of the batches read.
    pub padding_fraction: f64,
    /// Pad tokens.
    pub pad_tokens: u64,
    /// All token cells (real and pad).
    pub token_cells: u64,
}

/// `packed: padding 5.5% of the token cells (12 of 220)`.
impl std::fmt::Display for SequenceReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: padding {:.1}% of the token cells ({} of {})",
            self.mode,
            100.0 * self.padding_fraction,
            self.pad_tokens,
            self.token_cells
        )
    }
}

impl SequenceReport {
    /// The report of `meter` under `sequences`; `None` before any token.
    pub fn new(sequences: &Sequences, meter: &PaddingMeter) -> Option<SequenceReport> {
        let (pad, cells) = meter.counts();
        Some(SequenceReport {
            mode: sequences.mode().to_string(),
            padding_fraction: meter.fraction()?,
            pad_tokens: pad,
            token_cells: cells,
        })
    }
}

impl Sequences {
    /// Checks the settings, as the pipeline would at its start.
    ///
    /// ```
    /// use tfpipe::train::Sequences;
    /// assert!(Sequences::bucketed(vec![8, 16], 32).check().is_ok());
    /// assert!(Sequences::bucketed(vec![16, 8], 32).check().is_err());
    /// assert!(Sequences::Packed { length: 0 }.check().is_err());
    /// ```
    pub fn check(&self) -> Result<(), crate::PipelineError> {
        match self {
            Sequences::Padded => Ok(()),
            Sequences::Bucketed {
                boundaries,
                batch_sizes,
            } => BucketOptions::new("", boundaries.clone(), batch_sizes.clone()).check(),
            Sequences::Packed { length } => PackOptions::new([""], *length, 1).check(),
        }
    }
}

/// Pad tokens and all token cells of the batches seen (shared by clones).
///
/// ```
/// use tfpipe::train::PaddingMeter;
/// use tfpipe::{Batch, Column, Values};
/// let batch = Batch {
///     num_rows: 2,
///     columns: vec![Column { name: "tokens".into(), values: Values::Int64(vec![1, 2, 3]), row_splits: vec![vec![0, 2, 3]], inner_shape: vec![] }],
/// };
/// let meter = PaddingMeter::default();
/// meter.record(&batch, "tokens");
/// assert_eq!(meter.counts(), (1, 4)); // one pad cell of 2 x 2
/// assert_eq!(meter.fraction(), Some(0.25));
/// ```
#[derive(Debug, Clone, Default)]
pub struct PaddingMeter(Arc<[AtomicU64; 2]>);

impl PaddingMeter {
    /// Counts `batch`'s token column `tokens` (nothing if it has none).
    pub fn record(&self, batch: &Batch, tokens: &str) {
        if let Some((pad, cells)) = padding_of(batch, tokens) {
            self.0[0].fetch_add(pad, Ordering::Relaxed);
            self.0[1].fetch_add(cells, Ordering::Relaxed);
        }
    }

    /// `(pad tokens, all token cells)` so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.0[0].load(Ordering::Relaxed),
            self.0[1].load(Ordering::Relaxed),
        )
    }

    /// Pad tokens over all token cells; `None` before any token.
    pub fn fraction(&self) -> Option<f64> {
        let (pad, cells) = self.counts();
        (cells > 0).then(|| pad as f64 / cells as f64)
    }
}

/// `(pad cells, all cells)` of the token column `tokens`: a ragged column
/// as padded to its longest row, a packed one by its segment ids.
pub fn padding_of(batch: &Batch, tokens: &str) -> Option<(u64, u64)> {
    let column = batch.column(tokens)?;
    if let [splits] = column.row_splits.as_slice() {
        let rows = splits.len().saturating_sub(1) as u64;
        let longest = splits.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0) as u64;
        let real = (splits.last().copied().unwrap_or(0) - splits[0]) as u64;
        return Some((rows * longest - real, rows * longest));
    }
    let segments = batch.column(&format!("{tokens}_segment_ids"))?;
    match &segments.values {
        Values::Int32(ids) => Some((
            ids.iter().filter(|&&s| s == 0).count() as u64,
            ids.len() as u64,
        )),
        _ => None,
    }
}
