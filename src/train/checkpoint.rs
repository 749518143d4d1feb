//! Checkpoints: one directory holding `model.safetensors` (the weights,
//! candle's `VarMap` format), `optimizer.safetensors` (the optimizer's state
//! per variable, `VARNAME/SLOT`, when the optimizer exposes it) and
//! `checkpoint.json` ([`CheckpointMeta`]: step, epoch, the seed schedule,
//! model and optimizer settings, input columns, schema, an opaque
//! pipeline-state slot, and the SHA-256 of every other file).
//!
//! # Atomicity
//! A checkpoint is one unit: its files are written into a temporary
//! directory beside the target, each file and the directory are fsynced, and
//! the directory is then exchanged with the old one in one atomic rename
//! ([`AtomicDir`](crate::atomic_file::AtomicDir): `renameat2(RENAME_EXCHANGE)`
//! on Linux), so a crash at any instant leaves the old or the new checkpoint
//! whole at its name. Saves into one directory take a lock on it, one at a
//! time; the hidden `.NAME.*` directories a killed save leaves are removed by
//! the next save.
//!
//! # Verification
//! `checkpoint.json` carries the SHA-256 of every other file and of itself
//! (without that field), and loading checks both, and the bounds of every
//! number a resume acts on: damaged weights, or an edited
//! `checkpoint.json`, are an error, never a silently different model.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType as CDType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::TrainError;
use super::model::{BuiltinModel, ModelConfig};
use super::optim::{OptimizerConfig, OptimizerState, named_slots};
use super::tensor::InputSpec;
use crate::example::{DType, FeatureSpec, Layout, Schema, Value};

/// The weights file inside a checkpoint directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The optimizer-state file inside a checkpoint directory.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The metadata file inside a checkpoint directory.
pub const META_FILE: &str = "checkpoint.json";
/// The `format` value this version writes and reads.
pub const FORMAT: &str = "tfpipe-checkpoint-2";

