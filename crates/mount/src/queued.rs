//! Changes acknowledged before the server makes them (the caller knows from its leases that
//! the server will): removals and renames of files, changes of a file's permission bits and
//! times, and small new files made here (their create, data and commit).
//! Queued here, and sent together right before the requests of the next operation, whatever
//! it is, in the same round trip. No operation's requests go over another session until the
//! server has answered them. So the server makes every change in the order made here: a file
//! made again under a removed name is never removed by a late removal.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferry_format::Id;
use ferry_fs::ConnError;
use ferry_proto::{Attr, ErrorCode, Payload, Reply, Request, WirePath, WritePart};

use crate::link::Conn;

/// Changes waiting to be sent, at most: one more is made at once.
const MAX_QUEUED: usize = 1024;
/// Bytes of new files' data queued at most: past it, a file is committed at once by its
/// caller.
const MAX_QUEUED_BYTES: usize = 2 << 20;
/// The upload handle of a new file's queued commit (one at a time: each is committed, its
/// handle closed, before the next is created).
const PUT_HANDLE: u32 = 0xffff_ff00;

/// How long the queue must stay unchanged before the mount's thread sends it (a program
/// removing files one after another is still going: `rm -rf` sends a directory's removals with
/// the directory's own), and how long it waits at most.
const QUIET: Duration = Duration::from_millis(10);
const MAX_HOLD: Duration = Duration::from_millis(100);
/// The same on a near link (replies within a few milliseconds: a LAN, or this machine),
/// where a round trip more costs less than the server sitting idle: the queue goes out in
/// small batches, and the server makes them while the program goes on. Held for 100 ms, `cp -a`
/// of the headers sent about a hundred files at a time, and a larger file's commit, which
/// waits for the batch ahead of it, waited 25–40 ms for the server to make them.
const QUIET_NEAR: Duration = Duration::from_millis(1);
const MAX_HOLD_NEAR: Duration = Duration::from_millis(4);

/// A change queued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// The file at this path is removed.
    Unlink(WirePath),
    /// The file's permission bits and/or modification time are set (and its attributes asked
    /// for after, in the same round trip).
    SetAttr {
        path: WirePath,
        mode: Option<u32>,
        mtime_ns: Option<i64>,
    },
    /// The file is renamed (and its attributes asked for after, in the same round trip).
    Rename { from: WirePath, to: WirePath },
    /// A new file made here is created on the server with its data (Create, Write, Commit).
    Put(Box<NewFile>),
    /// A directory made here is made on the server (with this mode), and its listing and
    /// attributes asked for after, in the same round trip: the server's lease on them runs
    /// from then.
    Mkdir { path: WirePath, mode: u32 },
}

/// A small file made here, its data and what its commit says.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct NewFile {
    /// The mount's inode, and its count of writes when the data was read: the answer makes
    /// the copy clean if no write came since.
    pub ino: u64,
    pub writes: u64,
    pub path: WirePath,
    pub mode: u32,
    pub mtime_ns: i64,
    /// Its recipe (kept for the next commit of the file: see `crate::recipes`) and the whole
    /// object's id.
    pub recipe: Arc<ferry_format::Recipe>,
    pub oid: Id,
    pub data: Vec<u8>,
    /// Made with `O_EXCL`: a file someone else made under its name meanwhile is theirs.
    pub exclusive: bool,
    /// The version of the file it replaces (renamed over it before the commit went: see
    /// [`Queue::retarget_put`]); `None`: nothing may be there.
    pub replaces: Option<u64>,
}

impl std::fmt::Debug for NewFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "new file {:?} ({} bytes)", self.path, self.data.len())
    }
}

/// Where a queued new file's commit is (see [`Queue::cancel_put`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PutState {
    /// In the queue, not sent (taken out, if asked by [`Queue::cancel_put`]).
    Queued,
    /// Sent, not yet answered.
    InFlight,
    /// Neither queued nor on its way.
    None,
}

impl Change {
    /// The paths whose versions the change moves on the server (a removal's: none; a
    /// commit of a new file under that name needs no version).
    fn moves(&self) -> Vec<&WirePath> {
        match self.moves_version() {
            false => vec![],
            true => self.paths().1,
        }
    }

    /// Whether the change moves the version of the paths it names: not a removal's, and not
    /// a new directory's (which has none before; its attributes here serve until the answer,
    /// so a look at it does not send the queue: the kernel looks at a directory before each
    /// file made in it).
    fn moves_version(&self) -> bool {
        !matches!(self, Change::Unlink(_) | Change::Mkdir { .. })
    }

