//! What a receiver asks of this server: recipes, chunks (plainly, at the places it names, or
//! compressed against what it holds), whole files, and ranges.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::fs::FileExt;

use ferry_format::{chunk_object, Id, Oid, Recipe};
use ferry_proto::{
    Against, Chunks, Context, ErrorCode, FileKind, Frame, GetChunks, Ids, Located, Message,
    Payload, RecipeDelta, RecipePart, Reply, Target, WirePath,
};

use super::listing::more;
use super::ranges::target_path;
use super::{error, io_error, keep, Server};
use crate::delta::{FrameLevel, Keys};

/// Chunks per recipe reply frame.
const RECIPE_PAGE: usize = 4096;
/// Chunk bytes per plain Chunks frame, and the most one GetChunks is answered with: the rest of
/// what it asked for is not found this time (the client asks again), so a request naming one
/// large chunk a hundred thousand times costs the server 16 MiB, not gigabytes.
const CHUNKS_FRAME_BYTES: usize = 1 << 20;
const MAX_CHUNKS_REPLY: usize = 16 << 20;
/// Old chunks named by short ids that a request may look up in the history.
const MAX_OLDS: usize = 8192;

/// What chunk requests against old data leave for the next one: the receiver's piece keys and
/// old chunks (a request may leave either out to mean "the previous request's"), and the level
/// of large frames.
pub(crate) struct AgainstState {
    pub(crate) level: FrameLevel,
    keys: Keys,
    /// The old chunks last named; `None` for a short id the history knows no chunk by.
    olds: Vec<Option<Id>>,
}

impl AgainstState {
    pub(crate) fn new(floor: i32) -> Self {
        AgainstState {
            level: FrameLevel::new(floor),
            keys: Keys::default(),
            olds: vec![],
        }
    }
}

impl Server {
    /// The recipe, version and object id of the file at `path`, from the cache when the file
    /// has not changed. The chunks of a file the history keeps go into it as they are cut.
    pub(super) fn recipe(&mut self, path: &WirePath) -> io::Result<(Recipe, u64, Oid)> {
        for _ in 0..3 {
            let file = self.export.open_file(path)?;
            let _lock = crate::inplace::read_guard(&self.export, &file)?;
            let st = rustix::fs::fstat(&file)?;
            let (attr, fid) = crate::export::attr_of(&st);
            if attr.kind != FileKind::File {
                return Err(io::Error::from(io::ErrorKind::IsADirectory));
            }
            if let Some((r, oid)) = self.recipes.get(&fid) {
                return Ok((r.clone(), attr.version, *oid));
            }
            // Cut by an earlier session: not again, unless the history lost it (a cut keeps
            // what clients may hold old versions of).
            let history = self.history_for(attr.size);
            if let Some((r, oid)) = self.indexed(path, &fid) {
                let kept = |h: &super::history::History| {
                    r.chunks()
                        .first()
                        .is_none_or(|c| h.settled_for([&c.id]).contains(&c.id).unwrap_or(false))
                };
                if history.is_none_or(kept) {
                    self.remember(path, fid, r.clone(), oid);
                    return Ok((r, attr.version, oid));
                }
            }
            let (recipe, oid) = chunk_object(&file, &self.opts.chunker, self.opts.hash, |c, d| {
                keep(history, c.id, d);
                Ok::<_, io::Error>(())
            })?;
            // A file that changed while it was read gives a recipe of neither version: again.
            let (_, after) = crate::export::attr_of(&rustix::fs::fstat(&file)?);
            if after != fid {
                continue;
            }
            self.remember(path, fid, recipe.clone(), oid);
            return Ok((recipe, attr.version, oid));
        }
        Err(io::Error::other("the file keeps changing while it is read"))
    }

