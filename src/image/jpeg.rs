//! Decoding only the top rows of a JPEG: the row half of TensorFlow's
//! `decode_and_crop_jpeg`.
//!
//! A sequential JPEG whose first scan holds every component is coded one
//! MCU row after another, top to bottom. Lowering the height in its frame
//! header (SOF) makes a decoder stop after the rows above the new height,
//! leaving the entropy-coded data below unread: rows under a crop window
//! cost nothing. The lowered height keeps one MCU row more than the window
//! needs, so that chroma upsampling of the window's last rows sees the same
//! neighbours as in a full decode and the window's pixels are the full
//! decode's exactly (tested below).
//!
//! Progressive JPEGs (each scan covers the whole image) and sequential ones
//! with one scan per component are decoded whole. So is a stream that does
//! not end with an EOI marker: decoding it whole reports the truncation,
//! which a shortened decode would never reach.
//!
//! DCT-scaled decoding (1/2, 1/4, 1/8 of the size; see
//! [`Decoder::decode_window_scaled`](super::Decoder::decode_window_scaled))
//! is done by the vendored zune-jpeg (vendor/zune-jpeg/TFPIPE-PATCH.md) on
//! the shortened stream: a scaled decode upsamples nothing (each component
//! comes out at the output's resolution), so its rows are each block row's
//! own and the rows above the window's bottom equal a whole scaled
//! decode's (tested below).

/// What the marker segments before the first scan say about a JPEG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Frame {
    /// Byte offset of the frame header's 16-bit height.
    height_at: usize,
    /// Rows.
    pub(super) height: usize,
    /// Columns.
    pub(super) width: usize,
    /// 1 for a one-component (grey) JPEG, else 3.
    pub(super) channels: u8,
    /// Rows of one MCU: 8 times the largest vertical sampling factor.
    mcu_rows: usize,
    /// Whether only the top rows can be decoded (see the module doc).
    rows_first: bool,
}

impl Frame {
    /// Reads the marker segments of `bytes` up to the first scan; `None`
    /// when they do not parse (the codec then reports why).
    pub(super) fn read(bytes: &[u8]) -> Option<Frame> {
        let mut at = 2; // after SOI
        let mut frame: Option<(Frame, u8)> = None;
        loop {
            // Markers may be preceded by any number of 0xFF fill bytes.
            while *bytes.get(at)? == 0xFF && *bytes.get(at + 1)? == 0xFF {
                at += 1;
            }
            if *bytes.get(at)? != 0xFF {
                return None;
            }
            let marker = *bytes.get(at + 1)?;
            let length = usize::from(u16::from_be_bytes([
                *bytes.get(at + 2)?,
                *bytes.get(at + 3)?,
            ]));
            let segment = bytes.get(at + 4..at + 2 + length)?;
            match marker {
                0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                    frame = Some((Frame::from_sof(marker, at, segment)?, *segment.get(5)?));
                }
                0xDA => {
                    let (mut frame, components) = frame?;
                    // The first scan must hold every component.
                    frame.rows_first &= *segment.first()? == components;
                    frame.rows_first &= ends_with_eoi(bytes);
                    return Some(frame);
                }
                _ => {}
            }
            at += 2 + length;
        }
    }

    /// A frame header's segment (after its length) at marker `marker`.
    fn from_sof(marker: u8, at: usize, segment: &[u8]) -> Option<Frame> {
        let height = usize::from(u16::from_be_bytes([*segment.get(1)?, *segment.get(2)?]));
        let width = usize::from(u16::from_be_bytes([*segment.get(3)?, *segment.get(4)?]));
        let components = usize::from(*segment.get(5)?);
        let max_vertical = (0..components)
            .map(|c| segment.get(7 + 3 * c).map(|hv| hv & 0x0F))
            .collect::<Option<Vec<u8>>>()?
            .into_iter()
            .max()?;
        Some(Frame {
            height_at: at + 5,
            height,
            width,
            channels: if components == 1 { 1 } else { 3 },
            mcu_rows: 8 * usize::from(max_vertical.clamp(1, 4)),
            // SOF0 (baseline) and SOF1 (extended sequential, Huffman).
            rows_first: matches!(marker, 0xC0 | 0xC1),
        })
    }

    /// How many rows to decode so that rows `0..rows` equal a full decode's:
    /// `rows` rounded up to whole MCU rows, plus one MCU row, at most the
    /// image's height (always the whole height when only whole decodes work).
    pub(super) fn rows_to_decode(&self, rows: usize) -> usize {
        if !self.rows_first {
            return self.height;
        }
        let whole = rows.div_ceil(self.mcu_rows) * self.mcu_rows;
        (whole + self.mcu_rows).min(self.height)
    }

    /// `bytes` with the frame's height set to `rows`, into `out` (reused).
    pub(super) fn shortened(&self, bytes: &[u8], rows: usize, out: &mut Vec<u8>) {
        debug_assert!(rows <= self.height && rows > 0);
        out.clear();
        out.extend_from_slice(bytes);
        let height = u16::try_from(rows).unwrap_or(u16::MAX).to_be_bytes();
        out[self.height_at..self.height_at + 2].copy_from_slice(&height);
    }
}

