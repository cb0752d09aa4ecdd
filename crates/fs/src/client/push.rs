//! Sending a batch of files: the fetch's exchange pointed the other way.
//!
//! 1. For a file that replaces a version on the server, that version's recipe, against the pages
//!    of the new one (GetRecipe; the pages both hold come back as references, the rest by
//!    short id). For a new file, which of its chunks the server holds anywhere (Have).
//! 2. For a replacing file with new data: which of the new chunks the server holds anywhere
//!    (Have), and keys of pieces of the old data the new version dropped (GetKeys), unless the
//!    cache here holds that old data (it came from the server).
//! 3. The new version as a stream of Writes: pages and chunks the server holds by reference,
//!    new data compressed against the old data both sides hold (the parts of the old version
//!    the new one keeps, near the new data; old chunks held here; pieces whose keys the server
//!    sent), then Commit with the whole object's id.
//!
//! Each step is one round trip for the whole batch. A file under 8 KiB skips the first two:
//! its bytes go with its commit, one round trip (LBFS §3.3). No message grows with a file:
//! Have and Write are paged, and the server writes the file as the Writes arrive.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use ferry_format::{HashAlg, Id, Oid, Recipe};
use ferry_proto::{
    short_id, Attr, ErrorCode, Ids, KeyOlds, Payload, RecipePart, Reply, Request, Target, WirePath,
    WritePart,
};

use super::upload::check;
use super::{GetError, PutOptions, PutStats};
use crate::conn::{ConnError, Connection};
use crate::delta::{FrameLevel, Keys};

mod write;
use write::{write_file, Stream};

/// Files smaller than this travel whole with their commit, in one round trip (LBFS §3.3)...
const SMALL_FILE: u64 = 8 * 1024;
/// ...unless they replace a version on the server and are at least this large: then the old
/// version's keys cost less than what they save (a changed `.cargo-checksum.json`: a few
/// hundred bytes against kilobytes of hashes), at a round trip more (not with
/// `fewer_round_trips`).
const SMALL_AGAINST: u64 = 2 * 1024;
/// With `fewer_round_trips` (the mount's write-back), a new file (or one replacing an empty
/// version) smaller than this goes whole with its commit too when the cache here holds none of
/// its chunks: new data (none of it came from the server), so asking which chunks the server
/// holds would cost a round trip for nothing. SQLite's journal (a header and two 4 KiB pages
/// with theirs: just over 8 KiB) is one.
const NEW_SMALL_FILE: u64 = 32 * 1024;
/// Chunk ids per Have request.
const HAVE_IDS: usize = 64 << 10;
/// With `fewer_round_trips` (the mount's write-back), the chunks of a file smaller than this
/// are kept in the client's chunk cache as they are cut: the next commit of the file (SQLite's
/// database, a document saved again) compresses what it changed against them, old data held
/// here, with nothing asked (see `Replacing::recipe`).
const KEEP_CHUNKS_UNDER: u64 = 16 << 20;
/// With `fewer_round_trips`, a file replacing a version, of at most this many chunks, asks in
/// one round trip what a larger one asks in two: the old recipe, which of its own chunks the
/// server holds, and keys of every old chunk it dropped.
const ONE_ASK_CHUNKS: usize = 64;
/// Refs per Write at most, and bytes of the upload stream's requests kept unanswered at most:
/// memory stays bounded however large the files, and the link stays full.
const WRITE_REFS: usize = 4096;
const IN_FLIGHT_BYTES: usize = 16 << 20;
/// Bytes of new data per Write when it goes plainly (a new file's): a buffer of 2 MiB is a fresh
/// allocation at glibc's mmap threshold on both ends, faulted in and copied cold each time.
const PLAIN_DATA: usize = 256 << 10;
/// Chunks the server holds, at most, that a run of new data takes in between new ones.
const BRIDGE: usize = 4;
/// Bytes of old data named whole as a frame's prefix (the old chunks held here) at most.
const OLDS_BYTES: u64 = 8 << 20;
/// Bytes of the new version around new data that head a frame's prefix, whatever the data's
/// size; and at most.
const CONTEXT_FLOOR: u64 = 64 << 10;
const CONTEXT_MAX: u64 = 4 << 20;

