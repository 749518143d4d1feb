//! Batches to tensors: features as float32 `[batch, inputs]` (uint8 scaled to
//! [0,1], int64 and float32 standardised when the spec carries statistics),
//! labels as u32 class ids `[batch]` (classification) or float32 values
//! `[batch]` (regression).
//!
//! A single float32 feature moves its `Vec` into the tensor (`Tensor::from_vec`
//! takes ownership on the CPU): no copy; standardisation then rewrites it in
//! place. Other dtypes need one conversion pass, which writes straight into
//! the tensor's buffer. Nothing else is copied.
//!
//! Which schema features feed the model is decided once, by
//! [`InputSpec::from_schema`]: every fixed-shape number except the label;
//! the rest (bytes, variable-length, sequences) is skipped and reported, and
//! left out of the schema the data is parsed with, so it costs nothing.

use std::collections::HashMap;

use std::fmt;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use super::impute::{Imputation, Impute, MISSING_INT64, int_value};
use super::model::Task;
use super::{Setting, TrainError};
use crate::batch::{Batch, Column, Values};
use crate::example::{DType, FeatureSpec, Layout, Schema};

/// Which columns feed the model, how wide each is, and the label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputSpec {
    /// Feature columns in input order, with their values per example.
    pub features: Vec<(String, usize)>,
    /// The label column, if any: int64 class ids in `0..classes` for
    /// classification, a float32 (or int64) value for regression.
    pub label: Option<String>,
    /// What the label is.
    pub task: Task,
    /// Per-feature standardisation, one entry per `features` entry (all of a
    /// feature's values share it), or empty for none. The trainer fills it
    /// from the first training batch ([`Standardize::from_batch`]) and
    /// checkpoints keep it, so prediction scales inputs the same way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub standardize: Vec<Standardize>,
    /// A variable-length int64 feature of token ids, padded per batch into
    /// [`BatchTensors::tokens`] with a [`BatchTensors::mask`]. `None`: no
    /// token input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenSpec>,
    /// How missing inputs are filled, each flagged by an indicator column
    /// after all the inputs ([`Imputation`]); `None`: a missing input is an
    /// error naming its record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impute: Option<Imputation>,
}

/// A variable-length feature of token ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenSpec {
    /// The feature's name.
    pub name: String,
    /// Ids must be below this (the embedding's rows); `None` until known
    /// (the CLI sets it from `--vocab-size` or the schema file). An id
    /// outside `0..vocab` is an input error naming its batch and row.
    pub vocab: Option<usize>,
}

/// How uint8 inputs (pixels) are scaled before the model sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PixelScaling {
    /// Divided by 255, to `[0, 1]` (Keras' `Rescaling(1/255)`), nothing
    /// more. The default.
    #[default]
    Rescale,
    /// Divided by 255, then standardised like int64 and float32 inputs
    /// (the mean and standard deviation of each feature's values in the
    /// first training batch).
    Standardize,
}

/// `x -> (x - mean) / std` for one feature's values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Standardize {
    /// Subtracted first.
    pub mean: f32,
    /// Then divided by (never 0).
    pub std: f32,
}

impl Standardize {
    /// Leaves values as they are.
    pub const IDENTITY: Standardize = Standardize {
        mean: 0.0,
        std: 1.0,
    };

    /// Whether this changes nothing.
    pub fn is_identity(&self) -> bool {
        *self == Self::IDENTITY
    }

    /// Statistics for every feature of `spec` from one batch: mean and
    /// standard deviation over all of an int64 or float32 feature's values
    /// (a constant feature is only centred). uint8 features, already scaled
    /// to `[0, 1]`, and columns the batch lacks get the identity.
    ///
    /// Tabular inputs span very different ranges (penguins' body mass is
    /// ~4000 grams, bill depth ~17 mm); unscaled, the large ones dominate the
    /// first layer and training stalls or diverges. One (shuffled) batch is
    /// enough for a scale estimate and needs no second pass over the data.
    ///
    /// ```
    /// use tfpipe::{Batch, Column, Values};
    /// use tfpipe::train::{InputSpec, Standardize, Task};
    ///
    /// let spec = InputSpec { features: vec![("mass".into(), 1)], label: None, task: Task::Regression, standardize: vec![], tokens: None, impute: None };
    /// let batch = Batch { num_rows: 2, columns: vec![Column {
    ///     name: "mass".into(), values: Values::Int64(vec![3000, 5000]), row_splits: vec![], inner_shape: vec![],
    /// }] };
    /// assert_eq!(Standardize::from_batch(&batch, &spec), vec![Standardize { mean: 4000.0, std: 1000.0 }]);
    /// ```
    pub fn from_batch(batch: &Batch, spec: &InputSpec) -> Vec<Standardize> {
        Self::from_batch_with(batch, spec, PixelScaling::Rescale)
    }

    /// [`from_batch`](Self::from_batch), with uint8 features standardised
    /// too when `pixels` says so (their statistics are those of the values
    /// divided by 255, which is what the standardisation is applied to).
    ///
    /// ```
    /// use tfpipe::{Batch, Column, Values};
    /// use tfpipe::train::{InputSpec, PixelScaling, Standardize, Task};
    ///
    /// let spec = InputSpec { features: vec![("px".into(), 2)], label: None, task: Task::Regression, standardize: vec![], tokens: None, impute: None };
    /// let batch = Batch { num_rows: 1, columns: vec![Column {
    ///     name: "px".into(), values: Values::Uint8(vec![0, 255]), row_splits: vec![], inner_shape: vec![],
    /// }] };
    /// assert_eq!(Standardize::from_batch(&batch, &spec), vec![Standardize::IDENTITY]);
    /// let standardized = Standardize::from_batch_with(&batch, &spec, PixelScaling::Standardize);
    /// assert_eq!(standardized, vec![Standardize { mean: 0.5, std: 0.5 }]);
    /// ```
    pub fn from_batch_with(
        batch: &Batch,
        spec: &InputSpec,
        pixels: PixelScaling,
    ) -> Vec<Standardize> {
        spec.features
            .iter()
            .map(|(name, _)| match batch.column(name).map(|c| &c.values) {
                Some(Values::Float32(v)) => Self::from_values(v.iter().map(|&x| f64::from(x))),
                Some(Values::Int64(v)) => Self::from_values(v.iter().map(|&x| {
                    if x == MISSING_INT64 {
                        f64::NAN
                    } else {
                        x as f64
                    }
                })),
                Some(Values::Uint8(v)) if pixels == PixelScaling::Standardize => {
                    Self::from_values(v.iter().map(|&b| f64::from(b) / 255.0))
                }
                _ => Self::IDENTITY,
            })
            .collect()
    }

