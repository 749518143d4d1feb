//! TF Serving's REST API under `/v1/models/`: status, metadata, predict
//! (row and columnar forms), classify and regress.
//!
//! Outputs: a classifier's prediction is `{"class", "class_name" (when the
//! checkpoint recorded class names), "probabilities"}`, the keys of
//! `tfpipe predict`'s lines; a regressor has the one output `value`, which
//! TF Serving writes bare (`"predictions": [21.4, ...]`). `:classify`
//! answers each example with every class as `[label, score]` (the label is
//! the class name, or the class id as text); `:regress` with the value.

use serde::Serialize;
use serde_json::{Map, Value as Json, json};

use crate::train::{Outputs, Task};

use super::ApiError;
use super::http::Response;
use super::input::{Signature, check_context, columns_to_batch, rows_to_batch};
use super::server::{Shared, json_object, ok_json, short};
use super::versions::{Model, State};

/// Routes `rest` (the path after `/v1/models/`).
pub(crate) fn route(
    shared: &Shared,
    method: &str,
    rest: &str,
    body: &[u8],
) -> (Response, Option<(String, String)>) {
    let (target, verb) = match rest.split_once(':') {
        Some((target, verb)) => (target, Some(verb)),
        None => (rest, None),
    };
    let parts: Vec<&str> = target.split('/').collect();
    let (name, pick, metadata) = match parts.as_slice() {
        [name] => (*name, Pick::Newest, false),
        [name, "metadata"] => (*name, Pick::Newest, true),
        [name, "versions", v] => (*name, Pick::Number(v), false),
        [name, "versions", v, "metadata"] => (*name, Pick::Number(v), true),
        [name, "labels", l] => (*name, Pick::Label(l), false),
        [name, "labels", l, "metadata"] => (*name, Pick::Label(l), true),
        _ => {
            let e = ApiError::not_found(format!("no endpoint /v1/models/{}", short(rest)));
            return (Response::error(&e), None);
        }
    };
    let status_request = verb.is_none() && !metadata;
    let resolved = pick_version(shared, name, pick, status_request);
    let labels = Some((
        name.to_string(),
        match (&resolved, pick) {
            (Ok(Some(n)), _) => n.to_string(),
            (_, Pick::Number(v)) => v.to_string(),
            _ => String::new(),
        },
    ));
    let result = resolved.and_then(|version| {
        let model = shared.model(name)?;
        match (verb, metadata) {
            (None, false) => Ok(shared.get(method, || status(model, version))),
            (None, true) => Ok(shared.get(method, || metadata_of(model, version))),
            (Some(verb), false) => {
                if method != "POST" {
                    return Err(ApiError::new(405, format!("{method}: :{verb} takes POST")));
                }
                let v = model.serving(version)?;
                match verb {
                    "predict" => predict(shared, &v, body),
                    "classify" => classify(shared, &v, body, Task::Classification { classes: 0 }),
                    "regress" => classify(shared, &v, body, Task::Regression),
                    other => Err(ApiError::not_found(format!(
                        "no method :{} (there are :predict, :classify and :regress)",
                        short(other)
                    ))),
                }
            }
            (Some(_), true) => Err(ApiError::not_found("no method on /metadata")),
        }
    });
    let labels = match (&result, labels) {
        // The version that answered.
        (Ok(_), Some((name, v))) if v.is_empty() => {
            let v = served_version(shared, &name);
            Some((name, v))
        }
        (_, labels) => labels,
    };
    (result.unwrap_or_else(|e| Response::error(&e)), labels)
}

fn served_version(shared: &Shared, name: &str) -> String {
    shared
        .model(name)
        .ok()
        .and_then(|m| m.serving(None).ok())
        .map_or(String::new(), |v| v.number.to_string())
}

/// Which version a URL asks for.
#[derive(Clone, Copy)]
enum Pick<'a> {
    /// None named: the newest available.
    Newest,
    /// `/versions/V`.
    Number(&'a str),
    /// `/labels/LABEL`.
    Label(&'a str),
}

/// The version number a URL names (`None`: the newest), a label resolved
/// through the model's labels.
///
/// A label of a model this server does not have is TF Serving's 400
/// (`Unrecognized servable version label`), not a 404: its servable
/// lookup resolves the label first (`ServerCore::GetModelVersionForLabel`,
/// `InvalidArgument` for a model without that label, known or not). Its
/// status endpoint does not resolve labels at all
/// (`GetModelStatusImpl::GetModelStatusWithModelSpec` reads only the
/// version number, and a label is the other arm of `ModelSpec`'s version
/// choice): it answers every version of the model, whatever the label, and
/// an unknown model 404 (`Could not find any versions of model`).
/// `status_request` does the same.
fn pick_version(
    shared: &Shared,
    name: &str,
    pick: Pick<'_>,
    status_request: bool,
) -> Result<Option<u64>, ApiError> {
    match pick {
        Pick::Newest => Ok(None),
        Pick::Number(v) => parse_version(Some(v)),
        Pick::Label(_) if status_request => Ok(None),
        Pick::Label(label) => match shared.model(name) {
            Ok(model) => model.label_version(label).map(Some),
            Err(e) => Err(ApiError::bad_request(format!(
                "Unrecognized servable version label: {} ({})",
                short(label),
                e.message
            ))),
        },
    }
}

/// A version from the URL: digits only.
pub(crate) fn parse_version(v: Option<&str>) -> Result<Option<u64>, ApiError> {
    match v {
        None => Ok(None),
        Some(text) => match text.parse::<u64>() {
            Ok(n) if text.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(n)),
            _ => Err(ApiError::bad_request(format!(
                "version {:?} is not a version number",
                short(text)
            ))),
        },
    }
}

