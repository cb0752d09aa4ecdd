//! An object id hashed on a spare core: for objects that arrive in pieces on a thread that has
//! other work to do with each piece.

use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::JoinHandle;

use crate::{HashAlg, Id, IdHasher};

/// Pieces waiting for the hashing thread at most; giving more waits.
const QUEUED: usize = 4;

/// An [`IdHasher`] that moves to a thread of its own once it has taken more than `inline_max`
/// bytes: the pieces given after that are hashed there while the caller goes on. A server
/// receiving a large upload decodes, hashes each chunk and writes the file on one thread;
/// the whole object's id was a third of that thread's time.
pub struct SpareHasher {
    alg: HashAlg,
    state: State,
    taken: u64,
    inline_max: u64,
}

enum State {
    Here(IdHasher),
    There {
        pieces: SyncSender<Vec<u8>>,
        done: JoinHandle<IdHasher>,
    },
}

impl SpareHasher {
    pub fn new(alg: HashAlg, inline_max: u64) -> SpareHasher {
        SpareHasher {
            alg,
            state: State::Here(IdHasher::new(alg)),
            taken: 0,
            inline_max,
        }
    }

    /// Hashes the next piece.
    pub fn update(&mut self, piece: Vec<u8>) {
        self.taken += piece.len() as u64;
        match &mut self.state {
            State::Here(h) if self.taken <= self.inline_max => h.update(&piece),
            State::Here(h) => {
                let h = std::mem::replace(h, IdHasher::new(self.alg));
                self.state = self.spawn(h, piece);
            }
            State::There { pieces, .. } => {
                if pieces.send(piece).is_err() {
                    // The thread is gone only if it panicked: so does this.
                    let State::There { done, .. } =
                        std::mem::replace(&mut self.state, State::Here(IdHasher::new(self.alg)))
                    else {
                        unreachable!("matched above")
                    };
                    std::panic::resume_unwind(
                        done.join()
                            .err()
                            .unwrap_or_else(|| Box::new("the hashing thread ended early")),
                    );
                }
            }
        }
    }

    fn spawn(&mut self, mut h: IdHasher, first: Vec<u8>) -> State {
        let (hasher, take_hasher) = sync_channel::<IdHasher>(1);
        let (pieces, rx) = sync_channel::<Vec<u8>>(QUEUED);
        let spawned = std::thread::Builder::new()
            .name("ferry-hash".into())
            .spawn(move || {
                let mut h = take_hasher.recv().expect("sent once the thread runs");
                while let Ok(p) = rx.recv() {
                    h.update(&p);
                }
                h
            });
        match spawned {
            Ok(done) => {
                hasher.send(h).expect("the thread waits for it");
                pieces
                    .send(first)
                    .expect("the thread takes pieces until dropped");
                State::There { pieces, done }
            }
            // No thread to be had (a process limit): the hashing stays here, for good.
            Err(_) => {
                self.inline_max = u64::MAX;
                h.update(&first);
                State::Here(h)
            }
        }
    }

    /// The id of every piece given so far, in order; the hasher starts over.
    pub fn finish(&mut self) -> Id {
        let state = std::mem::replace(&mut self.state, State::Here(IdHasher::new(self.alg)));
        self.taken = 0;
        match state {
            State::Here(h) => h.finish(),
            State::There { pieces, done } => {
                drop(pieces);
                match done.join() {
                    Ok(h) => h.finish(),
                    Err(p) => std::panic::resume_unwind(p),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_the_same_here_and_on_a_thread() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let want = Id::hash(HashAlg::Blake3, &data);
        for inline_max in [0, 100_000, 1 << 30] {
            let mut h = SpareHasher::new(HashAlg::Blake3, inline_max);
            for piece in data.chunks(65_537) {
                h.update(piece.to_vec());
            }
            assert_eq!(h.finish(), want, "inline_max {inline_max}");
            // Starts over.
            h.update(b"abc".to_vec());
            assert_eq!(h.finish(), Id::hash(HashAlg::Blake3, b"abc"));
        }
    }
}
