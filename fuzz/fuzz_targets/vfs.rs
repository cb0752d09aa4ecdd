//! Arbitrary operation sequences on the mount's file system logic from two clients, against a
//! model of the tree (see `ferry_fuzz::vfs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::vfs::run(data));
