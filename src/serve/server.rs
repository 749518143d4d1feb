//! The server: the listening socket, the pool of connection threads, the
//! manager thread, routing, and shutdown.
//!
//! Shutdown ([`Server::shutdown`], or dropping the server): the stop flag
//! goes up; each connection thread finishes the request it is serving
//! (answering with `Connection: close`), closes idle connections, and
//! ends; the listener is woken and closed; then every version unloads,
//! its batcher answering what is still queued. Nothing in flight is lost.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value as Json};

use crate::spawn::{Thread, panic_message};
use crate::train::Outputs;

use super::batcher::{Submit, Wait};
use super::http::{Connection, Incoming, Limits, Request, Response, encode_response, exchange};
use super::metrics::Metrics;
use super::turns::{Turns, Waiter};
use super::versions::{Model, Version, manage};
use super::{ApiError, ModelSource, ServeConfig, ServeError, error_chain, rest, v2};

/// State the connection threads share.
pub(crate) struct Shared {
    pub models: Vec<Arc<Model>>,
    pub config: ServeConfig,
    pub metrics: Metrics,
    /// Start to ready, ms, once every model was ready.
    pub ready_ms: OnceLock<f64>,
    /// The request path was warmed up ([`warm_requests`]).
    pub requests_warm: AtomicBool,
    /// The client address of the warm-up's own connection while it runs:
    /// its requests are left out of the metrics.
    warmup_peer: Mutex<Option<SocketAddr>>,
    /// Which connection thread accepts next.
    turns: Turns,
}

impl Shared {
    pub fn model(&self, name: &str) -> Result<&Arc<Model>, ApiError> {
        self.models.iter().find(|m| m.name == name).ok_or_else(|| {
            let names: Vec<String> = self
                .models
                .iter()
                .map(|m| format!("{:?}", m.name))
                .collect();
            ApiError::not_found(format!(
                "model {:?} not found (this server has {})",
                short(name),
                names.join(", ")
            ))
        })
    }

    /// Whether every model has an available version, and the request
    /// path is warm.
    pub fn is_ready(&self) -> bool {
        self.requests_warm.load(Ordering::SeqCst) && self.models.iter().all(|m| m.is_ready())
    }

    /// Runs `batch` through `version`'s batcher and waits for its rows.
    /// Until the request path is warm (the warm-up's own requests, and any
    /// client's before the server is ready), a request does not wait
    /// `batch_timeout` for companions: the warm-up sends one request at a
    /// time, and each would wait out the timeout before ready.
    pub fn infer(
        &self,
        version: &Version,
        batch: crate::batch::Batch,
    ) -> Result<Outputs, ApiError> {
        let wait = if self.requests_warm.load(Ordering::Relaxed) {
            Wait::Yes
        } else {
            Wait::No
        };
        match version.batcher.submit(batch, wait) {
            Submit::Queued(reply) => match reply.recv() {
                Ok(Ok(outputs)) => Ok(outputs),
                Ok(Err(e)) => {
                    let status = if e.is_data_error() { 400 } else { 500 };
                    Err(ApiError::new(
                        status,
                        format!("prediction: {}", error_chain(&*e)),
                    ))
                }
                Err(_) => Err(ApiError::new(500, "prediction: the compute thread stopped")),
            },
            Submit::Full => Err(ApiError::new(
                503,
                format!(
                    "version {} is at its queue limit ({} examples waiting); retry later",
                    version.number,
                    version
                        .batcher
                        .stats()
                        .queued
                        .load(std::sync::atomic::Ordering::Relaxed)
                ),
            )),
            Submit::Closed => Err(ApiError::new(
                503,
                format!("version {} is unloading; retry", version.number),
            )),
        }
    }

    /// Whether `peer` is the warm-up's own connection.
    fn is_warmup_peer(&self, peer: SocketAddr) -> bool {
        *self
            .warmup_peer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            == Some(peer)
    }

