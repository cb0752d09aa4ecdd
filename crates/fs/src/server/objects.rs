//! Objects served by capability (the object family of `docs/protocol.md`): what a transfer
//! daemon (`ferry daemon`) hands other daemons. The shelf holding them is the daemon's; this
//! module checks each request against it and frames the answers.

use std::collections::HashSet;
use std::sync::Arc;

use ferry_format::{Id, Recipe};
use ferry_proto::{ErrorCode, Frame, Ids, Message, Reply, MAX_OBJECT_REFS};

use super::content::plain_chunk_frames;
use super::{error, Server};

/// Where a daemon's objects are, and who may read them.
pub trait ObjectShelf: Send + Sync {
    /// The size and recipe of object `oid`, if `cap` lets its holder read it. `None` both when
    /// it does not and when there is no such object: the answer must not tell them apart.
    fn open(&self, oid: &Id, cap: &[u8]) -> Option<(u64, Arc<Recipe>)>;

    /// A chunk's bytes, verified against `id`.
    fn chunk(&self, id: &Id) -> Option<Vec<u8>>;
}

/// The one answer to a capability that does not read the object, an object not held, and a
/// chunk that is not the object's.
fn not_found() -> Reply {
    error(
        ErrorCode::NotFound,
        "no such object, or not with this capability",
    )
}

/// The object whose chunks a session was last asked for, with its chunk ids.
pub(super) struct Opened {
    oid: Id,
    cap: Vec<u8>,
    ids: HashSet<Id>,
}

impl Server {
    /// Serves objects from `shelf` to anyone holding a capability; with `only`, nothing else
    /// (a client whose key is not authorized for the export).
    pub fn with_objects(mut self, shelf: Arc<dyn ObjectShelf>, only: bool) -> Self {
        self.shelf = Some(shelf);
        self.objects_only = only;
        self
    }

    pub(super) fn object_recipe(&mut self, oid: &Id, cap: &[u8], from: u64) -> Reply {
        let Some((size, recipe)) = self.shelf.as_ref().and_then(|s| s.open(oid, cap)) else {
            return not_found();
        };
        let total = recipe.len() as u64;
        let start = from.min(total) as usize;
        let end = (start + MAX_OBJECT_REFS).min(recipe.len());
        Reply::Object {
            oid: *oid,
            size,
            total,
            from: start as u64,
            chunks: recipe.chunks()[start..end].to_vec(),
        }
    }

    pub(super) fn object_chunks(&mut self, id: u32, oid: &Id, cap: &[u8], ids: &Ids) -> Vec<Frame> {
        let one = |r: Reply| vec![Message::Reply(r).to_frame(id)];
        let Some(shelf) = self.shelf.clone() else {
            return one(not_found());
        };
        let same = self
            .opened
            .as_ref()
            .is_some_and(|o| o.oid == *oid && o.cap == cap);
        if !same {
            let Some((_, recipe)) = shelf.open(oid, cap) else {
                return one(not_found());
            };
            self.opened = Some(Opened {
                oid: *oid,
                cap: cap.to_vec(),
                ids: recipe.chunks().iter().map(|c| c.id).collect(),
            });
        }
        let Ids::Full(asked) = ids else {
            return one(error(
                ErrorCode::BadRequest,
                "an object's chunks are asked for by full id",
            ));
        };
        let opened = self.opened.as_ref().expect("opened above");
        if !asked.iter().all(|c| opened.ids.contains(c)) {
            return one(not_found());
        }
        let found = asked
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i as u32, shelf.chunk(c)?)));
        plain_chunk_frames(id, found)
    }
}
