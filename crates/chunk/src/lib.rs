//! Content-defined chunking for Ferry.
//!
//! Ferry never sends a byte the other side can already find, and it finds shared bytes by
//! cutting every stream into chunks at points chosen by the content itself: an insertion near
//! the front of a file moves the bytes after it, but the cut points move with them, so every
//! chunk not touched by the edit keeps its identity (LBFS §3.1).
//!
//! # Algorithms, and why they are versioned
//!
//! | name | what | use |
//! |---|---|---|
//! | [`Algorithm::Lbfs`] | Rabin fingerprint of a 48-byte window, cut where the low 13 bits equal a magic value, 2 KiB min / 64 KiB max | fidelity to the LBFS paper |
//! | [`Algorithm::FastCdc`] | FastCDC 2020 (gear hash, normalized chunking level 2, two bytes per step) | the default everywhere |
//! | [`Algorithm::Fixed`] | fixed-size blocks | the "Block" baseline of OceanStore |
//!
//! Cut points are a format: two machines that chunk the same bytes must agree, today and in ten
//! years, or nothing deduplicates. Each algorithm therefore carries a version in its name
//! (`lbfs-v1`, `fastcdc2020-v1`, `fixed-v1`) and its cut points are pinned by golden vectors
//! (`tests/golden.rs`). A change to cut points is a new version beside the old, never an edit.
//!
//! # Keyed chunkers
//!
//! Plain content-defined cut points leak information: the sequence of chunk lengths of a known
//! file is a fingerprint an untrusted server can match even when it only sees ciphertext. For
//! encrypted stores the two content-defined chunkers take a secret [`Key`]: FastCDC's gear table
//! and the Rabin chunker's polynomial, byte substitution and magic value are all derived from
//! it, so cut points cannot be predicted without the key. See `docs/chunking.md` for what this
//! does and does not protect against.
//!
//! # Streaming
//!
//! A [`Cutter`] is a state machine fed successive buffers; its cut points are identical however
//! the input is split. [`ChunkReader`] drives one over any [`std::io::Read`] with memory bounded
//! by the maximum chunk size plus one read buffer.
//!
//! ```
//! use ferry_chunk::{ChunkReader, ChunkerSpec};
//!
//! let data: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
//! let mut reader = ChunkReader::new(&data[..], ChunkerSpec::default().build());
//! let mut total = 0;
//! while let Some(chunk) = reader.next_chunk().unwrap() {
//!     assert_eq!(chunk.offset as usize, total);
//!     total += chunk.data.len();
//! }
//! assert_eq!(total, data.len());
//! ```

mod fixed;
mod gear;
mod rabin;
mod stream;

use std::fmt;
use std::str::FromStr;

pub use fixed::FixedCutter;
pub use gear::{window_mask, GearCutter};
pub use rabin::{RabinCutter, LBFS_POLYNOMIAL};
pub use stream::{cut_lengths, Chunk, ChunkReader};

/// A chunking state machine.
///
/// Implementations keep whatever state they need (rolling hash, bytes into the current chunk)
/// so that feeding a stream in buffers of any size gives the same cut points as feeding it
/// whole.
pub trait Cutter: Send {
    /// Scans `data`, which continues the current chunk. Returns `Some(n)` when the current chunk
    /// ends after `data[..n]` (`1 <= n <= data.len()`); the cutter then starts a new chunk at
    /// `data[n]`. Returns `None` when all of `data` belongs to the current chunk.
    fn next_cut(&mut self, data: &[u8]) -> Option<usize>;

    /// Forgets all state: the next byte fed starts a new stream.
    fn reset(&mut self);

    /// The largest chunk this cutter can produce.
    fn max_size(&self) -> usize;
}

/// A secret that makes cut points unpredictable to anyone without it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(pub [u8; 32]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<secret>)")
    }
}

impl Key {
    /// Derives an independent sub-key for one purpose (domain-separated BLAKE3).
    pub(crate) fn derive(&self, context: &str) -> blake3::OutputReader {
        let sub = blake3::derive_key(context, &self.0);
        blake3::Hasher::new_keyed(&sub).finalize_xof()
    }
}

