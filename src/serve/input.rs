//! Request bodies to model inputs: a model's [`Signature`] (its input
//! features from the checkpoint's schema, and what it outputs), and the
//! JSON of TF Serving's and KServe's requests turned into a columnar
//! [`Batch`] that `batch_to_tensors` takes, exactly as the records of
//! `tfpipe predict` would be.
//!
//! Every value is checked here, before it reaches the batcher: a wrong type,
//! a wrong count, an unknown or missing feature, bad base64, a value the
//! model cannot take (NaN, infinity, an integer out of range) is an
//! [`ApiError`] of status 400 whose message starts with the field's path in
//! the request (`instances[3].image[17]`), so a client can find it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value as Json};

use crate::batch::{Batch, Column, Values};
use crate::example::{DType, json_kind};
use crate::train::{CheckpointMeta, DefaultMeta, Task};

use super::ApiError;

/// One input feature of a served model.
#[derive(Debug, Clone, PartialEq)]
pub struct InputFeature {
    /// The feature's name (the key in requests).
    pub name: String,
    /// Its element type: int64, float32 or uint8.
    pub dtype: DType,
    /// Its fixed shape per example (`[]` for a scalar); empty for a
    /// variable-length one.
    pub shape: Vec<usize>,
    /// Variable-length int64 (token ids) rather than fixed-shape.
    pub var: bool,
    /// The value taken when a request leaves the feature out: for an input
    /// the model imputes, its missing marker (NaN, or
    /// [`MISSING_INT64`](crate::train::MISSING_INT64)), which the model's
    /// imputation fills and flags as in training and `tfpipe predict`;
    /// else the checkpoint schema's default. `None`: the feature is
    /// required.
    pub default: Option<Vec<f64>>,
    /// Token ids must be below this (the embedding's rows), when known.
    pub vocab: Option<usize>,
}

impl InputFeature {
    /// Values per example (fixed-shape features).
    pub fn width(&self) -> usize {
        self.shape.iter().product()
    }

    /// TensorFlow's name of the dtype (`DT_FLOAT`, ...).
    pub fn tf_dtype(&self) -> &'static str {
        match self.dtype {
            DType::Float32 => "DT_FLOAT",
            DType::Uint8 => "DT_UINT8",
            _ => "DT_INT64",
        }
    }

    /// KServe's name of the dtype (`FP32`, ...).
    pub fn v2_dtype(&self) -> &'static str {
        match self.dtype {
            DType::Float32 => "FP32",
            DType::Uint8 => "UINT8",
            _ => "INT64",
        }
    }
}

/// What a served model takes and gives: its inputs, in the order the
/// model reads them, and its task (class ids and probabilities, or a value).
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    /// The input features.
    pub inputs: Vec<InputFeature>,
    /// Classification (with the number of classes) or regression.
    pub task: Task,
    /// The class names, by class id, when the checkpoint recorded them.
    pub class_names: Option<Vec<String>>,
}

impl Signature {
    /// The signature of a checkpoint: its input columns with their dtype
    /// and shape from the recorded schema (float32 of the input width when
    /// the checkpoint has no schema), and the token input when there is one.
    /// An input the model imputes takes its missing marker when a request
    /// leaves it out (see [`InputFeature::default`]). Fails on an input
    /// feature a request cannot carry (a dtype other than int64, float32
    /// or uint8).
    pub fn from_meta(meta: &CheckpointMeta) -> Result<Signature, String> {
        let schema = meta.schema.as_ref();
        let imputed = |name: &str| {
            meta.input
                .impute
                .as_ref()
                .is_some_and(|i| i.features.iter().any(|f| f == name))
        };
        let find = |name: &str| schema.and_then(|s| s.features.iter().find(|f| f.name == name));
        let mut inputs = Vec::new();
        for (name, width) in &meta.input.features {
            let feature = match find(name) {
                Some(f) => {
                    if !matches!(f.dtype, DType::Int64 | DType::Float32 | DType::Uint8) {
                        return Err(format!(
                            "input {name:?} is {}: the server takes int64, float32 and uint8 inputs",
                            f.dtype.name()
                        ));
                    }
                    InputFeature {
                        name: name.clone(),
                        dtype: f.dtype,
                        shape: f.shape.clone(),
                        var: false,
                        default: if imputed(name) {
                            missing_marker(f.dtype, *width)
                        } else {
                            f.default.as_ref().map(|d| match d {
                                DefaultMeta::Int64(v) => v.iter().map(|&x| x as f64).collect(),
                                DefaultMeta::Float32(v) => {
                                    v.iter().map(|&x| f64::from(x)).collect()
                                }
                            })
                        },
                        vocab: None,
                    }
                }
                None => InputFeature {
                    name: name.clone(),
                    dtype: DType::Float32,
                    shape: vec![*width],
                    var: false,
                    default: if imputed(name) {
                        missing_marker(DType::Float32, *width)
                    } else {
                        None
                    },
                    vocab: None,
                },
            };
            if feature.width() != *width {
                return Err(format!(
                    "input {name:?} has shape {:?} in the schema but {width} values in the model",
                    feature.shape
                ));
            }
            inputs.push(feature);
        }
        if let Some(tokens) = &meta.input.tokens {
            inputs.push(InputFeature {
                name: tokens.name.clone(),
                dtype: DType::Int64,
                shape: Vec::new(),
                var: true,
                default: None,
                vocab: tokens.vocab,
            });
        }
        Ok(Signature {
            inputs,
            task: meta.input.task,
            class_names: meta.label_vocabulary.clone(),
        })
    }

