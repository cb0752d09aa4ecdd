//! Any byte stream into the frame decoder and every frame into the message decoder: no panic,
//! no unbounded allocation, and whatever decodes re-encodes to a frame that decodes the same.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::frames::run(data));
