//! Tickets (binary and text) and lookaside device indexes from arbitrary bytes: no panic,
//! bounded allocation, and what decodes re-encodes to the same bytes (both are canonical).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::tickets::run(data));
