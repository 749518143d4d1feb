//! Where things went wrong: the position shared by every error about input data.

use std::fmt;
use std::path::PathBuf;

/// A position in a TFRecord stream: the file (when there is one), the index of
/// the record, and a byte offset into the *uncompressed* record stream.
///
/// `Display` leads with the position, as `PATH: record N at byte M`, so every
/// error about input data reads the same way and can be pasted into a bug report.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Location {
    /// The file, or `None` for an in-memory stream or stdin.
    pub path: Option<PathBuf>,
    /// Zero-based index of the record.
    pub record: u64,
    /// Byte offset in the uncompressed stream (what TensorFlow reports).
    pub offset: u64,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{}: ", path.display())?,
            None => f.write_str("<stream>: ")?,
        }
        write!(f, "record {} at byte {}", self.record, self.offset)
    }
}
