//! Bytes arriving on the API's runtime, read by blocking code (a put from a stream).

use std::io::{self, Read};

use hyper::body::Bytes;

/// Reads what a channel brings, to its end (the sender dropped) or its first error.
pub struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, String>>,
    buf: Bytes,
}

impl ChannelReader {
    pub fn new(rx: tokio::sync::mpsc::Receiver<Result<Bytes, String>>) -> Self {
        ChannelReader {
            rx,
            buf: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.buf.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.buf = b,
                Some(Err(e)) => return Err(io::Error::other(format!("the stream broke: {e}"))),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf.split_to(n));
        Ok(n)
    }
}
