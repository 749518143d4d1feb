//! The model server behind `tfpipe serve`: warm models behind the REST
//! protocols clients already speak.
//!
//! - **Protocols** (JSON over HTTP/1.1 with keep-alive): TF Serving's REST
//!   API (`/v1/models/NAME[/versions/V]` status, `/metadata`, `:predict` in
//!   the row and columnar forms, `:classify`, `:regress`), the Open
//!   Inference Protocol of KServe v2 and Triton (`/v2/health/live|ready`,
//!   `/v2/models/NAME[/versions/V][/ready|/infer]`), and Prometheus text at
//!   `/metrics`. Errors are `{"error": "..."}` with TF Serving's codes: 400
//!   for a bad request (the message names the field), 404 for an unknown
//!   model or version, 413 for a body over the limit, 503 when the queue is
//!   full or the model is not ready.
//! - **Versions** ([`ModelSource`]): a checkpoint directory, or a base
//!   directory of numbered versions (`PATH/1/`, `PATH/2/`, ...) of which the
//!   highest is served and that is polled for new ones. A new version is
//!   loaded and warmed on its own compute thread before it takes traffic;
//!   the old one then drains and is unloaded. A version that fails to load,
//!   to verify (checkpoint checksums) or to warm up is reported in the
//!   status and never served. Versions come from the directory listing
//!   (digits only), never from a request, so no request names a path.
//!   Labels ([`ModelSource::label`]) name versions, as TF Serving's
//!   `version_labels` do (`/v1/models/NAME/labels/stable:predict`); a
//!   labelled version stays loaded beside the newest.
//! - **Warm-up**, before a version is marked available: TF Serving's
//!   `assets.extra/tf_serving_warmup_requests` when the version has one, or
//!   records from [`ServeConfig::warmup_data`], or inputs generated from the
//!   schema, at every batch size [`BatchOptions::warmup_sizes`] lists.
//! - **Batching**: a dynamic batcher per version ([`BatchOptions`], TF
//!   Serving's `max_batch_size`, `batch_timeout_micros`,
//!   `max_enqueued_batches`) merges concurrent requests into one forward
//!   pass and splits the results back exactly; a full queue answers 503 at
//!   once.
//!
//! # Threads
//! All started through [`crate::spawn`]: a fixed pool of connection
//! threads (each serves one connection at a time, so connections are
//! bounded by [`ServeConfig::connections`]; they take turns at `accept`,
//! the thread idle most recently first), one compute thread per loaded
//! version, and one manager that loads, polls and unloads. Dropping the
//! [`Server`] (or [`Server::shutdown`]) stops accepting, answers the
//! requests in flight, and joins them all.
//!
//! # Example
//! Serving a custom model from its checkpoints (any [`Model`](crate::train::Model)):
//!
//! ```no_run
//! use std::sync::Arc;
//! use tfpipe::serve::{ModelSource, ServeConfig, Server};
//! use tfpipe::train::Predictor;
//!
//! let source = ModelSource::new("digits", "models/digits")
//!     // The default loader rebuilds built-in models; a custom one builds its own.
//!     .loader(Arc::new(|dir: &std::path::Path, device: &candle_core::Device| {
//!         Predictor::load(dir, device)
//!     }));
//! let server = Server::start(ServeConfig::default(), vec![source])?;
//! server.wait_ready(std::time::Duration::from_secs(10));
//! println!("serving on http://{}", server.local_addr());
//! server.shutdown()?;
//! # Ok::<(), tfpipe::serve::ServeError>(())
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;

use crate::spawn::Panicked;
use crate::train::{Predictor, TrainError};

mod batcher;
mod http;
pub(crate) mod input;
mod metrics;
mod rest;
mod server;
mod turns;
mod v2;
mod versions;
mod warmup;

pub use batcher::{BatchOptions, BatchStats};
pub use input::{InputFeature, Signature};
pub use server::Server;
pub use versions::{State, VersionStatus, next_version_dir};
pub use warmup::{
    MAX_WARMUP_RECORDS, WARMUP_FILE, WarmupReport, WarmupSource, proto, read_warmup_file,
    warmup_log_to_batch, write_warmup_file,
};

/// Loads a version's checkpoint directory into a predictor (the default
/// rebuilds a built-in model: [`Predictor::load`]).
pub type Loader =
    Arc<dyn Fn(&std::path::Path, &Device) -> Result<Predictor, TrainError> + Send + Sync>;

