//! Replicas: other daemons that keep copies of this one's objects, so that a create at
//! durability N (Bullet's paranoia factor) answers once N independent stores hold the object.
//! A replica is asked with `ObjectReplicate` (an owner's request: it must authorize this
//! daemon's key); it fetches the object from this daemon by a read-only ticket, as any fetch
//! goes, and answers its own capability for its copy, which the ticket then carries in a hint.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ferry_format::{Id, Recipe};
use ferry_fs::ShelfError;
use ferry_net::{Endpoint, Identity};
use ferry_objects::{Capability, Rights};
use ferry_proto::{ErrorCode, Reply, Request};

use crate::s3::{is_s3, S3Stores};
use crate::serve::FetchBy;
use crate::shelf::Shelf;
use crate::ticket::{Hint, Ticket};
use crate::DaemonError;

/// Where replicas' hints go among a ticket's: after the daemon's own (priority 10).
const REPLICA_PRIORITY: u16 = 20;

/// The replicas the user named (`ferry daemon replica add`), in `DATA/replicas.json`: URIs
/// with the key each presented when added (`ferry://HOST:PORT?key=blake3:HEX`).
pub struct Replicas {
    path: PathBuf,
    lock: Mutex<()>,
    /// Replicas that are S3 stores (`s3://BUCKET/PREFIX`).
    s3: Arc<S3Stores>,
}

impl Replicas {
    /// The S3 stores among the replicas, opened.
    pub fn s3(&self) -> &S3Stores {
        &self.s3
    }

    pub fn new(path: &Path, s3: Arc<S3Stores>) -> Replicas {
        Replicas {
            path: path.to_path_buf(),
            lock: Mutex::new(()),
            s3,
        }
    }

