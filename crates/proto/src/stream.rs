//! Session compression: with [`FEATURE_ZSTD_STREAM`] agreed in the Hellos, everything after
//! the Hello frame is, in each direction, one zstd stream of frames.
//!
//! One stream per direction compresses every message with the context of all earlier ones, so
//! a listing's names, a recipe's lengths and the chunks of one file are compressed together
//! instead of frame by frame. The sender flushes the stream at the end of every batch, so the
//! peer can always decode all it has been sent.
//!
//! Memory stays bounded on hostile input: the decoder's window is capped at
//! [`MAX_WINDOW_LOG`], and compressed input is only decompressed, [`INFLATE_STEP`] bytes at a
//! time, when no whole frame is waiting; so the plain bytes held never exceed one frame plus
//! one step, whatever the compression ratio.

use zstd::stream::raw::{CParameter, DParameter, Decoder, Encoder, InBuffer, Operation, OutBuffer};

use crate::{Frame, FrameDecoder, ProtoError, MAX_BODY};

/// Hello feature bit: the rest of the session travels as a zstd stream in each direction.
pub const FEATURE_ZSTD_STREAM: u64 = 1;
/// Largest window a sender may use, and a receiver accepts (16 MiB).
pub const MAX_WINDOW_LOG: u32 = 24;
/// Plain bytes produced per decompression step.
const INFLATE_STEP: usize = 256 << 10;
/// Scratch space for compressed output.
const DEFLATE_STEP: usize = 128 << 10;

/// The sending half: frames in, bytes for the transport out.
pub struct Outflow {
    z: Option<Encoder<'static>>,
    /// Compressed output before it is appended (kept: frames are many and often small).
    scratch: Vec<u8>,
}

impl Outflow {
    /// Frames travel as they are (before the Hellos, or when the peer lacks the feature).
    pub fn plain() -> Self {
        Outflow {
            z: None,
            scratch: vec![],
        }
    }

    /// From now on, frames travel in one zstd stream compressed at `level`.
    pub fn start_zstd(&mut self, level: i32) -> Result<(), ProtoError> {
        let bad = |_| ProtoError::BadCompression { max: MAX_BODY };
        let mut e = Encoder::new(level).map_err(bad)?;
        // Never more window than any receiver accepts, whatever the level would pick.
        e.set_parameter(CParameter::WindowLog(window_log(level)))
            .map_err(bad)?;
        self.z = Some(e);
        self.scratch = vec![0u8; DEFLATE_STEP];
        Ok(())
    }

    pub fn is_compressed(&self) -> bool {
        self.z.is_some()
    }

    /// Appends the transport bytes of `frame` to `out`. With compression on, they may stay in
    /// the stream's buffer until [`flush`](Self::flush).
    pub fn push(&mut self, frame: &Frame, out: &mut Vec<u8>) -> Result<(), ProtoError> {
        let bytes = frame.encode(self.z.is_none())?;
        self.push_encoded(&bytes, out)
    }

    /// Like [`push`](Self::push) for a frame already encoded (uncompressed).
    pub fn push_encoded(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), ProtoError> {
        let Some(z) = self.z.as_mut() else {
            out.extend_from_slice(bytes);
            return Ok(());
        };
        let mut input = InBuffer::around(bytes);
        while input.pos < bytes.len() {
            let mut o = OutBuffer::around(&mut self.scratch[..]);
            z.run(&mut input, &mut o).map_err(compress_failed)?;
            out.extend_from_slice(o.as_slice());
        }
        Ok(())
    }

