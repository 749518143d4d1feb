//! `tfpipe serve` and `tfpipe::serve` from the outside, over real sockets
//! on 127.0.0.1: every protocol against `tfpipe predict` on the same
//! inputs, malformed requests, 10,000 requests from 64 clients, the full
//! queue, versions (polling, warm-up, failures), warm-up files written by
//! TF Serving's Python package, and SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use candle_core::{Device, Tensor};
use candle_nn::VarBuilder;
use prost::Message;
use serde_json::{Value as Json, json};
use tfpipe::example::DType;
use tfpipe::example::Example;
use tfpipe::example::proto::{BytesList, Feature, Features, FloatList, Int64List, feature};
use tfpipe::serve::{BatchOptions, Event, ModelSource, ServeConfig, Server, WarmupSource};
use tfpipe::tfrecord::{Compression, FileRecordWriter};
use tfpipe::train::{
    BatchTensors, BuiltinModel, Checkpoint, CheckpointMeta, DefaultMeta, FORMAT, FeatureMeta,
    Imputation, Impute, InputSpec, Model, ModelConfig, Predictor, SchemaMeta, Standardize, Task,
};

/// Examples in the comparison data.
const EXAMPLES: usize = 200;
const NAMES: [&str; 3] = ["adelie", "chinstrap", "gentoo"];

/// The inputs of the test models: `x` float32 [3], `img` uint8 [2] (raw
/// bytes), `n` int64 scalar with default 7; label `species`.
fn meta(config: &ModelConfig) -> CheckpointMeta {
    let task = config.task();
    let feature = |name: &str, dtype, shape: Vec<usize>, default| FeatureMeta {
        name: name.into(),
        dtype,
        shape,
        var: false,
        default,
    };
    // From JSON, so fields later versions add (all optional) keep their defaults.
    let input = InputSpec {
        features: vec![("x".into(), 3), ("img".into(), 2), ("n".into(), 1)],
        label: Some("species".into()),
        task,
        standardize: vec![
            Standardize {
                mean: 0.5,
                std: 2.0,
            },
            Standardize::IDENTITY,
            Standardize {
                mean: 4.0,
                std: 3.0,
            },
        ],
        tokens: None,
        impute: None,
    };
    let schema = SchemaMeta {
        features: vec![
            feature("species", DType::Int64, vec![], None),
            feature("x", DType::Float32, vec![3], None),
            feature("img", DType::Uint8, vec![2], None),
            feature("n", DType::Int64, vec![], Some(DefaultMeta::Int64(vec![7]))),
        ],
        label: Some("species".into()),
    };
    let names: Option<Vec<&str>> =
        matches!(task, Task::Classification { .. }).then(|| NAMES.to_vec());
    serde_json::from_value(json!({
        "format": FORMAT,
        "step": 1,
        "epoch": 1,
        "model": config,
        "model_description": config.describe(),
        "optimizer": null,
        "optimizer_state": false,
        "input": input,
        "schema": schema,
        "seed": 3,
        "label_vocabulary": names,
    }))
    .unwrap()
}

fn classifier() -> ModelConfig {
    ModelConfig::Mlp {
        inputs: 6,
        hidden: vec![16],
        classes: 3,
    }
}

fn regressor() -> ModelConfig {
    ModelConfig::Regressor {
        inputs: 6,
        hidden: vec![8],
    }
}

/// Saves a seeded (untrained) built-in model into `dir`.
fn save(dir: &Path, config: &ModelConfig, seed: u64) {
    let (_, varmap) = BuiltinModel::init(config.clone(), seed, &Device::Cpu).unwrap();
    Checkpoint::save(dir, &varmap, None, &meta(config)).unwrap();
}

/// Example `i` of the comparison data: (x, img, n).
fn example_values(i: usize) -> ([f32; 3], [u8; 2], i64) {
    let f = i as f32;
    (
        [(f * 0.37).sin() * 3.0, (f * 0.11).cos(), f / 50.0 - 2.0],
        [(i * 37 % 256) as u8, (i * 91 % 256) as u8],
        (i % 9) as i64,
    )
}

fn example(i: usize) -> Example {
    let (x, img, n) = example_values(i);
    let kind = |k| Feature { kind: Some(k) };
    let mut map = std::collections::BTreeMap::new();
    map.insert(
        "x".to_string(),
        kind(feature::Kind::FloatList(FloatList { value: x.to_vec() })),
    );
    map.insert(
        "img".to_string(),
        kind(feature::Kind::BytesList(BytesList {
            value: vec![img.to_vec()],
        })),
    );
    map.insert(
        "n".to_string(),
        kind(feature::Kind::Int64List(Int64List { value: vec![n] })),
    );
    Example {
        features: Some(Features { feature: map }),
    }
}

fn write_examples(path: &Path) {
    let mut w = FileRecordWriter::create(path, Compression::None).unwrap();
    for i in 0..EXAMPLES {
        w.write_record(&example(i).encode_to_vec()).unwrap();
    }
    w.finish().unwrap();
}

/// Example `i` as a `/v1` instance (img as base64 every other time).
fn instance(i: usize) -> Json {
    let (x, img, n) = example_values(i);
    let img = if i.is_multiple_of(2) {
        json!({"b64": BASE64.encode(img)})
    } else {
        json!(img)
    };
    json!({"x": x, "img": img, "n": n})
}

/// What `tfpipe predict` says for every example: (class, probabilities) or value.
fn predict_cli(checkpoint: &Path, data: &Path) -> Vec<Json> {
    let out = Command::new(env!("CARGO_BIN_EXE_tfpipe"))
        .args(["predict", "--checkpoint"])
        .arg(checkpoint)
        .arg("--data")
        .arg(data)
        .args(["--batch-size", "32"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A minimal HTTP/1.1 client on one keep-alive connection.
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) -> (u16, Vec<u8>) {
        self.stream.write_all(bytes).unwrap();
        self.read_response()
    }

    fn request(&mut self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        self.send_raw(&req)
    }

    fn json(&mut self, method: &str, path: &str, body: &Json) -> (u16, Json) {
        let body = if body.is_null() {
            Vec::new()
        } else {
            serde_json::to_vec(body).unwrap()
        };
        let (status, bytes) = self.request(method, path, &body);
        let parsed = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&bytes)));
        (status, parsed)
    }

    fn read_response(&mut self) -> (u16, Vec<u8>) {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            self.fill();
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let status: u16 = head[9..12].parse().unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().unwrap())
            })
            .unwrap();
        while self.buf.len() < head_end + length {
            self.fill();
        }
        let body = self.buf[head_end..head_end + length].to_vec();
        self.buf.drain(..head_end + length);
        (status, body)
    }

    fn fill(&mut self) {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk).unwrap();
        assert!(n > 0, "the server closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }
}

/// A server on a free port over `sources`, waited on until ready.
fn start(sources: Vec<ModelSource>, config: ServeConfig) -> Server {
    let server = Server::start(
        ServeConfig {
            addr: "127.0.0.1:0".into(),
            connections: 80,
            ..config
        },
        sources,
    )
    .unwrap();
    assert!(
        server.wait_ready(Duration::from_secs(30)),
        "{:?}",
        server.statuses()
    );
    server
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * (1.0 + b.abs())
}

/// A prediction row equals `tfpipe predict`'s line (probabilities to 1e-5:
/// another batch size may sum in another order).
fn same_prediction(got: &Json, want: &Json) -> bool {
    if let Some(v) = want.get("value") {
        return close(got.as_f64().unwrap(), v.as_f64().unwrap());
    }
    let (Some(gp), Some(wp)) = (
        got["probabilities"].as_array(),
        want["probabilities"].as_array(),
    ) else {
        return false;
    };
    let probs_equal = gp.len() == wp.len()
        && gp
            .iter()
            .zip(wp)
            .all(|(a, b)| close(a.as_f64().unwrap(), b.as_f64().unwrap()));
    let mut sorted: Vec<f64> = wp.iter().map(|p| p.as_f64().unwrap()).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let tie = sorted.len() > 1 && sorted[0] - sorted[1] < 1e-5;
    probs_equal && (tie || got["class"] == want["class"]) && got["class_name"] == want["class_name"]
}

