//! Optimizers: ours ([`Sgd`] with momentum, [`Adam`], [`AdamW`]), each a
//! [`candle_nn::Optimizer`] whose state (moments, step count) checkpoints can
//! hold through [`OptimizerState`]; and [`TrainOptimizer`], the object-safe
//! face the [`Trainer`](super::Trainer) drives, which any candle optimizer
//! gets through [`Foreign`].
//!
//! Adam and AdamW differ in weight decay, as in PyTorch: Adam adds
//! `weight_decay * theta` to the gradient (L2 regularisation, scaled by the
//! adaptive step like the rest of the gradient); AdamW decays the weights
//! directly, `theta *= 1 - lr * weight_decay`, before the Adam step
//! (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019).
//! SGD with momentum follows PyTorch too: `b = momentum * b + g` (with
//! `g += weight_decay * theta` first), `theta -= lr * b`.
//!
//! On the CPU, for float32 variables, each update is one pass per parameter
//! tensor over the weights, the gradient and the moments (kept as plain
//! `Vec<f32>`): candle-nn's AdamW builds about a dozen intermediate tensors
//! per parameter per step, which on the CPU was most of an MLP's step (8.3 ms
//! of 11.1 ms for 784-256-10 at batch 256, against 0.2 ms for one pass;
//! `cargo bench --bench train`). On other devices, or other dtypes, the same
//! arithmetic runs as candle tensor operations.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::{Setting, TrainError};

/// An optimizer's state as checkpoints store it: the number of updates
/// applied, and named state tensors per variable (Adam's `m` and `v`, SGD's
/// `momentum`). Our optimizers implement it; with it, a resumed run continues
/// exactly where the saved one stopped.
pub trait OptimizerState {
    /// Updates applied so far.
    fn steps(&self) -> u64;

    /// Every state tensor: the variable it belongs to, the slot's name, its
    /// value (any device; the checkpoint moves it to the host).
    fn slots(&self) -> candle_core::Result<Vec<(Var, &'static str, Tensor)>>;

    /// Restores the state: `steps` updates applied, and each slot's value
    /// from `slot(var, name)` (`None`: the checkpoint has none for it; the
    /// implementation says whether that is an error).
    fn restore(
        &mut self,
        steps: u64,
        slot: &mut dyn FnMut(&Var, &str) -> Option<Tensor>,
    ) -> candle_core::Result<()>;
}

/// The optimizer as [`Trainer`](super::Trainer) drives it: object-safe, so a
/// trainer can hold any optimizer. Ours implement it directly; wrap any other
/// [`candle_nn::Optimizer`] in [`Foreign`].
pub trait TrainOptimizer {
    /// Applies one update from `grads`.
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()>;

    /// The current learning rate.
    fn learning_rate(&self) -> f64;

    /// Sets the learning rate (learning-rate schedules call this before each step).
    fn set_learning_rate(&mut self, lr: f64);

    /// A one-line description for reports, e.g. `adamw lr=0.001 wd=0.01`.
    fn describe(&self) -> String;

    /// The settings, when this is one of our optimizers (stored in checkpoints).
    fn config(&self) -> Option<OptimizerConfig> {
        None
    }

    /// The state a checkpoint can hold, if this optimizer exposes it. A
    /// foreign optimizer trains, but its state is not saved: resuming it
    /// starts its moments afresh (the trainer says so).
    fn state(&self) -> Option<&dyn OptimizerState> {
        None
    }

    /// The same, to restore.
    fn state_mut(&mut self) -> Option<&mut dyn OptimizerState> {
        None
    }
}

/// A boxed optimizer (as [`OptimizerConfig::build`] returns) is one too.
impl<T: TrainOptimizer + ?Sized> TrainOptimizer for Box<T> {
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        (**self).step(grads)
    }

    fn learning_rate(&self) -> f64 {
        (**self).learning_rate()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        (**self).set_learning_rate(lr)
    }

    fn describe(&self) -> String {
        (**self).describe()
    }

    fn config(&self) -> Option<OptimizerConfig> {
        (**self).config()
    }

    fn state(&self) -> Option<&dyn OptimizerState> {
        (**self).state()
    }

    fn state_mut(&mut self) -> Option<&mut dyn OptimizerState> {
        (**self).state_mut()
    }
}