/// A local file to upload, and what the server has at its path.
pub(crate) struct PutJob {
    pub(crate) local: PathBuf,
    pub(crate) meta: fs::Metadata,
    /// The permission bits to give the file on the server.
    pub(crate) mode: u32,
    pub(crate) remote: WirePath,
    /// The version of the file being replaced (`None`: there is none).
    pub(crate) if_version: Option<u64>,
    /// That version is known to be empty: nothing of it is asked for (a file a mount's create
    /// made, written at its close, asked for the recipe and keys of nothing).
    pub(crate) base_empty: bool,
    /// That version's recipe, known (see `Replacing::recipe`): nothing is asked.
    pub(crate) base_recipe: Option<std::sync::Arc<Recipe>>,
}

/// The version on the server that an upload replaces, as the client learns it.
struct BaseView {
    version: u64,
    /// Each chunk: length and short id.
    chunks: Vec<(u32, u64)>,
    /// Short id → index.
    by_short: HashMap<u64, usize>,
    /// Pages of the new version the base holds too (by index in the new version's pages).
    known_pages: HashSet<usize>,
    /// The base index of each chunk of the new version the base holds, by the new index.
    shared: HashMap<usize, usize>,
}

/// How a chunk of the new version goes.
#[derive(Clone, Copy, PartialEq)]
enum How {
    /// A chunk of the base (in a page both hold, or by short id and length), by its index
    /// there.
    Base,
    /// A chunk the server holds (Have said so, or it went earlier in this batch).
    Held,
    /// As data.
    Data,
}

/// A file of a batch and what is known of it.
struct Chunked {
    file: File,
    recipe: Recipe,
    oid: Oid,
    offsets: Vec<u64>,
    /// The pages of the new version: (first chunk, chunks, key).
    pages: Vec<(usize, usize, u64)>,
    base_ask: Option<u32>,
    /// Have and GetKeys went with the GetRecipe (a file of few chunks).
    asked_all: bool,
    base: Option<BaseView>,
    /// Have requests: (request id, the new chunks asked about).
    have_asks: Vec<(u32, Vec<usize>)>,
    keys_ask: Option<u32>,
    keys: Option<Keys>,
    /// Old chunks the cache here holds that the new version dropped: (base index, id).
    held_olds: Vec<(usize, Id)>,
    how: Vec<How>,
    /// A small file's bytes.
    small: Option<Vec<u8>>,
}

