//! Ids and formats: what Ferry's layers say to each other about data.
//!
//! - [`Id`]: an algorithm-tagged content digest (`blake3:<hex>` by default, `sha256:<hex>`
//!   available). A chunk's id is the digest of its bytes; an [`Oid`] names a whole object by the
//!   digest of all its bytes. Ids carry their algorithm so that a store or a peer can never mix
//!   up two hash functions, and so that the default can change one day without a flag day.
//! - [`Recipe`]: the ordered list of `(chunk id, length)` of an object — LBFS's GETHASH reply,
//!   DOT's descriptor list, OceanStore's file summary — with a compact, versioned encoding.
//! - [`RecipeDiff`]: keep / delete / insert runs that turn one recipe into another (Myers'
//!   O(ND) diff), the update OceanStore sends instead of a whole summary.
//! - [`chunk_object`]: cuts and hashes a stream in one pass, producing its recipe and OID.
//!
//! Every byte layout is specified in `docs/formats.md` and pinned by exact-bytes tests.
//!
//! ```
//! use ferry_format::{chunk_object, HashAlg, Recipe};
//! use ferry_chunk::ChunkerSpec;
//!
//! let data = vec![7u8; 100_000];
//! let (recipe, oid) = chunk_object(&data[..], &ChunkerSpec::default(), HashAlg::Blake3, |_, _| Ok::<_, std::io::Error>(())).unwrap();
//! assert_eq!(recipe.total_len(), 100_000);
//! assert_eq!(oid.id(), ferry_format::Id::hash(HashAlg::Blake3, &data));
//! let bytes = recipe.encode();
//! assert_eq!(Recipe::decode(&bytes).unwrap(), recipe);
//! ```

mod diff;
mod error;
mod id;
mod recipe;
mod spare;
pub mod varint;

pub use diff::{DiffOp, RecipeDiff};
pub use error::FormatError;
pub use id::{HashAlg, Id, IdHasher, Oid, ID_BYTES, TAGGED_ID_BYTES};
pub use recipe::{
    chunk_object, chunk_object_parallel, page_key, pages, ChunkRef, Recipe, PAGE_DIVISOR, PAGE_MAX,
};
pub use spare::SpareHasher;
