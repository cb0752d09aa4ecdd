//! Compressing new chunks against old data the receiver holds (GetChunks with `against`, and
//! the data parts of Write).
//!
//! A chunk that changed is mostly the old chunk it replaced: a line edited, a field bumped.
//! The receiver cuts the old chunks that the new recipe no longer uses into small
//! content-defined pieces (~220–256 bytes) and names each by a key; the sender cuts the new
//! chunks the same way, finds the pieces whose keys the receiver named, and compresses the new
//! chunks as one zstd frame with those pieces, concatenated, as the prefix. Each side holds the
//! prefix's bytes, so the frame carries little more than what is really new, compressed with
//! the context of the old text around it. The receiver verifies every chunk by its id: a key that
//! matched falsely (keys are 3 to 8 bytes, long enough for odds of about 1 in 1,000 a request)
//! gives chunks that fail verification and are fetched plainly.

use std::collections::{HashMap, HashSet};
use std::io;
use std::ops::Range;

use zstd::zstd_safe::{CCtx, CParameter, DCtx, DParameter};

mod level;
pub(crate) use level::NEAR;
pub use level::{fast_link, frame_floor, near_link, FrameLevel};

/// Largest window (prefix and data together) a frame may need: 2^25 bytes.
const MAX_WINDOW_LOG: u32 = 25;
/// Chunk bytes per request, and the most a server puts in one reply (the compressed frame of
/// incompressible data must still fit in a frame body).
pub const MAX_DATA: usize = 2 << 20;
pub const MAX_REPLY_DATA: usize = 3 << 20;
/// Level of a frame against old data while the link is the bottleneck (and always for small
/// frames, which cost little at any level), unless the session's own level is higher.
pub const TOP_LEVEL: i32 = 19;
/// Data at most this large is compressed at the top level whatever the link.
pub const SMALL_FRAME: usize = 256 << 10;
/// Prefix bytes at most (the window bounds it anyway).
pub const MAX_PREFIX: usize = 16 << 20;

/// How both sides cut pieces: a gear hash without normalization
/// ([`GearCutter::unnormalized`](ferry_chunk::GearCutter::unnormalized)): a 96-byte minimum,
/// a cut where 7 bits of the fingerprint of the last 32 bytes are zero (one chance in 128 a
/// byte) and a 2 KiB maximum, as docs/protocol.md fixes. Sizes spread wider than FastCDC's
/// (which pulls them toward the average): more small pieces around an edit, where they match
/// more of the old text, and fewer keys in all. It took the place of LBFS's Rabin cutter with
/// the same sizes (a 48-byte window), five times as slow (37 MB of numpy's libraries cut in
/// 95 ms, 25 ms now), for as many pieces and no more bytes: a server that never saw the old
/// tree, crates-vendor 170,650 → 163,838 bytes, django-tree 255,277 → 251,978, numpy-whl-tree
/// 1,845,462 → 1,826,933. A window of 64 bytes cost 1 to 2 % more, one of 16 or 24 about as
/// much as 32 (`examples/pieces_speed.rs` times the cut).
pub fn piece_cutter() -> ferry_chunk::GearCutter {
    ferry_chunk::GearCutter::unnormalized(PIECE_MIN, 7, 32, PIECE_MAX)
}

/// The smallest and largest pieces.
const PIECE_MIN: usize = 96;
const PIECE_MAX: usize = 2048;

/// A piece's key: its XXH3-64 hash (seed 0) cut to its low `bytes` bytes, the length
/// [`key_bytes`] picks. A key is a hint: a false match puts the wrong bytes in the prefix, and
/// the frame fails to decode or its chunks fail verification, and they are sent again plainly.
/// (BLAKE3 took 350 ns a piece of about 220 bytes, XXH3 50.)
pub fn piece_key(piece: &[u8], bytes: usize) -> u64 {
    let h = xxhash_rust::xxh3::xxh3_64(piece);
    match bytes {
        8.. => h,
        _ => h & ((1u64 << (8 * bytes)) - 1),
    }
}