/// Uploads a batch of files (see the module documentation). Returns the server's attributes of
/// each file committed. `after` goes right after the commits, in their round trip (again after
/// any file sent again whole): its replies are left in `pending`.
pub(crate) fn put_files<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    jobs: Vec<PutJob>,
    pending: &mut Vec<u32>,
    after: &[Request],
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
) -> Result<Vec<Attr>, GetError> {
    if let Some(cache) = opts.cache {
        // Over a fast link, compressing what the cache keeps would hold the upload up.
        cache.prefer_speed(crate::delta::fast_link(
            conn.link_rate().unwrap_or(0),
            conn.round_trip(),
        ));
    }
    let mut files = Vec::with_capacity(jobs.len());
    for j in &jobs {
        files.push(chunk_file(conn, j, opts)?);
    }
    conn.flush()?;
    // Step 2: what the server holds, and keys of the old data.
    for (j, c) in jobs.iter().zip(&mut files) {
        if let Some(id) = c.base_ask.take() {
            c.base = Some(base_view(conn.replies(id)?, c, j)?);
            plan_against_base(conn, j, c, opts)?;
        }
    }
    conn.flush()?;
    // By short id, as Have asks (8 bytes a chunk: a 10 GiB file has over a million).
    let mut sent: HashSet<u64> = HashSet::new();
    let last = files.len().saturating_sub(1);
    for (n, c) in files.iter_mut().enumerate() {
        take_haves(conn, c, &sent)?;
        if let Some(id) = c.keys_ask.take() {
            c.keys = match conn.replies(id)?.pop() {
                Some(Reply::Keys(k)) => Some(Keys::new(k.keys, k.key_bytes as usize, k.runs)),
                other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
            };
        }
        // A chunk sent for an earlier file of the batch is held by the time this one's write
        // arrives. (A short id shared by two chunks makes the server miss one: the file is
        // then sent again whole, below.)
        for (k, ch) in c.recipe.chunks().iter().enumerate() {
            if c.how[k] != How::Data {
                continue;
            }
            let short = short_id(&ch.id);
            if sent.contains(&short) {
                c.how[k] = How::Held;
            } else if n < last {
                sent.insert(short);
            }
        }
    }
    // Step 3: the writes and commits.
    let mut stream = Stream::default();
    let mut level = FrameLevel::new(crate::delta::frame_floor(crate::conn::DEFAULT_ZSTD_LEVEL));
    // Only whether the link is near says anything of the way up: the rate measured is down.
    level.link_rate(0, 0, conn.round_trip());
    for (n, (j, c)) in jobs.iter().zip(&files).enumerate() {
        write_file(conn, &mut stream, n, j, c, &mut level, opts, stats)?;
    }
    let mut after_ids = vec![];
    for r in after {
        after_ids.push(conn.send(r.clone())?);
    }
    let stat_after = match &opts.stat_after {
        Some(p) => Some(conn.send(Request::GetAttr { path: p.clone() })?),
        None => None,
    };
    let deferred = conn.offers(ferry_proto::FEATURE_DEFERRED_SYNC)?;
    let sync = match opts.sync_after && deferred {
        true => Some(conn.send(Request::Sync)?),
        false => None,
    };
    // Directories made earlier come first: a failed one explains the commits that follow.
    check(conn, pending)?;
    let results = stream.drain(conn, files.len())?;
    pending.extend(after_ids);
    if let Some(id) = stat_after {
        stats.stat_after = match conn.replies(id) {
            Ok(mut r) => match r.pop() {
                Some(Reply::Attr(a)) => Some(a),
                other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
            },
            Err(ConnError::Remote { .. }) => None,
            Err(e) => return Err(e.into()),
        };
    }
    if let Some(id) = sync {
        conn.replies(id)?;
    }
    // Without deferred syncs every change was durable before its reply.
    stats.synced = opts.sync_after;
    let mut attrs = Vec::with_capacity(files.len());
    let mut again = vec![];
    for ((j, c), r) in jobs.into_iter().zip(files).zip(results) {
        match r {
            Ok(a) => {
                stats.files += 1;
                stats.bytes += c.recipe.total_len();
                stats.chunks += c.recipe.len() as u64;
                if let Some(p) = opts.progress {
                    p(c.recipe.total_len());
                }
                if opts.fewer_round_trips {
                    stats.last_recipe = Some(std::sync::Arc::new(c.recipe));
                }
                attrs.push(a);
            }
            // A reference the server could not follow (a short id that led elsewhere, a chunk
            // gone from its store since Have): the file again, all of it as data.
            Err(ConnError::Remote {
                code: ErrorCode::MissingChunks,
                message,
            }) if !c.how.iter().all(|h| *h == How::Data) => {
                tracing::warn!("{message}; sending {} whole", j.local.display());
                again.push(j);
            }
            Err(e) => return Err(e.into()),
        }
    }
    if !again.is_empty() {
        // Asked before these commits: out of date after them.
        stats.stat_after = None;
        stats.synced = opts.sync_after && !deferred;
    }
    let sent_again = !again.is_empty();
    for j in again {
        let c = chunk_file_plain(&j, opts)?;
        let mut stream = Stream::default();
        write_file(conn, &mut stream, 0, &j, &c, &mut level, opts, stats)?;
        match stream.drain(conn, 1)?.pop() {
            Some(Ok(a)) => {
                stats.files += 1;
                stats.bytes += c.recipe.total_len();
                stats.chunks += c.recipe.len() as u64;
                if opts.fewer_round_trips {
                    stats.last_recipe = Some(std::sync::Arc::new(c.recipe));
                }
                attrs.push(a);
            }
            Some(Err(e)) => return Err(e.into()),
            None => return Err(ConnError::Unexpected("no commit reply".into()).into()),
        }
    }
    if sent_again {
        for r in after {
            pending.push(conn.send(r.clone())?);
        }
    }
    Ok(attrs)
}

