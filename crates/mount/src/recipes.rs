//! The recipes of versions this mount committed itself, by path: the next commit of the same
//! file names the chunks it keeps of that version by reference with nothing asked first (see
//! `ferry_fs::Replacing::recipe`), one round trip instead of two. A recipe that is not the
//! server's after all (the file changed there at the same version, a server that cut it
//! otherwise) costs only a refused commit, made again the usual way: the server checks the
//! whole object.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ferry_format::Recipe;
use ferry_proto::WirePath;

/// Chunks of all recipes kept, at most (about 40 bytes each): past it, the others go.
const MAX_CHUNKS: usize = 1 << 16;

#[derive(Default)]
pub(crate) struct Recipes {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    by_path: HashMap<WirePath, (u64, Arc<Recipe>)>,
    chunks: usize,
}

impl Recipes {
    /// The recipe of `path` at `version`, if this mount committed that version.
    pub(crate) fn get(&self, path: &WirePath, version: u64) -> Option<Arc<Recipe>> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.by_path
            .get(path)
            .filter(|(v, _)| *v == version)
            .map(|(_, r)| r.clone())
    }

    /// Keeps the recipe of the version of `path` just committed.
    pub(crate) fn put(&self, path: &WirePath, version: u64, recipe: Arc<Recipe>) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if recipe.len() > MAX_CHUNKS {
            Self::remove(&mut kept, path);
            return;
        }
        if kept.chunks + recipe.len() > MAX_CHUNKS {
            *kept = Kept::default();
        }
        kept.chunks += recipe.len();
        if let Some((_, old)) = kept.by_path.insert(path.clone(), (version, recipe)) {
            kept.chunks -= old.len();
        }
    }

    pub(crate) fn forget(&self, path: &WirePath) {
        Self::remove(
            &mut self.kept.lock().unwrap_or_else(|e| e.into_inner()),
            path,
        );
    }

    fn remove(kept: &mut Kept, path: &WirePath) {
        if let Some((_, old)) = kept.by_path.remove(path) {
            kept.chunks -= old.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(n: usize) -> Arc<Recipe> {
        let mut r = Recipe::new(ferry_format::HashAlg::Blake3);
        for i in 0..n {
            r.push(ferry_format::ChunkRef {
                id: ferry_format::Id::hash(ferry_format::HashAlg::Blake3, &i.to_le_bytes()),
                len: 8,
            })
            .unwrap();
        }
        Arc::new(r)
    }

    /// A recipe is found for its version only, and the chunks kept stay bounded.
    #[test]
    fn recipes_are_found_by_version_and_bounded() {
        let r = Recipes::default();
        let p = WirePath::from("a");
        r.put(&p, 7, recipe(3));
        assert!(r.get(&p, 7).is_some());
        assert!(r.get(&p, 8).is_none());
        r.put(&p, 8, recipe(5));
        assert!(r.get(&p, 7).is_none());
        assert_eq!(r.kept.lock().unwrap().chunks, 5);
        r.put(&WirePath::from("big"), 1, recipe(MAX_CHUNKS - 2));
        assert_eq!(
            r.kept.lock().unwrap().chunks,
            MAX_CHUNKS - 2,
            "the others went"
        );
        assert!(r.get(&p, 8).is_none());
        r.forget(&WirePath::from("big"));
        assert_eq!(r.kept.lock().unwrap().chunks, 0);
    }
}
