//! Session compression: with [`FEATURE_ZSTD_STREAM`] offered in the Hellos, everything a side
//! sends after its `Compressed` frame ([`COMPRESSED`]) is one zstd stream of frames.
//!
//! One stream per direction compresses every message with the context of all earlier ones, so
//! a listing's names, a recipe's lengths and the chunks of one file are compressed together
//! instead of frame by frame. The sender flushes the stream at the end of every batch, so the
//! peer can always decode all it has been sent.
//!
//! A frame of at least [`RAW_MIN`] bytes that hardly compresses (zstd level 1 saves under 3 %
//! of a sample of it: random data, media, archives) travels raw: the sender ends the zstd
//! frame in progress and writes a skippable frame (RFC 8878 §3.1.2, magic [`RAW_MAGIC`]) whose
//! content is the frame as is; the receiver takes it at a zstd frame boundary. No time goes into
//! searching bytes for matches they do not have (level 19 on random data: ~5 MB/s).
//!
//! Memory stays bounded on hostile input: the decoder's window is capped at
//! [`MAX_WINDOW_LOG`], and compressed input is only decompressed, [`INFLATE_STEP`] bytes at a
//! time, when no whole frame is waiting; so the plain bytes held never exceed one frame plus
//! one step, whatever the compression ratio. A raw segment holds one frame at most.

use zstd::stream::raw::{CParameter, DParameter, Decoder, Encoder, InBuffer, Operation, OutBuffer};

use crate::{Frame, FrameDecoder, ProtoError, MAX_BODY};

/// Hello feature bit: the rest of the session travels as a zstd stream in each direction.
pub const FEATURE_ZSTD_STREAM: u64 = 1;
/// The message type of `Compressed` ([`crate::Message::Compressed`]): after this frame, the
/// sender's bytes are its zstd stream. A receiver switches ([`Inflow::start_zstd`]) right after
/// decoding it, before the next frame.
pub const COMPRESSED: u8 = 0x02;
/// Largest window a sender may use, and a receiver accepts (16 MiB).
pub const MAX_WINDOW_LOG: u32 = 24;
/// Plain bytes produced per decompression step.
const INFLATE_STEP: usize = 256 << 10;
/// Scratch space for compressed output.
const DEFLATE_STEP: usize = 128 << 10;
/// The magic of a skippable zstd frame that carries one of the session's frames raw.
pub const RAW_MAGIC: u32 = 0x184D_2A5E;
/// Frames smaller than this are always compressed (they cost little whatever they hold).
pub const RAW_MIN: usize = 64 << 10;
/// Bytes of a frame tried at level 1 to tell whether it compresses.
const RAW_PROBE: usize = 32 << 10;

/// How a sender picks the level of its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// This level throughout (0: no stream compression at all).
    Fixed(i32),
    /// Follow the link: start at level 9, and while bulk data flows, step up when writes wait
    /// on the transport longer than compressing took (the link is the bottleneck: its idle
    /// time buys a smaller stream), and down when compressing takes most of the time and
    /// writes hardly wait (the compressor is the bottleneck: a LAN). From level 3 up to 19,
    /// like `zstd --adapt`.
    Adapt,
}

impl Level {
    /// The level a stream starts at (and the only one, when fixed).
    pub fn start(self) -> i32 {
        match self {
            Level::Fixed(l) => l,
            Level::Adapt => ADAPT_LEVELS[ADAPT_START],
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Level::Fixed(l) => write!(f, "{l}"),
            Level::Adapt => f.write_str("adapt"),
        }
    }
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "adapt" {
            return Ok(Level::Adapt);
        }
        match s.parse::<i32>() {
            Ok(l) if (1..=22).contains(&l) => Ok(Level::Fixed(l)),
            _ => Err(format!("{s:?}: a zstd level from 1 to 22, or 'adapt'")),
        }
    }
}

mod governor;

use governor::{Governor, ADAPT_LEVELS, ADAPT_START};

/// The sending half: frames in, bytes for the transport out.
pub struct Outflow {
    z: Option<Encoder<'static>>,
    /// Compressed output before it is appended (kept: frames are many and often small).
    scratch: Vec<u8>,
    governor: Option<Governor>,
    /// Plain bytes compressed, and the time it took, since the last [`wrote`](Self::wrote).
    plain: u64,
    busy: std::time::Duration,
    /// A level waiting for the current zstd frame to end (before the next bytes pushed, or at
    /// the next flush).
    next_level: Option<i32>,
    level: i32,
    /// Whether a zstd frame is in progress (bytes pushed since the last end).
    in_frame: bool,
    /// Tells frames that do not compress (made on the first large frame).
    probe: Option<zstd::bulk::Compressor<'static>>,
    /// When [`wrote`](Self::wrote) was last called.
    since: std::time::Instant,
}