    /// The names of the inputs, for messages: `"image"` or `"a", "b"`.
    pub fn input_names(&self) -> String {
        self.inputs
            .iter()
            .map(|f| format!("{:?}", f.name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn input(&self, name: &str) -> Option<usize> {
        self.inputs.iter().position(|f| f.name == name)
    }

    /// A batch of `rows` examples of generated inputs: every value 0, or
    /// the feature's default (for warm-up).
    pub fn generated(&self, rows: usize) -> Batch {
        let mut builders = self.builders();
        for builder in &mut builders {
            for _ in 0..rows {
                if builder.feature.var {
                    builder.push_f64(0.0);
                } else {
                    for _ in 0..builder.feature.width() {
                        builder.push_f64(0.0);
                    }
                }
                builder.end_row();
            }
        }
        finish(builders, rows)
    }

    /// A `:predict` body of `rows` generated instances, as a client would
    /// send it (uint8 features as `{"b64": ...}`): warm-up of the request
    /// path. Every value 0, as in [`generated`](Self::generated).
    pub fn generated_request(&self, rows: usize) -> Vec<u8> {
        let mut instance = Map::new();
        for f in &self.inputs {
            let values = vec![0.0f64; if f.var { 1 } else { f.width() }];
            let value = match f.dtype {
                DType::Uint8 => {
                    let bytes: Vec<u8> = values.iter().map(|&x| x as u8).collect();
                    serde_json::json!({ "b64": BASE64.encode(bytes) })
                }
                DType::Float32 => values.iter().map(|&x| Json::from(x as f32)).collect(),
                _ => values.iter().map(|&x| Json::from(x as i64)).collect(),
            };
            instance.insert(f.name.clone(), value);
        }
        let instances = vec![Json::Object(instance); rows];
        serde_json::to_vec(&serde_json::json!({ "instances": instances })).unwrap_or_default()
    }

    fn builders(&self) -> Vec<ColumnBuilder<'_>> {
        self.inputs.iter().map(ColumnBuilder::new).collect()
    }
}

/// An imputed input's missing marker, `width` times: what the training
/// data was parsed with where the value was missing
/// ([`Imputation::parse_schema`](crate::train::Imputation::parse_schema)).
fn missing_marker(dtype: DType, width: usize) -> Option<Vec<f64>> {
    let marker = match dtype {
        DType::Float32 => f64::NAN,
        // Exactly representable (-2^63): `as i64` gives the marker back.
        DType::Int64 => crate::train::MISSING_INT64 as f64,
        _ => return None,
    };
    Some(vec![marker; width])
}

/// The longest field path quoted back in an error.
const PATH_LIMIT: usize = 200;

/// Collects one feature's values over the rows of a request.
struct ColumnBuilder<'s> {
    feature: &'s InputFeature,
    values: Values,
    /// Row boundaries (variable-length features only).
    splits: Vec<usize>,
    /// Values in the row being built.
    row_start: usize,
}

impl<'s> ColumnBuilder<'s> {
    fn new(feature: &'s InputFeature) -> ColumnBuilder<'s> {
        let values = match feature.dtype {
            DType::Float32 => Values::Float32(Vec::new()),
            DType::Uint8 => Values::Uint8(Vec::new()),
            _ => Values::Int64(Vec::new()),
        };
        ColumnBuilder {
            feature,
            values,
            splits: vec![0],
            row_start: 0,
        }
    }

    fn len(&self) -> usize {
        self.values.len()
    }

    /// Pushes a value already known to fit the dtype (defaults, zeros).
    fn push_f64(&mut self, x: f64) {
        match &mut self.values {
            Values::Float32(v) => v.push(x as f32),
            Values::Uint8(v) => v.push(x as u8),
            Values::Int64(v) => v.push(x as i64),
            _ => {}
        }
    }

    /// Pushes one JSON scalar, checked against the dtype.
    fn push_json(&mut self, value: &Json, path: &dyn Fn() -> String) -> Result<(), ApiError> {
        let bad = |what: String| ApiError::bad_request(format!("{}: {what}", path()));
        let (expected, vocab) = (self.expected(), self.feature.vocab);
        match (&mut self.values, value) {
            (Values::Float32(v), Json::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN) as f32;
                if !x.is_finite() {
                    return Err(bad(format!(
                        "{n} is outside float32's range (the model takes finite numbers)"
                    )));
                }
                v.push(x);
            }
            (Values::Float32(_), Json::String(s))
                if matches!(
                    s.as_str(),
                    "NaN" | "nan" | "Infinity" | "-Infinity" | "inf" | "-inf"
                ) =>
            {
                return Err(bad(format!(
                    "{s:?}: the model takes finite numbers only (no NaN or infinity)"
                )));
            }
            (Values::Int64(v), Json::Number(n)) => match n.as_i64() {
                Some(x) if vocab.is_some_and(|n| x < 0 || x as u64 >= n as u64) => {
                    return Err(bad(format!(
                        "token id {x} is outside 0..{} (the vocabulary size)",
                        vocab.unwrap_or(0)
                    )));
                }
                Some(x) => v.push(x),
                None => return Err(bad(format!("{n} is not an int64 (a whole number)"))),
            },
            (Values::Uint8(v), Json::Number(n)) => match n.as_u64().filter(|&x| x <= 255) {
                Some(x) => v.push(x as u8),
                None => return Err(bad(format!("{n} is not a uint8 (a whole number 0 to 255)"))),
            },
            (_, other) => {
                return Err(bad(format!(
                    "expected {expected}, found {}",
                    json_kind(other)
                )));
            }
        }
        Ok(())
    }

