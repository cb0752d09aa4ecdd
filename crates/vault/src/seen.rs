//! What this client last stored of each local file (git's index, restic's parent snapshot):
//! the file's device, inode, size, mtime and ctime when it was read, and the root it became.
//! A put reads a file again unless all of them still hold and the vault's version of the name
//! is still that root. Size and mtime alone are not enough: unpacked archives give every
//! file the same mtime, and a file rewritten within one clock tick keeps its mtime; the
//! ctime cannot be set by a program, and a different inode is a different file.
//!
//! Kept next to the node cache, one file per vault: magic `FVSN`, version 1, the number of
//! entries (u32), then per entry: name (u16 length, bytes), dev, ino, size (u64 each), mtime
//! and ctime (i64 ns), root (32; zeros for none). A damaged file is ignored (everything is
//! read again).

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::records::Catalog;
use crate::tree::NodeId;
use crate::VaultError;

/// A file's identity and times when it was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Stat {
    pub fn of(m: &fs::Metadata) -> Stat {
        Stat {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        }
    }
}

/// The index, as loaded from (and saved to) its file.
#[derive(Debug, Default)]
pub struct Seen {
    path: Option<PathBuf>,
    map: HashMap<String, (Stat, Option<NodeId>)>,
}

impl Seen {
    /// The index in `path` (empty when missing or damaged).
    pub fn load(path: &Path) -> Seen {
        let map = fs::read(path)
            .ok()
            .and_then(|b| decode(&b))
            .unwrap_or_default();
        Seen {
            path: Some(path.to_path_buf()),
            map,
        }
    }

    /// Whether `name`, now `stat`, is still what was stored as the vault's `root` for it.
    pub fn unchanged(&self, name: &str, stat: &Stat, root: Option<NodeId>) -> bool {
        self.map.get(name) == Some(&(*stat, root))
    }

    /// Records what the names of `stats` became in `catalog` (a new version).
    pub fn record(&mut self, stats: &[(String, Stat)], catalog: &Catalog) {
        for (name, stat) in stats {
            match catalog.entries.get(name) {
                Some(e) if e.size == stat.size => {
                    self.map.insert(name.clone(), (*stat, e.root));
                }
                _ => {
                    self.map.remove(name);
                }
            }
        }
        self.map.retain(|n, _| catalog.entries.contains_key(n));
    }

    /// Writes the index back (through a temporary file and a rename).
    pub fn save(&self) -> Result<(), VaultError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let io = |e: std::io::Error| VaultError::Local(format!("{}: {e}", path.display()));
        if let Some(d) = path.parent() {
            fs::create_dir_all(d).map_err(io)?;
        }
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, encode(&self.map)).map_err(io)?;
        fs::rename(&tmp, path).map_err(io)
    }
}

fn encode(map: &HashMap<String, (Stat, Option<NodeId>)>) -> Vec<u8> {
    let mut out = b"FVSN\x01".to_vec();
    out.extend_from_slice(&(map.len() as u32).to_le_bytes());
    let mut names: Vec<&String> = map.keys().collect();
    names.sort();
    for n in names {
        let (s, root) = &map[n];
        out.extend_from_slice(&(n.len() as u16).to_le_bytes());
        out.extend_from_slice(n.as_bytes());
        for v in [s.dev, s.ino, s.size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [s.mtime_ns, s.ctime_ns] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&root.unwrap_or([0; 32]));
    }
    out
}

fn decode(mut b: &[u8]) -> Option<HashMap<String, (Stat, Option<NodeId>)>> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (x, rest) = b.split_at(n);
        *b = rest;
        Some(x)
    }
    let u64_ = |b: &mut &[u8]| take(b, 8).map(|x| u64::from_le_bytes(x.try_into().unwrap()));
    if take(&mut b, 5)? != b"FVSN\x01" {
        return None;
    }
    let n = u32::from_le_bytes(take(&mut b, 4)?.try_into().unwrap()) as usize;
    let mut map = HashMap::with_capacity(n.min(b.len() / 74));
    for _ in 0..n {
        let len = u16::from_le_bytes(take(&mut b, 2)?.try_into().unwrap()) as usize;
        let name = std::str::from_utf8(take(&mut b, len)?).ok()?.to_string();
        let stat = Stat {
            dev: u64_(&mut b)?,
            ino: u64_(&mut b)?,
            size: u64_(&mut b)?,
            mtime_ns: u64_(&mut b)? as i64,
            ctime_ns: u64_(&mut b)? as i64,
        };
        let root: NodeId = take(&mut b, 32)?.try_into().unwrap();
        map.insert(name, (stat, (root != [0; 32]).then_some(root)));
    }
    b.is_empty().then_some(map)
}
