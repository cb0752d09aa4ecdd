//! Step 3 of sending a batch (see the parent module): each file's Create, Writes and Commit as
//! one stream, new data compressed against the old data both sides hold.

use super::*;

/// Requests of the upload stream not yet answered: (request id, file, a commit, bytes).
#[derive(Default)]
pub(super) struct Stream {
    waiting: VecDeque<(u32, usize, bool, usize)>,
    /// Bytes of the requests waiting (about what the sending thread and the link hold).
    bytes: usize,
    /// Each file's first error, and its attributes once committed.
    errors: HashMap<usize, ConnError>,
    attrs: HashMap<usize, Attr>,
    next_handle: u32,
}

impl Stream {
    fn send<R: io::Read, W: Write>(
        &mut self,
        conn: &mut Connection<R, W>,
        file: usize,
        r: Request,
    ) -> Result<(), GetError> {
        let commit = matches!(r, Request::Commit { .. });
        let bytes = match &r {
            Request::Write { parts, .. } => parts
                .iter()
                .map(|p| match p {
                    WritePart::Data { payload, .. } => payload.data().len(),
                    _ => 64,
                })
                .sum(),
            _ => 64,
        };
        // Writes keep the stream going; waiting for them paces it, a round trip only for the
        // creates and commits (all of a batch's travel together).
        let id = if matches!(r, Request::Write { .. }) {
            conn.send_paced(r)?
        } else {
            conn.send(r)?
        };
        self.waiting.push_back((id, file, commit, bytes));
        self.bytes += bytes;
        while self.bytes > IN_FLIGHT_BYTES {
            self.take(conn)?;
        }
        Ok(())
    }