    fn expected(&self) -> &'static str {
        match self.feature.dtype {
            DType::Float32 => "a number",
            DType::Uint8 => "a number 0 to 255 (or {\"b64\": ...} for the raw bytes)",
            _ => "a whole number",
        }
    }

    /// Pushes a feature's value for one row: a scalar, a (nested) list, or
    /// `{"b64": ...}` (uint8 features: the raw bytes).
    fn push_value(&mut self, value: &Json, path: &dyn Fn() -> String) -> Result<(), ApiError> {
        match value {
            Json::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.push_value(item, &|| format!("{}[{i}]", path()))?;
                }
                Ok(())
            }
            Json::Object(map) if map.contains_key("b64") => self.push_b64(map, path),
            other => self.push_json(other, path),
        }
    }

    fn push_b64(
        &mut self,
        map: &Map<String, Json>,
        path: &dyn Fn() -> String,
    ) -> Result<(), ApiError> {
        let bad = |what: String| ApiError::bad_request(format!("{}: {what}", path()));
        if map.len() != 1 {
            return Err(bad("a {\"b64\": ...} object has no other keys".into()));
        }
        let Values::Uint8(v) = &mut self.values else {
            return Err(bad(format!(
                "{{\"b64\": ...}} is for bytes; {:?} is {}",
                self.feature.name,
                self.feature.dtype.name()
            )));
        };
        let Some(text) = map.get("b64").and_then(Json::as_str) else {
            return Err(bad("b64: expected a base64 string".into()));
        };
        let bytes = BASE64.decode(text).map_err(|e| {
            ApiError::bad_request(format!("{}.b64: not valid base64 ({e})", path()))
        })?;
        v.extend_from_slice(&bytes);
        Ok(())
    }

    /// Closes a row: checks its count (filling in the default of a missing
    /// feature) and records its end.
    fn end_row(&mut self) {
        if self.feature.var {
            self.splits.push(self.len());
        }
        self.row_start = self.len();
    }

    /// Checks the count of the row being built.
    fn check_row(&self, path: &dyn Fn() -> String) -> Result<(), ApiError> {
        let count = self.len() - self.row_start;
        let width = self.feature.width();
        if self.feature.var || count == width {
            return Ok(());
        }
        Err(ApiError::bad_request(format!(
            "{}: {count} values; {:?} takes {width} (shape {:?})",
            path(),
            self.feature.name,
            self.feature.shape
        )))
    }

    /// The feature's default for a row that leaves it out.
    fn push_default(&mut self, path: &dyn Fn() -> String) -> Result<(), ApiError> {
        match &self.feature.default {
            Some(d) if d.len() == self.feature.width() => {
                for &x in d {
                    self.push_f64(x);
                }
                Ok(())
            }
            _ if self.feature.var => Ok(()),
            _ => Err(ApiError::bad_request(format!(
                "{}: missing feature {:?} (it has no default)",
                path(),
                self.feature.name
            ))),
        }
    }

    fn finish(self) -> Column {
        let var = self.feature.var;
        Column {
            name: self.feature.name.clone(),
            values: self.values,
            row_splits: if var { vec![self.splits] } else { Vec::new() },
            inner_shape: if var {
                Vec::new()
            } else {
                self.feature.shape.clone()
            },
        }
    }
}

