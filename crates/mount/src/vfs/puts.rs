//! New small files committed without waiting: a file made here (its name absent from the
//! leased listing), of a few kilobytes, is queued at its close with its data (Create, Write and
//! Commit in the queue the removals use: see `crate::queued`) and goes to the server with the
//! next operation's requests, or from the mount's thread within 10–100 ms. `tar x`, `cp -r`
//! and `git`'s checkout then cost a round trip for many files, not one a file.
//!
//! Until the answer, the copy stays dirty (read, stat'ed and written here as any copy being
//! written back); a change of its attributes is made in the queued commit; its removal takes
//! the commit out of the queue (it never reaches the server) or waits for its answer; a rename,
//! `fsync`, or any commit of it waits for it. A look at it does not (`make` stats each object
//! file it made): it shows the copy, whose change time it keeps once committed.
//! Waiting means until the answer is applied here (see `Queue::wait_answered`), and a commit
//! is never both queued and on its way. Refused (someone else made the name meanwhile, unseen
//! here): an exclusive create's file is theirs, and this one's data is dropped, said so in the
//! log; any other is written back again over theirs, as the last close wins.

use std::io::Read;

use ferry_format::HashAlg;
use ferry_store::ChunkStore;

use super::*;
use crate::queued::{NewFile, PutAnswer, PutState};

/// New files this small or smaller are queued (with less than 8 KiB, whatever their data; up
/// to this, when the cache here holds none of their chunks: data new to the server too).
/// Kept small: a queued file reaches the server, and other clients' opens, a moment after its
/// close (within `MAX_HOLD`), where a file committed at its close is there when the close
/// returns. (1 MiB was tried: `cp -a` of the headers was no faster, and another mount's open
/// right after the close of a 400 KB file found nothing.)
const QUEUED_NEW_FILE: u64 = 32 * 1024;
const ALWAYS_WHOLE: usize = 8 * 1024;

impl Vfs {
    /// Queues the commit of the new file `ino` (at `path`, its copy's writes numbered up to
    /// `writes`) if it qualifies: made here and not yet on the server, small, in a directory the
    /// leases say the server will let this mount change. `again`: an earlier queued commit of
    /// it was taken back (its chunks are in the cache because of that one). `false`: commit it
    /// now. Called with `self.writing` held.
    pub(super) fn queue_put(
        &self,
        ino: Ino,
        path: &WirePath,
        writes: u64,
        mode: u32,
        again: bool,
    ) -> Result<bool, Errno> {
        if self.opts.strict_close {
            return Ok(false);
        }
        let exclusive = {
            let st = self.lock();
            match st.inodes.get(&ino) {
                Some(n) if n.pending && !n.unlinked => n.exclusive,
                _ => return Ok(false),
            }
        };
        let Some((dir, _)) = path.split_last() else {
            return Ok(false);
        };
        if !self.changeable_later(&dir) {
            return Ok(false);
        }
        let mut file = File::open(self.files.data(path))?;
        let m = file.metadata()?;
        if m.len() > QUEUED_NEW_FILE {
            return Ok(false);
        }
        let mut data = Vec::with_capacity(m.len() as usize);
        file.read_to_end(&mut data)?;
        let (recipe, oid) = ferry_format::chunk_object::<_, io::Error, _>(
            &data[..],
            &self.opts.chunker,
            HashAlg::Blake3,
            |_, _| Ok(()),
        )?;
        let held = |c: &ferry_format::ChunkRef| self.chunks.contains(&c.id).unwrap_or(true);
        if !again && data.len() >= ALWAYS_WHOLE && recipe.chunks().iter().any(held) {
            // Some of it came from the server: asking what it holds saves the link more.
            return Ok(false);
        }
        use std::os::unix::fs::MetadataExt;
        let recipe = std::sync::Arc::new(recipe);
        // (Kept for the chunk cache, once the commit is queued.)
        let kept = data.clone();
        let change = Change::Put(Box::new(NewFile {
            ino,
            writes,
            path: path.clone(),
            mode,
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            recipe: recipe.clone(),
            oid: oid.id(),
            data,
            exclusive,
            replaces: None,
        }));
        // Marked before it is queued: whoever looks finds the mark once it can be sent.
        let before = self
            .lock()
            .inodes
            .get_mut(&ino)
            .map(|n| n.put.replace(writes));
        if !self.queue_change(change) {
            if let (Some(n), Some(b)) = (self.lock().inodes.get_mut(&ino), before) {
                n.put = b;
            }
            return Ok(false);
        }
        self.counters.commits_queued.fetch_add(1, Ordering::Relaxed);
        // Kept here: the next commit of the file compresses its changes against them.
        for (at, c) in recipe.with_offsets() {
            let bytes = &kept[at as usize..at as usize + c.len as usize];
            let chunk = ferry_store::VerifiedChunk::assume_verified(c.id, bytes);
            if let Err(e) = self.chunks.put(&chunk) {
                tracing::debug!("keeping a chunk in the cache: {e}");
            }
        }
        let mut st = self.lock();
        // The directory's times as the server will set them, about.
        st.dir_times.insert(dir, specials::now_ns());
        st.unsynced.get_or_insert_with(Instant::now);
        Ok(true)
    }

