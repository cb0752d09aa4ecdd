//! A session with a server: the connection over a remote shell's standard input and output, or
//! over any other byte stream (the TLS daemon's, see `ferry-net`).
//!
//! The reading half runs on a thread of its own that hands the bytes over through a bounded
//! channel, so a reader can give up waiting: after a timeout (a link that went silent is
//! reported, not waited for forever: the mount must never hang), or at once when nothing has
//! arrived (to take the server's lease invalidations while idle, [`Connection::poll`]).
//! Commands that run to completion (`get`, `put`) leave the timeout unset and wait as long as
//! the link takes.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};

use crate::client::RemoteSpec;
use crate::conn::{ConnError, Connection};

/// The writing half of a session's byte stream.
pub type LinkWriter = Box<dyn Write + Send>;

/// Bytes read per message from the reading thread; at most [`QUEUED`] messages wait.
const READ_SIZE: usize = 256 * 1024;
const QUEUED: usize = 8;
/// "No timeout", in the shared cell.
const FOREVER: u64 = u64::MAX;
/// How often the reading thread looks up from waiting to see whether it is still wanted.
const WAKE: rustix::time::Timespec = rustix::time::Timespec {
    tv_sec: 0,
    tv_nsec: 100_000_000,
};

/// How long a [`LinkReader`]'s reads wait, shared with whoever sets it: `None` for as long as
/// it takes, zero not at all (only what already arrived is taken).
#[derive(Clone)]
pub(crate) struct ReadTimeout(Arc<AtomicU64>);

impl ReadTimeout {
    fn new() -> Self {
        ReadTimeout(Arc::new(AtomicU64::new(FOREVER)))
    }

    pub(crate) fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            FOREVER => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Sets it, to the millisecond (a wait under one rounds down to none).
    pub(crate) fn set(&self, t: Option<Duration>) {
        let ms = t.map_or(FOREVER, |d| (d.as_millis() as u64).min(FOREVER - 1));
        self.0.store(ms, Ordering::Relaxed);
    }
}

/// The reading half of a session's byte stream: what a thread reads from the transport,
/// handed over with an optional timeout.
pub struct LinkReader {
    rx: mpsc::Receiver<io::Result<(Instant, Vec<u8>)>>,
    pending: Vec<u8>,
    /// When the bytes handed out last were read from the transport.
    arrived: crate::conn::Arrivals,
    at: usize,
    /// The transport ended (or failed; the error was returned once).
    ended: bool,
    timeout: ReadTimeout,
    /// Tells the reading thread to let go of the transport.
    dropped: Arc<AtomicBool>,
    /// Written to wake the reading thread when it is told.
    wake: Option<Arc<std::os::fd::OwnedFd>>,
}

impl Drop for LinkReader {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Release);
        // Wakes the thread at once (else it notices within 100 ms).
        if let Some(w) = &self.wake {
            // Any non-zero count wakes it, in whichever byte order.
            let _ = rustix::io::write(w, &1u64.to_le_bytes());
        }
    }
}

impl LinkReader {
    /// Starts the thread reading `r`. The thread ends at the end of the stream, or as soon as
    /// this reader is dropped (an eventfd wakes it; without one, within 100 ms): it must not
    /// hold the transport open after that (a socket's other half, say, whose peer waits for
    /// the end).
    pub fn new(r: impl Read + AsFd + Send + 'static) -> LinkReader {
        let (tx, rx) = mpsc::sync_channel(QUEUED);
        let dropped = Arc::new(AtomicBool::new(false));
        let gone = dropped.clone();
        let wake = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .ok()
        .map(Arc::new);
        let woken = wake.clone();
        let spawned = std::thread::Builder::new()
            .name("ferry-recv".into())
            .spawn(move || {
                let mut r = r;
                let mut buf = vec![0u8; READ_SIZE];
                loop {
                    if gone.load(Ordering::Acquire) {
                        return;
                    }
                    let ready = {
                        let mut fds = vec![PollFd::new(&r, PollFlags::IN)];
                        if let Some(w) = &woken {
                            fds.push(PollFd::new(&**w, PollFlags::IN));
                        }
                        match poll(&mut fds, Some(&WAKE)) {
                            Ok(_) => !fds[0].revents().is_empty(),
                            Err(rustix::io::Errno::INTR) => false,
                            Err(e) => {
                                let _ = tx.send(Err(e.into()));
                                return;
                            }
                        }
                    };
                    if !ready {
                        continue;
                    }
                    let msg = match r.read(&mut buf) {
                        Ok(0) => Ok((Instant::now(), vec![])),
                        Ok(n) => Ok((Instant::now(), buf[..n].to_vec())),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => Err(e),
                    };
                    let last = !matches!(&msg, Ok((_, v)) if !v.is_empty());
                    // The reader is gone: nobody wants more.
                    if tx.send(msg).is_err() || last {
                        return;
                    }
                }
            });
        let rx = match spawned {
            Ok(_) => rx,
            Err(e) => {
                let (tx, rx) = mpsc::sync_channel(1);
                let _ = tx.send(Err(e));
                rx
            }
        };
        LinkReader {
            rx,
            pending: vec![],
            arrived: crate::conn::Arrivals::default(),
            at: 0,
            ended: false,
            timeout: ReadTimeout::new(),
            dropped,
            wake,
        }
    }

