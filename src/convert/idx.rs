//! MNIST IDX files to Examples: `image_raw` (the rows x cols pixels as one
//! bytes value, or with `--as-float` a float list scaled to [0, 1]) and
//! `label` (int64).
//!
//! IDX format (big-endian): magic `00 00 08 NDIMS` (0x08: unsigned bytes),
//! NDIMS u32 sizes, then the elements. Images are `00 00 08 03` (count, rows,
//! cols), labels `00 00 08 01` (count). Gzip input is detected by its magic
//! bytes; byte offsets in errors are in the uncompressed stream.

use std::path::{Path, PathBuf};

use serde_json::{Map, json};

use super::FixedSchema;
use super::driver::{Scanned, Source};
use super::encode::ExampleEncoder;
use super::error::{ConvertError, ConvertOption, SourceLocation};
use super::output::{Chunk, Ctx, Finished, Input};
use crate::example::{DType, FeatureSpec, Layout, Schema};

/// Options of the IDX converter.
#[derive(Debug, Clone, Default)]
pub struct IdxOptions {
    /// The labels file. By default inferred from the images file name
    /// (`*-images-idx3-ubyte*` -> `*-labels-idx1-ubyte*`); only with one input.
    pub labels: Option<PathBuf>,
    /// Store pixels as float32 in [0, 1] instead of raw bytes. By default `false`.
    pub as_float: bool,
    /// The schema this conversion must produce (`--schema`): an error if the
    /// input converts to another one (image size, pixel type). By default `None`.
    pub schema: Option<FixedSchema>,
}

/// Images per task.
const IMAGES_PER_TASK: usize = 2048;

/// The labels file that goes with an images file, by MNIST's naming:
/// `train-images-idx3-ubyte.gz` -> `train-labels-idx1-ubyte.gz`.
///
/// ```
/// use std::path::{Path, PathBuf};
/// use tfpipe::convert::labels_path_for;
///
/// assert_eq!(
///     labels_path_for(Path::new("data/t10k-images-idx3-ubyte.gz")),
///     Some(PathBuf::from("data/t10k-labels-idx1-ubyte.gz"))
/// );
/// assert_eq!(labels_path_for(Path::new("digits.bin")), None);
/// ```
pub fn labels_path_for(images: &Path) -> Option<PathBuf> {
    let name = images.file_name()?.to_str()?;
    for (from, to) in [
        ("-images-idx3-ubyte", "-labels-idx1-ubyte"),
        ("-images.idx3-ubyte", "-labels.idx1-ubyte"),
    ] {
        if name.contains(from) {
            return Some(images.with_file_name(name.replacen(from, to, 1)));
        }
    }
    None
}

/// A parsed IDX file: its dimensions and where the elements start.
struct Idx {
    path: PathBuf,
    data: Input,
    dims: Vec<usize>,
    start: usize,
}

