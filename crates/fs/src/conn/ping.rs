//! Timing the link by Pings: how near the server is decides how hard the frames against old
//! data start out compressed (`delta::level`).

use std::io::{ErrorKind, Read};
use std::time::Instant;

use ferry_proto::{Message, Request};

use super::{ConnError, Connection};
use crate::session::ReadTimeout;

/// When the bytes a [`crate::LinkReader`] handed out last were read from the transport, by its
/// thread: a reply found among them arrived then at the latest, however late the session's
/// own thread (busy cutting files, say) took it. A Ping's round trip is timed by it.
#[derive(Clone, Default)]
pub struct Arrivals(std::sync::Arc<std::sync::Mutex<Option<Instant>>>);

impl Arrivals {
    pub(crate) fn set(&self, t: Instant) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
    }

    /// When the bytes handed out last arrived, if any were.
    pub fn latest(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<R: Read, W> Connection<R, W> {
    /// Times the replies to Pings by when their bytes arrived (`arrivals`, of this
    /// connection's reader), not by when this side took them; and lets a wait for a Ping's
    /// reply be bounded by the reader's `timeout`.
    pub(crate) fn watch_reader(&mut self, arrivals: Arrivals, timeout: ReadTimeout) {
        self.arrivals = Some(arrivals);
        self.read_timeout = Some(timeout);
    }

    /// Before a choice that turns on how near the link is, while no Ping has shown it near:
    /// takes what has arrived, and waits for the reply to the latest Ping only until that Ping
    /// has been out for 8 ms (`delta::NEAR`; a later reply would show the link far
    /// anyway). If it did not show the link near, one more is sent (two in all, as ever) and
    /// waited for as long: the first goes as the server's Hello comes, and its reply waits
    /// behind the server readying its stream's compressor (10 ms over a local pipe). A fetch
    /// that begins with a listing reaches its first choice before the first Ping's reply is
    /// taken. Replies to other requests that arrive meanwhile are kept for them. A reader
    /// whose reads cannot be bounded (not a [`crate::LinkReader`]) is not read.
    pub fn settle_probe(&mut self) -> Result<(), ConnError> {
        let Some(timeout) = self.read_timeout.clone() else {
            return Ok(());
        };
        for _ in 0..2 {
            // (The latest by when it went: a Ping answered leaves its place to the last.)
            let Some(&(ping, went)) = self.pings.iter().max_by_key(|p| p.1) else {
                return Ok(());
            };
            if crate::delta::near_link(self.rate.round_trip()) {
                return Ok(());
            }
            let before = timeout.get();
            let waited = self.wait_for_ping(ping, went + crate::delta::NEAR, &timeout);
            timeout.set(before);
            waited.map_err(|e| self.early(e))?;
            // (Sends nothing if this one showed the link near, or two went already.)
            self.probe_link().map_err(|e| self.early(e))?;
        }
        Ok(())
    }

    fn wait_for_ping(
        &mut self,
        ping: u32,
        until: Instant,
        timeout: &ReadTimeout,
    ) -> Result<(), ConnError> {
        self.flush_inner()?;
        loop {
            while let Some(f) = self.inflow.next_frame()? {
                self.route(f, 0)?;
            }
            if !self.pings.iter().any(|&(p, _)| p == ping) {
                return Ok(());
            }
            // Past the time, what already arrived is still taken: the reply is timed to when
            // it arrived, not to now.
            timeout.set(Some(until.saturating_duration_since(Instant::now())));
            let n = match self.reader.read(&mut self.buf) {
                Ok(0) => return Err(ConnError::Closed),
                Ok(n) => n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(())
                }
                Err(e) => return Err(e.into()),
            };
            self.traffic.bytes_received += n as u64;
            self.inflow.feed(&self.buf[..n]);
        }
    }

    /// As the server's Hello comes, and first in the next batch, while no round trip timed
    /// shows the link near: a Ping, its reply unwaited for (two at most). The Hello's round
    /// trip holds the server's start (opening its stores), and the first requests' replies its
    /// work (an 11 MB file cut for its recipe: 80 ms; a fetch over a local pipe took its link
    /// for a far one, its frame of new mail against 4 MiB of the mailbox at level 12: 270 ms).
    /// A Ping's reply holds none but what the server still had to do before it: the first
    /// batch and the readying of its compressor for the one sent as the Hello came (in the
    /// lab's LAN, through ssh, over 5 ms), nothing for the next batch's, which the server
    /// answers at once (but which the client may take late, busy cutting its old files: so
    /// the reply is timed to when its bytes were read, by the reader's thread, where it says:
    /// `watch_reader`). Timed from when it was queued (first of its batch), a Ping never shows
    /// a link nearer than it is; the quickest counts.
    pub(super) fn probe_link(&mut self) -> Result<(), ConnError> {
        if self.probes >= 2
            || self.server.is_none()
            || self.unflushed
            || crate::delta::near_link(self.rate.round_trip())
        {
            return Ok(());
        }
        let id = self.new_request_id();
        let went = Instant::now();
        self.write(Message::Request(Request::Ping).to_frame(id))?;
        self.newest = id;
        self.forgotten.insert(id, 0);
        self.probes += 1;
        self.pings.push((id, went));
        Ok(())
    }

    /// A reply to request `id` came: if it is a Ping's, its round trip is timed, to when the
    /// bytes that completed it arrived (those the reader handed out last, at the latest).
    pub(super) fn time_ping(&mut self, id: u32) {
        if let Some(i) = self.pings.iter().position(|&(p, _)| p == id) {
            let (_, went) = self.pings.swap_remove(i);
            let came = (self.arrivals.as_ref())
                .and_then(|a| a.latest())
                .filter(|&t| t >= went)
                .unwrap_or_else(Instant::now);
            self.rate.probed(came - went);
        }
    }
}
