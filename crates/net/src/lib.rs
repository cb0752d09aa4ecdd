//! Ferry's network edge: the TLS 1.3 daemon (`ferry serve --listen`) and the client side of
//! `ferry://host[:port]/path`. This is the only crate that uses tokio; a session's protocol
//! work stays synchronous (ferry-fs) on a thread of its own, joined to the TLS stream by a
//! socket pair that a small async pump drives.
//!
//! Trust works like ssh's, without certificate authorities: each user has one key, made on
//! first run ([`Identity`]); a daemon prints its key's fingerprint, a client records it on
//! first use in `known_hosts` and refuses a changed key from then on; the daemon serves only
//! clients whose fingerprints are in its `authorized_keys`, and tells the others so.

mod keys;
mod tls;

use std::io;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_fs::{ConnError, Session};
use ferry_proto::ErrorCode;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

pub use keys::{
    append_line, data_dir, known_host, read_authorized, AuthorizedKey, Fingerprint, Identity,
};

/// The daemon's port when a `ferry://` address names none.
pub const DEFAULT_PORT: u16 = 7330;
/// A TCP connection or a TLS handshake that takes longer than this is given up (by default:
/// [`Daemon::handshake_timeout`]).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// A client the daemon turns away gets this long to say Hello and read why, in a first frame
/// of at most [`REFUSAL_FRAME`] bytes: a refused connection costs the daemon a task, a few KB
/// and a descriptor for this long, never a thread or a session slot.
const REFUSAL_TIME: Duration = Duration::from_secs(10);
const REFUSAL_FRAME: usize = 4096;
/// An authorized client that has not said Hello this long after its handshake is hung up on
/// (by default: [`Daemon::hello_timeout`]).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// After one direction of a session ends, the other gets this long to finish.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NetError {
    #[error("cannot {op} {}: {source}", path.display())]
    File {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{0}")]
    BadKey(String),
    #[error("{0}")]
    BadAddress(String),
    #[error(
        "the server at {host} presents key {seen}, but {known} was recorded for it in {}; \
         if its key really changed, delete that line (or pin the new key with `ferry key trust`)",
        file.display()
    )]
    KeyChanged {
        host: String,
        known: Fingerprint,
        seen: Fingerprint,
        file: PathBuf,
    },
    /// The link itself failed (refused, timed out, cut): worth retrying.
    #[error(transparent)]
    Link(ConnError),
}

impl NetError {
    fn file(op: &'static str, path: &Path, source: io::Error) -> Self {
        NetError::File {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    fn link(what: String, e: io::Error) -> Self {
        NetError::Link(ConnError::Io(io::Error::new(
            e.kind(),
            format!("{what}: {e}"),
        )))
    }
}

/// `ferry://host[:port]/path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// The path inside the daemon's export, without leading `/` (empty: its root).
    pub path: String,
}

impl Endpoint {
    /// `None` if `s` is not a `ferry://` address; an error if it is a malformed one.
    pub fn parse(s: &str) -> Option<Result<Endpoint, NetError>> {
        let rest = s.strip_prefix("ferry://")?;
        let bad = |why: &str| Some(Err(NetError::BadAddress(format!("{s:?}: {why}"))));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            match v6.split_once(']') {
                Some((h, "")) => (h, None),
                Some((h, p)) => match p.strip_prefix(':') {
                    Some(p) => (h, Some(p)),
                    None => return bad("expected :PORT after ]"),
                },
                None => return bad("unclosed ["),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return bad("no host");
        }
        let port = match port.map(str::parse::<u16>) {
            None => DEFAULT_PORT,
            Some(Ok(p)) if p != 0 => p,
            Some(_) => return bad("bad port"),
        };
        Some(Ok(Endpoint {
            host: host.to_string(),
            port,
            path: path.trim_matches('/').to_string(),
        }))
    }

