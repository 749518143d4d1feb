//! Models: the [`Model`] trait every model trains through, the [`Task`] that
//! chooses loss and metrics, and the built-in models ([`BuiltinModel`]): an
//! MLP with hidden sizes from flags, a LeNet-like CNN for images of any
//! size (28x28x1 by default), and
//! an embedding model for token ids (embedding -> masked mean pooling ->
//! MLP), which `tfpipe train` picks when the schema's input is a
//! variable-length int64 feature.
//! Plain structs built from a `VarBuilder`, as candle-nn does it.
//!
//! Weights are initialised from our own seeded generator (candle's CPU
//! generator cannot be seeded), so the same seed gives the same model
//! ([`seed_vars`] does it for any model's `VarMap`).

use candle_core::{D, DType, Device, Tensor};
use candle_nn::{Conv2d, Conv2dConfig, Linear, VarBuilder, VarMap};
use serde::{Deserialize, Serialize};

use super::ops;
use super::tensor::BatchTensors;
use super::{Setting, TrainError};

/// What a model learns, which chooses the loss and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Class ids in `0..classes`: the model outputs logits `[rows, classes]`;
    /// softmax cross-entropy loss; accuracy.
    Classification {
        /// The number of classes.
        classes: usize,
    },
    /// A float32 value: the model outputs `[rows]` or `[rows, 1]`; mean
    /// squared error loss; MAE and RMSE.
    Regression,
}

impl Task {
    /// The number of classes, for classification.
    pub fn classes(&self) -> Option<usize> {
        match self {
            Task::Classification { classes } => Some(*classes),
            Task::Regression => None,
        }
    }

    /// The output width a model must produce: `classes`, or 1.
    pub fn outputs(&self) -> usize {
        self.classes().unwrap_or(1)
    }

    /// The name of the task's headline metric in reports and TensorBoard.
    pub fn metric_name(&self) -> &'static str {
        match self {
            Task::Classification { .. } => "accuracy",
            Task::Regression => "mae",
        }
    }
}

/// A model the [`Trainer`](super::Trainer) can train: any candle model,
/// given a forward pass from a batch's tensors and the task it learns.
///
/// Its variables live in a `VarMap` handed to the trainer beside it (for the
/// optimizer and checkpoints).
///
/// ```
/// use candle_core::{Module, Tensor};
/// use candle_nn::{Linear, VarBuilder};
/// use tfpipe::train::{BatchTensors, Model, Task};
///
/// /// Logistic regression.
/// struct Linear1(Linear);
///
/// impl Model for Linear1 {
///     fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor> {
///         self.0.forward(&batch.features)
///     }
///     fn task(&self) -> Task {
///         Task::Classification { classes: 2 }
///     }
/// }
///
/// let varmap = candle_nn::VarMap::new();
/// let vb = VarBuilder::from_varmap(&varmap, candle_core::DType::F32, &candle_core::Device::Cpu);
/// let model = Linear1(candle_nn::linear(4, 2, vb.pp("fc"))?);
/// assert_eq!(model.describe(), "custom model");
/// # Ok::<(), candle_core::Error>(())
/// ```
pub trait Model: Send {
    /// The outputs for `batch`: logits `[rows, classes]` for classification,
    /// `[rows]` or `[rows, 1]` for regression.
    fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor>;

    /// What the model learns.
    fn task(&self) -> Task;

    /// A one-line description for reports, e.g. `mlp 784-256-10`.
    fn describe(&self) -> String {
        "custom model".into()
    }

    /// The outputs in training (`train = true`: the trainer's steps) or
    /// evaluation mode (`false`: evaluation, validation and prediction),
    /// for layers that differ between them, such as dropout and batch
    /// normalisation (candle's `ModuleT` convention). By default both
    /// modes are [`forward`](Self::forward).
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use tfpipe::train::{BatchTensors, Model, Task};
    ///
    /// /// Zeroes every input while training (a stand-in for dropout).
    /// struct Dropping;
    ///
    /// impl Model for Dropping {
    ///     fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor> {
    ///         Ok(batch.features.clone())
    ///     }
    ///     fn forward_t(&self, batch: &BatchTensors, train: bool) -> candle_core::Result<Tensor> {
    ///         if train { batch.features.zeros_like() } else { self.forward(batch) }
    ///     }
    ///     fn task(&self) -> Task {
    ///         Task::Regression
    ///     }
    /// }
    ///
    /// let features = Tensor::ones((2, 1), candle_core::DType::F32, &Device::Cpu)?;
    /// let batch = BatchTensors { features, labels: None, tokens: None, mask: None, pool: None, rows: 2 };
    /// assert_eq!(Dropping.forward_t(&batch, true)?.sum_all()?.to_scalar::<f32>()?, 0.0);
    /// assert_eq!(Dropping.forward_t(&batch, false)?.sum_all()?.to_scalar::<f32>()?, 2.0);
    /// # Ok::<(), candle_core::Error>(())
    /// ```
    fn forward_t(&self, batch: &BatchTensors, train: bool) -> candle_core::Result<Tensor> {
        let _ = train;
        self.forward(batch)
    }

