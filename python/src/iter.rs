//! The running iterator.
//!
//! The engine's [`PipelineIter`] runs on a thread of its own (started with
//! [`tfpipe::spawn::Thread`]), which pulls one element per request: the
//! iterator never runs ahead of what Python has taken, so `get_state()` is
//! exactly where the consumer stands. `__next__` sends a request and waits
//! for the reply with the GIL released, waking every [`SIGNAL_POLL`] to run
//! Python's signal handlers, so Ctrl-C raises `KeyboardInterrupt` in a
//! blocked `next()`; the pipeline is then stopped (its threads end and are
//! joined when the iterator goes).
//!
//! Invariants: at most one request is in flight (the inner state is taken
//! with `try_lock`: a second Python thread gets an error, never a deadlock
//! with the GIL); an iterator is used only in the process that made it (a
//! forked child has none of its threads, so it raises instead of hanging).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tfpipe::pipeline::{MetricsHandle, PipelineIter, PipelineState, Record, StopHandle};
use tfpipe::spawn::Thread;
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

enum Request {
    Next,
    State,
}

enum Reply {
    Next(Option<Result<Elem, PipelineError>>),
    State(Result<PipelineState, PipelineError>),
}

/// The thread that owns the engine iterator, and the ends to talk to it.
struct Driver {
    requests: Sender<Request>,
    replies: Receiver<Reply>,
    stop: StopHandle,
    metrics: MetricsHandle,
    thread: Option<Thread<()>>,
}

impl Driver {
    fn spawn<T: Send + 'static>(
        mut it: PipelineIter<T>,
        wrap: impl Fn(T) -> Elem + Send + 'static,
    ) -> std::io::Result<Driver> {
        let stop = it.stop_handle();
        let metrics = it.metrics_handle();
        let (requests, inbox) = crossbeam_channel::bounded::<Request>(1);
        let (outbox, replies) = crossbeam_channel::bounded::<Reply>(1);
        let thread = Thread::spawn("python-iterator", move |cancel| {
            while let Ok(request) = cancel.recv(&inbox) {
                let reply = match request {
                    Request::Next => Reply::Next(it.next().map(|r| r.map(&wrap))),
                    Request::State => Reply::State(it.state()),
                };
                if cancel.send(&outbox, reply).is_err() {
                    break;
                }
            }
            // Dropping `it` here cancels the stages and joins their threads.
        })?;
        Ok(Driver {
            requests,
            replies,
            stop,
            metrics,
            thread: Some(thread),
        })
    }

    /// Stops the pipeline and joins the thread (which joins the stages).
    fn shut_down(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            thread.cancel();
            let _ = thread.join();
        }
    }
}

/// Starts a built plan, from `state` if given.
fn start_built(built: Built, state: Option<&PipelineState>) -> Result<Driver, PipelineError> {
    fn go<T: Send + 'static>(
        p: tfpipe::Pipeline<T>,
        state: Option<&PipelineState>,
        wrap: impl Fn(T) -> Elem + Send + 'static,
    ) -> Result<Driver, PipelineError> {
        let it = match state {
            Some(state) => p.start_from(state)?,
            None => p.start()?,
        };
        Driver::spawn(it, wrap).map_err(|error| PipelineError::Spawn {
            stage: "python-iterator".into(),
            error,
        })
    }
    match built {
        Built::Files(files) => go(files.records(), state, Elem::Record),
        Built::Global(global) => go(global.pipeline(), state, Elem::Record),
        Built::Records(p, _) => go(p, state, Elem::Record),
        Built::RecordBatches(p) => go(p, state, Elem::Records),
        Built::Parsed { pipeline, batched } => {
            go(pipeline, state, move |batch| Elem::Batch { batch, batched })
        }
        Built::Tuples(p) => go(p, state, Elem::Tuple),
    }
}

