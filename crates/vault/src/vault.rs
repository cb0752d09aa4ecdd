//! Opening a vault: its config, its key slots, its heads (the versions), and the client's
//! memory of the newest head it saw (rollback protection).

use std::path::PathBuf;

use crate::backend::Backend;
use crate::keys::{KdfParams, VaultKeys};
use crate::nodes::{block_name, cache_file, hex, Metered, Nodes, Traffic};
use crate::records::{Catalog, Commit, Config};
use crate::tree::Tree;
use crate::VaultError;

/// An open vault: its backend, keys and parameters.
pub struct Vault {
    pub(crate) store: Metered,
    pub(crate) keys: VaultKeys,
    pub config: Config,
    /// The slot the passphrase opened (`keys/NAME`).
    pub slot: String,
    pub(crate) node_cache: Option<PathBuf>,
    memory: Option<PathBuf>,
}

/// One version: its commit and its files.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// 0 for the empty vault before its first commit.
    pub seq: u64,
    /// BLAKE3 of the head's sealed bytes (zeros before the first commit).
    pub hash: [u8; 32],
    pub commit: Option<Commit>,
    pub catalog: Catalog,
    /// The catalog's bytes as stored.
    pub(crate) catalog_bytes: Vec<u8>,
}

/// A key slot, as `ferry vault key list` shows it.
#[derive(Clone, Debug)]
pub struct SlotInfo {
    pub name: String,
    pub params: Option<KdfParams>,
}

pub(crate) fn head_name(seq: u64) -> String {
    format!("heads/{seq:020}")
}

impl Vault {
    /// Makes a new vault on `backend`, its master key wrapped under `passphrase`.
    pub fn init(
        backend: Box<dyn Backend>,
        passphrase: &[u8],
        kdf: KdfParams,
        config: Config,
    ) -> Result<Vault, VaultError> {
        let store = Metered::new(backend);
        if store.get("config")?.is_some() {
            return Err(VaultError::Exists(store.inner.describe()));
        }
        let keys = VaultKeys::generate();
        // The slot first: a config without a slot would be a vault nobody can open.
        let slot = new_slot_name();
        store.put(&format!("keys/{slot}"), &keys.wrap(passphrase, kdf)?)?;
        if !store.create("config", &config.encode())? {
            let _ = store.delete(&format!("keys/{slot}"));
            return Err(VaultError::Exists(store.inner.describe()));
        }
        Ok(Vault {
            store,
            keys,
            config,
            slot,
            node_cache: None,
            memory: None,
        })
    }

    /// Opens the vault on `backend` with `passphrase` (tried on each key slot).
    pub fn open(backend: Box<dyn Backend>, passphrase: &[u8]) -> Result<Vault, VaultError> {
        let store = Metered::new(backend);
        let config = match store.get("config")? {
            Some(b) => Config::decode(&b)?,
            None => return Err(VaultError::NotAVault(store.inner.describe())),
        };
        for name in store.list("keys/")? {
            let Some(slot) = store.get(&name)? else {
                continue;
            };
            match VaultKeys::unwrap(&slot, passphrase) {
                Ok(keys) => {
                    return Ok(Vault {
                        store,
                        keys,
                        config,
                        slot: name.trim_start_matches("keys/").to_string(),
                        node_cache: None,
                        memory: None,
                    })
                }
                // A damaged slot (or one a hostile server added) must not lock out the others.
                Err(_) => continue,
            }
        }
        Err(VaultError::WrongPassphrase)
    }

    /// Keeps tree nodes in `dir` (they never change, so the cache is never stale), and the
    /// catalog's sealed blocks beside it (`dir/../catalog-blocks`): a command then reads the
    /// catalog from the server only where another client changed it.
    pub fn with_node_cache(mut self, dir: PathBuf) -> Vault {
        self.node_cache = Some(dir);
        self
    }

    /// The fine summaries this client keeps (beside the node cache), if it keeps any.
    pub(crate) fn summaries(&self) -> Option<crate::summary::Summaries> {
        let dir = self.node_cache.as_ref()?.parent()?.join("summaries");
        Some(crate::summary::Summaries { dir })
    }

    /// Where the catalog's sealed block `id` is cached.
    pub(crate) fn cached_block(&self, id: &[u8; 32]) -> Option<PathBuf> {
        let h = hex(id);
        let dir = self.node_cache.as_ref()?.parent()?.join("catalog-blocks");
        Some(dir.join(&h[..2]).join(h))
    }

