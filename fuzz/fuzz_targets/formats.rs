//! Recipes and recipe diffs from arbitrary bytes: no panic, bounded allocation, and a decoded
//! value re-encodes to the same bytes (encodings are canonical).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::formats::run(data));
