//! Ferry's chunk store on S3-compatible object storage (AWS, Garage, Ceph RGW, SeaweedFS,
//! versitygw, MinIO…): [`S3Store`], a [`ferry_store::ChunkStore`] over a bucket and prefix.
//!
//! Layout under `s3://BUCKET/PREFIX/` (docs/s3.md):
//! - `ferry-store`: what the store is (`ferry-s3-store 1`, the hash algorithm); written once,
//!   by a conditional PUT (`If-None-Match: *`), so two servers that create the store at once
//!   agree on one.
//! - `packs/<64 hex>`: immutable packs of several MiB named by their BLAKE3
//!   ([`pack`] documents the bytes); each ends with its own table of contents, so the index is
//!   rebuilt from one ranged GET per pack.
//! - `objects/<64 hex>`: each object's recipe, written once its chunks are durable.
//!
//! Nothing in the bucket is ever modified in place: several servers on one store add packs and
//! objects side by side; what one flushed, every other finds (on a miss it lists the packs
//! again). Every chunk is verified against its id on every read.

mod client;
pub mod config;
mod index;
pub mod pack;
mod read;
mod store;
pub mod testing;

pub use client::{Client, ClientOptions, Cond, Put};
pub use config::{Locator, Resolved};
pub use store::{GcReport, Options, S3Store};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum S3Error {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Denied(String),
    #[error(
        "bucket {0} does not exist (`ferry store init --store s3://BUCKET/PREFIX` creates it)"
    )]
    NoBucket(String),
    #[error("{op}: HTTP {status} {why}")]
    Http {
        op: String,
        status: u16,
        why: String,
    },
    #[error("{op}: the server cannot be reached or keeps failing: {why}")]
    Unavailable { op: String, why: String },
    #[error("{0}")]
    Damaged(String),
    /// An object the index names is gone from the bucket (deleted by another server's gc).
    #[error("{0} is gone from the bucket")]
    Gone(String),
}

impl From<S3Error> for ferry_store::StoreError {
    fn from(e: S3Error) -> Self {
        ferry_store::StoreError::Remote { why: e.to_string() }
    }
}
