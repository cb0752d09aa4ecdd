//! Reading a vault: a file's content (its pieces from the tree, blocks fetched on four threads
//! and checked), the history of a name, and `check`, which verifies every record, node and
//! block a version uses.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::nodes::hex;
use crate::records::{child, Change, Entry};
use crate::tree::{Child, Node, NodeId};
use crate::vault::{Snapshot, Vault};
use crate::VaultError;

/// The bytes of a file read per walk of its tree.
const WINDOW: u64 = 16 << 20;
const FETCHERS: usize = 4;
/// Blocks asked for in one request.
const BATCH: usize = 16;

/// The bytes of block `b` that piece `p` names.
pub(crate) fn slice<'b>(b: &'b [u8], p: &crate::tree::Piece) -> Result<&'b [u8], VaultError> {
    let (a, z) = (p.offset as usize, p.offset as usize + p.len as usize);
    b.get(a..z).ok_or_else(|| VaultError::Damaged {
        id: format!("block {}", hex(&p.block)),
        why: format!("a piece names bytes {a}..{z} of a {}-byte block", b.len()),
    })
}

/// One version of one name, as `ferry vault log` shows it.
#[derive(Clone, Debug)]
pub struct Version {
    pub seq: u64,
    pub time_ns: i64,
    pub change: Change,
}

/// What `check` found.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub versions: u64,
    pub files: u64,
    pub nodes: u64,
    pub blocks: u64,
    /// Plaintext bytes of the blocks decrypted.
    pub bytes: u64,
    /// Everything wrong, one line each.
    pub problems: Vec<String>,
}

impl Vault {
    /// Writes the content under `root` to `out`; returns its size.
    pub fn read_content(
        &self,
        root: Option<Child>,
        out: &mut dyn Write,
    ) -> Result<u64, VaultError> {
        let Some(r) = root else {
            return Ok(0);
        };
        let mut nodes = self.nodes();
        let mut at = 0;
        while at < r.bytes {
            let end = (at + WINDOW).min(r.bytes);
            let pieces = self.tree(&mut nodes).read(Some(r), at, end)?;
            let mut ids: Vec<[u8; 32]> = pieces.iter().map(|p| p.block).collect();
            ids.sort_unstable();
            ids.dedup();
            let blocks = self.fetch_blocks(&ids)?;
            for p in &pieces {
                out.write_all(slice(&blocks[&p.block], p)?)
                    .map_err(|e| VaultError::Local(format!("writing: {e}")))?;
            }
            at = end;
        }
        Ok(r.bytes)
    }

