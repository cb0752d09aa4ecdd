//! The vault (the OceanStore paper's design, issue 22): files kept encrypted on servers that
//! cannot read them, updated by small diffs.
//!
//! Built so far: [`keys`] (a random master key wrapped by Argon2id and XChaCha20-Poly1305,
//! derived block, id and chunker keys, sealed blocks), and [`tree`], the Merkle B+-tree over a file's blocks whose internal nodes hold
//! relative offsets (byte counts), so that inserting or deleting in the middle of a file
//! touches O(log n) nodes and no offset after it; with the paper's §4.3 extension (leaf
//! entries name a range of a block), inserts and deletes at any byte offset. Still to come:
//! the update protocol, the targets and the CLI.

pub mod keys;
pub mod tree;

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
    #[error("wrong passphrase (or a key slot of another vault)")]
    WrongPassphrase,
}
