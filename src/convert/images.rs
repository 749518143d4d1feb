//! A folder tree `ROOT/<class>/*.{png,jpg,jpeg}` to Examples, in the layout
//! of TensorFlow's image-classification datasets: `image/encoded` (the file's
//! bytes), `image/format` (`png` or `jpeg`), `image/height` and
//! `image/width` (read from the PNG IHDR chunk or the JPEG SOF segment,
//! without decoding), `image/class/label` (the index of the class folder in
//! sorted order) and `image/class/text` (the folder name).
//!
//! With `resize` (the `images` cargo feature), images are decoded, resized to
//! exactly W x H and stored as raw RGB pixels in `image/raw` (uint8, H x W x 3)
//! instead of `image/encoded` and `image/format`.
//!
//! Order: classes sorted by name, files sorted by name within a class.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, json};

use super::encode::ExampleEncoder;
use super::error::{ConvertError, SourceLocation};
use super::output::{BadRows, Chunk, Ctx, Finished, finish, plan_shards};
use super::{Phase, Summary};
use crate::example::{DType, FeatureSpec, Layout, Schema};

/// Whether this build can `--resize` (the `images` cargo feature).
pub const RESIZE_AVAILABLE: bool = cfg!(feature = "images");

/// Options of the image-folder converter.
#[derive(Debug, Clone, Default)]
pub struct ImagesOptions {
    /// Decode and resize every image to `(width, height)`, storing raw RGB
    /// pixels. Needs the `images` cargo feature. By default `None`.
    pub resize: Option<(u32, u32)>,
}

/// Files per encoding task.
const FILES_PER_TASK: usize = 32;

