//! The bodies of the fuzz targets, shared by the cargo-fuzz crate in `fuzz/`
//! and the seeded, bounded fuzz pass in the test suite (`tests/records/fuzz.rs`),
//! so that both exercise the same code paths.
//!
//! Each function takes arbitrary bytes, must never panic on them, and checks
//! the invariants of the code under test (a panic is a finding):
//! - [`record_reader`]: any bytes under any compression and corruption policy
//!   are read without panicking, every error carries its location, and
//!   records written by the writer read back exactly;
//! - [`schema_parser`]: a schema and records derived from the bytes parse the
//!   same one at a time as in a batch, and skipping bad records leaves exactly
//!   the good ones (the rollback of a half-parsed row is exact);
//! - [`schema_file`]: any text either fails to load as a schema file or loads
//!   into a schema that survives a round trip through its JSON form;
//! - [`csv_converter`] and [`json_converter`] (the convert lane's): any input
//!   file either converts, with exactly the counted records, each of which
//!   parses under the schema the conversion writes, or fails with an error
//!   that names the input (and, for bad data, where in it);
//! - [`serve_inputs`]: any JSON a client sends as `instances`, `inputs`,
//!   `examples` with `context`, or KServe tensors either becomes a batch of
//!   exactly the rows sent, or a 400 whose message starts with the request
//!   field at fault;
//! - [`image_decoder`]: any bytes either decode or fail, under every decode
//!   path (whole, a window, DCT-scaled, the whole crop-resize-augment
//!   chain); a window of an image that decodes whole is that image's pixels
//!   exactly, and every output has the size it claims.

use prost::Message;

use crate::batch::Batch;
use crate::example::proto::{BytesList, Feature, Features, FloatList, Int64List, feature};
use crate::example::{BatchParser, DType, Example, FeatureSpec, Layout, Schema, Value};
use crate::image::{
    Augment, Crop, DecodeOptions, Decoder, Image, ImageLayout, ImageOptions, ImageWorker,
    OutputSlice, OutputType, RandomCrop, ResizeMethod, Window,
};
use crate::tfrecord::{Compression, OnCorruption, ReaderOptions, RecordReader, RecordWriter};

/// A cursor over the fuzzer's bytes; reads past the end are zero.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn below(&mut self, n: u8) -> u8 {
        self.byte() % n.max(1)
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }
}

/// Reads `data` as a TFRecord stream (the first byte picks the compression,
/// the policy and the buffer size), then writes the rest as records and
/// reads them back.
pub fn record_reader(data: &[u8]) {
    let mut input = Bytes(data);
    let mode = input.byte();
    let compression = [Compression::None, Compression::Gzip, Compression::Zlib][mode as usize % 3];
    let on_corruption = [
        OnCorruption::Fail,
        OnCorruption::Skip,
        OnCorruption::EndStream,
    ][(mode as usize / 3) % 3];
    let options = ReaderOptions {
        compression: Some(compression),
        on_corruption,
        buffer_size: 1 + (mode as usize / 9) * 7,
        max_record_len: 1 << 20,
        ..ReaderOptions::default()
    };
    let stream = input.0;
    let mut reader = RecordReader::decoding(stream, options.clone());
    let mut records = 0u64;
    loop {
        match reader.next_record() {
            Ok(Some(_)) => records += 1,
            Ok(None) => break,
            Err(err) => {
                if err.is_corruption() {
                    assert!(err.location().is_some(), "an unlocated error: {err}");
                }
                break;
            }
        }
        assert!(records <= stream.len() as u64, "more records than bytes");
    }
    assert!(reader.corruptions().len() as u64 <= reader.corruption_count());

    // The rest as records (split at each 0xff), written and read back.
    let parts: Vec<&[u8]> = stream.split(|&b| b == 0xff).collect();
    let mut writer = RecordWriter::new(Vec::new(), compression);
    for part in &parts {
        writer.write_record(part).expect("writing to memory");
    }
    let bytes = writer.finish().expect("writing to memory");
    let mut reader = RecordReader::decoding(&bytes[..], options);
    let mut back = Vec::new();
    let mut record = Vec::new();
    while reader
        .read_record(&mut record)
        .expect("our own output reads")
    {
        back.push(record.clone());
    }
    assert_eq!(back, parts, "round trip");
}