    /// The scalar loss the trainer minimises, from this model's `outputs`
    /// and the batch's `labels`. By default the task's: softmax
    /// cross-entropy over logits for classification (labels are class
    /// ids), mean squared error for regression. Override it for another
    /// objective (label smoothing, a weighted loss, an auxiliary term); the
    /// reported loss, validation loss and `keep_best` use it too.
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use tfpipe::train::{BatchTensors, Model, Task};
    ///
    /// /// Mean absolute error instead of mean squared error.
    /// struct Absolute;
    ///
    /// impl Model for Absolute {
    ///     fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor> {
    ///         batch.features.squeeze(1)
    ///     }
    ///     fn task(&self) -> Task {
    ///         Task::Regression
    ///     }
    ///     fn loss(&self, outputs: &Tensor, labels: &Tensor) -> candle_core::Result<Tensor> {
    ///         (outputs - labels)?.abs()?.mean_all()
    ///     }
    /// }
    ///
    /// let outputs = Tensor::new(&[1f32, 4.0], &Device::Cpu)?;
    /// let labels = Tensor::new(&[0f32, 2.0], &Device::Cpu)?;
    /// assert_eq!(Absolute.loss(&outputs, &labels)?.to_scalar::<f32>()?, 1.5);
    /// # Ok::<(), candle_core::Error>(())
    /// ```
    fn loss(&self, outputs: &Tensor, labels: &Tensor) -> candle_core::Result<Tensor> {
        super::objective::task_loss(self.task(), outputs, labels)
    }
}

/// A boxed model is a model.
impl<M: Model + ?Sized> Model for Box<M> {
    fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor> {
        (**self).forward(batch)
    }

    fn task(&self) -> Task {
        (**self).task()
    }

    fn describe(&self) -> String {
        (**self).describe()
    }

    fn forward_t(&self, batch: &BatchTensors, train: bool) -> candle_core::Result<Tensor> {
        (**self).forward_t(batch, train)
    }

    fn loss(&self, outputs: &Tensor, labels: &Tensor) -> candle_core::Result<Tensor> {
        (**self).loss(outputs, labels)
    }
}

/// Which built-in model, and its sizes. Stored in checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelConfig {
    /// A classifier: `inputs -> hidden[0] -> ... -> classes`, ReLU between layers.
    Mlp {
        /// Input values per example.
        inputs: usize,
        /// Hidden layer sizes, in order.
        hidden: Vec<usize>,
        /// The number of classes.
        classes: usize,
    },
    /// The same MLP with one output, for regression.
    Regressor {
        /// Input values per example.
        inputs: usize,
        /// Hidden layer sizes, in order.
        hidden: Vec<usize>,
    },
    /// LeNet-5-like over `[H, W, C]` images (NHWC, 28x28x1 by default):
    /// conv 5x5 (6, padded) -> pool -> conv 5x5 (16) -> pool -> flatten
    /// (400 at 28x28) -> 120 -> 84 -> classes.
    Cnn {
        /// The number of classes.
        classes: usize,
        /// The input image. Checkpoints written before it was a setting
        /// hold none: theirs is 28x28x1, which is also left unwritten.
        #[serde(default, skip_serializing_if = "ImageShape::is_default")]
        image: ImageShape,
    },
    /// A bag-of-tokens classifier: each token id in `0..vocab` looks up a
    /// `dim`-wide embedding; the embeddings of a row's real tokens (the
    /// mask) are averaged; the average, beside the row's `inputs` dense
    /// features when there are any, feeds an MLP `hidden -> classes`.
    Embedding {
        /// Token ids are in `0..vocab`: the embedding table's rows.
        vocab: usize,
        /// The embedding width.
        dim: usize,
        /// Input values per example.
        inputs: usize,
        /// Hidden layer sizes, in order.
        hidden: Vec<usize>,
        /// The number of classes.
        classes: usize,
    },
}

/// The input image of the [CNN](ModelConfig::Cnn): `height x width x
/// channels`, read in that (NHWC) order from each example's values.
///
/// ```
/// use tfpipe::train::{ImageShape, ModelConfig};
/// let image = ImageShape::new(64, 48, 3);
/// let cnn = ModelConfig::cnn(10, image);
/// assert_eq!(cnn.inputs(), 64 * 48 * 3);
/// assert_eq!(cnn.describe(), "cnn lenet 3x64x48-10");
/// assert_eq!(ImageShape::default().to_string(), "28x28x1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageShape {
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// Channels (1 grey, 3 RGB, ...).
    pub channels: usize,
}