    fn from_values(values: impl Iterator<Item = f64>) -> Standardize {
        let (mut n, mut sum, mut sq) = (0f64, 0f64, 0f64);
        for x in values.filter(|x| x.is_finite()) {
            n += 1.0;
            sum += x;
            sq += x * x;
        }
        if n == 0.0 {
            return Self::IDENTITY;
        }
        let mean = sum / n;
        let std = (sq / n - mean * mean).max(0.0).sqrt();
        let (mean, std) = (mean as f32, std as f32);
        Standardize {
            mean: if mean.is_finite() { mean } else { 0.0 },
            // A constant (or nearly so) feature: centre it, do not blow it up.
            std: if std.is_finite() && std > 1e-6 * mean.abs().max(1.0) {
                std
            } else {
                1.0
            },
        }
    }
}

/// A schema feature the models cannot take, left out of training.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedFeature {
    /// The feature's name.
    pub name: String,
    /// Why: `bytes`, `variable-length`, `sequence`, ... or an image's size
    /// beside the image.
    pub reason: String,
}

impl fmt::Display for SkippedFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.reason)
    }
}

/// What [`InputSpec::from_schema`] chose.
#[derive(Debug, Clone, PartialEq)]
pub struct InputSelection {
    /// The model's inputs and label.
    pub spec: InputSpec,
    /// Features left out, in schema order.
    pub skipped: Vec<SkippedFeature>,
    /// The schema restricted to the inputs and the label: parse the data
    /// with this (through [`InputSpec::parse_schema`]), so skipped features
    /// cost nothing (the decoder skips features that are not in its
    /// schema). It gives no input a default: a missing input is an error
    /// unless imputed.
    pub schema: Schema,
    /// The inputs that may be missing (fixed-shape int64 or float32 ones
    /// whose spec gave a default), in input order: what
    /// [`impute`](Self::impute) fills.
    pub may_be_missing: Vec<String>,
}

impl InputSelection {
    /// Fills the inputs that may be missing with `fill`, each flagged by an
    /// indicator column; nothing changes when none may be missing.
    ///
    /// ```
    /// use tfpipe::Schema;
    /// use tfpipe::train::{Impute, InputSpec, Task};
    ///
    /// let schema = Schema::from_feature_texts(&["hp:int64=0", "mass:float32", "mpg:float32"])?.with_label("mpg")?;
    /// let chosen = InputSpec::from_schema(&schema, Task::Regression)?.impute(Impute::Mean);
    /// assert_eq!(chosen.may_be_missing, vec!["hp".to_string()]);
    /// assert_eq!(chosen.spec.inputs(), 3); // hp, mass and hp's indicator
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn impute(mut self, fill: Impute) -> InputSelection {
        if !self.may_be_missing.is_empty() {
            self.spec.impute = Some(Imputation {
                fill,
                features: self.may_be_missing.clone(),
            });
        }
        self
    }
}