    /// Bytes of data it carries.
    fn bytes(&self) -> usize {
        match self {
            Change::Put(f) => f.data.len(),
            _ => 0,
        }
    }

    /// The path whose attributes are asked for after the change (none for a removal), and
    /// the paths to take as changed on the server if it refuses the change.
    fn paths(&self) -> (Option<&WirePath>, Vec<&WirePath>) {
        match self {
            Change::Unlink(p) => (None, vec![p]),
            Change::SetAttr { path, .. } => (Some(path), vec![path]),
            Change::Rename { from, to } => (Some(to), vec![from, to]),
            Change::Put(f) => (None, vec![&f.path]),
            Change::Mkdir { path, .. } => (Some(path), vec![path]),
        }
    }

    /// The requests that make the change (a new file's data taken out: it is not kept while
    /// the answer is awaited).
    fn requests(&mut self) -> Vec<Request> {
        if let Change::Put(f) = self {
            let data = std::mem::take(&mut f.data);
            let mut rs = vec![Request::Create {
                handle: PUT_HANDLE,
                path: f.path.clone(),
                base: f.replaces,
            }];
            if !data.is_empty() {
                rs.push(Request::Write {
                    handle: PUT_HANDLE,
                    parts: vec![WritePart::Data {
                        lens: f.recipe.chunks().iter().map(|c| c.len).collect(),
                        payload: Payload::Plain(data),
                    }],
                });
            }
            rs.push(Request::Commit {
                handle: PUT_HANDLE,
                mode: f.mode,
                mtime_ns: f.mtime_ns,
                size: f.recipe.total_len(),
                oid: f.oid,
            });
            return rs;
        }
        let (after, _) = self.paths();
        let mut rs = vec![match self.clone() {
            Change::Unlink(path) => Request::Unlink { path },
            Change::SetAttr {
                path,
                mode,
                mtime_ns,
            } => Request::SetAttr {
                path,
                mode,
                mtime_ns,
            },
            Change::Rename { from, to } => Request::Rename { from, to },
            Change::Mkdir { path, mode } => Request::Mkdir { path, mode },
            Change::Put(_) => unreachable!("made above"),
        }];
        if let Change::Mkdir { path, .. } = &*self {
            // The listing's lease too (the attributes' below is the directory's).
            rs.push(Request::ReadDir {
                path: path.clone(),
                keys: vec![],
            });
        }
        rs.extend(after.map(|p| Request::GetAttr { path: p.clone() }));
        rs
    }
}

/// What the server's answers to changes sent said of them.
#[derive(Default)]
pub(crate) struct Answered {
    /// Paths to ask for again: a change the server refused, so what it has shows.
    pub changed: Vec<WirePath>,
    /// The attributes of files whose attributes were set, after (asked for when the change
    /// was sent).
    pub attrs: Vec<(WirePath, Attr, Instant)>,
    /// New files' commits: the server's attributes of each, or its refusal.
    pub puts: Vec<PutAnswer>,
}

/// The answer to a queued new file's commit.
#[derive(Debug)]
pub(crate) struct PutAnswer {
    pub ino: u64,
    pub writes: u64,
    /// The path it was sent for (a directory renamed meanwhile moved the file here).
    pub path: WirePath,
    pub recipe: Arc<ferry_format::Recipe>,
    pub exclusive: bool,
    pub outcome: Result<Attr, (ErrorCode, String)>,
    /// When it was sent (the attributes' lease runs from then).
    pub at: Instant,
}

#[derive(Default)]
pub(crate) struct Queue {
    queue: Mutex<Vec<Change>>,
    queued: Condvar,
    /// Set from when changes are sent until the server's answers to them have arrived.
    in_flight: Arc<Flight>,
    /// The new files whose commits were sent and whose answers are not yet passed on (see
    /// [`Queue::wait_answered`]).
    answering: Arc<Answering>,
}

#[derive(Default)]
struct Answering {
    inos: Mutex<std::collections::HashSet<u64>>,
    done: Condvar,
}

#[derive(Default)]
struct Flight {
    busy: Mutex<bool>,
    landed: Condvar,
    /// The paths the changes in flight touch, each with whether the change moves its version.
    paths: Mutex<Vec<(WirePath, bool)>>,
}

