//! Group commit: commits that arrive together are synced together.
//!
//! Every commit fsyncs its temporary file before the rename, and on a journaled file system
//! each fsync in turn is a journal commit of its own (0.7 ms a small file on ext4 here); a
//! mount's `cp -a` or `tar x` sends the Create, Write and Commit of many small files at once.
//! So while more requests of the same kind are already waiting in the session's input, a
//! commit is checked and then parked; once the input holds nothing more (or another kind of
//! request comes, or the group is full), the parked temporary files are fsynced side by side
//! (the file system joins the syncs into few journal commits), then each is installed in
//! turn, exactly as alone, and answered. Nothing is answered before it is installed and
//! durable as the session promises (a session that does not defer its syncs has the
//! directories fsynced once for the group, before the answers), so what a client is told and
//! what a crash leaves are as without grouping; only the answers come later, together.

use std::fs::File;
use std::io;
use std::time::{Duration, Instant};

use ferry_proto::{Frame, Message, Payload, Reply, Request, WritePart};

use super::upload::Upload;
use super::{io_error, Server};

/// Commits parked at most: a group of files this large is synced together.
const MAX_PARKED: usize = 64;
/// Threads syncing a group's files at most.
const SYNC_THREADS: usize = 8;

/// The commits of a session waiting to be synced together.
#[derive(Default)]
pub(crate) struct Group {
    /// Set by the loop that serves a session, which settles the group whenever its input is
    /// empty ([`Server::settle`]); without it, every commit is installed at once.
    pub(super) enabled: bool,
    parked: Vec<(u32, Upload)>,
    /// How long syncing a file took the session lately (a moving average), once measured.
    sync_time: Option<Duration>,
}

impl Server {
    /// Lets commits wait to be synced together; the caller then calls [`Server::settle`]
    /// whenever no complete request is left in its input.
    pub fn group_commits(&mut self) {
        self.group.enabled = true;
    }

    /// Whether a commit of `size` bytes would be parked: grouping is on, the group has room,
    /// the file has bytes to sync, and syncing costs enough to be worth waiting for
    /// (`ServerOptions::group_sync_min`; not known yet: not parked, and measured).
    fn would_park(&self, size: u64) -> bool {
        let worth = self.opts.group_sync_min.is_zero()
            || self
                .group
                .sync_time
                .is_some_and(|t| t >= self.opts.group_sync_min);
        self.group.enabled && size > 0 && self.group.parked.len() < MAX_PARKED && worth
    }

    /// Parks the commit of upload `u` (request `id`) if it [would be](Self::would_park);
    /// gives `u` back otherwise.
    pub(super) fn park(&mut self, id: u32, u: Upload) -> Option<Upload> {
        if !self.would_park(u.size()) {
            return Some(u);
        }
        self.group.parked.push((id, u));
        None
    }

    /// Notes how long syncing a file took.
    pub(super) fn synced_in(&mut self, took: Duration) {
        self.group.sync_time = Some(match self.group.sync_time {
            Some(t) => (t * 3 + took) / 4,
            None => took,
        });
    }

    /// Whether request `r` may go ahead of the parked commits: the next file's upload, which
    /// neither reads nor names anything they change (its data whole or from its own base: a
    /// chunk named by reference may be one a parked commit brings, found only once it is
    /// installed), and a commit that will be parked too (one installed at once would pass
    /// those parked before it). Any other request settles them first.
    pub(super) fn may_pass_parked(&self, r: &Request) -> bool {
        match r {
            Request::Create { path, .. } => {
                !self.group.parked.iter().any(|(_, u)| u.path() == path)
            }
            Request::Write { parts, .. } => parts.iter().all(|p| match p {
                WritePart::Base { .. } => true,
                WritePart::Data { payload, .. } => matches!(payload, Payload::Plain(_)),
                WritePart::Chunks(_) => false,
            }),
            Request::Commit { size, .. } => self.would_park(*size),
            _ => false,
        }
    }

    /// Installs and answers the parked commits (see the module's docs); the answers, with the
    /// lease breaks they cause ahead of them.
    pub fn settle(&mut self) -> Vec<Frame> {
        let mut out = self.settle_parked();
        if !out.is_empty() && (!self.broken.is_empty() || !self.changed.is_empty()) {
            let breaks = self.unasked();
            out.splice(0..0, breaks);
        }
        out
    }

    /// [`settle`](Self::settle) without the lease breaks (a request's own answer carries them).
    pub(super) fn settle_parked(&mut self) -> Vec<Frame> {
        let parked = std::mem::take(&mut self.group.parked);
        if parked.is_empty() {
            return vec![];
        }
        let files: Vec<&File> = parked.iter().map(|(_, u)| u.file()).collect();
        let (synced, took) = sync_all(&files);
        self.synced_in(took);
        tracing::debug!("{} commits synced together", files.len());
        // A session that syncs each change's directory before its answer syncs each once for
        // the group, still before any answer.
        let deferred = self.dir_syncs.deferring();
        self.dir_syncs.defer();
        let mut answers = Vec::with_capacity(parked.len());
        for ((id, u), synced) in parked.into_iter().zip(synced) {
            let reply = match synced {
                Ok(()) => self.finish(u),
                Err(e) => {
                    let r = io_error(u.path(), &e);
                    super::upload::discard(u);
                    r
                }
            };
            answers.push((id, reply));
        }
        if !deferred {
            self.dir_syncs.undefer();
            if let Err(e) = self.dir_syncs.sync() {
                // Installed, but not made durable as promised: none of them is answered as
                // done (each can be committed again: the version now there is the client's).
                for (_, reply) in answers.iter_mut() {
                    if matches!(reply, Reply::Attr(_)) {
                        *reply = super::error(
                            ferry_proto::ErrorCode::Io,
                            format!("syncing the directories of a group of commits: {e}"),
                        );
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|(id, r)| Message::Reply(r).to_frame(id))
            .collect()
    }
}

/// Fsyncs `files` side by side (up to [`SYNC_THREADS`] at once); each one's outcome, in order,
/// and how long one took on average.
fn sync_all(files: &[&File]) -> (Vec<io::Result<()>>, Duration) {
    let each = |part: &[&File]| {
        part.iter()
            .map(|f| {
                let started = Instant::now();
                (f.sync_all(), started.elapsed())
            })
            .collect::<Vec<_>>()
    };
    let timed: Vec<(io::Result<()>, Duration)> = if files.len() <= 1 {
        each(files)
    } else {
        let per = files.len().div_ceil(SYNC_THREADS.min(files.len()));
        std::thread::scope(|s| {
            // A part whose thread cannot be had is synced here, in turn.
            let running: Vec<_> = files
                .chunks(per)
                .map(|part| {
                    let t = std::thread::Builder::new()
                        .name("ferry-sync".into())
                        .spawn_scoped(s, move || each(part));
                    (part, t)
                })
                .collect();
            running
                .into_iter()
                .flat_map(|(part, t)| match t {
                    Ok(t) => t.join().unwrap_or_else(|_| {
                        part.iter()
                            .map(|_| {
                                (
                                    Err(io::Error::other("a sync thread failed")),
                                    Duration::ZERO,
                                )
                            })
                            .collect()
                    }),
                    Err(_) => each(part),
                })
                .collect()
        })
    };
    let total: Duration = timed.iter().map(|(_, t)| *t).sum();
    let mean = total / timed.len().max(1) as u32;
    (timed.into_iter().map(|(r, _)| r).collect(), mean)
}
