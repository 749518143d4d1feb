//! Resizing a window of an image, as `tf.image.resize` does.
//!
//! Every method is separable: each output column is a weighted sum of a few
//! source columns (its *taps*), each output row of a few source rows. The
//! taps are TensorFlow's:
//! - `Bilinear` without antialias: `resize_bilinear` with half-pixel
//!   centres (`in = (out + 0.5) * in_len / out_len - 0.5`, clamped);
//! - `Bilinear` with antialias: `scale_and_translate` with the triangle
//!   kernel widened by the downscale factor (TensorFlow's `antialias=True`,
//!   used whether shrinking or growing);
//! - `Area`: `resize_area`, each source pixel weighted by the fraction of it
//!   the output pixel covers (antialias has no effect, as in TensorFlow);
//! - `Nearest`: `resize_nearest_neighbor` with half-pixel centres
//!   (`floor((out + 0.5) * in_len / out_len)`; antialias has no effect).
//!
//! Arithmetic is `f32`, as TensorFlow's, but summed in another order, so
//! results agree within float rounding (tests/image.rs states the bound).
//! A window is resized in place of a crop: `resize(crop(image))` without
//! copying the crop.
//!
//! The two passes run in the order that leaves the per-pixel one less to
//! do. The column pass gathers each output pixel's taps one pixel at a
//! time; the row pass is a weighted sum of whole rows, which compiles to
//! SIMD. Growing, or keeping the height, the columns go first, over the
//! source rows the output reads (no more than `height`); shrinking, the rows
//! go first, and the column pass then runs over `height` rows instead of
//! every source row the output reads (docs/benchmarks.md, "Images: the
//! resize's two passes in the cheaper order").

use super::decode::Image;

/// The interpolation of [`resize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ResizeMethod {
    /// Bilinear interpolation (`tf.image.ResizeMethod.BILINEAR`, the default).
    #[default]
    Bilinear,
    /// Area averaging (`AREA`).
    Area,
    /// Nearest neighbour (`NEAREST_NEIGHBOR`).
    Nearest,
}

impl ResizeMethod {
    /// The name used in specs (`bilinear`, `area`, `nearest`).
    pub fn name(self) -> &'static str {
        match self {
            ResizeMethod::Bilinear => "bilinear",
            ResizeMethod::Area => "area",
            ResizeMethod::Nearest => "nearest",
        }
    }

    /// The method named `name`.
    pub fn from_name(name: &str) -> Option<ResizeMethod> {
        [
            ResizeMethod::Bilinear,
            ResizeMethod::Area,
            ResizeMethod::Nearest,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }
}

/// A rectangle of an image, in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// First row.
    pub top: usize,
    /// First column.
    pub left: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
}

impl Window {
    /// The whole of an image of this size.
    pub fn full(height: usize, width: usize) -> Window {
        Window {
            top: 0,
            left: 0,
            height,
            width,
        }
    }
}

/// For each output index, the source indices and weights that sum to it.
#[derive(Debug, Default)]
struct Taps {
    /// `ranges[o]..ranges[o + 1]` are output `o`'s entries in `index`/`weight`.
    ranges: Vec<usize>,
    index: Vec<usize>,
    weight: Vec<f32>,
}

impl Taps {
    fn clear(&mut self) {
        self.ranges.clear();
        self.ranges.push(0);
        self.index.clear();
        self.weight.clear();
    }

    fn push(&mut self, index: usize, weight: f32) {
        self.index.push(index);
        self.weight.push(weight);
    }

    fn end_output(&mut self) {
        self.ranges.push(self.index.len());
    }

    /// The taps of `out_len` outputs over `in_len` inputs.
    fn compute(&mut self, method: ResizeMethod, antialias: bool, in_len: usize, out_len: usize) {
        self.clear();
        match (method, antialias) {
            (ResizeMethod::Nearest, _) => self.nearest(in_len, out_len),
            (ResizeMethod::Area, _) => self.area(in_len, out_len),
            (ResizeMethod::Bilinear, false) => self.bilinear(in_len, out_len),
            (ResizeMethod::Bilinear, true) => self.triangle(in_len, out_len),
        }
    }

