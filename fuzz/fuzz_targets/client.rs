//! The client's handling of arbitrary server answers (in-process, no sockets): after a valid
//! Hello, the input is the server's byte stream as frames (type, flags, request id, 16-bit
//! length, body), and the client runs a get of a tree, a put of one, or a listing against it.
//! No panic, bounded memory (libFuzzer's RSS limit), and nothing written outside the
//! destination: a hostile server can fail the command, never reach beyond it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::client::run(data));
