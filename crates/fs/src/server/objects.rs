//! Objects served by capability (the object family of `docs/protocol.md`): what a transfer
//! daemon (`ferry daemon`) hands other daemons. The shelf holding them is the daemon's; this
//! module checks each request against it and frames the answers.

use std::collections::HashSet;
use std::sync::Arc;

use ferry_format::{Id, Recipe};
use ferry_proto::{ErrorCode, Frame, Ids, Message, Reply, MAX_OBJECT_REFS};

use super::content::plain_chunk_frames;
use super::{error, Server};

/// Where a daemon's objects are, and who may read them.
pub trait ObjectShelf: Send + Sync {
    /// The size and recipe of object `oid`, if `cap` lets its holder read it. `None` both when
    /// it does not and when there is no such object: the answer must not tell them apart.
    fn open(&self, oid: &Id, cap: &[u8]) -> Option<(u64, Arc<Recipe>)>;

    /// A chunk's bytes, verified against `id`.
    fn chunk(&self, id: &Id) -> Option<Vec<u8>>;

    /// Bytes `offset..offset + len` (clamped to the object) of the object `cap` reads, with
    /// the object's id and size; `None` as [`ObjectShelf::open`].
    fn read(&self, cap: &[u8], offset: u64, len: u64) -> Option<(Id, u64, Vec<u8>)> {
        let _ = (cap, offset, len);
        None
    }

    /// A new object of `size` bytes read from `src` (Bullet's CREATE): the durability met and
    /// its ticket. A source that ends early fails the create and leaves nothing.
    fn create(
        &self,
        durability: u8,
        src: &mut (dyn std::io::Read + Send),
        size: u64,
    ) -> Result<(u8, Vec<u8>), ShelfError> {
        let _ = (durability, src, size);
        Err(unsupported())
    }

    /// Deletes the object `cap` names, if it carries the delete right (`NotFound` otherwise,
    /// as for no such object).
    fn delete(&self, cap: &[u8]) -> Result<(), ShelfError> {
        let _ = cap;
        Err(unsupported())
    }

    /// Fetches the object of a ticket and keeps a copy (a replica for another store's
    /// durability): the durability met and the copy's ticket.
    fn replicate(&self, durability: u8, ticket: &[u8]) -> Result<(u8, Vec<u8>), ShelfError> {
        let _ = (durability, ticket);
        Err(unsupported())
    }
}

/// Why a shelf refused: the code and message of the Error reply.
pub type ShelfError = (ErrorCode, String);

fn unsupported() -> ShelfError {
    (
        ErrorCode::Unsupported,
        "this server keeps no objects of its own".into(),
    )
}

/// An object being created over several requests (ObjectCreate, then ObjectAppend): its bytes
/// go to the shelf's create, on a thread of its own, as they arrive.
pub(super) struct Creating {
    tx: std::sync::mpsc::SyncSender<Vec<u8>>,
    done: std::thread::JoinHandle<Result<(u8, Vec<u8>), ShelfError>>,
    left: u64,
}

/// Reads what the requests bring, to the end (the sender dropped).
struct Arriving {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    at: usize,
}

impl std::io::Read for Arriving {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.buf.len() {
            match self.rx.recv() {
                Ok(b) => (self.buf, self.at) = (b, 0),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The most bytes one ObjectRead answers (in Range replies of 1 MiB each): bounds
/// what one request makes the server hold.
pub const MAX_OBJECT_READ: u64 = 4 << 20;
const READ_PIECE: usize = 1 << 20;

fn created(r: Result<(u8, Vec<u8>), ShelfError>) -> Reply {
    match r {
        Ok((durability, ticket)) => Reply::Created { durability, ticket },
        Err((code, message)) => error(code, message),
    }
}

/// The one answer to a capability that does not read the object, an object not held, and a
/// chunk that is not the object's.
fn not_found() -> Reply {
    error(
        ErrorCode::NotFound,
        "no such object, or not with this capability",
    )
}

/// The object whose chunks a session was last asked for, with its chunk ids.
pub(super) struct Opened {
    oid: Id,
    cap: Vec<u8>,
    ids: HashSet<Id>,
}

impl Server {
    /// Serves objects from `shelf` to anyone holding a capability; with `only`, nothing else
    /// (a client whose key is not authorized for the export).
    pub fn with_objects(mut self, shelf: Arc<dyn ObjectShelf>, only: bool) -> Self {
        self.shelf = Some(shelf);
        self.objects_only = only;
        self
    }

    pub(super) fn object_recipe(&mut self, oid: &Id, cap: &[u8], from: u64) -> Reply {
        let Some((size, recipe)) = self.shelf.as_ref().and_then(|s| s.open(oid, cap)) else {
            return not_found();
        };
        let total = recipe.len() as u64;
        let start = from.min(total) as usize;
        let end = (start + MAX_OBJECT_REFS).min(recipe.len());
        Reply::Object {
            oid: *oid,
            size,
            total,
            from: start as u64,
            chunks: recipe.chunks()[start..end].to_vec(),
        }
    }

    pub(super) fn object_read(&mut self, id: u32, cap: &[u8], offset: u64, len: u64) -> Vec<Frame> {
        let len = len.min(MAX_OBJECT_READ);
        let Some((oid, _, data)) = self.shelf.as_ref().and_then(|s| s.read(cap, offset, len))
        else {
            return vec![Message::Reply(not_found()).to_frame(id)];
        };
        let pieces: Vec<&[u8]> = match data.is_empty() {
            true => vec![&[]],
            false => data.chunks(READ_PIECE).collect(),
        };
        let last = pieces.len() - 1;
        let mut frames: Vec<Frame> = pieces
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let r = Reply::Range {
                    version: 0,
                    oid: (i == last).then_some(oid),
                    data: d.to_vec(),
                };
                Message::Reply(r).to_frame(id)
            })
            .collect();
        for f in &mut frames[..last] {
            f.flags |= ferry_proto::FLAG_MORE;
        }
        frames
    }