    /// Answers one request; a panic becomes a 500. `counted`: recorded
    /// in the metrics (all but the warm-up's).
    fn handle(&self, request: &Request, counted: bool) -> Response {
        let start = Instant::now();
        let routed = catch_unwind(AssertUnwindSafe(|| self.route(request)));
        let (response, labels) = routed.unwrap_or_else(|payload| {
            let e = ApiError::new(500, format!("internal error: {}", panic_message(&*payload)));
            (Response::error(&e), None)
        });
        if counted {
            let labels = labels.map(|labels| self.known_labels(labels));
            self.metrics
                .record(labels.as_ref(), response.status, start.elapsed());
        }
        response
    }

    /// Metric labels of served models and versions only: a client's made-up
    /// names would grow the metrics without bound.
    fn known_labels(&self, (model, version): (String, String)) -> (String, String) {
        let Some(m) = self.models.iter().find(|m| m.name == model) else {
            return (String::new(), String::new());
        };
        let known = version
            .parse::<u64>()
            .is_ok_and(|n| m.statuses(Some(n)).is_ok());
        (model, if known { version } else { String::new() })
    }

    /// The response, and the (model, version) it was about, for the metrics.
    fn route(&self, request: &Request) -> (Response, Option<(String, String)>) {
        let path = request.path.as_str();
        let method = request.method.as_str();
        if path == "/metrics" {
            return (self.get(method, || self.metrics.render(self)), None);
        }
        if let Some(rest) = path.strip_prefix("/v1/models/") {
            return rest::route(self, method, rest, &request.body);
        }
        if path == "/v2" || path.starts_with("/v2/") {
            return v2::route(self, method, &path[3..], &request.body);
        }
        let e = ApiError::not_found(format!(
            "no endpoint {method} {} (this server answers /v1/models/..., /v2/... and /metrics)",
            short(path)
        ));
        (Response::error(&e), None)
    }

    /// A GET endpoint: other methods get 405.
    pub fn get(&self, method: &str, f: impl FnOnce() -> Result<Response, ApiError>) -> Response {
        if method != "GET" {
            return Response::error(&ApiError::new(
                405,
                format!("{method}: this endpoint takes GET"),
            ));
        }
        f().unwrap_or_else(|e| Response::error(&e))
    }
}