/// Any [`candle_nn::Optimizer`] as a [`TrainOptimizer`], without saved state.
///
/// ```
/// use candle_nn::{Optimizer, VarMap};
/// use tfpipe::train::{Foreign, TrainOptimizer};
///
/// let varmap = VarMap::new();
/// let sgd = candle_nn::SGD::new(varmap.all_vars(), 0.1)?;
/// let opt = Foreign::new(sgd, "candle sgd");
/// assert!(opt.state().is_none());
/// assert_eq!(opt.learning_rate(), 0.1);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub struct Foreign<O> {
    inner: O,
    name: String,
}

impl<O: candle_nn::Optimizer> Foreign<O> {
    /// Wraps `inner`; `name` describes it in reports.
    pub fn new(inner: O, name: impl Into<String>) -> Foreign<O> {
        Foreign {
            inner,
            name: name.into(),
        }
    }

    /// The wrapped optimizer.
    pub fn into_inner(self) -> O {
        self.inner
    }
}

impl<O: candle_nn::Optimizer> TrainOptimizer for Foreign<O> {
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        self.inner.step(grads)
    }

    fn learning_rate(&self) -> f64 {
        self.inner.learning_rate()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.inner.set_learning_rate(lr)
    }

    fn describe(&self) -> String {
        format!("{} lr={}", self.name, self.inner.learning_rate())
    }
}

/// Which of our optimizers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Adam; weight decay as L2 added to the gradient.
    Adam,
    /// Adam with decoupled weight decay.
    #[serde(alias = "adamw-fused")]
    AdamW,
    /// Stochastic gradient descent with optional momentum.
    Sgd,
}

impl std::str::FromStr for OptimizerKind {
    type Err = crate::error::UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "adam" => Ok(OptimizerKind::Adam),
            // Our AdamW is the fused one; the old name stays accepted.
            "adamw" | "adamw-fused" | "adamw_fused" => Ok(OptimizerKind::AdamW),
            "sgd" => Ok(OptimizerKind::Sgd),
            _ => Err(crate::error::UnknownName {
                what: "optimizer",
                name: s.to_string(),
                expected: "adam, adamw or sgd",
            }),
        }
    }
}

impl std::fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OptimizerKind::Adam => "adam",
            OptimizerKind::AdamW => "adamw",
            OptimizerKind::Sgd => "sgd",
        })
    }
}

/// The settings of one of our optimizers. Stored in checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// Adam, AdamW or SGD.
    pub kind: OptimizerKind,
    /// The learning rate (the base rate, before any schedule).
    pub lr: f64,
    /// Weight decay: L2 for Adam and SGD, decoupled for AdamW.
    pub weight_decay: f64,
    /// SGD's momentum (0: plain SGD); ignored by Adam and AdamW.
    #[serde(default)]
    pub momentum: f64,
    /// Adam's first-moment decay. By default 0.9.
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    /// Adam's second-moment decay. By default 0.999.
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    /// Adam's denominator epsilon. By default 1e-8 (candle's and PyTorch's;
    /// Keras uses 1e-7).
    #[serde(default = "default_eps")]
    pub eps: f64,
}

fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_eps() -> f64 {
    1e-8
}

