//! The mount's file system logic (`ferry_mount::Vfs`, no kernel) under arbitrary operation
//! sequences from two clients of one export, each session served in-process on a thread,
//! against a model: a map from paths to files (their bytes, shared by a file's hard links)
//! and directories.
//!
//! Every operation is whole, as a program's open, write and close are: so after each one,
//! close-to-open says every later open (either client's) sees it. After each operation: the
//! answer agrees with the model (the same success, or one of the error numbers POSIX allows),
//! what a client reads is the model's, and the export on the server's disk holds exactly the
//! model, its names of one file being one file there. No panic, no hang.
//!
//! The first byte of the input chooses two clients without leases, or one with leases alone
//! (its cached listings and attributes must follow its own changes: the server breaks none of
//! its leases for them). The rest is a run of operations, five bytes each: code, client and
//! path (one byte: which
//! client, and one of 12 paths of at most two levels over the names `a`, `b`, `c`), and three
//! bytes of arguments. With one client, a code from 248 up makes a special file (FIFO, socket
//! or device node: the client's own, never on the server's disk).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferry_fs::{Export, Server, ServerOptions, Session};
use ferry_mount::{Errno, Ino, Options, Vfs, ROOT};
use ferry_proto::{FileKind, WirePath};

/// A file's bytes, shared by its names (hard links).
type Bytes = Rc<RefCell<Vec<u8>>>;

/// What the model holds at a path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    File(Bytes),
    Dir,
    /// A FIFO, socket or device node: the client's own, never on the server.
    Special,
}

impl Node {
    fn default_file() -> Node {
        Node::File(Rc::new(RefCell::new(vec![])))
    }
}

type Model = BTreeMap<Vec<String>, Node>;

const NAMES: [&str; 3] = ["a", "b", "c"];

/// One of 12 paths: `a`, `b`, `c`, or two of them (`a/b`).
fn path(b: u8) -> Vec<String> {
    let i = b as usize % 12;
    if i < 3 {
        vec![NAMES[i].into()]
    } else {
        vec![NAMES[(i - 3) / 3].into(), NAMES[(i - 3) % 3].into()]
    }
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    blake3::Hasher::new_derive_key("ferry vfs fuzz")
        .update(&[seed])
        .finalize_xof()
        .fill(&mut v);
    v
}

/// The threads serving sessions: joined once the clients are gone (so that nothing of an
/// input outlives it: libFuzzer's leak check).
type Servers = Arc<std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>>;

/// Serves `root` to a new session per connection, each on a thread, granting leases of
/// `lease_ms`.
fn connector(root: &Path, servers: &Servers, lease_ms: u32) -> ferry_mount::Connector {
    let (root, servers) = (root.to_path_buf(), servers.clone());
    Box::new(move || {
        let (a, b) = UnixStream::pair()?;
        let export = Export::open(&root)?;
        let opts = ServerOptions {
            lease_ms,
            ..ServerOptions::default()
        };
        let server = std::thread::spawn(move || {
            let staging = Arc::new(ferry_store::MemStore::new(ferry_format::HashAlg::Blake3));
            let mut server = Server::new(export, opts, staging);
            let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
        });
        servers.lock().unwrap().push(server);
        Session::over_asking(
            b.try_clone()?,
            Box::new(b),
            Box::new(|| Ok(())),
            ferry_mount::FEATURES,
        )
    })
}

/// The parent of `p` in the model: `Err` with the error numbers its lookup may give.
fn parent_ok(model: &Model, p: &[String]) -> Result<(), Vec<Errno>> {
    match &p[..p.len() - 1] {
        [] => Ok(()),
        parent => match model.get(parent) {
            Some(Node::Dir) => Ok(()),
            Some(Node::File(_) | Node::Special) => Err(vec![Errno::ENOTDIR]),
            None => Err(vec![Errno::ENOENT]),
        },
    }
}

fn has_children(model: &Model, p: &[String]) -> bool {
    model.keys().any(|k| k.len() > p.len() && k.starts_with(p))
}