/// What is wrong with a checkpoint (inside [`TrainError::Checkpoint`], which names the path).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing failed.
    #[error("cannot {action}")]
    Io {
        /// What was being done, e.g. `read checkpoint.json`.
        action: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `checkpoint.json` is not valid.
    #[error("{META_FILE} line {line} column {column}", line = .0.line(), column = .0.column())]
    Json(#[source] serde_json::Error),
    /// Written by another version.
    #[error("format {found:?}, expected {FORMAT:?}")]
    Format {
        /// The format found.
        found: String,
    },
    /// A file's contents do not match the checksum recorded at save time.
    #[error("{file} is damaged: its SHA-256 is {found}, but the checkpoint recorded {expected}")]
    Checksum {
        /// The file inside the checkpoint.
        file: String,
        /// Recorded at save time.
        expected: String,
        /// Computed now.
        found: String,
    },
    /// A file the checkpoint needs is missing from `checkpoint.json`'s list.
    #[error("{file} has no recorded checksum")]
    Unlisted {
        /// The file.
        file: String,
    },
    /// A tensor file could not be read or written.
    #[error("{file}")]
    Tensors {
        /// The file.
        file: &'static str,
        /// candle's error (without a backtrace).
        #[source]
        source: candle_core::Error,
    },
    /// A tensor the model needs is not in the file.
    #[error("{file} has no tensor {name:?}")]
    Missing {
        /// The file.
        file: &'static str,
        /// The variable.
        name: String,
    },
    /// A tensor in the file that the model does not have.
    #[error("{file} holds tensor {name:?}, which the model does not have")]
    Unexpected {
        /// The file.
        file: &'static str,
        /// The tensor.
        name: String,
    },
    /// A tensor of the wrong shape.
    #[error("tensor {name:?} has shape {found:?}; the model needs {expected:?}")]
    Shape {
        /// The variable.
        name: String,
        /// The model's shape.
        expected: Vec<usize>,
        /// The file's shape.
        found: Vec<usize>,
    },
    /// The checkpoint holds another model than asked for.
    #[error("holds {found} but this run asks for {wanted}")]
    Model {
        /// The checkpoint's model.
        found: String,
        /// The run's model.
        wanted: String,
    },
    /// The checkpoint was trained on different inputs.
    #[error("was trained on {trained}; this data has {found}")]
    Inputs {
        /// The checkpoint's inputs.
        trained: String,
        /// The run's.
        found: String,
    },
    /// The checkpoint's model was trained with another imputation of
    /// missing inputs (its indicator columns are part of the model's input).
    #[error("was trained with {trained}; this run has {found}")]
    Imputation {
        /// The checkpoint's imputation, described.
        trained: String,
        /// The run's.
        found: String,
    },
    /// The checkpoint was trained on other data or other data options
    /// (its [`DataFingerprint`](super::DataFingerprint) differs), so
    /// resuming would not continue its run.
    #[error(
        "was trained on other data or data options, so resuming would not continue its run: {}",
        differences.join("; ")
    )]
    OtherData {
        /// Each difference, e.g. `batch size 64, now 32`.
        differences: Vec<String>,
        /// Whether the batch size is the only difference (a resume that
        /// may be forced, restarting the epoch: [`Resume::position`](super::Resume::position)).
        only_batch_size: bool,
    },
    /// The model is not a built-in one, so it cannot be rebuilt from the checkpoint alone.
    #[error(
        "holds a custom model ({0}); rebuild it in code and load its weights with Checkpoint::load_weights"
    )]
    Custom(String),
    /// The optimizer's state does not fit (another optimizer or model).
    #[error("optimizer state")]
    Optimizer(#[source] candle_core::Error),
    /// Writing the checkpoint directory or switching it into place failed.
    #[error(transparent)]
    Output(#[from] crate::atomic_file::OutputError),
    /// `checkpoint.json` does not match the checksum it was saved with: it
    /// was edited or damaged.
    #[error("{META_FILE} was modified or damaged since it was saved: its checksum does not match")]
    MetaChecksum,
    /// A value in `checkpoint.json` is out of its bounds.
    #[error("{META_FILE}: {field}: {reason}")]
    Invalid {
        /// The field, e.g. `pipeline_state.skip`.
        field: String,
        /// What is wrong with its value.
        reason: String,
    },
}

/// One fixed-shape feature of a [`SchemaMeta`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureMeta {
    /// The feature's key in the records.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its fixed shape (`[]` for a scalar; `[]` for a variable-length one).
    pub shape: Vec<usize>,
    /// Variable-length (token ids) rather than fixed-shape.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub var: bool,
    /// The value of a missing feature (e.g. a CSV column's `NA`), as the
    /// training schema had it; numeric defaults only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<DefaultMeta>,
}

/// A numeric feature default in a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultMeta {
    /// For int64 and uint8 features.
    Int64(Vec<i64>),
    /// For float32 features.
    Float32(Vec<f32>),
}

/// The schema the model was trained on, so `predict` can parse new data
/// without flags: the fixed-shape features and the variable-length int64
/// ones (token ids), which is all training takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaMeta {
    /// The fixed-shape features, label included, in schema order.
    pub features: Vec<FeatureMeta>,
    /// The label feature's name.
    pub label: Option<String>,
}

impl SchemaMeta {
    /// The fixed-shape and variable-length int64 features of `schema`
    /// (others cannot feed a model).
    pub fn from_schema(schema: &Schema) -> SchemaMeta {
        SchemaMeta {
            features: schema
                .features
                .iter()
                .filter_map(|f| match &f.layout {
                    Layout::Var if f.dtype == DType::Int64 => Some(FeatureMeta {
                        name: f.name.clone(),
                        dtype: f.dtype,
                        shape: Vec::new(),
                        var: true,
                        default: None,
                    }),
                    Layout::Fixed(shape) => Some(FeatureMeta {
                        name: f.name.clone(),
                        dtype: f.dtype,
                        shape: shape.clone(),
                        var: false,
                        default: match &f.default {
                            Some(Value::Int64(v)) => Some(DefaultMeta::Int64(v.clone())),
                            Some(Value::Float32(v)) => Some(DefaultMeta::Float32(v.clone())),
                            Some(Value::Bytes(_)) | None => None,
                        },
                    }),
                    _ => None,
                })
                .collect(),
            label: schema.label.clone(),
        }
    }

