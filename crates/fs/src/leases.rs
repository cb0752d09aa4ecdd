//! Leases (LBFS §3.2): a client may trust attributes it was given until the lease expires, and
//! the server tells it sooner (Invalidate) when the file changes — through Ferry or behind its
//! back, by any local program. Changes are seen with inotify on the directories that hold leased
//! paths; each watch is added through `/proc/self/fd/N` of a directory opened beneath the export
//! root, so a symlink swapped in later cannot redirect it.

use std::collections::HashMap;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use ferry_proto::WirePath;
use rustix::fs::inotify;

use crate::export::Export;

/// Directories watched at most per session; past this, new grants get no lease (the client
/// revalidates every time instead).
const MAX_WATCHES: usize = 8192;

pub(crate) struct Leases {
    fd: OwnedFd,
    /// Watch descriptor → the directory it watches.
    watched: HashMap<i32, WirePath>,
    dirs: HashMap<WirePath, i32>,
    /// Leased path → expiry.
    leased: HashMap<WirePath, Instant>,
    /// Changes of names in leased listings are told name by name (`FEATURE_ENTRY_CHANGES`).
    pub(crate) entry_changes: bool,
    /// Names told changed in each leased listing since it was granted.
    told: HashMap<WirePath, usize>,
}

/// What an event means to a client that takes entry changes.
enum Told {
    Nothing,
    /// The lease on this path is broken.
    Break(WirePath),
    /// This path is told changed, under the lease on `lease`.
    Tell {
        path: WirePath,
        lease: WirePath,
    },
}

/// Names told changed in one listing under one lease, at most: past them, the listing's lease
/// is broken (a directory churned by someone else costs a bounded number of messages a lease,
/// as a single break did).
pub(crate) const MAX_TOLD: usize = 256;

/// What changes broke: leases, and (with [`Leases::entry_changes`]) the names changed in
/// directories whose listings stay leased.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Breaks {
    pub leases: Vec<WirePath>,
    pub entries: Vec<WirePath>,
}

