//! The tree against a plain byte vector: random inserts (at any byte offset), deletes and
//! reads; after each step the content, every count and id, the fill of every node and the
//! depth of every leaf are checked, and the nodes an edit writes stay O(log n).

use std::collections::HashMap;

use ferry_vault::tree::{BlockId, Child, MemNodes, Node, Piece, Tree};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// At a fraction of the size, a new block of this many bytes (a range of it).
    Insert(f64, u32, u32),
    Delete(f64, f64),
    Read(f64, f64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0.0..=1.0f64, 1u32..60, 0u32..10).prop_map(|(a, n, o)| Op::Insert(a, n, o)),
        2 => (0.0..=1.0f64, 0.0..0.3f64).prop_map(|(a, l)| Op::Delete(a, l)),
        1 => (0.0..=1.0f64, 0.0..1.0f64).prop_map(|(a, l)| Op::Read(a, l)),
    ]
}

/// The bytes the pieces name.
fn bytes(blocks: &HashMap<BlockId, Vec<u8>>, pieces: &[Piece]) -> Vec<u8> {
    let mut v = vec![];
    for p in pieces {
        let b = &blocks[&p.block];
        v.extend_from_slice(&b[p.offset as usize..(p.offset + p.len) as usize]);
    }
    v
}

/// Checks the subtree under `c`: its count, its ids, its fill; returns its leaves' depth.
fn check(t: &Tree<'_, MemNodes>, c: &Child, root: bool) -> usize {
    let n = t.load(&c.node).unwrap();
    let (len, bytes, depth) = match &n {
        Node::Leaf(ps) => (ps.len(), ps.iter().map(|p| p.len as u64).sum::<u64>(), 0),
        Node::Internal(cs) => {
            let depths: Vec<usize> = cs.iter().map(|x| check(t, x, false)).collect();
            assert!(
                depths.windows(2).all(|w| w[0] == w[1]),
                "leaves at one depth"
            );
            (cs.len(), cs.iter().map(|x| x.bytes).sum(), depths[0] + 1)
        }
    };
    assert_eq!(bytes, c.bytes, "a child's count is the bytes under it");
    assert!(len <= t.max);
    assert!(root || len >= t.max / 2, "a node under half full: {len}");
    if root {
        assert!(
            !matches!(n, Node::Internal(ref cs) if cs.len() == 1),
            "a root of one child"
        );
    }
    depth
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if std::env::var_os("FERRY_LONG").is_some() { 2000 } else { 200 }))]

    #[test]
    fn the_tree_is_the_byte_vector(ops in proptest::collection::vec(op(), 1..120), max in 4usize..9) {
        let mut store = MemNodes::default();
        let mut t = Tree::new(&mut store, max);
        let mut model: Vec<u8> = vec![];
        let mut blocks: HashMap<BlockId, Vec<u8>> = HashMap::new();
        let mut root: Option<Child> = None;
        for (step, op) in ops.into_iter().enumerate() {
            let size = model.len() as u64;
            let before = t.written;
            match op {
                Op::Insert(a, n, o) => {
                    let at = (a * size as f64) as u64;
                    // A block of o + n bytes; the piece is its last n.
                    let data: Vec<u8> = (0..o + n).map(|i| (step as u32 * 31 + i) as u8).collect();
                    let id = *blake3::hash(&[&step.to_le_bytes()[..], &data].concat()).as_bytes();
                    blocks.insert(id, data.clone());
                    let p = Piece { block: id, offset: o, len: n };
                    root = t.insert(root, at, &[p]).unwrap();
                    model.splice(at as usize..at as usize, data[o as usize..].iter().copied());
                }
                Op::Delete(a, l) => {
                    let start = (a * size as f64) as u64;
                    let end = (start + (l * size as f64) as u64).min(size);
                    root = t.delete(root, start, end).unwrap();
                    model.drain(start as usize..end as usize);
                }
                Op::Read(a, l) => {
                    let start = (a * size as f64) as u64;
                    let end = (start + (l * size as f64) as u64).min(size);
                    let got = bytes(&blocks, &t.read(root, start, end).unwrap());
                    prop_assert_eq!(&got[..], &model[start as usize..end as usize]);
                }
            }
            // The whole content, and the tree's invariants.
            let all = t.read(root, 0, model.len() as u64).unwrap();
            prop_assert_eq!(bytes(&blocks, &all), model.clone());
            match &root {
                None => prop_assert!(model.is_empty()),
                Some(r) => {
                    let depth = check(&t, r, true);
                    // An edit writes the path to it, with a split or a merge at each level.
                    prop_assert!(t.written - before <= 4 * (depth + 2), "{} nodes for depth {depth}", t.written - before);
                }
            }
        }
    }
}

