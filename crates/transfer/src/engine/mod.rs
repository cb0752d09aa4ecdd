//! The coordinator: who asks which source for what, and what happens when one answers, says
//! "not here", or fails.
//!
//! Each source runs on a thread of its own (a scoped one: sources may borrow, a session say)
//! with a queue of the wants it may serve, in the order wanted. The coordinator hands each
//! source batches from the front of its queue while it has fewer than its depth outstanding,
//! skipping what is done or outstanding elsewhere; the source's thread sends them, receives the
//! answers in order, verifies each chunk and gives it to the sink (so the hashing and storing
//! of several sources run in parallel), and reports back. A source that has run out of work
//! borrows the last batch outstanding at the busiest other source. A want every live source
//! has answered "not here" fails the fetch; so does every source failing.
//!
//! What a local source (a device) may hold waits for it while it is not known to be slower
//! than the others ([`gate`]); a source's thread is [`worker`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_format::Id;
use ferry_store::StoreError;

use crate::{Sink, Source, Want};

mod gate;
mod worker;
use gate::{probe_bytes, queue, slower};
use worker::work;

/// How a fetch behaves.
#[derive(Clone, Debug)]
pub struct Options {
    /// Lend the requests outstanding at a slow source to one that ran out of work.
    pub borrowing: bool,
    /// Once everything arrived, how long a source may go on receiving an answer before it is
    /// interrupted (a link gone silent would otherwise hold the fetch until TCP gives up).
    pub grace: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            borrowing: true,
            grace: Duration::from_secs(10),
        }
    }
}

/// What a fetch did, source by source.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub sources: Vec<SourceReport>,
    /// Chunks that arrived twice (a borrowed request answered by both sources): bytes the
    /// borrowing cost.
    pub duplicates: u64,
    pub duplicate_bytes: u64,
}

impl Report {
    /// Chunks delivered, from every source.
    pub fn chunks(&self) -> u64 {
        self.sources.iter().map(|s| s.chunks).sum()
    }

    /// Their bytes.
    pub fn bytes(&self) -> u64 {
        self.sources.iter().map(|s| s.bytes).sum()
    }
}

/// What one source did.
#[derive(Clone, Debug, Default)]
pub struct SourceReport {
    pub name: String,
    /// Chunks it delivered first, and their bytes.
    pub chunks: u64,
    pub bytes: u64,
    pub requests: u64,
    /// Chunks it said it did not have.
    pub misses: u64,
    /// Chunks whose bytes did not match their id (counted as not here), and their bytes.
    pub rejected: u64,
    pub rejected_bytes: u64,
    /// Chunks it was lent from another source's requests.
    pub borrowed: u64,
    /// Why it stopped, if it failed.
    pub failed: Option<String>,
    /// How long it had requests outstanding.
    pub busy: Duration,
}

/// Why a fetch did not get everything.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// No source has the chunk (each that might was asked); `lied`: one sent bytes that do
    /// not hash to its id.
    #[error("chunk {id} was found in none of the sources ({tried}){}", if *.lied { "; one sent wrong bytes for it" } else { "" })]
    NotFound { id: Id, tried: String, lied: bool },
    /// Every source failed; what arrived is in the sink.
    #[error("every source failed; the last: {0}")]
    Sources(String),
    #[error(transparent)]
    Sink(#[from] StoreError),
    #[error("more than 64 sources")]
    TooManySources,
}

/// What the coordinator tells a source's thread.
enum Command {
    /// Ask for these wants (indices).
    Ask(Vec<usize>),
    Stop,
}

/// What a source's thread tells the coordinator.
enum Event {
    /// The answer to the oldest batch outstanding at `source`: the wants it delivered (first),
    /// those it delivered after another source had (duplicates), and those it did not have.
    Answered {
        source: usize,
        delivered: Vec<usize>,
        bytes: u64,
        duplicates: (u64, u64),
        missing: Vec<usize>,
        rejected: (u64, u64),
        /// The wants of `missing` whose bytes were wrong.
        lies: Vec<usize>,
        busy: Duration,
        /// How long the source took over this batch alone (from its request, or from the
        /// answer before it if later), and the bytes it carried (duplicates included).
        served: Duration,
        carried: u64,
    },
    /// The source failed; its outstanding batches are unanswered.
    Failed {
        source: usize,
        error: String,
    },
    Sink(StoreError),
    /// A source's thread ended (it wakes [`wind_down`]).
    Exited(usize),
    /// A source's thread panicked, saying this.
    Panicked(usize, String),
}

