//! Fine file summaries: a version's content as a list of small keyed fingerprints (sub-blocks
//! of about 512 bytes, cut by a keyed content-defined chunker over the whole file). The client
//! keeps the summary of each version it writes, so its next update of that file can diff at
//! that grain and send only the bytes that changed, as new blocks that the tree's pieces
//! (the paper's §4.3 extension) place between ranges of the old blocks: an edit of a few bytes
//! no longer resends the ~8 KiB block around it.
//!
//! Summaries are the client's soft state (the paper's §3): kept beside the node cache, one file
//! per tree root, checked when read, and thrown away when unreadable or when no file of the
//! newest version has that root any more. Without one (another client wrote the old version,
//! or the cache was cleared) an update diffs whole blocks, as before, and keeps a summary of
//! what it wrote for next time.
//!
//! Summary file v1 (docs/formats.md, "Vault summary v1"), integers little-endian: magic
//! `FVSM`, version 1, the number of sub-blocks (u32), then per sub-block its length (u32) and
//! fingerprint (16 bytes), then BLAKE3 of everything before it (32 bytes).

use std::collections::HashSet;
use std::io::Read;
use std::path::PathBuf;

use ferry_chunk::{ChunkerSpec, Cutter, Key};

use crate::nodes::{cache_file, hex};
use crate::tree::{NodeId, Piece};
use crate::VaultError;

/// One sub-block: its length and keyed fingerprint (BLAKE3 keyed by a key of the vault, cut
/// to 128 bits: no one without the key can make two sub-blocks share one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sub {
    pub len: u32,
    pub fp: [u8; 16],
}

/// The sub-blocks of one version of a file, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    pub subs: Vec<Sub>,
}

impl Summary {
    pub fn bytes(&self) -> u64 {
        self.subs.iter().map(|s| s.len as u64).sum()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(9 + self.subs.len() * 20 + 32);
        out.extend_from_slice(b"FVSM\x01");
        out.extend_from_slice(&(self.subs.len() as u32).to_le_bytes());
        for s in &self.subs {
            out.extend_from_slice(&s.len.to_le_bytes());
            out.extend_from_slice(&s.fp);
        }
        let sum = *blake3::hash(&out).as_bytes();
        out.extend_from_slice(&sum);
        out
    }

    pub fn decode(b: &[u8]) -> Option<Summary> {
        let (body, sum) = b.split_at_checked(b.len().checked_sub(32)?)?;
        if blake3::hash(body).as_bytes() != sum || body.get(..5)? != b"FVSM\x01" {
            return None;
        }
        let n = u32::from_le_bytes(body.get(5..9)?.try_into().ok()?) as usize;
        let rest = &body[9..];
        if rest.len() != n.checked_mul(20)? {
            return None;
        }
        let subs = rest
            .chunks_exact(20)
            .map(|c| Sub {
                len: u32::from_le_bytes(c[..4].try_into().unwrap()),
                fp: c[4..].try_into().unwrap(),
            })
            .collect();
        Some(Summary { subs })
    }
}

/// Files larger than this are diffed by whole blocks only: their summaries would cost the
/// client too much memory (20 bytes a sub-block, two versions at once).
pub(crate) const MAX_FINE: u64 = 256 << 20;

/// The sub-block chunker: keyed FastCDC of 128 B–4 KiB around 512 B.
pub(crate) fn spec(key: [u8; 32]) -> ChunkerSpec {
    ChunkerSpec::fastcdc(128, 512, 4 << 10).keyed(Key(key))
}

/// Cuts a stream into sub-blocks and fingerprints them, as it is fed; gives up (keeping
/// nothing) past [`MAX_FINE`] bytes.
pub(crate) struct Fingerprinter {
    cutter: Box<dyn Cutter>,
    key: [u8; 32],
    hasher: blake3::Hasher,
    len: u32,
    subs: Vec<Sub>,
    total: u64,
}

impl Fingerprinter {
    pub fn new(chunk_key: [u8; 32], fp_key: [u8; 32]) -> Fingerprinter {
        Fingerprinter {
            cutter: spec(chunk_key).build(),
            key: fp_key,
            hasher: blake3::Hasher::new_keyed(&fp_key),
            len: 0,
            subs: vec![],
            total: 0,
        }
    }

    fn gave_up(&self) -> bool {
        self.total > MAX_FINE
    }