struct Fixture {
    _dir: tempfile::TempDir,
    classifier: PathBuf,
    regressor: PathBuf,
    expected: Vec<Json>,
    expected_values: Vec<Json>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let classifier_dir = dir.path().join("classifier");
    let regressor_dir = dir.path().join("regressor");
    save(&classifier_dir, &classifier(), 1);
    save(&regressor_dir, &regressor(), 2);
    let data = dir.path().join("data.tfrecord");
    write_examples(&data);
    let expected = predict_cli(&classifier_dir, &data);
    let expected_values = predict_cli(&regressor_dir, &data);
    assert_eq!(expected.len(), EXAMPLES);
    Fixture {
        classifier: classifier_dir,
        regressor: regressor_dir,
        expected,
        expected_values,
        _dir: dir,
    }
}

fn sources(f: &Fixture) -> Vec<ModelSource> {
    vec![
        ModelSource::new("penguins", &f.classifier),
        ModelSource::new("mass", &f.regressor),
    ]
}

#[test]
fn every_protocol_answers_what_tfpipe_predict_answers() {
    let f = fixture();
    let server = start(sources(&f), ServeConfig::default());
    let mut c = Client::connect(server.local_addr());

    let (s, body) = c.json("GET", "/v1/models/penguins", &Json::Null);
    assert_eq!(s, 200);
    assert_eq!(
        body,
        json!({"model_version_status": [{"version": "1", "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""}}]})
    );
    let (s, body) = c.json(
        "GET",
        "/v1/models/penguins/versions/1/metadata",
        &Json::Null,
    );
    assert_eq!(s, 200);
    let sig = &body["metadata"]["signature_def"]["signature_def"]["serving_default"];
    assert_eq!(sig["inputs"]["img"]["dtype"], "DT_UINT8");
    assert_eq!(sig["inputs"]["x"]["tensor_shape"]["dim"][1]["size"], "3");
    assert_eq!(
        sig["outputs"]["probabilities"]["tensor_shape"]["dim"][1]["size"],
        "3"
    );

    // Rows.
    let rows: Vec<Json> = (0..5).map(instance).collect();
    let (s, body) = c.json(
        "POST",
        "/v1/models/penguins:predict",
        &json!({"instances": rows}),
    );
    assert_eq!(s, 200, "{body}");
    for (i, p) in body["predictions"].as_array().unwrap().iter().enumerate() {
        assert!(
            same_prediction(p, &f.expected[i]),
            "{p} vs {}",
            f.expected[i]
        );
    }
    // Columns, with `n` left to its default for example 7 (n = 7 % 9 = 7).
    let cols = json!({"inputs": {"x": [example_values(7).0], "img": [example_values(7).1]}});
    let (s, body) = c.json("POST", "/v1/models/penguins/versions/1:predict", &cols);
    assert_eq!(s, 200, "{body}");
    let out = &body["outputs"];
    let row = json!({"class": out["class"][0], "class_name": out["class_name"][0],
        "probabilities": out["probabilities"][0]});
    assert!(same_prediction(&row, &f.expected[7]), "{row}");
    // Classify, with a context.
    let (x, img, _) = example_values(4);
    let req =
        json!({"context": {"n": 4}, "examples": [{"x": x, "img": {"b64": BASE64.encode(img)}}]});
    let (s, body) = c.json("POST", "/v1/models/penguins:classify", &req);
    assert_eq!(s, 200, "{body}");
    let scores = body["result"][0].as_array().unwrap();
    assert_eq!(scores[2][0], "gentoo");
    let probs = &f.expected[4]["probabilities"];
    for (c, pair) in scores.iter().enumerate() {
        assert!(close(pair[1].as_f64().unwrap(), probs[c].as_f64().unwrap()));
    }
    // Regress and regression predictions (bare values, as TF Serving writes one output).
    let (s, body) = c.json(
        "POST",
        "/v1/models/mass:regress",
        &json!({"examples": [instance(9)]}),
    );
    assert_eq!(s, 200, "{body}");
    assert!(
        same_prediction(&body["result"][0], &f.expected_values[9]),
        "{body}"
    );
    let (s, body) = c.json(
        "POST",
        "/v1/models/mass:predict",
        &json!({"instances": [instance(3)]}),
    );
    assert_eq!(s, 200);
    assert!(same_prediction(
        &body["predictions"][0],
        &f.expected_values[3]
    ));

    // KServe v2.
    assert_eq!(c.json("GET", "/v2/health/live", &Json::Null).0, 200);
    assert_eq!(
        c.json("GET", "/v2/health/ready", &Json::Null),
        (200, json!({"ready": true}))
    );
    assert_eq!(
        c.json("GET", "/v2/models/penguins/versions/1/ready", &Json::Null)
            .0,
        200
    );
    let (s, body) = c.json("GET", "/v2/models/penguins", &Json::Null);
    assert_eq!((s, &body["inputs"][0]["datatype"]), (200, &json!("FP32")));
    let xs: Vec<f32> = (10..12).flat_map(|i| example_values(i).0).collect();
    let imgs: Vec<u8> = (10..12).flat_map(|i| example_values(i).1).collect();
    let ns: Vec<i64> = (10..12).map(|i| example_values(i).2).collect();
    let req = json!({"id": "r1", "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": xs},
        {"name": "img", "datatype": "UINT8", "shape": [2, 2], "data": imgs},
        {"name": "n", "datatype": "INT64", "shape": [2, 1], "data": ns},
    ]});
    let (s, body) = c.json("POST", "/v2/models/penguins/infer", &req);
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["id"], "r1");
    let outputs = body["outputs"].as_array().unwrap();
    let probs = outputs
        .iter()
        .find(|o| o["name"] == "probabilities")
        .unwrap();
    assert_eq!(probs["shape"], json!([2, 3]));
    for r in 0..2 {
        let row = json!({"class": f.expected[10 + r]["class"], "class_name": f.expected[10 + r]["class_name"],
            "probabilities": probs["data"].as_array().unwrap()[r * 3..r * 3 + 3]});
        assert!(same_prediction(&row, &f.expected[10 + r]));
    }

    // Metrics.
    let (s, text) = c.request("GET", "/metrics", b"");
    let text = String::from_utf8(text).unwrap();
    assert_eq!(s, 200);
    for needle in [
        "tfpipe_serve_requests_total{model=\"penguins\",version=\"1\",code=\"200\"}",
        "tfpipe_serve_request_duration_seconds_bucket{model=\"penguins\",le=\"+Inf\"}",
        "tfpipe_serve_batch_size_count{model=\"penguins\",version=\"1\"}",
        "tfpipe_serve_queue_examples{model=\"penguins\",version=\"1\"} 0",
        "tfpipe_serve_load_seconds{model=\"mass\",version=\"1\"}",
        "tfpipe_serve_warmup_seconds{model=\"penguins\",version=\"1\"}",
        "tfpipe_serve_start_to_ready_seconds",
    ] {
        assert!(text.contains(needle), "{needle} not in\n{text}");
    }
    server.shutdown().unwrap();
}

/// What a model's first request used to allocate is made before ready:
/// its latency histogram is in `/metrics` (empty) before any request, and
/// the warm-up's own requests, sent over HTTP to the server's listener,
/// are not counted as requests.
#[test]
fn metrics_at_ready_have_each_models_histogram_and_no_warmup_requests() {
    let f = fixture();
    let server = start(sources(&f), ServeConfig::default());
    let (s, text) = Client::connect(server.local_addr()).request("GET", "/metrics", b"");
    let text = String::from_utf8(text).unwrap();
    assert_eq!(s, 200);
    for model in ["penguins", "mass"] {
        let empty = format!("tfpipe_serve_request_duration_seconds_count{{model=\"{model}\"}} 0\n");
        assert!(text.contains(&empty), "{empty} not in\n{text}");
        let counted = format!("tfpipe_serve_requests_total{{model=\"{model}\"");
        assert!(!text.contains(&counted), "{counted} in\n{text}");
    }
    // The warm-up's requests did run, through the batcher: 256 rows, then
    // 1 row three times, per model, on each of its two connections.
    for model in ["penguins", "mass"] {
        for needle in [
            format!("tfpipe_serve_batch_size_count{{model=\"{model}\",version=\"1\"}} 8\n"),
            format!("tfpipe_serve_batch_size_sum{{model=\"{model}\",version=\"1\"}} 518\n"),
        ] {
            assert!(text.contains(&needle), "{needle} not in\n{text}");
        }
    }
    server.shutdown().unwrap();
}

/// (method, path, body, status, the start of the error message).
fn bad_requests() -> Vec<(&'static str, &'static str, Vec<u8>, u16, &'static str)> {
    let j = |v: Json| serde_json::to_vec(&v).unwrap();
    let p = "/v1/models/penguins:predict";
    let good = instance(0);
    vec![
        (
            "POST",
            p,
            j(json!({"instances": [{"x": [1, 2, "a"], "img": [1, 2]}]})),
            400,
            "instances[0].x[2]: expected a number, found a string",
        ),
        (
            "POST",
            p,
            j(json!({"instances": [{"x": [1, 2], "img": [1, 2]}]})),
            400,
            "instances[0].x: 2 values; \"x\" takes 3",
        ),
        (
            "POST",
            p,
            j(json!({"instances": [{"x": [1, 2, 3], "img": [1, 2], "colour": 1}]})),
            400,
            "instances[0]: unknown feature \"colour\"",
        ),
        (
            "POST",
            p,
            j(json!({"instances": [{"x": [1, 2, 3], "img": {"b64": "@@@"}}]})),
            400,
            "instances[0].img.b64: not valid base64",
        ),
        (
            "POST",
            p,
            j(json!({"instances": [{"x": [1, "NaN", 3], "img": [1, 2]}]})),
            400,
            "instances[0].x[1]: \"NaN\": the model takes finite numbers only",
        ),
        (
            "POST",
            p,
            j(json!({"instances": [{"x": [1, "Infinity", 3], "img": [1, 2]}]})),
            400,
            "instances[0].x[1]: \"Infinity\"",
        ),
        (
            "POST",
            p,
            b"{\"instances\": [{\"x\": [1, 1e39, 3], \"img\": [1, 2]}]}".to_vec(),
            400,
            "instances[0].x[1]: 1e+39 is outside float32's range",
        ),
        (
            "POST",
            p,
            j(json!({"instances": [{"x": [1, 2, 3], "img": [1, 256]}]})),
            400,
            "instances[0].img[1]: 256 is not a uint8",
        ),
        (
            "POST",
            p,
            j(json!({"instances": [{"x": [1, 2, 3], "img": [1, 2], "n": 2.5}]})),
            400,
            "instances[0].n: 2.5 is not an int64",
        ),
        (
            "POST",
            p,
            j(json!({"instances": [{"x": [1, 2, 3]}]})),
            400,
            "instances[0]: missing feature \"img\"",
        ),
        (
            "POST",
            p,
            j(json!({"instances": []})),
            400,
            "instances: empty",
        ),
        (
            "POST",
            p,
            j(json!({"instances": vec![good.clone(); 9]})),
            400,
            "instances: 9 examples; the server takes at most 8",
        ),
        (
            "POST",
            p,
            j(json!({"instances": [good.clone()], "inputs": {}})),
            400,
            "instances and inputs: give one of them",
        ),
        (
            "POST",
            p,
            j(json!({"instance": [good.clone()]})),
            400,
            "unknown field \"instance\"",
        ),
        (
            "POST",
            p,
            j(json!({"inputs": {"x": [[1, 2, 3]], "img": [[1, 2], [3, 4]]}})),
            400,
            "inputs.x: 1 examples, but inputs.img has 2",
        ),
        (
            "POST",
            p,
            j(json!({"instances": [good.clone()], "signature_name": "other"})),
            400,
            "signature_name: \"other\" is not a signature",
        ),
        (
            "POST",
            p,
            vec![b'{', 0xff, 0xfe, b'}'],
            400,
            "body: not UTF-8 (invalid byte at offset 1)",
        ),
        (
            "POST",
            p,
            b"{\"instances\": [".to_vec(),
            400,
            "body: not valid JSON",
        ),
        (
            "POST",
            p,
            b"[1, 2]".to_vec(),
            400,
            "body: expected a JSON object",
        ),
        ("POST", p, Vec::new(), 400, "body: empty"),
        (
            "POST",
            "/v1/models/penguins:regress",
            j(json!({"examples": [good.clone()]})),
            400,
            "this model is a classifier",
        ),
        (
            "POST",
            "/v1/models/penguins:classify",
            j(json!({"examples": [good.clone()], "context": {"x": [1, 2, 3]}})),
            400,
            "examples[0].x: the feature is also in context",
        ),
        (
            "POST",
            "/v1/models/penguins:explain",
            j(json!({})),
            404,
            "no method :explain",
        ),
        (
            "POST",
            "/v1/models/nope:predict",
            j(json!({"instances": [good.clone()]})),
            404,
            "model \"nope\" not found",
        ),
        (
            "POST",
            "/v1/models/penguins/versions/9:predict",
            j(json!({"instances": [good.clone()]})),
            404,
            "model \"penguins\" has no version 9",
        ),
        (
            "GET",
            "/v1/models/penguins/versions/..%2f..%2fetc",
            Vec::new(),
            400,
            "version \"..%2f..%2fetc\" is not a version number",
        ),
        (
            "GET",
            "/v1/models/penguins/versions/-1",
            Vec::new(),
            400,
            "version \"-1\" is not",
        ),
        (
            "GET",
            "/v1/models/penguins:predict",
            Vec::new(),
            405,
            "GET: :predict takes POST",
        ),
        (
            "POST",
            "/v1/models/penguins",
            Vec::new(),
            405,
            "POST: this endpoint takes GET",
        ),
        (
            "GET",
            "/v3/whatever",
            Vec::new(),
            404,
            "no endpoint GET /v3/whatever",
        ),
        (
            "POST",
            "/v2/models/penguins/infer",
            j(json!({"inputs": [
            {"name": "x", "datatype": "FP64", "shape": [1, 3], "data": [1, 2, 3]}]})),
            400,
            "inputs[0].datatype: \"FP64\"; input \"x\" is FP32",
        ),
        (
            "POST",
            "/v2/models/penguins/infer",
            j(json!({"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})),
            400,
            "inputs[0].shape: [1, 4]; input \"x\" takes [n, 3]",
        ),
        (
            "POST",
            "/v2/models/penguins/infer",
            j(json!({"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3]},
            {"name": "img", "datatype": "UINT8", "shape": [2, 2], "data": [1, 2, 3, 4]}]})),
            400,
            "inputs[0].data: 3 values; shape [2, 3] takes 6",
        ),
        (
            "POST",
            "/v2/models/penguins/infer",
            j(json!({"inputs": [
            {"name": "y", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]})),
            400,
            "inputs[0].name: unknown input \"y\"",
        ),
        (
            "POST",
            "/v2/models/penguins/infer",
            j(json!({"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
            {"name": "img", "datatype": "UINT8", "shape": [1, 2], "data": [1, 2]}],
            "outputs": [{"name": "logits"}]})),
            400,
            "outputs[0].name: unknown output \"logits\"",
        ),
    ]
}

#[test]
fn malformed_requests_get_a_4xx_that_names_the_field() {
    let f = fixture();
    let config = ServeConfig {
        batching: BatchOptions {
            max_batch_size: 8,
            ..BatchOptions::default()
        },
        max_body_bytes: 4096,
        ..ServeConfig::default()
    };
    let server = start(sources(&f), config);
    let mut c = Client::connect(server.local_addr());
    for (method, path, body, status, message) in bad_requests() {
        let (s, bytes) = c.request(method, path, &body);
        let reply: Json = serde_json::from_slice(&bytes).unwrap();
        let error = reply["error"].as_str().unwrap_or_default();
        assert_eq!(s, status, "{method} {path}: {reply}");
        assert!(
            error.starts_with(message),
            "{method} {path}: {error:?} should start with {message:?}"
        );
    }
    // The connection is still good after all that.
    let (s, _) = c.json(
        "POST",
        "/v1/models/penguins:predict",
        &json!({"instances": [instance(1)]}),
    );
    assert_eq!(s, 200);
    // A body over the limit: 413, decided from Content-Length, and the connection closes.
    let big = vec![b' '; 5000];
    let (s, bytes) =
        Client::connect(server.local_addr()).request("POST", "/v1/models/penguins:predict", &big);
    assert_eq!(s, 413, "{}", String::from_utf8_lossy(&bytes));
    // Chunked bodies: 411.
    let (s, _) = Client::connect(server.local_addr()).send_raw(
        b"POST /v1/models/penguins:predict HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    );
    assert_eq!(s, 411);
    // A head over the limit: 431.
    let mut huge = b"GET /v2/health/live HTTP/1.1\r\nX-Pad: ".to_vec();
    huge.extend(vec![b'a'; 20 << 10]);
    huge.extend_from_slice(b"\r\n\r\n");
    let (s, _) = Client::connect(server.local_addr()).send_raw(&huge);
    assert_eq!(s, 431);
    // Made-up names do not become metric labels.
    let (_, text) = c.request("GET", "/metrics", b"");
    let text = String::from_utf8(text).unwrap();
    assert!(!text.contains("nope"), "{text}");
    assert!(
        text.contains("model=\"penguins\",version=\"\",code=\"404\""),
        "{text}"
    );
    server.shutdown().unwrap();
}

#[test]
fn ten_thousand_requests_from_64_clients_all_get_the_right_answer() {
    let f = fixture();
    let config = ServeConfig {
        batching: BatchOptions {
            max_batch_size: 64,
            batch_timeout: Duration::from_micros(200),
            max_enqueued_batches: 64,
            enabled: true,
        },
        ..ServeConfig::default()
    };
    let server = start(sources(&f), config);
    let addr = server.local_addr();
    let expected = Arc::new(f.expected.clone());
    // The malformed requests that do not depend on the batch size limit.
    let bad: Vec<_> = bad_requests()
        .into_iter()
        .filter(|(.., message)| !message.contains("at most"))
        .collect();
    let bad = Arc::new(bad);
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let clients: Vec<_> = (0..64)
        .map(|client| {
            let (expected, bad, failures) = (expected.clone(), bad.clone(), failures.clone());
            tfpipe::spawn::Thread::spawn(format!("client-{client}"), move |_| {
                let mut c = Client::connect(addr);
                let mut good = 0;
                for r in 0..157 {
                    let n = client * 157 + r;
                    if n >= 10_000 {
                        break;
                    }
                    if n % 10 == 3 {
                        // A malformed one (those that keep the connection open).
                        let (method, path, body, status, _) = &bad[n / 10 % bad.len()];
                        let (s, _) = c.request(method, path, body);
                        if s != *status || !(400..500).contains(&s) {
                            failures.lock().unwrap().push(format!("{path}: {s}"));
                        }
                        continue;
                    }
                    let rows: Vec<usize> = (0..1 + n % 3)
                        .map(|k| (n * 7 + k * 13) % EXAMPLES)
                        .collect();
                    let instances: Vec<Json> = rows.iter().map(|&i| instance(i)).collect();
                    let (s, body) = c.json(
                        "POST",
                        "/v1/models/penguins:predict",
                        &json!({"instances": instances}),
                    );
                    let preds = body["predictions"].as_array().cloned().unwrap_or_default();
                    let right = s == 200
                        && preds.len() == rows.len()
                        && preds
                            .iter()
                            .zip(&rows)
                            .all(|(p, &i)| same_prediction(p, &expected[i]));
                    if right {
                        good += 1;
                    } else {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("request {n}: {s} {body}"));
                    }
                }
                good
            })
            .unwrap()
        })
        .collect();
    let good: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let took = started.elapsed();
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failures, first: {:?}",
        failures.len(),
        failures.first()
    );
    assert_eq!(good, 9_000);
    eprintln!("10,000 requests from 64 clients in {took:?}");
    // The batcher merged them: far fewer forward passes than requests
    // (9,000 good ones of 1 to 3 examples; the warm-up adds a few passes).
    let (_, text) = Client::connect(addr).request("GET", "/metrics", b"");
    let text = String::from_utf8(text).unwrap();
    let metric = |name: &str| -> f64 {
        let key = format!("{name}{{model=\"penguins\",version=\"1\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} not in\n{text}"))
    };
    let (passes, examples) = (
        metric("tfpipe_serve_batch_size_count"),
        metric("tfpipe_serve_batch_size_sum"),
    );
    assert!(examples >= 18_000.0, "{examples} examples");
    assert!(
        passes < 4_500.0,
        "{passes} forward passes for 9,000 requests: not merged"
    );
    eprintln!(
        "{passes} forward passes, {:.1} examples each",
        examples / passes
    );
    server.shutdown().unwrap();
}

/// How long [`Slow`]'s forward pass sleeps: long enough that a request
/// that queued for it is told apart from an immediate 503 even on a loaded
/// 2-core machine (a 30 ms model and a 25 ms bound failed there at 76 ms).
const SLOW_FORWARD: Duration = Duration::from_millis(300);

/// A custom model (through the library API) that takes its time: the
/// classifier's two layers, rebuilt in code.
struct Slow(candle_nn::Linear, candle_nn::Linear);

impl Model for Slow {
    fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor> {
        use candle_core::Module;
        std::thread::sleep(SLOW_FORWARD);
        self.1.forward(&self.0.forward(&batch.features)?.relu()?)
    }
    fn task(&self) -> Task {
        Task::Classification { classes: 3 }
    }
}

#[test]
fn a_full_queue_answers_503_at_once_and_custom_models_serve() {
    let f = fixture();
    let slow =
        ModelSource::new("slow", &f.classifier).loader(Arc::new(|dir: &Path, device: &Device| {
            Predictor::load_with(dir, device, |vb: VarBuilder<'_>, meta| {
                let first = candle_nn::linear(meta.input.inputs(), 16, vb.pp("fc0"))?;
                Ok(Slow(first, candle_nn::linear(16, 3, vb.pp("fc1"))?))
            })
        }));
    let config = ServeConfig {
        batching: BatchOptions {
            max_batch_size: 1,
            batch_timeout: Duration::ZERO,
            max_enqueued_batches: 1,
            enabled: false,
        },
        poll: None,
        ..ServeConfig::default()
    };
    let server = start(vec![slow], config);
    let addr = server.local_addr();
    let codes: Vec<u16> = (0..12)
        .map(|i| {
            tfpipe::spawn::Thread::spawn(format!("client-{i}"), move |_| {
                let mut c = Client::connect(addr);
                let started = Instant::now();
                let (s, _) = c.json(
                    "POST",
                    "/v1/models/slow:predict",
                    &json!({"instances": [instance(i)]}),
                );
                (s, started.elapsed())
            })
            .unwrap()
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| {
            let (s, took) = t.join().unwrap();
            if s == 503 {
                assert!(took < SLOW_FORWARD / 2, "a 503 waited {took:?}");
            }
            s
        })
        .collect();
    assert!(codes.iter().all(|&s| s == 200 || s == 503), "{codes:?}");
    assert!(codes.contains(&503), "{codes:?}");
    assert!(codes.contains(&200), "{codes:?}");
    server.shutdown().unwrap();
}

/// A server of one classifier whose forward passes wait at the returned
/// gate while it is held (it is open at first), batching with `batching`.
fn gated_server(batching: BatchOptions) -> (Server, Arc<Gate>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), &classifier(), 1);
    let gate = Arc::new(Gate::default());
    let model_gate = gate.clone();
    let source =
        ModelSource::new("g", dir.path()).loader(Arc::new(move |dir: &Path, device: &Device| {
            let gate = Some(model_gate.clone());
            Predictor::load_with(dir, device, |vb: VarBuilder<'_>, meta| {
                let first = candle_nn::linear(meta.input.inputs(), 16, vb.pp("fc0"))?;
                Ok(Gated(first, candle_nn::linear(16, 3, vb.pp("fc1"))?, gate))
            })
        }));
    let config = ServeConfig {
        batching,
        poll: None,
        ..ServeConfig::default()
    };
    (start(vec![source], config), gate, dir)
}