impl Flight {
    fn land(&self) {
        self.paths.lock().unwrap_or_else(|e| e.into_inner()).clear();
        *self.busy.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.landed.notify_all();
    }
}

/// Changes sent, their answers to take (see [`Sent::finish`]): each change with the ids of
/// its requests.
pub(crate) struct Sent {
    ids: Vec<(Change, Vec<u32>)>,
    flight: Option<Arc<Flight>>,
    sent_at: Instant,
    /// The new files among them, and the set they are in until their answers are passed on.
    puts: Vec<u64>,
    answering: Arc<Answering>,
}

impl Drop for Sent {
    fn drop(&mut self) {
        // Answered, or the session failed: either way, nothing of them is on its way.
        if let Some(f) = self.flight.take() {
            f.land();
        }
        // Their answers were passed on (the owner drops it after), or will never come.
        if !self.puts.is_empty() {
            let mut set = self
                .answering
                .inos
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for ino in &self.puts {
                set.remove(ino);
            }
            self.answering.done.notify_all();
        }
    }
}

impl Queue {
    /// Queues `change`; `false` when the queue is full.
    pub(crate) fn queue(&self, change: Change) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = change.bytes();
        if q.len() >= MAX_QUEUED
            || (bytes > 0 && q.iter().map(Change::bytes).sum::<usize>() + bytes > MAX_QUEUED_BYTES)
        {
            return false;
        }
        q.push(change);
        self.queued.notify_all();
        true
    }

    /// Whether a change queued, or sent and not yet answered, moves the version of `path`.
    pub(crate) fn touches(&self, path: &WirePath) -> bool {
        self.involves(path, true)
    }

    /// Whether a change queued, or sent and not yet answered, names `path` (with `moving`:
    /// one that moves its version; a removal does not).
    pub(crate) fn involves(&self, path: &WirePath, moving: bool) -> bool {
        let queued = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let listed = |c: &Change| match moving {
            true => c.moves().contains(&path),
            false => c.paths().1.contains(&path),
        };
        let flying = self
            .in_flight
            .paths
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        queued.iter().any(listed)
            || flying
                .iter()
                .any(|(p, moves)| p == path && (*moves || !moving))
    }

    /// Whether a commit of the new file `ino` is queued or on its way.
    pub(crate) fn has_put(&self, ino: u64) -> bool {
        self.put_state(ino, false) != PutState::None
    }

    /// Whether a new file's commit is queued.
    pub(crate) fn holds_puts(&self) -> bool {
        let q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.iter().any(|c| matches!(c, Change::Put(_)))
    }

    /// Where a commit of the new file `ino` is.
    pub(crate) fn put_of(&self, ino: u64) -> PutState {
        self.put_state(ino, false)
    }

    /// A new file renamed before its queued commit went: the commit makes it under its new
    /// name `to` instead, replacing the version `replaces` of the file there (`None`: nothing
    /// there), as a rename would; not exclusive. It goes to the end of the queue, behind every
    /// change queued before the rename (a removal of `to`, a directory made for it). `false`
    /// when no commit of it is queued (it went, or there was none), or it already replaces a
    /// file (renamed twice: that file must go): the rename then waits for its answer. Nothing
    /// else queued names its old path (see `cancel_put`).
    pub(crate) fn retarget_put(&self, ino: u64, to: &WirePath, replaces: Option<u64>) -> bool {
        let mut queued = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = queued
            .iter()
            .position(|c| matches!(c, Change::Put(f) if f.ino == ino && f.replaces.is_none()))
        else {
            return false;
        };
        let mut c = queued.remove(i);
        if let Change::Put(f) = &mut c {
            f.path = to.clone();
            f.replaces = replaces;
            f.exclusive = false;
        }
        queued.push(c);
        self.queued.notify_all();
        true
    }

    /// Gives the queued commit of the new file `ino`, if it has not been sent, new permission
    /// bits and/or modification time (a chmod or utimes of the file after its close: `rsync`
    /// sets both on each temporary file), in place: its content is as queued. `false` when
    /// none is queued (it went, or there was none): its caller commits the file again. `writes`
    /// is the file's count of writes with this change (the answer makes the copy clean).
    pub(crate) fn restamp_put(
        &self,
        ino: u64,
        mode: Option<u32>,
        mtime_ns: Option<i64>,
        writes: u64,
    ) -> bool {
        let mut queued = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Change::Put(f)) = queued
            .iter_mut()
            .find(|c| matches!(c, Change::Put(f) if f.ino == ino))
        else {
            return false;
        };
        f.mode = mode.unwrap_or(f.mode);
        f.mtime_ns = mtime_ns.unwrap_or(f.mtime_ns);
        f.writes = writes;
        true
    }

    /// Takes the queued commit of the new file `ino` out of the queue if it has not been
    /// sent: its caller commits it otherwise (or the file is gone before it reached the
    /// server). Nothing else queued names its path (a change of its attributes is made in it;
    /// a removal or rename waits for its answer), so the rest keep their order.
    pub(crate) fn cancel_put(&self, ino: u64) -> PutState {
        self.put_state(ino, true)
    }

    fn put_state(&self, ino: u64, cancel: bool) -> PutState {
        let mut queued = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = queued
            .iter()
            .position(|c| matches!(c, Change::Put(f) if f.ino == ino))
        {
            if cancel {
                queued.remove(i);
            }
            return PutState::Queued;
        }
        drop(queued);
        let answering = self
            .answering
            .inos
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match answering.contains(&ino) {
            true => PutState::InFlight,
            false => PutState::None,
        }
    }

    /// Waits until the answer to the new file `ino`'s commit has been passed on (as a
    /// `Break::Put` among the link's breaks), or will never come (the link failed).
    pub(crate) fn wait_answered(&self, ino: u64) {
        let set = self
            .answering
            .inos
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let _set = self
            .answering
            .done
            .wait_while(set, |s| s.contains(&ino))
            .unwrap_or_else(|e| e.into_inner());
    }

    fn len(&self) -> usize {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Waits at most `timeout` for changes to be queued, then until the queue has been quiet
    /// for [`QUIET`] (at most [`MAX_HOLD`]; on a `near` link, [`QUIET_NEAR`] and
    /// [`MAX_HOLD_NEAR`]); whether some are queued.
    pub(crate) fn wait(&self, timeout: Duration, near: bool) -> bool {
        let (quiet, hold) = match near {
            true => (QUIET_NEAR, MAX_HOLD_NEAR),
            false => (QUIET, MAX_HOLD),
        };
        {
            let q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let (q, _) = self
                .queued
                .wait_timeout_while(q, timeout, |q| q.is_empty())
                .unwrap_or_else(|e| e.into_inner());
            if q.is_empty() {
                return false;
            }
        }
        let since = Instant::now();
        let mut n = self.len();
        while n > 0 && since.elapsed() < hold {
            std::thread::sleep(quiet);
            let now = self.len();
            if now == n {
                break;
            }
            n = now;
        }
        n > 0
    }

    /// Sends the queued changes over `c`, once the server has answered those sent over
    /// another session, without waiting for the answers: the caller's requests go right
    /// behind them, and other sessions' wait only until the answers arrive.
    pub(crate) fn send(&self, c: &mut Conn) -> Result<Sent, ConnError> {
        let flight = &self.in_flight;
        let mut busy = flight.busy.lock().unwrap_or_else(|e| e.into_inner());
        while *busy {
            busy = flight.landed.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        let changes = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            // The new files among them are awaited from now on, before the queue is let go:
            // a look in between finds each queued or awaited, never neither.
            let mut set = self
                .answering
                .inos
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            set.extend(q.iter().filter_map(|c| match c {
                Change::Put(f) => Some(f.ino),
                _ => None,
            }));
            std::mem::take(&mut *q)
        };
        let mut sent = Sent {
            ids: Vec::with_capacity(changes.len()),
            flight: None,
            sent_at: Instant::now(),
            puts: vec![],
            answering: self.answering.clone(),
        };
        if changes.is_empty() {
            return Ok(sent);
        }
        *busy = true;
        drop(busy);
        *flight.paths.lock().unwrap_or_else(|e| e.into_inner()) = changes
            .iter()
            .flat_map(|c| {
                let moves = c.moves_version();
                c.paths().1.into_iter().map(move |p| (p.clone(), moves))
            })
            .collect();
        sent.puts = changes
            .iter()
            .filter_map(|c| match c {
                Change::Put(f) => Some(f.ino),
                _ => None,
            })
            .collect();
        sent.flight = Some(flight.clone());
        let n = changes.len();
        for mut change in changes {
            let mut ids = vec![];
            for r in change.requests() {
                ids.push(c.send(r).map_err(|e| unknown(n, e))?);
            }
            sent.ids.push((change, ids));
        }
        if let Some(&last) = sent.ids.last().and_then(|(_, ids)| ids.last()) {
            // Answered in order: the last answer is the sign for all.
            let f = flight.clone();
            c.on_answered(last, Box::new(move || f.land()));
        }
        Ok(sent)
    }
}

