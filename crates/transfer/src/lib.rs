//! Ferry's transfer engine: one fetch drawing on many sources, every chunk verified.
//!
//! DOT (`../shared/seeds/001_…`, §4.2) moves data transfer out of applications into a service
//! whose *transfer plugins* each know one way to get chunks: from the sender, a mirror, a peer,
//! several network paths, a USB stick. This crate is that layer. A [`Source`] is a plugin: it
//! takes requests for chunks by id (with, when known, where each lies in the tree being moved)
//! and answers each chunk with its bytes or with "not here". [`fetch`] takes the chunks wanted
//! and an ordered set of sources and:
//!
//! - keeps each source busy (each has its own thread and keeps its own number of requests
//!   outstanding, as DOT's plugins keep ten), handing out work in the order wanted;
//! - treats "not here" as a reason to ask the next source that may have the chunk, never as an
//!   error (only a chunk no source has is one);
//! - among several remote sources, sizes each one's requests to a quarter second of its own
//!   measured rate, so a slow source never holds much of what is left;
//! - lends the requests still outstanding at the slowest source to one that has run out of
//!   work (request borrowing, DOT's multi-path plugin): whichever answers first wins, the
//!   other's copy is dropped, and a request whose every chunk came from elsewhere is abandoned
//!   rather than waited for (DOT's cancel); the fetch ends when the last chunk arrives;
//! - verifies every chunk (its bytes must hash to its id), on the source's thread, and hands
//!   it to the [`Sink`] once;
//! - when a source fails (a cut link, an unplugged device), gives its outstanding requests to
//!   the others; once everything arrived, a source still waiting on its link after a grace
//!   period (a link gone silent) is interrupted, so it cannot hold the fetch.
//!
//! What reaches the sink stays there: a fetch cut short (every source failed) is resumed by
//! fetching again what is still missing from it (the file service's `--retry` does).
//!
//! Nothing here does I/O of its own: sources and sinks do, behind traits, so the engine is
//! tested with stores, files, and sources that stall or fail on purpose.
//!
//! ```
//! use ferry_format::HashAlg;
//! use ferry_store::{ChunkStore, MemStore, VerifiedChunk};
//! use ferry_transfer::{fetch, Options, Source, StoreSource, Want};
//!
//! let far = MemStore::new(HashAlg::Blake3);
//! let chunk = VerifiedChunk::hash(HashAlg::Blake3, b"hello");
//! far.put(&chunk).unwrap();
//! let near = MemStore::new(HashAlg::Blake3);
//! let wants = [Want { id: *chunk.id(), len: 5, place: None }];
//! let mut source = StoreSource::new("far", &far);
//! let mut sources: [&mut (dyn Source + Send); 1] = [&mut source];
//! let report = fetch(&mut sources, &wants, &near, &Options::default()).unwrap();
//! assert_eq!(report.sources[0].chunks, 1);
//! assert_eq!(near.get(chunk.id()).unwrap().as_deref(), Some(&b"hello"[..]));
//! ```

use std::sync::Arc;

use ferry_format::Id;
use ferry_store::{ChunkStore, StoreError, VerifiedChunk};

mod engine;
mod local;

pub use engine::{fetch, EngineError, Options, Report, SourceReport};
pub use local::{open_beneath, openat2_beneath, ChunkLookup, FileIndex, FilesSource, StoreSource};

/// A chunk a fetch wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    pub id: Id,
    pub len: u32,
    /// Where the chunk lies in the tree being moved, when known: a hint for sources that hold
    /// the same tree (a mirror, a copy on a device) without an index of it.
    pub place: Option<Place>,
}

/// A place in the tree being moved.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    /// The file, relative to the root of the transfer (`/`-separated; empty: the root itself,
    /// a single file).
    pub path: Arc<[u8]>,
    pub offset: u64,
    /// The check of the whole file's recipe (`Recipe::check`), when known: a source holding a
    /// file with that recipe (the same content) has the chunk at `offset` of it.
    pub recipe: Option<[u8; 32]>,
}

