//! The file system as a tree of inodes, the operations that change it, and the states a power
//! cut can leave after any prefix of them.
//!
//! The persistence model is the one journaling file systems give, taken at its weakest:
//! - names (create, link, unlink, rename, chmod) reach the disk **in order**: a crash keeps a
//!   prefix of them; a directory's fsync makes every earlier change of names durable, and so
//!   does a file's fsync for its own mode;
//! - a file's bytes (write, truncate) are durable only once that file is fsynced; until then any
//!   subset of them may have reached the disk, and a write may be torn at a 512-byte sector;
//! - nothing is durable because of another file's fsync, and renames do not carry data.

use std::collections::{BTreeMap, HashMap};

/// The root directory's inode.
pub const ROOT: u64 = 1;

/// A sector: the unit a torn write keeps.
pub const SECTOR: u64 = 512;

/// What a create makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewNode {
    File { mode: u32 },
    Dir { mode: u32 },
    Symlink { target: Vec<u8> },
}

/// One operation, as the file system saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Create {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
        node: NewNode,
    },
    Link {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
    },
    /// unlink or rmdir.
    Remove {
        parent: u64,
        name: Vec<u8>,
    },
    /// Replaces what `to_name` named.
    Rename {
        parent: u64,
        name: Vec<u8>,
        to_parent: u64,
        to_name: Vec<u8>,
    },
    Chmod {
        ino: u64,
        mode: u32,
    },
    Write {
        ino: u64,
        off: u64,
        data: Vec<u8>,
    },
    SetLen {
        ino: u64,
        len: u64,
    },
    /// fsync or fdatasync of a file.
    Fsync {
        ino: u64,
    },
    /// fsync of a directory.
    FsyncDir {
        ino: u64,
    },
    /// The scenario's own note: what it has acknowledged by now.
    Mark(String),
}

impl Op {
    /// A change of names or modes (ordered on the disk).
    pub fn is_meta(&self) -> bool {
        matches!(
            self,
            Op::Create { .. }
                | Op::Link { .. }
                | Op::Remove { .. }
                | Op::Rename { .. }
                | Op::Chmod { .. }
        )
    }

    /// A change of a file's bytes: the file's inode.
    pub fn data_ino(&self) -> Option<u64> {
        match self {
            Op::Write { ino, .. } | Op::SetLen { ino, .. } => Some(*ino),
            _ => None,
        }
    }

    /// A moment worth crashing at: a sync, or a change of names a commit hangs on.
    pub fn is_crash_point(&self) -> bool {
        matches!(
            self,
            Op::Fsync { .. }
                | Op::FsyncDir { .. }
                | Op::Rename { .. }
                | Op::Link { .. }
                | Op::Remove { .. }
        )
    }
}

/// A node of the tree.
#[derive(Clone, Debug)]
pub enum Node {
    File {
        data: Vec<u8>,
        mode: u32,
    },
    Dir {
        entries: BTreeMap<Vec<u8>, u64>,
        mode: u32,
    },
    Symlink {
        target: Vec<u8>,
    },
}

/// Why an operation cannot apply (the errno the live file system answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    NotFound,
    NotDir,
    IsDir,
    Exists,
    NotEmpty,
}

/// Every inode ever made (an unlinked one stays: open handles may still use it) and the names.
#[derive(Clone, Debug)]
pub struct Tree {
    pub nodes: HashMap<u64, Node>,
}

impl Default for Tree {
    fn default() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node::Dir {
                entries: BTreeMap::new(),
                mode: 0o755,
            },
        );
        Tree { nodes }
    }
}

impl Tree {
    /// How many names inode `ino` has (hard links).
    pub fn links(&self, ino: u64) -> u32 {
        let names = self.nodes.values().map(|n| match n {
            Node::Dir { entries, .. } => entries.values().filter(|&&i| i == ino).count(),
            _ => 0,
        });
        names.sum::<usize>() as u32
    }

