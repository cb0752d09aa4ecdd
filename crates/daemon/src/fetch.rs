//! Fetching an object by ticket: its recipe from the first hint that answers, its chunks from
//! every source at once (the engine: the daemon's own store first, then each peer the hints
//! name), every chunk verified, the whole checked against the OID before it is installed.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ferry_format::{ChunkRef, Oid, Recipe};
use ferry_fs::{ConnError, Session, SessionSource};
use ferry_net::{Endpoint, Fingerprint, Identity};
use ferry_proto::{Reply, Request};
use ferry_store::ChunkStore;
use ferry_transfer::{Source, StoreSource, Want};

use crate::shelf::Shelf;
use crate::ticket::{Hint, Ticket};
use crate::DaemonError;

/// The fewest bytes a chunk of a recipe a peer sends may average: bounds what a peer lying
/// about an object's chunks can make this side hold (Ferry's chunkers cut 2 KiB at least).
const MIN_AVERAGE_CHUNK: u64 = 256;

/// What a fetch did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Fetched {
    pub oid: String,
    pub size: u64,
    /// Chunks and bytes the daemon's store already held.
    pub chunks_held: u64,
    pub bytes_held: u64,
    /// Per source that delivered: its name, chunks and bytes.
    pub sources: Vec<SourceUse>,
    /// Hints that could not be used, with why.
    pub failed_hints: Vec<String>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SourceUse {
    pub name: String,
    pub chunks: u64,
    pub bytes: u64,
}

/// A peer daemon named by a `ferry://HOST:PORT?key=FINGERPRINT` hint.
pub fn parse_peer(uri: &str) -> Result<(Endpoint, Fingerprint), DaemonError> {
    let bad = |why: &str| DaemonError::BadRequest(format!("hint {uri:?}: {why}"));
    let (addr, query) = uri
        .split_once('?')
        .ok_or_else(|| bad("no ?key=FINGERPRINT"))?;
    let key = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("key="))
        .ok_or_else(|| bad("no key=FINGERPRINT"))?;
    let ep = Endpoint::parse(addr)
        .ok_or_else(|| bad("not a ferry:// address"))?
        .map_err(|e| bad(&e.to_string()))?;
    let fp = key
        .parse()
        .map_err(|e: ferry_net::NetError| bad(&e.to_string()))?;
    Ok((ep, fp))
}

/// Where chunks fetched go: the store, counted for progress.
struct Counted<'a> {
    store: &'a dyn ChunkStore,
    bytes: std::sync::atomic::AtomicU64,
    progress: &'a (dyn Fn(u64) + Sync),
}

impl ferry_transfer::Sink for Counted<'_> {
    fn deliver(
        &self,
        _: usize,
        chunk: ferry_store::VerifiedChunk<'_>,
    ) -> Result<(), ferry_store::StoreError> {
        self.store.put(&chunk)?;
        let n = chunk.data().len() as u64;
        let total = self
            .bytes
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed)
            + n;
        (self.progress)(total);
        Ok(())
    }
}