    /// Makes sure no commit of the new file `ino` is queued or on its way: with `take_back`,
    /// one still queued is taken out (its caller commits the file now, or removes it before it
    /// reached the server); else it is sent. One on its way is waited for, and its answer
    /// applied. `EEXIST`: it was refused, someone else's file holding the name (this one is
    /// gone).
    pub(super) fn settle_put(&self, ino: Ino, take_back: bool) -> Result<(), Errno> {
        let Some(was_unlinked) = self
            .lock()
            .inodes
            .get(&ino)
            .filter(|n| n.put.is_some())
            .map(|n| n.unlinked)
        else {
            return Ok(());
        };
        if take_back && self.link.queued.cancel_put(ino) == PutState::Queued {
            if let Some(n) = self.lock().inodes.get_mut(&ino) {
                n.put = None;
            }
            return Ok(());
        }
        if self.link.queued.has_put(ino) {
            // Sends it (or, if it is on its way, what was queued since, behind it); its answer
            // is passed on by the thread that sent it.
            self.send_queued();
            self.link.queued.wait_answered(ino);
        }
        self.put_answer_taken(ino);
        match self.lock().inodes.get(&ino) {
            Some(n) if n.unlinked && !was_unlinked => Err(Errno::EEXIST),
            _ => Ok(()),
        }
    }

    /// For a new file whose commit was sent and is no longer awaited: applies its answer if
    /// passed on and not yet applied. If none came (the link failed first), the commit may
    /// have been made or not: the file is written back again by upkeep (an exclusive create
    /// that finds its own commit made drops its copy, the server's being the same). Removed
    /// here before that, it is removed here only, and shows again if the server has it (as a
    /// removal cut by the link).
    pub(super) fn put_answer_taken(&self, ino: Ino) {
        let sent = |v: &Vfs| {
            v.lock().inodes.get(&ino).is_some_and(|n| n.put.is_some())
                && !v.link.queued.has_put(ino)
        };
        if !sent(self) {
            return;
        }
        self.apply_invalidations();
        if !sent(self) {
            return;
        }
        if let Some(n) = self.lock().inodes.get_mut(&ino) {
            n.put = None;
        }
        self.retry_dirty.store(true, Ordering::Release);
    }

    /// Takes the server's answer to a new file's queued commit.
    pub(super) fn put_answered(&self, ans: PutAnswer) {
        let mut st = self.lock();
        let Some(n) = st.inodes.get_mut(&ans.ino) else {
            return;
        };
        if n.put == Some(ans.writes) {
            n.put = None;
        }
        if n.unlinked || !n.pending {
            // Removed or replaced here since, or committed since by a commit of its own (which
            // waited for this answer, but may have found it taken by another thread).
            return;
        }
        let path = n.path.clone();
        if path != ans.path {
            // Its directory was renamed while the commit was on its way: what the server made
            // of it is not this name's. Written back again.
            tracing::warn!(
                "{path:?}: moved while its commit (as {:?}) was on its way; written back again",
                ans.path
            );
            self.retry_dirty.store(true, Ordering::Release);
            return;
        }
        let a = match ans.outcome {
            Ok(a) => a,
            Err((code, m)) if code == ErrorCode::Conflict && ans.exclusive => {
                tracing::warn!(
                    "{path:?}: created here exclusively, but someone else made it meanwhile ({m}); theirs is kept, and the data written here is dropped"
                );
                n.dirty = false;
                self.unlinked(&mut st, &path);
                if let Some((dir, name)) = path.split_last() {
                    Self::relist(&mut st, &dir, name, Some(FileKind::File));
                }
                Self::forget_unused(&mut st, ans.ino);
                return;
            }
            Err((code, m)) => {
                // Left dirty. On a conflict it is written back again by upkeep, over theirs
                // (the last close wins); else (the directory gone, no space, no permission) at
                // its next close or when the link is made again, as a failed close's changes.
                tracing::warn!(
                    "{path:?}: the server refused the new file's commit ({m}); the changes are kept in the cache"
                );
                if code == ErrorCode::Conflict {
                    n.pending = false;
                    n.exclusive = false;
                }
                // (Not found: its directory is missing on the server, and the write-back
                // makes it again: see `commit`.)
                if matches!(code, ErrorCode::Conflict | ErrorCode::NotFound) {
                    self.retry_dirty.store(true, Ordering::Release);
                }
                return;
            }
        };
        let (clean, writing) = (n.writes == ans.writes, n.writers > 0);
        n.committed(a.version, clean);
        // Labelled under the state's lock, as a commit's result is (a release between would
        // label it otherwise).
        if let Err(e) = self
            .files
            .set_meta(&path, Some(a.version), !clean || writing)
        {
            tracing::warn!("{path:?}: cannot label the cache's copy: {e:?}");
        }
        self.recipes.put(&path, a.version, ans.recipe);
        if clean {
            self.keep_ctime_shown(&mut st, ans.ino, &path, &a);
        }
        self.store_attr(&mut st, &path, a, ans.at);
        // (The listing names it since its create here; the directory's attributes keep their
        // lease, its times as made here: see `queue_put`.)
        if let Some((dir, name)) = path.split_last() {
            Self::edit_listing(&mut st, &dir, name, Some(FileKind::File));
        }
        Self::forget_unused(&mut st, ans.ino);
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops `ino` if nothing refers to it any more and nothing is left to write back (a file
    /// closed and forgotten while its commit was on its way).
    fn forget_unused(st: &mut State, ino: Ino) {
        let Some(n) = st.inodes.get(&ino) else {
            return;
        };
        if n.open == 0 && n.lookups == 0 && !n.dirty && ino != ROOT {
            Self::drop_inode(st, ino);
        }
    }
}
