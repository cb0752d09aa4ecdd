//! The test harness: an export served to clients on threads, with a server that can be cut,
//! refused or held, and helpers that act as programs do.

use super::*;
use std::io::Write as _;

/// An export served to any number of clients, each session on a thread of its own; the
/// server can be made unreachable and every open session cut.
#[derive(Clone)]
pub struct Remote {
    root: std::path::PathBuf,
    lease_ms: u32,
    down: Arc<AtomicBool>,
    /// How long making a session takes (milliseconds; a slow link's ssh).
    pub connect_ms: Arc<std::sync::atomic::AtomicU64>,
    sockets: Arc<Mutex<Vec<UnixStream>>>,
    /// Sessions made so far.
    made: Arc<std::sync::atomic::AtomicUsize>,
    /// The session (by the order made, from 0) whose server takes no request while set.
    held: Arc<(Mutex<Hold>, std::sync::Condvar)>,
    /// The `Sync` requests each session's server received, by the order made.
    syncs: Arc<Mutex<Vec<usize>>>,
    outputs: Arc<Mutex<Outputs>>,
}

/// What the servers sent, per session: bytes held back while a session's output is held
/// (see [`Remote::hold_output`]), and the names its `Changed` frames told.
#[derive(Default)]
struct Outputs {
    held: Option<usize>,
    /// Per session: the bytes held back, and the names told in them.
    waiting: Vec<(Vec<u8>, Vec<WirePath>)>,
    sockets: Vec<Option<UnixStream>>,
}

/// A server's output that holds back what it writes while its session's output is held.
struct Valve {
    session: usize,
    frames: ferry_proto::Inflow,
    outputs: Arc<Mutex<Outputs>>,
}

impl std::io::Write for Valve {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut told = vec![];
        self.frames.feed(buf);
        while let Ok(Some(f)) = self.frames.next_frame() {
            match ferry_proto::Message::decode(&f) {
                Ok(ferry_proto::Message::Changed { path, .. }) => told.push(path),
                // As the client's reader does: one zstd stream after the Compressed.
                Ok(ferry_proto::Message::Compressed) => {
                    let _ = self.frames.start_zstd();
                }
                _ => {}
            }
        }
        let mut o = self.outputs.lock().unwrap();
        if o.held == Some(self.session) {
            let (bytes, names) = &mut o.waiting[self.session];
            bytes.extend_from_slice(buf);
            names.extend(told);
            return Ok(buf.len());
        }
        let socket = o.sockets[self.session].as_mut().expect("kept");
        socket.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A server's input that passes nothing on while its session is held (see [`Remote::hold`]).
struct Gated {
    input: UnixStream,
    session: usize,
    held: Arc<(Mutex<Hold>, std::sync::Condvar)>,
    /// Reads the requests as they pass, to count the Syncs.
    frames: ferry_proto::Inflow,
    syncs: Arc<Mutex<Vec<usize>>>,
}

#[derive(Default)]
struct Hold {
    session: Option<usize>,
    /// A request of the held session arrived and is held.
    holding: bool,
}

impl std::io::Read for Gated {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.input.read(buf)?;
        self.frames.feed(&buf[..n]);
        while let Ok(Some(f)) = self.frames.next_frame() {
            match ferry_proto::Message::decode(&f) {
                Ok(ferry_proto::Message::Request(ferry_proto::Request::Sync)) => {
                    self.syncs.lock().unwrap()[self.session] += 1;
                }
                // As the server's reader does: one zstd stream after the Compressed.
                Ok(ferry_proto::Message::Compressed) => {
                    let _ = self.frames.start_zstd();
                }
                _ => {}
            }
        }
        let (lock, changed) = &*self.held;
        let mut h = lock.lock().unwrap();
        if h.session == Some(self.session) {
            h.holding = true;
            changed.notify_all();
            while h.session == Some(self.session) {
                h = changed.wait(h).unwrap();
            }
            h.holding = false;
        }
        Ok(n)
    }
}

impl std::os::fd::AsFd for Gated {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.input.as_fd()
    }
}

