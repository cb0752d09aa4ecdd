//! The fuzz targets' bodies, one module each: `fuzz_targets/*.rs` hand them libFuzzer's inputs
//! (`cargo +nightly fuzz run NAME`, `scripts/fuzz.sh`), and `tests/smoke.rs` runs each over
//! generated inputs on the stable toolchain (in CI).

pub mod api;
pub mod client;
pub mod formats;
pub mod frames;
pub mod objects;
pub mod s3;
pub mod server;
pub mod stream;
pub mod tickets;
pub mod vault;
pub mod vault_ring;
pub mod vfs;

/// Nothing appeared beside `root`'s `allowed` entries, and its `outside` directory holds its
/// `secret` file alone and unchanged: `inside` (the export, the destination) was not escaped.
pub(crate) fn outside_intact(root: &std::path::Path, allowed: &[&str], inside: &str) {
    let mut names: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert!(
        names.iter().all(|n| allowed.iter().any(|a| n == *a)),
        "something appeared beside {inside}: {names:?}"
    );
    let outside: Vec<_> = std::fs::read_dir(root.join("outside"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(outside, ["secret"], "something appeared outside {inside}");
    assert_eq!(
        std::fs::read(root.join("outside/secret")).unwrap(),
        b"secret"
    );
}
