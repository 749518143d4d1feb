//! The running iterator.
//!
//! The engine's [`PipelineIter`] always ends in a `prefetch` stage (one is
//! added when the dataset's last step is not a prefetch), whose thread
//! computes the elements. `__next__` waits on that stage's channel itself,
//! with the GIL released, in slices of [`SIGNAL_POLL`], running Python's
//! signal handlers between them: Ctrl-C raises `KeyboardInterrupt` in a
//! blocked `next()`, and the pipeline is then stopped (its threads end and
//! are joined when the iterator goes). No thread stands between Python and
//! the pipeline: each element is one hand-off, as in the Rust API.
//! `get_state()` is exactly where the consumer stands (the prefetch stage's
//! state accounts for what it holds).
//!
//! Invariants: at most one request is in flight (the inner state is taken
//! with `try_lock`: a second Python thread gets an error, never a deadlock
//! with the GIL); an iterator is used only in the process that made it (a
//! forked child has none of its threads, so it raises instead of hanging).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tfpipe::pipeline::{MetricsHandle, PipelineIter, PipelineState, Record, StopHandle, TimedOut};
use tfpipe::{Batch, PipelineError};

use crate::convert;
use crate::errors::pipeline_error;
use crate::plan::{self, Built, Op, PlanError};

/// How often a waiting `next()` runs Python's signal handlers.
const SIGNAL_POLL: Duration = Duration::from_millis(20);

/// An element as it leaves the engine, before it becomes Python objects.
pub(crate) enum Elem {
    Record(Record),
    Records(Vec<Record>),
    Batch {
        batch: Batch,
        batched: bool,
    },
    /// One element of each zipped dataset.
    Tuple(Vec<Elem>),
}

/// A running pipeline of any element type, its elements made [`Elem`]s.
trait Engine: Send {
    fn next_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Result<Elem, PipelineError>>, TimedOut>;
    fn state(&self) -> Result<PipelineState, PipelineError>;
}

struct Wrapped<T, F> {
    it: PipelineIter<T>,
    wrap: F,
}

impl<T: Send, F: Fn(T) -> Elem + Send> Engine for Wrapped<T, F> {
    fn next_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Result<Elem, PipelineError>>, TimedOut> {
        Ok(self.it.next_timeout(timeout)?.map(|r| r.map(&self.wrap)))
    }

    fn state(&self) -> Result<PipelineState, PipelineError> {
        self.it.state()
    }
}

/// The running pipeline and the handles other threads use to reach it.
struct Running {
    engine: Box<dyn Engine>,
    stop: StopHandle,
    metrics: MetricsHandle,
}

impl Running {
    /// Stops the pipeline and joins its threads.
    fn shut_down(self) {
        self.stop.stop();
        drop(self.engine);
    }
}

/// Starts a built plan, from `state` if given. `prefetched`: the plan ends
/// in a prefetch already; otherwise one element is prefetched, so that
/// `next()` can wait in slices (see the module doc).
fn start_built(
    built: Built,
    prefetched: bool,
    state: Option<&PipelineState>,
) -> Result<Running, PipelineError> {
    fn go<T: Send + 'static>(
        p: tfpipe::Pipeline<T>,
        prefetched: bool,
        state: Option<&PipelineState>,
        wrap: impl Fn(T) -> Elem + Send + 'static,
    ) -> Result<Running, PipelineError> {
        let p = if prefetched { p } else { p.prefetch(1) };
        let it = match state {
            Some(state) => p.start_from(state)?,
            None => p.start()?,
        };
        Ok(Running {
            stop: it.stop_handle(),
            metrics: it.metrics_handle(),
            engine: Box::new(Wrapped { it, wrap }),
        })
    }
    match built {
        Built::Files(files) => go(files.records(), prefetched, state, Elem::Record),
        Built::Global(global) => go(global.pipeline(), prefetched, state, Elem::Record),
        Built::Records(p, _) => go(p, prefetched, state, Elem::Record),
        Built::RecordBatches(p) => go(p, prefetched, state, Elem::Records),
        Built::Parsed { pipeline, batched } => go(pipeline, prefetched, state, move |batch| {
            Elem::Batch { batch, batched }
        }),
        Built::Tuples(p) => go(p, prefetched, state, Elem::Tuple),
    }
}

struct Inner {
    running: Option<Running>,
    /// No request was made yet: `set_state` may still restart.
    fresh: bool,
    /// The stream ended (or failed with a fatal error, or was interrupted).
    done: Option<&'static str>,
    /// Where an exhausted iterator stands (taken before its threads ended).
    final_state: Option<PipelineState>,
}

/// What other threads may reach while a `next()` waits: held only briefly.
struct Control {
    stop: StopHandle,
    metrics: MetricsHandle,
}