/// A schema and records derived from `data`: parsing them one at a time
/// and as a batch agree, and skipping keeps exactly the good ones. Returns
/// `(good, bad)` record counts (`(0, 0)` for an invalid schema), so a seeded
/// pass can show it reached both paths.
pub fn schema_parser(data: &[u8]) -> (usize, usize) {
    let mut input = Bytes(data);
    let Some(schema) = schema_from(&mut input) else {
        return (0, 0);
    };
    let Ok(mut parser) = BatchParser::new(schema.clone()) else {
        return (0, 0);
    };
    let count = 1 + input.below(8) as usize;
    let records: Vec<Vec<u8>> = (0..count)
        .map(|_| record_from(&mut input, &schema))
        .collect();

    let singles: Vec<Option<Batch>> = records.iter().map(|r| parser.parse_one(r).ok()).collect();
    let whole = parser.parse(&records);
    assert_eq!(
        whole.is_ok(),
        singles.iter().all(Option::is_some),
        "a batch parses iff every record does"
    );
    let mut skipping = parser.empty_batch();
    let mut bad = Vec::new();
    parser.parse_into_skipping(&records, &mut skipping, |index, _| bad.push(index));
    let expected_bad: Vec<usize> = (0..count).filter(|&i| singles[i].is_none()).collect();
    assert_eq!(bad, expected_bad, "the bad records");
    let good: Vec<Batch> = singles.into_iter().flatten().collect();
    let expected = if good.is_empty() {
        parser.empty_batch()
    } else {
        Batch::concat(&good).expect("batches of one schema concatenate")
    };
    assert_eq!(
        skipping, expected,
        "skipping keeps exactly the good records"
    );
    if let Ok(whole) = whole {
        assert_eq!(whole, expected, "batch = one at a time");
    }
    (good.len(), bad.len())
}

/// Loads `data` as a schema file; a schema that loads round-trips.
pub fn schema_file(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(schema) = Schema::from_json_str(&text) {
        let again = Schema::from_json_value(&schema.to_json_value())
            .expect("a loaded schema's own JSON loads");
        assert_eq!(again, schema, "schema file round trip");
    }
}

fn schema_from(input: &mut Bytes<'_>) -> Option<Schema> {
    let n = 1 + input.below(4) as usize;
    let sequence = input.below(4) == 0;
    let mut features = Vec::with_capacity(n);
    for i in 0..n {
        let dtype =
            [DType::Int64, DType::Float32, DType::Bytes, DType::Uint8][input.below(4) as usize];
        let shape: Vec<usize> = (0..input.below(3))
            .map(|_| input.below(4) as usize)
            .collect();
        let layout = match (input.below(4), sequence) {
            (0, true) => Layout::FixedSequence(shape.clone()),
            (1, true) => Layout::VarSequence,
            (0 | 1, false) | (2, _) => Layout::Fixed(shape.clone()),
            _ => Layout::Var,
        };
        let mut spec = FeatureSpec {
            name: format!("f{i}"),
            dtype,
            layout,
            default: None,
            image: None,
        };
        if matches!(spec.layout, Layout::Fixed(_)) && input.below(2) == 0 {
            let len = if input.below(2) == 0 {
                1
            } else {
                shape.iter().product()
            };
            // raw_* types take no default (TensorFlow's decode_raw has none).
            spec.default = match dtype {
                DType::Int64 | DType::Uint8 => Some(Value::Int64(
                    (0..len).map(|_| i64::from(input.byte())).collect(),
                )),
                DType::Float32 => Some(Value::Float32(
                    (0..len).map(|_| f32::from(input.byte())).collect(),
                )),
                DType::Bytes => Some(Value::Bytes((0..len).map(|_| vec![input.byte()]).collect())),
                DType::RawInt16
                | DType::RawUint16
                | DType::RawInt32
                | DType::RawFloat32
                | DType::RawFloat64 => None,
            };
        }
        features.push(spec);
    }
    Some(Schema {
        features,
        label: None,
    })
}

