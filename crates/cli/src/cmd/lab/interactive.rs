//! The LBFS interactive workloads (§5 of the paper) through a mount: `ferry mount` against
//! sshfs, on the same generated data over the same emulated link, bytes counted at the link
//! from mounting to unmounting, time of the work itself.
//!
//! - `doc-saves`: a 1 MB document opened, then saved ten times as it is edited, each save a new
//!   file renamed over the old one (as word processors save).
//! - `rebuild`: a C project built before, rebuilt after a change to the header every file
//!   includes; the new object files are much like the old ones.
//! - `ed-script`: a source file edited in place by a script applying a release's changes and
//!   saving every 40 lines (LBFS's `ed` run).
//! - `unpack`: a source tree of 200 small files in 10 directories written as `tar x` writes
//!   them (each file's time set through its descriptor before the close; a symlink in each
//!   directory): metadata-heavy work, where round trips count.
//! - `remove-tree`: that tree removed (`rm -rf`).
//! - `rsync-tree`: that tree copied in by `rsync -a` (a temporary file each, renamed).
//! - `sqlite`: 100 transactions of 100 rows each into an SQLite database (the `sqlite3`
//!   program, its rollback journal made and removed by each).
//! - `git-clone`: `git clone` of a local repository (that tree in 5 commits) into the mount:
//!   lock files, packs, a checkout. (The index, a cache of each file's inode and times, is
//!   not compared with the reference's.)
//! - `build`: the `rebuild` project built from clean by `make -j2`.
//!
//! Each run starts with a cold client (nothing cached) and the data on the server. The
//! server's tree afterwards must equal a reference made by running the same steps locally.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::link::Relay;
use super::{same_files, Lab, Profile, Run};
use crate::cmd::demo::{source, Rng};

pub const WORKLOADS: &[&str] = &[
    "doc-saves",
    "rebuild",
    "ed-script",
    "unpack",
    "remove-tree",
    "rsync-tree",
    "sqlite",
    "git-clone",
    "build",
];
pub const MOUNTS: &[&str] = &["ferry-mount", "sshfs"];

/// Builds the server's copy of workload `name` in `dir` (not measured).
fn prepare(dir: &Path, name: &str) -> Result<()> {
    fs::create_dir_all(dir)?;
    match name {
        "doc-saves" => {
            let mut rng = Rng(0xd0c5);
            fs::write(dir.join("report.txt"), source(&mut rng, 30_000))?;
        }
        "rebuild" => {
            c_project(dir)?;
            run(Command::new("make").args(["-s", "-C"]).arg(dir))?;
        }
        "build" => c_project(dir)?,
        "git-clone" => source_repo(&dir.with_file_name("source.git"))?,
        "ed-script" => {
            let mut rng = Rng(0xed);
            fs::write(dir.join("text.c"), source(&mut rng, 6_000))?;
        }
        "unpack" | "rsync-tree" | "sqlite" => {}
        "remove-tree" => unpack(dir)?,
        _ => bail!(
            "no interactive workload {name:?} (workloads: {})",
            WORKLOADS.join(", ")
        ),
    }
    Ok(())
}

/// A C project of 40 files that include one header, and its Makefile.
fn c_project(dir: &Path) -> Result<()> {
    let mut rng = Rng(0xb17d);
    fs::write(
        dir.join("common.h"),
        "#define SCALE 3\nstatic inline long scale(long x) { return x * SCALE; }\n",
    )?;
    let mut objs = vec![];
    for f in 0..40 {
        let mut c = String::from("#include \"common.h\"\n");
        for g in 0..12 {
            let k = rng.next() % 1000;
            c += &format!(
                        "long f{f}_{g}(long a) {{\n  long s = 0;\n  for (long i = 0; i < a; i++)\n    s += scale(i) ^ {k};\n  return s;\n}}\n"
                    );
        }
        fs::write(dir.join(format!("m{f:02}.c")), c)?;
        objs.push(format!("m{f:02}.o"));
    }
    fs::write(
                dir.join("Makefile"),
                format!(
                    "OBJS = {}\nlib.a: $(OBJS)\n\tar rcs lib.a $(OBJS)\n%.o: %.c common.h\n\tgcc -O1 -c $< -o $@\n",
                    objs.join(" ")
                ),
            )?;
    Ok(())
}