struct Inner {
    driver: Option<Driver>,
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

fn start_driver(py: Python<'_>, ops: &[Op], state: Option<&PipelineState>) -> PyResult<Driver> {
    // Building resolves globs (listing object storage) and may count
    // records for `rank`: no Python object is touched meanwhile.
    py.detach(|| {
        let built = plan::build(ops)?;
        start_built(built, state).map_err(PlanError::Pipeline)
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
    let driver = start_driver(py, &ops, state.as_ref())?;
    Ok(Iterator {
        ops,
        control: Mutex::new(Control {
            stop: driver.stop.clone(),
            metrics: driver.metrics.clone(),
        }),
        inner: Mutex::new(Inner {
            driver: Some(driver),
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

    /// Sends `request` and waits for the reply with the GIL released,
    /// running the signal handlers between waits. On an exception from a
    /// handler (Ctrl-C), stops the pipeline and marks the iterator done.
    fn ask(&self, py: Python<'_>, inner: &mut Inner, request: Request) -> PyResult<Reply> {
        if let Some(why) = inner.done {
            return Err(PyRuntimeError::new_err(why));
        }
        let Some(driver) = inner.driver.as_ref() else {
            return Err(PyRuntimeError::new_err("this iterator is closed"));
        };
        inner.fresh = false;
        if driver.requests.send(request).is_err() {
            inner.done = Some("the iterator's thread has ended");
            return Err(PyRuntimeError::new_err("the iterator's thread has ended"));
        }
        loop {
            let replies = &driver.replies;
            match py.detach(|| replies.recv_timeout(SIGNAL_POLL)) {
                Ok(reply) => return Ok(reply),
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        driver.stop.stop();
                        inner.done = Some(
                            "this iterator was interrupted; its pipeline is stopped: start a \
                             new one (or resume from a state saved before)",
                        );
                        return Err(e);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    inner.done = Some("the iterator's thread has ended");
                    return Err(PyRuntimeError::new_err("the iterator's thread has ended"));
                }
            }
        }
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
        let driver = py.detach(|| {
            let mut inner = self
                .inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            inner.done.get_or_insert(why);
            inner.driver.take()
        });
        if let Some(mut driver) = driver {
            py.detach(|| driver.shut_down());
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
        let reply = self.ask(py, &mut inner, Request::Next)?;
        self.wait_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.nexts.fetch_add(1, Ordering::Relaxed);
        match reply {
            Reply::Next(None) => {
                // Finished: keep the final state, then join the threads now,
                // not when Python drops us.
                if let Ok(Reply::State(Ok(state))) = self.ask(py, &mut inner, Request::State) {
                    inner.final_state = Some(state);
                }
                inner.done = Some(END);
                if let Some(mut driver) = inner.driver.take() {
                    py.detach(|| driver.shut_down());
                }
                Ok(None)
            }
            Reply::Next(Some(Ok(elem))) => Ok(Some(convert::elem(py, elem)?.unbind())),
            Reply::Next(Some(Err(e))) => Err(pipeline_error(py, e)),
            Reply::State(_) => Err(PyRuntimeError::new_err("unexpected reply")),
        }
    }

    /// Where the iterator stands, as a JSON-serialisable dict.
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut inner = self.lock()?;
        if let Some(state) = &inner.final_state {
            return py.import("json")?.call_method1("loads", (state.to_json(),));
        }
        let state = match self.ask(py, &mut inner, Request::State)? {
            Reply::State(state) => state.map_err(|e| pipeline_error(py, e))?,
            Reply::Next(_) => return Err(PyRuntimeError::new_err("unexpected reply")),
        };
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
            inner.driver.take()
        };
        if let Some(mut old) = old {
            py.detach(|| old.shut_down());
        }
        let driver = start_driver(py, &self.ops, Some(&state))?;
        *self.control() = Control {
            stop: driver.stop.clone(),
            metrics: driver.metrics.clone(),
        };
        let mut inner = self.lock()?;
        inner.driver = Some(driver);
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
        let driver = match self.inner.get_mut() {
            Ok(inner) => inner.driver.take(),
            Err(p) => p.into_inner().driver.take(),
        };
        let Some(mut driver) = driver else { return };
        if std::process::id() != self.pid {
            // A forked child: the thread does not exist here; joining would
            // hang. Forget it (its memory is the parent's copy).
            std::mem::forget(driver);
            return;
        }
        Python::attach(|py| py.detach(|| driver.shut_down()));
    }
}
