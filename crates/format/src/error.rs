use thiserror::Error;

/// Why bytes could not be read as one of Ferry's formats.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FormatError {
    #[error("not a {what}: bad magic bytes")]
    BadMagic { what: &'static str },
    #[error(
        "{what} format version {version} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        what: &'static str,
        version: u8,
        supported: u8,
    },
    #[error("unknown hash algorithm tag {0}")]
    UnknownHashAlg(u8),
    #[error("unknown hash algorithm {0:?} (expected blake3 or sha256)")]
    UnknownHashName(String),
    #[error("invalid id {text:?}: {why}")]
    BadIdText { text: String, why: &'static str },
    #[error("{what} is truncated")]
    Truncated { what: &'static str },
    #[error("{what} has {extra} trailing bytes")]
    Trailing { what: &'static str, extra: usize },
    #[error("varint is overlong or exceeds 64 bits")]
    BadVarint,
    #[error("chunk length {0} is zero or larger than the 4 MiB limit")]
    BadChunkLength(u64),
    #[error("{what} declares {count} entries, more than its {available} bytes can hold")]
    CountTooLarge {
        what: &'static str,
        count: u64,
        available: usize,
    },
    #[error("recipe mixes hash algorithms ({0} and {1})")]
    MixedHashAlgs(&'static str, &'static str),
    #[error("diff does not fit the recipe it is applied to: {0}")]
    DiffMismatch(&'static str),
    #[error("{what} is invalid: {why}")]
    Invalid {
        what: &'static str,
        why: &'static str,
    },
    #[error("unknown diff operation tag {0}")]
    UnknownDiffOp(u8),
}
