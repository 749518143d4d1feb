//! `http://` URLs: TFRecord objects read from a plain HTTP server that
//! answers `HEAD` and ranged `GET`s (and nothing else: no WebDAV, so no
//! listing), started in-process by the test on 127.0.0.1.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tfpipe::Compression;
use tfpipe::pipeline::{Pipeline, PipelineError};
use tfpipe::storage::{self, ReadOptions, ReadStrategy};
use tfpipe::tfrecord::{FileRecordReader, ReaderOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::server::{assert_open_error, records, tfrecord};

/// A static-file HTTP/1.1 server over a map of paths to bytes. It answers
/// `HEAD`, `GET` and `GET` with `Range: bytes=A-B` (206 with
/// `Content-Range`), 404 for unknown paths and 405 for any other method;
/// every response closes its connection. Stops when dropped.
struct HttpServer {
    addr: SocketAddr,
    /// The objects served, by path (without the leading `/`).
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    /// Ranged GETs answered with 206.
    ranged: Arc<AtomicUsize>,
    /// Every request's method and path, in the order they came.
    requests: Arc<Mutex<Vec<String>>>,
    _runtime: tokio::runtime::Runtime,
}

impl HttpServer {
    fn start(files: HashMap<String, Vec<u8>>) -> HttpServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let files = Arc::new(Mutex::new(files));
        let served = Arc::clone(&files);
        let ranged = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ranged);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&requests);
        runtime.spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let (files, counter, log) =
                    (Arc::clone(&served), Arc::clone(&counter), Arc::clone(&log));
                tokio::spawn(async move {
                    let _ = serve(socket, &files, &counter, &log).await;
                });
            }
        });
        HttpServer {
            addr,
            files,
            ranged,
            requests,
            _runtime: runtime,
        }
    }

    /// The requests answered so far, as `METHOD /path`.
    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// Serves `path` no more (404 from now on).
    fn remove(&self, path: &str) {
        self.files.lock().unwrap().remove(path);
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }
}

/// Answers the one request on `socket`.
async fn serve(
    mut socket: TcpStream,
    files: &Mutex<HashMap<String, Vec<u8>>>,
    ranged: &AtomicUsize,
    log: &Mutex<Vec<String>>,
) -> io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let mut request = lines.next().unwrap_or("").split(' ');
    let (method, path) = (request.next().unwrap_or(""), request.next().unwrap_or(""));
    log.lock().unwrap().push(format!("{method} {path}"));
    let range = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("range")
            .then(|| value.trim().to_string())
    });
    let body = files
        .lock()
        .unwrap()
        .get(path.trim_start_matches('/'))
        .cloned();
    let (status, headers, payload): (&str, String, &[u8]) = match (method, &body) {
        ("GET" | "HEAD", None) => ("404 Not Found", String::new(), b"no such object"),
        ("GET" | "HEAD", Some(body)) => {
            match range.as_deref().and_then(|r| byte_range(r, body.len())) {
                Some((start, end)) => {
                    ranged.fetch_add(1, Ordering::SeqCst);
                    let headers = format!("Content-Range: bytes {start}-{end}/{}\r\n", body.len());
                    ("206 Partial Content", headers, &body[start..=end])
                }
                None => ("200 OK", String::new(), &body[..]),
            }
        }
        _ => ("405 Method Not Allowed", String::new(), b""),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n",
        payload.len()
    )
    .into_bytes();
    if method != "HEAD" {
        response.extend_from_slice(payload);
    }
    socket.write_all(&response).await?;
    socket.shutdown().await
}

/// `bytes=A-B` (inclusive, as HTTP has it) within an object of `len` bytes.
fn byte_range(header: &str, len: usize) -> Option<(usize, usize)> {
    let (start, end) = header.strip_prefix("bytes=")?.split_once('-')?;
    let start: usize = start.parse().ok()?;
    let end: usize = end.parse::<usize>().ok()?.min(len.checked_sub(1)?);
    (start <= end).then_some((start, end))
}

#[test]
fn tfrecord_objects_read_over_http_with_ranged_gets() {
    let plain = records(0, 300, 200);
    let gzip = records(1, 200, 150);
    let files = HashMap::from([
        (
            "data/part-0.tfrecord".to_string(),
            tfrecord(&plain, Compression::None),
        ),
        (
            "data/part-1.tfrecord.gz".to_string(),
            tfrecord(&gzip, Compression::Gzip),
        ),
    ]);
    let server = HttpServer::start(files);
    let (url0, url1) = (
        server.url("data/part-0.tfrecord"),
        server.url("data/part-1.tfrecord.gz"),
    );

    // Ranges of 1000 bytes, 3 in flight: records straddle range boundaries.
    let read = ReadOptions {
        range_size: 1000,
        ranges_in_flight: 3,
        strategy: ReadStrategy::Ranges,
        ..ReadOptions::default()
    };
    for (url, expected) in [(&url0, &plain), (&url1, &gzip)] {
        let got: Vec<Vec<u8>> = FileRecordReader::open_with(url, ReaderOptions::default(), &read)
            .unwrap()
            .into_records()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(&got, expected, "{url}");
    }
    assert!(
        server.ranged.load(Ordering::SeqCst) > 50,
        "objects are read by ranged GETs"
    );

    // Through the pipeline, both objects interleaved.
    let mut got: Vec<Vec<u8>> = Pipeline::tfrecord_files([&url0, &url1])
        .unwrap()
        .interleave(2, 5)
        .start()
        .unwrap()
        .map(|r| r.map(|r| r.to_vec()))
        .collect::<Result<_, _>>()
        .unwrap();
    let mut expected: Vec<Vec<u8>> = plain.iter().chain(&gzip).cloned().collect();
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
}