impl Default for ImageShape {
    /// 28x28x1, MNIST's: the CNN's input before the size was a setting.
    fn default() -> ImageShape {
        ImageShape::new(28, 28, 1)
    }
}

impl std::fmt::Display for ImageShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.height, self.width, self.channels)
    }
}

impl ImageShape {
    /// The smallest side the CNN takes: its second convolution (5x5,
    /// unpadded) and the pooling around it leave at least one value.
    pub const MIN_SIDE: usize = 12;

    /// `height x width x channels`.
    pub const fn new(height: usize, width: usize, channels: usize) -> ImageShape {
        ImageShape {
            height,
            width,
            channels,
        }
    }

    /// Whether this is the default 28x28x1.
    pub fn is_default(&self) -> bool {
        *self == ImageShape::default()
    }

    /// Values per image (saturating, so absurd sizes can be refused).
    pub fn values(&self) -> usize {
        self.height
            .saturating_mul(self.width)
            .saturating_mul(self.channels)
    }

    /// The CNN's feature map after the second pooling: `(rows, columns)`
    /// (5x5 at 28x28). Each 2x2 pooling drops an odd edge, as candle's.
    fn pooled(&self) -> (usize, usize) {
        let side = |n: usize| (n / 2).saturating_sub(4) / 2;
        (side(self.height), side(self.width))
    }

    /// The CNN's flattened features before its dense layers (400 at 28x28).
    fn flattened(&self) -> usize {
        let (h, w) = self.pooled();
        16usize.saturating_mul(h).saturating_mul(w)
    }
}

impl ModelConfig {
    /// The LeNet-like CNN over `image`, with `classes` outputs.
    pub fn cnn(classes: usize, image: ImageShape) -> ModelConfig {
        ModelConfig::Cnn { classes, image }
    }

    /// An MLP for `task`: a classifier, or a regressor with one output.
    pub fn mlp(inputs: usize, hidden: Vec<usize>, task: Task) -> ModelConfig {
        match task {
            Task::Classification { classes } => ModelConfig::Mlp {
                inputs,
                hidden,
                classes,
            },
            Task::Regression => ModelConfig::Regressor { inputs, hidden },
        }
    }

    /// An MLP's (inputs, hidden sizes, outputs).
    fn mlp_layers(&self) -> Option<(usize, &[usize], usize)> {
        match self {
            ModelConfig::Mlp {
                inputs,
                hidden,
                classes,
            } => Some((*inputs, hidden, *classes)),
            ModelConfig::Regressor { inputs, hidden } => Some((*inputs, hidden, 1)),
            ModelConfig::Cnn { .. } | ModelConfig::Embedding { .. } => None,
        }
    }

    /// The embedding model's MLP: (its inputs, hidden sizes, classes).
    fn head_layers(&self) -> Option<(usize, &[usize], usize)> {
        match self {
            ModelConfig::Embedding {
                dim,
                inputs,
                hidden,
                classes,
                ..
            } => Some((dim + inputs, hidden, *classes)),
            _ => self.mlp_layers(),
        }
    }

    /// The number of input values per example.
    pub fn inputs(&self) -> usize {
        match self {
            ModelConfig::Embedding { inputs, .. } => *inputs,
            ModelConfig::Cnn { image, .. } => image.values(),
            _ => match self.mlp_layers() {
                Some((inputs, _, _)) => inputs,
                None => unreachable!("every other model has its MLP layers"),
            },
        }
    }

    /// The number of outputs: classes, or 1 for regression.
    pub fn classes(&self) -> usize {
        match self {
            ModelConfig::Mlp { classes, .. }
            | ModelConfig::Cnn { classes, .. }
            | ModelConfig::Embedding { classes, .. } => *classes,
            ModelConfig::Regressor { .. } => 1,
        }
    }

    /// What the model learns.
    pub fn task(&self) -> Task {
        match self {
            ModelConfig::Mlp { classes, .. }
            | ModelConfig::Cnn { classes, .. }
            | ModelConfig::Embedding { classes, .. } => Task::Classification { classes: *classes },
            ModelConfig::Regressor { .. } => Task::Regression,
        }
    }

    /// The number of weights and biases, computed without allocating
    /// (saturating, so absurd sizes can be refused with a message).
    pub fn parameters(&self) -> u128 {
        let table = match self {
            ModelConfig::Embedding { vocab, dim, .. } => {
                (*vocab as u128).saturating_mul(*dim as u128)
            }
            _ => 0,
        };
        match self.head_layers() {
            Some((inputs, hidden, outputs)) => {
                let mut total = table;
                let mut width = inputs as u128;
                for &h in hidden.iter().chain(std::iter::once(&outputs)) {
                    let h = h as u128;
                    total = total.saturating_add(width.saturating_mul(h).saturating_add(h));
                    width = h;
                }
                total
            }
            None => {
                let c = self.classes() as u128;
                let image = self.image().unwrap_or_default();
                let channels = image.channels as u128;
                let flat = image.flattened() as u128;
                (6u128.saturating_mul(channels).saturating_mul(25) + 6)
                    .saturating_add(16 * 6 * 25 + 16)
                    .saturating_add(flat.saturating_mul(120).saturating_add(120))
                    .saturating_add((120 * 84 + 84) + 84 * c + c)
            }
        }
    }