    /// The path a target names: itself, or where the object was last seen.
    pub(super) fn resolve(&self, target: &Target) -> io::Result<WirePath> {
        match target {
            Target::Path(p) => Ok(p.clone()),
            Target::Object(oid) => self
                .objects
                .get(oid)
                .cloned()
                .or_else(|| {
                    let p = self.index.as_ref()?.object(oid).ok()??;
                    WirePath::new(p).ok()
                })
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::NotFound, format!("no object {oid} here"))
                }),
        }
    }

    pub(super) fn get_recipe(
        &mut self,
        id: u32,
        target: &Target,
        short: bool,
        known: &[u64],
    ) -> Vec<Frame> {
        let got = self.resolve(target).and_then(|path| {
            let (recipe, version, oid) = self.recipe(&path)?;
            // An object asked for by id must still be that object.
            match target {
                Target::Object(want) if *want != oid.id() => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("object {want} is gone"),
                )),
                _ => Ok((recipe, version, oid)),
            }
        });
        match got {
            Ok((recipe, version, _)) => recipe_delta(id, &recipe, version, known, short),
            Err(e) => vec![Message::Reply(io_error(&target_path(target), &e)).to_frame(id)],
        }
    }

    pub(super) fn get_chunks(&mut self, id: u32, g: GetChunks) -> Vec<Frame> {
        let one = |r: Reply| vec![Message::Reply(r).to_frame(id)];
        let asked: Vec<Option<Id>> = match &g.ids {
            Ids::Full(ids) => ids.iter().copied().map(Some).collect(),
            Ids::Short(s) => s.iter().map(|s| self.by_short(*s)).collect(),
        };
        if let Some(against) = g.against {
            // (None: its frame is being compressed beside this thread.)
            return self.against(id, &asked, against).map_or(vec![], one);
        }
        let places = g.at.as_ref().map(places_of).unwrap_or_default();
        let mut open: HashMap<WirePath, Option<std::fs::File>> = HashMap::new();
        let mut found = vec![];
        for (i, cid) in asked.iter().enumerate() {
            let Some(cid) = cid else { continue };
            let located = places
                .get(i)
                .and_then(|p| p.as_ref())
                .and_then(|(t, off, len)| self.read_at(&mut open, t, *off, *len, cid));
            if let Some(bytes) = located.or_else(|| self.chunk(cid)) {
                found.push((i as u32, bytes));
            }
        }
        plain_chunk_frames(id, found.into_iter())
    }

    /// A chunk read where the client says it lies, verified; it is remembered there.
    fn read_at(
        &mut self,
        open: &mut HashMap<WirePath, Option<std::fs::File>>,
        target: &Target,
        offset: u64,
        len: u32,
        id: &Id,
    ) -> Option<Vec<u8>> {
        let path = self.resolve(target).ok()?;
        let file = open
            .entry(path.clone())
            .or_insert_with(|| self.export.open_file(&path).ok())
            .as_ref()?;
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, offset).ok()?;
        if !id.matches(&buf) {
            return None;
        }
        self.hint_one(&path, *id, offset, len);
        Some(buf)
    }

    /// The chunks `asked` (a reply's worth, in the order asked; `None` is one this server
    /// cannot name), compressed against the client's old data when that pays; `None` when the
    /// reply's frame is being compressed on a thread of its own (`self.frames.started`).
    fn against(&mut self, id: u32, asked: &[Option<Id>], a: Against) -> Option<Reply> {
        let runs = a.runs;
        if let Some(keys) = a.keys {
            self.against.keys = Keys::new(keys, a.key_bytes as usize, runs);
        }
        if let Some(olds) = a.olds {
            let mut budget = MAX_OLDS;
            self.against.olds = self.find_olds(&olds, &mut budget);
        }
        // What the file holds there now; if it cannot be read, no context.
        let context = a
            .context
            .and_then(|c| self.read_context(&c))
            .unwrap_or_default();
        match self.chunks_against(id, asked, context) {
            Ok(Some((found, payload))) => Some(Reply::Chunks(Chunks {
                found: found.into_iter().map(|i| i as u32).collect(),
                payload,
            })),
            Ok(None) => None,
            Err(e) => Some(error(ErrorCode::Io, format!("compressing: {e}"))),
        }
    }

    /// The chunks found and how they go; `None` when their frame went to a thread of its own.
    fn chunks_against(
        &mut self,
        id: u32,
        asked: &[Option<Id>],
        context: Vec<u8>,
    ) -> io::Result<Option<(Vec<usize>, Payload)>> {
        let mut found = vec![];
        let mut data = vec![];
        for (i, cid) in asked.iter().enumerate() {
            if let Some(d) = cid.and_then(|c| self.chunk(&c)) {
                if !found.is_empty() && data.len() + d.len() > crate::delta::MAX_REPLY_DATA {
                    break;
                }
                data.extend_from_slice(&d);
                found.push(i);
            }
        }
        if self.against.level.plain_is_better(&data) {
            return Ok(Some((found, Payload::Plain(data))));
        }
        // The old chunks the history still holds, whole, head the prefix.
        let olds = std::mem::take(&mut self.against.olds);
        let (old_refs, mut prefix, every_old) = self.olds_in_history(&olds);
        self.against.olds = olds;
        // Pieces of what the history lacks. Cut as one run: the client asks for a file's
        // missing chunks in file order, mostly side by side, and measured on the public
        // workloads one run matches more than cutting each chunk alone.
        let mut refs = vec![];
        if !every_old && !self.against.keys.is_empty() {
            let (r, pieces) = crate::delta::find([&data[..]], &self.against.keys);
            if prefix.len() + pieces.len() <= crate::delta::MAX_PREFIX {
                refs = r;
                prefix.extend_from_slice(&pieces);
            }
        }
        // Bytes of the file the client holds (the context) head it all. They count with the
        // data toward a large frame (whose level follows the link): the higher levels take
        // time in proportion to the prefix too (mbox-append, 247 KB against 4 MiB of context:
        // level 19 in ~1 s, level 9 in ~0.1 s).
        let with_context = !context.is_empty();
        let work = data.len() + context.len();
        if with_context {
            // (Not spliced in: that copies the context a byte at a time.)
            let mut head = context;
            head.extend_from_slice(&prefix);
            prefix = head;
        }
        if prefix.is_empty() {
            return Ok(Some((found, Payload::Plain(data))));
        }
        let named = super::frames::Prefix {
            context: with_context,
            olds: old_refs,
            refs,
        };
        if self.frames_aside() && work > crate::delta::SMALL_FRAME {
            // Compressed beside this thread, which goes on to the next request meanwhile.
            self.frames.make_room(&mut self.against.level);
            let w = super::frames::FrameWork {
                level: self.against.level.pick(work, &data),
                floor: self.against.level.floor(),
                data,
                prefix,
            };
            let found = found.into_iter().map(|i| i as u32).collect();
            let job = super::frames::FrameJob::start(id, found, named, work, w);
            self.frames.started = Some(job);
            return Ok(None);
        }
        let frame = crate::delta::worth_a_frame(&mut self.against.level, &data, &prefix, work)?;
        Ok(Some((found, named.payload(frame, data))))
    }

    /// The old chunks `olds` that the history holds (each once, at most
    /// [`crate::delta::MAX_PREFIX`] bytes in all): their indices, their bytes concatenated,
    /// and whether that is every one of them.
    fn olds_in_history(&self, olds: &[Option<Id>]) -> (Vec<u32>, Vec<u8>, bool) {
        let (mut used, mut prefix) = (vec![], vec![]);
        let asked = olds.iter().flatten();
        let Some(h) = self.history.as_ref().map(|h| h.settled_for(asked)) else {
            return (used, prefix, false);
        };
        let mut every = !olds.is_empty();
        let mut seen = HashSet::new();
        for (i, old) in olds.iter().enumerate() {
            let Some(old) = old else {
                every = false;
                continue;
            };
            if !seen.insert(*old) {
                continue;
            }
            match h.get(old) {
                Ok(Some(d)) if prefix.len() + d.len() <= crate::delta::MAX_PREFIX => {
                    used.push(i as u32);
                    prefix.extend_from_slice(&d);
                }
                _ => every = false,
            }
        }
        (used, prefix, every)
    }

    /// The chunks of the history that short ids name, by place. Each lookup reads a record's
    /// header, so a request looks up at most [`MAX_OLDS`] (`budget`, what is left of them):
    /// more than a prefix can hold (a client names at most 8 MiB of old chunks, of 2 KiB at
    /// least); the rest are `None`.
    fn find_olds(&self, short: &[u64], budget: &mut usize) -> Vec<Option<Id>> {
        let Some(h) = self.history.as_ref().map(|h| h.settled_for_short(short)) else {
            return vec![None; short.len()];
        };
        short
            .iter()
            .map(|&p| {
                *budget = budget.checked_sub(1)?;
                h.find_prefix(p).ok().flatten()
            })
            .collect()
    }

    /// The bytes a context names, read from the file as it is now; `None` if they cannot all
    /// be read (no context, then, and the reply says so). The decoder bounds their total.
    fn read_context(&self, c: &Context) -> Option<Vec<u8>> {
        let f = self.export.open_file(&c.path).ok()?;
        let mut out = vec![];
        for &(offset, len) in &c.ranges {
            let at = out.len();
            out.resize(at + len as usize, 0);
            f.read_exact_at(&mut out[at..], offset).ok()?;
        }
        Some(out)
    }

    /// Files whole, in one payload: plainly when the client holds nothing of them (the
    /// session's stream compresses them), else as one frame against the old chunks the
    /// history holds. Each file is cut (and kept in the history) so its id goes along. A file
    /// that cannot be read, or would pass the reply's bound, is left out (`None`).
    pub(super) fn read_files(&mut self, files: Vec<(WirePath, Vec<u64>)>) -> Reply {
        self.files_payload(files)
            .unwrap_or_else(|e| error(ErrorCode::Io, format!("reading files: {e}")))
    }

    fn files_payload(&mut self, files: Vec<(WirePath, Vec<u64>)>) -> io::Result<Reply> {
        let mut sent = Vec::with_capacity(files.len());
        let mut data = vec![];
        for (path, _) in &files {
            let left = ferry_proto::MAX_FILES_DATA - data.len() as u64;
            let Ok(bytes) = self.read_whole(path, left) else {
                sent.push(None);
                continue;
            };
            let history = self.history_for(bytes.len() as u64);
            let (_, oid) = chunk_object(&bytes[..], &self.opts.chunker, self.opts.hash, |c, d| {
                keep(history, c.id, d);
                Ok::<_, io::Error>(())
            })?;
            sent.push(Some((bytes.len() as u64, Some(oid.id()))));
            data.extend_from_slice(&bytes);
        }
        if files.iter().all(|(_, olds)| olds.is_empty()) {
            // Nothing rebuilt against old data: no id to check it by.
            let files = sent
                .into_iter()
                .map(|f| f.map(|(len, _)| (len, None)))
                .collect();
            return Ok(Reply::Files {
                files,
                payload: Payload::Plain(data),
            });
        }
        let mut budget = MAX_OLDS;
        let short: Vec<u64> = files.into_iter().flat_map(|(_, olds)| olds).collect();
        let olds = self.find_olds(&short, &mut budget);
        let (used, prefix, _) = self.olds_in_history(&olds);
        let frame = self.against.level.timed(data.len(), &data, |level| {
            crate::delta::encode(&data, &prefix, level)
        })?;
        Ok(Reply::Files {
            files: sent,
            payload: Payload::Frame {
                context: false,
                olds: used,
                refs: vec![],
                data: frame,
            },
        })
    }

    /// A regular file's bytes, whole, if it is at most `limit` bytes long.
    fn read_whole(&self, path: &WirePath, limit: u64) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let file = self.export.open_file(path)?;
        let _lock = crate::inplace::read_guard(&self.export, &file)?;
        let st = rustix::fs::fstat(&file)?;
        if crate::export::attr_of(&st).0.kind != FileKind::File {
            return Err(io::Error::from(io::ErrorKind::IsADirectory));
        }
        let mut data = Vec::with_capacity((st.st_size as u64).min(limit) as usize);
        file.take(limit + 1).read_to_end(&mut data)?;
        if data.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("over {limit} bytes: fetch it by recipe"),
            ));
        }
        Ok(data)
    }
}

