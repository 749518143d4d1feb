//! Images: decoding JPEG, PNG, GIF and BMP bytes, cropping, resizing and
//! augmenting them into fixed-size `uint8` or `float32` tensors, as a
//! tf.data `map` of `decode_image`, `resize`, `random_crop` and
//! `random_flip_left_right` does.
//!
//! This layer sits beside [`batch`](crate::batch) and below
//! [`example`](crate::example): it knows pixels, not records. Where an image
//! came from (file, record, offset, feature) is added by the caller.
//!
//! | file | what lives there |
//! |---|---|
//! | `decode.rs` | [`ImageFormat`] by signature, [`read_header`], the reusable [`Decoder`] |
//! | `jpeg.rs` | decoding only a JPEG's top rows (the rows of `decode_and_crop_jpeg`) |
//! | `resize.rs` | [`resize`] of a [`Window`]: bilinear, area, nearest, antialias as `tf.image.resize` |
//! | `crop.rs` | [`center_crop`] and [`RandomCrop`] (`sample_distorted_bounding_box`) |
//! | `augment.rs` | [`Augment`] (flip, brightness, contrast, saturation), [`OutputType`], [`ImageLayout`] |
//! | `spec.rs` | the text form of [`ImageOptions`] in feature specs (`224x224x3:center,area`) |
//! | `error.rs` | [`ImageError`] |
//!
//! [`ImageWorker`] runs the whole chain for one element: decode, crop
//! window, resize, augment, write. Its buffers live as long as it does, one
//! worker per thread.
//!
//! # Randomness
//!
//! Every random choice of an element is a function of [`element_seed`]
//! (the pipeline's seed, the epoch and the element's position) and nothing
//! else: no generator state moves from one element to the next, so the
//! output does not depend on how elements are spread over threads, and a
//! resumed iterator draws exactly what the uninterrupted one would have.
//!
//! # Example
//!
//! ```
//! use tfpipe::image::{element_seed, Crop, ImageOptions, ImageWorker, OutputSlice};
//!
//! let jpeg = std::fs::read("testdata/images/china_q90.jpg")?;
//! let options = ImageOptions { crop: Crop::Random(Default::default()), ..ImageOptions::new(24, 24, 3) };
//! let mut worker = ImageWorker::new(options)?;
//! let mut pixels = vec![0u8; options.output_len()];
//! worker.process(&jpeg, element_seed(42, 0, 7), OutputSlice::Uint8(&mut pixels))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod augment;
mod codecs;
mod crop;
mod decode;
mod error;
mod jpeg;
mod resize;
mod spec;
#[cfg(test)]
mod tf_tests;

pub use augment::{Augment, ImageLayout, OutputSlice, OutputType};
pub use crop::{DEFAULT_CENTER_FRACTION, RandomCrop, center_crop};
pub use decode::{
    DEFAULT_MAX_PIXELS, DecodeOptions, Decoder, Header, Image, ImageFormat, read_header,
};
pub use error::ImageError;
pub use resize::{ResizeMethod, ResizeScratch, Window, resize};

use crate::rng::{SplitMix64, epoch_seed};

/// The seed of all random choices for the element at `position` (its index
/// in the epoch's input order) of epoch `epoch` of a pipeline seeded `seed`.
///
/// ```
/// use tfpipe::image::element_seed;
/// assert_ne!(element_seed(1, 0, 0), element_seed(1, 0, 1));
/// assert_ne!(element_seed(1, 0, 0), element_seed(1, 1, 0));
/// assert_eq!(element_seed(1, 2, 3), element_seed(1, 2, 3));
/// ```
pub fn element_seed(seed: u64, epoch: u64, position: u64) -> u64 {
    let mut rng =
        SplitMix64(epoch_seed(seed, epoch) ^ position.wrapping_mul(0x9FB2_1C65_1E98_DF25));
    rng.next_u64()
}

