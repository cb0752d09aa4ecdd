//! Ferry's wire protocol, free of I/O.
//!
//! One framed, pipelined, versioned protocol carries every service. This crate knows bytes and
//! messages only: [`FrameDecoder`] turns a byte stream into bounded [`Frame`]s, [`Message`]
//! turns frames into typed requests and replies and back. The network layer (stdio, TLS) feeds
//! it bytes and writes what it produces, so every rule here is tested without a socket.
//!
//! # Goals
//! - Pipelining: every request carries an id; replies carry it back; many requests may be in
//!   flight and replies may stream over several frames (`MORE`).
//! - Bounded memory on hostile input: a frame's length is checked before its body is read, a
//!   compressed body is decompressed into a bounded buffer, and every count inside a body is
//!   checked against the bytes remaining before anything is allocated.
//! - Evolution: `Hello` carries a version and feature bits; unknown message types are an error
//!   the peer can report, never a crash.
//!
//! # Non-goals
//! - Authentication and encryption: the transport provides them (ssh for stdio, TLS 1.3 with
//!   pinned keys for the daemon).
//! - Flow control beyond the transport's: the engine bounds requests in flight.
//!
//! The byte layout is specified in `docs/protocol.md` and pinned by exact-bytes tests.
//!
//! ```
//! use ferry_proto::{FrameDecoder, Message, Request};
//!
//! let bytes = Message::Request(Request::GetAttr { path: "src/main.rs".into() }).encode(7, false).unwrap();
//! let mut dec = FrameDecoder::new();
//! dec.feed(&bytes);
//! let frame = dec.next_frame().unwrap().unwrap();
//! assert_eq!(frame.request_id, 7);
//! assert_eq!(Message::decode(&frame).unwrap(), Message::Request(Request::GetAttr { path: "src/main.rs".into() }));
//! ```

mod codec;
mod error;
mod frame;
mod message;
mod stream;
mod tree;

pub use error::ProtoError;
pub use frame::{
    Frame, FrameDecoder, FLAG_COMPRESSED, FLAG_MORE, FRAME_HEADER_LEN, MAX_BODY, MAX_FRAME,
};
pub use message::{
    short_id, Against, Attr, Chunks, Context, DirEntry, ErrorCode, FileKind, FsStats, GetChunks,
    Hello, Ids, KeyOlds, Keys, Located, Message, Payload, RecipeDelta, RecipePart, Reply, Request,
    StatExtra, Target, VaultOp, WirePath, WritePart, ASKED_FEATURES, FEATURES,
    FEATURE_DEFERRED_SYNC, FEATURE_ENTRY_CHANGES, FEATURE_HARD_LINKS, FEATURE_HISTORY,
    FEATURE_NO_TREE_DIGESTS, FEATURE_OWN_CHANGES, FEATURE_RATE, FEATURE_STATFS, FEATURE_STAT_EXTRA,
    FEATURE_TREE_LISTINGS, KEY_BYTES, MAGIC, MAX_CAP_BYTES, MAX_CONTEXT, MAX_FILES_DATA,
    MAX_OBJECT_REFS, MAX_PATH, MAX_READ_FILE, MAX_READ_RANGE, MAX_VAULT_NAMES, MAX_WRITE_DATA,
    VERSION,
};
pub use stream::{Inflow, Level, Outflow, COMPRESSED, FEATURE_ZSTD_STREAM, MAX_WINDOW_LOG};
pub use tree::{entry_hash, entry_key, tree_digest, KnownEntries, TreeItem, MAX_FILTER_HASHES};