    /// Back to a [`Schema`]; without the label feature when `with_label` is false
    /// (for data that has no labels).
    pub fn to_schema(&self, with_label: bool) -> Schema {
        Schema {
            features: self
                .features
                .iter()
                .filter(|f| with_label || Some(&f.name) != self.label.as_ref())
                .map(|f| FeatureSpec {
                    name: f.name.clone(),
                    dtype: f.dtype,
                    layout: if f.var {
                        Layout::Var
                    } else {
                        Layout::Fixed(f.shape.clone())
                    },
                    default: match &f.default {
                        Some(DefaultMeta::Int64(v)) => Some(Value::Int64(v.clone())),
                        Some(DefaultMeta::Float32(v)) => Some(Value::Float32(v.clone())),
                        None => None,
                    },
                    image: None,
                })
                .collect(),
            label: if with_label { self.label.clone() } else { None },
        }
    }
}

/// The JSON half of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Always [`FORMAT`].
    pub format: String,
    /// The global step the weights are at (optimizer updates applied).
    pub step: u64,
    /// Completed epochs: a resumed run starts with epoch `epoch`.
    pub epoch: u64,
    /// The built-in model, or `None` for a custom one.
    pub model: Option<ModelConfig>,
    /// The model's description (e.g. `mlp 784-256-10`).
    pub model_description: String,
    /// Our optimizer's settings, or `None` for a foreign one.
    pub optimizer: Option<OptimizerConfig>,
    /// Whether `optimizer.safetensors` holds the optimizer's state.
    pub optimizer_state: bool,
    /// Which columns feed the model.
    pub input: InputSpec,
    /// The schema of the training data, when known.
    pub schema: Option<SchemaMeta>,
    /// The run's seed: weight initialisation and the pipeline's shuffle
    /// (see [`epoch_seed`](super::epoch_seed)), so a resumed run continues the same schedule.
    pub seed: u64,
    /// The class names (label vocabulary) the model was trained with, in
    /// class-id order, when the schema file recorded them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_vocabulary: Option<Vec<String>>,
    /// An opaque slot for the input pipeline's position (mid-epoch resume);
    /// `None`: resume at the epoch boundary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_state: Option<serde_json::Value>,
    /// SHA-256 (hex) of every other file in the checkpoint, by file name.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// The training data and how it was read, when the run recorded it: a
    /// resume with other data options is refused against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<super::DataFingerprint>,
    /// SHA-256 (hex) of this metadata as written without this field: an
    /// edited or damaged `checkpoint.json` is refused. Filled in by
    /// [`Checkpoint::save`]; absent in checkpoints of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

impl CheckpointMeta {
    /// The metadata as `checkpoint.json` holds it: pretty JSON, with its
    /// checksum.
    fn to_json_checked(&self) -> Result<Vec<u8>, CheckpointError> {
        let mut meta = self.clone();
        meta.checksum = Some(meta.own_checksum()?);
        let mut json = serde_json::to_vec_pretty(&meta).map_err(CheckpointError::Json)?;
        json.push(b'\n');
        Ok(json)
    }

    /// The checksum of this metadata without its `checksum` field.
    fn own_checksum(&self) -> Result<String, CheckpointError> {
        let unsummed = CheckpointMeta {
            checksum: None,
            ..self.clone()
        };
        let json = serde_json::to_vec_pretty(&unsummed).map_err(CheckpointError::Json)?;
        Ok(hex(&Sha256::digest(&json)))
    }