/// A record: raw bytes, or an `Example` whose features mostly fit `schema`.
fn record_from(input: &mut Bytes<'_>, schema: &Schema) -> Vec<u8> {
    if input.below(8) == 0 {
        let len = input.below(32) as usize;
        return input.take(len).to_vec();
    }
    let mut map = std::collections::BTreeMap::new();
    for spec in &schema.features {
        if input.below(6) == 0 {
            continue; // missing
        }
        let count = match (spec.fixed_len(), input.below(4)) {
            (Some(len), 0..=2) => len,
            _ => input.below(6) as usize,
        };
        // Mostly the right kind, sometimes another.
        let kind = match (spec.dtype, input.below(8)) {
            (_, 0) => input.below(3),
            (DType::Int64, _) => 0,
            (DType::Float32, _) => 1,
            (DType::Bytes | DType::Uint8, _) => 2,
            (_, _) => 2, // raw_* read a bytes_list
        };
        let kind = match kind {
            0 => feature::Kind::Int64List(Int64List {
                value: (0..count).map(|_| i64::from(input.byte()) - 128).collect(),
            }),
            1 => feature::Kind::FloatList(FloatList {
                value: (0..count).map(|_| f32::from(input.byte())).collect(),
            }),
            _ => {
                let width = match (spec.dtype, spec.fixed_len()) {
                    (DType::Uint8, Some(len)) if input.below(4) != 0 => len,
                    _ => input.below(4) as usize,
                };
                feature::Kind::BytesList(BytesList {
                    value: (0..count.min(4).max(usize::from(spec.dtype == DType::Uint8)))
                        .map(|_| input.take(width).to_vec())
                        .collect(),
                })
            }
        };
        map.insert(spec.name.clone(), Feature { kind: Some(kind) });
    }
    Example {
        features: Some(Features { feature: map }),
    }
    .encode_to_vec()
}

/// The CSV converter on `data` (the first byte picks the delimiter,
/// `--skip-bad-rows` and a label column); see the module doc. Returns the
/// records converted (`None` for an error), so a seeded pass can show it
/// reached both paths.
pub fn csv_converter(data: &[u8]) -> Option<u64> {
    let (options, rest) = data.split_first().unwrap_or((&0, data));
    let csv = crate::convert::CsvOptions {
        delimiter: [b',', b';', b'\t', b'|'][usize::from(options & 3)],
        label: (options & 8 != 0).then(|| "a".to_string()),
        ..crate::convert::CsvOptions::default()
    };
    convert_checked(
        &crate::convert::Format::Csv(csv),
        "input.csv",
        rest,
        options & 4 != 0,
    )
}

/// The JSON converter on `data` (the first byte picks `--skip-bad-rows` and
/// a label key); see the module doc.
pub fn json_converter(data: &[u8]) -> Option<u64> {
    let (options, rest) = data.split_first().unwrap_or((&0, data));
    let json = crate::convert::JsonOptions {
        label: (options & 2 != 0).then(|| "a".to_string()),
        ..crate::convert::JsonOptions::default()
    };
    convert_checked(
        &crate::convert::Format::Json(json),
        "input.json",
        rest,
        options & 1 != 0,
    )
}

/// Converts `data` (as the file `name`) in memory and checks the invariants.
fn convert_checked(
    format: &crate::convert::Format,
    name: &str,
    data: &[u8],
    skip: bool,
) -> Option<u64> {
    use crate::convert::ConvertError;
    // A fuzz input that cannot even be written to a temporary file is not a finding.
    let dir = tempfile::tempdir().ok()?;
    let path = dir.path().join(name);
    std::fs::write(&path, data).ok()?;
    match crate::convert::dry_run(format, std::slice::from_ref(&path), skip) {
        Ok((records, encoded, schema)) => {
            assert_eq!(encoded.len() as u64, records, "records counted = encoded");
            let mut parser = BatchParser::new(schema).expect("the converter's schema is valid");
            if let Err(e) = parser.parse(&encoded) {
                panic!("a converted record does not parse under its own schema: {e}");
            }
            Some(records)
        }
        Err(e) => {
            if matches!(
                e,
                ConvertError::BadRow { .. } | ConvertError::BadInput { .. }
            ) {
                let location = e.location().expect("bad data is located");
                assert_eq!(location.path, path, "the error names the input: {e}");
                assert!(
                    location.byte <= data.len() as u64 || data.starts_with(&[0x1f, 0x8b]),
                    "offset {} beyond the input's {} bytes: {e}",
                    location.byte,
                    data.len()
                );
            }
            assert!(!matches!(e, ConvertError::Panicked { .. }), "panicked: {e}");
            None
        }
    }
}