/// Whether an EOI marker (`FF D9`) closes the stream, allowing a few
/// trailing bytes (some writers pad files).
fn ends_with_eoi(bytes: &[u8]) -> bool {
    let tail = &bytes[bytes.len().saturating_sub(16)..];
    tail.windows(2).any(|w| w == [0xFF, 0xD9])
}

#[cfg(all(test, feature = "images"))]
mod tests {
    use super::*;
    use crate::example::Example;
    use crate::example::proto::feature::Kind;
    use crate::image::{DecodeOptions, Decoder, Image, ImageError, Window};
    use crate::tfrecord::{ReaderOptions, RecordReader};
    use prost::Message;

    fn read(name: &str) -> Vec<u8> {
        std::fs::read(format!("testdata/images/{name}")).unwrap()
    }

    fn decode(bytes: &[u8], channels: usize, bottom: Option<usize>) -> Image {
        let mut decoder = Decoder::new(DecodeOptions {
            channels,
            ..DecodeOptions::default()
        })
        .unwrap();
        let mut image = Image::default();
        match bottom {
            None => decoder.decode(bytes, &mut image).unwrap(),
            Some(bottom) => {
                decoder
                    .decode_window(
                        bytes,
                        |h, w| Window {
                            top: 0,
                            left: 0,
                            height: bottom.min(h),
                            width: w,
                        },
                        &mut image,
                    )
                    .unwrap();
            }
        }
        image
    }

    #[test]
    fn the_frame_header_is_read() {
        let frame = Frame::read(&read("china_q90.jpg")).unwrap();
        assert_eq!(
            (frame.height, frame.mcu_rows, frame.rows_first),
            (40, 16, true)
        );
        let frame = Frame::read(&read("flower_q75_444.jpg")).unwrap();
        assert_eq!(
            (frame.height, frame.mcu_rows, frame.rows_first),
            (29, 8, true)
        );
        let frame = Frame::read(&read("china_q50_progressive.jpg")).unwrap();
        assert!(!frame.rows_first);
        assert_eq!(frame.rows_to_decode(1), 40);
        assert_eq!(Frame::read(b"\xFF\xD8\xFF\xC0\x00"), None);
        assert_eq!(Frame::read(b"\xFF\xD8garbage"), None);
    }

    #[test]
    fn rows_to_decode_keep_one_mcu_row_below() {
        let frame = Frame::read(&read("china_q90.jpg")).unwrap();
        assert_eq!(frame.rows_to_decode(1), 32);
        assert_eq!(frame.rows_to_decode(16), 32);
        assert_eq!(frame.rows_to_decode(17), 40);
    }