    pub(super) fn object_create(&mut self, durability: u8, size: u64, data: Vec<u8>) -> Reply {
        let Some(shelf) = self.shelf.clone() else {
            return error(unsupported().0, unsupported().1);
        };
        // A create left unfinished is abandoned (its bytes end early: nothing is made).
        self.abandon_create();
        if data.len() as u64 > size {
            return error(ErrorCode::BadRequest, "more bytes than the size announced");
        }
        if data.len() as u64 == size {
            return created(shelf.create(durability, &mut &data[..], size));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
        let left = size - data.len() as u64;
        let spawned = std::thread::Builder::new()
            .name("ferry-create".into())
            .spawn(move || {
                let mut src = Arriving {
                    rx,
                    buf: vec![],
                    at: 0,
                };
                shelf.create(durability, &mut src, size)
            });
        let Ok(done) = spawned else {
            return error(ErrorCode::Io, "cannot start a create");
        };
        let _ = tx.send(data);
        self.creating = Some(Creating { tx, done, left });
        Reply::Ok
    }

    pub(super) fn object_append(&mut self, data: Vec<u8>) -> Reply {
        let Some(mut c) = self.creating.take() else {
            return error(ErrorCode::BadRequest, "no object is being created");
        };
        if data.len() as u64 > c.left {
            drop(c.tx);
            let _ = c.done.join();
            return error(ErrorCode::BadRequest, "more bytes than the size announced");
        }
        c.left -= data.len() as u64;
        let _ = c.tx.send(data);
        if c.left > 0 {
            self.creating = Some(c);
            return Reply::Ok;
        }
        drop(c.tx);
        created(
            c.done
                .join()
                .unwrap_or_else(|_| Err((ErrorCode::Io, "the create failed".into()))),
        )
    }

    /// Ends a create this session left unfinished: its bytes end early, so nothing is made.
    pub(super) fn abandon_create(&mut self) {
        if let Some(c) = self.creating.take() {
            drop(c.tx);
            let _ = c.done.join();
        }
    }

    pub(super) fn object_delete(&mut self, cap: &[u8]) -> Reply {
        match self.shelf.as_ref().map(|s| s.delete(cap)) {
            Some(Ok(())) => Reply::Ok,
            Some(Err((code, message))) => error(code, message),
            None => not_found(),
        }
    }

    pub(super) fn object_replicate(&mut self, durability: u8, ticket: &[u8]) -> Reply {
        match self.shelf.as_ref().map(|s| s.replicate(durability, ticket)) {
            Some(Ok((durability, ticket))) => Reply::Created { durability, ticket },
            Some(Err((code, message))) => error(code, message),
            None => error(unsupported().0, unsupported().1),
        }
    }

    pub(super) fn object_chunks(&mut self, id: u32, oid: &Id, cap: &[u8], ids: &Ids) -> Vec<Frame> {
        let one = |r: Reply| vec![Message::Reply(r).to_frame(id)];
        let Some(shelf) = self.shelf.clone() else {
            return one(not_found());
        };
        let same = self
            .opened
            .as_ref()
            .is_some_and(|o| o.oid == *oid && o.cap == cap);
        if !same {
            let Some((_, recipe)) = shelf.open(oid, cap) else {
                return one(not_found());
            };
            self.opened = Some(Opened {
                oid: *oid,
                cap: cap.to_vec(),
                ids: recipe.chunks().iter().map(|c| c.id).collect(),
            });
        }
        let Ids::Full(asked) = ids else {
            return one(error(
                ErrorCode::BadRequest,
                "an object's chunks are asked for by full id",
            ));
        };
        let opened = self.opened.as_ref().expect("opened above");
        if !asked.iter().all(|c| opened.ids.contains(c)) {
            return one(not_found());
        }
        let found = asked
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i as u32, shelf.chunk(c)?)));
        plain_chunk_frames(id, found)
    }
}