    /// Blocks `ids`, fetched in batches on several threads and checked.
    pub(crate) fn fetch_blocks(
        &self,
        ids: &[[u8; 32]],
    ) -> Result<HashMap<[u8; 32], Vec<u8>>, VaultError> {
        let batches: Vec<&[[u8; 32]]> = ids.chunks(BATCH).collect();
        let next = AtomicUsize::new(0);
        let got = Mutex::new(HashMap::with_capacity(ids.len()));
        let failed = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..FETCHERS.min(batches.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= batches.len() || failed.lock().unwrap().is_some() {
                        return;
                    }
                    match self.fetch_block_batch(batches[i]) {
                        Ok(bs) => got
                            .lock()
                            .unwrap()
                            .extend(batches[i].iter().copied().zip(bs)),
                        Err(e) => {
                            failed.lock().unwrap().get_or_insert(e);
                        }
                    }
                });
            }
        });
        match failed.into_inner().unwrap() {
            Some(e) => Err(e),
            None => Ok(got.into_inner().unwrap()),
        }
    }

    /// Fetches every node of the trees under `roots` not cached yet, a level at a time and
    /// several per request, into the node cache: reads of those trees then ask the server
    /// for blocks only.
    pub fn prefetch_trees(&self, roots: &[Child]) -> Result<(), VaultError> {
        let nodes = self.nodes();
        let mut level: Vec<NodeId> = roots.iter().map(|c| c.node).collect();
        let mut seen = HashSet::new();
        while !level.is_empty() {
            level.retain(|id| seen.insert(*id));
            let mut next = vec![];
            for b in nodes.fetch_many(&level)? {
                if let Ok(Node::Internal(cs)) = Node::decode(&b) {
                    next.extend(cs.iter().map(|c| c.node));
                }
            }
            level = next;
        }
        Ok(())
    }

    /// The contents of several small files, their blocks fetched together.
    pub fn read_small(&self, roots: &[Option<Child>]) -> Result<Vec<Vec<u8>>, VaultError> {
        let mut nodes = self.nodes();
        let mut pieces = Vec::with_capacity(roots.len());
        for r in roots {
            pieces.push(match r {
                Some(r) => self.tree(&mut nodes).read(Some(*r), 0, r.bytes)?,
                None => vec![],
            });
        }
        let mut ids: Vec<[u8; 32]> = pieces.iter().flatten().map(|p| p.block).collect();
        ids.sort_unstable();
        ids.dedup();
        let blocks = self.fetch_blocks(&ids)?;
        pieces
            .iter()
            .map(|ps| {
                let mut out = vec![];
                for p in ps {
                    out.extend_from_slice(slice(&blocks[&p.block], p)?);
                }
                Ok(out)
            })
            .collect()
    }

    /// The entries of `snap` at `name` or under `name/` (all of them for `""`).
    pub fn select<'s>(snap: &'s Snapshot, name: &str) -> Vec<&'s Entry> {
        let name = name.trim_matches('/');
        if name.is_empty() {
            return snap.catalog.entries.values().collect();
        }
        let dir = format!("{name}/");
        let mut out: Vec<&Entry> = snap.catalog.entries.get(name).into_iter().collect();
        out.extend(
            snap.catalog
                .entries
                .range(dir.clone()..)
                .take_while(|(k, _)| k.starts_with(&dir))
                .map(|(_, e)| e),
        );
        out
    }

    /// Every version that changed `name` (or anything under it; everything for `""`), newest
    /// first.
    pub fn log(&self, name: &str) -> Result<Vec<Version>, VaultError> {
        let newest = self.latest()?.seq;
        let name = name.trim_matches('/');
        let dir = format!("{name}/");
        let mut out = vec![];
        let mut expect_parent: Option<[u8; 32]> = None;
        for seq in (1..=newest).rev() {
            let (c, hash) = self.read_head(seq)?;
            if let Some(p) = expect_parent {
                if p != hash {
                    return Err(VaultError::Damaged {
                        id: crate::vault::head_name(seq),
                        why: "the next version does not name it as its parent".into(),
                    });
                }
            }
            expect_parent = Some(c.parent);
            for ch in &c.changes {
                if name.is_empty() || ch.name == name || ch.name.starts_with(&dir) {
                    out.push(Version {
                        seq,
                        time_ns: c.time_ns,
                        change: ch.clone(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Verifies the chain of heads, and every node and block of the newest version (of every
    /// version with `all`); `progress` gets plaintext bytes as blocks are checked.
    pub fn check(&self, all: bool, progress: &dyn Fn(u64)) -> Result<CheckReport, VaultError> {
        let mut r = CheckReport::default();
        let heads = self.heads()?;
        let newest = heads.last().copied().unwrap_or(0);
        for seq in 1..=newest {
            if heads.binary_search(&seq).is_err() {
                r.problems.push(format!("version {seq} is missing"));
            }
        }
        let mut parent = [0u8; 32];
        let mut seqs = vec![];
        for &seq in &heads {
            match self.read_head(seq) {
                Ok((c, hash)) => {
                    if seq > 1 && c.parent != parent && heads.contains(&(seq - 1)) {
                        r.problems.push(format!(
                            "version {seq} does not name version {} as its parent",
                            seq - 1
                        ));
                    }
                    parent = hash;
                    seqs.push(seq);
                }
                Err(e) => r.problems.push(format!("version {seq}: {e}")),
            }
            r.versions += 1;
        }
        if let Err(e) = self.latest() {
            r.problems.push(e.to_string());
        }
        let chosen: Vec<u64> = match (all, seqs.last()) {
            (true, _) => seqs,
            (false, Some(&s)) => vec![s],
            (false, None) => vec![],
        };
        let mut seen_nodes = HashSet::new();
        let mut seen_blocks = HashSet::new();
        for seq in chosen {
            let snap = match self.snapshot(seq) {
                Ok(s) => s,
                Err(e) => {
                    r.problems.push(format!("version {seq}'s catalog: {e}"));
                    continue;
                }
            };
            let c = snap.commit.as_ref().expect("a version");
            let mut roots = vec![(
                "the catalog".to_string(),
                child(c.catalog_size, c.catalog_root),
            )];
            for e in snap.catalog.entries.values() {
                r.files += 1;
                roots.push((e.name.clone(), child(e.size, e.root)));
            }
            for (name, root) in roots {
                if let Err(e) =
                    self.check_tree(root, &mut seen_nodes, &mut seen_blocks, &mut r, progress)
                {
                    r.problems.push(format!("version {seq}, {name}: {e}"));
                }
            }
        }
        Ok(r)
    }

    fn check_tree(
        &self,
        root: Option<Child>,
        seen_nodes: &mut HashSet<NodeId>,
        seen_blocks: &mut HashSet<[u8; 32]>,
        r: &mut CheckReport,
        progress: &dyn Fn(u64),
    ) -> Result<(), VaultError> {
        let Some(root) = root else {
            return Ok(());
        };
        // Nodes are checked from the server, not the cache (which would hide damage), a
        // level at a time, several per request.
        let nodes = crate::nodes::Nodes::new(&self.store, None);
        let mut level = vec![root];
        let mut blocks = vec![];
        while !level.is_empty() {
            level.retain(|c| seen_nodes.insert(c.node));
            let ids: Vec<NodeId> = level.iter().map(|c| c.node).collect();
            let mut next = vec![];
            for (c, bytes) in level.iter().zip(nodes.fetch_many(&ids)?) {
                r.nodes += 1;
                let damaged = |why: String| VaultError::Damaged {
                    id: format!("node {}", hex(&c.node)),
                    why,
                };
                let node = Node::decode(&bytes).map_err(damaged)?;
                if node.bytes() != c.bytes {
                    return Err(damaged(format!(
                        "it holds {} bytes, its parent says {}",
                        node.bytes(),
                        c.bytes
                    )));
                }
                match node {
                    Node::Internal(cs) => next.extend(cs),
                    Node::Leaf(ps) => blocks.extend(
                        ps.iter()
                            .filter(|p| seen_blocks.insert(p.block))
                            .map(|p| p.block),
                    ),
                }
            }
            level = next;
        }
        for batch in blocks.chunks(64) {
            for (_, b) in self.fetch_blocks(batch)? {
                r.blocks += 1;
                r.bytes += b.len() as u64;
                progress(b.len() as u64);
            }
        }
        Ok(())
    }
}