    pub fn list(&self) -> Result<Vec<String>, DaemonError> {
        match std::fs::read(&self.path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| DaemonError::Damaged(format!("{}: {e}", self.path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
            Err(e) => Err(DaemonError::file("read", &self.path)(e)),
        }
    }

    fn save(&self, list: &[String]) -> Result<(), DaemonError> {
        let body = serde_json::to_vec_pretty(list).expect("strings");
        crate::replace_file(&self.path, &body)
    }

    /// Adds the daemon at `uri` (`ferry://HOST[:PORT]`): reached once now, its key recorded
    /// (on first use, in `known_hosts`) and pinned in the entry; or the S3 store at
    /// `s3://BUCKET/PREFIX` (opened now, created if missing; the entry names its endpoint and
    /// region). Returns the entry.
    pub fn add(&self, uri: &str, id: &Identity, known_hosts: &Path) -> Result<String, DaemonError> {
        if is_s3(uri) {
            let entry = S3Stores::canonical(uri)?;
            self.s3.open(&entry, true)?;
            return self.record(entry);
        }
        let bad = |why: String| DaemonError::BadRequest(format!("replica {uri:?}: {why}"));
        let base = uri.split('?').next().unwrap_or(uri);
        let ep = Endpoint::parse(base)
            .ok_or_else(|| bad("not a ferry://HOST:PORT address".into()))?
            .map_err(|e| bad(e.to_string()))?;
        let session = ferry_net::connect(&ep, id, known_hosts, |_| {})?;
        let _ = session.close();
        let fp = ferry_net::known_host(known_hosts, &ep.host_port())?
            .ok_or_else(|| bad("its key was not recorded".into()))?;
        self.record(format!("ferry://{}?key={fp}", ep.host_port()))
    }

    fn record(&self, entry: String) -> Result<String, DaemonError> {
        let _held = self.lock.lock().expect("replicas");
        let mut list = self.list()?;
        if !list.contains(&entry) {
            list.push(entry.clone());
            self.save(&list)?;
        }
        Ok(entry)
    }

    /// Removes the replica at `uri` (with or without its key); whether it was there.
    pub fn remove(&self, uri: &str) -> Result<bool, DaemonError> {
        let _held = self.lock.lock().expect("replicas");
        let mut list = self.list()?;
        let base = uri.split('?').next().unwrap_or(uri).trim_end_matches('/');
        let before = list.len();
        list.retain(|e| e.split('?').next() != Some(base));
        if list.len() == before {
            return Ok(false);
        }
        self.save(&list)?;
        Ok(true)
    }
}

/// Creates an object of `size` bytes from `src` at `durability`: 0 or 1 in the shelf alone,
/// N in the shelf and N-1 replicas (their copies named by hints of the ticket). Returns the
/// object and its ticket (carrying `hints`, this daemon's, and the replicas').
pub fn create(
    shelf: &Shelf,
    replicas: &Replicas,
    id: &Identity,
    hints: &[Hint],
    src: impl std::io::Read + Send,
    size: u64,
    durability: u8,
) -> Result<(ferry_objects::Created, Ticket), DaemonError> {
    let need = durability.saturating_sub(1) as usize;
    let registered = replicas.list()?;
    if registered.len() < need {
        return Err(DaemonError::BadRequest(format!(
            "durability {durability} needs {need} replicas; {} registered \
             (`ferry daemon replica add ferry://HOST:PORT`; durability 0: in RAM, 1: on disk)",
            registered.len()
        )));
    }
    if need > 0 && hints.is_empty() {
        return Err(DaemonError::BadRequest(
            "replicas fetch from this daemon's peer side, which is not listening (--listen)".into(),
        ));
    }
    let made = shelf.objects().create(src, size, durability.min(1))?;
    let mut ticket = Ticket {
        oid: made.oid,
        size: made.size,
        cap: made.cap.clone(),
        durability: made.durability,
        hints: hints.to_vec(),
    };
    if need > 0 {
        match replicate(id, replicas, shelf, &registered, &ticket, need) {
            Ok(copies) => {
                ticket.hints.extend(copies);
                ticket.durability = durability;
            }
            Err(e) => {
                shelf.objects().delete(&made.cap)?;
                return Err(e);
            }
        }
    }
    Ok((made, ticket))
}

/// Has `need` of `replicas` keep a copy of the object of `ticket` (whose capability they use
/// to fetch it from this daemon), in order, each at durability 1. Returns the hints of the
/// copies made; when fewer than `need` could be made, deletes those and says why.
pub fn replicate(
    id: &Identity,
    registry: &Replicas,
    shelf: &Shelf,
    replicas: &[String],
    ticket: &Ticket,
    need: usize,
) -> Result<Vec<Hint>, DaemonError> {
    let reader = ticket
        .restrict(Rights::READ)
        .map_err(|e| DaemonError::Damaged(e.to_string()))?;
    let mut made: Vec<Hint> = vec![];
    let mut failed = vec![];
    for uri in replicas {
        if made.len() == need {
            break;
        }
        if is_s3(uri) {
            // The copy is the object's chunks and recipe in the bucket, found by OID.
            match registry.s3.copy_in(uri, shelf, ticket) {
                Ok(()) => made.push(Hint::new(uri.clone(), REPLICA_PRIORITY, 100)),
                Err(e) => failed.push(format!("{uri}: {e}")),
            }
            continue;
        }
        match replicate_at(id, uri, &reader) {
            Ok(cap) => {
                let mut h = Hint::new(uri.clone(), REPLICA_PRIORITY, 100);
                h.cap = Some(cap);
                made.push(h);
            }
            Err(e) => failed.push(format!("{uri}: {e}")),
        }
    }
    if made.len() < need {
        let t = Ticket {
            hints: made,
            ..ticket.clone()
        };
        for e in delete_copies(id, &registry.s3, &t) {
            tracing::warn!("a replica's copy left behind: {e}");
        }
        return Err(DaemonError::Unavailable(format!(
            "durability {} needs {need} replicas to keep a copy; {} could{}",
            need + 1,
            t.hints.len(),
            match failed.is_empty() {
                true => format!(
                    " ({} registered: `ferry daemon replica add`)",
                    replicas.len()
                ),
                false => format!(": {}", failed.join("; ")),
            }
        )));
    }
    Ok(made)
}

fn replicate_at(id: &Identity, uri: &str, reader: &Ticket) -> Result<Capability, DaemonError> {
    let (ep, fp) = crate::fetch::parse_peer(uri)?;
    let mut s = ferry_net::connect_pinned(&ep, id, fp)?;
    let r = s.conn.call(Request::ObjectReplicate {
        durability: 1,
        ticket: reader.to_bytes(),
    });
    let _ = s.close();
    let replies = r.map_err(|e| match e {
        ferry_fs::ConnError::Remote {
            code: ErrorCode::Permission,
            ..
        } => DaemonError::Unavailable(format!(
            "it does not authorize this daemon's key (there: `ferry key authorize {}`)",
            id.fingerprint()
        )),
        e => DaemonError::Unavailable(e.to_string()),
    })?;
    match replies.into_iter().next() {
        Some(Reply::Created { ticket, .. }) => Ticket::from_bytes(&ticket)
            .map(|t| t.cap)
            .map_err(|e| DaemonError::BadPeer(e.to_string())),
        r => Err(DaemonError::BadPeer(format!("{r:?} to ObjectReplicate"))),
    }
}

/// Deletes the copies the hints of `ticket` that carry capabilities of their own name (its
/// replicas), and its copies in the S3 stores its hints name; returns what could not be
/// deleted, and why.
pub fn delete_copies(id: &Identity, s3: &S3Stores, ticket: &Ticket) -> Vec<String> {
    let mut left = vec![];
    for h in &ticket.hints {
        if is_s3(&h.uri) {
            // Objects there are by content: an owner of the same bytes shares this copy.
            let r = s3
                .open(&h.uri, false)
                .and_then(|st| Ok(ferry_store::ChunkStore::remove_object(&*st, &ticket.oid)?));
            if let Err(e) = r {
                left.push(format!("{}: {e}", h.uri));
            }
            continue;
        }
        let Some(cap) = &h.cap else { continue };
        let r = (|| {
            let (ep, fp) = crate::fetch::parse_peer(&h.uri)?;
            let mut s = ferry_net::connect_pinned(&ep, id, fp)?;
            let r = s.conn.call(Request::ObjectDelete {
                cap: cap.to_bytes(),
            });
            let _ = s.close();
            match r
                .map_err(|e| DaemonError::Unavailable(e.to_string()))?
                .pop()
            {
                Some(Reply::Ok) => Ok(()),
                r => Err(DaemonError::BadPeer(format!("{r:?} to ObjectDelete"))),
            }
        })();
        if let Err(e) = r {
            left.push(format!("{}: {e}", h.uri));
        }
    }
    left
}

/// What the peer side serves: the shelf's objects, creates (with their replicas), and copies
/// made for other daemons.
pub struct PeerShelf {
    pub shelf: Arc<Shelf>,
    pub fetch: FetchBy,
    pub replicas: Arc<Replicas>,
    pub identity: Arc<Identity>,
    /// This daemon's hints, for the tickets it answers.
    pub hints: Vec<Hint>,
}

fn shelf_error(e: DaemonError) -> ShelfError {
    let code = match &e {
        DaemonError::NotFound(_) => ErrorCode::NotFound,
        DaemonError::BadRequest(_) => ErrorCode::BadRequest,
        _ => ErrorCode::Io,
    };
    (code, e.to_string())
}

impl ferry_fs::ObjectShelf for PeerShelf {
    fn open(&self, oid: &Id, cap: &[u8]) -> Option<(u64, Arc<Recipe>)> {
        self.shelf.open(oid, cap)
    }

    fn chunk(&self, id: &Id) -> Option<Vec<u8>> {
        ferry_fs::ObjectShelf::chunk(&*self.shelf, id)
    }

    fn read(&self, cap: &[u8], offset: u64, len: u64) -> Option<(Id, u64, Vec<u8>)> {
        ferry_fs::ObjectShelf::read(&*self.shelf, cap, offset, len)
    }

    fn create(
        &self,
        durability: u8,
        src: &mut (dyn std::io::Read + Send),
        size: u64,
    ) -> Result<(u8, Vec<u8>), ShelfError> {
        let (_, t) = create(
            &self.shelf,
            &self.replicas,
            &self.identity,
            &self.hints,
            src,
            size,
            durability,
        )
        .map_err(shelf_error)?;
        Ok((t.durability, t.to_bytes()))
    }

    fn delete(&self, cap: &[u8]) -> Result<(), ShelfError> {
        ferry_fs::ObjectShelf::delete(&*self.shelf, cap)
    }

    fn replicate(&self, _durability: u8, ticket: &[u8]) -> Result<(u8, Vec<u8>), ShelfError> {
        let t = Ticket::from_bytes(ticket).map_err(|e| (ErrorCode::BadRequest, e.to_string()))?;
        // A copy of its own (a delete by the asker must not touch another's object).
        let (cap, _) = (self.fetch)(&t, &|_| {}, true).map_err(shelf_error)?;
        let copy = Ticket {
            cap,
            durability: 1,
            hints: self.hints.clone(),
            ..t
        };
        Ok((1, copy.to_bytes()))
    }
}