impl Idx {
    fn open(path: &Path, ndims: u8, what: &str) -> Result<Idx, ConvertError> {
        let data = Input::load(path)?;
        let bad = |byte: usize, problem: String| ConvertError::BadInput {
            location: SourceLocation::at_byte(path, byte as u64),
            problem,
        };
        let expected_magic = format!("00 00 08 {ndims:02x}");
        if data.len() < 4 {
            return Err(bad(
                data.len(),
                format!(
                    "truncated IDX header: the file ends after {} bytes, expected the 4-byte magic {expected_magic} of an {what} file",
                    data.len()
                ),
            ));
        }
        if data[0] != 0 || data[1] != 0 || data[3] != ndims {
            return Err(bad(
                0,
                format!(
                    "not an IDX {what} file: magic {:02x} {:02x} {:02x} {:02x}, expected {expected_magic}",
                    data[0], data[1], data[2], data[3]
                ),
            ));
        }
        if data[2] != 0x08 {
            return Err(bad(
                2,
                format!(
                    "IDX element type {:#04x} is not supported: expected 0x08 (unsigned bytes)",
                    data[2]
                ),
            ));
        }
        let start = 4 + 4 * ndims as usize;
        if data.len() < start {
            return Err(bad(
                data.len(),
                format!(
                    "truncated IDX header: expected {start} header bytes ({ndims} sizes), the file ends after {}",
                    data.len()
                ),
            ));
        }
        let dims: Vec<usize> = (0..ndims as usize)
            .map(|i| {
                let b = &data[4 + 4 * i..8 + 4 * i];
                u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
            })
            .collect();
        if let Some(i) = (1..dims.len()).find(|&i| dims[i] == 0) {
            return Err(bad(
                4 + 4 * i,
                format!(
                    "IDX {what} of size {}: an item with 0 elements cannot be converted",
                    dims[1..]
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join("x")
                ),
            ));
        }
        let payload = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(4, format!("implausible IDX sizes {dims:?}")))?;
        let available = data.len() - start;
        if available < payload {
            let per_item: usize = dims[1..].iter().product::<usize>().max(1);
            return Err(bad(
                data.len(),
                format!(
                    "truncated IDX {what} file: the header promises {} {what} of {} bytes ({payload} bytes after the {start}-byte header), the file ends after {available} (inside {what} item {})",
                    dims[0],
                    per_item,
                    available / per_item
                ),
            ));
        }
        if available > payload {
            return Err(bad(
                start + payload,
                format!(
                    "{} unexpected bytes after the {} {what} the header announces",
                    available - payload,
                    dims[0]
                ),
            ));
        }
        Ok(Idx {
            path: path.to_path_buf(),
            data,
            dims,
            start,
        })
    }
}

struct Pair {
    images: Idx,
    labels: Idx,
    item: usize,
}

/// The IDX converter as a [`Source`]: the header checks are the scan.
pub(crate) struct IdxSource<'a> {
    inputs: &'a [PathBuf],
    options: &'a IdxOptions,
    pairs: Vec<Pair>,
}

impl<'a> IdxSource<'a> {
    pub(crate) fn new(inputs: &'a [PathBuf], options: &'a IdxOptions) -> Self {
        IdxSource {
            inputs,
            options,
            pairs: Vec::new(),
        }
    }

    /// Opens every images file with its labels file; both must agree.
    fn open_pairs(&self) -> Result<Vec<Pair>, ConvertError> {
        if self.options.labels.is_some() && self.inputs.len() != 1 {
            return Err(ConvertError::options(ConvertOption::Labels,
                "one labels file was given, so give exactly one images file (or let each labels file be inferred)".into(),
            ));
        }
        let mut pairs = Vec::with_capacity(self.inputs.len());
        for path in self.inputs {
            let labels_path = match &self.options.labels {
                Some(p) => p.clone(),
                None => labels_path_for(path).ok_or_else(|| {
                    ConvertError::options(ConvertOption::Labels, format!(
                        "{}: cannot infer the labels file from this name (expected *-images-idx3-ubyte*); name it explicitly",
                        path.display()
                    ))
                })?,
            };
            let images = Idx::open(path, 3, "images")?;
            let labels = Idx::open(&labels_path, 1, "labels")?;
            if labels.dims[0] != images.dims[0] {
                return Err(ConvertError::BadInput {
                    location: SourceLocation::at_byte(&labels.path, 4),
                    problem: format!(
                        "the labels file has {} labels, but the images file {} has {} images (expected one label per image)",
                        labels.dims[0],
                        images.path.display(),
                        images.dims[0]
                    ),
                });
            }
            let item = images.dims[1] * images.dims[2];
            pairs.push(Pair {
                images,
                labels,
                item,
            });
        }
        Ok(pairs)
    }

    fn schema(&self, shape: &[usize]) -> Schema {
        Schema {
            features: vec![
                FeatureSpec {
                    name: "image_raw".into(),
                    dtype: if self.options.as_float {
                        DType::Float32
                    } else {
                        DType::Uint8
                    },
                    layout: Layout::Fixed(shape.to_vec()),
                    default: None,
                    image: None,
                },
                FeatureSpec {
                    name: "label".into(),
                    dtype: DType::Int64,
                    layout: Layout::Fixed(Vec::new()),
                    default: None,
                    image: None,
                },
            ],
            label: Some("label".into()),
        }
    }
}

