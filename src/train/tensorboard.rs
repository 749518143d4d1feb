//! TensorBoard event files: `events.out.tfevents.<secs>.<host>`, a TFRecord
//! file of `tensorflow.Event` protos (`proto/event.proto`), written through
//! our own [`RecordWriter`]. The first event carries `file_version`
//! `"brain.Event:2"`; the rest carry `simple_value` scalar summaries, which
//! TensorBoard's scalar dashboard reads.
//!
//! Unlike our data shards, an event file is written in place, not renamed at
//! the end: TensorBoard reads it while training runs (as TensorFlow's own
//! writer does). Every record is framed with CRCs, so a reader detects a
//! truncated tail rather than misreading it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

use super::TrainError;
use crate::example::proto::{Event, Summary, event, summary};
use crate::tfrecord::{Compression, RecordWriter};

/// One named scalar, e.g. `("train/loss", 0.31)`.
pub type Scalar<'a> = (&'a str, f32);

/// Writes scalar summaries to a TensorBoard event file.
///
/// ```
/// use tfpipe::train::EventWriter;
///
/// let dir = tempfile::tempdir()?;
/// let mut events = EventWriter::create(dir.path())?;
/// events.scalars(1, &[("train/loss", 0.5), ("train/examples_per_sec", 1e5)])?;
/// events.flush()?;
/// assert!(events.path().file_name().unwrap().to_string_lossy().starts_with("events.out.tfevents."));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct EventWriter {
    file: File,
    path: PathBuf,
    /// Encoded events not yet written (flushed in one write).
    pending: Vec<Vec<u8>>,
    /// Reused framing buffer.
    framed: Vec<u8>,
}

impl EventWriter {
    /// Creates `logdir` if needed and a new event file in it, and writes the
    /// `file_version` event.
    pub fn create(logdir: impl AsRef<Path>) -> Result<EventWriter, TrainError> {
        let logdir = logdir.as_ref();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TrainError::Events { path, source }
        };
        std::fs::create_dir_all(logdir).map_err(io(logdir))?;
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let base = format!("events.out.tfevents.{secs}.{}", hostname());
        // Two writers in the same second (train and eval, tests) get `.1`, `.2`, ...
        let mut n = 0u32;
        let (file, path) = loop {
            let name = if n == 0 {
                base.clone()
            } else {
                format!("{base}.{n}")
            };
            let path = logdir.join(name);
            match File::options().write(true).create_new(true).open(&path) {
                Ok(file) => break (file, path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(io(&path)(e)),
            }
        };
        let mut writer = EventWriter {
            file,
            path,
            pending: Vec::new(),
            framed: Vec::new(),
        };
        writer.push(Event {
            wall_time: now_secs(),
            step: 0,
            what: Some(event::What::FileVersion("brain.Event:2".into())),
        });
        writer.flush()?;
        Ok(writer)
    }

    /// The event file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues one event holding `scalars` at `step` (written on [`flush`](Self::flush)).
    pub fn scalars(&mut self, step: u64, scalars: &[Scalar<'_>]) -> Result<(), TrainError> {
        let value = scalars
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(tag, v)| summary::Value {
                tag: (*tag).to_string(),
                value: Some(summary::value::Value::SimpleValue(*v)),
            })
            .collect();
        self.push(Event {
            wall_time: now_secs(),
            step: i64::try_from(step).unwrap_or(i64::MAX),
            what: Some(event::What::Summary(Summary { value })),
        });
        // Bound what a crash can lose and what sits in memory.
        if self.pending.len() >= 256 {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the queued events to the file.
    pub fn flush(&mut self) -> Result<(), TrainError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let path = self.path.clone();
        let mut writer = RecordWriter::new(std::mem::take(&mut self.framed), Compression::None);
        for event in self.pending.drain(..) {
            writer
                .write_record(&event)
                .map_err(|e| TrainError::Events {
                    path: path.clone(),
                    source: std::io::Error::other(e),
                })?;
        }
        let mut framed = writer.finish().map_err(|e| TrainError::Events {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        let written = self
            .file
            .write_all(&framed)
            .and_then(|()| self.file.flush());
        framed.clear();
        self.framed = framed;
        written.map_err(|source| TrainError::Events { path, source })
    }

    fn push(&mut self, event: Event) {
        self.pending.push(event.encode_to_vec());
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        // Best effort: an error here has nowhere to go; `flush` reports it
        // for callers that care.
        let _ = self.flush();
    }
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The host name for the file name (TensorFlow uses `socket.gethostname()`);
/// read from the kernel, without a dependency.
fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let name: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        .collect();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tfrecord::{FileRecordReader, ReaderOptions};

    #[test]
    fn writes_version_then_scalars() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalars(3, &[("train/loss", 0.25), ("nan", f32::NAN)])
            .unwrap();
        w.flush().unwrap();
        let second = EventWriter::create(dir.path()).unwrap();
        assert_ne!(second.path(), w.path());

        let mut reader = FileRecordReader::open(w.path(), ReaderOptions::default()).unwrap();
        let mut buf = Vec::new();
        let mut events = Vec::new();
        while reader.read_record(&mut buf).unwrap() {
            events.push(Event::decode(buf.as_slice()).unwrap());
        }
        assert_eq!(events.len(), 2);
        assert_eq!(
            events[0].what,
            Some(event::What::FileVersion("brain.Event:2".into()))
        );
        let Some(event::What::Summary(s)) = &events[1].what else {
            panic!("no summary")
        };
        assert_eq!(events[1].step, 3);
        assert_eq!(s.value.len(), 1);
        assert_eq!(s.value[0].tag, "train/loss");
        assert_eq!(
            s.value[0].value,
            Some(summary::value::Value::SimpleValue(0.25))
        );
    }
}