    pub fn feed(&mut self, mut data: &[u8]) {
        if self.gave_up() {
            return;
        }
        self.total += data.len() as u64;
        if self.gave_up() {
            self.subs = Vec::new();
            return;
        }
        while !data.is_empty() {
            match self.cutter.next_cut(data) {
                Some(n) => {
                    self.take(&data[..n]);
                    self.end_sub();
                    data = &data[n..];
                }
                None => {
                    self.take(data);
                    data = &[];
                }
            }
        }
    }

    fn take(&mut self, data: &[u8]) {
        self.hasher.update(data);
        self.len += data.len() as u32;
    }

    fn end_sub(&mut self) {
        let fp = self.hasher.finalize().as_bytes()[..16].try_into().unwrap();
        self.subs.push(Sub { len: self.len, fp });
        self.hasher = blake3::Hasher::new_keyed(&self.key);
        self.len = 0;
    }

    /// The summary of what was fed; `None` past [`MAX_FINE`] bytes.
    pub fn finish(mut self) -> Option<Summary> {
        if self.gave_up() {
            return None;
        }
        if self.len > 0 {
            self.end_sub();
        }
        Some(Summary { subs: self.subs })
    }

    /// The summary of all of `src`; `None` (having stopped reading) past [`MAX_FINE`] bytes.
    pub fn read_all(mut self, mut src: impl Read) -> Result<Option<Summary>, VaultError> {
        let mut buf = vec![0u8; 256 << 10];
        loop {
            match src.read(&mut buf) {
                Ok(0) => return Ok(self.finish()),
                Ok(_) if self.gave_up() => return Ok(None),
                Ok(n) => self.feed(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(VaultError::Local(format!("reading: {e}"))),
            }
        }
    }
}

/// The fingerprint of one sub-block, as [`Fingerprinter`] makes it.
pub(crate) fn fingerprint(fp_key: &[u8; 32], data: &[u8]) -> [u8; 16] {
    blake3::keyed_hash(fp_key, data).as_bytes()[..16]
        .try_into()
        .unwrap()
}

/// Reads a range of the new content while checking it is still the one the summary was made
/// of: each sub-block's fingerprint is checked as it ends, and a change is an error.
pub(crate) struct Checked<'a, R> {
    pub inner: R,
    pub subs: &'a [Sub],
    pub fp_key: [u8; 32],
    pub buf: Vec<u8>,
}

impl<R: Read> Read for Checked<'_, R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let Some(first) = self.subs.first() else {
            return Ok(0);
        };
        let want = (first.len as usize - self.buf.len()).min(out.len());
        let n = self.inner.read(&mut out[..want])?;
        if n == 0 {
            return Err(std::io::Error::other("the file shrank while it was read"));
        }
        self.buf.extend_from_slice(&out[..n]);
        if self.buf.len() == first.len as usize {
            if fingerprint(&self.fp_key, &self.buf) != first.fp {
                return Err(std::io::Error::other("the file changed while it was read"));
            }
            self.buf.clear();
            self.subs = &self.subs[1..];
        }
        Ok(n)
    }
}

/// One step of a fine diff, with `at` in the file as it is when the step applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FineOp {
    /// `len` bytes at `at` go.
    Delete { at: u64, len: u64 },
    /// The new content's sub-blocks `subs`, which start at byte `from` of it, go in at `at`.
    Insert {
        at: u64,
        from: u64,
        subs: std::ops::Range<usize>,
    },
}

/// The steps that turn content summarised by `old` into content summarised by `new`: the diff
/// of their sub-block sequences.
pub(crate) fn diff(old: &Summary, new: &Summary) -> Result<Vec<FineOp>, VaultError> {
    use ferry_format::{ChunkRef, DiffOp, HashAlg, Id, Recipe, RecipeDiff};
    let recipe = |s: &Summary| {
        let refs = s.subs.iter().map(|x| {
            let mut d = [0u8; 32];
            d[..16].copy_from_slice(&x.fp);
            ChunkRef {
                id: Id::from_parts(HashAlg::Blake3, d),
                len: x.len,
            }
        });
        Recipe::from_chunks(HashAlg::Blake3, refs.collect())
            .map_err(|e| VaultError::BadRange(e.to_string()))
    };
    let d = RecipeDiff::between(&recipe(old)?, &recipe(new)?)
        .map_err(|e| VaultError::BadRange(e.to_string()))?;
    let span = |s: &[Sub]| s.iter().map(|x| x.len as u64).sum::<u64>();
    let (mut at, mut from, mut i, mut j) = (0u64, 0u64, 0usize, 0usize);
    let mut out = vec![];
    for op in d.ops {
        match op {
            DiffOp::Keep(n) => {
                let len = span(&old.subs[i..i + n as usize]);
                (at, from) = (at + len, from + len);
                i += n as usize;
                j += n as usize;
            }
            DiffOp::Delete(n) => {
                let len = span(&old.subs[i..i + n as usize]);
                out.push(FineOp::Delete { at, len });
                i += n as usize;
            }
            DiffOp::Insert(refs) => {
                let len = span(&new.subs[j..j + refs.len()]);
                out.push(FineOp::Insert {
                    at,
                    from,
                    subs: j..j + refs.len(),
                });
                (at, from) = (at + len, from + len);
                j += refs.len();
            }
        }
    }
    Ok(out)
}

