//! The codec crates behind [`Decoder`](super::Decoder): zune-jpeg for JPEG,
//! `png` for PNG, the `image` crate's GIF and BMP decoders. Only built with
//! the `images` cargo feature; without it every function here answers
//! [`ImageError::NotBuilt`].
//!
//! Each decodes into a caller-owned buffer (reused from image to image),
//! and none allocates pixels before the caller has checked the header.

#[cfg(feature = "images")]
pub(super) use with_codecs::*;
#[cfg(not(feature = "images"))]
pub(super) use without_codecs::*;

#[cfg(feature = "images")]
mod with_codecs {
    use std::io::Cursor;

    use zune_core::bytestream::ZCursor;
    use zune_core::colorspace::ColorSpace;
    use zune_core::options::DecoderOptions;

    use crate::image::decode::{Header, Image, ImageFormat, Raw, clamp};
    use crate::image::error::ImageError;
    use crate::image::resize::Window;

    /// zune-jpeg, strict (a truncated or corrupt stream is an error, as in
    /// TensorFlow without `try_recover_truncated`), decoding straight to
    /// grey (the luma plane, as libjpeg does) or RGB.
    fn jpeg_decoder(bytes: &[u8], channels: usize) -> zune_jpeg::JpegDecoder<ZCursor<&[u8]>> {
        let colorspace = if channels == 1 {
            ColorSpace::Luma
        } else {
            ColorSpace::RGB
        };
        let options = DecoderOptions::default()
            .set_strict_mode(true)
            .set_max_width(usize::from(u16::MAX))
            .set_max_height(usize::from(u16::MAX))
            .jpeg_set_out_colorspace(colorspace);
        zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options)
    }

    /// The size and channels (1 for one component, else 3) in a JPEG's
    /// frame header.
    pub(crate) fn jpeg_size(bytes: &[u8]) -> Result<(u64, u64, u8), ImageError> {
        let mut decoder = jpeg_decoder(bytes, 3);
        decoder.decode_headers().map_err(ImageError::Jpeg)?;
        let (w, h) = decoder.dimensions().unwrap_or((0, 0));
        let grey = decoder.info().is_some_and(|i| i.components == 1);
        Ok((w as u64, h as u64, if grey { 1 } else { 3 }))
    }

    /// Decodes a JPEG (whose size the caller checked) straight into `out`,
    /// at 1/`scale` of its size (1, 2, 4 or 8) where the vendored
    /// zune-jpeg's reduced IDCT allows it (vendor/zune-jpeg/TFPIPE-PATCH.md);
    /// returns the scale decoded at. Only the pixels of `window(scale)` (in
    /// the pixels decoded at that scale) are sure to be written: where the
    /// patched zune-jpeg can, the MCUs around it are only entropy-decoded
    /// (decode-and-crop); `out` keeps the decoded image's size.
    pub(crate) fn decode_jpeg(
        bytes: &[u8],
        channels: usize,
        scale: usize,
        window: impl FnOnce(usize) -> Window,
        out: &mut Image,
    ) -> Result<usize, ImageError> {
        let mut decoder = jpeg_decoder(bytes, channels);
        decoder.decode_headers().map_err(ImageError::Jpeg)?;
        let scale = if scale > 1 {
            decoder.set_scale(scale)
        } else {
            1
        };
        let (width, height) = decoder.dimensions().unwrap_or((0, 0));
        let crop = clamp(window(scale), height, width);
        if width > 0 && height > 0 && crop != Window::full(height, width) {
            // Refused (false) for layouts it does not know: decoded whole.
            decoder.set_crop(crop.left, crop.top, crop.width, crop.height);
        }
        out.data
            .resize(decoder.output_buffer_size().unwrap_or(0), 0);
        decoder
            .decode_into(&mut out.data)
            .map_err(ImageError::Jpeg)?;
        out.width = width;
        out.height = height;
        out.channels = channels;
        Ok(scale)
    }

    /// Decodes a PNG (whose size the caller checked) into `raw`: palettes
    /// expanded, 16-bit samples cut to their high byte.
    pub(crate) fn decode_png(bytes: &[u8], raw: &mut Vec<u8>) -> Result<Raw, ImageError> {
        let mut decoder = png::Decoder::new(Cursor::new(bytes));
        decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
        decoder.set_ignore_text_chunk(true);
        let mut reader = decoder.read_info().map_err(ImageError::Png)?;
        let size = reader
            .output_buffer_size()
            .ok_or_else(|| ImageError::Corrupt {
                format: ImageFormat::Png,
                what: "its size overflows".into(),
            })?;
        raw.resize(size, 0);
        let frame = reader.next_frame(raw).map_err(ImageError::Png)?;
        Ok(Raw {
            width: frame.width as usize,
            height: frame.height as usize,
            channels: frame.color_type.samples(),
        })
    }

    /// Decodes a GIF's first frame or a BMP into `raw`, after `check` has
    /// accepted the size the codec read.
    pub(crate) fn decode_other(
        bytes: &[u8],
        format: ImageFormat,
        raw: &mut Vec<u8>,
        check: impl Fn(Header) -> Result<(), ImageError>,
    ) -> Result<Raw, ImageError> {
        let codec = |source| ImageError::Codec { format, source };
        match format {
            ImageFormat::Gif => {
                let decoder =
                    ::image::codecs::gif::GifDecoder::new(Cursor::new(bytes)).map_err(codec)?;
                read(decoder, format, raw, check)
            }
            _ => {
                let decoder =
                    ::image::codecs::bmp::BmpDecoder::new(Cursor::new(bytes)).map_err(codec)?;
                read(decoder, format, raw, check)
            }
        }
    }

    fn read(
        decoder: impl ::image::ImageDecoder,
        format: ImageFormat,
        raw: &mut Vec<u8>,
        check: impl Fn(Header) -> Result<(), ImageError>,
    ) -> Result<Raw, ImageError> {
        let (width, height) = decoder.dimensions();
        check(Header {
            format,
            width: u64::from(width),
            height: u64::from(height),
            channels: 3,
        })?;
        let color = decoder.color_type();
        if color.bytes_per_pixel() != color.channel_count() {
            return Err(ImageError::Corrupt {
                format,
                what: format!("{color:?} pixels are not supported"),
            });
        }
        raw.resize(decoder.total_bytes() as usize, 0);
        decoder
            .read_image(raw)
            .map_err(|source| ImageError::Codec { format, source })?;
        Ok(Raw {
            width: width as usize,
            height: height as usize,
            channels: usize::from(color.channel_count()),
        })
    }
}

#[cfg(not(feature = "images"))]
mod without_codecs {
    use crate::image::decode::{Header, Image, ImageFormat, Raw};
    use crate::image::error::ImageError;
    use crate::image::resize::Window;

    pub(crate) fn jpeg_size(_: &[u8]) -> Result<(u64, u64, u8), ImageError> {
        Err(ImageError::NotBuilt {
            format: ImageFormat::Jpeg,
        })
    }

    pub(crate) fn decode_jpeg(
        _: &[u8],
        _: usize,
        _: usize,
        _: impl FnOnce(usize) -> Window,
        _: &mut Image,
    ) -> Result<usize, ImageError> {
        Err(ImageError::NotBuilt {
            format: ImageFormat::Jpeg,
        })
    }

    pub(crate) fn decode_png(_: &[u8], _: &mut Vec<u8>) -> Result<Raw, ImageError> {
        Err(ImageError::NotBuilt {
            format: ImageFormat::Png,
        })
    }

    pub(crate) fn decode_other(
        _: &[u8],
        format: ImageFormat,
        _: &mut Vec<u8>,
        _: impl Fn(Header) -> Result<(), ImageError>,
    ) -> Result<Raw, ImageError> {
        Err(ImageError::NotBuilt { format })
    }
}