/// `GET /v1/models/NAME[/versions/V]`.
fn status(model: &Model, version: Option<u64>) -> Result<Response, ApiError> {
    let statuses = model.statuses(version)?;
    let list: Vec<Json> = statuses
        .iter()
        .map(|s| {
            let (code, message) = match &s.error {
                Some(e) => ("UNKNOWN", e.as_str()),
                None => ("OK", ""),
            };
            json!({
                "version": s.version.to_string(),
                "state": s.state.name(),
                "status": {"error_code": code, "error_message": message},
            })
        })
        .collect();
    ok_json(&json!({ "model_version_status": list }))
}

/// `GET /v1/models/NAME[/versions/V]/metadata`.
fn metadata_of(model: &Model, version: Option<u64>) -> Result<Response, ApiError> {
    let v = model.serving(version)?;
    let sig = &v.signature;
    let shape = |dims: Vec<i64>| {
        json!({
            "dim": dims.iter().map(|d| json!({"size": d.to_string(), "name": ""})).collect::<Vec<_>>(),
            "unknown_rank": false,
        })
    };
    let mut inputs = Map::new();
    for f in &sig.inputs {
        let mut dims = vec![-1i64];
        if f.var {
            dims.push(-1);
        } else {
            dims.extend(f.shape.iter().map(|&d| d as i64));
        }
        inputs.insert(
            f.name.clone(),
            json!({"dtype": f.tf_dtype(), "tensor_shape": shape(dims), "name": f.name}),
        );
    }
    let mut outputs = Map::new();
    let mut output = |name: &str, dtype: &str, dims: Vec<i64>| {
        outputs.insert(
            name.into(),
            json!({"dtype": dtype, "tensor_shape": shape(dims), "name": name}),
        );
    };
    match sig.task {
        Task::Classification { classes } => {
            output("class", "DT_INT64", vec![-1]);
            if sig.class_names.is_some() {
                output("class_name", "DT_STRING", vec![-1]);
            }
            output("probabilities", "DT_FLOAT", vec![-1, classes as i64]);
        }
        Task::Regression => output("value", "DT_FLOAT", vec![-1]),
    }
    ok_json(&json!({
        "model_spec": {"name": model.name, "signature_name": "", "version": v.number.to_string()},
        "metadata": {"signature_def": {"signature_def": {"serving_default": {
            "inputs": inputs,
            "outputs": outputs,
            "method_name": "tensorflow/serving/predict",
        }}}},
        "model": v.description,
        "state": State::Available.name(),
    }))
}

/// Refuses keys a request of this kind does not have, and a signature other
/// than the default.
fn check_keys(body: &Map<String, Json>, allowed: &[&str], what: &str) -> Result<(), ApiError> {
    if let Some(key) = body.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown field {:?} (a {what} request has {})",
            short(key),
            allowed.join(", ")
        )));
    }
    match body.get("signature_name") {
        None => Ok(()),
        Some(Json::String(s)) if s.is_empty() || s == "serving_default" => Ok(()),
        Some(other) => Err(ApiError::bad_request(format!(
            "signature_name: {} is not a signature of this model (it has \"serving_default\")",
            short(&other.to_string())
        ))),
    }
}

/// `:predict`, the row (`instances`) and columnar (`inputs`) forms.
fn predict(
    shared: &Shared,
    v: &super::versions::Version,
    body: &[u8],
) -> Result<Response, ApiError> {
    let body = json_object(body)?;
    check_keys(&body, &["instances", "inputs", "signature_name"], "predict")?;
    let max = shared.config.batching.max_batch_size;
    let (batch, columnar) = match (body.get("instances"), body.get("inputs")) {
        (Some(Json::Array(rows)), None) => (
            rows_to_batch(&v.signature, rows, None, "instances", max)?,
            false,
        ),
        (Some(_), None) => {
            return Err(ApiError::bad_request(
                "instances: expected a list of examples",
            ));
        }
        (None, Some(inputs)) => (columns_to_batch(&v.signature, inputs, max)?, true),
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "instances and inputs: give one of them (rows or columns), not both",
            ));
        }
        (None, None) => {
            return Err(ApiError::bad_request(
                "body: a predict request needs instances (rows) or inputs (columns)",
            ));
        }
    };
    let outputs = shared.infer(v, batch)?;
    let names = v.signature.class_names.as_deref();
    if columnar {
        ok_json(&ColumnsBody {
            outputs: columns_out(&outputs, names),
        })
    } else {
        ok_json(&RowsBody {
            predictions: rows_out(&outputs, names),
        })
    }
}