/// A number from `/metrics`: the line that starts with `prefix`.
fn metric(addr: SocketAddr, prefix: &str) -> f64 {
    let (s, body) = Client::connect(addr).request("GET", "/metrics", b"");
    assert_eq!(s, 200);
    let text = String::from_utf8(body).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// `batch_timeout` (`--batch-timeout-micros`): a lone request waits for
/// another to share its forward pass, and the two run as one batch. The
/// server's own warm-up requests (one example each, one at a time) do not
/// wait it out: ready comes long before even one timeout.
#[test]
fn batch_timeout_holds_a_request_for_the_next_to_share_its_batch() {
    let started = Instant::now();
    let (server, _gate, _dir) = gated_server(BatchOptions {
        enabled: true,
        max_batch_size: 2,
        // Long beside the 50 ms between the requests (the second fills
        // the batch, which then runs at once), and beside start to ready.
        batch_timeout: Duration::from_secs(20),
        max_enqueued_batches: 4,
    });
    let ready = started.elapsed();
    assert!(
        ready < Duration::from_secs(10),
        "ready after {ready:?}: the warm-up waited out the batch timeout"
    );
    let addr = server.local_addr();
    let batches = || {
        (
            metric(addr, "tfpipe_serve_batch_size_count{model=\"g\""),
            metric(addr, "tfpipe_serve_batch_size_sum{model=\"g\""),
        )
    };
    let before = batches();
    let mut first = Client::connect(addr);
    let mut second = Client::connect(addr);
    let body = serde_json::to_vec(&json!({"instances": [instance(1)]})).unwrap();
    let head = format!(
        "POST /v1/models/g:predict HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    first.stream.write_all(head.as_bytes()).unwrap();
    first.stream.write_all(&body).unwrap();
    // With no timeout this request would be answered well within this.
    std::thread::sleep(Duration::from_millis(50));
    first.stream.set_nonblocking(true).unwrap();
    let waiting = first.stream.peek(&mut [0u8; 1]);
    assert!(
        matches!(&waiting, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the first request was answered alone: {waiting:?}"
    );
    first.stream.set_nonblocking(false).unwrap();
    let (s, body) = second.json(
        "POST",
        "/v1/models/g:predict",
        &json!({"instances": [instance(2)]}),
    );
    assert_eq!(s, 200, "{body}");
    assert_eq!(first.read_response().0, 200);
    let after = batches();
    // One forward pass of two examples.
    assert_eq!((after.0 - before.0, after.1 - before.1), (1.0, 2.0));
    server.shutdown().unwrap();
}

/// `max_enqueued_batches` (`--max-enqueued-batches`): the queue holds that
/// many full batches' worth of examples (3 x 2 here) while the model is
/// busy; the requests past them are answered 503 at once, and the ones
/// queued are answered when the model is free.
#[test]
fn max_enqueued_batches_sets_how_many_examples_wait_before_a_503() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let (server, gate, _dir) = gated_server(BatchOptions {
        enabled: true,
        max_batch_size: 2,
        batch_timeout: Duration::ZERO,
        max_enqueued_batches: 3,
    });
    let addr = server.local_addr();
    gate.hold.store(true, SeqCst);
    // Opened again however the test ends: a failed assertion with the gate
    // held would leave the server's drop waiting on the compute thread.
    let _open = Opens(gate.clone());
    let refused = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let refused = refused.clone();
            tfpipe::spawn::Thread::spawn(format!("client-{i}"), move |_| {
                let (s, _) = Client::connect(addr).json(
                    "POST",
                    "/v1/models/g:predict",
                    &json!({"instances": [instance(i)]}),
                );
                if s == 503 {
                    refused.fetch_add(1, SeqCst);
                }
                s
            })
            .unwrap()
        })
        .collect();
    // A request is counted against the bound until its forward pass ends,
    // and none can end while the gate is held: six are taken, two refused.
    eventually("requests refused", || refused.load(SeqCst) >= 2);
    assert_eq!(metric(addr, "tfpipe_serve_queue_examples{model=\"g\""), 6.0);
    gate.hold.store(false, SeqCst);
    let mut codes: Vec<u16> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    codes.sort();
    assert_eq!(codes, [200, 200, 200, 200, 200, 200, 503, 503]);
    server.shutdown().unwrap();
}