    #[test]
    fn the_top_rows_equal_a_full_decode() {
        let files = [
            "china_q90.jpg",
            "china_tf_q80.jpg",
            "flower_q75_444.jpg",
            "flower_grey.jpg",
            "flower_tf_q95_444.jpg",
            "flower_q95_progressive.jpg",
        ];
        let mut shortened = 0;
        for file in files {
            let bytes = read(file);
            for channels in [1, 3] {
                let full = decode(&bytes, channels, None);
                for bottom in 1..full.height {
                    let part = decode(&bytes, channels, Some(bottom));
                    assert!(part.height >= bottom, "{file} {bottom}");
                    shortened += usize::from(part.height < full.height);
                    let len = bottom * full.width * channels;
                    assert_eq!(
                        part.data[..len],
                        full.data[..len],
                        "{file} c{channels} {bottom}"
                    );
                }
            }
        }
        // Some windows did skip rows.
        assert!(shortened > 20, "{shortened}");
    }

    #[test]
    fn a_truncated_stream_is_still_an_error() {
        let bytes = read("china_q90.jpg");
        let cut = &bytes[..bytes.len() - 100];
        let mut decoder = Decoder::new(DecodeOptions::default()).unwrap();
        let mut image = Image::default();
        let top = |_, w| Window {
            top: 0,
            left: 0,
            height: 1,
            width: w,
        };
        assert!(decoder.decode_window(cut, top, &mut image).is_err());
        assert!(decoder.decode_window(&bytes, top, &mut image).is_ok());
        // Decode-and-crop (a window away from the edges) still reads, and
        // checks, every MCU's entropy-coded data, at every scale.
        let inner = |_, _| Window {
            top: 17,
            left: 9,
            height: 16,
            width: 16,
        };
        for cut in [bytes.len() - 100, bytes.len() * 2 / 3, 200] {
            for at_least in [(16, 16), (8, 8), (4, 4), (2, 2)] {
                let cut = &bytes[..cut];
                let result = decoder.decode_window_scaled(cut, inner, at_least, &mut image);
                assert!(result.unwrap_err().is_data_error(), "{at_least:?}");
            }
        }
    }

    /// Decodes `bytes` whole at the scale that `at_least` picks.
    fn scaled(bytes: &[u8], channels: usize, at_least: (usize, usize)) -> (Image, Window) {
        let mut decoder = Decoder::new(DecodeOptions {
            channels,
            ..DecodeOptions::default()
        })
        .unwrap();
        let mut image = Image::default();
        let window = decoder
            .decode_window_scaled(bytes, Window::full, at_least, &mut image)
            .unwrap();
        (image, window)
    }

