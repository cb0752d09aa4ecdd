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
        let from = answered.filter(|&a| a > since).unwrap_or(since);
        answered = Some(got);
        match deliver(&batch, answers, wants, done, sink) {
            Ok(mut event) => {
                if let Event::Answered {
                    source,
                    busy: b,
                    served,
                    ..
                } = &mut event
                {
                    *source = s;
                    *b = since.elapsed();
                    *served = got - from;
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
