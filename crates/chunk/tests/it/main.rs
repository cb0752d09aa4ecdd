//! Integration tests of the chunkers: golden vectors and properties.

mod golden;
mod properties;

use ferry_chunk::{ChunkerSpec, Key};

/// Every chunker configuration the tests exercise, with a short name.
pub fn all_specs() -> Vec<(&'static str, ChunkerSpec)> {
    vec![
        ("lbfs", ChunkerSpec::lbfs()),
        ("fastcdc", ChunkerSpec::default()),
        ("fastcdc-small", ChunkerSpec::fastcdc(256, 1024, 8192)),
        ("fixed", ChunkerSpec::fixed(8192)),
        ("lbfs-keyed", ChunkerSpec::lbfs().keyed(Key([0x42; 32]))),
        (
            "fastcdc-keyed",
            ChunkerSpec::default().keyed(Key([0x42; 32])),
        ),
    ]
}

/// Deterministic pseudo-random bytes.
pub fn random_bytes(seed: &str, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    blake3::Hasher::new_derive_key("ferry chunk tests")
        .update(seed.as_bytes())
        .finalize_xof()
        .fill(&mut out);
    out
}