fn finish(builders: Vec<ColumnBuilder<'_>>, rows: usize) -> Batch {
    Batch {
        num_rows: rows,
        columns: builders.into_iter().map(ColumnBuilder::finish).collect(),
    }
}

/// Cuts a path quoted back to a client to a sane length.
fn short(path: String) -> String {
    if path.len() <= PATH_LIMIT {
        return path;
    }
    let mut end = PATH_LIMIT;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &path[..end])
}

/// Rows given one example at a time: `instances` of a predict request,
/// `examples` of classify and regress (with their `context`).
pub fn rows_to_batch(
    signature: &Signature,
    rows: &[Json],
    context: Option<&Map<String, Json>>,
    field: &str,
    max_rows: usize,
) -> Result<Batch, ApiError> {
    check_rows(rows.len(), field, max_rows)?;
    let mut builders = signature.builders();
    let single = signature.inputs.len() == 1;
    for (r, row) in rows.iter().enumerate() {
        let row_path = || short(format!("{field}[{r}]"));
        match row {
            Json::Object(map) if !(single && map.contains_key("b64") && context.is_none()) => {
                named_row(signature, &mut builders, map, context, &row_path)?;
            }
            value if single && context.is_none() => {
                let b = &mut builders[0];
                b.push_value(value, &row_path)?;
                b.check_row(&row_path)?;
                b.end_row();
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "{}: expected an object of the features ({}), found {}",
                    row_path(),
                    signature.input_names(),
                    json_kind(other)
                )));
            }
        }
    }
    Ok(finish(builders, rows.len()))
}

