//! Driving the protocol over byte streams: the client's connection, and (in `serve`) the
//! server loop.

mod hello;
mod ping;
mod serve;

pub use ping::Arrivals;

pub use serve::serve;

use std::collections::HashMap;
use std::io::{self, Read, Write};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferry_proto::{
    Frame, Hello, Inflow, Level, Message, Outflow, ProtoError, Reply, Request, FEATURES,
    FEATURE_RATE, FEATURE_ZSTD_STREAM, VERSION,
};
use thiserror::Error;

/// What went wrong talking to the other side. The cause is in the message, not also a
/// `source()`: a report that prints the chain would say it twice.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConnError {
    #[error("connection: {0}")]
    Io(io::Error),
    #[error("protocol violation by the peer: {0}")]
    Proto(ProtoError),
    #[error("the connection closed")]
    Closed,
    #[error("unexpected reply: {0}")]
    Unexpected(String),
    #[error("{message}")]
    Remote {
        code: ferry_proto::ErrorCode,
        message: String,
    },
}

impl From<io::Error> for ConnError {
    fn from(e: io::Error) -> Self {
        ConnError::Io(e)
    }
}

impl From<ProtoError> for ConnError {
    fn from(e: ProtoError) -> Self {
        ConnError::Proto(e)
    }
}

const READ_BUF: usize = 256 * 1024;
/// The most bytes one reply may carry in all its frames: a recipe of 7 million chunks (a file
/// of 56 GiB at the default chunk size), a listing of 5 million entries.
pub const MAX_REPLY: usize = 256 << 20;

/// Lease breaks kept until taken, of each kind; past that they are lost, and
/// [`Connection::breaks_lost`] says so.
pub const MAX_BREAKS: usize = 65_536;

/// How the session stream is compressed when nobody says otherwise: the level follows the
/// link (a thin link is the bottleneck Ferry is built for, so its idle time buys bytes; on a
/// fast one the compressor must not become the bottleneck).
pub const DEFAULT_ZSTD_LEVEL: Level = Level::Adapt;

/// Writes `bytes` out and clears them, telling `outflow` how long the transport took; returns
/// that time.
fn write_out(
    outflow: &mut Outflow,
    w: &mut impl Write,
    bytes: &mut Vec<u8>,
) -> io::Result<std::time::Duration> {
    let started = std::time::Instant::now();
    w.write_all(bytes)?;
    bytes.clear();
    let waited = started.elapsed();
    if let Some(next) = outflow.wrote(waited) {
        match next {
            0 => tracing::debug!("stream compression: off (frames raw) from the next frame"),
            _ => tracing::debug!("stream compression: level {next} from the next zstd frame"),
        }
    }
    Ok(waited)
}

/// Byte and message counts of a connection, as this side saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub requests: u64,
    /// Round trips on the critical path: waiting for a reply costs one when its request was
    /// sent after the last round trip began; requests sent together (pipelined) travel in the
    /// same one, as in LBFS's round-trip budget. Deterministic: it depends on the order of
    /// sends and waits, not on timing.
    pub round_trips: u64,
}

/// What the sending thread is asked to do.
enum Outgoing {
    Frame(Frame),
    /// Compress everything after this point as one zstd stream at this level.
    StartZstd(Level),
    /// Send what is queued now: the caller is about to wait for a reply.
    Flush,
    /// The link is known to be fast (a LAN, a local pipe): an adaptive stream may go below
    /// its start, and judges each level by what it carries.
    FastLink,
    /// The link is near: the stream starts low ([`ferry_proto::Outflow::near_link`]).
    NearLink,
}

/// Sends frames from a thread of its own, so the caller can pipeline any number of requests
/// and then read replies without either side ever blocking on a full pipe while the other
/// waits for it (requests queue in memory: callers bound what they send before reading). The
/// thread also compresses, so that work overlaps the caller's.
struct FrameWriter {
    tx: std::sync::mpsc::Sender<Outgoing>,
    thread: Option<std::thread::JoinHandle<Result<(), ConnError>>>,
    /// Bytes handed to the transport.
    sent: Arc<AtomicU64>,
    /// Writes to the transport, and how long they waited in all (nanoseconds).
    writes: Arc<(AtomicU64, AtomicU64)>,
}

