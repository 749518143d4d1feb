//! Object storage through `object_store`: the runtime, store configuration,
//! listing, the read-ahead reader and the multipart writer.
//!
//! A sequential read ([`ObjectReader`]) fetches an object by one streaming
//! GET, or by ranged GETs in parallel, whichever the server was measured to
//! serve faster ([`ReadStrategy`]); either way the bytes received but not
//! yet read are bounded by the read-ahead the options chose (`range_size *
//! ranges_in_flight`, and for one stream its smaller `stream_buffer`): a
//! GET's body waits on the runtime for credit.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::{self, Read, Write};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::Sender;
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutPayload, RetryConfig,
};
use tokio::sync::{Semaphore, oneshot};
use url::Url;

use super::resolve::{has_glob, list_prefix, percent_decode};
use super::{ReadOptions, ReadStrategy, StorageError};
use crate::spawn::Thread;

// ---------------------------------------------------------------------------
// The runtime

/// The tokio runtime all object-store I/O runs on, with the stores built on
/// it (their connection pools are tied to it). Shared through `Arc`; the last
/// owner to drop it stops the runtime and joins its thread.
pub(crate) struct Context {
    handle: tokio::runtime::Handle,
    stores: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<Thread<()>>>,
    /// Name resolution for the stores, on a thread of ours (instead of
    /// tokio's blocking pool, whose threads tfpipe does not start).
    resolver: Arc<Resolver>,
    resolver_thread: Mutex<Option<Thread<()>>>,
}

type Lookup = (
    String,
    oneshot::Sender<Result<Vec<std::net::IpAddr>, object_store::client::DnsError>>,
);

/// Resolves host names on the context's resolver thread, one at a time
/// (a lookup happens once per new connection, so one thread is plenty).
#[derive(Debug)]
struct Resolver {
    lookups: Mutex<crossbeam_channel::Sender<Lookup>>,
}

impl object_store::client::DnsResolver for Resolver {
    fn resolve(&self, host: &str) -> object_store::client::DnsFuture {
        let (reply, answer) = oneshot::channel();
        let sent = self
            .lookups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send((host.to_string(), reply));
        Box::pin(async move {
            sent.map_err(|_| "the resolver thread has stopped")?;
            answer
                .await
                .map_err(|_| "the resolver thread has stopped")?
        })
    }
}

fn resolve_host(host: &str) -> Result<Vec<std::net::IpAddr>, object_store::client::DnsError> {
    use std::net::ToSocketAddrs;
    let addrs = (host, 0u16).to_socket_addrs()?;
    Ok(addrs.map(|a| a.ip()).collect())
}

/// The live context, if any: a new one starts when the last is gone.
static CURRENT: Mutex<Weak<Context>> = Mutex::new(Weak::new());

/// `object_store` configuration options as `(key, value)` pairs.
type StoreOptions = Vec<(String, String)>;

/// Per-bucket options set by the program: `(scheme://bucket, options)`.
static BUCKET_OPTIONS: RwLock<Vec<(String, StoreOptions)>> = RwLock::new(Vec::new());

/// Sets `object_store` configuration options for the bucket (or container,
/// or HTTP origin) `base`, such as `s3://my-bucket` or `http://127.0.0.1:9000`.
/// They are applied after the environment, so they win over it, for stores
/// built from then on. Keys are `object_store`'s (`aws_endpoint`,
/// `aws_access_key_id`, `aws_allow_http`, `google_service_account`,
/// `azure_storage_account_key`, ...); an unknown key is reported when the
/// bucket is first used.
///
/// ```
/// tfpipe::storage::set_bucket_options(
///     "s3://example-bucket",
///     [("aws_endpoint", "http://127.0.0.1:9000"), ("aws_allow_http", "true")],
/// );
/// ```
pub fn set_bucket_options<K: Into<String>, V: Into<String>>(
    base: &str,
    options: impl IntoIterator<Item = (K, V)>,
) {
    let base = base.trim_end_matches('/').to_string();
    let options: Vec<(String, String)> = options
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    let mut all = BUCKET_OPTIONS
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    all.retain(|(b, _)| *b != base);
    all.push((base, options));
}

/// Per store base (`scheme://bucket`): how sequential reads fetch its
/// objects, set by [`set_read_strategy`] or measured on the first object
/// large enough ([`probe`]); kept for the process, as the stores' options.
type StrategyCell = Arc<OnceLock<ReadStrategy>>;
static STRATEGIES: Mutex<Vec<(String, StrategyCell)>> = Mutex::new(Vec::new());

/// Sets how sequential reads of objects in the bucket `base` (such as
/// `s3://my-bucket`) fetch them, for readers opened from then on, where
/// their [`ReadOptions::strategy`] is [`ReadStrategy::Auto`]:
/// [`ReadStrategy::Stream`] or [`ReadStrategy::Ranges`] instead of
/// measuring, or `Auto` to measure again.
///
/// ```
/// use tfpipe::storage::{ReadStrategy, read_strategy, set_read_strategy};
///
/// set_read_strategy("s3://example-bucket", ReadStrategy::Ranges);
/// assert_eq!(read_strategy("s3://example-bucket"), Some(ReadStrategy::Ranges));
/// set_read_strategy("s3://example-bucket", ReadStrategy::Auto);
/// assert_eq!(read_strategy("s3://example-bucket"), None);
/// ```
pub fn set_read_strategy(base: &str, strategy: ReadStrategy) {
    let base = base.trim_end_matches('/').to_string();
    let cell = StrategyCell::default();
    if strategy != ReadStrategy::Auto {
        let _ = cell.set(strategy);
    }
    let mut all = STRATEGIES.lock().unwrap_or_else(PoisonError::into_inner);
    all.retain(|(b, _)| *b != base);
    all.push((base, cell));
}

/// How sequential reads fetch objects of the bucket `base`: as set by
/// [`set_read_strategy`] or measured; `None` until either.
pub fn read_strategy(base: &str) -> Option<ReadStrategy> {
    strategy_cell(base.trim_end_matches('/')).get().copied()
}

/// The strategy kept for the store base `base` (empty until set or measured).
fn strategy_cell(base: &str) -> StrategyCell {
    let mut all = STRATEGIES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, cell)) = all.iter().find(|(b, _)| b == base) {
        return Arc::clone(cell);
    }
    let cell = StrategyCell::default();
    all.push((base.to_string(), Arc::clone(&cell)));
    cell
}

fn bucket_options(base: &str) -> Vec<(String, String)> {
    let all = BUCKET_OPTIONS
        .read()
        .unwrap_or_else(PoisonError::into_inner);
    all.iter()
        .find(|(b, _)| b == base)
        .map(|(_, o)| o.clone())
        .unwrap_or_default()
}

impl Context {
    /// The live context, or a new one (starting its thread).
    pub(crate) fn get() -> Result<Arc<Context>, StorageError> {
        let mut current = CURRENT.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(context) = current.upgrade() {
            return Ok(context);
        }
        let context = Arc::new(Context::start()?);
        *current = Arc::downgrade(&context);
        Ok(context)
    }