    fn nearest(&mut self, in_len: usize, out_len: usize) {
        let scale = in_len as f32 / out_len as f32;
        for o in 0..out_len {
            let i = ((o as f32 + 0.5) * scale).floor().max(0.0) as usize;
            self.push(i.min(in_len - 1), 1.0);
            self.end_output();
        }
    }

    fn bilinear(&mut self, in_len: usize, out_len: usize) {
        let scale = in_len as f32 / out_len as f32;
        for o in 0..out_len {
            let at = (o as f32 + 0.5) * scale - 0.5;
            let floor = at.floor();
            let lower = floor.max(0.0) as usize;
            let upper = (at.ceil().max(0.0) as usize).min(in_len - 1);
            let lerp = at - floor;
            if upper == lower {
                self.push(lower, 1.0);
            } else {
                self.push(lower, 1.0 - lerp);
                self.push(upper, lerp);
            }
            self.end_output();
        }
    }

    /// TensorFlow's `ComputeSpansCore` with the triangle kernel (radius 1).
    fn triangle(&mut self, in_len: usize, out_len: usize) {
        let scale = out_len as f32 / in_len as f32;
        let inv_scale = 1.0 / scale;
        let kernel_scale = inv_scale.max(1.0);
        let last = in_len as i64 - 1;
        for o in 0..out_len {
            let sample = (o as f32 + 0.5) * inv_scale;
            let start = ((sample - kernel_scale - 0.5).ceil() as i64).clamp(0, last);
            let end = ((sample + kernel_scale - 0.5).floor() as i64).clamp(0, last) + 1;
            let first = self.weight.len();
            let mut total = 0.0f32;
            for source in start..end {
                let position = (source as f32 + 0.5 - sample) / kernel_scale;
                let weight = (1.0 - position.abs()).max(0.0);
                total += weight;
                self.push(source as usize, weight);
            }
            if total.abs() >= 1000.0 * f32::MIN_POSITIVE {
                let inverse = 1.0 / total;
                self.weight[first..].iter_mut().for_each(|w| *w *= inverse);
            }
            self.end_output();
        }
    }

    /// TensorFlow's `resize_area`: coverage of each source cell, divided by
    /// the scale (so the weights of one output sum to 1).
    fn area(&mut self, in_len: usize, out_len: usize) {
        let scale = in_len as f32 / out_len as f32;
        let inverse = 1.0 / scale;
        for o in 0..out_len {
            let from = o as f32 * scale;
            let to = (o + 1) as f32 * scale;
            let start = from.floor() as usize;
            let end = to.ceil() as usize;
            for i in start..end {
                let covered = (i as f32 + 1.0).min(to) - (i as f32).max(from);
                self.push(i.min(in_len - 1), covered * inverse);
            }
            self.end_output();
        }
    }

    /// These outputs in reverse order, each with its own taps, into `out`
    /// (its buffers reused).
    fn mirror_into(&self, out: &mut Taps) {
        out.clear();
        for o in (0..self.ranges.len() - 1).rev() {
            for (i, w) in self.of(o) {
                out.push(i, w);
            }
            out.end_output();
        }
    }

    fn of(&self, o: usize) -> impl Iterator<Item = (usize, f32)> + '_ {
        let range = self.ranges[o]..self.ranges[o + 1];
        self.index[range.clone()]
            .iter()
            .copied()
            .zip(self.weight[range].iter().copied())
    }
}

/// Buffers [`resize`] reuses from call to call (one per worker thread).
#[derive(Debug, Default)]
pub struct ResizeScratch {
    rows: Taps,
    columns: Taps,
    /// A flipped image's columns are built here, then swapped in.
    mirrored: Taps,
    /// Columns first: `window.height x out_width x channels`; rows first,
    /// one row of the window, `window.width x channels`.
    wide: Vec<f32>,
}

