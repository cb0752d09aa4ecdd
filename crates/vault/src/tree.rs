//! The Merkle B+-tree over one file's blocks (the OceanStore paper's §4).
//!
//! Leaves hold pieces: a range (offset, length) of a block. Internal nodes hold, for each
//! child, the number of bytes under it and the child's id, which is the hash of its bytes: a
//! relative offset, so an insert or a delete in the middle of a file rewrites only the nodes
//! on the path to it (and their splits or merges), never the offsets after it; and the root's
//! id names the whole file's content, as a Merkle root. Pieces are the paper's §4.3 extension:
//! a byte inserted or deleted at any offset splits a piece, never a block.
//!
//! Nodes are immutable: every operation writes new nodes to a [`NodeStore`] (which names them:
//! by the hash of their bytes here, by a keyed hash of their ciphertext in the vault) and
//! returns the new root; the old version's nodes stay as they were, so an update is the set of
//! new nodes plus the new root, predicated on the old root.
//!
//! Node v1 (docs/formats.md, "Vault tree node v1"), integers little-endian:
//!
//! | bytes | what |
//! |---|---|
//! | 1 | kind: 1 leaf, 2 internal |
//! | 1 | version, 1 |
//! | 2 | n, entries (1 to 4096) |
//! | 40 × n | leaf: block id (32), offset in the block u32, length u32 (> 0); internal: bytes under the child u64 (> 0), child id (32) |

use crate::VaultError;

pub type NodeId = [u8; 32];
pub type BlockId = [u8; 32];

/// Bytes `offset..offset + len` of block `block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Piece {
    pub block: BlockId,
    pub offset: u32,
    pub len: u32,
}

/// A child of an internal node (or the root): the bytes under it and its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Child {
    pub bytes: u64,
    pub node: NodeId,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Leaf(Vec<Piece>),
    Internal(Vec<Child>),
}

const LEAF: u8 = 1;
const INTERNAL: u8 = 2;
const VERSION: u8 = 1;
const ENTRY: usize = 40;
/// The most entries a node may decode to.
pub const MAX_ENTRIES: usize = 4096;

impl Node {
    fn len(&self) -> usize {
        match self {
            Node::Leaf(p) => p.len(),
            Node::Internal(c) => c.len(),
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            Node::Leaf(p) => p.iter().map(|p| p.len as u64).sum(),
            Node::Internal(c) => c.iter().map(|c| c.bytes).sum(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + ENTRY * self.len());
        v.push(match self {
            Node::Leaf(_) => LEAF,
            Node::Internal(_) => INTERNAL,
        });
        v.push(VERSION);
        v.extend_from_slice(&(self.len() as u16).to_le_bytes());
        match self {
            Node::Leaf(ps) => {
                for p in ps {
                    v.extend_from_slice(&p.block);
                    v.extend_from_slice(&p.offset.to_le_bytes());
                    v.extend_from_slice(&p.len.to_le_bytes());
                }
            }
            Node::Internal(cs) => {
                for c in cs {
                    v.extend_from_slice(&c.bytes.to_le_bytes());
                    v.extend_from_slice(&c.node);
                }
            }
        }
        v
    }

    /// Decodes a node, every count checked against the bytes before anything is allocated.
    pub fn decode(b: &[u8]) -> Result<Node, String> {
        if b.len() < 4 {
            return Err("shorter than a node header".into());
        }
        if b[1] != VERSION {
            return Err(format!("node version {} (this Ferry reads 1)", b[1]));
        }
        let n = u16::from_le_bytes([b[2], b[3]]) as usize;
        if n == 0 || n > MAX_ENTRIES || b.len() != 4 + n * ENTRY {
            return Err(format!("{n} entries do not fit {} bytes", b.len()));
        }
        let entries = b[4..].chunks_exact(ENTRY);
        let u32_at = |e: &[u8], i: usize| u32::from_le_bytes(e[i..i + 4].try_into().unwrap());
        match b[0] {
            LEAF => entries
                .map(|e| {
                    let p = Piece {
                        block: e[..32].try_into().unwrap(),
                        offset: u32_at(e, 32),
                        len: u32_at(e, 36),
                    };
                    match p.len > 0 && p.offset.checked_add(p.len).is_some() {
                        true => Ok(p),
                        false => Err("an empty or overflowing piece".to_string()),
                    }
                })
                .collect::<Result<_, _>>()
                .map(Node::Leaf),
            INTERNAL => entries
                .map(|e| {
                    let c = Child {
                        bytes: u64::from_le_bytes(e[..8].try_into().unwrap()),
                        node: e[8..].try_into().unwrap(),
                    };
                    match c.bytes > 0 {
                        true => Ok(c),
                        false => Err("a child with no bytes".to_string()),
                    }
                })
                .collect::<Result<_, _>>()
                .map(Node::Internal),
            k => Err(format!("unknown node kind {k}")),
        }
    }
}

/// Where nodes are kept, and how they are named.
pub trait NodeStore {
    /// Stores a node's bytes; returns its id.
    fn put(&mut self, bytes: Vec<u8>) -> NodeId;
    /// The node's bytes, checked against its id; `None` when absent.
    fn get(&self, id: &NodeId) -> Result<Option<Vec<u8>>, VaultError>;
}

/// Nodes in memory, named by the BLAKE3 of their bytes (tests, and the model for others).
#[derive(Default)]
pub struct MemNodes(pub std::collections::HashMap<NodeId, Vec<u8>>);

impl NodeStore for MemNodes {
    fn put(&mut self, bytes: Vec<u8>) -> NodeId {
        let id = *blake3::hash(&bytes).as_bytes();
        self.0.insert(id, bytes);
        id
    }