impl OptimizerConfig {
    /// The usual defaults for `kind`: Adam lr 0.001 without weight decay;
    /// AdamW lr 0.001 and weight decay 0.01 (PyTorch's, candle's and
    /// Keras' defaults); SGD lr 0.1, no momentum, no weight decay.
    pub fn default_for(kind: OptimizerKind) -> OptimizerConfig {
        let base = OptimizerConfig {
            kind,
            lr: 1e-3,
            weight_decay: 0.0,
            momentum: 0.0,
            beta1: default_beta1(),
            beta2: default_beta2(),
            eps: default_eps(),
        };
        match kind {
            OptimizerKind::Adam => base,
            OptimizerKind::AdamW => OptimizerConfig {
                weight_decay: 0.01,
                ..base
            },
            OptimizerKind::Sgd => OptimizerConfig { lr: 0.1, ..base },
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |setting: Setting, what: &str, value: f64, rule: &str| {
            Err(TrainError::config(
                setting,
                format!("{what} {value} {rule}"),
            ))
        };
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(
                Setting::LearningRate,
                "",
                self.lr,
                "must be a positive number",
            );
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(Setting::WeightDecay, "", self.weight_decay, "must be >= 0");
        }
        if !(self.momentum.is_finite() && (0.0..1.0).contains(&self.momentum)) {
            return bad(Setting::Momentum, "", self.momentum, "must be in [0, 1)");
        }
        for (what, b) in [("beta1 ", self.beta1), ("beta2 ", self.beta2)] {
            if !(b.is_finite() && (0.0..1.0).contains(&b)) {
                return bad(Setting::AdamMoments, what, b, "must be in [0, 1)");
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad(
                Setting::AdamMoments,
                "epsilon ",
                self.eps,
                "must be a positive number",
            );
        }
        Ok(())
    }

    /// Builds the optimizer over `vars`.
    pub fn build(&self, vars: Vec<Var>) -> Result<Box<dyn TrainOptimizer + Send>, TrainError> {
        self.validate()?;
        let err = TrainError::candle("creating the optimizer");
        use candle_nn::Optimizer as _;
        Ok(match self.kind {
            OptimizerKind::Adam => Box::new(Adam::new(vars, *self).map_err(err)?),
            OptimizerKind::AdamW => Box::new(AdamW::new(vars, *self).map_err(err)?),
            OptimizerKind::Sgd => Box::new(Sgd::new(vars, *self).map_err(err)?),
        })
    }

    /// A one-line description, e.g. `adamw lr=0.001 wd=0.01`.
    pub fn describe(&self) -> String {
        let mut s = format!("{} lr={}", self.kind, self.lr);
        if self.weight_decay > 0.0 {
            s += &format!(" wd={}", self.weight_decay);
        }
        if self.kind == OptimizerKind::Sgd && self.momentum > 0.0 {
            s += &format!(" momentum={}", self.momentum);
        }
        s
    }
}

/// A state buffer: on the host for float32 variables on the CPU (updated in
/// one pass), else a tensor on the variable's device.
enum Buf {
    Host(Vec<f32>),
    Device(Tensor),
}

impl Buf {
    fn zeros(var: &Var) -> candle_core::Result<Buf> {
        Ok(if host_path(var) {
            Buf::Host(vec![0.0; var.elem_count()])
        } else {
            Buf::Device(var.zeros_like()?)
        })
    }

    fn to_tensor(&self, var: &Var) -> candle_core::Result<Tensor> {
        match self {
            Buf::Host(v) => Tensor::from_slice(v, var.shape(), &Device::Cpu),
            Buf::Device(t) => Ok(t.clone()),
        }
    }

    fn restore(&mut self, var: &Var, t: &Tensor) -> candle_core::Result<()> {
        if t.shape() != var.shape() {
            candle_core::bail!(
                "optimizer state of shape {:?} for a variable of shape {:?}",
                t.dims(),
                var.dims()
            );
        }
        *self = match self {
            Buf::Host(_) => Buf::Host(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?),
            Buf::Device(_) => Buf::Device(t.to_device(var.device())?.to_dtype(var.dtype())?),
        };
        Ok(())
    }
}

fn host_path(var: &Var) -> bool {
    var.device().is_cpu() && var.dtype() == DType::F32
}

/// The float variables of `vars` (others cannot be trained), each with `n` zeroed buffers.
fn with_buffers(vars: Vec<Var>, n: usize) -> candle_core::Result<Vec<(Var, Vec<Buf>)>> {
    vars.into_iter()
        .filter(|v| v.dtype().is_float())
        .map(|v| {
            let bufs = (0..n)
                .map(|_| Buf::zeros(&v))
                .collect::<candle_core::Result<_>>()?;
            Ok((v, bufs))
        })
        .collect()
}

fn restore_slots(
    vars: &mut [(Var, Vec<Buf>)],
    names: &[&'static str],
    slot: &mut dyn FnMut(&Var, &str) -> Option<Tensor>,
) -> candle_core::Result<()> {
    for (var, bufs) in vars.iter_mut() {
        for (buf, name) in bufs.iter_mut().zip(names) {
            let t = slot(var, name).ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "no optimizer state {name:?} for a variable of shape {:?}",
                    var.dims()
                ))
            })?;
            buf.restore(var, &t)?;
        }
    }
    Ok(())
}