    fn start() -> Result<Context, StorageError> {
        let (handle_tx, handle_rx) = crossbeam_channel::bounded(1);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = Thread::spawn("object-store", move |_cancel| {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = handle_tx.send(Err(e));
                    return;
                }
            };
            let _ = handle_tx.send(Ok(runtime.handle().clone()));
            // Drives every task spawned through the handle until told to stop.
            runtime.block_on(async {
                let _ = stop_rx.await;
            });
            // Dropping the runtime cancels what is left (its blocking pool
            // stays empty: names are resolved on our resolver thread).
            drop(runtime);
        })
        .map_err(StorageError::Runtime)?;
        let handle = handle_rx
            .recv()
            .map_err(|_| StorageError::Runtime(io::Error::other("the runtime thread ended")))?
            .map_err(StorageError::Runtime)?;
        let (lookups, requests) = crossbeam_channel::unbounded::<Lookup>();
        let resolver_thread = Thread::spawn("object-store-dns", move |cancel| {
            while let Ok((host, reply)) = cancel.recv(&requests) {
                let _ = reply.send(resolve_host(&host));
            }
        })
        .map_err(StorageError::Runtime)?;
        Ok(Context {
            handle,
            stores: Mutex::new(HashMap::new()),
            stop: Mutex::new(Some(stop_tx)),
            thread: Mutex::new(Some(thread)),
            resolver: Arc::new(Resolver {
                lookups: Mutex::new(lookups),
            }),
            resolver_thread: Mutex::new(Some(resolver_thread)),
        })
    }

    /// Runs `future` on the runtime and waits for its output on this thread.
    pub(crate) fn run<F, T>(self: &Arc<Self>, future: F) -> Result<T, StorageError>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        self.spawn(future).wait()
    }

    /// Starts `future` on the runtime; its output arrives through the
    /// returned [`Pending`]. Dropping the `Pending` aborts the task. The
    /// `Pending` keeps the runtime alive: a read started through a handle
    /// that is dropped at once (a `RangeReader` made for one GET) still
    /// completes.
    pub(crate) fn spawn<F, T>(self: &Arc<Self>, future: F) -> Pending<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        // A crossbeam channel, not a tokio one: waiting on it works from
        // any thread, even one inside the caller's own tokio runtime.
        let (tx, rx) = crossbeam_channel::bounded(1);
        let task = self.handle.spawn(async move {
            let _ = tx.send(future.await);
        });
        Pending {
            rx: Some(rx),
            task: task.abort_handle(),
            _context: Arc::clone(self),
        }
    }

    /// The store for `url`'s bucket (built once per context) and the key.
    pub(crate) fn store(
        &self,
        url: &str,
    ) -> Result<(Arc<dyn ObjectStore>, ObjectPath), StorageError> {
        let parsed = parse(url)?;
        let mut stores = self.stores.lock().unwrap_or_else(PoisonError::into_inner);
        let store = match stores.get(&parsed.base) {
            Some(store) => Arc::clone(store),
            None => {
                let store = build_store(url, &parsed, &self.resolver)?;
                stores.insert(parsed.base.clone(), Arc::clone(&store));
                store
            }
        };
        Ok((store, parsed.key))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Some(stop) = self
            .stop
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = stop.send(());
        }
        if let Some(thread) = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            // A panic on the runtime thread has already been reported by the
            // task that waited on it (its channel closed).
            let _ = thread.join();
        }
        if let Some(thread) = self
            .resolver_thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            thread.cancel();
            let _ = thread.join();
        }
    }
}

/// The output of a task on the runtime, not yet received.
pub(crate) struct Pending<T> {
    rx: Option<crossbeam_channel::Receiver<T>>,
    task: tokio::task::AbortHandle,
    /// The runtime the task runs on, kept until the task is received or
    /// aborted (dropped after `drop` has aborted it).
    _context: Arc<Context>,
}

impl<T> Pending<T> {
    /// Blocks this thread until the task is done.
    pub(crate) fn wait(mut self) -> Result<T, StorageError> {
        let rx = self.rx.take().ok_or_else(stopped)?;
        rx.recv().map_err(|_| stopped())
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if self.rx.is_some() {
            self.task.abort();
        }
    }
}

fn stopped() -> StorageError {
    StorageError::Runtime(io::Error::other(
        "an object-store task ended without a result (the runtime stopped or the task panicked)",
    ))
}

// ---------------------------------------------------------------------------
// URLs and stores

struct ParsedUrl {
    /// `scheme://authority`, the key of the store cache and of the options.
    base: String,
    key: ObjectPath,
    scheme: String,
}

fn parse(url: &str) -> Result<ParsedUrl, StorageError> {
    let bad = |reason: String| StorageError::BadUrl {
        url: url.to_string(),
        reason,
    };
    let parsed = Url::parse(url).map_err(|e| bad(format!("not a valid URL: {e}")))?;
    let scheme = parsed.scheme().to_ascii_lowercase();
    let authority = match (parsed.host_str(), parsed.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_string(),
        (None, _) => return Err(bad("the URL names no bucket or host".into())),
    };
    let key = ObjectPath::from_url_path(parsed.path())
        .map_err(|e| bad(format!("not a valid object key: {e}")))?;
    Ok(ParsedUrl {
        base: format!("{scheme}://{authority}"),
        key,
        scheme,
    })
}

fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: 4,
        retry_timeout: Duration::from_secs(120),
    }
}

fn client_options(resolver: &Arc<Resolver>) -> ClientOptions {
    let resolver: Arc<dyn object_store::client::DnsResolver> = Arc::clone(resolver) as _;
    ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(10))
        .with_timeout(Duration::from_secs(120))
        .with_dns_resolver(resolver)
}

/// `options` with the HTTP-client settings of the environment variables
/// starting with `prefix` (`AWS_ALLOW_HTTP`, `GOOGLE_PROXY_URL`, ...) applied
/// on top, read as the store's `from_env` reads them.
///
/// Needed because a builder's `with_client_options` replaces every client
/// setting `from_env` had read: without this, `AWS_ALLOW_HTTP=true` was
/// dropped and a request to an `http://` endpoint failed to build
/// ("builder error": reqwest refuses plain HTTP when HTTPS is required).
fn with_env_client_options<K: std::str::FromStr>(
    mut options: ClientOptions,
    prefix: &str,
    client_key: impl Fn(K) -> Option<object_store::ClientConfigKey>,
) -> ClientOptions {
    for (key, value) in std::env::vars_os() {
        let (Some(key), Some(value)) = (key.to_str(), value.to_str()) else {
            continue;
        };
        if !key.starts_with(prefix) {
            continue;
        }
        if let Some(key) = key.to_ascii_lowercase().parse().ok().and_then(&client_key) {
            options = options.with_config(key, value);
        }
    }
    options
}

/// Makes sure the process has a rustls crypto provider, installing ring's
/// if none is (idempotent, cheap after the first call).
///
/// tfpipe builds `reqwest` without a built-in provider (its default,
/// aws-lc-rs, needs cmake and a C toolchain to build), and `reqwest` panics
/// when it builds a client with no provider installed. tfpipe calls this
/// itself before building any store; a program that builds its own
/// `object_store` or `reqwest` clients in the same process, before its first
/// use of a tfpipe URL, calls it first. If the program installed another
/// provider already, that one stays.
///
/// ```
/// tfpipe::storage::install_crypto_provider();
/// assert!(rustls::crypto::CryptoProvider::get_default().is_some());
/// ```
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Fails only if another thread installed one meanwhile: as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