/// A model to serve: its name in URLs and where its versions are.
#[derive(Clone)]
pub struct ModelSource {
    /// The name clients use (`/v1/models/NAME`).
    pub name: String,
    /// A checkpoint directory (served as version 1), or a base directory of
    /// numbered versions.
    pub path: PathBuf,
    /// How a version is loaded.
    pub loader: Loader,
    /// Version labels (`"stable"` -> 1), TF Serving's `version_labels`:
    /// `/v1/models/NAME/labels/LABEL` is the labelled version, and a
    /// labelled version stays loaded beside the newest one.
    pub labels: BTreeMap<String, u64>,
}

impl ModelSource {
    /// A model of built-in checkpoints.
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>) -> ModelSource {
        ModelSource {
            name: name.into(),
            path: path.into(),
            loader: Arc::new(|dir: &std::path::Path, device: &Device| Predictor::load(dir, device)),
            labels: BTreeMap::new(),
        }
    }

    /// Names version `version` `label` (a label given again moves to the
    /// new version).
    ///
    /// ```
    /// let source = tfpipe::serve::ModelSource::new("digits", "models/digits")
    ///     .label("stable", 1)
    ///     .label("canary", 2);
    /// assert_eq!(source.labels["canary"], 2);
    /// ```
    pub fn label(mut self, label: impl Into<String>, version: u64) -> ModelSource {
        self.labels.insert(label.into(), version);
        self
    }

    /// Loads versions with `loader` (for custom models).
    pub fn loader(mut self, loader: Loader) -> ModelSource {
        self.loader = loader;
        self
    }
}

impl std::fmt::Debug for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSource")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}

/// Something the server did that an operator wants in the log.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A version is loaded and warmed, and now takes traffic.
    Available {
        /// The model.
        model: String,
        /// The version.
        version: u64,
        /// Checkpoint load, ms.
        load_ms: f64,
        /// How it was warmed.
        warmup: WarmupReport,
    },
    /// A version failed to load or warm up and will not be served.
    Failed {
        /// The model.
        model: String,
        /// The version.
        version: u64,
        /// Why, with every cause.
        error: String,
    },
    /// A version stopped taking new requests and drains.
    Unloading {
        /// The model.
        model: String,
        /// The version.
        version: u64,
    },
    /// A version is gone.
    Unloaded {
        /// The model.
        model: String,
        /// The version.
        version: u64,
    },
    /// Every model has an available version.
    Ready {
        /// Since [`ServeConfig::started`], ms.
        since_start_ms: f64,
    },
}

/// Receives [`Event`]s (the CLI prints them).
pub type EventSink = Arc<dyn Fn(&Event) + Send + Sync>;

/// How the server runs. Built with struct update syntax from `default()`.
#[derive(Clone)]
pub struct ServeConfig {
    /// The address to listen on. By default 127.0.0.1:8501 (TF Serving's REST port).
    pub addr: String,
    /// The batcher. By default batching on, at most 256 examples per
    /// batch, no waiting, 64 batches queued.
    pub batching: BatchOptions,
    /// Connection threads: the most connections served at once (others wait
    /// in the listen backlog). By default 128.
    pub connections: usize,
    /// The largest request body, bytes (larger: 413). By default 64 MiB.
    pub max_body_bytes: usize,
    /// The largest request head (request line and headers), bytes (larger:
    /// 431). By default 16 KiB.
    pub max_header_bytes: usize,
    /// How long an idle keep-alive connection is kept. By default 60 s.
    pub idle_timeout: Duration,
    /// How often base directories are scanned for new versions; `None`:
    /// never after start. By default 1 s.
    pub poll: Option<Duration>,
    /// TFRecord files of `tf.train.Example`s to warm up with, when a
    /// version has no TF Serving warm-up file. By default none (generated
    /// inputs).
    pub warmup_data: Vec<PathBuf>,
    /// The device models run on. By default the CPU.
    pub device: Device,
    /// When the process started, for the start-to-ready report and metric.
    /// By default when the config was made.
    pub started: Instant,
    /// Where events go. By default nowhere.
    pub events: Option<EventSink>,
}

impl Default for ServeConfig {
    fn default() -> ServeConfig {
        ServeConfig {
            addr: "127.0.0.1:8501".into(),
            batching: BatchOptions::default(),
            connections: 128,
            max_body_bytes: 64 << 20,
            max_header_bytes: 16 << 10,
            idle_timeout: Duration::from_secs(60),
            poll: Some(Duration::from_secs(1)),
            warmup_data: Vec::new(),
            device: Device::Cpu,
            started: Instant::now(),
            events: None,
        }
    }
}

