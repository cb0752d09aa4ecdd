//! The vault (the OceanStore paper's design, issue 22): files kept encrypted on servers that
//! cannot read them, updated by small diffs.
//!
//! Built so far: [`keys`] (a random master key wrapped by Argon2id and XChaCha20-Poly1305,
//! derived block, id and chunker keys, sealed blocks), and [`tree`], the Merkle B+-tree over a file's blocks whose internal nodes hold
//! relative offsets (byte counts), so that inserting or deleting in the middle of a file
//! touches O(log n) nodes and no offset after it; with the paper's §4.3 extension (leaf
//! entries name a range of a block), inserts and deletes at any byte offset; [`backend`]: a
//! directory or an S3 bucket as named blobs with one atomic create-if-absent; [`records`]:
//! config, commits (the heads) and the catalog; the [`Vault`] itself: open, update by
//! file-summary diffs predicated on the head they were made against (fine ones, at ~512-byte
//! sub-blocks, where the client kept the old version's summary: `summary`; the new blocks
//! sealed and sent in batches: `upload`), read, log and check.

pub mod backend;
pub mod keys;
pub mod local;
mod nodes;
mod read;
pub mod records;
pub mod ring;
pub mod seen;
mod summary;
pub mod tree;
mod update;
mod upload;
mod vault;

pub use backend::{Backend, DirBackend, S3Backend};
pub use keys::KdfParams;
pub use nodes::Traffic;
pub use read::{CheckReport, Version};
pub use records::{Catalog, Change, Commit, Config, Entry, Kind};
pub use update::{Edit, Source, UpdateReport};
pub use vault::{SlotInfo, Snapshot, Vault};

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum VaultError {
    /// A node the tree names is not in the store.
    #[error("node {0} is missing")]
    Missing(String),
    /// A node's bytes do not decode, or do not hash to its name.
    #[error("node {id} is damaged: {why}")]
    Damaged { id: String, why: String },
    #[error("{0}")]
    BadRange(String),
    #[error("wrong passphrase (no key slot of this vault opens with it)")]
    WrongPassphrase,
    /// The storage failed (I/O, S3).
    #[error("{0}")]
    Backend(String),
    /// A local file could not be read or written.
    #[error("{0}")]
    Local(String),
    #[error("{0}: not a vault (run `ferry vault init` first)")]
    NotAVault(String),
    #[error("{0}: a vault exists there already")]
    Exists(String),
    #[error("{0}: not in the vault")]
    NotFound(String),
    #[error("{0}")]
    Refused(String),
    /// The server offered an older version than this client has seen.
    #[error("rollback detected: {0}")]
    Rollback(String),
}
