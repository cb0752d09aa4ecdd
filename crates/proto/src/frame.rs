//! Frames: the unit the transport carries.
//!
//! ```text
//! 0  4  length of the rest (u32 le), FRAME_HEADER_LEN - 4 ..= MAX_FRAME
//! 4  1  message type
//! 5  1  flags: bit 0 COMPRESSED (body is one zstd frame), bit 1 MORE (the reply continues)
//! 6  4  request id (u32 le); 0 for Hello and for messages the server sends unasked
//! 10 .. body
//! ```

use crate::ProtoError;

pub const FRAME_HEADER_LEN: usize = 10;
/// Largest body: one maximum-size chunk (4 MiB) with room for its id and framing.
pub const MAX_BODY: usize = (4 << 20) + (64 << 10);
/// Largest value of the length field.
pub const MAX_FRAME: usize = FRAME_HEADER_LEN - 4 + MAX_BODY;
pub const FLAG_COMPRESSED: u8 = 1;
pub const FLAG_MORE: u8 = 2;
/// Bodies shorter than this are never worth compressing.
const COMPRESS_MIN: usize = 128;

/// A frame with its body decompressed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub msg_type: u8,
    /// Only [`FLAG_MORE`] survives decoding; compression is undone.
    pub flags: u8,
    pub request_id: u32,
    pub body: Vec<u8>,
}

impl Frame {
    pub fn more(&self) -> bool {
        self.flags & FLAG_MORE != 0
    }

    /// The frame's bytes. With `compress`, a body that shrinks under zstd travels compressed.
    pub fn encode(&self, compress: bool) -> Result<Vec<u8>, ProtoError> {
        if self.body.len() > MAX_BODY {
            return Err(ProtoError::FrameTooLarge {
                len: self.body.len() as u64,
                max: MAX_BODY as u64,
            });
        }
        let mut flags = self.flags & FLAG_MORE;
        let packed;
        let body: &[u8] = if compress && self.body.len() >= COMPRESS_MIN {
            match zstd::bulk::compress(&self.body, 3) {
                Ok(c) if c.len() < self.body.len() => {
                    flags |= FLAG_COMPRESSED;
                    packed = c;
                    &packed
                }
                _ => &self.body,
            }
        } else {
            &self.body
        };
        let mut out = Vec::with_capacity(FRAME_HEADER_LEN + body.len());
        out.extend_from_slice(&((FRAME_HEADER_LEN - 4 + body.len()) as u32).to_le_bytes());
        out.push(self.msg_type);
        out.push(flags);
        out.extend_from_slice(&self.request_id.to_le_bytes());
        out.extend_from_slice(body);
        Ok(out)
    }
}

