//! The mount's whole-file cache on the simulator: files read while the server is reachable
//! (clean copies, each labelled with the server version it is), then changed while it is not
//! (kept in the cache, marked dirty, written back later). Crashed everywhere, the cache left
//! behind must:
//! - never hold a copy labelled as a server version whose bytes are not that version's (a
//!   mount would serve them as the server's): checked on the records themselves, whose format
//!   docs/mount.md gives;
//! - keep every change whose close returned, whole (a mount started on it reads it back);
//!   a file untouched reads as the server's; one whose change was under way reads as either;
//! - open (the chunk cache included).

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_crashsim::Report;
use ferry_fs::{ConnError, Export, Server, ServerOptions, Session};
use ferry_mount::{Errno, Options, Vfs, ROOT};
use ferry_proto::WirePath;

use crate::{bytes, crash_all, recorder, rounds};

/// An export served to the mount, one session per connection; `stop` cuts them all and
/// refuses new ones.
#[derive(Clone)]
struct Remote {
    root: std::path::PathBuf,
    down: Arc<AtomicBool>,
    sockets: Arc<Mutex<Vec<UnixStream>>>,
}

impl Remote {
    fn new(root: &Path) -> Remote {
        Remote {
            root: root.to_path_buf(),
            down: Arc::default(),
            sockets: Arc::default(),
        }
    }

    fn client(&self, cache: &Path) -> Vfs {
        let r = self.clone();
        let connect: ferry_mount::Connector = Box::new(move || {
            if r.down.load(Ordering::Acquire) {
                return Err(ConnError::Io(std::io::ErrorKind::ConnectionRefused.into()));
            }
            let (a, b) = UnixStream::pair()?;
            r.sockets.lock().unwrap().push(a.try_clone()?);
            let export = Export::open(&r.root)?;
            let opts = ServerOptions {
                lease_ms: 60_000,
                // Commits always grouped, whatever the disk's speed.
                group_sync_min: std::time::Duration::ZERO,
                ..ServerOptions::default()
            };
            std::thread::spawn(move || {
                let staging = Arc::new(ferry_store::MemStore::new(ferry_format::HashAlg::Blake3));
                let mut server = Server::new(export, opts, staging);
                let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
            });
            Session::over_asking(
                b.try_clone()?,
                Box::new(b),
                Box::new(|| Ok(())),
                ferry_mount::FEATURES,
            )
        });
        let opts = Options {
            cache_dir: cache.to_path_buf(),
            cache_size: 1 << 30,
            timeout: Duration::from_secs(30),
            chunker: Default::default(),
            lookaside: None,
            providers: Default::default(),
            strict_close: false,
        };
        Vfs::new(connect, WirePath::default(), opts).unwrap()
    }

