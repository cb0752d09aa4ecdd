//! A source's thread: it sends the batches the coordinator hands it, receives the answers in
//! order, verifies each chunk and delivers it to the sink (so the hashing and storing of several
//! sources run in parallel), and reports back.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_store::{StoreError, VerifiedChunk};

use super::{Command, Event};
use crate::{Sink, Source, Want};

/// A source's thread: sends what it is asked, receives the answers in order, verifies and
/// delivers.
pub(super) fn work(
    s: usize,
    src: &mut (dyn Source + Send),
    wants: &[Want],
    done: &[AtomicBool],
    sink: &dyn Sink,
    commands: &mpsc::Receiver<Command>,
    events: &mpsc::Sender<Event>,
) {
    // Batches requested and not yet received: the wants asked for, and when.
    let mut pending: VecDeque<(Vec<usize>, Instant)> = VecDeque::new();
    let mut stopping = false;
    // When the last answer came: the next batch's own time starts there if it was asked before.
    let mut answered: Option<Instant> = None;
    loop {
        // Take commands: waiting for one only when nothing is outstanding.
        while !stopping {
            let c = if pending.is_empty() {
                match commands.recv() {
                    Ok(c) => c,
                    Err(_) => return,
                }
            } else {
                match commands.try_recv() {
                    Ok(c) => c,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        stopping = true;
                        break;
                    }
                }
            };
            match c {
                Command::Stop => stopping = true,
                Command::Ask(batch) => {
                    // What another source delivered meanwhile is not asked for (DOT's cancel).
                    let (todo, gone): (Vec<usize>, Vec<usize>) = batch
                        .into_iter()
                        .partition(|&w| !done[w].load(Ordering::Acquire));
                    if todo.is_empty() {
                        let _ = events.send(nothing(s));
                        continue;
                    }
                    let asked: Vec<Want> = todo.iter().map(|&w| wants[w].clone()).collect();
                    if let Err(e) = src.request(&asked) {
                        let _ = events.send(Event::Failed {
                            source: s,
                            error: e.0,
                        });
                        return;
                    }
                    let mut all = todo;
                    all.extend(gone);
                    pending.push_back((all, Instant::now()));
                }
            }
        }
        let Some((batch, since)) = pending.pop_front() else {
            if stopping {
                return;
            }
            continue;
        };
        // Everything it asked for came from elsewhere (or the fetch is over): its answer is
        // not wanted, and not waited for (DOT's cancel).
        if stopping || batch.iter().all(|&w| done[w].load(Ordering::Acquire)) {
            src.abandon(1);
            let _ = events.send(nothing(s));
            continue;
        }
        let answers = match src.receive() {
            Ok(a) => a,
            Err(e) => {
                let _ = events.send(Event::Failed {
                    source: s,
                    error: e.0,
                });
                return;
            }
        };
        let got = Instant::now();
        let served = served_alone(since, answered, got, src.latency_hint());
        answered = Some(got);
        match deliver(&batch, answers, wants, done, sink) {
            Ok(mut event) => {
                if let Event::Answered {
                    source,
                    busy: b,
                    served: slot,
                    ..
                } = &mut event
                {
                    *source = s;
                    *b = since.elapsed();
                    *slot = served;
                }
                if events.send(event).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = events.send(Event::Sink(e));
                return;
            }
        }
    }
}

/// How long a source took over a batch asked at `since` and answered at `got`, the previous
/// answer having come at `before`: from the later of the two, since a batch queued behind
/// another waits for it; and a batch that waited for nothing else but its request also waited
/// the source's `latency`, which is not its rate (at least a tenth of the time is kept, should
/// the latency known be too long).
fn served_alone(
    since: Instant,
    before: Option<Instant>,
    got: Instant,
    latency: Option<Duration>,
) -> Duration {
    match before.filter(|&a| a > since) {
        Some(from) => got - from,
        None => {
            let all = got - since;
            all.saturating_sub(latency.unwrap_or_default())
                .max(all / 10)
        }
    }
}

/// The answer to a batch that went nowhere: everything in it had arrived from elsewhere.
fn nothing(s: usize) -> Event {
    Event::Answered {
        source: s,
        delivered: vec![],
        bytes: 0,
        duplicates: (0, 0),
        missing: vec![],
        rejected: (0, 0),
        lies: vec![],
        busy: Duration::ZERO,
        served: Duration::ZERO,
        carried: 0,
    }
}

/// Checks and delivers the answers to one batch (`batch[..answers.len()]` were asked; any
/// after them had arrived from elsewhere before the request went).
fn deliver(
    batch: &[usize],
    answers: Vec<Option<Vec<u8>>>,
    wants: &[Want],
    done: &[AtomicBool],
    sink: &dyn Sink,
) -> Result<Event, StoreError> {
    let mut delivered = vec![];
    let mut missing = vec![];
    let mut lies = vec![];
    let (mut bytes, mut dup, mut rej) = (0, (0, 0), (0, 0));
    let mut answers = answers.into_iter();
    for &w in batch {
        let want = &wants[w];
        let answer = answers.next().flatten();
        let Some(data) = answer else {
            if !done[w].load(Ordering::Acquire) {
                missing.push(w);
            }
            continue;
        };
        let ok = data.len() == want.len as usize && want.id.matches(&data);
        if !ok {
            rej.0 += 1;
            rej.1 += data.len() as u64;
            if !done[w].load(Ordering::Acquire) {
                missing.push(w);
                lies.push(w);
            }
            continue;
        }
        // The first to arrive wins; a borrowed request's second copy is dropped.
        if done[w].swap(true, Ordering::AcqRel) {
            dup.0 += 1;
            dup.1 += data.len() as u64;
            continue;
        }
        sink.deliver(w, VerifiedChunk::assume_verified(want.id, &data))?;
        bytes += data.len() as u64;
        delivered.push(w);
    }
    Ok(Event::Answered {
        source: 0,
        delivered,
        bytes,
        duplicates: dup,
        missing,
        rejected: rej,
        lies,
        busy: Duration::ZERO,
        served: Duration::ZERO,
        carried: bytes + dup.1 + rej.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_asked_alone_is_timed_without_the_latency_and_one_queued_from_the_answer_before() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // A 16 KiB probe over a 10 ms link, its bytes taking 2 ms: the rate is the 2 ms's.
        assert_eq!(served_alone(t0, None, t0 + ms(12), Some(ms(10))), ms(2));
        // Latency unknown: the whole wait.
        assert_eq!(served_alone(t0, None, t0 + ms(12), None), ms(12));
        // A latency known too long leaves a tenth of the wait, never nothing.
        assert_eq!(served_alone(t0, None, t0 + ms(10), Some(ms(50))), ms(1));
        // Queued behind an answer that came after it was asked: from that answer, with no
        // latency taken off (the link was busy with the answer before).
        assert_eq!(
            served_alone(t0, Some(t0 + ms(5)), t0 + ms(8), Some(ms(10))),
            ms(3)
        );
        // The answer before came before this was asked: this one waited alone.
        let before = t0;
        let asked = t0 + ms(1);
        assert_eq!(
            served_alone(asked, Some(before), asked + ms(12), Some(ms(10))),
            ms(2)
        );
    }
}
