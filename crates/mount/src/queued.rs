//! Changes acknowledged before the server makes them (the caller knows from its leases that
//! the server will): removals and renames of files, and changes of a file's permission bits
//! and times.
//! Queued here, and sent together right before the requests of the next operation, whatever
//! it is, in the same round trip. No operation's requests go over another session until the
//! server has answered them. So the server makes every change in the order made here: a file
//! made again under a removed name is never removed by a late removal.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferry_fs::ConnError;
use ferry_proto::{Attr, ErrorCode, Reply, Request, WirePath};

use crate::link::Conn;

/// Changes waiting to be sent, at most: one more is made at once.
const MAX_QUEUED: usize = 1024;

/// How long the queue must stay unchanged before the mount's thread sends it (a program
/// removing files one after another is still going: `rm -rf` sends a directory's removals with
/// the directory's own), and how long it waits at most.
const QUIET: Duration = Duration::from_millis(10);
const MAX_HOLD: Duration = Duration::from_millis(100);

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
}

impl Change {
    /// The paths whose versions the change moves on the server (a removal's: none; a
    /// commit of a new file under that name needs no version).
    fn moves(&self) -> Vec<&WirePath> {
        match self {
            Change::Unlink(_) => vec![],
            _ => self.paths().1,
        }
    }

    /// The path whose attributes are asked for after the change (none for a removal), and
    /// the paths to take as changed on the server if it refuses the change.
    fn paths(&self) -> (Option<&WirePath>, Vec<&WirePath>) {
        match self {
            Change::Unlink(p) => (None, vec![p]),
            Change::SetAttr { path, .. } => (Some(path), vec![path]),
            Change::Rename { from, to } => (Some(to), vec![from, to]),
        }
    }

    fn requests(&self) -> Vec<Request> {
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
        }];
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
}

#[derive(Default)]
pub(crate) struct Queue {
    queue: Mutex<Vec<Change>>,
    queued: Condvar,
    /// Set from when changes are sent until the server's answers to them have arrived.
    in_flight: Arc<Flight>,
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
}

impl Drop for Sent {
    fn drop(&mut self) {
        // Answered, or the session failed: either way, nothing of them is on its way.
        if let Some(f) = self.flight.take() {
            f.land();
        }
    }
}

impl Queue {
    /// Queues `change`; `false` when the queue is full.
    pub(crate) fn queue(&self, change: Change) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_QUEUED {
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

    fn len(&self) -> usize {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Waits at most `timeout` for changes to be queued, then until the queue has been quiet
    /// for [`QUIET`] (at most [`MAX_HOLD`]); whether some are queued.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
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
        while n > 0 && since.elapsed() < MAX_HOLD {
            std::thread::sleep(QUIET);
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
        let changes = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
        let mut sent = Sent {
            ids: Vec::with_capacity(changes.len()),
            flight: None,
            sent_at: Instant::now(),
        };
        if changes.is_empty() {
            return Ok(sent);
        }
        *busy = true;
        drop(busy);
        *flight.paths.lock().unwrap_or_else(|e| e.into_inner()) = changes
            .iter()
            .flat_map(|c| {
                let moves = !matches!(c, Change::Unlink(_));
                c.paths().1.into_iter().map(move |p| (p.clone(), moves))
            })
            .collect();
        sent.flight = Some(flight.clone());
        let n = changes.len();
        for change in changes {
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
    pub(crate) fn finish(mut self, c: &mut Conn) -> Result<Answered, ConnError> {
        let mut out = Answered::default();
        let ids = std::mem::take(&mut self.ids);
        let n = ids.len();
        for (change, ids) in ids {
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
            if let (Some(p), [Some(_), Some(r)]) = (after, answers.as_mut_slice()) {
                if let Some(Reply::Attr(a)) = r.pop() {
                    out.attrs.push((p.clone(), a, self.sent_at));
                }
            }
        }
        Ok(out)
    }
}

fn unknown(n: usize, e: ConnError) -> ConnError {
    tracing::warn!(
        "the link failed before the server answered {n} changes made here (removals, renames, attributes): they may not have been made (what the server has shows if not)"
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
        assert!(!r.wait(Duration::ZERO));
        assert!(r.queue(Change::Unlink("a".into())));
        assert!(r.wait(Duration::ZERO));
        for i in 1..MAX_QUEUED {
            assert!(r.queue(Change::Unlink(format!("f{i}").as_str().into())));
        }
        assert!(!r.queue(Change::Unlink("one more".into())));
        assert_eq!(r.len(), MAX_QUEUED);
    }
}