    /// `host:port` as `known_hosts` names it (`[v6]:port` for IPv6 addresses).
    pub fn host_port(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Connects to a daemon, checks its key against `known_hosts` (recording it on first use, and
/// then calling `first_use` with it), proves this user's key and opens a session.
pub fn connect(
    ep: &Endpoint,
    id: &Identity,
    known_hosts: &Path,
    first_use: impl FnOnce(Fingerprint),
) -> Result<Session, NetError> {
    connect_asking(ep, id, known_hosts, 0, first_use)
}

/// Like [`connect`], asking also for the Hello features in `ask`
/// ([`ferry_fs::Connection::open_asking`]).
pub fn connect_asking(
    ep: &Endpoint,
    id: &Identity,
    known_hosts: &Path,
    ask: u64,
    first_use: impl FnOnce(Fingerprint),
) -> Result<Session, NetError> {
    let host_port = ep.host_port();
    let known = known_host(known_hosts, &host_port)?;
    let record = |fp: Fingerprint| -> Result<(), NetError> {
        append_line(known_hosts, &format!("{host_port} {fp}"))?;
        first_use(fp);
        Ok(())
    };
    open(ep, id, known, Some(known_hosts), ask, record)
}

/// Connects to a daemon whose key must be `key` (a transfer daemon named in a ticket's hint:
/// the ticket pins it, no `known_hosts` is involved), proves this user's key and opens a
/// session.
pub fn connect_pinned(ep: &Endpoint, id: &Identity, key: Fingerprint) -> Result<Session, NetError> {
    open(ep, id, Some(key), None, 0, |_| Ok(()))
}

fn open(
    ep: &Endpoint,
    id: &Identity,
    known: Option<Fingerprint>,
    known_hosts: Option<&Path>,
    ask: u64,
    first_use: impl FnOnce(Fingerprint) -> Result<(), NetError>,
) -> Result<Session, NetError> {
    let host_port = ep.host_port();
    let (cfg, verifier) = tls::client_config(id, known)?;
    let name = rustls::pki_types::ServerName::try_from(ep.host.clone())
        .map_err(|_| NetError::BadAddress(format!("{:?} is not a host name", ep.host)))?;
    let rt = runtime().map_err(|e| NetError::link("cannot start the network runtime".into(), e))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let addr = (ep.host.clone(), ep.port);
    let tls = rt.block_on(async {
        let tcp = tokio::time::timeout(HANDSHAKE_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "timed out"))??;
        tune(&tcp);
        tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, tcp))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))?
    });
    let seen = *verifier.seen.lock().unwrap();
    let tls = match (tls, known, seen) {
        (Err(_), Some(known), Some(seen)) if known != seen => {
            return Err(match known_hosts {
                Some(file) => NetError::KeyChanged {
                    host: host_port,
                    known,
                    seen,
                    file: file.to_path_buf(),
                },
                None => NetError::BadKey(format!(
                "the daemon at {host_port} presents key {seen}, not the {known} its ticket names"
            )),
            })
        }
        (Err(e), ..) => return Err(NetError::link(format!("cannot reach {host_port}"), e)),
        (Ok(t), ..) => t,
    };
    if let (None, Some(fp)) = (known, seen) {
        first_use(fp)?;
    }
    let (mine, theirs) = UnixStream::pair().map_err(|e| NetError::link("socket pair".into(), e))?;
    theirs
        .set_nonblocking(true)
        .map_err(|e| NetError::link("socket pair".into(), e))?;
    let pump = std::thread::Builder::new()
        .name("ferry-tls".into())
        .spawn(move || {
            rt.block_on(async move {
                match tokio::net::UnixStream::from_std(theirs) {
                    Ok(u) => pump(tls, u).await,
                    Err(e) => Err(e),
                }
            })
        })
        .map_err(|e| NetError::link("thread".into(), e))?;
    let reader = mine
        .try_clone()
        .map_err(|e| NetError::link("socket pair".into(), e))?;
    // By the time the session is closed every reply it waited for has arrived: how the
    // connection then ends (a reset, a missing close_notify) changes nothing, so it is logged,
    // not reported.
    let finish = Box::new(move || {
        match pump.join() {
            Ok(Err(e)) => tracing::debug!("closing the TLS connection: {e}"),
            Ok(Ok(())) => {}
            Err(_) => tracing::warn!("the TLS thread panicked"),
        }
        Ok(())
    });
    Session::over_asking(reader, Box::new(mine), finish, ask).map_err(NetError::Link)
}

fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Low latency for small requests, and keepalives so a vanished peer is noticed.
fn tune(tcp: &tokio::net::TcpStream) {
    use rustix::net::sockopt;
    let _ = tcp.set_nodelay(true);
    let _ = sockopt::set_socket_keepalive(tcp, true);
    let _ = sockopt::set_tcp_keepidle(tcp, Duration::from_secs(60));
    let _ = sockopt::set_tcp_keepintvl(tcp, Duration::from_secs(10));
    let _ = sockopt::set_tcp_keepcnt(tcp, 6);
}

