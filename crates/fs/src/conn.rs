//! Driving the protocol over byte streams: the server loop, and the client's connection.

use std::collections::HashMap;
use std::io::{self, Read, Write};

use ferry_proto::{
    Frame, FrameDecoder, Hello, Message, ProtoError, Reply, Request, FEATURES, VERSION,
};
use thiserror::Error;

use crate::server::Server;

/// What went wrong talking to the other side.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConnError {
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation by the peer: {0}")]
    Proto(#[from] ProtoError),
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

const READ_BUF: usize = 256 * 1024;

/// Serves one session: reads frames from `input`, writes replies to `output`, until the client
/// hangs up. Framing errors end the session (the stream cannot be resynchronised); errors in a
/// request are replied to and the session goes on.
pub fn serve(
    server: &mut Server,
    mut input: impl Read + std::os::fd::AsFd,
    mut output: impl Write,
) -> Result<(), ConnError> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut dec = FrameDecoder::new();
    let mut buf = vec![0u8; READ_BUF];
    loop {
        while let Some(f) = dec.next_frame()? {
            for reply in server.handle(&f) {
                output.write_all(&reply.encode(true)?)?;
            }
        }
        output.flush()?;
        // Wait for the client or for a change that breaks a lease, whichever comes first.
        loop {
            let (input_ready, changed) = {
                let watch = server.watch_fd();
                let mut fds = vec![PollFd::new(&input, PollFlags::IN)];
                if let Some(w) = &watch {
                    fds.push(PollFd::new(w, PollFlags::IN));
                }
                match poll(&mut fds, None) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(io::Error::from(e).into()),
                }
                (
                    !fds[0].revents().is_empty(),
                    fds.get(1).is_some_and(|f| !f.revents().is_empty()),
                )
            };
            if changed {
                for f in server.invalidations() {
                    output.write_all(&f.encode(false)?)?;
                }
                output.flush()?;
            }
            if input_ready {
                break;
            }
        }
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        dec.feed(&buf[..n]);
    }
}

/// Turns a client away: waits for its Hello (bounded, like any frame) and answers with `code`
/// and `message`, so the client can say why instead of seeing the link drop.
pub fn refuse(
    mut input: impl Read,
    mut output: impl Write,
    code: ferry_proto::ErrorCode,
    message: &str,
) -> Result<(), ConnError> {
    let mut dec = FrameDecoder::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(f) = dec.next_frame()? {
            let reply = Message::Reply(Reply::Error {
                code,
                message: message.to_string(),
            });
            output.write_all(&reply.to_frame(f.request_id).encode(false)?)?;
            output.flush()?;
            return Ok(());
        }
        match input.read(&mut buf)? {
            0 => return Err(ConnError::Closed),
            n => dec.feed(&buf[..n]),
        }
    }
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

/// Sends frames from a thread of its own, so the caller can pipeline any number of requests
/// and then read replies without either side ever blocking on a full pipe while the other
/// waits for it (requests queue in memory: callers bound what they send before reading).
struct FrameWriter {
    tx: std::sync::mpsc::Sender<Vec<u8>>,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
}

impl FrameWriter {
    fn new<W: Write + Send + 'static>(w: W) -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let thread = std::thread::Builder::new()
            .name("ferry-send".into())
            .spawn(move || {
                let mut w = io::BufWriter::with_capacity(READ_BUF, w);
                while let Ok(bytes) = rx.recv() {
                    w.write_all(&bytes)?;
                    // Everything queued goes out before a flush.
                    while let Ok(more) = rx.try_recv() {
                        w.write_all(&more)?;
                    }
                    w.flush()?;
                }
                Ok(())
            })?;
        Ok(FrameWriter {
            tx,
            thread: Some(thread),
        })
    }

    fn send(&mut self, bytes: Vec<u8>) -> Result<(), ConnError> {
        if self.tx.send(bytes).is_ok() {
            return Ok(());
        }
        // The thread stopped: it failed to write.
        let e = match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => e,
            _ => io::Error::from(io::ErrorKind::BrokenPipe),
        };
        Err(e.into())
    }
}