    /// When the bytes this reader handed out last arrived (see [`crate::conn::Arrivals`]).
    pub fn arrivals(&self) -> crate::conn::Arrivals {
        self.arrived.clone()
    }

    fn timeout(&self) -> Option<Duration> {
        self.timeout.get()
    }
}

impl Read for LinkReader {
    /// Waits at most the timeout for bytes: then fails with `TimedOut`, or with `WouldBlock`
    /// at once when the timeout is zero and nothing has arrived.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.pending.len() {
            if self.ended {
                return Ok(0);
            }
            let got = match self.timeout() {
                None => self.rx.recv().map_err(|_| ()),
                Some(d) if d.is_zero() => match self.rx.try_recv() {
                    Ok(m) => Ok(m),
                    Err(mpsc::TryRecvError::Empty) => return Err(io::ErrorKind::WouldBlock.into()),
                    Err(mpsc::TryRecvError::Disconnected) => Err(()),
                },
                Some(d) => match self.rx.recv_timeout(d) {
                    Ok(m) => Ok(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("nothing heard from the server for {} s", d.as_secs_f64()),
                        ))
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => Err(()),
                },
            };
            match got {
                Ok(Ok((t, v))) if !v.is_empty() => {
                    self.pending = v;
                    self.at = 0;
                    self.arrived.set(t);
                }
                Ok(Err(e)) => {
                    self.ended = true;
                    return Err(e);
                }
                Ok(Ok(_)) | Err(()) => {
                    self.ended = true;
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.pending.len() - self.at);
        buf[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A session with a server.
pub struct Session {
    pub conn: Connection<LinkReader, LinkWriter>,
    timeout: ReadTimeout,
    /// The reader's flag that lets go of the transport (see [`Session::hang_up_handle`]).
    hang_up: Arc<AtomicBool>,
    end: End,
}

/// What ends a session after hanging up.
enum End {
    /// The remote shell (or server) process carrying the session (shared with the
    /// connection's account of a failure before the session began).
    Child(Arc<std::sync::Mutex<Child>>),
    /// Anything else: waits for the thread carrying the stream, say.
    Other(Box<dyn FnOnce() -> io::Result<()> + Send>),
}

impl Session {
    /// Runs `RSH HOST REMOTE_FERRY serve --stdio [SERVE_ARGS] PATH` (the `-e` convention of
    /// rsync: RSH is split on white space) and opens a session over its standard input and
    /// output, sending at `zstd_level`.
    pub fn spawn(
        rsh: &str,
        remote_ferry: &str,
        spec: &RemoteSpec,
        serve_args: &[String],
        zstd_level: ferry_proto::Level,
    ) -> Result<Session, ConnError> {
        Self::spawn_asking(rsh, remote_ferry, spec, serve_args, zstd_level, 0)
    }

    /// Like [`spawn`](Self::spawn), asking also for the features in `ask` (as
    /// [`Connection::open_asking`]).
    pub fn spawn_asking(
        rsh: &str,
        remote_ferry: &str,
        spec: &RemoteSpec,
        serve_args: &[String],
        zstd_level: ferry_proto::Level,
        ask: u64,
    ) -> Result<Session, ConnError> {
        Self::spawn_pipelined(rsh, remote_ferry, spec, serve_args, zstd_level, ask)?.settled()
    }

    /// Like [`spawn_asking`](Self::spawn_asking), without waiting for the server's Hello (see
    /// [`Connection::open_pipelined`]): the caller's first requests go with this side's, in
    /// its round trip, and a failure to begin (the remote side's exit, a version refused)
    /// comes at their wait. For a session that goes straight to work (`get`, `put`).
    pub fn spawn_pipelined(
        rsh: &str,
        remote_ferry: &str,
        spec: &RemoteSpec,
        serve_args: &[String],
        zstd_level: ferry_proto::Level,
        ask: u64,
    ) -> Result<Session, ConnError> {
        let mut words = rsh.split_whitespace();
        let prog = words
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty --rsh command"))?;
        let mut cmd = Command::new(prog);
        cmd.args(words)
            .arg(&spec.host)
            .arg(remote_ferry)
            .args(["serve", "--stdio"])
            .args(serve_args)
            .arg(&spec.path);
        Self::command_asking(cmd, zstd_level, ask)
    }

    /// Runs `cmd`, which must speak the protocol on its standard input and output (a server:
    /// `ferry serve --stdio DIR`, however reached), and opens a session with it.
    pub fn command(cmd: Command) -> Result<Session, ConnError> {
        Self::command_with(cmd, crate::conn::DEFAULT_ZSTD_LEVEL)
    }

    /// Like [`command`](Self::command), sending at `zstd_level`.
    pub fn command_with(
        cmd: Command,
        zstd_level: ferry_proto::Level,
    ) -> Result<Session, ConnError> {
        Self::command_asking(cmd, zstd_level, 0)?.settled()
    }

    /// Waits for the server's Hello: a session that fails to begin fails here (a remote
    /// shell that exited is waited for), not at its first request.
    fn settled(mut self) -> Result<Session, ConnError> {
        match self.conn.settle_hello() {
            Ok(()) => Ok(self),
            Err(e) => {
                self.abort();
                Err(e)
            }
        }
    }

    fn command_asking(
        mut cmd: Command,
        zstd_level: ferry_proto::Level,
        ask: u64,
    ) -> Result<Session, ConnError> {
        let prog = cmd.get_program().to_string_lossy().into_owned();
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run {prog}: {e}")))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let reader = LinkReader::new(stdout);
        let (timeout, hang_up) = (reader.timeout.clone(), reader.dropped.clone());
        let arrivals = reader.arrivals();
        let mut conn = match Connection::open_pipelined(
            reader,
            Box::new(stdin) as LinkWriter,
            zstd_level,
            ask,
        ) {
            Ok(c) => c,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        conn.watch_reader(arrivals, timeout.clone());
        let child = Arc::new(std::sync::Mutex::new(child));
        let ended = child.clone();
        conn.before_hello(Box::new(move |e| exited_early(&ended, e)));
        Ok(Session {
            conn,
            timeout,
            hang_up,
            end: End::Child(child),
        })
    }

    /// Opens a session over an already connected byte stream; `finish` runs after hanging up.
    pub fn over(
        reader: impl Read + AsFd + Send + 'static,
        writer: LinkWriter,
        finish: Box<dyn FnOnce() -> io::Result<()> + Send>,
    ) -> Result<Session, ConnError> {
        Self::over_asking(reader, writer, finish, 0)
    }

    /// Like [`over`](Self::over), asking also for the features in `ask` (as
    /// [`Connection::open_asking`]).
    pub fn over_asking(
        reader: impl Read + AsFd + Send + 'static,
        writer: LinkWriter,
        finish: Box<dyn FnOnce() -> io::Result<()> + Send>,
        ask: u64,
    ) -> Result<Session, ConnError> {
        let reader = LinkReader::new(reader);
        let (timeout, hang_up) = (reader.timeout.clone(), reader.dropped.clone());
        let arrivals = reader.arrivals();
        let mut conn =
            Connection::open_pipelined(reader, writer, crate::conn::DEFAULT_ZSTD_LEVEL, ask)?;
        conn.watch_reader(arrivals, timeout.clone());
        conn.settle_hello()?;
        Ok(Session {
            conn,
            timeout,
            hang_up,
            end: End::Other(finish),
        })
    }

    /// A number that tells this session from every other one alive in the process.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.hang_up) as usize
    }

    /// A handle that ends the session's reading from another thread: within 100 ms a wait for
    /// the server fails (the session counts as closed), even one already blocked. For a link
    /// that went silent under a thread that cannot be told otherwise.
    pub fn hang_up_handle(&self) -> Arc<AtomicBool> {
        self.hang_up.clone()
    }

    /// How long a wait for the server may last before the link counts as failed (`TimedOut`);
    /// `None` waits as long as it takes, zero only takes what has already arrived.
    pub fn set_read_timeout(&self, t: Option<Duration>) {
        self.timeout.set(t);
    }

    /// Hangs up and waits for the remote side.
    pub fn close(self) -> io::Result<()> {
        let Session { conn, end, .. } = self;
        drop(conn);
        match end {
            End::Child(c) => lock(&c).wait().map(drop),
            End::Other(f) => f(),
        }
    }

    /// Hangs up without waiting: a remote shell is killed, anything else is left to end in
    /// the background. For a link that stopped answering, whose orderly end could take as long.
    pub fn abort(self) {
        let Session { conn, end, .. } = self;
        drop(conn);
        match end {
            End::Child(c) => {
                let mut c = lock(&c);
                let _ = c.kill();
                let _ = c.wait();
            }
            End::Other(f) => {
                let _ = std::thread::Builder::new()
                    .name("ferry-hangup".into())
                    .spawn(move || drop(f()));
            }
        }
    }
}

fn lock(c: &std::sync::Mutex<Child>) -> std::sync::MutexGuard<'_, Child> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// The link failed (`e`) before the server's Hello came: if the remote shell exited (within a
/// second), that is the failure, reported as the link's (so `--retry` tries again): ssh exits
/// so when the host is unreachable, and so does a missing remote ferry.
fn exited_early(child: &std::sync::Mutex<Child>, e: ConnError) -> ConnError {
    for _ in 0..20 {
        let status = lock(child).try_wait();
        match status {
            Ok(Some(st)) => {
                return ConnError::Io(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!(
                        "the remote side exited ({st}) before the session began; is the host \
                         reachable and ferry installed there (--remote-ferry)?"
                    ),
                ))
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => break,
        }
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_link_times_out_and_a_zero_timeout_never_waits() {
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut r = LinkReader::new(a);
        let mut buf = [0u8; 4];
        r.timeout.set(Some(Duration::ZERO));
        assert_eq!(
            r.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        r.timeout.set(Some(Duration::from_millis(50)));
        let t = std::time::Instant::now();
        assert_eq!(
            r.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
        assert!(t.elapsed() >= Duration::from_millis(50));
        b.write_all(b"abcdef").unwrap();
        r.timeout.set(None);
        assert_eq!(r.read(&mut buf).unwrap(), 4);
        assert_eq!(&buf, b"abcd");
        assert_eq!(r.read(&mut buf).unwrap(), 2);
        drop(b);
        assert_eq!(r.read(&mut buf).unwrap(), 0, "the end of the stream");
        assert_eq!(r.read(&mut buf).unwrap(), 0);
    }

    /// A remote side that exits at once (ferry missing there): a session that waits for the
    /// Hello fails as it opens; one that does not, at its first wait. Both say why.
    #[test]
    fn a_remote_side_that_exits_is_said_so_when_opened_or_at_the_first_wait() {
        let cmd = || {
            let mut c = Command::new("sh");
            c.args(["-c", "exit 127"]);
            c
        };
        let said = |e: ConnError| {
            let m = e.to_string();
            assert!(m.contains("before the session began"), "{m}");
            assert!(m.contains("127"), "{m}");
        };
        said(Session::command(cmd()).err().expect("refused"));
        let mut s = Session::command_asking(cmd(), crate::conn::DEFAULT_ZSTD_LEVEL, 0)
            .expect("not waited for");
        said(s.conn.call(ferry_proto::Request::Ping).unwrap_err());
    }

    /// The reader's thread notes when each read's bytes arrived: after they were written, and
    /// before the session took them (however late it takes them).
    #[test]
    fn the_reader_notes_when_bytes_arrived() {
        use std::io::Write;
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut r = LinkReader::new(b);
        let arrived = r.arrivals();
        assert!(arrived.latest().is_none(), "nothing arrived yet");
        let before = Instant::now();
        a.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        r.read_exact(&mut buf).unwrap();
        let after = Instant::now();
        let t = arrived.latest().expect("noted");
        assert!(before <= t && t <= after);
    }
}
