//! A batch of files: every recipe asked for at once (or the files whole, when that costs
//! less), then every chunk that neither the cache nor the files already at the destination
//! hold, then each file assembled.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Write};

use ferry_format::{ChunkRef, HashAlg, Id, Recipe};
use ferry_proto::{short_id, Payload, Reply, Request, Target};
use ferry_store::{ChunkStore, VerifiedChunk};
use ferry_transfer::{EngineError, Options, Place, Sink, Source, Want};

use super::against::{fetch_against, AgainstOld};
use super::install::{assemble, install_all, INSTALL_BATCH};
use super::local::{index_local, LocalIndex};
use super::partial;
use super::plain::{ask_plain_ahead, fetch_short, take_plain_ahead};
use super::ranged::Ranges;
use super::recipes::{recipe_from, Shorts};
use super::source::SessionSource;
use super::walk::FileJob;
use super::{GetError, GetStats, Sources};
use crate::conn::{ConnError, Connection};

/// Time between cache flushes while chunks arrive (each flush is an fsync and an index
/// commit): a cut connection, or a killed client, loses at most this much of the transfer.
const RESUME_FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Says when the cache is due a flush: [`RESUME_FLUSH_EVERY`] after the last.
pub(super) struct FlushClock(std::sync::Mutex<std::time::Instant>);

impl FlushClock {
    pub(super) fn new() -> Self {
        FlushClock(std::sync::Mutex::new(std::time::Instant::now()))
    }

    pub(super) fn due(&self) -> bool {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let due = last.elapsed() >= RESUME_FLUSH_EVERY;
        if due {
            *last = std::time::Instant::now();
        }
        due
    }
}
/// Files at most this large, with no old version at the destination, are read whole.
const WHOLE_FILE: u64 = ferry_proto::MAX_READ_FILE as u64;
/// Files at most this large, with an old version here that came from the server, come whole
/// against it, as many together as fit in [`FILES_BATCH`] bytes.
const FILE_AGAINST: u64 = 256 << 10;
const FILES_BATCH: u64 = 2 << 20;

/// How a file of a batch is asked for.
enum Ask {
    /// By recipe: the request.
    Recipe(u32),
    /// Whole (ReadFiles), or by ranges: nothing of its own.
    Other,
}

