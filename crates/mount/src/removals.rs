//! Removals of files acknowledged before the server makes them (the caller knows from its
//! leases that the server will): queued here, and sent together before the next request of any
//! operation, whose run waits until the server has answered them (or sends its own requests
//! behind them, when it is one quick round trip). So the server makes every change in the
//! order made here, whatever session carries it: a file made again under a removed name is
//! never removed by a late removal.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_fs::ConnError;
use ferry_proto::{ErrorCode, Request, WirePath};

use crate::link::Conn;

/// Removals waiting to be sent, at most: one more is made at once.
const MAX_QUEUED: usize = 1024;

/// How long the queue must stay unchanged before the mount's thread sends it (a program
/// removing files one after another is still going: `rm -rf` sends a directory's removals with
/// the directory's own), and how long it waits at most.
const QUIET: Duration = Duration::from_millis(10);
const MAX_HOLD: Duration = Duration::from_millis(100);

#[derive(Default)]
pub(crate) struct Removals {
    queue: Mutex<Vec<WirePath>>,
    queued: Condvar,
    /// Held from when removals are sent until the server has answered them all.
    sending: Mutex<()>,
}

/// Removals sent and not yet answered: no other operation's request goes before they are.
pub(crate) struct Sent<'a> {
    _sending: MutexGuard<'a, ()>,
    ids: Vec<(WirePath, u32)>,
}

impl Removals {
    /// Queues the removal of the file `path`; `false` when the queue is full.
    pub(crate) fn queue(&self, path: WirePath) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_QUEUED {
            return false;
        }
        q.push(path);
        self.queued.notify_all();
        true
    }

    fn len(&self) -> usize {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Waits at most `timeout` for removals to be queued, then until the queue has been quiet
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

    /// Sends the queued removals over `c` (after those another session is sending are
    /// answered), without waiting for the answers: [`Sent::finish`] takes them.
    pub(crate) fn send(&self, c: &mut Conn) -> Result<Sent<'_>, ConnError> {
        let sending = self.sending.lock().unwrap_or_else(|e| e.into_inner());
        let paths = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
        let mut ids = Vec::with_capacity(paths.len());
        for p in paths {
            match c.send(Request::Unlink { path: p.clone() }) {
                Ok(id) => ids.push((p, id)),
                Err(e) => return Err(unknown(ids.len() + 1, e)),
            }
        }
        Ok(Sent {
            _sending: sending,
            ids,
        })
    }
}

impl Sent<'_> {
    /// Takes the server's answers. One it refused (the file became a directory meanwhile,
    /// unseen here) is logged, and its name and directory are returned as changed on the
    /// server: the name shows again. Only a failure of the link is an `Err`; it leaves the
    /// removals' fate unknown (the session's end voids every lease: the server's listings say).
    pub(crate) fn finish(self, c: &mut Conn) -> Result<Vec<WirePath>, ConnError> {
        let mut changed = vec![];
        let n = self.ids.len();
        for (p, id) in self.ids {
            match c.replies(id) {
                Ok(_)
                | Err(ConnError::Remote {
                    code: ErrorCode::NotFound,
                    ..
                }) => {}
                Err(ConnError::Remote { message, .. }) => {
                    tracing::warn!(
                        "{p:?}: removed here, but the server refused ({message}); it shows again"
                    );
                    changed.extend(p.split_last().map(|(dir, _)| dir));
                    changed.push(p);
                }
                Err(e) => return Err(unknown(n, e)),
            }
        }
        Ok(changed)
    }
}

fn unknown(n: usize, e: ConnError) -> ConnError {
    tracing::warn!(
        "the link failed before the server answered {n} removals made here: they may not have been made (the names show again if not)"
    );
    e
}