/// Opens its gate when dropped.
struct Opens(Arc<Gate>);

impl Drop for Opens {
    fn drop(&mut self) {
        self.0
            .hold
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A status answer's versions as "VERSION STATE" lines, in its order.
fn version_states(body: &Json) -> Vec<String> {
    body["model_version_status"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s["version"].as_str().unwrap(),
                s["state"].as_str().unwrap()
            )
        })
        .collect()
}

/// Waits until `check` holds, at most 20 s.
fn eventually(what: &str, check: impl Fn() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < Duration::from_secs(20), "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn new_versions_load_warm_and_failed_ones_are_reported_never_served() {
    let base = tempfile::tempdir().unwrap();
    save(
        &tfpipe::serve::next_version_dir(base.path()).unwrap(),
        &classifier(),
        1,
    );
    let events = Arc::new(Mutex::new(Vec::<Event>::new()));
    let sink = events.clone();
    let config = ServeConfig {
        poll: Some(Duration::from_millis(20)),
        events: Some(Arc::new(move |e: &Event| {
            sink.lock().unwrap().push(e.clone())
        })),
        ..ServeConfig::default()
    };
    let server = start(vec![ModelSource::new("p", base.path())], config);
    let mut c = Client::connect(server.local_addr());
    let states = |c: &mut Client| {
        let (_, body) = c.json("GET", "/v1/models/p", &Json::Null);
        version_states(&body)
    };
    assert_eq!(states(&mut c), ["1 AVAILABLE"]);

    // Version 2, with TF Serving's warm-up file written by tfpipe.
    let staging = tempfile::tempdir().unwrap();
    let v2 = staging.path().join("2");
    save(&v2, &classifier(), 5);
    let data = staging.path().join("warm.tfrecord");
    write_examples(&data);
    let (file, records) = tfpipe::serve::write_warmup_file(&v2, &[data], "p").unwrap();
    assert_eq!(records, EXAMPLES);
    assert_eq!(
        tfpipe::serve::read_warmup_file(&file).unwrap().len(),
        EXAMPLES
    );
    std::fs::rename(&v2, base.path().join("2")).unwrap();
    let client = Mutex::new(Client::connect(server.local_addr()));
    eventually("version 2 available and 1 unloaded", || {
        states(&mut client.lock().unwrap()) == ["2 AVAILABLE", "1 END"]
    });
    let (s, _) = c.json(
        "POST",
        "/v1/models/p/versions/2:predict",
        &json!({"instances": [instance(0)]}),
    );
    assert_eq!(s, 200);
    let (s, body) = c.json(
        "POST",
        "/v1/models/p/versions/1:predict",
        &json!({"instances": [instance(0)]}),
    );
    assert_eq!(
        (s, body["error"].as_str().unwrap()),
        (404, "version 1 of model \"p\" is not available (it is END)")
    );

    // Version 3 is damaged: reported, never served; 2 stays.
    let v3 = staging.path().join("3");
    save(&v3, &classifier(), 6);
    let weights = v3.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&weights, bytes).unwrap();
    std::fs::rename(&v3, base.path().join("3")).unwrap();
    eventually("version 3 failed", || {
        states(&mut client.lock().unwrap())
            .first()
            .map(String::as_str)
            == Some("3 END")
    });
    let (_, body) = c.json("GET", "/v1/models/p/versions/3", &Json::Null);
    let message = body["model_version_status"][0]["status"]["error_message"]
        .as_str()
        .unwrap();
    assert!(
        message.contains("model.safetensors is damaged"),
        "{message}"
    );
    let (s, body) = c.json(
        "POST",
        "/v1/models/p:predict",
        &json!({"instances": [instance(0)]}),
    );
    assert_eq!(s, 200, "{body}");
    assert_eq!(states(&mut c), ["3 END", "2 AVAILABLE", "1 END"]);

    let events = events.lock().unwrap();
    let warmed: Vec<&WarmupSource> = events
        .iter()
        .filter_map(|e| match e {
            Event::Available { warmup, .. } => Some(&warmup.source),
            _ => None,
        })
        .collect();
    assert!(matches!(warmed[0], WarmupSource::Generated));
    assert!(matches!(warmed[1], WarmupSource::File(_)), "{warmed:?}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Unloaded { version: 1, .. }))
    );
    drop(events);
    server.shutdown().unwrap();
}

