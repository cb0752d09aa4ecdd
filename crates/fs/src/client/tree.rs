//! Which directories of a tree differ, in one exchange (ReadTree): the client names every
//! directory of its own copy (with its tree digest) in a filter, and the server answers with
//! the directories whose entries the filter does not hold, each below one that differs. Their
//! listings are then all asked for at once, each against the keys of its own local entries, so
//! a walk costs two round trips however deep the tree.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use ferry_proto::{KnownEntries, Reply, Request, WirePath};

use super::local::{Items, LocalTrees};
use super::walk::{ask_listing, listing_request};
use super::GetError;
use crate::conn::{ConnError, Connection};

/// Local directories named in a filter, at most (16 bits each: 400 KB). A larger tree is
/// walked level by level.
pub(crate) const FILTER_DIRS: usize = 200_000;

/// Listings asked for ahead of the walk, by path below the tree's root.
pub(crate) type Asked = HashMap<WirePath, (u32, Option<Items>)>;

/// Bytes of requests a get or put sends with its GetAttr on the chance that the tree differs,
/// at most (sent for nothing when it turns out the same).
pub(crate) const SPECULATE_BYTES: usize = 2048;

/// What asking for the tree of the local directory `local` costs when it turns out unchanged:
/// its filter (`hashes`, 2 bytes a directory) and the keys of its entries (3 bytes each).
pub(crate) fn tree_waste(local: &Path, hashes: &[u64]) -> usize {
    2 * hashes.len() + 3 * std::fs::read_dir(local).map_or(0, |d| d.count())
}

/// Asks which directories of the tree at `remote` differ from the local copy at `local`
/// (whose directories' hashes are `hashes`, its digests `trees`), then asks for the listing
/// of each, against its local entries when `digests` (the server gives tree digests).
pub(crate) fn ask_tree<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    local: &Path,
    digests: bool,
    (trees, hashes): (&LocalTrees, &[u64]),
) -> Result<Asked, GetError> {
    let started = start_tree(conn, remote, local, digests, (trees, hashes))?;
    finish_tree(conn, started, remote, local, digests, trees)
}

/// A ReadTree sent, and the root's listing with it.
pub(crate) struct Started {
    tree: u32,
    root: (u32, Option<Items>),
}

impl Started {
    /// Its replies are not wanted after all.
    pub(crate) fn forget<R: io::Read, W: Write>(self, conn: &mut Connection<R, W>) {
        conn.forget(self.tree);
        conn.forget(self.root.0);
    }
}

/// Sends the ReadTree of [`ask_tree`], and the root's listing with it (always wanted: asked
/// for with the tree, not a round trip after it), without waiting.
pub(crate) fn start_tree<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    local: &Path,
    digests: bool,
    (trees, hashes): (&LocalTrees, &[u64]),
) -> Result<Started, GetError> {
    let mut known = KnownEntries::default();
    if !hashes.is_empty() {
        known = KnownEntries::for_entries(hashes.len());
        for h in hashes {
            known.insert(*h);
        }
    }
    let tree = conn.send(Request::ReadTree {
        path: remote.clone(),
        known,
    })?;
    let root = ask_listing(conn, remote, digests, local, trees)?;
    Ok(Started { tree, root })
}

/// Takes the reply of a ReadTree [`start_tree`] sent, and asks for the listings it names.
pub(crate) fn finish_tree<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    started: Started,
    remote: &WirePath,
    local: &Path,
    digests: bool,
    trees: &LocalTrees,
) -> Result<Asked, GetError> {
    let replies = conn.replies(started.tree)?;
    // The root's listing comes right behind: once it is in, the batch below times a round trip.
    conn.arrive(started.root.0)?;
    let mut asked = Asked::new();
    asked.insert(WirePath::default(), started.root);
    // Every request made before the first is sent: the batch's round trip is timed from its
    // first request, and reading the local directories takes a while.
    let mut requests = vec![];
    for r in replies {
        let Reply::Tree(dirs) = r else {
            return Err(ConnError::Unexpected(format!("{r:?}")).into());
        };
        for rel in dirs {
            if asked.contains_key(&rel) {
                continue;
            }
            let at = remote.join_path(&rel)?;
            let here = local.join(std::ffi::OsStr::from_bytes(rel.as_bytes()));
            requests.push((rel, listing_request(&at, digests, &here, trees)));
        }
    }
    for (rel, (r, items)) in requests {
        asked.insert(rel, (conn.send(r)?, items));
    }
    Ok(asked)
}
