//! Vault tree nodes from arbitrary bytes: no panic, bounded allocation, and what decodes
//! re-encodes to the same bytes (the encoding is canonical).
#![no_main]

use ferry_vault::tree::Node;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(n) = Node::decode(data) {
        assert_eq!(n.encode(), data);
    }
});