/// Holds [`Gated`]'s forward passes while `hold` is up; `entered` says
/// one has begun.
#[derive(Default)]
struct Gate {
    hold: std::sync::atomic::AtomicBool,
    entered: std::sync::atomic::AtomicBool,
}

/// The classifier's two layers, rebuilt in code, whose forward pass waits
/// at its gate (when it has one) while the gate is held.
struct Gated(candle_nn::Linear, candle_nn::Linear, Option<Arc<Gate>>);

impl Model for Gated {
    fn forward(&self, batch: &BatchTensors) -> candle_core::Result<Tensor> {
        use candle_core::Module;
        use std::sync::atomic::Ordering::SeqCst;
        if let Some(gate) = &self.2 {
            gate.entered.store(gate.hold.load(SeqCst), SeqCst);
            while gate.hold.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.1.forward(&self.0.forward(&batch.features)?.relu()?)
    }
    fn task(&self) -> Task {
        Task::Classification { classes: 3 }
    }
}

/// Issue 17's `UNLOADING`, observed: a newer version takes the traffic
/// while a request is still being computed by the old one, which is then
/// `UNLOADING` (draining) until that request is answered, and only then
/// `END`.
#[test]
fn a_version_with_a_request_in_flight_is_unloading_until_it_is_answered() {
    use std::sync::atomic::Ordering::SeqCst;
    let base = tempfile::tempdir().unwrap();
    save(
        &tfpipe::serve::next_version_dir(base.path()).unwrap(),
        &classifier(),
        1,
    );
    let gate = Arc::new(Gate::default());
    let version_1_gate = gate.clone();
    let source =
        ModelSource::new("g", base.path()).loader(Arc::new(move |dir: &Path, device: &Device| {
            // Only version 1 waits at the gate.
            let gate = (dir.file_name() == Some("1".as_ref())).then(|| version_1_gate.clone());
            Predictor::load_with(dir, device, |vb: VarBuilder<'_>, meta| {
                let first = candle_nn::linear(meta.input.inputs(), 16, vb.pp("fc0"))?;
                Ok(Gated(first, candle_nn::linear(16, 3, vb.pp("fc1"))?, gate))
            })
        }));
    let config = ServeConfig {
        poll: Some(Duration::from_millis(20)),
        ..ServeConfig::default()
    };
    let server = start(vec![source], config);
    let addr = server.local_addr();
    let states = || {
        let (_, body) = Client::connect(addr).json("GET", "/v1/models/g", &Json::Null);
        version_states(&body)
    };
    assert_eq!(states(), ["1 AVAILABLE"]);