fn build_store(
    url: &str,
    parsed: &ParsedUrl,
    resolver: &Arc<Resolver>,
) -> Result<Arc<dyn ObjectStore>, StorageError> {
    install_crypto_provider();
    let client = || client_options(resolver);
    let options = bucket_options(&parsed.base);
    let config_error = |error: object_store::Error| StorageError::Store {
        url: url.to_string(),
        operation: "configuring the store".into(),
        attempts: 1,
        error: Box::new(error),
    };
    let bad_key = |key: &str, source: object_store::Error| StorageError::BadUrl {
        url: url.to_string(),
        reason: format!("unknown store option {key:?}: {source}"),
    };
    let store: Arc<dyn ObjectStore> = match parsed.scheme.as_str() {
        "s3" | "s3a" => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
            let client = with_env_client_options(client(), "AWS_", |k| match k {
                AmazonS3ConfigKey::Client(k) => Some(k),
                _ => None,
            });
            let mut b = AmazonS3Builder::from_env()
                .with_url(parsed.base.as_str())
                .with_retry(retry_config())
                .with_client_options(client);
            for (k, v) in options {
                let key: AmazonS3ConfigKey = k.parse().map_err(|e| bad_key(&k, e))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.build().map_err(config_error)?)
        }
        "gs" => {
            use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
            let client = with_env_client_options(client(), "GOOGLE_", |k| match k {
                GoogleConfigKey::Client(k) => Some(k),
                _ => None,
            });
            let mut b = GoogleCloudStorageBuilder::from_env()
                .with_url(parsed.base.as_str())
                .with_retry(retry_config())
                .with_client_options(client);
            for (k, v) in options {
                let key: GoogleConfigKey = k.parse().map_err(|e| bad_key(&k, e))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.build().map_err(config_error)?)
        }
        "az" | "azure" | "abfs" | "abfss" => {
            use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
            let client = with_env_client_options(client(), "AZURE_", |k| match k {
                AzureConfigKey::Client(k) => Some(k),
                _ => None,
            });
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_url(parsed.base.as_str())
                .with_retry(retry_config())
                .with_client_options(client);
            for (k, v) in options {
                let key: AzureConfigKey = k.parse().map_err(|e| bad_key(&k, e))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.build().map_err(config_error)?)
        }
        "http" | "https" => {
            use object_store::ClientConfigKey;
            use object_store::http::HttpBuilder;
            let mut b = HttpBuilder::new()
                .with_url(parsed.base.as_str())
                .with_retry(retry_config())
                .with_client_options(client().with_allow_http(parsed.scheme == "http"));
            for (k, v) in options {
                let key: ClientConfigKey = k.parse().map_err(|e| bad_key(&k, e))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.build().map_err(config_error)?)
        }
        other => {
            return Err(StorageError::BadUrl {
                url: url.to_string(),
                reason: format!("unsupported scheme {other:?}"),
            });
        }
    };
    Ok(store)
}

/// Whether an error may go away if the request is repeated.
fn transient(error: &object_store::Error) -> bool {
    !matches!(
        error,
        object_store::Error::NotFound { .. }
            | object_store::Error::InvalidPath { .. }
            | object_store::Error::NotSupported { .. }
            | object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotModified { .. }
            | object_store::Error::NotImplemented { .. }
            | object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }
            | object_store::Error::UnknownConfigurationKey { .. }
    )
}

fn store_error(
    url: &str,
    operation: String,
    attempts: u32,
    source: object_store::Error,
) -> StorageError {
    StorageError::Store {
        url: url.to_string(),
        operation,
        attempts,
        error: Box::new(source),
    }
}

// ---------------------------------------------------------------------------
// Listing and metadata

/// The object's metadata (one `HEAD`).
pub(crate) fn head(url: &str) -> Result<ObjectMeta, StorageError> {
    let context = Context::get()?;
    let (store, key) = context.store(url)?;
    context
        .run(async move { store.head(&key).await })?
        .map_err(|e| store_error(url, "HEAD".into(), 1, e))
}

/// Resolves one URL, a glob or not, to the objects it names.
pub(crate) fn resolve(pattern: &str) -> Result<Vec<PathBuf>, StorageError> {
    let parsed = parse_pattern(pattern)?;
    if parsed.key_pattern.is_empty() || parsed.key_pattern.ends_with('/') {
        return resolve_dataset(pattern, &parsed);
    }
    if !has_glob(&parsed.key_pattern) {
        head(pattern).map_err(|e| match e.io_kind() {
            io::ErrorKind::NotFound => StorageError::NoMatch {
                pattern: pattern.to_string(),
            },
            _ => e,
        })?;
        return Ok(vec![PathBuf::from(pattern)]);
    }
    let glob = glob::Pattern::new(&parsed.key_pattern).map_err(|e| StorageError::BadGlob {
        pattern: pattern.to_string(),
        reason: e.to_string(),
    })?;
    let keys = list_keys(pattern, &parsed.base, list_prefix(&parsed.key_pattern))?;
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    let mut found: Vec<String> = keys
        .into_iter()
        .filter(|key| glob.matches_with(key, options))
        .collect();
    if found.is_empty() {
        return Err(StorageError::NoMatch {
            pattern: pattern.to_string(),
        });
    }
    found.sort();
    Ok(found
        .into_iter()
        .map(|key| PathBuf::from(format!("{}/{key}", parsed.base)))
        .collect())
}

/// The data files of a dataset "directory" (a key prefix ending in `/`),
/// by [`is_dataset_file`](super::is_dataset_file) on each key below it.
fn resolve_dataset(pattern: &str, parsed: &ParsedPattern) -> Result<Vec<PathBuf>, StorageError> {
    let prefix = parsed.key_pattern.trim_end_matches('/').to_string();
    let keys = list_keys(pattern, &parsed.base, &prefix)?;
    let strip = if prefix.is_empty() {
        0
    } else {
        prefix.len() + 1
    };
    let mut found: Vec<String> = keys
        .into_iter()
        .filter(|key| key.get(strip..).is_some_and(super::is_dataset_file))
        .collect();
    if found.is_empty() {
        return Err(StorageError::NoMatch {
            pattern: format!("{pattern} (a directory: its part-* files)"),
        });
    }
    found.sort();
    Ok(found
        .into_iter()
        .map(|key| PathBuf::from(format!("{}/{key}", parsed.base)))
        .collect())
}

/// Every key under `prefix` (a whole number of segments; empty for all).
fn list_keys(pattern: &str, base: &str, prefix: &str) -> Result<Vec<String>, StorageError> {
    let context = Context::get()?;
    let (store, _) = context.store(&format!("{base}/"))?;
    let owned = prefix.to_string();
    let listed = context.run(async move {
        let prefix = (!owned.is_empty()).then(|| ObjectPath::from(owned.as_str()));
        let mut stream = store.list(prefix.as_ref());
        let mut keys = Vec::new();
        while let Some(meta) = stream.next().await {
            keys.push(meta?.location.to_string());
        }
        Ok::<_, object_store::Error>(keys)
    })?;
    let error = match listed {
        Ok(keys) => return Ok(keys),
        Err(e) => store_error(pattern, "LIST".into(), 1, e),
    };
    if !base.starts_with("http://") && !base.starts_with("https://") {
        return Err(error);
    }
    // A plain web server does not speak WebDAV; many list a directory as
    // an HTML page of links (nginx's autoindex, Apache, `python -m http.server`).
    index_keys(&context, base, prefix).map_err(|index| StorageError::NoHttpListing {
        url: pattern.to_string(),
        index,
        listing: Box::new(error),
    })
}

