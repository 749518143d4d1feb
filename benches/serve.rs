//! Serving benchmark: `tfpipe serve` on the MNIST MLP 784-256-10, driven
//! over HTTP from outside the process, as a client sees it.
//!
//! - **Start to ready**: process start (spawn) to the first `200` of
//!   `GET /v2/health/ready`, polled every 0.5 ms, and the server's own line
//!   (`ready N ms after process start`).
//! - **First against steady**: in a fresh process each time, the first
//!   `:predict` after ready against the p50 of the next 200, at batch 1 and
//!   at batch 256; on one keep-alive connection opened before the clock
//!   starts (`keep`), and with a new connection per request, each opened
//!   untimed (`fresh`); beside them, requests made after the steady ones,
//!   each after 20 ms without requests, against the same p50: what a pause
//!   alone costs once the process is long past its first request.
//! - **Load**: throughput, p50 and p99 of batch-1 `:predict` requests at 1,
//!   8 and 64 connections, with and without dynamic batching, from a real
//!   HTTP load generator: `oha` (`cargo install oha`; `$OHA` names it when
//!   it is not on the `PATH`), else `wrk` (Debian's package).
//!
//! The checkpoint is trained here (the bundled MNIST, one epoch) with the
//! built `tfpipe`. `--compare BIN` runs every measurement for a second
//! binary too, process for process interleaved with this build's (a before
//! and after at the same load); `--tfpipe BIN` measures another binary in
//! place of the built one. Not part of `cargo test`.
//!
//! ```text
//! cargo bench --bench serve                      # ~1.5 min
//! cargo bench --bench serve -- --processes 9 --seconds 5 --compare /tmp/tfpipe-before
//! ```
//!
//! Prints Markdown tables (with the load average before and after) and one
//! JSON line. Results: docs/benchmarks.md, "Serving".

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value as Json, json};

const TFPIPE: &str = env!("CARGO_BIN_EXE_tfpipe");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const PREDICT: &str = "/v1/models/mnist:predict";

struct Options {
    processes: usize,
    starts: usize,
    seconds: u64,
    steady: usize,
    tfpipe: PathBuf,
    compare: Option<PathBuf>,
    skip_load: bool,
}

fn options() -> Options {
    let mut o = Options {
        processes: 5,
        starts: 5,
        seconds: 5,
        steady: 200,
        tfpipe: PathBuf::from(TFPIPE),
        compare: None,
        skip_load: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match arg.as_str() {
            "--processes" => o.processes = value("--processes").parse().expect("--processes N"),
            "--starts" => o.starts = value("--starts").parse().expect("--starts N"),
            "--seconds" => o.seconds = value("--seconds").parse().expect("--seconds S"),
            "--steady" => o.steady = value("--steady").parse().expect("--steady N"),
            "--tfpipe" => o.tfpipe = value("--tfpipe").into(),
            "--compare" => o.compare = Some(value("--compare").into()),
            "--skip-load" => o.skip_load = true,
            // `cargo bench` passes `--bench`; a filter means nothing here.
            _ => {}
        }
    }
    o
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run tfpipe");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Trains the MLP 784-256-10 on the bundled MNIST digits (one epoch) into
/// `dir/models/1`; returns the base directory.
fn checkpoint(dir: &Path) -> PathBuf {
    let mnist = Path::new(ROOT).join("testdata/mnist/train-images-idx3-ubyte.gz");
    run(Command::new(TFPIPE)
        .args(["convert", "idx"])
        .arg(&mnist)
        .arg("-o")
        .arg(dir.join("train")));
    let models = dir.join("models");
    run(Command::new(TFPIPE)
        .args(["train", "--schema"])
        .arg(dir.join("train.features.json"))
        .arg("--data")
        .arg(format!("{}/train-*", dir.display()))
        .args(["--hidden", "256", "--epochs", "1", "--batch-size", "64"])
        .arg("--save-versions")
        .arg(&models));
    models
}

/// A `:predict` body of `rows` MNIST-sized instances of random bytes.
fn body(rows: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let instances: Vec<Json> = (0..rows)
        .map(|_| {
            let pixels: Vec<u8> = (0..784)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            json!({"image_raw": {"b64": base64::engine::general_purpose::STANDARD.encode(pixels)}})
        })
        .collect();
    serde_json::to_vec(&json!({ "instances": instances })).unwrap()
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    chunk: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        // Written now, so that the first timed response does not fault in
        // the client's pages. (`vec![0; n]` would not do: a zeroed
        // allocation this large is fresh mapped memory, untouched until
        // written; and a read buffer on the stack is fresh stack pages the
        // first time.)
        let mut buf = vec![1u8; 1 << 20];
        buf.clear();
        let chunk = vec![1u8; 64 << 10];
        Ok(Conn { stream, buf, chunk })
    }

    /// Sends one request and reads its response whole; the status.
    fn request(&mut self, method: &str, path: &str, body: &[u8]) -> std::io::Result<u16> {
        self.send(&http_request(method, path, body))
    }

    /// Sends `out`, a whole request, and reads its response whole; the status.
    fn send(&mut self, out: &[u8]) -> std::io::Result<u16> {
        self.stream.write_all(out)?;
        self.buf.clear();
        let chunk = &mut self.chunk;
        let (head, length) = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..i]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap_or(0));
                break (i + 4, length);
            }
            let n = self.stream.read(chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        };
        while self.buf.len() < head + length {
            let n = self.stream.read(chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let status = self.buf[9..12]
            .iter()
            .fold(0u16, |s, &d| s * 10 + u16::from(d - b'0'));
        Ok(status)
    }

    /// Times one `:predict` (`request`, made untimed by [`http_request`]),
    /// which must answer 200.
    fn predict(&mut self, request: &[u8]) -> Duration {
        let start = Instant::now();
        let status = self.send(request).expect("predict");
        let took = start.elapsed();
        assert_eq!(status, 200, "predict answered {status}");
        took
    }
}