impl Outflow {
    /// Frames travel as they are (before the Hellos, or when the peer lacks the feature).
    pub fn plain() -> Self {
        Outflow {
            z: None,
            scratch: vec![],
            governor: None,
            plain: 0,
            busy: Default::default(),
            next_level: None,
            level: 0,
            in_frame: false,
            probe: None,
            since: std::time::Instant::now(),
        }
    }

    /// From now on, frames travel in one zstd stream compressed at `level`.
    pub fn start_zstd(&mut self, level: Level) -> Result<(), ProtoError> {
        let mut e = Encoder::new(level.start()).map_err(compress_failed)?;
        // Never more window than any receiver accepts, whatever the level would pick.
        e.set_parameter(CParameter::WindowLog(window_log(level.start())))
            .map_err(compress_failed)?;
        self.z = Some(e);
        self.scratch = vec![0u8; DEFLATE_STEP];
        self.governor = (level == Level::Adapt).then(Governor::new);
        self.level = level.start();
        Ok(())
    }

    pub fn is_compressed(&self) -> bool {
        self.z.is_some()
    }

    /// Readies the compressor: zstd allocates and clears its tables at its first call (about
    /// 4 ms and 20 MB at level 9 on this machine), which would otherwise delay the first batch
    /// sent, and so the first round trip a peer times (and by which it judges whether the link
    /// is near). Sends nothing.
    pub fn warm(&mut self) -> Result<(), ProtoError> {
        let Some(z) = self.z.as_mut() else {
            return Ok(());
        };
        let mut input = InBuffer::around(&[][..]);
        let mut o = OutBuffer::around(&mut self.scratch[..]);
        z.run(&mut input, &mut o).map_err(compress_failed)?;
        // Nothing comes of no input (were anything to, it would be lost: refused, not sent
        // short); the stream starts afresh, its tables kept.
        if o.pos() != 0 {
            return Err(compress_failed(std::io::Error::other(
                "output from no input",
            )));
        }
        z.reinit().map_err(compress_failed)
    }

    /// The link is known to be fast (a LAN: the peer measured it): an adaptive stream may go
    /// below its starting level, as low as 3, while the compressor holds the link up.
    pub fn fast_link(&mut self) {
        if let Some(g) = self.governor.as_mut() {
            g.floor = 0;
        }
    }

    /// The link is near (replies within a few milliseconds: a LAN, or this machine): as
    /// on a fast link, and an adaptive stream that has not moved yet goes to level 3 at once,
    /// not after megabytes at its start of 9. A mount's or a tree's many small batches never
    /// add up to the spans its governor decides on, and over a local pipe level 9 took a fifth
    /// of a mount's time in `cp -a` of small files (level 1: 0.45 s, 9: 0.52 s). The governor
    /// still moves it up where that pays.
    pub fn near_link(&mut self) {
        self.fast_link();
        if let Some(level) = self.governor.as_mut().and_then(|g| g.start_low()) {
            self.next_level = Some(level);
        }
    }

    /// The level frames are compressed at now (0 when they are not).
    pub fn level(&self) -> i32 {
        self.level
    }

    /// Tells an adaptive stream that writing what it produced since the last call took
    /// `waited`. Returns a new level when it decides on one: the zstd frame ends before the
    /// next bytes pushed (or at the next flush), and the next starts at that level.
    pub fn wrote(&mut self, waited: std::time::Duration) -> Option<i32> {
        let (plain, busy) = (
            std::mem::take(&mut self.plain),
            std::mem::take(&mut self.busy),
        );
        let now = std::time::Instant::now();
        let wall = now - std::mem::replace(&mut self.since, now);
        let decided = self
            .governor
            .as_mut()
            .and_then(|g| g.record(plain, busy, waited, wall.max(busy + waited)));
        if decided.is_some() {
            self.next_level = decided;
        }
        decided
    }

    /// Appends the transport bytes of `frame` to `out`. With compression on, they may stay in
    /// the stream's buffer until [`flush`](Self::flush).
    pub fn push(&mut self, frame: &Frame, out: &mut Vec<u8>) -> Result<(), ProtoError> {
        let bytes = frame.encode(self.z.is_none())?;
        self.push_encoded(&bytes, out)
    }

