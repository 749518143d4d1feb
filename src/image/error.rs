//! The errors of decoding and transforming images.
//!
//! Decoding errors say what was wrong with the bytes; where they were (file,
//! record, offset, feature) is added by the caller that knows it, as
//! `example::ParseError` does for every other bad value.

/// An image that cannot be decoded, or options that cannot be applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The bytes start with no known image signature.
    #[error(
        "not a JPEG, PNG, GIF or BMP image ({len} bytes starting {start:02x?})",
        len = .len,
        start = .start
    )]
    Unrecognized {
        /// The first bytes (at most 8).
        start: Vec<u8>,
        /// How many bytes there were.
        len: usize,
    },
    /// The header claims more pixels than allowed; nothing was allocated.
    #[error(
        "{format} of {width}x{height} pixels is over the limit of {max_pixels} pixels \
         (a larger limit can be set in the decode options)"
    )]
    TooLarge {
        /// The format read from the signature.
        format: ImageFormat,
        /// The width claimed by the header.
        width: u64,
        /// The height claimed by the header.
        height: u64,
        /// The limit in force.
        max_pixels: u64,
    },
    /// The header claims an image with no pixels.
    #[error("{format} of {width}x{height} pixels: expected a non-empty image")]
    Empty {
        /// The format read from the signature.
        format: ImageFormat,
        /// The width claimed by the header.
        width: u64,
        /// The height claimed by the header.
        height: u64,
    },
    /// The bytes end inside the header.
    #[error("truncated {format}: {len} bytes end inside the header")]
    Truncated {
        /// The format read from the signature.
        format: ImageFormat,
        /// How many bytes there were.
        len: usize,
    },
    /// A header that makes no sense, or pixels this build does not decode.
    #[error("bad {format}: {what}")]
    Corrupt {
        /// The format.
        format: ImageFormat,
        /// What is wrong.
        what: String,
    },
    /// This build has no image codecs (the `images` cargo feature is off).
    #[error("decoding {format} needs the `images` cargo feature (in the default build)")]
    NotBuilt {
        /// The format.
        format: ImageFormat,
    },
    /// A JPEG that zune-jpeg cannot decode (corrupt or truncated).
    #[cfg(feature = "images")]
    #[error("corrupt JPEG")]
    Jpeg(#[source] zune_jpeg::errors::DecodeErrors),
    /// A PNG that the `png` crate cannot decode (corrupt or truncated).
    #[cfg(feature = "images")]
    #[error("corrupt PNG")]
    Png(#[source] png::DecodingError),
    /// A GIF or BMP that the `image` crate cannot decode.
    #[cfg(feature = "images")]
    #[error("corrupt {format}")]
    Codec {
        /// GIF or BMP.
        format: ImageFormat,
        /// The codec's error.
        #[source]
        source: ::image::ImageError,
    },
    /// Options that make no sense (a zero size, an empty range).
    #[error("invalid image options: {0}")]
    Config(String),
}

impl ImageError {
    /// Whether the error is about the input bytes (not about the options).
    pub fn is_data_error(&self) -> bool {
        !matches!(self, ImageError::Config(_) | ImageError::NotBuilt { .. })
    }
}

use super::decode::ImageFormat;