    /// Checks the recorded checksum (when there is one) and that every
    /// number a resume acts on is within its bounds, so that a damaged or
    /// edited file is refused rather than trained on (a `skip` of 10^15
    /// used to spin for minutes, an edited standardisation to load silently).
    fn validate(&self) -> Result<(), CheckpointError> {
        if let Some(recorded) = &self.checksum
            && *recorded != self.own_checksum()?
        {
            return Err(CheckpointError::MetaChecksum);
        }
        let invalid = |field: &str, reason: String| CheckpointError::Invalid {
            field: field.to_string(),
            reason,
        };
        for (i, s) in self.input.standardize.iter().enumerate() {
            if !s.mean.is_finite() || !s.std.is_finite() || s.std <= 0.0 {
                return Err(invalid(
                    &format!("input.standardize[{i}]"),
                    format!(
                        "mean {} and std {}: both must be finite and std above 0",
                        s.mean, s.std
                    ),
                ));
            }
        }
        // The batches skipped after the position's anchor were trained on,
        // so there are at most as many as steps (plus epoch markers).
        let skip = self
            .pipeline_state
            .as_ref()
            .and_then(|p| p.get("skip"))
            .and_then(|s| s.as_u64());
        let most = self.step.saturating_add(self.epoch).saturating_add(1);
        if let Some(skip) = skip
            && skip > most
        {
            return Err(invalid(
                "pipeline_state.skip",
                format!("{skip} batches, more than the {} steps trained", self.step),
            ));
        }
        if let Some(model) = &self.model {
            model
                .validate()
                .map_err(|e| invalid("model", e.to_string()))?;
        }
        Ok(())
    }
}

/// A loaded checkpoint of a built-in model: the model, its variables and its metadata.
pub struct Checkpoint {
    /// What `checkpoint.json` says.
    pub meta: CheckpointMeta,
    /// The model, built on the loaded variables.
    pub model: BuiltinModel,
    /// The variables (trainable: `--resume` continues from them).
    pub varmap: VarMap,
}