/// Step 1 for one file: chunks it, and asks what this kind of file needs first.
fn chunk_file<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    j: &PutJob,
    opts: &PutOptions<'_>,
) -> Result<Chunked, GetError> {
    let mut c = chunk_file_plain(j, opts)?;
    if c.small.is_some() {
        return Ok(c);
    }
    c.how = vec![How::Data; c.recipe.len()];
    if let (Some(version), Some(known), false) = (j.if_version, &j.base_recipe, j.base_empty) {
        // The base's recipe known: every chunk of it goes by reference, the rest as data
        // against it, with nothing asked (Have and GetKeys left out: one round trip).
        let mut v = BaseView {
            version,
            chunks: known
                .chunks()
                .iter()
                .map(|ch| (ch.len, short_id(&ch.id)))
                .collect(),
            by_short: HashMap::new(),
            known_pages: HashSet::new(),
            shared: HashMap::new(),
        };
        for (i, &(_, s)) in v.chunks.iter().enumerate() {
            v.by_short.entry(s).or_insert(i);
        }
        c.base = Some(v);
        c.asked_all = true;
        plan_against_base(conn, j, &mut c, opts)?;
    } else if j.if_version.is_some() && !j.base_empty {
        // The version being replaced: its recipe, against the new version's pages.
        let known = match c.pages.len() {
            0 | 1 => vec![],
            _ => c.pages.iter().map(|p| p.2).collect(),
        };
        c.base_ask = Some(conn.send(Request::GetRecipe {
            target: Target::Path(j.remote.clone()),
            short: true,
            known,
        })?);
        if opts.fewer_round_trips && c.recipe.len() <= ONE_ASK_CHUNKS {
            let all: Vec<usize> = (0..c.recipe.len()).collect();
            let shorts = c.recipe.chunks().iter().map(|ch| short_id(&ch.id));
            c.keys_ask = Some(conn.send(Request::GetKeys {
                path: j.remote.clone(),
                version: None,
                olds: KeyOlds::Except(shorts.collect()),
                new_bytes: c.recipe.total_len(),
            })?);
            ask_have(conn, &mut c, all)?;
            c.asked_all = true;
        }
    } else {
        let all = (0..c.recipe.len()).collect();
        ask_have(conn, &mut c, all)?;
    }
    Ok(c)
}

/// Files this large or larger are chunked on two threads (smaller ones fit in the one 1 MiB
/// batch the reading thread hands over: the two would never overlap).
const PARALLEL_FROM: u64 = 1 << 20;

