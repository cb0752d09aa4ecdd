//! Large frames against old data compressed on threads beside the session's, over a link the
//! client measured fast or near (a LAN, this machine), where compressing is what the client
//! waits for: the session's thread gathers the next reply's data and prefix (and answers other
//! requests) while a frame is compressed. Replies still go out in the order asked.
//!
//! A timeline of a cold get of numpy-whl-tree through a local pipe (`perf record -a`) had the
//! server compress its frames on one core for 150 ms while the other was half idle, the client
//! waiting for them.

use std::collections::VecDeque;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_proto::{Chunks, ErrorCode, Frame, Message, Payload, Reply};

use super::error;
use crate::delta::{judge_frame, try_frame, FrameLevel, Tried};

/// Frames compressed at once at most: the session's thread waits for the oldest before it
/// starts one more (bounding memory too: each holds up to 3 MiB of data and 16 MiB of prefix).
const IN_FLIGHT: usize = 2;
/// Bytes of replies held behind frames being compressed at most: past this the session's
/// thread waits for those frames, so a client's requests after a large frame (a plain
/// GetChunks is answered with up to 16 MiB) do not pile up in memory.
const HELD_BYTES: usize = 16 << 20;

/// Whether this machine has more than one core for the session (asked once: the answer reads
/// the cgroup's files).
pub(super) fn cores_to_spare() -> bool {
    static SPARE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SPARE.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// What a frame's prefix is made of, as its reply names it: the context (if `context`), the
/// old chunks `olds`, the pieces `refs`.
pub(super) struct Prefix {
    pub(super) context: bool,
    pub(super) olds: Vec<u32>,
    pub(super) refs: Vec<u32>,
}

impl Prefix {
    /// How `data` goes: as `frame` against this prefix, or plain when no frame paid.
    pub(super) fn payload(self, frame: Option<Vec<u8>>, data: Vec<u8>) -> Payload {
        match frame {
            Some(frame) => Payload::Frame {
                context: self.context,
                olds: self.olds,
                refs: self.refs,
                data: frame,
            },
            None => Payload::Plain(data),
        }
    }
}

/// A Chunks reply whose frame is being compressed.
pub(super) struct FrameJob {
    id: u32,
    found: Vec<u32>,
    prefix: Prefix,
    /// Bytes of work (data and context) and the level, for the level's next decision.
    work: usize,
    level: i32,
    running: Running,
}

/// The data back, what compressing found, and how long it took.
type Done = (Vec<u8>, Tried, Duration);

enum Running {
    Thread(JoinHandle<Done>),
    /// Compressed on the session's thread: no other thread could be had.
    Done(Done),
}

/// What a frame is made of, before it goes to its thread.
pub(super) struct FrameWork {
    pub(super) data: Vec<u8>,
    pub(super) prefix: Vec<u8>,
    pub(super) level: i32,
    pub(super) floor: i32,
}

fn compress(w: FrameWork) -> Done {
    let started = Instant::now();
    let tried = try_frame(&w.data, &w.prefix, w.level, w.floor);
    (w.data, tried, started.elapsed())
}

/// Starts compressing `w` on a thread of its own (here, if no thread can be had).
fn start(w: FrameWork) -> Running {
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(w)));
    let theirs = slot.clone();
    let take = |s: &std::sync::Mutex<Option<FrameWork>>| {
        s.lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .expect("taken once")
    };
    match std::thread::Builder::new()
        .name("ferry-frame".into())
        .spawn(move || compress(take(&theirs)))
    {
        Ok(t) => Running::Thread(t),
        Err(e) => {
            tracing::debug!("no thread to compress a frame on ({e}): compressed here");
            Running::Done(compress(take(&slot)))
        }
    }
}

impl FrameJob {
    /// Starts the frame of `w`: the reply to request `id`, the chunks `found` against
    /// `prefix`, `work` bytes in all.
    pub(super) fn start(
        id: u32,
        found: Vec<u32>,
        prefix: Prefix,
        work: usize,
        w: FrameWork,
    ) -> Self {
        FrameJob {
            id,
            found,
            prefix,
            work,
            level: w.level,
            running: start(w),
        }
    }

    fn is_finished(&self) -> bool {
        match &self.running {
            Running::Thread(t) => t.is_finished(),
            Running::Done(_) => true,
        }
    }

    /// The reply, once the frame is done (waited for), judged as the session's own are.
    fn finish(self, level: &mut FrameLevel) -> Frame {
        let done = match self.running {
            Running::Thread(t) => t.join().ok(),
            Running::Done(d) => Some(d),
        };
        let reply = match done {
            Some((data, tried, took)) => {
                level.took(self.work, self.level, took);
                match judge_frame(level, data.len(), tried) {
                    Ok(frame) => Reply::Chunks(Chunks {
                        found: self.found,
                        payload: self.prefix.payload(frame, data),
                    }),
                    Err(e) => error(ErrorCode::Io, format!("compressing: {e}")),
                }
            }
            None => error(ErrorCode::Io, "compressing: its thread failed"),
        };
        Message::Reply(reply).to_frame(self.id)
    }
}

fn bytes(frames: &[Frame]) -> usize {
    frames.iter().map(|f| f.body.len()).sum()
}

enum Slot {
    Ready(Vec<Frame>),
    Job(FrameJob),
}

/// Replies in the order asked, some of them frames still being compressed.
#[derive(Default)]
pub(super) struct Frames {
    queue: VecDeque<Slot>,
    /// Bytes of the frames ready in the queue.
    held: usize,
    /// A job the request being handled started: it goes after that request's other frames.
    pub(super) started: Option<FrameJob>,
}

