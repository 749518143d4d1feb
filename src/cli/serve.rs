//! `tfpipe serve`: serves checkpoints over TF Serving's REST API, KServe v2
//! and Prometheus metrics (the server is `tfpipe::serve`); here the flags,
//! the log lines and the signal that stops it.
//!
//! SIGTERM (or Ctrl-C) stops accepting, answers the requests in flight,
//! unloads the models and exits 0: the way a load balancer drains a
//! replica. A second signal ends the process at once.
//!
//! `tfpipe serve --write-warmup DIR --warmup-data FILES` writes TF Serving's
//! warm-up file into the version directory DIR and exits.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use tfpipe::Pipeline;
use tfpipe::serve::{
    BatchOptions, Event, ModelSource, ServeConfig, ServeError, Server, WarmupSource,
};
use tfpipe::train::parse_device;

use super::{Status, interrupt};

/// Arguments of `tfpipe serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// NAME=PATH: serve the checkpoint directory PATH, or the highest
    /// numbered version in the base directory PATH (PATH/1, PATH/2, ...),
    /// as NAME. Repeat for several models.
    #[arg(long, value_name = "NAME=PATH")]
    pub model: Vec<String>,
    /// NAME:LABEL=VERSION: model NAME's version VERSION answers at
    /// /v1/models/NAME/labels/LABEL and stays loaded beside the newest
    /// (TF Serving's version_labels). Repeat for several labels.
    #[arg(long, value_name = "NAME:LABEL=VERSION")]
    pub version_label: Vec<String>,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port (TF Serving's REST port by default; 0 picks a free one).
    #[arg(long, default_value_t = 8501)]
    pub port: u16,
    /// Merge concurrent requests into one forward pass (`false`: one
    /// request per pass).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_batching: bool,
    /// The most examples in one forward pass, and in one request.
    #[arg(long, default_value_t = 256, value_parser = super::positive::<usize>)]
    pub max_batch_size: usize,
    /// How long the first request of a batch waits for others, microseconds.
    #[arg(long, default_value_t = 0, value_parser = super::count::<u64>)]
    pub batch_timeout_micros: u64,
    /// Full batches the queue holds before requests get 503.
    #[arg(long, default_value_t = 64, value_parser = super::positive::<usize>)]
    pub max_enqueued_batches: usize,
    /// How often base directories are scanned for new versions, seconds
    /// (0: never after start).
    #[arg(long, default_value_t = 1.0)]
    pub poll_seconds: f64,
    /// TFRecord files or globs of tf.train.Examples to warm up with (when a
    /// version has no assets.extra/tf_serving_warmup_requests); by default
    /// inputs generated from the schema.
    #[arg(long, num_args = 1..)]
    pub warmup_data: Vec<String>,
    /// Write TF Serving's warm-up file (DIR/assets.extra/tf_serving_warmup_requests)
    /// from the first 1,000 records of --warmup-data, and exit.
    #[arg(long, value_name = "DIR", requires = "warmup_data")]
    pub write_warmup: Option<PathBuf>,
    /// Connections served at once (a thread each).
    #[arg(long, default_value_t = 128, value_parser = super::positive::<usize>)]
    pub max_connections: usize,
    /// The largest request body, bytes (larger: 413).
    #[arg(long, default_value_t = 64 << 20, value_parser = super::positive::<usize>)]
    pub max_body_bytes: usize,
    #[command(flatten)]
    pub runtime: super::RuntimeFlags,
}

/// Runs `tfpipe serve`.
pub fn run(args: Args) -> anyhow::Result<Status> {
    super::common::set_compute_threads(args.runtime.compute_threads)?;
    if let Some(dir) = &args.write_warmup {
        return write_warmup(&args, dir);
    }
    let models = parse_labels(parse_models(&args.model)?, &args.version_label)?;
    let config = config(&args)?;
    // Every thread on one malloc arena, grown by the warm-up: see
    // share_one_malloc_arena (the heap thresholds were set first thing in main).
    super::common::share_one_malloc_arena();
    let interrupt = interrupt::install().context("installing the signal handlers")?;
    let server = Server::start(config, models)?;
    eprintln!("tfpipe serve: listening on http://{}", server.local_addr());
    let stop = interrupt.flag();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("tfpipe serve: stopping: answering the requests in flight");
    server.shutdown()?;
    eprintln!("tfpipe serve: stopped");
    Ok(Status::Ok)
}

