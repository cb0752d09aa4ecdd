//! The vault's decoders from arbitrary bytes (tree nodes, config, commits, catalogs, tree
//! actions and roots, a server's answer to a get of several names): no panic, bounded
//! allocation, and what decodes re-encodes to the same bytes (every encoding is canonical).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::vault::run(data));
