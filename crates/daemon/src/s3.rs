//! S3 stores as the daemon's shared stores: `ferry daemon replica add s3://BUCKET/PREFIX`
//! makes one count as one of the N independent stores of a create at durability N (the copy
//! is the object's chunks and recipe in the bucket, by OID), and a ticket's `s3://` hint lets
//! any daemon with credentials for that bucket fetch the object from it, with no transfer
//! from the daemon that created it. Credentials come from the daemon's environment, the way
//! the AWS tools take them; the hint names the bucket, prefix, endpoint and region only.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ferry_chunk::ChunkerSpec;
use ferry_s3::{Locator, S3Store};

use crate::shelf::Shelf;
use crate::ticket::Ticket;
use crate::DaemonError;

/// The S3 stores this daemon has opened, by canonical URI.
pub struct S3Stores {
    /// Where their local index caches go.
    dir: PathBuf,
    open: Mutex<HashMap<String, Arc<S3Store>>>,
}

pub fn is_s3(uri: &str) -> bool {
    Locator::is_s3(uri)
}

fn bad(uri: &str, e: impl std::fmt::Display) -> DaemonError {
    DaemonError::BadRequest(format!("{uri}: {e}"))
}

impl S3Stores {
    pub fn new(dir: PathBuf) -> S3Stores {
        S3Stores {
            dir,
            open: Mutex::default(),
        }
    }

    /// `uri` with the endpoint and region it resolves to here, so that another daemon reading
    /// it in a ticket finds the same store (its credentials stay its own).
    pub fn canonical(uri: &str) -> Result<String, DaemonError> {
        let loc = Locator::parse(uri).map_err(|e| bad(uri, e))?;
        let r = ferry_s3::config::resolve(&loc, &ferry_s3::config::ProcessEnv)
            .map_err(|e| bad(uri, e))?;
        Ok(format!(
            "s3://{}/{}?endpoint={}&region={}",
            loc.bucket,
            loc.prefix.trim_end_matches('/'),
            r.endpoint,
            r.region
        ))
    }

    /// The store `uri` names, opened once per daemon; `create` makes the store (not the
    /// bucket) if it is missing.
    pub fn open(&self, uri: &str, create: bool) -> Result<Arc<S3Store>, DaemonError> {
        if let Some(s) = self.open.lock().unwrap().get(uri) {
            return Ok(s.clone());
        }
        let s = Arc::new(
            S3Store::open_locator(uri, &self.dir, create, false)
                .map_err(|e| DaemonError::Unavailable(format!("{uri}: {e}")))?,
        );
        self.open.lock().unwrap().insert(uri.to_string(), s.clone());
        Ok(s)
    }

    /// Copies the object of `ticket`, held whole in `shelf`, into the store `uri`.
    pub fn copy_in(&self, uri: &str, shelf: &Shelf, ticket: &Ticket) -> Result<(), DaemonError> {
        let store = self.open(uri, true)?;
        if ferry_store::ChunkStore::object(&*store, &ticket.oid)?.is_some() {
            return Ok(());
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<u8>, String>>(8);
        let reader = ChannelReader {
            rx,
            buf: vec![],
            at: 0,
        };
        let cap = ticket.cap.clone();
        let (oid, _, _) = std::thread::scope(|s| {
            let writer = s.spawn(move || {
                let mut w = ChannelWriter { tx: tx.clone() };
                let r = shelf.read(&cap, 0, ticket.size, &mut w);
                if let Err(e) = &r {
                    // The chunker must not take a cut object for a whole one.
                    let _ = tx.send(Err(e.to_string()));
                }
                r
            });
            let stored =
                ferry_store::store_object(&*store, reader, &ChunkerSpec::default(), |_| {});
            let wrote = writer.join().expect("the object reader does not panic");
            wrote?;
            Ok::<_, DaemonError>(stored?)
        })?;
        if oid != ticket.oid {
            return Err(DaemonError::Damaged(format!(
                "{uri}: the object read back as {oid}, not {}",
                ticket.oid
            )));
        }
        Ok(())
    }
}

/// The bytes of an object read on one thread, for the chunker on another.
struct ChannelWriter {
    tx: std::sync::mpsc::SyncSender<Result<Vec<u8>, String>>,
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.tx
            .send(Ok(b.to_vec()))
            .map_err(|_| std::io::Error::other("the S3 copy stopped"))?;
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct ChannelReader {
    rx: std::sync::mpsc::Receiver<Result<Vec<u8>, String>>,
    buf: Vec<u8>,
    at: usize,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.buf.len() {
            match self.rx.recv() {
                Ok(Ok(b)) => (self.buf, self.at) = (b, 0),
                Ok(Err(e)) => return Err(std::io::Error::other(e)),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
