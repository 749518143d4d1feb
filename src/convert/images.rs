//! A folder tree `ROOT/<class>/*.{png,jpg,jpeg}` to Examples.
//!
//! By default in TFDS's layout: `image` (the file's bytes) and `label` (the
//! index of the class folder in sorted order), with `image` marked in the
//! schema as an image feature (`image:image:HxWxC`) at the images' common
//! size (read from the PNG IHDR chunk or the JPEG SOF segment, without
//! decoding; grey when every image is), or `224x224x3:center` when sizes
//! differ, so `tfpipe train` on the schema decodes them.
//!
//! With [`ImagesLayout::Imagenet`], the layout of tensorflow/models'
//! `build_imagenet_data.py`: `image/encoded` (marked as an image in the
//! schema, as above), `image/format` (`png` or `jpeg`), `image/height`,
//! `image/width`, `image/class/label` and `image/class/text` (the folder
//! name).
//!
//! With `resize` (the `images` cargo feature), images are decoded, resized to
//! exactly W x H and stored as raw RGB pixels (uint8, H x W x 3): in `image`
//! (TFDS layout) or in `image/raw` instead of `image/encoded` and
//! `image/format` (ImageNet layout).
//!
//! Order: classes sorted by name, files sorted by name within a class.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, json};

use super::driver::{Scanned, Source};
use super::encode::ExampleEncoder;
use super::error::{ConvertError, ConvertOption, SourceLocation};
use super::output::{BadRows, Chunk, Ctx, Finished};
use super::{FixedSchema, Phase};
use crate::example::{DType, FeatureSpec, Layout, Schema};

/// Whether this build can `--resize` (the `images` cargo feature).
pub const RESIZE_AVAILABLE: bool = cfg!(feature = "images");

/// The feature names an image folder is written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImagesLayout {
    /// TFDS's `image` and `label` (the default).
    #[default]
    Tfds,
    /// tensorflow/models' ImageNet layout: `image/encoded`, `image/format`,
    /// `image/height`, `image/width`, `image/class/label`, `image/class/text`.
    Imagenet,
}

/// Options of the image-folder converter.
#[derive(Debug, Clone, Default)]
pub struct ImagesOptions {
    /// The feature names. By default TFDS's (`image`, `label`).
    pub layout: ImagesLayout,
    /// Decode and resize every image to `(width, height)`, storing raw RGB
    /// pixels. Needs the `images` cargo feature. By default `None`.
    pub resize: Option<(u32, u32)>,
    /// Convert with an earlier conversion's schema (`--schema`): its classes
    /// keep their indices, and a class folder outside them is a bad row for
    /// each of its images. By default `None`.
    pub schema: Option<FixedSchema>,
}

/// Files per encoding task.
const FILES_PER_TASK: usize = 32;

/// The image format and size from a file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) format: &'static str,
    pub(crate) width: u32,
    pub(crate) height: u32,
    /// 1 for a grey image (PNG colour type 0 or 4, a one-component JPEG),
    /// else 3.
    pub(crate) channels: u8,
}