impl FrameWriter {
    /// A writer to `w`; with `warm`, a compressor at that level is readied once the first
    /// batch (the Hello) is out, while its reply is on the way ([`Outflow::warm`]).
    fn new<W: Write + Send + 'static>(mut w: W, warm: Option<Level>) -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<Outgoing>();
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        let writes = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let waits = writes.clone();
        let thread = std::thread::Builder::new()
            .name("ferry-send".into())
            .spawn(move || {
                let mut out = Outflow::plain();
                let (mut warm, mut ready) = (warm, None);
                let mut bytes = Vec::with_capacity(READ_BUF);
                // Frames gather until the caller waits for a reply (or the end): a batch of
                // requests leaves as one write, in as few packets as the link's layers allow.
                loop {
                    let (flush, end) = match rx.recv() {
                        Ok(Outgoing::Frame(f)) => {
                            out.push(&f, &mut bytes)?;
                            (false, false)
                        }
                        Ok(Outgoing::StartZstd(level)) => {
                            match ready.take() {
                                Some((l, o)) if l == level => out = o,
                                _ => {
                                    out.start_zstd(level)?;
                                    out.warm()?;
                                }
                            }
                            (false, false)
                        }
                        Ok(Outgoing::Flush) => {
                            out.flush(&mut bytes)?;
                            (true, false)
                        }
                        Ok(Outgoing::FastLink) => {
                            out.fast_link();
                            (false, false)
                        }
                        Ok(Outgoing::NearLink) => {
                            tracing::debug!("the link is near: the stream starts low");
                            out.near_link();
                            (false, false)
                        }
                        // The connection is gone: what is queued still goes out.
                        Err(_) => {
                            out.flush(&mut bytes)?;
                            (true, true)
                        }
                    };
                    if flush || bytes.len() >= READ_BUF {
                        let n = bytes.len() as u64;
                        let waited = write_out(&mut out, &mut w, &mut bytes)?;
                        counter.fetch_add(n, Ordering::Relaxed);
                        waits
                            .1
                            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
                        waits.0.fetch_add(1, Ordering::Release);
                    }
                    if flush {
                        w.flush()?;
                        if let Some(level) = warm.take() {
                            let mut o = Outflow::plain();
                            o.start_zstd(level)?;
                            o.warm()?;
                            ready = Some((level, o));
                        }
                    }
                    if end {
                        return Ok(());
                    }
                }
            })?;
        Ok(FrameWriter {
            tx,
            thread: Some(thread),
            sent,
            writes,
        })
    }

    fn send(&mut self, o: Outgoing) -> Result<(), ConnError> {
        if self.tx.send(o).is_ok() {
            return Ok(());
        }
        // The thread stopped: it failed to write.
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => Err(e),
            _ => Err(io::Error::from(io::ErrorKind::BrokenPipe).into()),
        }
    }
}

