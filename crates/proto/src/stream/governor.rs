//! The adaptive stream's level: how an `Outflow` at `Level::Adapt` follows the link from how
//! long compressing and writing took (docs/protocol.md).

/// The levels an adaptive stream moves between: up one or more steps at a time, down one.
/// Below 9 only on a link known to be fast, when the compressor holds it up: a cold get of
/// `/usr/include` (7,962 files) through a pipe took 2.18 s with 9 as the floor, 1.86 s with 3.
/// 0 is off: every frame goes raw (see [`RAW_MAGIC`](super::RAW_MAGIC)), for a link faster
/// than even level 1 compresses (a local pipe, a fast LAN: zstd -1 makes about 200 MB/s of the
/// kernel's headers on this 2-core machine, a pipe carries several GB/s); a trial, kept only if
/// the plain bytes a second do not drop, as every move on a fast link.
pub(super) const ADAPT_LEVELS: [i32; 9] = [0, 1, 3, 6, 9, 12, 15, 17, 19];
pub(super) const ADAPT_START: usize = 4;
/// Where a stream starts on a near link (see `Outflow::near_link`): level 3.
const NEAR_START: usize = 2;
/// On a fast link a move is a trial, kept only if the next span's plain bytes a second are
/// at least this much of the last span's (a step up: more than that, by the inverse).
const TRIAL_KEEP: f64 = 0.95;
/// Plain bytes compressed between two decisions: enough for the transport's buffers (pipes,
/// ssh, the kernel's socket) to fill, so that waiting on them means the link is slow.
pub(super) const ADAPT_SPAN: u64 = 1 << 20;
/// Decisions during which a level just left for being too slow is not tried again.
const ADAPT_HOLD: u32 = 4;
/// Spans in a row with the compressor as the bottleneck before a step down.
const ADAPT_SLOW: u32 = 4;

/// Decides an adaptive stream's level from how long compressing and writing took.
#[derive(Debug)]
pub(super) struct Governor {
    at: usize,
    plain: u64,
    busy: std::time::Duration,
    waited: std::time::Duration,
    wall: std::time::Duration,
    /// A level stepped down from, and for how many more decisions it stays out of reach.
    held: Option<(usize, u32)>,
    /// Spans in a row that found the compressor the bottleneck.
    slow: u32,
    /// The lowest level it may step down to: its start, until the link is known to be fast
    /// (on a slow one, the transport's buffers take the first megabytes without a wait, and
    /// that must not pass for a compressor holding the link up).
    pub(super) floor: usize,
    /// On a fast link: the level just left and the plain bytes a second at it, until the next
    /// span says whether the move paid.
    trial: Option<(usize, f64)>,
    /// A level a step down to did not pay, and for how many more decisions it stays out of
    /// reach.
    held_low: Option<(usize, u32)>,
    /// Trials up and down in a row that did not pay: each doubles how long the next such
    /// level is held out of reach (a far end that is the slower would otherwise have every
    /// other span at a level it cannot use).
    failed: (u32, u32),
    /// Whether it has left its start (by a decision, or for a near link).
    moved: bool,
}

impl Governor {
    pub(super) fn new() -> Self {
        Governor {
            at: ADAPT_START,
            plain: 0,
            busy: Default::default(),
            waited: Default::default(),
            wall: Default::default(),
            held: None,
            slow: 0,
            floor: ADAPT_START,
            trial: None,
            held_low: None,
            failed: (0, 0),
            moved: false,
        }
    }

    /// Moves a governor that has not moved yet to the level a near link starts at (3), and
    /// returns it; `None` once it has moved (or been moved) from its start.
    pub(super) fn start_low(&mut self) -> Option<i32> {
        if self.at != ADAPT_START || self.moved {
            return None;
        }
        self.moved = true;
        self.at = NEAR_START;
        Some(ADAPT_LEVELS[NEAR_START])
    }