/// Fetches a batch of files: every recipe asked for at once, then every chunk that neither
/// the cache nor the files already at the destination hold, then each file assembled.
///
/// With `shortcuts`, recipes name chunks by short ids and a receiver with nothing reads large
/// files by ranges; a file they misled (a short id that led to the wrong chunk, a file that
/// changed between ranges) is fetched again without them.
pub(crate) fn fetch_files<R: io::Read + Send, W: Write>(
    conn: &mut Connection<R, W>,
    mut jobs: Vec<FileJob>,
    src: &Sources<'_>,
    stats: &mut GetStats,
    shortcuts: bool,
) -> Result<(), GetError> {
    // The file already at the destination is a chunk source (rsync's basis file,
    // generalised), and its recipe's pages let the server send only the pages that changed.
    let mut asks = Vec::with_capacity(jobs.len());
    let mut olds = Vec::with_capacity(jobs.len());
    let mut ranged = vec![];
    let history = conn.offers(ferry_proto::FEATURE_HISTORY)?;
    // Chunks named by short ids in recipes: those held nowhere here are fetched by them.
    let short = shortcuts && src.short_ids && src.devices().is_none();
    // Devices are searched by chunk id: new files come by recipe, then (not whole, not by
    // ranges). A small file whose old version came from the server still comes whole against
    // it (a delta costs less than any search), and a cut large one goes on from its partial file.
    // Over a link measured fast (a LAN), small new files come whole and compressed even so:
    // a source tree compresses 6 to 8 times, so a 10 Mbit/s link brings it faster than a USB 2
    // stick reads it, and a stick's cold opens of many small files cost more than the link's
    // whole transfer (the lookaside paper's loss at 100 Mb/s); large files still race the link
    // from the devices.
    // (Timed by the Ping that went as the server's Hello came, if its reply comes in time.)
    conn.settle_probe()?;
    let fast = crate::delta::fast_link(conn.link_rate().unwrap_or(0), conn.round_trip());
    // Chunks arriving over a fast link are kept as they are: compressing them for the cache
    // made the receiver the bottleneck of a LAN transfer (a fifth of a tree's fetch).
    src.cache.prefer_speed(fast);
    let (whole_new, by_ranges) = match src.devices() {
        None => (src.cold, src.ranges),
        Some(_) => (src.cold && fast, false),
    };
    // Files that come whole, in batches: (job indices, bytes). A receiver with nothing cached
    // reads small new files whole (their recipes and chunk ids would only add to the bytes);
    // with a cache, recipes let it find what it already holds. Files whose old version came
    // from the server come whole against it.
    let mut cold: Vec<(Vec<usize>, u64)> = vec![];
    let mut warm: Vec<(Vec<usize>, u64)> = vec![];
    let mut early = match fast {
        true => ask_recipes_early(conn, &jobs, short)?,
        false => HashMap::new(),
    };
    for i in 0..jobs.len() {
        let old = match index_local(jobs[i].open_old(), &src.chunker, HashAlg::Blake3) {
            Ok(old) => old,
            // A basis that cannot be read is no basis.
            Err(e) if jobs[i].basis.is_some() => {
                tracing::debug!("basis {:?}: {e}", jobs[i].basis);
                jobs[i].basis = None;
                LocalIndex::default()
            }
            Err(e) => return Err(GetError::local("read", jobs[i].old())(e)),
        };
        let size = jobs[i].attr.size;
        // An old version this client fetched (its chunks are in the cache) is in the server's
        // history: a small file comes whole against it, with no recipe or chunk ids.
        let against = history
            && !old.order.is_empty()
            && size <= FILE_AGAINST
            && old.order.iter().map(|c| c.len as u64).sum::<u64>() <= FILE_AGAINST
            && old
                .order
                .iter()
                .all(|c| src.cache.contains(&c.id).unwrap_or(false));
        let empty = old.order.is_empty();
        // A large file cut short by an earlier fetch goes on from its partial file.
        let resume = if empty && shortcuts && src.mirrors.is_none() && size > WHOLE_FILE {
            partial::resume_point(&jobs[i].root, &jobs[i].local, jobs[i].attr.version, size)
        } else {
            0
        };
        olds.push(old);
        if let Some(id) = early.remove(&i) {
            asks.push(Ask::Recipe(id));
        } else if against {
            add_to_batch(&mut warm, i, size);
            asks.push(Ask::Other);
        } else if empty && whole_new && size <= WHOLE_FILE {
            add_to_batch(&mut cold, i, size);
            asks.push(Ask::Other);
        } else if empty && shortcuts && (by_ranges || resume > 0) {
            // Large ones likewise, a range at a time.
            ranged.push((i, resume));
            asks.push(Ask::Other);
        } else {
            asks.push(Ask::Recipe(ask_recipe(conn, &jobs[i], &olds[i], short)?));
        }
    }
    let mut batches = vec![];
    for (b, _) in warm {
        let files = b
            .iter()
            .map(|&i| {
                let olds = olds[i].order.iter().map(|c| short_id(&c.id)).collect();
                (jobs[i].remote.clone(), olds)
            })
            .collect();
        batches.push((conn.send(Request::ReadFiles { files })?, b));
    }
    for (b, _) in cold {
        let files = b
            .iter()
            .map(|&i| (jobs[i].remote.clone(), vec![]))
            .collect();
        batches.push((conn.send(Request::ReadFiles { files })?, b));
    }
    // The first ranges go with the recipe requests: no round trip of their own.
    let mut ranges = Ranges::new(&ranged);
    ranges.send(conn, &jobs)?;
    conn.flush()?;
    let mut fetched = HashSet::new();
    let mut whole: HashMap<usize, Recipe> = HashMap::new();
    for (id, b) in batches {
        for (i, recipe) in read_files(conn, id, &b, &jobs, &olds, src, stats, &mut fetched)? {
            match recipe {
                Some(r) => {
                    whole.insert(i, r);
                }
                // Not sent, or not what the server named (the old version here changed
                // meanwhile, say): by recipe, then.
                None => {
                    asks[i] =
                        Ask::Recipe(ask_recipe(conn, &jobs[i], &LocalIndex::default(), false)?)
                }
            }
        }
    }
    conn.flush()?;
    let mut recipes = Vec::with_capacity(jobs.len());
    let mut missing: Vec<ChunkRef> = vec![];
    // Where each missing chunk lies in the tree: mirrors are asked with it.
    let mut places: HashMap<Id, Place> = HashMap::new();
    let mut seen = HashSet::new();
    let mut against = vec![];
    let mut shorts = Shorts::default();
    // The checks of recipes with chunks named by short ids, for once those have arrived.
    let mut checks = HashMap::new();
    for (i, (ask, old)) in asks.into_iter().zip(olds).enumerate() {
        let j = &jobs[i];
        if let Some(recipe) = whole.remove(&i) {
            recipes.push((i, recipe, old.at));
            continue;
        }
        let Ask::Recipe(id) = ask else {
            // Read by ranges.
            continue;
        };
        let replies = conn.replies(id)?;
        let by_short: HashMap<u64, Id> = match short {
            true => old.order.iter().map(|c| (short_id(&c.id), c.id)).collect(),
            false => HashMap::new(),
        };
        // Chunks the cache was found to hold while the recipe was read: not looked up again.
        let cached = std::cell::RefCell::new(HashSet::new());
        let find = |s: u64| -> Result<Option<Id>, GetError> {
            match by_short.get(&s) {
                Some(&id) => Ok(Some(id)),
                None => {
                    let id = src.cache.find_prefix(s)?;
                    cached.borrow_mut().extend(id);
                    Ok(id)
                }
            }
        };
        let pages = ferry_format::pages(&old.order);
        let with_shorts = short.then_some(&mut shorts);
        let recipe = match recipe_from(replies, &pages, j.attr.size, with_shorts, &find) {
            Err(GetError::RecipeCheck) => {
                // Two pages with one key (a 2^-64 chance): the whole recipe, then.
                tracing::warn!(
                    "{:?}: rebuilt recipe failed its check; fetching it whole",
                    j.remote
                );
                let id = ask_recipe(conn, j, &LocalIndex::default(), false)?;
                let r = conn.replies(id)?;
                recipe_from(r, &[], j.attr.size, None, &find)?
            }
            r => r?,
        };
        let (recipe, check) = recipe;
        if let Some(check) = check {
            checks.insert(i, check);
        }
        let old = if recipe.alg() == HashAlg::Blake3 {
            old
        } else {
            index_local(j.open_old(), &src.chunker, recipe.alg())
                .map_err(GetError::local("read", j.old()))?
        };
        let mut file_missing = vec![];
        let path: std::sync::Arc<[u8]> = std::sync::Arc::from(j.remote.as_bytes());
        let file_recipe = src.devices().map(|_| recipe.check());
        let held = |id| Ok::<_, GetError>(cached.borrow().contains(id) || src.cache.contains(id)?);
        for (offset, c) in recipe.with_offsets() {
            // Held here or not, each chunk once (one file's old version holding it says
            // nothing of another's).
            if !old.at.contains_key(&c.id) && !held(&c.id)? && seen.insert(c.id) {
                let want = Want {
                    id: c.id,
                    len: c.len,
                    place: Some(Place {
                        path: path.clone(),
                        offset,
                        recipe: file_recipe,
                    }),
                };
                // What a device may hold is fetched plainly (the device first), not against
                // old data.
                match src.devices().is_some_and(|l| l.may_have(&want)) {
                    true => missing.push(*c),
                    false => file_missing.push(*c),
                }
                if let Some(place) = want.place {
                    places.insert(c.id, place);
                }
            }
        }
        let history = history.then_some(src.cache);
        match AgainstOld::new(
            j,
            &old,
            &recipe,
            &file_missing,
            history,
            Some(j.remote.clone()),
            src.cache,
        ) {
            Some(mut a) => {
                if fast {
                    a.fast_link();
                }
                against.push((a, file_missing))
            }
            None => missing.extend(file_missing),
        }
        recipes.push((i, recipe, old.at));
    }
    // On a far link the few chunks that come plainly go ahead of those against old data, in
    // the same round trip; the rest, and what did not come against old data, come plainly
    // after.
    let ahead = match against.is_empty() {
        true => vec![],
        false => ask_plain_ahead(conn, &mut missing, &shorts, src)?,
    };
    missing.extend(fetch_against(
        conn,
        against,
        src,
        stats,
        &mut fetched,
        &mut shorts,
    )?);
    missing.extend(take_plain_ahead(
        conn,
        ahead,
        src,
        stats,
        &mut fetched,
        &mut shorts,
    )?);
    let (by_short, missing): (Vec<ChunkRef>, Vec<ChunkRef>) = missing
        .into_iter()
        .partition(|c| shorts.open.contains_key(&c.id));
    fetch_short(conn, &by_short, src, stats, &mut fetched, &mut shorts)?;
    fetched.extend(fetch_chunks(conn, &missing, &places, src, stats)?);
    let mut again = vec![];
    let mut written = vec![];
    for (i, recipe, here) in recipes {
        let recipe = match checks.get(&i) {
            None => recipe,
            Some(check) => match shorts.resolve(&recipe) {
                None => return Err(GetError::Changed),
                Some(r) if r.check() == *check => r,
                Some(_) => {
                    // A chunk held here has the short id of another (a 2^-64 chance), or the
                    // server lied: by full ids, then.
                    tracing::warn!(
                        "{:?}: short ids misled; fetching by full ids",
                        jobs[i].remote
                    );
                    again.push(jobs[i].clone());
                    continue;
                }
            },
        };
        written.push((
            assemble(&jobs[i], &recipe, &here, &fetched, src, stats)?,
            &jobs[i],
        ));
        if written.len() >= INSTALL_BATCH {
            install_all(std::mem::take(&mut written), stats)?;
        }
    }
    install_all(written, stats)?;
    for i in ranges.fetch(conn, &jobs, src, stats)? {
        tracing::warn!(
            "{:?} changed while read by ranges; fetching it by recipe",
            jobs[i].remote
        );
        again.push(jobs[i].clone());
    }
    if again.is_empty() {
        return Ok(());
    }
    fetch_files(conn, again, src, stats, false)
}