    /// Ends a batch: everything pushed so far becomes decodable by the peer.
    pub fn flush(&mut self, out: &mut Vec<u8>) -> Result<(), ProtoError> {
        let Some(z) = self.z.as_mut() else {
            return Ok(());
        };
        loop {
            let mut o = OutBuffer::around(&mut self.scratch[..]);
            let left = z.flush(&mut o).map_err(compress_failed)?;
            out.extend_from_slice(o.as_slice());
            if left == 0 {
                return Ok(());
            }
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
            if self.used == self.pending.len() && !self.full {
                return Ok(None);
            }
            let mut input = InBuffer::around(&self.pending[self.used..]);
            let mut o = OutBuffer::around(&mut self.plain[..]);
            z.run(&mut input, &mut o)
                .map_err(|_| ProtoError::BadCompression { max: MAX_BODY })?;
            let (consumed, produced) = (input.pos, o.pos());
            self.used += consumed;
            self.full = produced == INFLATE_STEP;
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
mod tests {
    use super::*;
    use crate::{Message, Request, WirePath};

    fn frame(i: u32) -> Frame {
        Message::Request(Request::GetAttr {
            path: WirePath::new(format!("src/dir{}/file{i}.rs", i % 7)).unwrap(),
        })
        .to_frame(i)
    }

    #[test]
    fn a_stream_of_batches_round_trips_and_compresses_across_frames() {
        let mut out = Outflow::plain();
        let mut bytes = vec![];
        out.push(&frame(0), &mut bytes).unwrap();
        out.flush(&mut bytes).unwrap();
        let plain_hello = bytes.len();
        out.start_zstd(3).unwrap();
        let mut inflow = Inflow::new();
        inflow.feed(&bytes);
        assert_eq!(inflow.next_frame().unwrap(), Some(frame(0)));
        inflow.start_zstd().unwrap();
        let mut plain = 0;
        let mut wire = 0;
        for batch in 0..20u32 {
            let mut b = vec![];
            for i in 0..50 {
                let f = frame(1 + batch * 50 + i);
                plain += f.encode(false).unwrap().len();
                out.push(&f, &mut b).unwrap();
            }
            out.flush(&mut b).unwrap();
            wire += b.len();
            // Delivered in awkward pieces.
            for piece in b.chunks(97) {
                inflow.feed(piece);
            }
            for i in 0..50 {
                assert_eq!(
                    inflow.next_frame().unwrap(),
                    Some(frame(1 + batch * 50 + i))
                );
            }
            assert_eq!(inflow.next_frame().unwrap(), None);
        }
        assert!(plain_hello > 0);
        assert!(
            wire * 4 < plain,
            "{wire} bytes on the wire for {plain} plain"
        );
    }

    #[test]
    fn frames_larger_than_a_step_arrive_whole() {
        let big = Message::Request(Request::PutChunks {
            chunks: vec![(
                ferry_format::Id::hash(ferry_format::HashAlg::Blake3, b"x"),
                vec![7u8; 3 << 20],
            )],
        })
        .to_frame(9);
        let mut out = Outflow::plain();
        out.start_zstd(1).unwrap();
        let mut b = vec![];
        out.push(&big, &mut b).unwrap();
        out.push(&frame(10), &mut b).unwrap();
        out.flush(&mut b).unwrap();
        let mut inflow = Inflow::new();
        inflow.start_zstd().unwrap();
        inflow.feed(&b);
        assert_eq!(inflow.next_frame().unwrap(), Some(big));
        assert_eq!(inflow.next_frame().unwrap(), Some(frame(10)));
        assert_eq!(inflow.next_frame().unwrap(), None);
    }

    #[test]
    fn a_decompression_bomb_stays_bounded() {
        // Zeros compress ~4000:1; the receiver holds one frame in progress plus one step.
        let mut out = Outflow::plain();
        out.start_zstd(3).unwrap();
        let mut b = vec![];
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.resize(64 << 20, 0);
        out.push_encoded(&huge, &mut b).unwrap();
        out.flush(&mut b).unwrap();
        let mut inflow = Inflow::new();
        inflow.start_zstd().unwrap();
        inflow.feed(&b);
        assert!(matches!(
            inflow.next_frame(),
            Err(ProtoError::FrameTooLarge { .. })
        ));
        assert!(inflow.buffered() <= INFLATE_STEP);
    }

    #[test]
    fn garbage_in_the_stream_is_an_error() {
        let mut inflow = Inflow::new();
        inflow.start_zstd().unwrap();
        inflow.feed(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(inflow.next_frame().is_err());
    }
}