/// The client end of a session.
pub struct Connection<R, W> {
    reader: R,
    writer: FrameWriter,
    _writes_to: std::marker::PhantomData<fn(W)>,
    inflow: Inflow,
    buf: Vec<u8>,
    next_id: u32,
    /// Frames that arrived for requests other than the one being waited for.
    early: HashMap<u32, Vec<Frame>>,
    /// Requests whose replies are not wanted: dropped as they arrive (the bytes of each so
    /// far, bounded as a reply waited for is: a hostile server's endless reply to a Ping is
    /// refused, not dropped for ever).
    forgotten: HashMap<u32, usize>,
    /// Requests whose last reply frame has not arrived, with the round trip each was sent in; a
    /// frame for any other id is a violation (it would otherwise let a hostile server fill
    /// `early` without bound).
    outstanding: HashMap<u32, u64>,
    traffic: Traffic,
    /// Frames queued since the last flush.
    unflushed: bool,
    /// The newest request queued; the first request the next flush sends.
    newest: u32,
    flush_from: u32,
    /// The request whose reply times a round trip, and when it went (see `flush`).
    timed: Option<(u32, std::time::Instant)>,
    /// When the first frame of the batch not yet flushed was queued: the batch's round trip
    /// runs from then (its first requests may go out, and be answered, before its flush).
    batch_began: Option<std::time::Instant>,
    /// How fast replies arrive, for the server's choice of levels.
    rate: crate::rate::RateMeter,
    /// The Pings that time the link ([`probe_link`](Self::probe_link)): how many were sent,
    /// and those whose replies have not come, with when each went.
    probes: u8,
    pings: Vec<(u32, std::time::Instant)>,
    /// When the reader's bytes arrived, if it knows (a [`crate::LinkReader`]): a Ping's reply
    /// is timed to then, not to when this side got round to taking it.
    arrivals: Option<Arrivals>,
    /// The reader's timeout, if it has one (a [`crate::LinkReader`]): a wait for a Ping's
    /// reply is bounded by it ([`settle_probe`](Self::settle_probe)).
    read_timeout: Option<crate::session::ReadTimeout>,
    /// Whether the sending thread was told the link is fast ([`Outgoing::FastLink`]).
    told_fast: bool,
    /// Whether the sending thread was told the link is near ([`Outgoing::NearLink`]).
    told_near: bool,
    pub server: Option<Hello>,
    /// Paths whose leases the server broke (Invalidate), in arrival order, until taken.
    pub invalidated: Vec<ferry_proto::WirePath>,
    /// Names changed in leased listings (Changed, with `FEATURE_ENTRY_CHANGES`): what each is
    /// now (`None`: gone), in arrival order, until taken.
    pub changed: Vec<(ferry_proto::WirePath, Option<ferry_proto::Attr>)>,
    /// Set when a break arrived with its list above full: breaks were lost, so every lease
    /// granted on this session is void (and what the lists hold may be older than what was
    /// lost). Cleared by whoever takes the lists.
    pub breaks_lost: bool,
    /// Called when the last reply frame of their request arrives (see
    /// [`on_answered`](Self::on_answered)).
    hooks: Vec<(u32, Box<dyn FnOnce() + Send>)>,
    /// The feature bits this side's Hello offered, and the level its stream starts at once the
    /// server's Hello offers one too.
    offered: u64,
    zstd_level: Level,
    /// What a failure of the link before the server's Hello arrived becomes (see
    /// [`before_hello`](Self::before_hello)).
    early_failure: Option<EarlyFailure>,
}

/// Says why the link failed before the session began (a remote shell that exited, say).
pub type EarlyFailure = Box<dyn FnMut(ConnError) -> ConnError + Send>;

impl<R: Read, W: Write + Send + 'static> Connection<R, W> {
    /// Opens a session: sends Hello and waits for the server's.
    pub fn open(reader: R, writer: W) -> Result<Self, ConnError> {
        Self::open_with(reader, writer, DEFAULT_ZSTD_LEVEL)
    }

    /// Like [`open`](Self::open), compressing what this side sends at `zstd_level` (when the
    /// server speaks the zstd stream; 0 asks for no stream compression at all).
    pub fn open_with(reader: R, writer: W, zstd_level: Level) -> Result<Self, ConnError> {
        Self::open_asking(reader, writer, zstd_level, 0)
    }

    /// Like [`open_with`](Self::open_with), asking also for the features in `ask` that a
    /// client has only when it asks ([`ferry_proto::FEATURE_NO_TREE_DIGESTS`]).
    pub fn open_asking(
        reader: R,
        writer: W,
        zstd_level: Level,
        ask: u64,
    ) -> Result<Self, ConnError> {
        let mut c = Self::open_pipelined(reader, writer, zstd_level, ask)?;
        c.settle_hello()?;
        Ok(c)
    }

    /// Like [`open_asking`](Self::open_asking), without waiting for the server's Hello: the
    /// first requests go with this side's, in its round trip. Until the server's has come,
    /// [`offers`](Self::offers) knows nothing ([`may_offer`](Self::may_offer) guesses), and a
    /// failure of the link goes through [`before_hello`](Self::before_hello).
    pub fn open_pipelined(
        reader: R,
        writer: W,
        zstd_level: Level,
        ask: u64,
    ) -> Result<Self, ConnError> {
        let mut c = Connection {
            reader,
            writer: FrameWriter::new(
                writer,
                (zstd_level != Level::Fixed(0)).then_some(zstd_level),
            )?,
            _writes_to: std::marker::PhantomData,
            inflow: Inflow::new(),
            buf: vec![0u8; READ_BUF],
            next_id: 1,
            early: HashMap::new(),
            forgotten: Default::default(),
            outstanding: HashMap::from([(0, 0)]),
            traffic: Traffic::default(),
            told_fast: false,
            told_near: false,
            unflushed: false,
            newest: 0,
            flush_from: 0,
            timed: None,
            batch_began: None,
            rate: Default::default(),
            probes: 0,
            pings: vec![],
            arrivals: None,
            read_timeout: None,
            server: None,
            invalidated: vec![],
            changed: vec![],
            breaks_lost: false,
            hooks: vec![],
            offered: 0,
            zstd_level,
            early_failure: None,
        };
        let agent = format!("ferry {}", env!("CARGO_PKG_VERSION"));
        c.offered = if zstd_level == Level::Fixed(0) {
            FEATURES & !FEATURE_ZSTD_STREAM
        } else {
            FEATURES
        } & !ferry_proto::ASKED_FEATURES
            | (ask & FEATURES);
        let hello = Message::Hello(Hello {
            version: VERSION,
            features: c.offered,
            agent,
        });
        c.write(hello.to_frame(0))?;
        Ok(c)
    }
}

