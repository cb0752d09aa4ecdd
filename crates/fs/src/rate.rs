//! How fast the link brings a client the server's bytes, measured from the client's own waits
//! for replies, so the server can pick the level of its large frames from the start (a thin
//! link's idle time buys bytes; on a broad one compressing at level 19 costs more time than the
//! bytes it saves). Told to the server with `Rate` (protocol.md).
//!
//! Two lower bounds of the rate, the best kept:
//! - A request that went alone (the last one queued, none other outstanding): its reply's bytes
//!   over the time from when it went to the last of them. That time also holds the round trip
//!   and the server's work, so on a fast link it says far too little (1.5 MB/s on a 100 Mbit/s
//!   one). A wait for a request sent earlier says nothing: its reply may have been on its way
//!   long before (a few hundred bytes read 70 µs into a wait once "measured" a 4 Mbit/s link at
//!   10 Mbit/s).
//! - The dispersion of any reply: the bytes after the first read, over the time from that read
//!   to the last. A reply the server wrote at once spreads over the link at the link's rate,
//!   with neither the round trip nor the server's work in it (one written piecemeal spreads
//!   wider, which can only say less). Only when the first read waited (a read that returned at
//!   once found bytes that came while the client was busy), did not fill the buffer, and the
//!   rest spread over 50 ms or more.
//!
//! The request that went alone also times a round trip: from when it went to its reply's first
//! bytes. The quickest tells a LAN from a long link where no reply was large enough for a
//! dispersion (a single file's recipe).

use std::time::{Duration, Instant};

/// A first read quicker than this found bytes already there.
const ALREADY_THERE: Duration = Duration::from_micros(50);
/// The dispersion of fewer bytes than this (a few segments), or over less time than
/// [`DISPERSION_SPAN`], says little: bytes held up past the link (an ssh client or this
/// process not scheduled for a few milliseconds) come in a burst that shortens it, by much of
/// a short span.
const DISPERSION_MIN: u64 = 32 << 10;
const DISPERSION_SPAN: Duration = Duration::from_millis(50);

/// The best lower bound of the link's rate so far, the most bytes one measured wait brought,
/// the shortest round trip, and what was last reported of them.
#[derive(Debug, Default)]
pub(crate) struct RateMeter {
    best: u64,
    sample: u64,
    round_trip: Option<Duration>,
    reported: Option<Measure>,
}

/// What the client tells the server (`Rate`): at least `rate` bytes a second, over waits the
/// largest of which brought `sample` bytes; replies came after `round_trip` at the quickest
/// (`None`: not timed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Measure {
    pub(crate) rate: u64,
    pub(crate) sample: u64,
    pub(crate) round_trip: Option<Duration>,
}

/// One wait for a reply, as its reads go.
#[derive(Debug)]
pub(crate) struct Wait {
    bytes: u64,
    /// The first read found bytes already there: no dispersion.
    void: bool,
    reads: u32,
    /// When the first read returned, what it brought, and whether that filled the buffer
    /// (bytes may have waited behind it: no dispersion).
    first: Option<(Instant, u64, bool)>,
    /// When the last read returned.
    last: Option<Instant>,
    /// When the request waited for went, if it went last and with no other outstanding: the
    /// first bytes end a round trip.
    went: Option<Instant>,
}

impl Wait {
    /// A wait for a request that went at `went`, if it times a round trip (see
    /// [`Wait::went`]).
    pub(crate) fn start(went: Option<Instant>) -> Self {
        Wait {
            bytes: 0,
            void: false,
            reads: 0,
            first: None,
            last: None,
            went,
        }
    }

    /// A read that began at `began` into a buffer of `room` bytes brought `n` bytes, just now.
    pub(crate) fn read(&mut self, began: Instant, n: usize, room: usize) {
        let now = Instant::now();
        if self.reads == 0 {
            self.void = now.saturating_duration_since(began) < ALREADY_THERE;
            self.first = Some((now, n as u64, n >= room));
        }
        self.last = Some(now);
        self.reads += 1;
        self.bytes += n as u64;
    }