/// Resizes `window` of `image` to `height x width`, writing `f32` pixels
/// (`[height, width, channels]`, values on the 0..=255 scale, like
/// `tf.image.resize` of a `uint8` image) into `out`.
///
/// The window must lie inside the image and the sizes be non-zero.
///
/// ```
/// use tfpipe::image::{resize, Image, ResizeMethod, ResizeScratch, Window};
///
/// let image = Image { height: 2, width: 2, channels: 1, data: vec![0, 100, 200, 100] };
/// let mut out = Vec::new();
/// let mut scratch = ResizeScratch::default();
/// let window = Window::full(2, 2);
/// resize(&image, window, 1, 1, ResizeMethod::Area, false, &mut scratch, &mut out);
/// assert_eq!(out, [100.0]);
/// ```
#[allow(clippy::too_many_arguments)]
pub fn resize(
    image: &Image,
    window: Window,
    height: usize,
    width: usize,
    method: ResizeMethod,
    antialias: bool,
    scratch: &mut ResizeScratch,
    out: &mut Vec<f32>,
) {
    let (size, how) = ((height, width), (method, antialias));
    resize_mirrored(image, window, size, how, false, scratch, out);
}

/// [`resize`], flipped left-right when `mirror`: output column `o` is
/// computed from the taps of column `width - 1 - o`, so the values equal
/// a flip of the resized image, bit for bit.
pub(crate) fn resize_mirrored(
    image: &Image,
    window: Window,
    (height, width): (usize, usize),
    (method, antialias): (ResizeMethod, bool),
    mirror: bool,
    scratch: &mut ResizeScratch,
    out: &mut Vec<f32>,
) {
    debug_assert!(window.top + window.height <= image.height);
    debug_assert!(window.left + window.width <= image.width);
    let channels = image.channels;
    scratch
        .rows
        .compute(method, antialias, window.height, height);
    scratch
        .columns
        .compute(method, antialias, window.width, width);
    if mirror {
        scratch.columns.mirror_into(&mut scratch.mirrored);
        std::mem::swap(&mut scratch.columns, &mut scratch.mirrored);
    }
    if distinct_rows(&scratch.rows) > height {
        rows_first(image, window, scratch, height, width, out);
        return;
    }
    horizontal(
        image,
        window,
        &scratch.columns,
        &scratch.rows,
        width,
        &mut scratch.wide,
    );
    vertical(&scratch.wide, &scratch.rows, height, width * channels, out);
}

/// How many source rows `rows` reads (its indices never decrease from one
/// output row to the next).
fn distinct_rows(rows: &Taps) -> usize {
    let mut last = None;
    let mut count = 0;
    for &r in &rows.index {
        if last.is_none_or(|l| r > l) {
            last = Some(r);
            count += 1;
        }
    }
    count
}

/// Shrinking rows: each output row is first the weighted sum of its window
/// rows (one row of `scratch.wide`), then resized to `width` columns.
fn rows_first(
    image: &Image,
    window: Window,
    scratch: &mut ResizeScratch,
    height: usize,
    width: usize,
    out: &mut Vec<f32>,
) {
    let channels = image.channels;
    let (line_len, row_len) = (window.width * channels, width * channels);
    let stride = image.width * channels;
    let window_row = |r: usize| {
        let start = (window.top + r) * stride + window.left * channels;
        &image.data[start..start + line_len]
    };
    // Grown, never cleared: every value is written before it is read.
    if scratch.wide.len() < line_len {
        scratch.wide.resize(line_len, 0.0);
    }
    let line = &mut scratch.wide[..line_len];
    out.resize(height * row_len, 0.0);
    for (o, out_row) in out.chunks_exact_mut(row_len).enumerate() {
        let mut taps = scratch.rows.of(o);
        let Some((first, weight)) = taps.next() else {
            out_row.fill(0.0);
            continue;
        };
        for (value, &s) in line.iter_mut().zip(window_row(first)) {
            *value = weight * f32::from(s);
        }
        for (r, weight) in taps {
            for (value, &s) in line.iter_mut().zip(window_row(r)) {
                *value += weight * f32::from(s);
            }
        }
        match channels {
            3 => horizontal_row::<3, f32>(line, &scratch.columns, out_row),
            1 => horizontal_row::<1, f32>(line, &scratch.columns, out_row),
            _ => horizontal_row_any(line, &scratch.columns, channels, out_row),
        }
    }
}