/// Reads the size from a PNG's IHDR chunk or a JPEG's SOF segment.
/// `Err((offset, problem))` when the header is not what it should be.
pub(crate) fn read_header(data: &[u8]) -> Result<Header, (usize, String)> {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    let be16 = |at: usize| u32::from(u16::from_be_bytes([data[at], data[at + 1]]));
    if data.starts_with(PNG) {
        if data.len() < 24 {
            return Err((
                data.len(),
                "truncated PNG: the file ends inside the IHDR chunk".into(),
            ));
        }
        if &data[12..16] != b"IHDR" {
            return Err((
                12,
                format!(
                    "PNG without IHDR as its first chunk (found {:?})",
                    String::from_utf8_lossy(&data[12..16])
                ),
            ));
        }
        let width = u32::from_be_bytes([data[16], data[17], data[18], data[19]]);
        let height = u32::from_be_bytes([data[20], data[21], data[22], data[23]]);
        if width == 0 || height == 0 {
            return Err((
                16,
                format!("PNG of {width}x{height} pixels: expected a non-empty image"),
            ));
        }
        let grey = matches!(data.get(25), Some(0 | 4));
        return Ok(Header {
            format: "png",
            width,
            height,
            channels: if grey { 1 } else { 3 },
        });
    }
    if data.starts_with(b"\xFF\xD8") {
        let mut i = 2;
        loop {
            // Markers may be preceded by any number of 0xFF fill bytes.
            if i < data.len() && data[i] != 0xFF {
                return Err((
                    i,
                    format!("JPEG: expected a marker (0xFF), found {:#04x}", data[i]),
                ));
            }
            while i < data.len() && data[i] == 0xFF {
                i += 1;
            }
            if i >= data.len() {
                return Err((
                    data.len(),
                    "truncated JPEG: no SOF segment before the end of the file".into(),
                ));
            }
            let marker = data[i];
            i += 1;
            match marker {
                0xD0..=0xD7 | 0x01 => continue,
                0xD9 | 0xDA => {
                    return Err((
                        i - 2,
                        "JPEG without a SOF segment before the image data: expected a frame header"
                            .into(),
                    ));
                }
                _ => {}
            }
            if i + 2 > data.len() {
                return Err((
                    data.len(),
                    "truncated JPEG: the file ends inside a segment header".into(),
                ));
            }
            let len = be16(i) as usize;
            let is_sof = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
            if is_sof {
                if i + 7 > data.len() {
                    return Err((
                        data.len(),
                        "truncated JPEG: the file ends inside the SOF segment".into(),
                    ));
                }
                let height = be16(i + 3);
                let width = be16(i + 5);
                if width == 0 || height == 0 {
                    return Err((
                        i + 3,
                        format!(
                            "JPEG of {width}x{height} pixels: expected a non-empty image (a height of 0 in SOF is not supported)"
                        ),
                    ));
                }
                let grey = data.get(i + 7) == Some(&1);
                return Ok(Header {
                    format: "jpeg",
                    width,
                    height,
                    channels: if grey { 1 } else { 3 },
                });
            }
            if len < 2 {
                return Err((i, format!("JPEG segment length {len}: expected at least 2")));
            }
            i += len;
        }
    }
    let shown: Vec<String> = data.iter().take(4).map(|b| format!("{b:02x}")).collect();
    Err((
        0,
        format!(
            "not a PNG or JPEG file: starts with {} (expected 89 50 4e 47 or ff d8)",
            shown.join(" ")
        ),
    ))
}

struct Item {
    path: PathBuf,
    class: usize,
}

/// The image-folder converter as a [`Source`].
pub(crate) struct ImagesSource<'a> {
    inputs: &'a [PathBuf],
    options: &'a ImagesOptions,
    /// Class names by class index.
    classes: Vec<String>,
    items: Vec<Item>,
    /// Per item: passed the scan (bad files are skipped under `--skip-bad-rows`).
    good: Vec<bool>,
    /// The sizes of the good images.
    sizes: Sizes,
}

/// What the images' headers have in common.
#[derive(Debug, Default, Clone, Copy)]
struct Sizes {
    /// `(height, width)` of the first image.
    first: Option<(u32, u32)>,
    mixed: bool,
    colour: bool,
}

impl Sizes {
    fn add(&mut self, header: &Header) {
        let size = (header.height, header.width);
        self.mixed |= self.first.is_some_and(|first| first != size);
        self.first.get_or_insert(size);
        self.colour |= header.channels > 1;
    }

    /// The image spec of the `image` feature: the common size, or a
    /// 224x224 centre crop when sizes differ.
    fn image_options(&self) -> crate::image::ImageOptions {
        let channels = if self.colour { 3 } else { 1 };
        match self.first {
            Some((h, w)) if !self.mixed => {
                crate::image::ImageOptions::new(h as usize, w as usize, channels)
            }
            _ => crate::image::ImageOptions {
                crop: crate::image::Crop::Center {
                    fraction: crate::image::DEFAULT_CENTER_FRACTION,
                },
                ..crate::image::ImageOptions::new(224, 224, channels)
            },
        }
    }
}

/// Files listed in a directory, sorted by name.
fn list(dir: &Path) -> Result<Vec<fs::DirEntry>, ConvertError> {
    let mut entries = fs::read_dir(dir)
        .map_err(|e| ConvertError::read(dir, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConvertError::read(dir, e))?;
    entries.sort_by_key(|e| e.file_name());
    Ok(entries)
}

fn is_image(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| ["png", "jpg", "jpeg"].contains(&e.to_ascii_lowercase().as_str()))
}

