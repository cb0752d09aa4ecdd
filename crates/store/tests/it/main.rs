//! Integration tests of the chunk stores.

mod conformance;
mod faults;
mod s3;

use ferry_format::HashAlg;
use ferry_store::{LocalStore, Options};

/// Pseudo-random bytes, deterministic per seed.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    blake3::Hasher::new_derive_key("ferry store tests")
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut v);
    v
}

/// Small packs so tests cross pack boundaries.
pub fn small_opts() -> Options {
    Options {
        hash_alg: HashAlg::Blake3,
        cache_bytes: 1 << 20,
        pack_target: 256 << 10,
        zstd_level: 3,
        flush_every: 1 << 20,
        append_to_last_pack: true,
        // Smaller than a pack: records reach the file before a flush, a few at a time.
        write_buffer: 64 << 10,
        wait_for_lock: true,
    }
}

pub fn new_local(dir: &std::path::Path) -> LocalStore {
    LocalStore::open_or_create(dir.join("store"), small_opts()).unwrap()
}

pub fn reopen(dir: &std::path::Path) -> LocalStore {
    LocalStore::open(dir.join("store"), small_opts()).unwrap()
}
