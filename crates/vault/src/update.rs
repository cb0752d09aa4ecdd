//! Updates: OceanStore's file-summary diff. The client keeps what the server's version of a file
//! is made of (its pieces, read from the tree), cuts the new version with the vault's keyed
//! chunker, diffs the two block sequences into delete and insert actions, applies them to the
//! tree copy-on-write, sends the blocks and nodes that are new, and publishes the result as the
//! next head, predicated on the head it was made against: creating `heads/N+1` fails when
//! another client got there first, and the update is then redone against the new version,
//! never merged blindly.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ferry_chunk::{ChunkReader, ChunkerSpec, Key};
use ferry_format::{ChunkRef, DiffOp, HashAlg, Id, Recipe, RecipeDiff};

use crate::backend::Backend;
use crate::nodes::{Nodes, Traffic};
use crate::records::{child, Catalog, Change, Commit, Entry, Kind};
use crate::ring::{self, Action};
use crate::summary::{self, Checked, FineOp, Fingerprinter, Part, Reuse, Summary};
use crate::tree::{Child, NodeId, Piece};
use crate::upload::{Sent, Uploader};
use crate::vault::{head_name, Snapshot, Vault};
use crate::VaultError;

/// Where a file's new content comes from.
#[derive(Clone, Debug)]
pub enum Source {
    File(PathBuf),
    Bytes(Vec<u8>),
}

/// One change to make.
#[derive(Clone, Debug)]
pub enum Edit {
    /// `name` becomes this content (replacing a file, or a directory, of that name).
    Put {
        name: String,
        kind: Kind,
        mode: u32,
        mtime_ns: i64,
        source: Source,
    },
    /// `name`, and everything under `name/`, go.
    Remove(String),
}

/// What an update did.
#[derive(Clone, Debug, Default)]
pub struct UpdateReport {
    /// The version made (or the current one, when nothing changed).
    pub seq: u64,
    pub changed: usize,
    /// Plaintext bytes read and cut.
    pub bytes_cut: u64,
    pub blocks_sent: u64,
    /// Sealed bytes of the blocks sent.
    pub block_bytes: u64,
    pub nodes_sent: u64,
    /// Times another client's head came first and the update was redone.
    pub retries: u32,
    /// The server applied the actions (a Ferry server); else the client sent the nodes.
    pub applied_by_server: bool,
    /// The files of the version made (or of the current one, when nothing changed).
    pub catalog: Catalog,
    pub traffic: Traffic,
}

/// Attempts before giving up on a vault that keeps changing under us.
const ATTEMPTS: u32 = 32;

impl Vault {
    /// The chunker: keyed FastCDC, or fixed blocks when the config's sizes are all equal.
    pub(crate) fn chunker(&self) -> ChunkerSpec {
        let c = &self.config;
        if c.min == c.max {
            ChunkerSpec::fixed(c.avg as usize)
        } else {
            ChunkerSpec::fastcdc(c.min as usize, c.avg as usize, c.max as usize)
                .keyed(Key(self.keys.chunker_key()))
        }
    }

    /// The catalog's chunker: keyed FastCDC around 2 KiB (an update changes a few entries,
    /// scattered; small blocks resend little around each).
    pub(crate) fn catalog_chunker(&self) -> ChunkerSpec {
        ChunkerSpec::fastcdc(512, 2 << 10, 16 << 10).keyed(Key(self.keys.chunker_key()))
    }

    /// Applies `edits` as one new version.
    pub fn update(&self, edits: &[Edit]) -> Result<UpdateReport, VaultError> {
        self.update_with(edits, &|_| {})
    }

    /// [`update`](Self::update), telling `progress` the bytes of new content cut as it goes.
    pub fn update_with(
        &self,
        edits: &[Edit],
        progress: &dyn Fn(u64),
    ) -> Result<UpdateReport, VaultError> {
        self.update_after(None, edits, progress)
    }

