//! The S3 store's decoders from arbitrary bytes: a pack's tail (as a hostile or damaged bucket
//! may hand it over, for any claimed pack size) and `s3://` locators. No panic, bounded
//! allocation, and every entry that parses lies inside the pack.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::s3::run(data));