fn add_to_batch(batches: &mut Vec<(Vec<usize>, u64)>, i: usize, size: u64) {
    match batches.last_mut() {
        Some((b, bytes)) if *bytes + size <= FILES_BATCH => {
            b.push(i);
            *bytes += size;
        }
        _ => batches.push((vec![i], size)),
    }
}

/// Over a fast link, asks for the recipe of every large file with an old version here before
/// that old version is cut: the server cuts the new one meanwhile. (One after the other, the
/// two cuts were a third of mbox-append's fetch through a pipe.) No page of the recipe is
/// named as known, so all of them come: at 8 Mbit/s and more, a recipe's bytes (some 36 per
/// 8 KiB chunk) take less time than cutting the old version does.
fn ask_recipes_early<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    jobs: &[FileJob],
    short: bool,
) -> Result<HashMap<usize, u32>, GetError> {
    let mut asked = HashMap::new();
    for (i, j) in jobs.iter().enumerate() {
        // Smaller files may come whole against their old version: that needs it cut first.
        let has_old = || {
            j.open_old()
                .ok()
                .flatten()
                .and_then(|f| f.metadata().ok())
                .is_some_and(|m| m.len() > 0)
        };
        if j.attr.size > FILE_AGAINST && has_old() {
            asked.insert(i, ask_recipe(conn, j, &LocalIndex::default(), short)?);
        }
    }
    if !asked.is_empty() {
        conn.flush()?;
    }
    Ok(asked)
}

