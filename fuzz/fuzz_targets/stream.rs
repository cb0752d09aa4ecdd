//! Any byte stream into a session's compressed inflow (the zstd stream after a `Compressed`): no
//! panic, and the plain bytes held stay bounded by a frame plus one decompression step.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::stream::run(data));