    /// Like [`push`](Self::push) for a frame already encoded (uncompressed).
    pub fn push_encoded(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), ProtoError> {
        if self.z.is_none() {
            out.extend_from_slice(bytes);
            return Ok(());
        }
        let started = std::time::Instant::now();
        // A new level is taken on here, ending the zstd frame in progress (mid-batch if need
        // be: a bulk reply may be megabytes long); off means raw.
        self.end_frame(out)?;
        let off = self.level == 0;
        if off || (bytes.len() >= RAW_MIN && hardly_compresses(&mut self.probe, bytes)) {
            // The zstd frame in progress ends first: the raw bytes follow its end.
            self.finish_frame(out)?;
            out.extend_from_slice(&RAW_MAGIC.to_le_bytes());
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
            if off {
                // What the governor weighs the level by, as the plain bytes of a level.
                self.plain += bytes.len() as u64;
            }
            self.busy += started.elapsed();
            return Ok(());
        }
        self.in_frame = true;
        let z = self.z.as_mut().expect("compressing");
        let mut input = InBuffer::around(bytes);
        while input.pos < bytes.len() {
            let mut o = OutBuffer::around(&mut self.scratch[..]);
            z.run(&mut input, &mut o).map_err(compress_failed)?;
            out.extend_from_slice(o.as_slice());
        }
        self.plain += bytes.len() as u64;
        self.busy += started.elapsed();
        Ok(())
    }

    /// Ends a batch: everything pushed so far becomes decodable by the peer. A new level
    /// ends the zstd frame too (a stream is a sequence of frames; the next starts at the new
    /// level, without the old one's window).
    pub fn flush(&mut self, out: &mut Vec<u8>) -> Result<(), ProtoError> {
        if self.z.is_none() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        // Ending the frame flushes it too; with no frame in progress there is nothing to flush
        // (and a flush would start a frame).
        if !self.end_frame(out)? && self.in_frame {
            let z = self.z.as_mut().expect("compressing");
            drain(&mut self.scratch, out, |o| z.flush(o))?;
        }
        self.busy += started.elapsed();
        Ok(())
    }

    /// Ends the zstd frame in progress, if any (a level waiting is taken on); the next bytes
    /// start a new one.
    fn finish_frame(&mut self, out: &mut Vec<u8>) -> Result<(), ProtoError> {
        if self.end_frame(out)? || !self.in_frame {
            return Ok(());
        }
        let z = self.z.as_mut().expect("compressing");
        drain(&mut self.scratch, out, |o| z.finish(o, true))?;
        self.in_frame = false;
        Ok(())
    }

    /// With a level waiting: ends the zstd frame, and the next starts at that level. Returns
    /// whether it did.
    fn end_frame(&mut self, out: &mut Vec<u8>) -> Result<bool, ProtoError> {
        let (Some(z), Some(level)) = (self.z.as_mut(), self.next_level.take()) else {
            return Ok(false);
        };
        if std::mem::take(&mut self.in_frame) {
            drain(&mut self.scratch, out, |o| z.finish(o, true))?;
        }
        self.level = level;
        if level == 0 {
            // Off: frames go raw until the next level (zstd's own 0 is its default, 3).
            return Ok(true);
        }
        z.set_parameter(CParameter::CompressionLevel(level))
            .map_err(compress_failed)?;
        z.set_parameter(CParameter::WindowLog(window_log(level)))
            .map_err(compress_failed)?;
        Ok(true)
    }
}

/// Whether `bytes` (a frame) hardly compresses: level 1 saves under 3 % of a sample from its
/// end (a body's bulk), at most [`RAW_PROBE`] bytes (tens of microseconds).
fn hardly_compresses(probe: &mut Option<zstd::bulk::Compressor<'static>>, bytes: &[u8]) -> bool {
    let sample = &bytes[bytes.len().saturating_sub(RAW_PROBE)..];
    if probe.is_none() {
        *probe = zstd::bulk::Compressor::new(1).ok();
    }
    probe
        .as_mut()
        .and_then(|z| z.compress(sample).ok())
        .is_some_and(|c| c.len() * 100 >= sample.len() * 97)
}

