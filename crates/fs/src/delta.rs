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
use std::time::Duration;

use ferry_chunk::ChunkerSpec;
use zstd::zstd_safe::{CCtx, CParameter, DCtx, DParameter};

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

/// How both sides cut pieces: the LBFS chunker (`lbfs-v1`, docs/chunking.md) with a 96-byte
/// minimum, a cut after one window in 128 and a 2 KiB maximum. Sizes spread wider than
/// FastCDC's (which pulls them toward the average): more small pieces around an edit, where they
/// match more of the old text, and fewer keys in all. Measured against FastCDC 64 B / 256 B /
/// 2 KiB pieces, a server that never saw the old tree: crates-vendor 184,165 → 158,756 bytes,
/// django-tree 248,487 → 228,960, numpy-whl-tree 1,625,309 → 1,545,676.
pub fn piece_spec() -> ChunkerSpec {
    ChunkerSpec {
        algorithm: ferry_chunk::Algorithm::Lbfs,
        min: 96,
        avg: 128,
        max: 2048,
        key: None,
    }
}

/// A piece's key: the first `bytes` bytes of its BLAKE3 hash, as a little-endian number, of the
/// length [`key_bytes`] picks. A false match puts the wrong bytes in the prefix: the frame fails
/// to decode or its chunks fail verification, and they are sent again plainly.
pub fn piece_key(piece: &[u8], bytes: usize) -> u64 {
    let mut k = [0u8; 8];
    k[..bytes].copy_from_slice(&blake3::hash(piece).as_bytes()[..bytes]);
    u64::from_le_bytes(k)
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
    let mut cutter = piece_spec().build();
    let mut at = 0;
    ferry_chunk::cut_lengths(cutter.as_mut(), data)
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

/// The level of a sender's frames against old data, following the link: it starts at
/// level 12 (or the session's own on a link the receiver measured fast, the top on one
/// it showed thin: [`link_rate`](Self::link_rate)), and after a large frame (or small ones
/// that took 50 ms in all) compares how long writing them out waited on the link
/// with how long compressing them took. Waits longer than compressing: the compressor is
/// hidden behind the link, up as far as compressing would still take no longer than the
/// waits (a step at least, if it costs at most twice as much). Waits under an eighth of
/// it: the compressor is the bottleneck (a LAN, where level 19 would take seconds a frame for a
/// few per cent of bytes), steps down, as many as halvings of the ratio beyond that eighth, down
/// to 9, or the session's own level if higher. Below 9 only on a link the receiver measured
/// broad or near: transport buffers can hold all of a small transfer, so writes that did not
/// wait do not prove a link fast (a 1.5 Mbit/s link at level 3 cost crates-vendor 19 % more
/// bytes than at 9). Large frames of data that hardly compresses (archives) go at the lowest
/// of those levels unless the link is far slower than compressing (writes waiting 8 times as
/// long, and since at least as long).
#[derive(Debug)]
pub struct FrameLevel {
    levels: Vec<i32>,
    at: usize,
    /// How long the frames since the last decision took to compress (`None`: no frame since),
    /// and the writes since the first of them (how many, and how long they waited).
    busy: Option<std::time::Duration>,
    writes: u32,
    waited: std::time::Duration,
    /// The link is far slower than compressing: writes waited 8 times as long as the last
    /// large frame took (and since, at least as long).
    thin: bool,
    /// The lowest of `levels` frames go down to: 9 (or the session's level if higher) until
    /// the link is measured broad or near, then the session's level.
    lowest: usize,
    /// The writes counted so far by [`saw_writes`](Self::saw_writes).
    seen: (u64, std::time::Duration),
    /// Whether a large frame was compressed yet, or a decision made (from then on, the link's
    /// waits lead).
    started: bool,
    /// A large frame is among those since the last decision.
    large: bool,
}

/// Small frames since the last decision must have taken this long in all for the next: a few
/// milliseconds of compressing and a write that waited as long say little.
const DECIDE_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// The level large frames start at: a frame alone, its time not hidden behind the link's
/// sending of others, goes quicker at 12 than at 19 on any link over 40 kbit/s. mbox-append's
/// one frame (320 KB of new mail against 4 MiB of the mailbox): 47.6 KB in 0.2 s at 12, 42.1 KB
/// in 1.4 s at 19 (its binary trees index the whole prefix; the levels from 13 up take as long).
/// Once a frame is out, the link's waits lead: a link the sender waits on buys level 19's bytes
/// with time it would idle anyway.
const START_LEVEL: i32 = 12;
/// Links the receiver measured at least this fast (64 Mbit/s, a LAN) start at the session's
/// own level; those at least [`BROAD_LINK`] (8 Mbit/s) at 6 at most, and those at least
/// [`THIN_LINK`] at 9 at most. Against a prefix, level 12 takes about 5 times as long as 3
/// (mbox-append's frame of 4 MB of work: 120 ms at 12) for 5-12 % fewer bytes (crates-vendor
/// 125.0 → 110.3 KiB, numpy-whl-tree 1.5 → 1.4 MiB): worth it only under about 2 Mbit/s.
const FAST_LINK: u64 = 8 << 20;
const BROAD_LINK: u64 = 1 << 20;
/// A link the receiver measured over a reply of [`THIN_SAMPLE`] bytes or more and found no
/// faster than this (2 Mbit/s) is thin: its frames start at the top, where the bytes saved are
/// worth the time (the next frames' compressing hides behind the link sending this one). A
/// measure from smaller replies is mostly a round trip's and proves nothing slow.
const THIN_LINK: u64 = 256 << 10;
/// A link whose replies came this soon after their requests is a LAN's (a long link's round
/// trip is over 10 ms): frames start as on a broad one, even where no reply was large enough
/// to measure the rate (a single file's recipe).
const NEAR: Duration = Duration::from_millis(2);
const THIN_SAMPLE: u64 = 16 << 10;

impl FrameLevel {
    /// Levels from `floor` (the session's level) up to [`TOP_LEVEL`].
    pub fn new(floor: i32) -> Self {
        let mut levels = vec![floor];
        levels.extend(
            [6, 9, 12, 15, 17, TOP_LEVEL]
                .into_iter()
                .filter(|&l| l > floor),
        );
        FrameLevel {
            at: start_of(&levels),
            lowest: at_most(&levels, 9),
            levels,
            busy: None,
            writes: 0,
            waited: Default::default(),
            thin: false,
            seen: Default::default(),
            started: false,
            large: false,
        }
    }

    /// The receiver measured the link bringing it at least `rate` bytes a second, over replies
    /// the largest of which was `sample` bytes, and replies coming `round_trip` after their
    /// requests at the quickest: on a fast link large frames start at the session's own level,
    /// on a broad or near one low, on one shown thin at the top (until the first large frame;
    /// after it, the link's waits lead).
    pub fn link_rate(&mut self, rate: u64, sample: u64, round_trip: Option<Duration>) {
        if self.started {
            return;
        }
        let near = round_trip.is_some_and(|r| r < NEAR);
        if rate >= BROAD_LINK || near {
            self.lowest = 0;
        }
        self.at = if rate >= FAST_LINK {
            0
        } else if rate >= BROAD_LINK || near {
            at_most(&self.levels, 6)
        } else if rate >= THIN_LINK {
            at_most(&self.levels, 9)
        } else if sample >= THIN_SAMPLE {
            self.levels.len() - 1
        } else {
            start_of(&self.levels)
        };
    }

    /// The session's own level, the lowest.
    pub fn floor(&self) -> i32 {
        self.levels[0]
    }

    /// The level for a frame of `bytes` of work, its data starting with `sample`.
    fn level(&mut self, bytes: usize, sample: &[u8]) -> i32 {
        let top = self.levels.len() - 1;
        // A decision once the frames since the last took long enough to say something (a large
        // one, or small ones adding up) and were written: nothing written says nothing about
        // the link.
        let enough = self.large || self.busy.is_some_and(|b| b >= DECIDE_AFTER);
        if let Some(busy) = self.busy.take_if(|_| enough && self.writes > 0) {
            self.large = false;
            self.started = true;
            let waited = std::mem::take(&mut self.waited);
            let ratio = waited.as_secs_f64() / busy.as_secs_f64().max(1e-9);
            self.thin = ratio >= if self.thin { 1.0 } else { 8.0 };
            if ratio >= 1.0 {
                // Up as far as compressing would still take no longer than the writes waited
                // (a step at least, if it costs at most twice as much): waits on a receiver
                // slower than the link (a local pipe) do not hide level 15 against a prefix
                // of 8 MiB (770 ms for a frame of 256 KiB that took 35 ms at 6).
                let now = cost(self.levels[self.at]);
                while self.at < top && cost(self.levels[self.at + 1]) / now <= ratio.max(2.0) {
                    self.at += 1;
                }
            } else if ratio * 8.0 < 1.0 {
                let steps = ((1.0 / (ratio * 8.0)).log2().floor() as usize).max(1);
                self.at = self.at.saturating_sub(steps).max(self.lowest);
            }
        }
        if bytes <= SMALL_FRAME {
            return self.levels[self.at];
        }
        // Data that hardly compresses gains a few per cent from the higher levels for ten
        // times the time and more (`zstd --patch-from` on django-sdist: 10.09 MB in 0.16 s at
        // level 3, 9.82 MB in 8.7 s at 19): worth it only on a link that writes wait on far
        // longer than compressing takes, where the time hides behind it.
        if !self.thin && hardly_compresses(sample) {
            return self.levels[self.lowest];
        }
        self.levels[self.at]
    }

    /// Runs `compress` (a frame of `bytes` of work: `data`, and whatever goes with it) at the
    /// level for it, timed for the next decision.
    pub fn timed<T>(&mut self, bytes: usize, data: &[u8], compress: impl FnOnce(i32) -> T) -> T {
        let level = self.level(bytes, data);
        let started = std::time::Instant::now();
        let out = compress(level);
        let took = started.elapsed();
        tracing::debug!("a frame of {bytes} bytes of work at level {level}: {took:?}");
        self.compressed(bytes, took);
        out
    }

    /// A frame of `bytes` of work was compressed in `busy`: it joins the frames since the last
    /// decision (the first of them starts counting the writes).
    fn compressed(&mut self, bytes: usize, busy: std::time::Duration) {
        if self.busy.is_none() {
            self.writes = 0;
            self.waited = Default::default();
        }
        self.busy = Some(self.busy.unwrap_or_default() + busy);
        if bytes > SMALL_FRAME {
            self.started = true;
            self.large = true;
        }
    }

    /// Whether frames were compressed since the last decision and nothing written since: the
    /// sender should write them out now, so the next decision knows how fast the link took them.
    pub fn unwritten(&self) -> bool {
        self.busy.is_some() && self.writes == 0
    }

    /// A write to the transport waited `waited`.
    pub fn wrote(&mut self, waited: std::time::Duration) {
        self.writes += 1;
        self.waited += waited;
    }

    /// The transport's writes so far (how many, how long they waited in all), as a sender
    /// whose writes happen elsewhere (the client's sending thread) counts them: those since the
    /// last call count as [`wrote`](Self::wrote) would.
    pub fn saw_writes(&mut self, writes: u64, waited: std::time::Duration) {
        let (n, w) = self.seen;
        if writes > n {
            self.writes += (writes - n).min(u32::MAX as u64) as u32;
            self.waited += waited.saturating_sub(w);
            self.seen = (writes, waited);
        }
    }
}

/// Where in `levels` frames start: the highest at most [`START_LEVEL`] (the session's own when
/// that is higher).
fn start_of(levels: &[i32]) -> usize {
    at_most(levels, START_LEVEL)
}

/// About how long a frame against a prefix takes at `level`, relative to level 3 (django-sdist's
/// frame of 256 KiB against 8 MiB of old data: 35 ms at 6, 109 ms at 9, 770 ms at 15;
/// mbox-append's at 12 and 19: 120 ms and 1.4 s).
fn cost(level: i32) -> f64 {
    const COSTS: [(i32, f64); 7] = [
        (3, 1.0),
        (6, 2.0),
        (9, 6.0),
        (12, 12.0),
        (15, 45.0),
        (17, 70.0),
        (19, 100.0),
    ];
    COSTS
        .iter()
        .find(|&&(l, _)| level <= l)
        .map_or(150.0, |&(_, c)| c)
}

/// The highest of `levels` at most `level` (the lowest when none is).
fn at_most(levels: &[i32], level: i32) -> usize {
    levels.iter().rposition(|&l| l <= level).unwrap_or(0)
}

/// The lowest level of a sender's frames against old data in a session at `level`: its own
/// when fixed; 3 when it follows the link, as a LAN wants (frames start higher unless the
/// link was measured fast, and climb while the link is the bottleneck).
pub fn frame_floor(level: ferry_proto::Level) -> i32 {
    match level {
        ferry_proto::Level::Fixed(l) => l,
        ferry_proto::Level::Adapt => 3,
    }
}

/// Whether `data` hardly compresses on its own (already compressed, say), judged by level 1 on
/// its first 128 KiB (well under a millisecond).
fn hardly_compresses(data: &[u8]) -> bool {
    let sample = &data[..data.len().min(128 << 10)];
    zstd::bulk::compress(sample, 1).is_ok_and(|c| c.len() * 10 >= sample.len() * 9)
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
    let (against, alone) = level.timed(work, data, |level| {
        let alone_level = if data.len() <= SMALL_FRAME {
            level
        } else {
            floor
        };
        let alone = encode(data, &[], alone_level).map_or(usize::MAX, |f| f.len());
        (encode(data, prefix, level), alone)
    });
    let against = against?;
    let compressible = alone * 10 < data.len() * 9;
    let worth = if compressible {
        against.len() * 10 < alone * 9
    } else {
        against.len() < alone
    };
    Ok(worth.then_some(against))
}

/// Sender: compresses `data` as one zstd frame against `prefix`.
pub fn encode(data: &[u8], prefix: &[u8], level: i32) -> io::Result<Vec<u8>> {
    let mut c = CCtx::create();
    c.set_parameter(CParameter::CompressionLevel(level))
        .map_err(zerr)?;
    c.set_parameter(CParameter::WindowLog(window_log(prefix.len() + data.len())))
        .map_err(zerr)?;
    if level < TOP_LEVEL {
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

    /// `n` bytes that do not compress (xorshift from `seed`).
    fn random_bytes(mut x: u64, n: usize) -> Vec<u8> {
        std::iter::repeat_with(|| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .take(n)
        .collect()
    }

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

    #[test]
    fn large_frames_follow_the_link() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let big = 2 << 20;
        const TEXT: &[u8] =
            b"fn main() { println!(\"hello\"); }\nfn main() { println!(\"hello\"); }\n";
        // A large frame compressed in `busy` ms, its write waiting `waited` ms: the next level.
        let next_for = |f: &mut FrameLevel, busy: u64, waited: u64, data: &[u8]| {
            f.compressed(big, ms(busy));
            f.wrote(ms(waited));
            f.level(big, data)
        };
        let next = |f: &mut FrameLevel, busy: u64, waited: u64| next_for(f, busy, waited, TEXT);
        let mut f = FrameLevel::new(9);
        // Frames start at 12, small and large.
        assert_eq!(f.level(1000, TEXT), 12);
        assert_eq!(f.level(big, TEXT), 12);
        // A thin link: writing waited 20 times as long as compressing took; up to the top.
        assert_eq!(next(&mut f, 2000, 40_000), 19);
        // A LAN: the write hardly waited. Down, several steps at once, to the session's level.
        assert_eq!(next(&mut f, 2000, 1), 9);
        assert_eq!(f.level(1000, TEXT), 9, "small frames follow");
        // No write between two large frames (replies gather before they go out): no decision.
        f.compressed(big, ms(2000));
        assert!(f.unwritten());
        assert_eq!(f.level(big, TEXT), 9);
        f.wrote(ms(30_000));
        assert!(!f.unwritten());
        assert_eq!(f.level(big, TEXT), 17);
        assert_eq!(next(&mut f, 2000, 1), 9);
        // Waits between an eighth of the time and all of it: stay.
        assert_eq!(next(&mut f, 100, 50), 9);
        // The link slowed: up as far as compressing would take no longer than the waits (12
        // to 15 costs 3.75 times as much, 17 almost 6 times).
        assert_eq!(next(&mut f, 100, 150), 12);
        assert_eq!(next(&mut f, 100, 450), 15);
        // Waits are counted from the last large frame on: a frame's own write, and any after.
        // A step that costs under twice as much goes on waits just longer than compressing.
        f.compressed(big, ms(1000));
        f.wrote(ms(600));
        f.wrote(ms(600));
        assert_eq!(f.level(big, TEXT), 17);
        // A receiver slower than the link (its writes waited 20 times as long as level 3 took)
        // does not buy level 15 against a large prefix: 12 is 12 times the work of 3.
        let mut f = FrameLevel::new(3);
        f.link_rate(0, 0, Some(ms(1)));
        assert_eq!(next(&mut f, 20, 400), 12);
        // A session at level 19 or above stays there; one below 9 goes down to 9, and to its
        // own on a link measured broad or near.
        assert_eq!(next(&mut FrameLevel::new(22), 2000, 0), 22);
        assert_eq!(next(&mut FrameLevel::new(3), 2000, 0), 9);
        // `timed` decides, runs the work at that level and records it.
        let mut f = FrameLevel::new(9);
        assert_eq!(f.timed(big, TEXT, |level| level), 12);
        assert!(f.unwritten());
        // Large frames of data that hardly compresses go at the session's level, the first
        // too, until writes wait 8 times as long as compressing took; then they follow the
        // link like the rest, until writes wait less than compressing.
        let random = random_bytes(0x9e37_79b9_7f4a_7c15, 200_000);
        assert!(hardly_compresses(&random) && !hardly_compresses(TEXT));
        let mut f = FrameLevel::new(9);
        assert_eq!(f.level(1000, &random), 12, "small frames follow the level");
        assert_eq!(f.level(big, &random), 9);
        // A LAN, where the peer's work makes writes wait a little: stays.
        assert_eq!(next_for(&mut f, 100, 300, &random), 9);
        assert_eq!(
            next_for(&mut f, 100, 300, TEXT),
            12,
            "15 costs over 3 times 12"
        );
        let mut f = FrameLevel::new(9);
        assert_eq!(f.level(big, &random), 9);
        assert_eq!(next_for(&mut f, 100, 10_000, &random), 19);
        assert_eq!(next_for(&mut f, 3000, 5000, &random), 19);
        assert_eq!(next_for(&mut f, 3000, 1000, &random), 9);
    }

    #[test]
    fn large_frames_start_at_12_or_lower_on_a_link_measured_faster() {
        let big = 2 << 20;
        let text = b"fn main() { println!(\"hello\"); }\n".repeat(4);
        let first = |floor: i32, measure: Option<(u64, u64)>| {
            let mut f = FrameLevel::new(floor);
            if let Some((rate, sample)) = measure {
                f.link_rate(rate, sample, None);
            }
            f.level(big, &text)
        };
        assert_eq!(first(9, None), 12);
        assert_eq!(first(9, Some((500_000, 30_000))), 9, "4 Mbit/s");
        assert_eq!(first(3, Some((500_000, 30_000))), 9, "4 Mbit/s");
        assert_eq!(first(3, Some((2_000_000, 30_000))), 6, "16 Mbit/s");
        assert_eq!(first(9, Some((12_500_000, 500))), 9, "100 Mbit/s");
        assert_eq!(first(9, Some((190_000, 30_000))), 19, "1.5 Mbit/s, shown");
        assert_eq!(
            first(9, Some((16_000, 500))),
            12,
            "a round trip proves nothing"
        );
        assert_eq!(first(3, None), 12);
        assert_eq!(first(3, Some((12_500_000, 500))), 3);
        assert_eq!(
            first(19, Some((12_500_000, 500))),
            19,
            "a session at 19 stays"
        );
        assert_eq!(first(22, None), 22);
        // A round trip under 2 ms is a LAN's, whatever the rate measured (none large enough).
        let near = |floor: i32, rate, round_trip| {
            let mut f = FrameLevel::new(floor);
            f.link_rate(rate, 500, Some(Duration::from_micros(round_trip)));
            f.level(big, &text)
        };
        assert_eq!(near(3, 9000, 800), 6);
        assert_eq!(near(9, 9000, 800), 9);
        assert_eq!(
            near(3, 9000, 30_000),
            12,
            "a long link's round trip proves nothing"
        );
        assert_eq!(near(3, 12_500_000, 800), 3);
        // Large frames of data that hardly compresses go at 9 in a session that may go down to
        // 3, until the link is shown broad or near.
        let random = random_bytes(0x2545_f491_4f6c_dd1d, 200_000);
        let mut f = FrameLevel::new(3);
        assert_eq!(f.level(big, &random), 9);
        f.link_rate(2_000_000, 500, None);
        assert_eq!(f.level(big, &random), 3);
        let mut f = FrameLevel::new(3);
        f.link_rate(9000, 500, Some(Duration::from_micros(800)));
        assert_eq!(f.level(big, &random), 3);
        // Writes that did not wait prove nothing: the session goes down to 9 only.
        let mut f = FrameLevel::new(3);
        f.compressed(big, Duration::from_millis(100));
        f.wrote(Duration::from_millis(1));
        assert_eq!(f.level(big, &random), 9);
        assert_eq!(f.level(big, &text), 9);
        let mut f = FrameLevel::new(3);
        f.link_rate(9000, 500, Some(Duration::from_micros(800)));
        f.compressed(big, Duration::from_millis(100));
        f.wrote(Duration::from_millis(1));
        assert_eq!(f.level(big, &text), 3);
        // Later measures replace earlier ones until the first large frame.
        let mut f = FrameLevel::new(9);
        f.link_rate(190_000, 30_000, None);
        f.link_rate(400_000, 60_000, None);
        assert_eq!(f.level(big, &text), 9);
        // After the first large frame, the link's waits lead: a later measure changes nothing.
        let mut f = FrameLevel::new(9);
        assert_eq!(f.timed(big, &text, |l| l), 12);
        f.link_rate(12_500_000, 500, None);
        assert_eq!(f.level(big, &text), 12);
        // Small frames start there too.
        let mut f = FrameLevel::new(9);
        f.link_rate(12_500_000, 500, None);
        assert_eq!(f.level(1000, &text), 9);
        f.link_rate(190_000, 30_000, None);
        assert_eq!(f.level(1000, &text), 19);
    }

    #[test]
    fn small_frames_decide_once_they_add_up() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let text = b"fn main() { println!(\"hello\"); }\n".repeat(4);
        let mut f = FrameLevel::new(9);
        // Small frames of 10 ms, each written after waiting 40 ms (a thin link): no decision
        // until 50 ms of compressing add up, then up (the waits were 4 times as long).
        for _ in 0..5 {
            assert_eq!(f.level(1000, &text), 12);
            f.compressed(1000, ms(10));
            f.wrote(ms(40));
        }
        assert_eq!(f.level(1000, &text), 15);
        // A fast link: the writes hardly wait; down once 50 ms add up again.
        for _ in 0..5 {
            assert_eq!(f.level(1000, &text), 15);
            f.compressed(1000, ms(10));
            f.wrote(ms(0));
        }
        assert_eq!(f.level(1000, &text), 9);
        // The measure of the link counts only until the first decision.
        f.link_rate(190_000, 30_000, None);
        assert_eq!(f.level(1000, &text), 9);
    }
}
