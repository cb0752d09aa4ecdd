//! How fast the link brings a client the server's bytes, measured from the client's own waits
//! for replies, so the server can pick the level of its large frames from the start (a thin
//! link's idle time buys bytes; on a broad one compressing at level 19 costs more time than the
//! bytes it saves). Told to the server with `Rate` (protocol.md).
//!
//! Each wait for a reply gives a lower bound: the bytes that arrived during it, over its time
//! (which also holds the round trip and the server's work, so it can only say too little). A
//! wait whose first read returned at once read bytes that arrived before it began (the client
//! was busy while the link delivered), and says nothing. The measure is the best bound so far,
//! with the most bytes one measured wait brought: a bound from a few hundred bytes is a round
//! trip's, from tens of KB the link's own.

use std::time::{Duration, Instant};

/// A first read quicker than this found bytes already there.
const ALREADY_THERE: Duration = Duration::from_micros(50);

/// The best lower bound of the link's rate so far, the most bytes one measured wait brought,
/// and what was last reported of both.
#[derive(Debug, Default)]
pub(crate) struct RateMeter {
    best: u64,
    sample: u64,
    reported: (u64, u64),
}

/// One wait for a reply, as its reads go.
#[derive(Debug)]
pub(crate) struct Wait {
    started: Instant,
    bytes: u64,
    /// The first read found bytes already there: this wait says nothing.
    void: bool,
    reads: u32,
}

impl Wait {
    pub(crate) fn start() -> Self {
        Wait {
            started: Instant::now(),
            bytes: 0,
            void: false,
            reads: 0,
        }
    }

    /// A read that began at `began` brought `n` bytes, just now.
    pub(crate) fn read(&mut self, began: Instant, n: usize) {
        if self.reads == 0 && began.elapsed() < ALREADY_THERE {
            self.void = true;
        }
        self.reads += 1;
        self.bytes += n as u64;
    }
}

impl RateMeter {
    /// A wait ended (its reply complete): its bound counts if it says anything.
    pub(crate) fn ended(&mut self, w: &Wait) {
        self.take(w.void, w.bytes, w.started.elapsed());
    }

    fn take(&mut self, void: bool, bytes: u64, took: Duration) {
        if void || bytes == 0 {
            return;
        }
        let rate = (bytes as f64 / took.as_secs_f64().max(1e-6)).min(u64::MAX as f64) as u64;
        self.best = self.best.max(rate);
        self.sample = self.sample.max(bytes);
    }

    /// The best lower bound so far, if any.
    pub(crate) fn best(&self) -> Option<u64> {
        (self.best > 0).then_some(self.best)
    }

    /// The measure to tell the server (rate, sample), when there is one it has not heard: the
    /// first, or one whose rate or sample is at least twice the last told.
    pub(crate) fn news(&mut self) -> Option<(u64, u64)> {
        let (rate, sample) = self.reported;
        let new =
            self.best > 0 && (rate == 0 || self.best / 2 >= rate || self.sample / 2 >= sample);
        new.then(|| {
            self.reported = (self.best, self.sample);
            self.reported
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
        // Bytes that were already there say nothing.
        m.take(true, 1 << 20, ms(1));
        m.take(false, 0, ms(1));
        assert_eq!(m.news(), None);
        // 30 KB in 80 ms (a recipe over DSL): 375 KB/s.
        m.take(false, 30_000, ms(80));
        assert_eq!(m.news(), Some((375_000, 30_000)));
        assert_eq!(m.news(), None, "told once");
        // Slower waits (the server working) do not lower it; a faster one under twice neither.
        m.take(false, 3_000, ms(80));
        m.take(false, 50_000, ms(100));
        assert_eq!(m.news(), None);
        m.take(false, 75_000, ms(100));
        assert_eq!(m.news(), Some((750_000, 75_000)));
        // A sample twice as large is news even at a lower rate.
        m.take(false, 150_000, ms(1000));
        assert_eq!(m.news(), Some((750_000, 150_000)));
    }

    #[test]
    fn a_first_read_that_waited_counts_one_that_found_bytes_there_does_not() {
        let mut w = Wait::start();
        let began = Instant::now() - Duration::from_millis(5);
        w.read(began, 4096);
        w.read(Instant::now(), 4096);
        assert!(!w.void);
        assert_eq!(w.bytes, 8192);
        let mut w = Wait::start();
        w.read(Instant::now() + Duration::from_secs(1), 4096);
        assert!(w.void);
    }
}