    /// [`update_with`](Self::update_with), made first against `snap`, a version this client
    /// just read (from [`latest`](Self::latest), to plan the edits): one listing of the heads
    /// fewer. If another client made a version since, the update is redone against the
    /// newest, as any update whose head is taken.
    pub fn update_on(
        &self,
        snap: Snapshot,
        edits: &[Edit],
        progress: &dyn Fn(u64),
    ) -> Result<UpdateReport, VaultError> {
        self.update_after(Some(snap), edits, progress)
    }

    fn update_after(
        &self,
        mut first: Option<Snapshot>,
        edits: &[Edit],
        progress: &dyn Fn(u64),
    ) -> Result<UpdateReport, VaultError> {
        let mut report = UpdateReport::default();
        for attempt in 0..ATTEMPTS {
            report.retries = attempt;
            let snap = match first.take() {
                Some(s) => s,
                None => self.latest()?,
            };
            let mut nodes = self.nodes();
            let mut batch = Batch::default();
            let sent = Mutex::new(Sent::default());
            let staged = std::thread::scope(|s| {
                let mut up = Uploader::start(s, self, &sent);
                let mut w = Work {
                    nodes: &mut nodes,
                    batch: &mut batch,
                    report: &mut report,
                    progress,
                    spec: self.chunker(),
                    cache_blocks: false,
                    up: &mut up,
                };
                let staged = self.stage(&snap, edits, &mut w);
                // Every block is stored (or the first failure known) before anything names it.
                let finished = up.finish();
                let staged = staged?;
                finished.map(|()| staged)
            })?;
            let sent = sent.into_inner().unwrap();
            report.blocks_sent += sent.blocks;
            report.block_bytes += sent.bytes;
            let Some((catalog, commit)) = staged else {
                report.seq = snap.seq;
                report.catalog = snap.catalog;
                report.traffic = self.traffic();
                return Ok(report);
            };
            self.settle_nodes(&mut nodes, &batch, &mut report)?;
            self.store.flush()?;
            report.catalog = catalog;
            let sealed = self.seal_head(&commit);
            if self.store.create(&head_name(commit.seq), &sealed)? {
                self.remember(commit.seq, *blake3::hash(&sealed).as_bytes())?;
                self.cache_head_bytes(commit.seq, &sealed);
                if let Some(s) = self.summaries() {
                    s.prune(
                        &report
                            .catalog
                            .entries
                            .values()
                            .filter_map(|e| e.root)
                            .collect(),
                    );
                }
                report.seq = commit.seq;
                report.traffic = self.traffic();
                return Ok(report);
            }
            tracing::info!(
                seq = commit.seq,
                "another client made version {} first; redoing the update against it",
                commit.seq
            );
        }
        Err(VaultError::Refused(format!(
            "the vault changed under this update {ATTEMPTS} times in a row; try again"
        )))
    }

    /// Applies `edits` to the files of `snap` and then to its catalog: their blocks queued, the
    /// actions in the batch, the next commit made (not yet published). None when nothing
    /// changed.
    fn stage(
        &self,
        snap: &Snapshot,
        edits: &[Edit],
        w: &mut Work<'_, '_, '_>,
    ) -> Result<Option<(Catalog, Commit)>, VaultError> {
        let mut catalog = snap.catalog.clone();
        let mut changes = vec![];
        for e in edits {
            self.apply_edit(w, &mut catalog, e, &mut changes)?;
        }
        w.report.changed = changes.len();
        if changes.is_empty() {
            return Ok(None);
        }
        let old_catalog = snap
            .commit
            .as_ref()
            .and_then(|c| child(c.catalog_size, c.catalog_root));
        let bytes = catalog.encode();
        // The old catalog's bytes are at hand: its fine summary costs nothing to make.
        let (chunk_key, fp_key) = self.keys.fine_keys();
        let old_summary =
            Fingerprinter::new(chunk_key, fp_key).read_all(&snap.catalog_bytes[..])?;
        let mut w = Work {
            nodes: &mut *w.nodes,
            batch: &mut *w.batch,
            report: &mut *w.report,
            progress: &|_| {},
            spec: self.catalog_chunker(),
            cache_blocks: true,
            up: &mut *w.up,
        };
        let catalog_root = self
            .update_content(
                &mut w,
                old_catalog,
                old_summary,
                Content::Bytes(&bytes),
                false,
            )?
            .root;
        let commit = Commit {
            seq: snap.seq + 1,
            parent: snap.hash,
            time_ns: now_ns(),
            catalog_size: bytes.len() as u64,
            catalog_root,
            changes,
        };
        Ok(Some((catalog, commit)))
    }