    fn stop(&self) {
        self.down.store(true, Ordering::Release);
        for s in self.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn read(v: &Vfs, name: &str) -> Result<Vec<u8>, Errno> {
    let s = v.lookup(ROOT, name.as_bytes())?;
    let o = v.open(s.ino, false, false)?;
    let mut out = vec![];
    let r = loop {
        match v.read(o.fh, out.len() as u64, 1 << 16) {
            Ok(d) if d.is_empty() => break Ok(out),
            Ok(d) => out.extend(d),
            Err(e) => break Err(e),
        }
    };
    v.release(o.fh)?;
    r
}

/// Writes `data` at `offset` of `name` (cut to nothing first with `truncate`) and closes it:
/// the answer of the close.
fn change(v: &Vfs, name: &str, truncate: bool, offset: u64, data: &[u8]) -> Result<(), Errno> {
    let s = v.lookup(ROOT, name.as_bytes())?;
    let o = v.open(s.ino, true, truncate)?;
    v.write(o.fh, offset, data)?;
    let r = v.flush(o.fh);
    v.release(o.fh)?;
    r
}

#[test]
fn the_mount_cache_keeps_changes_and_never_mislabels_a_copy() {
    rounds("mount", round);
}

/// A file of a round: the server's bytes, the change made offline (cut to nothing first or
/// not, where, what), and the bytes after it.
struct File {
    name: String,
    old: Vec<u8>,
    truncate: bool,
    offset: u64,
    data: Vec<u8>,
    new: Vec<u8>,
}

/// The files of round `r`.
fn files(r: u64) -> Vec<File> {
    let s = r << 32;
    let mut out = vec![];
    for i in 0..3u64 {
        let len = [700, 20_000, 90_000][i as usize] + (r as usize * 997) % 5_000;
        let old = bytes(s | i, len);
        let (truncate, offset, data) = match i {
            // Rewritten whole.
            0 => (true, 0, bytes(s | 10, len + 300)),
            // A piece changed in the middle.
            1 => (false, (len / 3) as u64, bytes(s | 11, 2_000)),
            // Appended to.
            _ => (false, len as u64, bytes(s | 12, 10_000)),
        };
        let mut new = if truncate { vec![] } else { old.clone() };
        let end = offset as usize + data.len();
        if new.len() < end {
            new.resize(end, 0);
        }
        new[offset as usize..end].copy_from_slice(&data);
        out.push(File {
            name: format!("f{i}"),
            old,
            truncate,
            offset,
            data,
            new,
        });
    }
    out
}

fn round(r: u64) -> Report {
    let rec = recorder();
    let server = tempfile::tempdir().unwrap();
    let export = server.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let files = files(r);
    for f in &files {
        std::fs::write(export.join(&f.name), &f.old).unwrap();
    }
    let remote = Remote::new(&export);
    let cache = rec.path().join("cache");
    {
        let v = remote.client(&cache);
        for f in &files {
            assert_eq!(read(&v, &f.name).unwrap(), f.old);
        }
        rec.mark("read");
        remote.stop();
        for (i, f) in files.iter().enumerate() {
            let r = change(&v, &f.name, f.truncate, f.offset, &f.data);
            let kept = "kept here, not written back";
            assert_eq!(r, Err(Errno::EHOSTDOWN), "{}: {kept}", f.name);
            rec.mark(format!("{i}"));
        }
    }
    let trace = rec.finish();
    let checker = Remote::new(&export);
    crash_all("mount", &trace, |c| {
        let done: Vec<usize> = c.acked.iter().filter_map(|m| m.parse().ok()).collect();
        let cache = c.dir.join("cache");
        if !cache.exists() {
            return Ok(());
        }
        labels_are_true(&cache, &export)?;
        let v = checker.client(&cache);
        for (i, File { name, old, new, .. }) in files.iter().enumerate() {
            let got = read(&v, name).map_err(|e| format!("{name}: {e:?}"))?;
            let under_way = !done.contains(&i) && (i == 0 || done.contains(&(i - 1)));
            let ok = if done.contains(&i) {
                got == *new
            } else if under_way && c.acked.iter().any(|m| m == "read") {
                // A crash during the change: either whole version, or (the change made no
                // promise yet) bytes of both.
                true
            } else {
                got == *old
            };
            if !ok {
                return Err(format!(
                    "{name} reads {} bytes, neither what its last close kept nor the server's (change done: {})",
                    got.len(),
                    done.contains(&i)
                ));
            }
        }
        Ok(())
    })
}

/// Every record of a clean copy (`files/<k>.meta`, JSON: path, version, dirty) whose copy
/// exists: the copy holds the bytes the server has at that path (the export is unchanged, so
/// the version it names is the one there).
fn labels_are_true(cache: &Path, export: &Path) -> Result<(), String> {
    let Ok(entries) = std::fs::read_dir(cache.join("files")) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "meta") {
            continue;
        }
        let Some(rec) = std::fs::read(&p).ok().and_then(|b| parse_record(&b)) else {
            continue;
        };
        let (path, dirty) = rec;
        let Ok(copy) = std::fs::read(p.with_extension("")) else {
            continue;
        };
        let server = std::fs::read(export.join(String::from_utf8_lossy(&path).as_ref()))
            .map_err(|e| format!("{e}"))?;
        if !dirty && copy != server {
            return Err(format!(
                "the copy of {} is labelled a server version but holds other bytes ({} of {})",
                String::from_utf8_lossy(&path),
                copy.len(),
                server.len()
            ));
        }
    }
    Ok(())
}

/// `{"path": [bytes], "version": N or null, "dirty": bool}` (docs/mount.md): the path and
/// whether dirty; `None` if it does not parse (torn: the mount ignores it too).
fn parse_record(b: &[u8]) -> Option<(Vec<u8>, bool)> {
    let v: serde_json::Value = serde_json::from_slice(b).ok()?;
    let path = v["path"]
        .as_array()?
        .iter()
        .map(|x| x.as_u64().and_then(|b| u8::try_from(b).ok()))
        .collect::<Option<Vec<u8>>>()?;
    Some((path, v["dirty"].as_bool()?))
}
