//! Fetching an object by ticket: its recipe from the first hint that answers, its chunks from
//! every source at once (the engine: the daemon's own store first, then each peer the hints
//! name), every chunk verified, the whole checked against the OID before it is installed.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_format::{ChunkRef, Recipe};
use ferry_fs::{ConnError, Session, SessionSource};
use ferry_net::{Endpoint, Fingerprint, Identity};
use ferry_proto::{Reply, Request};
use ferry_store::ChunkStore;
use ferry_transfer::{Source, StoreSource, Want};

use crate::devices::{self, Devices};
use crate::shelf::{HeldChunks, Shelf};
use crate::ticket::{Hint, Ticket};
use crate::DaemonError;
use ferry_objects::Capability;
use std::io::Write;

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
    /// A ticket of the daemon's own copy (its owner's capability).
    #[serde(default)]
    pub local: Option<String>,
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

/// How often the registered devices are looked at during a fetch (DOT polls every 5 s): a
/// device plugged in mid-transfer takes part from the next segment of the fetch on. With no
/// device registered, a fetch is one segment.
const POLL: Duration = Duration::from_secs(5);
/// The first segment of a fetch, in bytes; later ones last about [`POLL`] at the rate
/// measured, within these bounds.
const FIRST_SEGMENT: u64 = 4 << 20;
const MAX_SEGMENT: u64 = 1 << 30;

/// What a daemon fetches with.
pub struct Fetcher<'a> {
    pub shelf: &'a Shelf,
    pub identity: &'a Identity,
    pub devices: &'a Devices,
    /// The user's lookaside devices (`ferry lookaside add`).
    pub lookaside: Option<&'a ferry_lookaside::Lookaside>,
    /// The directory of the lookaside registry, where what devices and providers supplied is
    /// counted.
    pub registry: &'a Path,
    /// The user's lookaside providers (`ferry://HOST:PORT`: daemons of the user's that
    /// authorize this one's key), asked for chunks by id.
    pub providers: Vec<String>,
    /// Where the providers' keys are recorded (on first use) and checked.
    pub known_hosts: PathBuf,
    /// S3 stores, for `s3://` hints.
    pub s3: &'a crate::s3::S3Stores,
}

/// An S3 store a hint names, and its name in reports.
type Shared = (String, Arc<ferry_s3::S3Store>);

/// The store an `s3://` hint names and, when `want_recipe`, the object's recipe from it.
fn open_shared(
    f: &Fetcher<'_>,
    hint: &Hint,
    ticket: &Ticket,
    want_recipe: bool,
) -> Result<(Arc<ferry_s3::S3Store>, Option<Recipe>), DaemonError> {
    let store = f.s3.open(&hint.uri, false)?;
    if !want_recipe {
        return Ok((store, None));
    }
    let recipe = store
        .object(&ticket.oid)?
        .ok_or_else(|| DaemonError::NotFound(format!("object {} is not in it", ticket.oid)))?;
    if recipe.total_len() != ticket.size {
        return Err(DaemonError::BadPeer(format!(
            "its recipe of {} adds up to {} bytes, not {}",
            ticket.oid,
            recipe.total_len(),
            ticket.size
        )));
    }
    Ok((store, Some(recipe)))
}