/// One example given as `{feature: value, ...}`.
fn named_row(
    signature: &Signature,
    builders: &mut [ColumnBuilder<'_>],
    map: &Map<String, Json>,
    context: Option<&Map<String, Json>>,
    row_path: &dyn Fn() -> String,
) -> Result<(), ApiError> {
    for key in map.keys() {
        if signature.input(key).is_none() {
            return Err(ApiError::bad_request(format!(
                "{}: unknown feature {:?} (the model takes {})",
                row_path(),
                short(key.clone()),
                signature.input_names()
            )));
        }
        if context.is_some_and(|c| c.contains_key(key)) {
            return Err(ApiError::bad_request(format!(
                "{}.{key}: the feature is also in context (give it in one place)",
                row_path()
            )));
        }
    }
    for b in builders.iter_mut() {
        let name = b.feature.name.as_str();
        let value = map
            .get(name)
            .map(|v| (v, false))
            .or_else(|| context.and_then(|c| c.get(name)).map(|v| (v, true)));
        let path = || match value {
            Some((_, true)) => format!("context.{name}"),
            _ => format!("{}.{name}", row_path()),
        };
        match value {
            Some((v, _)) => b.push_value(v, &path)?,
            None => b.push_default(row_path)?,
        }
        b.check_row(&path)?;
        b.end_row();
    }
    Ok(())
}

/// Checks a context's keys (classify and regress).
pub fn check_context(signature: &Signature, context: &Map<String, Json>) -> Result<(), ApiError> {
    match context.keys().find(|k| signature.input(k).is_none()) {
        Some(key) => Err(ApiError::bad_request(format!(
            "context: unknown feature {:?} (the model takes {})",
            short(key.clone()),
            signature.input_names()
        ))),
        None => Ok(()),
    }
}

fn check_rows(rows: usize, field: &str, max_rows: usize) -> Result<(), ApiError> {
    if rows == 0 {
        return Err(ApiError::bad_request(format!(
            "{field}: empty (give at least one example)"
        )));
    }
    if rows > max_rows {
        return Err(ApiError::bad_request(format!(
            "{field}: {rows} examples; the server takes at most {max_rows} per request (its maximum batch size)"
        )));
    }
    Ok(())
}

/// The columnar form of a predict request: `inputs` as `{feature: [row,
/// ...]}`, or, for a model of one input, the list of rows itself.
pub fn columns_to_batch(
    signature: &Signature,
    inputs: &Json,
    max_rows: usize,
) -> Result<Batch, ApiError> {
    let single = signature.inputs.len() == 1;
    let named: Vec<(usize, &Vec<Json>, String)> = match inputs {
        Json::Array(rows) if single => vec![(0, rows, "inputs".to_string())],
        Json::Object(map) => {
            let mut named = Vec::new();
            for (key, value) in map {
                let Some(i) = signature.input(key) else {
                    return Err(ApiError::bad_request(format!(
                        "inputs: unknown feature {:?} (the model takes {})",
                        short(key.clone()),
                        signature.input_names()
                    )));
                };
                let Json::Array(rows) = value else {
                    return Err(ApiError::bad_request(format!(
                        "inputs.{key}: expected a list of examples, found {}",
                        json_kind(value)
                    )));
                };
                named.push((i, rows, format!("inputs.{key}")));
            }
            named
        }
        other => {
            return Err(ApiError::bad_request(format!(
                "inputs: expected an object of the features ({}), found {}",
                signature.input_names(),
                json_kind(other)
            )));
        }
    };
    let rows = named.first().map_or(0, |(_, r, _)| r.len());
    check_rows(rows, "inputs", max_rows)?;
    if let Some((_, r, path)) = named.iter().find(|(_, r, _)| r.len() != rows) {
        return Err(ApiError::bad_request(format!(
            "{path}: {} examples, but {} has {rows}",
            r.len(),
            named[0].2
        )));
    }
    let mut builders = signature.builders();
    for (i, b) in builders.iter_mut().enumerate() {
        let given = named.iter().find(|(j, _, _)| *j == i);
        for r in 0..rows {
            let path = || match given {
                Some((_, _, p)) => format!("{p}[{r}]"),
                None => format!("inputs[{r}]"),
            };
            match given {
                Some((_, values, _)) => b.push_value(&values[r], &path)?,
                None => b.push_default(&path)?,
            }
            b.check_row(&path)?;
            b.end_row();
        }
    }
    Ok(finish(builders, rows))
}

/// A KServe v2 input tensor's values for one feature: `data` (flat or
/// nested, row-major) with its `shape` (`[rows, ...]`).
pub struct TensorInput<'a> {
    /// Which input of the signature.
    pub feature: usize,
    /// The examples in it (`shape[0]`).
    pub rows: usize,
    /// The values.
    pub data: &'a Json,
    /// `inputs[i]`, for messages.
    pub path: String,
}