/// A bare repository at `at` holding the `unpack` tree in 5 commits (a few files changed by
/// each), with fixed names and dates.
fn source_repo(at: &Path) -> Result<()> {
    let work = tempfile::tempdir()?;
    let w = work.path();
    unpack(w)?;
    let git = |args: &[&str]| {
        let mut c = Command::new("git");
        c.arg("-C").arg(w).args(args);
        fixed_git(&mut c);
        run(&mut c)
    };
    git(&["init", "-q", "-b", "main"])?;
    for i in 0..5 {
        if i > 0 {
            for d in 0..10 {
                let f = w.join(format!("src/mod{d:02}/file{:02}.rs", (i * 3 + d) % 20));
                let mut text = fs::read_to_string(&f)?;
                text += &format!("// change {i}\n");
                fs::write(&f, text)?;
            }
        }
        git(&["add", "-A"])?;
        git(&["commit", "-q", "-m", &format!("version {i}")])?;
    }
    git(&["clone", "-q", "--bare", ".", &at.to_string_lossy()])
}

/// Names and dates fixed, so two clones (the mount's and the reference) are alike byte for
/// byte, their reflogs too.
fn fixed_git(c: &mut Command) {
    for (k, v) in [
        ("GIT_AUTHOR_NAME", "Ferry Lab"),
        ("GIT_AUTHOR_EMAIL", "lab@ferry.invalid"),
        ("GIT_COMMITTER_NAME", "Ferry Lab"),
        ("GIT_COMMITTER_EMAIL", "lab@ferry.invalid"),
        ("GIT_AUTHOR_DATE", "1700000000 +0000"),
        ("GIT_COMMITTER_DATE", "1700000000 +0000"),
        ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ("GIT_CONFIG_NOSYSTEM", "1"),
        // One thread's pack is the same pack every time.
        ("GIT_CONFIG_COUNT", "1"),
        ("GIT_CONFIG_KEY_0", "pack.threads"),
        ("GIT_CONFIG_VALUE_0", "1"),
    ] {
        c.env(k, v);
    }
}

/// The measured work of workload `name`, in `dir` (a mount, or a local reference copy).
fn steps(dir: &Path, name: &str) -> Result<()> {
    match name {
        "doc-saves" => {
            let doc = dir.join("report.txt");
            let mut text = fs::read_to_string(&doc)?;
            for i in 0..10 {
                let at = text.len() * (i * 7 % 10 + 1) / 11;
                let at = text[..at].rfind('\n').map_or(0, |n| n + 1);
                text.insert_str(at, &format!("An edit made before save {i}.\n"));
                let tmp = dir.join(".~lock.report.tmp");
                fs::write(&tmp, &text)?;
                fs::rename(&tmp, &doc)?;
            }
        }
        "rebuild" => {
            let h = dir.join("common.h");
            let text = fs::read_to_string(&h)?.replace("SCALE 3", "SCALE 4");
            fs::write(&h, text)?;
            run(Command::new("make").args(["-s", "-C"]).arg(dir))?;
        }
        "ed-script" => {
            let f = dir.join("text.c");
            let mut lines: Vec<String> =
                fs::read_to_string(&f)?.lines().map(String::from).collect();
            let mut rng = Rng(0xed17);
            // 30 saves of 40 changed lines each: replaced, inserted or deleted.
            for _ in 0..30 {
                for _ in 0..40 {
                    let i = (rng.next() % lines.len() as u64) as usize;
                    match rng.next() % 3 {
                        0 => {
                            lines[i] =
                                format!("    // changed in the release: {}", rng.next() % 997)
                        }
                        1 => lines.insert(i, format!("    let added = {};", rng.next() % 991)),
                        _ => {
                            lines.remove(i);
                        }
                    }
                }
                fs::write(&f, lines.join("\n") + "\n")?;
            }
        }
        "unpack" => unpack(dir)?,
        "remove-tree" => fs::remove_dir_all(dir.join("src"))?,
        "rsync-tree" => {
            let from = tempfile::tempdir()?;
            unpack(from.path())?;
            run(Command::new("rsync")
                .arg("-a")
                .arg(format!("{}/", from.path().display()))
                .arg(dir))?;
        }
        "git-clone" => {
            let mut c = Command::new("git");
            let from = dir.with_file_name("source.git");
            c.args(["clone", "-q", &format!("file://{}", from.display())])
                .arg(dir.join("repo"));
            fixed_git(&mut c);
            run(&mut c)?;
        }
        "build" => run(Command::new("make").args(["-s", "-j2", "-C"]).arg(dir))?,
        "sqlite" => {
            let mut sql = String::from("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);\n");
            let mut rng = Rng(0x5e1);
            for _ in 0..100 {
                sql += "BEGIN;\n";
                for _ in 0..100 {
                    sql += &format!("INSERT INTO t (v) VALUES ('{}');\n", rng.next() % 1_000_000);
                }
                sql += "COMMIT;\n";
            }
            let mut child = Command::new("sqlite3")
                .arg(dir.join("data.db"))
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .context("running sqlite3")?;
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("piped")
                .write_all(sql.as_bytes())?;
            if !child.wait()?.success() {
                bail!("sqlite3 failed");
            }
        }
        _ => bail!("no interactive workload {name:?}"),
    }
    Ok(())
}