/// Each window row that `rows` reads, resized to `width` columns (rows no
/// output reads are left as they were: never zeroed, never read).
fn horizontal(
    image: &Image,
    window: Window,
    taps: &Taps,
    rows: &Taps,
    width: usize,
    wide: &mut Vec<f32>,
) {
    let channels = image.channels;
    let row_len = width * channels;
    // Grown, never cleared: every value read is written first.
    if wide.len() < window.height * row_len {
        wide.resize(window.height * row_len, 0.0);
    }
    let stride = image.width * channels;
    let mut last = None;
    for &r in &rows.index {
        // Row taps come in increasing order, mostly two per output row.
        if last.is_some_and(|l| l >= r) {
            continue;
        }
        last = Some(r);
        let row_start = (window.top + r) * stride + window.left * channels;
        let row = &image.data[row_start..row_start + window.width * channels];
        let out_row = &mut wide[r * row_len..(r + 1) * row_len];
        match channels {
            3 => horizontal_row::<3, u8>(row, taps, out_row),
            1 => horizontal_row::<1, u8>(row, taps, out_row),
            _ => horizontal_row_any(row, taps, channels, out_row),
        }
    }
}

/// One row of `C` channels (bytes of the image, or a row already summed
/// from several): each output pixel summed in registers.
#[inline(always)]
fn horizontal_row<const C: usize, S: Copy>(row: &[S], taps: &Taps, out_row: &mut [f32])
where
    f32: From<S>,
{
    for (o, pixel) in out_row.chunks_exact_mut(C).enumerate() {
        let (from, to) = (taps.ranges[o], taps.ranges[o + 1]);
        let mut sum = [0f32; C];
        for (&i, &weight) in taps.index[from..to].iter().zip(&taps.weight[from..to]) {
            let source = &row[i * C..i * C + C];
            for c in 0..C {
                sum[c] += weight * f32::from(source[c]);
            }
        }
        pixel.copy_from_slice(&sum);
    }
}

fn horizontal_row_any<S: Copy>(row: &[S], taps: &Taps, channels: usize, out_row: &mut [f32])
where
    f32: From<S>,
{
    for (o, pixel) in out_row.chunks_exact_mut(channels).enumerate() {
        pixel.fill(0.0);
        for (i, weight) in taps.of(o) {
            let source = &row[i * channels..(i + 1) * channels];
            for (value, &s) in pixel.iter_mut().zip(source) {
                *value += weight * f32::from(s);
            }
        }
    }
}

