//! The level of a sender's frames against old data: where it starts, given the receiver's
//! measure of the link, and how it follows the link as frames go (docs/protocol.md, "The level
//! of a frame against old data").

use std::time::Duration;

use super::{SMALL_FRAME, TOP_LEVEL};

/// The level of a sender's frames against old data, following the link: it starts at
/// level 9 (or the session's own on a link the receiver measured fast, the top on one
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
    /// The receiver's measure of the link, bytes a second (0: none).
    rate: u64,
    /// How long the last frame took to compress.
    last_took: Duration,
    /// Frames of data that hardly compresses to send plain before trying one against old data
    /// again, and how many were skipped last time (doubling, up to [`MAX_PLAIN_RUN`]).
    plain_left: u32,
    plain_run: u32,
    /// Replies came within [`NEAR`] of their requests: small frames go at the session's level.
    near: bool,
}

/// Frames of data that hardly compresses sent plain in a row before one is tried against old
/// data again: at first (a reply carries 3 MiB at most, so 8 cover 24 MiB), and at most.
const FIRST_PLAIN_RUN: u32 = 8;
const MAX_PLAIN_RUN: u32 = 64;

/// Small frames since the last decision must have taken this long in all for the next: a few
/// milliseconds of compressing and a write that waited as long say little.
const DECIDE_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// The level large frames start at on a link not measured: a frame alone, its time not hidden
/// behind the link's sending of others. mbox-append's one frame (300 KB of new mail against 4
/// MiB of the mailbox) over a 30 ms round trip: 48.7 KiB in 88 ms at 9, 47.6 KiB in 285 ms at
/// 12, 42.1 KB in 1.4 s at 19 (its binary trees index the whole prefix; the levels from 13 up
/// take as long). 12 pays over 9 only under about 45 kbit/s (5.6 KB/s), and by 1.5 % of the
/// time at 10 kbit/s; on the lab's DSL (4 Mbit/s) it cost 0.2 s of a fetch of 1.4 s. Once a
/// frame is out, the link's waits lead: a link the sender waits on buys level 19's bytes with
/// time it would idle anyway.
const START_LEVEL: i32 = 9;
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
/// trip is over 10 ms): frames start as on a fast one, even where no reply was large enough
/// to measure the rate (a single file's recipe). mbox-append's frame (300 KB of new mail
/// against 4 MiB of the mailbox, `zstd --patch-from`): 57.8 KB in 0.02 s at 3, 51.0 KB in
/// 0.07 s at 6; level 6 pays only under about 1 Mbit/s, which no LAN is. (8 ms, not 5: a
/// Wi-Fi LAN's round trips take a few, and a Ping through ssh over the lab's LAN (0.2 ms),
/// client and server cutting 20 MB on the same two cores, came back after 1.3 to 6.6 ms; the
/// lab's T1 takes 10 ms and more.)
pub(crate) const NEAR: Duration = Duration::from_millis(8);
const THIN_SAMPLE: u64 = 16 << 10;

/// Whether the receiver's measure shows a broad or near link (a LAN): there, frames start low
/// and the session's stream may go below its starting level.
pub fn fast_link(rate: u64, round_trip: Option<Duration>) -> bool {
    rate >= BROAD_LINK || round_trip.is_some_and(|r| r < NEAR)
}