/// Fetches the object of `ticket` into the shelf as an object of its own (a no-op when one
/// holds it whole already, unless `fresh`), telling `progress` the bytes of chunks in hand so
/// far (from any thread). Returns the owner's capability of the daemon's copy.
pub fn fetch(
    f: &Fetcher<'_>,
    ticket: &Ticket,
    progress: &(dyn Fn(u64) + Sync),
    fresh: bool,
) -> Result<(Capability, Fetched), DaemonError> {
    let shelf = f.shelf;
    let mut report = Fetched {
        oid: ticket.oid.to_string(),
        size: ticket.size,
        ..Fetched::default()
    };
    if let Some((cap, r)) = shelf.whole(&ticket.oid)?.filter(|_| !fresh) {
        report.chunks_held = r.len() as u64;
        report.bytes_held = r.total_len();
        return Ok((cap, report));
    }
    let mut peers: Vec<Named> = vec![];
    let mut shared: Vec<Shared> = vec![];
    let mut recipe = None;
    for hint in ticket.ordered_hints(|n| rand::random_range(0..n.max(1))) {
        if crate::s3::is_s3(&hint.uri) {
            match open_shared(f, &hint, ticket, recipe.is_none()) {
                Ok((store, r)) => {
                    if recipe.is_none() {
                        recipe = r;
                    }
                    shared.push((hint.uri.clone(), store));
                }
                Err(e) => report.failed_hints.push(format!("{}: {e}", hint.uri)),
            }
            continue;
        }
        match open_peer(&hint, f.identity, ticket, recipe.is_none()) {
            Ok((session, r)) => {
                if recipe.is_none() {
                    recipe = r;
                }
                peers.push((hint.uri.clone(), session));
            }
            Err(e) => report.failed_hints.push(format!("{}: {e}", hint.uri)),
        }
    }
    let mut providers: Vec<Named> = vec![];
    for p in &f.providers {
        let r = match Endpoint::parse(p) {
            Some(Ok(ep)) => ferry_net::connect(&ep, f.identity, &f.known_hosts, |_| {}),
            _ => continue,
        };
        match r {
            Ok(s) => providers.push((p.clone(), s)),
            Err(e) => tracing::info!("lookaside provider {p}: {e}"),
        }
    }
    let mut present = f.devices.present();
    let recipe = recipe.or_else(|| {
        present
            .iter()
            .find_map(|d| devices::recipe(d, &ticket.oid, ticket.size))
    });
    let Some(recipe) = recipe else {
        return Err(DaemonError::Unavailable(format!(
            "no source of object {} answered: {}",
            ticket.oid,
            if report.failed_hints.is_empty() {
                "the ticket names none, and no device holds it".to_string()
            } else {
                report.failed_hints.join("; ")
            }
        )));
    };
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
    let store = shelf.staging();
    let sink = Counted {
        store: &**store,
        bytes: Default::default(),
        progress,
    };
    let mut used: Vec<SourceUse> = vec![];
    // Segments only when there are devices to look for between them: each segment's end
    // waits on its slowest source, which costs a multi-path fetch some of its borrowing.
    let first = match f.devices.list().is_empty() {
        true => u64::MAX,
        false => FIRST_SEGMENT,
    };
    let (mut at, mut segment, mut polled) = (0, first, Instant::now());
    let r = (|| {
        while at < wants.len() {
            if polled.elapsed() >= POLL {
                present = f.devices.present();
                polled = Instant::now();
            }
            let mut end = at;
            let mut bytes = 0u64;
            while end < wants.len() && (end == at || bytes < segment) {
                bytes += wants[end].len as u64;
                end += 1;
            }
            let started = Instant::now();
            let remote = (&mut providers[..], &mut peers[..]);
            let done = fetch_segment(f, &present, &shared, remote, ticket, &wants[at..end], &sink)?;
            for s in done.sources {
                match used.iter_mut().find(|u| u.name == s.name) {
                    Some(u) => (u.chunks, u.bytes) = (u.chunks + s.chunks, u.bytes + s.bytes),
                    None => used.push(SourceUse {
                        name: s.name,
                        chunks: s.chunks,
                        bytes: s.bytes,
                    }),
                }
            }
            let rate = bytes as f64 / started.elapsed().as_secs_f64().max(1e-3);
            if segment != u64::MAX {
                segment = ((rate * POLL.as_secs_f64()) as u64).clamp(FIRST_SEGMENT, MAX_SEGMENT);
            }
            at = end;
        }
        Ok::<_, DaemonError>(())
    })();
    for (_, s) in peers.into_iter().chain(providers) {
        let _ = s.close();
    }
    let mut supplied = f.lookaside.map(|l| l.supplied()).unwrap_or_default();
    for u in used.iter().filter(|u| f.providers.contains(&u.name)) {
        let s = ferry_lookaside::Supplied {
            chunks: u.chunks,
            bytes: u.bytes,
            ..Default::default()
        };
        supplied.push((PathBuf::from(&u.name), s));
    }
    if let Err(e) = ferry_lookaside::Registry::new(f.registry).count(&supplied) {
        tracing::warn!("cannot count what lookaside devices and providers supplied: {e}");
    }
    r?;
    for u in used {
        if u.name == STORE || u.name == HELD {
            report.chunks_held += u.chunks;
            report.bytes_held += u.bytes;
        } else if u.chunks > 0 {
            report.sources.push(u);
        }
    }
    store.flush()?;
    // The whole must be the object before it is one: the store computes the OID as it goes.
    let made =
        shelf
            .objects()
            .create(RecipeReader::new(&**store, &recipe), recipe.total_len(), 1)?;
    if made.oid != ticket.oid {
        shelf.objects().delete(&made.cap)?;
        return Err(DaemonError::BadPeer(format!(
            "the chunks fetched make {}, not {}",
            made.oid, ticket.oid
        )));
    }
    Ok((made.cap, report))
}

/// The bytes of a recipe's chunks, from a chunk store (each verified by the store).
struct RecipeReader<'a> {
    store: &'a dyn ChunkStore,
    recipe: &'a Recipe,
    next: usize,
    buf: Vec<u8>,
    at: usize,
}