    /// Puts the new nodes where the next head can name them: the server applies the batch's
    /// actions and the client checks its roots, or (plain storage, or a batch too large for
    /// one request) the client sends the nodes itself.
    fn settle_nodes(
        &self,
        nodes: &mut Nodes<'_>,
        batch: &Batch,
        report: &mut UpdateReport,
    ) -> Result<(), VaultError> {
        let roots: Vec<NodeId> = batch.expect.iter().flatten().map(|c| c.node).collect();
        let body = ring::encode_actions(&batch.files);
        let applied = match body.len() <= MAX_APPLY {
            true => self.store.apply(&body)?,
            false => None,
        };
        match applied {
            Some(reply) => {
                if ring::decode_roots(&reply)? != batch.expect {
                    return Err(VaultError::Damaged {
                        id: "the server's update".into(),
                        why: "its new roots are not the ones the actions make".into(),
                    });
                }
                report.applied_by_server = true;
                nodes.keep_local(&roots)?;
            }
            None => report.nodes_sent += nodes.upload(&roots)? as u64,
        }
        Ok(())
    }

    fn apply_edit(
        &self,
        w: &mut Work<'_, '_, '_>,
        catalog: &mut Catalog,
        edit: &Edit,
        changes: &mut Vec<Change>,
    ) -> Result<(), VaultError> {
        match edit {
            Edit::Remove(name) => {
                for gone in remove_under(catalog, name) {
                    changes.push(Change {
                        removed: true,
                        name: gone.name,
                        size: 0,
                        root: None,
                    });
                }
            }
            Edit::Put {
                name,
                kind,
                mode,
                mtime_ns,
                source,
            } => {
                crate::records::check_name(name).map_err(VaultError::BadRange)?;
                let old = catalog.entries.get(name).cloned();
                // A file replaces a directory of its name, and the files its parents were.
                for gone in remove_under(catalog, &format!("{name}/")) {
                    changes.push(removed(gone));
                }
                let mut at = name.as_str();
                while let Some((parent, _)) = at.rsplit_once('/') {
                    if let Some(gone) = catalog.entries.remove(parent) {
                        changes.push(removed(gone));
                    }
                    at = parent;
                }
                let old_root = old.as_ref().and_then(|o| child(o.size, o.root));
                let summaries = self.summaries();
                let old_summary = old_root
                    .zip(summaries.as_ref())
                    .and_then(|(r, s)| s.load(&r.node, r.bytes));
                let content = match source {
                    Source::Bytes(b) => Content::Bytes(b),
                    Source::File(p) => Content::File(p),
                };
                let keep = summaries.is_some();
                let written = self.update_content(w, old_root, old_summary, content, keep)?;
                if let (Some(s), Some(root), Some(summary)) =
                    (&summaries, written.root, &written.summary)
                {
                    s.save(&root, summary);
                }
                let (root, size) = (written.root, written.size);
                let entry = Entry {
                    name: name.clone(),
                    kind: *kind,
                    mode: *mode,
                    mtime_ns: *mtime_ns,
                    size,
                    root,
                };
                if old.as_ref() != Some(&entry) {
                    changes.push(Change {
                        removed: false,
                        name: name.clone(),
                        size,
                        root,
                    });
                    catalog.entries.insert(name.clone(), entry);
                }
            }
        }
        Ok(())
    }

