//! The three compressions TensorFlow's TFRecord files use, and how a file name
//! implies one.
//!
//! GZIP and ZLIB wrap the *whole* framed stream (not each record), exactly as
//! `tf.io.TFRecordWriter(options=...)` writes it.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::Path;
use std::str::FromStr;

use flate2::Compression as Level;
use flate2::write::{GzEncoder, ZlibEncoder};

use super::inflate::{Format, Inflater};

/// How a TFRecord stream is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// Plain framed records.
    #[default]
    None,
    /// One gzip stream (RFC 1952) around the records; multi-member files read fully.
    Gzip,
    /// One zlib stream (RFC 1950) around the records; concatenated streams read fully.
    Zlib,
}

impl Compression {
    /// The compression a file name implies: `.gz` is GZIP, `.zlib` and `.zz`
    /// are ZLIB, anything else is none.
    pub fn from_path(path: impl AsRef<Path>) -> Compression {
        match path.as_ref().extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("gz") => Compression::Gzip,
            Some(ext) if ext.eq_ignore_ascii_case("zlib") || ext.eq_ignore_ascii_case("zz") => {
                Compression::Zlib
            }
            _ => Compression::None,
        }
    }

    /// The file-name suffix for this compression, with its dot (`""` for none).
    pub fn suffix(self) -> &'static str {
        match self {
            Compression::None => "",
            Compression::Gzip => ".gz",
            Compression::Zlib => ".zlib",
        }
    }

    /// The name TensorFlow uses for it (`compression_type=`).
    pub fn tf_name(self) -> &'static str {
        match self {
            Compression::None => "NONE",
            Compression::Gzip => "GZIP",
            Compression::Zlib => "ZLIB",
        }
    }

    /// Wraps `reader` in the matching decompressor. Its errors carry a
    /// [`DecodeError`](super::DecodeError) (see [`DecodeError::of`](super::DecodeError::of)),
    /// and the bytes decoded before a damaged spot are returned before the error.
    /// An empty input is an empty stream.
    pub fn decoder<'a, R: Read + Send + 'a>(self, reader: R) -> Box<dyn Read + Send + 'a> {
        match Format::of_compression(self) {
            None => Box::new(reader),
            Some(format) => Box::new(Inflater::new(reader, format)),
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Zlib => "zlib",
        })
    }
}

/// The error for a compression name that is none of `none`, `gzip`, `zlib`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown compression {0:?}: expected none, gzip or zlib")]
pub struct UnknownCompression(pub String);

impl FromStr for Compression {
    type Err = UnknownCompression;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "" => Ok(Compression::None),
            "gzip" | "gz" => Ok(Compression::Gzip),
            "zlib" | "zz" => Ok(Compression::Zlib),
            _ => Err(UnknownCompression(s.to_string())),
        }
    }
}

/// A writer that compresses (or not) what goes through it.
pub(crate) enum Encoder<W: Write> {
    Plain(W),
    Gzip(GzEncoder<W>),
    Zlib(ZlibEncoder<W>),
}

impl<W: Write> Encoder<W> {
    pub(crate) fn new(inner: W, compression: Compression) -> Self {
        // TensorFlow's writers use zlib's default level too.
        match compression {
            Compression::None => Encoder::Plain(inner),
            Compression::Gzip => Encoder::Gzip(GzEncoder::new(inner, Level::default())),
            Compression::Zlib => Encoder::Zlib(ZlibEncoder::new(inner, Level::default())),
        }
    }

    /// Writes any compressed trailer and returns the inner writer, flushed.
    pub(crate) fn finish(self) -> io::Result<W> {
        let mut inner = match self {
            Encoder::Plain(w) => w,
            Encoder::Gzip(e) => e.finish()?,
            Encoder::Zlib(e) => e.finish()?,
        };
        inner.flush()?;
        Ok(inner)
    }

    pub(crate) fn get_ref(&self) -> &W {
        match self {
            Encoder::Plain(w) => w,
            Encoder::Gzip(e) => e.get_ref(),
            Encoder::Zlib(e) => e.get_ref(),
        }
    }
}

impl<W: Write> Write for Encoder<W> {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::Plain(w) => w.write(buf),
            Encoder::Gzip(e) => e.write(buf),
            Encoder::Zlib(e) => e.write(buf),
        }
    }

    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Encoder::Plain(w) => w.write_all(buf),
            Encoder::Gzip(e) => e.write_all(buf),
            Encoder::Zlib(e) => e.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Plain(w) => w.flush(),
            Encoder::Gzip(e) => e.flush(),
            Encoder::Zlib(e) => e.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infers_from_file_name() {
        assert_eq!(Compression::from_path("a/b.tfrecord"), Compression::None);
        assert_eq!(Compression::from_path("b.tfrecord.gz"), Compression::Gzip);
        assert_eq!(Compression::from_path("b.tfrecord.GZ"), Compression::Gzip);
        assert_eq!(Compression::from_path("b.tfrecord.zlib"), Compression::Zlib);
        assert_eq!(Compression::from_path("b.zz"), Compression::Zlib);
        assert_eq!(Compression::from_path("noext"), Compression::None);
    }

    #[test]
    fn parses_names() {
        assert_eq!("GZIP".parse::<Compression>().unwrap(), Compression::Gzip);
        assert_eq!("zlib".parse::<Compression>().unwrap(), Compression::Zlib);
        assert_eq!("none".parse::<Compression>().unwrap(), Compression::None);
        let err = "lz4".parse::<Compression>().unwrap_err();
        assert!(err.to_string().contains("lz4"));
    }
}