/// The client end of a session.
pub struct Connection<R, W> {
    reader: R,
    writer: FrameWriter,
    _writes_to: std::marker::PhantomData<fn(W)>,
    dec: FrameDecoder,
    buf: Vec<u8>,
    next_id: u32,
    /// Frames that arrived for requests other than the one being waited for.
    early: HashMap<u32, Vec<Frame>>,
    /// Requests whose last reply frame has not arrived, with the round trip each was sent in; a
    /// frame for any other id is a violation (it would otherwise let a hostile server fill
    /// `early` without bound).
    outstanding: HashMap<u32, u64>,
    pub traffic: Traffic,
    pub server: Option<Hello>,
    /// Paths whose leases the server broke (Invalidate), in arrival order, until taken.
    pub invalidated: Vec<ferry_proto::WirePath>,
}

impl<R: Read, W: Write + Send + 'static> Connection<R, W> {
    /// Opens a session: sends Hello and waits for the server's.
    pub fn open(reader: R, writer: W) -> Result<Self, ConnError> {
        let mut c = Connection {
            reader,
            writer: FrameWriter::new(writer)?,
            _writes_to: std::marker::PhantomData,
            dec: FrameDecoder::new(),
            buf: vec![0u8; READ_BUF],
            next_id: 1,
            early: HashMap::new(),
            outstanding: HashMap::from([(0, 0)]),
            traffic: Traffic::default(),
            server: None,
            invalidated: vec![],
        };
        let agent = format!("ferry {}", env!("CARGO_PKG_VERSION"));
        let hello = Message::Hello(Hello {
            version: VERSION,
            features: FEATURES,
            agent,
        });
        c.write(&hello.to_frame(0))?;
        let f = c.wait(0)?;
        match Message::decode(&f)? {
            Message::Hello(h) if h.version == VERSION => c.server = Some(h),
            Message::Hello(h) => {
                return Err(ConnError::Unexpected(format!(
                    "server speaks protocol {}, this client {VERSION}",
                    h.version
                )))
            }
            Message::Reply(Reply::Error { code, message }) => {
                return Err(ConnError::Remote { code, message })
            }
            other => return Err(ConnError::Unexpected(format!("{other:?} instead of hello"))),
        }
        Ok(c)
    }
}

impl<R: Read, W> Connection<R, W> {
    fn write(&mut self, f: &Frame) -> Result<(), ConnError> {
        let bytes = f.encode(true)?;
        self.traffic.bytes_sent += bytes.len() as u64;
        self.writer.send(bytes)
    }

    /// Sends a request without waiting (it is queued for the sending thread); returns its id.
    pub fn send(&mut self, r: Request) -> Result<u32, ConnError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.write(&Message::Request(r).to_frame(id))?;
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

    /// Requests go out as soon as they are sent; kept so callers can mark where a batch ends.
    pub fn flush(&mut self) -> Result<(), ConnError> {
        Ok(())
    }

    /// The next frame for request `id`.
    fn wait(&mut self, id: u32) -> Result<Frame, ConnError> {
        if self.outstanding.get(&id) == Some(&self.traffic.round_trips) {
            self.traffic.round_trips += 1;
        }
        if let Some(q) = self.early.get_mut(&id) {
            if !q.is_empty() {
                return Ok(q.remove(0));
            }
        }
        loop {
            if let Some(f) = self.dec.next_frame()? {
                if !self.outstanding.contains_key(&f.request_id) {
                    if f.request_id == 0 {
                        if let Message::Invalidate(p) = Message::decode(&f)? {
                            // Bounded: a flood from the server cannot grow it without limit.
                            if self.invalidated.len() < 65_536 {
                                self.invalidated.push(p);
                            }
                        }
                        continue;
                    }
                    return Err(ConnError::Unexpected(format!(
                        "a reply to request {} that was never sent",
                        f.request_id
                    )));
                }
                if !f.more() {
                    self.outstanding.remove(&f.request_id);
                }
                if f.request_id == id {
                    return Ok(f);
                }
                self.early.entry(f.request_id).or_default().push(f);
                continue;
            }
            let n = self.reader.read(&mut self.buf)?;
            if n == 0 {
                return Err(ConnError::Closed);
            }
            self.traffic.bytes_received += n as u64;
            self.dec.feed(&self.buf[..n]);
        }
    }

    /// All reply frames of request `id` (a streamed reply has several), decoded. A remote error
    /// becomes [`ConnError::Remote`].
    pub fn replies(&mut self, id: u32) -> Result<Vec<Reply>, ConnError> {
        let mut out = vec![];
        loop {
            let f = self.wait(id)?;
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

    /// Sends `r` and waits for its whole reply.
    pub fn call(&mut self, r: Request) -> Result<Vec<Reply>, ConnError> {
        let id = self.send(r)?;
        self.flush()?;
        self.replies(id)
    }
}