impl<R: Read, W> Connection<R, W> {
    fn write(&mut self, f: Frame) -> Result<(), ConnError> {
        // Refused here, not by the writer thread, whose failure would leave the caller
        // waiting for a reply to a request never sent.
        if f.body.len() > ferry_proto::MAX_BODY {
            return Err(ConnError::Unexpected(format!(
                "a request of {} bytes, more than one frame carries ({})",
                f.body.len(),
                ferry_proto::MAX_BODY
            )));
        }
        if !std::mem::replace(&mut self.unflushed, true) {
            // The batch's first frame: none of it can leave before now (the sending thread
            // writes a large batch out before its flush).
            self.batch_began = Some(std::time::Instant::now());
        }
        self.writer.send(Outgoing::Frame(f))
    }

    /// Sends what is queued and ends the sending side, waiting for it to finish: for a
    /// transport that cannot stall (memory, a pipe to a child that reads to its end). Dropping
    /// the connection instead leaves its sending thread to finish in the background.
    pub fn close(self) -> Result<(), ConnError> {
        let FrameWriter { tx, thread, .. } = self.writer;
        drop(tx);
        match thread.map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(io::Error::other("the sending thread panicked").into()),
            None => Ok(()),
        }
    }

    /// Bytes, requests and round trips so far.
    pub fn traffic(&self) -> Traffic {
        Traffic {
            bytes_sent: self.writer.sent.load(Ordering::Relaxed),
            ..self.traffic.clone()
        }
    }

    /// One read from the link into the frames to decode.
    fn read_more(&mut self, waited: &mut crate::rate::Wait) -> Result<(), ConnError> {
        let began = std::time::Instant::now();
        let n = self.reader.read(&mut self.buf)?;
        if n == 0 {
            return Err(ConnError::Closed);
        }
        waited.read(began, n, self.buf.len());
        self.traffic.bytes_received += n as u64;
        self.inflow.feed(&self.buf[..n]);
        Ok(())
    }

    /// The writes to the transport so far, and how long they waited in all: how the link takes
    /// what this side sends (a sender picks its frames' levels by it).
    pub fn write_waits(&self) -> (u64, std::time::Duration) {
        let (n, ns) = &*self.writer.writes;
        let n = n.load(Ordering::Acquire);
        (
            n,
            std::time::Duration::from_nanos(ns.load(Ordering::Relaxed)),
        )
    }

    /// The id of a request about to go: the next one, never 0 (the Hellos' and the server's
    /// own frames).
    fn new_request_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    /// Sends a request without waiting (it is queued for the sending thread); returns its id.
    pub fn send(&mut self, r: Request) -> Result<u32, ConnError> {
        self.probe_link()?;
        let id = self.new_request_id();
        // The measure matters where the server sends bulk: its frames against old data, and its
        // stream's level (which goes below its start only on a link measured fast). A near
        // link is told at once, whatever the request: a mount that only writes back never asks
        // for bulk, and the server's stream compressed each small reply at level 9.
        let bulk = matches!(
            r,
            Request::GetChunks(_) | Request::ReadFiles { .. } | Request::ReadRange { .. }
        );
        let newly_near = !self.told_near && crate::delta::near_link(self.rate.round_trip());
        if (bulk || newly_near) && self.server_offers(FEATURE_RATE) {
            if let Some(m) = self.rate.news() {
                tracing::debug!(
                    "the link brings at least {} bytes/s ({} bytes at once), replies after {:?}",
                    m.rate,
                    m.sample,
                    m.round_trip
                );
                let round_trip = m.round_trip.map_or(0, |r| (r.as_micros() as u64).max(1));
                self.write(
                    Message::Rate {
                        rate: m.rate,
                        sample: m.sample,
                        round_trip,
                    }
                    .to_frame(0),
                )?;
            }
        }
        // This end's stream follows the link as the server's does: below its start only on a
        // link measured fast (an upload over a local pipe otherwise climbed to level 19 on
        // writes that waited for a server busy with its own share of the cores).
        if !self.told_fast
            && crate::delta::fast_link(self.rate.best().unwrap_or(0), self.rate.round_trip())
        {
            self.told_fast = true;
            self.writer.send(Outgoing::FastLink)?;
        }
        if newly_near {
            self.told_near = true;
            self.writer.send(Outgoing::NearLink)?;
        }
        let f = Message::Request(r).to_frame(id);
        tracing::trace!(
            target: "ferry::sizes",
            "request {:#04x} {} id {id}",
            f.msg_type,
            f.body.len()
        );
        self.write(f)?;
        self.newest = id;
        self.traffic.requests += 1;
        self.outstanding.insert(id, self.traffic.round_trips);
        Ok(id)
    }

    /// Sends a request that keeps a stream going (the next window of chunks while earlier ones
    /// are still in flight): waiting for its reply paces the stream and is not counted as a
    /// round trip, since with a window larger than the link's bandwidth-delay product the
    /// link never idles.
    pub fn send_paced(&mut self, r: Request) -> Result<u32, ConnError> {
        let id = self.send(r)?;
        self.outstanding.insert(id, u64::MAX);
        Ok(id)
    }

    /// Sends the requests queued so far; waiting for a reply does it too.
    pub fn flush(&mut self) -> Result<(), ConnError> {
        self.flush_inner().map_err(|e| self.early(e))
    }

    fn flush_inner(&mut self) -> Result<(), ConnError> {
        if std::mem::take(&mut self.unflushed) {
            self.writer.send(Outgoing::Flush)?;
            let from = std::mem::replace(&mut self.flush_from, self.newest.wrapping_add(1));
            let began = self.batch_began.take();
            let began = began.unwrap_or_else(std::time::Instant::now);
            // The first request of this flush, with nothing sent before it outstanding, times a
            // round trip from when it went: its reply's first bytes are the first to come back,
            // and a server writes out the first reply to what it reads at once. (Not only a
            // request alone: a mount sends everything in batches, and never measured its
            // link.)
            // (More outstanding than this flush sent: an older one is; no need to look.)
            let sent = self.newest.wrapping_sub(from) as usize + 1;
            self.timed = (self.outstanding.len() <= sent
                && first_of_flush(from..=self.newest, self.outstanding.keys(), from))
            .then_some((from, began));
        }
        Ok(())
    }

    /// The next frame for request `id`.
    fn wait(&mut self, id: u32) -> Result<Frame, ConnError> {
        self.wait_inner(id).map_err(|e| self.early(e))
    }

    fn wait_inner(&mut self, id: u32) -> Result<Frame, ConnError> {
        self.flush_inner()?;
        if self.outstanding.get(&id) == Some(&self.traffic.round_trips) {
            self.traffic.round_trips += 1;
            tracing::trace!(target: "ferry::sizes", "round trip waiting on {id}");
        }
        if let Some(q) = self.early.get_mut(&id) {
            if !q.is_empty() {
                return Ok(q.remove(0));
            }
        }
        // With no reply to a forgotten request still to come ahead of it.
        let went = match self.timed {
            Some((t, at)) if t == id && self.forgotten.is_empty() => {
                self.timed = None;
                Some(at)
            }
            _ => None,
        };
        let mut waited = crate::rate::Wait::start(went);
        loop {
            while let Some(f) = self.inflow.next_frame()? {
                if let Some(f) = self.route(f, id)? {
                    let timed = waited.round_trip();
                    tracing::trace!(target: "ferry::sizes", "reply to {id} timed: {timed:?}");
                    self.rate.ended(&waited);
                    return Ok(f);
                }
            }
            self.read_more(&mut waited)?;
        }
    }

    /// Reads until the whole reply to request `id` has arrived, keeping it for
    /// [`replies`](Self::replies): a request sent with others is no longer outstanding, so a
    /// batch flushed next can time a round trip.
    /// At most [`MAX_REPLY`] bytes of bodies, as `replies`.
    pub fn arrive(&mut self, id: u32) -> Result<(), ConnError> {
        let mut got = self.early.remove(&id).unwrap_or_default();
        let mut total: usize = got.iter().map(|f| f.body.len()).sum();
        while self.outstanding.contains_key(&id) {
            let f = self.wait(id)?;
            within_reply(&mut total, &f, id)?;
            got.push(f);
        }
        self.early.insert(id, got);
        Ok(())
    }

    /// Takes what the server sent unasked (lease invalidations, into
    /// [`invalidated`](Self::invalidated)) without waiting: the reader must fail with
    /// `WouldBlock` or `TimedOut` when nothing more has arrived (a [`crate::LinkReader`] with a
    /// zero timeout). Replies that arrive meanwhile are kept for their requests.
    pub fn poll(&mut self) -> Result<(), ConnError> {
        self.poll_inner().map_err(|e| self.early(e))
    }

    fn poll_inner(&mut self) -> Result<(), ConnError> {
        loop {
            while let Some(f) = self.inflow.next_frame()? {
                // Nothing is returned for request 0 (the Hello's: taken as it comes).
                self.route(f, 0)?;
            }
            let n = match self.reader.read(&mut self.buf) {
                Ok(0) => return Err(ConnError::Closed),
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(())
                }
                Err(e) => return Err(e.into()),
            };
            self.traffic.bytes_received += n as u64;
            self.inflow.feed(&self.buf[..n]);
        }
    }

    /// All reply frames of request `id` (a streamed reply has several), decoded: at most
    /// [`MAX_REPLY`] bytes of bodies in all (a server streaming `MORE` frames without end is
    /// refused, not followed). A remote error becomes [`ConnError::Remote`].
    pub fn replies(&mut self, id: u32) -> Result<Vec<Reply>, ConnError> {
        let mut out = vec![];
        let mut total = 0usize;
        loop {
            let f = self.wait(id)?;
            within_reply(&mut total, &f, id)?;
            tracing::trace!(target: "ferry::sizes", "reply {:#04x} {}", f.msg_type, f.body.len());
            let more = f.more();
            match Message::decode(&f)? {
                Message::Reply(Reply::Error { code, message }) => {
                    return Err(ConnError::Remote { code, message })
                }
                Message::Reply(r) => out.push(r),
                other => return Err(ConnError::Unexpected(format!("{other:?}"))),
            }
            if !more {
                return Ok(out);
            }
        }
    }

    /// At least how many bytes a second the link has brought replies so far, if measured.
    pub fn link_rate(&self) -> Option<u64> {
        self.rate.best()
    }

    /// The quickest reply to a request that went alone or first of its batch, from when it
    /// went to its first bytes (a round trip and the server's work), if timed.
    pub fn round_trip(&self) -> Option<std::time::Duration> {
        self.rate.round_trip()
    }

    /// Takes a frame that arrived: an invalidation is noted, a reply to another request kept
    /// for later; a reply to `id` is returned.
    fn route(&mut self, f: Frame, id: u32) -> Result<Option<Frame>, ConnError> {
        if f.request_id == 0 && self.server.is_none() {
            self.take_hello(&f)?;
            return Ok(None);
        }
        if f.request_id == 0 && f.msg_type == ferry_proto::COMPRESSED {
            // The server's stream starts with the next byte.
            if !self.streams_compressed() || self.inflow.is_compressed() {
                return Err(ConnError::Unexpected(
                    "a Compressed the session did not agree to".into(),
                ));
            }
            self.inflow.start_zstd()?;
            return Ok(None);
        }
        self.time_ping(f.request_id);
        if let Some(total) = self.forgotten.get_mut(&f.request_id) {
            within_reply(total, &f, f.request_id)?;
            if !f.more() {
                self.forgotten.remove(&f.request_id);
            }
            return Ok(None);
        }
        if !self.outstanding.contains_key(&f.request_id) {
            if f.request_id == 0 {
                // Bounded: a flood from the server cannot grow them without limit.
                match Message::decode(&f)? {
                    Message::Changed { path, attr } if self.changed.len() < MAX_BREAKS => {
                        self.changed.push((path, attr));
                    }
                    Message::Invalidate(path) if self.invalidated.len() < MAX_BREAKS => {
                        self.invalidated.push(path);
                    }
                    // Too many to keep (a name changed past the bound cannot become a lease
                    // break instead: breaks are taken before names, so an older name's state
                    // would be taken last).
                    Message::Invalidate(_) | Message::Changed { .. } => self.breaks_lost = true,
                    _ => {}
                }
                return Ok(None);
            }
            return Err(ConnError::Unexpected(format!(
                "a reply to request {} that was never sent",
                f.request_id
            )));
        }
        if !f.more() {
            self.outstanding.remove(&f.request_id);
            if let Some(i) = self.hooks.iter().position(|(h, _)| *h == f.request_id) {
                (self.hooks.swap_remove(i).1)();
            }
        }
        if f.request_id == id {
            return Ok(Some(f));
        }
        self.early.entry(f.request_id).or_default().push(f);
        Ok(None)
    }

    /// The reply to request `id` is not wanted: what came of it already is dropped, and the
    /// rest as it arrives (the link still carries it).
    pub fn forget(&mut self, id: u32) {
        self.early.remove(&id);
        if self.outstanding.remove(&id).is_some() {
            self.forgotten.insert(id, 0);
        }
    }

    /// Calls `f` as soon as the whole reply to request `id` has arrived, whoever is reading
    /// (at once if it has): a sender learns that the server has made a change while it waits
    /// for later replies. Not called if the connection fails first.
    pub fn on_answered(&mut self, id: u32, f: Box<dyn FnOnce() + Send>) {
        if self.outstanding.contains_key(&id) {
            self.hooks.push((id, f));
        } else {
            f();
        }
    }

    /// Sends `r` and waits for its whole reply.
    pub fn call(&mut self, r: Request) -> Result<Vec<Reply>, ConnError> {
        let id = self.send(r)?;
        self.flush()?;
        self.replies(id)
    }
}

