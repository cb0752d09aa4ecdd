//! OceanStore's inner ring, for a Ferry server: it receives an update's insert and delete
//! actions, applies them to the trees (which hold no secret: block ids, counts and node
//! hashes), and stores the new nodes, without ever holding a key. The client computes the same
//! trees itself (the algorithm is deterministic) and checks the roots the server answers, so a
//! server that misapplies an update is caught before any head names the result.
//!
//! Vault actions v1 (docs/formats.md), integers little-endian: magic `FVAC`, version 1, the
//! number of files (u32), then per file: the old root's size (u64) and id (32; zeros for none),
//! the number of actions (u32), then per action: kind (u8: 1 delete, 2 insert), at (u64), and
//! for a delete its length (u64), for an insert the number of pieces (u32) and each piece
//! (block id 32, offset u32, length u32). The answer: magic `FVRT`, version 1, the number of
//! files (u32), each new root's size (u64) and id (32; zeros for none).

use crate::backend::Backend;
use crate::nodes::Nodes;
use crate::records::{self, Config, Reader};
use crate::tree::{Child, NodeId, Piece, Tree};
use crate::VaultError;

/// One edit of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Delete { at: u64, len: u64 },
    Insert { at: u64, pieces: Vec<Piece> },
}

/// The actions that turn one file's tree into its next version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileActions {
    pub old: Option<Child>,
    pub actions: Vec<Action>,
}

fn bad(why: &str) -> VaultError {
    VaultError::Damaged {
        id: "vault actions".into(),
        why: why.into(),
    }
}

fn put_root(out: &mut Vec<u8>, c: Option<Child>) {
    records::put_root(out, c.map_or(0, |c| c.bytes), c.map(|c| c.node));
}

fn get_root(r: &mut Reader<'_>) -> Result<Option<Child>, VaultError> {
    let (bytes, node) = records::get_root(r)?;
    Ok(node.map(|node| Child { bytes, node }))
}

pub fn encode_actions(files: &[FileActions]) -> Vec<u8> {
    let mut out = b"FVAC\x01".to_vec();
    out.extend_from_slice(&(files.len() as u32).to_le_bytes());
    for f in files {
        put_root(&mut out, f.old);
        out.extend_from_slice(&(f.actions.len() as u32).to_le_bytes());
        for a in &f.actions {
            match a {
                Action::Delete { at, len } => {
                    out.push(1);
                    out.extend_from_slice(&at.to_le_bytes());
                    out.extend_from_slice(&len.to_le_bytes());
                }
                Action::Insert { at, pieces } => {
                    out.push(2);
                    out.extend_from_slice(&at.to_le_bytes());
                    out.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
                    for p in pieces {
                        out.extend_from_slice(&p.block);
                        out.extend_from_slice(&p.offset.to_le_bytes());
                        out.extend_from_slice(&p.len.to_le_bytes());
                    }
                }
            }
        }
    }
    out
}

pub fn decode_actions(b: &[u8]) -> Result<Vec<FileActions>, VaultError> {
    let mut c = Reader {
        buf: b,
        what: "vault actions",
    };
    c.header(b"FVAC")?;
    let n = c.count(44)?;
    let mut files = Vec::with_capacity(n);
    for _ in 0..n {
        let old = get_root(&mut c)?;
        let k = c.count(17)?;
        let mut actions = Vec::with_capacity(k);
        for _ in 0..k {
            let kind = c.u8()?;
            let at = c.u64()?;
            actions.push(match kind {
                1 => Action::Delete { at, len: c.u64()? },
                2 => {
                    let m = c.count(40)?;
                    let mut pieces = Vec::with_capacity(m);
                    for _ in 0..m {
                        let p = Piece {
                            block: c.arr()?,
                            offset: c.u32()?,
                            len: c.u32()?,
                        };
                        if p.offset as u64 + p.len as u64 > u32::MAX as u64 {
                            return Err(bad("a piece past the largest block"));
                        }
                        pieces.push(p);
                    }
                    Action::Insert { at, pieces }
                }
                _ => return Err(bad("an unknown action")),
            });
        }
        files.push(FileActions { old, actions });
    }
    c.end()?;
    Ok(files)
}

