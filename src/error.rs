//! Where things went wrong: the position shared by every error about input
//! data, and the convention every error type of the crate follows.
//!
//! # One convention for errors
//!
//! Each area has its own `thiserror` enum. A variant is one of two kinds,
//! never a mix:
//! - **a short message plus a typed source**: the message says what was
//!   being done and where (`checkpoint ck/`, `stage parse`), and the cause
//!   is the `#[source]` (or `#[from]`), which the message does not repeat;
//! - **a self-contained message with no source**: everything is in the
//!   text, and `source()` is `None` (used where a foreign error already
//!   embeds its own cause in its text, as `object_store`'s do).
//!
//! So printing an error and then each `source()` in turn, as `{:#}` of
//! `anyhow` and the `tfpipe` binary do, shows every cause exactly once,
//! with no de-duplication by substring. Each error type that can be about
//! bad input data answers one question, `is_data_error()` (`RecordError`:
//! `is_corruption()`), and the binary's exit codes follow it: 1 for bad
//! data, 2 for usage and I/O.

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

/// An error and each of its causes, joined by `: `: the whole story on one
/// line, each cause once (see the [module docs](self)). What the `tfpipe`
/// binary prints and the Python package's exceptions carry.
///
/// ```
/// use tfpipe::pipeline::StateError;
///
/// let gone = std::io::Error::other("gone");
/// let error = StateError::Reread(tfpipe::RecordError::Open { path: "a.tfrecord".into(), error: gone });
/// assert_eq!(
///     tfpipe::error::display_chain(&error),
///     "re-reading a buffered record: a.tfrecord: cannot open: gone"
/// );
/// ```
pub fn display_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

/// A name that is not one of a closed set: a dtype, an optimizer, a
/// compression. The `FromStr` error of those types.
///
/// ```
/// let e = "int32".parse::<tfpipe::example::DType>().unwrap_err();
/// assert_eq!(e.name, "int32");
/// assert!(e.to_string().starts_with("unknown dtype \"int32\" (expected int64"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?} (expected {expected})")]
pub struct UnknownName {
    /// What kind of name (`dtype`, `optimizer`).
    pub what: &'static str,
    /// The name given.
    pub name: String,
    /// The names accepted, as a phrase.
    pub expected: &'static str,
}
