//! Driving a [`Cutter`] over a reader with bounded memory.

use std::io::{self, Read};

use crate::Cutter;

/// How much is read from the source at a time.
const READ_SIZE: usize = 256 * 1024;

/// The buffer's size at the first read: it doubles as the stream proves longer, so a small
/// file costs a small buffer (a mount chunks one per close).
const FIRST_BUFFER: usize = 16 * 1024;

/// One chunk of a stream: its offset in the stream and its bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Chunk<'a> {
    pub offset: u64,
    pub data: &'a [u8],
}

/// Cuts a reader into chunks.
///
/// Memory is one buffer of at most `max chunk size + 256 KiB`. Chunks borrow from it, so each must be
/// used (hashed, stored, sent) before asking for the next.
pub struct ChunkReader<R> {
    src: R,
    cutter: Box<dyn Cutter>,
    buf: Vec<u8>,
    /// What `buf` grows to.
    cap: usize,
    /// Start of the current chunk in `buf`.
    start: usize,
    /// Bytes in `buf[start..scanned]` have been fed to the cutter.
    scanned: usize,
    /// Bytes in `buf[..filled]` are valid.
    filled: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
    eof: bool,
}

impl<R: Read> ChunkReader<R> {
    /// Chunks `src` with `cutter` (which is reset first).
    pub fn new(src: R, mut cutter: Box<dyn Cutter>) -> Self {
        cutter.reset();
        let cap = cutter.max_size() + READ_SIZE;
        ChunkReader {
            src,
            cutter,
            buf: Vec::new(),
            cap,
            start: 0,
            scanned: 0,
            filled: 0,
            base: 0,
            eof: false,
        }
    }

    /// The next chunk, or `None` at the end of the stream. An empty stream has no chunks.
    pub fn next_chunk(&mut self) -> io::Result<Option<Chunk<'_>>> {
        loop {
            if self.scanned < self.filled {
                if let Some(n) = self.cutter.next_cut(&self.buf[self.scanned..self.filled]) {
                    let (s, e) = (self.start, self.scanned + n);
                    self.start = e;
                    self.scanned = e;
                    return Ok(Some(Chunk {
                        offset: self.base + s as u64,
                        data: &self.buf[s..e],
                    }));
                }
                self.scanned = self.filled;
            }
            if self.eof {
                if self.start == self.filled {
                    return Ok(None);
                }
                let (s, e) = (self.start, self.filled);
                self.start = e;
                self.cutter.reset();
                return Ok(Some(Chunk {
                    offset: self.base + s as u64,
                    data: &self.buf[s..e],
                }));
            }
            self.fill()?;
        }
    }

    fn fill(&mut self) -> io::Result<()> {
        if self.buf.len() - self.filled < READ_SIZE && self.buf.len() < self.cap {
            let len = (self.buf.len() * 2).clamp(FIRST_BUFFER, self.cap);
            self.buf.resize(len, 0);
        } else if self.buf.len() - self.filled < READ_SIZE {
            // Keep only the current chunk; it is shorter than the cutter's maximum, so READ_SIZE
            // bytes are free after the move.
            self.buf.copy_within(self.start..self.filled, 0);
            self.base += self.start as u64;
            self.filled -= self.start;
            self.scanned -= self.start;
            self.start = 0;
        }
        let end = (self.filled + READ_SIZE).min(self.buf.len());
        loop {
            match self.src.read(&mut self.buf[self.filled..end]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(());
                }
                Ok(n) => {
                    self.filled += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Cut points (chunk lengths) of a whole buffer: a convenience for tests and small inputs.
pub fn cut_lengths(cutter: &mut dyn Cutter, mut data: &[u8]) -> Vec<usize> {
    cutter.reset();
    let mut out = vec![];
    while let Some(n) = cutter.next_cut(data) {
        out.push(n);
        data = &data[n..];
    }
    if !data.is_empty() {
        out.push(data.len());
    }
    cutter.reset();
    out
}
