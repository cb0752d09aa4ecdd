//! `ferry cp SRC DST` (DOT's gcp): copies a file or tree like scp, one side `HOST:PATH`. The
//! control channel is a remote shell (names, modes, times: a manifest); the bytes move daemon
//! to daemon as objects with hints, so a second copy of the same data, a device or a mirror
//! all help. Where either side runs no daemon, it falls back to the file service (`ferry put`
//! or `ferry get` over the same remote shell), so it always works.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use ferry_daemon::api::{FetchRequest, PutReply, PutRequest};
use ferry_daemon::client::Client;
use ferry_daemon::jobs::{Job, State};
use ferry_fs::RemoteSpec;
use serde::{Deserialize, Serialize};

/// Exit code of `ferry object send|receive` when no daemon answers on that side.
pub const NO_DAEMON: u8 = 5;
/// The largest manifest read from the far side.
const MAX_MANIFEST: u64 = 256 << 20;
/// How long a fetch is followed through a daemon that does not answer.
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(clap::Args)]
pub struct Args {
    /// Remote shell, as with scp's -S and rsync's -e: runs `RSH HOST FERRY object …`.
    #[arg(short = 'e', long = "rsh", default_value = "ssh")]
    rsh: String,
    /// The ferry program on the remote side.
    #[arg(long, default_value = "ferry")]
    remote_ferry: String,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
    /// A local file or directory, or HOST:PATH.
    src: String,
    /// Where to copy it: HOST:PATH or a local path (into it, if it is a directory).
    dst: String,
}

/// What is copied: names, kinds, modes and times, and each file's ticket.
#[derive(Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// The source's own name (its last component).
    pub name: String,
    /// The source is a directory.
    pub tree: bool,
    /// Paths relative to the source, parents before children; the source file itself is "".
    pub entries: Vec<Entry>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    pub dir: bool,
    pub mode: u32,
    pub mtime_ns: i64,
    /// A file's ticket.
    pub ticket: Option<String>,
}

