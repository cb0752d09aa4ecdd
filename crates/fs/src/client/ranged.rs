//! Large new files read whole, a range at a time (ReadRange), into partial files beside their
//! destinations: no recipe and no chunk ids travel, only the files' bytes.

use std::collections::{HashSet, VecDeque};
use std::io::{self, Write};
use std::path::Path;

use ferry_format::{HashAlg, Id};
use ferry_proto::{Reply, Request, Target};
use ferry_store::VerifiedChunk;

use super::dest::{self, Temp};
use super::fetch::FlushClock;
use super::install::{install, parent_dir};
use super::partial;
use super::walk::FileJob;
use super::{GetError, GetStats, Sources};
use crate::conn::{ConnError, Connection};

/// Bytes asked for per ReadRange, and ReadRange requests kept in flight (8 MiB in all: a
/// long fat link stays full). Ranges of 2 MiB made every reply a fresh allocation the size of
/// glibc's mmap threshold on both ends, each page faulted in and copied cold: a 1 GiB file
/// through a local pipe took 7.0 s against 2.0–2.3 s with ranges of 256 KiB (hyperfine,
/// docs/benchmarks.md).
const RANGE_BYTES: u32 = 256 << 10;
const RANGES_IN_FLIGHT: usize = 32;

/// Large new files that a receiver with nothing reads whole (ReadRange), a range at a time, in
/// order: no recipe and no chunk ids travel, only the files' bytes in the session stream.
pub(super) struct Ranges {
    /// The files read so, by job, in order, each from where its partial file ends.
    files: Vec<(usize, u64)>,
    /// The next range to ask for: (place in `files`, offset). Ranges are made as they are
    /// asked for, so a size a server lists (2^62, say) costs nothing until bytes come.
    next: (usize, u64),
    /// How many were asked for, and (job, offset, length, request id) of those not yet taken.
    sent: usize,
    waiting: VecDeque<(usize, u64, u32, u32)>,
    /// Files no more ranges are asked for (one came back short, or of another version).
    stopped: HashSet<usize>,
}

impl Ranges {
    pub(super) fn new(files: &[(usize, u64)]) -> Self {
        Ranges {
            files: files.to_vec(),
            next: (0, files.first().map_or(0, |f| f.1)),
            sent: 0,
            waiting: Default::default(),
            stopped: HashSet::new(),
        }
    }

    /// The next range to ask for: (job, offset, length).
    fn next_range(&mut self, jobs: &[FileJob]) -> Option<(usize, u64, u32)> {
        loop {
            let (f, offset) = self.next;
            let &(job, _) = self.files.get(f)?;
            let size = jobs[job].attr.size;
            if offset >= size || self.stopped.contains(&job) {
                self.next = (f + 1, self.files.get(f + 1).map_or(0, |n| n.1));
                continue;
            }
            let len = (size - offset).min(RANGE_BYTES as u64) as u32;
            self.next.1 = offset + len as u64;
            return Some((job, offset, len));
        }
    }

    /// Asks for ranges until [`RANGES_IN_FLIGHT`] are on their way: the first window costs a
    /// round trip, refills only keep the stream going.
    pub(super) fn send<R: io::Read, W: Write>(
        &mut self,
        conn: &mut Connection<R, W>,
        jobs: &[FileJob],
    ) -> Result<(), GetError> {
        while self.waiting.len() < RANGES_IN_FLIGHT {
            let Some((job, offset, len)) = self.next_range(jobs) else {
                break;
            };
            let r = Request::ReadRange {
                target: Target::Path(jobs[job].remote.clone()),
                offset,
                len,
            };
            let id = if self.sent < RANGES_IN_FLIGHT {
                conn.send(r)?
            } else {
                conn.send_paced(r)?
            };
            self.waiting.push_back((job, offset, len, id));
            self.sent += 1;
        }
        Ok(())
    }

    /// Takes every range, writing each file into its partial file (a cut transfer goes on from
    /// there) and cutting it into the cache as it arrives unless it is larger than the cache
    /// takes. A file whose ranges named another version than listed, or whose bytes do not
    /// hash to the object id the server named (it changed meanwhile, is not as long as listed,
    /// or no id came) never replaces anything: returns those, to fetch by recipe.
    pub(super) fn fetch<R: io::Read, W: Write>(
        mut self,
        conn: &mut Connection<R, W>,
        jobs: &[FileJob],
        src: &Sources<'_>,
        stats: &mut GetStats,
    ) -> Result<Vec<usize>, GetError> {
        let mut file: Option<RangeFile> = None;
        let mut changed = vec![];
        // Files done with (installed, or to fetch again): their ranges still on the way are
        // taken and dropped.
        let mut done = HashSet::new();
        let clock = FlushClock::new();
        loop {
            self.send(conn, jobs)?;
            let Some((job, offset, len, id)) = self.waiting.pop_front() else {
                break;
            };
            let mut replies = conn.replies(id)?;
            let [Reply::Range { version, oid, data }] = &mut replies[..] else {
                return Err(ConnError::Unexpected(format!("{replies:?}")).into());
            };
            if done.contains(&job) {
                continue;
            }
            let f = match &mut file {
                Some(f) if f.job == job => Some(f),
                f => RangeFile::new(job, &jobs[job], offset, src, stats)?.map(|new| f.insert(new)),
            };
            // Another version than listed, or another id named for it.
            let other = |f: &RangeFile| f.oid.is_some_and(|o| oid.is_some_and(|n| n != o));
            let listed = *version == jobs[job].attr.version;
            let Some(f) = f.filter(|f| listed && !other(f) && data.len() <= len as usize) else {
                partial::remove(&jobs[job].root, &jobs[job].local, jobs[job].attr.version);
                file = None;
                self.stopped.insert(job);
                done.insert(job);
                changed.push(job);
                continue;
            };
            f.oid = f.oid.or(*oid);
            f.write(data, &jobs[job].local, src, stats)?;
            if clock.due() {
                src.cache.flush()?;
            }
            // The file ends here: as listed, or sooner (then it is not what was listed).
            let short = data.len() < len as usize;
            if short {
                self.stopped.insert(job);
            }
            if short || offset + len as u64 >= jobs[job].attr.size {
                let f = file.take().expect("a file");
                done.insert(job);
                if !f.finish(&jobs[job], src, stats)? {
                    partial::remove(&jobs[job].root, &jobs[job].local, jobs[job].attr.version);
                    changed.push(job);
                }
            }
        }
        src.cache.flush()?;
        Ok(changed)
    }
}