/// The coordinator's view of one source.
struct Seat {
    queue: VecDeque<usize>,
    outstanding: VecDeque<Vec<usize>>,
    depth: usize,
    batch: crate::Batch,
    local: bool,
    alive: bool,
    tx: mpsc::Sender<Command>,
    /// Bytes a second the source carried, over its answers so far (once they make up some size).
    rate: Option<f64>,
    /// What the source knew of its rate before the fetch ([`Source::rate_hint`]).
    hint: Option<f64>,
    /// Local sources before this one (bit t): what one of them may have waits for it.
    ahead: u64,
    /// Since when the oldest outstanding batch has been its own work (sent, or the answer
    /// before it came): how long it has been waited for.
    waiting: Option<Instant>,
    /// Bytes it carried and the time it took over them, in all (its rate, smoothed: one
    /// answer that came in a burst says little).
    carried: u64,
    served: Duration,
}

/// With several remote sources, a source's batches hold about this much of its own time (its
/// rate measured on the answers so far), so its outstanding work ([`Source::depth`] batches)
/// is about a second of it: a slow source is never left holding much when the fast ones have
/// done the rest (with 4 MiB batches, a 5 Mbit/s mirror held 7 s of a 16 MiB file a 20 Mbit/s
/// server fetched in 6).
const BATCH_TIME: Duration = Duration::from_millis(250);
/// Their bytes before a source's rate is known, and at least.
const FIRST_BATCH_BYTES: usize = 256 << 10;
const MIN_BATCH_BYTES: usize = 32 << 10;
/// How often a local source's work is looked at while another source is idle.
const WATCH: Duration = Duration::from_millis(50);
/// Answers smaller than this say too little of a source's rate.
const RATE_SAMPLE: u64 = 16 << 10;

/// Fetches every chunk `wants` names from `sources` (tried in that order when several may have
/// one; all kept busy) into `sink`. See the crate documentation.
pub fn fetch(
    sources: &mut [&mut (dyn Source + Send)],
    wants: &[Want],
    sink: &dyn Sink,
    opts: &Options,
) -> Result<Report, EngineError> {
    if sources.len() > 64 {
        return Err(EngineError::TooManySources);
    }
    let mut report = Report {
        sources: sources
            .iter()
            .map(|s| SourceReport {
                name: s.name(),
                ..SourceReport::default()
            })
            .collect(),
        ..Report::default()
    };
    if wants.is_empty() {
        return Ok(report);
    }
    // Which sources may have each want (bit s), asked once.
    let mut may: Vec<u64> = vec![0; wants.len()];
    for (s, src) in sources.iter_mut().enumerate() {
        for (w, want) in wants.iter().enumerate() {
            if src.may_have(want) {
                may[w] |= 1 << s;
            }
        }
    }
    let locals = sources
        .iter()
        .enumerate()
        .filter(|(_, src)| src.local())
        .fold(0u64, |m, (s, _)| m | 1 << s);
    let done: Vec<AtomicBool> = wants.iter().map(|_| AtomicBool::new(false)).collect();
    let (events, inbox) = mpsc::channel::<Event>();
    let interrupters: Vec<_> = sources.iter().map(|s| s.interrupter()).collect();
    let exited: Vec<AtomicBool> = sources.iter().map(|_| AtomicBool::new(false)).collect();
    std::thread::scope(|scope| {
        let mut seats = vec![];
        for (s, src) in sources.iter_mut().enumerate() {
            let (tx, rx) = mpsc::channel();
            let events = events.clone();
            let (done, exited) = (&done, &exited[s]);
            let (depth, batch, local) = (src.depth().max(1), src.batch(), src.local());
            let hint = src.rate_hint();
            let ahead = (0..s)
                .filter(|&t| locals & (1 << t) != 0)
                .fold(0u64, |m, t| m | 1 << t);
            let queue = queue(s, ahead, &may);
            let src: &mut (dyn Source + Send) = &mut **src;
            std::thread::Builder::new()
                .name(format!("ferry-source-{s}"))
                .spawn_scoped(scope, move || {
                    let _exit = Exit(s, exited, &events);
                    // A panic (a bug in a source or the sink) ends the fetch with an error: what
                    // the thread was delivering may be lost.
                    let run = || work(s, src, wants, done, sink, &rx, &events);
                    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                        let why = p
                            .downcast_ref::<&str>()
                            .map(|m| m.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        let _ = events.send(Event::Panicked(s, why));
                    }
                })
                .expect("a thread for a source");
            seats.push(Seat {
                queue,
                outstanding: VecDeque::new(),
                depth,
                batch,
                local,
                alive: true,
                tx,
                rate: None,
                hint,
                ahead,
                waiting: None,
                carried: 0,
                served: Duration::ZERO,
            });
        }
        drop(events);
        let r = coordinate(&mut seats, wants, &may, &done, &inbox, opts, &mut report);
        for seat in &seats {
            let _ = seat.tx.send(Command::Stop);
        }
        wind_down(&exited, &inbox, &interrupters, opts.grace);
        r
    })?;
    Ok(report)
}

