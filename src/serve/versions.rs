//! Models and their versions: which version serves, the states TF Serving
//! reports (`LOADING`, `AVAILABLE`, `UNLOADING`, `END`), and the manager
//! that loads, polls and unloads.
//!
//! Invariants:
//! - A version takes traffic only once loaded and warmed ([`Model::serving`]
//!   hands out only the available one).
//! - A version that failed is never served, and not retried until its
//!   `checkpoint.json` changes (a copy that was still being written); the
//!   version served before it stays.
//! - Version numbers come from the base directory's listing (names of ASCII
//!   digits only); a request's version is looked up among them, never
//!   joined to a path.
//! - An unloading version is dropped (its queue drained, its compute thread
//!   joined) once no request holds it.
//! - A version a label names ([`ModelSource::labels`]) is loaded beside
//!   the newest and kept when a newer one arrives; a label resolves to its
//!   number, which is then looked up like any version.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime};

use crate::train::META_FILE;

use super::batcher::Batcher;
use super::input::Signature;
use super::warmup::{WarmupReport, warm};
use super::{ApiError, Event, ModelSource, ServeConfig, ServeError, error_chain};

/// A version's state, TF Serving's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Being loaded and warmed.
    Loading,
    /// Serving.
    Available,
    /// Draining: no new requests.
    Unloading,
    /// Unloaded, or failed to load (with an error).
    End,
}

impl State {
    /// `LOADING`, `AVAILABLE`, `UNLOADING` or `END`.
    pub fn name(self) -> &'static str {
        match self {
            State::Loading => "LOADING",
            State::Available => "AVAILABLE",
            State::Unloading => "UNLOADING",
            State::End => "END",
        }
    }
}

/// What the status endpoint reports of one version.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionStatus {
    /// The version number.
    pub version: u64,
    /// Its state.
    pub state: State,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// Checkpoint load, ms (once loaded).
    pub load_ms: Option<f64>,
    /// Warm-up, ms (once warmed).
    pub warmup_ms: Option<f64>,
}

/// A loaded version: its signature and its batcher.
pub(crate) struct Version {
    pub number: u64,
    pub signature: Signature,
    pub description: String,
    pub batcher: Batcher,
}

/// A served model.
pub(crate) struct Model {
    pub name: String,
    source: ModelSource,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The newest available version: requests that name no version.
    serving: Option<Arc<Version>>,
    /// Older versions kept available because a label names them.
    pinned: BTreeMap<u64, Arc<Version>>,
    statuses: BTreeMap<u64, VersionStatus>,
    unloading: Vec<Arc<Version>>,
    /// Failed versions, with their metadata file's time then.
    failed: BTreeMap<u64, Option<SystemTime>>,
}