/// A streamed read of a whole object is its one GET: the size comes from
/// that response, not from a `HEAD` before it (6-30 ms per object against
/// moto, docs/benchmarks.md). A missing object still fails at open, naming
/// the URL, and `Auto` on a small object (streamed without measuring) sends
/// no `HEAD` either.
#[test]
fn a_streamed_object_is_read_by_one_get_and_no_head() {
    let recs = records(0, 300, 200);
    let bytes = tfrecord(&recs, Compression::None);
    let server = HttpServer::start(HashMap::from([("a.tfrecord".to_string(), bytes.clone())]));
    let url = server.url("a.tfrecord");
    for strategy in [ReadStrategy::Stream, ReadStrategy::Auto] {
        let read = ReadOptions {
            strategy,
            ..ReadOptions::default()
        };
        let before = server.requests().len();
        let mut reader = storage::open_object(&url, &read).unwrap();
        assert_eq!(reader.size(), bytes.len() as u64, "{strategy:?}");
        let mut got = Vec::new();
        io::Read::read_to_end(&mut reader, &mut got).unwrap();
        assert!(got == bytes, "{strategy:?}: the bytes differ");
        assert_eq!(
            server.requests()[before..],
            ["GET /a.tfrecord"],
            "{strategy:?}"
        );
    }
    let missing = server.url("nope.tfrecord");
    let read = ReadOptions {
        strategy: ReadStrategy::Stream,
        ..ReadOptions::default()
    };
    let err = FileRecordReader::open_with(&missing, ReaderOptions::default(), &read)
        .err()
        .unwrap();
    assert_open_error(&err, io::ErrorKind::NotFound, &missing);
}

#[test]
fn a_missing_http_object_and_an_http_glob_fail_naming_the_url() {
    let server = HttpServer::start(HashMap::from([(
        "a.tfrecord".to_string(),
        tfrecord(&records(0, 3, 10), Compression::None),
    )]));
    let missing = server.url("nope.tfrecord");
    let err = FileRecordReader::open(&missing, ReaderOptions::default())
        .err()
        .unwrap();
    assert_open_error(&err, io::ErrorKind::NotFound, &missing);
    let err = Pipeline::tfrecord_files([&missing]).err().unwrap();
    assert!(matches!(err, PipelineError::NoFiles { .. }), "{err}");
    assert!(err.to_string().contains(&missing), "{err}");

    // Listing over HTTP is WebDAV's PROPFIND or an HTML index page; this
    // server has neither, and the error names the pattern and says why
    // (never an empty match or a panic).
    let glob = server.url("*.tfrecord");
    let err = storage::resolve([&glob]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&glob) && text.contains("WebDAV") && text.contains("index page"),
        "{text}"
    );
    let err = storage::resolve([server.url("")]).unwrap_err();
    assert!(err.to_string().contains("name the files instead"), "{err}");
}

/// An `http://` URL ending in `/` is a dataset directory when the server
/// lists it as an HTML index page (nginx's autoindex, `python -m
/// http.server`): its part files, through `key=value/` pages, leaving out
/// markers and pages' other links.
#[test]
fn an_http_directory_is_read_through_its_index_pages() {
    let (a, b) = (records(0, 40, 30), records(1, 20, 30));
    let page = |links: &[&str]| {
        let items: String = links
            .iter()
            .map(|l| format!("<a href=\"{l}\">{l}</a>\n"))
            .collect();
        format!("<html><body><a href=\"../\">../</a>\n{items}</body></html>").into_bytes()
    };
    let files = HashMap::from([
        (
            "out/".to_string(),
            page(&["lang=en/", "lang=fr/", "_SUCCESS", "?C=N;O=D"]),
        ),
        ("out/_SUCCESS".to_string(), Vec::new()),
        (
            "out/lang=en/".to_string(),
            page(&["part-r-00000", ".part-r-00000.crc"]),
        ),
        (
            "out/lang=en/part-r-00000".to_string(),
            tfrecord(&a, Compression::None),
        ),
        ("out/lang=fr/".to_string(), page(&["part-r-00000.gz"])),
        (
            "out/lang=fr/part-r-00000.gz".to_string(),
            tfrecord(&b, Compression::Gzip),
        ),
    ]);
    let server = HttpServer::start(files);
    let found = storage::resolve([server.url("out/")]).unwrap();
    let found: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
    assert_eq!(
        found,
        [
            server.url("out/lang=en/part-r-00000"),
            server.url("out/lang=fr/part-r-00000.gz")
        ]
    );
    // A glob lists through the same pages.
    let glob = storage::resolve([server.url("out/lang=*/part-*")]).unwrap();
    assert_eq!(glob.len(), 2);
    let got: Vec<Vec<u8>> = Pipeline::tfrecord_files([server.url("out/")])
        .unwrap()
        .records()
        .start()
        .unwrap()
        .map(|r| r.map(|r| r.to_vec()))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(got, [a, b].concat());
}