/// What a copy did.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Copied {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// Bytes of those that came from another machine (the rest was already there).
    pub fetched: u64,
    /// Entries not copied (symlinks, special files), with why.
    pub skipped: Vec<String>,
    /// `daemon` (objects between daemons) or `file service` (the fallback).
    pub via: String,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (src, dst) = (RemoteSpec::parse(&a.src), RemoteSpec::parse(&a.dst));
    let copied = match (src, dst) {
        (None, Some(r)) => push(&a, Path::new(&a.src), &r)?,
        (Some(r), None) => pull(&a, &r, Path::new(&a.dst))?,
        (Some(_), Some(_)) => bail!("one side of `ferry cp` must be local"),
        (None, None) => bail!("one side of `ferry cp` must be HOST:PATH (use cp for local copies)"),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&copied)?);
    } else {
        eprintln!(
            "ferry: {} files, {} directories, {} bytes ({} moved between machines) via the {}",
            copied.files, copied.dirs, copied.bytes, copied.fetched, copied.via
        );
        for s in &copied.skipped {
            eprintln!("ferry: skipped {s}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn local_client() -> Result<Option<Client>> {
    let client = Client::new(&ferry_daemon::Paths::from_env().socket)?;
    Ok(client
        .get::<ferry_daemon::api::Status>("/v1/status")
        .is_ok()
        .then_some(client))
}

fn remote(a: &Args, host: &str, args: &[&str]) -> Command {
    let mut words = a.rsh.split_whitespace();
    let mut cmd = Command::new(words.next().unwrap_or("ssh"));
    cmd.args(words).arg(host).arg(&a.remote_ferry).args(args);
    cmd
}

/// Local to remote: objects into this daemon, the manifest to `ferry object receive` there.
fn push(a: &Args, src: &Path, r: &RemoteSpec) -> Result<Copied> {
    let Some(client) = local_client()? else {
        tracing::info!("no daemon runs here: copying through the file service");
        return fallback(a, &["put", &a.src, &a.dst]);
    };
    let (manifest, skipped) = send(src, &client)?;
    let mut child = remote(a, &r.host, &["object", "receive", &r.path])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", a.rsh))?;
    let body = serde_json::to_vec(&manifest)?;
    let mut stdin = child.stdin.take().expect("piped");
    // A far side that stops reading (no daemon) is told by its exit code, below.
    let _ = stdin.write_all(&body);
    drop(stdin);
    let mut out = vec![];
    child
        .stdout
        .take()
        .expect("piped")
        .take(MAX_MANIFEST)
        .read_to_end(&mut out)?;
    let status = child.wait()?;
    if status.code() == Some(NO_DAEMON as i32) {
        tracing::info!(
            "no daemon runs on {}: copying through the file service",
            r.host
        );
        return fallback(a, &["put", &a.src, &a.dst]);
    }
    if !status.success() {
        bail!("the far side could not receive the copy ({status})");
    }
    let mut copied: Copied =
        serde_json::from_slice(&out).context("the far side's answer is not understood")?;
    copied.skipped.extend(skipped);
    Ok(copied)
}

/// Remote to local: `ferry object send` there puts the objects into its daemon and answers
/// with the manifest; this daemon fetches them.
fn pull(a: &Args, r: &RemoteSpec, dst: &Path) -> Result<Copied> {
    let Some(client) = local_client()? else {
        tracing::info!("no daemon runs here: copying through the file service");
        return fallback(a, &["get", &a.src, &a.dst]);
    };
    let out = remote(a, &r.host, &["object", "send", &r.path])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", a.rsh))?;
    if out.status.code() == Some(NO_DAEMON as i32) {
        tracing::info!(
            "no daemon runs on {}: copying through the file service",
            r.host
        );
        return fallback(a, &["get", &a.src, &a.dst]);
    }
    if !out.status.success() {
        bail!("the far side could not send the copy ({})", out.status);
    }
    let manifest: Manifest =
        serde_json::from_slice(&out.stdout).context("the far side's manifest is not understood")?;
    receive(&manifest, dst, &client)
}

/// The copy through the file service: `ferry put|get SRC DST` with the same remote shell.
fn fallback(a: &Args, args: &[&str]) -> Result<Copied> {
    let exe = std::env::current_exe().context("cannot find this program")?;
    let status = Command::new(exe)
        .args(args)
        .args(["-e", &a.rsh, "--remote-ferry", &a.remote_ferry])
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("the copy through the file service failed ({status})");
    }
    Ok(Copied {
        via: "file service".into(),
        ..Copied::default()
    })
}

/// `ferry object send PATH` (run by `ferry cp` on the far side): the manifest on standard
/// output, or exit code [`NO_DAEMON`].
pub fn send_here(src: &Path) -> Result<ExitCode> {
    let Some(client) = local_client()? else {
        eprintln!("ferry: no daemon runs on this machine");
        return Ok(ExitCode::from(NO_DAEMON));
    };
    let (manifest, skipped) = send(src, &client)?;
    for s in skipped {
        eprintln!("ferry: skipped {s}");
    }
    println!("{}", serde_json::to_string(&manifest)?);
    Ok(ExitCode::SUCCESS)
}

/// `ferry object receive DEST` (run by `ferry cp` on the far side): the manifest on standard
/// input; what was copied on standard output, or exit code [`NO_DAEMON`].
pub fn receive_here(dst: &Path) -> Result<ExitCode> {
    let Some(client) = local_client()? else {
        eprintln!("ferry: no daemon runs on this machine");
        return Ok(ExitCode::from(NO_DAEMON));
    };
    let mut body = vec![];
    std::io::stdin().take(MAX_MANIFEST).read_to_end(&mut body)?;
    let manifest: Manifest = serde_json::from_slice(&body).context("not a manifest")?;
    let copied = receive(&manifest, dst, &client)?;
    println!("{}", serde_json::to_string(&copied)?);
    Ok(ExitCode::SUCCESS)
}

/// Puts the file or tree at `src` into the daemon: the manifest, and what was skipped.
pub fn send(src: &Path, client: &Client) -> Result<(Manifest, Vec<String>)> {
    let src = std::path::absolute(src)?;
    let meta = std::fs::metadata(&src).with_context(|| format!("cannot read {}", src.display()))?;
    let name = src
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| ".".into());
    let mut entries = vec![];
    let mut skipped = vec![];
    for e in walkdir::WalkDir::new(&src)
        .follow_links(false)
        .sort_by_file_name()
    {
        let e = e?;
        let rel = e
            .path()
            .strip_prefix(&src)
            .expect("beneath")
            .to_string_lossy();
        let m = e.metadata()?;
        let ft = m.file_type();
        if !(ft.is_file() || ft.is_dir()) {
            skipped.push(format!("{} (not a file or directory)", e.path().display()));
            continue;
        }
        let ticket = if ft.is_file() {
            let r: PutReply = client
                .post(
                    "/v1/objects",
                    &PutRequest {
                        path: e.path().to_path_buf(),
                        durability: 1,
                    },
                )
                .with_context(|| format!("cannot put {}", e.path().display()))?;
            Some(r.ticket)
        } else {
            None
        };
        use std::os::unix::fs::MetadataExt;
        entries.push(Entry {
            path: rel.into_owned(),
            dir: ft.is_dir(),
            mode: m.mode() & 0o7777,
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ticket,
        });
    }
    Ok((
        Manifest {
            name,
            tree: meta.is_dir(),
            entries,
        },
        skipped,
    ))
}