/// KServe v2 inputs to a batch: each feature's flat data, `rows` examples.
pub fn tensors_to_batch(
    signature: &Signature,
    tensors: &[TensorInput<'_>],
    max_rows: usize,
) -> Result<Batch, ApiError> {
    let rows = tensors.first().map_or(0, |t| t.rows);
    check_rows(rows, "inputs", max_rows)?;
    let mut builders = signature.builders();
    for (i, b) in builders.iter_mut().enumerate() {
        let Some(t) = tensors.iter().find(|t| t.feature == i) else {
            for r in 0..rows {
                let path = || format!("inputs (example {r})");
                b.push_default(&path)?;
                b.end_row();
            }
            continue;
        };
        if t.rows != rows {
            return Err(ApiError::bad_request(format!(
                "{}: shape[0] is {}, but the first input has {rows} examples",
                t.path, t.rows
            )));
        }
        if b.feature.var {
            return Err(ApiError::bad_request(format!(
                "{}: {:?} is variable-length; send it through /v1 instances",
                t.path, b.feature.name
            )));
        }
        let path = || format!("{}.data", t.path);
        b.push_value(t.data, &path)?;
        let expected = rows * b.feature.width();
        if b.len() != expected {
            return Err(ApiError::bad_request(format!(
                "{}.data: {} values; shape [{rows}, {}] takes {expected}",
                t.path,
                b.len(),
                b.feature
                    .shape
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(finish(builders, rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn signature() -> Signature {
        Signature {
            inputs: vec![
                InputFeature {
                    name: "x".into(),
                    dtype: DType::Float32,
                    shape: vec![2],
                    var: false,
                    default: None,
                    vocab: None,
                },
                InputFeature {
                    name: "n".into(),
                    dtype: DType::Int64,
                    shape: vec![],
                    var: false,
                    default: Some(vec![7.0]),
                    vocab: None,
                },
            ],
            task: Task::Regression,
            class_names: None,
        }
    }

    fn err(r: Result<Batch, ApiError>) -> String {
        r.unwrap_err().message
    }

    #[test]
    fn rows_and_columns_make_the_same_batch() {
        let s = signature();
        let rows = [json!({"x": [1.0, 2.0], "n": 3}), json!({"x": [[4.5], [5]]})];
        let a = rows_to_batch(&s, &rows, None, "instances", 8).unwrap();
        let b = columns_to_batch(&s, &json!({"x": [[1, 2], [4.5, 5]], "n": [3, 7]}), 8).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a.column("x").unwrap().values,
            Values::Float32(vec![1.0, 2.0, 4.5, 5.0])
        );
        assert_eq!(a.column("n").unwrap().values, Values::Int64(vec![3, 7]));
    }

    #[test]
    fn every_mistake_names_its_field() {
        let s = signature();
        let cases = [
            (
                json!([{"x": [1, 2], "y": 1}]),
                "instances[0]: unknown feature \"y\"",
            ),
            (
                json!([{"x": [1, "a"]}]),
                "instances[0].x[1]: expected a number, found a string",
            ),
            (
                json!([{"x": [1, 2, 3]}]),
                "instances[0].x: 3 values; \"x\" takes 2",
            ),
            (
                json!([{"x": [1, "NaN"]}]),
                "instances[0].x[1]: \"NaN\": the model takes finite",
            ),
            (
                json!([{"x": [1, 1e39]}]),
                "instances[0].x[1]: 1e+39 is outside float32's range",
            ),
            (
                json!([{"x": [1, 2], "n": 1.5}]),
                "instances[0].n: 1.5 is not an int64",
            ),
            (json!([{"n": 1}]), "instances[0]: missing feature \"x\""),
            (
                json!([{"x": {"b64": "AAAA"}}]),
                "instances[0].x: {\"b64\": ...} is for bytes",
            ),
            (
                json!([3]),
                "instances[0]: expected an object of the features",
            ),
        ];
        for (rows, expected) in cases {
            let rows = rows.as_array().unwrap().clone();
            let message = err(rows_to_batch(&s, &rows, None, "instances", 8));
            assert!(message.starts_with(expected), "{message}");
        }
        let message = err(rows_to_batch(
            &s,
            &vec![json!({"x": [1, 2]}); 3],
            None,
            "instances",
            2,
        ));
        assert!(message.contains("at most 2 per request"), "{message}");
        let message = err(columns_to_batch(
            &s,
            &json!({"x": [[1, 2]], "n": [1, 2]}),
            8,
        ));
        assert!(
            message.starts_with("inputs.x: 1 examples, but inputs.n has 2"),
            "{message}"
        );
    }

    #[test]
    fn uint8_takes_base64_and_checks_it() {
        let s = Signature {
            inputs: vec![InputFeature {
                name: "image".into(),
                dtype: DType::Uint8,
                shape: vec![3],
                var: false,
                default: None,
                vocab: None,
            }],
            task: Task::Classification { classes: 2 },
            class_names: None,
        };
        let b = rows_to_batch(
            &s,
            &[json!({"b64": "AQID"}), json!([4, 5, 6])],
            None,
            "instances",
            8,
        )
        .unwrap();
        assert_eq!(b.columns[0].values, Values::Uint8(vec![1, 2, 3, 4, 5, 6]));
        let message = err(rows_to_batch(
            &s,
            &[json!({"b64": "A!=="})],
            None,
            "instances",
            8,
        ));
        assert!(
            message.starts_with("instances[0].b64: not valid base64"),
            "{message}"
        );
        let message = err(rows_to_batch(
            &s,
            &[json!([1, 2, 300])],
            None,
            "instances",
            8,
        ));
        assert!(
            message.starts_with("instances[0][2]: 300 is not a uint8"),
            "{message}"
        );
    }
}