impl InputSpec {
    /// Every fixed-shape numeric (int64, float32, uint8) feature of `schema`
    /// except the label feeds the model; the label is `schema.label` and
    /// must be one int64 per example for classification, one float32 or
    /// int64 for regression. The first variable-length int64 feature is the
    /// token input ([`InputSpec::tokens`]). Other features (bytes, further
    /// variable-length ones, sequences) are skipped and listed. Fails when
    /// no input remains.
    ///
    /// ```
    /// use tfpipe::Schema;
    /// use tfpipe::train::{InputSpec, Task};
    ///
    /// let mut schema = Schema::from_feature_texts(&["species:int64", "island:bytes", "mass:int64"])?;
    /// schema.label = Some("species".into());
    /// let chosen = InputSpec::from_schema(&schema, Task::Classification { classes: 3 })?;
    /// assert_eq!(chosen.spec.features, vec![("mass".to_string(), 1)]);
    /// assert_eq!(chosen.skipped[0].to_string(), "island (bytes)");
    /// assert_eq!(chosen.schema.features.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_schema(schema: &Schema, task: Task) -> Result<InputSelection, TrainError> {
        if let Some(label) = &schema.label
            && schema.feature(label).is_none()
        {
            return Err(TrainError::config(
                Setting::Label,
                format!("{label:?} is not one of the schema's features"),
            ));
        }
        let mut features = Vec::new();
        let mut skipped = Vec::new();
        let mut used = Vec::new();
        let mut tokens: Option<TokenSpec> = None;
        let mut may_be_missing = Vec::new();
        // Beside an image decoded from its bytes (an `image` feature), the
        // image's size features (`image/height`, `image/width` of the
        // ImageNet layout) are its metadata, not inputs: the image alone
        // feeds the model (the CNN).
        let has_image = schema.features.iter().any(|f| f.image.is_some());
        for f in &schema.features {
            if Some(&f.name) == schema.label.as_ref() {
                let scalar =
                    matches!(&f.layout, Layout::Fixed(s) if s.iter().product::<usize>() == 1);
                let fits = match task {
                    // Text labels become class ids in the pipeline (`LabelClasses`).
                    Task::Classification { .. } => matches!(f.dtype, DType::Int64 | DType::Bytes),
                    Task::Regression => matches!(f.dtype, DType::Int64 | DType::Float32),
                };
                if !scalar || !fits {
                    let want = match task {
                        Task::Classification { .. } => "one int64 class id or text class name",
                        Task::Regression => "one float32 or int64 value",
                    };
                    return Err(TrainError::config(
                        Setting::Label,
                        format!(
                            "{:?} must be {want} per example (it is {})",
                            f.name,
                            describe_feature(f)
                        ),
                    ));
                }
                // A label is never filled in: a record without one is an
                // error naming its file and record, not a silent 0 (a
                // converter gives a column with missing values a default,
                // and a column chosen as the label later keeps it).
                used.push(FeatureSpec {
                    default: None,
                    ..f.clone()
                });
                continue;
            }
            if f.layout == Layout::Var && f.dtype == DType::Int64 && tokens.is_none() {
                tokens = Some(TokenSpec {
                    name: f.name.clone(),
                    vocab: None,
                });
                used.push(f.clone());
                continue;
            }
            let reason = match (&f.layout, f.dtype) {
                _ if has_image && is_image_size(&f.name) => "an image's size, beside the image",
                (Layout::Fixed(shape), dtype) if dtype != DType::Bytes => {
                    features.push((f.name.clone(), shape.iter().product()));
                    // A default is where the value may be missing (the
                    // converters give one to a column with missing values),
                    // never what the model sees: a missing input is an
                    // error unless imputed.
                    if f.default.is_some() && matches!(dtype, DType::Int64 | DType::Float32) {
                        may_be_missing.push(f.name.clone());
                    }
                    used.push(FeatureSpec {
                        default: None,
                        ..f.clone()
                    });
                    continue;
                }
                (_, DType::Bytes) => "bytes",
                (Layout::Var, _) => "variable-length",
                (Layout::FixedSequence(_) | Layout::VarSequence, _) => "sequence",
                (Layout::VarFixed(_) | Layout::Ragged(_), _) => "ragged",
                (Layout::Sparse { .. }, _) => "sparse",
                (Layout::Fixed(_), _) => "unsupported dtype",
            };
            skipped.push(SkippedFeature {
                name: f.name.clone(),
                reason: reason.into(),
            });
        }
        if features.is_empty() && tokens.is_none() {
            let others = if skipped.is_empty() {
                "none".to_string()
            } else {
                join(&skipped)
            };
            return Err(TrainError::config(
                Setting::Inputs,
                format!(
                    "none besides the label (other features: {others}): the models need at least one fixed-shape int64, float32 or uint8 feature, or a variable-length int64 one (token ids); numbers stored as text (bytes) must be converted as numbers"
                ),
            ));
        }
        // An image folder converted without decoding holds the encoded bytes
        // (skipped: the models take no bytes) and the images' size: a model
        // of the size alone learns nothing of the images, and used to train
        // silently to chance accuracy.
        let encoded = skipped.iter().find(|s| s.reason == "bytes");
        if let Some(encoded) = encoded
            && tokens.is_none()
            && features.iter().all(|(name, _)| is_image_size(name))
        {
            let sizes: Vec<&str> = features.iter().map(|(n, _)| n.as_str()).collect();
            return Err(TrainError::config(
                Setting::Inputs,
                format!(
                    "only an image's size ({}): the image itself ({:?}) is encoded bytes, which the models cannot take; declare it as an image feature to decode it (the spec NAME:image:HxWxC, e.g. {:?}, which `tfpipe inspect` suggests)",
                    sizes.join(", "),
                    encoded.name,
                    format!("{}:image:224x224x3", encoded.name)
                ),
            ));
        }
        Ok(InputSelection {
            spec: InputSpec {
                features,
                label: schema.label.clone(),
                task,
                standardize: Vec::new(),
                tokens,
                impute: None,
            },
            skipped,
            schema: Schema {
                features: used,
                label: schema.label.clone(),
            },
            may_be_missing,
        })
    }

    /// The number of input values per example: the features' values, then
    /// one missing indicator per imputed input.
    pub fn inputs(&self) -> usize {
        self.feature_values() + self.impute.as_ref().map_or(0, |i| i.features.len())
    }

    /// The features' values per example (without indicator columns).
    fn feature_values(&self) -> usize {
        self.features.iter().map(|(_, w)| w).sum()
    }

    /// The schema to parse the data with: `schema` (the selection's, or a
    /// checkpoint's) with the imputation's missing markers as defaults.
    pub fn parse_schema(&self, schema: &Schema) -> Schema {
        match &self.impute {
            Some(imputation) => imputation.parse_schema(schema),
            None => schema.clone(),
        }
    }
}

/// Whether a feature named `name` is an image's size (`image/height`,
/// `width`, `img_channels`, ...).
fn is_image_size(name: &str) -> bool {
    let last = name.rsplit(['/', '_', '.', '-']).next().unwrap_or(name);
    matches!(
        last.to_ascii_lowercase().as_str(),
        "height" | "width" | "channels" | "depth"
    )
}

/// `int64 [3]`, `float32 var`, ... for messages.
fn describe_feature(f: &FeatureSpec) -> String {
    let dtype = f.dtype.name();
    match &f.layout {
        Layout::Fixed(shape) if shape.is_empty() => format!("{dtype}, scalar"),
        Layout::Fixed(shape) => format!("{dtype} of shape {shape:?}"),
        Layout::Var => format!("{dtype}, variable-length"),
        Layout::FixedSequence(_) | Layout::VarSequence => format!("{dtype}, a sequence"),
        Layout::VarFixed(shape) => format!("{dtype}, variable-length elements of shape {shape:?}"),
        Layout::Ragged(_) => format!("{dtype}, ragged"),
        Layout::Sparse { .. } => format!("{dtype}, sparse"),
    }
}

