//! Decoding JPEG, PNG, GIF and BMP bytes into `uint8` `[H, W, C]` pixels.
//!
//! The format is told by the signature (magic bytes), as
//! `tf.io.decode_image` does. The size is read from the header and checked
//! against [`DecodeOptions::max_pixels`] before any pixel buffer is
//! allocated. JPEG is decoded by zune-jpeg (strict: a truncated or corrupt
//! stream is an error, as in TensorFlow without `try_recover_truncated`),
//! PNG by the `png` crate, GIF and BMP by the `image` crate's codecs
//! (docs/benchmarks.md, "Image decoding", says why these).
//!
//! Channel conversion follows TensorFlow:
//! - alpha is dropped, never composited (libpng's `png_set_strip_alpha`);
//! - grey to RGB repeats the grey value;
//! - RGB to grey is libpng's `png_set_rgb_to_gray` with TensorFlow's
//!   weights (0.299, 0.587): `(9797 R + 19234 G + 3737 B) >> 15` (the weights truncated to 15 bits, as libpng stores them), exactly
//!   what `tf.io.decode_png(channels=1)` gives; a colour JPEG gives its
//!   luma (Y) plane, as libjpeg does for `decode_jpeg(channels=1)`. GIF and
//!   BMP use the PNG rule (TensorFlow refuses `channels=1` for them);
//! - 16-bit PNG samples keep their high byte (libpng's `png_set_strip_16`).
//!
//! Only the first frame of an animated GIF is decoded
//! (`decode_image(expand_animations=False)`).

use super::codecs;
use super::error::ImageError;
use super::jpeg::Frame;
use super::resize::Window;

/// The default limit on decoded pixels: 50 megapixels, above any camera
/// photograph of a training set and below an allocation that hurts (150 MB
/// of RGB).
pub const DEFAULT_MAX_PIXELS: u64 = 50_000_000;

/// An encoded image format, told by its signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// JPEG (`FF D8 FF`).
    Jpeg,
    /// PNG (`89 50 4E 47 0D 0A 1A 0A`).
    Png,
    /// GIF (`GIF87a` or `GIF89a`).
    Gif,
    /// BMP (`BM`).
    Bmp,
}

impl ImageFormat {
    /// The format whose signature `bytes` start with, if any.
    ///
    /// ```
    /// use tfpipe::image::ImageFormat;
    /// assert_eq!(ImageFormat::sniff(b"\x89PNG\r\n\x1a\n...."), Some(ImageFormat::Png));
    /// assert_eq!(ImageFormat::sniff(b"hello"), None);
    /// ```
    pub fn sniff(bytes: &[u8]) -> Option<ImageFormat> {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(ImageFormat::Jpeg)
        } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(ImageFormat::Png)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(ImageFormat::Gif)
        } else if bytes.starts_with(b"BM") {
            Some(ImageFormat::Bmp)
        } else {
            None
        }
    }

    /// The lower-case name (`jpeg`, `png`, `gif`, `bmp`).
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "jpeg",
            ImageFormat::Png => "png",
            ImageFormat::Gif => "gif",
            ImageFormat::Bmp => "bmp",
        }
    }
}

impl std::fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::Png => "PNG",
            ImageFormat::Gif => "GIF",
            ImageFormat::Bmp => "BMP",
        })
    }
}

/// What a header says, read without decoding any pixel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The format.
    pub format: ImageFormat,
    /// Width in pixels.
    pub width: u64,
    /// Height in pixels.
    pub height: u64,
    /// Colour channels the encoding holds, alpha not counted: 1 for grey
    /// (a grey PNG, a one-component JPEG), else 3.
    pub channels: u8,
}

/// Decoded pixels, `[height, width, channels]` in row-major order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Image {
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// Values per pixel (1 or 3).
    pub channels: usize,
    /// `height * width * channels` values.
    pub data: Vec<u8>,
}