/// Runs `step` (a flush or the end of a zstd frame) until the compressor holds nothing back,
/// appending what it writes to `out`.
fn drain(
    scratch: &mut [u8],
    out: &mut Vec<u8>,
    mut step: impl FnMut(&mut OutBuffer<'_, [u8]>) -> std::io::Result<usize>,
) -> Result<(), ProtoError> {
    loop {
        let mut o = OutBuffer::around(&mut scratch[..]);
        let left = step(&mut o).map_err(compress_failed)?;
        out.extend_from_slice(o.as_slice());
        if left == 0 {
            return Ok(());
        }
    }
}

fn compress_failed(_: std::io::Error) -> ProtoError {
    ProtoError::BadCompression { max: MAX_BODY }
}

/// The window a level uses, capped at [`MAX_WINDOW_LOG`].
fn window_log(level: i32) -> u32 {
    // zstd's own tables: levels up to 5 use at most 2^21, up to 12 at most 2^23.
    match level {
        ..=5 => 21,
        6..=12 => 23,
        _ => MAX_WINDOW_LOG,
    }
}

/// The receiving half: transport bytes in, bounded frames out.
#[derive(Default)]
pub struct Inflow {
    frames: FrameDecoder,
    z: Option<Decoder<'static>>,
    /// Compressed bytes not yet decompressed.
    pending: Vec<u8>,
    used: usize,
    /// The decoder filled its output last time, so it may hold more without further input.
    full: bool,
    /// Decompressed output before it is fed to the frame decoder (kept between steps).
    plain: Vec<u8>,
    /// At a zstd frame boundary: a raw segment may come next.
    boundary: bool,
    /// Bytes of a raw segment still to come.
    raw_left: usize,
}

impl Inflow {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn feed(&mut self, data: &[u8]) {
        if self.z.is_some() {
            if self.used == self.pending.len() {
                self.pending.clear();
                self.used = 0;
            }
            self.pending.extend_from_slice(data);
        } else {
            self.frames.feed(data);
        }
    }

    /// Whether the peer's stream has started ([`start_zstd`](Self::start_zstd)).
    pub fn is_compressed(&self) -> bool {
        self.z.is_some()
    }

    /// Bytes after the frame last returned are one zstd stream.
    pub fn start_zstd(&mut self) -> Result<(), ProtoError> {
        let mut d = Decoder::new().map_err(compress_failed)?;
        d.set_parameter(DParameter::WindowLogMax(MAX_WINDOW_LOG))
            .map_err(compress_failed)?;
        self.pending = self.frames.take_buffered();
        self.used = 0;
        self.full = false;
        self.plain = vec![0u8; INFLATE_STEP];
        self.z = Some(d);
        self.boundary = true;
        self.raw_left = 0;
        Ok(())
    }

    /// The next whole frame, decompressing only as much as it takes.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtoError> {
        loop {
            if let Some(f) = self.frames.next_frame()? {
                return Ok(Some(f));
            }
            let Some(z) = self.z.as_mut() else {
                return Ok(None);
            };
            let avail = &self.pending[self.used..];
            if self.raw_left > 0 {
                // A raw segment's bytes are frames' bytes as they are.
                if avail.is_empty() {
                    return Ok(None);
                }
                let n = avail.len().min(self.raw_left);
                self.frames.feed(&avail[..n]);
                self.used += n;
                self.raw_left -= n;
                continue;
            }
            if self.boundary && !self.full {
                // What comes next: a raw segment (its magic and length), or a zstd frame.
                if avail.len() < 4 || (avail.len() < 8 && avail[..4] == RAW_MAGIC.to_le_bytes()) {
                    return Ok(None);
                }
                if avail[..4] == RAW_MAGIC.to_le_bytes() {
                    let n = u32::from_le_bytes(avail[4..8].try_into().expect("4 bytes")) as usize;
                    // One frame at most: its length field and body.
                    if n > crate::MAX_FRAME + 4 {
                        return Err(ProtoError::FrameTooLarge {
                            len: n as u64,
                            max: crate::MAX_FRAME as u64 + 4,
                        });
                    }
                    self.used += 8;
                    self.raw_left = n;
                    continue;
                }
                self.boundary = false;
            }
            if avail.is_empty() && !self.full {
                // Nothing to decode and nothing held back. (zstd counts calls without input
                // and fails after a few: a reader polled often would trip it.)
                return Ok(None);
            }
            let mut input = InBuffer::around(avail);
            let mut o = OutBuffer::around(&mut self.plain[..]);
            let hint = z
                .run(&mut input, &mut o)
                .map_err(|_| ProtoError::BadCompression { max: MAX_BODY })?;
            let (consumed, produced) = (input.pos, o.pos());
            self.used += consumed;
            // A frame decoded and flushed whole (the decoder stops there): the next bytes
            // start something new, and nothing of this one is held back.
            self.boundary = hint == 0;
            self.full = produced == INFLATE_STEP && !self.boundary;
            self.frames.feed(&self.plain[..produced]);
            if consumed == 0 && produced == 0 {
                return Ok(None);
            }
        }
    }

    /// Plain bytes of a frame in progress (for bounding tests).
    pub fn buffered(&self) -> usize {
        self.frames.buffered()
    }
}

#[cfg(test)]
mod tests;