/// Skipped features as one line: `island (bytes), sex (bytes)`.
pub(crate) fn join(skipped: &[SkippedFeature]) -> String {
    skipped
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The number of classes a converter recorded in a schema file's metadata
/// (from [`Schema::load_with_metadata`]): the size of `source.label_vocabulary`
/// (`convert csv|json` with a text label) or of `source.classes` (`convert
/// images`). `None` when neither is there.
pub fn classes_from_metadata(metadata: &Map<String, Json>) -> Option<usize> {
    crate::example::SchemaMetadata::from_json(metadata)
        .ok()?
        .classes()
}

/// One batch as tensors on a device.
#[derive(Debug, Clone)]
pub struct BatchTensors {
    /// `[rows, inputs]` float32.
    pub features: Tensor,
    /// `[rows]` u32 class ids (classification) or f32 values (regression),
    /// when the spec has a label.
    pub labels: Option<Tensor>,
    /// `[rows, longest]` u32 token ids, padded with 0 after each row's own
    /// ids, when the spec has a token input. (`longest` is the batch's
    /// longest row, at least 1.)
    pub tokens: Option<Tensor>,
    /// `[rows, longest]` float32: 1 for a real token, 0 for padding.
    pub mask: Option<Tensor>,
    /// For a packed batch ([`Sequences::Packed`](super::Sequences)): which
    /// sequence each token cell belongs to, and its averaging weight. Then
    /// `tokens` and `mask` are the packed rows, while `labels`, `features`
    /// and [`rows`](Self::rows) count sequences.
    pub pool: Option<Pooling>,
    /// The number of examples.
    pub rows: usize,
}

/// How a packed batch's token cells pool into sequences: sequence `index[c]`
/// sums cell `c`'s embedding (padding goes to one extra sequence past the
/// last, dropped), and each sum is divided by the sequence's length.
#[derive(Debug, Clone)]
pub struct Pooling {
    /// `[rows * width]` u32: the sequence of each flattened token cell
    /// (`sequences` for padding).
    pub index: Tensor,
    /// `[sequences, 1]` float32: each sequence's length, at least 1.
    pub lengths: Tensor,
}

/// `t` on `device`: moved there, or as it is on the CPU.
fn on_device(t: Tensor, device: &Device) -> Result<Tensor, TrainError> {
    if device.is_cpu() {
        Ok(t)
    } else {
        t.to_device(device)
            .map_err(TrainError::candle("host-to-device copy"))
    }
}

/// Converts `batch` (consumed, so its buffers can move into tensors) for the
/// model. `index` names the batch in errors.
pub fn batch_to_tensors(
    mut batch: Batch,
    spec: &InputSpec,
    index: u64,
    device: &Device,
) -> Result<BatchTensors, TrainError> {
    if let Some(t) = &spec.tokens
        && batch.column(&format!("{}_segment_ids", t.name)).is_some()
    {
        return packed_to_tensors(batch, spec, t, index, device);
    }
    let rows = batch.num_rows;
    let bad = |reason: String| TrainError::Input {
        batch: index,
        reason,
    };
    let labels = match &spec.label {
        None => None,
        Some(name) => {
            let col = take_column(&mut batch, name)
                .ok_or_else(|| bad(format!("no label column {name:?}")))?;
            check_dense(&col, rows, 1).map_err(&bad)?;
            Some(label_tensor(&col, name, spec.task, index)?)
        }
    };
    let tokens = match &spec.tokens {
        Some(t) => {
            let col = take_column(&mut batch, &t.name)
                .ok_or_else(|| bad(format!("no token column {:?}", t.name)))?;
            Some(token_tensors(&col, rows, t, index)?)
        }
        None => None,
    };
    let values = spec.feature_values();
    let mut data: Vec<f32> = if let [(name, width)] = spec.features.as_slice() {
        let col = take_column(&mut batch, name)
            .ok_or_else(|| bad(format!("no feature column {name:?}")))?;
        check_dense(&col, rows, *width).map_err(&bad)?;
        match col.values {
            // The zero-copy case: the parser's buffer becomes the tensor's.
            Values::Float32(v) => v,
            other => {
                let mut out = Vec::with_capacity(rows * width);
                append_f32(&other, &mut out);
                out
            }
        }
    } else {
        // Several features: interleave them row by row into one buffer.
        let mut cols = Vec::with_capacity(spec.features.len());
        for (name, width) in &spec.features {
            let col = batch
                .column(name)
                .ok_or_else(|| bad(format!("no feature column {name:?}")))?;
            check_dense(col, rows, *width).map_err(&bad)?;
            cols.push((col, *width));
        }
        let mut out = Vec::with_capacity(rows * values);
        for row in 0..rows {
            for (col, width) in &cols {
                append_row_f32(&col.values, row * width, *width, &mut out);
            }
        }
        out
    };
    if let Some(imputation) = &spec.impute {
        data = imputation.apply(&data, rows, &spec.features, &spec.standardize);
    }
    standardize(&mut data, spec).map_err(&bad)?;
    let features = Tensor::from_vec(data, (rows, spec.inputs()), &Device::Cpu)
        .map_err(TrainError::candle("feature tensor"))?;
    let (tokens, mask) = match tokens {
        Some((ids, mask)) => (Some(ids), Some(mask)),
        None => (None, None),
    };
    let to_device = |t: Tensor| on_device(t, device);
    let opt = |t: Option<Tensor>| t.map(to_device).transpose();
    Ok(BatchTensors {
        features: to_device(features)?,
        labels: opt(labels)?,
        tokens: opt(tokens)?,
        mask: opt(mask)?,
        pool: None,
        rows,
    })
}

/// A packed batch (tokens `[rows, width]` with segment ids, the label packed
/// beside them) as tensors with one example per sequence: the sequences are
/// the label's segments in order, each pooling its own token cells.
fn packed_to_tensors(
    mut batch: Batch,
    spec: &InputSpec,
    t: &TokenSpec,
    index: u64,
    device: &Device,
) -> Result<BatchTensors, TrainError> {
    let bad = |reason: String| TrainError::Input {
        batch: index,
        reason,
    };
    if !spec.features.is_empty() {
        return Err(bad(format!(
            "a packed batch carries only the tokens and the label; the model's other inputs ({}) cannot be packed",
            spec.features
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let rows = batch.num_rows;
    let column = |batch: &mut Batch, name: String| {
        take_column(batch, &name)
            .ok_or_else(|| bad(format!("no column {name:?} in the packed batch")))
    };
    let ids = column(&mut batch, t.name.clone())?;
    let segments = column(&mut batch, format!("{}_segment_ids", t.name))?;
    let (Values::Int64(ids), Values::Int32(segments), [width]) =
        (&ids.values, &segments.values, ids.inner_shape.as_slice())
    else {
        return Err(bad(format!(
            "token column {:?} is not packed int64",
            t.name
        )));
    };
    let cells = rows * width;
    if ids.len() != cells || segments.len() != cells {
        return Err(bad(format!(
            "packed token column {:?} has {} values for {rows} rows of {width}",
            t.name,
            ids.len()
        )));
    }
    // The sequences, in order: the label's segments, or the tokens' without a label.
    let mut sequence_of: HashMap<(usize, i32), usize> = HashMap::new();
    let mut label_values: Vec<f64> = Vec::new();
    let label_is_int = match &spec.label {
        Some(name) => {
            let label = column(&mut batch, name.clone())?;
            let label_segments = column(&mut batch, format!("{name}_segment_ids"))?;
            let (Values::Int32(label_segments), [label_width]) =
                (&label_segments.values, label.inner_shape.as_slice())
            else {
                return Err(bad(format!("label {name:?} is not packed")));
            };
            for (i, &s) in label_segments.iter().enumerate() {
                if s > 0 {
                    sequence_of.insert((i / label_width, s), label_values.len());
                    label_values.push(match &label.values {
                        Values::Int64(v) => v[i] as f64,
                        Values::Float32(v) => f64::from(v[i]),
                        _ => return Err(bad(format!("label {name:?} is not int64 or float32"))),
                    });
                }
            }
            matches!(label.values, Values::Int64(_))
        }
        None => {
            for (i, &s) in segments.iter().enumerate() {
                let next = sequence_of.len();
                if s > 0 {
                    sequence_of.entry((i / width, s)).or_insert(next);
                }
            }
            true
        }
    };
    let sequences = sequence_of.len();
    let mut cell_sequence = vec![sequences as u32; cells];
    let mut lengths = vec![0u32; sequences];
    let mut token_ids = vec![0u32; cells];
    let mut mask = vec![0f32; cells];
    for (cell, (&s, &id)) in segments.iter().zip(ids.iter()).enumerate() {
        if s == 0 {
            continue;
        }
        let Some(&n) = sequence_of.get(&(cell / width, s)) else {
            return Err(bad(format!(
                "row {}: token segment {s} has no label",
                cell / width
            )));
        };
        let fits = id >= 0 && t.vocab.is_none_or(|v| (id as u64) < v as u64);
        if !fits || id > i64::from(u32::MAX) {
            return Err(bad(format!(
                "row {}: token id {id} in {:?} is outside 0..{} (the vocabulary size)",
                cell / width,
                t.name,
                t.vocab.map_or("2^32".into(), |v| v.to_string())
            )));
        }
        token_ids[cell] = id as u32;
        mask[cell] = 1.0;
        cell_sequence[cell] = n as u32;
        lengths[n] += 1;
    }
    let labels = match &spec.label {
        Some(name) => {
            let values = if label_is_int {
                Values::Int64(label_values.iter().map(|&v| v as i64).collect())
            } else {
                Values::Float32(label_values.iter().map(|&v| v as f32).collect())
            };
            let col = Column {
                name: name.clone(),
                values,
                row_splits: Vec::new(),
                inner_shape: Vec::new(),
            };
            Some(label_tensor(&col, name, spec.task, index)?)
        }
        None => None,
    };
    let cpu = &Device::Cpu;
    let err = TrainError::candle;
    let features = Tensor::zeros((sequences, 0), candle_core::DType::F32, cpu)
        .map_err(err("feature tensor"))?;
    let tokens = Tensor::from_vec(token_ids, (rows, *width), cpu).map_err(err("token tensor"))?;
    let mask = Tensor::from_vec(mask, (rows, *width), cpu).map_err(err("token mask"))?;
    let cell_sequence =
        Tensor::from_vec(cell_sequence, cells, cpu).map_err(err("pooling index"))?;
    let lengths: Vec<f32> = lengths.iter().map(|&n| n.max(1) as f32).collect();
    let lengths =
        Tensor::from_vec(lengths, (sequences, 1), cpu).map_err(err("sequence lengths"))?;
    let to_device = |t: Tensor| on_device(t, device);
    Ok(BatchTensors {
        features: to_device(features)?,
        labels: labels.map(to_device).transpose()?,
        tokens: Some(to_device(tokens)?),
        mask: Some(to_device(mask)?),
        pool: Some(Pooling {
            index: to_device(cell_sequence)?,
            lengths: to_device(lengths)?,
        }),
        rows: sequences,
    })
}

/// The token column padded to the batch's longest row: ids `[rows,
/// longest]` (u32, 0 after each row's end) and the mask (1.0 on real tokens).
fn token_tensors(
    col: &Column,
    rows: usize,
    spec: &TokenSpec,
    index: u64,
) -> Result<(Tensor, Tensor), TrainError> {
    let bad = |reason: String| TrainError::Input {
        batch: index,
        reason,
    };
    let (Values::Int64(ids), [splits]) = (&col.values, col.row_splits.as_slice()) else {
        return Err(bad(format!(
            "token column {:?} is not variable-length int64",
            spec.name
        )));
    };
    if splits.len() != rows + 1 {
        return Err(bad(format!(
            "token column {:?} has {} row splits for {rows} rows",
            spec.name,
            splits.len()
        )));
    }
    let longest = splits
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut padded = vec![0u32; rows * longest];
    let mut mask = vec![0f32; rows * longest];
    for row in 0..rows {
        let row_ids = ids.get(splits[row]..splits[row + 1]).unwrap_or(&[]);
        for (i, &id) in row_ids.iter().enumerate() {
            let fits = id >= 0 && spec.vocab.is_none_or(|v| (id as u64) < v as u64);
            if !fits || id > i64::from(u32::MAX) {
                return Err(bad(format!(
                    "row {row}: token id {id} in {:?} is outside 0..{} (the vocabulary size)",
                    spec.name,
                    spec.vocab.map_or("2^32".into(), |v| v.to_string())
                )));
            }
            padded[row * longest + i] = id as u32;
            mask[row * longest + i] = 1.0;
        }
    }
    let err = TrainError::candle("token tensor");
    let ids = Tensor::from_vec(padded, (rows, longest), &Device::Cpu).map_err(err)?;
    let mask = Tensor::from_vec(mask, (rows, longest), &Device::Cpu)
        .map_err(TrainError::candle("token mask"))?;
    Ok((ids, mask))
}

/// The label column as class ids (u32) or regression targets (f32), `[rows]`.
fn label_tensor(col: &Column, name: &str, task: Task, batch: u64) -> Result<Tensor, TrainError> {
    let rows = col.values.len();
    let bad = |reason: String| TrainError::Input { batch, reason };
    let t = match (task, &col.values) {
        (Task::Classification { classes }, Values::Int64(values)) => {
            let mut ids = Vec::with_capacity(rows);
            for (row, &v) in values.iter().enumerate() {
                if v < 0 || v as u64 >= classes as u64 {
                    return Err(TrainError::Label {
                        batch,
                        row,
                        location: None,
                        name: name.into(),
                        value: v,
                        classes,
                    });
                }
                ids.push(v as u32);
            }
            Tensor::from_vec(ids, rows, &Device::Cpu)
        }
        (Task::Classification { .. }, _) => {
            return Err(bad(format!("label {name:?} is not int64 class ids")));
        }
        (Task::Regression, Values::Float32(v)) => Tensor::from_slice(v, rows, &Device::Cpu),
        (Task::Regression, Values::Int64(v)) => {
            Tensor::from_vec(v.iter().map(|&x| x as f32).collect(), rows, &Device::Cpu)
        }
        (Task::Regression, _) => {
            return Err(bad(format!(
                "label {name:?} is not a float32 or int64 value"
            )));
        }
    };
    t.map_err(TrainError::candle("label tensor"))
}

/// Applies `spec.standardize` in place to `data` (`[rows, inputs]`, features
/// side by side in each row).
fn standardize(data: &mut [f32], spec: &InputSpec) -> Result<(), String> {
    if spec.standardize.is_empty() || spec.standardize.iter().all(Standardize::is_identity) {
        return Ok(());
    }
    if spec.standardize.len() != spec.features.len() {
        return Err(format!(
            "the input spec has {} standardisation entries for {} features",
            spec.standardize.len(),
            spec.features.len()
        ));
    }
    let inputs = spec.inputs();
    for row in data.chunks_exact_mut(inputs.max(1)) {
        let mut at = 0;
        for ((_, width), s) in spec.features.iter().zip(&spec.standardize) {
            if !s.is_identity() {
                for x in &mut row[at..at + width] {
                    *x = (*x - s.mean) / s.std;
                }
            }
            at += width;
        }
    }
    Ok(())
}

fn take_column(batch: &mut Batch, name: &str) -> Option<Column> {
    let i = batch.columns.iter().position(|c| c.name == name)?;
    Some(batch.columns.swap_remove(i))
}

fn check_dense(col: &Column, rows: usize, width: usize) -> Result<(), String> {
    if !col.row_splits.is_empty() {
        return Err(format!(
            "column {:?} is variable-length; the models need a fixed shape",
            col.name
        ));
    }
    if matches!(col.values, Values::Bytes { .. }) {
        return Err(format!(
            "column {:?} holds byte strings, not numbers",
            col.name
        ));
    }
    if col.values.len() != rows * width {
        return Err(format!(
            "column {:?} has {} values for {rows} rows; expected {width} per row",
            col.name,
            col.values.len()
        ));
    }
    Ok(())
}

fn append_f32(values: &Values, out: &mut Vec<f32>) {
    append_row_f32(values, 0, values.len(), out)
}

fn append_row_f32(values: &Values, start: usize, len: usize, out: &mut Vec<f32>) {
    match values {
        Values::Float32(v) => out.extend_from_slice(&v[start..start + len]),
        // uint8 pixels to [0, 1], as Keras' Rescaling(1/255) does.
        Values::Uint8(v) => out.extend(v[start..start + len].iter().map(|&b| f32::from(b) / 255.0)),
        Values::Int64(v) => out.extend(v[start..start + len].iter().map(|&x| int_value(x))),
        Values::Int16(v) => out.extend(v[start..start + len].iter().map(|&x| f32::from(x))),
        Values::Uint16(v) => out.extend(v[start..start + len].iter().map(|&x| f32::from(x))),
        Values::Int32(v) => out.extend(v[start..start + len].iter().map(|&x| x as f32)),
        Values::Float64(v) => out.extend(v[start..start + len].iter().map(|&x| x as f32)),
        // Refused by check_dense before we get here.
        Values::Bytes { .. } | Values::Sparse { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_images_size_alone_is_refused_as_the_only_input() {
        let mut schema = Schema::from_feature_texts(&[
            "image/encoded:bytes",
            "image/height:int64",
            "image/width:int64",
            "image/class/label:int64",
        ])
        .unwrap();
        schema.label = Some("image/class/label".into());
        let task = Task::Classification { classes: 10 };
        let Err(err) = InputSpec::from_schema(&schema, task) else {
            panic!("refused");
        };
        assert!(err.to_string().contains("image's size"), "{err}");
        assert!(err.to_string().contains("image/encoded:image:"), "{err}");
        // Declared as an image (the ImageNet layout converted by tfpipe),
        // the image alone is the input: its size is metadata beside it.
        let mut schema = Schema::from_feature_texts(&[
            "image/encoded:image:32x32x3",
            "image/height:int64",
            "image/width:int64",
            "image/class/label:int64",
        ])
        .unwrap();
        schema.label = Some("image/class/label".into());
        let chosen = InputSpec::from_schema(&schema, task).unwrap();
        assert_eq!(
            chosen.spec.features,
            vec![("image/encoded".to_string(), 32 * 32 * 3)]
        );
        let skipped: Vec<String> = chosen.skipped.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            skipped,
            [
                "image/height (an image's size, beside the image)",
                "image/width (an image's size, beside the image)"
            ]
        );
        assert_eq!(chosen.schema.features.len(), 2);
        // With pixels beside them, the size is an input like any other.
        let mut schema =
            Schema::from_feature_texts(&["pixels:uint8:4", "height:int64", "label:int64"]).unwrap();
        schema.label = Some("label".into());
        assert!(InputSpec::from_schema(&schema, task).is_ok());
    }

    fn col(name: &str, values: Values, width: usize) -> Column {
        Column {
            name: name.into(),
            values,
            row_splits: vec![],
            inner_shape: vec![width],
        }
    }

    fn spec(features: &[(&str, usize)]) -> InputSpec {
        InputSpec {
            features: features.iter().map(|(n, w)| (n.to_string(), *w)).collect(),
            label: Some("label".into()),
            task: Task::Classification { classes: 3 },
            standardize: vec![],
            tokens: None,
            impute: None,
        }
    }

    #[test]
    fn uint8_scaled_and_labels_as_ids() {
        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("image", Values::Uint8(vec![0, 255, 51, 102]), 2),
                col("label", Values::Int64(vec![2, 0]), 1),
            ],
        };
        let t = batch_to_tensors(batch, &spec(&[("image", 2)]), 0, &Device::Cpu).unwrap();
        let x: Vec<Vec<f32>> = t.features.to_vec2().unwrap();
        assert_eq!(x, vec![vec![0.0, 1.0], vec![0.2, 0.4]]);
        assert_eq!(t.labels.unwrap().to_vec1::<u32>().unwrap(), vec![2, 0]);
    }

    #[test]
    fn float32_moves_without_copy_and_features_interleave() {
        let data = vec![1.0f32, 2.0, 3.0, 4.0];
        let ptr = data.as_ptr();
        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("x", Values::Float32(data), 2),
                col("label", Values::Int64(vec![1, 1]), 1),
            ],
        };
        let t = batch_to_tensors(batch, &spec(&[("x", 2)]), 0, &Device::Cpu).unwrap();
        let (storage, _) = t.features.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else {
            panic!("not cpu")
        };
        assert_eq!(cpu.as_slice::<f32>().unwrap().as_ptr(), ptr);
        drop(storage);

        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("a", Values::Float32(vec![1.0, 2.0]), 1),
                col("b", Values::Int64(vec![10, 20, 30, 40]), 2),
                col("label", Values::Int64(vec![0, 1]), 1),
            ],
        };
        let t = batch_to_tensors(batch, &spec(&[("a", 1), ("b", 2)]), 0, &Device::Cpu).unwrap();
        let x: Vec<Vec<f32>> = t.features.to_vec2().unwrap();
        assert_eq!(x, vec![vec![1.0, 10.0, 20.0], vec![2.0, 30.0, 40.0]]);
    }

    #[test]
    fn bad_batches_name_the_problem() {
        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("x", Values::Float32(vec![1.0; 4]), 2),
                col("label", Values::Int64(vec![1, 7]), 1),
            ],
        };
        let err = batch_to_tensors(batch, &spec(&[("x", 2)]), 5, &Device::Cpu).unwrap_err();
        assert_eq!(
            err.to_string(),
            "batch 5: row 1: label \"label\" = 7 is outside 0..3 (the number of classes is 3)"
        );
        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("x", Values::Float32(vec![1.0; 3]), 2),
                col("label", Values::Int64(vec![1, 1]), 1),
            ],
        };
        let err = batch_to_tensors(batch, &spec(&[("x", 2)]), 0, &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("has 3 values for 2 rows"), "{err}");
    }

    #[test]
    fn from_schema_takes_fixed_numbers_and_skips_the_rest() {
        use crate::example::FeatureSpec;
        let mut schema = Schema::from_feature_texts(&[
            "species:int64",
            "island:bytes",
            "bill:float32",
            "image:uint8:2x3",
            "year:int64",
        ])
        .unwrap();
        schema.features.push(FeatureSpec {
            name: "tags".into(),
            dtype: DType::Int64,
            layout: Layout::Var,
            default: None,
            image: None,
        });
        schema.features.push(FeatureSpec {
            name: "frames".into(),
            dtype: DType::Float32,
            layout: Layout::FixedSequence(vec![2]),
            default: None,
            image: None,
        });
        // Only the first variable-length int64 feature is the token input.
        schema.features.push(FeatureSpec {
            name: "more_tags".into(),
            dtype: DType::Int64,
            layout: Layout::Var,
            default: None,
            image: None,
        });
        schema.label = Some("species".into());
        let chosen = InputSpec::from_schema(&schema, Task::Classification { classes: 3 }).unwrap();
        assert_eq!(
            chosen.spec.tokens,
            Some(TokenSpec {
                name: "tags".into(),
                vocab: None
            })
        );
        assert_eq!(
            chosen.spec.features,
            vec![
                ("bill".to_string(), 1),
                ("image".to_string(), 6),
                ("year".to_string(), 1)
            ]
        );
        assert_eq!(chosen.spec.inputs(), 8);
        assert_eq!(chosen.spec.label.as_deref(), Some("species"));
        assert_eq!(chosen.spec.task, Task::Classification { classes: 3 });
        assert_eq!(
            join(&chosen.skipped),
            "island (bytes), frames (sequence), more_tags (variable-length)"
        );
        // The parse schema: the inputs and the label, in schema order.
        let names: Vec<&str> = chosen
            .schema
            .features
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(names, ["species", "bill", "image", "year", "tags"]);
        assert_eq!(chosen.schema.label.as_deref(), Some("species"));

        // Nothing numeric left besides the label: an error that says what is needed.
        let mut only_text = Schema::from_feature_texts(&["species:int64", "island:bytes"]).unwrap();
        only_text.label = Some("species".into());
        let err = InputSpec::from_schema(&only_text, Task::Classification { classes: 3 })
            .unwrap_err()
            .to_string();
        assert!(err.contains("inputs: none besides the label"), "{err}");
        assert!(err.contains("island (bytes)"), "{err}");
        assert!(err.contains("fixed-shape int64, float32 or uint8"), "{err}");

        // A text label is a class name (the pipeline maps it to its id,
        // `LabelClasses`), never a regression target.
        let mut text_label = Schema::from_feature_texts(&["species:bytes", "x:float32"]).unwrap();
        text_label.label = Some("species".into());
        assert!(InputSpec::from_schema(&text_label, Task::Classification { classes: 3 }).is_ok());
        let err = InputSpec::from_schema(&text_label, Task::Regression)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("must be one float32 or int64 value per example"),
            "{err}"
        );
        assert!(err.contains("(it is bytes, scalar)"), "{err}");
        // A float label is a regression target.
        let mut float_label = Schema::from_feature_texts(&["mpg:float32", "x:float32"]).unwrap();
        float_label.label = Some("mpg".into());
        assert!(InputSpec::from_schema(&float_label, Task::Classification { classes: 3 }).is_err());
        let chosen = InputSpec::from_schema(&float_label, Task::Regression).unwrap();
        assert_eq!(chosen.spec.features, vec![("x".to_string(), 1)]);
    }

    #[test]
    fn classes_come_from_a_recorded_label_vocabulary() {
        let meta = |v: serde_json::Value| v.as_object().unwrap().clone();
        assert_eq!(
            classes_from_metadata(&meta(serde_json::json!({
                "records": 344,
                "source": { "label_vocabulary": ["Adelie", "Chinstrap", "Gentoo"] }
            }))),
            Some(3)
        );
        assert_eq!(
            classes_from_metadata(&meta(serde_json::json!({
                "source": { "format": "images", "classes": ["cat", "dog"] }
            }))),
            Some(2)
        );
        assert_eq!(
            classes_from_metadata(&meta(
                serde_json::json!({ "source": { "label_counts": { "0": 5 } } })
            )),
            None
        );
        assert_eq!(classes_from_metadata(&Map::new()), None);
    }

    #[test]
    fn imputed_inputs_skip_their_markers_in_the_statistics_and_get_an_indicator() {
        let mut schema = Schema::from_feature_texts(&[
            "hp:int64=0",
            "mass:float32=0",
            "year:int64",
            "label:int64",
        ])
        .unwrap();
        schema.label = Some("label".into());
        let task = Task::Classification { classes: 3 };
        let chosen = InputSpec::from_schema(&schema, task).unwrap();
        // The defaults mark what may be missing; none is parsed with.
        assert_eq!(chosen.may_be_missing, ["hp", "mass"]);
        assert!(chosen.schema.features.iter().all(|f| f.default.is_none()));
        assert_eq!(chosen.spec.parse_schema(&chosen.schema), chosen.schema);
        let mut spec = chosen.impute(Impute::Mean).spec;
        assert_eq!(spec.inputs(), 5);
        let nan = f32::NAN;
        let batch = || Batch {
            num_rows: 3,
            columns: vec![
                col("hp", Values::Int64(vec![100, MISSING_INT64, 300]), 1),
                col("mass", Values::Float32(vec![nan, 2.0, 4.0]), 1),
                col("year", Values::Int64(vec![1, 2, 3]), 1),
                col("label", Values::Int64(vec![0, 1, 2]), 1),
            ],
        };
        spec.standardize = Standardize::from_batch(&batch(), &spec);
        assert_eq!(
            spec.standardize[0],
            Standardize {
                mean: 200.0,
                std: 100.0
            }
        );
        assert_eq!(
            spec.standardize[1],
            Standardize {
                mean: 3.0,
                std: 1.0
            }
        );
        let x: Vec<Vec<f32>> = batch_to_tensors(batch(), &spec, 0, &Device::Cpu)
            .unwrap()
            .features
            .to_vec2()
            .unwrap();
        let year = |v: f32| (v - 2.0) / (2f32 / 3.0).sqrt();
        // hp, mass, year, then the indicators of hp and mass.
        let expected = [
            [-1.0, 0.0, year(1.0), 0.0, 1.0],
            [0.0, -1.0, year(2.0), 1.0, 0.0],
            [1.0, 1.0, year(3.0), 0.0, 0.0],
        ];
        for (row, want) in x.iter().zip(expected) {
            assert_eq!(row.len(), 5);
            for (got, want) in row.iter().zip(want) {
                assert!((got - want).abs() < 1e-5, "{x:?}");
            }
        }
        // `zero` fills the value 0, then standardises it like the others.
        spec.impute = Some(Imputation {
            fill: Impute::Zero,
            features: vec!["hp".into(), "mass".into()],
        });
        let x: Vec<Vec<f32>> = batch_to_tensors(batch(), &spec, 0, &Device::Cpu)
            .unwrap()
            .features
            .to_vec2()
            .unwrap();
        assert_eq!((x[0][1], x[1][0]), (-3.0, -2.0));
    }

    #[test]
    fn standardisation_from_a_batch_and_applied() {
        let batch = Batch {
            num_rows: 4,
            columns: vec![
                col("mass", Values::Int64(vec![3000, 5000, 3000, 5000]), 1),
                col("bill", Values::Float32(vec![1.0, 1.0, 1.0, 1.0]), 1),
                col("image", Values::Uint8(vec![0, 255, 0, 255]), 1),
                col("label", Values::Int64(vec![0, 1, 2, 0]), 1),
            ],
        };
        let mut three = spec(&[("mass", 1), ("bill", 1), ("image", 1)]);
        let stats = Standardize::from_batch(&batch, &three);
        assert_eq!(
            stats,
            vec![
                Standardize {
                    mean: 4000.0,
                    std: 1000.0
                },
                // Constant: centred only.
                Standardize {
                    mean: 1.0,
                    std: 1.0
                },
                // uint8 is already in [0,1].
                Standardize::IDENTITY,
            ]
        );
        three.standardize = stats;
        let t = batch_to_tensors(batch, &three, 0, &Device::Cpu).unwrap();
        let x: Vec<Vec<f32>> = t.features.to_vec2().unwrap();
        assert_eq!(
            x,
            vec![
                vec![-1.0, 0.0, 0.0],
                vec![1.0, 0.0, 1.0],
                vec![-1.0, 0.0, 0.0],
                vec![1.0, 0.0, 1.0]
            ]
        );

        // The single-float32 path standardises in place.
        let batch = Batch {
            num_rows: 2,
            columns: vec![
                col("x", Values::Float32(vec![2.0, 4.0, 6.0, 8.0]), 2),
                col("label", Values::Int64(vec![0, 1]), 1),
            ],
        };
        let mut single = spec(&[("x", 2)]);
        single.standardize = Standardize::from_batch(&batch, &single);
        let s = single.standardize[0];
        assert_eq!(s.mean, 5.0);
        assert!((s.std - 5f32.sqrt()).abs() < 1e-6);
        let t = batch_to_tensors(batch, &single, 0, &Device::Cpu).unwrap();
        let x: Vec<Vec<f32>> = t.features.to_vec2().unwrap();
        assert!((x[0][0] + 3.0 / 5f32.sqrt()).abs() < 1e-6, "{x:?}");
        assert!((x[1][1] - 3.0 / 5f32.sqrt()).abs() < 1e-6, "{x:?}");
    }
}
