//! Chunks compressed against the old version of a file held here (`crate::delta`): the server
//! is told the keys of pieces of the old data the new version dropped, the old chunks its
//! history may hold, and the parts of the new version held here (the context); it sends the
//! missing chunks as one zstd frame against what both sides hold.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;

use ferry_format::{ChunkRef, Id, Recipe};
use ferry_proto::{
    short_id, Against, Chunks, Context, GetChunks, Ids, Payload, Reply, Request, WirePath,
};
use ferry_store::{ChunkStore, VerifiedChunk};

use super::local::LocalIndex;
use super::recipes::Shorts;
use super::{GetError, GetStats, Sources};
use crate::conn::{ConnError, Connection};

/// The old version of a file at the destination, cut into pieces that new chunks can be
/// compressed against (`crate::delta`): the parts of it the new recipe no longer uses.
pub(crate) struct AgainstOld {
    file: File,
    path: PathBuf,
    /// (offset, length) of each piece a key names.
    pieces: Vec<(u64, u32)>,
    keys: Vec<u64>,
    /// Bytes of each key on the wire.
    key_bytes: u8,
    /// Whether the keys count only in runs.
    runs: bool,
    /// The old chunks the new recipe dropped, in file order, with their offsets.
    olds: Vec<(ChunkRef, u64)>,
    /// The file's path on the server, for a context.
    remote: Option<WirePath>,
    /// The chunks of the new version held here: (offset in the new version, chunk, offset in
    /// the old file or `None` for one in the cache).
    held: Vec<Held>,
    /// Where each missing chunk first comes in the new version.
    missing_at: HashMap<Id, u64>,
    /// The most bytes of context a request names.
    context_budget: u64,
}

/// Bytes of context a file's requests may name whatever it holds (at level 19, ~20 ms).
const CONTEXT_FLOOR: u64 = 64 << 10;

/// A chunk of the new version held here: its offset there, itself, and its offset in the old
/// file (`None`: in the cache).
type Held = (u64, ChunkRef, Option<u64>);

impl AgainstOld {
    /// `None` when there is nothing old to compress against: no pieces or old chunks worth
    /// naming (naming them costs more than they could save), and no context (`remote`, the
    /// file's path on a server that takes one: the parts of the new version held here, in the
    /// old file or `cache`).
    pub(crate) fn new(
        j: &super::walk::FileJob,
        old: &LocalIndex,
        recipe: &Recipe,
        missing: &[ChunkRef],
        history: Option<&dyn ChunkStore>,
        remote: Option<WirePath>,
        cache: &dyn ChunkStore,
    ) -> Option<Self> {
        use std::os::unix::fs::FileExt;
        if missing.is_empty() || old.order.is_empty() {
            return None;
        }
        let used: std::collections::HashSet<Id> = recipe.chunks().iter().map(|c| c.id).collect();
        let file = j.open_old().ok().flatten()?;
        let mut a = AgainstOld {
            file,
            path: j.old().to_path_buf(),
            pieces: vec![],
            keys: vec![],
            key_bytes: *ferry_proto::KEY_BYTES.start(),
            runs: false,
            olds: vec![],
            remote,
            held: vec![],
            missing_at: HashMap::new(),
            context_budget: 0,
        };
        if a.remote.is_some() {
            let missing: std::collections::HashSet<Id> = missing.iter().map(|c| c.id).collect();
            let mut at = 0;
            for c in recipe.chunks() {
                if missing.contains(&c.id) {
                    a.missing_at.entry(c.id).or_insert(at);
                } else if let Some(&(off, _)) = old.at.get(&c.id) {
                    a.held.push((at, *c, Some(off)));
                } else if cache.contains(&c.id).unwrap_or(false) {
                    a.held.push((at, *c, None));
                }
                at += c.len as u64;
            }
        }
        // Old chunks this client fetched (they are in its cache) are in the server's history
        // unless it was trimmed since: those are named by id. The rest are cut into pieces,
        // each run of adjacent ones on its own, as the server cuts each run of new ones.
        let mut runs: Vec<(u64, u64)> = vec![];
        let (mut offset, mut dropped) = (0u64, 0u64);
        for c in &old.order {
            if !used.contains(&c.id) {
                dropped += c.len as u64;
                if history.is_some_and(|cache| cache.contains(&c.id).unwrap_or(false)) {
                    a.olds.push((*c, offset));
                } else {
                    match runs.last_mut() {
                        Some(r) if r.1 == offset => r.1 += c.len as u64,
                        _ => runs.push((offset, offset + c.len as u64)),
                    }
                }
            }
            offset += c.len as u64;
        }
        let mut buf = vec![];
        let mut sample = crate::delta::Compressibility::default();
        for (start, end) in runs {
            buf.resize((end - start) as usize, 0);
            a.file.read_exact_at(&mut buf, start).ok()?;
            sample.sample(&buf);
            for r in crate::delta::pieces(&buf) {
                a.keys.push(crate::delta::piece_key(&buf[r.clone()], 8));
                a.pieces.push((start + r.start as u64, r.len() as u32));
            }
        }
        let bytes: u64 = missing.iter().map(|c| c.len as u64).sum();
        // A context pays for data with no old counterpart (appended, inserted: what the
        // missing chunks hold beyond the dropped old ones); for data edited in place, the
        // old pieces already give the text around it, and a large context would only cost
        // the server time (measured: mbox-append 66,983 → 45,076 bytes; the trees of code
        // within 0.5 %, numpy-whl-tree's machine code 0.1 %). A little always helps a little.
        let net = bytes.saturating_sub(dropped);
        a.context_budget = (net * 16 + CONTEXT_FLOOR).min(ferry_proto::MAX_CONTEXT);
        // Keys as short as the pieces at hand allow (the new ones counted as one per 256 bytes
        // of a request; pieces average ~220, so the odds of a false match are ~1.15 in 1,000
        // rather than 1). Old data that hardly compresses meets new data in long runs or not
        // at all: there, keys count only in runs, and are shorter.
        a.runs = sample.incompressible();
        let new = bytes.min(crate::delta::MAX_DATA as u64) as usize / 256;
        a.key_bytes = crate::delta::key_bytes(a.keys.len(), new, a.runs);
        let mask = u64::MAX >> (64 - 8 * a.key_bytes as u32);
        a.keys.iter_mut().for_each(|k| *k &= mask);
        // Keys cost their bytes and old ids 8 bytes a chunk, once: worth it unless the old
        // data dwarfs the new.
        let cost = a.keys.len() as u64 * a.key_bytes as u64 + a.olds.len() as u64 * 8;
        let worth = !(a.keys.is_empty() && a.olds.is_empty()) && cost <= bytes / 16;
        if !worth {
            (a.keys, a.pieces, a.olds) = (vec![], vec![], vec![]);
        }
        (worth || !a.held.is_empty()).then_some(a)
    }

