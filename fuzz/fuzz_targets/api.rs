//! Arbitrary requests to the transfer daemon's local API (see `ferry_fuzz::api`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::api::run(data));