impl<'a> RecipeReader<'a> {
    fn new(store: &'a dyn ChunkStore, recipe: &'a Recipe) -> Self {
        RecipeReader {
            store,
            recipe,
            next: 0,
            buf: vec![],
            at: 0,
        }
    }
}

impl std::io::Read for RecipeReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.buf.len() {
            let Some(c) = self.recipe.chunks().get(self.next) else {
                return Ok(0);
            };
            self.next += 1;
            self.buf = self
                .store
                .get(&c.id)
                .map_err(std::io::Error::other)?
                .ok_or_else(|| std::io::Error::other(format!("chunk {} is gone", c.id)))?;
            self.at = 0;
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A session with a peer or a provider, and its name in reports.
type Named = (String, Session);

/// The daemon's stores' names among the sources: the chunks of fetches, and its objects.
const STORE: &str = "the daemon's store";
const HELD: &str = "the daemon's objects";

/// One segment of a fetch, from every source at hand: the store, the devices present, the
/// lookaside devices and providers, the peers.
fn fetch_segment(
    f: &Fetcher<'_>,
    present: &[PathBuf],
    shared: &[Shared],
    (providers, peers): (&mut [Named], &mut [Named]),
    ticket: &Ticket,
    wants: &[Want],
    sink: &Counted<'_>,
) -> Result<ferry_transfer::Report, DaemonError> {
    let store = f.shelf.staging();
    let held = HeldChunks(f.shelf.objects());
    let mut owned: Vec<Box<dyn Source + Send + '_>> = vec![
        Box::new(StoreSource::new(STORE, &**store)),
        Box::new(StoreSource::new(HELD, &held)),
    ];
    for d in present {
        match devices::DeviceSource::open(d) {
            Ok(s) => owned.push(Box::new(s)),
            Err(e) => tracing::info!("device {}: {e}", d.display()),
        }
    }
    if let Some(l) = f.lookaside {
        for s in l.sources() {
            owned.push(Box::new(s));
        }
    }
    for (name, s) in shared {
        owned.push(Box::new(StoreSource::new(name.clone(), &**s)));
    }
    for (name, s) in providers.iter_mut() {
        let hang_up = Some(s.hang_up_handle());
        owned.push(Box::new(SessionSource::provider(
            &mut s.conn,
            name,
            hang_up,
        )));
    }
    for (name, s) in peers.iter_mut() {
        let hang_up: Arc<AtomicBool> = s.hang_up_handle();
        owned.push(Box::new(SessionSource::object(
            &mut s.conn,
            name,
            ticket.oid.0,
            ticket.cap_for_uri(name).to_bytes(),
            Some(hang_up),
        )));
    }
    let mut sources: Vec<&mut (dyn Source + Send)> = owned
        .iter_mut()
        .map(|b| &mut **b as &mut (dyn Source + Send))
        .collect();
    let done = ferry_transfer::fetch(&mut sources, wants, sink, &Default::default());
    drop(sources);
    drop(owned);
    let done = done.map_err(|e| DaemonError::Unavailable(e.to_string()))?;
    if let Some(l) = f.lookaside {
        l.record(&done.sources);
    }
    Ok(done)
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
        Some(recipe_from(&mut session, ticket, &ticket.cap_for(hint))?)
    } else {
        None
    };
    Ok((session, recipe))
}

/// The object's recipe, paged through; it must add up to the ticket's size.
fn recipe_from(
    session: &mut Session,
    ticket: &Ticket,
    cap: &Capability,
) -> Result<Recipe, DaemonError> {
    let lie = |why: String| DaemonError::BadPeer(why);
    let max_chunks = ticket.size / MIN_AVERAGE_CHUNK + 16;
    let mut chunks: Vec<ChunkRef> = vec![];
    let mut total_len = 0u64;
    loop {
        let req = Request::ObjectRecipe {
            oid: ticket.oid.0,
            cap: cap.to_bytes(),
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

/// Writes the object `cap` reads into `dest` atomically: a temporary file beside it, synced,
/// then renamed over it, every chunk verified.
pub fn install(shelf: &Shelf, cap: &Capability, dest: &Path) -> Result<u64, DaemonError> {
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".ferry-object")
        .tempfile_in(&dir)
        .map_err(DaemonError::file("create a file in", &dir))?;
    let n = {
        let mut out = std::io::BufWriter::new(tmp.as_file_mut());
        let n = shelf.read(cap, 0, u64::MAX, &mut out)?;
        out.flush().map_err(DaemonError::file("write", dest))?;
        n
    };
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