/// Copies both ways until both are done; once one direction ends, the other gets
/// [`CLOSE_GRACE`] to finish.
async fn pump<A, B>(a: A, b: B) -> io::Result<()>
where
    A: AsyncRead + AsyncWrite,
    B: AsyncRead + AsyncWrite,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let up = async {
        let r = tokio::io::copy(&mut ar, &mut bw).await;
        let _ = bw.shutdown().await;
        r
    };
    let down = async {
        let r = tokio::io::copy(&mut br, &mut aw).await;
        let _ = aw.shutdown().await;
        r
    };
    tokio::pin!(up, down);
    let rest = tokio::select! {
        r = &mut up => { r?; tokio::time::timeout(CLOSE_GRACE, &mut down).await }
        r = &mut down => { r?; tokio::time::timeout(CLOSE_GRACE, &mut up).await }
    };
    match rest {
        Ok(r) => r.map(drop),
        Err(_) => Ok(()),
    }
}

/// A client the daemon let in.
#[derive(Clone, Debug)]
pub struct Peer {
    pub fingerprint: Fingerprint,
    /// Its name in `authorized_keys` (may be empty).
    pub name: String,
    pub addr: SocketAddr,
    /// Whether its key is in `authorized_keys`. A guest's (see [`Daemon::guests`]) is not: it
    /// may use only what needs no key (objects read by capability).
    pub authorized: bool,
}

/// Runs one session: the protocol over the given stream, until the client hangs up (or, if it
/// has not said Hello within the timeout given, then).
pub type Handler = Arc<dyn Fn(&Peer, UnixStream, Duration) + Send + Sync>;

/// The TLS daemon.
pub struct Daemon {
    pub listener: std::net::TcpListener,
    pub identity: Identity,
    /// Read again for every connection, so edits apply at once.
    pub authorized_keys: PathBuf,
    /// Sessions at once; more are told the server is busy. Only clients whose keys are
    /// authorized take one.
    pub max_sessions: usize,
    /// Sessions at once for clients whose keys are not authorized (guests: a transfer daemon
    /// serves them objects by capability); 0 turns them away. Guests have slots of their own,
    /// so they cannot take those of authorized clients.
    pub guests: usize,
    /// A session whose client has not said Hello this long after its handshake ends, and its
    /// slot is free again ([`HELLO_TIMEOUT`]).
    pub hello_timeout: Duration,
    /// A connection that has not finished its TLS handshake this long after it was accepted is
    /// dropped ([`HANDSHAKE_TIMEOUT`]).
    pub handshake_timeout: Duration,
}

impl Daemon {
    /// Accepts connections for ever, each session on a thread of its own.
    pub fn run(self, handler: Handler) -> Result<(), NetError> {
        let cfg = Arc::new(tls::server_config(&self.identity)?);
        let rt = runtime().map_err(|e| NetError::link("network runtime".into(), e))?;
        let keys = Arc::new(self.authorized_keys);
        let slots = Arc::new(tokio::sync::Semaphore::new(self.max_sessions));
        let guest_slots = Arc::new(tokio::sync::Semaphore::new(self.guests));
        let admit_guests = self.guests > 0;
        let hello = self.hello_timeout;
        let handshake = self.handshake_timeout;
        let listener = self.listener;
        rt.block_on(async move {
            listener
                .set_nonblocking(true)
                .map_err(|e| NetError::link("listen".into(), e))?;
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|e| NetError::link("listen".into(), e))?;
            let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
            loop {
                let (tcp, addr) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors and the like: pause rather than spin.
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                tune(&tcp);
                tokio::spawn(session(
                    acceptor.clone(),
                    tcp,
                    addr,
                    keys.clone(),
                    (handler.clone(), hello, handshake),
                    (slots.clone(), admit_guests.then(|| guest_slots.clone())),
                ));
            }
        })
    }
}