impl Model {
    pub fn new(source: ModelSource) -> Model {
        Model {
            name: source.name.clone(),
            source,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The version to send a request to: the available one, which must be
    /// `version` when one is asked for.
    pub fn serving(&self, version: Option<u64>) -> Result<Arc<Version>, ApiError> {
        let inner = self.lock();
        match (&inner.serving, version) {
            (Some(v), None) => Ok(v.clone()),
            (Some(v), Some(n)) if v.number == n => Ok(v.clone()),
            (_, Some(n)) if inner.pinned.contains_key(&n) => Ok(inner.pinned[&n].clone()),
            (_, Some(n)) => Err(ApiError::not_found(match inner.statuses.get(&n) {
                Some(s) => format!(
                    "version {n} of model {:?} is not available (it is {})",
                    self.name,
                    s.state.name()
                ),
                None => format!("model {:?} has no version {n}", self.name),
            })),
            (None, None) => Err(ApiError::new(
                503,
                format!(
                    "model {:?} has no available version yet ({})",
                    self.name,
                    self.describe_states(&inner)
                ),
            )),
        }
    }

    /// The version `label` names. None: TF Serving's message and code, 400
    /// (its label lookup fails with `InvalidArgument`, not `NotFound`).
    pub fn label_version(&self, label: &str) -> Result<u64, ApiError> {
        self.source.labels.get(label).copied().ok_or_else(|| {
            let known: Vec<String> = self
                .source
                .labels
                .keys()
                .map(|l| format!("{l:?}"))
                .collect();
            let known = match known.is_empty() {
                true => "none".to_string(),
                false => known.join(", "),
            };
            ApiError::bad_request(format!(
                "Unrecognized servable version label: {} (model {:?} has labels: {known})",
                super::server::short(label),
                self.name
            ))
        })
    }

    fn is_labelled(&self, number: u64) -> bool {
        self.source.labels.values().any(|&n| n == number)
    }

    fn describe_states(&self, inner: &Inner) -> String {
        if inner.statuses.is_empty() {
            return "none found".into();
        }
        inner
            .statuses
            .values()
            .map(|s| format!("version {} {}", s.version, s.state.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The statuses of every version, or of `version`.
    pub fn statuses(&self, version: Option<u64>) -> Result<Vec<VersionStatus>, ApiError> {
        let inner = self.lock();
        match version {
            None => Ok(inner.statuses.values().rev().cloned().collect()),
            Some(n) => inner
                .statuses
                .get(&n)
                .map(|s| vec![s.clone()])
                .ok_or_else(|| {
                    ApiError::not_found(format!("model {:?} has no version {n}", self.name))
                }),
        }
    }

    /// Whether a version is available.
    pub fn is_ready(&self) -> bool {
        self.lock().serving.is_some()
    }

    /// The loaded versions (serving and draining), for the metrics.
    pub fn loaded(&self) -> Vec<Arc<Version>> {
        let inner = self.lock();
        inner
            .serving
            .iter()
            .chain(inner.pinned.values())
            .chain(&inner.unloading)
            .cloned()
            .collect()
    }

    fn set_status(&self, status: VersionStatus) {
        self.lock().statuses.insert(status.version, status);
    }

    /// Loads a newer version when the directory has one, and the labelled
    /// versions not loaded yet; drops drained ones.
    pub fn poll(&self, config: &ServeConfig) {
        self.reap(config);
        let Ok(candidates) = list_versions(&self.source.path) else {
            return;
        };
        let current = self.lock().serving.as_ref().map(|v| v.number);
        let next = candidates
            .iter()
            .rev()
            .find(|(n, dir)| current.is_none_or(|c| *n > c) && self.may_try(*n, dir));
        if let Some((number, dir)) = next
            && let Some(version) = self.load(*number, dir.clone(), config)
        {
            self.make_newest(version, config);
        }
        for (number, dir) in &candidates {
            if self.is_labelled(*number)
                && !self.is_loaded(*number)
                && self.may_try(*number, dir)
                && let Some(version) = self.load(*number, dir.clone(), config)
            {
                self.lock().pinned.insert(*number, Arc::new(version));
            }
        }
    }

    fn is_loaded(&self, number: u64) -> bool {
        let inner = self.lock();
        inner.serving.as_ref().is_some_and(|v| v.number == number)
            || inner.pinned.contains_key(&number)
    }

    /// `version` takes the requests that name no version; the one it
    /// replaces stays when labelled, else drains.
    fn make_newest(&self, version: Version, config: &ServeConfig) {
        let old = self.lock().serving.replace(Arc::new(version));
        match old {
            Some(old) if self.is_labelled(old.number) => {
                self.lock().pinned.insert(old.number, old);
            }
            Some(old) => self.unload(old, config),
            None => {}
        }
    }

    /// Whether version `n` may be (re)tried: never failed, or its metadata
    /// changed since.
    fn may_try(&self, n: u64, dir: &Path) -> bool {
        match self.lock().failed.get(&n) {
            None => true,
            Some(then) => meta_time(dir) != *then,
        }
    }

    /// Loads and warms version `number`, reporting how it went; the caller
    /// puts it where requests find it.
    fn load(&self, number: u64, dir: PathBuf, config: &ServeConfig) -> Option<Version> {
        self.set_status(VersionStatus {
            version: number,
            state: State::Loading,
            error: None,
            load_ms: None,
            warmup_ms: None,
        });
        let stamp = meta_time(&dir);
        match start_version(&self.source, number, dir, config) {
            Ok((version, load_ms, warmup)) => {
                self.set_status(VersionStatus {
                    version: number,
                    state: State::Available,
                    error: None,
                    load_ms: Some(load_ms),
                    warmup_ms: Some(warmup.ms),
                });
                self.lock().failed.remove(&number);
                config.emit(Event::Available {
                    model: self.name.clone(),
                    version: number,
                    load_ms,
                    warmup,
                });
                Some(version)
            }
            Err(e) => {
                let error = error_chain(&e);
                self.set_status(VersionStatus {
                    version: number,
                    state: State::End,
                    error: Some(error.clone()),
                    load_ms: None,
                    warmup_ms: None,
                });
                self.lock().failed.insert(number, stamp);
                config.emit(Event::Failed {
                    model: self.name.clone(),
                    version: number,
                    error,
                });
                None
            }
        }
    }

    fn unload(&self, old: Arc<Version>, config: &ServeConfig) {
        let number = old.number;
        if let Some(s) = self.lock().statuses.get_mut(&number) {
            s.state = State::Unloading;
        }
        config.emit(Event::Unloading {
            model: self.name.clone(),
            version: number,
        });
        self.lock().unloading.push(old);
        self.reap(config);
    }

    /// Drops the unloading versions no request holds any more.
    fn reap(&self, config: &ServeConfig) {
        let done: Vec<Arc<Version>> = {
            let mut inner = self.lock();
            let (done, busy) = std::mem::take(&mut inner.unloading)
                .into_iter()
                .partition(|v| Arc::strong_count(v) == 1);
            inner.unloading = busy;
            done
        };
        for version in done {
            self.finish_unload(version, config);
        }
    }

    /// Drops `version` (which closes its queue, answers what is left and
    /// joins its thread), marks it ended and says so.
    fn finish_unload(&self, version: Arc<Version>, config: &ServeConfig) {
        let number = version.number;
        drop(version);
        if let Some(s) = self.lock().statuses.get_mut(&number) {
            s.state = State::End;
        }
        config.emit(Event::Unloaded {
            model: self.name.clone(),
            version: number,
        });
    }

    /// Stops serving: every version unloads (at shutdown, after the
    /// connections are closed).
    pub fn unload_all(&self, config: &ServeConfig) {
        let (serving, pinned) = {
            let mut inner = self.lock();
            (inner.serving.take(), std::mem::take(&mut inner.pinned))
        };
        for v in serving.into_iter().chain(pinned.into_values()) {
            self.unload(v, config);
        }
        let rest = std::mem::take(&mut self.lock().unloading);
        for version in rest {
            self.finish_unload(version, config);
        }
    }
}

/// Loads version `number` from `dir` on a new compute thread and warms it
/// up there; returns it with its load time and warm-up report.
fn start_version(
    source: &ModelSource,
    number: u64,
    dir: PathBuf,
    config: &ServeConfig,
) -> Result<(Version, f64, WarmupReport), ServeError> {
    let loader = source.loader.clone();
    let device = config.device.clone();
    let options = config.batching;
    let data = config.warmup_data.clone();
    let prepare = move || {
        let start = Instant::now();
        let predictor = loader(&dir, &device).map_err(|e| ServeError::Load(Box::new(e)))?;
        let load_ms = start.elapsed().as_secs_f64() * 1e3;
        let signature = Signature::from_meta(predictor.meta()).map_err(ServeError::Signature)?;
        let report = warm(&predictor, &signature, &options, &dir, &data)?;
        let description = predictor.describe();
        Ok((predictor, (signature, description, load_ms, report)))
    };
    let name = format!("serve-{}-v{number}", source.name);
    let (batcher, (signature, description, load_ms, report)) =
        Batcher::start(name, options, prepare)?;
    Ok((
        Version {
            number,
            signature,
            description,
            batcher,
        },
        load_ms,
        report,
    ))
}

/// The versions in `path`, ascending: `[(1, path)]` for a checkpoint
/// directory, else its subdirectories named by a number.
pub(crate) fn list_versions(path: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    if path.join(META_FILE).is_file() {
        return Ok(vec![(1, path.to_path_buf())]);
    }
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(number) = name.to_str().and_then(version_number) else {
            continue;
        };
        if entry.path().is_dir() {
            versions.push((number, entry.path()));
        }
    }
    versions.sort();
    Ok(versions)
}

/// A directory name that is a version: ASCII digits only (no sign, no
/// dots), as TF Serving reads them.
fn version_number(name: &str) -> Option<u64> {
    if name.is_empty() || name.len() > 18 || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

fn meta_time(dir: &Path) -> Option<SystemTime> {
    std::fs::metadata(dir.join(META_FILE))
        .and_then(|m| m.modified())
        .ok()
}

/// The directory for the next version under `base` (created when
/// missing): one above the highest numbered subdirectory, or `base/1`.
/// The directory itself is not created: a checkpoint saved there appears
/// whole ([`Checkpoint::save`](crate::train::Checkpoint::save) is atomic),
/// so a server polling `base` never sees half a version.
///
/// ```
/// let base = tempfile::tempdir()?;
/// let first = tfpipe::serve::next_version_dir(base.path())?;
/// assert_eq!(first, base.path().join("1"));
/// std::fs::create_dir(base.path().join("7"))?;
/// assert_eq!(tfpipe::serve::next_version_dir(base.path())?, base.path().join("8"));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn next_version_dir(base: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(base)?;
    let highest = list_versions(base)?.last().map_or(0, |(n, _)| *n);
    Ok(base.join((highest + 1).to_string()))
}

/// Loads and polls until `stop` says so (or is dropped). Once every model
/// has a version, `before_ready` runs (the request path's warm-up), then
/// `on_ready` with the time since start.
pub(crate) fn manage(
    models: &[Arc<Model>],
    config: &ServeConfig,
    stop: &crossbeam_channel::Receiver<()>,
    before_ready: &dyn Fn(),
    on_ready: &dyn Fn(f64),
) {
    let mut announced = false;
    loop {
        for model in models {
            model.poll(config);
        }
        if !announced && models.iter().all(|m| m.is_ready()) {
            announced = true;
            before_ready();
            let since_start_ms = config.started.elapsed().as_secs_f64() * 1e3;
            on_ready(since_start_ms);
            config.emit(Event::Ready { since_start_ms });
        }
        let stopped = match config.poll {
            Some(every) => !matches!(
                stop.recv_timeout(every),
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
            ),
            None => {
                let _ = stop.recv();
                true
            }
        };
        if stopped {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_digit_names_are_versions() {
        assert_eq!(version_number("12"), Some(12));
        for name in [
            "",
            "-1",
            "+1",
            "1.0",
            "..",
            "1a",
            "0x1",
            "99999999999999999999",
        ] {
            assert_eq!(version_number(name), None, "{name}");
        }
    }

    #[test]
    fn versions_list_in_order_and_skip_others() {
        let base = tempfile::tempdir().unwrap();
        for name in ["10", "2", ".3.tmp-x", "notes"] {
            std::fs::create_dir(base.path().join(name)).unwrap();
        }
        std::fs::write(base.path().join("5"), b"a file").unwrap();
        let found: Vec<u64> = list_versions(base.path())
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(found, vec![2, 10]);
        assert_eq!(
            next_version_dir(base.path()).unwrap(),
            base.path().join("11")
        );
    }
}