    /// Over a fast link the context is kept to [`CONTEXT_FLOOR`]: the bytes a large one saves
    /// take less time than it costs both sides (the server reads it and loads it into its
    /// compressor, this side gathers it to decode). mbox-append's fetch through a local pipe,
    /// 4 MiB of context against 64 KiB: 76.7 against 88.6 KiB in all, and 283 against 267 ms
    /// (medians of 20, in turn).
    pub(crate) fn fast_link(&mut self) {
        self.context_budget = self.context_budget.min(CONTEXT_FLOOR);
    }

    /// The held chunks to name as the context of the request for `group`: the nearest to it
    /// in the new version, up to 16 times its bytes and the file's budget, in file order (none
    /// when the server takes no context: then nothing is held).
    fn context_for(&self, group: &[ChunkRef]) -> Vec<Held> {
        let spans = group.iter().filter_map(|c| {
            let at = *self.missing_at.get(&c.id)?;
            Some((at, at + c.len as u64))
        });
        let (start, end) = spans.fold((u64::MAX, 0), |(s, e), (a, b)| (s.min(a), e.max(b)));
        let bytes: u64 = group.iter().map(|c| c.len as u64).sum();
        let budget = (bytes * 16).min(self.context_budget);
        let distance = |&(at, c, _): &Held| {
            if at + c.len as u64 <= start {
                start - at - c.len as u64
            } else {
                at.saturating_sub(end)
            }
        };
        let mut near = self.held.clone();
        near.sort_by_key(distance);
        let mut total = 0;
        near.retain(|(_, c, _)| {
            total += c.len as u64;
            total <= budget
        });
        near.sort_by_key(|h| h.0);
        near
    }

    /// The context that names the held chunks `held` (in file order), as merged ranges;
    /// `None` when there are none.
    fn context(&self, held: &[Held]) -> Option<Context> {
        let path = self.remote.as_ref().filter(|_| !held.is_empty())?;
        let mut ranges: Vec<(u64, u64)> = vec![];
        for (at, c, _) in held {
            match ranges.last_mut() {
                Some(r) if r.0 + r.1 == *at => r.1 += c.len as u64,
                _ => ranges.push((*at, c.len as u64)),
            }
        }
        Some(Context {
            path: path.clone(),
            ranges,
        })
    }

