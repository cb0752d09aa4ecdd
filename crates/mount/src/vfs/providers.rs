//! Lookaside providers a mount asks for chunks beside its server, and what each supplied.

/// Sessions with lookaside providers (`ferry lookaside add ferry://…`), and what each supplied
/// so far. One that fails is left out of later fetches by the engine's handling of a failed
/// source; the mount goes on with the server.
#[derive(Clone, Default)]
pub struct Providers {
    pub sessions: std::sync::Arc<std::sync::Mutex<Vec<ferry_fs::Mirror>>>,
    supplied: std::sync::Arc<std::sync::Mutex<Vec<ferry_fs::SourceStats>>>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_list()
            .entries(list.iter().map(|m| &m.name))
            .finish()
    }
}

impl Providers {
    pub fn new(sessions: Vec<ferry_fs::Mirror>) -> Self {
        Providers {
            sessions: std::sync::Arc::new(std::sync::Mutex::new(sessions)),
            supplied: Default::default(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Adds what a fetch's sources did to the providers' counts.
    pub(super) fn note(&self, sources: &[ferry_fs::SourceStats]) {
        let names: Vec<String> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|m| m.name.clone())
            .collect();
        let mut sum = self.supplied.lock().unwrap_or_else(|e| e.into_inner());
        for s in sources.iter().filter(|s| names.contains(&s.name)) {
            match sum.iter_mut().find(|t| t.name == s.name) {
                Some(t) => {
                    t.requests += s.requests;
                    t.chunks += s.chunks;
                    t.bytes += s.bytes;
                    t.misses += s.misses;
                    t.rejected += s.rejected;
                }
                None => sum.push(s.clone()),
            }
        }
    }

    /// What each provider supplied since the mount began.
    pub fn supplied(&self) -> Vec<ferry_fs::SourceStats> {
        self.supplied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
