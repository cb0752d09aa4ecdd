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