/// Which window of the decoded image is resized.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Crop {
    /// The whole image (its aspect ratio is not kept, as in `tf.image.resize`).
    #[default]
    None,
    /// The square centre crop of `fraction` times the shorter side
    /// ([`center_crop`]).
    Center {
        /// In `(0, 1]`.
        fraction: f32,
    },
    /// A random window ([`RandomCrop`]).
    Random(RandomCrop),
}

/// What one decoded image becomes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImageOptions {
    /// Output rows.
    pub height: usize,
    /// Output columns.
    pub width: usize,
    /// Output channels: 1 (grey) or 3 (RGB).
    pub channels: usize,
    /// The interpolation. By default bilinear.
    pub method: ResizeMethod,
    /// Antialias when shrinking (`tf.image.resize(antialias=...)`). By
    /// default off, as in TensorFlow.
    pub antialias: bool,
    /// The window resized. By default the whole image.
    pub crop: Crop,
    /// Random augmentations. By default none.
    pub augment: Augment,
    /// `uint8` or normalised `float32`. By default `uint8`.
    pub output: OutputType,
    /// `[H, W, C]` or `[C, H, W]`. By default `[H, W, C]`.
    pub layout: ImageLayout,
    /// The most pixels an encoded image may claim. By default
    /// [`DEFAULT_MAX_PIXELS`].
    pub max_pixels: u64,
    /// Decode a JPEG whose window is at least twice the output size at 1/2,
    /// 1/4 or 1/8 of its size ([`Decoder::decode_window_scaled`]), as PIL's
    /// `draft` and DALI do, instead of exactly as TensorFlow does. Off in
    /// [`ImageOptions::new`]; the spec text turns it on with `random_crop`
    /// (unless `exact`) or `dct_scale` (docs/images.md, "DCT-scaled decoding").
    pub dct_scale: bool,
}

impl ImageOptions {
    /// `height x width x channels`, everything else at its default.
    pub fn new(height: usize, width: usize, channels: usize) -> ImageOptions {
        ImageOptions {
            height,
            width,
            channels,
            method: ResizeMethod::Bilinear,
            antialias: false,
            crop: Crop::None,
            augment: Augment::default(),
            output: OutputType::Uint8,
            layout: ImageLayout::Nhwc,
            max_pixels: DEFAULT_MAX_PIXELS,
            dct_scale: false,
        }
    }

    /// Refuses options that cannot work (a zero size, a bad range).
    pub fn check(&self) -> Result<(), ImageError> {
        if self.height == 0 || self.width == 0 {
            return Err(ImageError::Config(format!(
                "the output size {}x{} must not be empty",
                self.height, self.width
            )));
        }
        self.decode_options().check()?;
        match self.crop {
            Crop::None => {}
            Crop::Center { fraction } => crop::check_fraction(fraction)?,
            Crop::Random(random) => random.check()?,
        }
        self.augment.check()?;
        self.output.check()
    }

    /// Values per output image: `height * width * channels`.
    pub fn output_len(&self) -> usize {
        self.height * self.width * self.channels
    }

    /// The output shape in its layout.
    pub fn shape(&self) -> [usize; 3] {
        match self.layout {
            ImageLayout::Nhwc => [self.height, self.width, self.channels],
            ImageLayout::Nchw => [self.channels, self.height, self.width],
        }
    }

    /// Whether any choice depends on the element's seed.
    pub fn is_random(&self) -> bool {
        matches!(self.crop, Crop::Random(_)) || !self.augment.is_none()
    }

    fn decode_options(&self) -> DecodeOptions {
        DecodeOptions {
            channels: self.channels,
            max_pixels: self.max_pixels,
        }
    }
}

/// Decodes, crops, resizes, augments and writes one image at a time,
/// reusing its buffers (one worker per thread).
#[derive(Debug)]
pub struct ImageWorker {
    options: ImageOptions,
    decoder: Decoder,
    image: Image,
    scratch: ResizeScratch,
    pixels: Vec<f32>,
}

