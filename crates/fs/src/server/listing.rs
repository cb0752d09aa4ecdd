//! Attributes, listings and tree digests.

use std::collections::{HashSet, VecDeque};
use std::io;

use ferry_format::{HashAlg, Id};
use ferry_proto::{
    DirEntry, FileKind, Frame, KnownEntries, Message, Reply, TreeItem, WirePath, FLAG_MORE,
};

use super::{io_error, Server};

/// Directory entries per reply frame.
const DIR_PAGE: usize = 1024;
/// Directories one ReadTree names at most: the client finds any left out as it walks, and asks
/// for them then. Bounds what the reply holds in memory on both sides.
pub(crate) const TREE_DIRS: usize = 65_536;
/// Paths per reply frame of a ReadTree.
const TREE_PAGE: usize = 4096;
/// How long a computed tree digest is reused: long enough for one walk of a tree over a slow
/// link (a level's listings arrive together), short enough that a later command sees changes.
const TREE_DIGEST_TTL: std::time::Duration = std::time::Duration::from_secs(10);
/// Tree digests remembered before the memo is cleared.
const TREE_MEMO_ENTRIES: usize = 200_000;

impl Server {
    pub(super) fn get_attr(&mut self, path: &WirePath) -> Reply {
        match self.export.stat(path) {
            Ok((mut attr, fid)) => {
                attr.lease_ms = self.lease(path, false);
                self.keep_extra(&mut attr);
                attr.oid = match attr.kind {
                    FileKind::Dir => self.tree_id(path),
                    _ => self.recipes.get(&fid).map(|(_, o)| o.id()),
                };
                Reply::Attr(attr)
            }
            Err(e) => io_error(path, &e),
        }
    }

