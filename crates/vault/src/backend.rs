//! Where a vault's bytes live: a plain directory or an S3 bucket. Neither runs any vault
//! logic; both are named blobs with one atomic primitive, **create if absent**, that the vault
//! uses as its compare-and-swap (a new head `heads/N+1` is created only if nobody created it
//! first). Directory: a temporary file, synced, then `link(2)`ed to its name (atomic, and it
//! fails when the name exists; no lock). S3: `PUT` with `If-None-Match: *`.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Mutex;

use rustix::fs::{openat2, AtFlags, Mode, OFlags, ResolveFlags};

use crate::VaultError;

/// Named blobs. Names are `/`-separated, made by the vault (never by the user or the server).
pub trait Backend: Send + Sync {
    /// The blob, or `None` when there is none.
    fn get(&self, name: &str) -> Result<Option<Vec<u8>>, VaultError>;
    /// Stores a blob whose name is its content's id (writing it twice is harmless).
    fn put(&self, name: &str, bytes: &[u8]) -> Result<(), VaultError>;
    /// Creates the blob only if the name is free; `false` when it was taken.
    fn create(&self, name: &str, bytes: &[u8]) -> Result<bool, VaultError>;
    /// Names under `dir` (which ends with `/`), at any depth.
    fn list(&self, dir: &str) -> Result<Vec<String>, VaultError>;
    /// The names under `dir` that sort after `after` (a storage that can, sends only those).
    fn list_after(&self, dir: &str, after: &str) -> Result<Vec<String>, VaultError> {
        let mut names = self.list(dir)?;
        names.retain(|n| n.as_str() > after);
        Ok(names)
    }
    fn delete(&self, name: &str) -> Result<(), VaultError>;
    /// Makes everything put so far durable (before a head names it).
    fn flush(&self) -> Result<(), VaultError>;
    /// Stores several content-named blobs (one round trip where the storage allows it).
    fn put_many(&self, blobs: &[(String, Vec<u8>)]) -> Result<(), VaultError> {
        blobs.iter().try_for_each(|(n, b)| self.put(n, b))
    }
    /// Several blobs at once (one round trip where the storage allows it); `None` for each
    /// that is absent.
    fn get_many(&self, names: &[String]) -> Result<Vec<Option<Vec<u8>>>, VaultError> {
        names.iter().map(|n| self.get(n)).collect()
    }
    /// Has the storage itself apply a batch of tree actions ([`crate::ring`]), answering the
    /// new roots; `None` when it cannot (plain storage: the client writes the nodes).
    fn apply(&self, _actions: &[u8]) -> Result<Option<Vec<u8>>, VaultError> {
        Ok(None)
    }
    /// What to call this backend in messages.
    fn describe(&self) -> String;
}

/// The answer to a get of several names, as a server sends it: per name answered, in order,
/// `00` (absent) or `01 ‖ length u32 LE ‖ bytes`; it stops before `limit` bytes (after one
/// name at least), and the asker asks again for the rest.
pub fn encode_many(b: &dyn Backend, names: &[&str], limit: usize) -> Result<Vec<u8>, VaultError> {
    let mut out = vec![];
    for n in names {
        match b.get(n)? {
            None => out.push(0),
            Some(bytes) => {
                if !out.is_empty() && out.len() + 5 + bytes.len() > limit {
                    break;
                }
                out.push(1);
                out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                out.extend_from_slice(&bytes);
            }
        }
    }
    Ok(out)
}

/// Several blobs to put, as a client sends them: per blob, name (u16 length, bytes), length
/// (u32), bytes.
pub fn encode_puts(blobs: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = vec![];
    for (n, b) in blobs {
        out.extend_from_slice(&(n.len() as u16).to_le_bytes());
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    }
    out
}

/// What [`encode_puts`] made.
pub fn decode_puts(mut b: &[u8]) -> Result<Vec<(&str, &[u8])>, VaultError> {
    let bad = || VaultError::Backend("a garbled put of several blobs".into());
    let mut out = vec![];
    while !b.is_empty() {
        let n = u16::from_le_bytes(b.get(..2).ok_or_else(bad)?.try_into().unwrap()) as usize;
        let name = std::str::from_utf8(b.get(2..2 + n).ok_or_else(bad)?).map_err(|_| bad())?;
        let at = 2 + n;
        let len =
            u32::from_le_bytes(b.get(at..at + 4).ok_or_else(bad)?.try_into().unwrap()) as usize;
        let data = b.get(at + 4..at + 4 + len).ok_or_else(bad)?;
        out.push((name, data));
        b = &b[at + 4 + len..];
    }
    Ok(out)
}