impl Remote {
    pub fn new(root: &Path, lease_ms: u32) -> Remote {
        Remote {
            root: root.to_path_buf(),
            lease_ms,
            down: Arc::default(),
            connect_ms: Arc::default(),
            sockets: Arc::default(),
            made: Arc::default(),
            held: Arc::default(),
            syncs: Arc::default(),
            outputs: Arc::default(),
        }
    }

    /// Holds back what the server of session `n` (by the order made, from 0) sends, replies
    /// and news alike, until [`pass_output`](Self::pass_output): a slow pipe.
    pub fn hold_output(&self, n: usize) {
        self.outputs.lock().unwrap().held = Some(n);
    }

    /// The names told in `Changed` frames held back so far.
    pub fn output_told(&self, n: usize) -> Vec<WirePath> {
        let o = self.outputs.lock().unwrap();
        o.waiting.get(n).map(|w| w.1.clone()).unwrap_or_default()
    }

    /// How many bytes session `n`'s server sent that are held back.
    pub fn output_held(&self, n: usize) -> usize {
        let o = self.outputs.lock().unwrap();
        o.waiting.get(n).map_or(0, |w| w.0.len())
    }

    /// Sends on the first `len` bytes held back (see [`output_held`](Self::output_held)), and
    /// holds back the rest and what follows.
    pub fn pass_output_upto(&self, len: usize) {
        let mut o = self.outputs.lock().unwrap();
        let Some(n) = o.held else { return };
        let bytes: Vec<u8> = o.waiting[n].0.drain(..len).collect();
        if let Some(s) = o.sockets[n].as_mut() {
            let _ = s.write_all(&bytes);
        }
    }

    /// Sends on what the held session's server sent, and holds nothing back from now on.
    pub fn pass_output(&self) {
        let mut o = self.outputs.lock().unwrap();
        let Some(n) = o.held.take() else { return };
        let bytes = std::mem::take(&mut o.waiting[n].0);
        o.waiting[n].1.clear();
        if let Some(s) = o.sockets[n].as_mut() {
            let _ = s.write_all(&bytes);
        }
    }

    /// The `Sync` requests session `n` (by the order made, from 0) received so far.
    pub fn syncs(&self, n: usize) -> usize {
        self.syncs.lock().unwrap().get(n).copied().unwrap_or(0)
    }

    /// Holds the requests of session `n` (by the order made, from 0) until [`free`](Self::free):
    /// they reach its server, which handles none of them meanwhile.
    pub fn hold(&self, n: usize) {
        self.held.0.lock().unwrap().session = Some(n);
    }

    /// Waits until a request of the session held has reached its server.
    pub fn wait_held(&self) {
        let (lock, changed) = &*self.held;
        let (h, _) = changed
            .wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(120), |h| {
                !h.holding
            })
            .unwrap();
        assert!(h.holding, "no request of the session held came");
    }

    /// Sessions made so far.
    pub fn sessions_made(&self) -> usize {
        self.made.load(Ordering::Acquire)
    }

    pub fn free(&self) {
        self.held.0.lock().unwrap().session = None;
        self.held.1.notify_all();
    }

    pub fn connector(&self) -> ferry_mount::Connector {
        let r = self.clone();
        Box::new(move || {
            if r.down.load(Ordering::Acquire) {
                return Err(ConnError::Io(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "server down (test)",
                )));
            }
            std::thread::sleep(Duration::from_millis(r.connect_ms.load(Ordering::Acquire)));
            let (a, b) = UnixStream::pair()?;
            r.sockets.lock().unwrap().push(a.try_clone()?);
            let session = r.made.fetch_add(1, Ordering::AcqRel);
            {
                let mut syncs = r.syncs.lock().unwrap();
                if syncs.len() <= session {
                    syncs.resize(session + 1, 0);
                }
            }
            let input = Gated {
                input: a.try_clone()?,
                session,
                held: r.held.clone(),
                frames: ferry_proto::Inflow::new(),
                syncs: r.syncs.clone(),
            };
            let export = Export::open(&r.root)?;
            let opts = ServerOptions {
                lease_ms: r.lease_ms,
                // Commits always grouped, whatever the disk's speed.
                group_sync_min: std::time::Duration::ZERO,
                ..ServerOptions::default()
            };
            {
                let mut o = r.outputs.lock().unwrap();
                o.waiting.resize_with(session + 1, Default::default);
                o.sockets.resize_with(session + 1, || None);
                o.sockets[session] = Some(a.try_clone()?);
            }
            let output = Valve {
                session,
                frames: ferry_proto::Inflow::new(),
                outputs: r.outputs.clone(),
            };
            std::thread::spawn(move || {
                let staging = Arc::new(ferry_store::MemStore::new(ferry_format::HashAlg::Blake3));
                let mut server = Server::new(export, opts, staging);
                let _ = ferry_fs::serve(&mut server, input, output);
            });
            // As `ferry mount` does.
            Session::over_asking(
                b.try_clone()?,
                Box::new(b),
                Box::new(|| Ok(())),
                ferry_mount::FEATURES,
            )
        })
    }

    /// Cuts every session and refuses new ones.
    pub fn stop(&self) {
        self.down.store(true, Ordering::Release);
        for s in self.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn start(&self) {
        self.down.store(false, Ordering::Release);
    }
}

