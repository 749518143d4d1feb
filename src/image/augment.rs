//! Augmentation and output: flip, colour jitter, normalisation and layout,
//! on resized `f32` pixels (`[H, W, C]`, the 0..=255 scale).
//!
//! The jitters are TensorFlow's, rescaled from its 0..1 floats to 0..=255:
//! - brightness (`adjust_brightness`): `x + delta`, `delta` uniform in
//!   `[-max_delta, max_delta)` (given on the 0..1 scale, as in TensorFlow);
//! - contrast (`adjust_contrast`): `(x - mean) * factor + mean`, the mean per
//!   channel over the image;
//! - saturation (`adjust_saturation`): in HSV, `s * factor` clamped to
//!   `[0, 1]`; RGB only (a grey image has no saturation to change).
//!
//! They run in that fixed order, without clamping in between, and the
//! result is clamped to `[0, 255]` once before output (TensorFlow's models
//! clip at the end the same way). Each draw comes from its own stream of the
//! element's seed, so turning one augmentation on or off leaves the others'
//! draws unchanged.

use super::error::ImageError;
use crate::rng::SplitMix64;

/// Random augmentations. By default none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Augment {
    /// Flip left-right with probability 1/2 (`random_flip_left_right`).
    pub flip: bool,
    /// Brightness jitter: the largest `|delta|`, on the 0..1 scale
    /// (`random_brightness(max_delta)`).
    pub brightness: Option<f32>,
    /// Contrast jitter: the factor's range (`random_contrast(lower, upper)`).
    pub contrast: Option<(f32, f32)>,
    /// Saturation jitter: the factor's range (`random_saturation(lower, upper)`).
    pub saturation: Option<(f32, f32)>,
}

impl Augment {
    /// Refuses negative or empty ranges.
    pub fn check(&self) -> Result<(), ImageError> {
        if let Some(delta) = self.brightness
            && !(delta >= 0.0 && delta.is_finite())
        {
            return Err(ImageError::Config(format!(
                "brightness max_delta {delta} must be >= 0"
            )));
        }
        for (what, range) in [("contrast", self.contrast), ("saturation", self.saturation)] {
            if let Some((lo, hi)) = range
                && !(lo >= 0.0 && lo <= hi && hi.is_finite())
            {
                return Err(ImageError::Config(format!(
                    "{what} range ({lo}, {hi}) must satisfy 0 <= lower <= upper"
                )));
            }
        }
        Ok(())
    }

    /// Whether any augmentation is on.
    pub fn is_none(&self) -> bool {
        *self == Augment::default()
    }

    /// Applies the augmentations to `pixels` (`[height, width, channels]`),
    /// with draws from `seed`: the flip, then the jitters. `ImageWorker`
    /// has the resize do the flip instead (`flips`, then
    /// `apply_after_flip`); this is the reference its test compares with.
    #[cfg(test)]
    pub(crate) fn apply(&self, pixels: &mut [f32], width: usize, channels: usize, seed: u64) {
        if self.flips(seed) {
            flip_left_right(pixels, width, channels);
        }
        self.apply_after_flip(pixels, channels, seed);
    }

    /// Whether the element of `seed` is flipped left-right.
    pub(crate) fn flips(&self, seed: u64) -> bool {
        self.flip && stream(seed, Stream::Flip).next_u64() >> 63 == 1
    }

    /// [`apply`](Self::apply) less the flip, for pixels flipped already
    /// (or not to be): the jitters are per pixel or use whole-channel
    /// means, so they commute with the flip.
    pub(crate) fn apply_after_flip(&self, pixels: &mut [f32], channels: usize, seed: u64) {
        if let Some(max_delta) = self.brightness {
            let delta = uniform(&mut stream(seed, Stream::Brightness), -max_delta, max_delta);
            pixels.iter_mut().for_each(|v| *v += delta * 255.0);
        }
        if let Some((lo, hi)) = self.contrast {
            let factor = uniform(&mut stream(seed, Stream::Contrast), lo, hi);
            adjust_contrast(pixels, channels, factor);
        }
        if let Some((lo, hi)) = self.saturation
            && channels == 3
        {
            let factor = uniform(&mut stream(seed, Stream::Saturation), lo, hi);
            adjust_saturation(pixels, factor);
        }
    }
}