/// What [`encode_many`] made: the blobs of the first names asked for.
pub fn decode_many(mut b: &[u8], asked: usize) -> Result<Vec<Option<Vec<u8>>>, VaultError> {
    let bad = || VaultError::Backend("a garbled answer to a get of several names".into());
    let mut out = vec![];
    while !b.is_empty() {
        if out.len() == asked {
            return Err(bad());
        }
        match b[0] {
            0 => {
                out.push(None);
                b = &b[1..];
            }
            1 if b.len() >= 5 => {
                let n = u32::from_le_bytes(b[1..5].try_into().unwrap()) as usize;
                let rest = &b[5..];
                if rest.len() < n {
                    return Err(bad());
                }
                out.push(Some(rest[..n].to_vec()));
                b = &rest[n..];
            }
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

fn io_err(what: &Path, e: io::Error) -> VaultError {
    VaultError::Backend(format!("{}: {e}", what.display()))
}

fn check_name(name: &str) -> Result<(), VaultError> {
    let ok = !name.is_empty()
        && name
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != ".." && !p.starts_with(".tmp-"));
    if ok {
        Ok(())
    } else {
        Err(VaultError::Backend(format!("bad blob name {name:?}")))
    }
}

/// A vault in a directory (a USB disk, a network share, or the directory a Ferry server keeps
/// one in). Every name is resolved beneath the directory with no symlink followed
/// (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`), so nothing placed in it can send a read
/// or write elsewhere.
pub struct DirBackend {
    root: OwnedFd,
    name: String,
    /// Directories that gained entries since the last flush (names relative to the root).
    dirty: Mutex<HashSet<String>>,
}

fn strict() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

fn errno(what: &str, e: rustix::io::Errno) -> VaultError {
    VaultError::Backend(format!("{what}: {}", io::Error::from(e)))
}

impl DirBackend {
    /// The directory `root` (created, with its parents, when `create`).
    pub fn open(root: &Path, create: bool) -> Result<DirBackend, VaultError> {
        if create {
            fs::create_dir_all(root).map_err(|e| io_err(root, e))?;
        }
        let fd = rustix::fs::open(
            root,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR => {
                VaultError::NotAVault(format!("{}: no such directory", root.display()))
            }
            e => errno(&root.display().to_string(), e),
        })?;
        Ok(DirBackend::from_fd(fd, root.display().to_string()))
    }

    /// The directory open at `fd` (a server resolves it beneath its export first).
    pub fn from_fd(fd: OwnedFd, name: String) -> DirBackend {
        DirBackend {
            root: fd,
            name,
            dirty: Mutex::new(HashSet::new()),
        }
    }

    /// The directory `dir` (a name relative to the root, `""` for the root), made when
    /// `create`.
    fn dir(&self, dir: &str, create: bool) -> Result<Option<OwnedFd>, VaultError> {
        let mut at = rustix::fs::openat(
            &self.root,
            ".",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno(&self.name, e))?;
        let mut so_far = String::new();
        for part in dir.split('/').filter(|p| !p.is_empty()) {
            let open = || {
                openat2(
                    &at,
                    part,
                    OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
                    Mode::empty(),
                    strict(),
                )
            };
            at = match open() {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&at, part, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(errno(&format!("{}/{dir}", self.name), e)),
                    }
                    self.dirty.lock().unwrap().insert(so_far.clone());
                    open().map_err(|e| errno(&format!("{}/{dir}", self.name), e))?
                }
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                Err(e) => return Err(errno(&format!("{}/{dir}", self.name), e)),
            };
            if !so_far.is_empty() {
                so_far.push('/');
            }
            so_far.push_str(part);
        }
        Ok(Some(at))
    }

    /// A synced temporary file in `dir` holding `bytes`; its name.
    fn temp(&self, dir: &OwnedFd, dir_name: &str, bytes: &[u8]) -> Result<String, VaultError> {
        let tmp = format!(".tmp-{:016x}", rand::random::<u64>());
        let fd = openat2(
            dir,
            tmp.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
            strict(),
        )
        .map_err(|e| errno(&format!("{}/{dir_name}", self.name), e))?;
        let mut f = File::from(fd);
        let written = f.write_all(bytes).and_then(|()| f.sync_all());
        if let Err(e) = written {
            let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
            return Err(VaultError::Backend(format!(
                "{}/{dir_name}: {e}",
                self.name
            )));
        }
        self.dirty.lock().unwrap().insert(dir_name.to_string());
        Ok(tmp)
    }
}