/// Writes a source tree of small files into `dir` as `tar x` does (`unpack`).
fn unpack(dir: &Path) -> Result<()> {
    use std::io::Write;
    let mut rng = Rng(0x7a2);
    for d in 0..10 {
        let sub = dir.join(format!("src/mod{d:02}"));
        fs::create_dir_all(&sub)?;
        for f in 0..20 {
            let lines = 20 + (rng.next() % 180) as usize;
            let text = source(&mut rng, lines);
            let mut file = fs::File::create(sub.join(format!("file{f:02}.rs")))?;
            file.write_all(text.as_bytes())?;
            let age = Duration::from_secs(1_700_000_000 + rng.next() % 10_000_000);
            file.set_modified(std::time::UNIX_EPOCH + age)?;
        }
        std::os::unix::fs::symlink("file00.rs", sub.join("mod.rs"))?;
    }
    Ok(())
}

fn run(cmd: &mut Command) -> Result<()> {
    super::output(cmd).map(drop)
}

/// Whether something is mounted at `at`.
fn mounted(at: &Path) -> bool {
    let at = at.to_string_lossy();
    fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(&*at)))
}

/// A mount running as a child process.
struct Mount {
    child: Child,
    at: PathBuf,
}

impl Mount {
    fn start(mut cmd: Command, at: &Path) -> Result<Mount> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
        let mut m = Mount {
            child,
            at: at.to_path_buf(),
        };
        let t = Instant::now();
        while !mounted(at) {
            if let Some(st) = m.child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = m.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                bail!("the mount ended ({st}): {}", err.trim());
            }
            if t.elapsed() > Duration::from_secs(120) {
                bail!("not mounted after 120 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }

    /// Unmounts and waits for the process to end (so every byte it sends is counted).
    fn stop(mut self) -> Result<()> {
        let r = ferry_mount::unmount(&self.at);
        let t = Instant::now();
        loop {
            if self.child.try_wait()?.is_some() {
                break;
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the mount did not end after unmounting");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        r.context("cannot unmount")
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if mounted(&self.at) {
            let _ = ferry_mount::unmount(&self.at);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Lab {
    /// Runs interactive workload `name` through `tool` (a mount) over `relay`.
    pub(super) fn run_mounted(
        &self,
        tool: &str,
        name: &str,
        relay: &Relay,
        p: &Profile,
    ) -> Result<Run> {
        let base = self.work.join("interactive");
        let _ = fs::remove_dir_all(&base);
        let (srv, reference, mnt) = (base.join("srv"), base.join("reference"), base.join("mnt"));
        prepare(&srv, name)?;
        super::workloads::copy_tree(&srv, &reference)?;
        steps(&reference, name)?;
        fs::create_dir_all(&mnt)?;
        let state = base.join("state");
        let remote = format!("{}:{}", self.sshd.host(), srv.display());
        let cmd = match tool {
            "ferry-mount" => {
                let mut c = self.ferry_command(&["mount", "--foreground"], relay.port, &state);
                c.arg(&remote).arg(&mnt);
                c
            }
            "sshfs" => {
                let mut c = Command::new("sshfs");
                let mut ssh = vec!["ssh".to_string(), "-F".into(), "/dev/null".into()];
                ssh.extend(self.sshd.options("-p", relay.port));
                c.arg("-f")
                    .arg("-o")
                    .arg(format!("ssh_command={}", ssh.join(" ")))
                    .arg(&remote)
                    .arg(&mnt);
                c
            }
            _ => bail!("no mount {tool:?} (mounts: {})", MOUNTS.join(", ")),
        };
        relay.take();
        let m = Mount::start(cmd, &mnt)?;
        let t = Instant::now();
        let worked = steps(&mnt, name);
        let seconds = t.elapsed().as_secs_f64();
        let stopped = m.stop();
        let (bytes_up, bytes_down) = relay.take();
        let status = match (worked, stopped) {
            (Ok(()), Ok(())) => {
                match ignore_index(&reference, &srv).and_then(|()| same_files(&reference, &srv)) {
                    // (Only what the reference holds is compared: what it lacks must be gone.)
                    Ok(()) if !reference.join("src").exists() && srv.join("src").exists() => {
                        "failed: the server's tree still holds src".into()
                    }
                    Ok(()) => "ok".into(),
                    Err(e) => format!("failed: the server's tree: {e}"),
                }
            }
            (Err(e), _) | (_, Err(e)) => format!("failed: {e:#}"),
        };
        Ok(Run {
            profile: p.name.clone(),
            workload: name.into(),
            tool: tool.into(),
            bytes_up,
            bytes_down,
            seconds,
            status,
        })
    }
}

/// Removes a clone's index from the reference and the server's tree: a cache of each file's
/// inode number and times, never alike in two clones.
fn ignore_index(reference: &Path, srv: &Path) -> Result<()> {
    for root in [reference, srv] {
        match fs::remove_file(root.join("repo/.git/index")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    Ok(())
}

/// The interactive runs as markdown: a row per profile and workload, bytes both ways and
/// seconds per mount, and Ferry's bytes as a fraction of sshfs's.
pub fn markdown(runs: &[Run]) -> String {
    let runs: Vec<&Run> = runs
        .iter()
        .filter(|r| MOUNTS.contains(&r.tool.as_str()))
        .collect();
    if runs.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n### Interactive workloads through a mount (LBFS §5)\n\nA cold client mounts, works, \
         unmounts; bytes both ways at the link from mounting to unmounting (ssh included), \
         seconds of the work itself.\n\n\
         | profile | workload | ferry mount | sshfs | ferry ÷ sshfs (bytes) | ferry ÷ sshfs (time) |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    let mut seen = vec![];
    for r in &runs {
        let key = (r.profile.clone(), r.workload.clone());
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let find = |tool: &str| {
            runs.iter()
                .find(|x| x.profile == r.profile && x.workload == r.workload && x.tool == tool)
        };
        let cell = |x: Option<&&Run>| match x {
            Some(x) if x.status == "ok" => {
                format!("{} · {:.1} s", x.bytes_up + x.bytes_down, x.seconds)
            }
            // A table cell: the first line of what failed (results.json keeps it whole).
            Some(x) => x
                .status
                .lines()
                .next()
                .unwrap_or_default()
                .replace('|', "\\|"),
            None => String::new(),
        };
        let (f, h) = (find("ferry-mount"), find("sshfs"));
        let ratio = match (f, h) {
            (Some(f), Some(h)) if f.status == "ok" && h.status == "ok" => format!(
                "{:.2} | {:.2}",
                (f.bytes_up + f.bytes_down) as f64 / (h.bytes_up + h.bytes_down).max(1) as f64,
                f.seconds / h.seconds.max(1e-9)
            ),
            _ => " | ".into(),
        };
        s += &format!(
            "| {} | {} | {} | {} | {} |\n",
            r.profile,
            r.workload,
            cell(f),
            cell(h),
            ratio
        );
    }
    s
}