    #[test]
    fn scaled_decoding_matches_tensorflow() {
        // tf.io.decode_jpeg(ratio=2, 4, 8) of each file, described case by
        // case (file, channels, ratio, offset, shape) in scaled_tf.json
        // (scripts/tf_images_scaled.py).
        let golden = read("scaled_tf.bin");
        let manifest: serde_json::Value = serde_json::from_slice(&read("scaled_tf.json")).unwrap();
        let number = |case: &serde_json::Value, key: &str| case[key].as_u64().unwrap() as usize;
        let mut at = 0;
        let (mut largest, mut sum, mut count) = (0u8, 0u64, 0u64);
        for case in manifest["cases"].as_array().unwrap() {
            let file = case["file"].as_str().unwrap();
            let (channels, ratio) = (number(case, "channels"), number(case, "ratio"));
            let bytes = read(file);
            let full = decode(&bytes, channels, None);
            // The smallest window the ratio keeps at least this size.
            let at_least = (full.height / ratio, full.width / ratio);
            let (image, window) = scaled(&bytes, channels, at_least);
            let (h, w) = (full.height.div_ceil(ratio), full.width.div_ceil(ratio));
            assert_eq!((image.height, image.width), (h, w), "{file} 1/{ratio}");
            assert_eq!((window.height, window.width), (h, w), "{file} 1/{ratio}");
            let shape = case["shape"].as_array().unwrap();
            assert_eq!(
                shape,
                &[h, w, channels].map(serde_json::Value::from),
                "{file}"
            );
            assert_eq!(number(case, "offset"), at, "{file} 1/{ratio}");
            let expected = &golden[at..at + image.data.len()];
            at += image.data.len();
            for (a, b) in image.data.iter().zip(expected) {
                largest = largest.max(a.abs_diff(*b));
                sum += u64::from(a.abs_diff(*b));
                count += 1;
            }
        }
        assert_eq!(at, golden.len());
        // The reduced IDCTs are libjpeg's; what differs is the colour
        // conversion's rounding and, at 1/2 of a 4:2:0 image, the chroma's
        // full 8x8 IDCT (libjpeg-turbo's IFAST against zune-jpeg's): largest
        // difference seen 3 over the 30 decodes, 1/4 and 1/8 and every 4:4:4 or 4:2:2
        // or grey one identical (docs/images.md).
        // A full-size decode differs by up to 6 (src/image/tf_tests.rs); a
        // plain N-point IDCT of the top-left coefficients, tried first,
        // differed by up to 50 on the large benchmark photos.
        let mean = sum as f64 / count as f64;
        assert!(largest <= 3 && mean < 0.4, "largest {largest}, mean {mean}");
    }

    #[test]
    fn scaled_windows_stay_inside_and_compose_with_the_row_crop() {
        let bytes = read("china_q90.jpg"); // 32 x 40, 4:2:0
        let (whole, _) = scaled(&bytes, 3, (10, 8)); // 1/4
        assert_eq!((whole.height, whole.width), (10, 8));
        let mut decoder = Decoder::new(DecodeOptions::default()).unwrap();
        let mut part = Image::default();
        for (top, left, height, width) in [(0, 0, 16, 16), (3, 5, 17, 27), (23, 1, 17, 31)] {
            let choose = |_, _| Window {
                top,
                left,
                height,
                width,
            };
            let window = decoder
                .decode_window_scaled(&bytes, choose, (4, 4), &mut part)
                .unwrap();
            assert!(window.top + window.height <= part.height, "{window:?}");
            assert!(window.left + window.width <= part.width, "{window:?}");
            // Rows below the window were not decoded when they could be
            // skipped, and the window's pixels equal the whole scaled
            // decode's (those around it are decode-and-crop's to skip).
            assert!(part.height <= whole.height);
            assert_eq!(pixels(&part, window), pixels(&whole, window), "{window:?}");
        }
        // A window under twice the size is decoded exactly.
        let (exact, window) = scaled(&bytes, 3, (21, 17));
        assert_eq!((exact.height, window.height), (40, 40));
    }

    /// The JPEGs of testdata/images and the photo crops of
    /// photos-imagenet.tfrecord (its records' JPEG bytes).
    fn all_jpegs() -> Vec<(String, Vec<u8>)> {
        let names = [
            "china_q90.jpg",
            "china_tf_q80.jpg",
            "china_q85_restart.jpg",
            "china_q50_progressive.jpg",
            "flower_q75_444.jpg",
            "flower_q90_422.jpg",
            "flower_grey.jpg",
            "flower_tf_q95_444.jpg",
            "flower_q95_progressive.jpg",
            "photo_tf_progressive.jpg",
            "photo_tf_progressive_grey.jpg",
            "photo_tf_progressive_444.jpg",
        ];
        let mut jpegs: Vec<_> = names.iter().map(|n| (n.to_string(), read(n))).collect();
        let path = "testdata/images/photos-imagenet.tfrecord";
        let mut records = RecordReader::open(path, ReaderOptions::default()).unwrap();
        while let Some(record) = records.next_record().unwrap() {
            let features = Example::decode(record).unwrap().features.unwrap();
            let Some(Kind::BytesList(encoded)) = &features.feature["image/encoded"].kind else {
                panic!("image/encoded is not a bytes feature");
            };
            jpegs.push((format!("photo {}", jpegs.len()), encoded.value[0].clone()));
        }
        jpegs
    }

