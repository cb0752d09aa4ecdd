//! Uploads: a walk of the local tree against the server's listings, then files in batches
//! (`push`), symlinks, deletions, and the directories' modes and times.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ferry_proto::{Attr, FileKind, Reply, Request, TreeItem, WirePath};

use super::local::{local_tree_hashing, same_tree, LocalTrees};
use super::push::{put_files, PutJob};
use super::tree::{
    ask_tree, finish_tree, start_tree, tree_waste, Asked, Started, FILTER_DIRS, SPECULATE_BYTES,
};
use super::walk::{ask_listing, take_listing};
use super::{GetError, PutOptions, PutStats};
use crate::conn::{ConnError, Connection};

/// Files uploaded together: what each batch asks of the server goes in one round trip.
const BATCH_FILES: usize = 1024;
/// Bytes of files per upload batch.
const PUT_BATCH_FILE_BYTES: u64 = 64 << 20;

/// What the walk of an upload leaves to do.
#[derive(Default)]
struct PutPlan {
    files: Vec<PutJob>,
    /// Symlinks: the local target, the server path, what the server has there.
    links: Vec<(Vec<u8>, WirePath, Option<Attr>)>,
    deletes: Vec<(WirePath, FileKind)>,
    /// Requests sent and not yet checked (Mkdir): their replies are read with the next batch.
    pending: Vec<u32>,
    /// Directories walked, parents first: their modes and times are set on the server last.
    dirs: Vec<(PathBuf, WirePath)>,
}

/// Uploads the file or tree at `local` to `remote`, sending only chunks the server lacks, and
/// committing each file atomically against the version it had when the upload began. With
/// `delete`, entries of the server's directories that `local` lacks are removed.
///
/// A walk compares the local tree with the server's listings (two round trips however deep,
/// with a server that names the directories that differ; else one a level); then files go up
/// in batches of about two round trips each (which chunks the server has; the missing chunks
/// and the commits), files under 8 KiB in one. The directories' modes and times go last, with
/// the last batch's commits when no symlink or deletion follows them.
pub fn put<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    local: &Path,
    remote: &WirePath,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
) -> Result<(), GetError> {
    let meta = fs::symlink_metadata(local).map_err(GetError::local("read", local))?;
    // With tree digests from the server, every subtree already the same there is skipped.
    let mut trees = LocalTrees::new();
    // Every local directory's hash, for a ReadTree's filter.
    let mut hashes = vec![];
    if meta.is_dir() {
        if let Err(e) = local_tree_hashing(local, local, &mut trees, &mut hashes) {
            tracing::debug!("no tree digests for {}: {e}", local.display());
            trees.clear();
            hashes.clear();
        }
    }
    let ping = super::ping(conn)?;
    let attr_id = conn.send(Request::GetAttr {
        path: remote.clone(),
    })?;
    // Which directories differ, and the root's listing, are asked for with the attributes
    // when that wastes little should the tree turn out the same there (as a get does).
    let mut started = None;
    if meta.is_dir()
        && conn.may_offer(ferry_proto::FEATURE_TREE_LISTINGS)
        && hashes.len() <= FILTER_DIRS
        && tree_waste(local, &hashes) <= SPECULATE_BYTES
    {
        started = Some(start_tree(conn, remote, local, true, (&trees, &hashes))?);
    }
    super::take_ping(conn, ping)?;
    let current = match conn.replies(attr_id) {
        Ok(mut r) => match r.pop() {
            Some(Reply::Attr(a)) => Some(a),
            other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
        },
        Err(ConnError::Remote {
            code: ferry_proto::ErrorCode::NotFound,
            ..
        }) => None,
        Err(e) => return Err(e.into()),
    };
    if current.as_ref().is_none_or(|a| a.oid.is_none()) {
        trees.clear();
    }
    let unchanged = current
        .as_ref()
        .filter(|_| meta.is_dir())
        .and_then(|cur| same_tree(local, cur, &trees));
    let is_dir = current.as_ref().is_some_and(|a| a.kind == FileKind::Dir);
    if unchanged.is_some() || !is_dir {
        if let Some(s) = started.take() {
            s.forget(conn);
        }
    }
    if let Some(files) = unchanged {
        stats.unchanged += files;
        return Ok(());
    }
    let mut plan = PutPlan::default();
    put_walk(
        conn,
        local,
        meta,
        remote,
        current,
        (&trees, &hashes),
        started,
        opts,
        stats,
        &mut plan,
    )?;
    // The directories' modes and times, set last: with the last batch's commits when nothing
    // else follows them (no symlinks, no deletions), in their round trip.
    let mut dir_times = dir_times(&plan, opts)?;
    let with_commits = plan.links.is_empty() && plan.deletes.is_empty();
    let mut batch = vec![];
    let mut bytes = 0;
    for job in std::mem::take(&mut plan.files) {
        if !batch.is_empty()
            && (batch.len() >= BATCH_FILES || bytes + job.meta.len() > PUT_BATCH_FILE_BYTES)
        {
            put_files(
                conn,
                std::mem::take(&mut batch),
                &mut plan.pending,
                &[],
                opts,
                stats,
            )?;
            bytes = 0;
        }
        bytes += job.meta.len();
        batch.push(job);
    }
    if !batch.is_empty() {
        let after = match with_commits {
            true => std::mem::take(&mut dir_times),
            false => vec![],
        };
        put_files(conn, batch, &mut plan.pending, &after, opts, stats)?;
    }
    put_links(
        conn,
        std::mem::take(&mut plan.links),
        &mut plan.pending,
        opts,
        stats,
    )?;
    for (path, kind) in std::mem::take(&mut plan.deletes) {
        if opts.dry_run {
            stats.planned.push(format!("delete {path:?}"));
        } else if kind == FileKind::Dir {
            remove_remote(conn, &path, kind)?;
        } else {
            plan.pending.push(conn.send(Request::Unlink { path })?);
        }
        stats.deleted += 1;
    }
    for r in dir_times {
        plan.pending.push(conn.send(r)?);
    }
    check(conn, &mut plan.pending)
}

