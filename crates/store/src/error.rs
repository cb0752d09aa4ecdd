//! Errors of the store layer.
//!
//! Rules: every error names what it is about (the path, the chunk id, the pack and offset);
//! no error is replaced by a vaguer one on the way up; a damaged chunk is `Corrupt`, never
//! `None` (absent) and never wrong bytes.

use std::io;
use std::path::PathBuf;

use ferry_format::{FormatError, HashAlg, Id};
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("store index {}: {msg} (try `ferry store rebuild`)", path.display())]
    Index { path: PathBuf, msg: String },
    #[error("chunk {id} at {location} is damaged: {why}")]
    Corrupt {
        id: Id,
        location: String,
        why: String,
    },
    #[error("{what} is damaged: {why}")]
    Damaged { what: String, why: String },
    #[error("{} is not a Ferry store: {why}", path.display())]
    NotAStore { path: PathBuf, why: String },
    #[error("store {} is in use by another process", path.display())]
    Locked { path: PathBuf },
    #[error("store holds {store} ids, not {got}")]
    WrongHashAlg { store: HashAlg, got: HashAlg },
    #[error("an earlier write to {} failed; reopen the store before writing again", path.display())]
    Poisoned { path: PathBuf },
    #[error("object {what} is {len} bytes, over the {limit}-byte limit")]
    TooLarge { what: String, len: u64, limit: u64 },
    /// A store elsewhere (an S3 bucket) refused or failed a request, after retries.
    #[error("{why}")]
    Remote { why: String },
    #[error(transparent)]
    Format(#[from] FormatError),
}

impl StoreError {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> StoreError {
        let path = path.into();
        move |source| StoreError::Io { op, path, source }
    }

    /// Whether this is a chunk found damaged (the store recorded it; putting it again repairs
    /// it), as opposed to the store itself failing.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, StoreError::Corrupt { .. })
    }

    /// Whether this is the disk being full (the caller may free space and retry).
    pub fn is_disk_full(&self) -> bool {
        matches!(self, StoreError::Io { source, .. } if source.raw_os_error() == Some(28))
    }
}