// The response bodies are serialized straight from the outputs (no
// `serde_json::Value`), so float32s print in their shortest form, as
// `tfpipe predict` prints them.

#[derive(Serialize)]
struct RowsBody<'a> {
    predictions: RowsOut<'a>,
}

#[derive(Serialize)]
struct ColumnsBody<'a> {
    outputs: ColumnsOut<'a>,
}

/// One prediction of a classifier.
#[derive(Serialize)]
pub(crate) struct Prediction<'a> {
    class: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    class_name: Option<&'a str>,
    probabilities: &'a [f32],
}

/// The row form of the outputs.
#[derive(Serialize)]
#[serde(untagged)]
pub(crate) enum RowsOut<'a> {
    Classes(Vec<Prediction<'a>>),
    Values(&'a [f32]),
}

/// The columnar form of the outputs.
#[derive(Serialize)]
#[serde(untagged)]
enum ColumnsOut<'a> {
    Classes {
        class: &'a [u32],
        #[serde(skip_serializing_if = "Option::is_none")]
        class_name: Option<Vec<Option<&'a str>>>,
        probabilities: Vec<&'a [f32]>,
    },
    Values(&'a [f32]),
}

fn class_name(names: Option<&[String]>, id: u32) -> Option<&str> {
    names?.get(id as usize).map(String::as_str)
}

pub(crate) fn rows_out<'a>(outputs: &'a Outputs, names: Option<&'a [String]>) -> RowsOut<'a> {
    match outputs {
        Outputs::Classes { ids, .. } => RowsOut::Classes(
            ids.iter()
                .enumerate()
                .map(|(row, &class)| Prediction {
                    class,
                    class_name: class_name(names, class),
                    probabilities: outputs.probabilities(row).unwrap_or(&[]),
                })
                .collect(),
        ),
        Outputs::Values(values) => RowsOut::Values(values),
    }
}

fn columns_out<'a>(outputs: &'a Outputs, names: Option<&'a [String]>) -> ColumnsOut<'a> {
    match outputs {
        Outputs::Classes { ids, .. } => ColumnsOut::Classes {
            class: ids,
            class_name: names.map(|_| ids.iter().map(|&c| class_name(names, c)).collect()),
            probabilities: (0..ids.len())
                .map(|r| outputs.probabilities(r).unwrap_or(&[]))
                .collect(),
        },
        Outputs::Values(values) => ColumnsOut::Values(values),
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum ResultOut<'a> {
    /// Per example, every class as `[label, score]`.
    Classes(Vec<Vec<(String, f32)>>),
    Values(&'a [f32]),
}

#[derive(Serialize)]
struct ResultBody<'a> {
    result: ResultOut<'a>,
}

/// `:classify` (`want` a classification) and `:regress`: `examples`, with
/// an optional `context` merged into each.
fn classify(
    shared: &Shared,
    v: &super::versions::Version,
    body: &[u8],
    want: Task,
) -> Result<Response, ApiError> {
    let sig: &Signature = &v.signature;
    match (want, sig.task) {
        (Task::Classification { .. }, Task::Regression) => {
            return Err(ApiError::bad_request(
                "this model is a regressor: use :regress or :predict",
            ));
        }
        (Task::Regression, Task::Classification { .. }) => {
            return Err(ApiError::bad_request(
                "this model is a classifier: use :classify or :predict",
            ));
        }
        _ => {}
    }
    let what = if want == Task::Regression {
        "regress"
    } else {
        "classify"
    };
    let body = json_object(body)?;
    check_keys(&body, &["examples", "context", "signature_name"], what)?;
    let context = match body.get("context") {
        None => None,
        Some(Json::Object(c)) => {
            check_context(sig, c)?;
            Some(c)
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "context: expected an object of features",
            ));
        }
    };
    let rows = match body.get("examples") {
        Some(Json::Array(rows)) => rows,
        Some(_) => {
            return Err(ApiError::bad_request(
                "examples: expected a list of examples",
            ));
        }
        None => {
            return Err(ApiError::bad_request(format!(
                "body: a {what} request needs examples"
            )));
        }
    };
    let batch = rows_to_batch(
        sig,
        rows,
        context,
        "examples",
        shared.config.batching.max_batch_size,
    )?;
    let outputs = shared.infer(v, batch)?;
    let names = sig.class_names.as_deref();
    let result = match &outputs {
        Outputs::Classes { ids, classes, .. } => ResultOut::Classes(
            (0..ids.len())
                .map(|row| {
                    let probs = outputs.probabilities(row).unwrap_or(&[]);
                    (0..*classes)
                        .map(|c| {
                            let label = class_name(names, c as u32)
                                .map_or_else(|| c.to_string(), str::to_string);
                            (label, probs.get(c).copied().unwrap_or(0.0))
                        })
                        .collect()
                })
                .collect(),
        ),
        Outputs::Values(values) => ResultOut::Values(values),
    };
    ok_json(&ResultBody { result })
}