/// The independent draw streams of one element.
#[derive(Clone, Copy)]
pub(crate) enum Stream {
    Crop = 1,
    Flip,
    Brightness,
    Contrast,
    Saturation,
}

/// The generator of one stream of an element's draws.
pub(crate) fn stream(seed: u64, which: Stream) -> SplitMix64 {
    let mut mix = SplitMix64(seed ^ (which as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    SplitMix64(mix.next_u64())
}

fn uniform(rng: &mut SplitMix64, lo: f32, hi: f32) -> f32 {
    lo + (hi - lo) * rng.unit() as f32
}

/// Swaps pixel `x` with pixel `width - 1 - x` of each row, a row's two
/// halves paired by chunks: the flip `Augment::apply` does, for tests (the
/// pipeline's flip is the resize's, `resize_mirrored`).
#[cfg(test)]
fn flip_left_right(pixels: &mut [f32], width: usize, channels: usize) {
    if width == 0 || channels == 0 {
        return;
    }
    let half = width / 2 * channels;
    // Where the right half's pixels start: past the middle one of an odd width.
    let right_start = (width - width / 2) * channels;
    for row in pixels.chunks_exact_mut(width * channels) {
        let (left, rest) = row.split_at_mut(half);
        let right = &mut rest[right_start - half..];
        for (a, b) in left
            .chunks_exact_mut(channels)
            .zip(right.rchunks_exact_mut(channels))
        {
            a.swap_with_slice(b);
        }
    }
}

fn adjust_contrast(pixels: &mut [f32], channels: usize, factor: f32) {
    let pixel_count = (pixels.len() / channels) as f32;
    for c in 0..channels {
        let mean = pixels.iter().skip(c).step_by(channels).sum::<f32>() / pixel_count;
        for v in pixels.iter_mut().skip(c).step_by(channels) {
            *v = (*v - mean) * factor + mean;
        }
    }
}

/// TensorFlow's `adjust_saturation` kernel (RGB to HSV, scale S, back),
/// on the 0..=255 scale (HSV's V carries the scale; H and S do not).
fn adjust_saturation(pixels: &mut [f32], factor: f32) {
    for p in pixels.chunks_exact_mut(3) {
        let (h, s, v) = rgb_to_hsv(p[0], p[1], p[2]);
        let (r, g, b) = hsv_to_rgb(h, (s * factor).clamp(0.0, 1.0), v);
        p.copy_from_slice(&[r, g, b]);
    }
}

fn rgb_to_hsv(r: f32, g: f32, b: f32) -> (f32, f32, f32) {
    let v = r.max(g).max(b);
    let range = v - r.min(g).min(b);
    let s = if v > 0.0 { range / v } else { 0.0 };
    if range <= 0.0 {
        return (0.0, s, v);
    }
    let norm = 1.0 / (6.0 * range);
    let mut h = if r == v {
        norm * (g - b)
    } else if g == v {
        norm * (b - r) + 2.0 / 6.0
    } else {
        norm * (r - g) + 4.0 / 6.0
    };
    if h < 0.0 {
        h += 1.0;
    }
    (h, s, v)
}

fn hsv_to_rgb(h: f32, s: f32, v: f32) -> (f32, f32, f32) {
    let c = s * v;
    let m = v - c;
    let dh = h * 6.0;
    let x = c * (1.0 - ((dh % 2.0) - 1.0).abs());
    let (r, g, b) = match dh.floor() as i32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        5 => (c, 0.0, x),
        _ => (0.0, 0.0, 0.0),
    };
    (r + m, g + m, b + m)
}

/// The element type and scaling of the output.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum OutputType {
    /// `uint8`, rounded to nearest and clamped to 0..=255.
    #[default]
    Uint8,
    /// `float32`: `(x / 255 - mean[c]) / std[c]` per channel (`mean` 0 and
    /// `std` 1 give TensorFlow's `convert_image_dtype` to 0..1).
    Float32 {
        /// Per-channel mean, on the 0..1 scale (a grey image uses `[0]`).
        mean: [f32; 3],
        /// Per-channel standard deviation, on the 0..1 scale.
        std: [f32; 3],
    },
}

