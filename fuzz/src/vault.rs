//! The vault's decoders from arbitrary bytes (tree nodes, config, commits, catalogs, tree
//! actions and roots, a server's answer to a get of several names): no panic, bounded
//! allocation, and what decodes re-encodes to the same bytes (every encoding is canonical).

use ferry_vault::records::{Catalog, Commit, Config};
use ferry_vault::ring;
use ferry_vault::tree::Node;

/// One input.
pub fn run(data: &[u8]) {
    let Some((&which, b)) = data.split_first() else {
        return;
    };
    match which % 8 {
        0 => {
            if let Ok(n) = Node::decode(b) {
                assert_eq!(n.encode(), b);
            }
        }
        1 => {
            if let Ok(c) = Config::decode(b) {
                assert_eq!(c.encode(), b);
            }
        }
        2 => {
            if let Ok(c) = Commit::decode(b) {
                assert_eq!(c.encode(), b);
            }
        }
        3 => {
            if let Ok(c) = Catalog::decode(b) {
                assert_eq!(c.encode(), b);
            }
        }
        4 => {
            if let Ok(a) = ring::decode_actions(b) {
                assert_eq!(ring::encode_actions(&a), b);
            }
        }
        5 => {
            if let Ok(r) = ring::decode_roots(b) {
                assert_eq!(ring::encode_roots(&r), b);
            }
        }
        6 => {
            let _ = ferry_vault::backend::decode_many(b, 64);
        }
        _ => {
            if let Ok(blobs) = ferry_vault::backend::decode_puts(b) {
                let owned: Vec<(String, Vec<u8>)> = blobs
                    .iter()
                    .map(|(n, d)| (n.to_string(), d.to_vec()))
                    .collect();
                assert_eq!(ferry_vault::backend::encode_puts(&owned), b);
            }
        }
    }
}
