//! Removals of files acknowledged before the server makes them (the caller knows from its
//! leases that the server will): queued here, and sent together right before the requests of
//! the next operation, whatever it is, in the same round trip. No operation's requests go over
//! another session until the server has answered them. So the server makes every change in
//! the order made here: a file made again under a removed name is never removed by a late
//! removal.

use std::sync::{Arc, Condvar, Mutex};
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
    /// Set from when removals are sent until the server's answers to them have arrived.
    in_flight: Arc<Flight>,
}

#[derive(Default)]
struct Flight {
    busy: Mutex<bool>,
    landed: Condvar,
}

impl Flight {
    fn land(&self) {
        *self.busy.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.landed.notify_all();
    }
}

/// Removals sent, their answers to take (see [`Sent::finish`]).
pub(crate) struct Sent {
    ids: Vec<(WirePath, u32)>,
    flight: Option<Arc<Flight>>,
}

impl Drop for Sent {
    fn drop(&mut self) {
        // Answered, or the session failed: either way, nothing of them is on its way.
        if let Some(f) = self.flight.take() {
            f.land();
        }
    }
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

    /// Whether removals are queued, or sent and not yet answered.
    pub(crate) fn busy(&self) -> bool {
        self.len() > 0
            || *self
                .in_flight
                .busy
                .lock()
                .unwrap_or_else(|e| e.into_inner())
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

    /// Sends the queued removals over `c`, once the server has answered those sent over
    /// another session, without waiting for the answers: the caller's requests go right
    /// behind them, and other sessions' wait only until the answers arrive.
    pub(crate) fn send(&self, c: &mut Conn) -> Result<Sent, ConnError> {
        let flight = &self.in_flight;
        let mut busy = flight.busy.lock().unwrap_or_else(|e| e.into_inner());
        while *busy {
            busy = flight.landed.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        let paths = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
        let mut sent = Sent {
            ids: Vec::with_capacity(paths.len()),
            flight: None,
        };
        if paths.is_empty() {
            return Ok(sent);
        }
        *busy = true;
        drop(busy);
        sent.flight = Some(flight.clone());
        let n = paths.len();
        for p in paths {
            match c.send(Request::Unlink { path: p.clone() }) {
                Ok(id) => sent.ids.push((p, id)),
                Err(e) => return Err(unknown(n, e)),
            }
        }
        if let Some(&(_, last)) = sent.ids.last() {
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

    /// Takes the server's answers. One it refused (the file became a directory meanwhile,
    /// unseen here) is logged, and its name and directory are returned as changed on the
    /// server: the name shows again. Only a failure of the link is an `Err`; it leaves the
    /// removals' fate unknown (the session's end voids every lease: the server's listings say).
    pub(crate) fn finish(mut self, c: &mut Conn) -> Result<Vec<WirePath>, ConnError> {
        let mut changed = vec![];
        let ids = std::mem::take(&mut self.ids);
        let n = ids.len();
        for (p, id) in ids {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The mount's thread finds removals queued (and none when there are none), and the queue
    /// is bounded: past it, a removal is made at once by its caller.
    #[test]
    fn the_queue_is_found_and_bounded() {
        let r = Removals::default();
        assert!(!r.wait(Duration::ZERO));
        assert!(r.queue("a".into()));
        assert!(r.wait(Duration::ZERO));
        for i in 1..MAX_QUEUED {
            assert!(r.queue(format!("f{i}").as_str().into()));
        }
        assert!(!r.queue("one more".into()));
        assert_eq!(r.len(), MAX_QUEUED);
    }
}
