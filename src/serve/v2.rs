//! The Open Inference Protocol (KServe v2, Triton) under `/v2`: server
//! metadata, liveness and readiness, model metadata and readiness, and
//! `infer` with its tensor JSON.
//!
//! Readiness means what a load balancer needs: `/v2/health/ready` is 200
//! only once every model has a version loaded and warmed; before (and for
//! a model whose every version failed) it is 503.
//!
//! Outputs: a classifier gives `class` (INT64 `[n]`), `class_name` (BYTES
//! `[n]`, when the checkpoint recorded class names) and `probabilities`
//! (FP32 `[n, classes]`); a regressor gives `value` (FP32 `[n]`).

use serde::Serialize;
use serde_json::{Map, Value as Json, json};

use crate::train::{Outputs, Task};

use super::ApiError;
use super::http::Response;
use super::input::{TensorInput, tensors_to_batch};
use super::rest::parse_version;
use super::server::{Shared, json_object, ok_json, short};
use super::versions::Version;

/// Routes `path` (after `/v2`).
pub(crate) fn route(
    shared: &Shared,
    method: &str,
    path: &str,
    body: &[u8],
) -> (Response, Option<(String, String)>) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (name, version, action) = match parts.as_slice() {
        [""] => {
            let r = shared.get(method, || {
                ok_json(&json!({"name": "tfpipe", "version": env!("CARGO_PKG_VERSION"), "extensions": []}))
            });
            return (r, None);
        }
        ["health", "live"] => {
            return (shared.get(method, || ok_json(&json!({"live": true}))), None);
        }
        ["health", "ready"] => {
            let r = shared.get(method, || {
                let ready = shared.is_ready();
                let body = serde_json::to_vec(&json!({ "ready": ready })).unwrap_or_default();
                Ok(Response::json(if ready { 200 } else { 503 }, body))
            });
            return (r, None);
        }
        ["models", name] => (*name, None, ""),
        ["models", name, action @ ("ready" | "infer")] => (*name, None, *action),
        ["models", name, "versions", v] => (*name, Some(*v), ""),
        ["models", name, "versions", v, action @ ("ready" | "infer")] => (*name, Some(*v), *action),
        _ => {
            let e = ApiError::not_found(format!("no endpoint /v2{}", short(path)));
            return (Response::error(&e), None);
        }
    };
    let mut labels = Some((name.to_string(), version.unwrap_or("").to_string()));
    let result = parse_version(version).and_then(|version| {
        let model = shared.model(name)?;
        match action {
            "ready" => Ok(shared.get(method, || {
                let ready = model.serving(version).is_ok();
                let body =
                    serde_json::to_vec(&json!({"name": name, "ready": ready})).unwrap_or_default();
                Ok(Response::json(if ready { 200 } else { 503 }, body))
            })),
            "infer" => {
                if method != "POST" {
                    return Err(ApiError::new(405, format!("{method}: infer takes POST")));
                }
                let v = model.serving(version)?;
                if let Some((_, label)) = labels.as_mut() {
                    *label = v.number.to_string();
                }
                infer(shared, &model.name, &v, body)
            }
            _ => Ok(shared.get(method, || {
                let v = model.serving(version)?;
                metadata(&model.name, &v)
            })),
        }
    });
    (result.unwrap_or_else(|e| Response::error(&e)), labels)
}

/// `GET /v2/models/NAME[/versions/V]`.
fn metadata(name: &str, v: &Version) -> Result<Response, ApiError> {
    let inputs: Vec<Json> = v
        .signature
        .inputs
        .iter()
        .map(|f| {
            let mut shape = vec![-1i64];
            if f.var {
                shape.push(-1);
            } else {
                shape.extend(f.shape.iter().map(|&d| d as i64));
            }
            json!({"name": f.name, "datatype": f.v2_dtype(), "shape": shape})
        })
        .collect();
    let outputs: Vec<Json> = match v.signature.task {
        Task::Classification { classes } => {
            let mut out = vec![json!({"name": "class", "datatype": "INT64", "shape": [-1]})];
            if v.signature.class_names.is_some() {
                out.push(json!({"name": "class_name", "datatype": "BYTES", "shape": [-1]}));
            }
            out.push(json!({"name": "probabilities", "datatype": "FP32", "shape": [-1, classes]}));
            out
        }
        Task::Regression => vec![json!({"name": "value", "datatype": "FP32", "shape": [-1]})],
    };
    ok_json(&json!({
        "name": name,
        "versions": [v.number.to_string()],
        "platform": "tfpipe",
        "inputs": inputs,
        "outputs": outputs,
    }))
}