/// Marks a source's thread as ended, however it ends, and tells the coordinator.
struct Exit<'a>(usize, &'a AtomicBool, &'a mpsc::Sender<Event>);

impl Drop for Exit<'_> {
    fn drop(&mut self) {
        self.1.store(true, Ordering::Release);
        let _ = self.2.send(Event::Exited(self.0));
    }
}

/// Waits for the sources' threads to end (told to stop): those still receiving an answer
/// after `grace` are interrupted, when they can be.
fn wind_down(
    exited: &[AtomicBool],
    inbox: &mpsc::Receiver<Event>,
    interrupters: &[Option<crate::Interrupter>],
    grace: Duration,
) {
    let deadline = Instant::now() + grace;
    while exited.iter().any(|e| !e.load(Ordering::Acquire)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match inbox.recv_timeout(left) {
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => break,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
    for (s, i) in interrupters.iter().enumerate() {
        if let (false, Some(i)) = (exited[s].load(Ordering::Acquire), i) {
            tracing::warn!("source {s} still receiving {grace:?} after the fetch ended: hung up");
            i();
        }
    }
}

/// Hands out work until every want is done, or cannot be.
fn coordinate(
    seats: &mut [Seat],
    wants: &[Want],
    may: &[u64],
    done: &[AtomicBool],
    inbox: &mpsc::Receiver<Event>,
    opts: &Options,
    report: &mut Report,
) -> Result<(), EngineError> {
    // Sources that said "not here" to each want (bit s), and how many sources have it now.
    let mut tried: Vec<u64> = vec![0; wants.len()];
    let mut lied: Vec<u64> = vec![0; wants.len()];
    let mut asked: Vec<u8> = vec![0; wants.len()];
    let mut left = wants.len();
    let mut last_error = String::new();
    loop {
        let mut ws = Wants {
            wants,
            may,
            done,
            tried: &tried,
            asked: &mut asked,
        };
        for s in 0..seats.len() {
            fill(s, seats, &mut ws, report)?;
        }
        if opts.borrowing {
            for s in 0..seats.len() {
                if seats[s].alive && seats[s].outstanding.is_empty() {
                    borrow(s, seats, &mut ws, report)?;
                }
            }
        }
        // Everything arrived: what is still outstanding somewhere is abandoned.
        if left == 0 {
            return Ok(());
        }
        if seats.iter().all(|s| s.outstanding.is_empty()) {
            // Nothing outstanding and nothing more to hand out.
            if seats.iter().all(|s| !s.alive) {
                return Err(EngineError::Sources(last_error));
            }
            let w = (0..wants.len())
                .find(|&w| !done[w].load(Ordering::Acquire))
                .expect("a want left");
            let tried_names: Vec<&str> = (0..seats.len())
                .filter(|&s| tried[w] & (1 << s) != 0)
                .map(|s| report.sources[s].name.as_str())
                .collect();
            return Err(EngineError::NotFound {
                id: wants[w].id,
                tried: tried_names.join(", "),
                lied: lied[w] != 0,
            });
        }
        // While a local source works and another is idle, the idle one may take over what
        // the local one holds once it proves slow: look again now and then.
        let watch = seats.iter().any(|x| x.local && !x.outstanding.is_empty())
            && seats.iter().any(|x| x.alive && x.outstanding.is_empty());
        let event = match watch {
            false => inbox.recv().map_err(|_| ()),
            true => match inbox.recv_timeout(WATCH) {
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                r => r.map_err(|_| ()),
            },
        };
        let Ok(event) = event else {
            return Err(EngineError::Sources(last_error));
        };
        match event {
            Event::Answered {
                source,
                delivered,
                bytes,
                duplicates,
                missing,
                rejected,
                lies,
                busy,
                served,
                carried,
            } => {
                let seat = &mut seats[source];
                seat.carried += carried;
                seat.served += served;
                if seat.carried >= RATE_SAMPLE {
                    seat.rate = Some(seat.carried as f64 / seat.served.as_secs_f64().max(1e-6));
                }
                let batch = seats[source].outstanding.pop_front().unwrap_or_default();
                seats[source].waiting = (!seats[source].outstanding.is_empty()).then(Instant::now);
                for &w in &batch {
                    asked[w] = asked[w].saturating_sub(1);
                }
                left -= delivered.len();
                let r = &mut report.sources[source];
                r.chunks += delivered.len() as u64;
                r.bytes += bytes;
                r.misses += missing.len() as u64;
                r.rejected += rejected.0;
                r.rejected_bytes += rejected.1;
                r.busy += busy;
                report.duplicates += duplicates.0;
                report.duplicate_bytes += duplicates.1;
                for w in missing {
                    tried[w] |= 1 << source;
                    requeue(w, source, seats, may);
                }
                for w in lies {
                    lied[w] |= 1 << source;
                }
            }
            Event::Failed { source, error } => {
                tracing::warn!("{}: {error}", report.sources[source].name);
                let seat = &mut seats[source];
                seat.alive = false;
                seat.queue.clear();
                let given_back: Vec<Vec<usize>> = seat.outstanding.drain(..).collect();
                for batch in given_back {
                    for w in batch {
                        asked[w] = asked[w].saturating_sub(1);
                        // Given back: the others take it first.
                        tried[w] |= 1 << source;
                        requeue(w, source, seats, may);
                    }
                }
                report.sources[source].failed = Some(error.clone());
                last_error = error;
            }
            Event::Sink(e) => return Err(EngineError::Sink(e)),
            // After a failure (reported before): nothing more to do.
            Event::Exited(s) if report.sources[s].failed.is_some() => {}
            // Neither failed nor stopped: it panicked. What it was delivering may be lost: the
            // fetch ends here.
            Event::Exited(s) => {
                return Err(EngineError::Sources(format!(
                    "{}: its thread ended unexpectedly (a bug)",
                    report.sources[s].name
                )))
            }
            Event::Panicked(s, why) => {
                return Err(EngineError::Sources(format!(
                    "{}: its thread panicked (a bug): {why}",
                    report.sources[s].name
                )))
            }
        }
    }
}

/// Puts want `w`, which source `from` did not serve, at the front of the queues of the others
/// that may have it: it may have waited behind others there (see [`gate`]).
fn requeue(w: usize, from: usize, seats: &mut [Seat], may: &[u64]) {
    for (t, seat) in seats.iter_mut().enumerate() {
        if t != from && seat.alive && may[w] & (1 << t) != 0 {
            seat.queue.push_front(w);
        }
    }
}

/// The most bytes of a batch for a source that takes at most `max`: alone, or local, that; a
/// remote source beside others (remote ones, or a device it may race from the other end),
/// [`BATCH_TIME`] of its measured rate (before it is measured, [`FIRST_BATCH_BYTES`]): what it
/// has asked for and not received is what the others cannot take over.
fn batch_bytes(shared: bool, rate: Option<f64>, max: usize) -> usize {
    match (shared, rate) {
        (false, _) => max,
        (true, None) => FIRST_BATCH_BYTES.min(max),
        (true, Some(r)) => ((r * BATCH_TIME.as_secs_f64()) as usize)
            .clamp(MIN_BATCH_BYTES, max.max(MIN_BATCH_BYTES)),
    }
}

/// What the coordinator hands out from: the wants, who may have each, and where each stands.
struct Wants<'a> {
    wants: &'a [Want],
    /// Sources that may have each want (bit s).
    may: &'a [u64],
    done: &'a [AtomicBool],
    /// Sources that said "not here" to each (bit s).
    tried: &'a [u64],
    /// How many sources each is outstanding at.
    asked: &'a mut [u8],
}

/// Gives source `s` batches from its queue while it has room.
fn fill(
    s: usize,
    seats: &mut [Seat],
    ws: &mut Wants<'_>,
    report: &mut Report,
) -> Result<(), EngineError> {
    let Wants {
        wants,
        may,
        done,
        tried,
        ..
    } = *ws;
    let remote = seats.iter().filter(|x| x.alive && !x.local).count();
    let local = seats.iter().any(|x| x.alive && x.local);
    let max_bytes = batch_bytes(
        (remote > 1 || local) && !seats[s].local,
        seats[s].rate,
        seats[s].batch.bytes,
    );
    while seats[s].alive && seats[s].outstanding.len() < seats[s].depth {
        let mut batch = vec![];
        let mut bytes = 0;
        // Skipped ones stay queued (at the front, in order): outstanding elsewhere now, or
        // waiting for a local source, they may come back (not there) for this source to try.
        let mut skipped = vec![];
        // Local sources ahead that may still serve what waits for them, now.
        let blocking = gate::blocking(s, seats, wants, Instant::now());
        // A source of unknown rate with nothing outstanding may take one small batch of what
        // waits for a local source (from the end that one reaches last): its answer measures it.
        let may_probe = seats[s].rate.is_none() && seats[s].outstanding.is_empty();
        let mut probe = false;
        while let Some(w) = seats[s].queue.pop_front() {
            if done[w].load(Ordering::Acquire) || tried[w] & (1 << s) != 0 {
                continue;
            }
            if ws.asked[w] > 0 {
                skipped.push(w);
                continue;
            }
            if may[w] & blocking & !tried[w] != 0 {
                if !(may_probe && (batch.is_empty() || probe)) {
                    // The rest of the queue waits too (what a local source did not have is
                    // queued again at the front): stop here.
                    seats[s].queue.push_front(w);
                    break;
                }
                probe = true;
            }
            let cap = match probe {
                true => probe_bytes(seats[s].hint),
                false => max_bytes,
            };
            if !batch.is_empty()
                && (batch.len() >= seats[s].batch.chunks || bytes + wants[w].len as usize > cap)
            {
                seats[s].queue.push_front(w);
                break;
            }
            bytes += wants[w].len as usize;
            batch.push(w);
        }
        let seat = &mut seats[s];
        for w in skipped.into_iter().rev() {
            seat.queue.push_front(w);
        }
        if batch.is_empty() {
            break;
        }
        send(s, seat, batch, ws.asked, report)?;
    }
    Ok(())
}

/// Lends source `s` (out of work) the last batch outstanding at the busiest other source that
/// still has wants `s` may have and no one else is asked for.
fn borrow(
    s: usize,
    seats: &mut [Seat],
    ws: &mut Wants<'_>,
    report: &mut Report,
) -> Result<(), EngineError> {
    let Wants {
        wants,
        may,
        done,
        tried,
        ..
    } = *ws;
    // What a source here would hand over is not spent on a link, unless it proves slower.
    let now = Instant::now();
    let busiest = (0..seats.len())
        .filter(|&t| {
            t != s
                && seats[t].alive
                && (seats[s].local || !seats[t].local || slower(t, s, seats, wants, now))
        })
        .max_by_key(|&t| {
            seats[t]
                .outstanding
                .iter()
                .flatten()
                .filter(|&&w| !done[w].load(Ordering::Acquire))
                .count()
        });
    let Some(t) = busiest else {
        return Ok(());
    };
    // The last batch there with something to lend: the one it would answer last.
    let lendable = |w: &usize| {
        !done[*w].load(Ordering::Acquire)
            && ws.asked[*w] == 1
            && may[*w] & (1 << s) != 0
            && tried[*w] & (1 << s) == 0
    };
    let lent: Vec<usize> = seats[t]
        .outstanding
        .iter()
        .rev()
        .map(|b| b.iter().copied().filter(lendable).collect::<Vec<_>>())
        .find(|b| !b.is_empty())
        .unwrap_or_default();
    if lent.is_empty() {
        return Ok(());
    }
    report.sources[s].borrowed += lent.len() as u64;
    send(s, &mut seats[s], lent, ws.asked, report)
}

fn send(
    s: usize,
    seat: &mut Seat,
    batch: Vec<usize>,
    asked: &mut [u8],
    report: &mut Report,
) -> Result<(), EngineError> {
    for &w in &batch {
        asked[w] += 1;
    }
    report.sources[s].requests += 1;
    if seat.outstanding.is_empty() {
        seat.waiting = Some(Instant::now());
    }
    if seat.tx.send(Command::Ask(batch.clone())).is_err() {
        // Its thread is gone: it failed, and says so in the inbox.
        seat.alive = false;
    }
    seat.outstanding.push_back(batch);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_sources_batches_hold_a_quarter_second_of_its_rate() {
        let max = 4 << 20;
        // Alone, or local: as large as the source takes.
        assert_eq!(batch_bytes(false, None, max), max);
        assert_eq!(batch_bytes(false, Some(1000.0), max), max);
        // Shared: small until measured, then a quarter second of its rate, within bounds.
        assert_eq!(batch_bytes(true, None, max), 256 << 10);
        assert_eq!(batch_bytes(true, None, 64 << 10), 64 << 10);
        assert_eq!(batch_bytes(true, Some(625_000.0), max), 156_250, "5 Mbit/s");
        assert_eq!(
            batch_bytes(true, Some(12_500_000.0), max),
            3_125_000,
            "100 Mbit/s"
        );
        assert_eq!(batch_bytes(true, Some(1e9), max), max);
        assert_eq!(batch_bytes(true, Some(1000.0), max), 32 << 10, "a floor");
    }
}