impl Leases {
    pub(crate) fn new() -> io::Result<Leases> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        Ok(Leases {
            fd,
            watched: HashMap::new(),
            dirs: HashMap::new(),
            leased: HashMap::new(),
            entry_changes: false,
            told: HashMap::new(),
        })
    }

    /// How long the lease on `path` has left, in milliseconds (0: none).
    pub(crate) fn remaining_ms(&self, path: &WirePath) -> u32 {
        self.leased.get(path).map_or(0, |e| {
            let left = e.saturating_duration_since(Instant::now()).as_millis();
            left.min(u32::MAX as u128) as u32
        })
    }

    /// The descriptor to poll for changes.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn watch(&mut self, export: &Export, dir: &WirePath) -> io::Result<()> {
        if self.dirs.contains_key(dir) {
            return Ok(());
        }
        if self.dirs.len() >= MAX_WATCHES {
            return Err(io::Error::other("too many watched directories"));
        }
        let d = export.open_dir(dir)?;
        let mask = inotify::WatchFlags::MODIFY
            | inotify::WatchFlags::ATTRIB
            | inotify::WatchFlags::CLOSE_WRITE
            | inotify::WatchFlags::MOVED_FROM
            | inotify::WatchFlags::MOVED_TO
            | inotify::WatchFlags::CREATE
            | inotify::WatchFlags::DELETE
            | inotify::WatchFlags::DELETE_SELF
            | inotify::WatchFlags::MOVE_SELF;
        let wd = inotify::add_watch(&self.fd, crate::export::fd_path(&d), mask)?;
        self.watched.insert(wd, dir.clone());
        self.dirs.insert(dir.clone(), wd);
        Ok(())
    }

    /// Grants a lease on `path` (a file's attributes, or a directory's listing when `listing`);
    /// returns its length in milliseconds, 0 when no lease could be given.
    pub(crate) fn grant(
        &mut self,
        export: &Export,
        path: &WirePath,
        listing: bool,
        ms: u32,
    ) -> u32 {
        if ms == 0 {
            return 0;
        }
        let dir = if listing {
            Some(path.clone())
        } else {
            path.split_last().map(|(d, _)| d)
        };
        let ok = match dir {
            Some(d) => self.watch(export, &d).is_ok(),
            None => true, // the root itself: its attributes change only through its entries
        };
        if !ok {
            return 0;
        }
        self.leased.insert(
            path.clone(),
            Instant::now() + Duration::from_millis(ms as u64),
        );
        if listing {
            self.told.remove(path);
        }
        ms
    }

    /// What an event on `name` in the watched `dir` (or on `dir` itself) means to a client
    /// that takes entry changes; `None`: what it means to any client. A name made, removed or
    /// moved in a live listing is told, and so is a directory's change of attributes (its own
    /// listing stands: its entries did not change); a file's change breaks its own lease. The
    /// session's own change breaks the name's lease (a directory's attributes: nothing, its
    /// reply carried them).
    fn as_entry_change(
        &self,
        dir: &WirePath,
        name: Option<&[u8]>,
        flags: inotify::ReadFlags,
        own: &[(WirePath, Vec<u8>)],
    ) -> Option<Told> {
        use inotify::ReadFlags;
        let path = match name {
            Some(n) => dir.join(n).ok()?,
            None => dir.clone(),
        };
        let now = Instant::now();
        let live = |p: &WirePath| self.leased.get(p).is_some_and(|e| *e > now);
        let mine = own.iter().any(|(d, o)| d.join(o).is_ok_and(|q| q == path));
        let named = flags.intersects(
            ReadFlags::CREATE | ReadFlags::DELETE | ReadFlags::MOVED_FROM | ReadFlags::MOVED_TO,
        );
        let is_dir = name.is_none() || flags.contains(ReadFlags::ISDIR);
        let tell = |lease: &WirePath| Told::Tell {
            path: path.clone(),
            lease: lease.clone(),
        };
        Some(match (name.is_some(), named, is_dir) {
            // The directory itself (its attributes).
            (false, _, _) if mine || !live(dir) => Told::Nothing,
            (false, _, _) => tell(dir),
            (true, true, _) if mine => Told::Break(path),
            (true, true, _) if live(dir) => tell(dir),
            (true, false, true) if mine => Told::Nothing,
            (true, false, true) if live(dir) => tell(dir),
            (true, false, true) if live(&path) => tell(&path),
            (true, false, false) if mine || live(dir) => Told::Break(path),
            _ => return None,
        })
    }

    /// Tells `path` changed, under the lease on `lease` (its budget of [`MAX_TOLD`]; past it,
    /// that lease is broken instead). What is told is leased as `lease` is.
    fn tell(
        &mut self,
        path: WirePath,
        lease: &WirePath,
        entries: &mut Vec<(WirePath, WirePath)>,
        hit: &mut Vec<WirePath>,
    ) {
        let told = self.told.entry(lease.clone()).or_default();
        if *told >= MAX_TOLD {
            hit.push(lease.clone());
        } else if !entries.iter().any(|(p, _)| *p == path) {
            *told += 1;
            if let Some(&e) = self.leased.get(lease) {
                self.leased.insert(path.clone(), e);
            }
            entries.push((path, lease.clone()));
        }
    }

    /// Reads pending change events and returns the leased paths they break (each lease broken
    /// once; expired leases are forgotten). A queue that overflowed (events were lost) breaks
    /// every lease; a watched directory that went (removed, moved, unmounted) is forgotten, so
    /// a new one at its path is watched afresh.
    ///
    /// Events on the server's own entries (commit temporaries, the trash), which no listing
    /// shows, break nothing. An event on a name in `own` (directory, name: changes the session
    /// just made itself, for a client that asked for `FEATURE_OWN_CHANGES`) breaks the lease on
    /// that name, not the one on its directory's listing. With
    /// [`entry_changes`](Self::entry_changes), see [`as_entry_change`](Self::as_entry_change):
    /// the names told are [`Breaks::entries`].
    pub(crate) fn broken(&mut self, own: &[(WirePath, Vec<u8>)]) -> Breaks {
        use inotify::ReadFlags;
        let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
        let mut hit = vec![];
        let mut entries = vec![];
        let mut tells = vec![];
        let mut overflow = false;
        let mut gone = vec![];
        let mut reader = inotify::Reader::new(&self.fd, &mut buf);
        // Until EAGAIN: nothing more now.
        while let Ok(ev) = reader.next() {
            let flags = ev.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                overflow = true;
                continue;
            }
            let Some(dir) = self.watched.get(&ev.wd()) else {
                continue;
            };
            if flags.intersects(ReadFlags::IGNORED | ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF)
            {
                gone.push(ev.wd());
            }
            let name = ev.file_name().map(|n| n.to_bytes());
            let unseen =
                |n: &[u8]| crate::export::is_commit_temp(n) || crate::export::is_server_dir(n);
            if name.is_some_and(unseen) {
                continue;
            }
            let lost = flags
                .intersects(ReadFlags::IGNORED | ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF);
            if self.entry_changes && !lost {
                let dir = dir.clone();
                match self.as_entry_change(&dir, name, flags, own) {
                    Some(Told::Nothing) => continue,
                    Some(Told::Break(p)) => {
                        hit.push(p);
                        continue;
                    }
                    Some(Told::Tell { path, lease }) => {
                        tells.push((path, lease));
                        continue;
                    }
                    None => {}
                }
            }
            let mine = name.is_some_and(|n| own.iter().any(|(d, o)| d == dir && o == n));
            if !mine {
                hit.push(dir.clone());
            }
            if let Some(name) = name {
                if let Ok(p) = dir.join(name) {
                    hit.push(p);
                }
            }
        }
        for (path, lease) in tells {
            self.tell(path, &lease, &mut entries, &mut hit);
        }
        // What is told is read after these events: its lease stands.
        hit.retain(|h| !entries.iter().any(|(p, _)| p == h));
        for wd in gone {
            if let Some(dir) = self.watched.remove(&wd) {
                // What was below it went with it.
                hit.extend(self.leased.keys().filter(|p| is_below(p, &dir)).cloned());
                if self.dirs.get(&dir) == Some(&wd) {
                    self.dirs.remove(&dir);
                }
                let _ = inotify::remove_watch(&self.fd, wd);
            }
        }
        if overflow {
            tracing::info!("change notifications overflowed: every lease is broken");
            hit.extend(self.leased.keys().cloned());
        }
        let now = Instant::now();
        let mut leases = vec![];
        for p in hit {
            if let Some(expiry) = self.leased.remove(&p) {
                if expiry > now && !leases.contains(&p) {
                    leases.push(p);
                }
            }
        }
        // What is told under a lease broken meanwhile is told by that break.
        let entries = entries
            .into_iter()
            .filter(|(_, lease)| self.leased.contains_key(lease))
            .map(|(p, _)| p)
            .collect();
        Breaks { leases, entries }
    }
}

