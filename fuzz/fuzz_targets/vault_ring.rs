//! A Ferry server's inner ring under hostile actions: arbitrary bytes (and well-formed batches
//! of arbitrary inserts and deletes) applied to a small vault's trees, as `serve_apply` does
//! for a client's Vault apply request. No panic, no unbounded work: anything is applied or
//! refused with an error.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::vault_ring::run(data));