/// Splits a byte stream into frames. Feed it what the transport delivers; take frames out.
///
/// Memory: the buffer holds at most what was fed and not yet taken; a length prefix over
/// [`MAX_FRAME`] is an error as soon as its four bytes arrive, before any body is buffered, so a
/// caller that reads at most one frame's worth ahead stays bounded.
#[derive(Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    start: usize,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn feed(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Takes the bytes fed but not yet returned as frames (when the stream changes encoding).
    pub fn take_buffered(&mut self) -> Vec<u8> {
        let rest = self.buf.split_off(self.start);
        self.buf.clear();
        self.start = 0;
        rest
    }

    /// Bytes fed but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// How many more bytes the frame in progress needs (at least 1), for readers that want to
    /// read exactly one frame at a time. An error if the length prefix is out of bounds.
    pub fn wanted(&self) -> Result<usize, ProtoError> {
        let have = &self.buf[self.start..];
        if have.len() < 4 {
            return Ok(FRAME_HEADER_LEN - have.len());
        }
        let len = Self::check_len(have)?;
        Ok((4 + len).saturating_sub(have.len()).max(1))
    }

    fn check_len(have: &[u8]) -> Result<usize, ProtoError> {
        let len = u32::from_le_bytes(have[..4].try_into().unwrap());
        if len as usize > MAX_FRAME {
            return Err(ProtoError::FrameTooLarge {
                len: len as u64,
                max: MAX_FRAME as u64,
            });
        }
        if (len as usize) < FRAME_HEADER_LEN - 4 {
            return Err(ProtoError::FrameTooShort(len));
        }
        Ok(len as usize)
    }

    /// The next whole frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtoError> {
        let have = &self.buf[self.start..];
        if have.len() < 4 {
            return Ok(None);
        }
        let len = Self::check_len(have)?;
        if have.len() < 4 + len {
            return Ok(None);
        }
        let msg_type = have[4];
        let flags = have[5];
        if flags & !(FLAG_COMPRESSED | FLAG_MORE) != 0 {
            return Err(ProtoError::BadFlags(flags));
        }
        let request_id = u32::from_le_bytes(have[6..10].try_into().unwrap());
        let raw = &have[FRAME_HEADER_LEN..4 + len];
        let body = if flags & FLAG_COMPRESSED != 0 {
            zstd::bulk::decompress(raw, MAX_BODY)
                .map_err(|_| ProtoError::BadCompression { max: MAX_BODY })?
        } else {
            raw.to_vec()
        };
        self.start += 4 + len;
        Ok(Some(Frame {
            msg_type,
            flags: flags & FLAG_MORE,
            request_id,
            body,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_is_pinned() {
        let f = Frame {
            msg_type: 0x10,
            flags: FLAG_MORE,
            request_id: 0x0102_0304,
            body: b"abc".to_vec(),
        };
        let b = f.encode(true).unwrap();
        assert_eq!(
            b,
            [9, 0, 0, 0, 0x10, 0x02, 0x04, 0x03, 0x02, 0x01, b'a', b'b', b'c']
        );
        let mut d = FrameDecoder::new();
        for byte in &b {
            assert_eq!(d.next_frame().unwrap(), None);
            d.feed(&[*byte]);
        }
        assert_eq!(d.next_frame().unwrap(), Some(f));
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn compressible_bodies_travel_compressed() {
        let f = Frame {
            msg_type: 0x41,
            flags: 0,
            request_id: 1,
            body: vec![b'x'; 100_000],
        };
        let b = f.encode(true).unwrap();
        assert!(b.len() < 1000);
        assert_eq!(b[5], FLAG_COMPRESSED);
        let mut d = FrameDecoder::new();
        d.feed(&b);
        assert_eq!(d.next_frame().unwrap().unwrap(), f);
    }

    #[test]
    fn hostile_frames_are_refused_before_allocation() {
        let mut d = FrameDecoder::new();
        d.feed(&u32::MAX.to_le_bytes());
        assert!(matches!(
            d.next_frame(),
            Err(ProtoError::FrameTooLarge { .. })
        ));
        assert!(d.wanted().is_err());
        let mut d = FrameDecoder::new();
        d.feed(&[2, 0, 0, 0, 1, 0]);
        assert_eq!(d.next_frame(), Err(ProtoError::FrameTooShort(2)));
        let mut d = FrameDecoder::new();
        d.feed(&[6, 0, 0, 0, 1, 0x80, 0, 0, 0, 0]);
        assert_eq!(d.next_frame(), Err(ProtoError::BadFlags(0x80)));
        // A zstd bomb: a small frame that would decompress past MAX_BODY.
        let bomb = zstd::bulk::compress(&vec![0u8; MAX_BODY + 1], 19).unwrap();
        let mut b = ((FRAME_HEADER_LEN - 4 + bomb.len()) as u32)
            .to_le_bytes()
            .to_vec();
        b.extend_from_slice(&[0x41, FLAG_COMPRESSED, 1, 0, 0, 0]);
        b.extend_from_slice(&bomb);
        let mut d = FrameDecoder::new();
        d.feed(&b);
        assert!(matches!(
            d.next_frame(),
            Err(ProtoError::BadCompression { .. })
        ));
        let too_big = Frame {
            msg_type: 1,
            flags: 0,
            request_id: 0,
            body: vec![0; MAX_BODY + 1],
        };
        assert!(too_big.encode(false).is_err());
    }
}