/// The most pages and keys an HTML index listing reads (a bound on a
/// server whose pages link without end).
const MAX_INDEX_PAGES: usize = 1000;
const MAX_INDEX_KEYS: usize = 1_000_000;

/// The keys below `prefix` by the HTML index pages of `base/prefix/`: each
/// page's relative links, a link ending in `/` read as a subdirectory's
/// page. Returns why not when the first page is not such a page.
fn index_keys(context: &Arc<Context>, base: &str, prefix: &str) -> Result<Vec<String>, String> {
    install_crypto_provider();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| format!("no HTTP client: {e}"))?;
    let mut dirs = VecDeque::from([prefix.trim_end_matches('/').to_string()]);
    let (mut keys, mut pages) = (Vec::new(), 0);
    while let Some(dir) = dirs.pop_front() {
        pages += 1;
        if pages > MAX_INDEX_PAGES || keys.len() > MAX_INDEX_KEYS {
            return Err(format!(
                "more than {MAX_INDEX_PAGES} pages or {MAX_INDEX_KEYS} files"
            ));
        }
        let url = if dir.is_empty() {
            format!("{base}/")
        } else {
            format!("{base}/{dir}/")
        };
        let request = client.get(&url);
        let page = context
            .run(async move {
                let response = request.send().await?.error_for_status()?;
                response.text().await
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("GET {url}: {e}"))?;
        let links = index_links(&page);
        if links.is_empty() && pages == 1 {
            return Err(format!("GET {url} gave a page with no relative links"));
        }
        for link in links {
            let key = if dir.is_empty() {
                link.clone()
            } else {
                format!("{dir}/{link}")
            };
            match key.strip_suffix('/') {
                Some(sub) => dirs.push_back(sub.to_string()),
                None => keys.push(key),
            }
        }
    }
    Ok(keys)
}

/// The relative links of an HTML index page (`href="name"` or
/// `href='name/'`), percent-decoded, leaving out links up or out (`..`,
/// `/...`, `scheme:`), queries and fragments (the sort links of Apache's
/// pages).
fn index_links(page: &str) -> Vec<String> {
    let lower = page.to_ascii_lowercase();
    let mut seen = std::collections::HashSet::new();
    let mut links = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find("href=") {
        let start = from + at + 5;
        from = start;
        let Some(quote) = page[start..]
            .chars()
            .next()
            .filter(|c| *c == '"' || *c == '\'')
        else {
            continue;
        };
        let Some(len) = page[start + 1..].find(quote) else {
            break;
        };
        let link = &page[start + 1..start + 1 + len];
        from = start + 1 + len;
        let link = link.strip_prefix("./").unwrap_or(link);
        let outward = link.is_empty()
            || link.starts_with(['/', '?', '#', '.'])
            || link.contains([':', '?', '#'])
            || link.contains("..");
        if outward {
            continue;
        }
        let decoded = percent_decode(link);
        if seen.insert(decoded.clone()) {
            links.push(decoded);
        }
    }
    links
}

struct ParsedPattern {
    base: String,
    /// The key with its wildcards, not percent-decoded (`[` survives).
    key_pattern: String,
}

/// Splits `scheme://authority/key-pattern` without URL-parsing the pattern
/// (which would percent-encode its wildcards).
fn parse_pattern(pattern: &str) -> Result<ParsedPattern, StorageError> {
    let bad = |reason: &str| StorageError::BadUrl {
        url: pattern.to_string(),
        reason: reason.to_string(),
    };
    let (scheme, rest) = pattern.split_once("://").ok_or_else(|| bad("not a URL"))?;
    let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(bad("the URL names no bucket or host"));
    }
    if has_glob(authority) {
        return Err(bad(
            "wildcards are allowed in the key, not in the bucket or host",
        ));
    }
    Ok(ParsedPattern {
        base: format!("{}://{authority}", scheme.to_ascii_lowercase()),
        key_pattern: key.to_string(),
    })
}

// ---------------------------------------------------------------------------
// Reading

/// What a ranged GET needs: the store, the key, the URL (for errors) and
/// the retry budget. Cheap to clone (shared handles).
#[derive(Clone)]
struct RangeTask {
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    url: Arc<str>,
    attempts: u32,
    backoff: Duration,
    /// The object's size, when known: a GET of all of it then asks for no
    /// range (a plain GET, which some servers serve faster: moto slices a
    /// copy of the whole object for any ranged one).
    size: Option<u64>,
}

/// Why one GET stopped before its range's end.
enum Delivery {
    /// The receiver declined more: nothing more is wanted.
    Declined,
    Failed(object_store::Error),
}