fn export_slots(
    vars: &[(Var, Vec<Buf>)],
    names: &[&'static str],
) -> candle_core::Result<Vec<(Var, &'static str, Tensor)>> {
    let mut out = Vec::new();
    for (var, bufs) in vars {
        for (buf, name) in bufs.iter().zip(names) {
            out.push((var.clone(), *name, buf.to_tensor(var)?));
        }
    }
    Ok(out)
}

/// Lets `f` update a float32 CPU variable's weights from its gradient, in
/// place on the variable's own storage ([`ops::update_in_place`]).
fn update_host(
    var: &Var,
    grad: &Tensor,
    f: impl FnOnce(&mut [f32], &[f32]),
) -> candle_core::Result<()> {
    if !super::ops::update_in_place(var.as_tensor(), grad, f)? {
        candle_core::bail!(
            "a host-side optimizer buffer for a {:?} variable on {:?}",
            var.dtype(),
            var.device().location()
        );
    }
    Ok(())
}

/// Adam's per-step constants.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// 1 / (1 - beta1^t).
    pub scale_m: f32,
    /// 1 / (1 - beta2^t).
    pub scale_v: f32,
    /// L2 weight decay added to the gradient (Adam), or 0.
    pub l2: f32,
    /// Multiplies the weights before the step: `1 - lr * wd` (AdamW), or 1.
    pub decay: f32,
}

/// One Adam/AdamW update over a float32 tensor, in place.
pub(crate) fn adam_update(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: &AdamStep) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        let g = g + h.l2 * *p;
        *m = h.beta1 * *m + (1.0 - h.beta1) * g;
        *v = h.beta2 * *v + (1.0 - h.beta2) * g * g;
        let update = (*m * h.scale_m) / ((*v * h.scale_v).sqrt() + h.eps);
        *p = *p * h.decay - h.lr * update;
    }
}

/// One SGD update over a float32 tensor, in place: `b` is the momentum buffer.
pub(crate) fn sgd_update(p: &mut [f32], g: &[f32], b: &mut [f32], lr: f32, momentum: f32, wd: f32) {
    for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
        let g = g + wd * *p;
        *b = momentum * *b + g;
        *p -= lr * *b;
    }
}

/// Adam and AdamW share everything but how weight decay enters.
struct AdamCore {
    vars: Vec<(Var, Vec<Buf>)>,
    config: OptimizerConfig,
    steps: u64,
    decoupled: bool,
}

const ADAM_SLOTS: [&str; 2] = ["m", "v"];