    /// The bytes of the held chunks `held`, concatenated, from the old file or the cache.
    fn held_bytes(&self, held: &[Held], cache: &dyn ChunkStore) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut out = vec![];
        for (_, c, old) in held {
            match old {
                Some(off) => {
                    let at = out.len();
                    out.resize(at + c.len as usize, 0);
                    self.file.read_exact_at(&mut out[at..], *off)?;
                }
                None => match cache.get(&c.id) {
                    Ok(Some(d)) => out.extend_from_slice(&d),
                    _ => return Err(io::Error::other(format!("chunk {} left the cache", c.id))),
                },
            }
        }
        Ok(out)
    }

    /// The old chunks to name with the request for `group` (the missing chunks from index
    /// `at` on): those around the same place in the old file, at most `OLDS_BYTES` of them
    /// (all of them for most files).
    fn olds_for(&self, missing: &[ChunkRef], at: usize, group: usize) -> &[(ChunkRef, u64)] {
        const OLDS_BYTES: u64 = 8 << 20;
        let total: u64 = self.olds.iter().map(|(c, _)| c.len as u64).sum();
        if total <= OLDS_BYTES {
            return &self.olds;
        }
        let before: u64 = missing[..at].iter().map(|c| c.len as u64).sum();
        let new_total: u64 = missing.iter().map(|c| c.len as u64).sum::<u64>().max(1);
        let middle = before
            + missing[at..at + group]
                .iter()
                .map(|c| c.len as u64)
                .sum::<u64>()
                / 2;
        // The same fraction of the way through the old data, with OLDS_BYTES around it.
        let centre = (middle as u128 * total as u128 / new_total as u128) as u64;
        let lo = centre
            .saturating_sub(OLDS_BYTES / 2)
            .min(total - OLDS_BYTES);
        let (mut start, mut end, mut acc) = (self.olds.len(), self.olds.len(), 0u64);
        for (i, (c, _)) in self.olds.iter().enumerate() {
            if acc >= lo && start == self.olds.len() {
                start = i;
            }
            acc += c.len as u64;
            if acc > lo + OLDS_BYTES {
                end = i;
                break;
            }
        }
        &self.olds[start.min(end)..end]
    }

    /// The old chunks `olds` names (indices into `sent`) followed by the pieces `refs` names,
    /// concatenated: the prefix the server compressed against.
    fn prefix(&self, sent: &[(ChunkRef, u64)], olds: &[u32], refs: &[u32]) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let olds = olds.iter().map(|&i| {
            sent.get(i as usize)
                .map(|(c, off)| (*off, c.len))
                .ok_or_else(|| bad("no such old chunk"))
        });
        let pieces = refs.iter().map(|&i| {
            self.pieces
                .get(i as usize)
                .copied()
                .ok_or_else(|| bad("no such piece"))
        });
        let mut out = vec![];
        for range in olds.chain(pieces) {
            let (off, len) = range?;
            let at = out.len();
            // A server naming pieces over and over cannot make this grow without bound.
            if at + len as usize > crate::delta::MAX_PREFIX {
                return Err(bad("prefix too long"));
            }
            out.resize(at + len as usize, 0);
            self.file.read_exact_at(&mut out[at..], off)?;
        }
        Ok(out)
    }
}

