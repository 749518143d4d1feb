//! [`Record`]: one serialized TFRecord record whose buffer is recycled.
//!
//! A TFRecord source copies each record out of the reader's I/O buffer once
//! (that copy is inherent: the reader's buffer is reused for the next read,
//! and avoiding it would mean mapping whole files). What it avoids is the
//! allocation: the copy goes into a buffer taken from a process-wide free
//! list, and dropping the [`Record`] (typically in the parse stage, on
//! another thread) puts the buffer back. With `Vec<u8>` records, every record
//! cost a `malloc` on the reading thread and a cross-thread `free` on the
//! parsing one.
//!
//! The free list is bounded, so recycling never holds more than
//! [`POOL_BUFFERS`] idle buffers of at most [`POOL_MAX_CAPACITY`] bytes each
//! (8 MiB in all, whatever the pipelines do). A buffer that grew beyond that
//! (a large record) is freed normally; for records that large the allocation
//! is small next to the copy. When the list is empty a new buffer is
//! allocated, so the list never blocks anyone.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::LazyLock;

use crossbeam_channel::{Receiver, Sender, bounded};

/// Idle buffers the free list keeps at most (a batch of 256 records
/// returns all of its buffers at once, so this leaves room for several).
pub const POOL_BUFFERS: usize = 2048;

/// The largest buffer capacity, in bytes, the free list keeps.
pub const POOL_MAX_CAPACITY: usize = 4096;

/// The free list: a bounded lock-free array queue (crossbeam's array
/// channel, used only with `try_send`/`try_recv`, so nobody ever waits).
static POOL: LazyLock<FreeList> = LazyLock::new(|| bounded(POOL_BUFFERS));

type FreeList = (Sender<Vec<u8>>, Receiver<Vec<u8>>);

/// A serialized record, as read from a TFRecord file: bytes you read through
/// `Deref<Target = [u8]>` / `AsRef<[u8]>`, whose buffer goes back to a
/// bounded free list when dropped (see the [pipeline module docs](crate::pipeline)).
///
/// Convert from and to `Vec<u8>` with `From`/[`into_vec`](Record::into_vec);
/// it compares equal to byte slices and vectors with the same bytes.
///
/// ```
/// use tfpipe::pipeline::Record;
/// let r = Record::from(&b"abc"[..]);
/// assert_eq!(r, b"abc"[..]);
/// assert_eq!(r.len(), 3);
/// assert_eq!(r.into_vec(), b"abc".to_vec());
/// ```
pub struct Record {
    buf: Vec<u8>,
}

impl Record {
    /// An empty record whose buffer comes from the free list when it has one.
    pub fn new() -> Record {
        Record {
            buf: POOL.1.try_recv().unwrap_or_default(),
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// The buffer to fill (for a reader's `read_record`); cleared by whoever
    /// fills it.
    pub(crate) fn buffer_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// The bytes as a `Vec<u8>`, taking the buffer out of recycling.
    pub fn into_vec(mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

impl Default for Record {
    fn default() -> Self {
        Record::new()
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let cap = self.buf.capacity();
        if cap != 0 && cap <= POOL_MAX_CAPACITY {
            let mut buf = std::mem::take(&mut self.buf);
            buf.clear();
            // A full list frees the buffer (the error hands it back).
            let _ = POOL.0.try_send(buf);
        }
    }
}

impl Deref for Record {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl AsRef<[u8]> for Record {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Borrow<[u8]> for Record {
    fn borrow(&self) -> &[u8] {
        &self.buf
    }
}

impl Clone for Record {
    fn clone(&self) -> Record {
        Record::from(self.as_slice())
    }
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Record").field(&self.as_slice()).finish()
    }
}

impl PartialEq for Record {
    fn eq(&self, other: &Record) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Record {}

impl Hash for Record {
    // Same as `[u8]`'s, as `Borrow<[u8]>` requires.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state)
    }
}

impl PartialEq<[u8]> for Record {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_slice() == other
    }
}

impl PartialEq<Vec<u8>> for Record {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl PartialEq<Record> for Vec<u8> {
    fn eq(&self, other: &Record) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl From<Vec<u8>> for Record {
    /// Wraps the vector (no copy); its buffer joins the free list on drop.
    fn from(buf: Vec<u8>) -> Record {
        Record { buf }
    }
}

impl From<&[u8]> for Record {
    fn from(bytes: &[u8]) -> Record {
        let mut record = Record::new();
        record.buf.extend_from_slice(bytes);
        record
    }
}

impl From<Record> for Vec<u8> {
    fn from(record: Record) -> Vec<u8> {
        record.into_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_and_equality() {
        let r = Record::from(vec![1u8, 2, 3]);
        assert_eq!(r, [1u8, 2, 3][..]);
        assert_eq!(r, vec![1u8, 2, 3]);
        assert_eq!(vec![1u8, 2, 3], r);
        assert_eq!(r.clone(), r);
        assert_eq!(&r[1..], &[2, 3]);
        assert_eq!(format!("{r:?}"), "Record([1, 2, 3])");
        assert_eq!(Vec::from(r), vec![1, 2, 3]);
        assert!(Record::new().is_empty());
    }

    #[test]
    fn recycled_buffers_come_back_empty() {
        // Other tests share the free list, so only properties that hold
        // whatever they do are checked.
        for _ in 0..100 {
            let mut r = Record::from(&[7u8; 100][..]);
            r.buffer_mut().push(8);
            assert_eq!(r.len(), 101);
            drop(r);
            assert!(Record::new().is_empty());
        }
        // An oversized buffer is not kept (and dropping it is fine).
        drop(Record::from(vec![0u8; POOL_MAX_CAPACITY + 1]));
        assert!(POOL.0.len() <= POOL_BUFFERS);
    }
}