impl Source for IdxSource<'_> {
    /// (pair, first image, end image).
    type Task = (usize, usize, usize);

    fn scan(&mut self, _ctx: &Ctx<'_>) -> Result<Scanned<Self::Task>, ConvertError> {
        self.pairs = self.open_pairs()?;
        let pairs = &self.pairs;
        let shape: Vec<usize> = pairs[0].images.dims[1..].to_vec();
        if let Some(other) = pairs.iter().find(|p| p.images.dims[1..] != shape[..]) {
            return Err(ConvertError::BadInput {
                location: SourceLocation::at_byte(&other.images.path, 8),
                problem: format!(
                    "images of {:?}, but the first file's are {shape:?}: all inputs need the same image shape",
                    &other.images.dims[1..]
                ),
            });
        }
        let records: u64 = pairs.iter().map(|p| p.images.dims[0] as u64).sum();
        let bytes_in: u64 = pairs
            .iter()
            .map(|p| (p.images.data.len() + p.labels.data.len()) as u64)
            .sum();
        let mut tasks = Vec::new();
        for (i, p) in pairs.iter().enumerate() {
            let n = p.images.dims[0];
            let mut from = 0;
            while from < n {
                let to = (from + IMAGES_PER_TASK).min(n);
                tasks.push((i, from, to));
                from = to;
            }
        }
        let mut counts = [0u64; 256];
        for p in pairs {
            for &l in &p.labels.data[p.labels.start..] {
                counts[l as usize] += 1;
            }
        }
        let mut extra = Map::new();
        extra.insert("image_shape".into(), json!(shape));
        extra.insert(
            "labels".into(),
            json!(
                pairs
                    .iter()
                    .map(|p| p.labels.path.display().to_string())
                    .collect::<Vec<_>>()
            ),
        );
        let mut label_counts = Map::new();
        for (label, &count) in counts.iter().enumerate() {
            if count > 0 {
                label_counts.insert(label.to_string(), json!(count));
            }
        }
        extra.insert(
            "label_counts".into(),
            serde_json::Value::Object(label_counts),
        );
        Ok(Scanned {
            records,
            tasks,
            done: Finished {
                schema: self.schema(&shape),
                format: "idx",
                inputs: self.inputs.to_vec(),
                bytes_in,
                rows_skipped: 0,
                bad_rows: Vec::new(),
                extra,
                warnings: Vec::new(),
            },
        })
    }

    fn encode(&self, (i, from, to): Self::Task) -> Result<Chunk, ConvertError> {
        Ok(encode(&self.pairs[i], from, to, self.options.as_float))
    }

    fn locate(&self, &(i, from, _): &Self::Task) -> SourceLocation {
        let images = &self.pairs[i].images;
        SourceLocation::at_byte(
            &images.path,
            (images.start + from * self.pairs[i].item) as u64,
        )
    }
}

fn encode(pair: &Pair, from: usize, to: usize, as_float: bool) -> Chunk {
    let item = pair.item;
    let images = &pair.images.data[pair.images.start..];
    let labels = &pair.labels.data[pair.labels.start..];
    let per_record = if as_float { 4 * item + 32 } else { item + 32 };
    let mut chunk = Chunk {
        bytes_in: ((to - from) * (item + 1)) as u64,
        ..Chunk::default()
    };
    let mut enc = ExampleEncoder::with_capacity((to - from) * per_record);
    for i in from..to {
        let pixels = &images[i * item..(i + 1) * item];
        enc.begin();
        if as_float {
            enc.floats_from(
                b"image_raw",
                item,
                pixels.iter().map(|&p| f32::from(p) / 255.0),
            );
        } else {
            enc.bytes(b"image_raw", pixels);
        }
        enc.int64(b"label", i64::from(labels[i]));
        enc.end();
    }
    chunk.fill(enc);
    chunk
}