/// An output tensor of the response.
#[derive(Serialize)]
struct OutputTensor<'a> {
    name: &'static str,
    datatype: &'static str,
    shape: Vec<usize>,
    data: Data<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Data<'a> {
    Ints(&'a [u32]),
    Floats(&'a [f32]),
    Names(Vec<&'a str>),
}

#[derive(Serialize)]
struct InferBody<'a> {
    model_name: &'a str,
    model_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a Json>,
    outputs: Vec<OutputTensor<'a>>,
}

/// `POST /v2/models/NAME[/versions/V]/infer`.
fn infer(shared: &Shared, name: &str, v: &Version, body: &[u8]) -> Result<Response, ApiError> {
    let body = json_object(body)?;
    let allowed = ["id", "parameters", "inputs", "outputs"];
    if let Some(key) = body.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown field {:?} (an infer request has id, parameters, inputs, outputs)",
            short(key)
        )));
    }
    let Some(Json::Array(inputs)) = body.get("inputs") else {
        return Err(ApiError::bad_request("inputs: expected a list of tensors"));
    };
    let tensors = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| tensor_input(v, i, t))
        .collect::<Result<Vec<_>, _>>()?;
    let wanted = requested_outputs(&body, v)?;
    let batch = tensors_to_batch(
        &v.signature,
        &tensors,
        shared.config.batching.max_batch_size,
    )?;
    let outputs = shared.infer(v, batch)?;
    let names = v.signature.class_names.as_deref();
    let mut tensors = Vec::new();
    match &outputs {
        Outputs::Classes {
            ids,
            probabilities,
            classes,
        } => {
            let n = ids.len();
            tensors.push(OutputTensor {
                name: "class",
                datatype: "INT64",
                shape: vec![n],
                data: Data::Ints(ids),
            });
            if let Some(names) = names {
                let data = ids
                    .iter()
                    .map(|&c| names.get(c as usize).map_or("", String::as_str))
                    .collect();
                tensors.push(OutputTensor {
                    name: "class_name",
                    datatype: "BYTES",
                    shape: vec![n],
                    data: Data::Names(data),
                });
            }
            tensors.push(OutputTensor {
                name: "probabilities",
                datatype: "FP32",
                shape: vec![n, *classes],
                data: Data::Floats(probabilities),
            });
        }
        Outputs::Values(values) => tensors.push(OutputTensor {
            name: "value",
            datatype: "FP32",
            shape: vec![values.len()],
            data: Data::Floats(values),
        }),
    }
    if let Some(wanted) = wanted {
        tensors.retain(|t| wanted.iter().any(|w| w == t.name));
    }
    ok_json(&InferBody {
        model_name: name,
        model_version: v.number.to_string(),
        id: body.get("id"),
        outputs: tensors,
    })
}

/// One entry of `inputs`: its feature, examples and data, checked.
fn tensor_input<'a>(v: &Version, i: usize, t: &'a Json) -> Result<TensorInput<'a>, ApiError> {
    let path = format!("inputs[{i}]");
    let bad = |what: String| ApiError::bad_request(format!("{path}.{what}"));
    let Json::Object(t) = t else {
        return Err(ApiError::bad_request(format!(
            "{path}: expected an object (name, shape, datatype, data)"
        )));
    };
    let name = match t.get("name") {
        Some(Json::String(n)) => n,
        _ => return Err(bad("name: missing (a string)".into())),
    };
    let sig = &v.signature;
    let Some(feature) = sig.inputs.iter().position(|f| &f.name == name) else {
        return Err(bad(format!(
            "name: unknown input {:?} (the model takes {})",
            short(name),
            sig.input_names()
        )));
    };
    let f = &sig.inputs[feature];
    match t.get("datatype") {
        Some(Json::String(d)) if d == f.v2_dtype() => {}
        Some(Json::String(d)) => {
            return Err(bad(format!(
                "datatype: {:?}; input {:?} is {}",
                short(d),
                f.name,
                f.v2_dtype()
            )));
        }
        _ => return Err(bad("datatype: missing (a string such as \"FP32\")".into())),
    }
    let shape: Vec<u64> = match t.get("shape") {
        Some(Json::Array(dims)) => dims
            .iter()
            .map(|d| d.as_u64())
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| bad("shape: expected whole numbers, 0 or more".into()))?,
        _ => return Err(bad("shape: missing (a list such as [1, 784])".into())),
    };
    let Some((&rows, rest)) = shape.split_first() else {
        return Err(bad(
            "shape: empty; the first dimension is the examples".into()
        ));
    };
    let inner: u128 = rest.iter().map(|&d| u128::from(d)).product();
    if !f.var && inner != f.width() as u128 {
        return Err(bad(format!(
            "shape: {shape:?}; input {:?} takes [n, {}]",
            f.name,
            f.shape
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let data = t.get("data").ok_or_else(|| bad("data: missing".into()))?;
    Ok(TensorInput {
        feature,
        rows: usize::try_from(rows).unwrap_or(usize::MAX),
        data,
        path,
    })
}

/// The names in `outputs`, when the request filters them.
fn requested_outputs(
    body: &Map<String, Json>,
    v: &Version,
) -> Result<Option<Vec<String>>, ApiError> {
    let Some(list) = body.get("outputs") else {
        return Ok(None);
    };
    let Json::Array(list) = list else {
        return Err(ApiError::bad_request(
            "outputs: expected a list of {\"name\": ...}",
        ));
    };
    let known: &[&str] = match v.signature.task {
        Task::Classification { .. } => &["class", "class_name", "probabilities"],
        Task::Regression => &["value"],
    };
    let mut names = Vec::new();
    for (i, o) in list.iter().enumerate() {
        match o.get("name").and_then(Json::as_str) {
            Some(n) if known.contains(&n) => names.push(n.to_string()),
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "outputs[{i}].name: unknown output {:?} (the model gives {})",
                    short(n),
                    known.join(", ")
                )));
            }
            None => return Err(ApiError::bad_request(format!("outputs[{i}].name: missing"))),
        }
    }
    Ok(Some(names))
}