impl RangeTask {
    /// Reads `range`, handing each body chunk to `deliver` in order as it
    /// arrives; a transient error (or a body that ends short) is retried
    /// with exponential backoff from the first byte not yet delivered, the
    /// budget of attempts counting from the last progress. `Ok` once the
    /// range is delivered or `deliver` returned `false`.
    async fn fetch(
        &self,
        range: Range<u64>,
        credit: Option<&Semaphore>,
        mut opened: Option<GetResult>,
        mut deliver: impl FnMut(Bytes) -> bool,
    ) -> Result<(), StorageError> {
        let mut next = range.start;
        let mut attempt = 0;
        let mut delay = self.backoff;
        while next < range.end {
            attempt += 1;
            let before = next;
            let failure = match self
                .get_once(
                    next..range.end,
                    &mut next,
                    credit,
                    opened.take(),
                    &mut deliver,
                )
                .await
            {
                Ok(()) if next >= range.end => return Ok(()),
                Ok(()) => None,
                Err(Delivery::Declined) => return Ok(()),
                Err(Delivery::Failed(e)) => Some(e),
            };
            if next > before {
                attempt = 1;
                delay = self.backoff;
            }
            let give_up =
                attempt >= self.attempts.max(1) || failure.as_ref().is_some_and(|e| !transient(e));
            if give_up {
                return Err(match failure {
                    Some(e) => store_error(
                        &self.url,
                        format!("GET bytes {}..{}", next, range.end),
                        attempt,
                        e,
                    ),
                    None => StorageError::ShortRead {
                        url: self.url.to_string(),
                        range: range.clone(),
                        got: next - range.start,
                        attempts: attempt,
                    },
                });
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
        Ok(())
    }

    /// One GET of `range`, each body chunk delivered as it arrives (in
    /// pieces of at most [`PIECE`] bytes, each first taking its size in
    /// `credit`, when given, so that no more is buffered than the reader
    /// allowed); `next` follows the first byte not yet delivered. `Ok` when
    /// the body ended (at `range.end`, or short of it if the object shrank).
    /// An `opened` response (of exactly `range`) is read instead of a new GET.
    async fn get_once(
        &self,
        range: Range<u64>,
        next: &mut u64,
        credit: Option<&Semaphore>,
        opened: Option<GetResult>,
        deliver: &mut impl FnMut(Bytes) -> bool,
    ) -> Result<(), Delivery> {
        let result = match opened {
            Some(result) => result,
            None => {
                let whole = range.start == 0 && Some(range.end) == self.size;
                let options = GetOptions::default().with_range((!whole).then(|| range.clone()));
                self.store
                    .get_opts(&self.key, options)
                    .await
                    .map_err(Delivery::Failed)?
            }
        };
        let mut body = result.into_stream();
        while let Some(chunk) = body.next().await {
            let mut chunk = chunk.map_err(Delivery::Failed)?;
            // Never more than was asked for, whatever the server sends.
            let wanted = (range.end - *next).min(chunk.len() as u64) as usize;
            chunk.truncate(wanted);
            // Credit is taken piece by piece; without it, a chunk stays whole.
            let most = if credit.is_some() { PIECE } else { usize::MAX };
            while !chunk.is_empty() {
                let piece = chunk.split_to(chunk.len().min(most));
                if let Some(credit) = credit {
                    // Closed only when the reader is gone.
                    let permits = credit
                        .acquire_many(piece.len() as u32)
                        .await
                        .map_err(|_| Delivery::Declined)?;
                    permits.forget();
                }
                *next += piece.len() as u64;
                if !deliver(piece) {
                    return Err(Delivery::Declined);
                }
            }
            if *next >= range.end {
                break;
            }
        }
        Ok(())
    }

    /// `range` whole, in one `Bytes`.
    async fn collect(self, range: Range<u64>) -> Result<Bytes, StorageError> {
        let mut parts = Vec::new();
        self.fetch(range, None, None, |chunk| {
            parts.push(chunk);
            true
        })
        .await?;
        Ok(match parts.len() {
            1 => parts.swap_remove(0),
            _ => parts.concat().into(),
        })
    }

    /// `range` streamed into `chunks`, each piece sent once `credit` has
    /// room for it (the receiver returns the credit as it reads); an error
    /// is sent last. The channel closes when the task ends, so a receiver
    /// that counts its bytes tells an aborted or panicked task from a
    /// finished one.
    async fn stream(
        self,
        range: Range<u64>,
        credit: Arc<Semaphore>,
        opened: Option<GetResult>,
        chunks: Sender<Result<Bytes, StorageError>>,
    ) {
        let sent = self
            .fetch(range, Some(&credit), opened, |chunk| {
                chunks.send(Ok(chunk)).is_ok()
            })
            .await;
        if let Err(error) = sent {
            let _ = chunks.send(Err(error));
        }
    }
}

/// Reads `ranges` of one object, all at once, in order.
pub(crate) fn read_ranges(
    url: &str,
    ranges: &[Range<u64>],
    options: &ReadOptions,
) -> Result<Vec<Bytes>, StorageError> {
    let reader = RangeReader::new(url, options.clone())?;
    let pending: Vec<_> = ranges.iter().map(|r| reader.start(r.clone())).collect();
    pending.into_iter().map(|p| p.wait()?).collect()
}

/// Random access to one object: ranged GETs started now, received later.
pub(crate) struct RangeReader {
    context: Arc<Context>,
    task: RangeTask,
    options: ReadOptions,
}

impl RangeReader {
    pub(crate) fn new(url: &str, options: ReadOptions) -> Result<RangeReader, StorageError> {
        let context = Context::get()?;
        let (store, key) = context.store(url)?;
        Ok(RangeReader {
            context,
            task: RangeTask {
                store,
                key,
                url: Arc::from(url),
                attempts: options.attempts,
                backoff: options.backoff,
                size: None,
            },
            options,
        })
    }

    /// Starts reading `range`; [`Pending::wait`] gives the bytes.
    pub(crate) fn start(&self, range: Range<u64>) -> Pending<Result<Bytes, StorageError>> {
        self.context.spawn(self.task.clone().collect(range))
    }

    /// Starts streaming `range` into a channel the reader drains, at most
    /// `buffer` bytes ahead of it, from the `opened` response if given.
    fn stream(&self, range: Range<u64>, buffer: u64, opened: Option<GetResult>) -> StreamedRange {
        // The channel itself is unbounded; the credit bounds what it holds
        // (a bounded channel would block the runtime's one thread).
        let (tx, chunks) = crossbeam_channel::unbounded();
        let buffer = buffer.clamp(PIECE as u64, MAX_CREDIT as u64) as usize;
        let credit = Arc::new(Semaphore::new(buffer));
        StreamedRange {
            limit: buffer,
            _task: self.context.spawn(self.task.clone().stream(
                range.clone(),
                Arc::clone(&credit),
                opened,
                tx,
            )),
            range,
            received: 0,
            chunks,
            credit,
        }
    }

    /// The strategy already settled for this object's reads, whatever its
    /// size: what the options ask, else what was measured for its store.
    fn settled_strategy(&self) -> Option<ReadStrategy> {
        if self.options.strategy != ReadStrategy::Auto {
            return Some(self.options.strategy);
        }
        let base = parse(&self.task.url).ok()?.base;
        strategy_cell(&base).get().copied()
    }

    /// Whether a read from `start` opens with a plain GET of the whole
    /// object (whose response's head gives the size) rather than a `HEAD`:
    /// from byte 0, unless parallel ranges are already chosen.
    fn opens_whole(&self, start: u64) -> bool {
        start == 0 && self.settled_strategy() != Some(ReadStrategy::Ranges)
    }

    /// Sends a plain GET of the whole object now; its response's head (its
    /// size, and the body to stream; errors, a missing object included, as
    /// a `HEAD` would give them) arrives through the returned [`Pending`].
    fn send_whole(&self) -> Pending<Result<GetResult, StorageError>> {
        let task = self.task.clone();
        self.context.spawn(async move {
            task.store
                .get_opts(&task.key, GetOptions::default())
                .await
                .map_err(|e| store_error(&task.url, "GET".into(), 1, e))
        })
    }

    /// How a sequential read of `length` bytes fetches this object: what
    /// the options ask, else what was measured for its store, else, for an
    /// object large enough, measured now ([`probe`], once per store and
    /// process), else one streaming GET.
    fn strategy(&self, length: u64) -> ReadStrategy {
        if self.options.strategy != ReadStrategy::Auto {
            return self.options.strategy;
        }
        let Ok(parsed) = parse(&self.task.url) else {
            return ReadStrategy::Stream;
        };
        let cell = strategy_cell(&parsed.base);
        if let Some(&known) = cell.get() {
            return known;
        }
        let sample = read_ahead(&self.options);
        if length < sample {
            return ReadStrategy::Stream;
        }
        let depth = self.options.ranges_in_flight.max(1) as u64;
        *cell.get_or_init(|| {
            self.context
                .run(probe(self.task.clone(), sample, depth))
                .unwrap_or(ReadStrategy::Stream)
        })
    }
}

/// The largest piece a GET's body is handed on in: the unit of credit.
const PIECE: usize = 1 << 20;

/// The most credit one stream holds (a semaphore's limit is far above).
const MAX_CREDIT: usize = 1 << 40;

/// How much faster parallel ranges must be, measured, to be chosen over one
/// stream: below this the difference is within a shared machine's noise,
/// and one GET is the cheaper request.
const RANGES_MARGIN: f64 = 1.25;

/// The read-ahead in bytes: `range_size * ranges_in_flight`.
fn read_ahead(options: &ReadOptions) -> u64 {
    options
        .range_size
        .max(1)
        .saturating_mul(options.ranges_in_flight.max(1) as u64)
}

/// Measures which strategy the server behind `task` serves faster: the
/// first `sample` bytes of the object by one GET, then the same bytes by
/// `depth` ranged GETs at once. Ranges win only when at least
/// [`RANGES_MARGIN`] times faster. (S3 caps each connection, so parallel
/// ranges multiply throughput; a server that reads the whole object for
/// every ranged GET, as moto does, or one bound by its own CPU, serves one
/// stream faster.) A failed GET gives the stream: errors are reported by the
/// read itself.
async fn probe(task: RangeTask, sample: u64, depth: u64) -> ReadStrategy {
    let start = Instant::now();
    if task.clone().collect(0..sample).await.is_err() {
        return ReadStrategy::Stream;
    }
    let one = start.elapsed();
    let step = sample.div_ceil(depth).max(1);
    let start = Instant::now();
    let ranges = (0..sample)
        .step_by(step as usize)
        .map(|at| task.clone().collect(at..sample.min(at + step)));
    let fetched = futures_util::future::join_all(ranges).await;
    if fetched.iter().any(Result::is_err) {
        return ReadStrategy::Stream;
    }
    choose(one, start.elapsed())
}

/// Ranges when fetching by them (`parallel`) was [`RANGES_MARGIN`] times
/// faster than by one GET (`one`), else the stream.
fn choose(one: Duration, parallel: Duration) -> ReadStrategy {
    if parallel.as_secs_f64() * RANGES_MARGIN < one.as_secs_f64() {
        ReadStrategy::Ranges
    } else {
        ReadStrategy::Stream
    }
}

/// A GET in flight, as the reader sees it: at most its credit (the range's
/// length, or the read-ahead for a whole-object stream) is ever buffered in
/// `chunks`.
struct StreamedRange {
    range: Range<u64>,
    received: u64,
    chunks: crossbeam_channel::Receiver<Result<Bytes, StorageError>>,
    /// Bytes the GET may still hand on; returned as they are read.
    credit: Arc<Semaphore>,
    /// The credit it started with.
    limit: usize,
    /// Held only so that dropping the range unread aborts its GET.
    _task: Pending<()>,
}

impl StreamedRange {
    /// Bytes received and not yet handed to the reader.
    fn held(&self) -> u64 {
        self.limit.saturating_sub(self.credit.available_permits()) as u64
    }

    /// The next chunk, `None` once the whole range has arrived.
    fn next_chunk(&mut self) -> Result<Option<Bytes>, StorageError> {
        let length = self.range.end - self.range.start;
        if self.received >= length {
            return Ok(None);
        }
        match self.chunks.recv() {
            Ok(Ok(bytes)) => {
                self.received += bytes.len() as u64;
                // The reader holds this piece from now on: the GET may
                // fetch as much again.
                self.credit.add_permits(bytes.len());
                Ok(Some(bytes))
            }
            Ok(Err(e)) => Err(e),
            // The task ended without the range or an error: it was aborted
            // (the runtime stopped) or it panicked.
            Err(_) => Err(stopped()),
        }
    }
}

/// The smallest range a small object is split into: below it, a GET's fixed
/// cost (a round trip, a signature) outweighs what parallelism gains.
const MIN_SPLIT_RANGE: u64 = 1 << 20;

/// Bytes per GET for reading `length` bytes: [`ReadOptions::range_size`], or
/// less for an object too small to fill the read-ahead with full ranges, so
/// that it still has `ranges_in_flight` GETs in flight.
fn range_step(options: &ReadOptions, length: u64) -> u64 {
    let size = options.range_size.max(1);
    let depth = options.ranges_in_flight.max(1) as u64;
    let split = length.div_ceil(depth);
    size.min(split).max(size.min(MIN_SPLIT_RANGE))
}

/// An object as a byte stream, fetched as [`ReadStrategy`] says: one
/// streaming GET at most [`ReadOptions::stream_buffer`] bytes ahead of the
/// reader (and never more than the read-ahead, `range_size *
/// ranges_in_flight`), or ranged GETs of [`ReadOptions::range_size`],
/// [`ReadOptions::ranges_in_flight`] of them ahead, each delivered as its
/// body arrives (the reader starts on the first bytes of a range, not
/// after its last).
///
/// Dropping it aborts the GETs in flight.
pub struct ObjectReader {
    ranges: RangeReader,
    size: u64,
    /// Bytes per GET: the whole rest for a stream, else [`range_step`].
    step: u64,
    /// GETs in flight at once: 1 for a stream.
    depth: usize,
    /// Bytes each GET may buffer ahead of the reader.
    buffer: u64,
    /// The next byte not yet requested.
    next: u64,
    in_flight: VecDeque<StreamedRange>,
    /// The whole-object GET sent at open, until its stream starts.
    opened: Option<GetResult>,
    current: Bytes,
    failed: bool,
}

/// A whole-object GET sent before its reader was wanted
/// ([`ObjectReader::start_open`]).
pub(crate) struct StartedOpen {
    ranges: RangeReader,
    response: Pending<Result<GetResult, StorageError>>,
}

impl StartedOpen {
    /// Sends `ranges`' whole-object GET.
    fn send(ranges: RangeReader) -> StartedOpen {
        let response = ranges.send_whole();
        StartedOpen { ranges, response }
    }
}

impl std::fmt::Debug for StartedOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartedOpen")
            .field("url", &self.ranges.task.url)
            .finish()
    }
}