/// Adds frame `f` of the reply to request `id` to the `total` of its bodies, refused past
/// [`MAX_REPLY`] bytes (a server streaming `MORE` frames without end is not followed).
fn within_reply(total: &mut usize, f: &Frame, id: u32) -> Result<(), ConnError> {
    *total += f.body.len();
    if *total > MAX_REPLY {
        return Err(ConnError::Unexpected(format!(
            "a reply of over {MAX_REPLY} bytes to request {id}"
        )));
    }
    Ok(())
}

/// Whether the reply to `id` is the first to come back of the flush that sent `flush`: `id` was
/// sent in it, and every request `outstanding` was too, none before `id`. Its first bytes then
/// end a round trip from the flush (and the server's work on it): a batch's first reply times
/// one as well as a request sent alone.
fn first_of_flush<'a>(
    flush: std::ops::RangeInclusive<u32>,
    mut outstanding: impl Iterator<Item = &'a u32>,
    id: u32,
) -> bool {
    flush.contains(&id) && outstanding.all(|k| flush.contains(k) && *k >= id)
}

#[cfg(test)]
mod tests {
    use super::first_of_flush;

    /// A session that only sends batches (a mount's) times round trips by their first replies;
    /// it once timed only requests sent alone, and a mount never learnt its link was near.
    #[test]
    fn a_batchs_first_reply_times_a_round_trip_and_no_other() {
        // A batch of three (ids 5 to 7), nothing else outstanding: the first times one.
        assert!(first_of_flush(5..=7, [5, 6, 7].iter(), 5));
        // The later ones of the batch come after it.
        assert!(!first_of_flush(5..=7, [6, 7].iter(), 7));
        // A reply of an earlier flush still outstanding may come first.
        assert!(!first_of_flush(5..=7, [3, 5, 6, 7].iter(), 5));
        // A request of an earlier flush times nothing.
        assert!(!first_of_flush(5..=7, [4].iter(), 4));
        // Alone, as before.
        assert!(first_of_flush(9..=9, [9].iter(), 9));
    }
}