    pub fn entries(&self, dir: u64) -> Result<&BTreeMap<Vec<u8>, u64>, Refused> {
        match self.nodes.get(&dir) {
            Some(Node::Dir { entries, .. }) => Ok(entries),
            Some(_) => Err(Refused::NotDir),
            None => Err(Refused::NotFound),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<Vec<u8>, u64>, Refused> {
        match self.nodes.get_mut(&dir) {
            Some(Node::Dir { entries, .. }) => Ok(entries),
            Some(_) => Err(Refused::NotDir),
            None => Err(Refused::NotFound),
        }
    }

    pub fn lookup(&self, dir: u64, name: &[u8]) -> Result<u64, Refused> {
        self.entries(dir)?
            .get(name)
            .copied()
            .ok_or(Refused::NotFound)
    }

    fn is_dir(&self, ino: u64) -> bool {
        matches!(self.nodes.get(&ino), Some(Node::Dir { .. }))
    }

    /// Applies one operation as the live file system does: refused (and unchanged) when it
    /// cannot be done. Syncs and marks change nothing.
    pub fn apply(&mut self, op: &Op) -> Result<(), Refused> {
        match op {
            Op::Create {
                parent,
                name,
                ino,
                node,
            } => {
                if self.entries(*parent)?.contains_key(name) {
                    return Err(Refused::Exists);
                }
                let node = match node {
                    NewNode::File { mode } => Node::File {
                        data: vec![],
                        mode: *mode,
                    },
                    NewNode::Dir { mode } => Node::Dir {
                        entries: BTreeMap::new(),
                        mode: *mode,
                    },
                    NewNode::Symlink { target } => Node::Symlink {
                        target: target.clone(),
                    },
                };
                self.nodes.insert(*ino, node);
                self.entries_mut(*parent)?.insert(name.clone(), *ino);
            }
            Op::Link { parent, name, ino } => {
                if !self.nodes.contains_key(ino) {
                    return Err(Refused::NotFound);
                }
                if self.entries(*parent)?.contains_key(name) {
                    return Err(Refused::Exists);
                }
                self.entries_mut(*parent)?.insert(name.clone(), *ino);
            }
            Op::Remove { parent, name } => {
                let ino = self.lookup(*parent, name)?;
                if let Ok(e) = self.entries(ino) {
                    if !e.is_empty() {
                        return Err(Refused::NotEmpty);
                    }
                }
                self.entries_mut(*parent)?.remove(name);
            }
            Op::Rename {
                parent,
                name,
                to_parent,
                to_name,
            } => {
                let ino = self.lookup(*parent, name)?;
                self.entries(*to_parent)?;
                if let Ok(old) = self.lookup(*to_parent, to_name) {
                    if old == ino {
                        return Ok(());
                    }
                    match (self.is_dir(ino), self.entries(old)) {
                        (true, Ok(e)) if !e.is_empty() => return Err(Refused::NotEmpty),
                        (true, Err(_)) => return Err(Refused::NotDir),
                        (false, Ok(_)) => return Err(Refused::IsDir),
                        _ => {}
                    }
                }
                self.entries_mut(*parent)?.remove(name);
                self.entries_mut(*to_parent)?.insert(to_name.clone(), ino);
            }
            Op::Chmod { ino, mode: m } => match self.nodes.get_mut(ino) {
                Some(Node::File { mode, .. } | Node::Dir { mode, .. }) => *mode = *m,
                Some(Node::Symlink { .. }) => {}
                None => return Err(Refused::NotFound),
            },
            Op::Write { ino, off, data: d } => match self.nodes.get_mut(ino) {
                Some(Node::File { data, .. }) => {
                    let (off, end) = (*off as usize, *off as usize + d.len());
                    if data.len() < end {
                        data.resize(end, 0);
                    }
                    data[off..end].copy_from_slice(d);
                }
                Some(_) => return Err(Refused::IsDir),
                None => return Err(Refused::NotFound),
            },
            Op::SetLen { ino, len } => match self.nodes.get_mut(ino) {
                Some(Node::File { data, .. }) => data.resize(*len as usize, 0),
                Some(_) => return Err(Refused::IsDir),
                None => return Err(Refused::NotFound),
            },
            Op::Fsync { .. } | Op::FsyncDir { .. } | Op::Mark(_) => {}
        }
        Ok(())
    }
}

/// A small deterministic generator (splitmix64): crash states are reproducible from a seed.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn chance(&mut self, one_in: u64) -> bool {
        self.next_u64().is_multiple_of(one_in)
    }
}