fn split(name: &str) -> (&str, &str) {
    name.rsplit_once('/').unwrap_or(("", name))
}

impl Backend for DirBackend {
    fn get(&self, name: &str) -> Result<Option<Vec<u8>>, VaultError> {
        check_name(name)?;
        let fd = match openat2(
            &self.root,
            name,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
            strict(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(errno(&format!("{}/{name}", self.name), e)),
        };
        let mut b = vec![];
        io::Read::read_to_end(&mut File::from(fd), &mut b)
            .map_err(|e| VaultError::Backend(format!("{}/{name}: {e}", self.name)))?;
        Ok(Some(b))
    }

    fn put(&self, name: &str, bytes: &[u8]) -> Result<(), VaultError> {
        check_name(name)?;
        let (d, leaf) = split(name);
        let dir = self.dir(d, true)?.expect("created");
        if rustix::fs::statat(&dir, leaf, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
            return Ok(());
        }
        let tmp = self.temp(&dir, d, bytes)?;
        rustix::fs::renameat(&dir, tmp.as_str(), &dir, leaf).map_err(|e| {
            let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
            errno(&format!("{}/{name}", self.name), e)
        })
    }

    fn create(&self, name: &str, bytes: &[u8]) -> Result<bool, VaultError> {
        check_name(name)?;
        let (d, leaf) = split(name);
        let dir = self.dir(d, true)?.expect("created");
        let tmp = self.temp(&dir, d, bytes)?;
        let linked = rustix::fs::linkat(&dir, tmp.as_str(), &dir, leaf, AtFlags::empty());
        let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
        match linked {
            Ok(()) => {
                self.flush()?;
                Ok(true)
            }
            Err(rustix::io::Errno::EXIST) => Ok(false),
            Err(e) => Err(errno(&format!("{}/{name}", self.name), e)),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>, VaultError> {
        let mut out = vec![];
        let mut todo = vec![dir.trim_end_matches('/').to_string()];
        while let Some(d) = todo.pop() {
            check_name(&d)?;
            let Some(fd) = self.dir(&d, false)? else {
                continue;
            };
            let entries = rustix::fs::Dir::read_from(&fd).map_err(|e| errno(&self.name, e))?;
            for e in entries {
                let e = e.map_err(|e| errno(&self.name, e))?;
                let Ok(n) = e.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                if n == "." || n == ".." || n.starts_with(".tmp-") {
                    continue;
                }
                let st = rustix::fs::statat(&fd, n.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| errno(&self.name, e))?;
                match rustix::fs::FileType::from_raw_mode(st.st_mode) {
                    rustix::fs::FileType::Directory => todo.push(format!("{d}/{n}")),
                    rustix::fs::FileType::RegularFile => out.push(format!("{d}/{n}")),
                    _ => {}
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<(), VaultError> {
        check_name(name)?;
        let (d, leaf) = split(name);
        let Some(dir) = self.dir(d, false)? else {
            return Ok(());
        };
        match rustix::fs::unlinkat(&dir, leaf, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(errno(&format!("{}/{name}", self.name), e)),
        }
    }

    fn flush(&self) -> Result<(), VaultError> {
        let dirs: Vec<String> = self.dirty.lock().unwrap().drain().collect();
        for d in dirs {
            if let Some(fd) = self.dir(&d, false)? {
                rustix::fs::fsync(&fd).map_err(|e| errno(&self.name, e))?;
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}

/// A vault in an S3 bucket, under a prefix.
pub struct S3Backend {
    client: ferry_s3::Client,
    prefix: String,
    name: String,
}

impl S3Backend {
    /// `s3://BUCKET/PREFIX[?endpoint=…&region=…&profile=…]`, credentials found the way the AWS
    /// tools find them; the bucket is created when `create` and it is missing.
    pub fn open(locator: &str, create: bool) -> Result<S3Backend, VaultError> {
        let loc = ferry_s3::Locator::parse(locator).map_err(s3_err)?;
        let r = ferry_s3::config::resolve(&loc, &ferry_s3::config::ProcessEnv).map_err(s3_err)?;
        S3Backend::with(&loc, &r, create)
    }

    /// The bucket and prefix of `loc` on the server `r` names.
    pub fn with(
        loc: &ferry_s3::Locator,
        r: &ferry_s3::Resolved,
        create: bool,
    ) -> Result<S3Backend, VaultError> {
        let client = ferry_s3::Client::new(r, &loc.bucket, Default::default()).map_err(s3_err)?;
        if create {
            client.create_bucket().map_err(s3_err)?;
        }
        Ok(S3Backend {
            client,
            prefix: loc.prefix.clone(),
            name: loc.display(),
        })
    }

    fn key(&self, name: &str) -> Result<String, VaultError> {
        check_name(name)?;
        Ok(format!("{}{name}", self.prefix))
    }
}

fn s3_err(e: ferry_s3::S3Error) -> VaultError {
    VaultError::Backend(e.to_string())
}

impl Backend for S3Backend {
    fn get(&self, name: &str) -> Result<Option<Vec<u8>>, VaultError> {
        self.client.get(&self.key(name)?, None).map_err(s3_err)
    }

    fn put(&self, name: &str, bytes: &[u8]) -> Result<(), VaultError> {
        use ferry_s3::Cond;
        self.client
            .put(&self.key(name)?, bytes, Cond::None)
            .map_err(s3_err)?;
        Ok(())
    }

    fn create(&self, name: &str, bytes: &[u8]) -> Result<bool, VaultError> {
        use ferry_s3::{Cond, Put};
        match self
            .client
            .put(&self.key(name)?, bytes, Cond::Absent)
            .map_err(s3_err)?
        {
            Put::Done(_) => Ok(true),
            Put::Refused => Ok(false),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>, VaultError> {
        check_name(dir.trim_end_matches('/'))?;
        let listed = self
            .client
            .list(&format!("{}{dir}", self.prefix))
            .map_err(s3_err)?;
        let mut out: Vec<String> = listed
            .into_iter()
            .filter_map(|l| l.key.strip_prefix(&self.prefix).map(str::to_string))
            .collect();
        out.sort();
        Ok(out)
    }

    fn list_after(&self, dir: &str, after: &str) -> Result<Vec<String>, VaultError> {
        check_name(dir.trim_end_matches('/'))?;
        let start = format!("{}{after}", self.prefix);
        let listed = self
            .client
            .list_after(&format!("{}{dir}", self.prefix), Some(&start))
            .map_err(s3_err)?;
        let mut out: Vec<String> = listed
            .into_iter()
            .filter_map(|l| l.key.strip_prefix(&self.prefix).map(str::to_string))
            .filter(|k| k.as_str() > after)
            .collect();
        out.sort();
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<(), VaultError> {
        self.client.delete(&self.key(name)?).map_err(s3_err)
    }

    fn flush(&self) -> Result<(), VaultError> {
        // A PUT is durable when it answers.
        Ok(())
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_at_once_round_trip_and_refuse_garbage() {
        let t = tempfile::tempdir().unwrap();
        let d = DirBackend::open(t.path(), true).unwrap();
        let blobs = vec![
            ("blocks/aa/1".to_string(), vec![1u8; 10]),
            ("blocks/bb/2".to_string(), vec![]),
        ];
        let wire = encode_puts(&blobs);
        let back = decode_puts(&wire).unwrap();
        assert_eq!(back.len(), 2);
        for (n, b) in back {
            d.put(n, b).unwrap();
        }
        let names = ["blocks/aa/1", "nope/x", "blocks/bb/2"];
        let many = encode_many(&d, &names, 1 << 20).unwrap();
        assert_eq!(
            decode_many(&many, 3).unwrap(),
            vec![Some(vec![1u8; 10]), None, Some(vec![])]
        );
        // A limit cuts the answer after the first name; the rest is asked again.
        let first = encode_many(&d, &names, 1).unwrap();
        assert_eq!(decode_many(&first, 3).unwrap().len(), 2);
        // Cut anywhere but between two blobs: refused.
        let first_end = 2 + 11 + 4 + 10;
        for cut in (1..wire.len()).filter(|&c| c != first_end) {
            assert!(decode_puts(&wire[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(decode_puts(&wire[..first_end]).unwrap().len(), 1);
        assert!(decode_many(&many, 2).is_err());
        assert!(decode_many(&[7], 1).is_err());
    }
}
