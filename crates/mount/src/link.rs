//! The mount's connection to the server: one session used by one operation at a time,
//! reconnected in the background when it fails, and never waited on for long.
//!
//! sshfs's most common complaint is a mount that hangs when the server goes away. Here every
//! wait is bounded: a read that hears nothing for the timeout fails the session; connecting
//! happens on a thread of its own that an operation waits for at most the timeout; while the
//! server is unreachable, operations that need it fail at once (until the next attempt is due,
//! with a backoff up to 30 s) and the file system answers from its cache where it can.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferry_fs::{ConnError, Connection, GetError, LinkReader, LinkWriter, Session};
use ferry_proto::{ErrorCode, WirePath};

/// Opens a new session with the server (runs `ssh host ferry serve --stdio`, say).
pub type Connector = Box<dyn Fn() -> Result<Session, ConnError> + Send + Sync>;

/// The connection an operation runs over.
pub(crate) type Conn = Connection<LinkReader, LinkWriter>;

/// Why an operation over the link did not succeed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The server cannot be reached now (the link failed, timed out, or is reconnecting).
    Offline(String),
    /// The server refused the request.
    Remote(ErrorCode, String),
    /// Anything else: a local error, or a server that broke the protocol.
    Failed(GetError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Offline(why) => write!(f, "server unreachable: {why}"),
            Failure::Remote(_, m) => f.write_str(m),
            Failure::Failed(e) => write!(f, "{e}"),
        }
    }
}

struct Reconnect {
    connecting: bool,
    /// A session made by the connecting thread, not yet taken.
    ready: Option<Session>,
    /// No new attempt before this.
    retry_at: Instant,
    failures: u32,
    why: String,
}

pub(crate) struct Link {
    connect: Arc<Connector>,
    timeout: Duration,
    /// Held for the whole of an operation: one at a time on the session.
    session: Mutex<Option<Session>>,
    reconnect: Arc<(Mutex<Reconnect>, Condvar)>,
    /// Bumped by every new session: leases granted before it may have been broken unheard.
    epoch: Arc<AtomicU64>,
    /// Paths whose leases the server broke, until taken.
    invalidated: Mutex<Vec<WirePath>>,
}

impl Link {
    /// Connects (waiting as long as that takes: a mount that cannot reach its server at the
    /// start fails with the reason).
    pub(crate) fn open(connect: Connector, timeout: Duration) -> Result<Link, ConnError> {
        let s = connect()?;
        s.set_read_timeout(Some(timeout));
        Ok(Link {
            connect: Arc::new(connect),
            timeout,
            session: Mutex::new(Some(s)),
            reconnect: Arc::new((
                Mutex::new(Reconnect {
                    connecting: false,
                    ready: None,
                    retry_at: Instant::now(),
                    failures: 0,
                    why: String::new(),
                }),
                Condvar::new(),
            )),
            epoch: Arc::new(AtomicU64::new(1)),
            invalidated: Mutex::new(vec![]),
        })
    }

