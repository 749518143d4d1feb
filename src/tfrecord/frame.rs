//! Sans-IO TFRecord framing: encoding and checking the 12-byte header and the
//! 4-byte footer around each record. No I/O happens here, so the framing rules
//! are tested on byte slices alone.
//!
//! ```text
//! u64 length (LE) | u32 masked_crc32c(length bytes) | data[length] | u32 masked_crc32c(data)
//! ```

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

/// The framed size of a record of `len` data bytes.
#[inline]
pub const fn framed_len(len: usize) -> usize {
    HEADER_LEN + len + FOOTER_LEN
}

#[cfg(test)]
mod tests {
    use super::*;

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
