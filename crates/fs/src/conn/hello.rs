//! The client's side of the Hellos: waiting for the server's, what it offers, and what a
//! failure before it came becomes.

use std::io::Read;

use ferry_proto::{Frame, Message, Reply, FEATURE_ZSTD_STREAM, VERSION};

use super::{ConnError, Connection, EarlyFailure, Outgoing};

impl<R: Read, W> Connection<R, W> {
    /// Whether the server offers `feature` (a Hello feature bit), waiting for its Hello if it
    /// has not come yet.
    pub fn offers(&mut self, feature: u64) -> Result<bool, ConnError> {
        self.settle_hello()?;
        Ok(self.server_offers(feature))
    }

    /// Whether both Hellos offered the zstd stream: each side then starts its own with a
    /// `Compressed`.
    pub(super) fn streams_compressed(&self) -> bool {
        self.offered & FEATURE_ZSTD_STREAM != 0 && self.server_offers(FEATURE_ZSTD_STREAM)
    }

    /// Whether the server's Hello, if it has come, offers `feature`.
    pub(super) fn server_offers(&self, feature: u64) -> bool {
        self.server
            .as_ref()
            .is_some_and(|h| h.features & feature != 0)
    }

    /// Whether the server offers `feature`, or, before its Hello has come, whether this side
    /// offered it (a server of this version offers what its client does, unless told not to):
    /// for a request sent ahead of the server's Hello that every server of this version
    /// answers anyway ([`ferry_proto::Request::ReadTree`]).
    pub fn may_offer(&self, feature: u64) -> bool {
        match &self.server {
            Some(h) => h.features & feature != 0,
            None => self.offered & feature != 0,
        }
    }

    /// What a failure of the link before the server's Hello has come becomes: a remote shell
    /// that exited says so.
    pub fn before_hello(&mut self, f: EarlyFailure) {
        self.early_failure = Some(f);
    }

    /// Waits for the server's Hello, if it has not come yet (replies that come ahead of it are
    /// kept for their requests).
    pub fn settle_hello(&mut self) -> Result<(), ConnError> {
        self.settle_inner().map_err(|e| self.early(e))
    }

    fn settle_inner(&mut self) -> Result<(), ConnError> {
        if self.server.is_some() {
            return Ok(());
        }
        self.flush()?;
        if self.outstanding.get(&0) == Some(&self.traffic.round_trips) {
            self.traffic.round_trips += 1;
            tracing::trace!(target: "ferry::sizes", "round trip waiting on the hello");
        }
        // (Not timed: a server just started answers its first Hello late.)
        let mut waited = crate::rate::Wait::start(None);
        while self.server.is_none() {
            if let Some(f) = self.inflow.next_frame()? {
                self.route(f, 0)?;
                continue;
            }
            self.read_more(&mut waited)?;
        }
        self.rate.ended(&waited);
        Ok(())
    }

    /// `e`, said as the session's failure to begin when the server's Hello has not come.
    pub(super) fn early(&mut self, e: ConnError) -> ConnError {
        match (&self.server, self.early_failure.as_mut()) {
            (None, Some(f)) if matches!(e, ConnError::Closed | ConnError::Io(_)) => f(e),
            _ => e,
        }
    }

    /// Takes the server's Hello (request 0, arrived while it was outstanding): this side's
    /// stream starts once both offer it, its Compressed going with the next batch.
    pub(super) fn take_hello(&mut self, f: &Frame) -> Result<(), ConnError> {
        match Message::decode(f)? {
            Message::Hello(h) if h.version == VERSION => {
                self.outstanding.remove(&0);
                self.server = Some(h);
                if self.streams_compressed() {
                    self.writer
                        .send(Outgoing::Frame(Message::Compressed.to_frame(0)))?;
                    self.writer.send(Outgoing::StartZstd(self.zstd_level))?;
                }
                // The link is timed now, while this side waits for replies and reads the
                // Ping's as it comes (a Ping sent with the next batch came back while the
                // client cut its old files, and the lab's LAN looked far).
                if !self.unflushed {
                    self.probe_link()?;
                    self.flush_inner()?;
                }
                Ok(())
            }
            Message::Hello(h) => Err(ConnError::Unexpected(format!(
                "the server ({}) speaks protocol {}, this client (ferry {}) protocol {VERSION}: \
                 install the same version of ferry on both sides",
                h.agent,
                h.version,
                env!("CARGO_PKG_VERSION")
            ))),
            Message::Reply(Reply::Error { code, message }) => {
                Err(ConnError::Remote { code, message })
            }
            other => Err(ConnError::Unexpected(format!("{other:?} instead of hello"))),
        }
    }
}