impl<'a> ImagesSource<'a> {
    pub(crate) fn new(inputs: &'a [PathBuf], options: &'a ImagesOptions) -> Self {
        ImagesSource {
            inputs,
            options,
            classes: Vec::new(),
            items: Vec::new(),
            good: Vec::new(),
            sizes: Sizes::default(),
        }
    }

    fn root(&self) -> Result<&'a Path, ConvertError> {
        if self.options.resize.is_some() && !RESIZE_AVAILABLE {
            return Err(ConvertError::ResizeUnavailable);
        }
        if let Some((w, h)) = self.options.resize
            && (w == 0 || h == 0)
        {
            return Err(ConvertError::options(
                ConvertOption::Resize,
                format!("resize to {w}x{h}: both sides must be at least 1"),
            ));
        }
        match self.inputs {
            [root] => Ok(root),
            _ => Err(ConvertError::options(
                ConvertOption::Inputs,
                format!(
                    "images takes one ROOT folder (ROOT/<class>/*.png), {} given",
                    self.inputs.len()
                ),
            )),
        }
    }

    /// Lists the class folders and their images. With a fixed vocabulary
    /// (`--schema`), the classes and their indices are the schema's, and a
    /// folder outside it is a bad row for each of its images. Returns the
    /// number of files ignored and the bad rows found.
    fn list_items(&mut self, root: &Path, skip: bool) -> Result<(u64, BadRows), ConvertError> {
        let fixed = self
            .options
            .schema
            .as_ref()
            .and_then(|f| f.vocabulary.as_ref());
        if let Some(vocab) = fixed {
            self.classes = vocab.clone();
        }
        let mut ignored = 0u64;
        let mut bad = BadRows::default();
        let mut folders = 0;
        for entry in list(root)? {
            if !entry.path().is_dir() {
                ignored += 1;
                continue;
            }
            folders += 1;
            let name = entry.file_name().to_string_lossy().into_owned();
            let class = match fixed {
                None => {
                    self.classes.push(name.clone());
                    Some(self.classes.len() - 1)
                }
                Some(vocab) => vocab.iter().position(|c| *c == name),
            };
            for file in list(&entry.path())? {
                let path = file.path();
                if !is_image(&path) {
                    ignored += 1;
                    continue;
                }
                match class {
                    Some(class) => self.items.push(Item { path, class }),
                    None => {
                        let e = ConvertError::BadRow {
                            location: SourceLocation::at_byte(&path, 0),
                            problem: format!(
                                "class folder {name:?} is not in the schema's vocabulary of {} classes ({})",
                                self.classes.len(),
                                self.options
                                    .schema
                                    .as_ref()
                                    .map_or(String::new(), |f| f.path.display().to_string())
                            ),
                        };
                        if !skip {
                            return Err(e);
                        }
                        bad.push(e);
                    }
                }
            }
        }
        if folders == 0 {
            return Err(ConvertError::options(
                ConvertOption::Inputs,
                format!(
                    "{}: no class folders (expected ROOT/<class>/*.png|jpg)",
                    root.display()
                ),
            ));
        }
        Ok((ignored, bad))
    }

    fn schema(&self) -> Schema {
        if self.options.layout == ImagesLayout::Tfds {
            let image = match self.options.resize {
                None => FeatureSpec::image("image", self.sizes.image_options()),
                Some((w, h)) => {
                    FeatureSpec::fixed("image", DType::Uint8, &[h as usize, w as usize, 3])
                }
            };
            return Schema {
                features: vec![image, FeatureSpec::fixed("label", DType::Int64, &[])],
                label: Some("label".into()),
            };
        }
        let scalar = |name: &str, dtype| FeatureSpec {
            name: name.into(),
            dtype,
            layout: Layout::Fixed(Vec::new()),
            default: None,
            image: None,
        };
        let mut features = match self.options.resize {
            None => vec![
                FeatureSpec::image("image/encoded", self.sizes.image_options()),
                scalar("image/format", DType::Bytes),
            ],
            Some((w, h)) => vec![FeatureSpec {
                name: "image/raw".into(),
                dtype: DType::Uint8,
                layout: Layout::Fixed(vec![h as usize, w as usize, 3]),
                default: None,
                image: None,
            }],
        };
        features.push(scalar("image/height", DType::Int64));
        features.push(scalar("image/width", DType::Int64));
        features.push(scalar("image/class/label", DType::Int64));
        features.push(scalar("image/class/text", DType::Bytes));
        Schema {
            features,
            label: Some("image/class/label".into()),
        }
    }
}