/// The chunking algorithms, by published version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// `lbfs-v1`: Rabin fingerprint over a 48-byte window, as in LBFS.
    Lbfs,
    /// `fastcdc2020-v1`: FastCDC 2020 with normalized chunking.
    FastCdc,
    /// `fixed-v1`: fixed-size blocks.
    Fixed,
}

impl Algorithm {
    /// The versioned name used in formats and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Lbfs => "lbfs-v1",
            Algorithm::FastCdc => "fastcdc2020-v1",
            Algorithm::Fixed => "fixed-v1",
        }
    }

    /// The one-byte tag used in binary formats (see `docs/formats.md`).
    pub fn tag(self) -> u8 {
        match self {
            Algorithm::Lbfs => 1,
            Algorithm::FastCdc => 2,
            Algorithm::Fixed => 3,
        }
    }

    /// The algorithm with binary tag `tag`.
    pub fn from_tag(tag: u8) -> Option<Self> {
        [Algorithm::Lbfs, Algorithm::FastCdc, Algorithm::Fixed]
            .into_iter()
            .find(|a| a.tag() == tag)
    }
}

impl FromStr for Algorithm {
    type Err = ParamError;
    fn from_str(s: &str) -> Result<Self, ParamError> {
        match s {
            "lbfs" | "lbfs-v1" => Ok(Algorithm::Lbfs),
            "fastcdc" | "fastcdc2020" | "fastcdc2020-v1" => Ok(Algorithm::FastCdc),
            "fixed" | "fixed-v1" => Ok(Algorithm::Fixed),
            other => Err(ParamError(format!(
                "unknown chunker {other:?} (expected lbfs, fastcdc or fixed)"
            ))),
        }
    }
}

/// Chunk sizes are bounded so that a chunk always fits a protocol frame.
pub const MAX_CHUNK_LIMIT: usize = 4 << 20;
/// The smallest minimum chunk size accepted; below it per-chunk metadata outweighs data.
pub const MIN_CHUNK_LIMIT: usize = 64;

/// A chunker: algorithm, sizes and optional key. Build a [`Cutter`] from it with
/// [`ChunkerSpec::build`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkerSpec {
    pub algorithm: Algorithm,
    /// Minimum chunk size (ignored by `fixed`).
    pub min: usize,
    /// Target average size (the block size for `fixed`).
    pub avg: usize,
    /// Maximum chunk size (ignored by `fixed`).
    pub max: usize,
    /// Secret for keyed cut points (not allowed with `fixed`, which has no content-defined cuts).
    pub key: Option<Key>,
}

/// An invalid chunker parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError(pub String);

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParamError {}

impl Default for ChunkerSpec {
    /// FastCDC 2020, 2 KiB / 8 KiB / 64 KiB, unkeyed.
    fn default() -> Self {
        ChunkerSpec::fastcdc(2048, 8192, 65536)
    }
}

impl ChunkerSpec {
    /// LBFS's chunker with the paper's parameters: 2 KiB / 8 KiB expected / 64 KiB.
    pub fn lbfs() -> Self {
        ChunkerSpec {
            algorithm: Algorithm::Lbfs,
            min: 2048,
            avg: 8192,
            max: 65536,
            key: None,
        }
    }

    /// FastCDC 2020 with the given sizes.
    pub fn fastcdc(min: usize, avg: usize, max: usize) -> Self {
        ChunkerSpec {
            algorithm: Algorithm::FastCdc,
            min,
            avg,
            max,
            key: None,
        }
    }

    /// Fixed-size blocks of `size` bytes.
    pub fn fixed(size: usize) -> Self {
        ChunkerSpec {
            algorithm: Algorithm::Fixed,
            min: size,
            avg: size,
            max: size,
            key: None,
        }
    }

    /// The same chunker with cut points keyed by `key`.
    pub fn keyed(mut self, key: Key) -> Self {
        self.key = Some(key);
        self
    }