    /// What the name at `path` (in a leased listing) is now, for a `Changed`: its attributes
    /// under what is left of the listing's lease, or `Some(None)` when it is gone; `None` when
    /// it cannot be told (the name's lease is broken instead).
    pub(super) fn entry_now(&mut self, path: &WirePath) -> Option<Option<ferry_proto::Attr>> {
        let (dir, _) = path.split_last()?;
        let lease_ms = self.leases.as_ref()?.remaining_ms(&dir);
        match self.export.stat(path) {
            Ok((mut attr, fid)) => {
                attr.lease_ms = lease_ms;
                self.keep_extra(&mut attr);
                attr.oid = match attr.kind {
                    FileKind::Dir => self.tree_id(path),
                    _ => self.recipes.get(&fid).map(|(_, o)| o.id()),
                };
                Some(Some(attr))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some(None),
            Err(_) => None,
        }
    }

    /// A listing: whole, or (when the client names the keys of the entries it holds) only the
    /// entries whose keys it did not name, with a bitmap of which of its keys are entries here.
    pub(super) fn read_dir(&mut self, id: u32, path: &WirePath, keys: &[u32]) -> Vec<Frame> {
        let entries = match self.listing(path) {
            Ok(e) => e,
            Err(e) => return vec![Message::Reply(io_error(path, &e)).to_frame(id)],
        };
        if keys.is_empty() {
            return paged(id, entries, DIR_PAGE, |entries| Reply::Entries {
                present: vec![],
                entries,
            });
        }
        let named: HashSet<u32> = keys.iter().copied().collect();
        let mut here = HashSet::new();
        let mut send = vec![];
        let mut unkeyed = false;
        for e in &entries {
            match self.entry_key(path, e) {
                Some(k) if named.contains(&k) => {
                    here.insert(k);
                }
                k => {
                    // The client checks what it rebuilt against the tree digest, which it
                    // cannot compute over a symlink it has not read.
                    unkeyed |= k.is_none() || e.attr.kind == FileKind::Symlink;
                    send.push(e.clone());
                }
            }
        }
        if unkeyed {
            // Then the whole listing, none of the client's entries taken as known.
            here.clear();
            send = entries;
        }
        let mut present = Some(keys.iter().map(|k| here.contains(k)).collect());
        paged(id, send, DIR_PAGE, |entries| Reply::Entries {
            present: present.take().unwrap_or_default(),
            entries,
        })
    }

    /// Which directories of the tree at `path` differ from the client's (ReadTree): `path`
    /// itself and, breadth first, every subdirectory of one listed whose entry (with its tree
    /// digest, `ferry_proto::entry_hash`) `known` does not hold, up to [`TREE_DIRS`].
    pub(super) fn read_tree(
        &mut self,
        id: u32,
        path: &WirePath,
        known: &KnownEntries,
    ) -> Vec<Frame> {
        let mut queue = VecDeque::from([WirePath::default()]);
        let mut dirs = vec![];
        while let Some(rel) = queue.pop_front() {
            let Ok(full) = path.join_path(&rel) else {
                continue;
            };
            let entries = match self.export.read_dir(&full) {
                Ok(es) => es,
                Err(e) if dirs.is_empty() => {
                    return vec![Message::Reply(io_error(path, &e)).to_frame(id)]
                }
                // The client hears why when it asks for the listing itself.
                Err(_) => continue,
            };
            dirs.push(rel.clone());
            for (name, attr) in entries {
                if attr.kind != FileKind::Dir || dirs.len() + queue.len() >= TREE_DIRS {
                    continue;
                }
                let (Ok(child), Ok(child_rel)) = (full.join(&name), rel.join(&name)) else {
                    continue;
                };
                let same = self.tree_id(&child).is_some_and(|d| {
                    let item = TreeItem::Dir {
                        mode: attr.mode,
                        mtime_ns: attr.mtime_ns,
                        digest: *d.digest(),
                    };
                    known.contains(ferry_proto::entry_hash(rel.as_bytes(), &name, &item))
                });
                if !same {
                    queue.push_back(child_rel);
                }
            }
        }
        paged(id, dirs, TREE_PAGE, Reply::Tree)
    }

    /// The entries of the directory at `path`, with leases and (for directories) tree digests.
    fn listing(&mut self, path: &WirePath) -> io::Result<Vec<DirEntry>> {
        let entries = self.export.read_dir(path)?;
        let listing_lease = self.lease(path, true);
        Ok(entries
            .into_iter()
            .map(|(name, attr)| {
                let child = path.join(&name).ok();
                let lease_ms = match &child {
                    Some(child) if listing_lease > 0 => self.lease(child, false),
                    _ => 0,
                };
                let oid = match &child {
                    Some(child) if attr.kind == FileKind::Dir => self.tree_id(child),
                    _ => attr.oid,
                };
                let mut attr = ferry_proto::Attr {
                    lease_ms,
                    oid,
                    ..attr
                };
                self.keep_extra(&mut attr);
                DirEntry { name, attr }
            })
            .collect())
    }

    /// An entry's key (`ferry_proto::entry_key`), when it can be computed: a directory needs
    /// its tree digest, a symlink its target.
    fn entry_key(&self, dir: &WirePath, e: &DirEntry) -> Option<u32> {
        let target = match e.attr.kind {
            FileKind::Symlink => Some(self.export.read_link(&dir.join(&e.name).ok()?).ok()?),
            _ => None,
        };
        let item = tree_item(&e.attr, target.as_deref())?;
        Some(ferry_proto::entry_key(&e.name, &item))
    }

    /// Drops the rest of stat(2) from `attr` unless the client asked for it.
    pub(super) fn keep_extra(&self, attr: &mut ferry_proto::Attr) {
        if self.features & ferry_proto::FEATURE_STAT_EXTRA == 0 {
            attr.extra = None;
        } else if self.features & ferry_proto::FEATURE_HARD_LINKS == 0 {
            if let Some(x) = &mut attr.extra {
                x.id = None;
            }
        }
    }

    /// The tree digest of the directory at `path` as an id, when the whole subtree could be
    /// read (and the client did not ask for none: `FEATURE_NO_TREE_DIGESTS`).
    fn tree_id(&mut self, path: &WirePath) -> Option<Id> {
        if self.features & ferry_proto::FEATURE_NO_TREE_DIGESTS != 0 {
            return None;
        }
        match self.tree_digest(path) {
            Ok(d) => Some(Id::from_parts(HashAlg::Blake3, d)),
            Err(e) => {
                tracing::debug!("no tree digest for {path:?}: {e}");
                None
            }
        }
    }

    /// `ferry_proto::tree_digest` of a directory, computed bottom-up, each subtree's digest
    /// remembered for [`TREE_DIGEST_TTL`].
    fn tree_digest(&mut self, path: &WirePath) -> io::Result<[u8; 32]> {
        if let Some((at, d)) = self.trees.get(path) {
            if at.elapsed() < TREE_DIGEST_TTL {
                return Ok(*d);
            }
        }
        let mut items = vec![];
        for (name, attr) in self.export.read_dir(path)? {
            let child = path.join(&name).map_err(io::Error::other)?;
            let item = match attr.kind {
                FileKind::Symlink => TreeItem::Symlink {
                    target: self.export.read_link(&child)?,
                },
                FileKind::Dir => TreeItem::Dir {
                    mode: attr.mode,
                    mtime_ns: attr.mtime_ns,
                    digest: self.tree_digest(&child)?,
                },
                _ => TreeItem::File {
                    mode: attr.mode,
                    size: attr.size,
                    mtime_ns: attr.mtime_ns,
                },
            };
            items.push((name, item));
        }
        let d = ferry_proto::tree_digest(&mut items);
        if self.trees.len() >= TREE_MEMO_ENTRIES {
            self.trees.clear();
        }
        self.trees
            .insert(path.clone(), (std::time::Instant::now(), d));
        Ok(d)
    }
}

/// What the tree digest records of an entry of attributes `a` (a symlink's `target` read
/// already); `None` for a directory without a digest or a symlink without its target.
fn tree_item(a: &ferry_proto::Attr, target: Option<&[u8]>) -> Option<TreeItem> {
    Some(match a.kind {
        FileKind::Dir => TreeItem::Dir {
            mode: a.mode,
            mtime_ns: a.mtime_ns,
            digest: *a.oid?.digest(),
        },
        FileKind::Symlink => TreeItem::Symlink {
            target: target?.to_vec(),
        },
        _ => TreeItem::File {
            mode: a.mode,
            size: a.size,
            mtime_ns: a.mtime_ns,
        },
    })
}

/// Splits `items` into reply frames of `page` items, all but the last flagged MORE.
pub(super) fn paged<T: Clone>(
    id: u32,
    items: Vec<T>,
    page: usize,
    mut wrap: impl FnMut(Vec<T>) -> Reply,
) -> Vec<Frame> {
    let mut frames: Vec<Frame> = items
        .chunks(page)
        .map(|p| Message::Reply(wrap(p.to_vec())).to_frame(id))
        .collect();
    if frames.is_empty() {
        frames.push(Message::Reply(wrap(vec![])).to_frame(id));
    }
    more(&mut frames);
    frames
}

/// Flags every frame but the last MORE.
pub(super) fn more(frames: &mut [Frame]) {
    let n = frames.len();
    for f in &mut frames[..n.saturating_sub(1)] {
        f.flags |= FLAG_MORE;
    }
}