/// A request's bytes on the wire.
fn http_request(method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A running `tfpipe serve`.
struct Served {
    child: Child,
    addr: SocketAddr,
    /// Spawn to the first 200 of `/v2/health/ready`.
    ready: Duration,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn serve(bin: &Path, models: &Path, batching: bool) -> Served {
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    let mut child = Command::new(bin)
        .arg("serve")
        .arg("--model")
        .arg(format!("mnist={}", models.display()))
        .args(["--port", &port.to_string(), "--poll-seconds", "0"])
        .args(["--enable-batching", if batching { "true" } else { "false" }])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tfpipe serve");
    loop {
        let ready = Conn::open(addr)
            .and_then(|mut c| c.request("GET", "/v2/health/ready", b""))
            .is_ok_and(|s| s == 200);
        if ready {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("tfpipe serve exited ({status}) before it was ready");
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "not ready in 30 s"
        );
        std::thread::sleep(Duration::from_micros(500));
    }
    Served {
        ready: start.elapsed(),
        child,
        addr,
    }
}

impl Served {
    /// SIGTERM, then the server's own start-to-ready line, ms.
    fn stop(mut self) -> Option<f64> {
        // SAFETY: kill only sends a signal to our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let mut log = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut log);
        }
        let status = self.child.wait().expect("wait for tfpipe serve");
        assert!(status.success(), "tfpipe serve: {status}\n{log}");
        log.lines()
            .find_map(|l| l.strip_prefix("tfpipe serve: ready "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|ms| ms.parse().ok())
    }
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Requests timed after the steady ones, each after [`IDLE`] without any.
const AFTER_IDLE: usize = 5;

/// The pause before each of those.
const IDLE: Duration = Duration::from_millis(20);

/// One process: its first request, the p50 of the next `steady`, and the
/// median of [`AFTER_IDLE`] requests made after them, each after [`IDLE`]
/// without requests: what a request costs after a pause once the process
/// is long past its first (on this VM a pause alone costs 1.3-1.7x at
/// batch 256, decaying over the next few requests; docs/benchmarks.md,
/// "The first request against a request after a pause").
fn first_vs_steady(bin: &Path, models: &Path, rows: usize, fresh: bool, steady: usize) -> [f64; 3] {
    // The requests first: made after ready (tens of ms in a dev-built
    // harness at batch 256), they put an idle gap before the first request,
    // which then measured the cost of a request after idle; made inside
    // the timing, the first one's 270 KB would be a fresh block of the
    // client's allocator, faulted in.
    let bodies: Vec<Vec<u8>> = (0..5)
        .map(|seed| http_request("POST", PREDICT, &body(rows, seed)))
        .collect();
    let served = serve(bin, models, true);
    let mut conn = Conn::open(served.addr).expect("connect");
    let first = ms(conn.predict(&bodies[0]));
    let mut times: Vec<f64> = (0..steady)
        .map(|i| {
            if fresh {
                conn = Conn::open(served.addr).expect("connect");
            }
            ms(conn.predict(&bodies[1 + i % 4]))
        })
        .collect();
    let mut after_idle: Vec<f64> = (0..AFTER_IDLE)
        .map(|i| {
            if fresh {
                conn = Conn::open(served.addr).expect("connect");
            }
            std::thread::sleep(IDLE);
            ms(conn.predict(&bodies[1 + i % 4]))
        })
        .collect();
    drop(conn);
    served.stop();
    [first, median(&mut times), median(&mut after_idle)]
}

/// Process-interleaved runs of each binary; per binary, the medians of
/// first, steady and their ratio, and every ratio.
fn first_runs(bins: &[PathBuf], models: &Path, rows: usize, fresh: bool, o: &Options) -> Vec<Json> {
    let mut runs = vec![Vec::new(); bins.len()];
    for _ in 0..o.processes {
        for (bin, runs) in bins.iter().zip(runs.iter_mut()) {
            runs.push(first_vs_steady(bin, models, rows, fresh, o.steady));
        }
    }
    runs.into_iter()
        .map(|r| {
            let mut ratios: Vec<f64> = r.iter().map(|[f, s, _]| f / s).collect();
            let mut idle_ratios: Vec<f64> = r.iter().map(|[_, s, a]| a / s).collect();
            let column = |i: usize| median(&mut r.iter().map(|x| x[i]).collect::<Vec<_>>());
            let (first, steady, after_idle) = (column(0), column(1), column(2));
            let ratio = median(&mut ratios);
            let idle_ratio = median(&mut idle_ratios);
            json!({"first_ms": first, "steady_p50_ms": steady, "after_idle_ms": after_idle,
                   "ratio": ratio, "ratios": ratios,
                   "after_idle_vs_steady": idle_ratio, "after_idle_vs_steady_ratios": idle_ratios})
        })
        .collect()
}

fn start_to_ready(bins: &[PathBuf], models: &Path, o: &Options) -> Vec<Json> {
    let mut runs = vec![(Vec::new(), Vec::new()); bins.len()];
    for _ in 0..o.starts {
        for (bin, (client, own)) in bins.iter().zip(runs.iter_mut()) {
            let served = serve(bin, models, true);
            client.push(ms(served.ready));
            if let Some(line) = served.stop() {
                own.push(line);
            }
        }
    }
    runs.into_iter()
        .map(|(mut client, mut own)| {
            json!({"client_ms": median(&mut client), "server_line_ms": median(&mut own),
                   "client_all_ms": client})
        })
        .collect()
}

/// The load generator: `$OHA`, `oha` on the PATH, or `wrk`.
fn generator() -> Option<(&'static str, PathBuf)> {
    let on_path = |name: &str| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join(name))
                .find(|p| p.is_file())
        })
    };
    if let Some(oha) = std::env::var_os("OHA") {
        return Some(("oha", oha.into()));
    }
    on_path("oha")
        .map(|p| ("oha", p))
        .or_else(|| on_path("wrk").map(|p| ("wrk", p)))
}

