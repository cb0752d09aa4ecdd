//! Chunks asked for plainly, by short or full ids, outside the transfer engine: those of short
//! recipes (placeholders, verified by short id and hash), and on a far link the few a batch
//! needs plainly, asked for ahead of those against old data in the same round trip.

use std::collections::HashSet;
use std::io::{self, Write};

use ferry_format::{ChunkRef, Id};
use ferry_proto::{short_id, Chunks, GetChunks, Ids, Payload, Reply, Request};
use ferry_store::VerifiedChunk;

use super::against::{found_places, groups};
use super::recipes::Shorts;
use super::{GetError, GetStats, Sources};
use crate::conn::{ConnError, Connection};

/// Bytes of chunks asked for plainly ahead of those against old data, at most.
const PLAIN_AHEAD: u64 = 1 << 20;

/// Plain requests sent ahead of those against old data ([`ask_plain_ahead`]): each request's
/// id, whether it names its chunks by short ids (placeholders of short recipes), and the
/// chunks it asked for.
type Ahead = Vec<(u32, bool, Vec<ChunkRef>)>;

/// On a far link, with no other source to ask (devices, mirrors), asks for the chunks in
/// `missing` (taken from it) plainly, ahead of the requests against old data: a round trip
/// saved (crates-vendor over the lab's DSL spent its last one on 4 KB of them). Not on a near
/// link, where the client decodes them while the server compresses the next frames, nor past
/// [`PLAIN_AHEAD`] bytes.
pub(super) fn ask_plain_ahead<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    missing: &mut Vec<ChunkRef>,
    shorts: &Shorts,
    src: &Sources<'_>,
) -> Result<Ahead, GetError> {
    let far = conn
        .round_trip()
        .is_some_and(|r| !crate::delta::near_link(Some(r)));
    let bytes: u64 = missing.iter().map(|c| c.len as u64).sum();
    if !far || bytes > PLAIN_AHEAD || src.devices().is_some() || src.mirrors.is_some() {
        return Ok(vec![]);
    }
    let (short, full): (Vec<ChunkRef>, Vec<ChunkRef>) = std::mem::take(missing)
        .into_iter()
        .partition(|c| shorts.open.contains_key(&c.id));
    let mut ahead = vec![];
    for (by_short, asked) in [(true, short), (false, full)] {
        if !asked.is_empty() {
            ahead.push((ask_plain(conn, &asked, by_short)?, by_short, asked));
        }
    }
    Ok(ahead)
}

/// A plain GetChunks for `asked`: by short ids (placeholders of short recipes), or by full ids.
fn ask_plain<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    asked: &[ChunkRef],
    by_short: bool,
) -> Result<u32, ConnError> {
    let ids = match by_short {
        true => Ids::Short(asked.iter().map(|c| short_id(&c.id)).collect()),
        false => Ids::Full(asked.iter().map(|c| c.id).collect()),
    };
    conn.send(Request::GetChunks(GetChunks {
        ids,
        at: None,
        against: None,
    }))
}

/// The reply to [`ask_plain`]'s request `id` for `asked`: every chunk that verifies (a
/// placeholder's by its short id and hash) goes into the cache. Returns those that did not
/// come or did not verify, and the first that came wrong.
#[allow(clippy::too_many_arguments)]
fn take_plain<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    id: u32,
    by_short: bool,
    asked: &[ChunkRef],
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: &mut HashSet<Id>,
    shorts: &mut Shorts,
) -> Result<(Vec<ChunkRef>, Option<Id>), GetError> {
    let mut came = vec![false; asked.len()];
    let mut wrong = None;
    for (p, bytes) in plain_chunks(conn.replies(id)?, asked)? {
        let c = asked[p];
        let v = match by_short {
            true => shorts.arrived(c.id, &bytes),
            false => VerifiedChunk::check(c.id, &bytes).ok(),
        };
        let Some(v) = v else {
            wrong.get_or_insert(c.id);
            continue;
        };
        src.cache.put(&v)?;
        fetched.insert(*v.id());
        stats.from_server += 1;
        stats.bytes_from_server += bytes.len() as u64;
        came[p] = true;
    }
    let left = asked
        .iter()
        .zip(came)
        .filter_map(|(c, came)| (!came).then_some(*c))
        .collect();
    Ok((left, wrong))
}

/// The replies to [`ask_plain_ahead`]'s requests: what came goes into the cache, verified (a
/// placeholder's chunk by its short id and hash); what did not, or did not verify, is
/// returned, to be fetched as any other.
pub(super) fn take_plain_ahead<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    ahead: Ahead,
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: &mut HashSet<Id>,
    shorts: &mut Shorts,
) -> Result<Vec<ChunkRef>, GetError> {
    if ahead.is_empty() {
        return Ok(vec![]);
    }
    let mut left = vec![];
    for (id, by_short, asked) in ahead {
        let (l, _) = take_plain(conn, id, by_short, &asked, src, stats, fetched, shorts)?;
        left.extend(l);
    }
    src.cache.flush()?;
    Ok(left)
}

/// Fetches chunks of short recipes held nowhere here (`by_short`: placeholders), plainly, by
/// their short ids; each is verified by its own hash and its short id.
pub(super) fn fetch_short<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    by_short: &[ChunkRef],
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: &mut HashSet<Id>,
    shorts: &mut Shorts,
) -> Result<(), GetError> {
    let mut sent = vec![];
    for group in groups(by_short, crate::delta::MAX_DATA) {
        sent.push((ask_plain(conn, group, true)?, group));
    }
    conn.flush()?;
    for (id, asked) in sent {
        match take_plain(conn, id, true, asked, src, stats, fetched, shorts)? {
            (_, Some(wrong)) => return Err(GetError::BadData(wrong)),
            (left, None) if !left.is_empty() => return Err(GetError::Changed),
            _ => {}
        }
    }
    src.cache.flush()?;
    Ok(())
}

/// The chunks a plain Chunks reply (one or more frames) carries for a request of `asked`:
/// (place in the request, bytes), each place at most once.
pub(crate) fn plain_chunks(
    replies: Vec<Reply>,
    asked: &[ChunkRef],
) -> Result<Vec<(usize, Vec<u8>)>, GetError> {
    let mut out = vec![];
    let mut next = 0;
    for r in replies {
        let Reply::Chunks(Chunks {
            found,
            payload: Payload::Plain(data),
        }) = r
        else {
            return Err(ConnError::Unexpected(format!("{r:?} for plain chunks")).into());
        };
        let places = found_places(&found, asked.len())?;
        if places.first().is_some_and(|&p| p < next) {
            return Err(ConnError::Unexpected("chunks sent twice".into()).into());
        }
        let total: usize = places.iter().map(|&p| asked[p].len as usize).sum();
        if total != data.len() {
            return Err(ConnError::Unexpected(format!(
                "{} bytes of chunks where {total} were expected",
                data.len()
            ))
            .into());
        }
        let mut at = 0;
        for p in places {
            let len = asked[p].len as usize;
            out.push((p, data[at..at + len].to_vec()));
            at += len;
            next = p + 1;
        }
    }
    Ok(out)
}