pub fn client(remote: &Remote, cache: &Path, timeout: Duration) -> Vfs {
    client_with(remote, cache, timeout, false)
}

/// A client, `strict_close` as given.
pub fn client_with(remote: &Remote, cache: &Path, timeout: Duration, strict_close: bool) -> Vfs {
    let opts = Options {
        cache_dir: cache.to_path_buf(),
        cache_size: 1 << 30,
        timeout,
        chunker: Default::default(),
        lookaside: None,
        providers: Default::default(),
        strict_close,
    };
    Vfs::new(remote.connector(), WirePath::default(), opts).unwrap()
}

/// A fresh export, its server, and one client of it with a cache of its own: (the directory
/// holding them, the export, the server, the client).
pub fn one_client() -> (tempfile::TempDir, std::path::PathBuf, Remote, Vfs) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let remote = Remote::new(&root, 60_000);
    let v = client(&remote, &t.path().join("c"), Duration::from_secs(5));
    (t, root, remote, v)
}

pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    blake3::Hasher::new_derive_key("ferry mount tests")
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut v);
    v
}

/// Opens `name` in the root, reads it whole, closes it.
pub fn read(v: &Vfs, name: &str) -> Result<Vec<u8>, Errno> {
    let s = v.lookup(ROOT, name.as_bytes())?;
    let o = v.open(s.ino, false, false)?;
    let mut out = vec![];
    loop {
        let d = v.read(o.fh, out.len() as u64, 1 << 16)?;
        if d.is_empty() {
            break;
        }
        out.extend(d);
    }
    v.flush(o.fh)?;
    v.release(o.fh)?;
    v.forget(s.ino, 1);
    Ok(out)
}

/// Creates or overwrites `name` in the root with `data`, as `cat > name` does.
pub fn write(v: &Vfs, name: &str, data: &[u8]) -> Result<(), Errno> {
    let (ino, fh) = match v.lookup(ROOT, name.as_bytes()) {
        Ok(s) => (s.ino, v.open(s.ino, true, true)?.fh),
        Err(Errno::ENOENT) => {
            let (s, o) = v.create(ROOT, name.as_bytes(), 0o644, false)?;
            (s.ino, o.fh)
        }
        Err(e) => return Err(e),
    };
    for (i, part) in data.chunks(1 << 16).enumerate() {
        v.write(fh, (i << 16) as u64, part)?;
    }
    let r = v.flush(fh);
    v.release(fh)?;
    v.forget(ino, 1);
    r
}

/// Makes `name` in `dir` with `data` through a create without `O_EXCL` or, with `excl`, an
/// exclusive one, as the kernel asks for them (each made by its commit where the listing is
/// leased); closes it.
pub fn make(v: &Vfs, dir: u64, name: &[u8], data: &[u8], excl: bool) {
    let (_, o) = match excl {
        true => v.create_excl(dir, name, 0o644),
        false => v.create_later(dir, name, 0o644),
    }
    .unwrap();
    v.write(o.fh, 0, data).unwrap();
    v.flush(o.fh).unwrap();
    v.release(o.fh).unwrap();
}

/// Lets each client take the lease breaks its server sent.
pub fn settle(clients: &[&Vfs]) {
    for _ in 0..20 {
        for c in clients {
            c.tick();
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

pub fn requests(v: &Vfs) -> u64 {
    v.traffic().unwrap().requests
}