/// The most pixels a fuzzed image may claim: small, so that each input
/// decodes in microseconds, and large enough for every test image.
const FUZZ_MAX_PIXELS: u64 = 1 << 18;

/// Decodes the bytes after the first six (which pick the channels, a
/// window, a DCT scale's target and the worker's options) by every path.
/// Panics on a finding: a panic inside a decoder, an output whose size
/// disagrees with what it claims, a window outside the decoded image, or a
/// window whose pixels differ from the same window of a whole decode.
/// Returns whether the image decoded whole, so that a seeded pass can show
/// it reached both the decoding and the error paths.
pub fn image_decoder(data: &[u8]) -> bool {
    let mut input = Bytes(data);
    let picks: [u8; 6] = std::array::from_fn(|_| input.byte());
    let bytes = input.0;
    let channels = if picks[0] & 1 == 0 { 1 } else { 3 };
    let options = DecodeOptions {
        channels,
        max_pixels: FUZZ_MAX_PIXELS,
    };
    let mut decoder = Decoder::new(options).expect("valid options");
    let mut whole = Image::default();
    let whole_ok = decoder.decode(bytes, &mut whole).is_ok();
    if whole_ok {
        assert_consistent(&whole, channels);
    }
    // A window picked as fractions of the header's size.
    let fraction = |pick: u8, of: usize| (pick as usize * of) / 256;
    let choose = |height: usize, width: usize| {
        let top = fraction(picks[1], height);
        let left = fraction(picks[2], width);
        Window {
            top,
            left,
            height: (fraction(picks[3], height) + 1).min(height - top),
            width: (fraction(picks[4], width) + 1).min(width - left),
        }
    };
    let mut part = Image::default();
    let windowed = decoder.decode_window(bytes, choose, &mut part);
    if let Ok(window) = windowed {
        assert_consistent(&part, channels);
        assert_inside(window, &part);
        if whole_ok {
            assert_same_window(&whole, &part, window);
        }
    } else {
        assert!(!whole_ok, "a window failed where the whole image decodes");
    }
    let at_least = (1 + picks[5] as usize % 16, 1 + picks[5] as usize / 16);
    let mut scaled = Image::default();
    if let Ok(window) = decoder.decode_window_scaled(bytes, choose, at_least, &mut scaled) {
        assert_consistent(&scaled, channels);
        assert_inside(window, &scaled);
    }
    worker_chain(bytes, picks);
    whole_ok
}

/// The crop-resize-augment chain with options picked from `picks`: it
/// succeeds or fails without panicking, and a float output it fills is
/// finite.
fn worker_chain(bytes: &[u8], picks: [u8; 6]) {
    let crop = match picks[1] % 3 {
        0 => Crop::None,
        1 => Crop::Center { fraction: 0.875 },
        _ => Crop::Random(RandomCrop::default()),
    };
    let options = ImageOptions {
        method: [
            ResizeMethod::Bilinear,
            ResizeMethod::Area,
            ResizeMethod::Nearest,
        ][picks[2] as usize % 3],
        antialias: picks[2] & 4 != 0,
        crop,
        augment: Augment {
            flip: picks[3] & 1 != 0,
            brightness: (picks[3] & 2 != 0).then_some(0.2),
            contrast: (picks[3] & 4 != 0).then_some((0.5, 1.5)),
            saturation: (picks[3] & 8 != 0).then_some((0.5, 1.5)),
        },
        output: if picks[4] & 1 == 0 {
            OutputType::Uint8
        } else {
            OutputType::IMAGENET
        },
        layout: if picks[4] & 2 == 0 {
            ImageLayout::Nhwc
        } else {
            ImageLayout::Nchw
        },
        max_pixels: FUZZ_MAX_PIXELS,
        dct_scale: picks[4] & 4 != 0,
        ..ImageOptions::new(
            1 + picks[5] as usize % 13,
            1 + picks[5] as usize / 13 % 13,
            3,
        )
    };
    let mut worker = ImageWorker::new(options).expect("valid options");
    let len = options.output_len();
    let seed = u64::from_le_bytes([picks[0], picks[1], picks[2], picks[3], 0, 0, 0, 1]);
    match options.output {
        OutputType::Uint8 => {
            let mut out = vec![0u8; len];
            let _ = worker.process(bytes, seed, OutputSlice::Uint8(&mut out));
        }
        OutputType::Float32 { .. } => {
            let mut out = vec![0f32; len];
            if worker
                .process(bytes, seed, OutputSlice::Float32(&mut out))
                .is_ok()
            {
                assert!(out.iter().all(|v| v.is_finite()), "a non-finite output");
            }
        }
    }
}

