//! Streaming GZIP and ZLIB decompression that loses nothing it decoded.
//!
//! `flate2`'s readers return an error *instead of* the bytes decoded in the
//! same call, so a damaged stream (a bad checksum at the very end, a flipped
//! byte in the middle) could lose up to a buffer's worth of good records. The
//! [`Inflater`] hands out every byte the decompressor produced before the
//! damage, and reports the damage on the next read, with the offset in the
//! compressed file and in the uncompressed stream.
//!
//! Stream boundaries, decided once for both formats:
//! - an empty file is an empty stream (0 records), as in TensorFlow;
//! - a stream followed by another stream of the same format (a multi-member
//!   gzip file, concatenated zlib streams) is read to the end of the last one,
//!   including members that decompress to nothing (TensorFlow stops at an
//!   empty gzip member, and reads only the first zlib stream);
//! - any other bytes after a stream's end (garbage, zero padding) are a
//!   [`DecodeError::TrailingData`] error, never silently ignored.

use std::fmt;
use std::io::{self, Read};

use flate2::{Decompress, FlushDecompress, Status};

use super::compression::Compression;

/// Why a compressed stream could not be read. Travels inside an
/// [`io::Error`] (kind `InvalidData`, or `UnexpectedEof` for a truncation);
/// [`DecodeError::of`] gets it back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The decompressor found invalid data (or a checksum mismatch).
    #[error(
        "corrupt {format} stream at compressed byte {compressed} (uncompressed byte {uncompressed}): {reason}"
    )]
    Corrupt {
        /// The compression format.
        format: Format,
        /// Compressed bytes read before the problem.
        compressed: u64,
        /// Uncompressed bytes produced before the problem.
        uncompressed: u64,
        /// The decompressor's message.
        reason: String,
    },
    /// The file ends inside a stream.
    #[error(
        "{format} stream cut short: the file ends at compressed byte {compressed} (uncompressed byte {uncompressed}) before the stream's end"
    )]
    Truncated {
        /// The compression format.
        format: Format,
        /// Compressed bytes read before the problem.
        compressed: u64,
        /// Uncompressed bytes produced before the problem.
        uncompressed: u64,
    },
    /// Bytes after the end of the last stream that do not start another.
    #[error(
        "{bytes} unexpected bytes after the end of the {format} stream, from compressed byte {compressed}{}",
        if *zeros { " (all zero: padding)" } else { "" }
    )]
    TrailingData {
        /// The compression format.
        format: Format,
        /// Compressed bytes read before the problem.
        compressed: u64,
        /// The bytes after the end of the stream.
        bytes: u64,
        /// Whether they are all zero bytes (padding).
        zeros: bool,
    },
}

impl DecodeError {
    /// The decode error inside an I/O error from a TFRecord decompressor.
    pub fn of(err: &io::Error) -> Option<&DecodeError> {
        err.get_ref()?.downcast_ref::<DecodeError>()
    }
}

/// Which compressed format, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// RFC 1952.
    Gzip,
    /// RFC 1950.
    Zlib,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Gzip => "gzip",
            Format::Zlib => "zlib",
        })
    }
}

impl Format {
    /// The format, for a compression that has one.
    pub fn of_compression(compression: Compression) -> Option<Format> {
        match compression {
            Compression::None => None,
            Compression::Gzip => Some(Format::Gzip),
            Compression::Zlib => Some(Format::Zlib),
        }
    }

    fn decompressor(self) -> Decompress {
        match self {
            Format::Gzip => Decompress::new_gzip(15),
            Format::Zlib => Decompress::new(true),
        }
    }

    /// Whether `head` (at least 2 bytes) starts a stream of this format.
    pub(crate) fn starts(self, head: &[u8]) -> bool {
        match head {
            [a, b, ..] => match self {
                Format::Gzip => *a == 0x1f && *b == 0x8b,
                // CM = 8 (deflate), CINFO <= 7, and the header check.
                Format::Zlib => {
                    a & 0x0f == 8 && a >> 4 <= 7 && (u16::from(*a) << 8 | u16::from(*b)) % 31 == 0
                }
            },
            _ => false,
        }
    }
}

enum State {
    /// Before the first stream, or after one ended.
    Between,
    /// Inside a stream.
    Body,
    /// Finished (the end, or an error was returned).
    Done,
}