/// How to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Channels of the output: 1 (grey) or 3 (RGB). By default 3.
    pub channels: usize,
    /// The most pixels (width times height) an image may claim; a larger
    /// header is refused before anything is allocated. By default
    /// [`DEFAULT_MAX_PIXELS`].
    pub max_pixels: u64,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            channels: 3,
            max_pixels: DEFAULT_MAX_PIXELS,
        }
    }
}

impl DecodeOptions {
    /// Refuses a channel count other than 1 or 3, and a zero pixel limit.
    pub fn check(&self) -> Result<(), ImageError> {
        if self.channels != 1 && self.channels != 3 {
            return Err(ImageError::Config(format!(
                "channels must be 1 or 3, not {}",
                self.channels
            )));
        }
        if self.max_pixels == 0 {
            return Err(ImageError::Config("max_pixels must be at least 1".into()));
        }
        Ok(())
    }
}

/// Reads the format and size of an encoded image without decoding pixels.
///
/// ```
/// let png = std::fs::read("testdata/images/china_rgb.png")?;
/// let header = tfpipe::image::read_header(&png)?;
/// assert_eq!((header.width, header.height, header.channels), (32, 40, 3));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read_header(bytes: &[u8]) -> Result<Header, ImageError> {
    let format = ImageFormat::sniff(bytes).ok_or_else(|| unrecognized(bytes))?;
    let (width, height, channels) = match format {
        // The marker segments when they parse (no Huffman tables built),
        // else the codec, which says what is wrong.
        ImageFormat::Jpeg => match Frame::read(bytes) {
            Some(f) if f.height > 0 && f.width > 0 => (f.width as u64, f.height as u64, f.channels),
            _ => codecs::jpeg_size(bytes)?,
        },
        ImageFormat::Png => png_size(bytes)?,
        ImageFormat::Gif => small_header(bytes, format, 6, 2)?,
        ImageFormat::Bmp => small_header(bytes, format, 18, 4)?,
    };
    Ok(Header {
        format,
        width,
        height,
        channels,
    })
}

/// PNG's IHDR chunk: two big-endian u32 at byte 16, then the bit depth and
/// the colour type (0 grey, 4 grey + alpha; 2, 3 and 6 colour).
fn png_size(bytes: &[u8]) -> Result<(u64, u64, u8), ImageError> {
    match (bytes.get(12..16), bytes.get(16..26)) {
        (Some(b"IHDR"), Some(b)) => Ok((
            u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            u64::from(u32::from_be_bytes([b[4], b[5], b[6], b[7]])),
            if matches!(b[9], 0 | 4) { 1 } else { 3 },
        )),
        (Some(_), Some(_)) => Err(ImageError::Corrupt {
            format: ImageFormat::Png,
            what: "the first chunk is not IHDR".into(),
        }),
        _ => Err(ImageError::Truncated {
            format: ImageFormat::Png,
            len: bytes.len(),
        }),
    }
}

/// GIF's logical screen (two little-endian u16 at byte 6) and BMP's
/// `BITMAPINFOHEADER` (two little-endian i32 at byte 18; a negative height
/// means top-down rows).
fn small_header(
    bytes: &[u8],
    format: ImageFormat,
    at: usize,
    width: usize,
) -> Result<(u64, u64, u8), ImageError> {
    let field = |i: usize| -> Option<u64> {
        let b = bytes.get(at + i * width..at + (i + 1) * width)?;
        Some(match width {
            2 => u64::from(u16::from_le_bytes([b[0], b[1]])),
            _ => u64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]).unsigned_abs()),
        })
    };
    match (field(0), field(1)) {
        (Some(w), Some(h)) => Ok((w, h, 3)),
        _ => Err(ImageError::Truncated {
            format,
            len: bytes.len(),
        }),
    }
}

/// `window` cut to an image of `height x width`, at least one pixel.
pub(super) fn clamp(window: Window, height: usize, width: usize) -> Window {
    let top = window.top.min(height.saturating_sub(1));
    let left = window.left.min(width.saturating_sub(1));
    Window {
        top,
        left,
        height: window.height.max(1).min(height - top),
        width: window.width.max(1).min(width - left),
    }
}

