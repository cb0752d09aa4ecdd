//! A crash simulator for files (issue 25): what a power cut can leave of a program's files, at
//! every sync and rename of its run.
//!
//! A scenario runs its code against a directory on a [`Recorder`]: a FUSE file system held in
//! memory that logs every change of names, every write and every sync, in order, with the
//! scenario's own [`Recorder::mark`]s between them ("object 3 acknowledged"). The [`Trace`]
//! then yields, for every moment worth crashing at (each fsync, rename, link and unlink), the
//! trees a crash there can leave under the model in [`model`]: the least that was made durable,
//! everything, and random mixes in between with writes torn at 512-byte sectors. Each is written
//! to a real directory and handed to the scenario's check, with the marks made before the crash:
//! reopen, recover, and prove that nothing acknowledged is lost and nothing is torn or mixed.
//!
//! LazyFS (VLDB '24) and ALICE (OSDI '14) do the same below real programs; this one is small and
//! in-process so that the checks are ordinary Rust tests. Mounting needs root and /dev/fuse.

pub mod corrupt;
pub mod model;

mod fs;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use model::{crash_state, Keep, Node, Op, Tree, ROOT};

/// A recording file system mounted at a fresh directory; unmounted by [`Recorder::finish`].
pub struct Recorder {
    live: Arc<Mutex<fs::Live>>,
    session: Option<fuser::BackgroundSession>,
    dir: tempfile::TempDir,
}

impl Recorder {
    /// Mounts an empty recording file system.
    pub fn mount() -> std::io::Result<Recorder> {
        let dir = tempfile::Builder::new()
            .prefix("ferry-crashsim-")
            .tempdir()?;
        let (fs, live) = fs::Recording::new();
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("ferry-crashsim".into()),
            fuser::MountOption::NoAtime,
        ];
        let session = fuser::spawn_mount(fs, dir.path(), &config)?;
        Ok(Recorder {
            live,
            session: Some(session),
            dir,
        })
    }

    /// The mounted directory: run the scenario's code beneath it.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Notes that the scenario has now acknowledged something (its check is told which marks
    /// a crash came after).
    pub fn mark(&self, label: impl Into<String>) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.log.push(Op::Mark(label.into()));
    }

    /// How many operations are logged so far.
    pub fn ops(&self) -> usize {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .log
            .len()
    }

    /// Unmounts and hands over the log.
    pub fn finish(mut self) -> Trace {
        self.unmount();
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        Trace {
            ops: live.log.clone(),
        }
    }
}

impl Recorder {
    /// Unmounts, lazily when something beneath still holds the mount (a scenario's server
    /// thread that has not yet let go of its export): without that, a busy mount outlived the
    /// session as a dead mount point ("Transport endpoint is not connected"), two for every
    /// run of the commit scenarios.
    fn unmount(&mut self) {
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                let _ =
                    rustix::mount::unmount(self.dir.path(), rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// A recorded run: every change, sync and mark in order.
#[derive(Clone, Debug)]
pub struct Trace {
    pub ops: Vec<Op>,
}

/// How hard to try.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Random mixes per crash point (besides the least and the all).
    pub random: u64,
    /// Check at most this many crash points, spread evenly over the run (0: all).
    pub max_points: usize,
    /// Seed of the random mixes.
    pub seed: u64,
}

impl Plan {
    /// A few mixes at every crash point; `FERRY_LONG=1` tries many more.
    pub fn from_env() -> Plan {
        let long = std::env::var_os("FERRY_LONG").is_some_and(|v| v != "0");
        Plan {
            random: if long { 6 } else { 2 },
            max_points: if long { 0 } else { 120 },
            seed: std::env::var("FERRY_CRASH_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0x5eed),
        }
    }
}

/// One crash state handed to a check.
pub struct Crash<'a> {
    /// Where the state is written: the same layout as beneath [`Recorder::path`].
    pub dir: &'a Path,
    /// The marks made before the crash, in order.
    pub acked: &'a [String],
    /// The operations that had happened (the crash came after the last).
    pub at: usize,
}

/// What a run of checks did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub crash_points: usize,
    pub states: usize,
}

/// A check that failed, with what is needed to reproduce it.
#[derive(Debug)]
pub struct Failure {
    pub at: usize,
    pub keep: Keep,
    pub message: String,
    pub recent: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "crash after operation {} ({:?}): {}",
            self.at, self.keep, self.message
        )?;
        writeln!(f, "the operations before it:")?;
        for r in &self.recent {
            writeln!(f, "  {r}")?;
        }
        Ok(())
    }
}

