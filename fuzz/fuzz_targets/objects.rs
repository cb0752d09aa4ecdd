//! The object service's formats from arbitrary bytes: capabilities (binary and text), directory
//! listings and inodes. No panic, bounded allocation, and what decodes re-encodes to the same
//! bytes (all three are canonical).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::objects::run(data));