pub fn encode_roots(roots: &[Option<Child>]) -> Vec<u8> {
    let mut out = b"FVRT\x01".to_vec();
    out.extend_from_slice(&(roots.len() as u32).to_le_bytes());
    for r in roots {
        put_root(&mut out, *r);
    }
    out
}

pub fn decode_roots(b: &[u8]) -> Result<Vec<Option<Child>>, VaultError> {
    let mut c = Reader {
        buf: b,
        what: "vault roots",
    };
    c.header(b"FVRT")?;
    let n = c.count(40)?;
    let roots = (0..n)
        .map(|_| get_root(&mut c))
        .collect::<Result<Vec<_>, _>>()?;
    c.end()?;
    Ok(roots)
}

/// Applies `actions` (once for the whole batch of files) to `tree`; the new root.
pub(crate) fn apply_one(
    tree: &mut Tree<'_, Nodes<'_>>,
    f: &FileActions,
) -> Result<Option<Child>, VaultError> {
    let mut root = f.old;
    for a in &f.actions {
        root = match a {
            Action::Delete { at, len } => {
                let end = at
                    .checked_add(*len)
                    .ok_or_else(|| bad("a range past 2^64"))?;
                tree.delete(root, *at, end)?
            }
            Action::Insert { at, pieces } => tree.insert(root, *at, pieces)?,
        };
    }
    Ok(root)
}

/// The server's side: applies an encoded batch of actions to the vault in `backend`, stores
/// the nodes the new trees need, and answers the encoded roots.
pub fn serve_apply(backend: &dyn Backend, body: &[u8]) -> Result<Vec<u8>, VaultError> {
    let config = match backend.get("config")? {
        Some(b) => Config::decode(&b)?,
        None => return Err(VaultError::NotAVault(backend.describe())),
    };
    let files = decode_actions(body)?;
    let mut nodes = Nodes::new(backend, None);
    let mut roots = Vec::with_capacity(files.len());
    for f in &files {
        let mut tree = Tree::new(&mut nodes, config.fanout as usize);
        roots.push(apply_one(&mut tree, f)?);
    }
    let ids: Vec<NodeId> = roots.iter().flatten().map(|c| c.node).collect();
    nodes.upload(&ids)?;
    backend.flush()?;
    Ok(encode_roots(&roots))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_and_roots_golden_bytes() {
        let files = vec![
            FileActions {
                old: Some(Child {
                    bytes: 10,
                    node: [0xaa; 32],
                }),
                actions: vec![
                    Action::Delete { at: 1, len: 2 },
                    Action::Insert {
                        at: 1,
                        pieces: vec![Piece {
                            block: [0xbb; 32],
                            offset: 0,
                            len: 7,
                        }],
                    },
                ],
            },
            FileActions::default(),
        ];
        let want = format!(
            "4656414301 02000000 0a00000000000000 {} 02000000 01 0100000000000000 0200000000000000 \
             02 0100000000000000 01000000 {} 00000000 07000000 0000000000000000 {} 00000000",
            "aa".repeat(32),
            "bb".repeat(32),
            "00".repeat(32)
        )
        .replace(' ', "");
        let got: String = encode_actions(&files)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, want);
        assert_eq!(decode_actions(&encode_actions(&files)).unwrap(), files);
        let roots = vec![
            None,
            Some(Child {
                bytes: 1,
                node: [0xcc; 32],
            }),
        ];
        let want = format!(
            "4656525401 02000000 0000000000000000 {} 0100000000000000 {}",
            "00".repeat(32),
            "cc".repeat(32)
        )
        .replace(' ', "");
        let got: String = encode_roots(&roots)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, want);
        assert_eq!(decode_roots(&encode_roots(&roots)).unwrap(), roots);
    }

    #[test]
    fn hostile_actions_are_refused() {
        let good = encode_actions(&[FileActions {
            old: None,
            actions: vec![Action::Insert {
                at: 0,
                pieces: vec![Piece {
                    block: [1; 32],
                    offset: 0,
                    len: 5,
                }],
            }],
        }]);
        for cut in 0..good.len() {
            assert!(decode_actions(&good[..cut]).is_err(), "cut at {cut}");
        }
        // A piece reaching past the largest block; a count beyond the bytes.
        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 8..n - 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_actions(&bad).is_err());
        let mut huge = b"FVAC\x01".to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_actions(&huge).is_err());
    }
}