impl Trace {
    /// Every moment worth crashing at: just before and just after each sync, rename, link and
    /// unlink, and the end.
    pub fn crash_points(&self) -> Vec<usize> {
        let mut v = vec![];
        for (i, op) in self.ops.iter().enumerate() {
            if op.is_crash_point() {
                v.push(i);
                v.push(i + 1);
            }
        }
        v.push(self.ops.len());
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Crashes the run at its crash points (all, or `plan.max_points` spread over it) and checks
    /// each state; stops at the first failure.
    pub fn check(
        &self,
        plan: Plan,
        mut check: impl FnMut(&Crash<'_>) -> Result<(), String>,
    ) -> Result<Report, Failure> {
        let mut points = self.crash_points();
        if plan.max_points > 0 && points.len() > plan.max_points {
            let n = points.len();
            points = (0..plan.max_points)
                .map(|i| points[i * (n - 1) / (plan.max_points - 1).max(1)])
                .collect();
            points.dedup();
        }
        let mut report = Report::default();
        let mut rng = model::Rng(plan.seed);
        for &at in &points {
            let ops = &self.ops[..at];
            let acked: Vec<String> = ops
                .iter()
                .filter_map(|o| match o {
                    Op::Mark(m) => Some(m.clone()),
                    _ => None,
                })
                .collect();
            let mut keeps = vec![Keep::Least, Keep::All];
            keeps.extend((0..plan.random).map(|_| Keep::Random(rng.next_u64())));
            for keep in keeps {
                let tree = crash_state(ops, keep);
                let dir = tempfile::Builder::new()
                    .prefix("ferry-crash-")
                    .tempdir()
                    .map_err(|e| self.failure(at, keep, format!("temporary directory: {e}")))?;
                materialize(&tree, dir.path())
                    .map_err(|e| self.failure(at, keep, format!("writing the state: {e}")))?;
                check(&Crash {
                    dir: dir.path(),
                    acked: &acked,
                    at,
                })
                .map_err(|m| self.failure(at, keep, m))?;
                report.states += 1;
            }
            report.crash_points += 1;
        }
        Ok(report)
    }

    fn failure(&self, at: usize, keep: Keep, message: String) -> Failure {
        let recent = self.ops[at.saturating_sub(12)..at]
            .iter()
            .map(describe)
            .collect();
        Failure {
            at,
            keep,
            message,
            recent,
        }
    }
}

/// One line per operation, bytes summarized.
fn describe(op: &Op) -> String {
    let s = |n: &[u8]| String::from_utf8_lossy(n).into_owned();
    match op {
        Op::Write { ino, off, data } => format!("write ino {ino} at {off}, {} bytes", data.len()),
        Op::Create {
            parent, name, ino, ..
        } => format!("create {} in {parent} as {ino}", s(name)),
        Op::Link { parent, name, ino } => format!("link {ino} as {} in {parent}", s(name)),
        Op::Remove { parent, name } => format!("remove {} in {parent}", s(name)),
        Op::Rename {
            parent,
            name,
            to_parent,
            to_name,
        } => format!(
            "rename {} in {parent} to {} in {to_parent}",
            s(name),
            s(to_name)
        ),
        other => format!("{other:?}"),
    }
}

/// Writes a tree to a real directory (which exists and is empty); a file of several names is
/// one file of several names there too.
pub fn materialize(tree: &Tree, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let mut stack: Vec<(u64, PathBuf)> = vec![(ROOT, dir.to_path_buf())];
    let mut written: std::collections::HashMap<u64, PathBuf> = Default::default();
    while let Some((ino, path)) = stack.pop() {
        let Ok(entries) = tree.entries(ino) else {
            continue;
        };
        for (name, &child) in entries {
            let p = path.join(std::ffi::OsStr::from_bytes(name));
            match tree.nodes.get(&child) {
                Some(Node::File { .. }) if written.contains_key(&child) => {
                    std::fs::hard_link(&written[&child], &p)?;
                }
                Some(Node::File { data, mode }) => {
                    std::fs::write(&p, data)?;
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))?;
                    written.insert(child, p);
                }
                Some(Node::Dir { mode, .. }) => {
                    std::fs::create_dir(&p)?;
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode | 0o700))?;
                    stack.push((child, p));
                }
                Some(Node::Symlink { target }) => {
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &p)?;
                }
                None => {}
            }
        }
    }
    Ok(())
}