/// Reads one file and judges it: its length and header, or the bad row.
fn check_file(
    item: &Item,
    resize: Option<(u32, u32)>,
) -> Result<(u64, Result<Header, ConvertError>), ConvertError> {
    let data = fs::read(&item.path).map_err(|e| ConvertError::read(&item.path, e))?;
    let verdict = read_header(&data)
        .map_err(|(at, problem)| ConvertError::BadRow {
            location: SourceLocation::at_byte(&item.path, at as u64),
            problem,
        })
        .and_then(|h| match resize {
            Some((w, hh)) => pixels(&item.path, &data, w, hh).map(|_| h),
            None => Ok(h),
        });
    Ok((data.len() as u64, verdict))
}

impl Source for ImagesSource<'_> {
    /// (first item, end item).
    type Task = (usize, usize);

    fn scan(&mut self, ctx: &Ctx<'_>) -> Result<Scanned<Self::Task>, ConvertError> {
        let root = self.root()?;
        let skip = ctx.options.skip_bad_rows;
        let (ignored, mut bad) = self.list_items(root, skip)?;
        // Check every file's header (and decoding, when resizing).
        let resize = self.options.resize;
        let items = &self.items;
        let total_items = items.len() as u64;
        ctx.begin_phase(Phase::Scanning, total_items);
        let mut good: Vec<bool> = Vec::with_capacity(items.len());
        let mut sizes = Sizes::default();
        let mut bytes_in = 0u64;
        let tasks: Vec<Self::Task> = (0..items.len())
            .step_by(FILES_PER_TASK)
            .map(|from| (from, (from + FILES_PER_TASK).min(items.len())))
            .collect();
        ctx.run_ordered(
            tasks.clone(),
            |(from, to)| {
                items[from..to]
                    .iter()
                    .map(|item| check_file(item, resize))
                    .collect()
            },
            |&(from, _)| SourceLocation::at_byte(items.get(from).map_or(root, |i| &i.path), 0),
            |results: Vec<(u64, Result<Header, ConvertError>)>| {
                let n = results.len() as u64;
                for (len, verdict) in results {
                    match verdict {
                        Ok(header) => {
                            good.push(true);
                            sizes.add(&header);
                            bytes_in += len;
                        }
                        Err(e) if skip => {
                            good.push(false);
                            bad.push(e);
                        }
                        Err(e) => return Err(e),
                    }
                }
                ctx.advance(Phase::Scanning, total_items, n, n);
                Ok(())
            },
        )?;
        self.good = good;
        self.sizes = sizes;
        let records = self.good.iter().filter(|&&g| g).count() as u64;
        let mut extra = Map::new();
        extra.insert("classes".into(), json!(self.classes));
        extra.insert("files_ignored".into(), json!(ignored));
        if let Some((w, h)) = resize {
            extra.insert("resize".into(), json!([w, h]));
        }
        let warnings = if ignored > 0 {
            vec![format!(
                "{}: {ignored} file(s) ignored (not a class folder, or not .png/.jpg/.jpeg)",
                root.display()
            )]
        } else {
            Vec::new()
        };
        Ok(Scanned {
            records,
            tasks,
            done: Finished {
                schema: self.schema(),
                format: "images",
                inputs: self.inputs.to_vec(),
                bytes_in,
                rows_skipped: bad.count,
                bad_rows: bad.kept,
                extra,
                warnings,
            },
        })
    }

    fn encode(&self, (from, to): Self::Task) -> Result<Chunk, ConvertError> {
        let mut chunk = Chunk::default();
        let mut enc = ExampleEncoder::default();
        for (item, _) in self.items[from..to]
            .iter()
            .zip(&self.good[from..to])
            .filter(|(_, good)| **good)
        {
            let data = fs::read(&item.path).map_err(|e| ConvertError::read(&item.path, e))?;
            chunk.bytes_in += data.len() as u64;
            let header = read_header(&data).map_err(|(at, problem)| ConvertError::BadRow {
                location: SourceLocation::at_byte(&item.path, at as u64),
                problem: format!("{problem} (the file changed during the conversion?)"),
            })?;
            let class = &self.classes[item.class];
            enc.begin();
            if self.options.layout == ImagesLayout::Tfds {
                // Keys in sorted order, as TensorFlow serializes the map.
                match self.options.resize {
                    None => enc.bytes(b"image", &data),
                    Some((w, h)) => enc.bytes(b"image", &pixels(&item.path, &data, w, h)?),
                }
                enc.int64(b"label", item.class as i64);
                enc.end();
                continue;
            }
            enc.int64(b"image/class/label", item.class as i64);
            enc.bytes(b"image/class/text", class.as_bytes());
            match self.options.resize {
                None => {
                    enc.bytes(b"image/encoded", &data);
                    enc.bytes(b"image/format", header.format.as_bytes());
                    enc.int64(b"image/height", i64::from(header.height));
                    enc.int64(b"image/width", i64::from(header.width));
                }
                Some((w, h)) => {
                    let raw = pixels(&item.path, &data, w, h)?;
                    enc.int64(b"image/height", i64::from(h));
                    enc.bytes(b"image/raw", &raw);
                    enc.int64(b"image/width", i64::from(w));
                }
            }
            enc.end();
        }
        chunk.fill(enc);
        Ok(chunk)
    }

    fn locate(&self, &(from, _): &Self::Task) -> SourceLocation {
        match self.items.get(from) {
            Some(item) => SourceLocation::at_byte(&item.path, 0),
            None => SourceLocation::at_byte(self.inputs.first().map_or(Path::new(""), |p| p), 0),
        }
    }
}