    fn get(&self, id: &NodeId) -> Result<Option<Vec<u8>>, VaultError> {
        match self.0.get(id) {
            Some(b) if blake3::hash(b).as_bytes() == id => Ok(Some(b.clone())),
            Some(_) => Err(VaultError::Damaged {
                id: hex(id),
                why: "its bytes do not hash to its id".into(),
            }),
            None => Ok(None),
        }
    }
}

fn hex(id: &[u8; 32]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Copy-on-write operations over trees in a store. `max` entries per node (at least 4); every
/// node but the root holds at least `max / 2`.
pub struct Tree<'a, S: NodeStore> {
    pub store: &'a mut S,
    pub max: usize,
    /// Nodes written so far (what an update uploads).
    pub written: usize,
}

impl<'a, S: NodeStore> Tree<'a, S> {
    pub fn new(store: &'a mut S, max: usize) -> Self {
        assert!((4..=MAX_ENTRIES).contains(&max));
        Tree {
            store,
            max,
            written: 0,
        }
    }

    pub fn load(&self, id: &NodeId) -> Result<Node, VaultError> {
        let b = self
            .store
            .get(id)?
            .ok_or_else(|| VaultError::Missing(hex(id)))?;
        Node::decode(&b).map_err(|why| VaultError::Damaged { id: hex(id), why })
    }

    fn save(&mut self, n: &Node) -> Child {
        self.written += 1;
        Child {
            bytes: n.bytes(),
            node: self.store.put(n.encode()),
        }
    }

    /// Nodes of `entries` (one level), split evenly so that each holds at most `max`.
    fn pack<T: Clone>(&mut self, entries: Vec<T>, make: fn(Vec<T>) -> Node) -> Vec<Child> {
        if entries.is_empty() {
            return vec![];
        }
        let k = entries.len().div_ceil(self.max);
        let (q, r) = (entries.len() / k, entries.len() % k);
        let mut out = Vec::with_capacity(k);
        let mut at = 0;
        for i in 0..k {
            let n = q + usize::from(i < r);
            out.push(self.save(&make(entries[at..at + n].to_vec())));
            at += n;
        }
        out
    }