    /// The current session's number; leases of an older one are void.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Runs `f` over the session (connecting first if need be, waiting at most the timeout).
    /// A failure of the link ends the session; the next operation or [`poll`](Self::poll)
    /// reconnects.
    pub(crate) fn run<T>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<T, GetError>,
    ) -> Result<T, Failure> {
        let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(self.wait_connected()?);
        }
        let s = slot.as_mut().expect("connected");
        let r = f(&mut s.conn);
        self.take_invalidations(&mut s.conn);
        match r {
            Ok(v) => Ok(v),
            Err(GetError::Conn(ConnError::Remote { code, message })) => {
                Err(Failure::Remote(code, message))
            }
            Err(GetError::Conn(e)) => {
                // The session cannot be trusted to be in step any more.
                let why = e.to_string();
                tracing::warn!("link to the server failed: {why}");
                slot.take().expect("connected").abort();
                self.failed(why.clone());
                Err(Failure::Offline(why))
            }
            Err(e) => {
                // Requests may still be outstanding on it: start afresh next time.
                slot.take().expect("connected").abort();
                Err(Failure::Failed(e))
            }
        }
    }

    /// Takes what the server sent unasked without waiting, and reconnects in the background
    /// when the session is gone. Returns at once when an operation holds the session.
    pub(crate) fn poll(&self) {
        let Ok(mut slot) = self.session.try_lock() else {
            return;
        };
        match slot.as_mut() {
            Some(s) => {
                s.set_read_timeout(Some(Duration::ZERO));
                let r = s.conn.poll();
                s.set_read_timeout(Some(self.timeout));
                self.take_invalidations(&mut s.conn);
                if let Err(e) = r {
                    let why = e.to_string();
                    tracing::warn!("link to the server failed: {why}");
                    slot.take().expect("connected").abort();
                    self.failed(why);
                }
            }
            None => {
                let (lock, _) = &*self.reconnect;
                let mut rc = lock.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(s) = rc.ready.take() {
                    *slot = Some(s);
                } else {
                    self.start_connecting(&mut rc);
                }
            }
        }
    }

    /// Whether a session is open (or made and waiting to be taken).
    pub(crate) fn is_up(&self) -> bool {
        if let Ok(slot) = self.session.try_lock() {
            if slot.is_some() {
                return true;
            }
        } else {
            return true; // in use
        }
        let (lock, _) = &*self.reconnect;
        lock.lock()
            .unwrap_or_else(|e| e.into_inner())
            .ready
            .is_some()
    }

    /// Bytes, requests and round trips of the current session (none while disconnected).
    pub(crate) fn traffic(&self) -> Option<ferry_fs::Traffic> {
        let slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref().map(|s| s.conn.traffic())
    }

    /// The paths whose leases the server broke since the last call.
    pub(crate) fn invalidated(&self) -> Vec<WirePath> {
        std::mem::take(&mut *self.invalidated.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Hangs up (at unmount).
    pub(crate) fn close(&self) {
        if let Some(s) = self
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            if let Err(e) = s.close() {
                tracing::debug!("closing the session: {e}");
            }
        }
    }

    fn take_invalidations(&self, c: &mut Conn) {
        if !c.invalidated.is_empty() {
            self.invalidated
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .append(&mut c.invalidated);
        }
    }

    fn failed(&self, why: String) {
        // Lease breaks sent from now on are lost: leases granted so far are void.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let (lock, _) = &*self.reconnect;
        let mut rc = lock.lock().unwrap_or_else(|e| e.into_inner());
        rc.why = why;
        // The first reconnection is tried at once (a server restarted, an idle link cut).
        rc.retry_at = Instant::now();
    }

    /// A new session: one made in the background, or one the attempt started now makes within
    /// the timeout.
    fn wait_connected(&self) -> Result<Session, Failure> {
        let (lock, cv) = &*self.reconnect;
        let mut rc = lock.lock().unwrap_or_else(|e| e.into_inner());
        self.start_connecting(&mut rc);
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(s) = rc.ready.take() {
                return Ok(s);
            }
            let now = Instant::now();
            if !rc.connecting || now >= deadline {
                return Err(Failure::Offline(if rc.connecting {
                    format!("still connecting ({})", rc.why)
                } else {
                    rc.why.clone()
                }));
            }
            rc = cv
                .wait_timeout(rc, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn start_connecting(&self, rc: &mut Reconnect) {
        if rc.connecting || rc.ready.is_some() || Instant::now() < rc.retry_at {
            return;
        }
        rc.connecting = true;
        let connect = self.connect.clone();
        let shared = self.reconnect.clone();
        let epoch = self.epoch.clone();
        let timeout = self.timeout;
        let spawned = std::thread::Builder::new()
            .name("ferry-connect".into())
            .spawn(move || {
                let r = connect();
                let (lock, cv) = &*shared;
                let mut rc = lock.lock().unwrap_or_else(|e| e.into_inner());
                rc.connecting = false;
                match r {
                    Ok(s) => {
                        s.set_read_timeout(Some(timeout));
                        epoch.fetch_add(1, Ordering::AcqRel);
                        tracing::info!("reconnected to the server");
                        rc.ready = Some(s);
                        rc.failures = 0;
                    }
                    Err(e) => {
                        rc.failures += 1;
                        let wait = Duration::from_secs(1 << rc.failures.min(5))
                            .min(Duration::from_secs(30));
                        rc.why = e.to_string();
                        rc.retry_at = Instant::now() + wait;
                        tracing::warn!(
                            "cannot reach the server ({}); next attempt in {} s",
                            rc.why,
                            wait.as_secs()
                        );
                    }
                }
                cv.notify_all();
            });
        if let Err(e) = spawned {
            rc.connecting = false;
            rc.why = format!("cannot start a thread: {e}");
        }
    }
}