/// Splits `chunks` into runs of at most `max` bytes (or one chunk).
pub(crate) fn groups(chunks: &[ChunkRef], max: usize) -> Vec<&[ChunkRef]> {
    let mut out = vec![];
    let (mut start, mut bytes) = (0, 0);
    for (i, c) in chunks.iter().enumerate() {
        if i > start && bytes + c.len as usize > max {
            out.push(&chunks[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += c.len as usize;
    }
    if start < chunks.len() {
        out.push(&chunks[start..]);
    }
    out
}

/// Fetches the missing chunks of files with an old version here, compressed against it, all
/// requests of the batch at once. Returns the chunks that did not arrive that way (to fetch
/// plainly): none, unless the server lacked some or a piece's key collided.
pub(crate) fn fetch_against<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    files: Vec<(AgainstOld, Vec<ChunkRef>)>,
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: &mut HashSet<Id>,
    shorts: &mut Shorts,
) -> Result<Vec<ChunkRef>, GetError> {
    let history = conn.offers(ferry_proto::FEATURE_HISTORY)?;
    let mut sent = vec![];
    for (i, (a, missing)) in files.iter().enumerate() {
        let mut at = 0;
        for (n, group) in groups(missing, crate::delta::MAX_DATA)
            .into_iter()
            .enumerate()
        {
            // A file's keys travel once: the server keeps them for the requests that follow.
            let keys = (n == 0).then(|| a.keys.clone());
            let olds = a.olds_for(missing, at, group.len());
            at += group.len();
            // Olds are named even when empty when the server keeps a history: a list left out
            // is the previous request's.
            let held = a.context_for(group);
            let id = conn.send(Request::GetChunks(GetChunks {
                ids: Ids::Short(group.iter().map(|c| short_id(&c.id)).collect()),
                at: None,
                against: Some(Against {
                    key_bytes: a.key_bytes,
                    runs: a.runs,
                    keys,
                    olds: history.then(|| olds.iter().map(|(c, _)| short_id(&c.id)).collect()),
                    context: a.context(&held),
                }),
            }))?;
            sent.push((id, i, group, olds, held));
        }
    }
    conn.flush()?;
    let mut plain = vec![];
    for (id, i, asked, sent_olds, held) in sent {
        let a = &files[i].0;
        let mut stored = HashSet::new();
        let mut store = |cid: Id, bytes: &[u8], against: bool| -> Result<(), GetError> {
            // A placeholder's chunk is what has its short id.
            let v = match shorts.open.contains_key(&cid) {
                true => shorts.arrived(cid, bytes),
                false => VerifiedChunk::check(cid, bytes).ok(),
            };
            // Wrong bytes from a collided piece key are no lie: those chunks are fetched
            // plainly.
            if let Some(v) = v {
                src.cache.put(&v)?;
                stored.insert(cid);
                fetched.insert(*v.id());
                stats.from_server += 1;
                stats.against_old += against as u64;
                stats.bytes_from_server += bytes.len() as u64;
            }
            Ok(())
        };
        let Some(Reply::Chunks(Chunks { found, payload })) = conn.replies(id)?.pop() else {
            return Err(
                ConnError::Unexpected("chunks against old data: another reply".into()).into(),
            );
        };
        let places = found_places(&found, asked.len())?;
        if !places.is_empty() {
            let total = places.iter().map(|&p| asked[p].len as usize).sum();
            let against = matches!(payload, Payload::Frame { .. });
            let bytes = match payload {
                Payload::Frame {
                    context,
                    olds,
                    refs,
                    data,
                } => {
                    let head = match context {
                        true => a.held_bytes(&held, src.cache),
                        false => Ok(vec![]),
                    };
                    head.and_then(|mut prefix| {
                        prefix.extend(a.prefix(sent_olds, &olds, &refs)?);
                        crate::delta::decode(&data, &prefix, total)
                    })
                }
                Payload::Plain(data) if data.len() == total => Ok(data),
                Payload::Plain(data) => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} bytes where {total} were expected", data.len()),
                )),
            };
            match bytes {
                Ok(data) => {
                    let mut at = 0;
                    for p in places {
                        let len = asked[p].len as usize;
                        store(asked[p].id, &data[at..at + len], against)?;
                        at += len;
                    }
                }
                Err(e) => tracing::warn!(
                    "chunks of {} compressed against the old file: {e}; fetching them plainly",
                    a.path.display()
                ),
            }
        }
        plain.extend(asked.iter().filter(|c| !stored.contains(&c.id)).copied());
    }
    src.cache.flush()?;
    Ok(plain)
}

/// The places in a request of `asked` chunks that a Chunks reply names: increasing (so each at
/// most once, and what is decompressed stays within what was asked), all within the request.
pub(crate) fn found_places(found: &[u32], asked: usize) -> Result<Vec<usize>, GetError> {
    let increasing = found.windows(2).all(|w| w[0] < w[1]);
    if !increasing || found.last().is_some_and(|&i| i as usize >= asked) {
        return Err(
            ConnError::Unexpected("a chunks reply naming places never asked for".into()).into(),
        );
    }
    Ok(found.iter().map(|&i| i as usize).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_format::HashAlg;

    #[test]
    fn a_prefix_of_repeated_pieces_is_bounded() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("old");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let a = AgainstOld {
            file: File::open(&path).unwrap(),
            path,
            pieces: vec![(0, 8192)],
            keys: vec![1],
            key_bytes: 5,
            runs: false,
            olds: vec![],
            remote: None,
            held: vec![],
            missing_at: HashMap::new(),
            context_budget: 0,
        };
        assert_eq!(a.prefix(&[], &[], &[0, 0]).unwrap().len(), 16384);
        // A million references to one 8 KiB piece would be 8 GiB: refused instead.
        assert!(a.prefix(&[], &[], &vec![0; 1 << 20]).is_err());
        assert!(a.prefix(&[], &[], &[1]).is_err(), "no such piece");
        // Likewise old chunks named over and over, or ones never sent.
        let old = ChunkRef {
            id: Id::from_parts(HashAlg::Blake3, [1; 32]),
            len: 8192,
        };
        assert_eq!(a.prefix(&[(old, 0)], &[0], &[0]).unwrap().len(), 16384);
        assert!(a.prefix(&[(old, 0)], &vec![0; 1 << 20], &[]).is_err());
        assert!(
            a.prefix(&[(old, 0)], &[1], &[]).is_err(),
            "no such old chunk"
        );
    }
}
