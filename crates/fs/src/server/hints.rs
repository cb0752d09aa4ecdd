//! Where chunks are found: hints of this session (where each chunk was seen, verified on use),
//! the persistent index of earlier sessions (LBFS's database), and the daemon's shelf.

use super::*;

impl Server {
    /// Notes that the chunks of `recipe` lie in the file at `path` (hints, verified on use).
    pub(super) fn hint_all(&mut self, path: &WirePath, recipe: &Recipe) {
        if recipe.len() > MAX_HINTS / 4 {
            // A huge file would push out every other hint (and hold hundreds of MB): its
            // chunks are found through the persistent index, where there is one.
            return;
        }
        self.make_room_for_hints(recipe.len());
        let file = self.hint_file(path);
        for (offset, c) in recipe.with_offsets() {
            self.short_ids.insert(ferry_proto::short_id(&c.id), c.id);
            self.hints.insert(
                c.id,
                Hint {
                    file,
                    offset,
                    len: c.len,
                },
            );
        }
    }

    /// Notes that chunk `id` lies at `offset` in the file at `path`.
    pub(super) fn hint_one(&mut self, path: &WirePath, id: Id, offset: u64, len: u32) {
        self.make_room_for_hints(1);
        let file = self.hint_file(path);
        self.short_ids.insert(ferry_proto::short_id(&id), id);
        self.hints.insert(id, Hint { file, offset, len });
    }

    /// The number hints name the file at `path` by.
    pub(super) fn hint_file(&mut self, path: &WirePath) -> u32 {
        if let Some(&f) = self.hint_files.get(path) {
            return f;
        }
        let f = self.hint_paths.len() as u32;
        self.hint_paths.push(path.clone());
        self.hint_files.insert(path.clone(), f);
        f
    }

    /// Forgets every hint when `n` more would pass [`MAX_HINTS`]: they are only hints, and
    /// what is forgotten is found again by the next recipe.
    pub(super) fn make_room_for_hints(&mut self, n: usize) {
        if self.hints.len() + n > MAX_HINTS {
            self.hints.clear();
            self.short_ids.clear();
            self.hint_paths.clear();
            self.hint_files.clear();
        }
    }

    /// A recipe of the file at `path` an earlier session cut while it had identity `fid`.
    pub(super) fn indexed(&self, path: &WirePath, fid: &FileId) -> Option<(Recipe, Oid)> {
        let i = self.index.as_ref()?;
        match i.recipe(path.as_bytes(), &stamp(fid)) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("index: {e}");
                None
            }
        }
    }

    /// The chunk a short id names: one this session saw, or one the index knows.
    pub(super) fn by_short(&self, short: u64) -> Option<Id> {
        if let Some(&id) = self.short_ids.get(&short) {
            return Some(id);
        }
        self.index.as_ref()?.find_prefix(short).ok().flatten()
    }

    /// Records a file's recipe (keyed by its identity) and where each of its chunks lies, for
    /// this session and (if it has an index) those to come.
    pub(super) fn remember(&mut self, path: &WirePath, fid: FileId, recipe: Recipe, oid: Oid) {
        if let Some(i) = &self.index {
            let known = i.recipe(path.as_bytes(), &stamp(&fid)).ok().flatten();
            if known.is_none_or(|(r, o)| r != recipe || o != oid) {
                self.to_record
                    .push((path.as_bytes().to_vec(), stamp(&fid), recipe.clone(), oid));
                if self.to_record.len() >= RECORD_AT_ONCE {
                    self.record_now();
                }
            }
        }
        self.hint_all(path, &recipe);
        if self.recipes.len() >= RECIPE_CACHE_ENTRIES {
            self.recipes.clear();
            self.objects.clear();
        }
        self.objects.insert(oid.id(), path.clone());
        self.recipes.insert(fid, (recipe, oid));
    }

    /// Writes what [`remember`](Self::remember) kept for the index, in one transaction.
    pub(super) fn record_now(&mut self) {
        let (Some(i), false) = (&self.index, self.to_record.is_empty()) else {
            return;
        };
        let files: Vec<_> = self
            .to_record
            .iter()
            .map(|(p, st, r, o)| (&p[..], st, r, o))
            .collect();
        if let Err(e) = i.record_all(&files) {
            tracing::debug!("index: {e}");
        }
        self.to_record.clear();
    }

    /// A chunk's bytes from wherever it was seen, verified; `None` if no valid copy is known.
    pub(super) fn chunk(&mut self, id: &Id) -> Option<Vec<u8>> {
        if let Some(d) = self.hinted(id) {
            return Some(d);
        }
        // A transfer daemon's store, to a client whose key the daemon authorizes (its owner's
        // other machines: a lookaside provider); never to a guest, which reads by capability.
        if !self.objects_only {
            if let Some(d) = self.shelf.as_ref().and_then(|s| s.chunk(id)) {
                return Some(d);
            }
        }
        // Seen by an earlier session.
        let i = self.index.clone()?;
        let (path, offset, len) = i.locate(id).ok()??;
        if !self.index_files.contains_key(&path) {
            if self.index_files.len() >= INDEX_FILES_OPEN {
                self.index_files.clear();
            }
            let f = WirePath::new(path.clone())
                .map_err(io::Error::other)
                .and_then(|p| self.export.open_file(&p));
            self.index_files
                .insert(path.clone(), f.map_err(|e| e.kind()));
        }
        let read = || -> io::Result<Vec<u8>> {
            use std::os::unix::fs::FileExt;
            let f = self.index_files[&path]
                .as_ref()
                .map_err(|&kind| io::Error::from(kind))?;
            let mut buf = vec![0u8; len as usize];
            f.read_exact_at(&mut buf, offset)?;
            Ok(buf)
        };
        // Stale: the file is gone, shorter, or holds other bytes there. (Not a failure of this
        // moment, out of descriptors say.)
        let stale = match read() {
            Ok(buf) if id.matches(&buf) => return Some(buf),
            Ok(_) => true,
            Err(e) => matches!(
                e.kind(),
                io::ErrorKind::NotFound
                    | io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::NotADirectory
                    | io::ErrorKind::IsADirectory
            ),
        };
        if stale {
            self.stale.push(*id);
        }
        None
    }

    /// A chunk's bytes from where this session saw it, verified.
    pub(super) fn hinted(&mut self, id: &Id) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let hint = *self.hints.get(id)?;
        let path = self.hint_paths.get(hint.file as usize)?;
        let read = || -> io::Result<Vec<u8>> {
            let f = self.export.open_file(path)?;
            let mut buf = vec![0u8; hint.len as usize];
            f.read_exact_at(&mut buf, hint.offset)?;
            Ok(buf)
        };
        match read() {
            Ok(buf) if id.matches(&buf) => Some(buf),
            _ => {
                // The file changed or went away: the hint was wrong, which costs only this.
                self.hints.remove(id);
                let short = ferry_proto::short_id(id);
                if self.short_ids.get(&short) == Some(id) {
                    self.short_ids.remove(&short);
                }
                None
            }
        }
    }
}