#[test]
fn out_of_range_edits_are_refused() {
    let mut store = MemNodes::default();
    let mut t = Tree::new(&mut store, 4);
    let p = Piece {
        block: [1; 32],
        offset: 0,
        len: 10,
    };
    assert!(t.insert(None, 1, &[p]).is_err());
    let r = t.insert(None, 0, &[p]).unwrap();
    assert!(t.insert(r, 11, &[p]).is_err());
    assert!(t.delete(r, 5, 11).is_err());
    assert!(t.delete(r, 6, 5).is_err());
    assert!(t.read(r, 0, 11).is_err());
    assert!(t.insert(r, 0, &[Piece { len: 0, ..p }]).is_err());
    assert_eq!(t.delete(r, 0, 10).unwrap(), None);
}

#[test]
fn a_damaged_or_missing_node_is_named() {
    let mut store = MemNodes::default();
    let pieces: Vec<Piece> = (0..40u8)
        .map(|i| Piece {
            block: [i; 32],
            offset: 0,
            len: 3,
        })
        .collect();
    let r = Tree::new(&mut store, 4).build(pieces).unwrap();
    let victim = *store.0.keys().find(|k| **k != r.node).unwrap();
    store.0.get_mut(&victim).unwrap()[5] ^= 1;
    let t = Tree::new(&mut store, 4);
    assert!(matches!(
        t.read(Some(r), 0, 120),
        Err(ferry_vault::VaultError::Damaged { .. })
    ));
    store.0.remove(&victim);
    let t = Tree::new(&mut store, 4);
    assert!(matches!(
        t.read(Some(r), 0, 120),
        Err(ferry_vault::VaultError::Missing(_))
    ));
}

/// Node v1, byte for byte.
#[test]
fn node_golden_bytes() {
    let leaf = Node::Leaf(vec![Piece {
        block: [0xab; 32],
        offset: 7,
        len: 300,
    }]);
    let b = leaf.encode();
    assert_eq!(&b[..4], &[1, 1, 1, 0]);
    assert_eq!(&b[4..36], &[0xab; 32]);
    assert_eq!(&b[36..], &[7, 0, 0, 0, 44, 1, 0, 0]);
    assert_eq!(Node::decode(&b).unwrap(), leaf);
    let inner = Node::Internal(vec![Child {
        bytes: 0x0102,
        node: [9; 32],
    }]);
    let b = inner.encode();
    assert_eq!(&b[..12], &[2, 1, 1, 0, 2, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&b[12..], &[9; 32]);
    assert_eq!(Node::decode(&b).unwrap(), inner);
    assert_eq!(
        blake3::hash(&b).to_hex().to_string(),
        blake3::hash(&[&[2u8, 1, 1, 0, 2, 1, 0, 0, 0, 0, 0, 0][..], &[9; 32]].concat())
            .to_hex()
            .to_string()
    );
    // Every cut and bad header is refused.
    for cut in 0..b.len() {
        assert!(Node::decode(&b[..cut]).is_err());
    }
    for bad in [[0u8, 1], [3, 1], [2, 2]] {
        let mut x = b.clone();
        x[..2].copy_from_slice(&bad);
        assert!(Node::decode(&x).is_err());
    }
    let mut empty_child = b.clone();
    empty_child[4..12].fill(0);
    assert!(Node::decode(&empty_child).is_err());
}