/// Asks for the recipe of a job's file, against the pages of the old version held here (a
/// one-page old version is no page of a changed file's new one).
fn ask_recipe<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    j: &FileJob,
    old: &LocalIndex,
    short: bool,
) -> Result<u32, GetError> {
    let pages = ferry_format::pages(&old.order);
    let known = match pages.len() {
        0 | 1 => vec![],
        _ => pages.iter().map(|p| ferry_format::page_key(p)).collect(),
    };
    Ok(conn.send(Request::GetRecipe {
        target: Target::Path(j.remote.clone()),
        short,
        known,
    })?)
}

/// Fetches `missing` into the cache from the server and its mirrors, all kept busy (the
/// transfer engine); returns what arrived.
fn fetch_chunks<R: io::Read + Send, W: Write>(
    conn: &mut Connection<R, W>,
    missing: &[ChunkRef],
    places: &HashMap<Id, Place>,
    src: &Sources<'_>,
    stats: &mut GetStats,
) -> Result<HashSet<Id>, GetError> {
    if missing.is_empty() {
        return Ok(HashSet::new());
    }
    let wants: Vec<Want> = missing
        .iter()
        .map(|c| Want {
            id: c.id,
            len: c.len,
            place: places.get(&c.id).cloned(),
        })
        .collect();
    let sink = CacheSink {
        cache: src.cache,
        clock: FlushClock::new(),
    };
    let mut mirrors = src
        .mirrors
        .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
    let (mut providers, mut others): (Vec<_>, Vec<_>) = mirrors
        .iter_mut()
        .flat_map(|m| m.iter_mut())
        .partition(|m| m.by_id);
    let mut providers: Vec<_> = providers
        .iter_mut()
        .map(|m| {
            let hang_up = Some(m.session.hang_up_handle());
            SessionSource::provider(&mut m.session.conn, &m.name, hang_up)
        })
        .collect();
    let mut others: Vec<_> = others
        .iter_mut()
        .map(|m| {
            let hang_up = Some(m.session.hang_up_handle());
            SessionSource::mirror(&mut m.session.conn, &m.name, &m.of, &m.root, hang_up)
        })
        .collect();
    let mut devices = src.devices().map(|l| l.sources()).unwrap_or_default();
    let devices_len = devices.len();
    let mut primary = SessionSource::primary(conn);
    // Devices first (searched before the network), then lookaside providers (on the LAN),
    // then the server, then its mirrors.
    let mut sources: Vec<&mut (dyn Source + Send)> = vec![];
    for d in &mut devices {
        sources.push(d);
    }
    for p in &mut providers {
        sources.push(p);
    }
    let first_remote = sources.len();
    sources.push(&mut primary);
    for o in &mut others {
        sources.push(o);
    }
    let opts = Options {
        borrowing: src.borrowing,
        ..Options::default()
    };
    let report = ferry_transfer::fetch(&mut sources, &wants, &sink, &opts);
    // What arrived is kept, whatever else happened: a retry resumes from it.
    src.cache.flush()?;
    let report = report.map_err(engine_error)?;
    if let Some(l) = src.devices() {
        l.record(&report.sources[..devices_len]);
    }
    for d in &report.sources[..first_remote] {
        stats.from_lookaside += d.chunks;
        stats.bytes_from_lookaside += d.bytes;
    }
    for r in &report.sources[first_remote..] {
        stats.from_server += r.chunks;
        stats.bytes_from_server += r.bytes;
    }
    for m in &report.sources[first_remote + 1..] {
        stats.from_mirrors += m.chunks;
        stats.bytes_from_mirrors += m.bytes;
    }
    for r in &report.sources {
        let i = match stats.sources.iter().position(|s| s.name == r.name) {
            Some(i) => i,
            None => {
                stats.sources.push(super::SourceStats {
                    name: r.name.clone(),
                    ..Default::default()
                });
                stats.sources.len() - 1
            }
        };
        let s = &mut stats.sources[i];
        s.requests += r.requests;
        s.chunks += r.chunks;
        s.bytes += r.bytes;
        s.misses += r.misses;
        s.rejected += r.rejected;
        if r.failed.is_some() {
            s.failed.clone_from(&r.failed);
        }
    }
    Ok(wants.iter().map(|w| w.id).collect())
}