/// The largest of 8, 4 and 2 that keeps `window` at least `at_least`
/// (rows, columns) on both sides once divided by it, else 1.
fn dct_scale(window: Window, at_least: (usize, usize)) -> usize {
    let (rows, columns) = at_least;
    [8, 4, 2]
        .into_iter()
        .find(|s| window.height >= s * rows.max(1) && window.width >= s * columns.max(1))
        .unwrap_or(1)
}

/// `window` of an image of `size` (rows, columns) in the pixels of the
/// image decoded at 1/`scale`: each edge rounded to the nearest scaled
/// pixel, except that the image's own bottom and right edges stay its edges
/// (the scaled image's last row and column cover what is left of the
/// image); at least one pixel (the caller clamps it to the image).
fn scaled(window: Window, size: (usize, usize), scale: usize) -> Window {
    let edge = |x: usize, end: usize| match x == end {
        true => end.div_ceil(scale),
        false => (x + scale / 2) / scale,
    };
    let (top, left) = (edge(window.top, size.0), edge(window.left, size.1));
    let bottom = edge(window.top + window.height, size.0);
    let right = edge(window.left + window.width, size.1);
    Window {
        top,
        left,
        height: bottom.saturating_sub(top).max(1),
        width: right.saturating_sub(left).max(1),
    }
}

fn unrecognized(bytes: &[u8]) -> ImageError {
    ImageError::Unrecognized {
        start: bytes[..bytes.len().min(8)].to_vec(),
        len: bytes.len(),
    }
}

/// A reusable decoder: one per worker thread, so that its scratch buffer
/// (the codec's output before channel conversion) is allocated once.
///
/// ```
/// use tfpipe::image::{DecodeOptions, Decoder, Image};
///
/// let png = std::fs::read("testdata/images/china_rgb.png")?;
/// let mut decoder = Decoder::new(DecodeOptions { channels: 1, ..DecodeOptions::default() })?;
/// let mut image = Image::default();
/// decoder.decode(&png, &mut image)?;
/// assert_eq!((image.height, image.width, image.channels), (40, 32, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Decoder {
    options: DecodeOptions,
    raw: Vec<u8>,
}

impl Decoder {
    /// A decoder with these options (checked).
    pub fn new(options: DecodeOptions) -> Result<Decoder, ImageError> {
        options.check()?;
        Ok(Decoder {
            options,
            raw: Vec::new(),
        })
    }

    /// The options.
    pub fn options(&self) -> &DecodeOptions {
        &self.options
    }

    /// Decodes `bytes` into `out`, reusing its buffer.
    pub fn decode(&mut self, bytes: &[u8], out: &mut Image) -> Result<(), ImageError> {
        self.decode_window(bytes, Window::full, out).map(|_| ())
    }

    /// Decodes the part of `bytes` that `choose` (given the image's height
    /// and width from its header) says is needed, into `out`, and returns
    /// that window, clamped to the image.
    ///
    /// A sequential JPEG is decoded only down to the window's last MCU row
    /// (and one more, so the window's pixels equal a full decode's): `out`
    /// then has fewer rows than the image. Of the rows decoded, only the
    /// window's pixels are sure to be the image's: as TensorFlow's
    /// `decode_and_crop_jpeg`, the MCUs away from the window are only
    /// entropy-decoded (docs/images.md, "Decode-and-crop"). Every other
    /// image is decoded whole.
    ///
    /// ```
    /// use tfpipe::image::{DecodeOptions, Decoder, Image, Window};
    ///
    /// let jpeg = std::fs::read("testdata/images/china_q90.jpg")?;
    /// let mut decoder = Decoder::new(DecodeOptions::default())?;
    /// let mut image = Image::default();
    /// let top = |_h, w| Window { top: 0, left: 0, height: 8, width: w };
    /// let window = decoder.decode_window(&jpeg, top, &mut image)?;
    /// assert_eq!((window.height, window.width), (8, 32));
    /// assert_eq!(image.height, 32); // of 40: the last MCU row was skipped
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decode_window(
        &mut self,
        bytes: &[u8],
        choose: impl FnOnce(usize, usize) -> Window,
        out: &mut Image,
    ) -> Result<Window, ImageError> {
        self.decode_window_at(bytes, choose, None, out)
    }

