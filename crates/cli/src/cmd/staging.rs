//! Where the chunks a client uploads wait for their commit: a local staging store of each
//! client's own (trimmed after each session), or the shared store `ferry serve --store` names.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use ferry_format::{HashAlg, Id, Oid, Recipe};
use ferry_store::{ChunkStore, LocalStore, StoreError, StoreStats, VerifiedChunk};

use crate::cmd::remote::cache_options;

/// Where a session's uploaded chunks wait for their commit.
pub(crate) enum StagingStore {
    /// A local store, opened (or made) at its first use, and trimmed after the session.
    Local(Arc<LazyStaging>),
    /// The shared store `--store` names (never trimmed here: its gc is `ferry store gc`).
    Shared(Arc<dyn ChunkStore>),
}

impl StagingStore {
    /// The shared store, or a local one in `dir` to be opened at its first use.
    pub(crate) fn new(shared: Option<Arc<dyn ChunkStore>>, dir: &Path) -> StagingStore {
        match shared {
            Some(s) => StagingStore::Shared(s),
            None => StagingStore::Local(Arc::new(LazyStaging {
                dir: dir.to_path_buf(),
                opened: OnceLock::new(),
            })),
        }
    }

    pub(crate) fn store(&self) -> ferry_fs::Staging {
        match self {
            StagingStore::Local(lazy) => lazy.clone(),
            StagingStore::Shared(s) => s.clone(),
        }
    }

    pub(crate) fn trim(&self) -> Result<()> {
        match self {
            StagingStore::Local(lazy) => {
                if let Some(Ok(o)) = lazy.opened.get() {
                    o.store.trim(STAGING_BYTES)?;
                }
            }
            StagingStore::Shared(s) => s.flush()?,
        }
        Ok(())
    }
}

/// A local staging store opened at its first use: a session that uploads nothing (a `get`, a
/// mount that only reads) neither makes nor opens one. Making one (its index, with a dozen
/// disk syncs) stood between a new server and its first reply.
pub(crate) struct LazyStaging {
    dir: PathBuf,
    opened: OnceLock<Result<Opened, String>>,
}

struct Opened {
    store: Arc<LocalStore>,
    /// The private directory of one made because the usual one was in use.
    _private: Option<tempfile::TempDir>,
}

impl LazyStaging {
    fn store(&self) -> Result<&LocalStore, StoreError> {
        let opened = self.opened.get_or_init(|| {
            open_staging(&self.dir)
                .map(|(store, private)| Opened {
                    store,
                    _private: private,
                })
                .map_err(|e| format!("{e:#}"))
        });
        match opened {
            Ok(o) => Ok(&o.store),
            Err(why) => Err(StoreError::Io {
                op: "open the staging store",
                path: self.dir.clone(),
                source: std::io::Error::other(why.clone()),
            }),
        }
    }
}

impl ChunkStore for LazyStaging {
    fn hash_alg(&self) -> HashAlg {
        // A store that cannot be opened says so at its first put or read; until then it would
        // be made with the usual algorithm.
        self.store()
            .map_or(cache_options().hash_alg, |s| s.hash_alg())
    }
    fn contains(&self, id: &Id) -> Result<bool, StoreError> {
        self.store()?.contains(id)
    }
    fn get(&self, id: &Id) -> Result<Option<Vec<u8>>, StoreError> {
        self.store()?.get(id)
    }
    fn get_passing(&self, id: &Id) -> Result<Option<Vec<u8>>, StoreError> {
        self.store()?.get_passing(id)
    }
    fn find_prefix(&self, prefix: u64) -> Result<Option<Id>, StoreError> {
        self.store()?.find_prefix(prefix)
    }
    fn prefetch(&self, ids: &[Id]) {
        if let Ok(s) = self.store() {
            s.prefetch(ids);
        }
    }
    fn prefer_speed(&self, yes: bool) {
        if let Ok(s) = self.store() {
            s.prefer_speed(yes);
        }
    }
    fn put(&self, chunk: &VerifiedChunk<'_>) -> Result<bool, StoreError> {
        self.store()?.put(chunk)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.store()?.flush()
    }
    fn put_object(&self, oid: &Oid, recipe: &Recipe) -> Result<(), StoreError> {
        self.store()?.put_object(oid, recipe)
    }
    fn object(&self, oid: &Oid) -> Result<Option<Recipe>, StoreError> {
        self.store()?.object(oid)
    }
    fn remove_object(&self, oid: &Oid) -> Result<bool, StoreError> {
        self.store()?.remove_object(oid)
    }
    fn objects(&self) -> Result<Vec<(Oid, u64)>, StoreError> {
        self.store()?.objects()
    }
    fn stats(&self) -> Result<StoreStats, StoreError> {
        self.store()?.stats()
    }
    fn is_empty(&self) -> Result<bool, StoreError> {
        self.store()?.is_empty()
    }
}

/// Bound on a staging store, trimmed (least recently used first) after each session: chunks
/// wait there only until their commit, or for a cut upload to resume.
const STAGING_BYTES: u64 = 1 << 30;

/// Opens the staging store where chunks clients send wait for their commit (a cut upload
/// resumes from them). A second session at the same time gets a private store for its
/// lifetime, kept alive by the returned guard.
fn open_staging(dir: &Path) -> Result<(Arc<LocalStore>, Option<tempfile::TempDir>)> {
    // Another session's store is not waited for: a mount opens its second session while the
    // first is busy, and would wait the whole second for nothing.
    let shared = ferry_store::Options {
        wait_for_lock: false,
        ..cache_options()
    };
    match LocalStore::open_or_create(dir, shared) {
        Ok(s) => Ok((Arc::new(s), None)),
        Err(ferry_store::StoreError::Locked { .. }) => {
            let private = tempfile::tempdir()?;
            let s = LocalStore::create(private.path().join("staging"), cache_options())?;
            Ok((Arc::new(s), Some(private)))
        }
        Err(e) => {
            Err(e).with_context(|| format!("cannot open the staging store {}", dir.display()))
        }
    }
}