impl Frames {
    /// Queues what a request's handling made: its frames, then its frame being compressed.
    pub(super) fn push(&mut self, out: Vec<Frame>) {
        if !out.is_empty() {
            self.held += bytes(&out);
            self.queue.push_back(Slot::Ready(out));
        }
        if let Some(job) = self.started.take() {
            self.queue.push_back(Slot::Job(job));
        }
    }

    /// Waits for the oldest frames being compressed until fewer than [`IN_FLIGHT`] are.
    pub(super) fn make_room(&mut self, level: &mut FrameLevel) {
        let running = |q: &VecDeque<Slot>| q.iter().filter(|s| matches!(s, Slot::Job(_))).count();
        while running(&self.queue) >= IN_FLIGHT {
            let Some(i) = self.queue.iter().position(|s| matches!(s, Slot::Job(_))) else {
                break;
            };
            if let Some(Slot::Job(job)) = self.queue.remove(i) {
                let done = vec![job.finish(level)];
                self.held += bytes(&done);
                self.queue.insert(i, Slot::Ready(done));
            }
        }
    }

    /// What can go out now, in order: up to the first frame still being compressed, or (with
    /// `wait`, or more than [`HELD_BYTES`] held behind such frames) all of it.
    pub(super) fn take(&mut self, level: &mut FrameLevel, wait: bool) -> Vec<Frame> {
        let wait = wait || self.held > HELD_BYTES;
        let mut out = vec![];
        loop {
            match self.queue.front() {
                Some(Slot::Job(job)) if !wait && !job.is_finished() => break,
                None => break,
                Some(_) => {}
            }
            match self.queue.pop_front() {
                Some(Slot::Ready(frames)) => {
                    self.held -= bytes(&frames);
                    out.extend(frames);
                }
                Some(Slot::Job(job)) => out.push(job.finish(level)),
                None => break,
            }
        }
        out
    }

    /// Whether any reply waits in the queue.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.started.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(id: u32) -> Vec<Frame> {
        vec![Message::Reply(Reply::Ok).to_frame(id)]
    }

    fn job(id: u32, seed: u8) -> FrameJob {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8 ^ seed).collect();
        let w = FrameWork {
            prefix: data[..100_000].to_vec(),
            data,
            level: 3,
            floor: 3,
        };
        let prefix = Prefix {
            context: false,
            olds: vec![],
            refs: vec![],
        };
        FrameJob::start(id, vec![0], prefix, 300_000, w)
    }

    fn ids(frames: &[Frame]) -> Vec<u32> {
        frames.iter().map(|f| f.request_id).collect()
    }

    #[test]
    fn replies_go_in_the_order_asked_whatever_finishes_first() {
        let mut level = FrameLevel::new(3);
        let mut f = Frames::default();
        f.push(ready(1));
        // A request's own frames go before its frame being compressed.
        f.started = Some(job(3, 1));
        f.push(ready(2));
        f.push(ready(4));
        f.started = Some(job(5, 2));
        f.push(vec![]);
        f.push(ready(6));
        // Without waiting, whatever goes is the head of the order.
        let mut out = ids(&f.take(&mut level, false));
        assert_eq!(out[..], [1, 2, 3, 4, 5, 6][..out.len()]);
        out.extend(ids(&f.take(&mut level, true)));
        assert_eq!(out, [1, 2, 3, 4, 5, 6]);
        assert!(f.is_empty());
    }

    #[test]
    fn a_third_frame_waits_for_the_first() {
        let mut level = FrameLevel::new(3);
        let mut f = Frames::default();
        for id in 1..=3 {
            f.make_room(&mut level);
            let running = f.queue.iter().filter(|s| matches!(s, Slot::Job(_))).count();
            assert!(running < IN_FLIGHT, "{running} running before frame {id}");
            f.started = Some(job(id, id as u8));
            f.push(vec![]);
        }
        assert_eq!(ids(&f.take(&mut level, true)), [1, 2, 3]);
    }

    #[test]
    fn replies_held_behind_a_frame_are_bounded() {
        let mut level = FrameLevel::new(3);
        // A frame that takes until it is let go.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let mut held = job(1, 0);
        let w = FrameWork {
            data: vec![1; 300_000],
            prefix: vec![1; 1000],
            level: 3,
            floor: 3,
        };
        held.running = Running::Thread(std::thread::spawn(move || {
            let _ = wait.recv();
            compress(w)
        }));
        let mut f = Frames {
            started: Some(held),
            ..Default::default()
        };
        f.push(vec![]);
        let big = |id| {
            let mut r = ready(id);
            r[0].body = vec![0; 1 << 20];
            r
        };
        // 16 MiB of replies wait behind the frame; the next one waits for it, and all go.
        for id in 2..=17 {
            f.push(big(id));
            assert!(f.take(&mut level, false).is_empty());
        }
        assert_eq!(f.held, 16 << 20);
        go.send(()).unwrap();
        f.push(big(18));
        assert_eq!(
            ids(&f.take(&mut level, false)),
            (1..=18).collect::<Vec<_>>()
        );
        assert_eq!(f.held, 0);
        assert!(f.is_empty());
    }

    #[test]
    fn a_frame_reply_carries_its_chunks_against_the_prefix() {
        let mut level = FrameLevel::new(3);
        let mut f = Frames {
            started: Some(job(7, 0)),
            ..Default::default()
        };
        f.push(vec![]);
        let out = f.take(&mut level, true);
        assert_eq!(ids(&out), [7]);
        match Message::decode(&out[0]).unwrap() {
            Message::Reply(Reply::Chunks(c)) => {
                assert_eq!(c.found, [0]);
                // Data that repeats its first 100 KB (the prefix) compresses to a frame.
                assert!(matches!(c.payload, Payload::Frame { .. }));
            }
            other => panic!("{other:?}"),
        }
    }
}