/// Fetches the object of `ticket` into the shelf (a no-op when it is there whole), telling
/// `progress` the bytes of chunks delivered so far (from any thread).
pub fn fetch(
    shelf: &Shelf,
    id: &Identity,
    ticket: &Ticket,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(Recipe, Fetched), DaemonError> {
    let mut report = Fetched {
        oid: ticket.oid.to_string(),
        size: ticket.size,
        ..Fetched::default()
    };
    if let Some(r) = shelf.whole(&ticket.oid)? {
        report.chunks_held = r.len() as u64;
        report.bytes_held = r.total_len();
        return Ok((r, report));
    }
    let mut peers: Vec<(String, Session)> = vec![];
    let mut recipe = None;
    for hint in ticket.ordered_hints(|n| rand::random_range(0..n.max(1))) {
        match open_peer(&hint, id, ticket, recipe.is_none()) {
            Ok((session, r)) => {
                if recipe.is_none() {
                    recipe = r;
                }
                peers.push((hint.uri.clone(), session));
            }
            Err(e) => report.failed_hints.push(format!("{}: {e}", hint.uri)),
        }
    }
    let Some(recipe) = recipe else {
        return Err(DaemonError::Unavailable(format!(
            "no source of object {} answered: {}",
            ticket.oid,
            if report.failed_hints.is_empty() {
                "the ticket names none".to_string()
            } else {
                report.failed_hints.join("; ")
            }
        )));
    };
    let store = shelf.store();
    let mut wants = vec![];
    let mut seen = std::collections::HashSet::new();
    for c in recipe.chunks() {
        if seen.insert(c.id) {
            wants.push(Want {
                id: c.id,
                len: c.len,
                place: None,
            });
        }
    }
    let local = StoreSource::new("the daemon's store", &**store);
    let mut owned: Vec<Box<dyn Source + Send + '_>> = vec![Box::new(local)];
    for (name, s) in peers.iter_mut() {
        let hang_up: Arc<AtomicBool> = s.hang_up_handle();
        owned.push(Box::new(SessionSource::object(
            &mut s.conn,
            name,
            ticket.oid.0,
            ticket.cap,
            Some(hang_up),
        )));
    }
    let mut sources: Vec<&mut (dyn Source + Send)> = owned
        .iter_mut()
        .map(|b| &mut **b as &mut (dyn Source + Send))
        .collect();
    let sink = Counted {
        store: &**store,
        bytes: Default::default(),
        progress,
    };
    let done = ferry_transfer::fetch(&mut sources, &wants, &sink, &Default::default());
    drop(sources);
    drop(owned);
    for (_, s) in peers {
        let _ = s.close();
    }
    let done = done.map_err(|e| DaemonError::Unavailable(e.to_string()))?;
    for (i, s) in done.sources.iter().enumerate() {
        if i == 0 {
            report.chunks_held = s.chunks;
            report.bytes_held = s.bytes;
        } else if s.chunks > 0 {
            report.sources.push(SourceUse {
                name: s.name.clone(),
                chunks: s.chunks,
                bytes: s.bytes,
            });
        }
    }
    store.flush()?;
    // The whole must be the object before it is recorded as one.
    shelf.read(&ticket.oid, &recipe, std::io::sink())?;
    store.put_object(&ticket.oid, &recipe)?;
    store.flush()?;
    Ok((recipe, report))
}

/// A session with the peer a hint names and, when `want_recipe`, the object's recipe from it.
fn open_peer(
    hint: &Hint,
    id: &Identity,
    ticket: &Ticket,
    want_recipe: bool,
) -> Result<(Session, Option<Recipe>), DaemonError> {
    if !hint.uri.starts_with("ferry://") {
        return Err(DaemonError::BadRequest(format!(
            "no plugin for hints like {:?}",
            hint.uri
        )));
    }
    let (ep, fp) = parse_peer(&hint.uri)?;
    let mut session = ferry_net::connect_pinned(&ep, id, fp)?;
    let recipe = if want_recipe {
        Some(recipe_from(&mut session, ticket)?)
    } else {
        None
    };
    Ok((session, recipe))
}

/// The object's recipe, paged through; it must add up to the ticket's size.
fn recipe_from(session: &mut Session, ticket: &Ticket) -> Result<Recipe, DaemonError> {
    let lie = |why: String| DaemonError::BadPeer(why);
    let max_chunks = ticket.size / MIN_AVERAGE_CHUNK + 16;
    let mut chunks: Vec<ChunkRef> = vec![];
    let mut total_len = 0u64;
    loop {
        let req = Request::ObjectRecipe {
            oid: ticket.oid.0,
            cap: ticket.cap,
            from: chunks.len() as u64,
        };
        let replies = session.conn.call(req).map_err(link)?;
        let Some(Reply::Object {
            oid,
            size,
            total,
            from,
            chunks: page,
        }) = replies.into_iter().next()
        else {
            return Err(lie("no Object reply to ObjectRecipe".into()));
        };
        if oid != ticket.oid.0 || size != ticket.size || from != chunks.len() as u64 {
            return Err(lie(format!(
                "it answers for {oid} ({size} bytes, from {from}) when asked for {} ({} bytes, from {})",
                ticket.oid, ticket.size, chunks.len()
            )));
        }
        if total > max_chunks {
            return Err(lie(format!("{total} chunks for {size} bytes")));
        }
        if page.is_empty() && (chunks.len() as u64) < total {
            return Err(lie("an empty page of the recipe before its end".into()));
        }
        for c in &page {
            total_len += c.len as u64;
        }
        if total_len > size {
            return Err(lie(format!(
                "chunks of more than the object's {size} bytes"
            )));
        }
        chunks.extend(page);
        if chunks.len() as u64 >= total {
            break;
        }
    }
    if total_len != ticket.size {
        return Err(lie(format!(
            "chunks of {total_len} bytes for an object of {}",
            ticket.size
        )));
    }
    Recipe::from_chunks(ticket.oid.0.alg(), chunks).map_err(|e| lie(e.to_string()))
}

fn link(e: ConnError) -> DaemonError {
    match e {
        ConnError::Remote {
            code: ferry_proto::ErrorCode::NotFound,
            ..
        } => DaemonError::NotFound(
            "the peer holds no such object, or not for this capability".into(),
        ),
        e => DaemonError::Unavailable(e.to_string()),
    }
}

/// Writes the object into `dest` atomically: a temporary file beside it, synced, then renamed
/// over it, once the whole checked out.
pub fn install(shelf: &Shelf, oid: &Oid, recipe: &Recipe, dest: &Path) -> Result<u64, DaemonError> {
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".ferry-object")
        .tempfile_in(&dir)
        .map_err(DaemonError::file("create a file in", &dir))?;
    let n = shelf.read(oid, recipe, std::io::BufWriter::new(tmp.as_file_mut()))?;
    tmp.as_file()
        .sync_all()
        .map_err(DaemonError::file("write", dest))?;
    use std::os::unix::fs::PermissionsExt;
    let _ = tmp
        .as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644));
    tmp.persist(dest)
        .map_err(|e| DaemonError::file("install", dest)(e.error))?;
    crate::sync_dir(&dir);
    Ok(n)
}