    /// Turns the old tree into one of `src`, sending the blocks that takes. With a summary of
    /// the old version (`old_summary`), the diff is fine: only the sub-blocks that changed are
    /// read again and sent, as new blocks placed between ranges of the old ones. Without, the
    /// new content's blocks are diffed against the old version's. With `keep`, the new
    /// content's summary is made (to be kept) either way.
    pub(crate) fn update_content(
        &self,
        w: &mut Work<'_, '_, '_>,
        old: Option<Child>,
        old_summary: Option<Summary>,
        src: Content<'_>,
        keep: bool,
    ) -> Result<Written, VaultError> {
        let old_pieces = match old {
            Some(r) => self.tree(w.nodes).read(Some(r), 0, r.bytes)?,
            None => vec![],
        };
        // A vault of fixed blocks is the paper's Block scheme: whole blocks only.
        let fixed = self.config.min == self.config.max;
        let fine = old_summary.filter(|_| !fixed && old.is_some());
        let done = match fine {
            Some(old_summary) => self.fine_actions(w, &old_summary, &old_pieces, src)?,
            None => None,
        };
        let (actions, summary, size) = match done {
            Some(d) => d,
            None => {
                let (chunk_key, fp_key) = self.keys.fine_keys();
                let mut fp = (keep && !fixed).then(|| Fingerprinter::new(chunk_key, fp_key));
                let have = old_pieces.iter().map(|p| p.block).collect();
                let segment = std::iter::once(src.open_at(0, u64::MAX));
                let pieces = self.send_blocks(have, segment, w, true, fp.as_mut())?;
                let new_pieces = pieces.into_iter().next().unwrap_or_default();
                let size = new_pieces.iter().map(|p| p.len as u64).sum();
                let summary = fp.and_then(Fingerprinter::finish);
                (diff_actions(&old_pieces, &new_pieces)?, summary, size)
            }
        };
        let root = if actions.is_empty() {
            old
        } else {
            let f = ring::FileActions { old, actions };
            let root = ring::apply_one(&mut self.tree(w.nodes), &f)?;
            w.batch.files.push(f);
            w.batch.expect.push(root);
            root
        };
        Ok(Written {
            root: root.map(|c| c.node),
            size,
            summary,
        })
    }

    /// The fine diff of `src` against the old version (`old_summary`, held in `old_pieces`):
    /// its actions, its summary and size, the new bytes queued; `None` when `src` is too large
    /// to summarise ([`summary::MAX_FINE`]).
    #[allow(clippy::type_complexity)]
    fn fine_actions(
        &self,
        w: &mut Work<'_, '_, '_>,
        old_summary: &Summary,
        old_pieces: &[Piece],
        src: Content<'_>,
    ) -> Result<Option<(Vec<Action>, Option<Summary>, u64)>, VaultError> {
        let (chunk_key, fp_key) = self.keys.fine_keys();
        let mut counted = Counted {
            inner: src.open_at(0, u64::MAX)?,
            n: 0,
            progress: w.progress,
        };
        let Some(new) = Fingerprinter::new(chunk_key, fp_key).read_all(&mut counted)? else {
            return Ok(None);
        };
        w.report.bytes_cut += counted.n;
        let ops = summary::diff(old_summary, &new)?;
        // What each insert puts in: old bytes found anywhere, or new bytes to send.
        let reuse = Reuse::new(old_summary, old_pieces);
        let parts: Vec<Vec<Part>> = ops
            .iter()
            .map(|op| match op {
                FineOp::Insert { from, subs, .. } => {
                    reuse.parts(&new.subs[subs.clone()], subs.start, *from)
                }
                FineOp::Delete { .. } => vec![],
            })
            .collect();
        // Each run of new bytes read again (opened only when its turn comes: there may be
        // thousands), checked against the summary.
        let segments = parts.iter().flatten().filter_map(|part| match part {
            Part::New { from, subs } => {
                let subs = &new.subs[subs.clone()];
                let len = subs.iter().map(|s| s.len as u64).sum();
                Some(src.open_at(*from, len).map(|inner| {
                    Box::new(Checked {
                        inner,
                        subs,
                        fp_key,
                        buf: vec![],
                    }) as Box<dyn Read + '_>
                }))
            }
            Part::Old { .. } => None,
        });
        let have = old_pieces.iter().map(|p| p.block).collect();
        let mut sent = self
            .send_blocks(have, segments, w, false, None)?
            .into_iter();
        let actions = ops
            .iter()
            .zip(&parts)
            .map(|(op, parts)| match op {
                FineOp::Delete { at, len } => Action::Delete { at: *at, len: *len },
                FineOp::Insert { at, .. } => Action::Insert {
                    at: *at,
                    pieces: parts
                        .iter()
                        .flat_map(|p| match p {
                            Part::Old { at, len } => reuse.pieces(*at, *len),
                            // Short only if a put failed: the update's end says so.
                            Part::New { .. } => sent.next().unwrap_or_default(),
                        })
                        .collect(),
                },
            })
            .collect();
        let size = new.bytes();
        Ok(Some((actions, Some(new), size)))
    }

