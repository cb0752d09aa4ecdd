//! Arbitrary request sequences into the file server's handler (`Server::handle`, in-process, no
//! sockets), on a small export beside a directory it must never touch: no panic, every frame
//! it answers decodes, replies stay bounded, and nothing outside the export changes or
//! appears. The input is a run of frames: type, flags, a 16-bit length, the body.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::server::run(data));