/// A file chunked, with nothing asked: everything goes as data.
fn chunk_file_plain(j: &PutJob, opts: &PutOptions<'_>) -> Result<Chunked, GetError> {
    let file = File::open(&j.local).map_err(GetError::local("open", &j.local))?;
    let new = j.if_version.is_none() || j.base_empty;
    let mut small = j.meta.len() < SMALL_FILE
        && (j.if_version.is_none() || j.meta.len() < SMALL_AGAINST || opts.fewer_round_trips);
    let new_small = !small && opts.fewer_round_trips && new && j.meta.len() < NEW_SMALL_FILE;
    let cache = opts
        .cache
        .filter(|_| opts.fewer_round_trips && j.meta.len() < KEEP_CHUNKS_UNDER);
    let mut bytes = vec![];
    // Whether the cache held a chunk of it before (it came from the server, or went there).
    let mut was_held = false;
    let keep = |c: &ferry_format::ChunkRef, data: &[u8]| {
        if small || new_small {
            bytes.extend_from_slice(data);
        }
        if let Some(cache) = cache {
            // (A chunk that cannot be kept costs only compression later.)
            match cache.put(&ferry_store::VerifiedChunk::assume_verified(c.id, data)) {
                Ok(added) => was_held |= !added,
                Err(e) => tracing::debug!("keeping a chunk in the cache: {e}"),
            }
        }
        Ok::<_, io::Error>(())
    };
    // For the small files of a bulk copy, starting a thread cost more than the chunking.
    let (recipe, oid) = if j.meta.len() < PARALLEL_FROM {
        ferry_format::chunk_object(&file, &opts.chunker, HashAlg::Blake3, keep)
    } else {
        ferry_format::chunk_object_parallel(&file, &opts.chunker, HashAlg::Blake3, keep)
    }
    .map_err(GetError::local("read", &j.local))?;
    if new_small {
        let held = |c: &ferry_format::ChunkRef| {
            opts.cache
                .is_some_and(|cache| cache.contains(&c.id).unwrap_or(true))
        };
        small = match cache {
            Some(_) => !was_held,
            None => !recipe.chunks().iter().any(held),
        };
    }
    let offsets = recipe.with_offsets().map(|(o, _)| o).collect();
    let mut pages = vec![];
    let mut at = 0;
    for p in recipe.pages() {
        pages.push((at, p.len(), ferry_format::page_key(p)));
        at += p.len();
    }
    Ok(Chunked {
        file,
        how: vec![How::Data; recipe.len()],
        recipe,
        oid,
        offsets,
        pages,
        base_ask: None,
        asked_all: false,
        base: None,
        have_asks: vec![],
        keys_ask: None,
        keys: None,
        held_olds: vec![],
        small: small.then_some(bytes),
    })
}

/// Asks which of the new chunks `which` (each distinct id once) the server holds.
fn ask_have<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    c: &mut Chunked,
    which: Vec<usize>,
) -> Result<(), GetError> {
    let mut seen = HashSet::new();
    let which: Vec<usize> = which
        .into_iter()
        .filter(|&k| seen.insert(short_id(&c.recipe.chunks()[k].id)))
        .collect();
    drop(seen);
    for page in which.chunks(HAVE_IDS) {
        let ids = page.iter().map(|&k| short_id(&c.recipe.chunks()[k].id));
        let id = conn.send(Request::Have {
            ids: Ids::Short(ids.collect()),
        })?;
        c.have_asks.push((id, page.to_vec()));
    }
    Ok(())
}

/// Takes the Have replies of a file: chunks the server holds go by reference.
fn take_haves<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    c: &mut Chunked,
    sent: &HashSet<u64>,
) -> Result<(), GetError> {
    let mut held = HashSet::new();
    for (id, asked) in std::mem::take(&mut c.have_asks) {
        match conn.replies(id)?.pop() {
            Some(Reply::Have(flags)) if flags.len() == asked.len() => {
                for (k, have) in asked.into_iter().zip(flags) {
                    if have {
                        held.insert(short_id(&c.recipe.chunks()[k].id));
                    }
                }
            }
            other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
        }
    }
    for (k, ch) in c.recipe.chunks().iter().enumerate() {
        let short = short_id(&ch.id);
        if c.how[k] == How::Data && (held.contains(&short) || sent.contains(&short)) {
            c.how[k] = How::Held;
        }
    }
    Ok(())
}