/// A manifest path as a relative path of plain components (a manifest from the far side
/// cannot name anything outside the destination).
fn confined(p: &str) -> Result<PathBuf> {
    let path = Path::new(p);
    if !path.components().all(|c| matches!(c, Component::Normal(_))) {
        bail!("the manifest names {p:?}, which is not a plain relative path");
    }
    Ok(path.to_path_buf())
}

/// Fetches every file of `m` through the daemon into `dst` (into it, when it is a
/// directory), directories made, modes and times set.
pub fn receive(m: &Manifest, dst: &Path, client: &Client) -> Result<Copied> {
    let dst = std::path::absolute(dst)?;
    if m.name.contains('/') || m.name == ".." {
        bail!("the manifest names its source {:?}", m.name);
    }
    let root = if dst.is_dir() && m.name != "." {
        dst.join(&m.name)
    } else {
        dst
    };
    let mut copied = Copied {
        via: "daemon".into(),
        ..Copied::default()
    };
    let mut jobs = vec![];
    for e in &m.entries {
        let rel = confined(&e.path)?;
        // The source file itself is the root ("" joined would add a slash).
        let at = match rel.as_os_str().is_empty() {
            true => root.clone(),
            false => root.join(&rel),
        };
        no_links_between(&root, &rel)?;
        if e.dir {
            std::fs::create_dir_all(&at)
                .with_context(|| format!("cannot create {}", at.display()))?;
            copied.dirs += 1;
            continue;
        }
        let Some(ticket) = &e.ticket else {
            bail!("the manifest gives {:?} no ticket", e.path);
        };
        let job: Job = client.post(
            "/v1/fetches",
            &FetchRequest {
                ticket: ticket.clone(),
                path: Some(at.clone()),
            },
        )?;
        jobs.push((job.id, at, e));
    }
    for (id, at, e) in jobs {
        let end = client.follow(&id, 0, PATIENCE, |_| {})?;
        let report = match (end.state, end.report) {
            (State::Done, Some(r)) => r,
            _ => bail!(
                "cannot fetch {}: {}",
                at.display(),
                end.error.unwrap_or_default()
            ),
        };
        copied.files += 1;
        copied.bytes += report.size;
        copied.fetched += report.sources.iter().map(|s| s.bytes).sum::<u64>();
        set_attrs(&at, e)?;
    }
    // Directories' times last (their contents changed them), deepest first.
    for e in m.entries.iter().rev().filter(|e| e.dir) {
        set_attrs(&root.join(&e.path), e)?;
    }
    Ok(copied)
}

/// Refuses a destination path that would pass through a symlink below `root`.
fn no_links_between(root: &Path, rel: &Path) -> Result<()> {
    let mut at = root.to_path_buf();
    for c in rel.parent().into_iter().flat_map(|p| p.components()) {
        at.push(c);
        if let Ok(m) = std::fs::symlink_metadata(&at) {
            if m.file_type().is_symlink() {
                bail!(
                    "{} is a symlink; nothing is copied through it",
                    at.display()
                );
            }
        }
    }
    Ok(())
}

fn set_attrs(at: &Path, e: &Entry) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(at, std::fs::Permissions::from_mode(e.mode & 0o7777))
        .with_context(|| format!("cannot set the mode of {}", at.display()))?;
    let t = if e.mtime_ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(e.mtime_ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(e.mtime_ns.unsigned_abs())
    };
    let f = std::fs::File::open(at).with_context(|| format!("cannot open {}", at.display()))?;
    f.set_modified(t)
        .with_context(|| format!("cannot set the time of {}", at.display()))
}