impl OutputType {
    /// `float32` scaled to 0..1.
    pub const UNIT_FLOAT: OutputType = OutputType::Float32 {
        mean: [0.0; 3],
        std: [1.0; 3],
    };

    /// `float32` normalised with ImageNet's mean and standard deviation
    /// (torchvision's, and Keras's `imagenet_utils` in `torch` mode).
    pub const IMAGENET: OutputType = OutputType::Float32 {
        mean: [0.485, 0.456, 0.406],
        std: [0.229, 0.224, 0.225],
    };

    /// Refuses a zero or non-finite standard deviation.
    pub fn check(&self) -> Result<(), ImageError> {
        if let OutputType::Float32 { mean, std } = self
            && (std.iter().any(|s| *s == 0.0 || !s.is_finite())
                || mean.iter().any(|m| !m.is_finite()))
        {
            return Err(ImageError::Config(format!(
                "normalisation mean {mean:?} and std {std:?} must be finite, std non-zero"
            )));
        }
        Ok(())
    }
}

/// The order of a decoded image's axes in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ImageLayout {
    /// `[height, width, channels]` (TensorFlow's).
    #[default]
    Nhwc,
    /// `[channels, height, width]` (PyTorch's).
    Nchw,
}

/// Where [`ImageWorker::process`](super::ImageWorker::process) writes one image.
#[derive(Debug)]
pub enum OutputSlice<'a> {
    /// For [`OutputType::Uint8`].
    Uint8(&'a mut [u8]),
    /// For [`OutputType::Float32`].
    Float32(&'a mut [f32]),
}

/// Clamps `pixels` (`[H, W, C]`) to 0..=255 and writes them as `output`
/// in `layout` into `out` (which must hold exactly `pixels.len()` values of
/// the right type).
pub(crate) fn write_output(
    pixels: &[f32],
    channels: usize,
    output: OutputType,
    layout: ImageLayout,
    out: OutputSlice<'_>,
) -> Result<(), ImageError> {
    let fits = match &out {
        OutputSlice::Uint8(o) => output == OutputType::Uint8 && o.len() == pixels.len(),
        OutputSlice::Float32(o) => output != OutputType::Uint8 && o.len() == pixels.len(),
    };
    if pixels.is_empty() && fits {
        return Ok(());
    }
    if !fits || !(1..=3).contains(&channels) {
        return Err(ImageError::Config(format!(
            "the output buffer does not match {output:?} of {} values",
            pixels.len()
        )));
    }
    // Per channel `clamp(v) * scale + bias`: `(v / 255 - mean) / std`
    // without a division per value.
    let (scale, bias) = match output {
        OutputType::Uint8 => ([1.0; 3], [0.0; 3]),
        OutputType::Float32 { mean, std } => (
            std.map(|s| 1.0 / (255.0 * s)),
            [0, 1, 2].map(|c| -mean[c] / std[c]),
        ),
    };
    let float = |v: f32, c: usize| v.clamp(0.0, 255.0) * scale[c] + bias[c];
    let byte = round_to_byte;
    let plane = pixels.len() / channels;
    match (out, layout) {
        (OutputSlice::Uint8(out), ImageLayout::Nhwc) => {
            for (o, &v) in out.iter_mut().zip(pixels) {
                *o = byte(v);
            }
        }
        (OutputSlice::Float32(out), ImageLayout::Nhwc) => {
            normalise_interleaved(pixels, channels, scale, bias, out);
        }
        (OutputSlice::Uint8(out), ImageLayout::Nchw) => {
            for (c, plane_out) in out.chunks_exact_mut(plane).enumerate() {
                let values = pixels.iter().skip(c).step_by(channels);
                for (o, &v) in plane_out.iter_mut().zip(values) {
                    *o = byte(v);
                }
            }
        }
        (OutputSlice::Float32(out), ImageLayout::Nchw) => {
            for (c, plane_out) in out.chunks_exact_mut(plane).enumerate() {
                let values = pixels.iter().skip(c).step_by(channels);
                for (o, &v) in plane_out.iter_mut().zip(values) {
                    *o = float(v, c);
                }
            }
        }
    }
    Ok(())
}

/// `out[i] = pixels[i].clamp(0, 255) * scale[c] + bias[c]`, `c` the
/// channel of value `i` (`out` as long as `pixels`, `channels` 1 to 3).
///
/// Values go in blocks of 24, a multiple of every channel count, with the
/// per-channel factors spelled out for the block's 24 values, so the loop
/// has no channel index and compiles to whole SIMD vectors. A loop over
/// pixels with an inner loop over the channels did not vectorise: 8% of
/// the JPEG pipeline's CPU (docs/benchmarks.md, "Images: the
/// normalisation vectorised").
fn normalise_interleaved(
    pixels: &[f32],
    channels: usize,
    scale: [f32; 3],
    bias: [f32; 3],
    out: &mut [f32],
) {
    const BLOCK: usize = 24;
    let spell = |per_channel: [f32; 3]| -> [f32; BLOCK] {
        std::array::from_fn(|i| per_channel[i % channels])
    };
    let (scale, bias) = (spell(scale), spell(bias));
    let mut outs = out.chunks_exact_mut(BLOCK);
    let mut ins = pixels.chunks_exact(BLOCK);
    for (o, p) in (&mut outs).zip(&mut ins) {
        for i in 0..BLOCK {
            o[i] = p[i].clamp(0.0, 255.0) * scale[i] + bias[i];
        }
    }
    // The tail starts at a multiple of BLOCK, so on a pixel's first channel.
    let tail = outs.into_remainder().iter_mut().zip(ins.remainder());
    for (i, (o, &p)) in tail.enumerate() {
        *o = p.clamp(0.0, 255.0) * scale[i] + bias[i];
    }
}

/// `v.clamp(0.0, 255.0).round() as u8` (halves away from zero, NaN to 0),
/// without `f32::round`: on the baseline x86-64 target that is a call to
/// libm's `roundf` per value, which made a uint8 batch cost more CPU than a
/// float32 one (docs/benchmarks.md, "Third round"). Exact: for `v` in
/// 0..=255, `v - trunc(v)` is exact in f32.
#[inline]
fn round_to_byte(v: f32) -> u8 {
    let v = v.clamp(0.0, 255.0);
    let whole = v as u8;
    whole + u8::from(v - f32::from(whole) >= 0.5)
}

#[cfg(test)]
mod tests {
    /// `round_to_byte` is `clamp(0, 255).round() as u8` for every f32
    /// from -2 to 258 in steps of 1/1024 (every half, and the values just
    /// either side of each half), and for NaN and the infinities.
    #[test]
    fn round_to_byte_is_clamp_then_round() {
        let reference = |v: f32| v.clamp(0.0, 255.0).round() as u8;
        let mut values: Vec<f32> = (-2048..=258 * 1024).map(|i| i as f32 / 1024.0).collect();
        for k in 0..=256 {
            let half = k as f32 + 0.5;
            values.extend([half.next_down(), half, half.next_up()]);
        }
        values.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0]);
        for v in values {
            assert_eq!(super::round_to_byte(v), reference(v), "{v:e}");
        }
    }

    use super::*;

    #[test]
    fn flip_reverses_each_row() {
        let mut p: Vec<f32> = (0..12).map(|v| v as f32).collect();
        flip_left_right(&mut p, 2, 3);
        assert_eq!(p, [3., 4., 5., 0., 1., 2., 9., 10., 11., 6., 7., 8.]);
        // An odd width keeps its middle pixel; one channel too.
        let mut p: Vec<f32> = (0..6).map(|v| v as f32).collect();
        flip_left_right(&mut p, 3, 1);
        assert_eq!(p, [2., 1., 0., 5., 4., 3.]);
        let mut p: Vec<f32> = (0..9).map(|v| v as f32).collect();
        flip_left_right(&mut p, 3, 3);
        assert_eq!(p, [6., 7., 8., 3., 4., 5., 0., 1., 2.]);
    }

    #[test]
    fn saturation_zero_is_grey_and_one_is_identity() {
        let rgb = [200.0f32, 100.0, 50.0];
        let mut p = rgb;
        adjust_saturation(&mut p, 1.0);
        for (a, b) in p.iter().zip(rgb) {
            assert!((a - b).abs() < 1e-3, "{p:?}");
        }
        adjust_saturation(&mut p, 0.0);
        assert_eq!(p, [200.0; 3]);
    }

    #[test]
    fn contrast_scales_around_the_channel_mean() {
        let mut p = vec![0.0f32, 10.0, 100.0, 30.0];
        adjust_contrast(&mut p, 2, 2.0);
        assert_eq!(p, [-50.0, 0.0, 150.0, 40.0]);
    }

    #[test]
    fn each_stream_is_independent_of_the_others() {
        let on = Augment {
            flip: true,
            brightness: Some(0.2),
            ..Augment::default()
        };
        let flip_only = Augment {
            flip: true,
            ..Augment::default()
        };
        let flipped = |a: &Augment, seed| {
            let mut p = vec![0.0f32, 255.0];
            a.apply(&mut p, 2, 1, seed);
            p[0] > p[1]
        };
        let mut flips = 0;
        for seed in 0..200 {
            assert_eq!(flipped(&on, seed), flipped(&flip_only, seed));
            flips += usize::from(flipped(&flip_only, seed));
        }
        assert!((70..130).contains(&flips), "{flips} of 200");
    }

    #[test]
    fn output_layouts_and_types() {
        let pixels = [0.0f32, 1.4, 255.6, 10.0, 20.0, -3.0];
        let mut u8s = [0u8; 6];
        write_output(
            &pixels,
            3,
            OutputType::Uint8,
            ImageLayout::Nchw,
            OutputSlice::Uint8(&mut u8s),
        )
        .unwrap();
        assert_eq!(u8s, [0, 10, 1, 20, 255, 0]);
        let mut f = [0f32; 6];
        write_output(
            &pixels,
            3,
            OutputType::UNIT_FLOAT,
            ImageLayout::Nhwc,
            OutputSlice::Float32(&mut f),
        )
        .unwrap();
        assert_eq!(f[3], 10.0 / 255.0);
        assert_eq!(f[2], 1.0);
        let wrong = write_output(
            &pixels,
            3,
            OutputType::Uint8,
            ImageLayout::Nhwc,
            OutputSlice::Float32(&mut f),
        );
        assert!(wrong.is_err());
        assert!(
            OutputType::Float32 {
                mean: [0.0; 3],
                std: [0.0; 3]
            }
            .check()
            .is_err()
        );
        assert!(OutputType::IMAGENET.check().is_ok());
    }

    /// The blocked NHWC normalisation gives, value for value, what the
    /// per-pixel formula gives: every channel count, lengths with and
    /// without a tail after the last whole block, values outside 0..=255.
    #[test]
    fn blocked_normalisation_equals_the_per_pixel_formula() {
        let (scale, bias) = ([0.5f32, -2.0, 0.25], [1.0f32, 3.0, -7.5]);
        for channels in 1..=3 {
            for pixels_count in [0, 1, 7, 8, 9, 16, 17, 33] {
                let len = pixels_count * channels;
                let pixels: Vec<f32> = (0..len).map(|i| (i as f32 * 37.3) % 300.0 - 20.0).collect();
                let mut out = vec![f32::NAN; len];
                normalise_interleaved(&pixels, channels, scale, bias, &mut out);
                for (i, (&o, &p)) in out.iter().zip(&pixels).enumerate() {
                    let c = i % channels;
                    let expected = p.clamp(0.0, 255.0) * scale[c] + bias[c];
                    assert_eq!(
                        o.to_bits(),
                        expected.to_bits(),
                        "channels {channels} value {i}"
                    );
                }
            }
        }
    }
}