/// Decodes and resizes to exactly `w` x `h` RGB pixels.
#[cfg(feature = "images")]
fn pixels(path: &Path, data: &[u8], w: u32, h: u32) -> Result<Vec<u8>, ConvertError> {
    let image = image::load_from_memory(data).map_err(|e| ConvertError::BadRow {
        location: SourceLocation::at_byte(path, 0),
        problem: format!("cannot decode the image: {e}"),
    })?;
    Ok(image
        .resize_exact(w, h, image::imageops::FilterType::Triangle)
        .to_rgb8()
        .into_raw())
}

#[cfg(not(feature = "images"))]
fn pixels(_path: &Path, _data: &[u8], _w: u32, _h: u32) -> Result<Vec<u8>, ConvertError> {
    Err(ConvertError::ResizeUnavailable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_png_and_jpeg_sizes() {
        let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        png.extend_from_slice(&640u32.to_be_bytes());
        png.extend_from_slice(&480u32.to_be_bytes());
        assert_eq!(
            read_header(&png),
            Ok(Header {
                format: "png",
                width: 640,
                height: 480,
                channels: 3
            })
        );
        // SOI, APP0 (length 16), fill byte, SOF0 with height 3, width 5.
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10];
        jpeg.extend_from_slice(&[0; 14]);
        jpeg.extend_from_slice(&[0xFF, 0xFF, 0xC0, 0x00, 0x11, 0x08, 0x00, 0x03, 0x00, 0x05]);
        assert_eq!(
            read_header(&jpeg),
            Ok(Header {
                format: "jpeg",
                width: 5,
                height: 3,
                channels: 3
            })
        );
    }

    #[test]
    fn bad_headers_say_where() {
        assert_eq!(read_header(b"GIF89a").unwrap_err().0, 0);
        assert_eq!(read_header(b"\x89PNG\r\n\x1a\n\x00\x00").unwrap_err().0, 10);
        let err = read_header(&[0xFF, 0xD8, 0xFF, 0xDA, 0, 2]).unwrap_err();
        assert_eq!(err.0, 2);
        assert!(err.1.contains("SOF"));
        assert!(read_header(&[0xFF, 0xD8, 0xFF, 0xE0, 0x00]).is_err());
        assert!(read_header(&[0xFF, 0xD8, 0x12]).is_err());
    }
}