impl std::fmt::Debug for ObjectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectReader")
            .field("url", &self.ranges.task.url)
            .field("size", &self.size)
            .field("next", &self.next)
            .finish()
    }
}

impl ObjectReader {
    /// Opens `url` and starts the first GETs; see [`open_from`](Self::open_from).
    pub fn open(url: &str, options: ReadOptions) -> Result<ObjectReader, StorageError> {
        ObjectReader::open_from(url, 0, options)
    }

    /// [`open`](Self::open), reading from byte `start` on (the end, if the
    /// object is shorter).
    ///
    /// Unless ranges are already chosen for its store, a read of the whole
    /// object sends no `HEAD`: its one GET is sent now and its response's
    /// head gives the size (and any error: a missing object fails here, as
    /// before). Ranges, and a read from `start > 0`, ask a `HEAD` for the
    /// size first.
    pub fn open_from(
        url: &str,
        start: u64,
        options: ReadOptions,
    ) -> Result<ObjectReader, StorageError> {
        let ranges = RangeReader::new(url, options)?;
        if ranges.opens_whole(start) {
            return ObjectReader::finish_open(StartedOpen::send(ranges));
        }
        let size = head(url)?.size;
        ObjectReader::new(ranges, size, start.min(size), None)
    }

    /// Sends the GET that [`open`](Self::open) would send first, and returns
    /// without waiting for its answer: [`finish_open`](Self::finish_open)
    /// makes the reader. Until then the response waits unread (its body held
    /// back by the connection's flow control, not buffered here); dropping
    /// the [`StartedOpen`] aborts it.
    ///
    /// `None` when `open` would not start with a GET of the whole object
    /// (parallel ranges are already chosen for its store: a `HEAD` comes
    /// first).
    pub(crate) fn start_open(
        url: &str,
        options: ReadOptions,
    ) -> Result<Option<StartedOpen>, StorageError> {
        let ranges = RangeReader::new(url, options)?;
        Ok(ranges.opens_whole(0).then(|| StartedOpen::send(ranges)))
    }