/// The requests that give the directories walked the local modes and times, children before
/// parents: sent after everything that changes them, so the next sync finds their digests
/// equal. None for a dry run.
fn dir_times(plan: &PutPlan, opts: &PutOptions<'_>) -> Result<Vec<Request>, GetError> {
    use std::os::unix::fs::MetadataExt;
    if opts.dry_run {
        return Ok(vec![]);
    }
    let mut out = vec![];
    for (local, remote) in plan.dirs.iter().rev() {
        let m = fs::symlink_metadata(local).map_err(GetError::local("read", local))?;
        out.push(Request::SetAttr {
            path: remote.clone(),
            mode: Some(m.mode() & 0o7777),
            mtime_ns: Some(m.mtime() * 1_000_000_000 + m.mtime_nsec()),
        });
    }
    Ok(out)
}

/// The version of a file an upload replaces, as the client knows it.
#[derive(Clone, Debug)]
pub struct Replacing {
    pub version: u64,
    /// That version is empty (nothing of it is asked for).
    pub empty: bool,
    /// Its recipe as the server keeps it (the client committed that version itself, say):
    /// nothing is asked first, and the upload is one round trip. The server checks the whole
    /// object at the commit, so a recipe that is not the server's costs only a refusal
    /// (`BadRequest`, or `MissingChunks`): ask again without it.
    pub recipe: Option<std::sync::Arc<ferry_format::Recipe>>,
}

/// Uploads the local file `local` to `remote` as one new version, committed against the
/// version it replaces (the server refuses it with a conflict if the file is no longer at that
/// version; `None`: if anything is there), with permission bits `mode`. Only the chunks the
/// server lacks travel. Returns the server's attributes of the new version.
pub fn put_file<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    local: &Path,
    remote: &WirePath,
    replacing: Option<Replacing>,
    mode: u32,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
) -> Result<Attr, GetError> {
    let meta = fs::metadata(local).map_err(GetError::local("read", local))?;
    let job = PutJob {
        local: local.to_path_buf(),
        meta,
        mode: mode & 0o7777,
        remote: remote.clone(),
        if_version: replacing.as_ref().map(|r| r.version),
        base_empty: replacing.as_ref().is_some_and(|r| r.empty),
        base_recipe: replacing.and_then(|r| r.recipe),
    };
    let mut attrs = put_files(conn, vec![job], &mut vec![], &[], opts, stats)?;
    attrs
        .pop()
        .ok_or_else(|| ConnError::Unexpected("no commit reply".into()).into())
}

/// Reads the replies of requests sent earlier; the first error wins.
pub(crate) fn check<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    pending: &mut Vec<u32>,
) -> Result<(), GetError> {
    conn.flush()?;
    for id in pending.drain(..) {
        conn.replies(id)?;
    }
    Ok(())
}

