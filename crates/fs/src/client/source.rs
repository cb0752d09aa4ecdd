//! A server session as a source of the transfer engine (`ferry_transfer`): chunks by full id,
//! pipelined; for a mirror, with each chunk's place in the tree, so a server that never cut
//! the file (or cut it with another chunker's boundaries) finds it by reading there.

use std::collections::VecDeque;
use std::io::{self, Write};

use ferry_format::{ChunkRef, Id};
use ferry_proto::{GetChunks, Ids, Located, Request, Target, WirePath};
use ferry_transfer::{Batch, Source, SourceError, Want};

use super::plain::plain_chunks;
use crate::conn::{ConnError, Connection};

/// Requests a session keeps outstanding, and what one names at most.
const DEPTH: usize = 4;
const BATCH: Batch = Batch {
    chunks: 256,
    bytes: 4 << 20,
};

/// Another server holding the same tree as the one a fetch lists (or part of it): it serves
/// chunks in parallel with the first.
pub struct Mirror {
    pub session: crate::Session,
    /// Where the tree is on the mirror (its wire path).
    pub root: WirePath,
    /// Where the same tree is on the server the fetch lists.
    pub of: WirePath,
    /// For reports: `host:path`.
    pub name: String,
    /// A lookaside provider (a daemon of the user's on the LAN): asked for chunks by id alone,
    /// before the server.
    pub by_id: bool,
}

/// A session as a source.
pub struct SessionSource<'c, R, W> {
    conn: &'c mut Connection<R, W>,
    name: String,
    /// With places: (the tree's wire path on the server the fetch lists, on this one).
    places: Option<(WirePath, WirePath)>,
    /// Chunks of this object, read with this capability (a transfer daemon's).
    object: Option<(Id, Vec<u8>)>,
    pending: VecDeque<(u32, Vec<ChunkRef>)>,
    /// Requests sent so far: the first window costs a round trip, refills keep the stream
    /// going.
    sent: usize,
    /// Ends the session's reading from another thread (a mirror's: its link may go silent).
    hang_up: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// Ends a session's reading from another thread.
type HangUp = Option<std::sync::Arc<std::sync::atomic::AtomicBool>>;

impl<'c, R: io::Read, W: Write> SessionSource<'c, R, W> {
    fn new(conn: &'c mut Connection<R, W>, name: &str, hang_up: HangUp) -> Self {
        SessionSource {
            conn,
            name: name.to_string(),
            places: None,
            object: None,
            pending: VecDeque::new(),
            sent: 0,
            hang_up,
        }
    }

    /// The server the fetch lists: it cut every recipe it sent, and finds chunks by id.
    pub(crate) fn primary(conn: &'c mut Connection<R, W>) -> Self {
        Self::new(conn, "the server", None)
    }

    /// A lookaside provider: chunks by id alone; `hang_up` ends its session's reading.
    pub fn provider(conn: &'c mut Connection<R, W>, name: &str, hang_up: HangUp) -> Self {
        Self::new(conn, name, hang_up)
    }

    /// A transfer daemon holding object `oid`, read with capability `cap`; `hang_up` ends its
    /// session's reading.
    pub fn object(
        conn: &'c mut Connection<R, W>,
        name: &str,
        oid: Id,
        cap: Vec<u8>,
        hang_up: HangUp,
    ) -> Self {
        SessionSource {
            object: Some((oid, cap)),
            ..Self::new(conn, name, hang_up)
        }
    }

    /// A mirror: chunks asked for with their places, its paths for the listed server's;
    /// `hang_up` ends its session's reading (a link gone silent cannot hold the fetch).
    pub(crate) fn mirror(
        conn: &'c mut Connection<R, W>,
        name: &str,
        of: &WirePath,
        root: &WirePath,
        hang_up: HangUp,
    ) -> Self {
        SessionSource {
            places: Some((of.clone(), root.clone())),
            ..Self::new(conn, name, hang_up)
        }
    }

    /// Where the wants lie on this server, in runs of one file each; `None` when a place
    /// cannot be named here (then the chunks are asked for by id alone).
    fn located(&self, wants: &[Want]) -> Option<Located> {
        let (of, root) = self.places.as_ref()?;
        let mut runs: Vec<(Target, Vec<(u64, u32)>)> = vec![];
        let mut last: Option<&[u8]> = None;
        for w in wants {
            let place = w.place.as_ref()?;
            if last != Some(&place.path[..]) {
                let listed = WirePath::new(place.path.to_vec()).ok()?;
                let here = root.join_path(&listed.strip_prefix(of)?).ok()?;
                runs.push((Target::Path(here), vec![]));
                last = Some(&place.path[..]);
            }
            runs.last_mut()?.1.push((place.offset, w.len));
        }
        Some(Located { runs })
    }
}

impl<R: io::Read + Send, W: Write> Source for SessionSource<'_, R, W> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn depth(&self) -> usize {
        DEPTH
    }

    fn rate_hint(&self) -> Option<f64> {
        self.conn.link_rate().map(|r| r as f64)
    }

    fn latency_hint(&self) -> Option<std::time::Duration> {
        self.conn.round_trip()
    }

    fn batch(&self) -> Batch {
        BATCH
    }

    fn request(&mut self, wants: &[Want]) -> Result<(), SourceError> {
        let ids = Ids::Full(wants.iter().map(|w| w.id).collect());
        let r = match &self.object {
            Some((oid, cap)) => Request::ObjectChunks {
                oid: *oid,
                cap: cap.clone(),
                ids,
            },
            None => Request::GetChunks(GetChunks {
                ids,
                at: self.located(wants),
                against: None,
            }),
        };
        let id = if self.sent < DEPTH {
            self.conn.send(r)
        } else {
            self.conn.send_paced(r)
        };
        let id = id.and_then(|id| self.conn.flush().map(|_| id));
        let id = id.map_err(source_error)?;
        self.sent += 1;
        let asked = wants
            .iter()
            .map(|w| ChunkRef {
                id: w.id,
                len: w.len,
            })
            .collect();
        self.pending.push_back((id, asked));
        Ok(())
    }

    fn receive(&mut self) -> Result<Vec<Option<Vec<u8>>>, SourceError> {
        let (id, asked) = self
            .pending
            .pop_front()
            .ok_or_else(|| SourceError::new("nothing asked"))?;
        let replies = self.conn.replies(id).map_err(source_error)?;
        let mut out = vec![None; asked.len()];
        for (p, bytes) in plain_chunks(replies, &asked).map_err(SourceError::new)? {
            out[p] = Some(bytes);
        }
        Ok(out)
    }

    fn interrupter(&self) -> Option<ferry_transfer::Interrupter> {
        let flag = self.hang_up.clone()?;
        Some(Box::new(move || {
            flag.store(true, std::sync::atomic::Ordering::Release)
        }))
    }

    fn abandon(&mut self, n: usize) {
        for (id, _) in self.pending.drain(..n.min(self.pending.len())) {
            self.conn.forget(id);
        }
    }
}

fn source_error(e: ConnError) -> SourceError {
    SourceError::new(e)
}
