//! Local sources ahead of remote ones: what a device may hold waits for it while it is not
//! known to be slower than the link; a link of unknown rate may probe to get measured.

use std::collections::VecDeque;
use std::time::Instant;

use super::{Seat, BATCH_TIME, FIRST_BATCH_BYTES, RATE_SAMPLE};
use crate::Want;

/// The wants source `s` may serve, in the order it takes them: first those no local source
/// before it (`ahead`) may have, in the order wanted; then those one may, from the last (it
/// takes them only once that source turns out slower, from the end the other does not reach
/// first).
pub(super) fn queue(s: usize, ahead: u64, may: &[u64]) -> VecDeque<usize> {
    let mine = |w: &usize| may[*w] & (1 << s) != 0;
    let (first, later): (Vec<usize>, Vec<usize>) = (0..may.len())
        .filter(mine)
        .partition(|&w| may[w] & ahead == 0);
    first.into_iter().chain(later.into_iter().rev()).collect()
}

impl Seat {
    /// Its rate: measured in this fetch, else as the source knew it.
    pub(super) fn speed(&self) -> Option<f64> {
        self.rate.or(self.hint)
    }

    /// Its rate at most, now: a batch of B bytes waited for T says the source carries less
    /// than B/T (a device that stalls, a stuck read, shows as slow as it goes on).
    pub(super) fn speed_now(&self, wants: &[Want], now: Instant) -> Option<f64> {
        let bound = self
            .outstanding
            .front()
            .zip(self.waiting)
            .map(|(b, since)| {
                let bytes: u64 = b.iter().map(|&w| wants[w].len as u64).sum();
                bytes as f64 / now.duration_since(since).as_secs_f64().max(1e-9)
            });
        match (self.speed(), bound) {
            (Some(k), Some(b)) => Some(k.min(b)),
            (k, b) => k.or(b),
        }
    }
}

/// The local sources ahead of `s` (bit t) that what they may have still waits for, now: alive
/// and not known to be slower than `s` (a device is searched first; the network takes what it
/// holds only once the device is the slower).
pub(super) fn blocking(s: usize, seats: &[Seat], wants: &[Want], now: Instant) -> u64 {
    let mut ahead = seats[s].ahead;
    let mut out = 0;
    while ahead != 0 {
        let t = ahead.trailing_zeros() as usize;
        ahead &= ahead - 1;
        if seats[t].alive && !slower(t, s, seats, wants, now) {
            out |= 1 << t;
        }
    }
    out
}

/// Whether local source `t` is known to be slower, now, than source `s`.
pub(super) fn slower(t: usize, s: usize, seats: &[Seat], wants: &[Want], now: Instant) -> bool {
    matches!(
        (seats[t].speed_now(wants, now), seats[s].speed()),
        (Some(a), Some(b)) if a < b
    )
}

/// A probe's bytes: a quarter second at the least rate the source is known to carry, at least
/// enough to measure it by, at most a first batch.
pub(super) fn probe_bytes(hint: Option<f64>) -> usize {
    let at_hint = hint.map_or(0, |h| (h * BATCH_TIME.as_secs_f64()) as usize);
    at_hint.clamp(RATE_SAMPLE as usize, FIRST_BATCH_BYTES)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::{Duration, Instant};

    use super::*;
    use ferry_format::{HashAlg, Id};

    fn seat(local: bool, rate: Option<f64>, ahead: u64) -> Seat {
        Seat {
            queue: VecDeque::new(),
            outstanding: VecDeque::new(),
            depth: 1,
            batch: crate::Batch {
                chunks: 8,
                bytes: 1 << 20,
            },
            local,
            alive: true,
            tx: std::sync::mpsc::channel().0,
            rate,
            hint: None,
            ahead,
            waiting: None,
            carried: 0,
            served: Duration::ZERO,
        }
    }

    fn wants(n: usize, len: u32) -> Vec<Want> {
        (0..n)
            .map(|i| Want {
                id: Id::hash(HashAlg::Blake3, &i.to_le_bytes()),
                len,
                place: None,
            })
            .collect()
    }

    #[test]
    fn what_a_local_source_ahead_may_have_comes_last_and_from_the_end() {
        // Source 1 after local source 0, which may have wants 1 and 3.
        let may = [0b10, 0b11, 0b10, 0b11, 0b10];
        assert_eq!(Vec::from(queue(1, 0b01, &may)), [0, 2, 4, 3, 1]);
        // Nothing local ahead: in the order wanted.
        assert_eq!(Vec::from(queue(1, 0, &may)), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_local_source_blocks_until_it_is_known_slower() {
        let w = wants(4, 1000);
        let now = Instant::now();
        // The link's rate unknown: the device blocks, whatever its own.
        let mut seats = [seat(true, Some(1e6), 0), seat(false, None, 0b1)];
        assert_eq!(blocking(1, &seats, &w, now), 0b1);
        // The link faster: it no longer does; slower: it does.
        seats[1].rate = Some(1e7);
        assert_eq!(blocking(1, &seats, &w, now), 0);
        seats[1].rate = Some(1e5);
        assert_eq!(blocking(1, &seats, &w, now), 0b1);
        // A device gone blocks nothing.
        seats[0].alive = false;
        assert_eq!(blocking(1, &seats, &w, now), 0);
    }

    #[test]
    fn a_device_waited_for_shows_ever_slower() {
        let w = wants(4, 250_000);
        let mut d = seat(true, Some(1e9), 0);
        let t0 = Instant::now();
        d.outstanding.push_back(vec![0, 1, 2, 3]);
        d.waiting = Some(t0);
        // A megabyte waited for ten seconds: at most 100 kB/s, whatever it did before.
        let at = d.speed_now(&w, t0 + Duration::from_secs(10)).unwrap();
        assert!((at - 1e5).abs() < 1.0, "{at}");
        let link = seat(false, Some(1e6), 0b1);
        let seats = [d, link];
        assert!(slower(0, 1, &seats, &w, t0 + Duration::from_secs(10)));
        assert!(!slower(0, 1, &seats, &w, t0 + Duration::from_millis(100)));
    }

    #[test]
    fn a_probe_is_a_quarter_second_at_the_known_rate_within_bounds() {
        assert_eq!(probe_bytes(None), 16 << 10);
        assert_eq!(probe_bytes(Some(12_500.0)), 16 << 10, "100 kbit/s");
        assert_eq!(probe_bytes(Some(400_000.0)), 100_000);
        assert_eq!(probe_bytes(Some(1e9)), 256 << 10);
    }
}