/// Where each chunk of a GetChunks lies, by its place in the request.
fn places_of(at: &Located) -> Vec<Option<(Target, u64, u32)>> {
    at.runs
        .iter()
        .flat_map(|(t, places)| places.iter().map(move |&(o, l)| Some((t.clone(), o, l))))
        .collect()
}

/// A recipe as parts against the pages the client named: the pages it holds go as their
/// index in `known`, the rest in full (or by short id), at most [`RECIPE_PAGE`] chunks a frame.
fn recipe_delta(id: u32, recipe: &Recipe, version: u64, known: &[u64], short: bool) -> Vec<Frame> {
    let mut index = HashMap::with_capacity(known.len());
    for (i, k) in known.iter().enumerate() {
        index.entry(*k).or_insert(i as u32);
    }
    let mut frames: Vec<Vec<RecipePart>> = vec![vec![]];
    let mut in_frame = 0;
    for page in recipe.pages() {
        if in_frame + page.len() > RECIPE_PAGE {
            frames.push(vec![]);
            in_frame = 0;
        }
        let parts = frames.last_mut().expect("non-empty");
        let page_len = page.len();
        in_frame += match index.get(&ferry_format::page_key(page)) {
            Some(&i) => {
                parts.push(RecipePart::Known(i));
                1
            }
            None if short => {
                let page = page.iter().map(|c| (c.len, ferry_proto::short_id(&c.id)));
                match parts.last_mut() {
                    Some(RecipePart::Short(cs)) => cs.extend(page),
                    _ => parts.push(RecipePart::Short(page.collect())),
                }
                page_len
            }
            None => {
                match parts.last_mut() {
                    Some(RecipePart::Chunks(cs)) => cs.extend_from_slice(page),
                    _ => parts.push(RecipePart::Chunks(page.to_vec())),
                }
                page_len
            }
        };
    }
    let check = recipe.check();
    let mut frames: Vec<Frame> = frames
        .into_iter()
        .map(|parts| {
            Message::Reply(Reply::Recipe(RecipeDelta {
                version,
                total_chunks: recipe.len() as u64,
                check,
                alg: recipe.alg(),
                parts,
            }))
            .to_frame(id)
        })
        .collect();
    more(&mut frames);
    frames
}