impl ServeConfig {
    /// Refuses settings that cannot work, before anything starts.
    pub fn validate(&self) -> Result<(), ServeError> {
        let bad = |setting: &'static str, reason: &str| {
            Err(ServeError::Config {
                setting,
                reason: reason.into(),
            })
        };
        if self.batching.max_batch_size == 0 {
            return bad(
                "max_batch_size",
                "the maximum batch size must be at least 1",
            );
        }
        if self.batching.max_batch_size > 1 << 16 {
            return bad(
                "max_batch_size",
                "the maximum batch size must be at most 65536",
            );
        }
        if self.batching.max_enqueued_batches == 0 {
            return bad(
                "max_enqueued_batches",
                "the queue must hold at least one batch",
            );
        }
        if self.connections == 0 || self.connections > 4096 {
            return bad("connections", "connection threads must be 1 to 4096");
        }
        if self.max_header_bytes < 256 {
            return bad(
                "max_header_bytes",
                "the request head limit must be at least 256 bytes",
            );
        }
        Ok(())
    }

    fn emit(&self, event: Event) {
        if let Some(sink) = &self.events {
            sink(&event);
        }
    }
}

/// A request the server refuses: the HTTP status and a message that names
/// the field at fault. Sent as `{"error": message}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// 400, 404, 405, 411, 413, 431, 500 or 503.
    pub status: u16,
    /// What is wrong, and where.
    pub message: String,
}

impl ApiError {
    /// A 400.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, message)
    }

    /// A 404.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(404, message)
    }

    /// Any status.
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

/// Why the server, a version, or a warm-up file failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting that cannot work: which one, and why.
    #[error("invalid server configuration: {setting}: {reason}")]
    Config {
        /// The setting, as [`ServeConfig`] names it (`max_batch_size`,
        /// `warmup_data`, ...).
        setting: &'static str,
        /// Why it cannot work.
        reason: String,
    },
    /// The address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A thread could not be started.
    #[error("cannot start the {0} thread")]
    Spawn(&'static str, #[source] std::io::Error),
    /// A thread panicked.
    #[error(transparent)]
    Panic(#[from] Panicked),
    /// A model path that is neither a checkpoint nor a directory of versions.
    #[error("{}: cannot read the model directory", path.display())]
    ModelDir {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Loading a checkpoint failed (I/O, checksums, another format).
    #[error("loading")]
    Load(#[source] Box<TrainError>),
    /// The checkpoint's inputs cannot come in a request.
    #[error("the model's inputs cannot be served: {0}")]
    Signature(String),
    /// A warm-up forward pass failed.
    #[error("warm-up at batch size {rows}")]
    Warmup {
        /// The batch's examples.
        rows: usize,
        /// The model's error.
        #[source]
        source: Box<TrainError>,
    },
    /// A warm-up record that is not a request the model takes.
    #[error("{}: record {record}", path.display())]
    WarmupRecord {
        /// The warm-up file.
        path: PathBuf,
        /// The record's index.
        record: usize,
        /// What is wrong with it.
        #[source]
        source: ApiError,
    },
    /// A warm-up file or warm-up data that cannot be read or written.
    #[error("warm-up records")]
    Records(#[source] crate::tfrecord::RecordError),
    /// A file that cannot be written.
    #[error("{}: cannot write", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Every cause of `err`, each once, as one line (for status messages and logs).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setting_that_cannot_work_is_named() {
        assert!(ServeConfig::default().validate().is_ok());
        let with = |edit: fn(&mut ServeConfig)| {
            let mut config = ServeConfig::default();
            edit(&mut config);
            match config.validate() {
                Err(ServeError::Config { setting, .. }) => setting,
                other => panic!("accepted: {other:?}"),
            }
        };
        assert_eq!(with(|c| c.batching.max_batch_size = 0), "max_batch_size");
        assert_eq!(
            with(|c| c.batching.max_batch_size = 1 << 20),
            "max_batch_size"
        );
        assert_eq!(
            with(|c| c.batching.max_enqueued_batches = 0),
            "max_enqueued_batches"
        );
        assert_eq!(with(|c| c.connections = 0), "connections");
        assert_eq!(with(|c| c.max_header_bytes = 10), "max_header_bytes");
    }
}