/// Why a source cannot go on (its link failed, its device went away). Not "not here": a
/// source answers that per chunk.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

impl SourceError {
    pub fn new(e: impl std::fmt::Display) -> Self {
        SourceError(e.to_string())
    }
}

/// How many chunks, and bytes, one request to a source may name.
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    pub chunks: usize,
    pub bytes: usize,
}

/// A transfer plugin: somewhere chunks may be found.
///
/// The engine drives each source from a thread of its own: [`request`](Source::request)s up
/// to [`depth`](Source::depth) of them, then [`receive`](Source::receive)s the answers in the
/// order requested. A source may answer "not here" for any chunk; wrong bytes are caught by
/// the engine and count as not here.
pub trait Source {
    /// For reports and logs: `ferry://host:7330`, `/media/usb`, …
    fn name(&self) -> String;

    /// Whether it may hold `want` (a look at an index, no more). A source that cannot tell
    /// says yes; a no keeps the engine from asking.
    fn may_have(&mut self, want: &Want) -> bool {
        let _ = want;
        true
    }

    /// Whether it reads from this machine (a store, a disk, a device): its requests are never
    /// lent to a source across a network, which would spend the link on what is at hand.
    fn local(&self) -> bool {
        false
    }

    /// Bytes a second this source is known to carry before the fetch measures it (a session's
    /// measure of its link so far), if it knows: the engine weighs it against a local device's
    /// from the start.
    fn rate_hint(&self) -> Option<f64> {
        None
    }

    /// How long an answer takes before its first byte (a link's round trip and the far end's
    /// work), if known: a batch asked alone waits this long besides its bytes, which must not
    /// pass for a slow rate (a small probe over a link of 10 ms would measure the round trip).
    fn latency_hint(&self) -> Option<std::time::Duration> {
        None
    }

    /// Requests kept outstanding: enough to keep a link's pipe full.
    fn depth(&self) -> usize {
        4
    }

    /// The most one request may name.
    fn batch(&self) -> Batch {
        Batch {
            chunks: 256,
            bytes: 4 << 20,
        }
    }

    /// Asks for `wants` (sent at once, or queued to go with the next ones).
    fn request(&mut self, wants: &[Want]) -> Result<(), SourceError>;

    /// The answer to the oldest request not yet received: one entry per chunk it named, its
    /// bytes or `None` (not here). Waits for it.
    fn receive(&mut self) -> Result<Vec<Option<Vec<u8>>>, SourceError>;

    /// What stops this source's waiting from another thread, if it can be stopped (a
    /// session's link gone silent): after a fetch has everything, the engine waits a grace
    /// period for each source to finish the answer it is receiving, then calls this; the
    /// source's receive must then fail soon.
    fn interrupter(&self) -> Option<Interrupter> {
        None
    }

    /// The answers to the oldest `n` requests not yet received are not wanted (what they asked
    /// for came from elsewhere, or the fetch is over). A source that can drops them as they
    /// come, without waiting (DOT's cancel); by default they are received and dropped.
    fn abandon(&mut self, n: usize) {
        for _ in 0..n {
            if self.receive().is_err() {
                return;
            }
        }
    }
}

/// Stops a source's waiting from another thread (see [`Source::interrupter`]).
pub type Interrupter = Box<dyn Fn() + Send + Sync>;

/// Where verified chunks go.
pub trait Sink: Sync {
    /// Takes the chunk that want `index` asked for, verified. Called at most once for each
    /// want, from the sources' threads.
    fn deliver(&self, index: usize, chunk: VerifiedChunk<'_>) -> Result<(), StoreError>;
}

/// A store is a sink: every chunk fetched is put there (and is there for a fetch that
/// resumes).
impl<S: ChunkStore + ?Sized> Sink for S {
    fn deliver(&self, _: usize, chunk: VerifiedChunk<'_>) -> Result<(), StoreError> {
        self.put(&chunk).map(drop)
    }
}