    /// Cuts each of `segments` into blocks and queues those not in `have`; the pieces of each
    /// segment. `counting`: the bytes read are the content's (a fine diff's were counted when
    /// the file was summarised). `fp`, if given, is fed everything read.
    fn send_blocks<'r>(
        &self,
        mut have: HashSet<[u8; 32]>,
        segments: impl IntoIterator<Item = Result<Box<dyn Read + 'r>, VaultError>>,
        w: &mut Work<'_, '_, '_>,
        counting: bool,
        mut fp: Option<&mut Fingerprinter>,
    ) -> Result<Vec<Vec<Piece>>, VaultError> {
        let mut out = vec![];
        for segment in segments {
            let segment = segment?;
            let mut pieces = vec![];
            let mut reader = ChunkReader::new(segment, w.spec.build());
            loop {
                let c = match reader.next_chunk() {
                    Ok(Some(c)) => c,
                    Ok(None) => break,
                    Err(e) => return Err(VaultError::Local(format!("reading: {e}"))),
                };
                if counting {
                    w.report.bytes_cut += c.data.len() as u64;
                    (w.progress)(c.data.len() as u64);
                }
                if let Some(fp) = fp.as_deref_mut() {
                    fp.feed(c.data);
                }
                let id = self.keys.block_id(c.data);
                pieces.push(Piece {
                    block: id,
                    offset: 0,
                    len: c.data.len() as u32,
                });
                if have.insert(id) && !w.up.send(id, c.data.to_vec(), w.cache_blocks) {
                    // A put failed: the update's end reports it.
                    return Ok(out);
                }
            }
            out.push(pieces);
        }
        Ok(out)
    }
}

fn removed(e: Entry) -> Change {
    Change {
        removed: true,
        name: e.name,
        size: 0,
        root: None,
    }
}

/// Removes `name` and what is under `name/` (a `name` ending in `/`: only what is under it).
fn remove_under(catalog: &mut Catalog, name: &str) -> Vec<Entry> {
    let dir = if name.ends_with('/') {
        name.to_string()
    } else {
        format!("{name}/")
    };
    let mut gone: Vec<String> = catalog
        .entries
        .range(dir.clone()..)
        .take_while(|(k, _)| k.starts_with(&dir))
        .map(|(k, _)| k.clone())
        .collect();
    if !name.ends_with('/') && catalog.entries.contains_key(name) {
        gone.push(name.to_string());
    }
    gone.iter()
        .filter_map(|k| catalog.entries.remove(k))
        .collect()
}

/// A piece as the recipe diff sees it: equal only to the same range of the same block.
fn as_ref(p: &Piece) -> ChunkRef {
    let digest = if p.offset == 0 {
        p.block
    } else {
        let mut h = blake3::Hasher::new();
        h.update(&p.block);
        h.update(&p.offset.to_le_bytes());
        h.update(&p.len.to_le_bytes());
        *h.finalize().as_bytes()
    };
    ChunkRef {
        id: Id::from_parts(HashAlg::Blake3, digest),
        len: p.len,
    }
}

