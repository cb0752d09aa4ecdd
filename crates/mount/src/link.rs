//! The mount's connection to the server: a few sessions, each used by one operation at a
//! time (a long fetch over a slow link holds one; the other operations go on over the others),
//! reconnected in the background when the link fails, and never waited on for long.
//!
//! sshfs's most common complaint is a mount that hangs when the server goes away. Here every
//! wait is bounded: a read that hears nothing for the timeout fails the session; connecting
//! happens on a thread of its own that an operation waits for at most the timeout; while the
//! server is unreachable, operations that need it fail at once (until the next attempt is due,
//! with a backoff up to 30 s) and the file system answers from its cache where it can.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferry_fs::{ConnError, Connection, GetError, LinkReader, LinkWriter, Session};
use ferry_proto::{ErrorCode, WirePath};

use crate::queued::{Change, Queue, Sent};

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

struct Pool {
    idle: Vec<Session>,
    open: usize,
    /// The ids of the sessions open, idle or in use ([`Session::id`]).
    ids: std::collections::HashSet<usize>,
    /// Syncs of every session ([`Link::sync_all`]) are numbered; `wanted` holds, for each
    /// session that was in use when one began, the newest such number it owes a `Sync` for
    /// (made as it comes back), and `synced` the newest its last `Sync` answered for.
    syncs: u64,
    wanted: std::collections::HashMap<usize, u64>,
    synced: std::collections::HashMap<usize, u64>,
}

impl Pool {
    fn new(first: Session) -> Pool {
        Pool {
            ids: [first.id()].into(),
            idle: vec![first],
            open: 1,
            syncs: 0,
            wanted: Default::default(),
            synced: Default::default(),
        }
    }

    /// The sync number session `id` owes a `Sync` for, if it owes one.
    fn owed(&self, id: usize) -> Option<u64> {
        let wanted = self.wanted.get(&id).copied().unwrap_or(0);
        (wanted > self.synced.get(&id).copied().unwrap_or(0)).then_some(wanted)
    }