async fn session(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    addr: SocketAddr,
    keys: Arc<PathBuf>,
    (handler, hello, handshake): (Handler, Duration, Duration),
    (slots, guests): (
        Arc<tokio::sync::Semaphore>,
        Option<Arc<tokio::sync::Semaphore>>,
    ),
) {
    let tls = match tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return tracing::info!("{addr}: handshake failed: {e}"),
        Err(_) => return tracing::info!("{addr}: handshake timed out"),
    };
    let Some(fp) = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| Fingerprint::of(c))
    else {
        return tracing::info!("{addr}: no client key");
    };
    // The key first, a session slot only then: clients that are not let in cannot take the
    // slots of those who are.
    let verdict = match read_authorized(&keys) {
        Err(e) => {
            tracing::error!("{e}");
            Err((ErrorCode::Io, "the server cannot read its authorized keys".to_string()))
        }
        Ok(list) => match list.into_iter().find(|k| k.fingerprint == fp) {
            Some(k) => match slots.try_acquire_owned() {
                Ok(slot) => Ok((
                    Peer {
                        fingerprint: fp,
                        name: k.name,
                        addr,
                        authorized: true,
                    },
                    slot,
                )),
                Err(_) => Err((ErrorCode::Busy, "the server is busy; try again later".into())),
            },
            None => match guests.map(|g| g.try_acquire_owned()) {
                Some(Ok(slot)) => Ok((
                    Peer {
                        fingerprint: fp,
                        name: String::new(),
                        addr,
                        authorized: false,
                    },
                    slot,
                )),
                Some(Err(_)) => Err((ErrorCode::Busy, "the server is busy; try again later".into())),
                None => Err((
                    ErrorCode::Permission,
                    format!(
                        "this client's key {fp} is not authorized on the server; its owner can add it with `ferry key authorize {fp}`"
                    ),
                )),
            },
        },
    };
    let (peer, slot) = match verdict {
        Ok(v) => v,
        Err((code, message)) => {
            tracing::info!("{addr}: refused {fp}: {message}");
            return refuse(tls, code, &message).await;
        }
    };
    let (mine, theirs) = match UnixStream::pair() {
        Ok(p) => p,
        Err(e) => return tracing::error!("socket pair: {e}"),
    };
    let worker = std::thread::Builder::new()
        .name("ferry-session".into())
        .spawn(move || {
            tracing::info!("{addr}: session for {} ({fp})", peer.name);
            handler(&peer, mine, hello)
        });
    if let Err(e) = worker {
        return tracing::error!("cannot start a session thread: {e}");
    }
    let r = match theirs
        .set_nonblocking(true)
        .and_then(|_| tokio::net::UnixStream::from_std(theirs))
    {
        Ok(u) => pump(tls, u).await,
        Err(e) => Err(e),
    };
    if let Err(e) = r {
        tracing::info!("{addr}: {e}");
    }
    drop(slot);
}

/// Turns a client away: waits (at most [`REFUSAL_TIME`]) for its first frame, which must be
/// small (a Hello is), and answers it with an `Error`, so the client can say why instead of
/// seeing the link drop.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, code: ErrorCode, message: &str) {
    use tokio::io::AsyncReadExt;
    let answer = async {
        let mut dec = ferry_proto::FrameDecoder::new();
        let mut buf = [0u8; 1024];
        let mut read = 0;
        let id = loop {
            match dec.next_frame() {
                Ok(Some(f)) => break f.request_id,
                Ok(None) => {}
                Err(_) => return,
            }
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    read += n;
                    if read > REFUSAL_FRAME {
                        return;
                    }
                    dec.feed(&buf[..n]);
                }
            }
        };
        let reply = ferry_proto::Message::Reply(ferry_proto::Reply::Error {
            code,
            message: message.to_string(),
        });
        if let Ok(bytes) = reply.encode(id, false) {
            let _ = s.write_all(&bytes).await;
            let _ = s.shutdown().await;
        }
    };
    let _ = tokio::time::timeout(REFUSAL_TIME, answer).await;
}

#[cfg(test)]
mod daemon_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        let e = Endpoint::parse("ferry://h/a/b/").unwrap().unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.path.as_str()),
            ("h", DEFAULT_PORT, "a/b")
        );
        let e = Endpoint::parse("ferry://h:99").unwrap().unwrap();
        assert_eq!((e.port, e.path.as_str()), (99, ""));
        let e = Endpoint::parse("ferry://[::1]:5/x").unwrap().unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 5));
        assert_eq!(e.host_port(), "[::1]:5");
        assert!(Endpoint::parse("host:path").is_none());
        for bad in [
            "ferry://",
            "ferry://:4/x",
            "ferry://h:0/",
            "ferry://h:x/",
            "ferry://[::1/",
        ] {
            assert!(Endpoint::parse(bad).unwrap().is_err(), "{bad}");
        }
    }
}