/// Requests/s, p50 and p99 ms, and the non-200 answers of `conns`
/// connections sending batch-1 requests for `seconds`.
fn load(tool: &(&str, PathBuf), addr: SocketAddr, conns: usize, seconds: u64, dir: &Path) -> Json {
    let url = format!("http://{addr}{PREDICT}");
    let payload = body(1, 7);
    if tool.0 == "oha" {
        let file = dir.join("body.json");
        std::fs::write(&file, &payload).unwrap();
        let out = Command::new(&tool.1)
            .args(["--no-tui", "--output-format", "json", "-m", "POST"])
            .args(["-T", "application/json", "-D"])
            .arg(&file)
            .args(["-c", &conns.to_string(), "-z", &format!("{seconds}s"), &url])
            .output()
            .expect("run oha");
        assert!(
            out.status.success(),
            "oha: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: Json = serde_json::from_slice(&out.stdout).expect("oha's JSON");
        let codes = &r["statusCodeDistribution"];
        let ok = codes["200"].as_u64().unwrap_or(0);
        let all: u64 = codes
            .as_object()
            .map_or(0, |m| m.values().filter_map(Json::as_u64).sum());
        return json!({
            "req_per_s": r["summary"]["requestsPerSec"],
            "p50_ms": r["latencyPercentiles"]["p50"].as_f64().map(|s| s * 1e3),
            "p99_ms": r["latencyPercentiles"]["p99"].as_f64().map(|s| s * 1e3),
            "non_200": all - ok,
        });
    }
    let script = dir.join("post.lua");
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = {}\n",
            serde_json::to_string(&String::from_utf8(payload).unwrap()).unwrap()
        ),
    )
    .unwrap();
    let out = Command::new(&tool.1)
        .arg(format!("-t{}", conns.min(2)))
        .arg(format!("-c{conns}"))
        .arg(format!("-d{seconds}s"))
        .arg("--latency")
        .arg("-s")
        .arg(&script)
        .arg(&url)
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |label: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(label))
            .map(|v| v.trim().to_string())
    };
    let wrk_ms = |v: Option<String>| {
        v.and_then(|v| {
            let (n, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic())?);
            let scale = match unit {
                "us" => 1e-3,
                "ms" => 1.0,
                "s" => 1e3,
                _ => return None,
            };
            n.parse::<f64>().ok().map(|n| n * scale)
        })
    };
    json!({
        "req_per_s": field("Requests/sec:").and_then(|v| v.parse::<f64>().ok()),
        "p50_ms": wrk_ms(field("50%")),
        "p99_ms": wrk_ms(field("99%")),
        "non_200": field("Non-2xx or 3xx responses:").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0),
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn main() {
    let o = options();
    let dir = tempfile::tempdir().unwrap();
    let models = checkpoint(dir.path());
    let mut bins = vec![o.tfpipe.clone()];
    bins.extend(o.compare.clone());
    let names: Vec<String> = bins.iter().map(|b| b.display().to_string()).collect();
    let load_before = loadavg();
    let mut res = json!({"binaries": names, "load_before": load_before});

    let ready = start_to_ready(&bins, &models, &o);
    println!("\n| binary | start to ready (client) | server's line |\n| --- | --- | --- |");
    for (name, r) in names.iter().zip(&ready) {
        println!(
            "| {name} | {:.1} ms | {:.1} ms |",
            r["client_ms"].as_f64().unwrap(),
            r["server_line_ms"].as_f64().unwrap_or(f64::NAN)
        );
    }
    res["start_to_ready"] = json!(ready);

    println!(
        "\n| binary | rows | connection | first | steady p50 | after 20 ms idle | first / steady (median) | after 20 ms idle / steady (median) | first / steady, per process |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for rows in [1, 256] {
        for fresh in [false, true] {
            let mode = if fresh { "fresh" } else { "keep" };
            let runs = first_runs(&bins, &models, rows, fresh, &o);
            for (name, r) in names.iter().zip(&runs) {
                let ratios: Vec<String> = r["ratios"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| format!("{:.2}", x.as_f64().unwrap()))
                    .collect();
                println!(
                    "| {name} | {rows} | {mode} | {:.3} ms | {:.3} ms | {:.3} ms | {:.2}x | {:.2}x | {} |",
                    r["first_ms"].as_f64().unwrap(),
                    r["steady_p50_ms"].as_f64().unwrap(),
                    r["after_idle_ms"].as_f64().unwrap(),
                    r["ratio"].as_f64().unwrap(),
                    r["after_idle_vs_steady"].as_f64().unwrap(),
                    ratios.join(" ")
                );
            }
            res[format!("first_b{rows}_{mode}")] = json!(runs);
        }
    }

    match (o.skip_load, generator()) {
        (true, _) => {}
        (false, None) => println!("\nno load generator: install oha (cargo install oha) or wrk"),
        (false, Some(tool)) => {
            println!(
                "\n{}: {} s per row, batch-1 requests\n\n| binary | batching | connections | requests/s | p50 | p99 | non-200 |\n| --- | --- | --- | --- | --- | --- | --- |",
                tool.1.display(),
                o.seconds
            );
            let mut rows = Vec::new();
            for conns in [1, 8, 64] {
                for batching in [true, false] {
                    for (bin, name) in bins.iter().zip(&names) {
                        let served = serve(bin, &models, batching);
                        let r = load(&tool, served.addr, conns, o.seconds, dir.path());
                        served.stop();
                        println!(
                            "| {name} | {} | {conns} | {:.0} | {:.2} ms | {:.2} ms | {} |",
                            if batching { "on" } else { "off" },
                            r["req_per_s"].as_f64().unwrap_or(f64::NAN),
                            r["p50_ms"].as_f64().unwrap_or(f64::NAN),
                            r["p99_ms"].as_f64().unwrap_or(f64::NAN),
                            r["non_200"]
                        );
                        rows.push(json!({"binary": name, "batching": batching, "connections": conns, "result": r}));
                    }
                }
            }
            res["load_generator"] = json!(tool.1.display().to_string());
            res["load"] = json!(rows);
        }
    }
    let load_after = loadavg();
    println!("\nload average: {load_before} before, {load_after} after");
    res["load_after"] = json!(load_after);
    println!("{res}");
}
