//! Where the chunks a client uploads wait for their commit: a local staging store of each
//! client's own (trimmed after each session), or the shared store `ferry serve --store` names.

use std::path::Path;

use anyhow::{Context, Result};
use ferry_store::LocalStore;

use crate::cmd::remote::cache_options;

/// Where a session's uploaded chunks wait for their commit.
pub(crate) enum StagingStore {
    /// A local store, trimmed after the session (and the private directory of one made
    /// because the usual one was in use).
    Local {
        store: std::sync::Arc<LocalStore>,
        _private: Option<tempfile::TempDir>,
    },
    /// The shared store `--store` names (never trimmed here: its gc is `ferry store gc`).
    Shared(std::sync::Arc<dyn ferry_store::ChunkStore>),
}

impl StagingStore {
    pub(crate) fn open(
        shared: Option<std::sync::Arc<dyn ferry_store::ChunkStore>>,
        dir: &Path,
    ) -> Result<StagingStore> {
        Ok(match shared {
            Some(s) => StagingStore::Shared(s),
            None => {
                let (store, private) = open_staging(dir)?;
                StagingStore::Local {
                    store,
                    _private: private,
                }
            }
        })
    }

    pub(crate) fn store(&self) -> ferry_fs::Staging {
        match self {
            StagingStore::Local { store, .. } => store.clone(),
            StagingStore::Shared(s) => s.clone(),
        }
    }

    pub(crate) fn trim(&self) -> Result<()> {
        match self {
            StagingStore::Local { store, .. } => {
                store.trim(STAGING_BYTES)?;
            }
            StagingStore::Shared(s) => s.flush()?,
        }
        Ok(())
    }
}

/// Bound on a staging store, trimmed (least recently used first) after each session: chunks
/// wait there only until their commit, or for a cut upload to resume.
const STAGING_BYTES: u64 = 1 << 30;

/// Opens the staging store where chunks clients send wait for their commit (a cut upload
/// resumes from them). A second session at the same time gets a private store for its
/// lifetime, kept alive by the returned guard.
fn open_staging(dir: &Path) -> Result<(std::sync::Arc<LocalStore>, Option<tempfile::TempDir>)> {
    // Another session's store is not waited for: a mount opens its second session while the
    // first is busy, and would wait the whole second for nothing.
    let shared = ferry_store::Options {
        wait_for_lock: false,
        ..cache_options()
    };
    match LocalStore::open_or_create(dir, shared) {
        Ok(s) => Ok((std::sync::Arc::new(s), None)),
        Err(ferry_store::StoreError::Locked { .. }) => {
            let private = tempfile::tempdir()?;
            let s = LocalStore::create(private.path().join("staging"), cache_options())?;
            Ok((std::sync::Arc::new(s), Some(private)))
        }
        Err(e) => {
            Err(e).with_context(|| format!("cannot open the staging store {}", dir.display()))
        }
    }
}