/// An iterator over a `Dataset` (made by `iter(ds)` or `ds.iter(state=...)`).
#[pyclass(frozen, module = "tfpipe._tfpipe")]
pub(crate) struct Iterator {
    ops: Vec<Op>,
    /// Held through a request (with the GIL released): taken with `try_lock`.
    inner: Mutex<Inner>,
    control: Mutex<Control>,
    pid: u32,
    /// Nanoseconds `next()` spent waiting for the engine.
    wait_ns: AtomicU64,
    nexts: AtomicU64,
}

/// The running pipeline, or why there is none.
fn running_of(inner: &mut Inner) -> PyResult<&mut Running> {
    if let Some(why) = inner.done {
        return Err(PyRuntimeError::new_err(why));
    }
    inner.fresh = false;
    inner
        .running
        .as_mut()
        .ok_or_else(|| PyRuntimeError::new_err("this iterator is closed"))
}

fn plan_error(py: Python<'_>, e: PlanError) -> PyErr {
    match e {
        PlanError::Invalid(message) => PyValueError::new_err(message),
        PlanError::Schema(e) => crate::errors::schema_error(e),
        PlanError::Pipeline(e) => pipeline_error(py, e),
    }
}

fn parse_ops(ops_json: &str) -> PyResult<Vec<Op>> {
    serde_json::from_str(ops_json)
        .map_err(|e| PyValueError::new_err(format!("invalid dataset description: {e}")))
}