    /// [`decode_window`](Self::decode_window), but a sequential JPEG whose
    /// window is at least twice `at_least` (rows, columns) on both sides is
    /// decoded at 1/2, 1/4 or 1/8 of its size (DCT-scaled, as libjpeg's
    /// `scale_denom` and `tf.io.decode_jpeg(ratio=...)`): the smallest scale
    /// that keeps the window at least `at_least`. `out` and the window
    /// returned are then in the scaled image's pixels (the window's edges
    /// rounded to the nearest scaled pixel, inside the image).
    ///
    /// Scaled only: sequential (baseline or extended) JPEGs with every
    /// component in the first scan, grey ones, and colour ones decoded to
    /// RGB whose chroma is 4:4:4, 4:2:2 or 4:2:0, and progressive ones
    /// without 4:2:2 (docs/images.md, "DCT-scaled decoding"); anything else
    /// is decoded as `decode_window` does.
    ///
    /// ```
    /// use tfpipe::image::{DecodeOptions, Decoder, Image, Window};
    ///
    /// let jpeg = std::fs::read("testdata/images/china_q90.jpg")?; // 32 x 40
    /// let mut decoder = Decoder::new(DecodeOptions::default())?;
    /// let mut image = Image::default();
    /// let window = decoder.decode_window_scaled(&jpeg, Window::full, (8, 8), &mut image)?;
    /// assert_eq!((image.height, image.width), (10, 8)); // decoded at 1/4
    /// assert_eq!((window.height, window.width), (10, 8));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decode_window_scaled(
        &mut self,
        bytes: &[u8],
        choose: impl FnOnce(usize, usize) -> Window,
        at_least: (usize, usize),
        out: &mut Image,
    ) -> Result<Window, ImageError> {
        self.decode_window_at(bytes, choose, Some(at_least), out)
    }

    fn decode_window_at(
        &mut self,
        bytes: &[u8],
        choose: impl FnOnce(usize, usize) -> Window,
        at_least: Option<(usize, usize)>,
        out: &mut Image,
    ) -> Result<Window, ImageError> {
        let header = read_header(bytes)?;
        self.check_size(header)?;
        let channels = self.options.channels;
        let decoded = match header.format {
            ImageFormat::Jpeg => {
                // Checked against `max_pixels` above, so both fit in usize.
                let (height, width) = (header.height as usize, header.width as usize);
                let window = clamp(choose(height, width), height, width);
                let scale = at_least.map_or(1, |size| dct_scale(window, size));
                let in_scaled = |scale| scaled(window, (height, width), scale);
                let scale = self.decode_jpeg_rows(bytes, header, window, scale, in_scaled, out)?;
                return Ok(clamp(in_scaled(scale), out.height, out.width));
            }
            ImageFormat::Png => codecs::decode_png(bytes, &mut self.raw)?,
            ImageFormat::Gif | ImageFormat::Bmp => {
                codecs::decode_other(bytes, header.format, &mut self.raw, |h| {
                    self.options.check_size(h)
                })?
            }
        };
        let Raw {
            width,
            height,
            channels: from,
        } = decoded;
        convert_channels(
            &self.raw[..width * height * from],
            from,
            width,
            height,
            channels,
            out,
        );
        // A GIF's first frame may be smaller than its header's screen.
        Ok(clamp(choose(out.height, out.width), out.height, out.width))
    }

    /// A JPEG's `window` (see [`jpeg`](super::jpeg)): its rows from the top
    /// to the window's last at least, at 1/`scale` of its size where the
    /// codec can; returns the scale used. Only the window's pixels
    /// (`in_scaled(scale)`) are sure to be written (decode-and-crop).
    fn decode_jpeg_rows(
        &mut self,
        bytes: &[u8],
        header: Header,
        window: Window,
        scale: usize,
        in_scaled: impl FnOnce(usize) -> Window,
        out: &mut Image,
    ) -> Result<usize, ImageError> {
        let channels = self.options.channels;
        let rows = window.top + window.height;
        let frame = Frame::read(bytes)
            .filter(|f| (f.height as u64, f.width as u64) == (header.height, header.width));
        match frame.map(|f| (f, f.rows_to_decode(rows))) {
            Some((frame, decode)) if decode < frame.height => {
                frame.shortened(bytes, decode, &mut self.raw);
                codecs::decode_jpeg(&self.raw, channels, scale, in_scaled, out)
            }
            _ => codecs::decode_jpeg(bytes, channels, scale, in_scaled, out),
        }
    }

    fn check_size(&self, header: Header) -> Result<(), ImageError> {
        self.options.check_size(header)
    }
}