    fn take<R: io::Read, W: Write>(&mut self, conn: &mut Connection<R, W>) -> Result<(), GetError> {
        let Some((id, file, commit, bytes)) = self.waiting.pop_front() else {
            return Ok(());
        };
        self.bytes -= bytes;
        match conn.replies(id) {
            Ok(mut r) => match (commit, r.pop()) {
                (true, Some(Reply::Attr(a))) => {
                    self.attrs.insert(file, a);
                }
                (false, Some(Reply::Ok)) => {}
                (_, other) => {
                    return Err(ConnError::Unexpected(format!("{other:?} in an upload")).into())
                }
            },
            // The first error of a file is what went wrong; the rest follow from it.
            Err(e @ ConnError::Remote { .. }) => {
                self.errors.entry(file).or_insert(e);
            }
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Every reply; then each file's result, in order.
    pub(super) fn drain<R: io::Read, W: Write>(
        mut self,
        conn: &mut Connection<R, W>,
        files: usize,
    ) -> Result<Vec<Result<Attr, ConnError>>, GetError> {
        conn.flush()?;
        while !self.waiting.is_empty() {
            self.take(conn)?;
        }
        Ok((0..files)
            .map(|f| match (self.errors.remove(&f), self.attrs.remove(&f)) {
                (Some(e), _) => Err(e),
                (None, Some(a)) => Ok(a),
                (None, None) => Err(ConnError::Unexpected("no commit reply".into())),
            })
            .collect())
    }
}

/// Step 3 for one file: Create, the Writes, Commit.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_file<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    stream: &mut Stream,
    n: usize,
    j: &PutJob,
    c: &Chunked,
    level: &mut FrameLevel,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
) -> Result<(), GetError> {
    use std::os::unix::fs::MetadataExt;
    stream.next_handle = stream.next_handle.wrapping_add(1);
    let handle = stream.next_handle;
    let base = c.base.as_ref().map(|b| b.version).or(j.if_version);
    stream.send(
        conn,
        n,
        Request::Create {
            handle,
            path: j.remote.clone(),
            base,
        },
    )?;
    let mut parts: Vec<WritePart> = vec![];
    let mut refs = 0;
    let flush = |conn: &mut Connection<R, W>,
                 stream: &mut Stream,
                 parts: &mut Vec<WritePart>,
                 refs: &mut usize|
     -> Result<(), GetError> {
        if !parts.is_empty() {
            let parts = std::mem::take(parts);
            stream.send(conn, n, Request::Write { handle, parts })?;
        }
        *refs = 0;
        Ok(())
    };
    if let Some(bytes) = &c.small {
        if !bytes.is_empty() {
            stats.chunks_sent += c.recipe.len() as u64;
            stats.chunk_bytes_sent += bytes.len() as u64;
            parts.push(WritePart::Data {
                lens: c.recipe.chunks().iter().map(|ch| ch.len).collect(),
                payload: Payload::Plain(bytes.clone()),
            });
        }
    } else {
        let chunks = c.recipe.chunks();
        let mut k = 0;
        while k < chunks.len() {
            match c.how[k] {
                How::Base => {
                    // Runs of the base's chunks in its order: a page both hold is one.
                    let b = *c
                        .base
                        .as_ref()
                        .and_then(|base| base.shared.get(&k))
                        .expect("a chunk of the base knows its place there")
                        as u32;
                    match parts.last_mut() {
                        Some(WritePart::Base { start, count }) if *start + *count == b => {
                            *count += 1
                        }
                        _ => {
                            parts.push(WritePart::Base { start: b, count: 1 });
                            refs += 1;
                        }
                    }
                    k += 1;
                }
                How::Held => {
                    match parts.last_mut() {
                        Some(WritePart::Chunks(v)) => v.push(chunks[k]),
                        _ => parts.push(WritePart::Chunks(vec![chunks[k]])),
                    }
                    k += 1;
                    refs += 1;
                }
                How::Data => {
                    // A run of new chunks, at most a frame's worth; a few chunks the server
                    // holds between new ones go in it too (they cost next to nothing against
                    // the prefix, which holds them), so one frame's window spans the run.
                    let start = k;
                    let mut bytes = 0usize;
                    // Data with no base to compress against goes plainly, in smaller runs.
                    let max = match c.base {
                        Some(_) => crate::delta::MAX_DATA,
                        None => PLAIN_DATA,
                    };
                    let fits = |k: usize, bytes: usize| {
                        k == start || bytes + chunks[k].len as usize <= max
                    };
                    while k < chunks.len() && fits(k, bytes) {
                        if c.how[k] != How::Data {
                            let gap = (k..chunks.len().min(k + BRIDGE + 1))
                                .take_while(|&g| c.how[g] != How::Data)
                                .count();
                            if gap > BRIDGE || k + gap >= chunks.len() {
                                break;
                            }
                        }
                        bytes += chunks[k].len as usize;
                        k += 1;
                    }
                    let part = data_part(c, j, start..k, level, opts, conn)?;
                    stats.chunks_sent += (k - start) as u64;
                    stats.chunk_bytes_sent += bytes as u64;
                    parts.push(part);
                    flush(conn, stream, &mut parts, &mut refs)?;
                }
            }
            if refs >= WRITE_REFS {
                flush(conn, stream, &mut parts, &mut refs)?;
            }
        }
    }
    flush(conn, stream, &mut parts, &mut refs)?;
    stream.send(
        conn,
        n,
        Request::Commit {
            handle,
            mode: j.mode,
            mtime_ns: j.meta.mtime() * 1_000_000_000 + j.meta.mtime_nsec(),
            size: c.recipe.total_len(),
            oid: c.oid.id(),
        },
    )
}

/// New chunks `range` of a file as a Write's data part: plainly, or as one frame against the old
/// data both sides hold when that pays.
fn data_part<R: io::Read, W: Write>(
    c: &Chunked,
    j: &PutJob,
    range: std::ops::Range<usize>,
    level: &mut FrameLevel,
    opts: &PutOptions<'_>,
    conn: &Connection<R, W>,
) -> Result<WritePart, GetError> {
    let chunks = &c.recipe.chunks()[range.clone()];
    let start = c.offsets[range.start];
    let len: u64 = chunks.iter().map(|ch| ch.len as u64).sum();
    let mut data = vec![0u8; len as usize];
    c.file
        .read_exact_at(&mut data, start)
        .map_err(GetError::local("read", &j.local))?;
    let mut at = 0;
    for ch in chunks {
        if !ch.id.matches(&data[at..at + ch.len as usize]) {
            return Err(GetError::LocalChanged(j.local.clone()));
        }
        at += ch.len as usize;
    }
    let lens = chunks.iter().map(|ch| ch.len).collect();
    let Some(base) = &c.base else {
        return Ok(WritePart::Data {
            lens,
            payload: Payload::Plain(data),
        });
    };
    // The prefix: the base's chunks the new version keeps, nearest to this data (read here
    // from the new file); old chunks the new version dropped that the cache holds; pieces
    // whose keys the server sent.
    // (Old chunks are held only where there is a cache.)
    let held = c.held_olds.iter().map(|&(i, _)| base.chunks[i].0 as u64);
    let held = held.sum();
    let (mut olds, mut prefix) = context(c, base, &range, len, held, j)?;
    if let Some(cache) = opts.cache {
        for &(i, id) in &c.held_olds {
            if let Ok(Some(bytes)) = cache.get(&id) {
                olds.push(i as u32);
                prefix.extend_from_slice(&bytes);
            }
        }
    }
    let mut refs = vec![];
    if let Some(keys) = &c.keys {
        let (r, pieces) = crate::delta::find([&data[..]], keys);
        if prefix.len() + pieces.len() <= crate::delta::MAX_PREFIX {
            refs = r;
            prefix.extend_from_slice(&pieces);
        }
    }
    if prefix.is_empty() {
        return Ok(WritePart::Data {
            lens,
            payload: Payload::Plain(data),
        });
    }
    let (writes, waited) = conn.write_waits();
    level.saw_writes(writes, waited);
    let work = data.len() + prefix.len();
    let payload =
        match crate::delta::worth_a_frame(level, &data, &prefix, work).map_err(ConnError::Io)? {
            Some(frame) => Payload::Frame {
                context: false,
                olds,
                refs,
                data: frame,
            },
            None => Payload::Plain(data),
        };
    Ok(WritePart::Data { lens, payload })
}

/// Bytes of neighbours for `len` bytes of new data when the cache holds `held` bytes of the
/// old chunks the new version dropped. Those old versions are what the data matches best (a
/// page of a database, an edited paragraph): then the neighbours add little but the work of
/// loading them into the compressor, which for a small change (SQLite's commits: a few pages
/// of a file of 100 KB) cost more than compressing the data, and as much again on the server.
fn context_budget(len: u64, held: u64) -> u64 {
    if held >= len {
        len
    } else {
        (len * 16).clamp(CONTEXT_FLOOR, CONTEXT_MAX)
    }
}

/// How far chunk `k` lies from the chunks `range` (0 within it: a kept chunk can sit between
/// new ones of one range).
fn distance(k: usize, range: &std::ops::Range<usize>) -> usize {
    if k < range.start {
        range.start - k
    } else {
        (k + 1).saturating_sub(range.end)
    }
}

/// The chunks of the base the new version keeps nearest to new chunks `range` (`len` bytes):
/// their base indices, in the order of the new version, and their bytes (read from the new
/// file), up to 16 times the data and [`CONTEXT_MAX`] (at least [`CONTEXT_FLOOR`]); as much as
/// the data only when the old chunks held here (`held` bytes) are at least as many.
fn context(
    c: &Chunked,
    base: &BaseView,
    range: &std::ops::Range<usize>,
    len: u64,
    held: u64,
    j: &PutJob,
) -> Result<(Vec<u32>, Vec<u8>), GetError> {
    let budget = context_budget(len, held);
    let chunks = c.recipe.chunks();
    let mut near: Vec<(usize, usize)> = base.shared.iter().map(|(&k, &b)| (k, b)).collect();
    near.sort_by_key(|&(k, _)| distance(k, range));
    let mut total = 0;
    let mut seen = HashSet::new();
    near.retain(|&(k, b)| {
        if total + chunks[k].len as u64 > budget || !seen.insert(b) {
            return false;
        }
        total += chunks[k].len as u64;
        true
    });
    near.sort_unstable();
    let mut olds = Vec::with_capacity(near.len());
    let mut prefix = Vec::with_capacity(total as usize);
    for (k, b) in near {
        let at = prefix.len();
        prefix.resize(at + chunks[k].len as usize, 0);
        c.file
            .read_exact_at(&mut prefix[at..], c.offsets[k])
            .map_err(GetError::local("read", &j.local))?;
        olds.push(b as u32);
    }
    Ok((olds, prefix))
}

#[cfg(test)]
mod tests {
    /// With the old chunks held, the neighbours are as many bytes as the data; else at least
    /// the floor, up to 16 times the data, at most the maximum.
    #[test]
    fn the_context_is_small_when_the_old_chunks_are_held() {
        use super::{context_budget, CONTEXT_FLOOR, CONTEXT_MAX};
        assert_eq!(context_budget(8 << 10, 8 << 10), 8 << 10);
        assert_eq!(context_budget(8 << 10, 1 << 20), 8 << 10);
        assert_eq!(context_budget(2 << 10, 1 << 10), CONTEXT_FLOOR);
        assert_eq!(context_budget(64 << 10, 0), 1 << 20);
        assert_eq!(context_budget(1 << 20, 0), CONTEXT_MAX);
    }

    /// A kept chunk between the new chunks of one range is at distance 0 (it underflowed, found
    /// by the crash simulator's varied rounds).
    #[test]
    fn distance_to_a_range_of_new_chunks() {
        let r = 5..9;
        let d: Vec<usize> = (0..12).map(|k| super::distance(k, &r)).collect();
        assert_eq!(d, [5, 4, 3, 2, 1, 0, 0, 0, 0, 1, 2, 3]);
    }
}