impl Sent {
    /// The session failed before the answers came: their fate is unknown.
    pub(crate) fn abandon(self) {
        if !self.ids.is_empty() {
            unknown(self.ids.len(), ConnError::Closed);
        }
    }

    /// Takes the server's answers. A change it refused (the file became a directory
    /// meanwhile, unseen here, or is not the user's to change) is logged, and its path and
    /// directory are returned as changed on the server: they show as the server has them.
    /// Only a failure of the link is an `Err`; it leaves the changes' fate unknown (the
    /// session's end voids every lease: the server's listings say).
    pub(crate) fn finish(&mut self, c: &mut Conn) -> Result<Answered, ConnError> {
        let mut out = Answered::default();
        let ids = std::mem::take(&mut self.ids);
        let n = ids.len();
        for (change, ids) in ids {
            if let Change::Put(f) = &change {
                out.puts
                    .push(self.put_answer(c, f, ids).map_err(|e| unknown(n, e))?);
                continue;
            }
            let (after, touched) = change.paths();
            let mut answers = vec![];
            for id in ids {
                match c.replies(id) {
                    Ok(r) => answers.push(Some(r)),
                    Err(ConnError::Remote {
                        code: ErrorCode::NotFound,
                        ..
                    }) if matches!(change, Change::Unlink(_)) => answers.push(None),
                    Err(ConnError::Remote { message, .. }) => {
                        tracing::warn!(
                            "{change:?}: made here, but the server refused ({message}); what it has shows"
                        );
                        for p in &touched {
                            out.changed.extend(p.split_last().map(|(dir, _)| dir));
                            out.changed.push((*p).clone());
                        }
                        answers.push(None);
                    }
                    Err(e) => return Err(unknown(n, e)),
                }
            }
            // The attributes asked for after the change, its last request, when every
            // request was answered.
            if let (Some(p), true) = (after, answers.iter().all(Option::is_some)) {
                if let Some(Reply::Attr(a)) = answers.last_mut().and_then(|r| r.take()?.pop()) {
                    out.attrs.push((p.clone(), a, self.sent_at));
                }
            }
        }
        Ok(out)
    }