impl ImageWorker {
    /// A worker for these options (checked).
    pub fn new(options: ImageOptions) -> Result<ImageWorker, ImageError> {
        options.check()?;
        Ok(ImageWorker {
            options,
            decoder: Decoder::new(options.decode_options())?,
            image: Image::default(),
            scratch: ResizeScratch::default(),
            pixels: Vec::new(),
        })
    }

    /// The options.
    pub fn options(&self) -> &ImageOptions {
        &self.options
    }

    /// Turns `bytes` into one output image in `out`, with random choices
    /// drawn from `seed` (see [`element_seed`]; ignored when nothing is
    /// random).
    pub fn process(
        &mut self,
        bytes: &[u8],
        seed: u64,
        out: OutputSlice<'_>,
    ) -> Result<(), ImageError> {
        let o = self.options;
        // The window is chosen from the header, so that a JPEG is decoded
        // only down to the window's last row.
        let choose = |height, width| match o.crop {
            Crop::None => Window::full(height, width),
            Crop::Center { fraction } => center_crop(height, width, fraction),
            Crop::Random(random) => {
                let crop_seed = augment::stream(seed, augment::Stream::Crop).next_u64();
                random.window(height, width, crop_seed)
            }
        };
        let window = if o.dct_scale {
            let size = (o.height, o.width);
            (self.decoder).decode_window_scaled(bytes, choose, size, &mut self.image)?
        } else {
            self.decoder.decode_window(bytes, choose, &mut self.image)?
        };
        // The flip is done by the resize, which writes the columns in
        // reverse: the same values as flipping afterwards, without a pass
        // over the image.
        let mirror = o.augment.flips(seed);
        resize::resize_mirrored(
            &self.image,
            window,
            (o.height, o.width),
            (o.method, o.antialias),
            mirror,
            &mut self.scratch,
            &mut self.pixels,
        );
        o.augment
            .apply_after_flip(&mut self.pixels, o.channels, seed);
        augment::write_output(&self.pixels, o.channels, o.output, o.layout, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn photo() -> Vec<u8> {
        std::fs::read("testdata/images/china_q90.jpg").unwrap()
    }

    fn run(options: ImageOptions, seed: u64) -> Vec<u8> {
        let mut worker = ImageWorker::new(options).unwrap();
        let mut out = vec![0u8; options.output_len()];
        worker
            .process(&photo(), seed, OutputSlice::Uint8(&mut out))
            .unwrap();
        out
    }

    /// The flip done by the resize (columns written in reverse) gives
    /// what resizing and then flipping gave, bit for bit, with the jitters
    /// after it, for crops and sizes that grow and shrink.
    #[test]
    fn the_flip_in_the_resize_equals_a_flip_after_it() {
        let mut flipped = 0;
        for (height, width) in [(16, 16), (7, 40), (50, 9)] {
            let options = ImageOptions {
                output: OutputType::IMAGENET,
                ..all_random(height, width)
            };
            let mut worker = ImageWorker::new(options).unwrap();
            for position in 0..12 {
                let seed = element_seed(3, 0, position);
                let mut got = vec![0f32; options.output_len()];
                worker
                    .process(&photo(), seed, OutputSlice::Float32(&mut got))
                    .unwrap();
                // The old order: resize, then flip and jitter the pixels.
                let o = options;
                let choose = |h, w| {
                    let crop_seed = augment::stream(seed, augment::Stream::Crop).next_u64();
                    RandomCrop::default().window(h, w, crop_seed)
                };
                let mut image = Image::default();
                let window = worker
                    .decoder
                    .decode_window(&photo(), choose, &mut image)
                    .unwrap();
                let mut pixels = Vec::new();
                let mut scratch = ResizeScratch::default();
                resize(
                    &image,
                    window,
                    height,
                    width,
                    o.method,
                    o.antialias,
                    &mut scratch,
                    &mut pixels,
                );
                o.augment.apply(&mut pixels, width, 3, seed);
                let mut want = vec![0f32; options.output_len()];
                augment::write_output(
                    &pixels,
                    3,
                    o.output,
                    o.layout,
                    OutputSlice::Float32(&mut want),
                )
                .unwrap();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{height}x{width} position {position}");
                flipped += usize::from(o.augment.flips(seed));
            }
        }
        assert!((6..30).contains(&flipped), "{flipped} of 36 flipped");
    }

    /// RGB images of `height x width` with every random choice on.
    fn all_random(height: usize, width: usize) -> ImageOptions {
        ImageOptions {
            crop: Crop::Random(RandomCrop::default()),
            augment: Augment {
                flip: true,
                brightness: Some(0.1),
                contrast: Some((0.8, 1.2)),
                saturation: Some((0.5, 1.5)),
            },
            ..ImageOptions::new(height, width, 3)
        }
    }

    /// A worker's own buffers (the decoded image, the resized pixels)
    /// grow to the largest image they have held and are reused after
    /// that: going over the same images again allocates none of them anew.
    #[test]
    fn the_worker_reuses_its_buffers() {
        let options = all_random(16, 16);
        let mut worker = ImageWorker::new(options).unwrap();
        let mut out = vec![0u8; options.output_len()];
        let mut pass = |worker: &mut ImageWorker| {
            let mut seen = Vec::new();
            for position in 0..30 {
                let seed = element_seed(2, 0, position);
                worker
                    .process(&photo(), seed, OutputSlice::Uint8(&mut out))
                    .unwrap();
                seen.push((worker.image.data.as_ptr(), worker.pixels.as_ptr()));
            }
            seen
        };
        pass(&mut worker);
        let buffers = (worker.image.data.as_ptr(), worker.pixels.as_ptr());
        let again = pass(&mut worker);
        assert!(
            again.iter().all(|&b| b == buffers),
            "{buffers:?} then {again:?}"
        );
        assert!(worker.image.data.capacity() > 0 && worker.pixels.capacity() > 0);
    }

    #[test]
    fn random_choices_follow_the_seed_only() {
        let options = all_random(16, 16);
        let a = run(options, element_seed(5, 0, 3));
        assert_eq!(a, run(options, element_seed(5, 0, 3)));
        assert_ne!(a, run(options, element_seed(5, 0, 4)));
        assert_ne!(a, run(options, element_seed(5, 1, 3)));
    }

    #[test]
    fn dct_scaled_crops_follow_the_seed_only() {
        let exact = ImageOptions {
            crop: Crop::Random(RandomCrop::default()),
            augment: Augment {
                flip: true,
                ..Augment::default()
            },
            ..ImageOptions::new(4, 4, 3)
        };
        let scaled = ImageOptions {
            dct_scale: true,
            ..exact
        };
        let mut differs = 0;
        for position in 0..20 {
            let seed = element_seed(9, 0, position);
            let a = run(scaled, seed);
            assert_eq!(a, run(scaled, seed), "{position}");
            differs += usize::from(a != run(exact, seed));
        }
        // Windows of 8 px or more (of 32 x 40) were decoded scaled.
        assert!(differs > 0);
    }

    #[test]
    fn a_plain_resize_ignores_the_seed_and_nchw_transposes() {
        let options = ImageOptions::new(8, 6, 3);
        let hwc = run(options, 1);
        assert_eq!(hwc, run(options, 2));
        let chw = run(
            ImageOptions {
                layout: ImageLayout::Nchw,
                ..options
            },
            1,
        );
        for (i, v) in hwc.iter().enumerate() {
            let (pixel, c) = (i / 3, i % 3);
            assert_eq!(chw[c * 48 + pixel], *v);
        }
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(ImageWorker::new(ImageOptions::new(0, 4, 3)).is_err());
        assert!(ImageWorker::new(ImageOptions::new(4, 4, 2)).is_err());
        let bad = ImageOptions {
            crop: Crop::Center { fraction: 0.0 },
            ..ImageOptions::new(4, 4, 1)
        };
        assert!(ImageWorker::new(bad).is_err());
    }
}