/// Part of what an insert puts in: bytes of the old version (found by fingerprint, anywhere
/// in it: moved content, or the middle of a diff too large for Myers), or new bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// `len` bytes at `at` in the old content.
    Old { at: u64, len: u64 },
    /// The new content's sub-blocks `subs`, starting at byte `from` of it.
    New {
        from: u64,
        subs: std::ops::Range<usize>,
    },
}

/// Where the old version's sub-blocks are, by fingerprint, and which pieces hold its bytes.
pub(crate) struct Reuse<'a> {
    at: std::collections::HashMap<[u8; 16], u64>,
    pieces: &'a [Piece],
    /// Where each piece begins in the old content.
    starts: Vec<u64>,
}

impl<'a> Reuse<'a> {
    pub fn new(old: &Summary, pieces: &'a [Piece]) -> Reuse<'a> {
        let mut at = std::collections::HashMap::with_capacity(old.subs.len());
        let mut off = 0;
        for s in &old.subs {
            at.entry(s.fp).or_insert(off);
            off += s.len as u64;
        }
        let mut starts = Vec::with_capacity(pieces.len());
        let mut off = 0;
        for p in pieces {
            starts.push(off);
            off += p.len as u64;
        }
        Reuse { at, pieces, starts }
    }

    /// The parts of an insert of the new sub-blocks `subs` (`first` is the index of the
    /// first, `from` its byte offset): runs found in the old content, and runs of new bytes.
    pub fn parts(&self, subs: &[Sub], first: usize, from: u64) -> Vec<Part> {
        let mut out: Vec<Part> = vec![];
        let mut off = from;
        for (i, s) in subs.iter().enumerate() {
            let len = s.len as u64;
            match (self.at.get(&s.fp), out.last_mut()) {
                (Some(&at), Some(Part::Old { at: a, len: l })) if *a + *l == at => *l += len,
                (Some(&at), _) => out.push(Part::Old { at, len }),
                (None, Some(Part::New { subs: r, .. })) => r.end = first + i + 1,
                (None, _) => out.push(Part::New {
                    from: off,
                    subs: first + i..first + i + 1,
                }),
            }
            off += len;
        }
        out
    }

    /// The pieces holding old bytes `at..at + len`.
    pub fn pieces(&self, at: u64, len: u64) -> Vec<Piece> {
        let mut out = vec![];
        let end = at + len;
        let mut i = self.starts.partition_point(|&s| s <= at).saturating_sub(1);
        while i < self.pieces.len() && self.starts[i] < end {
            let (p, s) = (self.pieces[i], self.starts[i]);
            let lo = at.max(s) - s;
            let hi = end.min(s + p.len as u64) - s;
            if hi > lo {
                out.push(Piece {
                    block: p.block,
                    offset: p.offset + lo as u32,
                    len: (hi - lo) as u32,
                });
            }
            i += 1;
        }
        out
    }
}

/// The summaries a client keeps, one file per root.
pub(crate) struct Summaries {
    pub dir: PathBuf,
}

impl Summaries {
    fn path(&self, root: &NodeId) -> PathBuf {
        let h = hex(root);
        self.dir.join(&h[..2]).join(h)
    }

    /// The summary of the content under `root` (`bytes` long), if this client kept a sound one.
    pub fn load(&self, root: &NodeId, bytes: u64) -> Option<Summary> {
        let s = Summary::decode(&std::fs::read(self.path(root)).ok()?)?;
        (s.bytes() == bytes).then_some(s)
    }

    pub fn save(&self, root: &NodeId, s: &Summary) {
        cache_file(&self.path(root), &s.encode());
    }