    /// The reader of a [`start_open`](Self::start_open)ed object, as
    /// [`open`](Self::open) would have made it: waits for the response's
    /// head (its errors are `open`'s).
    pub(crate) fn finish_open(started: StartedOpen) -> Result<ObjectReader, StorageError> {
        let opened = started.response.wait()??;
        let size = opened.meta.size;
        ObjectReader::new(started.ranges, size, 0, Some(opened))
    }

    /// Reads an object of known `size` (no `HEAD`).
    pub fn with_size(
        url: &str,
        size: u64,
        options: ReadOptions,
    ) -> Result<ObjectReader, StorageError> {
        let ranges = RangeReader::new(url, options)?;
        ObjectReader::new(ranges, size, 0, None)
    }

    /// A reader of `ranges`' object of `size` bytes from `start` on, its
    /// first GETs sent; an `opened` GET of the whole object is streamed if
    /// the strategy is one stream, else dropped (which aborts it).
    fn new(
        mut ranges: RangeReader,
        size: u64,
        start: u64,
        opened: Option<GetResult>,
    ) -> Result<ObjectReader, StorageError> {
        ranges.task.size = Some(size);
        let length = size - start;
        let options = &ranges.options;
        let (step, depth, buffer) = match ranges.strategy(length) {
            ReadStrategy::Ranges => {
                let step = range_step(options, length);
                (step, options.ranges_in_flight.max(1), step)
            }
            // One GET for the rest: its own buffer, within the read-ahead.
            ReadStrategy::Stream | ReadStrategy::Auto => {
                let buffer = options.stream_buffer.min(read_ahead(options));
                (length.max(1), 1, buffer)
            }
        };
        let whole = depth == 1 && start == 0 && length > 0;
        let mut reader = ObjectReader {
            opened: opened.filter(|_| whole),
            step,
            depth,
            buffer: buffer.min(step),
            ranges,
            size,
            next: start,
            in_flight: VecDeque::new(),
            current: Bytes::new(),
            failed: false,
        };
        reader.top_up();
        Ok(reader)
    }

    /// The object's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes received from the store and not yet read: never more than the
    /// read-ahead (`range_size * ranges_in_flight`, at least 1 MiB per
    /// GET; for one stream, [`ReadOptions::stream_buffer`] if smaller) plus
    /// the piece being read (at most 1 MiB), whatever the reader's pace.
    pub fn buffered(&self) -> u64 {
        let held: u64 = self.in_flight.iter().map(StreamedRange::held).sum();
        held + self.current.len() as u64
    }

    fn top_up(&mut self) {
        let step = self.step;
        while self.in_flight.len() < self.depth && self.next < self.size {
            let end = self.size.min(self.next.saturating_add(step));
            let range = self.next..end;
            let opened = self.opened.take();
            self.in_flight
                .push_back(self.ranges.stream(range, self.buffer, opened));
            self.next = end;
        }
    }