impl AdamCore {
    fn new(vars: Vec<Var>, config: OptimizerConfig, decoupled: bool) -> candle_core::Result<Self> {
        Ok(AdamCore {
            vars: with_buffers(vars, 2)?,
            config,
            steps: 0,
            decoupled,
        })
    }

    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        self.steps += 1;
        let c = &self.config;
        let t = i32::try_from(self.steps).unwrap_or(i32::MAX);
        let (lr, wd) = (c.lr, c.weight_decay);
        let scale_m = 1.0 / (1.0 - c.beta1.powi(t));
        let scale_v = 1.0 / (1.0 - c.beta2.powi(t));
        let (l2, decay) = if self.decoupled {
            (0.0, 1.0 - lr * wd)
        } else {
            (wd, 1.0)
        };
        let h = AdamStep {
            lr: lr as f32,
            beta1: c.beta1 as f32,
            beta2: c.beta2 as f32,
            eps: c.eps as f32,
            scale_m: scale_m as f32,
            scale_v: scale_v as f32,
            l2: l2 as f32,
            decay: decay as f32,
        };
        for (var, bufs) in &mut self.vars {
            let Some(g) = grads.get(var) else { continue };
            match bufs.as_mut_slice() {
                [Buf::Host(m), Buf::Host(v)] => {
                    update_host(var, g, |p, g| adam_update(p, g, m, v, &h))?;
                }
                [Buf::Device(m), Buf::Device(v)] => {
                    let g = if l2 > 0.0 {
                        (g + (var.as_tensor() * l2)?)?
                    } else {
                        g.clone()
                    };
                    let m_new = ((&*m * c.beta1)? + (&g * (1.0 - c.beta1))?)?;
                    let v_new = ((&*v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
                    let update = ((&m_new * scale_m)? / ((&v_new * scale_v)?.sqrt()? + c.eps)?)?;
                    let theta = ((var.as_tensor() * decay)? - (update * lr)?)?;
                    var.set(&theta)?;
                    *m = m_new;
                    *v = v_new;
                }
                _ => candle_core::bail!("adam: mixed state buffers"),
            }
        }
        Ok(())
    }
}

macro_rules! adam_variant {
    ($name:ident, $decoupled:expr, $kind:expr, $doc:literal) => {
        #[doc = $doc]
        pub struct $name(AdamCore);

        impl candle_nn::Optimizer for $name {
            type Config = OptimizerConfig;

            /// `config.kind` is ignored: the type decides.
            fn new(vars: Vec<Var>, config: OptimizerConfig) -> candle_core::Result<Self> {
                let config = OptimizerConfig {
                    kind: $kind,
                    ..config
                };
                Ok($name(AdamCore::new(vars, config, $decoupled)?))
            }

            fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
                self.0.step(grads)
            }

            fn learning_rate(&self) -> f64 {
                self.0.config.lr
            }

            fn set_learning_rate(&mut self, lr: f64) {
                self.0.config.lr = lr
            }
        }

        impl OptimizerState for $name {
            fn steps(&self) -> u64 {
                self.0.steps
            }

            fn slots(&self) -> candle_core::Result<Vec<(Var, &'static str, Tensor)>> {
                export_slots(&self.0.vars, &ADAM_SLOTS)
            }

            fn restore(
                &mut self,
                steps: u64,
                slot: &mut dyn FnMut(&Var, &str) -> Option<Tensor>,
            ) -> candle_core::Result<()> {
                restore_slots(&mut self.0.vars, &ADAM_SLOTS, slot)?;
                self.0.steps = steps;
                Ok(())
            }
        }

        impl TrainOptimizer for $name {
            fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
                self.0.step(grads)
            }

            fn learning_rate(&self) -> f64 {
                self.0.config.lr
            }

            fn set_learning_rate(&mut self, lr: f64) {
                self.0.config.lr = lr
            }

            fn describe(&self) -> String {
                self.0.config.describe()
            }

            fn config(&self) -> Option<OptimizerConfig> {
                Some(self.0.config)
            }

            fn state(&self) -> Option<&dyn OptimizerState> {
                Some(self)
            }

            fn state_mut(&mut self) -> Option<&mut dyn OptimizerState> {
                Some(self)
            }
        }
    };
}

adam_variant!(
    Adam,
    false,
    OptimizerKind::Adam,
    "Adam (Kingma & Ba, 2015); weight decay is L2, added to the gradient."
);
adam_variant!(
    AdamW,
    true,
    OptimizerKind::AdamW,
    "AdamW: Adam with decoupled weight decay (`theta *= 1 - lr * wd` before each step)."
);

/// Stochastic gradient descent with momentum and (L2) weight decay, as PyTorch's `SGD`.
pub struct Sgd {
    vars: Vec<(Var, Vec<Buf>)>,
    config: OptimizerConfig,
    steps: u64,
}

const SGD_SLOTS: [&str; 1] = ["momentum"];

impl Sgd {
    fn update(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        self.steps += 1;
        let c = self.config;
        for (var, bufs) in &mut self.vars {
            let Some(g) = grads.get(var) else { continue };
            match bufs.as_mut_slice() {
                [Buf::Host(b)] => update_host(var, g, |p, g| {
                    sgd_update(
                        p,
                        g,
                        b,
                        c.lr as f32,
                        c.momentum as f32,
                        c.weight_decay as f32,
                    )
                })?,
                [Buf::Device(b)] => {
                    let g = if c.weight_decay > 0.0 {
                        (g + (var.as_tensor() * c.weight_decay)?)?
                    } else {
                        g.clone()
                    };
                    let b_new = ((&*b * c.momentum)? + g)?;
                    var.set(&(var.as_tensor() - (&b_new * c.lr)?)?)?;
                    *b = b_new;
                }
                _ => candle_core::bail!("sgd: mixed state buffers"),
            }
        }
        Ok(())
    }
}

impl candle_nn::Optimizer for Sgd {
    type Config = OptimizerConfig;

    /// `config.kind` is ignored.
    fn new(vars: Vec<Var>, config: OptimizerConfig) -> candle_core::Result<Self> {
        Ok(Sgd {
            vars: with_buffers(vars, 1)?,
            config: OptimizerConfig {
                kind: OptimizerKind::Sgd,
                ..config
            },
            steps: 0,
        })
    }

    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        self.update(grads)
    }

    fn learning_rate(&self) -> f64 {
        self.config.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.config.lr = lr
    }
}

