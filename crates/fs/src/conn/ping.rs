//! Timing the link by Pings: how near the server is decides how hard the frames against old
//! data start out compressed (`delta::level`).

use std::io::Read;
use std::time::Instant;

use ferry_proto::{Message, Request};

use super::{ConnError, Connection};

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
    /// connection's reader), not by when this side took them.
    pub fn set_arrivals(&mut self, arrivals: Arrivals) {
        self.arrivals = Some(arrivals);
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
    /// `set_arrivals`). Timed from when it was queued (first of its batch), a Ping never shows
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