/// Looks `p` up from the root through the client, component by component.
fn resolve(v: &Vfs, p: &[String]) -> Result<Ino, Errno> {
    let mut ino = ROOT;
    for name in p {
        ino = v.lookup(ino, name.as_bytes())?.ino;
    }
    Ok(ino)
}

/// The parent directory of `p`, looked up, and `p`'s last name.
fn resolve_parent<'a>(v: &Vfs, p: &'a [String]) -> Result<(Ino, &'a [u8]), Errno> {
    Ok((resolve(v, &p[..p.len() - 1])?, p[p.len() - 1].as_bytes()))
}

/// Opens (creating if need be), writes `data` at `offset`, closes.
fn write(v: &Vfs, p: &[String], offset: u64, data: &[u8]) -> Result<(), Errno> {
    let (dir, name) = resolve_parent(v, p)?;
    let fh = match v.lookup(dir, name) {
        Ok(s) if s.kind == FileKind::Dir => return Err(Errno::EISDIR),
        Ok(s) => v.open(s.ino, true, false)?.fh,
        // As a shell's `>` (truncating: made on the server by the commit, where the listing
        // is leased), as `open(O_CREAT|O_EXCL)` (likewise, unless someone else made the name),
        // or as `open(O_CREAT)`.
        Err(Errno::ENOENT) => match offset % 3 {
            0 => v.create_later(dir, name, 0o644)?.1.fh,
            1 => v.create_excl(dir, name, 0o644)?.1.fh,
            _ => v.create(dir, name, 0o644, false)?.1.fh,
        },
        Err(e) => return Err(e),
    };
    let r = v
        .write(fh, offset, data)
        .map(drop)
        .and_then(|_| v.flush(fh));
    v.release(fh)?;
    r
}

fn read(v: &Vfs, p: &[String]) -> Result<Vec<u8>, Errno> {
    let s = v.lookup(resolve(v, &p[..p.len() - 1])?, p[p.len() - 1].as_bytes())?;
    if s.kind == FileKind::Dir {
        return Err(Errno::EISDIR);
    }
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

/// What the model says of an operation: the error numbers it may fail with, or success.
fn expect(r: Result<(), Errno>, allowed: Result<(), Vec<Errno>>, what: &str) {
    match (r, allowed) {
        (Ok(()), Ok(())) => {}
        (Err(e), Err(allowed)) if allowed.contains(&e) => {}
        (r, allowed) => panic!("{what}: the mount answered {r:?}, the model {allowed:?}"),
    }
}

/// The export on disk, as the model would hold it (Ferry's own entries left out).
fn on_disk(root: &Path) -> Model {
    fn walk(dir: &Path, at: &mut Vec<String>, out: &mut Model) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            if name.starts_with(".ferry-") {
                continue;
            }
            at.push(name);
            let m = e.metadata().unwrap();
            if m.is_dir() {
                out.insert(at.clone(), Node::Dir);
                walk(&e.path(), at, out);
            } else {
                let data = std::fs::read(e.path()).unwrap();
                out.insert(at.clone(), Node::File(Rc::new(RefCell::new(data))));
            }
            at.pop();
        }
    }
    let mut out = Model::new();
    walk(root, &mut vec![], &mut out);
    out
}

/// Runs the operations of `data` (see the module's documentation).
pub fn run(data: &[u8]) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let servers = Servers::default();
    let client = |name: &str, lease_ms: u32| {
        let opts = Options {
            cache_dir: t.path().join(name),
            cache_size: 1 << 30,
            timeout: Duration::from_secs(60),
            chunker: Default::default(),
            lookaside: None,
            providers: Default::default(),
            strict_close: false,
        };
        Vfs::new(
            connector(&root, &servers, lease_ms),
            WirePath::default(),
            opts,
        )
        .unwrap()
    };
    // Two clients without leases (every open asks the server, so each sees the other's
    // closes at once); or one with leases, alone (its cached listings and attributes must
    // follow its own changes: the server breaks none of its leases for them).
    let clients = match mode & 1 {
        0 => vec![client("a", 0), client("b", 0)],
        _ => vec![client("a", 60_000)],
    };
    let views = [&clients[0], &clients[clients.len() - 1]];
    let mut model = Model::new();
    for op in data.chunks_exact(5).take(48) {
        // Special files are one client's own: made only when there is one.
        if clients.len() == 1 && op[0] >= 248 {
            mknod(views[0], &mut model, op);
        } else {
            step(&views, &mut model, op);
        }
        // Removals acknowledged here reach the server before the next request, or when the
        // mount's thread sends them: now.
        for v in views {
            v.send_changes(Duration::ZERO);
        }
        let served: Model = model
            .iter()
            .filter(|(_, n)| **n != Node::Special)
            .map(|(k, n)| (k.clone(), n.clone()))
            .collect();
        assert_eq!(on_disk(&root), served, "the export after {op:?}");
        same_files(&root, &model);
    }
    drop(clients);
    for s in std::mem::take(&mut *servers.lock().unwrap()) {
        s.join().unwrap();
    }
}