/// How much of what was not yet durable a crash state keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Only what was made durable.
    Least,
    /// Everything that happened.
    All,
    /// A random prefix of the names, a random subset of the bytes, torn writes.
    Random(u64),
}

/// What must survive a crash after `ops[..end]`: the length of the durable prefix of the
/// changes of names (counted in changes of names), and which byte changes are durable.
struct Durable {
    meta_min: usize,
    data: Vec<bool>,
}

fn durable(ops: &[Op]) -> Durable {
    let mut meta_min = 0;
    let mut metas = 0;
    // The last change of names that touches each directory (or mode), by count of changes.
    let mut last_in: HashMap<u64, usize> = HashMap::new();
    // Byte changes not yet synced, by inode.
    let mut pending: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut data = vec![false; ops.len()];
    for (i, op) in ops.iter().enumerate() {
        if op.is_meta() {
            metas += 1;
            for dir in touched(op) {
                last_in.insert(dir, metas);
            }
        }
        if let Some(ino) = op.data_ino() {
            pending.entry(ino).or_default().push(i);
        }
        match op {
            Op::FsyncDir { ino } | Op::Fsync { ino } => {
                meta_min = meta_min.max(last_in.get(ino).copied().unwrap_or(0));
                if let Op::Fsync { ino } = op {
                    for j in pending.remove(ino).unwrap_or_default() {
                        data[j] = true;
                    }
                }
            }
            _ => {}
        }
    }
    Durable { meta_min, data }
}

/// The directories (and, for a chmod, the inode) whose fsync makes a change durable.
fn touched(op: &Op) -> Vec<u64> {
    match op {
        Op::Create { parent, .. } | Op::Link { parent, .. } | Op::Remove { parent, .. } => {
            vec![*parent]
        }
        Op::Rename {
            parent, to_parent, ..
        } => vec![*parent, *to_parent],
        Op::Chmod { ino, .. } => vec![*ino],
        _ => vec![],
    }
}

/// The tree a crash after `ops[..end]` leaves, keeping what `keep` says of what was not durable.
pub fn crash_state(ops: &[Op], keep: Keep) -> Tree {
    let d = durable(ops);
    let metas = ops.iter().filter(|o| o.is_meta()).count();
    let mut rng = Rng(match keep {
        Keep::Random(seed) => seed,
        _ => 0,
    });
    let meta_keep = match keep {
        Keep::Least => d.meta_min,
        Keep::All => metas,
        Keep::Random(_) => rng.range(d.meta_min as u64, metas as u64) as usize,
    };
    let mut tree = Tree::default();
    let mut seen_meta = 0;
    for (i, op) in ops.iter().enumerate() {
        if op.is_meta() {
            seen_meta += 1;
            if seen_meta <= meta_keep {
                // Refused here only when the live system refused it too.
                let _ = tree.apply(op);
            }
            continue;
        }
        if op.data_ino().is_none() {
            continue;
        }
        let kept = match keep {
            _ if d.data[i] => Some(op.clone()),
            Keep::Least => None,
            Keep::All => Some(op.clone()),
            Keep::Random(_) => match rng.next_u64() % 4 {
                0 => None,
                1 => tear(op, &mut rng),
                _ => Some(op.clone()),
            },
        };
        if let Some(op) = kept {
            let _ = tree.apply(&op);
        }
    }
    tree
}

