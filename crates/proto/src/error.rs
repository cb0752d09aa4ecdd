use thiserror::Error;

/// A protocol violation by the peer (or a bug in this side's encoder).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    FrameTooLarge { len: u64, max: u64 },
    #[error("frame of {0} bytes is shorter than a frame header")]
    FrameTooShort(u32),
    #[error("unknown frame flags {0:#04x}")]
    BadFlags(u8),
    #[error("compressed body is invalid or decompresses past {max} bytes")]
    BadCompression { max: usize },
    #[error("unknown message type {0:#04x}")]
    UnknownType(u8),
    #[error("{what} is truncated")]
    Truncated { what: &'static str },
    #[error("{what} has {extra} trailing bytes")]
    Trailing { what: &'static str, extra: usize },
    #[error("{what} declares {count} items, more than its remaining {available} bytes can hold")]
    CountTooLarge {
        what: &'static str,
        count: u64,
        available: usize,
    },
    #[error("invalid {what}: {why}")]
    Invalid { what: &'static str, why: String },
    #[error("not a Ferry peer (bad hello magic)")]
    BadMagic,
    #[error("peer speaks protocol version {peer}, this build speaks {ours}")]
    Version { peer: u16, ours: u16 },
    #[error(transparent)]
    Format(#[from] ferry_format::FormatError),
}