    // A request held inside version 1's forward pass.
    gate.hold.store(true, SeqCst);
    let in_flight = tfpipe::spawn::Thread::spawn("client-in-flight", move |_| {
        Client::connect(addr).json(
            "POST",
            "/v1/models/g/versions/1:predict",
            &json!({"instances": [instance(0)]}),
        )
    })
    .unwrap();
    eventually("the request inside version 1", || gate.entered.load(SeqCst));

    // Version 2 arrives, warms up (its model has no gate) and takes the
    // traffic; version 1 drains.
    let staging = tempfile::tempdir().unwrap();
    save(&staging.path().join("2"), &classifier(), 2);
    std::fs::rename(staging.path().join("2"), base.path().join("2")).unwrap();
    eventually("version 2 available, 1 unloading", || {
        states() == ["2 AVAILABLE", "1 UNLOADING"]
    });
    let (s, _) = Client::connect(addr).json(
        "POST",
        "/v1/models/g:predict",
        &json!({"instances": [instance(0)]}),
    );
    assert_eq!(s, 200);
    // Several polls later it still drains: the request is not answered.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(states(), ["2 AVAILABLE", "1 UNLOADING"]);
    assert!(!in_flight.is_finished());

    // Released: the request is answered by version 1, which then ends.
    gate.hold.store(false, SeqCst);
    let (s, body) = in_flight.join().unwrap();
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["predictions"].as_array().unwrap().len(), 1);
    eventually("version 1 ended", || states() == ["2 AVAILABLE", "1 END"]);
    server.shutdown().unwrap();
}

/// TF Serving's version labels: `/v1/models/NAME/labels/LABEL`, and a
/// labelled version stays loaded when a newer one arrives.
#[test]
fn version_labels_route_to_their_versions_and_keep_them_loaded() {
    let base = tempfile::tempdir().unwrap();
    for seed in [1, 2] {
        save(
            &tfpipe::serve::next_version_dir(base.path()).unwrap(),
            &classifier(),
            seed,
        );
    }
    let source = ModelSource::new("p", base.path())
        .label("stable", 1)
        .label("canary", 2)
        .label("next", 9);
    let config = ServeConfig {
        poll: Some(Duration::from_millis(20)),
        ..ServeConfig::default()
    };
    let server = start(vec![source], config);
    let mut c = Client::connect(server.local_addr());
    let probabilities = |c: &mut Client, path: &str| {
        let (s, body) = c.json("POST", path, &json!({"instances": [instance(3)]}));
        assert_eq!(s, 200, "{path}: {body}");
        body["predictions"][0]["probabilities"].clone()
    };
    let states = |c: &mut Client| {
        let (_, body) = c.json("GET", "/v1/models/p", &Json::Null);
        version_states(&body)
    };
    eventually("the labelled version 1 loaded", || {
        states(&mut Client::connect(server.local_addr())) == ["2 AVAILABLE", "1 AVAILABLE"]
    });
    let v1 = probabilities(&mut c, "/v1/models/p/versions/1:predict");
    let v2 = probabilities(&mut c, "/v1/models/p/versions/2:predict");
    assert_ne!(
        v1, v2,
        "the two versions must differ for the test to mean anything"
    );
    assert_eq!(
        probabilities(&mut c, "/v1/models/p/labels/stable:predict"),
        v1
    );
    assert_eq!(
        probabilities(&mut c, "/v1/models/p/labels/canary:predict"),
        v2
    );
    assert_eq!(probabilities(&mut c, "/v1/models/p:predict"), v2);
    let (s, body) = c.json("GET", "/v1/models/p/labels/stable/metadata", &Json::Null);
    assert_eq!(
        (s, &body["model_spec"]["version"]),
        (200, &json!("1")),
        "{body}"
    );
    // TF Serving's status endpoint ignores the label (GetModelStatusImpl::
    // GetModelStatusWithModelSpec reads only a version number): every
    // version of the model, for a label it has or not.
    for label in ["stable", "canary", "beta"] {
        let path = format!("/v1/models/p/labels/{label}");
        let (s, body) = c.json("GET", &path, &Json::Null);
        assert_eq!(s, 200, "{path}: {body}");
        assert_eq!(body, c.json("GET", "/v1/models/p", &Json::Null).1, "{path}");
        assert_eq!(
            body["model_version_status"].as_array().unwrap().len(),
            2,
            "{path}: {body}"
        );
    }
    let (s, body) = c.json(
        "POST",
        "/v1/models/p/labels/beta:predict",
        &json!({"instances": [instance(3)]}),
    );
    // TF Serving's code: its label lookup fails with InvalidArgument, which
    // its REST server answers 400 (server_core.cc, http_server.cc).
    assert_eq!(s, 400);
    assert_eq!(
        body["error"],
        "Unrecognized servable version label: beta (model \"p\" has labels: \"canary\", \"next\", \"stable\")"
    );
    // A label asked of a model this server does not have: TF Serving
    // resolves the label before it looks the model up (ServerCore::
    // ServableRequestFromModelSpec -> GetModelVersionForLabel, which
    // answers InvalidArgument for a model with no such label, known or
    // not), so :predict, :classify, :regress and metadata are 400. Its
    // status endpoint ignores labels: an unknown model is its 404 there.
    for (method, path) in [
        ("POST", "/v1/models/nope/labels/stable:predict"),
        ("POST", "/v1/models/nope/labels/stable:classify"),
        ("GET", "/v1/models/nope/labels/stable/metadata"),
    ] {
        let (s, body) = c.json(method, path, &json!({"instances": [instance(3)]}));
        assert_eq!(s, 400, "{path}: {body}");
        assert_eq!(
            body["error"],
            "Unrecognized servable version label: stable (model \"nope\" not found (this server has \"p\"))",
            "{path}"
        );
    }
    let (s, body) = c.json("GET", "/v1/models/nope/labels/stable", &Json::Null);
    assert_eq!(s, 404, "{body}");
    // A label of a version not in the directory: the version's 404.
    let (s, body) = c.json(
        "POST",
        "/v1/models/p/labels/next:predict",
        &json!({"instances": [instance(3)]}),
    );
    assert_eq!(
        (s, body["error"].as_str().unwrap()),
        (404, "model \"p\" has no version 9")
    );

    // Version 3 arrives: 2 (canary) and 1 (stable) stay available.
    let staging = tempfile::tempdir().unwrap();
    save(&staging.path().join("3"), &classifier(), 3);
    std::fs::rename(staging.path().join("3"), base.path().join("3")).unwrap();
    eventually("version 3 available beside the labelled ones", || {
        states(&mut Client::connect(server.local_addr()))
            == ["3 AVAILABLE", "2 AVAILABLE", "1 AVAILABLE"]
    });
    assert_eq!(
        probabilities(&mut c, "/v1/models/p/labels/canary:predict"),
        v2
    );
    assert_eq!(
        probabilities(&mut c, "/v1/models/p/labels/stable:predict"),
        v1
    );
    assert_ne!(probabilities(&mut c, "/v1/models/p:predict"), v2);
    server.shutdown().unwrap();
}