/// Whether `p` is `dir` or below it.
fn is_below(p: &WirePath, dir: &WirePath) -> bool {
    p.strip_prefix(dir).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(l: &mut Leases, e: &Export, p: &str) {
        assert!(l.grant(e, &p.into(), false, 60_000) > 0, "{p}");
    }

    #[test]
    fn an_overflowed_queue_breaks_every_lease() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/f"), b"1").unwrap();
        let e = Export::open(t.path()).unwrap();
        let mut l = Leases::new().unwrap();
        lease(&mut l, &e, "d/f");
        // More events than the queue holds, then the leased file's change, which is lost.
        let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(16384);
        for _ in 0..max / 2 + 1 {
            std::fs::write(t.path().join("d/other"), b"x").unwrap();
        }
        std::fs::write(t.path().join("d/f"), b"2").unwrap();
        assert_eq!(l.broken(&[]).leases, vec![WirePath::from("d/f")]);
    }

    #[test]
    fn a_directory_made_again_is_watched_again() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/f"), b"1").unwrap();
        let e = Export::open(t.path()).unwrap();
        let mut l = Leases::new().unwrap();
        lease(&mut l, &e, "d/f");
        std::fs::remove_dir_all(t.path().join("d")).unwrap();
        assert!(l.broken(&[]).leases.contains(&WirePath::from("d/f")));
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/g"), b"1").unwrap();
        lease(&mut l, &e, "d/g");
        std::fs::write(t.path().join("d/g"), b"2").unwrap();
        assert_eq!(l.broken(&[]).leases, vec![WirePath::from("d/g")]);
    }

    #[test]
    fn the_servers_own_entries_break_nothing_and_users_do() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/f"), b"1").unwrap();
        let e = Export::open(t.path()).unwrap();
        let mut l = Leases::new().unwrap();
        assert!(l.grant(&e, &"d".into(), true, 60_000) > 0);
        lease(&mut l, &e, "d/f");
        // A commit temporary, made and removed; a user's file named like one is no temporary.
        let tmp = t.path().join("d/.ferry-1-0123456789abcdef-1.tmp");
        std::fs::write(&tmp, b"x").unwrap();
        std::fs::remove_file(&tmp).unwrap();
        assert_eq!(l.broken(&[]).leases, Vec::<WirePath>::new());
        std::fs::write(t.path().join("d/.ferry-notes.tmp"), b"x").unwrap();
        std::fs::write(t.path().join("d/f"), b"2").unwrap();
        let mut b = l.broken(&[]).leases;
        b.sort();
        assert_eq!(b, vec![WirePath::from("d"), WirePath::from("d/f")]);
    }

    #[test]
    fn with_entry_changes_names_are_told_and_the_listing_stays_leased() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("f"), b"1").unwrap();
        let e = Export::open(t.path()).unwrap();
        let mut l = Leases::new().unwrap();
        l.entry_changes = true;
        assert!(l.grant(&e, &"d".into(), true, 60_000) > 0);
        lease(&mut l, &e, "d/f");
        let names = |v: &[&str]| v.iter().map(|&p| WirePath::from(p)).collect::<Vec<_>>();
        let breaks = |leases: &[&str], entries: &[&str]| Breaks {
            leases: names(leases),
            entries: names(entries),
        };
        // A name made is told; a leased name written has its lease broken, once.
        std::fs::write(d.join("g"), b"new").unwrap();
        std::fs::write(d.join("f"), b"2").unwrap();
        assert_eq!(l.broken(&[]), breaks(&["d/f"], &["d/g"]));
        std::fs::write(d.join("f"), b"3").unwrap();
        assert_eq!(l.broken(&[]), breaks(&[], &[]));
        // The listing is still leased, and so is what was told: its next changes are told too.
        std::fs::write(d.join("g"), b"changed").unwrap();
        std::fs::remove_file(d.join("g")).unwrap();
        assert_eq!(l.broken(&[]), breaks(&[], &["d/g"]));
        // The session's own change breaks the name's lease, as without entry changes.
        lease(&mut l, &e, "d/f");
        std::fs::write(d.join("f"), b"4").unwrap();
        let own = [(WirePath::from("d"), b"f".to_vec())];
        assert_eq!(l.broken(&own), breaks(&["d/f"], &[]));
        // The directory's own attributes are told too: its listing stands.
        std::fs::write(d.join("h"), b"x").unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(l.broken(&[]), breaks(&[], &["d/h", "d"]));
        // The directory moved away: its lease, and those below it, are broken; nothing in it
        // is told any more.
        std::fs::rename(&d, t.path().join("e")).unwrap();
        let mut b = l.broken(&[]);
        b.leases.sort();
        assert_eq!(b, breaks(&["d", "d/g", "d/h"], &[]));
        std::fs::write(t.path().join("e/i"), b"x").unwrap();
        assert_eq!(l.broken(&[]), Breaks::default());
    }

    /// A directory churned by someone else: past [`MAX_TOLD`] names told, its listing's
    /// lease is broken, and nothing more is sent for it until it is leased again.
    #[test]
    fn names_told_under_one_lease_are_bounded() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        std::fs::create_dir(&d).unwrap();
        let e = Export::open(t.path()).unwrap();
        let mut l = Leases::new().unwrap();
        l.entry_changes = true;
        assert!(l.grant(&e, &"d".into(), true, 60_000) > 0);
        for i in 0..MAX_TOLD {
            std::fs::write(d.join(format!("f{i}")), b"x").unwrap();
        }
        assert_eq!(l.broken(&[]).entries.len(), MAX_TOLD);
        std::fs::write(d.join("one more"), b"x").unwrap();
        assert_eq!(l.broken(&[]).leases, vec![WirePath::from("d")]);
        std::fs::write(d.join("and another"), b"x").unwrap();
        assert_eq!(l.broken(&[]), Breaks::default());
        // Leased again: told again.
        assert!(l.grant(&e, &"d".into(), true, 60_000) > 0);
        std::fs::write(d.join("again"), b"x").unwrap();
        assert_eq!(l.broken(&[]).entries, vec![WirePath::from("d/again")]);
    }
}
