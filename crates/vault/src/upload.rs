//! Sending an update's new blocks: gathered into batches (one request each where the storage
//! takes several) across all the files of the update and its catalog, sealed and put on four
//! threads. A small update's blocks all go in one request, at the end; a large one's stream
//! out a full batch at a time.

use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::{Scope, ScopedJoinHandle};

use crate::backend::Backend;
use crate::nodes::block_name;
use crate::vault::Vault;
use crate::VaultError;

/// Blocks sent in one request at most (where the storage takes several), and about how many
/// bytes.
const PUT_BATCH: usize = 32;
const PUT_BATCH_BYTES: usize = 1 << 20;

/// A block to send: its id, plaintext, and whether to keep it sealed in the local cache (the
/// catalog's are).
type Block = ([u8; 32], Vec<u8>, bool);

pub(crate) struct Uploader<'scope> {
    tx: Option<SyncSender<Vec<Block>>>,
    pending: Vec<Block>,
    pending_bytes: usize,
    workers: Vec<ScopedJoinHandle<'scope, ()>>,
    state: &'scope Mutex<Sent>,
}

/// What the workers did.
#[derive(Default)]
pub(crate) struct Sent {
    pub blocks: u64,
    pub bytes: u64,
    pub failed: Option<VaultError>,
}

impl<'scope> Uploader<'scope> {
    pub fn start<'env>(
        s: &'scope Scope<'scope, 'env>,
        vault: &'env Vault,
        state: &'scope Mutex<Sent>,
    ) -> Uploader<'scope> {
        let (tx, rx) = sync_channel::<Vec<Block>>(4);
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..4)
            .map(|_| {
                let rx = rx.clone();
                s.spawn(move || loop {
                    let Ok(batch) = rx.lock().unwrap().recv() else {
                        return;
                    };
                    let sealed: Vec<(String, Vec<u8>)> = batch
                        .iter()
                        .map(|(id, plain, cache)| {
                            let sealed = vault.seal_block(id, plain);
                            if *cache {
                                vault.cache_block(id, &sealed);
                            }
                            (block_name(id), sealed)
                        })
                        .collect();
                    let put = vault.store.put_many(&sealed);
                    let mut st = state.lock().unwrap();
                    match put {
                        Ok(()) => {
                            st.blocks += sealed.len() as u64;
                            st.bytes += sealed.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
                        }
                        Err(e) => {
                            st.failed.get_or_insert(e);
                        }
                    }
                })
            })
            .collect();
        Uploader {
            tx: Some(tx),
            pending: vec![],
            pending_bytes: 0,
            workers,
            state,
        }
    }

    /// Queues a block; false once a put has failed (stop cutting: [`finish`](Self::finish)
    /// says why).
    pub fn send(&mut self, id: [u8; 32], plain: Vec<u8>, cache: bool) -> bool {
        self.pending_bytes += plain.len();
        self.pending.push((id, plain, cache));
        if self.pending.len() >= PUT_BATCH || self.pending_bytes >= PUT_BATCH_BYTES {
            self.flush_batch();
        }
        self.state.lock().unwrap().failed.is_none()
    }

    fn flush_batch(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        self.pending_bytes = 0;
        let batch = std::mem::take(&mut self.pending);
        if let Some(tx) = &self.tx {
            // A send fails only when every worker is gone, which they are not before finish.
            let _ = tx.send(batch);
        }
    }

    /// Sends what waits and waits for every put; the first failure, if any.
    pub fn finish(mut self) -> Result<(), VaultError> {
        self.flush_batch();
        self.tx = None;
        let mut panicked = false;
        for w in self.workers.drain(..) {
            panicked |= w.join().is_err();
        }
        if panicked {
            return Err(VaultError::Local("a thread sealing blocks failed".into()));
        }
        match self.state.lock().unwrap().failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