impl Checkpoint {
    /// Writes `varmap`'s weights, the optimizer's `state` (when given) and
    /// `meta` into the directory `dir`, as one atomic unit (see the module
    /// doc). `meta.files` and `meta.optimizer_state` are filled in here.
    pub fn save(
        dir: impl AsRef<Path>,
        varmap: &VarMap,
        state: Option<&dyn OptimizerState>,
        meta: &CheckpointMeta,
    ) -> Result<(), TrainError> {
        let dir = dir.as_ref();
        let fail = |source: CheckpointError| TrainError::checkpoint(dir.to_path_buf(), source);
        let io = |action: &str| {
            let action = action.to_string();
            move |source| CheckpointError::Io { action, source }
        };
        let _lock = SaveLock::acquire(dir).map_err(fail)?;
        let staging = crate::atomic_file::AtomicDir::create(dir)
            .map_err(CheckpointError::from)
            .map_err(fail)?;
        let tmp = staging.path();
        let mut meta = meta.clone();
        meta.files.clear();
        let tensors = |file: &'static str| {
            move |e| CheckpointError::Tensors {
                file,
                source: strip_backtrace(e),
            }
        };
        varmap
            .save(tmp.join(WEIGHTS_FILE))
            .map_err(tensors(WEIGHTS_FILE))
            .map_err(fail)?;
        meta.files.insert(
            WEIGHTS_FILE.into(),
            sha256_file(&tmp.join(WEIGHTS_FILE)).map_err(fail)?,
        );
        meta.optimizer_state = false;
        if let Some(state) = state {
            let names = var_names(varmap).map_err(fail)?;
            let slots = named_slots(state, &names)
                .map_err(tensors(OPTIMIZER_FILE))
                .map_err(fail)?;
            candle_core::safetensors::save(&slots, tmp.join(OPTIMIZER_FILE))
                .map_err(tensors(OPTIMIZER_FILE))
                .map_err(fail)?;
            meta.files.insert(
                OPTIMIZER_FILE.into(),
                sha256_file(&tmp.join(OPTIMIZER_FILE)).map_err(fail)?,
            );
            meta.optimizer_state = true;
        }
        let json = meta.to_json_checked().map_err(fail)?;
        std::fs::File::create(tmp.join(META_FILE))
            .and_then(|mut f| f.write_all(&json))
            .map_err(io("write checkpoint.json"))
            .map_err(fail)?;
        // The safetensors writer creates its files owner-only (0600); give
        // them the mode File::create gave checkpoint.json (0666 less the
        // umask), the one rule every output follows.
        let mode = std::fs::metadata(tmp.join(META_FILE))
            .map_err(io("read the mode of checkpoint.json"))
            .map_err(fail)?
            .permissions();
        for file in [WEIGHTS_FILE, OPTIMIZER_FILE] {
            let path = tmp.join(file);
            if path.exists() {
                std::fs::set_permissions(&path, mode.clone())
                    .map_err(io(&format!("set the mode of {file}")))
                    .map_err(fail)?;
            }
        }
        staging
            .commit()
            .map_err(CheckpointError::from)
            .map_err(fail)?;
        Ok(())
    }

    /// Reads `dir/checkpoint.json`.
    pub fn read_meta(dir: impl AsRef<Path>) -> Result<CheckpointMeta, TrainError> {
        let dir = dir.as_ref();
        let path = dir.join(META_FILE);
        let fail = |source: CheckpointError| TrainError::checkpoint(dir.to_path_buf(), source);
        let text = std::fs::read_to_string(&path)
            .map_err(|source| CheckpointError::Io {
                action: format!("read {META_FILE}"),
                source,
            })
            .map_err(fail)?;
        // The format first, so an old checkpoint says so rather than
        // failing on a missing field.
        #[derive(Deserialize)]
        struct Format {
            format: String,
        }
        let format: Format = serde_json::from_str(&text)
            .map_err(CheckpointError::Json)
            .map_err(fail)?;
        if format.format != FORMAT {
            return Err(fail(CheckpointError::Format {
                found: format.format,
            }));
        }
        let meta: CheckpointMeta = serde_json::from_str(&text)
            .map_err(CheckpointError::Json)
            .map_err(fail)?;
        meta.validate().map_err(fail)?;
        Ok(meta)
    }

    /// Loads the checkpoint of a built-in model in `dir` onto `device`.
    pub fn load(dir: impl AsRef<Path>, device: &Device) -> Result<Checkpoint, TrainError> {
        let dir = dir.as_ref();
        let meta = Checkpoint::read_meta(dir)?;
        let fail = |source: CheckpointError| TrainError::checkpoint(dir.to_path_buf(), source);
        let config = meta
            .model
            .clone()
            .ok_or_else(|| fail(CheckpointError::Custom(meta.model_description.clone())))?;
        let varmap = VarMap::new();
        let model = BuiltinModel::new(
            config,
            VarBuilder::from_varmap(&varmap, CDType::F32, device),
        )?;
        load_weights_checked(dir, &meta, &varmap)?;
        Ok(Checkpoint {
            meta,
            model,
            varmap,
        })
    }

    /// Loads the weights in `dir` into `varmap`'s variables (by name),
    /// after verifying the file's checksum. Every variable must be in the
    /// file with its shape, and the file must hold nothing else. For custom
    /// models: build the model on `varmap`, then call this.
    pub fn load_weights(
        dir: impl AsRef<Path>,
        varmap: &VarMap,
    ) -> Result<CheckpointMeta, TrainError> {
        let dir = dir.as_ref();
        let meta = Checkpoint::read_meta(dir)?;
        load_weights_checked(dir, &meta, varmap)?;
        Ok(meta)
    }

    /// Restores `state` from `dir/optimizer.safetensors` (checksum
    /// verified), with the variables named through `varmap`.
    pub fn load_optimizer(
        dir: impl AsRef<Path>,
        meta: &CheckpointMeta,
        varmap: &VarMap,
        state: &mut dyn OptimizerState,
    ) -> Result<(), TrainError> {
        let dir = dir.as_ref();
        let fail = |source: CheckpointError| TrainError::checkpoint(dir.to_path_buf(), source);
        let tensors = read_verified(dir, meta, OPTIMIZER_FILE).map_err(fail)?;
        let names = var_names(varmap).map_err(fail)?;
        state
            .restore(meta.step, &mut |var, slot| {
                let name = names.get(&var.as_tensor().id())?;
                tensors.get(&format!("{name}/{slot}")).cloned()
            })
            .map_err(|e| fail(CheckpointError::Optimizer(strip_backtrace(e))))
    }
}