/// Compares `local` (whose tree digests and directories' hashes are `trees` and `hashes`) with
/// the server, breadth first, noting what to upload and delete. With a server that names the
/// directories that differ (ReadTree), all their listings are asked for at once.
#[allow(clippy::too_many_arguments)]
fn put_walk<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    local: &Path,
    meta: fs::Metadata,
    remote: &WirePath,
    current: Option<Attr>,
    (trees, hashes): (&LocalTrees, &[u64]),
    started: Option<Started>,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
    plan: &mut PutPlan,
) -> Result<(), GetError> {
    if !meta.is_dir() {
        return put_note(local, meta, remote, current, opts, stats, plan);
    }
    let root = local;
    // Listings asked for ahead, by path below the root.
    let mut ahead = Asked::new();
    // (local directory, server directory, its listing if it exists there): asked against the
    // entries here, so only those that differ come back.
    let mut queue = std::collections::VecDeque::new();
    match &current {
        Some(a) if a.kind == FileKind::Dir => {
            let digests = a.oid.is_some();
            ahead = match started {
                Some(s) => finish_tree(conn, s, remote, local, digests, trees)?,
                None if conn.offers(ferry_proto::FEATURE_TREE_LISTINGS)?
                    && hashes.len() <= FILTER_DIRS =>
                {
                    ask_tree(conn, remote, local, digests, (trees, hashes))?
                }
                None => Asked::new(),
            };
            let asked = match ahead.remove(&WirePath::default()) {
                Some(asked) => asked,
                None => ask_listing(conn, remote, digests, local, trees)?,
            };
            queue.push_back((
                local.to_path_buf(),
                remote.clone(),
                Some((asked, a.clone())),
            ));
        }
        Some(_) => {
            return Err(ConnError::Unexpected(format!(
                "{remote:?} exists on the server and is not a directory"
            ))
            .into())
        }
        None => {
            put_mkdir(conn, remote, &meta, opts, stats, plan)?;
            queue.push_back((local.to_path_buf(), remote.clone(), None));
        }
    }
    while let Some((local, remote, listing)) = queue.pop_front() {
        plan.dirs.push((local.clone(), remote.clone()));
        // The server's entries that differ from those here, and those it has as they are here.
        let mut there: HashMap<Vec<u8>, Attr> = HashMap::new();
        let mut same: HashMap<Vec<u8>, TreeItem> = HashMap::new();
        if let Some((asked, attr)) = listing {
            conn.flush()?;
            let (entries, known) = take_listing(conn, &remote, &attr, asked)?;
            there.extend(entries.into_iter().map(|e| (e.name, e.attr)));
            same.extend(known);
        }
        let mut names: Vec<_> = fs::read_dir(&local)
            .map_err(GetError::local("read directory", &local))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(GetError::local("read directory", &local))?;
        // A fetch's partial files are not the tree's.
        names.retain(|n| !crate::export::is_partial(n.as_bytes()));
        names.sort();
        for name in &names {
            let (child_local, child) = (local.join(name), remote.join(name.as_bytes())?);
            if let Some(item) = same.remove(name.as_bytes()) {
                stats.unchanged += match item {
                    TreeItem::File { .. } => 1,
                    TreeItem::Dir { .. } => trees.get(&child_local).map_or(0, |t| t.1),
                    TreeItem::Symlink { .. } => 0,
                };
                continue;
            }
            let m = fs::symlink_metadata(&child_local)
                .map_err(GetError::local("read", &child_local))?;
            let cur = there.remove(name.as_bytes());
            if !m.is_dir() {
                put_note(&child_local, m, &child, cur, opts, stats, plan)?;
                continue;
            }
            match cur {
                Some(a) if a.kind == FileKind::Dir => {
                    if let Some(files) = same_tree(&child_local, &a, trees) {
                        stats.unchanged += files;
                        continue;
                    }
                    let rel = child_local
                        .strip_prefix(root)
                        .ok()
                        .and_then(|r| WirePath::new(r.as_os_str().as_bytes()).ok());
                    let asked = match rel.and_then(|r| ahead.remove(&r)) {
                        Some(asked) => asked,
                        None => ask_listing(conn, &child, a.oid.is_some(), &child_local, trees)?,
                    };
                    queue.push_back((child_local, child, Some((asked, a))));
                }
                Some(_) => {
                    return Err(ConnError::Unexpected(format!(
                        "{child:?} exists on the server and is not a directory"
                    ))
                    .into())
                }
                None => {
                    put_mkdir(conn, &child, &m, opts, stats, plan)?;
                    queue.push_back((child_local, child, None));
                }
            }
        }
        if opts.delete {
            // What is left of the listing, the local tree lacks.
            let mut extra: Vec<_> = there.into_iter().collect();
            extra.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, attr) in extra {
                plan.deletes.push((remote.join(&name)?, attr.kind));
            }
        }
    }
    // Listings asked for that no listing led to: their replies are dropped as they come.
    for (_, (id, _)) in ahead {
        conn.forget(id);
    }
    Ok(())
}