    fn synced(&mut self, id: usize, n: u64) {
        let at = self.synced.entry(id).or_insert(0);
        *at = (*at).max(n);
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

/// Sessions open at most: operations beyond these wait (at most the timeout) for one.
const MAX_SESSIONS: usize = 4;
/// How long an operation waits for a busy session to come back before it opens another
/// (longer than the server takes for a batch of queued changes on a LAN: a thousand new files,
/// synced in groups, took it 0.15–0.3 s).
const BRIEFLY: Duration = Duration::from_millis(250);

pub(crate) struct Link {
    connect: Arc<Connector>,
    timeout: Duration,
    /// Sessions not in use, and how many are open in all (idle or in use).
    pool: Mutex<Pool>,
    /// Signalled when a session goes back to the pool.
    freed: Condvar,
    reconnect: Arc<(Mutex<Reconnect>, Condvar)>,
    /// Bumped by every session that fails: leases granted before it may have been broken
    /// unheard.
    epoch: Arc<AtomicU64>,
    /// What the servers told of changes (lease breaks, names changed), until taken.
    invalidated: Mutex<Vec<Break>>,
    /// Files removed here and not yet on the server.
    pub(crate) queued: Queue,
    /// Syncs waiting for sessions in use to come back (for tests).
    pub(crate) owed_waits: AtomicUsize,
    /// Operations waiting for a session in use to come back (for tests), and how long one
    /// waits before it opens another ([`BRIEFLY`]; tests lengthen it, so a slow run cannot
    /// open one early), in milliseconds.
    pub(crate) session_waits: AtomicUsize,
    pub(crate) patience_ms: AtomicU64,
    /// The last session given back had its replies within a few milliseconds (a LAN,
    /// or this machine): see [`is_near`](Self::is_near).
    near: AtomicBool,
}

/// A change the server told of.
pub(crate) enum Break {
    /// The lease on this path is broken.
    Lease(WirePath),
    /// This name in a leased listing changed: what it is now (`None`: gone).
    Entry(WirePath, Option<ferry_proto::Attr>),
    /// The attributes of a path after a change queued here (asked for at that moment).
    Attr(WirePath, ferry_proto::Attr, Instant),
    /// The answer to a new file's queued commit.
    Put(crate::queued::PutAnswer),
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
            pool: Mutex::new(Pool::new(s)),
            freed: Condvar::new(),
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
            queued: Queue::default(),
            owed_waits: AtomicUsize::new(0),
            session_waits: AtomicUsize::new(0),
            patience_ms: AtomicU64::new(BRIEFLY.as_millis() as u64),
            near: AtomicBool::new(false),
        })
    }

    /// The current session's number; leases of an older one are void.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Runs `f` over a session: an idle one, a new one while fewer than [`MAX_SESSIONS`] are
    /// open, else the first to come back (waiting at most the timeout for any of these). A
    /// failure of the link ends the session; the next operation or [`poll`](Self::poll)
    /// reconnects.
    pub(crate) fn run<T>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<T, GetError>,
    ) -> Result<T, Failure> {
        let mut s = self.take()?;
        let r = self.run_on(&mut s.conn, f);
        self.settle(s, r)
    }

    /// Makes the changes of every session durable on the server: each session's server syncs
    /// the directories that session changed, so a `Sync` must reach each one. The idle ones
    /// now, one after another (with none open, one as [`run`](Self::run) takes it); those in
    /// use by other operations as each comes back (before another operation takes it), waited
    /// for with `wait`. The first failure is the answer.
    pub(crate) fn sync_all(&self, wait: bool) -> Result<(), Failure> {
        let (mut sessions, mut busy, n) = {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            pool.syncs += 1;
            let n = pool.syncs;
            let idle = std::mem::take(&mut pool.idle);
            let busy: Vec<usize> = pool
                .ids
                .iter()
                .filter(|&&id| !idle.iter().any(|s| s.id() == id))
                .copied()
                .collect();
            for &id in &busy {
                let w = pool.wanted.entry(id).or_insert(0);
                *w = (*w).max(n);
            }
            (idle, busy, n)
        };
        if sessions.is_empty() && busy.is_empty() {
            sessions.push(self.take()?);
        }
        let mut first = Ok(());
        for mut s in sessions {
            let id = s.id();
            let r = self.run_on(&mut s.conn, Self::sync_one);
            if r.is_ok() {
                self.pool
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .synced(id, n);
            }
            if let (Err(e), Ok(())) = (self.settle(s, r), &first) {
                first = Err(e);
            }
        }
        if !wait {
            return first;
        }
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        self.owed_waits.fetch_add(1, Ordering::AcqRel);
        loop {
            busy.retain(|id| pool.synced.get(id).is_none_or(|&at| at < n));
            let gone = busy.len();
            busy.retain(|id| pool.ids.contains(id));
            if busy.len() < gone && first.is_ok() {
                first = Err(Failure::Offline(
                    "a session ended before its changes were synced".into(),
                ));
            }
            if busy.is_empty() {
                break;
            }
            pool = self.freed.wait(pool).unwrap_or_else(|e| e.into_inner());
        }
        self.owed_waits.fetch_sub(1, Ordering::AcqRel);
        first
    }

    /// One session's `Sync` (a server without deferred syncs made every change durable
    /// before its answer).
    fn sync_one(c: &mut Conn) -> Result<(), GetError> {
        if c.offers(ferry_proto::FEATURE_DEFERRED_SYNC)? {
            c.call(ferry_proto::Request::Sync)?;
        }
        Ok(())
    }

    /// Runs `f` over `c` right behind the changes queued (see `crate::queued`).
    fn run_on<T>(
        &self,
        c: &mut Conn,
        f: impl FnOnce(&mut Conn) -> Result<T, GetError>,
    ) -> Result<T, GetError> {
        self.queued
            .send(c)
            .map_err(GetError::from)
            .and_then(|sent| match f(c) {
                // Their answers will not come either.
                Err(GetError::Conn(e)) if !matches!(e, ConnError::Remote { .. }) => {
                    sent.abandon();
                    Err(GetError::Conn(e))
                }
                r => self.finished(sent, c).and(r),
            })
    }

    /// Gives `s` back after an operation that came to `r`, or ends it if the link failed.
    fn settle<T>(&self, mut s: Session, r: Result<T, GetError>) -> Result<T, Failure> {
        self.take_invalidations(&mut s.conn);
        match r {
            Ok(v) => {
                self.give_back(s);
                Ok(v)
            }
            Err(GetError::Conn(ConnError::Remote { code, message })) => {
                self.give_back(s);
                Err(Failure::Remote(code, message))
            }
            Err(GetError::Conn(e)) => {
                // The session cannot be trusted to be in step any more.
                let why = e.to_string();
                tracing::warn!("link to the server failed: {why}");
                self.drop_session(s);
                self.failed(why.clone());
                Err(Failure::Offline(why))
            }
            Err(e) => {
                // Requests may still be outstanding on it: start afresh next time.
                self.drop_session(s);
                Err(Failure::Failed(e))
            }
        }
    }

    /// Queues a change acknowledged before the server makes it (the caller knows from its
    /// leases that the server will make it): see `crate::queued`. `false` (not queued) when
    /// the queue is full or the server unreachable: make it at once.
    pub(crate) fn queue_change(&self, change: Change) -> bool {
        self.is_up() && self.queued.queue(change)
    }

    /// The answers to changes sent: refused ones' paths are taken as changed on the server,
    /// and attributes asked for after a change are passed on, as are new files' answers.
    /// (`sent` is dropped at the end, after: its new files are awaited until their answers are
    /// among the breaks, see `Queue::wait_answered`.)
    fn finished(&self, mut sent: Sent, c: &mut Conn) -> Result<(), GetError> {
        let answered = sent.finish(c)?;
        // What the server said ahead of the answers (its breaks of this mount's own changes'
        // leases) goes first: the attributes after come after it.
        self.take_invalidations(c);
        if !answered.changed.is_empty() || !answered.attrs.is_empty() || !answered.puts.is_empty() {
            let mut all = self.invalidated.lock().unwrap_or_else(|e| e.into_inner());
            all.extend(answered.puts.into_iter().map(Break::Put));
            all.extend(answered.changed.into_iter().map(Break::Lease));
            all.extend(
                answered
                    .attrs
                    .into_iter()
                    .map(|(p, a, at)| Break::Attr(p, a, at)),
            );
        }
        Ok(())
    }

    /// A session for one operation.
    fn take(&self) -> Result<Session, Failure> {
        let deadline = Instant::now() + self.timeout;
        let patience = Duration::from_millis(self.patience_ms.load(Ordering::Relaxed));
        let briefly = Instant::now() + patience.min(self.timeout);
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(s) = pool.idle.pop() {
                return Ok(s);
            }
            // A session busy for a moment (the queue of changes being sent) is waited for
            // before another is opened: the server of one session breaks the leases another
            // granted when it sees the changes made through that one, so each session more
            // costs the mount its leases, and every change made after then a round trip.
            // Waited for the whole moment, not until the first session given back: another
            // operation waiting too may take that one (four FUSE threads taking turns on one
            // session opened a second 50 ms into `rsync -a`, and `rsync` took twice as long).
            let now = Instant::now();
            if pool.open > 0 && now < briefly {
                self.session_waits.fetch_add(1, Ordering::AcqRel);
                pool = self
                    .freed
                    .wait_timeout(pool, briefly - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                self.session_waits.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            if pool.open < MAX_SESSIONS {
                pool.open += 1;
                drop(pool);
                let made = self.wait_connected();
                let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
                match &made {
                    Ok(s) => pool.ids.insert(s.id()),
                    Err(_) => {
                        pool.open -= 1;
                        false
                    }
                };
                return made;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Failure::Offline(format!(
                    "all {MAX_SESSIONS} sessions with the server are busy"
                )));
            }
            pool = self
                .freed
                .wait_timeout(pool, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Puts `s` back among the idle sessions, after the `Sync` it owes a sync of every
    /// session begun while it was in use (see [`sync_all`](Self::sync_all)).
    fn give_back(&self, mut s: Session) {
        let id = s.id();
        self.near.store(
            ferry_fs::delta::near_link(s.conn.round_trip()),
            Ordering::Relaxed,
        );
        loop {
            let owed = {
                let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
                match pool.owed(id) {
                    Some(n) => n,
                    None => {
                        pool.idle.push(s);
                        drop(pool);
                        // Syncs wait on this too.
                        self.freed.notify_all();
                        return;
                    }
                }
            };
            let r = self.run_on(&mut s.conn, Self::sync_one);
            self.take_invalidations(&mut s.conn);
            match r {
                Ok(()) => self
                    .pool
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .synced(id, owed),
                Err(e) => {
                    // Refused or failed: the syncs waiting for it learn it ended unsynced.
                    let why = e.to_string();
                    tracing::warn!("syncing the server's last changes: {why}");
                    self.drop_session(s);
                    if matches!(e, GetError::Conn(ref c) if !matches!(c, ConnError::Remote { .. }))
                    {
                        self.failed(why);
                    }
                    return;
                }
            }
        }
    }

    /// Ends a session that cannot go on (without waiting for its orderly end).
    fn drop_session(&self, s: Session) {
        let id = s.id();
        s.abort();
        {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            pool.open -= 1;
            pool.ids.remove(&id);
            pool.wanted.remove(&id);
            pool.synced.remove(&id);
        }
        self.freed.notify_all();
    }

    /// Takes what the servers sent unasked over the idle sessions without waiting, and
    /// reconnects in the background when none is open. Sessions in use are left alone.
    pub(crate) fn poll(&self) {
        let idle = std::mem::take(&mut self.pool.lock().unwrap_or_else(|e| e.into_inner()).idle);
        for mut s in idle {
            s.set_read_timeout(Some(Duration::ZERO));
            let r = s.conn.poll();
            s.set_read_timeout(Some(self.timeout));
            self.take_invalidations(&mut s.conn);
            match r {
                // (A sync begun meanwhile found it in use: it owes it a `Sync` now.)
                Ok(()) => self.give_back(s),
                Err(e) => {
                    let why = e.to_string();
                    tracing::warn!("link to the server failed: {why}");
                    self.drop_session(s);
                    self.failed(why);
                }
            }
        }
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.open == 0 {
            let (lock, _) = &*self.reconnect;
            let mut rc = lock.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = rc.ready.take() {
                pool.ids.insert(s.id());
                pool.idle.push(s);
                pool.open += 1;
            } else {
                self.start_connecting(&mut rc);
            }
        }
    }

    /// Whether the server's replies come within a few milliseconds (a LAN, or this
    /// machine): the queue then goes out as soon as it is quiet for a moment (see
    /// [`Queue::wait`](crate::queued::Queue::wait)).
    pub(crate) fn is_near(&self) -> bool {
        self.near.load(Ordering::Relaxed)
    }

    /// How many sessions are open (idle or in use).
    pub(crate) fn sessions_open(&self) -> usize {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).open
    }

    /// Whether a session is open (or made and waiting to be taken).
    pub(crate) fn is_up(&self) -> bool {
        if self.pool.lock().unwrap_or_else(|e| e.into_inner()).open > 0 {
            return true;
        }
        let (lock, _) = &*self.reconnect;
        lock.lock()
            .unwrap_or_else(|e| e.into_inner())
            .ready
            .is_some()
    }

    /// Bytes, requests and round trips of the idle sessions, added up (none while
    /// disconnected).
    pub(crate) fn traffic(&self) -> Option<ferry_fs::Traffic> {
        let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Option<ferry_fs::Traffic> = None;
        for s in &pool.idle {
            let t = s.conn.traffic();
            let sum = all.get_or_insert_with(Default::default);
            sum.bytes_sent += t.bytes_sent;
            sum.bytes_received += t.bytes_received;
            sum.requests += t.requests;
            sum.round_trips += t.round_trips;
        }
        all
    }

    /// What the servers told of changes since the last call, in the order told.
    pub(crate) fn invalidated(&self) -> Vec<Break> {
        std::mem::take(&mut *self.invalidated.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Hangs up (at unmount).
    pub(crate) fn close(&self) {
        let idle = {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            let idle = std::mem::take(&mut pool.idle);
            for s in &idle {
                pool.ids.remove(&s.id());
            }
            pool.open -= idle.len();
            idle
        };
        self.freed.notify_all();
        for s in idle {
            if let Err(e) = s.close() {
                tracing::debug!("closing the session: {e}");
            }
        }
    }

    fn take_invalidations(&self, c: &mut Conn) {
        if std::mem::take(&mut c.breaks_lost) {
            tracing::warn!("the server's lease breaks came faster than taken: every lease is void");
            // What was told before the loss may be older than what was lost: none of it is
            // taken (the listings and attributes are asked again), and no lease stands. The
            // answers to new files' commits stay: they say what became of the copies here.
            c.changed.clear();
            self.invalidated
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|b| matches!(b, Break::Lease(_) | Break::Put(_)));
            self.epoch.fetch_add(1, Ordering::AcqRel);
        }
        if !c.invalidated.is_empty() || !c.changed.is_empty() {
            // A server sends a batch's lease breaks ahead of its names changed.
            let mut all = self.invalidated.lock().unwrap_or_else(|e| e.into_inner());
            all.extend(c.invalidated.drain(..).map(Break::Lease));
            all.extend(c.changed.drain(..).map(|(p, a)| Break::Entry(p, a)));
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
            if !rc.connecting {
                // Another waiter took the session made: another one for this waiter (unless
                // the last attempt failed, and the next is not due yet).
                self.start_connecting(&mut rc);
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
                        // Leases stay: the other sessions still carry their breaks, and those
                        // of a session that failed were voided then (`failed`).
                        if rc.why.is_empty() {
                            tracing::debug!("one more session with the server");
                        } else {
                            tracing::info!("reconnected to the server");
                            rc.why.clear();
                        }
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