fn load_weights_checked(
    dir: &Path,
    meta: &CheckpointMeta,
    varmap: &VarMap,
) -> Result<(), TrainError> {
    let fail = |source: CheckpointError| TrainError::checkpoint(dir.to_path_buf(), source);
    let tensors = read_verified(dir, meta, WEIGHTS_FILE).map_err(fail)?;
    let data = varmap.data().lock().unwrap_or_else(|p| p.into_inner());
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for name in names {
        let var = &data[name];
        let t = tensors.get(name).ok_or_else(|| {
            fail(CheckpointError::Missing {
                file: WEIGHTS_FILE,
                name: name.clone(),
            })
        })?;
        if t.dims() != var.dims() {
            return Err(fail(CheckpointError::Shape {
                name: name.clone(),
                expected: var.dims().to_vec(),
                found: t.dims().to_vec(),
            }));
        }
        t.to_dtype(var.dtype())
            .and_then(|t| t.to_device(var.device()))
            .and_then(|t| var.set(&t))
            .map_err(|e| {
                fail(CheckpointError::Tensors {
                    file: WEIGHTS_FILE,
                    source: strip_backtrace(e),
                })
            })?;
    }
    let mut extra: Vec<&String> = tensors.keys().filter(|k| !data.contains_key(*k)).collect();
    extra.sort();
    if let Some(name) = extra.first() {
        return Err(fail(CheckpointError::Unexpected {
            file: WEIGHTS_FILE,
            name: (*name).clone(),
        }));
    }
    Ok(())
}

/// Reads a tensor file of the checkpoint onto the CPU after checking its checksum.
fn read_verified(
    dir: &Path,
    meta: &CheckpointMeta,
    file: &'static str,
) -> Result<HashMap<String, Tensor>, CheckpointError> {
    let path = dir.join(file);
    let bytes = std::fs::read(&path).map_err(|source| CheckpointError::Io {
        action: format!("read {file}"),
        source,
    })?;
    let expected = meta
        .files
        .get(file)
        .ok_or_else(|| CheckpointError::Unlisted { file: file.into() })?;
    let found = hex(&Sha256::digest(&bytes));
    if &found != expected {
        return Err(CheckpointError::Checksum {
            file: file.into(),
            expected: expected.clone(),
            found,
        });
    }
    candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| {
        CheckpointError::Tensors {
            file,
            source: strip_backtrace(e),
        }
    })
}

/// Variable tensor id -> its name in `varmap`.
fn var_names(varmap: &VarMap) -> Result<HashMap<candle_core::TensorId, String>, CheckpointError> {
    let data = varmap.data().lock().unwrap_or_else(|p| p.into_inner());
    Ok(data
        .iter()
        .map(|(name, var)| (var.as_tensor().id(), name.clone()))
        .collect())
}