/// The cache as the engine's sink, flushed every [`RESUME_FLUSH_EVERY`]: a cut connection, or
/// a killed client, resumes from what arrived.
struct CacheSink<'a> {
    cache: &'a dyn ChunkStore,
    clock: FlushClock,
}

impl Sink for CacheSink<'_> {
    fn deliver(&self, _: usize, chunk: VerifiedChunk<'_>) -> Result<(), ferry_store::StoreError> {
        self.cache.put(&chunk)?;
        if self.clock.due() {
            self.cache.flush()?;
        }
        Ok(())
    }
}

/// What a fetch from the engine's sources failing means to the caller.
fn engine_error(e: EngineError) -> GetError {
    match e {
        // Bytes that do not match the id a recipe named: a lie, or a disk gone bad.
        EngineError::NotFound { id, lied: true, .. } => GetError::BadData(id),
        // A chunk of a recipe the server sent that no source has: the file changed since.
        EngineError::NotFound { .. } => GetError::Changed,
        EngineError::Sink(e) => GetError::Store(e),
        // The link failed: what arrived is kept, and a retry resumes.
        e => ConnError::Io(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            e.to_string(),
        ))
        .into(),
    }
}

/// The reply to ReadFiles `id` for the jobs `batch`: each job's recipe, or `None` for those to
/// fetch by recipe instead. The files sent go into the cache like fetched chunks.
#[allow(clippy::too_many_arguments)]
fn read_files<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    id: u32,
    batch: &[usize],
    jobs: &[FileJob],
    olds: &[LocalIndex],
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: &mut HashSet<Id>,
) -> Result<Vec<(usize, Option<Recipe>)>, GetError> {
    let none = || batch.iter().map(|&i| (i, None)).collect();
    let (files, payload) = match conn.replies(id)?.pop() {
        Some(Reply::Files { files, payload }) if files.len() == batch.len() => (files, payload),
        other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
    };
    // Lengths from the server: summed with a bound, before anything is sized by them.
    let total = files
        .iter()
        .flatten()
        .try_fold(0u64, |t, (len, _)| t.checked_add(*len))
        .filter(|&t| t <= ferry_proto::MAX_FILES_DATA)
        .ok_or_else(|| ConnError::Unexpected("more file bytes than a reply may carry".into()))?;
    let framed = matches!(payload, Payload::Frame { .. });
    let decoded = match payload {
        Payload::Plain(data) if data.len() as u64 == total => Ok(data),
        Payload::Plain(data) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} bytes where {total} were expected", data.len()),
        )),
        Payload::Frame { context: true, .. } => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a context that was never named",
        )),
        Payload::Frame {
            olds: used, data, ..
        } => prefix_of(batch, jobs, olds, &used)
            .and_then(|prefix| crate::delta::decode(&data, &prefix, total as usize)),
    };
    let decoded = match decoded {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!("files read whole: {e}; fetching them by recipe");
            return Ok(none());
        }
    };
    let mut out = vec![];
    let mut at = 0;
    for (&i, f) in batch.iter().zip(files) {
        let Some((len, oid)) = f else {
            out.push((i, None));
            continue;
        };
        let bytes = &decoded[at..at + len as usize];
        at += len as usize;
        let (recipe, got) = whole_file(bytes, src, stats, fetched)?;
        // What was rebuilt against old data is checked by its id; plain bytes have none.
        if oid.map_or(!framed, |oid| got.id() == oid) {
            if !olds[i].order.is_empty() {
                stats.against_old += recipe.len() as u64;
            }
            out.push((i, Some(recipe)));
        } else {
            tracing::warn!("{:?}: not the file the server named", jobs[i].remote);
            out.push((i, None));
        }
    }
    Ok(out)
}