/// Chunks found (their places in the request, increasing, with their bytes) as plain Chunks
/// replies of about a MiB each, at most [`MAX_CHUNKS_REPLY`] bytes in all (what does not fit is
/// left out: the asker asks again).
pub(super) fn plain_chunk_frames(
    id: u32,
    chunks: impl Iterator<Item = (u32, Vec<u8>)>,
) -> Vec<Frame> {
    let mut frames = vec![];
    let (mut found, mut data, mut total) = (vec![], vec![], 0usize);
    for (i, bytes) in chunks {
        if total + bytes.len() > MAX_CHUNKS_REPLY {
            break;
        }
        total += bytes.len();
        found.push(i);
        data.extend_from_slice(&bytes);
        if data.len() >= CHUNKS_FRAME_BYTES {
            let c = Chunks {
                found: std::mem::take(&mut found),
                payload: Payload::Plain(std::mem::take(&mut data)),
            };
            frames.push(Message::Reply(Reply::Chunks(c)).to_frame(id));
        }
    }
    if frames.is_empty() || !found.is_empty() {
        let c = Chunks {
            found,
            payload: Payload::Plain(data),
        };
        frames.push(Message::Reply(Reply::Chunks(c)).to_frame(id));
    }
    more(&mut frames);
    frames
}
