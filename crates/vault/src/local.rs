//! Between a vault and local files: what a `put` of a file or tree changes (files whose size,
//! time and mode are unchanged are not read again; files gone from the tree are removed), and
//! writing a version's files out (each through a temporary file and a rename, never through a
//! symlink).

use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::records::{Catalog, Entry, Kind};
use crate::seen::{Seen, Stat};
use crate::update::{Edit, Source};
use crate::vault::{Snapshot, Vault};
use crate::VaultError;

fn local(p: &Path, e: std::io::Error) -> VaultError {
    VaultError::Local(format!("{}: {e}", p.display()))
}

/// What a put of `path` as `name` plans: the edits, and what was skipped.
#[derive(Debug, Default)]
pub struct Plan {
    pub edits: Vec<Edit>,
    /// Files unchanged since the vault's version (size, time, mode).
    pub unchanged: u64,
    /// Sockets, FIFOs and devices, which a vault does not keep.
    pub skipped: Vec<PathBuf>,
    /// Each file's identity and times as planned (for [`Seen::record`] once stored).
    pub stats: Vec<(String, Stat)>,
}

fn mtime_ns(m: &fs::Metadata) -> i64 {
    m.mtime() * 1_000_000_000 + m.mtime_nsec()
}

/// The edits that make `name` in `catalog` what `path` is now (a file, a symlink or a tree);
/// a file `seen` says is unchanged since it became the vault's version is not read again.
pub fn plan_put(
    catalog: &Catalog,
    seen: &Seen,
    path: &Path,
    name: &str,
) -> Result<Plan, VaultError> {
    crate::records::check_name(name).map_err(VaultError::BadRange)?;
    let mut plan = Plan::default();
    // A symlink named on the command line is followed (as `cp -r` does); those in a tree
    // are kept as symlinks.
    let top = fs::metadata(path).map_err(|e| local(path, e))?;
    if !top.is_dir() {
        add(catalog, seen, path, name, &top, &mut plan)?;
        return Ok(plan);
    }
    let mut present = std::collections::HashSet::new();
    let mut stack = vec![(path.to_path_buf(), name.to_string())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut rd: Vec<_> = fs::read_dir(&dir)
            .map_err(|e| local(&dir, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| local(&dir, e))?;
        rd.sort_by_key(|e| e.file_name());
        for e in rd {
            let p = e.path();
            let Some(n) = e.file_name().to_str().map(str::to_string) else {
                plan.skipped.push(p);
                continue;
            };
            let child = format!("{prefix}/{n}");
            let m = fs::symlink_metadata(&p).map_err(|e| local(&p, e))?;
            if m.is_dir() {
                stack.push((p, child));
            } else if add(catalog, seen, &p, &child, &m, &mut plan)? {
                present.insert(child);
            }
        }
    }
    let dir = format!("{name}/");
    for k in catalog
        .entries
        .range(dir.clone()..)
        .take_while(|(k, _)| k.starts_with(&dir))
        .map(|(k, _)| k)
    {
        if !present.contains(k) {
            plan.edits.push(Edit::Remove(k.clone()));
        }
    }
    if catalog.entries.contains_key(name) {
        // A file of that name becomes the tree.
        plan.edits.push(Edit::Remove(name.to_string()));
    }
    Ok(plan)
}

/// Plans one file or symlink; `false` when it is of a kind a vault does not keep.
fn add(
    catalog: &Catalog,
    seen: &Seen,
    p: &Path,
    name: &str,
    m: &fs::Metadata,
    plan: &mut Plan,
) -> Result<bool, VaultError> {
    let (kind, source, size) = if m.is_file() {
        (Kind::File, Source::File(p.to_path_buf()), m.len())
    } else if m.file_type().is_symlink() {
        let t = fs::read_link(p).map_err(|e| local(p, e))?;
        let t = t.as_os_str().as_encoded_bytes().to_vec();
        let n = t.len() as u64;
        (Kind::Symlink, Source::Bytes(t), n)
    } else {
        plan.skipped.push(p.to_path_buf());
        return Ok(false);
    };
    let mode = m.mode() & 0o7777;
    let mtime_ns = mtime_ns(m);
    let stat = Stat::of(m);
    let same = catalog.entries.get(name).is_some_and(|e| {
        e.kind == kind
            && e.size == size
            && e.mode == mode
            && e.mtime_ns == mtime_ns
            && seen.unchanged(name, &stat, e.root)
    });
    plan.stats.push((name.to_string(), stat));
    if same {
        plan.unchanged += 1;
    } else {
        plan.edits.push(Edit::Put {
            name: name.to_string(),
            kind,
            mode,
            mtime_ns,
            source,
        });
    }
    Ok(true)
}

/// What a get wrote.
#[derive(Debug, Default)]
pub struct Exported {
    pub files: u64,
    pub bytes: u64,
}

/// Writes `name` of `snap` to `dest`: a file to `dest` (or into it, when it is a directory), a
/// tree's files under `dest`.
pub fn export(
    vault: &Vault,
    snap: &Snapshot,
    name: &str,
    dest: &Path,
    progress: &dyn Fn(u64),
) -> Result<Exported, VaultError> {
    let name = name.trim_matches('/');
    let entries = Vault::select(snap, name);
    if entries.is_empty() {
        return Err(VaultError::NotFound(name.to_string()));
    }
    let mut out = Exported::default();
    if let [e] = entries[..] {
        if e.name == name {
            let to = if dest.is_dir() {
                dest.join(name.rsplit('/').next().expect("a name"))
            } else {
                dest.to_path_buf()
            };
            write_entry(e, &to, Content::Vault(vault), &mut out, progress)?;
            return Ok(out);
        }
    }
    // Every node first, a level of all the trees at a time; then the small files' blocks
    // together, a group at a time; a large file by itself, a window at a time.
    let roots: Vec<_> = entries
        .iter()
        .filter_map(|e| crate::records::child(e.size, e.root))
        .collect();
    vault.prefetch_trees(&roots)?;
    let place = |e: &Entry| -> Result<PathBuf, VaultError> {
        let rel = match name.is_empty() {
            true => e.name.as_str(),
            false => &e.name[name.len() + 1..],
        };
        let to = dest.join(rel);
        make_parents(dest, &to)?;
        Ok(to)
    };
    let mut group: Vec<&Entry> = vec![];
    let mut group_bytes = 0;
    let flush = |group: &mut Vec<&Entry>, out: &mut Exported| -> Result<(), VaultError> {
        let roots: Vec<_> = group
            .iter()
            .map(|e| crate::records::child(e.size, e.root))
            .collect();
        for (e, content) in group.iter().zip(vault.read_small(&roots)?) {
            write_entry(e, &place(e)?, Content::Bytes(&content), out, progress)?;
        }
        group.clear();
        Ok(())
    };
    for e in entries {
        if e.size > SMALL {
            write_entry(e, &place(e)?, Content::Vault(vault), &mut out, progress)?;
            continue;
        }
        group.push(e);
        group_bytes += e.size;
        if group_bytes >= GROUP_BYTES || group.len() >= GROUP_FILES {
            flush(&mut group, &mut out)?;
            group_bytes = 0;
        }
    }
    flush(&mut group, &mut out)?;
    Ok(out)
}

/// Files up to this size are read in groups.
const SMALL: u64 = 1 << 20;
const GROUP_BYTES: u64 = 16 << 20;
const GROUP_FILES: usize = 1024;

/// Where a file's content comes from when it is written out.
enum Content<'a> {
    /// Read from the vault, a window at a time.
    Vault(&'a Vault),
    /// Read already.
    Bytes(&'a [u8]),
}

/// Creates the directories between `base` and `to`, refusing any that is not a real directory
/// (a symlink there would send the write elsewhere).
fn make_parents(base: &Path, to: &Path) -> Result<(), VaultError> {
    fs::create_dir_all(base).map_err(|e| local(base, e))?;
    let parent = to.parent().expect("below base");
    let rel = parent.strip_prefix(base).expect("below base");
    let mut at = base.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(VaultError::Local(format!(
                    "{}: not a directory (a symlink or file is in the way)",
                    at.display()
                )))
            }
            Err(_) => fs::create_dir(&at).map_err(|e| local(&at, e))?,
        }
    }
    Ok(())
}