    /// Records `plain` bytes compressed in `busy` and written out in `waited`, out of `wall`
    /// time in all (the rest went to other work, or to waiting for the peer); returns the
    /// level to move to, if it should change.
    pub(super) fn record(
        &mut self,
        plain: u64,
        busy: std::time::Duration,
        waited: std::time::Duration,
        wall: std::time::Duration,
    ) -> Option<i32> {
        self.plain += plain;
        self.busy += busy;
        self.waited += waited;
        self.wall += wall;
        if self.plain < ADAPT_SPAN {
            return None;
        }
        let busy = std::mem::take(&mut self.busy);
        let waited = std::mem::take(&mut self.waited);
        let wall = std::mem::take(&mut self.wall);
        let plain = std::mem::take(&mut self.plain);
        if let Some((level, n)) = self.held {
            self.held = (n > 1).then_some((level, n - 1));
        }
        if let Some((level, n)) = self.held_low {
            self.held_low = (n > 1).then_some((level, n - 1));
        }
        if self.floor < ADAPT_START {
            return self.fast(plain as f64 / wall.as_secs_f64().max(1e-9), busy, waited);
        }
        // The link waited on the compressor: writes hardly waited while compressing took
        // most of the time. (Writes that do not wait while the time went elsewhere, to round
        // trips say, say nothing about the level.) Buffers between here and the link (pipes,
        // ssh's window, sockets: megabytes) carry it through a short stretch like that, so it
        // takes several spans in a row to step down.
        self.slow = if waited * 8 < busy && busy * 2 > wall {
            self.slow + 1
        } else {
            0
        };
        // The compressor sat idle more than half the time: a slower level is hidden behind the
        // link. Each step about halves the compressor's speed, so the longer the waits, the
        // more steps at once (buffers hide a slow link for the first megabytes: a transfer of
        // a few must not spend them all climbing). Never up to a level held out of reach.
        let ratio = waited.as_secs_f64() / busy.as_secs_f64().max(1e-9);
        let steps = (ratio.log2().floor() as usize).max(1);
        let top = self.held.map_or(ADAPT_LEVELS.len(), |(l, _)| l) - 1;
        let up = (self.at + steps).min(top);
        let next = if waited > busy && up > self.at {
            up
        } else if self.slow >= ADAPT_SLOW && self.at > self.floor {
            self.slow = 0;
            self.held = Some((self.at, ADAPT_HOLD));
            self.at - 1
        } else {
            return None;
        };
        self.moved = true;
        self.at = next;
        Some(ADAPT_LEVELS[next])
    }

    /// A decision on a link known to be fast, where the far end may be the slower (it shares
    /// this machine's cores over a local pipe, or its disk is slow): writes that wait then say
    /// nothing of the link, and a higher level only takes CPU from it. Every move is a trial
    /// judged by the plain bytes a second (`rate`) of the span after it: a step up is kept if
    /// it paid, a step down unless it cost (the cheaper level wins a tie); one that did not is
    /// undone, and its level held out of reach for a while. The move tried: up one level when
    /// writes waited longer than compressing took, else down one.
    fn fast(
        &mut self,
        rate: f64,
        busy: std::time::Duration,
        waited: std::time::Duration,
    ) -> Option<i32> {
        if let Some((from, was)) = self.trial.take() {
            let up = self.at > from;
            let paid = match up {
                true => rate * TRIAL_KEEP > was,
                false => rate >= was * TRIAL_KEEP,
            };
            let fails = match up {
                true => &mut self.failed.0,
                false => &mut self.failed.1,
            };
            if paid {
                *fails = 0;
                return None;
            }
            let held = Some((self.at, ADAPT_HOLD << (*fails).min(4)));
            *fails += 1;
            match up {
                true => self.held = held,
                false => self.held_low = held,
            }
            self.moved = true;
            self.at = from;
            return Some(ADAPT_LEVELS[from]);
        }
        let top = self.held.map_or(ADAPT_LEVELS.len(), |(l, _)| l) - 1;
        let bottom = self.held_low.map_or(self.floor, |(l, _)| l + 1);
        let next = if waited > busy && self.at < top {
            self.at + 1
        } else if self.at > bottom {
            self.at - 1
        } else {
            return None;
        };
        self.trial = Some((self.at, rate));
        self.moved = true;
        self.at = next;
        Some(ADAPT_LEVELS[next])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_governor_steps_once_per_span_and_does_not_flap() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let mut g = Governor::new();
        // Less than a span: no decision, however long the waits.
        assert_eq!(g.record(ADAPT_SPAN / 2, ms(10), ms(20), ms(30)), None);
        // Writes waited more than compressing took: a step up; over 4 times as long, two.
        assert_eq!(g.record(ADAPT_SPAN / 2, ms(10), ms(20), ms(30)), Some(12));
        assert_eq!(g.record(ADAPT_SPAN, ms(10), ms(50), ms(60)), Some(17));
        assert_eq!(g.record(ADAPT_SPAN, ms(10), ms(50000), ms(50010)), Some(19));
        let mut g = Governor::new();
        assert_eq!(g.record(ADAPT_SPAN, ms(10), ms(30), ms(40)), Some(12));
        // Waits between 1/8 and 1 of the compressing time: stay.
        assert_eq!(g.record(ADAPT_SPAN, ms(100), ms(50), ms(150)), None);
        // Writes that hardly wait while most of the time went to waiting for the peer: stay.
        assert_eq!(g.record(ADAPT_SPAN, ms(100), ms(1), ms(2000)), None);
        // The link waits on the compressor for a while: down, and the level left stays out of
        // reach for a while even when writes wait again.
        for _ in 0..ADAPT_SLOW - 1 {
            assert_eq!(g.record(ADAPT_SPAN, ms(100), ms(1), ms(110)), None);
        }
        assert_eq!(g.record(ADAPT_SPAN, ms(100), ms(1), ms(110)), Some(9));
        for _ in 0..ADAPT_HOLD - 1 {
            assert_eq!(g.record(ADAPT_SPAN, ms(100), ms(200), ms(300)), None);
        }
        assert_eq!(g.record(ADAPT_SPAN, ms(100), ms(200), ms(300)), Some(12));
        // Bounded at both ends.
        let mut g = Governor::new();
        for _ in 0..20 {
            g.record(ADAPT_SPAN, ms(1), ms(100), ms(101));
        }
        assert_eq!(ADAPT_LEVELS[g.at], 19);
        for _ in 0..ADAPT_SLOW as usize * ADAPT_LEVELS.len() {
            g.record(ADAPT_SPAN, ms(100), ms(0), ms(100));
        }
        assert_eq!(ADAPT_LEVELS[g.at], 9, "below its start only on a fast link");
    }

