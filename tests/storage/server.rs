//! An S3 server on 127.0.0.1 for the tests: `s3s-fs` over a temporary
//! directory, with SigV4 authentication, plus a proxy that cuts connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const ACCESS_KEY: &str = "tfpipe-test-access";
pub const SECRET_KEY: &str = "tfpipe-test-secret";

static BUCKETS: AtomicUsize = AtomicUsize::new(0);

/// A running S3 server; stops when dropped.
pub struct S3Server {
    pub addr: SocketAddr,
    pub runtime: tokio::runtime::Runtime,
    root: tempfile::TempDir,
}

impl S3Server {
    pub fn start() -> S3Server {
        let root = tempfile::tempdir().expect("temp dir");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let fs = s3s_fs::FileSystem::new(root.path()).expect("s3s-fs");
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = builder.build();
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        runtime.spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let conn = http
                    .serve_connection(TokioIo::new(socket), service.clone())
                    .into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        S3Server {
            addr,
            runtime,
            root,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A new, empty bucket (a directory of the server's root), registered
    /// with tfpipe under this server's endpoint and credentials. Returns
    /// `s3://NAME`.
    pub fn bucket(&self, tag: &str) -> String {
        self.bucket_at(tag, &self.endpoint(), SECRET_KEY)
    }

    /// A new bucket that tfpipe reaches through `endpoint` with `secret`.
    pub fn bucket_at(&self, tag: &str, endpoint: &str, secret: &str) -> String {
        let n = BUCKETS.fetch_add(1, Ordering::SeqCst);
        let name = format!("{tag}-{n}-{}", std::process::id());
        std::fs::create_dir(self.root.path().join(&name)).expect("bucket dir");
        let base = format!("s3://{name}");
        tfpipe::storage::set_bucket_options(
            &base,
            [
                ("aws_endpoint", endpoint),
                ("aws_allow_http", "true"),
                ("aws_access_key_id", ACCESS_KEY),
                ("aws_secret_access_key", secret),
                ("aws_region", "us-east-1"),
            ],
        );
        base
    }

    /// A client of this server's `bucket` built here, not by tfpipe (it still
    /// needs a rustls crypto provider: tfpipe installs the one it uses).
    pub fn direct_store(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        tfpipe::storage::install_crypto_provider();
        AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_endpoint(self.endpoint())
            .with_allow_http(true)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_region("us-east-1")
            .build()
            .expect("store")
    }

    /// Uploads `bytes` to `url` (`s3://bucket/key`) through the S3 API,
    /// independently of tfpipe's writer.
    pub fn put(&self, url: &str, bytes: Vec<u8>) {
        let (bucket, key) = url
            .strip_prefix("s3://")
            .and_then(|r| r.split_once('/'))
            .expect("s3 url");
        let store = self.direct_store(bucket);
        self.runtime
            .block_on(store.put(&ObjectPath::from(key), bytes.into()))
            .expect("put");
    }

    /// Whether an object exists, asked of the server directly.
    pub fn exists(&self, url: &str) -> bool {
        let (bucket, key) = url
            .strip_prefix("s3://")
            .and_then(|r| r.split_once('/'))
            .expect("s3 url");
        let store = self.direct_store(bucket);
        match self.runtime.block_on(store.head(&ObjectPath::from(key))) {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => panic!("HEAD {url}: {e}"),
        }
    }

    /// A proxy to this server that cuts each of the first `cuts` connections
    /// after forwarding `after` response bytes. Returns its endpoint and the
    /// count of connections cut so far.
    pub fn cutting_proxy(&self, cuts: usize, after: u64) -> (String, Arc<AtomicU64>) {
        let upstream = self.addr;
        let listener = self
            .runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let cut = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&cut);
        self.runtime.spawn(async move {
            let mut accepted = 0usize;
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let limit = (accepted < cuts).then_some(after);
                accepted += 1;
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    proxy(client, server, limit, counter).await;
                });
            }
        });
        (format!("http://{addr}"), cut)
    }
}

/// Forwards both ways; with a `limit`, drops both sockets once that many
/// response bytes have gone to the client.
async fn proxy(client: TcpStream, server: TcpStream, limit: Option<u64>, cut: Arc<AtomicU64>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upload = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let mut sent = 0u64;
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match server_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let n = match limit {
            Some(limit) if sent + n as u64 >= limit => {
                let keep = (limit - sent) as usize;
                let _ = client_write.write_all(&buf[..keep]).await;
                cut.fetch_add(1, Ordering::SeqCst);
                break;
            }
            _ => n,
        };
        if client_write.write_all(&buf[..n]).await.is_err() {
            break;
        }
        sent += n as u64;
    }
    upload.abort();
    // Dropping the halves closes both connections mid-response.
}

/// TFRecord bytes of `records`, with `compression`.
pub fn tfrecord(records: &[Vec<u8>], compression: tfpipe::Compression) -> Vec<u8> {
    let mut writer = tfpipe::RecordWriter::new(Vec::new(), compression);
    for r in records {
        writer.write_record(r).expect("write");
    }
    writer.finish().expect("finish")
}

/// `n` records of varied sizes, each naming its file and index.
pub fn records(file: usize, n: usize, size: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut r = format!("file {file} record {i} ").into_bytes();
            r.resize(size + (i * 37) % 101, b'a' + (i % 26) as u8);
            r
        })
        .collect()
}

/// Asserts that opening `url` failed at open with an I/O error of `kind`
/// and a message that names `url`.
pub fn assert_open_error(err: &tfpipe::tfrecord::RecordError, kind: std::io::ErrorKind, url: &str) {
    let tfpipe::tfrecord::RecordError::Open { error: source, .. } = err else {
        panic!("{err}");
    };
    assert_eq!(source.kind(), kind, "{err}");
    assert!(err.to_string().contains(url), "{err}");
}