    /// Forgets every summary whose root is not in `keep`.
    pub fn prune(&self, keep: &HashSet<NodeId>) {
        let Ok(dirs) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for d in dirs.flatten() {
            let Ok(files) = std::fs::read_dir(d.path()) else {
                continue;
            };
            for f in files.flatten() {
                let name = f.file_name();
                let root = name.to_str().and_then(parse_hex);
                if root.is_none_or(|r| !keep.contains(&r)) {
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
    }
}

fn parse_hex(s: &str) -> Option<NodeId> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(data: &[u8]) -> Summary {
        let mut f = Fingerprinter::new([1; 32], [2; 32]);
        // Fed in uneven pieces: the cuts must not depend on how the stream arrives.
        for piece in data.chunks(777) {
            f.feed(piece);
        }
        f.finish().unwrap()
    }

    fn text(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b"abcdefgh ijklmnop\n"[(x % 18) as usize]
            })
            .collect()
    }

    #[test]
    fn a_stream_past_the_limit_keeps_no_summary() {
        let mut f = Fingerprinter::new([1; 32], [2; 32]);
        let mb = vec![7u8; 1 << 20];
        for _ in 0..(MAX_FINE >> 20) {
            f.feed(&mb);
        }
        assert!(!f.subs.is_empty());
        f.feed(b"one more byte");
        assert!(f.subs.is_empty(), "nothing kept past the limit");
        assert_eq!(f.finish(), None);
    }

    #[test]
    fn cuts_follow_content_not_the_feeding() {
        let data = text(100_000, 7);
        let a = fp(&data);
        let b = Fingerprinter::new([1; 32], [2; 32])
            .read_all(&data[..])
            .unwrap()
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.bytes(), 100_000);
        let avg = 100_000 / a.subs.len();
        assert!((256..2048).contains(&avg), "average sub-block {avg}");
        let mut at = 0;
        for s in &a.subs {
            assert_eq!(s.fp, fingerprint(&[2; 32], &data[at..at + s.len as usize]));
            at += s.len as usize;
        }
    }

    #[test]
    fn an_insert_changes_the_sub_blocks_around_it_only() {
        let old = text(60_000, 9);
        let mut new = old.clone();
        new.splice(30_000..30_000, b"INSERTED".iter().copied());
        let (a, b) = (fp(&old), fp(&new));
        let olds: HashSet<_> = a.subs.iter().collect();
        let fresh: u64 = b
            .subs
            .iter()
            .filter(|s| !olds.contains(s))
            .map(|s| s.len as u64)
            .sum();
        assert!(
            fresh > 0 && fresh < 10_000,
            "{fresh} bytes of new sub-blocks"
        );
    }

