//! Checkpoints: a directory with `model.safetensors` (the weights, candle's
//! `VarMap` format) and `checkpoint.json` ([`CheckpointMeta`]: step, epoch,
//! model and optimizer settings, input columns, schema, seed).
//!
//! Both files are written under temporary names and renamed into place, the
//! JSON last, so a reader never sees a half-written file. Optimizer moments
//! are not saved: `--resume` continues the weights and the step count, and
//! AdamW's moment estimates restart (they re-converge within a few dozen steps).
//!
//! [`BackgroundLoad`] reads a checkpoint on its own thread, so the load
//! overlaps with the pipeline's warm-up; [`CheckpointLoad`] reports both
//! durations and their overlap.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::{DType as CDType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use serde::{Deserialize, Serialize};

use super::model::{Model, ModelConfig};
use super::optim::OptimizerConfig;
use super::tensor::InputSpec;
use super::{TrainError, panic_text};
use crate::example::{DType, FeatureSpec, Layout, Schema, Value};

/// The weights file inside a checkpoint directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The metadata file inside a checkpoint directory.
pub const META_FILE: &str = "checkpoint.json";
/// The `format` value this version writes and reads.
pub const FORMAT: &str = "tfpipe-checkpoint-1";

/// One fixed-shape feature of a [`SchemaMeta`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureMeta {
    /// The feature's key in the records.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its fixed shape (`[]` for a scalar).
    pub shape: Vec<usize>,
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
/// without flags. Training takes fixed-shape features only, which is all
/// this stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaMeta {
    /// The fixed-shape features, label included, in schema order.
    pub features: Vec<FeatureMeta>,
    /// The label feature's name.
    pub label: Option<String>,
}

impl SchemaMeta {
    /// The fixed-shape features of `schema` (others cannot feed a model).
    pub fn from_schema(schema: &Schema) -> SchemaMeta {
        SchemaMeta {
            features: schema
                .features
                .iter()
                .filter_map(|f| match &f.layout {
                    Layout::Fixed(shape) => Some(FeatureMeta {
                        name: f.name.clone(),
                        dtype: f.dtype,
                        shape: shape.clone(),
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
                    layout: Layout::Fixed(f.shape.clone()),
                    default: match &f.default {
                        Some(DefaultMeta::Int64(v)) => Some(Value::Int64(v.clone())),
                        Some(DefaultMeta::Float32(v)) => Some(Value::Float32(v.clone())),
                        None => None,
                    },
                })
                .collect(),
            label: if with_label { self.label.clone() } else { None },
        }
    }
}

/// The JSON half of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Always `"tfpipe-checkpoint-1"`.
    pub format: String,
    /// The global step the weights are at.
    pub step: u64,
    /// Completed epochs.
    pub epoch: u64,
    /// The model.
    pub model: ModelConfig,
    /// The optimizer settings.
    pub optimizer: OptimizerConfig,
    /// Which columns feed the model.
    pub input: InputSpec,
    /// The schema of the training data, when known.
    pub schema: Option<SchemaMeta>,
    /// The seed of the run that started training.
    pub seed: u64,
}

/// A loaded checkpoint: the model, its variables and its metadata.
pub struct Checkpoint {
    /// What `checkpoint.json` says.
    pub meta: CheckpointMeta,
    /// The model, built on the loaded variables.
    pub model: Model,
    /// The variables (trainable: `--resume` continues from them).
    pub varmap: VarMap,
}

impl Checkpoint {
    /// Writes `varmap`'s weights and `meta` into `dir` (created if missing).
    pub fn save(
        dir: impl AsRef<Path>,
        varmap: &VarMap,
        meta: &CheckpointMeta,
    ) -> Result<(), TrainError> {
        let dir = dir.as_ref();
        let fail = |reason: String| TrainError::Checkpoint {
            path: dir.to_path_buf(),
            reason,
        };
        std::fs::create_dir_all(dir)
            .map_err(|e| fail(format!("cannot create the directory: {e}")))?;
        let weights = tempfile::Builder::new()
            .prefix(".model.")
            .tempfile_in(dir)
            .map_err(|e| fail(format!("cannot create a temporary file: {e}")))?;
        varmap
            .save(weights.path())
            .map_err(|e| fail(format!("cannot write the weights: {e}")))?;
        let mut json = tempfile::Builder::new()
            .prefix(".checkpoint.")
            .tempfile_in(dir)
            .map_err(|e| fail(format!("cannot create a temporary file: {e}")))?;
        serde_json::to_writer_pretty(&mut json, meta)
            .map_err(|e| fail(format!("cannot write {META_FILE}: {e}")))?;
        json.write_all(b"\n")
            .map_err(|e| fail(format!("cannot write {META_FILE}: {e}")))?;
        weights
            .persist(dir.join(WEIGHTS_FILE))
            .map_err(|e| fail(format!("cannot rename into {WEIGHTS_FILE}: {e}")))?;
        json.persist(dir.join(META_FILE))
            .map_err(|e| fail(format!("cannot rename into {META_FILE}: {e}")))?;
        Ok(())
    }