    /// Decodes `bytes` at 1/`scale` (when granted) with the window `window`
    /// (in full-size pixels) or whole; the image and the window in its
    /// pixels.
    fn decode_at(
        bytes: &[u8],
        channels: usize,
        scale: usize,
        window: Option<Window>,
    ) -> (Image, Window) {
        let mut decoder = Decoder::new(DecodeOptions {
            channels,
            ..DecodeOptions::default()
        })
        .unwrap();
        let mut image = Image::default();
        let choose = |h, w| window.unwrap_or(Window::full(h, w));
        let window = if scale == 1 {
            decoder.decode_window(bytes, choose, &mut image)
        } else {
            // The largest scale keeping the window at least this is `scale`
            // (see dct_scale); a whole decode passes its size as the window.
            let size = match window {
                Some(w) => (w.height, w.width),
                None => {
                    let frame = Frame::read(bytes).unwrap();
                    (frame.height, frame.width)
                }
            };
            let at_least = ((size.0 / scale).max(1), (size.1 / scale).max(1));
            decoder.decode_window_scaled(bytes, choose, at_least, &mut image)
        };
        (image, window.unwrap())
    }

    /// `window` of `image`, row after row.
    fn pixels(image: &Image, window: Window) -> Vec<u8> {
        let c = image.channels;
        (window.top..window.top + window.height)
            .flat_map(|r| {
                let start = (r * image.width + window.left) * c;
                image.data[start..start + window.width * c].to_vec()
            })
            .collect()
    }

    #[test]
    fn cropped_decoding_equals_a_full_decode_then_crop() {
        let mut rng = crate::rng::SplitMix64(20);
        let mut below = |n: usize| rng.below(n as u64) as usize;
        let (mut cropped, mut skipped) = (0, 0);
        for (name, bytes) in all_jpegs() {
            let frame = Frame::read(&bytes).unwrap();
            let (height, width) = (frame.height, frame.width);
            for channels in [1, 3] {
                for scale in [1, 2, 4, 8] {
                    let (full, _) = decode_at(&bytes, channels, scale, None);
                    for _ in 0..60 {
                        let top = below(height);
                        let left = below(width);
                        let window = Window {
                            top,
                            left,
                            height: 1 + below(height - top),
                            width: 1 + below(width - left),
                        };
                        // Scaled only when the window is `scale` times 1 px.
                        let (part, inside) = decode_at(&bytes, channels, scale, Some(window));
                        if part.width != full.width {
                            continue; // decoded at another scale than `full`
                        }
                        cropped += usize::from(scale > 1 || part.height < full.height);
                        // Pixels around the window were left alone.
                        let len = part.data.len().min(full.data.len());
                        skipped += usize::from(part.data[..len] != full.data[..len]);
                        assert_eq!(
                            pixels(&part, inside),
                            pixels(&full, inside),
                            "{name} c{channels} 1/{scale} {window:?} -> {inside:?}"
                        );
                    }
                }
            }
        }
        assert!(cropped > 500 && skipped > 500, "{cropped} {skipped}");
    }

