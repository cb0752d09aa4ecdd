//! Recipes put together from the parts a server sends: pages held here, chunks in full, chunks
//! by short id; checked against the server's check of the whole.

use std::collections::HashMap;

use ferry_format::{ChunkRef, HashAlg, Id, Recipe};
use ferry_proto::{short_id, RecipePart, Reply};
use ferry_store::VerifiedChunk;

use super::GetError;
use crate::conn::ConnError;

/// known, so the check comes back with it.
pub(crate) fn recipe_from(
    replies: Vec<Reply>,
    known: &[&[ChunkRef]],
    size: u64,
    mut shorts: Option<&mut Shorts>,
    find: &dyn Fn(u64) -> Result<Option<Id>, GetError>,
) -> Result<(Recipe, Option<[u8; 32]>), GetError> {
    let max_chunks = size.max(64 << 20) / ferry_chunk::MIN_CHUNK_LIMIT as u64;
    let mut chunks: Vec<ChunkRef> = vec![];
    let mut alg = HashAlg::Blake3;
    let mut check = None;
    let mut deferred = false;
    for r in replies {
        match r {
            Reply::Recipe(d) => {
                if d.total_chunks > max_chunks {
                    return Err(ConnError::Unexpected(
                        "a recipe of more chunks than the file's size allows".into(),
                    )
                    .into());
                }
                alg = d.alg;
                check = Some(d.check);
                for p in d.parts {
                    match p {
                        RecipePart::Known(i) => {
                            chunks.extend_from_slice(known.get(i as usize).ok_or_else(|| {
                                ConnError::Unexpected(format!("recipe page {i} was never named"))
                            })?)
                        }
                        RecipePart::Chunks(cs) => chunks.extend(cs),
                        RecipePart::Short(cs) => {
                            let shorts = shorts.as_deref_mut().ok_or_else(|| {
                                ConnError::Unexpected("short ids in a recipe not asked so".into())
                            })?;
                            deferred = true;
                            for (len, short) in cs {
                                let id = shorts.id(alg, len, short, find)?;
                                chunks.push(ChunkRef { id, len });
                                if chunks.len() as u64 > d.total_chunks {
                                    break;
                                }
                            }
                        }
                    }
                    if chunks.len() as u64 > d.total_chunks {
                        return Err(
                            ConnError::Unexpected("recipe longer than announced".into()).into()
                        );
                    }
                }
            }
            other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
        }
    }
    let recipe = Recipe::from_chunks(alg, chunks).map_err(ferry_proto::ProtoError::from)?;
    if deferred {
        return Ok((recipe, check));
    }
    if check.is_some_and(|c| c != recipe.check()) {
        return Err(GetError::RecipeCheck);
    }
    Ok((recipe, None))
}

/// Chunks named by short ids in recipes (GetRecipe with `short`) and held nowhere here: each stands in
/// its recipe under a placeholder id (the short id, then zeros) until it arrives and its real
/// id is known.
#[derive(Default)]
pub(crate) struct Shorts {
    /// Placeholders, with their chunks' lengths.
    pub(crate) open: HashMap<Id, u32>,
    /// Placeholders whose chunks arrived, and their real ids.
    found: HashMap<Id, Id>,
}

impl Shorts {
    /// The id of a chunk named by `short`: one held here with that prefix (`find`), else a
    /// placeholder.
    pub(crate) fn id(
        &mut self,
        alg: HashAlg,
        len: u32,
        short: u64,
        find: &dyn Fn(u64) -> Result<Option<Id>, GetError>,
    ) -> Result<Id, GetError> {
        if let Some(id) = find(short)?.filter(|id| id.alg() == alg) {
            return Ok(id);
        }
        let mut d = [0u8; 32];
        d[..8].copy_from_slice(&short.to_le_bytes());
        let id = Id::from_parts(alg, d);
        self.open.insert(id, len);
        Ok(id)
    }

    /// Bytes that arrived for `asked`: when it is a placeholder and they have its short id,
    /// the chunk they are (verified: its id is their hash).
    pub(crate) fn arrived<'a>(&mut self, asked: Id, bytes: &'a [u8]) -> Option<VerifiedChunk<'a>> {
        self.open.get(&asked)?;
        let v = VerifiedChunk::hash(asked.alg(), bytes);
        (short_id(v.id()) == short_id(&asked)).then(|| {
            self.found.insert(asked, *v.id());
            v
        })
    }

    /// A recipe with every placeholder replaced by the real id; `None` if some chunk never
    /// arrived.
    pub(crate) fn resolve(&self, recipe: &Recipe) -> Option<Recipe> {
        let chunks = recipe.chunks().iter().map(|c| {
            if self.open.contains_key(&c.id) {
                self.found.get(&c.id).map(|&id| ChunkRef { id, len: c.len })
            } else {
                Some(*c)
            }
        });
        Recipe::from_chunks(recipe.alg(), chunks.collect::<Option<_>>()?).ok()
    }
}
