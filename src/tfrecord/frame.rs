//! Sans-IO TFRecord framing: encoding and checking the 12-byte header and the
//! 4-byte footer around each record. No I/O happens here, so the framing rules
//! are tested on byte slices alone.
//!
//! ```text
//! u64 length (LE) | u32 masked_crc32c(length bytes) | data[length] | u32 masked_crc32c(data)
//! ```

use std::fs::File;
use std::io;
use std::ops::Range;

use super::CorruptionKind;
use super::crc::masked_crc32c;

/// Bytes before the data: the length and its CRC.
pub const HEADER_LEN: usize = 12;
/// Bytes after the data: the data CRC.
pub const FOOTER_LEN: usize = 4;

/// The header for a record of `len` bytes.
#[inline]
pub fn encode_header(len: u64) -> [u8; HEADER_LEN] {
    let len_bytes = len.to_le_bytes();
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(&len_bytes);
    header[8..].copy_from_slice(&masked_crc32c(&len_bytes).to_le_bytes());
    header
}

/// The footer for `data`.
#[inline]
pub fn encode_footer(data: &[u8]) -> [u8; FOOTER_LEN] {
    masked_crc32c(data).to_le_bytes()
}

/// What a header says, once its CRC has been checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// The length CRC matches: the record holds this many data bytes.
    Valid(u64),
    /// The stored CRC does not match the stored length.
    BadCrc {
        /// The record length its header states.
        length: u64,
        /// The CRC stored in the file.
        stored: u32,
        /// The CRC of the bytes read.
        computed: u32,
    },
}

/// Reads and checks a header.
#[inline]
pub fn decode_header(header: &[u8; HEADER_LEN]) -> Header {
    let (len_bytes, crc_bytes) = header.split_at(8);
    let length = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    let stored = u32::from_le_bytes(crc_bytes.try_into().expect("4 bytes"));
    let computed = masked_crc32c(len_bytes);
    if stored == computed {
        Header::Valid(length)
    } else {
        Header::BadCrc {
            length,
            stored,
            computed,
        }
    }
}

/// Checks `data` against its footer; `Err((stored, computed))` on a mismatch.
#[inline]
pub fn check_footer(data: &[u8], footer: &[u8; FOOTER_LEN]) -> Result<(), (u32, u32)> {
    let stored = u32::from_le_bytes(*footer);
    let computed = masked_crc32c(data);
    if stored == computed {
        Ok(())
    } else {
        Err((stored, computed))
    }
}