/// A file being read by ranges: the partial file it goes into, and what was made of it so far.
struct RangeFile {
    job: usize,
    /// The object id once the server named it (on the last range at the latest).
    oid: Option<Id>,
    /// The partial file, renamed over the destination once whole.
    file: Temp,
    intake: Intake,
}

impl RangeFile {
    /// The file of job `j`, its ranges coming from `start` (where its partial file ends); `None`
    /// if that partial is not as long as it was.
    fn new(
        job: usize,
        j: &FileJob,
        start: u64,
        src: &Sources<'_>,
        stats: &mut GetStats,
    ) -> Result<Option<Self>, GetError> {
        let local = &j.local;
        let parent = parent_dir(local);
        let dir = dest::make_dirs(&j.root, parent)
            .map_err(GetError::local("create directory", parent))?;
        let mut intake = Intake::new(j, src)?;
        let name = partial::name_for(local, j.attr.version);
        // What arrived before is hashed (and cut) again: the object id covers it too.
        let mut failed = None;
        let opened = partial::open(&dir, &name, start, |b| {
            if failed.is_none() {
                failed = intake.take(b, src, stats, false).err();
            }
        })
        .map_err(GetError::local("open", &parent.join(&name)))?;
        if let Some(e) = failed {
            return Err(e);
        }
        let Some(file) = opened else {
            return Ok(None);
        };
        if start > 0 {
            tracing::debug!("{}: going on from byte {start}", local.display());
        }
        Ok(Some(RangeFile {
            job,
            oid: None,
            file: Temp::existing(dir, name, file),
            intake,
        }))
    }

    fn write(
        &mut self,
        data: &[u8],
        local: &Path,
        src: &Sources<'_>,
        stats: &mut GetStats,
    ) -> Result<(), GetError> {
        self.file
            .write_all(data)
            .map_err(GetError::local("write", local))?;
        self.intake.take(data, src, stats, true)
    }

    /// Installs the file if its bytes hash to the object id named; says whether they did.
    fn finish(
        self,
        j: &FileJob,
        src: &Sources<'_>,
        stats: &mut GetStats,
    ) -> Result<bool, GetError> {
        if Some(self.intake.finish(src, stats)?) != self.oid {
            return Ok(false);
        }
        install(self.file, j, stats)?;
        Ok(true)
    }
}

/// What is made of a file's bytes as they arrive: their object id, and chunks in the cache
/// (unless the file is larger than the cache takes: it would only push out the rest).
struct Intake {
    cutter: Option<Box<dyn ferry_chunk::Cutter>>,
    /// The bytes of the chunk not yet cut off.
    pending: Vec<u8>,
    whole: ferry_format::IdHasher,
}

impl Intake {
    fn new(j: &FileJob, src: &Sources<'_>) -> Result<Self, GetError> {
        let cutter = match j.attr.size <= src.cache_file_max {
            true => Some(src.chunker.try_build().map_err(|e| GetError::Local {
                op: "chunk",
                path: j.local.clone(),
                error: io::Error::new(io::ErrorKind::InvalidInput, e),
            })?),
            false => None,
        };
        Ok(Intake {
            cutter,
            pending: vec![],
            whole: ferry_format::IdHasher::new(HashAlg::Blake3),
        })
    }

    /// Takes the file's next bytes; `fetched` counts them as come from the server.
    fn take(
        &mut self,
        mut data: &[u8],
        src: &Sources<'_>,
        stats: &mut GetStats,
        fetched: bool,
    ) -> Result<(), GetError> {
        self.whole.update(data);
        if fetched {
            stats.bytes_from_server += data.len() as u64;
            stats.bytes += data.len() as u64;
            if let Some(p) = src.progress {
                p(data.len() as u64);
            }
        }
        let Some(cutter) = self.cutter.as_mut() else {
            return Ok(());
        };
        while let Some(n) = cutter.next_cut(data) {
            self.pending.extend_from_slice(&data[..n]);
            cut(&mut self.pending, src, stats, fetched)?;
            data = &data[n..];
        }
        self.pending.extend_from_slice(data);
        Ok(())
    }

    /// The last chunk cut; returns the object id of all the bytes taken.
    fn finish(mut self, src: &Sources<'_>, stats: &mut GetStats) -> Result<Id, GetError> {
        if !self.pending.is_empty() {
            cut(&mut self.pending, src, stats, true)?;
        }
        Ok(self.whole.finish())
    }
}

/// `pending` is a chunk: into the cache. `fetched`: it came from the server (else from the
/// partial file an earlier fetch left).
fn cut(
    pending: &mut Vec<u8>,
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: bool,
) -> Result<(), GetError> {
    src.cache
        .put(&VerifiedChunk::hash(HashAlg::Blake3, pending))?;
    pending.clear();
    match fetched {
        true => stats.from_server += 1,
        false => stats.from_local += 1,
    }
    stats.chunks += 1;
    Ok(())
}