    /// The CNN's input image; `None` for the other models.
    pub fn image(&self) -> Option<ImageShape> {
        match self {
            ModelConfig::Cnn { image, .. } => Some(*image),
            _ => None,
        }
    }

    /// The widest layer's output per example (for activation memory).
    pub fn widest_layer(&self) -> usize {
        match self.head_layers() {
            Some((inputs, hidden, outputs)) => hidden
                .iter()
                .copied()
                .chain([inputs, outputs])
                .max()
                .unwrap_or(0),
            None => {
                let image = self.image().unwrap_or_default();
                let conv1 = image.height.saturating_mul(image.width).saturating_mul(6);
                conv1.max(image.values()).max(self.classes())
            }
        }
    }

    /// Checks the sizes before any work starts.
    pub fn validate(&self) -> Result<(), TrainError> {
        if let Task::Classification { classes } = self.task()
            && classes < 2
        {
            return Err(TrainError::config(
                Setting::Classes,
                format!("{classes} classes: a classifier needs at least 2"),
            ));
        }
        if let ModelConfig::Embedding { vocab, dim, .. } = self
            && (*vocab == 0 || *dim == 0)
        {
            return Err(TrainError::config(
                Setting::Embedding,
                format!("{vocab} tokens x {dim}: both must be at least 1"),
            ));
        }
        if let ModelConfig::Cnn { image, .. } = self
            && (image.height.min(image.width) < ImageShape::MIN_SIDE || image.channels == 0)
        {
            return Err(TrainError::config(
                Setting::ImageSize,
                format!(
                    "the CNN's input {image} is too small: it takes images of at least {0}x{0} with 1 channel or more",
                    ImageShape::MIN_SIDE
                ),
            ));
        }
        if let Some((inputs, hidden, _)) = self.head_layers() {
            if inputs == 0 {
                return Err(TrainError::config(
                    Setting::Inputs,
                    "the MLP has no input features",
                ));
            }
            if hidden.contains(&0) {
                return Err(TrainError::config(
                    Setting::HiddenSizes,
                    format!("{hidden:?} contain 0"),
                ));
            }
        }
        Ok(())
    }

    /// A one-line description, e.g. `mlp 784-256-10`.
    pub fn describe(&self) -> String {
        if let ModelConfig::Embedding {
            vocab,
            dim,
            inputs,
            hidden,
            classes,
        } = self
        {
            let mut sizes = vec![(dim + inputs).to_string()];
            sizes.extend(hidden.iter().map(|h| h.to_string()));
            sizes.push(classes.to_string());
            let dense = if *inputs > 0 {
                format!(" + {inputs} dense")
            } else {
                String::new()
            };
            return format!(
                "embedding {vocab}x{dim} mean-pooled{dense} -> mlp {}",
                sizes.join("-")
            );
        }
        match self.mlp_layers() {
            Some((inputs, hidden, outputs)) => {
                let mut sizes = vec![inputs.to_string()];
                sizes.extend(hidden.iter().map(|h| h.to_string()));
                sizes.push(outputs.to_string());
                let kind = if self.task() == Task::Regression {
                    "mlp regressor"
                } else {
                    "mlp"
                };
                format!("{kind} {}", sizes.join("-"))
            }
            None => {
                let image = self.image().unwrap_or_default();
                format!(
                    "cnn lenet {}x{}x{}-{}",
                    image.channels,
                    image.height,
                    image.width,
                    self.classes()
                )
            }
        }
    }
}

enum Net {
    Mlp(Vec<Linear>),
    Embedding {
        table: candle_nn::Embedding,
        head: Vec<Linear>,
    },
    Cnn {
        image: ImageShape,
        conv1: Conv2d,
        conv2: Conv2d,
        fc1: Linear,
        fc2: Linear,
        fc3: Linear,
    },
}

/// A built-in classifier producing logits `[batch, classes]` from `[batch, inputs]` float32.
pub struct BuiltinModel {
    config: ModelConfig,
    net: Net,
}