/// `--model NAME=PATH`s, checked: a name fit for a URL, a path that exists.
fn parse_models(flags: &[String]) -> anyhow::Result<Vec<ModelSource>> {
    if flags.is_empty() {
        bail!("--model NAME=PATH: give at least one model to serve");
    }
    let mut models: Vec<ModelSource> = Vec::new();
    for flag in flags {
        let Some((name, path)) = flag.split_once('=') else {
            bail!("--model {flag:?}: expected NAME=PATH (e.g. --model digits=models/digits)");
        };
        let fits = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if name.is_empty() || !name.chars().all(fits) || name.starts_with('.') {
            bail!(
                "--model {flag:?}: the name must be letters, digits, '-', '_' or '.' (it goes in URLs)"
            );
        }
        if models.iter().any(|m| m.name == name) {
            bail!("--model {flag:?}: the name {name:?} is given twice");
        }
        let path = PathBuf::from(path);
        if !path.is_dir() {
            bail!(
                "--model {flag:?}: {} is not a directory (a checkpoint from `tfpipe train --save`, or a base directory of versions from --save-versions)",
                path.display()
            );
        }
        models.push(ModelSource::new(name, path));
    }
    Ok(models)
}

/// `--version-label NAME:LABEL=VERSION`s onto the models they name.
fn parse_labels(
    mut models: Vec<ModelSource>,
    flags: &[String],
) -> anyhow::Result<Vec<ModelSource>> {
    for flag in flags {
        let parsed = flag
            .split_once(':')
            .and_then(|(name, rest)| Some((name, rest.split_once('=')?)));
        let Some((name, (label, version))) = parsed else {
            bail!("--version-label {flag:?}: expected NAME:LABEL=VERSION (e.g. digits:stable=3)");
        };
        let Some(model) = models.iter_mut().find(|m| m.name == name) else {
            bail!("--version-label {flag:?}: no --model is named {name:?}");
        };
        let fits = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if label.is_empty() || !label.chars().all(fits) {
            bail!(
                "--version-label {flag:?}: the label must be letters, digits, '-', '_' or '.' (it goes in URLs)"
            );
        }
        let Some(number) = version
            .parse::<u64>()
            .ok()
            .filter(|_| version.bytes().all(|b| b.is_ascii_digit()))
        else {
            bail!("--version-label {flag:?}: {version:?} is not a version number");
        };
        if model.labels.contains_key(label) {
            bail!("--version-label {flag:?}: model {name:?} has the label {label:?} twice");
        }
        model.labels.insert(label.to_string(), number);
    }
    Ok(models)
}

/// The server's configuration from the flags, checked.
fn config(args: &Args) -> anyhow::Result<ServeConfig> {
    if !(args.poll_seconds.is_finite() && args.poll_seconds >= 0.0) {
        bail!(
            "--poll-seconds {}: must be 0 (never) or more",
            args.poll_seconds
        );
    }
    let poll = (args.poll_seconds > 0.0).then(|| Duration::from_secs_f64(args.poll_seconds));
    let warmup_data = match args.warmup_data.is_empty() {
        true => Vec::new(),
        false => Pipeline::tfrecord_files(&args.warmup_data)
            .context("--warmup-data")?
            .paths()
            .to_vec(),
    };
    let config = ServeConfig {
        addr: format!("{}:{}", args.host, args.port),
        batching: BatchOptions {
            enabled: args.enable_batching,
            max_batch_size: args.max_batch_size,
            batch_timeout: Duration::from_micros(args.batch_timeout_micros),
            max_enqueued_batches: args.max_enqueued_batches,
        },
        connections: args.max_connections,
        max_body_bytes: args.max_body_bytes,
        poll,
        warmup_data,
        device: parse_device(&args.runtime.device)?,
        started: super::process_start(),
        events: Some(Arc::new(print_event)),
        ..ServeConfig::default()
    };
    config.validate().map_err(with_flag)?;
    Ok(config)
}