    #[test]
    fn a_summary_round_trips_and_any_damage_is_refused() {
        let s = fp(&text(20_000, 3));
        let bytes = s.encode();
        assert_eq!(Summary::decode(&bytes), Some(s));
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert_eq!(Summary::decode(&b), None, "byte {i} flipped");
        }
        for cut in 0..bytes.len() {
            assert_eq!(Summary::decode(&bytes[..cut]), None);
        }
    }

    #[test]
    fn the_v1_bytes_are_pinned() {
        let s = Summary {
            subs: vec![Sub {
                len: 0x0102,
                fp: [0xab; 16],
            }],
        };
        let b = s.encode();
        let mut want = b"FVSM\x01\x01\x00\x00\x00\x02\x01\x00\x00".to_vec();
        want.extend_from_slice(&[0xab; 16]);
        let sum = *blake3::hash(&want).as_bytes();
        want.extend_from_slice(&sum);
        assert_eq!(b, want);
    }

    #[test]
    fn a_checked_read_refuses_a_changed_range() {
        let data = text(10_000, 5);
        let s = fp(&data);
        let read = |bytes: &[u8]| {
            let mut out = vec![];
            Checked {
                inner: bytes,
                subs: &s.subs,
                fp_key: [2; 32],
                buf: vec![],
            }
            .read_to_end(&mut out)
            .map(|_| out)
        };
        assert_eq!(read(&data).unwrap(), data);
        let mut changed = data.clone();
        changed[5_000] ^= 1;
        assert!(read(&changed).is_err());
        assert!(read(&data[..9_000]).is_err());
    }

    /// Applies fine ops to `old` with the inserted bytes taken from `new`, as the tree would.
    fn apply(old: &[u8], new: &[u8], ops: &[FineOp], subs: &[Sub]) -> Vec<u8> {
        let mut out = old.to_vec();
        for op in ops {
            match op {
                FineOp::Delete { at, len } => {
                    out.drain(*at as usize..(*at + *len) as usize);
                }
                FineOp::Insert { at, from, subs: r } => {
                    let len: u64 = subs[r.clone()].iter().map(|s| s.len as u64).sum();
                    let bytes = &new[*from as usize..(*from + len) as usize];
                    out.splice(*at as usize..*at as usize, bytes.iter().copied());
                }
            }
        }
        out
    }

    #[test]
    fn a_fine_diff_rebuilds_the_new_content_and_inserts_little() {
        let old = text(80_000, 11);
        let mut new = old.clone();
        new.splice(70_000..70_100, []);
        new.splice(40_000..40_000, b"a sentence added".iter().copied());
        new.splice(100..100, b"X".iter().copied());
        new.extend_from_slice(b"and a line appended\n");
        let (a, b) = (fp(&old), fp(&new));
        let ops = diff(&a, &b).unwrap();
        assert_eq!(apply(&old, &new, &ops, &b.subs), new);
        let inserted: u64 = ops
            .iter()
            .map(|o| match o {
                FineOp::Insert { subs, .. } => {
                    b.subs[subs.clone()].iter().map(|s| s.len as u64).sum()
                }
                FineOp::Delete { .. } => 0,
            })
            .sum();
        assert!(
            inserted < 8_000,
            "{inserted} bytes inserted for four small edits"
        );
        assert!(diff(&b, &b).unwrap().is_empty());
        let none = Summary::default();
        assert_eq!(apply(&old, &new, &diff(&a, &none).unwrap(), &[]), b"");
        assert_eq!(apply(b"", &new, &diff(&none, &b).unwrap(), &b.subs), new);
    }

    fn pc(block: u8, offset: u32, len: u32) -> Piece {
        Piece {
            block: [block; 32],
            offset,
            len,
        }
    }

    #[test]
    fn reuse_finds_moved_bytes_and_slices_the_old_pieces() {
        let old = text(40_000, 12);
        let a = fp(&old);
        // The old content as three pieces of two blocks, the way a tree may hold it.
        let pieces = [pc(1, 100, 15_000), pc(2, 0, 5_000), pc(1, 20_000, 20_000)];
        let r = Reuse::new(&a, &pieces);
        // New content: old bytes 30,000.. moved to the front, then new bytes, then the rest.
        let cut: usize = a
            .subs
            .iter()
            .take_while({
                let mut n = 0;
                move |s| {
                    n += s.len as usize;
                    n <= 30_000
                }
            })
            .map(|s| s.len as usize)
            .sum();
        let mut new = old[cut..].to_vec();
        new.extend_from_slice(&text(3_000, 99));
        new.extend_from_slice(&old[..cut]);
        let b = fp(&new);
        let parts = r.parts(&b.subs, 0, 0);
        let rebuilt: Vec<u8> = parts
            .iter()
            .flat_map(|p| match p {
                Part::Old { at, len } => old[*at as usize..(*at + *len) as usize].to_vec(),
                Part::New { from, subs } => {
                    let n: u64 = b.subs[subs.clone()].iter().map(|s| s.len as u64).sum();
                    new[*from as usize..(*from + n) as usize].to_vec()
                }
            })
            .collect();
        assert_eq!(rebuilt, new);
        let fresh: u64 = parts
            .iter()
            .map(|p| match p {
                Part::New { subs, .. } => b.subs[subs.clone()].iter().map(|s| s.len as u64).sum(),
                Part::Old { .. } => 0,
            })
            .sum();
        assert!(
            fresh < 3_000 + 8_000,
            "{fresh} new bytes for 3,000 inserted"
        );
        // Slicing: a range across all three pieces.
        assert_eq!(
            r.pieces(14_000, 7_000),
            vec![pc(1, 14_100, 1_000), pc(2, 0, 5_000), pc(1, 20_000, 1_000),]
        );
        assert_eq!(r.pieces(0, 10), vec![pc(1, 100, 10)]);
        assert_eq!(r.pieces(39_990, 10), vec![pc(1, 39_990, 10)]);
    }

    #[test]
    fn prune_keeps_only_the_named_roots() {
        let dir = tempfile::tempdir().unwrap();
        let s = Summaries {
            dir: dir.path().into(),
        };
        let sum = fp(&text(3_000, 1));
        s.save(&[1; 32], &sum);
        s.save(&[2; 32], &sum);
        assert_eq!(s.load(&[1; 32], 3_000), Some(sum.clone()));
        assert_eq!(s.load(&[1; 32], 2_999), None);
        s.prune(&[[2u8; 32]].into_iter().collect());
        assert_eq!(s.load(&[1; 32], 3_000), None);
        assert_eq!(s.load(&[2; 32], 3_000), Some(sum));
    }
}