    /// Keeps a sealed catalog block (sealed: the cache holds nothing readable).
    pub(crate) fn cache_block(&self, id: &[u8; 32], sealed: &[u8]) {
        if let Some(p) = self.cached_block(id) {
            cache_file(&p, sealed);
        }
    }

    /// Remembers the newest head seen in `file`, and refuses older ones after.
    pub fn with_memory(mut self, file: PathBuf) -> Vault {
        self.memory = Some(file);
        self
    }

    pub fn traffic(&self) -> Traffic {
        self.store.traffic()
    }

    pub fn describe(&self) -> String {
        self.store.inner.describe()
    }

    pub(crate) fn nodes(&self) -> Nodes<'_> {
        Nodes::new(&self.store, self.node_cache.clone())
    }

    pub(crate) fn tree<'n, 's>(&self, nodes: &'n mut Nodes<'s>) -> Tree<'n, Nodes<'s>> {
        Tree::new(nodes, self.config.fanout as usize)
    }

    // ---- keys ----

    /// The key slots.
    pub fn slots(&self) -> Result<Vec<SlotInfo>, VaultError> {
        let mut out = vec![];
        for name in self.store.list("keys/")? {
            let params = self
                .store
                .get(&name)?
                .and_then(|b| crate::keys::slot_params(&b));
            out.push(SlotInfo {
                name: name.trim_start_matches("keys/").to_string(),
                params,
            });
        }
        Ok(out)
    }

    /// Adds a key slot for another passphrase; returns its name.
    pub fn add_slot(&self, passphrase: &[u8], kdf: KdfParams) -> Result<String, VaultError> {
        let slot = new_slot_name();
        self.store
            .put(&format!("keys/{slot}"), &self.keys.wrap(passphrase, kdf)?)?;
        self.store.flush()?;
        Ok(slot)
    }

    /// Removes a key slot; never the last one.
    pub fn remove_slot(&self, name: &str) -> Result<(), VaultError> {
        let slots = self.slots()?;
        if !slots.iter().any(|s| s.name == name) {
            return Err(VaultError::NotFound(format!("key slot {name}")));
        }
        if slots.len() == 1 {
            return Err(VaultError::Refused(
                "that is the vault's only key slot: add another first".into(),
            ));
        }
        self.store.delete(&format!("keys/{name}"))
    }

    // ---- heads ----

    /// The seqs of the heads present, ascending.
    pub fn heads(&self) -> Result<Vec<u64>, VaultError> {
        self.heads_from(0)
    }

    /// The seqs of the heads present from `from` on, ascending (only those are listed: a
    /// client that saw version N does not list the N before it).
    fn heads_from(&self, from: u64) -> Result<Vec<u64>, VaultError> {
        let names = match from {
            0 => self.store.list("heads/")?,
            n => self.store.list_after("heads/", &head_name(n - 1))?,
        };
        let mut seqs: Vec<u64> = names
            .iter()
            .filter_map(|n| n.strip_prefix("heads/")?.parse().ok())
            .filter(|&s| s >= from)
            .collect();
        seqs.sort_unstable();
        Ok(seqs)
    }

    fn head_aad(&self, seq: u64) -> Vec<u8> {
        let mut aad = b"FVCM".to_vec();
        aad.extend_from_slice(&self.config.id);
        aad.extend_from_slice(&seq.to_le_bytes());
        aad
    }

    pub(crate) fn seal_head(&self, c: &Commit) -> Vec<u8> {
        self.keys.seal(&c.encode(), &self.head_aad(c.seq))
    }

    /// Head `seq`: its commit and the BLAKE3 of its sealed bytes.
    pub fn read_head(&self, seq: u64) -> Result<(Commit, [u8; 32]), VaultError> {
        let name = head_name(seq);
        let sealed = self
            .store
            .get(&name)?
            .ok_or_else(|| VaultError::Missing(name.clone()))?;
        self.open_head(seq, &sealed)
    }

    /// Head `seq` from the local cache when there (a head never changes once made), else
    /// from the server, then cached.
    fn read_head_cached(&self, seq: u64) -> Result<(Commit, [u8; 32]), VaultError> {
        let file = self
            .node_cache
            .as_ref()
            .and_then(|d| d.parent())
            .map(|d| d.join("heads").join(format!("{seq:020}")));
        if let Some(Ok(r)) = file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .map(|s| self.open_head(seq, &s))
        {
            return Ok(r);
        }
        let name = head_name(seq);
        let sealed = self
            .store
            .get(&name)?
            .ok_or_else(|| VaultError::Missing(name.clone()))?;
        let r = self.open_head(seq, &sealed)?;
        if let Some(f) = file {
            cache_file(&f, &sealed);
        }
        Ok(r)
    }

    pub(crate) fn cache_head_bytes(&self, seq: u64, sealed: &[u8]) {
        if let Some(d) = self.node_cache.as_ref().and_then(|d| d.parent()) {
            cache_file(&d.join("heads").join(format!("{seq:020}")), sealed);
        }
    }

    fn open_head(&self, seq: u64, sealed: &[u8]) -> Result<(Commit, [u8; 32]), VaultError> {
        let name = head_name(seq);
        let plain = self.keys.open(sealed, &self.head_aad(seq), &name)?;
        let c = Commit::decode(&plain)?;
        if c.seq != seq {
            return Err(VaultError::Damaged {
                id: name,
                why: format!("it says it is version {}", c.seq),
            });
        }
        Ok((c, *blake3::hash(sealed).as_bytes()))
    }

    /// The newest version (checked against the client's memory of the newest it saw).
    pub fn latest(&self) -> Result<Snapshot, VaultError> {
        let seen = self.recall()?;
        let from = seen.map_or(0, |(seq, _)| seq);
        let mut newest = self.heads_from(from)?.last().copied().unwrap_or(0);
        if newest < from {
            // What is there, for the message.
            newest = self.heads()?.last().copied().unwrap_or(0);
        }
        if let Some((seq, hash)) = seen {
            if newest < seq {
                return Err(VaultError::Rollback(format!(
                    "the vault offers version {newest}, but this client has seen version {seq}: \
                     the server rolled it back or lost it"
                )));
            }
            // The newest one as this client keeps it; an older one from the server, to see
            // that the history it saw is still the one there.
            let read = match seq == newest {
                true => self.read_head_cached(seq),
                false => self.read_head(seq),
            };
            let (_, h) = read.map_err(|e| {
                VaultError::Rollback(format!(
                    "version {seq}, which this client saw, is no longer readable ({e})"
                ))
            })?;
            if h != hash {
                return Err(VaultError::Rollback(format!(
                    "version {seq} is not the one this client saw: the history was rewritten"
                )));
            }
        }
        let snap = self.snapshot(newest)?;
        self.remember(snap.seq, snap.hash)?;
        Ok(snap)
    }

    /// Version `seq` (0: the empty vault).
    pub fn snapshot(&self, seq: u64) -> Result<Snapshot, VaultError> {
        if seq == 0 {
            return Ok(Snapshot {
                seq: 0,
                hash: [0; 32],
                commit: None,
                catalog: Catalog::default(),
                catalog_bytes: vec![],
            });
        }
        let (commit, hash) = self.read_head_cached(seq)?;
        let root = crate::records::child(commit.catalog_size, commit.catalog_root);
        let bytes = self.read_catalog(root)?;
        let catalog = Catalog::decode(&bytes)?;
        Ok(Snapshot {
            seq,
            hash,
            commit: Some(commit),
            catalog,
            catalog_bytes: bytes,
        })
    }

    fn recall(&self) -> Result<Option<(u64, [u8; 32])>, VaultError> {
        let Some(f) = &self.memory else {
            return Ok(None);
        };
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(VaultError::Backend(format!("{}: {e}", f.display()))),
        };
        let bad = || VaultError::Backend(format!("{}: not a record of a version", f.display()));
        let (seq, h) = text.trim().split_once(' ').ok_or_else(bad)?;
        let seq = seq.parse().map_err(|_| bad())?;
        let mut hash = [0u8; 32];
        if h.len() != 64 {
            return Err(bad());
        }
        for (i, b) in hash.iter_mut().enumerate() {
            *b = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Some((seq, hash)))
    }

    pub(crate) fn remember(&self, seq: u64, hash: [u8; 32]) -> Result<(), VaultError> {
        let Some(f) = &self.memory else {
            return Ok(());
        };
        if seq == 0 || self.recall()?.is_some_and(|(s, _)| s >= seq) {
            return Ok(());
        }
        let io = |e: std::io::Error| VaultError::Backend(format!("{}: {e}", f.display()));
        let dir = f.parent().expect("a file");
        std::fs::create_dir_all(dir).map_err(io)?;
        let tmp = f.with_extension("tmp");
        std::fs::write(&tmp, format!("{seq} {}\n", hex(&hash))).map_err(io)?;
        std::fs::rename(&tmp, f).map_err(io)
    }

    // ---- blocks ----

    fn block_aad(&self, id: &[u8; 32]) -> Vec<u8> {
        let mut aad = b"FVBK".to_vec();
        aad.extend_from_slice(&self.config.id);
        aad.extend_from_slice(id);
        aad
    }

    /// A block sealed: `01 ‖ zstd(plain)` when that is at least an eighth smaller, else
    /// `00 ‖ plain`, encrypted (compression before encryption: the server sees the compressed
    /// size, which says no more than the plain size it would otherwise see).
    pub(crate) fn seal_block(&self, id: &[u8; 32], plain: &[u8]) -> Vec<u8> {
        let mut body = Vec::with_capacity(plain.len() + 1);
        match zstd::bulk::compress(plain, 3) {
            Ok(z) if z.len() + z.len() / 7 < plain.len() => {
                body.push(1);
                body.extend_from_slice(&z);
            }
            _ => {
                body.push(0);
                body.extend_from_slice(plain);
            }
        }
        self.keys.seal(&body, &self.block_aad(id))
    }

    /// Blocks `ids` (one request where the storage allows), each decrypted and checked.
    pub(crate) fn fetch_block_batch(&self, ids: &[[u8; 32]]) -> Result<Vec<Vec<u8>>, VaultError> {
        let names: Vec<String> = ids.iter().map(block_name).collect();
        let sealed = self.store.get_many(&names)?;
        ids.iter()
            .zip(sealed)
            .map(|(id, s)| self.open_block(id, s))
            .collect()
    }

    /// The catalog under `root`: its blocks from the local cache where there, the rest from
    /// the server (then cached).
    fn read_catalog(&self, root: Option<crate::tree::Child>) -> Result<Vec<u8>, VaultError> {
        let Some(r) = root else {
            return Ok(vec![]);
        };
        let pieces = self.tree(&mut self.nodes()).read(Some(r), 0, r.bytes)?;
        let mut blocks = std::collections::HashMap::new();
        let mut missing = vec![];
        for p in &pieces {
            if blocks.contains_key(&p.block) || missing.contains(&p.block) {
                continue;
            }
            let cached = self
                .cached_block(&p.block)
                .and_then(|f| std::fs::read(f).ok());
            match cached.map(|s| self.open_block(&p.block, Some(s))) {
                Some(Ok(b)) => {
                    blocks.insert(p.block, b);
                }
                _ => missing.push(p.block),
            }
        }
        for batch in missing.chunks(64) {
            let names: Vec<String> = batch.iter().map(block_name).collect();
            for (id, sealed) in batch.iter().zip(self.store.get_many(&names)?) {
                if let Some(s) = &sealed {
                    self.cache_block(id, s);
                }
                blocks.insert(*id, self.open_block(id, sealed)?);
            }
        }
        let mut out = Vec::with_capacity(r.bytes.min(1 << 30) as usize);
        for p in &pieces {
            out.extend_from_slice(crate::read::slice(&blocks[&p.block], p)?);
        }
        Ok(out)
    }

    fn open_block(&self, id: &[u8; 32], sealed: Option<Vec<u8>>) -> Result<Vec<u8>, VaultError> {
        let name = block_name(id);
        let sealed = sealed.ok_or_else(|| VaultError::Missing(name.clone()))?;
        let body = self.keys.open(&sealed, &self.block_aad(id), &name)?;
        let damaged = |why: &str| VaultError::Damaged {
            id: name.clone(),
            why: why.into(),
        };
        let plain = match body.split_first() {
            Some((0, raw)) => raw.to_vec(),
            // Bounded by the largest block the vault cuts (the catalog's are up to 16 KiB).
            Some((1, z)) => zstd::bulk::decompress(z, (self.config.max as usize).max(16 << 10))
                .map_err(|_| damaged("its compressed bytes do not decompress"))?,
            _ => return Err(damaged("an unknown block encoding")),
        };
        if self.keys.block_id(&plain) != *id {
            return Err(damaged("it decrypts, but not to the block its id names"));
        }
        Ok(plain)
    }
}

fn new_slot_name() -> String {
    format!("{:016x}", rand::random::<u64>())
}