/// A configuration error, with the flag that sets the setting at fault.
fn with_flag(e: ServeError) -> anyhow::Error {
    let flag = match &e {
        ServeError::Config { setting, .. } => match *setting {
            "max_batch_size" => Some("--max-batch-size"),
            "max_enqueued_batches" => Some("--max-enqueued-batches"),
            "connections" => Some("--max-connections"),
            "warmup_data" => Some("--warmup-data"),
            "models" => Some("--model NAME=PATH"),
            _ => None,
        },
        _ => None,
    };
    match flag {
        Some(flag) => anyhow::Error::new(e).context(flag),
        None => anyhow::Error::new(e),
    }
}

/// One log line per load, failure, unload, and when ready.
fn print_event(event: &Event) {
    match event {
        Event::Available {
            model,
            version,
            load_ms,
            warmup,
        } => {
            let source = match &warmup.source {
                WarmupSource::File(path) => format!("{}", path.display()),
                WarmupSource::Data => "--warmup-data".to_string(),
                WarmupSource::Generated => "generated inputs".to_string(),
            };
            eprintln!(
                "tfpipe serve: {model} version {version}: loaded in {load_ms:.1} ms, warmed in {:.1} ms ({} passes, {source}); AVAILABLE",
                warmup.ms, warmup.passes
            );
        }
        Event::Failed {
            model,
            version,
            error,
        } => eprintln!("tfpipe serve: {model} version {version}: not served: {error}"),
        Event::Unloading { model, version } => {
            eprintln!("tfpipe serve: {model} version {version}: UNLOADING (draining)")
        }
        Event::Unloaded { model, version } => {
            eprintln!("tfpipe serve: {model} version {version}: unloaded (END)")
        }
        Event::Ready { since_start_ms } => {
            eprintln!("tfpipe serve: ready {since_start_ms:.1} ms after process start")
        }
    }
}

/// `--write-warmup DIR`.
fn write_warmup(args: &Args, dir: &std::path::Path) -> anyhow::Result<Status> {
    let files = Pipeline::tfrecord_files(&args.warmup_data).context("--warmup-data")?;
    let name = args
        .model
        .first()
        .and_then(|m| m.split_once('='))
        .map_or("", |(name, _)| name);
    let (path, records) = tfpipe::serve::write_warmup_file(dir, files.paths(), name)?;
    println!(
        "wrote {records} warm-up requests (PredictionLog, predict) to {}",
        path.display()
    );
    Ok(Status::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `tfpipe serve`'s flags alone.
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        args: Args,
    }

    /// The flags that only shape behaviour over time (the batch timeout,
    /// the queue bound, the poll interval) reach the library's settings
    /// unchanged; `tests/serve.rs` shows each setting's effect.
    #[test]
    fn batching_and_poll_flags_become_the_servers_settings() {
        let flags = [
            "serve",
            "--model",
            "m=/nonexistent",
            "--max-batch-size",
            "8",
            "--batch-timeout-micros",
            "1500",
            "--max-enqueued-batches",
            "3",
            "--poll-seconds",
            "0.25",
        ];
        let settings = config(&Serve::try_parse_from(flags).unwrap().args).unwrap();
        assert_eq!(
            settings.batching,
            BatchOptions {
                enabled: true,
                max_batch_size: 8,
                batch_timeout: Duration::from_micros(1500),
                max_enqueued_batches: 3,
            }
        );
        assert_eq!(settings.poll, Some(Duration::from_millis(250)));
        let never = Serve::try_parse_from(["serve", "--poll-seconds", "0"]).unwrap();
        assert_eq!(config(&never.args).unwrap().poll, None);
    }
}