/// How long piece keys must be so that `old` keys against `new` pieces match falsely with odds
/// under 1 in 1,000: from 3 bytes (enough for a small file's pieces) up to 8. Keys that count
/// only in runs (`runs`) match falsely only in pairs, at odds of about 2 × old × new /
/// 2^(16 × length).
pub fn key_bytes(old: usize, new: usize, runs: bool) -> u8 {
    let pairs = (old as u128 * new as u128).saturating_mul(if runs { 2000 } else { 1000 });
    let bits = if runs { 16 } else { 8 };
    let mut n = *ferry_proto::KEY_BYTES.start();
    while n < 8 && pairs >> (bits * n as u32).min(127) != 0 {
        n += 1;
    }
    n
}

/// How well some data compresses, from slices of it: where zstd level 1 saves under 10 %,
/// matches with old data come in long runs (an archive's members, the tail of a compressed
/// stream), so keys may count only in runs.
#[derive(Default)]
pub struct Compressibility {
    plain: usize,
    packed: usize,
}

impl Compressibility {
    /// Bytes tried at most, in slices of 64 KiB spread over what is sampled.
    const MAX: usize = 1 << 20;
    const SLICE: usize = 64 << 10;

    /// Tries up to 16 slices of `data`, until 1 MiB in all has been tried.
    pub fn sample(&mut self, data: &[u8]) {
        let step = (data.len() / 16).max(Self::SLICE);
        for at in (0..data.len()).step_by(step) {
            if self.plain >= Self::MAX {
                return;
            }
            let slice = &data[at..(at + Self::SLICE).min(data.len())];
            self.plain += slice.len();
            self.packed += zstd::bulk::compress(slice, 1).map_or(slice.len(), |c| c.len());
        }
    }

    pub fn incompressible(&self) -> bool {
        self.plain > 0 && self.packed * 10 >= self.plain * 9
    }
}

/// The receiver's piece keys, as a sender looks them up.
#[derive(Default)]
pub struct Keys {
    /// Each key's first index.
    first: HashMap<u64, u32>,
    /// Every key, by index.
    list: Vec<u64>,
    /// Bytes of each key.
    bytes: usize,
    /// Whether a key counts only in a run (a neighbouring piece matching the neighbouring key).
    runs: bool,
}