    #[test]
    fn progressive_crops_transform_only_around_the_window() {
        // A window in the middle of a progressive JPEG, 1 and 3 channels,
        // at full size and at 1/2: its pixels are a whole decode's, and the
        // rows above it and below it were never written (the buffer's
        // zeros), as for a sequential JPEG's decode-and-crop.
        // (8-pixel MCUs: the test JPEGs are too small for a 4:2:0 one's
        // 16-pixel MCU rows to leave a row above and below the margins.)
        let cases = [
            ("photo_tf_progressive_444.jpg", 1, 1),
            ("photo_tf_progressive_444.jpg", 3, 1),
            ("photo_tf_progressive_444.jpg", 3, 2),
            ("photo_tf_progressive_grey.jpg", 1, 1),
        ];
        for (file, channels, scale) in cases {
            let bytes = read(file);
            let (full, _) = decode_at(&bytes, channels, scale, None);
            let (h, w) = (full.height * scale, full.width * scale);
            let window = Window {
                top: h * 2 / 5,
                left: w / 3,
                height: 4 * scale,
                width: w / 3,
            };
            let (part, inside) = decode_at(&bytes, channels, scale, Some(window));
            assert_eq!(part.width, full.width, "{file} c{channels} 1/{scale}");
            assert_eq!(pixels(&part, inside), pixels(&full, inside), "{file}");
            let row = |image: &Image, y: usize| {
                let len = image.width * image.channels;
                image.data[y * len..(y + 1) * len].to_vec()
            };
            let zeros = vec![0; part.width * channels];
            for y in [0, part.height - 1] {
                assert_eq!(row(&part, y), zeros, "{file} c{channels} 1/{scale} row {y}");
                assert_ne!(row(&full, y), zeros, "{file} c{channels} 1/{scale} row {y}");
            }
        }
    }

    #[test]
    fn corrupt_jpegs_decode_or_fail_at_every_scale_and_crop_never_panic() {
        // The patched decoder's scaled and cropped paths (sequential and
        // progressive) on damaged bytes: an error or an image, never a
        // panic. Bytes past the headers are overwritten at random, so the
        // entropy-coded data and the scan headers are what is damaged.
        let mut rng = crate::rng::SplitMix64(7);
        let (mut failed, mut decoded) = (0, 0);
        let window = |h: usize, w: usize| Window {
            top: h / 3,
            left: w / 4,
            height: (h / 2).max(1),
            width: (w / 2).max(1),
        };
        for (name, bytes) in all_jpegs() {
            for round in 0..40 {
                let mut damaged = bytes.clone();
                for _ in 0..1 + round % 4 {
                    let at = 20 + rng.below(damaged.len() as u64 - 20) as usize;
                    damaged[at] = rng.next_u64() as u8;
                }
                for scale in [1, 2, 4, 8] {
                    // A fresh decoder each time: what one decode leaves in a
                    // decoder must not decide the next one's outcome here.
                    let mut decoder = Decoder::new(DecodeOptions::default()).unwrap();
                    let mut image = Image::default();
                    let at_least = (1 + 8 / scale, 1 + 8 / scale);
                    match decoder.decode_window_scaled(&damaged, window, at_least, &mut image) {
                        Ok(_) => decoded += 1,
                        Err(error) => {
                            assert!(error.is_data_error(), "{name} {round}: {error}");
                            failed += 1;
                        }
                    }
                }
            }
        }
        assert!(failed > 100 && decoded > 100, "{failed} {decoded}");
    }

    #[test]
    fn scaled_decoding_keeps_the_bounds_and_errors() {
        let bytes = read("china_q90.jpg");
        let mut small = Decoder::new(DecodeOptions {
            channels: 3,
            max_pixels: 1000,
        })
        .unwrap();
        let mut image = Image::default();
        let error = small
            .decode_window_scaled(&bytes, Window::full, (4, 4), &mut image)
            .unwrap_err();
        assert!(matches!(error, ImageError::TooLarge { .. }), "{error}");
        assert_eq!(image.data.capacity(), 0);
        let mut decoder = Decoder::new(DecodeOptions::default()).unwrap();
        // Sequential, and progressive (whose scans all come before the
        // scaled transform).
        for file in ["china_q90.jpg", "china_q50_progressive.jpg"] {
            let bytes = read(file);
            for cut in [bytes.len() - 100, bytes.len() * 2 / 3, 200] {
                let error = decoder
                    .decode_window_scaled(&bytes[..cut], Window::full, (4, 4), &mut image)
                    .unwrap_err();
                assert!(error.is_data_error(), "{file} {cut}: {error}");
            }
        }
    }
}
