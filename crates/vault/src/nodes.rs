//! The client's view of a vault's blobs: a meter on the backend (what went up and down), tree
//! nodes through a local cache (nodes are immutable and named by their hash, so a cached node
//! is never stale), and the overlay an update writes its new nodes to before any is sent.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::Backend;
use crate::tree::{Node, NodeId, NodeStore};
use crate::VaultError;

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn node_name(id: &NodeId) -> String {
    let h = hex(id);
    format!("nodes/{}/{h}", &h[..2])
}

pub(crate) fn block_name(id: &[u8; 32]) -> String {
    let h = hex(id);
    format!("blocks/{}/{h}", &h[..2])
}

/// Writes a file of the client's cache (a temporary file renamed into place). The cache is an
/// optimisation: a failure to write it costs a later fetch only.
pub(crate) fn cache_file(path: &std::path::Path, bytes: &[u8]) {
    let Some(dir) = path.parent() else {
        return;
    };
    let tmp = dir.join(format!(".tmp-{:016x}", rand::random::<u64>()));
    let ok = std::fs::create_dir_all(dir).is_ok()
        && std::fs::write(&tmp, bytes).is_ok()
        && std::fs::rename(&tmp, path).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// What crossed the link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub requests: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// A backend that counts its requests and bytes.
pub struct Metered {
    pub inner: Box<dyn Backend>,
    requests: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
}

impl Metered {
    pub fn new(inner: Box<dyn Backend>) -> Metered {
        Metered {
            inner,
            requests: AtomicU64::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
        }
    }

    pub fn traffic(&self) -> Traffic {
        Traffic {
            requests: self.requests.load(Ordering::Relaxed),
            bytes_up: self.up.load(Ordering::Relaxed),
            bytes_down: self.down.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn count(&self, up: usize, down: usize) {
        tracing::trace!(target: "ferry::vault", up, down, "request");
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.up.fetch_add(up as u64, Ordering::Relaxed);
        self.down.fetch_add(down as u64, Ordering::Relaxed);
    }
}

impl Backend for Metered {
    fn get(&self, name: &str) -> Result<Option<Vec<u8>>, VaultError> {
        let b = self.inner.get(name)?;
        self.count(0, b.as_ref().map_or(0, Vec::len));
        Ok(b)
    }

    fn put(&self, name: &str, bytes: &[u8]) -> Result<(), VaultError> {
        self.inner.put(name, bytes)?;
        self.count(bytes.len(), 0);
        Ok(())
    }

    fn create(&self, name: &str, bytes: &[u8]) -> Result<bool, VaultError> {
        let made = self.inner.create(name, bytes)?;
        self.count(bytes.len(), 0);
        Ok(made)
    }

    fn list(&self, dir: &str) -> Result<Vec<String>, VaultError> {
        let l = self.inner.list(dir)?;
        self.count(0, l.iter().map(|n| n.len() + 1).sum());
        Ok(l)
    }

    fn list_after(&self, dir: &str, after: &str) -> Result<Vec<String>, VaultError> {
        let l = self.inner.list_after(dir, after)?;
        self.count(0, l.iter().map(|n| n.len() + 1).sum());
        Ok(l)
    }

    fn delete(&self, name: &str) -> Result<(), VaultError> {
        self.count(0, 0);
        self.inner.delete(name)
    }

    fn flush(&self) -> Result<(), VaultError> {
        self.inner.flush()
    }

    fn put_many(&self, blobs: &[(String, Vec<u8>)]) -> Result<(), VaultError> {
        self.inner.put_many(blobs)?;
        self.count(blobs.iter().map(|(n, b)| n.len() + b.len() + 6).sum(), 0);
        Ok(())
    }

    fn get_many(&self, names: &[String]) -> Result<Vec<Option<Vec<u8>>>, VaultError> {
        let r = self.inner.get_many(names)?;
        self.count(
            names.iter().map(|n| n.len() + 1).sum(),
            r.iter()
                .map(|b| b.as_ref().map_or(1, |b| b.len() + 5))
                .sum(),
        );
        Ok(r)
    }

    fn apply(&self, body: &[u8]) -> Result<Option<Vec<u8>>, VaultError> {
        let r = self.inner.apply(body)?;
        if let Some(b) = &r {
            self.count(body.len(), b.len());
        }
        Ok(r)
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Tree nodes: new ones in memory, old ones from the local cache or the backend.
pub(crate) struct Nodes<'a> {
    backend: &'a dyn Backend,
    cache: Option<PathBuf>,
    pub(crate) new: HashMap<NodeId, Vec<u8>>,
}

impl<'a> Nodes<'a> {
    pub(crate) fn new(backend: &'a dyn Backend, cache: Option<PathBuf>) -> Nodes<'a> {
        Nodes {
            backend,
            cache,
            new: HashMap::new(),
        }
    }

    fn cached(&self, id: &NodeId) -> Option<PathBuf> {
        let h = hex(id);
        self.cache.as_ref().map(|c| c.join(&h[..2]).join(h))
    }

    fn remember(&self, id: &NodeId, bytes: &[u8]) {
        if let Some(p) = self.cached(id) {
            cache_file(&p, bytes);
        }
    }

    /// Sends the new nodes reachable from `roots` (children before parents, so a node is
    /// never on the server before what it names); nodes not new are there already.
    pub(crate) fn upload(&mut self, roots: &[NodeId]) -> Result<usize, VaultError> {
        self.settle(roots, true)
    }

    /// Keeps the new nodes reachable from `roots` in the local cache only (a server that
    /// applies actions made them on its side).
    pub(crate) fn keep_local(&mut self, roots: &[NodeId]) -> Result<usize, VaultError> {
        self.settle(roots, false)
    }

    fn settle(&mut self, roots: &[NodeId], send: bool) -> Result<usize, VaultError> {
        let mut order = vec![];
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<(NodeId, bool)> = roots.iter().map(|r| (*r, false)).collect();
        while let Some((id, expanded)) = stack.pop() {
            if expanded {
                order.push(id);
                continue;
            }
            let Some(bytes) = self.new.get(&id) else {
                continue;
            };
            if !seen.insert(id) {
                continue;
            }
            stack.push((id, true));
            if let Ok(Node::Internal(cs)) = Node::decode(bytes) {
                stack.extend(cs.iter().map(|c| (c.node, false)));
            }
        }
        for id in &order {
            let bytes = &self.new[id];
            if send {
                self.backend.put(&node_name(id), bytes)?;
            }
            self.remember(id, bytes);
        }
        self.new.clear();
        Ok(order.len())
    }
}

impl Nodes<'_> {
    /// The bytes of nodes `ids`, from the cache or (those missing, several per request) the
    /// backend, each checked against its id and cached.
    pub(crate) fn fetch_many(&self, ids: &[NodeId]) -> Result<Vec<Vec<u8>>, VaultError> {
        let mut out: Vec<Option<Vec<u8>>> = ids
            .iter()
            .map(|id| {
                let p = self.cached(id)?;
                std::fs::read(p)
                    .ok()
                    .filter(|b| blake3::hash(b).as_bytes() == id)
            })
            .collect();
        let missing: Vec<usize> = (0..ids.len()).filter(|&i| out[i].is_none()).collect();
        for batch in missing.chunks(256) {
            let names: Vec<String> = batch.iter().map(|&i| node_name(&ids[i])).collect();
            for (&i, b) in batch.iter().zip(self.backend.get_many(&names)?) {
                let id = &ids[i];
                let b = b.ok_or_else(|| VaultError::Missing(format!("node {}", hex(id))))?;
                if blake3::hash(&b).as_bytes() != id {
                    return Err(VaultError::Damaged {
                        id: format!("node {}", hex(id)),
                        why: "the server's bytes do not hash to its id (altered or swapped)".into(),
                    });
                }
                self.remember(id, &b);
                out[i] = Some(b);
            }
        }
        Ok(out.into_iter().map(|b| b.expect("fetched")).collect())
    }
}

impl NodeStore for Nodes<'_> {
    fn put(&mut self, bytes: Vec<u8>) -> NodeId {
        let id = *blake3::hash(&bytes).as_bytes();
        self.new.insert(id, bytes);
        id
    }

    fn get(&self, id: &NodeId) -> Result<Option<Vec<u8>>, VaultError> {
        if let Some(b) = self.new.get(id) {
            return Ok(Some(b.clone()));
        }
        if let Some(p) = self.cached(id) {
            if let Ok(b) = std::fs::read(&p) {
                if blake3::hash(&b).as_bytes() == id {
                    return Ok(Some(b));
                }
                let _ = std::fs::remove_file(&p);
            }
        }
        let Some(b) = self.backend.get(&node_name(id))? else {
            return Ok(None);
        };
        if blake3::hash(&b).as_bytes() != id {
            return Err(VaultError::Damaged {
                id: format!("node {}", hex(id)),
                why: "the server's bytes do not hash to its id (altered or swapped)".into(),
            });
        }
        self.remember(id, &b);
        Ok(Some(b))
    }
}