/// Quotes at most 100 characters of client text back.
pub(crate) fn short(text: &str) -> &str {
    match text.char_indices().nth(100) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

/// The body as a JSON object, or a 400 that says what is wrong with it.
pub(crate) fn json_object(body: &[u8]) -> Result<Map<String, Json>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::bad_request(format!(
            "body: not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    if text.trim().is_empty() {
        return Err(ApiError::bad_request(
            "body: empty (a JSON object is needed)",
        ));
    }
    match serde_json::from_str::<Json>(text) {
        Ok(Json::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad_request("body: expected a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("body: not valid JSON ({e})"))),
    }
}

/// A JSON response of status 200.
pub(crate) fn ok_json(value: &impl serde::Serialize) -> Result<Response, ApiError> {
    serde_json::to_vec(value)
        .map(|body| Response::json(200, body))
        .map_err(|e| ApiError::new(500, format!("response: {e}")))
}

/// A running server. See the module doc for shutdown.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    workers: Vec<Thread<()>>,
    manager: Option<Thread<()>>,
    manager_stop: Option<crossbeam_channel::Sender<()>>,
}

impl Server {
    /// Binds `config.addr`, starts the connection threads and the manager,
    /// which loads and warms every model's newest version. Returns at once:
    /// the server answers `/v2/health/live` now, and `/v2/health/ready`
    /// once every model is warm ([`Server::wait_ready`]).
    pub fn start(config: ServeConfig, models: Vec<ModelSource>) -> Result<Server, ServeError> {
        config.validate()?;
        if models.is_empty() {
            return Err(ServeError::Config {
                setting: "models",
                reason: "no model to serve".into(),
            });
        }
        let listener = TcpListener::bind(&config.addr).map_err(|source| ServeError::Bind {
            addr: config.addr.clone(),
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| ServeError::Bind {
            addr: config.addr.clone(),
            source,
        })?;
        let models: Vec<Arc<Model>> = models
            .into_iter()
            .map(|s| Arc::new(Model::new(s)))
            .collect();
        let shared = Arc::new(Shared {
            metrics: Metrics::for_models(models.iter().map(|m| m.name.as_str())),
            models,
            config,
            ready_ms: OnceLock::new(),
            requests_warm: AtomicBool::new(false),
            warmup_peer: Mutex::new(None),
            turns: Turns::default(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut server = Server {
            addr,
            shared: shared.clone(),
            stop: stop.clone(),
            workers: Vec::new(),
            manager: None,
            manager_stop: None,
        };
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let manager_shared = shared.clone();
        server.manager = Some(
            Thread::spawn("serve-manager", move |_| {
                let s = &manager_shared;
                let warm = || {
                    warm_requests(s, loopback(addr));
                    s.requests_warm.store(true, Ordering::SeqCst);
                };
                manage(&s.models, &s.config, &stop_rx, &warm, &|ms| {
                    let _ = s.ready_ms.set(ms);
                });
            })
            .map_err(|e| ServeError::Spawn("manager", e))?,
        );
        server.manager_stop = Some(stop_tx);
        let limits = Limits {
            max_header_bytes: shared.config.max_header_bytes,
            max_body_bytes: shared.config.max_body_bytes,
            idle_timeout: shared.config.idle_timeout,
        };
        for i in 0..shared.config.connections {
            let listener = listener
                .try_clone()
                .map_err(|e| ServeError::Spawn("connection", e))?;
            let (shared, stop) = (shared.clone(), stop.clone());
            let worker = Thread::spawn(format!("serve-conn-{i}"), move |_| {
                accept_loop(&listener, &shared, &stop, limits);
            })
            .map_err(|e| ServeError::Spawn("connection", e))?;
            server.workers.push(worker);
        }
        Ok(server)
    }

    /// The address the server listens on (with the port chosen when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether every model has an available (warm) version.
    pub fn is_ready(&self) -> bool {
        self.shared.is_ready()
    }

    /// Waits until [`is_ready`](Self::is_ready), at most `timeout`; returns
    /// whether it is.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.is_ready() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Every model's version statuses.
    pub fn statuses(&self) -> Vec<(String, Vec<super::VersionStatus>)> {
        self.shared
            .models
            .iter()
            .map(|m| (m.name.clone(), m.statuses(None).unwrap_or_default()))
            .collect()
    }

    /// Stops accepting, answers the requests in flight, unloads every
    /// version and joins every thread. A thread's panic is the error.
    pub fn shutdown(mut self) -> Result<(), ServeError> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> Result<(), ServeError> {
        self.stop.store(true, Ordering::SeqCst);
        // The threads waiting for their turn end; a connection to ourselves
        // wakes the one in accept.
        self.shared.turns.stop();
        let _ = TcpStream::connect_timeout(&loopback(self.addr), Duration::from_millis(100));
        let mut first_error = None;
        for worker in self.workers.drain(..) {
            if let Err(e) = worker.join() {
                first_error.get_or_insert(ServeError::Panic(e));
            }
        }
        self.manager_stop.take();
        if let Some(manager) = self.manager.take()
            && let Err(e) = manager.join()
        {
            first_error.get_or_insert(ServeError::Panic(e));
        }
        for model in &self.shared.models {
            model.unload_all(&self.shared.config);
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop_all();
    }
}

/// `addr` as this machine reaches it: a listener on every address (0.0.0.0,
/// ::) is reached on the loopback.
fn loopback(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(a) if a.ip().is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], a.port()))
        }
        SocketAddr::V6(a) if a.ip().is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port()))
        }
        a => a,
    }
}