    /// Reads `dir/checkpoint.json`.
    pub fn read_meta(dir: impl AsRef<Path>) -> Result<CheckpointMeta, TrainError> {
        let path = dir.as_ref().join(META_FILE);
        let fail = |reason: String| TrainError::Checkpoint {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| fail(format!("cannot read: {e}")))?;
        let meta: CheckpointMeta = serde_json::from_str(&text)
            .map_err(|e| fail(format!("line {} column {}: {e}", e.line(), e.column())))?;
        if meta.format != FORMAT {
            return Err(fail(format!(
                "format {:?}, expected {FORMAT:?}",
                meta.format
            )));
        }
        Ok(meta)
    }

    /// Loads the checkpoint in `dir` onto `device`.
    pub fn load(dir: impl AsRef<Path>, device: &Device) -> Result<Checkpoint, TrainError> {
        let dir = dir.as_ref();
        let meta = Checkpoint::read_meta(dir)?;
        let path = dir.join(WEIGHTS_FILE);
        let fail = |reason: String| TrainError::Checkpoint {
            path: path.clone(),
            reason,
        };
        let tensors: HashMap<String, Tensor> =
            candle_core::safetensors::load(&path, device).map_err(|e| fail(e.to_string()))?;
        let varmap = VarMap::new();
        {
            let mut data = varmap
                .data()
                .lock()
                .map_err(|_| fail("variable map lock poisoned".into()))?;
            for (name, t) in &tensors {
                let t = t
                    .to_dtype(CDType::F32)
                    .map_err(|e| fail(format!("{name}: {e}")))?;
                data.insert(
                    name.clone(),
                    Var::from_tensor(&t).map_err(|e| fail(format!("{name}: {e}")))?,
                );
            }
        }
        // The model takes the loaded variables (shapes checked by candle);
        // any it has to create were missing from the file.
        let model = Model::new(
            meta.model.clone(),
            VarBuilder::from_varmap(&varmap, CDType::F32, device),
        )
        .map_err(|e| fail(format!("does not fit {}: {e}", meta.model.describe())))?;
        if varmap.all_vars().len() != tensors.len() {
            return Err(fail(format!(
                "has {} tensors, {} needs {}",
                tensors.len(),
                meta.model.describe(),
                varmap.all_vars().len()
            )));
        }
        Ok(Checkpoint {
            meta,
            model,
            varmap,
        })
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

/// A model being built (from a checkpoint, or initialised fresh) on its own thread.
pub(crate) struct BackgroundLoad {
    worker: Option<JoinHandle<(Result<Checkpoint, TrainError>, Instant)>>,
    started: Instant,
}

impl BackgroundLoad {
    /// Starts `build` on its own thread.
    pub(crate) fn spawn<F>(build: F) -> Result<BackgroundLoad, TrainError>
    where
        F: FnOnce() -> Result<Checkpoint, TrainError> + Send + 'static,
    {
        let started = Instant::now();
        let worker = std::thread::Builder::new()
            .name("tfpipe-model-load".into())
            .spawn(move || {
                let result = build();
                (result, Instant::now())
            })
            .map_err(|e| TrainError::Panic("model load", format!("cannot start: {e}")))?;
        Ok(BackgroundLoad {
            worker: Some(worker),
            started,
        })
    }

    /// Waits for the model; returns it with the load's start and end.
    pub(crate) fn join(mut self) -> Result<(Checkpoint, Instant, Instant), TrainError> {
        let worker = self
            .worker
            .take()
            .ok_or_else(|| TrainError::Panic("model load", "joined twice".into()))?;
        let (result, end) = worker
            .join()
            .map_err(|p| TrainError::Panic("model load", panic_text(&*p)))?;
        result.map(|c| (c, self.started, end))
    }
}

impl Drop for BackgroundLoad {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
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
