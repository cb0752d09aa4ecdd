//! Ferry's object service, after the Bullet server (`../shared/seeds/002_…`): immutable objects
//! kept contiguously (one extent each in large data files), protected by capabilities that can
//! be restricted without the server, created at a chosen durability, and a directory service
//! that names them in versioned directories. The transfer daemon (`ferry-daemon`) serves it.
//!
//! - [`caps`]: capabilities and rights (format in `docs/formats.md`).
//! - [`store`]: the object store: extents, inode table, RAM cache, durability 0 and 1.
//! - [`dir`]: the directory service.
//! - [`space`]: the first-fit allocator of extents.
//! - [`disk`]: real files, and the simulated disk crash tests run on.

mod base32;
pub mod caps;
pub mod dir;
pub mod disk;
pub mod inode;
pub mod space;
pub mod store;

use std::path::Path;
use std::sync::Arc;

pub use caps::{BadCapability, Capability, Rights};
pub use dir::{Entry, Listing};
pub use inode::Kind;
pub use store::{Created, ObjectStore, Options, Stat, Stats};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectsError {
    /// The one answer to a capability that is forged, altered, widened, lacks the right asked
    /// for, or names no object: it does not tell these apart.
    #[error("no such object, or not with this capability")]
    Denied,
    #[error("cannot {op} {what}: {source}")]
    Io {
        op: &'static str,
        what: String,
        source: std::io::Error,
    },
    #[error("the object index: {0}")]
    Index(String),
    #[error("damaged: {0}")]
    Corrupt(String),
    #[error("{0}")]
    BadInput(String),
    #[error("{0}")]
    Conflict(String),
}

/// Opens (or makes) the object store in directory `dir`.
pub fn open_dir(
    dir: &Path,
    secret: [u8; 32],
    opts: Options,
) -> Result<Arc<ObjectStore>, ObjectsError> {
    std::fs::create_dir_all(dir).map_err(|source| ObjectsError::Io {
        op: "create",
        what: dir.display().to_string(),
        source,
    })?;
    ObjectStore::open(Arc::new(disk::Dir(dir.to_path_buf())), secret, opts)
}