fn parse_state(py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<PipelineState> {
    let text: String = if let Ok(text) = state.extract::<String>() {
        text
    } else {
        py.import("json")?
            .call_method1("dumps", (state,))?
            .extract()?
    };
    PipelineState::from_json(&text)
        .map_err(|e| PyValueError::new_err(format!("invalid iterator state: {e}")))
}

fn start_running(py: Python<'_>, ops: &[Op], state: Option<&PipelineState>) -> PyResult<Running> {
    let prefetched = matches!(ops.last(), Some(Op::Prefetch { buffer_size }) if *buffer_size > 0);
    // Building resolves globs (listing object storage) and may count
    // records for `rank`: no Python object is touched meanwhile.
    py.detach(|| {
        let built = plan::build(ops)?;
        start_built(built, prefetched, state).map_err(PlanError::Pipeline)
    })
    .map_err(|e| plan_error(py, e))
}

/// Starts a dataset (its JSON description) from the beginning, or from a
/// state that `get_state()` returned.
#[pyfunction]
#[pyo3(signature = (ops_json, state = None))]
pub(crate) fn start(
    py: Python<'_>,
    ops_json: &str,
    state: Option<&Bound<'_, PyAny>>,
) -> PyResult<Iterator> {
    let ops = parse_ops(ops_json)?;
    let state = state.map(|s| parse_state(py, s)).transpose()?;
    let running = start_running(py, &ops, state.as_ref())?;
    Ok(Iterator {
        ops,
        control: Mutex::new(Control {
            stop: running.stop.clone(),
            metrics: running.metrics.clone(),
        }),
        inner: Mutex::new(Inner {
            running: Some(running),
            fresh: true,
            done: None,
            final_state: None,
        }),
        pid: std::process::id(),
        wait_ns: AtomicU64::new(0),
        nexts: AtomicU64::new(0),
    })
}

/// `(rank, world_size)` from torchrun's or Slurm's variables, as the CLI
/// reads them, or `None` outside a launcher.
#[pyfunction]
pub(crate) fn rank_from_env() -> PyResult<Option<(usize, usize)>> {
    tfpipe::pipeline::Rank::from_env()
        .map(|r| r.map(|r| (r.rank(), r.world_size())))
        .map_err(|e| PyValueError::new_err(format!("the launcher's rank variables: {e}")))
}

impl Iterator {
    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, Inner>> {
        if std::process::id() != self.pid {
            return Err(PyRuntimeError::new_err(
                "this tfpipe iterator was created in another process (before a fork): its \
                 threads do not exist here; create a new iterator in this process \
                 (iter(dataset))",
            ));
        }
        match self.inner.try_lock() {
            Ok(guard) => Ok(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Err(PyRuntimeError::new_err(
                "this tfpipe iterator is in use by another thread; give each thread its own \
                 iterator",
            )),
        }
    }

    /// The next element, waited for with the GIL released, running the
    /// signal handlers between waits. On an exception from a handler
    /// (Ctrl-C), stops the pipeline and marks the iterator done.
    fn wait_next(
        &self,
        py: Python<'_>,
        inner: &mut Inner,
    ) -> PyResult<Option<Result<Elem, PipelineError>>> {
        let running = running_of(inner)?;
        loop {
            let engine = &mut running.engine;
            match py.detach(|| engine.next_timeout(SIGNAL_POLL)) {
                Ok(next) => return Ok(next),
                Err(TimedOut) => {
                    if let Err(e) = py.check_signals() {
                        running.stop.stop();
                        inner.done = Some(
                            "this iterator was interrupted; its pipeline is stopped: start a \
                             new one (or resume from a state saved before)",
                        );
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Where the pipeline stands, after the last element returned.
    fn running_state(
        &self,
        py: Python<'_>,
        inner: &mut Inner,
    ) -> PyResult<Result<PipelineState, PipelineError>> {
        let engine = &mut running_of(inner)?.engine;
        Ok(py.detach(move || engine.state()))
    }

    fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops the pipeline, waits for a `next()` in flight on another thread
    /// (it returns soon: the pipeline is stopped) and joins the threads.
    fn close_inner(&self, py: Python<'_>, why: &'static str) {
        self.control().stop.stop();
        let running = py.detach(|| {
            let mut inner = self
                .inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            inner.done.get_or_insert(why);
            inner.running.take()
        });
        if let Some(running) = running {
            py.detach(|| running.shut_down());
        }
    }
}

#[pymethods]
impl Iterator {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let mut inner = self.lock()?;
        if inner.done == Some(END) {
            return Ok(None);
        }
        let started = Instant::now();
        let next = self.wait_next(py, &mut inner)?;
        self.wait_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.nexts.fetch_add(1, Ordering::Relaxed);
        match next {
            None => {
                // Finished: keep the final state, then join the threads now,
                // not when Python drops us.
                if let Ok(Ok(state)) = self.running_state(py, &mut inner) {
                    inner.final_state = Some(state);
                }
                inner.done = Some(END);
                if let Some(running) = inner.running.take() {
                    py.detach(|| running.shut_down());
                }
                Ok(None)
            }
            Some(Ok(elem)) => Ok(Some(convert::elem(py, elem)?.unbind())),
            Some(Err(e)) => Err(pipeline_error(py, e)),
        }
    }

    /// Where the iterator stands, as a JSON-serialisable dict.
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut inner = self.lock()?;
        if let Some(state) = &inner.final_state {
            return py.import("json")?.call_method1("loads", (state.to_json(),));
        }
        let state = self
            .running_state(py, &mut inner)?
            .map_err(|e| pipeline_error(py, e))?;
        py.import("json")?.call_method1("loads", (state.to_json(),))
    }

    /// Continues from `state` (from `get_state()`); only before the first `next()`.
    fn set_state(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let state = parse_state(py, state)?;
        let old = {
            let mut inner = self.lock()?;
            if !inner.fresh {
                return Err(PyRuntimeError::new_err(
                    "set_state() works only before the first next(); use \
                     dataset.iter(state=...) for a new iterator",
                ));
            }
            inner.running.take()
        };
        if let Some(old) = old {
            py.detach(|| old.shut_down());
        }
        let running = start_running(py, &self.ops, Some(&state))?;
        *self.control() = Control {
            stop: running.stop.clone(),
            metrics: running.metrics.clone(),
        };
        let mut inner = self.lock()?;
        inner.running = Some(running);
        Ok(())
    }

    /// Per-stage counters, the bottleneck stage and the time `next()` waited.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snapshot = self.control().metrics.snapshot();
        let out = PyDict::new(py);
        let json = py.import("json")?;
        let stages = json.call_method1(
            "loads",
            (serde_json::to_string(&snapshot.stages).unwrap_or_else(|_| "[]".into()),),
        )?;
        out.set_item("stages", stages)?;
        out.set_item("bottleneck", snapshot.bottleneck_stage())?;
        out.set_item(
            "next_wait_s",
            self.wait_ns.load(Ordering::Relaxed) as f64 / 1e9,
        )?;
        out.set_item("next_calls", self.nexts.load(Ordering::Relaxed))?;
        Ok(out)
    }

    /// Stops the pipeline and joins its threads (also done when the iterator
    /// is dropped). A `next()` waiting on another thread returns (the stream
    /// ends). Later calls of `next()` raise `StopIteration`.
    fn close(&self, py: Python<'_>) {
        self.close_inner(py, END);
    }

    fn __repr__(&self) -> String {
        format!("<tfpipe iterator over {} operations>", self.ops.len())
    }
}

const END: &str = "the iterator is exhausted";

impl Drop for Iterator {
    fn drop(&mut self) {
        let running = match self.inner.get_mut() {
            Ok(inner) => inner.running.take(),
            Err(p) => p.into_inner().running.take(),
        };
        let Some(running) = running else { return };
        if std::process::id() != self.pid {
            // A forked child: the pipeline's threads do not exist here; joining would
            // hang. Forget it (its memory is the parent's copy).
            std::mem::forget(running);
            return;
        }
        Python::attach(|py| py.detach(|| running.shut_down()));
    }
}
