//! Read-ahead across the files of an interleave: the next object's GET is
//! sent while the open ones stream.
//!
//! An object store answers a GET after a delay of its own (tens of
//! milliseconds on S3; against moto, which prepares the objects it is asked
//! for one after another, up to 240 ms for the last of eight). An interleave
//! goes round its open files in a fixed order, so without read-ahead it waits
//! for the slowest first bytes of each set of files it opens: at the start
//! (where its producers, `parallelism` at a time, open their files in turns)
//! and again each time the open files end and the next ones open. With it:
//! - the first file claimed in a start sends the GETs of the `budget - 1`
//!   files after it, which the other slots open next, so that all of the
//!   first set are asked for at once;
//! - each file that opens sends the GET of the next file not yet claimed,
//!   so that file's answer is on its way when its slot asks for it.
//!
//! Measured against moto (`benches/storage.rs`, docs/storage.md): the
//! pipeline from 0.75x a plain download (median of 4) to 0.82x; per open
//! alone, 0.80x.
//!
//! Invariants:
//! - Only objects read from their start are opened ahead: never a local
//!   file, nor a file a record index starts past its start, and a GET sent
//!   for a file that a restored state starts past is dropped unread.
//! - At most `budget` (the interleave's `cycle_length`) GETs are ahead at
//!   once. Each holds an unread response, whose body the connection's flow
//!   control holds back: memory stays bounded by the buffers the user chose.
//! - One read-ahead lives for one start of the pipeline (one epoch under
//!   `repeat`); dropping it (the iterator dropped) aborts the GETs ahead.
//! - A GET that fails ahead fails its own file's open, in that file's place
//!   in the order, exactly as an open without read-ahead would.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use crate::storage::{self, OpenAhead, ReadOptions};

/// The GETs sent ahead for one start of an interleave over files.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    /// Per file, in the interleave's order: its path where it may be opened
    /// ahead (an object read from its start), else `None`.
    files: Arc<[Option<PathBuf>]>,
    read: ReadOptions,
    /// GETs ahead at once, at most.
    budget: usize,
    state: Mutex<AheadState>,
}

#[derive(Debug, Default)]
struct AheadState {
    /// Files whose reader has begun opening (never opened ahead after that).
    claimed: Vec<bool>,
    /// GETs sent ahead and not yet claimed, by file.
    sent: BTreeMap<usize, OpenAhead>,
    /// Whether a file has been claimed yet.
    started: bool,
}

impl ReadAhead {
    /// A read-ahead over `files` (`None` where a file may not be opened
    /// ahead), `budget` GETs at most; `None` when no file may be.
    pub(crate) fn new(
        files: Arc<[Option<PathBuf>]>,
        budget: usize,
        read: ReadOptions,
    ) -> Option<Arc<ReadAhead>> {
        if budget == 0 || files.iter().all(Option::is_none) {
            return None;
        }
        let claimed = vec![false; files.len()];
        Some(Arc::new(ReadAhead {
            files,
            read,
            budget,
            state: Mutex::new(AheadState {
                claimed,
                sent: BTreeMap::new(),
                started: false,
            }),
        }))
    }

    /// File `index`'s reader begins opening: its GET, if one was sent ahead.
    /// The first claim of a start also sends the GETs of the files after it
    /// that the interleave's other slots open next (`budget - 1` of them),
    /// so that they are asked for at once, not as each slot gets its turn.
    pub(crate) fn claim(&self, index: usize) -> Option<OpenAhead> {
        let mut state = self.lock();
        if let Some(claimed) = state.claimed.get_mut(index) {
            *claimed = true;
        }
        let sent = state.sent.remove(&index);
        if !state.started {
            state.started = true;
            self.send_after(&mut state, index, self.budget - 1);
        }
        sent
    }

    /// File `index` has opened: sends the GET of the first file after it not
    /// yet claimed nor sent, if the budget allows. Returns that file.
    pub(crate) fn opened(&self, index: usize) -> Option<usize> {
        let mut state = self.lock();
        self.send_after(&mut state, index, 1).first().copied()
    }

    /// Sends the GETs of up to `count` files after `index` not yet claimed
    /// nor sent, within the budget; returns them.
    fn send_after(&self, state: &mut AheadState, index: usize, count: usize) -> Vec<usize> {
        let mut sent = Vec::new();
        for next in index + 1..self.files.len() {
            if sent.len() >= count || state.sent.len() >= self.budget {
                break;
            }
            let Some(path) = self.files[next].as_deref() else {
                continue;
            };
            if state.claimed[next] || state.sent.contains_key(&next) {
                continue;
            }
            // Sending only starts a task on the storage runtime: no waiting
            // under the lock.
            if let Some(ahead) = storage::open_ahead(path, &self.read) {
                state.sent.insert(next, ahead);
                sent.push(next);
            }
        }
        sent
    }

    /// The GETs ahead now, by file (for tests).
    #[cfg(test)]
    fn sent(&self) -> Vec<usize> {
        self.lock().sent.keys().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AheadState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_files_and_an_empty_budget_make_no_read_ahead() {
        let local = Arc::from([None, None]);
        assert!(ReadAhead::new(local, 4, ReadOptions::default()).is_none());
        let object = Arc::from([Some(PathBuf::from("http://127.0.0.1:9/a"))]);
        assert!(ReadAhead::new(object, 0, ReadOptions::default()).is_none());
    }

    /// Port 9 (discard) on loopback: the GETs are sent to nothing that
    /// answers, which is enough to see which files are opened ahead.
    #[cfg(feature = "object-store")]
    #[test]
    fn the_first_set_is_sent_at_once_then_one_file_per_open() {
        let url = |i: usize| Some(PathBuf::from(format!("http://127.0.0.1:9/f{i}")));
        // File 2 is read from past its start: never opened ahead.
        let files = Arc::from([url(0), url(1), None, url(3), url(4), url(5), url(6)]);
        let ahead = ReadAhead::new(files, 2, ReadOptions::default()).unwrap();
        assert!(ahead.claim(0).is_none());
        assert_eq!(
            ahead.sent(),
            [1],
            "the first claim sends the rest of its set"
        );
        assert!(ahead.claim(1).is_some(), "1's GET was sent at 0's claim");
        assert_eq!(ahead.opened(0), Some(3), "2 is skipped");
        assert_eq!(ahead.opened(1), Some(4));
        assert_eq!(ahead.opened(1), None, "the budget is 2");
        assert_eq!(ahead.sent(), [3, 4]);
        assert!(ahead.claim(3).is_some(), "3's GET was sent ahead");
        assert_eq!(ahead.opened(3), Some(5));
        // A file claimed before it was sent ahead is never sent.
        assert!(ahead.claim(6).is_none());
        assert!(ahead.claim(4).is_some());
        assert_eq!(ahead.opened(4), None, "5 is sent, 6 claimed");
        assert_eq!(ahead.sent(), [5]);
    }
}