    /// Checks that the sizes make sense for the algorithm.
    pub fn validate(&self) -> Result<(), ParamError> {
        let err = |m: String| Err(ParamError(m));
        if self.algorithm == Algorithm::Fixed {
            if self.key.is_some() {
                return err("the fixed chunker has no content-defined cut points to key".into());
            }
            if !(MIN_CHUNK_LIMIT..=MAX_CHUNK_LIMIT).contains(&self.avg) {
                return err(format!(
                    "block size {} out of range {MIN_CHUNK_LIMIT}..={MAX_CHUNK_LIMIT}",
                    self.avg
                ));
            }
            return Ok(());
        }
        if !self.avg.is_power_of_two() {
            return err(format!(
                "average chunk size {} is not a power of two",
                self.avg
            ));
        }
        if !(self.min < self.avg && self.avg < self.max) {
            return err(format!(
                "chunk sizes must satisfy min < avg < max (got {} / {} / {})",
                self.min, self.avg, self.max
            ));
        }
        if self.min < MIN_CHUNK_LIMIT || self.max > MAX_CHUNK_LIMIT {
            return err(format!(
                "chunk sizes must lie within {MIN_CHUNK_LIMIT}..={MAX_CHUNK_LIMIT} (got {} / {})",
                self.min, self.max
            ));
        }
        if self.algorithm == Algorithm::Lbfs && self.min < rabin::WINDOW {
            return err(format!(
                "the lbfs minimum chunk size must be at least its {}-byte window",
                rabin::WINDOW
            ));
        }
        let bits = self.avg.trailing_zeros();
        if self.algorithm == Algorithm::FastCdc && !(8..=22).contains(&bits) {
            return err(format!(
                "fastcdc average {} must be 256 B ..= 4 MiB",
                self.avg
            ));
        }
        Ok(())
    }

    /// Builds the cutter. Panics only if [`validate`](Self::validate) fails; call it first for
    /// user input.
    pub fn try_build(&self) -> Result<Box<dyn Cutter>, ParamError> {
        self.validate()?;
        Ok(match self.algorithm {
            Algorithm::Lbfs => Box::new(RabinCutter::new(self)),
            Algorithm::FastCdc => Box::new(GearCutter::new(self)),
            Algorithm::Fixed => Box::new(FixedCutter::new(self.avg)),
        })
    }

    /// Builds the cutter.
    ///
    /// # Panics
    /// If the parameters are invalid; use [`try_build`](Self::try_build) for user input.
    pub fn build(&self) -> Box<dyn Cutter> {
        self.try_build().expect("invalid chunker parameters")
    }

    /// The canonical text form, e.g. `fastcdc2020-v1:2048:8192:65536` (`+keyed` appended for a
    /// keyed chunker; the key itself is never printed).
    pub fn describe(&self) -> String {
        let keyed = if self.key.is_some() { "+keyed" } else { "" };
        match self.algorithm {
            Algorithm::Fixed => format!("{}:{}", self.algorithm.name(), self.avg),
            a => format!("{}:{}:{}:{}{keyed}", a.name(), self.min, self.avg, self.max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_nonsense() {
        assert!(ChunkerSpec::fastcdc(2048, 8000, 65536).validate().is_err());
        assert!(ChunkerSpec::fastcdc(8192, 8192, 65536).validate().is_err());
        assert!(ChunkerSpec::fastcdc(2048, 8192, 8192).validate().is_err());
        assert!(ChunkerSpec::fastcdc(16, 64, 128).validate().is_err());
        assert!(ChunkerSpec::fastcdc(2048, 8192, 64 << 20)
            .validate()
            .is_err());
        assert!(ChunkerSpec::fixed(0).validate().is_err());
        assert!(ChunkerSpec::fixed(4096)
            .keyed(Key([0; 32]))
            .validate()
            .is_err());
        assert!(ChunkerSpec::default().validate().is_ok());
        assert!(ChunkerSpec::lbfs().validate().is_ok());
    }

    #[test]
    fn names_and_tags_round_trip() {
        for a in [Algorithm::Lbfs, Algorithm::FastCdc, Algorithm::Fixed] {
            assert_eq!(Algorithm::from_tag(a.tag()), Some(a));
            assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
        }
        assert!("rabin".parse::<Algorithm>().is_err());
        assert_eq!(
            ChunkerSpec::default().describe(),
            "fastcdc2020-v1:2048:8192:65536"
        );
        assert!(!format!("{:?}", Key([7; 32])).contains('7'));
    }
}