/// A reader that decompresses one or more GZIP or ZLIB streams. See the
/// module doc for what it promises.
pub(crate) struct Inflater<R> {
    inner: R,
    format: Format,
    decompress: Decompress,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    eof: bool,
    state: State,
    /// Streams finished so far.
    streams: u64,
    /// Compressed and uncompressed bytes of the finished streams.
    done_in: u64,
    done_out: u64,
    /// An error found in a call that also produced bytes: returned next.
    pending: Option<io::Error>,
}

impl<R: Read> Inflater<R> {
    pub(crate) fn new(inner: R, format: Format) -> Inflater<R> {
        Inflater {
            inner,
            format,
            decompress: format.decompressor(),
            buf: vec![0; 64 << 10].into_boxed_slice(),
            pos: 0,
            end: 0,
            eof: false,
            state: State::Between,
            streams: 0,
            done_in: 0,
            done_out: 0,
            pending: None,
        }
    }

    /// Buffers at least `n` unread bytes unless the input ends first.
    fn want(&mut self, n: usize) -> io::Result<()> {
        while self.end - self.pos < n && !self.eof {
            if self.pos > 0 {
                self.buf.copy_within(self.pos..self.end, 0);
                self.end -= self.pos;
                self.pos = 0;
            }
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn compressed_offset(&self) -> u64 {
        self.done_in + self.decompress.total_in()
    }

    fn uncompressed_offset(&self) -> u64 {
        self.done_out + self.decompress.total_out()
    }

    /// Counts the bytes after the last stream (reading them to the end).
    fn trailing(&mut self) -> io::Error {
        let compressed = self.done_in;
        let mut bytes = (self.end - self.pos) as u64;
        let mut zeros = self.buf[self.pos..self.end].iter().all(|&b| b == 0);
        self.pos = self.end;
        loop {
            match self.inner.read(&mut self.buf) {
                Ok(0) => break,
                Ok(k) => {
                    bytes += k as u64;
                    zeros &= self.buf[..k].iter().all(|&b| b == 0);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return e,
            }
        }
        let error = DecodeError::TrailingData {
            format: self.format,
            compressed,
            bytes,
            zeros,
        };
        io::Error::new(io::ErrorKind::InvalidData, error)
    }

    fn step(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.state {
                State::Done => return Ok(0),
                State::Between => {
                    self.want(2)?;
                    if self.pos == self.end {
                        // The end of the input at a stream boundary (or an
                        // empty file): a clean end.
                        self.state = State::Done;
                        return Ok(0);
                    }
                    if self.streams > 0 && !self.format.starts(&self.buf[self.pos..self.end]) {
                        self.state = State::Done;
                        return Err(self.trailing());
                    }
                    self.state = State::Body;
                }
                State::Body => {
                    self.want(1)?;
                    if self.pos == self.end {
                        self.state = State::Done;
                        let error = DecodeError::Truncated {
                            format: self.format,
                            compressed: self.compressed_offset(),
                            uncompressed: self.uncompressed_offset(),
                        };
                        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, error));
                    }
                    let (in0, out0) = (self.decompress.total_in(), self.decompress.total_out());
                    let result = self.decompress.decompress(
                        &self.buf[self.pos..self.end],
                        out,
                        FlushDecompress::None,
                    );
                    self.pos += (self.decompress.total_in() - in0) as usize;
                    let written = (self.decompress.total_out() - out0) as usize;
                    match result {
                        Ok(Status::StreamEnd) => {
                            self.streams += 1;
                            self.done_in += self.decompress.total_in();
                            self.done_out += self.decompress.total_out();
                            // A fresh one for the next stream, if any.
                            self.decompress = self.format.decompressor();
                            self.state = State::Between;
                            if written > 0 {
                                return Ok(written);
                            }
                        }
                        Ok(Status::Ok | Status::BufError) => {
                            if written > 0 {
                                return Ok(written);
                            }
                        }
                        Err(e) => {
                            self.state = State::Done;
                            let error = DecodeError::Corrupt {
                                format: self.format,
                                compressed: self.compressed_offset(),
                                uncompressed: self.uncompressed_offset(),
                                reason: e.to_string(),
                            };
                            let error = io::Error::new(io::ErrorKind::InvalidData, error);
                            if written > 0 {
                                // What decoded before the damage goes out first.
                                self.pending = Some(error);
                                return Ok(written);
                            }
                            return Err(error);
                        }
                    }
                }
            }
        }
    }
}

impl<R: Read> Read for Inflater<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if let Some(err) = self.pending.take() {
            return Err(err);
        }
        if out.is_empty() {
            return Ok(0);
        }
        self.step(out)
    }
}