/// The old chunks `used` names (indices into the batch's old chunk lists, concatenated), read
/// from the old files at the destination and concatenated: the prefix the server used.
fn prefix_of(
    batch: &[usize],
    jobs: &[FileJob],
    olds: &[LocalIndex],
    used: &[u32],
) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    // (job, offset, length) of each old chunk, in the order the request named them.
    let mut all = vec![];
    for &i in batch {
        let mut at = 0u64;
        for c in &olds[i].order {
            all.push((i, at, c.len));
            at += c.len as u64;
        }
    }
    let mut open: HashMap<usize, File> = HashMap::new();
    let mut prefix = vec![];
    for &u in used {
        let &(i, off, n) = all
            .get(u as usize)
            .ok_or_else(|| bad("no such old chunk"))?;
        if prefix.len() + n as usize > crate::delta::MAX_PREFIX {
            return Err(bad("prefix too long"));
        }
        let file = match open.entry(i) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(jobs[i].open_old()?.ok_or(io::ErrorKind::NotFound)?)
            }
        };
        let start = prefix.len();
        prefix.resize(start + n as usize, 0);
        file.read_exact_at(&mut prefix[start..], off)?;
    }
    Ok(prefix)
}

/// A file read whole (ReadFiles): its chunks go into the cache like fetched
/// ones; returns its recipe and object id.
fn whole_file(
    data: &[u8],
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: &mut HashSet<Id>,
) -> Result<(Recipe, ferry_format::Oid), GetError> {
    // Each chunk into the cache as it is cut: its id was just hashed from these bytes (no
    // copy, no second hash).
    let mut failed = None;
    let (recipe, oid) = ferry_format::chunk_object(data, &src.chunker, HashAlg::Blake3, |c, b| {
        if failed.is_none() {
            failed = src
                .cache
                .put(&VerifiedChunk::assume_verified(c.id, b))
                .err();
        }
        Ok::<_, io::Error>(())
    })
    .map_err(ConnError::Io)?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    for c in recipe.chunks() {
        if fetched.insert(c.id) {
            stats.from_server += 1;
            stats.bytes_from_server += c.len as u64;
        }
    }
    Ok((recipe, oid))
}