    /// Spans of an adaptive stream on a fast link whose plain bytes a second at each level
    /// are `rate(level)`, the writes always waiting longer than compressing took: the levels
    /// the governor sends each span at.
    fn fast_spans(spans: usize, rate: impl Fn(i32) -> f64) -> Vec<i32> {
        let mut g = Governor::new();
        g.floor = 0;
        let mut at = ADAPT_LEVELS[g.at];
        let mut levels = vec![];
        for _ in 0..spans {
            levels.push(at);
            let wall = std::time::Duration::from_secs_f64(ADAPT_SPAN as f64 / rate(at));
            let busy = wall / 10;
            if let Some(l) = g.record(ADAPT_SPAN, busy, wall - busy, wall) {
                at = l;
            }
        }
        levels
    }

    #[test]
    fn on_a_fast_link_the_governor_keeps_the_levels_that_pay() {
        // A far end that is the slower (the same plain bytes a second at every level, or
        // fewer at higher ones: its CPU shared with the compressor): down to the lowest level,
        // off, and there, with ever rarer trials above it, although the writes wait.
        for rate in [(|_| 80e6) as fn(i32) -> f64, |l| 100e6 - l as f64 * 2e6] {
            let levels = fast_spans(200, rate);
            let first = levels.iter().position(|&l| l == 0).expect("reaches 0");
            assert!(first < 18, "{levels:?}");
            let above = levels[first..].iter().filter(|&&l| l > 0).count();
            assert!(above <= 8, "{above} trials: {levels:?}");
        }
        // A link that level 1 keeps up with, and off does not (a LAN, text): at 1, off tried
        // ever more rarely.
        let levels = fast_spans(200, |l| match l {
            0 => 40e6,
            l => 120e6 - l as f64 * 2e6,
        });
        let first = levels.iter().position(|&l| l == 1).expect("reaches 1");
        assert!(first < 12, "{levels:?}");
        let off = levels[first..].iter().filter(|&&l| l == 0).count();
        assert!(off <= 8, "{off} trials of off: {levels:?}");
        assert!(levels[first..].iter().all(|&l| l <= 3), "{levels:?}");
        // A link that is the slower: each level up carries more plain bytes a second. Up to
        // the top, and there but for a rare trial down.
        let levels = fast_spans(200, |l| (20 + l) as f64 * 1e6);
        let first = levels.iter().position(|&l| l == 19).expect("reaches 19");
        assert!(first < 12, "{levels:?}");
        let below = levels[first..].iter().filter(|&&l| l < 19).count();
        assert!(below <= 8, "{below} trials: {levels:?}");
    }
}
