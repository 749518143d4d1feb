//! Decoding and resizing against TensorFlow's own answers for the files of
//! `testdata/images/` (written by `scripts/tf_images.py` and
//! `scripts/tf_images_full.py` with TensorFlow 2.21).
//!
//! PNG, GIF and BMP pixels equal `tf.io.decode_image`'s exactly. JPEG pixels
//! differ from libjpeg-turbo's (TensorFlow's decoder) by rounding in the
//! IDCT and the chroma upsampling: at most [`JPEG_TOLERANCE`] per value.
//! Resized values are within [`RESIZE_TOLERANCE`] of `tf.image.resize`'s
//! (float summation order).

use std::io::Read as _;

use serde_json::Value;

use super::*;

/// The largest difference from TensorFlow allowed for a JPEG pixel value.
const JPEG_TOLERANCE: i32 = 6;
/// The largest difference from TensorFlow allowed for a resized value
/// (on the 0..=255 scale).
const RESIZE_TOLERANCE: f32 = 1e-3;

fn expected() -> (Vec<Value>, Vec<u8>) {
    golden("expected")
}

/// The cases of `testdata/images/NAME.json` and the pixels of
/// `NAME.bin.gz` they point into.
fn golden(name: &str) -> (Vec<Value>, Vec<u8>) {
    let json = std::fs::read_to_string(format!("testdata/images/{name}.json")).unwrap();
    let json: Value = serde_json::from_str(&json).unwrap();
    let mut blob = Vec::new();
    let gz = std::fs::File::open(format!("testdata/images/{name}.bin.gz")).unwrap();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut blob)
        .unwrap();
    (json["cases"].as_array().unwrap().clone(), blob)
}

fn shape(case: &Value) -> Vec<usize> {
    case["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

fn decode(file: &str, channels: usize) -> Image {
    let bytes = std::fs::read(format!("testdata/images/{file}")).unwrap();
    let mut decoder = Decoder::new(DecodeOptions {
        channels,
        ..DecodeOptions::default()
    })
    .unwrap();
    let mut image = Image::default();
    decoder
        .decode(&bytes, &mut image)
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    image
}

/// The pixels TensorFlow gave for `case` (its offset into `blob`, `len`
/// values).
fn want<'a>(case: &Value, blob: &'a [u8], len: usize) -> &'a [u8] {
    let offset = case["offset"].as_u64().unwrap() as usize;
    &blob[offset..offset + len]
}

/// Decodes `case`'s file at its channel count, checking the shape
/// TensorFlow gave, and returns the image and a name for messages.
fn decode_case(case: &Value) -> (Image, String) {
    let file = case["file"].as_str().unwrap();
    let channels = case["channels"].as_u64().unwrap() as usize;
    let image = decode(file, channels);
    let name = format!("{file} channels {channels}");
    if case.get("error").is_none() {
        let got = vec![image.height, image.width, image.channels];
        assert_eq!(got, shape(case), "{name}");
    }
    (image, name)
}

/// A JPEG decode against TensorFlow's: checks the largest difference per
/// value against [`JPEG_TOLERANCE`], prints it with the mean, and returns
/// both.
fn jpeg_within_tolerance(name: &str, want: &[u8], got: &[u8]) -> (i32, f64) {
    let differences: Vec<i32> = want
        .iter()
        .zip(got)
        .map(|(a, b)| (i32::from(*a) - i32::from(*b)).abs())
        .collect();
    let most = differences.iter().copied().max().unwrap();
    let mean = differences.iter().map(|&d| f64::from(d)).sum::<f64>() / want.len() as f64;
    eprintln!("{name}: largest difference {most}, mean {mean:.3}");
    assert!(most <= JPEG_TOLERANCE, "{name}: differs by {most}");
    (most, mean)
}

#[test]
fn decoding_matches_tensorflow() {
    let (cases, blob) = expected();
    let mut jpeg_max = 0;
    let mut checked = 0;
    for case in cases.iter().filter(|c| c["kind"] == "decode") {
        let (image, name) = decode_case(case);
        if case.get("error").is_some() {
            // TensorFlow refuses channels=1 for GIF and BMP; tfpipe converts.
            assert_eq!(image.channels, 1, "{name}");
            continue;
        }
        let want = want(case, &blob, image.data.len());
        if case["file"].as_str().unwrap().ends_with(".jpg") {
            jpeg_max = jpeg_max.max(jpeg_within_tolerance(&name, want, &image.data).0);
        } else {
            assert!(
                want == image.data,
                "{name}: pixels differ from TensorFlow's"
            );
        }
        checked += 1;
    }
    assert!(checked >= 28, "{checked} cases");
    eprintln!("largest JPEG difference from TensorFlow: {jpeg_max}");
}

/// Full-size decodes of the JPEGs `decoding_matches_tensorflow` leaves
/// out (restart markers, 4:2:2, TensorFlow's progressive ones) and of a
/// 320x240 photo written by TensorFlow (the small ones at 1 and 3
/// channels, the photo at 3; `scripts/tf_images_full.py`): within
/// [`JPEG_TOLERANCE`], and close on average.
#[test]
fn full_size_decoding_matches_tensorflow() {
    let (cases, blob) = golden("full_tf");
    let mut largest = 0;
    for case in &cases {
        let (image, name) = decode_case(case);
        let want = want(case, &blob, image.data.len());
        let (most, mean) = jpeg_within_tolerance(&name, want, &image.data);
        assert!(mean < 1.5, "{name}: mean difference {mean}");
        largest = largest.max(most);
    }
    let expected = "five files at 1 and 3 channels, the photo at 3";
    assert_eq!(cases.len(), 11, "{expected}");
    eprintln!("largest full-size JPEG difference from TensorFlow: {largest}");
}

#[test]
fn resizing_matches_tensorflow() {
    let (cases, blob) = expected();
    let mut scratch = ResizeScratch::default();
    let mut out = Vec::new();
    let mut worst = 0.0f32;
    let mut checked = 0;
    for case in cases.iter().filter(|c| c["kind"] == "resize") {
        let file = case["file"].as_str().unwrap();
        let method = ResizeMethod::from_name(case["method"].as_str().unwrap()).unwrap();
        let antialias = case["antialias"].as_bool().unwrap();
        let image = decode(file, 3);
        let [height, width, _] = shape(case)[..] else {
            panic!("shape")
        };
        let window = Window::full(image.height, image.width);
        resize(
            &image,
            window,
            height,
            width,
            method,
            antialias,
            &mut scratch,
            &mut out,
        );
        let offset = case["offset"].as_u64().unwrap() as usize;
        let want = blob[offset..offset + out.len() * 4]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let most = want
            .zip(&out)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            most <= RESIZE_TOLERANCE,
            "{file} {method:?} antialias {antialias} to {height}x{width}: {most}"
        );
        worst = worst.max(most);
        checked += 1;
    }
    assert_eq!(checked, 12);
    eprintln!("largest resize difference from TensorFlow: {worst}");
}