impl Keys {
    pub fn new(list: Vec<u64>, bytes: usize, runs: bool) -> Self {
        let mut first = HashMap::with_capacity(list.len());
        for (i, k) in list.iter().enumerate() {
            first.entry(*k).or_insert(i as u32);
        }
        Keys {
            first,
            list,
            bytes,
            runs,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The index of the key of the `j`th of the pieces keyed `keys`, if it counts: the key
    /// after the previous match (`last`) if it is this one (old data goes on where it left
    /// off, whatever other pieces share the key), else the first with it.
    fn find(&self, keys: &[u64], j: usize, last: Option<u32>) -> Option<u32> {
        let key = |i: usize| self.list.get(i).copied();
        let next = last.map(|l| l as usize + 1);
        let i = match next {
            Some(n) if key(n) == Some(keys[j]) => n as u32,
            _ => *self.first.get(&keys[j])?,
        };
        let run = || {
            let i = i as usize;
            (j + 1 < keys.len() && key(i + 1) == Some(keys[j + 1]))
                || (j > 0 && i > 0 && key(i - 1) == Some(keys[j - 1]))
        };
        (!self.runs || run()).then_some(i)
    }
}

/// The pieces of `data`, as ranges.
pub fn pieces(data: &[u8]) -> Vec<Range<usize>> {
    let mut at = 0;
    ferry_chunk::cut_lengths(&mut piece_cutter(), data)
        .into_iter()
        .map(|n| {
            at += n;
            at - n..at
        })
        .collect()
}

fn zerr(code: usize) -> io::Error {
    io::Error::other(format!("zstd: {}", zstd::zstd_safe::get_error_name(code)))
}

fn window_log(bytes: usize) -> u32 {
    (usize::BITS - bytes.max(1024).leading_zeros()).min(MAX_WINDOW_LOG)
}

/// The receiver's pieces (`keys`) found in `runs` (each run of adjacent chunks cut on its
/// own, as the receiver cuts each run of old chunks): their indices, in the order found, and
/// their bytes concatenated (the prefix).
pub fn find<'a>(runs: impl IntoIterator<Item = &'a [u8]>, keys: &Keys) -> (Vec<u32>, Vec<u8>) {
    let mut refs = vec![];
    let mut prefix = vec![];
    let mut used = HashSet::new();
    let all: Vec<&[u8]> = runs
        .into_iter()
        .flat_map(|c| pieces(c).into_iter().map(move |r| &c[r]))
        .collect();
    let hashes: Vec<u64> = all.iter().map(|p| piece_key(p, keys.bytes)).collect();
    let mut last = None;
    for (j, piece) in all.iter().enumerate() {
        if prefix.len() + piece.len() > MAX_PREFIX {
            break;
        }
        last = keys.find(&hashes, j, last);
        if let Some(i) = last {
            if used.insert(i) {
                refs.push(i);
                prefix.extend_from_slice(piece);
            }
        }
    }
    (refs, prefix)
}

/// Sender: `data` as one frame against `prefix` (`work` bytes in all, the prefix's share
/// included, at the level `level` picks), or `None` when that does not clearly pay. Plain data
/// compresses in the session's stream with the context of everything sent before (other files
/// like this one): when it compresses at all, it goes so unless the old data is worth 10 % more,
/// judged against compressing it alone (a large frame's at the session's level: quicker, and
/// what the stream would mostly do).
pub fn worth_a_frame(
    level: &mut FrameLevel,
    data: &[u8],
    prefix: &[u8],
    work: usize,
) -> io::Result<Option<Vec<u8>>> {
    let floor = level.floor();
    let tried = level.timed(work, data, |level| try_frame(data, prefix, level, floor));
    judge_frame(level, data.len(), tried)
}

/// What [`try_frame`] found: the frame against the prefix, and the data's size compressed
/// alone when that was tried too.
pub type Tried = (io::Result<Vec<u8>>, Option<usize>);

/// The compressing half of [`worth_a_frame`], at `level` (the data alone, when it is compared,
/// at that level if the data is small, else at `floor`): it needs nothing of the sender's
/// state, so it may run on a thread of its own.
pub fn try_frame(data: &[u8], prefix: &[u8], level: i32, floor: i32) -> Tried {
    let against = encode(data, prefix, level);
    if against
        .as_ref()
        .is_ok_and(|f| f.len() * CLEAR_WIN <= data.len())
    {
        return (against, None);
    }
    let alone_level = if data.len() <= SMALL_FRAME {
        level
    } else {
        floor
    };
    let alone = encode(data, &[], alone_level).map_or(usize::MAX, |f| f.len());
    (against, Some(alone))
}

/// The judging half of [`worth_a_frame`]: the frame [`try_frame`] made of `len` bytes of data,
/// if it pays.
pub fn judge_frame(
    level: &mut FrameLevel,
    len: usize,
    (against, alone): Tried,
) -> io::Result<Option<Vec<u8>>> {
    let against = against?;
    // An eighth of the data or less: the old data clearly pays (alone, the data would have to
    // compress more than 7 to 1 to beat it by a tenth), and is not compressed alone to see.
    let Some(alone) = alone else {
        return Ok(Some(against));
    };
    let compressible = alone * 10 < len * 9;
    if !compressible {
        level.hard_frame(alone.saturating_sub(against.len()));
    }
    let worth = if compressible {
        against.len() * 10 < alone * 9
    } else {
        against.len() < alone
    };
    Ok(worth.then_some(against))
}

/// The least prefix a frame looks for long matches in (zstd's long-distance matcher): a
/// smaller one the level's own search covers: four 64 KiB pieces each of text-insert,
/// mbox-append, numpy-whl-raw and django-sdist against their old versions' neighbourhoods, at
/// levels 3, 6 and 9, came out at most 141 bytes larger without it up to 1 MiB of prefix (at
/// 4 MiB, level 3 without it lost most matches); with it, 8 KiB against 40 KiB took 48 µs at
/// level 3, without it 27 (`cargo bench -p ferry-fs --bench delta`): a mount's commit of a
/// small file.
const LONG_MATCHES: usize = 1 << 20;

/// A frame against old data at most this many times smaller than the data is taken without
/// compressing the data alone to compare (see [`worth_a_frame`]).
const CLEAR_WIN: usize = 8;
/// Prefix and data at most this large are compressed in a context kept from frame to frame.
const REUSED_WORK: usize = 256 << 10;
/// The first bytes of a zstd dictionary: a prefix that starts so would be read as one by the
/// one-shot path of [`encode`] (and must not: both sides hold it as plain bytes).
const DICTIONARY_MAGIC: [u8; 4] = 0xEC30_A437u32.to_le_bytes();

/// Sender: compresses `data` as one zstd frame against `prefix`.
///
/// A small frame (prefix and data within 256 KiB) goes through this thread's own
/// context, kept from frame to frame: a fresh one is allocated and its tables cleared each time
/// (768 KiB at level 3 against 100 KiB of prefix), which cost a mount's commit of a few SQLite
/// pages more than compressing them (`memset` and `ZSTD_createCCtx` were a quarter of the
/// frames' samples). Either way the prefix is raw content to both sides, and the window spans it
/// and the data.
pub fn encode(data: &[u8], prefix: &[u8], level: i32) -> io::Result<Vec<u8>> {
    if prefix.len() + data.len() > REUSED_WORK || prefix.starts_with(&DICTIONARY_MAGIC) {
        return encode_fresh(data, prefix, level);
    }
    thread_local! {
        static CONTEXT: std::cell::RefCell<Option<CCtx<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    CONTEXT.with_borrow_mut(|c| {
        let c = c.get_or_insert_with(CCtx::create);
        let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(data.len()));
        // One shot, its parameters from the level and the sizes: zstd's for work of at most
        // 256 KiB have windows that large, shrunk to fit the prefix and the data.
        c.compress_using_dict(&mut out, data, prefix, level)
            .map_err(zerr)?;
        Ok(out)
    })
}

/// [`encode`] with a context of its own, for a prefix long enough to want long-distance
/// matching.
fn encode_fresh(data: &[u8], prefix: &[u8], level: i32) -> io::Result<Vec<u8>> {
    let mut c = CCtx::create();
    c.set_parameter(CParameter::CompressionLevel(level))
        .map_err(zerr)?;
    c.set_parameter(CParameter::WindowLog(window_log(prefix.len() + data.len())))
        .map_err(zerr)?;
    if level < TOP_LEVEL && prefix.len() >= LONG_MATCHES {
        // Long matches far back in the prefix, which the faster levels' searches miss (as
        // `zstd --patch-from` does): measured at level 9 on numpy-whl-raw, 5.46 → 4.48 MB.
        c.set_parameter(CParameter::EnableLongDistanceMatching(true))
            .map_err(zerr)?;
    }
    c.ref_prefix(prefix).map_err(zerr)?;
    let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(data.len()));
    c.compress2(&mut out, data).map_err(zerr)?;
    Ok(out)
}