impl BuiltinModel {
    /// Builds the model's variables in `vb` (created when missing).
    pub fn new(config: ModelConfig, vb: VarBuilder) -> Result<BuiltinModel, TrainError> {
        config.validate()?;
        let net = match (&config, config.mlp_layers()) {
            (_, Some((inputs, hidden, outputs))) => {
                Net::Mlp(linear_stack(inputs, hidden, outputs, &vb)?)
            }
            (ModelConfig::Embedding { vocab, dim, .. }, None) => {
                let Some((inputs, hidden, outputs)) = config.head_layers() else {
                    unreachable!("an embedding model always has its head");
                };
                Net::Embedding {
                    table: candle_nn::embedding(*vocab, *dim, vb.pp("embedding"))
                        .map_err(TrainError::candle("building the embedding"))?,
                    head: linear_stack(inputs, hidden, outputs, &vb)?,
                }
            }
            (ModelConfig::Mlp { .. } | ModelConfig::Regressor { .. }, None) => {
                unreachable!("an MLP always has its layers");
            }
            (ModelConfig::Cnn { classes, image }, _) => {
                let padded = Conv2dConfig {
                    padding: 2,
                    ..Default::default()
                };
                let e = TrainError::candle;
                Net::Cnn {
                    image: *image,
                    conv1: candle_nn::conv2d(image.channels, 6, 5, padded, vb.pp("conv1"))
                        .map_err(e("building conv1"))?,
                    conv2: candle_nn::conv2d(6, 16, 5, Default::default(), vb.pp("conv2"))
                        .map_err(e("building conv2"))?,
                    fc1: candle_nn::linear(image.flattened(), 120, vb.pp("fc1"))
                        .map_err(e("building fc1"))?,
                    fc2: candle_nn::linear(120, 84, vb.pp("fc2")).map_err(e("building fc2"))?,
                    fc3: candle_nn::linear(84, *classes, vb.pp("fc3"))
                        .map_err(e("building fc3"))?,
                }
            }
        };
        Ok(BuiltinModel { config, net })
    }