    /// The next chunk of the object in order, `None` at its end.
    fn next_chunk(&mut self) -> Result<Option<Bytes>, StorageError> {
        loop {
            let Some(front) = self.in_flight.front_mut() else {
                return Ok(None);
            };
            if let Some(bytes) = front.next_chunk()? {
                return Ok(Some(bytes));
            }
            // That range is done: start the next one behind the others.
            self.in_flight.pop_front();
            self.top_up();
        }
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.failed {
            return Ok(0);
        }
        while self.current.is_empty() {
            match self.next_chunk() {
                Ok(Some(bytes)) => self.current = bytes,
                Ok(None) => return Ok(0),
                Err(e) => {
                    self.failed = true;
                    self.in_flight.clear();
                    return Err(e.into_io());
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

// ---------------------------------------------------------------------------
// Writing

/// Writes one object by multipart upload: it appears under its name only
/// when [`finish`](Self::finish) completes the upload. Dropping an unfinished
/// writer aborts the upload, so a failed or interrupted write leaves no
/// object (and no partial one).
///
/// Parts are [`ReadOptions::range_size`] bytes (at least 5 MiB, S3's
/// minimum), up to [`ReadOptions::ranges_in_flight`] uploading at once.
pub struct ObjectWriter {
    context: Arc<Context>,
    url: Arc<str>,
    upload: Option<Box<dyn MultipartUpload>>,
    part: Vec<u8>,
    part_size: usize,
    max_in_flight: usize,
    in_flight: VecDeque<Pending<object_store::Result<()>>>,
    written: u64,
}

impl ObjectWriter {
    /// Starts a multipart upload to `url`.
    pub fn create(url: &str, options: &ReadOptions) -> Result<ObjectWriter, StorageError> {
        let context = Context::get()?;
        let (store, key) = context.store(url)?;
        let upload = context
            .run(async move { store.put_multipart(&key).await })?
            .map_err(|e| store_error(url, "starting a multipart upload".into(), 1, e))?;
        let part_size = usize::try_from(options.range_size)
            .unwrap_or(usize::MAX)
            .max(5 << 20);
        Ok(ObjectWriter {
            context,
            url: Arc::from(url),
            upload: Some(upload),
            part: Vec::with_capacity(part_size),
            part_size,
            max_in_flight: options.ranges_in_flight.max(1),
            in_flight: VecDeque::new(),
            written: 0,
        })
    }

    /// The object's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn send_part(&mut self) -> Result<(), StorageError> {
        if self.upload.is_none() {
            return Ok(());
        }
        while self.in_flight.len() >= self.max_in_flight {
            self.wait_one()?;
        }
        let Some(upload) = self.upload.as_mut() else {
            return Ok(());
        };
        let data = std::mem::replace(&mut self.part, Vec::with_capacity(self.part_size));
        let part = upload.put_part(PutPayload::from(data));
        self.in_flight.push_back(self.context.spawn(part));
        Ok(())
    }

    fn wait_one(&mut self) -> Result<(), StorageError> {
        if let Some(pending) = self.in_flight.pop_front() {
            pending
                .wait()?
                .map_err(|e| store_error(&self.url, "uploading a part".into(), 1, e))?;
        }
        Ok(())
    }

    /// Uploads what is left and completes the upload: only now does the
    /// object appear. Returns the bytes written.
    pub fn finish(self) -> Result<u64, StorageError> {
        let written = self.written;
        self.finish_pending()?.complete()?;
        Ok(written)
    }

    /// Uploads every part but does not complete the upload: the object is
    /// not visible until [`PendingObject::complete`], and dropping the
    /// `PendingObject` aborts it. For outputs that must appear together (the
    /// shards of one conversion): upload all, then complete all.
    pub fn finish_pending(mut self) -> Result<PendingObject, StorageError> {
        if !self.part.is_empty() || self.written == 0 {
            self.send_part()?;
        }
        while !self.in_flight.is_empty() {
            self.wait_one()?;
        }
        Ok(PendingObject {
            context: Arc::clone(&self.context),
            url: Arc::clone(&self.url),
            upload: self.upload.take(),
            bytes: self.written,
        })
    }
}

/// An upload with every part sent, not yet completed: invisible until
/// [`complete`](Self::complete); aborted if dropped.
pub struct PendingObject {
    context: Arc<Context>,
    url: Arc<str>,
    upload: Option<Box<dyn MultipartUpload>>,
    bytes: u64,
}

impl std::fmt::Debug for PendingObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingObject")
            .field("url", &self.url)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl PendingObject {
    /// The object's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Bytes uploaded.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Completes the upload: the object appears under its name, whole.
    pub fn complete(mut self) -> Result<(), StorageError> {
        let Some(mut upload) = self.upload.take() else {
            return Ok(());
        };
        let done = self.context.run(async move { upload.complete().await });
        done?
            .map_err(|e| store_error(&self.url, "completing the multipart upload".into(), 1, e))?;
        Ok(())
    }
}

impl PendingObject {
    /// Uploads `bytes` to `url` without completing the upload (a small
    /// object that must appear together with others, such as a schema file).
    pub fn upload(url: &str, bytes: &[u8]) -> Result<PendingObject, StorageError> {
        let mut writer = ObjectWriter::create(url, &ReadOptions::default())?;
        writer.part.extend_from_slice(bytes);
        writer.written = bytes.len() as u64;
        writer.finish_pending()
    }
}

/// Completes `objects` in order, calling `before(i)` before completing the
/// `i`-th (an error from it aborts the commit like a failed completion);
/// returns their URLs. On a failure the objects completed so far are deleted
/// again and the rest are aborted as they drop, so nothing of the set stays
/// visible. (Stores have no multi-object transaction: a crash between two
/// completions can leave the earlier ones; completing a schema file last
/// makes its presence the sign that the set is whole.)
pub fn commit_objects(
    objects: Vec<PendingObject>,
    before: &mut dyn FnMut(usize) -> io::Result<()>,
) -> Result<Vec<PathBuf>, StorageError> {
    let mut done: Vec<PathBuf> = Vec::with_capacity(objects.len());
    for (i, object) in objects.into_iter().enumerate() {
        let url = object.url().to_string();
        let result = before(i)
            .map_err(|error| StorageError::Io {
                path: PathBuf::from(&url),
                error,
            })
            .and_then(|()| object.complete());
        if let Err(e) = result {
            for url in &done {
                // Best effort: the failure that made us roll back is the one to report.
                let _ = delete_object(&url.to_string_lossy());
            }
            return Err(e);
        }
        done.push(PathBuf::from(url));
    }
    Ok(done)
}

impl Drop for PendingObject {
    fn drop(&mut self) {
        if let Some(mut upload) = self.upload.take() {
            let _ = self.context.run(async move { upload.abort().await });
        }
    }
}

/// Deletes an object (to roll back outputs completed before a later failure).
pub fn delete_object(url: &str) -> Result<(), StorageError> {
    let context = Context::get()?;
    let (store, key) = context.store(url)?;
    context
        .run(async move { store.delete(&key).await })?
        .map_err(|e| store_error(url, "DELETE".into(), 1, e))
}

impl Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = self.part_size - self.part.len();
        let n = buf.len().min(room);
        self.part.extend_from_slice(&buf[..n]);
        self.written += n as u64;
        if self.part.len() == self.part_size {
            self.send_part().map_err(StorageError::into_io)?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        // Unfinished: abort, so the parts are discarded and nothing appears.
        self.in_flight.clear();
        if let Some(mut upload) = self.upload.take() {
            let _ = self.context.run(async move { upload.abort().await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_pages_give_their_relative_links() {
        let nginx = r#"<html><head><title>Index of /out/</title></head><body><h1>Index of /out/</h1><hr><pre><a href="../">../</a>
<a href="lang=en/">lang=en/</a>    02-Dec-2026 04:00       -
<a href="_SUCCESS">_SUCCESS</a>    02-Dec-2026 04:00       0
<a href="part-r-00000%20x.gz">part-r-00000 x.gz</a>
</pre><hr></body></html>"#;
        assert_eq!(
            index_links(nginx),
            ["lang=en/", "_SUCCESS", "part-r-00000 x.gz"]
        );
        // Apache's sort links, absolute and outward links, and repeats are left out.
        let apache = "<A HREF='?C=N;O=D'>Name</A> <a href='/icons/x.gif'> <a href=\"https://x/y\"> \
                      <a href='./part-1'> <a href=\"part-1\"> <a href=\"a/../../b\"> <a href=#top>";
        assert_eq!(index_links(apache), ["part-1"]);
        assert_eq!(percent_decode("a%3Db%2"), "a=b%2");
    }

    #[test]
    fn patterns_split_into_base_and_key() {
        let p = parse_pattern("S3://bucket/train/part-[0-9]*.tfrecord").unwrap();
        assert_eq!(p.base, "s3://bucket");
        assert_eq!(p.key_pattern, "train/part-[0-9]*.tfrecord");
        assert!(parse_pattern("s3://b*/x").is_err());
        assert!(parse_pattern("s3:///x").is_err());
    }

    #[test]
    fn urls_parse_to_store_base_and_key() {
        let p = parse("s3://bucket/dir/file.tfrecord.gz").unwrap();
        assert_eq!(p.base, "s3://bucket");
        assert_eq!(p.key.as_ref(), "dir/file.tfrecord.gz");
        let p = parse("http://127.0.0.1:9000/a/b").unwrap();
        assert_eq!(p.base, "http://127.0.0.1:9000");
        assert_eq!(p.key.as_ref(), "a/b");
    }

    #[test]
    fn small_objects_are_split_to_fill_the_read_ahead() {
        let options = ReadOptions::default(); // 8 MiB, 4 in flight
        let mib = 1 << 20;
        // Large: full ranges. Small: four ranges, never under 1 MiB.
        assert_eq!(range_step(&options, 100 * mib), 8 * mib);
        assert_eq!(range_step(&options, 20 * mib), 5 * mib);
        assert_eq!(range_step(&options, 2 * mib), mib);
        assert_eq!(range_step(&options, 0), mib);
        // A range size below the floor is the caller's choice, kept.
        let tiny = ReadOptions {
            range_size: 1000,
            ..ReadOptions::default()
        };
        assert_eq!(range_step(&tiny, 100 * mib), 1000);
        assert_eq!(range_step(&tiny, 10), 1000);
    }

    #[test]
    fn ranges_are_chosen_only_when_measured_clearly_faster() {
        let ms = Duration::from_millis;
        assert_eq!(choose(ms(100), ms(30)), ReadStrategy::Ranges);
        assert_eq!(choose(ms(100), ms(90)), ReadStrategy::Stream);
        // moto: ranged GETs slower than one whole-object GET.
        assert_eq!(choose(ms(60), ms(230)), ReadStrategy::Stream);
    }

    #[test]
    fn a_set_strategy_is_kept_per_bucket_until_reset() {
        set_read_strategy("s3://strategy-test/", ReadStrategy::Stream);
        assert_eq!(
            read_strategy("s3://strategy-test"),
            Some(ReadStrategy::Stream)
        );
        assert_eq!(read_strategy("s3://strategy-other"), None);
        set_read_strategy("s3://strategy-test", ReadStrategy::Auto);
        assert_eq!(read_strategy("s3://strategy-test"), None);
    }

    #[test]
    fn the_runtime_thread_is_joined_when_the_last_user_drops() {
        let context = Context::get().unwrap();
        let again = Context::get().unwrap();
        assert!(Arc::ptr_eq(&context, &again));
        assert_eq!(context.run(async { 6 * 7 }).unwrap(), 42);
        drop(again);
        drop(context);
        assert!(CURRENT.lock().unwrap().upgrade().is_none());
    }
}