/// The model's names of one file are one file in the export, and its different files are
/// different files there.
fn same_files(root: &Path, model: &Model) {
    use std::os::unix::fs::MetadataExt;
    let files: Vec<(&Vec<String>, &Bytes, u64)> = model
        .iter()
        .filter_map(|(p, n)| match n {
            Node::File(b) => Some((p, b, std::fs::metadata(root.join(p.join("/"))).ok()?.ino())),
            _ => None,
        })
        .collect();
    for (p, a, i) in &files {
        for (q, b, j) in &files {
            assert_eq!(Rc::ptr_eq(a, b), i == j, "{p:?} and {q:?}: one file?");
        }
    }
}

/// A FIFO, socket or device node made at the path `op` names.
fn mknod(v: &Vfs, model: &mut Model, op: &[u8]) {
    use ferry_mount::SpecialKind as K;
    let p = path(op[1] & 0x7f);
    let kind = [K::Fifo, K::Socket, K::CharDevice, K::BlockDevice][op[2] as usize % 4];
    let r = resolve_parent(v, &p).and_then(|(d, n)| v.mknod(d, n, kind, 0o644, 0).map(drop));
    let allowed = parent_ok(model, &p).and_then(|()| match model.get(&p) {
        Some(_) => Err(vec![Errno::EEXIST]),
        None => Ok(()),
    });
    if allowed.is_ok() {
        model.insert(p.clone(), Node::Special);
    }
    expect(r, allowed, &format!("mknod {op:?} {}", p.join("/")));
}