/// Runs generated `:predict` requests through the whole path a client's
/// request takes, once per process before it reports ready: over a TCP
/// connection to the server's own listener (`addr`), so that a connection
/// thread accepts it, reads and parses the HTTP request, and the JSON
/// body, columns, batcher, response encoding and the write back all run
/// as for a client. What the first request of a process pays beyond the
/// model's forward pass (code and buffers touched for the first time, the
/// allocator's first large blocks, the metrics' entries) is paid here; a
/// warm-up that called the router directly (before this) left the HTTP
/// framing, the socket reads and writes and the metrics to the first
/// client (docs/benchmarks.md, "Serving"). The largest batch first, then
/// the smallest three times: its latency is the one that shows cold
/// caches most. Not counted in the request metrics (the connection is
/// told apart by its client address). If the loopback connection cannot
/// be made, the router is called directly instead.
fn warm_requests(shared: &Shared, addr: SocketAddr) {
    let largest = shared.config.batching.max_batch_size;
    let requests: Vec<(String, Vec<u8>)> = shared
        .models
        .iter()
        .filter_map(|model| Some((model, model.serving(None).ok()?)))
        .flat_map(|(model, version)| {
            let path = format!("/v1/models/{}:predict", model.name);
            [largest, 1, 1, 1].map(|rows| (path.clone(), version.signature.generated_request(rows)))
        })
        .collect();
    // Twice, each time until the thread that served it waits again (as many
    // wait as before it took the connection; a client's connection held
    // open meanwhile does not count against that): the thread holding the
    // turn serves the first, the one it passes the turn to the second, and
    // those two then take the first connections of clients (turns.rs).
    let over_http = (0..2).try_for_each(|_| {
        let waiting = shared.turns.waiting();
        warm_over_http(shared, addr, &requests)?;
        shared.turns.wait_idle(waiting, Duration::from_millis(20));
        Ok::<_, std::io::Error>(())
    });
    if over_http.is_ok() {
        return;
    }
    for (path, body) in requests {
        let request = Request {
            method: "POST".into(),
            path,
            body,
            close: false,
        };
        let (response, _) = shared.route(&request);
        std::hint::black_box(encode_response(&response, false));
    }
}

/// [`warm_requests`] over one loopback connection.
fn warm_over_http(
    shared: &Shared,
    addr: SocketAddr,
    requests: &[(String, Vec<u8>)],
) -> std::io::Result<()> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    *shared
        .warmup_peer
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some(stream.local_addr()?);
    let result = requests
        .iter()
        .try_for_each(|(path, body)| exchange(&mut stream, "POST", path, body).map(drop));
    drop(stream);
    // Every answer was read, so every request was recorded (or not).
    *shared
        .warmup_peer
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = None;
    result
}

/// One connection thread: in its turn, accept; pass the turn on; serve the
/// connection to its end; again.
fn accept_loop(listener: &TcpListener, shared: &Shared, stop: &AtomicBool, limits: Limits) {
    let me = Arc::new(Waiter::default());
    while shared.turns.take(&me) {
        let accepted = listener.accept();
        shared.turns.pass();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, peer)) => serve_connection(stream, peer, shared, stop, &limits),
            // Out of descriptors, a reset before accept: wait a little, go on.
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    stop: &AtomicBool,
    limits: &Limits,
) {
    let Ok(mut conn) = Connection::new(stream) else {
        return;
    };
    loop {
        let request = conn.read_request(limits, stop);
        // Asked once a request is in: the warm-up names its connection
        // after connecting, which may be after the accept. Once the request
        // path is warm, the warm-up's requests have all been answered, and
        // no request takes the lock.
        let counted = shared.requests_warm.load(Ordering::SeqCst) || !shared.is_warmup_peer(peer);
        match request {
            Ok(Incoming::Request(request)) => {
                let response = shared.handle(&request, counted);
                let close = request.close || stop.load(Ordering::SeqCst);
                if conn.write_response(&response, close).is_err() || close {
                    return;
                }
            }
            Ok(Incoming::Refused(e)) => {
                if counted {
                    shared.metrics.record(None, e.status, Duration::ZERO);
                }
                if conn.write_response(&Response::error(&e), true).is_ok() {
                    conn.linger_close();
                }
                return;
            }
            Ok(Incoming::Closed) | Err(_) => return,
        }
    }
}