    /// The dispersion of the reply's bytes: those after the first read, and the time from it
    /// to the last; `None` when it says nothing.
    fn dispersion(&self) -> Option<(u64, Duration)> {
        let (at, n, full) = self.first.filter(|_| !self.void)?;
        let after = self.bytes - n;
        let span = self.last.unwrap_or(at) - at;
        (!full && after >= DISPERSION_MIN && span >= DISPERSION_SPAN).then_some((after, span))
    }

    /// The round trip this wait timed, if it timed one.
    pub(crate) fn round_trip(&self) -> Option<Duration> {
        let (at, _, _) = self.first?;
        Some(at.saturating_duration_since(self.went?))
    }
}

impl RateMeter {
    /// A wait ended (its reply complete): its bounds count if they say anything.
    pub(crate) fn ended(&mut self, w: &Wait) {
        if let (Some(went), Some(last)) = (w.went, w.last) {
            self.take(w.bytes, last.saturating_duration_since(went));
        }
        if let Some((bytes, took)) = w.dispersion() {
            self.take(bytes, took);
        }
        if let Some(rt) = w.round_trip() {
            self.probed(rt);
        }
    }

    fn take(&mut self, bytes: u64, took: Duration) {
        if bytes == 0 {
            return;
        }
        let rate = (bytes as f64 / took.as_secs_f64().max(1e-6)).min(u64::MAX as f64) as u64;
        self.best = self.best.max(rate);
        self.sample = self.sample.max(bytes);
    }

    /// A round trip timed: a reply came `rt` after its request went, at the latest (a Ping's,
    /// or the first of a batch's); the quickest counts.
    pub(crate) fn probed(&mut self, rt: Duration) {
        self.round_trip = Some(self.round_trip.map_or(rt, |r| r.min(rt)));
    }

    /// The quickest round trip timed so far, if any.
    pub(crate) fn round_trip(&self) -> Option<Duration> {
        self.round_trip
    }

    /// The best lower bound so far, if any.
    pub(crate) fn best(&self) -> Option<u64> {
        (self.best > 0).then_some(self.best)
    }