/// What a codec wrote into the scratch buffer: `width * height * channels`
/// bytes, channels 1 (grey), 2 (grey + alpha), 3 (RGB) or 4 (RGBA).
pub(super) struct Raw {
    pub(super) width: usize,
    pub(super) height: usize,
    pub(super) channels: usize,
}

impl DecodeOptions {
    /// Refuses an empty image, or one of more than `max_pixels` pixels.
    pub(super) fn check_size(&self, header: Header) -> Result<(), ImageError> {
        let Header {
            format,
            width,
            height,
            ..
        } = header;
        if width == 0 || height == 0 {
            return Err(ImageError::Empty {
                format,
                width,
                height,
            });
        }
        if width.saturating_mul(height) > self.max_pixels {
            return Err(ImageError::TooLarge {
                format,
                width,
                height,
                max_pixels: self.max_pixels,
            });
        }
        Ok(())
    }
}

/// libpng's `png_set_rgb_to_gray` with TensorFlow's weights, in its 15-bit
/// fixed point, truncating (what `decode_png(channels=1)` gives, bit for bit).
fn grey(r: u8, g: u8, b: u8) -> u8 {
    ((9797 * u32::from(r) + 19234 * u32::from(g) + 3737 * u32::from(b)) >> 15) as u8
}

/// From 1 (grey), 2 (grey + alpha), 3 (RGB) or 4 (RGBA) channels to
/// `channels` (1 or 3), alpha dropped.
fn convert_channels(
    raw: &[u8],
    from: usize,
    width: usize,
    height: usize,
    channels: usize,
    out: &mut Image,
) {
    out.width = width;
    out.height = height;
    out.channels = channels;
    out.data.clear();
    out.data.reserve(width * height * channels);
    let pixels = raw.chunks_exact(from);
    match (from, channels) {
        (1 | 2, 1) => out.data.extend(pixels.map(|p| p[0])),
        (1 | 2, _) => out.data.extend(pixels.flat_map(|p| [p[0]; 3])),
        (_, 1) => out.data.extend(pixels.map(|p| grey(p[0], p[1], p[2]))),
        (_, _) => out.data.extend(pixels.flat_map(|p| [p[0], p[1], p[2]])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(channels: usize) -> DecodeOptions {
        DecodeOptions {
            channels,
            ..DecodeOptions::default()
        }
    }

    #[test]
    fn sniffs_each_signature() {
        assert_eq!(
            ImageFormat::sniff(&[0xFF, 0xD8, 0xFF, 0xE0]),
            Some(ImageFormat::Jpeg)
        );
        assert_eq!(ImageFormat::sniff(b"GIF89a..."), Some(ImageFormat::Gif));
        assert_eq!(ImageFormat::sniff(b"BM......"), Some(ImageFormat::Bmp));
        assert_eq!(ImageFormat::sniff(b"\x89PNG\r\n"), None);
    }

    #[test]
    fn a_huge_header_is_refused_before_allocation() {
        // A valid PNG signature and IHDR claiming 100000 x 100000 pixels.
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend(100_000u32.to_be_bytes());
        png.extend(100_000u32.to_be_bytes());
        png.extend([8, 2, 0, 0, 0]);
        png.extend(crc32(&png[12..]).to_be_bytes());
        let mut decoder = Decoder::new(options(3)).unwrap();
        let mut image = Image::default();
        let error = decoder.decode(&png, &mut image).unwrap_err();
        assert!(
            matches!(error, ImageError::TooLarge { width: 100_000, .. }),
            "{error}"
        );
        assert_eq!(image.data.capacity(), 0);

        // A GIF logical screen of 65535 x 65535 under a 1000-pixel limit.
        let gif = b"GIF89a\xff\xff\xff\xff\0\0\0;".to_vec();
        let mut small = Decoder::new(DecodeOptions {
            channels: 3,
            max_pixels: 1000,
        })
        .unwrap();
        let error = small.decode(&gif, &mut image).unwrap_err();
        assert!(
            matches!(error, ImageError::TooLarge { width: 65535, .. }),
            "{error}"
        );

        // A BMP's BITMAPINFOHEADER of 100000 x -100000 (top-down rows) and
        // a JPEG's SOF0 of 65500 x 65500: refused too, nothing allocated.
        let mut bmp = b"BM".to_vec();
        bmp.extend([0; 12]);
        bmp.extend(40u32.to_le_bytes());
        bmp.extend(100_000i32.to_le_bytes());
        bmp.extend((-100_000i32).to_le_bytes());
        bmp.extend([1, 0, 24, 0]);
        bmp.extend([0; 24]);
        let mut jpeg = b"\xff\xd8\xff\xc0\0\x11\x08".to_vec();
        jpeg.extend(65_500u16.to_be_bytes());
        jpeg.extend(65_500u16.to_be_bytes());
        jpeg.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        // A scan header and the end: the size is read from the markers.
        jpeg.extend([0xFF, 0xDA, 0, 12, 3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0]);
        jpeg.extend([0xFF, 0xD9]);
        for (name, bytes, side) in [("BMP", bmp, 100_000), ("JPEG", jpeg, 65_500)] {
            let mut image = Image::default();
            let error = decoder.decode(&bytes, &mut image).unwrap_err();
            assert!(
                matches!(error, ImageError::TooLarge { width, .. } if width == side),
                "{name}: {error}"
            );
            assert_eq!(image.data.capacity(), 0, "{name}");
        }
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn truncated_and_unknown_bytes_are_errors() {
        let mut decoder = Decoder::new(options(3)).unwrap();
        let mut image = Image::default();
        for name in [
            "china_q90.jpg",
            "china_q50_progressive.jpg",
            "china_rgb.png",
            "china.gif",
            "flower.bmp",
        ] {
            let bytes = std::fs::read(format!("testdata/images/{name}")).unwrap();
            decoder.decode(&bytes, &mut image).unwrap();
            let cut = &bytes[..bytes.len() * 2 / 3];
            let error = decoder.decode(cut, &mut image).unwrap_err();
            assert!(error.is_data_error(), "{name}: {error}");
        }
        let error = decoder.decode(b"not an image", &mut image).unwrap_err();
        assert_eq!(
            error.to_string(),
            "not a JPEG, PNG, GIF or BMP image (12 bytes starting [6e, 6f, 74, 20, 61, 6e, 20, 69])"
        );
    }

    #[test]
    fn channel_conversion_follows_tensorflow() {
        let mut out = Image::default();
        convert_channels(&[10, 20, 30, 255], 4, 1, 1, 3, &mut out);
        assert_eq!(out.data, [10, 20, 30]);
        convert_channels(&[7, 0], 2, 1, 1, 3, &mut out);
        assert_eq!(out.data, [7, 7, 7]);
        convert_channels(&[255, 255, 255], 3, 1, 1, 1, &mut out);
        // 32768 * 255 >> 15 is 255: white stays white.
        assert_eq!(out.data, [255]);
        convert_channels(&[19, 13, 17], 3, 1, 1, 1, &mut out);
        assert_eq!(out.data, [15]);
    }

    #[test]
    fn options_are_checked() {
        assert!(Decoder::new(options(4)).is_err());
        assert!(
            Decoder::new(DecodeOptions {
                channels: 1,
                max_pixels: 0
            })
            .is_err()
        );
    }
}
