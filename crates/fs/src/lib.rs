//! The LBFS-style file service: an exported tree served over Ferry's protocol, and the client
//! that fetches from it using every chunk it can already find.
//!
//! - [`export`]: the exported directory; every path resolved beneath its root with
//!   `openat2(RESOLVE_BENEATH)`.
//! - [`server`]: request handling as frames in, frames out (no sockets), with recipes cached per
//!   file identity and chunk locations kept as verified-on-use hints.
//! - [`conn`]: the server loop over any byte stream (also pushing lease invalidations), and the
//!   client's pipelined connection.
//! - [`session`]: a session over a remote shell (`ssh host ferry serve --stdio DIR`) or any
//!   byte stream, with reads that can time out.
//! - [`client`]: `ls`, `get` and `put` over a remote shell (`ssh host ferry serve --stdio DIR`),
//!   with the persistent cache, the destination's existing files, the server's files and its
//!   trash as chunk sources; `--delete` and dry runs.
//! - [`delta`]: new chunks compressed against the old data the receiver holds, both ways.
//!
//! The transports (stdio under a remote shell, the TLS daemon of `ferry-net`) only carry bytes.

pub mod client;
pub mod conn;
pub mod delta;
pub mod export;
pub mod inplace;
mod leases;
mod rate;
pub mod server;
pub mod session;
pub mod vault;
mod writeback;

pub use client::{
    fetch_file, get, list, put, put_file, GetError, GetStats, Mirror, PutOptions, PutStats,
    RemoteSpec, Replacing, SessionSource, SourceStats, Sources,
};
pub use conn::{serve, ConnError, Connection, Traffic, DEFAULT_ZSTD_LEVEL};
pub use export::Export;
pub use server::{
    IndexStats, ObjectShelf, Server, ServerOptions, ShelfError, Staging, MAX_OBJECT_READ,
};
pub use session::{LinkReader, LinkWriter, Session};