/// The image format and size from a file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) format: &'static str,
    pub(crate) width: u32,
    pub(crate) height: u32,
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
        return Ok(Header {
            format: "png",
            width,
            height,
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
                return Ok(Header {
                    format: "jpeg",
                    width,
                    height,
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

pub(crate) fn convert(
    inputs: &[PathBuf],
    options: &ImagesOptions,
    ctx: &Ctx<'_>,
) -> Result<Summary, ConvertError> {
    if options.resize.is_some() && !RESIZE_AVAILABLE {
        return Err(ConvertError::ResizeUnavailable);
    }
    if let Some((w, h)) = options.resize
        && (w == 0 || h == 0)
    {
        return Err(ConvertError::Options(format!(
            "resize to {w}x{h}: both sides must be at least 1"
        )));
    }
    let [root] = inputs else {
        return Err(ConvertError::Options(format!(
            "images takes one ROOT folder (ROOT/<class>/*.png), {} given",
            inputs.len()
        )));
    };
    let list = |dir: &Path| -> Result<Vec<fs::DirEntry>, ConvertError> {
        let mut entries = fs::read_dir(dir)
            .map_err(|e| ConvertError::read(dir, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ConvertError::read(dir, e))?;
        entries.sort_by_key(|e| e.file_name());
        Ok(entries)
    };
    let mut classes = Vec::new();
    let mut items = Vec::new();
    let mut ignored = 0u64;
    for entry in list(root)? {
        if !entry.path().is_dir() {
            ignored += 1;
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let class = classes.len();
        classes.push(name);
        for file in list(&entry.path())? {
            let path = file.path();
            let is_image = path.is_file()
                && path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                    ["png", "jpg", "jpeg"].contains(&e.to_ascii_lowercase().as_str())
                });
            if is_image {
                items.push(Item { path, class });
            } else {
                ignored += 1;
            }
        }
    }
    if classes.is_empty() {
        return Err(ConvertError::Options(format!(
            "{}: no class folders (expected ROOT/<class>/*.png|jpg)",
            root.display()
        )));
    }

    // Pass 1: check every file's header (and decoding, when resizing).
    let skip = ctx.options.skip_bad_rows;
    let resize = options.resize;
    ctx.begin_phase(Phase::Scanning, items.len() as u64);
    let mut good: Vec<bool> = Vec::with_capacity(items.len());
    let mut bad = BadRows::default();
    let mut bytes_in = 0u64;
    let tasks: Vec<&[Item]> = items.chunks(FILES_PER_TASK).collect();
    let total_items = items.len() as u64;
    ctx.run_ordered(
        tasks.clone(),
        |task| {
            let mut out = Vec::with_capacity(task.len());
            for item in task {
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
                out.push((data.len() as u64, verdict));
            }
            Ok(out)
        },
        |task| SourceLocation::at_byte(task.first().map_or(root, |item| &item.path), 0),
        |results: Vec<(u64, Result<Header, ConvertError>)>| {
            let n = results.len() as u64;
            for (len, verdict) in results {
                match verdict {
                    Ok(_) => {
                        good.push(true);
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
    let total = good.iter().filter(|&&g| g).count() as u64;
    if total == 0 {
        return Err(ConvertError::NoRecords {
            inputs: inputs.to_vec(),
            skipped: bad.count,
        });
    }

    // Pass 2: encode.
    let plan = plan_shards(total, ctx.options.sharding, bytes_in);
    ctx.begin_phase(Phase::Encoding, bytes_in);
    let indexed: Vec<(usize, &[Item])> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (i * FILES_PER_TASK, *t))
        .collect();
    let shards = ctx.write_shards(
        &plan,
        bytes_in,
        indexed,
        |(first, task)| {
            let mut chunk = Chunk::default();
            let mut enc = ExampleEncoder::default();
            for (k, item) in task.iter().enumerate() {
                if !good[first + k] {
                    continue;
                }
                let data = fs::read(&item.path).map_err(|e| ConvertError::read(&item.path, e))?;
                chunk.bytes_in += data.len() as u64;
                let header = read_header(&data).map_err(|(at, problem)| ConvertError::BadRow {
                    location: SourceLocation::at_byte(&item.path, at as u64),
                    problem: format!("{problem} (the file changed during the conversion?)"),
                })?;
                let class = &classes[item.class];
                enc.begin();
                enc.int64(b"image/class/label", item.class as i64);
                enc.bytes(b"image/class/text", class.as_bytes());
                match resize {
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
        },
        |(_, task)| SourceLocation::at_byte(task.first().map_or(root, |item| &item.path), 0),
    )?;

    let scalar = |name: &str, dtype| FeatureSpec {
        name: name.into(),
        dtype,
        layout: Layout::Fixed(Vec::new()),
        default: None,
    };
    let mut features = match resize {
        None => vec![
            scalar("image/encoded", DType::Bytes),
            scalar("image/format", DType::Bytes),
        ],
        Some((w, h)) => vec![FeatureSpec {
            name: "image/raw".into(),
            dtype: DType::Uint8,
            layout: Layout::Fixed(vec![h as usize, w as usize, 3]),
            default: None,
        }],
    };
    features.push(scalar("image/height", DType::Int64));
    features.push(scalar("image/width", DType::Int64));
    features.push(scalar("image/class/label", DType::Int64));
    features.push(scalar("image/class/text", DType::Bytes));
    let schema = Schema {
        features,
        label: Some("image/class/label".into()),
    };
    let mut extra = Map::new();
    extra.insert("classes".into(), json!(classes));
    extra.insert("files_ignored".into(), json!(ignored));
    if let Some((w, h)) = resize {
        extra.insert("resize".into(), json!([w, h]));
    }
    finish(
        ctx,
        shards,
        Finished {
            schema,
            format: "images",
            inputs: inputs.to_vec(),
            bytes_in,
            rows_skipped: bad.count,
            bad_rows: bad.kept,
            extra,
            warnings: if ignored > 0 {
                vec![format!(
                    "{}: {ignored} file(s) ignored (not a class folder, or not .png/.jpg/.jpeg)",
                    root.display()
                )]
            } else {
                Vec::new()
            },
        },
    )
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
                height: 480
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
                height: 3
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