/// Each output row, a weighted sum of the rows of `wide`.
fn vertical(wide: &[f32], taps: &Taps, height: usize, row_len: usize, out: &mut Vec<f32>) {
    // Same length as the last image's: kept without zeroing; every value
    // is written below.
    out.resize(height * row_len, 0.0);
    for (o, out_row) in out.chunks_exact_mut(row_len).enumerate() {
        let mut taps = taps.of(o);
        let Some((first, weight)) = taps.next() else {
            out_row.fill(0.0);
            continue;
        };
        let row = &wide[first * row_len..(first + 1) * row_len];
        for (value, &s) in out_row.iter_mut().zip(row) {
            *value = weight * s;
        }
        for (i, weight) in taps {
            let row = &wide[i * row_len..(i + 1) * row_len];
            for (value, &s) in out_row.iter_mut().zip(row) {
                *value += weight * s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(height: usize, width: usize) -> Image {
        let data = (0..height * width).map(|i| (i * 7 % 256) as u8).collect();
        Image {
            height,
            width,
            channels: 1,
            data,
        }
    }

    #[test]
    fn each_method_keeps_an_image_of_the_same_size() {
        let image = ramp(5, 7);
        let mut scratch = ResizeScratch::default();
        let mut out = Vec::new();
        let expected: Vec<f32> = image.data.iter().map(|&v| f32::from(v)).collect();
        for method in [
            ResizeMethod::Bilinear,
            ResizeMethod::Area,
            ResizeMethod::Nearest,
        ] {
            for antialias in [false, true] {
                resize(
                    &image,
                    Window::full(5, 7),
                    5,
                    7,
                    method,
                    antialias,
                    &mut scratch,
                    &mut out,
                );
                assert_eq!(out, expected, "{method:?} antialias {antialias}");
            }
        }
    }

    #[test]
    fn weights_of_each_output_sum_to_one() {
        let mut taps = Taps::default();
        for method in [
            ResizeMethod::Bilinear,
            ResizeMethod::Area,
            ResizeMethod::Nearest,
        ] {
            for antialias in [false, true] {
                for (i, o) in [(7, 3), (3, 7), (224, 500), (500, 224), (1, 5), (5, 1)] {
                    taps.compute(method, antialias, i, o);
                    for out in 0..o {
                        let sum: f32 = taps.of(out).map(|(_, w)| w).sum();
                        assert!(
                            (sum - 1.0).abs() < 1e-4,
                            "{method:?} {antialias} {i}->{o}: {sum}"
                        );
                        assert!(taps.of(out).all(|(index, _)| index < i));
                    }
                }
            }
        }
    }

    /// Whichever order the passes run in (rows first when shrinking the
    /// height), every output value is the double sum of its taps, computed
    /// here in f64: shrinking and growing each side, 1 to 4 channels, every
    /// method, in a window off the image's corner.
    #[test]
    fn both_pass_orders_give_the_double_sum_of_the_taps() {
        let mut scratch = ResizeScratch::default();
        let mut out = Vec::new();
        let (mut rows, mut columns) = (Taps::default(), Taps::default());
        for channels in 1..=4 {
            let (height, width) = (23, 19);
            let image = Image {
                height,
                width,
                channels,
                data: (0..height * width * channels)
                    .map(|i| (i * 37 % 251) as u8)
                    .collect(),
            };
            let window = Window {
                top: 2,
                left: 1,
                height: 20,
                width: 17,
            };
            for method in [
                ResizeMethod::Bilinear,
                ResizeMethod::Area,
                ResizeMethod::Nearest,
            ] {
                for antialias in [false, true] {
                    for (h, w) in [(7, 5), (7, 30), (31, 6), (33, 29), (20, 17)] {
                        resize(
                            &image,
                            window,
                            h,
                            w,
                            method,
                            antialias,
                            &mut scratch,
                            &mut out,
                        );
                        rows.compute(method, antialias, window.height, h);
                        columns.compute(method, antialias, window.width, w);
                        for (o, value) in out.iter().enumerate() {
                            let (r, c, k) = (o / (w * channels), o / channels % w, o % channels);
                            let mut want = 0f64;
                            for (i, wr) in rows.of(r) {
                                for (j, wc) in columns.of(c) {
                                    let at =
                                        ((window.top + i) * width + window.left + j) * channels;
                                    want += f64::from(wr)
                                        * f64::from(wc)
                                        * f64::from(image.data[at + k]);
                                }
                            }
                            assert!(
                                (f64::from(*value) - want).abs() < 1e-3,
                                "{method:?} {antialias} {channels} channels to {h}x{w}, value {o}: {value} against {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_window_resizes_like_its_crop() {
        let image = ramp(9, 11);
        let window = Window {
            top: 2,
            left: 3,
            height: 5,
            width: 6,
        };
        let crop = Image {
            height: 5,
            width: 6,
            channels: 1,
            data: (2..7)
                .flat_map(|r| image.data[r * 11 + 3..r * 11 + 9].to_vec())
                .collect(),
        };
        let mut scratch = ResizeScratch::default();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        resize(
            &image,
            window,
            3,
            4,
            ResizeMethod::Bilinear,
            true,
            &mut scratch,
            &mut a,
        );
        resize(
            &crop,
            Window::full(5, 6),
            3,
            4,
            ResizeMethod::Bilinear,
            true,
            &mut scratch,
            &mut b,
        );
        assert_eq!(a, b);
    }
}
