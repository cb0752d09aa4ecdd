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

/// Writes into a channel the API's runtime sends on as a response body (an object read).
pub struct ChannelWriter {
    pub tx: tokio::sync::mpsc::Sender<Result<Bytes, io::Error>>,
}

impl io::Write for ChannelWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.tx
            .blocking_send(Ok(Bytes::copy_from_slice(b)))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the reader went away"))?;
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