/// Four objects of 300 records each, `f0` to `f3`, on a new server.
fn four_objects() -> (HttpServer, Vec<String>, Vec<Vec<Vec<u8>>>) {
    let contents: Vec<Vec<Vec<u8>>> = (0..4).map(|i| records(i, 300, 200)).collect();
    let files = contents
        .iter()
        .enumerate()
        .map(|(i, recs)| (format!("f{i}"), tfrecord(recs, Compression::None)))
        .collect();
    let server = HttpServer::start(files);
    let urls = (0..4).map(|i| server.url(&format!("f{i}"))).collect();
    (server, urls, contents)
}

/// Waits up to 10 s for `server` to have been asked `request`.
fn wait_for_request(server: &HttpServer, request: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if server.requests().iter().any(|r| r == request) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    false
}

/// Once a file of an interleave has opened, the next file's GET is sent
/// while the first is still being read (its answer's delay, tens of ms on a
/// real store, then passes during the read), and that GET is the one the
/// next file reads from: one GET per object, the records unchanged.
#[test]
fn the_next_objects_get_is_sent_while_the_open_one_is_read() {
    let (server, urls, contents) = four_objects();
    let read = ReadOptions {
        strategy: ReadStrategy::Stream,
        ..ReadOptions::default()
    };
    let files = Pipeline::tfrecord_files(&urls).unwrap().read_options(read);
    let resolved = server.requests().len();
    let mut it = files.records().start().unwrap();
    let first = it.next().unwrap().unwrap();
    assert_eq!(first.to_vec(), contents[0][0]);
    assert!(
        wait_for_request(&server, "GET /f1"),
        "f1 is asked for while f0 is read: {:?}",
        server.requests()
    );
    assert!(
        !server.requests().iter().any(|r| r == "GET /f2"),
        "one file ahead, not more (cycle_length 1): {:?}",
        server.requests()
    );
    let rest: Vec<Vec<u8>> = it.map(|r| r.unwrap().to_vec()).collect();
    let expected: Vec<Vec<u8>> = contents.concat();
    assert!(rest == expected[1..], "the records differ");
    assert_eq!(
        server.requests()[resolved..],
        ["GET /f0", "GET /f1", "GET /f2", "GET /f3"],
        "one GET per object"
    );
}

/// A GET sent ahead that fails fails its own file, in that file's place: the
/// records before it all come, then its error naming it, then the next
/// file's records; the same under a parallel interleave and each epoch of a
/// `repeat`, which sends its own GETs ahead.
#[test]
fn a_get_sent_ahead_that_fails_fails_its_own_file_in_order() {
    let (server, urls, contents) = four_objects();
    let files = Pipeline::tfrecord_files(&urls).unwrap();
    // Gone after the listing: its GET, sent ahead, answers 404.
    server.remove("f2");
    let got: Vec<Result<Vec<u8>, String>> = files
        .clone()
        .records()
        .start()
        .unwrap()
        .map(|r| r.map(|r| r.to_vec()).map_err(|e| e.to_string()))
        .collect();
    assert_eq!(got.len(), 3 * 300 + 1);
    assert!(got[..600].iter().all(Result::is_ok));
    let error = got[600].as_ref().unwrap_err();
    assert!(error.contains(&urls[2]), "{error}");
    let after: Vec<Vec<u8>> = got[601..].iter().map(|r| r.clone().unwrap()).collect();
    assert!(after == contents[3]);

    // Two at a time on producer threads (f2 and f3 opened ahead), two
    // epochs: f2's error in each, and every other record once per epoch.
    let got: Vec<Result<Vec<u8>, String>> = files
        .interleave(2, 7)
        .repeat(Some(2))
        .start()
        .unwrap()
        .map(|r| r.map(|r| r.to_vec()).map_err(|e| e.to_string()))
        .collect();
    let errors: Vec<&String> = got.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().all(|e| e.contains(&urls[2])), "{errors:?}");
    let mut records: Vec<Vec<u8>> = got.into_iter().filter_map(Result::ok).collect();
    let mut expected: Vec<Vec<u8>> = [&contents[0], &contents[1], &contents[3]]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    records.sort();
    expected.extend(expected.clone());
    expected.sort();
    assert!(records == expected, "every record once per epoch");
}
