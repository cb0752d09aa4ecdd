//! Ferry's transfer daemon (DOT, `../shared/seeds/001_…`): applications hand objects to their
//! daemon and get back a ticket (OID, size, hints and a read capability); the receiver's daemon
//! fetches the object from every source the hints and its own store offer, through the
//! transfer engine, verifying every chunk and the whole.
//!
//! - [`ticket`]: the ticket and its hints (format in `docs/formats.md`).
//! - [`shelf`]: the object store (`ferry-objects`) and the chunks of fetches.
//! - [`fetch`](mod@fetch): fetching by ticket, installing atomically.
//! - [`api`]: the local API, HTTP/1.1 + JSON on a Unix socket (`docs/daemon-api.json`), and
//!   [`client`], what the `ferry` commands use to call it.
//! - [`jobs`]: fetches accepted, recorded, resumed after a restart, followed as events.
//! - [`devices`]: portable storage (DOT's plugin).
//! - [`run`]: the daemon: the local API and the peer side (the TLS daemon of `ferry-net`
//!   serving objects by capability to other daemons).

pub mod api;
pub mod client;
pub mod devices;
pub mod dirs;
pub mod fetch;
pub mod jobs;
mod paths;
pub mod replicas;
mod s3;
mod serve;
pub mod shelf;
mod stream;
pub mod ticket;

use std::io;
use std::path::{Path, PathBuf};

pub use ferry_objects::{Capability, Rights};
pub use paths::Paths;
pub use ticket::{Hint, Ticket};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    #[error("cannot {op} {}: {source}", path.display())]
    File {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(transparent)]
    Store(#[from] ferry_store::StoreError),
    #[error(transparent)]
    Net(#[from] ferry_net::NetError),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// A change made against a version that is no longer the current one.
    #[error("{0}")]
    Conflict(String),
    /// No source could supply what was asked.
    #[error("{0}")]
    Unavailable(String),
    /// A peer answered something that cannot be true.
    #[error("a peer answered wrongly: {0}")]
    BadPeer(String),
    #[error("{0}")]
    Damaged(String),
    /// The daemon is not running, or its API answered with an error.
    #[error("{0}")]
    Api(String),
}

impl DaemonError {
    pub(crate) fn file(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DaemonError {
        let path = path.to_path_buf();
        move |source| DaemonError::File { op, path, source }
    }
}

/// Replaces the file at `path` with `bytes`, atomically and durably: a temporary file beside it,
/// synced, renamed over it, the directory synced.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), DaemonError> {
    use std::io::Write;
    let dir = path.parent().expect("a file in a directory");
    let mut tmp = tempfile::Builder::new()
        .prefix(".ferry-tmp")
        .tempfile_in(dir)
        .map_err(DaemonError::file("create a file in", dir))?;
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(DaemonError::file("write", path))?;
    tmp.persist(path)
        .map_err(|e| DaemonError::file("replace", path)(e.error))?;
    sync_dir(dir);
    Ok(())
}

/// Makes a rename or a new file in `dir` durable (best effort: some file systems cannot).
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub paths: Paths,
    /// Where the peer side listens (TLS): `None`, nowhere (objects are then served to no one).
    pub listen: Option<std::net::SocketAddr>,
    /// The host name peers reach the daemon at, for the hint in the tickets it makes (default:
    /// the address it listens on, or this machine's name when that is a wildcard).
    pub advertise: Option<String>,
}

/// Runs the daemon until it is killed: binds the API socket (and the peer port), then calls
/// `ready` with what it bound, then serves.
pub fn run(cfg: Config, ready: impl FnOnce(&api::Status)) -> Result<(), DaemonError> {
    serve::run(cfg, ready)
}