fn assert_consistent(image: &Image, channels: usize) {
    assert_eq!(image.channels, channels, "the channels asked for");
    assert_eq!(
        image.data.len(),
        image.height * image.width * image.channels,
        "the data's length against its shape"
    );
    assert!(image.height as u64 * image.width as u64 <= FUZZ_MAX_PIXELS);
}

fn assert_inside(window: Window, image: &Image) {
    assert!(window.height > 0 && window.width > 0, "an empty window");
    assert!(
        window.top + window.height <= image.height && window.left + window.width <= image.width,
        "window {window:?} outside a {}x{} image",
        image.height,
        image.width
    );
}

fn assert_same_window(whole: &Image, part: &Image, window: Window) {
    assert_eq!(part.width, whole.width, "a window decode keeps the width");
    assert!(part.height <= whole.height);
    let c = whole.channels;
    for row in window.top..window.top + window.height {
        let span = |image: &Image| {
            let start = (row * image.width + window.left) * c;
            image.data[start..start + window.width * c].to_vec()
        };
        assert!(
            span(whole) == span(part),
            "row {row} of window {window:?} differs from the whole decode"
        );
    }
}

/// JSON request parts derived from `data` (the shapes a client could send:
/// numbers out of range, strings where numbers go, `{"b64": ...}`, nesting,
/// unknown and missing keys), turned into batches for two signatures by
/// every request form the server takes (`instances`, `inputs`, `examples`
/// with `context`, KServe tensors). Panics on a finding: a panic, a batch
/// with another number of rows than the request sent, the same examples
/// giving different batches as rows and as columns, or an error that is not
/// a 400 naming its field. Returns `(accepted, refused)` request counts, so that a
/// seeded pass can show it reached both.
#[cfg(feature = "serve")]
pub fn serve_inputs(data: &[u8]) -> (usize, usize) {
    use crate::serve::input::{
        TensorInput, check_context, columns_to_batch, rows_to_batch, tensors_to_batch,
    };
    use serde_json::Value as Json;

    let mut input = Bytes(data);
    let mut counts = (0, 0);
    for signature in fuzz_signatures() {
        let names: Vec<&str> = signature.inputs.iter().map(|f| f.name.as_str()).collect();
        let mut tally = |result: Result<crate::batch::Batch, crate::serve::ApiError>,
                         rows: Option<usize>,
                         fields: &[&str]| match result {
            Ok(batch) => {
                counts.0 += 1;
                assert_eq!(
                    batch.columns.len(),
                    signature.inputs.len(),
                    "one column per input"
                );
                if let Some(rows) = rows {
                    assert_eq!(batch.num_rows, rows, "a row per example sent");
                }
                assert!((1..=FUZZ_MAX_ROWS).contains(&batch.num_rows));
                for column in &batch.columns {
                    assert_eq!(column.num_rows(), batch.num_rows, "column {}", column.name);
                }
            }
            Err(e) => {
                counts.1 += 1;
                assert_eq!(e.status, 400, "{e}");
                assert!(
                    fields.iter().any(|f| e.message.starts_with(f)),
                    "an error that names no field of {fields:?}: {e}"
                );
            }
        };
        // 0 to 9 rows; one (valid) once the input is exhausted.
        let count = (input.below(10) as usize + 1) % 10;
        let rows: Vec<Json> = (0..count)
            .map(|_| valid_or_not(&mut input, &signature, &names))
            .collect();
        let instances = rows_to_batch(&signature, &rows, None, "instances", FUZZ_MAX_ROWS);
        tally(instances.clone(), Some(rows.len()), &["instances"]);
        let context = match json_from(&mut input, 1, &names) {
            Json::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        // As the server does: the context's keys first, then the rows.
        tally(
            check_context(&signature, &context).and_then(|()| {
                rows_to_batch(&signature, &rows, Some(&context), "examples", FUZZ_MAX_ROWS)
            }),
            Some(rows.len()),
            &["examples", "context"],
        );
        let (columns, of_rows) = columns_of(&mut input, &signature, &rows);
        let columnar = columns_to_batch(&signature, &columns, FUZZ_MAX_ROWS);
        if of_rows && let (Ok(by_rows), Ok(by_columns)) = (&instances, &columnar) {
            assert_eq!(
                by_rows, by_columns,
                "the same examples as rows and as columns"
            );
        }
        tally(columnar, of_rows.then_some(rows.len()), &["inputs"]);
        let flat: Vec<Json> = signature
            .inputs
            .iter()
            .map(|f| match &columns {
                Json::Object(map) => flatten(map.get(&f.name)),
                Json::Array(_) => flatten(Some(&columns)),
                other => other.clone(),
            })
            .collect();
        let tensors: Vec<TensorInput<'_>> = flat
            .iter()
            .enumerate()
            .map(|(i, data)| TensorInput {
                feature: i,
                rows: match input.below(8) {
                    0 => usize::MAX,
                    1 => rows.len() + 1,
                    _ => rows.len(),
                },
                data,
                path: format!("inputs[{i}]"),
            })
            .collect();
        tally(
            tensors_to_batch(&signature, &tensors, FUZZ_MAX_ROWS),
            None,
            &["inputs"],
        );
    }
    counts
}

/// The most examples a fuzzed request may carry (the server's maximum
/// batch size).
#[cfg(feature = "serve")]
const FUZZ_MAX_ROWS: usize = 8;

/// A model of several inputs (float32, an int64 with a default, uint8
/// pixels, token ids below 10) and one of a single float32 input (the
/// request forms that leave names out).
#[cfg(feature = "serve")]
fn fuzz_signatures() -> [crate::serve::Signature; 2] {
    use crate::serve::{InputFeature, Signature};
    use crate::train::Task;
    let feature = |name: &str, dtype, shape: Vec<usize>| InputFeature {
        name: name.into(),
        dtype,
        shape,
        var: false,
        default: None,
        vocab: None,
    };
    let several = Signature {
        inputs: vec![
            feature("x", DType::Float32, vec![3]),
            InputFeature {
                default: Some(vec![7.0]),
                ..feature("n", DType::Int64, vec![])
            },
            feature("img", DType::Uint8, vec![2, 2]),
            InputFeature {
                var: true,
                vocab: Some(10),
                ..feature("tokens", DType::Int64, vec![])
            },
        ],
        task: Task::Classification { classes: 3 },
        class_names: None,
    };
    let single = Signature {
        inputs: vec![feature("x", DType::Float32, vec![4])],
        task: Task::Regression,
        class_names: None,
    };
    [several, single]
}

/// A JSON value picked by the bytes, `depth` levels into a request.
#[cfg(feature = "serve")]
fn json_from(input: &mut Bytes<'_>, depth: u8, names: &[&str]) -> serde_json::Value {
    use serde_json::{Map, Value as Json, json};
    const NUMBERS: [f64; 10] = [
        0.0, 1.0, -1.0, 0.5, 255.0, 256.0, 1e300, -3.5e38, 9.3e18, 1e-320,
    ];
    const TEXTS: [&str; 6] = ["", "NaN", "Infinity", "abc", "AAEC", "\u{1F600}"];
    let choices = if depth >= 3 { 6 } else { 9 };
    match input.below(choices) {
        0 => Json::Null,
        1 => Json::Bool(input.byte() & 1 == 1),
        2 => json!(i64::from(input.byte() as i8) * 3),
        3 => json!(NUMBERS[input.below(10) as usize]),
        4 => Json::String(TEXTS[input.below(6) as usize].into()),
        5 => {
            let b64 = ["AAECAw==", "!!", "", "AA"][input.below(4) as usize];
            json!({ "b64": b64 })
        }
        6 | 7 => Json::Array(
            (0..input.below(5))
                .map(|_| json_from(input, depth + 1, names))
                .collect(),
        ),
        _ => {
            let mut map = Map::new();
            for _ in 0..input.below(5) {
                let key = match input.below(names.len() as u8 + 2) as usize {
                    i if i < names.len() => names[i],
                    i if i == names.len() => "b64",
                    _ => "unknown",
                };
                map.insert(key.into(), json_from(input, depth + 1, names));
            }
            Json::Object(map)
        }
    }
}

/// One example for `signature`, valid two times in three, else with one
/// feature's value replaced, left out, or an unknown key added.
#[cfg(feature = "serve")]
fn valid_or_not(
    input: &mut Bytes<'_>,
    signature: &crate::serve::Signature,
    names: &[&str],
) -> serde_json::Value {
    use serde_json::{Map, Value as Json, json};
    let mut row = Map::new();
    for f in &signature.inputs {
        let count = if f.var {
            input.below(5) as usize
        } else {
            f.width()
        };
        let values: Vec<Json> = (0..count)
            .map(|_| match f.dtype {
                DType::Float32 => json!([0.0, 1.0, -2.5, 0.25][input.below(4) as usize]),
                DType::Uint8 => json!(input.byte()),
                _ => json!(input.below(10)),
            })
            .collect();
        let value = if f.shape.is_empty() && !f.var {
            values.into_iter().next().unwrap_or(Json::Null)
        } else {
            Json::Array(values)
        };
        row.insert(f.name.clone(), value);
    }
    // (An exhausted input reads as zeros: valid rows from then on.)
    if input.below(3) == 1 {
        let key = names[input.below(names.len() as u8) as usize];
        match input.below(3) {
            0 => {
                row.insert(key.into(), json_from(input, 1, names));
            }
            1 => {
                row.remove(key);
            }
            _ => {
                row.insert("unknown".into(), json!(1));
            }
        }
    }
    if signature.inputs.len() == 1 && input.below(2) == 0 {
        // A one-input model's rows may be the value alone.
        return row.into_iter().next().map_or(Json::Null, |(_, v)| v);
    }
    Json::Object(row)
}

/// The columnar form of `rows` (`{name: [value, ...]}`; the list itself
/// for a one-input model, sometimes), and `true`; or now and then any JSON,
/// and `false`.
#[cfg(feature = "serve")]
fn columns_of(
    input: &mut Bytes<'_>,
    signature: &crate::serve::Signature,
    rows: &[serde_json::Value],
) -> (serde_json::Value, bool) {
    use serde_json::{Map, Value as Json};
    if input.below(8) == 7 {
        let names: Vec<&str> = signature.inputs.iter().map(|f| f.name.as_str()).collect();
        return (json_from(input, 0, &names), false);
    }
    let column = |name: &str| {
        let values = rows.iter().map(|row| match row {
            Json::Object(map) => map.get(name).cloned().unwrap_or(Json::Null),
            other => other.clone(),
        });
        Json::Array(values.collect())
    };
    if signature.inputs.len() == 1 && input.below(2) == 0 {
        return (column(&signature.inputs[0].name), true);
    }
    let map: Map<String, Json> = signature
        .inputs
        .iter()
        .map(|f| (f.name.clone(), column(&f.name)))
        .collect();
    (Json::Object(map), true)
}

/// A column's values flattened row-major, as KServe's `data` carries them.
#[cfg(feature = "serve")]
fn flatten(column: Option<&serde_json::Value>) -> serde_json::Value {
    use serde_json::Value as Json;
    fn push(value: &Json, out: &mut Vec<Json>) {
        match value {
            Json::Array(items) => items.iter().for_each(|v| push(v, out)),
            other => out.push(other.clone()),
        }
    }
    let mut out = Vec::new();
    if let Some(column) = column {
        push(column, &mut out);
    }
    Json::Array(out)
}