    /// A fresh model in a new `VarMap` with weights drawn from `seed`.
    pub fn init(
        config: ModelConfig,
        seed: u64,
        device: &Device,
    ) -> Result<(BuiltinModel, VarMap), TrainError> {
        let varmap = VarMap::new();
        let model =
            BuiltinModel::new(config, VarBuilder::from_varmap(&varmap, DType::F32, device))?;
        seed_vars(&varmap, seed, device)?;
        Ok((model, varmap))
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Logits `[batch, classes]` for `xs` of shape `[batch, inputs]`. (The
    /// embedding model needs token ids: use [`Model::forward`].)
    pub fn forward_features(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        match &self.net {
            Net::Mlp(layers) => mlp_forward(layers, xs),
            Net::Embedding { .. } => Err(candle_core::Error::Msg(
                "the embedding model takes token ids: call Model::forward with a batch".into(),
            )),
            Net::Cnn {
                image,
                conv1,
                conv2,
                fc1,
                fc2,
                fc3,
            } => {
                // NHWC through the convolutions, as image features are laid
                // out; the last pool writes NCHW, so that flattening gives
                // candle's order and checkpoints keep their meaning (tested
                // against candle's own layers).
                let b = xs.dim(0)?;
                let h = xs.reshape((b, image.height, image.width, image.channels))?;
                let h = ops::conv2d(&h, conv1.weight(), conv1.bias(), 2, true)?;
                let h = ops::max_pool2x2(&h, false)?;
                let h = ops::conv2d(&h, conv2.weight(), conv2.bias(), 0, true)?;
                let h = ops::max_pool2x2(&h, true)?.flatten_from(1)?;
                let h = dense_relu(fc1, &h)?;
                let h = dense_relu(fc2, &h)?;
                dense(fc3, &h)
            }
        }
    }

    /// Predicted class ids `[batch]` (u32) for `xs`.
    pub fn predict(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_features(xs)?.argmax(D::Minus1)
    }
}

impl Model for BuiltinModel {
    fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor> {
        match &self.net {
            Net::Embedding { table, head } => {
                let pooled = masked_mean(table, batch)?;
                let h = if batch.features.dim(1)? > 0 {
                    Tensor::cat(&[&pooled, &batch.features], 1)?
                } else {
                    pooled
                };
                mlp_forward(head, &h)
            }
            _ => self.forward_features(&batch.features),
        }
    }

    fn task(&self) -> Task {
        self.config.task()
    }

    fn describe(&self) -> String {
        self.config.describe()
    }
}

/// Dense layers `inputs -> hidden... -> outputs`, named `fc0`, `fc1`, ...
fn linear_stack(
    inputs: usize,
    hidden: &[usize],
    outputs: usize,
    vb: &VarBuilder,
) -> Result<Vec<Linear>, TrainError> {
    let mut layers = Vec::with_capacity(hidden.len() + 1);
    let mut width = inputs;
    for (i, &h) in hidden.iter().chain(std::iter::once(&outputs)).enumerate() {
        layers.push(
            candle_nn::linear(width, h, vb.pp(format!("fc{i}")))
                .map_err(TrainError::candle("building the model"))?,
        );
        width = h;
    }
    Ok(layers)
}

/// ReLU between the layers, none after the last.
fn mlp_forward(layers: &[Linear], xs: &Tensor) -> candle_core::Result<Tensor> {
    let Some((last, hidden)) = layers.split_last() else {
        return Ok(xs.clone());
    };
    let mut h = xs.clone();
    for layer in hidden {
        h = dense_relu(layer, &h)?;
    }
    dense(last, &h)
}

/// The mean of each row's token embeddings over its real tokens (the mask):
/// `sum_t mask[r, t] * E[ids[r, t]] / max(1, sum_t mask[r, t])`, `[rows, dim]`.
/// A row without tokens pools to zeros.
fn masked_mean(table: &candle_nn::Embedding, batch: &BatchTensors) -> candle_core::Result<Tensor> {
    let (Some(ids), Some(mask)) = (&batch.tokens, &batch.mask) else {
        return Err(candle_core::Error::Msg(
            "the embedding model needs token ids: the batch has none".into(),
        ));
    };
    let embedded = candle_core::Module::forward(table, ids)?; // [rows, longest, dim]
    if let Some(pool) = &batch.pool {
        // Packed rows: each sequence's mean over its own cells.
        let (rows, width, dim) = embedded.dims3()?;
        let cells = embedded.reshape((rows * width, dim))?;
        // One extra row takes the padding's sum, then goes.
        let zeros = Tensor::zeros((batch.rows + 1, dim), cells.dtype(), cells.device())?;
        let sums = zeros
            .index_add(&pool.index, &cells, 0)?
            .narrow(0, 0, batch.rows)?;
        return sums.broadcast_div(&pool.lengths); // [sequences, dim]
    }
    let summed = embedded.broadcast_mul(&mask.unsqueeze(2)?)?.sum(1)?; // [rows, dim]
    let counts = mask.sum_keepdim(1)?.clamp(1f32, f32::MAX)?; // [rows, 1]
    summed.broadcast_div(&counts)
}

/// A dense layer: `x W^T + b`, one fused GEMM on the CPU ([`ops::linear`]).
pub(crate) fn dense(layer: &Linear, x: &Tensor) -> candle_core::Result<Tensor> {
    ops::linear(x, layer.weight(), layer.bias(), false)
}

/// A dense layer followed by ReLU, fused the same way.
pub(crate) fn dense_relu(layer: &Linear, x: &Tensor) -> candle_core::Result<Tensor> {
    ops::linear(x, layer.weight(), layer.bias(), true)
}

/// Overwrites every variable with He-uniform weights (bound `sqrt(6 / fan_in)`)
/// and zero biases, from a SplitMix64 stream seeded by `seed` and the
/// variable's name, so the result does not depend on `HashMap` order.
///
/// Any model's `VarMap` can be seeded this way (custom models included).
pub fn seed_vars(varmap: &VarMap, seed: u64, device: &Device) -> Result<(), TrainError> {
    let data = varmap
        .data()
        .lock()
        // A panic elsewhere cannot leave the map half-written: seeding rewrites every variable.
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (name, var) in data.iter() {
        let dims = var.dims().to_vec();
        let count: usize = dims.iter().product();
        let values: Vec<f32> = if dims.len() < 2 {
            vec![0.0; count]
        } else {
            let fan_in: usize = dims[1..].iter().product();
            let bound = (6.0 / fan_in as f64).sqrt();
            let mut rng = crate::rng::SplitMix64(seed ^ fnv1a(name.as_bytes()));
            (0..count)
                .map(|_| ((rng.unit() * 2.0 - 1.0) * bound) as f32)
                .collect()
        };
        let t = Tensor::from_vec(values, dims, device)
            .map_err(TrainError::candle("initialising weights"))?;
        var.set(&t)
            .map_err(TrainError::candle("initialising weights"))?;
    }
    Ok(())
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Module;

    #[test]
    fn mlp_shapes_and_seeded_init() {
        let config = ModelConfig::Mlp {
            inputs: 4,
            hidden: vec![8],
            classes: 3,
        };
        let (a, _) = BuiltinModel::init(config.clone(), 7, &Device::Cpu).unwrap();
        let (b, _) = BuiltinModel::init(config.clone(), 7, &Device::Cpu).unwrap();
        let (c, _) = BuiltinModel::init(config, 8, &Device::Cpu).unwrap();
        let xs = Tensor::arange(0f32, 8.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 4))
            .unwrap();
        let ya: Vec<Vec<f32>> = a.forward_features(&xs).unwrap().to_vec2().unwrap();
        let yb: Vec<Vec<f32>> = b.forward_features(&xs).unwrap().to_vec2().unwrap();
        let yc: Vec<Vec<f32>> = c.forward_features(&xs).unwrap().to_vec2().unwrap();
        assert_eq!(ya.len(), 2);
        assert_eq!(ya[0].len(), 3);
        assert_eq!(ya, yb);
        assert_ne!(ya, yc);
    }

    #[test]
    fn cnn_takes_784_inputs() {
        let config = ModelConfig::cnn(10, ImageShape::default());
        let (m, vars) = BuiltinModel::init(config.clone(), 1, &Device::Cpu).unwrap();
        let xs = Tensor::zeros((3, 784), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(m.forward_features(&xs).unwrap().dims(), &[3, 10]);
        assert_eq!(vars.all_vars().len(), 10);
        let counted: usize = vars.all_vars().iter().map(|v| v.elem_count()).sum();
        assert_eq!(config.parameters(), counted as u128);
        // Checkpoints written before the size was a setting read as 28x28x1,
        // and a 28x28x1 CNN is still written without it.
        let old: ModelConfig = serde_json::from_str(r#"{"kind":"cnn","classes":10}"#).unwrap();
        assert_eq!(old, config);
        assert_eq!(
            serde_json::to_string(&config).unwrap(),
            r#"{"kind":"cnn","classes":10}"#
        );
    }

    /// Any image size and channel count: the first convolution takes the
    /// channels, the first dense layer the flattened map (16 x 1 x 3 at
    /// 13x29), and the size travels in the checkpoint's config.
    #[test]
    fn cnn_takes_any_image_size() {
        let image = ImageShape::new(13, 29, 3);
        let config = ModelConfig::cnn(4, image);
        let (m, vars) = BuiltinModel::init(config.clone(), 1, &Device::Cpu).unwrap();
        let xs = Tensor::zeros((2, 13 * 29 * 3), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(m.forward_features(&xs).unwrap().dims(), &[2, 4]);
        let counted: usize = vars.all_vars().iter().map(|v| v.elem_count()).sum();
        assert_eq!(config.parameters(), counted as u128);
        assert_eq!(config.inputs(), 13 * 29 * 3);
        assert_eq!(config.describe(), "cnn lenet 3x13x29-4");
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), config);
        // Below 12 pixels a side the second pooling has nothing left.
        let small = ModelConfig::cnn(4, ImageShape::new(11, 64, 3));
        let Err(TrainError::Config { setting, reason }) = small.validate() else {
            panic!("an 11-pixel side is refused");
        };
        assert_eq!(setting, Setting::ImageSize);
        assert!(reason.contains("at least 12x12"), "{reason}");
        assert!(
            ModelConfig::cnn(4, ImageShape::new(12, 12, 0))
                .validate()
                .is_err()
        );
        assert!(
            ModelConfig::cnn(4, ImageShape::new(12, 12, 1))
                .validate()
                .is_ok()
        );
    }

    /// The same weights through candle-nn's own layers (NCHW conv, `Linear`,
    /// `relu`; pooling by reshape + max): what the built-in models computed
    /// before the fused kernels, and what checkpoints mean.
    fn candle_reference(config: &ModelConfig, varmap: &VarMap, xs: &Tensor) -> Tensor {
        let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
        let fc = |i: &str, a, b| candle_nn::linear(a, b, vb.pp(i)).unwrap();
        match config {
            ModelConfig::Cnn { classes, image } => {
                let padded = Conv2dConfig {
                    padding: 2,
                    ..Default::default()
                };
                let c1 = candle_nn::conv2d(image.channels, 6, 5, padded, vb.pp("conv1")).unwrap();
                let c2 = candle_nn::conv2d(6, 16, 5, Default::default(), vb.pp("conv2")).unwrap();
                let b = xs.dim(0).unwrap();
                // The examples are NHWC; candle's layers take NCHW.
                let h = xs
                    .reshape((b, image.height, image.width, image.channels))
                    .and_then(|t| t.permute((0, 3, 1, 2)))
                    .unwrap();
                // Pooling by reshape + max: candle's max_pool2d backward
                // scales the gradient (see `ops::max_pool2x2`).
                let pool = |t: Tensor| super::ops::max_pool2x2_nchw(&t).unwrap();
                let h = pool(c1.forward(&h).unwrap().relu().unwrap());
                let h = pool(c2.forward(&h).unwrap().relu().unwrap());
                let h = h.flatten_from(1).unwrap();
                let h = fc("fc1", image.flattened(), 120)
                    .forward(&h)
                    .unwrap()
                    .relu()
                    .unwrap();
                let h = fc("fc2", 120, 84).forward(&h).unwrap().relu().unwrap();
                fc("fc3", 84, *classes).forward(&h).unwrap()
            }
            _ => {
                let (inputs, hidden, outputs) = config.mlp_layers().unwrap();
                let mut h = xs.clone();
                let mut width = inputs;
                for (i, &n) in hidden.iter().enumerate() {
                    h = fc(&format!("fc{i}"), width, n)
                        .forward(&h)
                        .unwrap()
                        .relu()
                        .unwrap();
                    width = n;
                }
                fc(&format!("fc{}", hidden.len()), width, outputs)
                    .forward(&h)
                    .unwrap()
            }
        }
    }

    /// The fused forward and its gradients equal candle's layers' on the
    /// same weights, for both built-in models, the CNN at 28x28x1 and at a
    /// non-square RGB size (NHWC examples against candle's NCHW layers).
    #[test]
    fn fused_layers_match_candle_layers() {
        let configs = [
            ModelConfig::Mlp {
                inputs: 784,
                hidden: vec![16, 8],
                classes: 10,
            },
            ModelConfig::cnn(10, ImageShape::default()),
            ModelConfig::cnn(10, ImageShape::new(17, 14, 3)),
        ];
        let labels = Tensor::new(&[1u32, 7, 3], &Device::Cpu).unwrap();
        for config in configs {
            // Deterministic pixels in [0, 1].
            let inputs = config.inputs();
            let xs = Tensor::arange(0u32, 3 * inputs as u32, &Device::Cpu)
                .and_then(|t| t.to_dtype(DType::F32))
                .and_then(|t| (t * 0.37)?.sin()?.abs())
                .and_then(|t| t.reshape((3, inputs)))
                .unwrap();
            let (model, varmap) = BuiltinModel::init(config.clone(), 3, &Device::Cpu).unwrap();
            let fused = model.forward_features(&xs).unwrap();
            let reference = candle_reference(&config, &varmap, &xs);
            let diff = (&fused - &reference)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(
                diff < 1e-4,
                "{}: forward differs by {diff}",
                config.describe()
            );
            let ga = super::ops::softmax_cross_entropy(&fused, &labels)
                .unwrap()
                .backward()
                .unwrap();
            let gb = candle_nn::loss::cross_entropy(&reference, &labels)
                .unwrap()
                .backward()
                .unwrap();
            for var in varmap.all_vars() {
                let a = ga.get(&var).expect("fused gradient");
                let b = gb.get(&var).expect("candle gradient");
                let scale = b
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                let diff = (a - b)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert!(
                    diff <= 1e-4 * (1.0 + scale),
                    "{}: gradient of a {:?} variable differs by {diff}",
                    config.describe(),
                    var.dims()
                );
            }
        }
    }

    /// On a GPU the built-in models (through the kernels' candle-ops
    /// fallbacks) and our AdamW (its tensor path) compute what they compute
    /// on the CPU. Skips without a CUDA device.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_step_matches_the_cpu_step() {
        use super::super::{OptimizerConfig, OptimizerKind};
        let Ok(gpu) = Device::new_cuda(0) else {
            eprintln!("cuda_step_matches_the_cpu_step: no CUDA device, skipped");
            return;
        };
        let xs = Tensor::arange(0u32, 4 * 784, &Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| (t * 0.11)?.cos()?.abs())
            .and_then(|t| t.reshape((4, 784)))
            .unwrap();
        let labels = Tensor::new(&[3u32, 1, 4, 1], &Device::Cpu).unwrap();
        for config in [
            ModelConfig::Mlp {
                inputs: 784,
                hidden: vec![32],
                classes: 10,
            },
            ModelConfig::cnn(10, ImageShape::default()),
        ] {
            let mut weights = Vec::new();
            for device in [Device::Cpu, gpu.clone()] {
                let (model, varmap) = BuiltinModel::init(config.clone(), 5, &device).unwrap();
                let mut opt = OptimizerConfig::default_for(OptimizerKind::AdamW)
                    .build(varmap.all_vars())
                    .unwrap();
                let x = xs.to_device(&device).unwrap();
                let y = labels.to_device(&device).unwrap();
                for _ in 0..2 {
                    let logits = model.forward_features(&x).unwrap();
                    let loss = super::super::ops::softmax_cross_entropy(&logits, &y).unwrap();
                    opt.step(&loss.backward().unwrap()).unwrap();
                }
                let mut all: Vec<(String, Vec<f32>)> = varmap
                    .data()
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(name, v)| {
                        let host = v.to_device(&Device::Cpu).unwrap();
                        (name.clone(), host.flatten_all().unwrap().to_vec1().unwrap())
                    })
                    .collect();
                all.sort_by(|a, b| a.0.cmp(&b.0));
                weights.push(all);
            }
            for ((name, a), (_, b)) in weights[0].iter().zip(&weights[1]) {
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() < 1e-4,
                        "{}: {name}: {x} vs {y}",
                        config.describe()
                    );
                }
            }
        }
    }

    #[test]
    fn bad_configs_are_refused() {
        let bad = ModelConfig::Mlp {
            inputs: 4,
            hidden: vec![0],
            classes: 3,
        };
        assert!(matches!(
            bad.validate(),
            Err(TrainError::Config {
                setting: Setting::HiddenSizes,
                ..
            })
        ));
        assert!(
            ModelConfig::cnn(1, ImageShape::default())
                .validate()
                .is_err()
        );
    }
}