/// The server's recipe of the version replaced, as sent against the new version's pages.
fn base_view(replies: Vec<Reply>, c: &Chunked, j: &PutJob) -> Result<BaseView, GetError> {
    let bad = |why: &str| GetError::from(ConnError::Unexpected(format!("{:?}: {why}", j.remote)));
    let max_chunks = j.meta.len().max(64 << 20) / ferry_chunk::MIN_CHUNK_LIMIT as u64;
    let mut v = BaseView {
        version: 0,
        chunks: vec![],
        by_short: HashMap::new(),
        known_pages: HashSet::new(),
        shared: HashMap::new(),
    };
    for r in replies {
        let Reply::Recipe(d) = r else {
            return Err(bad("not a recipe"));
        };
        if d.total_chunks > max_chunks.max(c.recipe.len() as u64 * 4) {
            return Err(bad("a recipe of more chunks than the file's size allows"));
        }
        v.version = d.version;
        for part in d.parts {
            match part {
                RecipePart::Known(i) => {
                    let &(first, n, _) = c
                        .pages
                        .get(i as usize)
                        .ok_or_else(|| bad("a page never named"))?;
                    v.known_pages.insert(i as usize);
                    for k in first..first + n {
                        let ch = c.recipe.chunks()[k];
                        v.shared.insert(k, v.chunks.len());
                        v.chunks.push((ch.len, short_id(&ch.id)));
                    }
                }
                RecipePart::Chunks(cs) => v
                    .chunks
                    .extend(cs.iter().map(|ch| (ch.len, short_id(&ch.id)))),
                RecipePart::Short(cs) => v.chunks.extend(cs),
            }
            if v.chunks.len() as u64 > d.total_chunks {
                return Err(bad("a recipe longer than announced"));
            }
        }
    }
    if j.if_version.is_some_and(|want| want != v.version) {
        return Err(ConnError::Remote {
            code: ErrorCode::Conflict,
            message: format!("{:?} changed since version {:?}", j.remote, j.if_version),
        }
        .into());
    }
    for (i, &(_, s)) in v.chunks.iter().enumerate() {
        v.by_short.entry(s).or_insert(i);
    }
    Ok(v)
}

/// Step 2 for a file replacing a version: how each new chunk goes, and what to ask of the
/// server (Have for the new chunks, GetKeys for the old data the new version dropped that the
/// cache here does not hold).
fn plan_against_base<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    j: &PutJob,
    c: &mut Chunked,
    opts: &PutOptions<'_>,
) -> Result<(), GetError> {
    let base = c.base.as_mut().expect("a base");
    let mut fresh = vec![];
    for (p, &(first, n, _)) in c.pages.iter().enumerate() {
        for k in first..first + n {
            let ch = c.recipe.chunks()[k];
            c.how[k] = if base.known_pages.contains(&p) {
                How::Base
            } else if let Some(&b) = base
                .by_short
                .get(&short_id(&ch.id))
                .filter(|&&b| base.chunks[b].0 == ch.len)
            {
                base.shared.insert(k, b);
                How::Base
            } else {
                fresh.push(k);
                How::Data
            };
        }
    }
    if fresh.is_empty() {
        return Ok(());
    }
    let fresh_bytes: u64 = fresh.iter().map(|&k| c.recipe.chunks()[k].len as u64).sum();
    // Old chunks the new version dropped: named whole when the cache holds them (they came
    // from the server), else keyed by the server.
    let used: HashSet<u64> = c
        .recipe
        .chunks()
        .iter()
        .map(|ch| short_id(&ch.id))
        .collect();
    let (mut to_key, mut keyed_bytes, mut held_bytes) = (vec![], 0u64, 0u64);
    for (i, &(len, s)) in base.chunks.iter().enumerate() {
        if used.contains(&s) {
            continue;
        }
        let held = opts
            .cache
            .and_then(|cache| cache.find_prefix(s).ok().flatten());
        match held {
            Some(id) if held_bytes + len as u64 <= OLDS_BYTES => {
                c.held_olds.push((i, id));
                held_bytes += len as u64;
            }
            _ if keyed_bytes + (len as u64) <= crate::delta::MAX_PREFIX as u64 => {
                to_key.push(i as u32);
                keyed_bytes += len as u64;
            }
            _ => {}
        }
    }
    if c.asked_all {
        return Ok(());
    }
    // Keys cost a few bytes a piece of ~220: worth it unless the old data dwarfs the new.
    if !to_key.is_empty() && keyed_bytes / 220 * 4 <= fresh_bytes / 16 {
        c.keys_ask = Some(conn.send(Request::GetKeys {
            path: j.remote.clone(),
            version: Some(base.version),
            olds: KeyOlds::Indices(to_key),
            new_bytes: fresh_bytes,
        })?);
    }
    ask_have(conn, c, fresh)
}