/// One operation: applied through a client and to the model, the answers compared.
fn step(clients: &[&Vfs; 2], model: &mut Model, op: &[u8]) {
    let v = clients[(op[1] >> 7) as usize];
    let p = path(op[1] & 0x7f);
    let (x, y) = (op[3] as u64, op[4] as u64);
    let what = format!("{:?} {}", op, p.join("/"));
    // The kernel opens a special file itself: writes and reads never reach the mount.
    let special = parent_ok(model, &p).is_ok() && model.get(&p) == Some(&Node::Special);
    if special && matches!(op[0] % 9, 0 | 2) {
        return;
    }
    match op[0] % 9 {
        // Write: at an offset up to 48 KiB, up to 24 KiB (across chunk boundaries).
        0 => {
            let (offset, len) = ((x << 8) % (48 << 10), (y << 7) as usize % (24 << 10));
            let data = bytes(op[2], len);
            let allowed = parent_ok(model, &p).and_then(|()| match model.get(&p) {
                Some(Node::Dir) => Err(vec![Errno::EISDIR]),
                _ => Ok(()),
            });
            let r = write(v, &p, offset, &data);
            if allowed.is_ok() {
                let node = model.entry(p.clone()).or_insert_with(Node::default_file);
                let Node::File(f) = node else { unreachable!() };
                let mut f = f.borrow_mut();
                // An empty write changes nothing, wherever it is.
                if !data.is_empty() {
                    let end = offset as usize + data.len();
                    if f.len() < end {
                        f.resize(end, 0);
                    }
                    f[offset as usize..end].copy_from_slice(&data);
                }
            }
            expect(r, allowed, &what);
        }
        // Truncate (or extend) to a size up to 64 KiB.
        1 => {
            let size = ((x << 8) | y) % (64 << 10);
            let r = resolve(v, &p).and_then(|ino| v.setattr(ino, None, Some(size), None).map(drop));
            let allowed = parent_ok(model, &p).and_then(|()| match model.get_mut(&p) {
                Some(Node::File(f)) => {
                    f.borrow_mut().resize(size as usize, 0);
                    Ok(())
                }
                Some(Node::Dir) => Err(vec![Errno::EISDIR]),
                Some(Node::Special) => Err(vec![Errno::EINVAL]),
                None => Err(vec![Errno::ENOENT]),
            });
            expect(r, allowed, &what);
        }
        2 => {
            let r = read(v, &p);
            match (parent_ok(model, &p), model.get(&p)) {
                (Ok(()), Some(Node::File(want))) => {
                    assert_eq!(r.as_deref(), Ok(&want.borrow()[..]), "{what}: read")
                }
                (Ok(()), Some(Node::Dir)) => expect(r.map(drop), Err(vec![Errno::EISDIR]), &what),
                // Not read through the mount (returned above).
                (Ok(()), Some(Node::Special)) => {}
                (Ok(()), None) => expect(r.map(drop), Err(vec![Errno::ENOENT]), &what),
                (Err(allowed), _) => expect(r.map(drop), Err(allowed), &what),
            }
        }
        3 => {
            // As the kernel does: a name that exists is EEXIST before the mount is asked.
            let r = resolve_parent(v, &p).and_then(|(d, n)| match v.lookup(d, n) {
                Ok(_) => Err(Errno::EEXIST),
                Err(Errno::ENOENT) => v.mkdir(d, n, 0o755).map(drop),
                Err(e) => Err(e),
            });
            let allowed = parent_ok(model, &p).and_then(|()| match model.get(&p) {
                Some(_) => Err(vec![Errno::EEXIST]),
                None => Ok(()),
            });
            if allowed.is_ok() {
                model.insert(p.clone(), Node::Dir);
            }
            expect(r, allowed, &what);
        }
        4 => {
            let r = resolve_parent(v, &p).and_then(|(d, n)| v.rmdir(d, n));
            let allowed = parent_ok(model, &p).and_then(|()| match model.get(&p) {
                Some(Node::Dir) if has_children(model, &p) => {
                    Err(vec![Errno::ENOTEMPTY, Errno::EEXIST])
                }
                Some(Node::Dir) => Ok(()),
                Some(Node::File(_) | Node::Special) => Err(vec![Errno::ENOTDIR]),
                None => Err(vec![Errno::ENOENT]),
            });
            if allowed.is_ok() {
                model.remove(&p);
            }
            expect(r, allowed, &what);
        }
        5 => {
            let r = resolve_parent(v, &p).and_then(|(d, n)| v.unlink(d, n));
            let allowed = parent_ok(model, &p).and_then(|()| match model.get(&p) {
                Some(Node::File(_) | Node::Special) => Ok(()),
                Some(Node::Dir) => Err(vec![Errno::EISDIR, Errno::EPERM]),
                None => Err(vec![Errno::ENOENT]),
            });
            if allowed.is_ok() {
                model.remove(&p);
            }
            expect(r, allowed, &what);
        }
        6 => {
            let to = path(op[2]);
            // As the kernel does: the source is looked up first.
            let r = resolve_parent(v, &p).and_then(|(d, n)| {
                v.lookup(d, n)?;
                let (d2, n2) = resolve_parent(v, &to)?;
                v.rename(d, n, d2, n2, false)
            });
            let allowed = rename(model, &p, &to);
            expect(r, allowed, &format!("{what} -> {}", to.join("/")));
        }
        7 => {
            let to = path(op[2]);
            // As the kernel does: the source is looked up, then the new name (EEXIST if it
            // is there, before the mount is asked).
            let r = resolve(v, &p).and_then(|ino| {
                let (d, n) = resolve_parent(v, &to)?;
                match v.lookup(d, n) {
                    Ok(_) => Err(Errno::EEXIST),
                    Err(Errno::ENOENT) => v.link(ino, d, n).map(drop),
                    Err(e) => Err(e),
                }
            });
            let allowed = link(model, &p, &to);
            expect(r, allowed, &format!("{what} => {}", to.join("/")));
        }
        _ => {
            let r = resolve(v, &p).and_then(|ino| v.readdir(ino));
            match (parent_ok(model, &p), model.get(&p)) {
                (Ok(()), Some(Node::Dir)) => {
                    let mut got: Vec<_> = r
                        .unwrap_or_else(|e| panic!("{what}: readdir {e:?}"))
                        .into_iter()
                        .map(|(_, _, n)| String::from_utf8(n).unwrap())
                        .filter(|n| n != "." && n != "..")
                        .collect();
                    got.sort();
                    let want: Vec<_> = model
                        .keys()
                        .filter(|k| k.len() == p.len() + 1 && k.starts_with(&p))
                        .map(|k| k[p.len()].clone())
                        .collect();
                    assert_eq!(got, want, "{what}: readdir");
                }
                (Ok(()), Some(Node::File(_) | Node::Special)) => {
                    expect(r.map(drop), Err(vec![Errno::ENOTDIR]), &what)
                }
                (Ok(()), None) => expect(r.map(drop), Err(vec![Errno::ENOENT]), &what),
                (Err(allowed), _) => expect(r.map(drop), Err(allowed), &what),
            }
        }
    }
}