/// Receiver: the chunk bytes of `frame`, which must be exactly `len` bytes, decompressed
/// against `prefix` (its pieces named by the reply's refs, concatenated).
pub fn decode(frame: &[u8], prefix: &[u8], len: usize) -> io::Result<Vec<u8>> {
    let mut d = DCtx::create();
    d.set_parameter(DParameter::WindowLogMax(MAX_WINDOW_LOG))
        .map_err(zerr)?;
    d.ref_prefix(prefix).map_err(zerr)?;
    // One byte more than expected, so a frame that would produce more is caught.
    let mut out = Vec::with_capacity(len + 1);
    let n = d.decompress(&mut out, frame).map_err(zerr)?;
    if n != len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{n} bytes where {len} were expected"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(seed: u64, n: usize) -> Vec<u8> {
        let words = [
            "ferry ", "chunk ", "link ", "slow ", "byte ", "delta\n", "store ",
        ];
        let mut x = seed;
        let mut out = vec![];
        while out.len() < n {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            out.extend_from_slice(words[(x >> 33) as usize % words.len()].as_bytes());
            out.extend_from_slice(format!("{} ", x >> 50).as_bytes());
        }
        out.truncate(n);
        out
    }

    /// Frames from this thread's kept context decode against their prefix as any other, one
    /// after another of every kind and size: a prefix under 8 bytes (which zstd's one-shot
    /// path ignores), one that starts like a zstd dictionary (which it would parse as one), no
    /// prefix, and work beyond the kept context's (a fresh one); the same input gives the same
    /// frame every time, whatever the context compressed before.
    #[test]
    fn frames_from_the_kept_context_decode_and_repeat() {
        let old = text(7, 40 << 10);
        let mut new = old.clone();
        new.splice(1000..1000, b"an edit in the middle".iter().copied());
        let mut magic = DICTIONARY_MAGIC.to_vec();
        magic.extend_from_slice(&old);
        let big = text(8, REUSED_WORK);
        let cases: [(&[u8], &[u8]); 5] = [
            (&new, &old),
            (&new, &old[..5]),
            (&new, &magic),
            (&new, &[]),
            (&big, &old),
        ];
        for level in [1, 3, 9] {
            for (data, prefix) in cases {
                let frame = encode(data, prefix, level).unwrap();
                assert_eq!(decode(&frame, prefix, data.len()).unwrap(), data);
                assert_eq!(encode(data, prefix, level).unwrap(), frame);
            }
        }
        // Against its old version the edit costs little; alone, the whole of it.
        let against = encode(&new, &old, 3).unwrap().len();
        assert!(
            against * 20 < encode(&new, &[], 3).unwrap().len(),
            "{against}"
        );
    }

    /// Data a frame shrinks more than 8 times over goes as the frame, even where it compresses
    /// about as well alone (it is not compressed alone to compare).
    #[test]
    fn a_frame_that_clearly_pays_is_taken() {
        // Compresses to a few bytes alone as well as against the prefix.
        let old = vec![b'x'; 64 << 10];
        // (A prefix in the data's own buffer would be dropped by zstd as overwritten.)
        let prefix = old.clone();
        let mut level = FrameLevel::new(3);
        let frame = worth_a_frame(&mut level, &old, &prefix, 2 * old.len()).unwrap();
        let frame = frame.expect("a frame of the data against itself");
        assert!(frame.len() * CLEAR_WIN <= old.len(), "{}", frame.len());
        assert_eq!(decode(&frame, &prefix, old.len()).unwrap(), old);
    }

    #[test]
    fn keys_grow_with_the_pieces_they_may_meet() {
        assert_eq!(key_bytes(0, 0, false), 3);
        // A changed chunk of a small file: 37 pieces each side.
        assert_eq!(key_bytes(37, 37, false), 3);
        assert_eq!(key_bytes(1000, 1000, false), 4);
        // A wholly changed 10 MB file: 40,000 pieces each side, a request's 8,000 new ones.
        assert_eq!(key_bytes(40_000, 8_000, false), 5);
        assert_eq!(key_bytes(40_000, 8_000, true), 3);
        assert_eq!(key_bytes(usize::MAX, usize::MAX, false), 8);
        assert_eq!(key_bytes(usize::MAX, usize::MAX, true), 8);
        for (old, new) in [(10, 10), (5000, 8000), (1 << 20, 8000), (1 << 30, 1 << 30)] {
            let (old, new) = (old as f64, new as f64);
            // Odds of a false match under 1 in 1,000 (or the longest key).
            let n = key_bytes(old as usize, new as usize, false) as i32;
            assert!(n == 8 || old * new * 1000.0 < 2f64.powi(8 * n));
            let n = key_bytes(old as usize, new as usize, true) as i32;
            assert!(n == 8 || old * new * 2000.0 < 2f64.powi(16 * n));
        }
    }

    #[test]
    fn an_edit_costs_about_the_edit() {
        let old = text(1, 64 << 10);
        let mut new = old.clone();
        new.splice(
            30_000..30_000,
            b"an inserted line of new text\n".iter().copied(),
        );
        new[50_000] ^= 0x20;
        // Receiver: keys of its old data's pieces.
        let ranges = pieces(&old);
        let list = ranges.iter().map(|r| piece_key(&old[r.clone()], 4));
        let (refs, prefix) = find([&new[..]], &Keys::new(list.collect(), 4, false));
        let frame = encode(&new, &prefix, 19).unwrap();
        let alone = zstd::bulk::compress(&new, 19).unwrap();
        assert!(
            frame.len() * 20 < alone.len(),
            "{} bytes against old data, {} alone",
            frame.len(),
            alone.len()
        );
        let from_old: Vec<u8> = refs
            .iter()
            .flat_map(|&i| old[ranges[i as usize].clone()].to_vec())
            .collect();
        assert_eq!(from_old, prefix);
        assert_eq!(decode(&frame, &prefix, new.len()).unwrap(), new);
        // The wrong prefix, or the wrong length, is an error or different bytes, never a panic.
        assert!(decode(&frame, &prefix, new.len() - 1).is_err());
        let wrong = vec![b'x'; prefix.len()];
        assert!(decode(&frame, &wrong, new.len()).map_or(true, |d| d != new));
        // Nothing in common: plain compression.
        let (refs, prefix) = find([&new[..]], &Keys::default());
        assert!(refs.is_empty() && prefix.is_empty());
        let frame = encode(&new, &prefix, 3).unwrap();
        assert_eq!(decode(&frame, &[], new.len()).unwrap(), new);
    }

    #[test]
    fn keys_in_runs_match_runs_only() {
        // Incompressible old data: a new version shares a long run of it, and one piece of it
        // alone, elsewhere.
        let mut x = 1u64;
        let old: Vec<u8> = (0..256 << 10)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                (x >> 56) as u8
            })
            .collect();
        let mut c = Compressibility::default();
        c.sample(&old);
        assert!(c.incompressible());
        let mut t = Compressibility::default();
        t.sample(&text(1, 256 << 10));
        assert!(!t.incompressible());
        // The new version: the first half with every other piece changed (its first byte,
        // which moves no cut), the second half as it was.
        let ranges = pieces(&old);
        let half = ranges.len() / 2;
        let mut new = old.clone();
        for r in ranges[..half].iter().skip(1).step_by(2) {
            new[r.start] ^= 0xff;
        }
        let list: Vec<u64> = ranges
            .iter()
            .map(|r| piece_key(&old[r.clone()], 3))
            .collect();
        let (refs, _) = find([&new[..]], &Keys::new(list.clone(), 3, false));
        assert_eq!(refs.len(), ranges.len() - half / 2);
        let (refs, prefix) = find([&new[..]], &Keys::new(list, 3, true));
        // Pieces alone do not count; the run does.
        let want: Vec<u32> = (half as u32 - half as u32 % 2..ranges.len() as u32).collect();
        assert_eq!(refs, want);
        assert_eq!(prefix, old[ranges[want[0] as usize].start..]);
        // Keys that match only one by one, never a neighbour's, do not count.
        let scrambled: Vec<u64> = ranges
            .iter()
            .rev()
            .map(|r| piece_key(&old[r.clone()], 3))
            .step_by(2)
            .collect();
        let (refs, _) = find([&old[..]], &Keys::new(scrambled, 3, true));
        assert!(refs.is_empty(), "{refs:?}");
    }

    /// The pieces and keys docs/protocol.md fixes (version 4): both sides must cut and key
    /// alike, so these bytes are a promise.
    #[test]
    fn pieces_and_keys_are_pinned() {
        // XXH3-64 of nothing, seed 0 (the reference's own test vector).
        assert_eq!(piece_key(b"", 8), 0x2D06_8005_38D3_94C2);
        assert_eq!(piece_key(b"", 3), 0x2D06_8005_38D3_94C2 & 0xFF_FFFF);
        let data = text(7, 4000);
        let ranges = pieces(&data);
        let lens: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
        let keys: Vec<u64> = ranges
            .iter()
            .map(|r| piece_key(&data[r.clone()], 8))
            .collect();
        assert_eq!(
            lens,
            [
                416, 101, 311, 255, 354, 129, 171, 168, 432, 117, 195, 399, 112, 158, 150, 106,
                197, 229
            ]
        );
        assert_eq!(
            keys[..3],
            [
                0x84fa_cd82_cc42_0280,
                0xcce6_7fc7_9f48_5b55,
                0x2f6c_7834_ef4b_e830
            ]
        );
        assert_eq!(keys[17], 0x4ca6_043b_6d25_a213);
    }
}