impl OptimizerState for Sgd {
    fn steps(&self) -> u64 {
        self.steps
    }

    fn slots(&self) -> candle_core::Result<Vec<(Var, &'static str, Tensor)>> {
        export_slots(&self.vars, &SGD_SLOTS)
    }

    fn restore(
        &mut self,
        steps: u64,
        slot: &mut dyn FnMut(&Var, &str) -> Option<Tensor>,
    ) -> candle_core::Result<()> {
        restore_slots(&mut self.vars, &SGD_SLOTS, slot)?;
        self.steps = steps;
        Ok(())
    }
}

impl TrainOptimizer for Sgd {
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        self.update(grads)
    }

    fn learning_rate(&self) -> f64 {
        self.config.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.config.lr = lr
    }

    fn describe(&self) -> String {
        self.config.describe()
    }

    fn config(&self) -> Option<OptimizerConfig> {
        Some(self.config)
    }

    fn state(&self) -> Option<&dyn OptimizerState> {
        Some(self)
    }

    fn state_mut(&mut self) -> Option<&mut dyn OptimizerState> {
        Some(self)
    }
}

/// The slots of `state` keyed `VARNAME/SLOT`, on the host, with variables
/// named through `names` (variable tensor id -> name, from the `VarMap`).
pub(crate) fn named_slots(
    state: &dyn OptimizerState,
    names: &HashMap<candle_core::TensorId, String>,
) -> candle_core::Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (var, slot, t) in state.slots()? {
        let name = names.get(&var.as_tensor().id()).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "the optimizer holds a variable of shape {:?} that is not in the model's VarMap",
                var.dims()
            ))
        })?;
        out.insert(format!("{name}/{slot}"), t.to_device(&Device::Cpu)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_nn::Optimizer as _;

    fn quadratic_steps(opt: &mut dyn TrainOptimizer, var: &Var, steps: usize) -> Vec<f32> {
        let target = Tensor::new(&[[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::Cpu).unwrap();
        for _ in 0..steps {
            let loss = var
                .as_tensor()
                .sub(&target)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap();
            opt.step(&loss.backward().unwrap()).unwrap();
        }
        var.flatten_all().unwrap().to_vec1().unwrap()
    }

    const INIT: [f32; 6] = [0.5, -1.0, 2.0, 0.0, 3.0, -0.25];

    fn var() -> Var {
        Var::from_vec(INIT.to_vec(), (2, 3), &Device::Cpu).unwrap()
    }

    /// The one-pass AdamW follows candle-nn's AdamW step for step.
    #[test]
    fn adamw_matches_candle() {
        let (a, b) = (var(), var());
        let config = OptimizerConfig::default_for(OptimizerKind::AdamW);
        let reference = candle_nn::AdamW::new(
            vec![a.clone()],
            candle_nn::ParamsAdamW {
                lr: config.lr,
                weight_decay: config.weight_decay,
                ..Default::default()
            },
        )
        .unwrap();
        let a = quadratic_steps(&mut Foreign::new(reference, "candle adamw"), &a, 20);
        let b = quadratic_steps(config.build(vec![b.clone()]).unwrap().as_mut(), &b, 20);
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
        assert_ne!(a, INIT.to_vec());
    }

    /// The host pass and the tensor-op path (used off the CPU) agree, for
    /// every optimizer, weight decay and momentum included.
    #[test]
    fn host_and_tensor_paths_agree() {
        for kind in [
            OptimizerKind::Adam,
            OptimizerKind::AdamW,
            OptimizerKind::Sgd,
        ] {
            let config = OptimizerConfig {
                weight_decay: 0.1,
                momentum: 0.9,
                lr: 0.01,
                ..OptimizerConfig::default_for(kind)
            };
            let host = var();
            // A float64 variable takes the tensor path on the CPU too.
            let dev = Var::from_tensor(&host.to_dtype(DType::F64).unwrap()).unwrap();
            let mut a = config.build(vec![host.clone()]).unwrap();
            let mut b = config.build(vec![dev.clone()]).unwrap();
            let target = Tensor::new(&[[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::Cpu).unwrap();
            for _ in 0..10 {
                let la = host
                    .as_tensor()
                    .sub(&target)
                    .unwrap()
                    .sqr()
                    .unwrap()
                    .sum_all()
                    .unwrap();
                a.step(&la.backward().unwrap()).unwrap();
                let t64 = target.to_dtype(DType::F64).unwrap();
                let lb = dev
                    .as_tensor()
                    .sub(&t64)
                    .unwrap()
                    .sqr()
                    .unwrap()
                    .sum_all()
                    .unwrap();
                b.step(&lb.backward().unwrap()).unwrap();
            }
            let x: Vec<f32> = host.flatten_all().unwrap().to_vec1().unwrap();
            let y: Vec<f64> = dev.flatten_all().unwrap().to_vec1().unwrap();
            for (x, y) in x.iter().zip(&y) {
                assert!((f64::from(*x) - y).abs() < 1e-4, "{kind}: {x} vs {y}");
            }
        }
    }

    /// Adam (L2) and AdamW (decoupled) are different optimizers once weight
    /// decay is set, and the same without it.
    #[test]
    fn adam_and_adamw_differ_by_weight_decay() {
        let run = |kind, wd| {
            let v = var();
            let config = OptimizerConfig {
                weight_decay: wd,
                ..OptimizerConfig::default_for(kind)
            };
            quadratic_steps(config.build(vec![v.clone()]).unwrap().as_mut(), &v, 5)
        };
        assert_ne!(
            run(OptimizerKind::Adam, 0.1),
            run(OptimizerKind::AdamW, 0.1)
        );
        assert_eq!(
            run(OptimizerKind::Adam, 0.0),
            run(OptimizerKind::AdamW, 0.0)
        );
    }

    /// Momentum SGD by hand: b1 = g1, b2 = 0.9 b1 + g2.
    #[test]
    fn sgd_momentum_by_hand() {
        let v = Var::from_vec(vec![1.0f32], 1, &Device::Cpu).unwrap();
        let config = OptimizerConfig {
            momentum: 0.9,
            lr: 0.1,
            ..OptimizerConfig::default_for(OptimizerKind::Sgd)
        };
        let mut opt = Sgd::new(vec![v.clone()], config).unwrap();
        // loss = x^2, g = 2x.
        for _ in 0..2 {
            let loss = v.as_tensor().sqr().unwrap().sum_all().unwrap();
            candle_nn::Optimizer::backward_step(&mut opt, &loss).unwrap();
        }
        // x1 = 1 - 0.1 * 2 = 0.8; b2 = 0.9 * 2 + 1.6 = 3.4; x2 = 0.8 - 0.34.
        let x: Vec<f32> = v.to_vec1().unwrap();
        assert!((x[0] - 0.46).abs() < 1e-6, "{x:?}");
    }

    /// Saving the state and restoring it into a fresh optimizer continues
    /// bit for bit.
    #[test]
    fn state_round_trip_continues_exactly() {
        for kind in [
            OptimizerKind::Adam,
            OptimizerKind::AdamW,
            OptimizerKind::Sgd,
        ] {
            let config = OptimizerConfig {
                momentum: 0.5,
                ..OptimizerConfig::default_for(kind)
            };
            let straight = var();
            let mut opt = config.build(vec![straight.clone()]).unwrap();
            let full = quadratic_steps(opt.as_mut(), &straight, 6);

            let resumed = var();
            let mut first = config.build(vec![resumed.clone()]).unwrap();
            quadratic_steps(first.as_mut(), &resumed, 3);
            let state = first.state().unwrap();
            let slots: HashMap<&str, Tensor> = state
                .slots()
                .unwrap()
                .into_iter()
                .map(|(_, name, t)| (name, t))
                .collect();
            let steps = state.steps();
            assert_eq!(steps, 3);
            let mut second = config.build(vec![resumed.clone()]).unwrap();
            second
                .state_mut()
                .unwrap()
                .restore(steps, &mut |_, name| slots.get(name).cloned())
                .unwrap();
            let rest = quadratic_steps(second.as_mut(), &resumed, 3);
            assert_eq!(full, rest, "{kind}");
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        let mut c = OptimizerConfig::default_for(OptimizerKind::Sgd);
        c.momentum = 1.0;
        assert!(c.validate().unwrap_err().to_string().contains("momentum"));
        c.momentum = 0.0;
        c.lr = -0.1;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("learning rate")
        );
        assert_eq!("adamw-fused".parse(), Ok(OptimizerKind::AdamW));
        assert_eq!("Adam".parse(), Ok(OptimizerKind::Adam));
    }
}
