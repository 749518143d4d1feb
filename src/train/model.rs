//! Models: the [`Model`] trait every model trains through, the [`Task`] that
//! chooses loss and metrics, and the built-in models ([`BuiltinModel`]): an
//! MLP with hidden sizes from flags, a LeNet-like CNN for 28x28 inputs, and
//! an embedding model for token ids (embedding -> masked mean pooling ->
//! MLP), which `tfpipe train` picks when the schema's input is a
//! variable-length int64 feature.
//! Plain structs built from a `VarBuilder`, as candle-nn does it.
//!
//! Weights are initialised from our own seeded generator (candle's CPU
//! generator cannot be seeded), so the same seed gives the same model
//! ([`seed_vars`] does it for any model's `VarMap`).

use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::{Conv2d, Conv2dConfig, Linear, VarBuilder, VarMap};
use serde::{Deserialize, Serialize};

use super::TrainError;
use super::tensor::BatchTensors;

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
}

/// Which built-in model, and its sizes. Stored in checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelConfig {
    /// A classifier: `inputs -> hidden[0] -> ... -> classes`, ReLU between layers.
    Mlp {
        inputs: usize,
        hidden: Vec<usize>,
        classes: usize,
    },
    /// The same MLP with one output, for regression.
    Regressor { inputs: usize, hidden: Vec<usize> },
    /// LeNet-5-like for 1x28x28 inputs: conv 5x5 (6, padded) -> pool ->
    /// conv 5x5 (16) -> pool -> 400 -> 120 -> 84 -> classes.
    Cnn { classes: usize },
    /// A bag-of-tokens classifier: each token id in `0..vocab` looks up a
    /// `dim`-wide embedding; the embeddings of a row's real tokens (the
    /// mask) are averaged; the average, beside the row's `inputs` dense
    /// features when there are any, feeds an MLP `hidden -> classes`.
    Embedding {
        vocab: usize,
        dim: usize,
        inputs: usize,
        hidden: Vec<usize>,
        classes: usize,
    },
}

impl ModelConfig {
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
            _ => match self.mlp_layers() {
                Some((inputs, _, _)) => inputs,
                None => 28 * 28,
            },
        }
    }

    /// The number of outputs: classes, or 1 for regression.
    pub fn classes(&self) -> usize {
        match self {
            ModelConfig::Mlp { classes, .. }
            | ModelConfig::Cnn { classes }
            | ModelConfig::Embedding { classes, .. } => *classes,
            ModelConfig::Regressor { .. } => 1,
        }
    }

    /// What the model learns.
    pub fn task(&self) -> Task {
        match self {
            ModelConfig::Mlp { classes, .. }
            | ModelConfig::Cnn { classes }
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
                (6 * 25 + 6) + (16 * 6 * 25 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + 84 * c + c
            }
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
            None => (6 * 28 * 28).max(self.classes()),
        }
    }

    /// Checks the sizes before any work starts.
    pub fn validate(&self) -> Result<(), TrainError> {
        if let Task::Classification { classes } = self.task()
            && classes < 2
        {
            return Err(TrainError::Config(format!(
                "{classes} classes: a classifier needs at least 2"
            )));
        }
        if let ModelConfig::Embedding { vocab, dim, .. } = self
            && (*vocab == 0 || *dim == 0)
        {
            return Err(TrainError::Config(format!(
                "embedding of {vocab} tokens x {dim}: both must be at least 1"
            )));
        }
        if let Some((inputs, hidden, _)) = self.head_layers() {
            if inputs == 0 {
                return Err(TrainError::Config("the MLP has no input features".into()));
            }
            if hidden.contains(&0) {
                return Err(TrainError::Config(format!(
                    "hidden sizes {hidden:?} contain 0"
                )));
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
            None => format!("cnn lenet 1x28x28-{}", self.classes()),
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
                    return Err(TrainError::Config(
                        "an embedding model without its head".into(),
                    ));
                };
                Net::Embedding {
                    table: candle_nn::embedding(*vocab, *dim, vb.pp("embedding"))
                        .map_err(TrainError::candle("building the embedding"))?,
                    head: linear_stack(inputs, hidden, outputs, &vb)?,
                }
            }
            (ModelConfig::Mlp { .. } | ModelConfig::Regressor { .. }, None) => {
                return Err(TrainError::Config("an MLP without its layers".into()));
            }
            (ModelConfig::Cnn { classes }, _) => {
                let padded = Conv2dConfig {
                    padding: 2,
                    ..Default::default()
                };
                let e = TrainError::candle;
                Net::Cnn {
                    conv1: candle_nn::conv2d(1, 6, 5, padded, vb.pp("conv1"))
                        .map_err(e("building conv1"))?,
                    conv2: candle_nn::conv2d(6, 16, 5, Default::default(), vb.pp("conv2"))
                        .map_err(e("building conv2"))?,
                    fc1: candle_nn::linear(400, 120, vb.pp("fc1")).map_err(e("building fc1"))?,
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
                conv1,
                conv2,
                fc1,
                fc2,
                fc3,
            } => {
                let b = xs.dim(0)?;
                let h = xs.reshape((b, 1, 28, 28))?;
                let h = conv1.forward(&h)?.relu()?.max_pool2d(2)?;
                let h = conv2.forward(&h)?.relu()?.max_pool2d(2)?;
                let h = h.flatten_from(1)?;
                let h = fc1.forward(&h)?.relu()?;
                let h = fc2.forward(&h)?.relu()?;
                fc3.forward(&h)
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
    let embedded = table.forward(ids)?; // [rows, longest, dim]
    let summed = embedded.broadcast_mul(&mask.unsqueeze(2)?)?.sum(1)?; // [rows, dim]
    let counts = mask.sum_keepdim(1)?.clamp(1f32, f32::MAX)?; // [rows, 1]
    summed.broadcast_div(&counts)
}

/// A dense layer: `x W^T + b`. (The layers are small functions so that
/// fused kernels can take their place one at a time.)
pub(crate) fn dense(layer: &Linear, x: &Tensor) -> candle_core::Result<Tensor> {
    layer.forward(x)
}

/// A dense layer followed by ReLU.
pub(crate) fn dense_relu(layer: &Linear, x: &Tensor) -> candle_core::Result<Tensor> {
    layer.forward(x)?.relu()
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
        .map_err(|_| TrainError::Config("variable map lock poisoned".into()))?;
    for (name, var) in data.iter() {
        let dims = var.dims().to_vec();
        let count: usize = dims.iter().product();
        let values: Vec<f32> = if dims.len() < 2 {
            vec![0.0; count]
        } else {
            let fan_in: usize = dims[1..].iter().product();
            let bound = (6.0 / fan_in as f64).sqrt();
            let mut rng = SplitMix64(seed ^ fnv1a(name.as_bytes()));
            (0..count)
                .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
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

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, good enough for init.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (m, vars) =
            BuiltinModel::init(ModelConfig::Cnn { classes: 10 }, 1, &Device::Cpu).unwrap();
        let xs = Tensor::zeros((3, 784), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(m.forward_features(&xs).unwrap().dims(), &[3, 10]);
        assert_eq!(vars.all_vars().len(), 10);
    }

    #[test]
    fn bad_configs_are_refused() {
        let bad = ModelConfig::Mlp {
            inputs: 4,
            hidden: vec![0],
            classes: 3,
        };
        assert!(matches!(bad.validate(), Err(TrainError::Config(_))));
        assert!(ModelConfig::Cnn { classes: 1 }.validate().is_err());
    }
}