fn sha256_file(path: &Path) -> Result<String, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        action: format!("read back {}", path.display()),
        source,
    })?;
    Ok(hex(&Sha256::digest(&bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// candle attaches a backtrace to errors when `RUST_BACKTRACE` is set; a
/// message for users carries none.
pub(crate) fn strip_backtrace(e: candle_core::Error) -> candle_core::Error {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => strip_backtrace(*inner),
        candle_core::Error::Context { inner, context } => candle_core::Error::Context {
            inner: Box::new(strip_backtrace(*inner)),
            context,
        },
        candle_core::Error::WithPath { inner, path } => candle_core::Error::WithPath {
            inner: Box::new(strip_backtrace(*inner)),
            path,
        },
        other => other,
    }
}

/// An exclusive lock on a checkpoint's parent directory for one save, so
/// that saves into it run one at a time; whatever temporary directories of
/// the checkpoint are found while holding it were left by a save that died
/// (SIGKILL, power loss) and are removed. Released when dropped. On systems
/// without `flock`, saves take no lock and leftovers stay.
struct SaveLock {
    #[cfg(target_os = "linux")]
    _dir: std::fs::File,
}

impl SaveLock {
    fn acquire(target: &Path) -> Result<SaveLock, CheckpointError> {
        let parent = parent_of(target);
        std::fs::create_dir_all(&parent).map_err(|source| CheckpointError::Io {
            action: format!("create {}", parent.display()),
            source,
        })?;
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let dir = std::fs::File::open(&parent).map_err(|source| CheckpointError::Io {
                action: format!("open {}", parent.display()),
                source,
            })?;
            // SAFETY: flock on a descriptor we own; it touches no memory.
            if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(CheckpointError::Io {
                    action: format!("lock {} for the save", parent.display()),
                    source: std::io::Error::last_os_error(),
                });
            }
            remove_stale_temporaries(target, &parent);
            Ok(SaveLock { _dir: dir })
        }
        #[cfg(not(target_os = "linux"))]
        Ok(SaveLock {})
    }
}

/// Removes the temporary directories a dead save of `target` left in
/// `parent`: `.NAME.XXXXXX.tmp` and `.NAME.XXXXXX.old` (this version's
/// [`AtomicDir`](crate::atomic_file::AtomicDir)), `.NAME.tmp-XXXXXX` and
/// `.NAME.old-XXXXXX` (earlier versions'). Only called under the save lock.
#[cfg(target_os = "linux")]
fn remove_stale_temporaries(target: &Path, parent: &Path) {
    let Some(name) = target.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let prefix = format!(".{name}.");
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = file_name.strip_prefix(&prefix) else {
            continue;
        };
        let ours = rest.starts_with("tmp-")
            || rest.starts_with("old-")
            || ((rest.ends_with(".tmp") || rest.ends_with(".old")) && rest.len() == 10);
        if ours && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// How a background checkpoint load overlapped with the pipeline's warm-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointLoad {
    /// Checkpoint load time (read, build the model), ms.
    pub load_ms: f64,
    /// From the start of training (pipeline construction) to the first batch, ms.
    pub pipeline_warmup_ms: f64,
    /// How long both ran at once, ms.
    pub overlap_ms: f64,
}

impl CheckpointLoad {
    /// The report for a load over `[load_start, load_end]` and a warm-up over
    /// `[warm_start, warm_end]`.
    pub fn between(
        load_start: Instant,
        load_end: Instant,
        warm_start: Instant,
        warm_end: Instant,
    ) -> CheckpointLoad {
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
        CheckpointLoad {
            load_ms: ms(load_start, load_end),
            pipeline_warmup_ms: ms(warm_start, warm_end),
            overlap_ms: ms(load_start.max(warm_start), load_end.min(warm_end)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_meta_keeps_numeric_defaults() {
        let mut schema =
            Schema::from_feature_texts(&["species:int64", "mass:int64", "bill:float32"]).unwrap();
        schema.features[1].default = Some(Value::Int64(vec![0]));
        schema.features[2].default = Some(Value::Float32(vec![0.5]));
        schema.label = Some("species".into());
        let meta = SchemaMeta::from_schema(&schema);
        let json = serde_json::to_string(&meta).unwrap();
        let back: SchemaMeta = serde_json::from_str(&json).unwrap();
        assert_eq!(back.to_schema(true), schema);
        // Written by a version without defaults: still reads.
        let old: SchemaMeta = serde_json::from_str(
            r#"{"features":[{"name":"x","dtype":"float32","shape":[2]}],"label":null}"#,
        )
        .unwrap();
        assert_eq!(old.features[0].default, None);
    }
}