/// `--version-label` is checked before the server starts.
#[test]
fn version_label_flags_that_cannot_work_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, want) in [
        ("p=1", "expected NAME:LABEL=VERSION"),
        ("q:stable=1", "no --model is named \"q\""),
        ("p:sta/ble=1", "the label must be letters"),
        ("p:stable=+1", "\"+1\" is not a version number"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tfpipe"))
            .args(["serve", "--port", "0", "--model"])
            .arg(format!("p={}", dir.path().display()))
            .args(["--version-label", flag])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: accepted");
        assert!(stderr.contains(want), "{flag}: {stderr}");
    }
}

/// `tfpipe serve --write-warmup DIR --warmup-data FILES` writes TF
/// Serving's file where TF Serving looks for it, one predict log per
/// record, and says so; data that cannot be found is an error naming the
/// flag, with nothing written.
#[test]
fn serve_write_warmup_writes_tf_servings_file_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("warm.tfrecord");
    write_examples(&data);
    let version = dir.path().join("models").join("1");
    save(&version, &classifier(), 5);
    let write = |data: &Path| {
        Command::new(env!("CARGO_BIN_EXE_tfpipe"))
            .args(["serve", "--model"])
            .arg(format!("p={}", dir.path().join("models").display()))
            .arg("--write-warmup")
            .arg(&version)
            .arg("--warmup-data")
            .arg(data)
            .output()
            .unwrap()
    };
    let file = version
        .join("assets.extra")
        .join("tf_serving_warmup_requests");

    let missing = write(&dir.path().join("nothing-*.tfrecord"));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success(), "accepted a missing file");
    assert!(stderr.contains("--warmup-data"), "{stderr}");
    assert!(!file.exists(), "a file was written from no data");

    let out = write(&data);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("wrote {EXAMPLES} warm-up requests")),
        "{stdout}"
    );
    assert_eq!(
        tfpipe::serve::read_warmup_file(&file).unwrap().len(),
        EXAMPLES
    );
}