fn write_entry(
    e: &Entry,
    to: &Path,
    content: Content<'_>,
    out: &mut Exported,
    progress: &dyn Fn(u64),
) -> Result<(), VaultError> {
    let dir = to.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".ferry-vault-{:016x}.tmp", rand::random::<u64>()));
    let root = crate::records::child(e.size, e.root);
    let result = (|| -> Result<(), VaultError> {
        match e.kind {
            Kind::File => {
                let mut f = fs::File::create(&tmp).map_err(|err| local(&tmp, err))?;
                let mut w = Progress {
                    inner: &mut f,
                    progress,
                };
                match content {
                    Content::Vault(v) => {
                        v.read_content(root, &mut w)?;
                    }
                    Content::Bytes(b) => {
                        std::io::Write::write_all(&mut w, b).map_err(|err| local(&tmp, err))?
                    }
                }
                f.sync_all().map_err(|err| local(&tmp, err))?;
                f.set_modified(time_of(e.mtime_ns))
                    .map_err(|err| local(&tmp, err))?;
                fs::set_permissions(&tmp, fs::Permissions::from_mode(e.mode & 0o7777))
                    .map_err(|err| local(&tmp, err))?;
            }
            Kind::Symlink => {
                let target = match content {
                    Content::Vault(v) => {
                        let mut t = vec![];
                        v.read_content(root, &mut t)?;
                        t
                    }
                    Content::Bytes(b) => b.to_vec(),
                };
                let target = std::ffi::OsString::from_vec(target);
                std::os::unix::fs::symlink(&target, &tmp).map_err(|err| local(&tmp, err))?;
            }
        }
        fs::rename(&tmp, to).map_err(|err| local(to, err))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    out.files += 1;
    out.bytes += e.size;
    Ok(())
}

fn time_of(ns: i64) -> std::time::SystemTime {
    let base = std::time::UNIX_EPOCH;
    if ns >= 0 {
        base + std::time::Duration::from_nanos(ns as u64)
    } else {
        base - std::time::Duration::from_nanos(ns.unsigned_abs())
    }
}

struct Progress<'a, W> {
    inner: &'a mut W,
    progress: &'a dyn Fn(u64),
}

impl<W: std::io::Write> std::io::Write for Progress<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        (self.progress)(n as u64);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