/// The record framed at the start of `bytes` (which may go on past it),
/// both CRCs checked, and no longer than `max_len` data bytes: the data's
/// range in `bytes`. The frame ends at `data.end + FOOTER_LEN`. A
/// truncated frame says how long the record is
/// ([`CorruptionKind::TruncatedData`]), so a caller that read too little
/// can read the rest.
pub fn parse_framed(bytes: &[u8], max_len: u64) -> Result<Range<usize>, CorruptionKind> {
    let header: &[u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(CorruptionKind::TruncatedHeader {
            available: bytes.len(),
        })?;
    let length = match decode_header(header) {
        Header::Valid(length) => length,
        Header::BadCrc {
            length,
            stored,
            computed,
        } => {
            return Err(CorruptionKind::LengthCrc {
                length,
                stored,
                computed,
            });
        }
    };
    if length > max_len {
        return Err(CorruptionKind::ImplausibleLength {
            length,
            limit: max_len,
        });
    }
    let truncated = || CorruptionKind::TruncatedData {
        length,
        available: (bytes.len() - HEADER_LEN) as u64,
    };
    let end = usize::try_from(length)
        .ok()
        .and_then(|len| HEADER_LEN.checked_add(len))
        .ok_or_else(truncated)?;
    let data = HEADER_LEN..end;
    let footer: &[u8; FOOTER_LEN] = bytes
        .get(end..end + FOOTER_LEN)
        .and_then(|f| f.try_into().ok())
        .ok_or_else(truncated)?;
    check_footer(&bytes[data.clone()], footer).map_err(|(stored, computed)| {
        CorruptionKind::DataCrc {
            length,
            stored,
            computed,
        }
    })?;
    Ok(data)
}

/// Why [`read_framed_at`] gave no record.
#[derive(Debug)]
pub enum ReadAtError {
    /// Reading failed.
    Io(io::Error),
    /// The bytes there are not a whole, intact record.
    Corrupt(CorruptionKind),
}

/// Reads the record framed at `offset` of the local `file` into `buf`
/// with positioned reads, and checks it ([`parse_framed`]): the data's
/// range in `buf`. With `framed_len` (a record index knows it) one read
/// does; otherwise the header is read first, and the length it states
/// (at most `max_len`) bounds the second read, so that no absurd length
/// is allocated. The one positioned record read: the record index, the
/// global shuffle and iterator-state re-reads all go through it.
pub fn read_framed_at(
    file: &File,
    offset: u64,
    framed_len: Option<u64>,
    max_len: u64,
    buf: &mut Vec<u8>,
) -> Result<Range<usize>, ReadAtError> {
    let total = match framed_len {
        Some(total) => total,
        None => {
            let mut header = [0u8; HEADER_LEN];
            crate::storage::read_exact_at(file, &mut header, offset).map_err(ReadAtError::Io)?;
            let length = match decode_header(&header) {
                Header::Valid(length) if length <= max_len => length,
                // Not allocated: parse_framed says what is wrong.
                _ => return parse_framed(&header, max_len).map_err(ReadAtError::Corrupt),
            };
            length + (HEADER_LEN + FOOTER_LEN) as u64
        }
    };
    let total = usize::try_from(total).map_err(|_| {
        ReadAtError::Corrupt(CorruptionKind::ImplausibleLength {
            length: total,
            limit: max_len,
        })
    })?;
    buf.clear();
    buf.resize(total, 0);
    crate::storage::read_exact_at(file, buf, offset).map_err(ReadAtError::Io)?;
    parse_framed(buf, max_len).map_err(ReadAtError::Corrupt)
}

/// The framed size of a record of `len` data bytes.
#[inline]
pub const fn framed_len(len: usize) -> usize {
    HEADER_LEN + len + FOOTER_LEN
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two records framed one after the other, and where the second starts.
    fn two_records() -> (Vec<u8>, usize) {
        let mut bytes = Vec::new();
        for data in [&b"hello"[..], b"tfpipe!"] {
            bytes.extend_from_slice(&encode_header(data.len() as u64));
            bytes.extend_from_slice(data);
            bytes.extend_from_slice(&encode_footer(data));
        }
        (bytes, framed_len(5))
    }

    #[test]
    fn parse_framed_finds_the_data_and_names_each_fault() {
        let (bytes, second) = two_records();
        assert_eq!(
            parse_framed(&bytes, 1 << 20),
            Ok(HEADER_LEN..HEADER_LEN + 5)
        );
        let at = &bytes[second..];
        assert_eq!(&at[parse_framed(at, 1 << 20).unwrap()], b"tfpipe!");
        assert_eq!(
            parse_framed(&bytes[..7], 1 << 20),
            Err(CorruptionKind::TruncatedHeader { available: 7 })
        );
        assert_eq!(
            parse_framed(&bytes[..HEADER_LEN + 3], 1 << 20),
            Err(CorruptionKind::TruncatedData {
                length: 5,
                available: 3
            })
        );
        assert!(matches!(
            parse_framed(&bytes[1..], 1 << 20),
            Err(CorruptionKind::LengthCrc { .. })
        ));
        assert_eq!(
            parse_framed(&bytes, 4),
            Err(CorruptionKind::ImplausibleLength {
                length: 5,
                limit: 4
            })
        );
        let mut flipped = bytes.clone();
        flipped[HEADER_LEN] ^= 1;
        assert!(matches!(
            parse_framed(&flipped, 1 << 20),
            Err(CorruptionKind::DataCrc { length: 5, .. })
        ));
    }

    #[test]
    fn read_framed_at_reads_with_or_without_the_length_and_refuses_absurd_ones() {
        let (bytes, second) = two_records();
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &bytes).unwrap();
        let mut buf = Vec::new();
        let data = read_framed_at(&file, second as u64, None, 1 << 20, &mut buf).unwrap();
        assert_eq!(&buf[data], b"tfpipe!");
        let known = Some(framed_len(5) as u64);
        let data = read_framed_at(&file, 0, known, 1 << 20, &mut buf).unwrap();
        assert_eq!(&buf[data], b"hello");
        // A header claiming more than the limit is refused before any allocation.
        let mut huge = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut huge, &encode_header(1 << 40)).unwrap();
        let Err(ReadAtError::Corrupt(kind)) = read_framed_at(&huge, 0, None, 1 << 20, &mut buf)
        else {
            panic!("accepted a 1 TiB record");
        };
        assert!(matches!(kind, CorruptionKind::ImplausibleLength { .. }));
        // Past the end: the read fails, naming no record.
        let past = read_framed_at(&file, bytes.len() as u64, None, 1 << 20, &mut buf);
        assert!(
            matches!(past, Err(ReadAtError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof)
        );
    }

    #[test]
    fn header_round_trip() {
        for len in [0u64, 1, 174, 1 << 40, u64::MAX] {
            assert_eq!(decode_header(&encode_header(len)), Header::Valid(len));
        }
    }

    #[test]
    fn flipped_length_bit_is_detected() {
        let mut header = encode_header(115);
        header[0] ^= 1;
        assert!(matches!(
            decode_header(&header),
            Header::BadCrc { length: 114, .. }
        ));
    }

    #[test]
    fn footer_detects_corruption() {
        let data = b"hello tfrecord".to_vec();
        let footer = encode_footer(&data);
        assert!(check_footer(&data, &footer).is_ok());
        let mut bad = data.clone();
        bad[3] ^= 0xff;
        assert!(check_footer(&bad, &footer).is_err());
    }
}