/// The delete and insert actions that turn a file of `old` pieces into one of `new`: the diff
/// of the two sequences, with offsets in the file as it is when each action applies.
fn diff_actions(old: &[Piece], new: &[Piece]) -> Result<Vec<Action>, VaultError> {
    let recipe = |ps: &[Piece]| {
        Recipe::from_chunks(HashAlg::Blake3, ps.iter().map(as_ref).collect())
            .map_err(|e| VaultError::BadRange(e.to_string()))
    };
    let diff = RecipeDiff::between(&recipe(old)?, &recipe(new)?)
        .map_err(|e| VaultError::BadRange(e.to_string()))?;
    let span = |ps: &[Piece]| ps.iter().map(|p| p.len as u64).sum::<u64>();
    let (mut at, mut i) = (0u64, 0usize);
    let mut out = vec![];
    for op in diff.ops {
        match op {
            DiffOp::Keep(n) => {
                at += span(&old[i..i + n as usize]);
                i += n as usize;
            }
            DiffOp::Delete(n) => {
                let len = span(&old[i..i + n as usize]);
                out.push(Action::Delete { at, len });
                i += n as usize;
            }
            DiffOp::Insert(refs) => {
                let pieces: Vec<Piece> = refs
                    .iter()
                    .map(|r| Piece {
                        block: *r.id.digest(),
                        offset: 0,
                        len: r.len,
                    })
                    .collect();
                at += span(&pieces);
                out.push(Action::Insert {
                    at: at - span(&pieces),
                    pieces,
                });
            }
        }
    }
    Ok(out)
}

/// What one update carries between its edits.
pub(crate) struct Work<'n, 's, 'u> {
    nodes: &'n mut Nodes<'s>,
    batch: &'n mut Batch,
    report: &'n mut UpdateReport,
    progress: &'n dyn Fn(u64),
    /// How this content is cut.
    spec: ChunkerSpec,
    /// Keep its sealed blocks in the local cache (the catalog's).
    cache_blocks: bool,
    up: &'n mut Uploader<'u>,
}

/// The actions of an update, and the roots the client computed from them.
#[derive(Default)]
pub(crate) struct Batch {
    files: Vec<ring::FileActions>,
    expect: Vec<Option<Child>>,
}

/// The largest batch of actions sent as one request; larger ones are sent as nodes.
const MAX_APPLY: usize = 2 << 20;

/// What [`Vault::update_content`] made: the new root, its size, and (where it is small enough
/// to keep) its fine summary.
pub(crate) struct Written {
    pub root: Option<NodeId>,
    pub size: u64,
    pub summary: Option<Summary>,
}

/// New content: a file (read twice when diffed finely: once whole to summarise it, then the
/// ranges that changed) or bytes in memory.
#[derive(Clone, Copy)]
pub(crate) enum Content<'a> {
    File(&'a Path),
    Bytes(&'a [u8]),
}

impl<'a> Content<'a> {
    /// At most `len` bytes from byte `at` on.
    fn open_at(&self, at: u64, len: u64) -> Result<Box<dyn Read + 'a>, VaultError> {
        match *self {
            Content::Bytes(b) => Ok(Box::new(b.get(at as usize..).unwrap_or_default().take(len))),
            Content::File(p) => {
                let fail = |e: std::io::Error| VaultError::Local(format!("{}: {e}", p.display()));
                let mut f = std::fs::File::open(p).map_err(fail)?;
                if at > 0 {
                    f.seek(SeekFrom::Start(at)).map_err(fail)?;
                }
                Ok(Box::new(f.take(len)))
            }
        }
    }
}

/// A reader that tells `progress` the bytes it read.
struct Counted<'p, R> {
    inner: R,
    n: u64,
    progress: &'p dyn Fn(u64),
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        (self.progress)(n as u64);
        Ok(n)
    }
}

pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}