    /// A new file's answers (its create's, data's and commit's): the commit's attributes, or
    /// the first refusal (the rest follow from it).
    fn put_answer(&self, c: &mut Conn, f: &NewFile, ids: Vec<u32>) -> Result<PutAnswer, ConnError> {
        let mut outcome = Err((ErrorCode::Io, "no answer to the commit".to_string()));
        let mut refused = None;
        for id in ids {
            match c.replies(id) {
                Ok(mut r) => {
                    if let Some(Reply::Attr(a)) = r.pop() {
                        outcome = Ok(a);
                    }
                }
                Err(ConnError::Remote { code, message }) => {
                    refused.get_or_insert((code, message));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(PutAnswer {
            ino: f.ino,
            writes: f.writes,
            path: f.path.clone(),
            recipe: f.recipe.clone(),
            exclusive: f.exclusive,
            outcome: refused.map_or(outcome, Err),
            at: self.sent_at,
        })
    }
}

fn unknown(n: usize, e: ConnError) -> ConnError {
    tracing::warn!(
        "the link failed before the server answered {n} changes made here (removals, renames, attributes, new files): they may not have been made (what the server has shows if not; new files are written back again)"
    );
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mount's thread finds changes queued (and none when there are none), and the queue
    /// is bounded: past it, a removal is made at once by its caller.
    #[test]
    fn the_queue_is_found_and_bounded() {
        let r = Queue::default();
        assert!(!r.wait(Duration::ZERO, false));
        assert!(!r.wait(Duration::ZERO, true));
        assert!(r.queue(Change::Unlink("a".into())));
        assert!(r.wait(Duration::ZERO, true));
        assert!(r.wait(Duration::ZERO, false));
        for i in 1..MAX_QUEUED {
            assert!(r.queue(Change::Unlink(format!("f{i}").as_str().into())));
        }
        assert!(!r.queue(Change::Unlink("one more".into())));
        assert_eq!(r.len(), MAX_QUEUED);
    }
}