    /// The root over `children` (one level): new levels until one node is left.
    fn root_over(&mut self, mut children: Vec<Child>) -> Option<Child> {
        while children.len() > 1 {
            children = self.pack(children, Node::Internal);
        }
        children.pop()
    }

    /// A tree holding `pieces`, in order.
    pub fn build(&mut self, pieces: Vec<Piece>) -> Option<Child> {
        let leaves = self.pack(pieces, Node::Leaf);
        self.root_over(leaves)
    }

    /// The pieces covering bytes `start..end` (clipped to them), in order.
    pub fn read(
        &self,
        root: Option<Child>,
        start: u64,
        end: u64,
    ) -> Result<Vec<Piece>, VaultError> {
        let mut out = vec![];
        if let Some(r) = root {
            check_range(start, end, r.bytes)?;
            self.read_in(&r.node, start, end, &mut out)?;
        }
        Ok(out)
    }

    fn read_in(
        &self,
        id: &NodeId,
        start: u64,
        end: u64,
        out: &mut Vec<Piece>,
    ) -> Result<(), VaultError> {
        let mut at = 0u64;
        match self.load(id)? {
            Node::Leaf(ps) => {
                for p in ps {
                    let (a, b) = (at, at + p.len as u64);
                    at = b;
                    if b <= start || a >= end {
                        continue;
                    }
                    let from = start.max(a) - a;
                    let to = end.min(b) - a;
                    out.push(Piece {
                        block: p.block,
                        offset: p.offset + from as u32,
                        len: (to - from) as u32,
                    });
                }
            }
            Node::Internal(cs) => {
                for c in cs {
                    let (a, b) = (at, at + c.bytes);
                    at = b;
                    if b > start && a < end {
                        self.read_in(&c.node, start.max(a) - a, end.min(b) - a, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Inserts `pieces` at byte `at` (0 ..= the file's size); returns the new root.
    pub fn insert(
        &mut self,
        root: Option<Child>,
        at: u64,
        pieces: &[Piece],
    ) -> Result<Option<Child>, VaultError> {
        if pieces.iter().any(|p| p.len == 0) {
            return Err(VaultError::BadRange("an empty piece".into()));
        }
        let Some(r) = root else {
            if at != 0 {
                return Err(VaultError::BadRange(format!(
                    "insert at {at} into an empty file"
                )));
            }
            return Ok(self.build(pieces.to_vec()));
        };
        check_range(at, at, r.bytes)?;
        if pieces.is_empty() {
            return Ok(Some(r));
        }
        let children = self.insert_in(&r.node, at, pieces)?;
        Ok(self.root_over(children))
    }

    fn insert_in(
        &mut self,
        id: &NodeId,
        at: u64,
        pieces: &[Piece],
    ) -> Result<Vec<Child>, VaultError> {
        match self.load(id)? {
            Node::Leaf(mut ps) => {
                // The index to insert at, splitting the piece `at` falls inside (§4.3).
                let mut pos = 0u64;
                let mut i = 0;
                while i < ps.len() && pos + ps[i].len as u64 <= at {
                    pos += ps[i].len as u64;
                    i += 1;
                }
                if i < ps.len() && pos < at {
                    let p = ps[i];
                    let k = (at - pos) as u32;
                    ps[i].len = k;
                    ps.insert(
                        i + 1,
                        Piece {
                            offset: p.offset + k,
                            len: p.len - k,
                            ..p
                        },
                    );
                    i += 1;
                }
                ps.splice(i..i, pieces.iter().copied());
                Ok(self.pack(ps, Node::Leaf))
            }
            Node::Internal(mut cs) => {
                let mut pos = 0u64;
                let mut i = 0;
                // The first child whose range holds `at` (its end included: an append).
                while i + 1 < cs.len() && pos + cs[i].bytes < at {
                    pos += cs[i].bytes;
                    i += 1;
                }
                let new = self.insert_in(&cs[i].node, at - pos, pieces)?;
                cs.splice(i..=i, new);
                Ok(self.pack(cs, Node::Internal))
            }
        }
    }

    /// Deletes bytes `start..end`; returns the new root (`None`: the file is empty).
    pub fn delete(
        &mut self,
        root: Option<Child>,
        start: u64,
        end: u64,
    ) -> Result<Option<Child>, VaultError> {
        let Some(r) = root else {
            return match (start, end) {
                (0, 0) => Ok(None),
                _ => Err(VaultError::BadRange(format!(
                    "delete {start}..{end} of an empty file"
                ))),
            };
        };
        check_range(start, end, r.bytes)?;
        if start == end {
            return Ok(Some(r));
        }
        let left = self.delete_in(&r.node, start, end)?;
        let mut root = self.root_over(left);
        // A root with one child is that child.
        while let Some(r) = root {
            match self.load(&r.node)? {
                Node::Internal(cs) if cs.len() == 1 => root = Some(cs[0]),
                _ => break,
            }
        }
        Ok(root)
    }

    fn delete_in(&mut self, id: &NodeId, start: u64, end: u64) -> Result<Vec<Child>, VaultError> {
        let mut at = 0u64;
        match self.load(id)? {
            Node::Leaf(ps) => {
                let mut kept = Vec::with_capacity(ps.len() + 1);
                for p in ps {
                    let (a, b) = (at, at + p.len as u64);
                    at = b;
                    if b <= start || a >= end {
                        kept.push(p);
                        continue;
                    }
                    if a < start {
                        kept.push(Piece {
                            len: (start - a) as u32,
                            ..p
                        });
                    }
                    if b > end {
                        let skip = (end - a) as u32;
                        kept.push(Piece {
                            offset: p.offset + skip,
                            len: p.len - skip,
                            ..p
                        });
                    }
                }
                Ok(self.pack(kept, Node::Leaf))
            }
            Node::Internal(cs) => {
                let mut out = Vec::with_capacity(cs.len());
                for c in cs {
                    let (a, b) = (at, at + c.bytes);
                    at = b;
                    if b <= start || a >= end {
                        out.push(c);
                    } else {
                        out.extend(self.delete_in(&c.node, start.max(a) - a, end.min(b) - a)?);
                    }
                }
                let out = self.rebalance(out)?;
                Ok(self.pack(out, Node::Internal))
            }
        }
    }

    /// Merges each child under `max / 2` entries with a neighbour (and splits the pair evenly
    /// again when together they are over `max`).
    fn rebalance(&mut self, mut cs: Vec<Child>) -> Result<Vec<Child>, VaultError> {
        let min = self.max / 2;
        let mut i = 0;
        while cs.len() > 1 && i < cs.len() {
            let n = self.load(&cs[i].node)?;
            if n.len() >= min {
                i += 1;
                continue;
            }
            let j = if i + 1 < cs.len() { i + 1 } else { i - 1 };
            let (a, b) = (i.min(j), i.max(j));
            let merged = match (self.load(&cs[a].node)?, self.load(&cs[b].node)?) {
                (Node::Leaf(mut x), Node::Leaf(y)) => {
                    x.extend(y);
                    self.pack(x, Node::Leaf)
                }
                (Node::Internal(mut x), Node::Internal(y)) => {
                    // An underfull node's children may be underfull too (a subtree thinned to
                    // one path): rebalanced among their new siblings.
                    x.extend(y);
                    let x = self.rebalance(x)?;
                    self.pack(x, Node::Internal)
                }
                _ => {
                    return Err(VaultError::Damaged {
                        id: hex(&cs[a].node),
                        why: "siblings of different kinds".into(),
                    })
                }
            };
            cs.splice(a..=b, merged);
            i = a;
        }
        Ok(cs)
    }
}

fn check_range(start: u64, end: u64, size: u64) -> Result<(), VaultError> {
    if start <= end && end <= size {
        Ok(())
    } else {
        Err(VaultError::BadRange(format!(
            "bytes {start}..{end} of a file of {size}"
        )))
    }
}