/// A write cut at a sector boundary (what reached the disk of a write in flight).
fn tear(op: &Op, rng: &mut Rng) -> Option<Op> {
    let Op::Write { ino, off, data } = op else {
        return Some(op.clone());
    };
    let end = off + data.len() as u64;
    let first = (off / SECTOR + 1) * SECTOR;
    if first >= end {
        return None;
    }
    let cut = rng.range(first / SECTOR, (end - 1) / SECTOR) * SECTOR;
    Some(Op::Write {
        ino: *ino,
        off: *off,
        data: data[..(cut - off) as usize].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(parent: u64, name: &str, ino: u64) -> Op {
        Op::Create {
            parent,
            name: name.into(),
            ino,
            node: NewNode::File { mode: 0o644 },
        }
    }

    fn write(ino: u64, off: u64, data: &[u8]) -> Op {
        Op::Write {
            ino,
            off,
            data: data.to_vec(),
        }
    }

    fn file(t: &Tree, name: &str) -> Option<Vec<u8>> {
        let ino = t.lookup(ROOT, name.as_bytes()).ok()?;
        match &t.nodes[&ino] {
            Node::File { data, .. } => Some(data.clone()),
            _ => None,
        }
    }

    /// The write-to-temporary, fsync, rename, fsync-directory commit: durable only at the end,
    /// and never a torn or empty file at the name.
    #[test]
    fn a_synced_rename_survives_and_an_unsynced_one_may_not() {
        let ops = vec![
            create(ROOT, "tmp", 2),
            write(2, 0, b"new content"),
            Op::Fsync { ino: 2 },
            Op::Rename {
                parent: ROOT,
                name: "tmp".into(),
                to_parent: ROOT,
                to_name: "f".into(),
            },
            Op::FsyncDir { ino: ROOT },
        ];
        assert_eq!(
            file(&crash_state(&ops, Keep::Least), "f"),
            Some(b"new content".to_vec())
        );
        // Before the directory's fsync the rename may be lost, but the data never is.
        let t = crash_state(&ops[..4], Keep::Least);
        assert_eq!(file(&t, "f"), None);
        let t = crash_state(&ops[..4], Keep::All);
        assert_eq!(file(&t, "f"), Some(b"new content".to_vec()));
        // Without the file's fsync, the renamed file may be empty (the classic lost data).
        let unsynced = [&ops[..2], &ops[3..]].concat();
        assert_eq!(
            file(&crash_state(&unsynced, Keep::Least), "f"),
            Some(vec![])
        );
    }

    #[test]
    fn names_reach_the_disk_in_order() {
        let ops = vec![
            create(ROOT, "a", 2),
            create(ROOT, "b", 3),
            create(ROOT, "c", 4),
        ];
        for seed in 0..50 {
            let t = crash_state(&ops, Keep::Random(seed));
            let names: Vec<_> = t.entries(ROOT).unwrap().keys().cloned().collect();
            let want: Vec<Vec<u8>> = ["a", "b", "c"][..names.len()]
                .iter()
                .map(|s| s.as_bytes().to_vec())
                .collect();
            assert_eq!(names, want);
        }
    }

    #[test]
    fn torn_writes_keep_whole_sectors_of_the_start() {
        let data = vec![7u8; 3000];
        let ops = vec![create(ROOT, "f", 2), write(2, 100, &data)];
        let mut lens = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let t = crash_state(&ops, Keep::Random(seed));
            if let Some(d) = file(&t, "f") {
                assert!(
                    d.is_empty() || d.len() == 3100 || d.len() % 512 == 0,
                    "{}",
                    d.len()
                );
                lens.insert(d.len());
            }
        }
        assert!(
            lens.contains(&0) && lens.contains(&3100) && lens.contains(&1024),
            "{lens:?}"
        );
    }

    #[test]
    fn a_directory_fsync_makes_every_earlier_name_durable() {
        let ops = vec![
            Op::Create {
                parent: ROOT,
                name: "d".into(),
                ino: 2,
                node: NewNode::Dir { mode: 0o755 },
            },
            create(2, "x", 3),
            Op::FsyncDir { ino: 2 },
        ];
        let t = crash_state(&ops, Keep::Least);
        assert_eq!(t.lookup(t.lookup(ROOT, b"d").unwrap(), b"x"), Ok(3));
    }
}