    /// The measure to tell the server, when there is one it has not heard: the first, or one
    /// whose rate or sample is at least twice, or round trip at most half, the last told.
    pub(crate) fn news(&mut self) -> Option<Measure> {
        let now = Measure {
            rate: self.best,
            sample: self.sample,
            round_trip: self.round_trip,
        };
        let new = match self.reported {
            _ if now.rate == 0 && now.round_trip.is_none() => false,
            None => true,
            Some(was) => {
                now.rate / 2 >= was.rate
                    || now.sample / 2 >= was.sample
                    || now
                        .round_trip
                        .is_some_and(|r| was.round_trip.is_none_or(|w| r * 2 <= w))
            }
        };
        new.then(|| {
            self.reported = Some(now);
            now
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_bound_is_reported_once_and_again_when_it_doubles() {
        let ms = Duration::from_millis;
        let mut m = RateMeter::default();
        assert_eq!(m.news(), None, "nothing measured");
        m.take(0, ms(1));
        assert_eq!(m.news(), None);
        // 30 KB in 80 ms (a recipe over DSL): 375 KB/s.
        m.take(30_000, ms(80));
        let told = |rate, sample| {
            Some(Measure {
                rate,
                sample,
                round_trip: None,
            })
        };
        assert_eq!(m.news(), told(375_000, 30_000));
        assert_eq!(m.news(), None, "told once");
        // Slower waits (the server working) do not lower it; a faster one under twice neither.
        m.take(3_000, ms(80));
        m.take(50_000, ms(100));
        assert_eq!(m.news(), None);
        m.take(75_000, ms(100));
        assert_eq!(m.news(), told(750_000, 75_000));
        // A sample twice as large is news even at a lower rate.
        m.take(150_000, ms(1000));
        assert_eq!(m.news(), told(750_000, 150_000));
    }

    #[test]
    fn only_a_request_that_went_alone_bounds_the_rate_by_its_wait() {
        // A reply of 300 bytes read 70 µs into the wait for a request sent earlier.
        let mut w = wait_of(&[(0, 300)], 1 << 20);
        w.went = None;
        let mut m = RateMeter::default();
        m.ended(&w);
        assert_eq!(m.best(), None);
        // 300 bytes 30 ms after the request went alone: at least 10 KB/s.
        m.ended(&wait_of(&[(30, 300)], 1 << 20));
        assert_eq!(m.best(), Some(10_000));
    }

    #[test]
    fn a_first_read_that_waited_counts_one_that_found_bytes_there_does_not() {
        let mut w = Wait::start(None);
        let began = Instant::now() - Duration::from_millis(5);
        w.read(began, 4096, 65536);
        w.read(Instant::now(), 4096, 65536);
        assert!(!w.void);
        assert_eq!(w.bytes, 8192);
        let mut w = Wait::start(None);
        w.read(Instant::now() + Duration::from_secs(1), 4096, 65536);
        assert!(w.void);
    }

    /// A wait as its reads went: (ms after the wait began, as its request went, that each
    /// read returned, bytes), the first read having waited.
    fn wait_of(reads: &[(u64, u64)], room: usize) -> Wait {
        let started = Instant::now();
        let at = |ms| started + Duration::from_millis(ms);
        let mut w = Wait::start(Some(started));
        for (i, &(ms, n)) in reads.iter().enumerate() {
            if i == 0 {
                w.void = false;
                w.first = Some((at(ms), n, n as usize >= room));
            }
            w.last = Some(at(ms));
            w.reads += 1;
            w.bytes += n;
        }
        w
    }

    #[test]
    fn the_dispersion_of_a_reply_leaves_out_the_round_trip_and_the_servers_work() {
        // 100 KB after a 50 ms wait (a round trip and the server's work), then 600 KB over
        // 60 ms: the link brings 10 MB/s; the whole wait says under 6.4 MB/s.
        let reads = [(50, 100_000), (70, 200_000), (90, 200_000), (110, 200_000)];
        let w = wait_of(&reads, 256 << 10);
        assert_eq!(w.dispersion(), Some((600_000, Duration::from_millis(60))));
        let mut m = RateMeter::default();
        m.ended(&w);
        assert_eq!(m.best(), Some(10_000_000));
        assert_eq!(m.sample, 700_000, "the whole wait's bytes");
        // Over less than 50 ms a burst could halve the span: nothing.
        let short = wait_of(&[(50, 100_000), (60, 100_000), (90, 100_000)], 256 << 10);
        assert_eq!(short.dispersion(), None);
        // A first read that filled the buffer may have left bytes behind it: no dispersion.
        assert_eq!(wait_of(&reads, 100_000).dispersion(), None);
        // Nor from a few KB after the first read, nor from a wait that found bytes there.
        assert_eq!(
            wait_of(&[(50, 4000), (51, 20_000)], 1 << 20).dispersion(),
            None
        );
        let mut w = wait_of(&reads, 256 << 10);
        w.void = true;
        assert_eq!(w.dispersion(), None);
    }

    #[test]
    fn the_quickest_reply_to_a_request_alone_times_the_round_trip() {
        let ms = Duration::from_millis;
        let mut m = RateMeter::default();
        // The first bytes of a reply came 30 ms after its request went, the rest 20 ms later.
        m.ended(&wait_of(&[(30, 1000), (50, 1000)], 1 << 20));
        let first = m.news().expect("a measure");
        assert_eq!(first.round_trip, Some(ms(30)));
        // Slower replies (the server working) change nothing; one under half is news.
        m.ended(&wait_of(&[(45, 1000)], 1 << 20));
        m.ended(&wait_of(&[(16, 10)], 1 << 20));
        assert_eq!(m.news(), None);
        m.ended(&wait_of(&[(1, 10)], 1 << 20));
        assert_eq!(m.news().and_then(|n| n.round_trip), Some(ms(1)));
        // A wait for a request sent earlier, or with others outstanding, times no round trip.
        // One that found the reply there times one no shorter than the real (an upper bound).
        let mut w = wait_of(&[(0, 10)], 1 << 20);
        w.went = None;
        assert_eq!(w.round_trip(), None);
        let mut w = wait_of(&[(3, 10)], 1 << 20);
        w.void = true;
        assert_eq!(w.round_trip(), Some(ms(3)));
    }
}