fn put_mkdir<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    meta: &fs::Metadata,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
    plan: &mut PutPlan,
) -> Result<(), GetError> {
    if opts.dry_run {
        stats.planned.push(format!("mkdir {remote:?}"));
        return Ok(());
    }
    // Not waited for: the server handles requests in order, so what goes into the directory
    // comes after it; the reply is checked with the next batch.
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions());
    plan.pending.push(conn.send(Request::Mkdir {
        path: remote.clone(),
        mode: mode & 0o7777,
    })?);
    Ok(())
}

/// Notes a file or symlink the walk found.
fn put_note(
    local: &Path,
    meta: fs::Metadata,
    remote: &WirePath,
    current: Option<Attr>,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
    plan: &mut PutPlan,
) -> Result<(), GetError> {
    use std::os::unix::fs::MetadataExt;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = fs::read_link(local).map_err(GetError::local("read symlink", local))?;
        plan.links.push((
            target.as_os_str().as_bytes().to_vec(),
            remote.clone(),
            current,
        ));
    } else if ft.is_file() {
        let mtime_ns = meta.mtime() * 1_000_000_000 + meta.mtime_nsec();
        // The quick check, as for get: same size, mtime and mode means unchanged.
        if current.as_ref().is_some_and(|a| {
            a.kind == FileKind::File
                && a.size == meta.len()
                && a.mtime_ns == mtime_ns
                && a.mode & 0o7777 == meta.mode() & 0o7777
        }) {
            stats.unchanged += 1;
        } else if current.as_ref().is_some_and(|a| a.kind == FileKind::Dir) {
            return Err(
                ConnError::Unexpected(format!("a directory is in the way of {remote:?}")).into(),
            );
        } else if opts.dry_run {
            stats
                .planned
                .push(format!("send {} ({} bytes)", local.display(), meta.len()));
            stats.files += 1;
        } else {
            plan.files.push(PutJob {
                local: local.to_path_buf(),
                mode: meta.mode() & 0o7777,
                meta,
                remote: remote.clone(),
                if_version: current.as_ref().map(|a| a.version),
                base_empty: current.is_some_and(|a| a.size == 0),
                base_recipe: None,
            });
        }
    } else {
        tracing::warn!(
            "skipping {}: not a regular file, directory or symlink",
            local.display()
        );
    }
    Ok(())
}

/// Makes the server's symlinks match: targets of the ones there asked for at once, then the
/// changes sent together.
fn put_links<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    links: Vec<(Vec<u8>, WirePath, Option<Attr>)>,
    pending: &mut Vec<u32>,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
) -> Result<(), GetError> {
    let mut asks = vec![];
    for (_, remote, cur) in &links {
        asks.push(match cur {
            Some(a) if a.kind == FileKind::Symlink => Some(conn.send(Request::ReadLink {
                path: remote.clone(),
            })?),
            _ => None,
        });
    }
    conn.flush()?;
    for ((target, remote, cur), ask) in links.into_iter().zip(asks) {
        if let Some(id) = ask {
            if let Some(Reply::Link(t)) = conn.replies(id)?.pop() {
                if t == target {
                    continue;
                }
            }
        }
        if cur.as_ref().is_some_and(|a| a.kind == FileKind::Dir) {
            return Err(ConnError::Unexpected(format!(
                "a directory is in the way of symlink {remote:?}"
            ))
            .into());
        }
        if opts.dry_run {
            stats.planned.push(format!("link {remote:?}"));
            continue;
        }
        if cur.is_some() {
            pending.push(conn.send(Request::Unlink {
                path: remote.clone(),
            })?);
        }
        pending.push(conn.send(Request::Symlink {
            path: remote,
            target,
        })?);
        stats.files += 1;
    }
    Ok(())
}

/// Removes a server entry, a directory with everything below it.
fn remove_remote<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    path: &WirePath,
    kind: FileKind,
) -> Result<(), GetError> {
    if kind == FileKind::Dir {
        let mut entries = vec![];
        for r in conn.call(Request::ReadDir {
            path: path.clone(),
            keys: vec![],
        })? {
            if let Reply::Entries { entries: es, .. } = r {
                entries.extend(es);
            }
        }
        for e in entries {
            remove_remote(conn, &path.join(&e.name)?, e.attr.kind)?;
        }
        conn.call(Request::Rmdir { path: path.clone() })?;
    } else {
        conn.call(Request::Unlink { path: path.clone() })?;
    }
    Ok(())
}