/// A hard link in the model, as POSIX has it; `Err` with the error numbers it may fail with.
fn link(model: &mut Model, from: &[String], to: &[String]) -> Result<(), Vec<Errno>> {
    // Linux's order: the source, the new name, then the source's kind.
    parent_ok(model, from)?;
    let node = model.get(from).cloned().ok_or(vec![Errno::ENOENT])?;
    parent_ok(model, to)?;
    if model.contains_key(to) {
        return Err(vec![Errno::EEXIST]);
    }
    if node == Node::Dir {
        return Err(vec![Errno::EPERM]);
    }
    model.insert(to.to_vec(), node);
    Ok(())
}

/// A rename in the model, as POSIX has it; `Err` with the error numbers it may fail with.
fn rename(model: &mut Model, from: &[String], to: &[String]) -> Result<(), Vec<Errno>> {
    let mut errs = vec![];
    for p in [from, to] {
        if let Err(e) = parent_ok(model, p) {
            errs.extend(e);
        }
    }
    let src = model.get(from).cloned();
    let dst = model.get(to).cloned();
    match (&src, &dst) {
        (None, _) => errs.push(Errno::ENOENT),
        _ if from == to => {}
        // Two names of one file: nothing happens.
        (Some(Node::File(a)), Some(Node::File(b))) if Rc::ptr_eq(a, b) => return Ok(()),
        // Into itself.
        (Some(Node::Dir), _) if to.starts_with(from) => errs.push(Errno::EINVAL),
        // Over a directory holding it (Linux: ENOTEMPTY, before the kinds are compared).
        _ if from.starts_with(to) => errs.extend([Errno::ENOTEMPTY, Errno::EISDIR]),
        (Some(Node::File(_) | Node::Special), Some(Node::Dir)) => errs.push(Errno::EISDIR),
        (Some(Node::Dir), Some(Node::File(_) | Node::Special)) => errs.push(Errno::ENOTDIR),
        (Some(Node::Dir), Some(Node::Dir)) if has_children(model, to) => {
            errs.extend([Errno::ENOTEMPTY, Errno::EEXIST])
        }
        _ => {}
    }
    // Where `to`'s parent is `from` itself or below it (moved meanwhile), its lookup may fail.
    if !errs.is_empty() {
        return Err(errs);
    }
    if from == to {
        return Ok(());
    }
    let moved: Vec<_> = model
        .keys()
        .filter(|k| k.starts_with(from))
        .cloned()
        .collect();
    model.retain(|k, _| !k.starts_with(to));
    for k in moved {
        let node = model.remove(&k).unwrap();
        let mut n = to.to_vec();
        n.extend_from_slice(&k[from.len()..]);
        model.insert(n, node);
    }
    Ok(())
}