#[test]
fn tf_serving_api_warmup_files_replay() {
    // Written by scripts/serve_warmup_interop.py with tensorflow-serving-api.
    let path = Path::new("testdata/serve/tf_serving_warmup_requests");
    let logs = tfpipe::serve::read_warmup_file(path).unwrap();
    assert_eq!(logs.len(), 3, "predict, classify and regress logs");
    let sig = tfpipe::serve::Signature::from_meta(&meta(&classifier())).unwrap();
    let rows: Vec<usize> = logs
        .iter()
        .map(|log| {
            tfpipe::serve::warmup_log_to_batch(log, &sig, 64)
                .unwrap()
                .num_rows
        })
        .collect();
    assert_eq!(rows, [2, 2, 1]);
    let batch = tfpipe::serve::warmup_log_to_batch(&logs[0], &sig, 64).unwrap();
    assert_eq!(
        batch.column("x").unwrap().values,
        tfpipe::batch::Values::Float32(vec![0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
    );
    assert_eq!(
        batch.column("img").unwrap().values,
        tfpipe::batch::Values::Uint8(vec![1, 2, 3, 4])
    );
    assert_eq!(
        batch.column("n").unwrap().values,
        tfpipe::batch::Values::Int64(vec![4, 5])
    );
}

#[cfg(unix)]
#[test]
fn sigterm_answers_the_request_in_flight_and_exits_0() {
    let f = fixture();
    let (mut child, mut stderr, addr, log) = serve_cli(&[
        "--model".into(),
        format!("penguins={}", f.classifier.display()),
        // `--model` repeats: a second model beside the first.
        "--model".into(),
        format!("mass={}", f.regressor.display()),
        // TF Serving's batching flags reach the batcher.
        "--max-batch-size".into(),
        "4".into(),
        "--batch-timeout-micros".into(),
        "500".into(),
        "--max-enqueued-batches".into(),
        "2".into(),
    ]);
    // Bound to the loopback unless --host says otherwise.
    assert!(addr.ip().is_loopback(), "{addr}");
    let mut c = Client::connect(addr);
    assert_eq!(c.json("GET", "/v2/health/ready", &Json::Null).0, 200);
    let (s, reply) = c.json(
        "POST",
        "/v1/models/mass:predict",
        &json!({"instances": (0..5).map(instance).collect::<Vec<_>>()}),
    );
    assert_eq!(
        (s, reply["error"].as_str().unwrap()),
        (
            400,
            "instances: 5 examples; the server takes at most 4 per request (its maximum batch size)"
        )
    );
    let (s, reply) = c.json(
        "POST",
        "/v1/models/mass:predict",
        &json!({"instances": [instance(5)]}),
    );
    assert_eq!(s, 200, "{reply}");
    assert!(same_prediction(
        &reply["predictions"][0],
        &f.expected_values[5]
    ));
    // A request in flight: its head and half its body sent, then SIGTERM.
    let body = serde_json::to_vec(&json!({"instances": [instance(5)]})).unwrap();
    let head = format!(
        "POST /v1/models/penguins:predict HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.stream.write_all(head.as_bytes()).unwrap();
    c.stream.write_all(&body[..10]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let killed = Command::new("kill")
        .arg("-TERM")
        .arg(child.0.id().to_string())
        .status()
        .unwrap();
    assert!(killed.success());
    std::thread::sleep(Duration::from_millis(100));
    c.stream.write_all(&body[10..]).unwrap();
    let (s, reply) = c.read_response();
    let reply: Json = serde_json::from_slice(&reply).unwrap();
    assert_eq!(s, 200, "{reply}");
    assert!(same_prediction(&reply["predictions"][0], &f.expected[5]));
    let status = child.0.wait().unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{status}\n{log}{rest}");
    assert!(rest.contains("stopped"), "{rest}");
    // Nothing listens any more.
    assert!(TcpStream::connect(addr).is_err());
}

/// A `tfpipe serve` process, killed if the test ends before it does (a
/// failed assertion must not leave a server running).
struct CliServer(std::process::Child);

impl Drop for CliServer {
    fn drop(&mut self) {
        // An error: it has exited already.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tfpipe serve --port 0 ARGS`, read until it is listening and ready:
/// the process, the rest of its stderr, its address and its log so far.
fn serve_cli(
    args: &[String],
) -> (
    CliServer,
    BufReader<std::process::ChildStderr>,
    SocketAddr,
    String,
) {
    let mut child = CliServer(
        Command::new(env!("CARGO_BIN_EXE_tfpipe"))
            .args(["serve", "--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = BufReader::new(child.0.stderr.take().unwrap());
    let mut log = String::new();
    let mut addr = None;
    // The ready line may come before the listening line (another thread prints it).
    while !log.contains(" ready ") || addr.is_none() {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            panic!("tfpipe serve ended before it was ready:\n{log}");
        }
        if let Some(a) = line
            .trim()
            .strip_prefix("tfpipe serve: listening on http://")
        {
            addr = Some(a.parse::<SocketAddr>().unwrap());
        }
        log.push_str(&line);
    }
    (child, stderr, addr.unwrap(), log)
}

/// `tfpipe serve --poll-seconds` from the command line: a version written
/// into the base directory while the server runs is loaded and served.
/// (That the flag's value becomes the library's interval is the unit test
/// in `src/cli/serve.rs`; `--poll-seconds 0` never polls.)
#[cfg(unix)]
#[test]
fn serve_poll_seconds_picks_up_a_new_version_from_the_command_line() {
    let base = tempfile::tempdir().unwrap();
    save(&base.path().join("1"), &classifier(), 1);
    let (_server, _stderr, addr, _log) = serve_cli(&[
        "--model".into(),
        format!("m={}", base.path().display()),
        "--poll-seconds".into(),
        "0.05".into(),
    ]);
    let mut c = Client::connect(addr);
    let served = |c: &mut Client| {
        let (s, body) = c.json("GET", "/v1/models/m/metadata", &Json::Null);
        assert_eq!(s, 200, "{body}");
        body["model_spec"]["version"].as_str().unwrap().to_string()
    };
    assert_eq!(served(&mut c), "1");
    // Written aside and renamed in, as `tfpipe train --save-versions` does.
    let staging = tempfile::tempdir().unwrap();
    save(&staging.path().join("2"), &classifier(), 2);
    std::fs::rename(staging.path().join("2"), base.path().join("2")).unwrap();
    eventually("version 2 served", || {
        served(&mut Client::connect(addr)) == "2"
    });
    let (s, body) = c.json("GET", "/v1/models/m/versions/2", &Json::Null);
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["model_version_status"][0]["state"], "AVAILABLE");
    let (s, body) = c.json(
        "POST",
        "/v1/models/m:predict",
        &json!({"instances": [instance(3)]}),
    );
    assert_eq!(s, 200, "{body}");
}

/// `tfpipe train --save-versions` writes numbered versions a server picks up.
#[test]
fn train_save_versions_writes_numbered_versions() {
    let dir = tempfile::tempdir().unwrap();
    let tfpipe = || Command::new(env!("CARGO_BIN_EXE_tfpipe"));
    let prefix = dir.path().join("penguins");
    let out = tfpipe()
        .args([
            "convert",
            "csv",
            "testdata/tabular/penguins.csv",
            "--label",
            "species",
            "--output",
        ])
        .arg(&prefix)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let base = dir.path().join("models");
    for _ in 0..2 {
        let out = tfpipe()
            .arg("train")
            .arg("--schema")
            .arg(dir.path().join("penguins.features.json"))
            .arg("--data")
            .arg(format!("{}-*", prefix.display()))
            .args(["--epochs", "1", "--impute", "mean", "--hidden", "8"])
            .arg("--save-versions")
            .arg(&base)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for v in ["1", "2"] {
        assert!(
            base.join(v).join("checkpoint.json").is_file(),
            "no version {v}"
        );
    }
    let server = start(
        vec![ModelSource::new("penguins", &base)],
        ServeConfig::default(),
    );
    let mut c = Client::connect(server.local_addr());
    let (s, body) = c.json("GET", "/v1/models/penguins", &Json::Null);
    assert_eq!(s, 200);
    assert_eq!(body["model_version_status"][0]["version"], "2");
    server.shutdown().unwrap();
}

/// A model trained with `--impute` fills a feature a request leaves out
/// the way training and `tfpipe predict` do (its mean, with the missing
/// indicator set), where it used to answer 400 ("it has no default").
#[test]
fn a_feature_left_out_is_imputed_as_predict_imputes_it() {
    let dir = tempfile::tempdir().unwrap();
    // x (3), img (2), n (1), and n's missing indicator.
    let config = ModelConfig::Mlp {
        inputs: 7,
        hidden: vec![16],
        classes: 3,
    };
    let mut meta = meta(&config);
    meta.input.impute = Some(Imputation {
        fill: Impute::Mean,
        features: vec!["n".into()],
    });
    // As training records it: no input keeps its schema default.
    for f in &mut meta.schema.as_mut().unwrap().features {
        f.default = None;
    }
    let ck = dir.path().join("imputed");
    let (_, varmap) = BuiltinModel::init(config, 5, &Device::Cpu).unwrap();
    Checkpoint::save(&ck, &varmap, None, &meta).unwrap();
    // Every other record lacks `n`.
    let lacks_n = |i: usize| i % 2 == 1;
    let data = dir.path().join("data.tfrecord");
    let mut w = FileRecordWriter::create(&data, Compression::None).unwrap();
    for i in 0..8 {
        let mut e = example(i);
        if lacks_n(i) {
            e.features.as_mut().unwrap().feature.remove("n");
        }
        w.write_record(&e.encode_to_vec()).unwrap();
    }
    w.finish().unwrap();
    let expected = predict_cli(&ck, &data);
    assert_eq!(expected.len(), 8);

    let server = start(
        vec![ModelSource::new("imputed", &ck)],
        ServeConfig::default(),
    );
    let mut c = Client::connect(server.local_addr());
    let rows: Vec<Json> = (0..8)
        .map(|i| {
            let mut row = instance(i);
            if lacks_n(i) {
                row.as_object_mut().unwrap().remove("n");
            }
            row
        })
        .collect();
    let (s, body) = c.json(
        "POST",
        "/v1/models/imputed:predict",
        &json!({"instances": rows}),
    );
    assert_eq!(s, 200, "{body}");
    let got = body["predictions"].as_array().unwrap();
    for (i, want) in expected.iter().enumerate() {
        assert!(same_prediction(&got[i], want), "{i}: {} vs {want}", got[i]);
    }
    // The indicator is set: a row without `n` is not the row with n at its mean.
    let mut at_mean = instance(1);
    at_mean["n"] = json!(4);
    let (s, body) = c.json(
        "POST",
        "/v1/models/imputed:predict",
        &json!({"instances": [at_mean]}),
    );
    assert_eq!(s, 200, "{body}");
    assert!(
        !same_prediction(&body["predictions"][0], &expected[1]),
        "{body}"
    );
    server.shutdown().unwrap();
}

/// A version is `LOADING` (and the server not ready, its requests 503)
/// until its load and warm-up are done; then it is `AVAILABLE`, warmed
/// from `warmup_data` (`--warmup-data`) at every batch size the batcher
/// can form.
#[test]
fn a_version_is_loading_and_not_ready_until_warmed_from_warmup_data() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("p");
    save(&checkpoint, &classifier(), 1);
    let data = dir.path().join("warm.tfrecord");
    write_examples(&data);
    let (release_tx, released) = crossbeam_channel::bounded::<()>(0);
    let source =
        ModelSource::new("p", &checkpoint).loader(Arc::new(move |dir: &Path, device: &Device| {
            let _ = released.recv();
            Predictor::load(dir, device)
        }));
    let events = Arc::new(Mutex::new(Vec::<Event>::new()));
    let sink = events.clone();
    let batching = BatchOptions {
        max_batch_size: 8,
        ..BatchOptions::default()
    };
    let server = Server::start(
        ServeConfig {
            addr: "127.0.0.1:0".into(),
            connections: 4,
            poll: None,
            batching,
            warmup_data: vec![data],
            events: Some(Arc::new(move |e: &Event| {
                sink.lock().unwrap().push(e.clone())
            })),
            ..ServeConfig::default()
        },
        vec![source],
    )
    .unwrap();
    // Declared after the server, so dropped before it if an assertion
    // fails: the loader then returns and the server's drop can join.
    let release = release_tx;
    let mut c = Client::connect(server.local_addr());
    // The manager lists the version once it has found it in the directory;
    // the loader then holds it LOADING until released.
    let client = Mutex::new(Client::connect(server.local_addr()));
    eventually("version 1 LOADING", || {
        let (s, body) = client
            .lock()
            .unwrap()
            .json("GET", "/v1/models/p", &Json::Null);
        s == 200 && body["model_version_status"][0]["state"] == "LOADING"
    });
    let (_, body) = c.json("GET", "/v1/models/p", &Json::Null);
    assert_eq!(body["model_version_status"][0]["version"], "1", "{body}");
    assert_eq!(c.json("GET", "/v2/health/live", &Json::Null).0, 200);
    assert_eq!(c.json("GET", "/v2/health/ready", &Json::Null).0, 503);
    assert_eq!(c.json("GET", "/v2/models/p/ready", &Json::Null).0, 503);
    let (s, _) = c.json(
        "POST",
        "/v1/models/p:predict",
        &json!({"instances": [instance(0)]}),
    );
    assert_eq!(s, 503);
    assert!(!server.is_ready());

    release.send(()).unwrap();
    assert!(server.wait_ready(Duration::from_secs(30)));
    assert_eq!(c.json("GET", "/v2/health/ready", &Json::Null).0, 200);
    let (_, body) = c.json("GET", "/v1/models/p", &Json::Null);
    assert_eq!(body["model_version_status"][0]["state"], "AVAILABLE");
    let warmup = events
        .lock()
        .unwrap()
        .iter()
        .find_map(|e| match e {
            Event::Available { warmup, .. } => Some(warmup.clone()),
            _ => None,
        })
        .expect("an Available event");
    assert_eq!(warmup.source, WarmupSource::Data);
    assert_eq!(warmup.passes, batching.warmup_sizes().len());
    assert_eq!(batching.warmup_sizes(), [1, 2, 4, 8]);
    server.shutdown().unwrap();
}