/// Whether replies came within 8 ms of their requests: a LAN, or this machine, where the
/// session's stream starts low (`Outflow::near_link`).
pub fn near_link(round_trip: Option<Duration>) -> bool {
    round_trip.is_some_and(|r| r < NEAR)
}

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
            rate: 0,
            last_took: Duration::ZERO,
            plain_left: 0,
            plain_run: 0,
            near: false,
        }
    }

    /// The receiver measured the link bringing it at least `rate` bytes a second, over replies
    /// the largest of which was `sample` bytes, and replies coming `round_trip` after their
    /// requests at the quickest: on a fast or near link large frames start at the session's
    /// own level, on a broad one low, on one shown thin at the top (until the first large
    /// frame; after it, the link's waits lead); on a near one small frames go at the session's
    /// level.
    pub fn link_rate(&mut self, rate: u64, sample: u64, round_trip: Option<Duration>) {
        self.rate = rate;
        let near = round_trip.is_some_and(|r| r < NEAR);
        self.near = near;
        if self.started {
            return;
        }
        if fast_link(rate, round_trip) {
            self.lowest = 0;
        }
        self.at = if rate >= FAST_LINK || near {
            0
        } else if rate >= BROAD_LINK {
            at_most(&self.levels, 6)
        } else if rate >= THIN_LINK {
            at_most(&self.levels, 9)
        } else if sample >= THIN_SAMPLE {
            self.levels.len() - 1
        } else {
            start_of(&self.levels)
        };
    }

    /// Whether `data` goes plain rather than in a frame against old data: while frames of data
    /// that hardly compresses (archives) save less link time than they take (see
    /// [`hard_frame`](Self::hard_frame)), such data skips them for a while.
    pub fn plain_is_better(&mut self, data: &[u8]) -> bool {
        // A link that writes wait on at least as long as compressing took hides the frames'
        // time: they cost nothing there, and every byte they save counts.
        let link_bound =
            self.thin || (self.writes > 0 && self.busy.is_some_and(|b| self.waited >= b));
        if self.plain_left == 0 || link_bound || !hardly_compresses(data) {
            return false;
        }
        self.plain_left -= 1;
        true
    }

    /// A frame of data that hardly compresses saved `saved` bytes against old data. Worth it
    /// when those bytes take the link (at the receiver's measure) longer than twice the frame's
    /// compressing (the receiver decompresses it against the same prefix): then the next such
    /// frames are tried too; else the next 8, 16, 32 or 64 go plain before one is tried again.
    /// Warm django-sdist (a .tar.gz) in the lab's LAN: 1.73 s with such frames, 1.41 s
    /// without, 0.6 % more bytes; numpy-whl-raw (a wheel) saves 10 % and keeps them; on DSL
    /// writes wait and frames go on.
    pub fn hard_frame(&mut self, saved: usize) {
        let link = match self.rate {
            0 => f64::INFINITY,
            r => saved as f64 / r as f64,
        };
        if link > 2.0 * self.last_took.as_secs_f64() {
            self.plain_run = 0;
            self.plain_left = 0;
        } else {
            self.plain_run = (self.plain_run * 2).clamp(FIRST_PLAIN_RUN, MAX_PLAIN_RUN);
            self.plain_left = self.plain_run;
        }
    }

    /// The session's own level, the lowest.
    pub fn floor(&self) -> i32 {
        self.levels[0]
    }

    /// The level for a frame of `bytes` of work, its data starting with `sample` (compressed
    /// elsewhere: [`took`](Self::took) then says how long that took).
    pub fn pick(&mut self, bytes: usize, sample: &[u8]) -> i32 {
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
            // On a near link a small frame's bytes cost less than compressing them harder:
            // a mount's commit of a few SQLite pages against 40 KiB took 90 µs at level 6,
            // 30 at 3, and SQLite's transactions through a mount waited on it three times each.
            return match self.near {
                true => self.levels[0],
                false => self.levels[self.at],
            };
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
        let level = self.pick(bytes, data);
        let started = std::time::Instant::now();
        let out = compress(level);
        self.took(bytes, level, started.elapsed());
        out
    }

    /// A frame of `bytes` of work at `level` (its [`pick`](Self::pick)) took `took` to compress.
    pub fn took(&mut self, bytes: usize, level: i32, took: Duration) {
        tracing::debug!("a frame of {bytes} bytes of work at level {level}: {took:?}");
        self.compressed(bytes, took);
    }

    /// A frame of `bytes` of work was compressed in `busy`: it joins the frames since the last
    /// decision (the first of them starts counting the writes).
    fn compressed(&mut self, bytes: usize, busy: std::time::Duration) {
        self.last_took = busy;
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
            f.pick(big, data)
        };
        let next = |f: &mut FrameLevel, busy: u64, waited: u64| next_for(f, busy, waited, TEXT);
        let mut f = FrameLevel::new(9);
        // Frames start at 9, small and large.
        assert_eq!(f.pick(1000, TEXT), 9);
        assert_eq!(f.pick(big, TEXT), 9);
        // A thin link: writing waited 20 times as long as compressing took; up to the top.
        assert_eq!(next(&mut f, 2000, 40_000), 19);
        // A LAN: the write hardly waited. Down, several steps at once, to the session's level.
        assert_eq!(next(&mut f, 2000, 1), 9);
        assert_eq!(f.pick(1000, TEXT), 9, "small frames follow");
        // No write between two large frames (replies gather before they go out): no decision.
        f.compressed(big, ms(2000));
        assert!(f.unwritten());
        assert_eq!(f.pick(big, TEXT), 9);
        f.wrote(ms(30_000));
        assert!(!f.unwritten());
        assert_eq!(f.pick(big, TEXT), 17);
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
        assert_eq!(f.pick(big, TEXT), 17);
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
        let mut f = FrameLevel::new(3);
        assert_eq!(f.timed(big, TEXT, |level| level), 9);
        assert!(f.unwritten());
        // Large frames of data that hardly compresses go at the session's level, the first
        // too, until writes wait 8 times as long as compressing took; then they follow the
        // link like the rest, until writes wait less than compressing.
        let random = random_bytes(0x9e37_79b9_7f4a_7c15, 200_000);
        assert!(hardly_compresses(&random) && !hardly_compresses(TEXT));
        // Such data goes plain for a while after a frame of it saved less link time than
        // compressing took (twice: the receiver decompresses too); text never does.
        let mut f = FrameLevel::new(3);
        f.link_rate(10 << 20, 0, None);
        f.compressed(big, ms(20));
        for round in [8, 16, 32] {
            f.hard_frame(100 << 10); // 10 ms of link for 40 ms of work
            assert!(!f.plain_is_better(TEXT));
            for _ in 0..round {
                assert!(f.plain_is_better(&random));
            }
            assert!(!f.plain_is_better(&random), "tried again after {round}");
        }
        f.hard_frame(1 << 20); // 100 ms of link: worth it, frames go on
        assert!(!f.plain_is_better(&random));
        f.hard_frame(100 << 10);
        for _ in 0..8 {
            assert!(f.plain_is_better(&random), "from 8 skipped again");
        }
        assert!(!f.plain_is_better(&random));
        // Once writes wait on the link as long as compressing took, frames are tried again.
        let mut f = FrameLevel::new(3);
        f.link_rate(10 << 20, 0, None);
        f.compressed(big, ms(20));
        f.hard_frame(100 << 10);
        assert!(f.plain_is_better(&random));
        f.saw_writes(1, ms(25));
        assert!(!f.plain_is_better(&random));
        // On a link not measured, or a slow one, the same saving is worth it.
        for rate in [0, 1 << 20] {
            let mut f = FrameLevel::new(3);
            f.link_rate(rate, 0, None);
            f.compressed(big, ms(20));
            f.hard_frame(100 << 10);
            assert!(!f.plain_is_better(&random));
        }
        let mut f = FrameLevel::new(9);
        assert_eq!(f.pick(1000, &random), 9, "small frames follow the level");
        assert_eq!(f.pick(big, &random), 9);
        // A LAN, where the peer's work makes writes wait a little: stays.
        assert_eq!(next_for(&mut f, 100, 300, &random), 9);
        assert_eq!(
            next_for(&mut f, 100, 300, TEXT),
            12,
            "15 costs over 3 times 12"
        );
        let mut f = FrameLevel::new(9);
        assert_eq!(f.pick(big, &random), 9);
        assert_eq!(next_for(&mut f, 100, 10_000, &random), 19);
        assert_eq!(next_for(&mut f, 3000, 5000, &random), 19);
        assert_eq!(next_for(&mut f, 3000, 1000, &random), 9);
    }

    #[test]
    fn large_frames_start_at_9_or_lower_on_a_link_measured_faster() {
        let big = 2 << 20;
        let text = b"fn main() { println!(\"hello\"); }\n".repeat(4);
        let first = |floor: i32, measure: Option<(u64, u64)>| {
            let mut f = FrameLevel::new(floor);
            if let Some((rate, sample)) = measure {
                f.link_rate(rate, sample, None);
            }
            f.pick(big, &text)
        };
        assert_eq!(first(9, None), 9);
        assert_eq!(first(9, Some((500_000, 30_000))), 9, "4 Mbit/s");
        assert_eq!(first(3, Some((500_000, 30_000))), 9, "4 Mbit/s");
        assert_eq!(first(3, Some((2_000_000, 30_000))), 6, "16 Mbit/s");
        assert_eq!(first(9, Some((12_500_000, 500))), 9, "100 Mbit/s");
        assert_eq!(first(9, Some((190_000, 30_000))), 19, "1.5 Mbit/s, shown");
        assert_eq!(
            first(9, Some((16_000, 500))),
            9,
            "a round trip proves nothing"
        );
        assert_eq!(first(3, None), 9);
        assert_eq!(first(12, None), 12, "a session at 12 starts there");
        assert_eq!(first(3, Some((12_500_000, 500))), 3);
        assert_eq!(
            first(19, Some((12_500_000, 500))),
            19,
            "a session at 19 stays"
        );
        assert_eq!(first(22, None), 22);
        // A round trip under 8 ms is a LAN's, whatever the rate measured (none large enough).
        let near = |floor: i32, rate, round_trip| {
            let mut f = FrameLevel::new(floor);
            f.link_rate(rate, 500, Some(Duration::from_micros(round_trip)));
            f.pick(big, &text)
        };
        assert_eq!(near(3, 9000, 800), 3);
        assert_eq!(near(9, 9000, 800), 9);
        // A LAN's Ping through ssh on a loaded machine (the lab's, up to 6.6 ms), not a T1's
        // (10 ms and more).
        assert_eq!(near(3, 9000, 6_600), 3);
        assert_eq!(near(3, 9000, 10_000), 9);
        assert_eq!(
            near(3, 9000, 30_000),
            9,
            "a long link's round trip proves nothing"
        );
        assert_eq!(near(3, 12_500_000, 800), 3);
        // Small frames go at the session's level on a near link, not on a far one.
        let small = |round_trip| {
            let mut f = FrameLevel::new(3);
            f.link_rate(9000, 500, Some(Duration::from_micros(round_trip)));
            f.pick(48 << 10, &text)
        };
        assert_eq!(small(800), 3);
        assert_eq!(small(30_000), 9);
        // Large frames of data that hardly compresses go at 9 in a session that may go down to
        // 3, until the link is shown broad or near.
        let random = random_bytes(0x2545_f491_4f6c_dd1d, 200_000);
        let mut f = FrameLevel::new(3);
        assert_eq!(f.pick(big, &random), 9);
        f.link_rate(2_000_000, 500, None);
        assert_eq!(f.pick(big, &random), 3);
        let mut f = FrameLevel::new(3);
        f.link_rate(9000, 500, Some(Duration::from_micros(800)));
        assert_eq!(f.pick(big, &random), 3);
        // Writes that did not wait prove nothing: the session goes down to 9 only.
        let mut f = FrameLevel::new(3);
        f.compressed(big, Duration::from_millis(100));
        f.wrote(Duration::from_millis(1));
        assert_eq!(f.pick(big, &random), 9);
        assert_eq!(f.pick(big, &text), 9);
        let mut f = FrameLevel::new(3);
        f.link_rate(9000, 500, Some(Duration::from_micros(800)));
        f.compressed(big, Duration::from_millis(100));
        f.wrote(Duration::from_millis(1));
        assert_eq!(f.pick(big, &text), 3);
        // Later measures replace earlier ones until the first large frame.
        let mut f = FrameLevel::new(9);
        f.link_rate(190_000, 30_000, None);
        f.link_rate(400_000, 60_000, None);
        assert_eq!(f.pick(big, &text), 9);
        // After the first large frame, the link's waits lead: a later measure changes nothing.
        let mut f = FrameLevel::new(3);
        assert_eq!(f.timed(big, &text, |l| l), 9);
        f.link_rate(12_500_000, 500, None);
        assert_eq!(f.pick(big, &text), 9);
        // Small frames start there too.
        let mut f = FrameLevel::new(9);
        f.link_rate(12_500_000, 500, None);
        assert_eq!(f.pick(1000, &text), 9);
        f.link_rate(190_000, 30_000, None);
        assert_eq!(f.pick(1000, &text), 19);
    }

    #[test]
    fn small_frames_decide_once_they_add_up() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let text = b"fn main() { println!(\"hello\"); }\n".repeat(4);
        let mut f = FrameLevel::new(9);
        // Small frames of 10 ms, each written after waiting 40 ms (a thin link): no decision
        // until 50 ms of compressing add up, then up (the waits were 4 times as long: 12 costs
        // twice as much as 9, 15 over 7 times).
        for _ in 0..5 {
            assert_eq!(f.pick(1000, &text), 9);
            f.compressed(1000, ms(10));
            f.wrote(ms(40));
        }
        assert_eq!(f.pick(1000, &text), 12);
        // A fast link: the writes hardly wait; down once 50 ms add up again.
        for _ in 0..5 {
            assert_eq!(f.pick(1000, &text), 12);
            f.compressed(1000, ms(10));
            f.wrote(ms(0));
        }
        assert_eq!(f.pick(1000, &text), 9);
        // The measure of the link counts only until the first decision.
        f.link_rate(190_000, 30_000, None);
        assert_eq!(f.pick(1000, &text), 9);
    }
}
