//! DOT's evaluation (`../shared/seeds/001_…`, §6): the transfer daemon against scp and rsync
//! for a 40 MB file over emulated links (its Figure 6: what the service costs on fast links);
//! one object over two links at once (its Table 2, daemon to daemon); and portable storage
//! (§6.2.2: a transfer over a slow link, a device carrying all or half of the object there from
//! the start or plugged in during the transfer).
//!
//! Two daemons run here, each with a directory of its own: A sends, B receives. B reaches A's
//! peer side only through emulated links (relays in front of A's port, named by the hints), and
//! `ferry cp` reaches A's machine through the lab's sshd over an emulated link of the same
//! shape; bytes are counted at both links. Every run starts with B's store empty.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::link::{Relay, Shape};
use super::{rate, run_bounded, same_files, Lab};

/// The file moved: incompressible, 40 MB as in DOT's experiments.
const FILE_BYTES: usize = 40_000_000;
const HOUR: Duration = Duration::from_secs(3600);

fn shape(mbit: f64, rtt_ms: u64) -> Shape {
    let bps = (mbit * 1e6) as u64;
    Shape {
        down_bps: bps,
        up_bps: bps,
        rtt: Duration::from_millis(rtt_ms),
    }
}

fn name(s: &Shape) -> String {
    format!("{}/{} ms", rate(s.down_bps), s.rtt.as_millis())
}

/// One run.
#[derive(Serialize)]
pub struct DotRun {
    /// gcp, multipath or storage.
    pub experiment: String,
    pub link: String,
    /// ferry-cp, scp, rsync; single, two-paths; network, device-all, device-half,
    /// device-plugged.
    pub mode: String,
    pub seconds: f64,
    /// Bytes over the emulated links, both ways.
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub status: String,
}

/// A daemon of the lab's, stopped when dropped.
pub(super) struct Daemon {
    dir: PathBuf,
    ferry: PathBuf,
    pub(super) key: String,
}

impl Daemon {
    /// Starts a daemon in `dir` listening on `listen`, advertising `advertise`.
    pub(super) fn start(lab: &Lab, dir: &Path, listen: &str, advertise: &str) -> Result<Daemon> {
        fs::create_dir_all(dir)?;
        let out = Command::new(&lab.ferry)
            .args(["daemon", "--detach", "--json", "--listen", listen])
            .args(["--advertise", advertise, "--dir"])
            .arg(dir)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!(
                "cannot start a daemon: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let status = super::output(
            Command::new(&lab.ferry)
                .args(["daemon", "status", "--json", "--dir"])
                .arg(dir),
        )?;
        let v: serde_json::Value = serde_json::from_str(&status)?;
        Ok(Daemon {
            dir: dir.to_path_buf(),
            ferry: lab.ferry.clone(),
            key: v["key"].as_str().unwrap_or_default().to_string(),
        })
    }

    /// Where its peer side listens.
    pub(super) fn listen(&self) -> Result<String> {
        let status = super::output(&mut self.cmd(&["daemon", "status", "--json"]))?;
        let v: serde_json::Value = serde_json::from_str(&status)?;
        Ok(v["listen"]
            .as_str()
            .context("the daemon does not listen")?
            .to_string())
    }

    pub(super) fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.ferry);
        c.arg("-q").args(args).env("FERRY_DAEMON_DIR", &self.dir);
        c
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.cmd(&["daemon", "stop"]).stderr(Stdio::null()).status();
        // The socket answers no more once it is gone: wait for that (a new daemon in the same
        // directory must not find the old one still there).
        for _ in 0..200 {
            if std::os::unix::net::UnixStream::connect(self.dir.join("daemon.sock")).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A free loopback port (bound, then let go).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Runs the three experiments; returns their runs in the order run.
pub fn run(lab: &Lab) -> Result<Vec<DotRun>> {
    let dir = fs::canonicalize(&lab.work)?.join("dot");
    let src = dir.join("src");
    fs::create_dir_all(&src)?;
    fs::write(
        src.join("file"),
        super::incompressible(0x646f_7421, FILE_BYTES),
    )?;
    let mut runs = vec![];
    for link in [shape(100.0, 0), shape(10.0, 30), shape(4.0, 30)] {
        for tool in ["ferry-cp", "scp", "rsync"] {
            runs.push(log(gcp(lab, &dir, link, tool)?));
        }
    }
    for (a, b) in [
        (shape(20.0, 10), shape(5.0, 30)),
        (shape(8.0, 30), shape(2.0, 30)),
    ] {
        for mode in ["single", "two-paths"] {
            runs.push(log(multipath(lab, &dir, a, b, mode)?));
        }
    }
    let slow = shape(4.0, 30);
    for mode in ["network", "device-all", "device-half", "device-plugged"] {
        runs.push(log(storage(lab, &dir, slow, mode)?));
    }
    Ok(runs)
}

fn log(r: DotRun) -> DotRun {
    eprintln!(
        "lab: dot {:<9} {:<22} {:<14} {:>8.2} s  {:>10} B down  ({})",
        r.experiment, r.link, r.mode, r.seconds, r.bytes_down, r.status
    );
    r
}

/// A's daemon behind `relays` (B reaches it only through them), with the file put.
struct Sender {
    daemon: Daemon,
    ticket: ferry_daemon::Ticket,
}

fn sender(lab: &Lab, dir: &Path, relays: &[&Relay], port: u16) -> Result<Sender> {
    let advertise = format!("127.0.0.1:{}", relays[0].port);
    let daemon = Daemon::start(
        lab,
        &dir.join("a"),
        &format!("127.0.0.1:{port}"),
        &advertise,
    )?;
    let file = dir.join("src/file");
    let t = super::output(daemon.cmd(&["object", "put"]).arg(&file))?;
    let mut ticket: ferry_daemon::Ticket = t.parse()?;
    ticket.hints = relays
        .iter()
        .map(|r| {
            let uri = format!("ferry://127.0.0.1:{}?key={}", r.port, daemon.key);
            ferry_daemon::Hint::new(uri, 0, 1)
        })
        .collect();
    Ok(Sender { daemon, ticket })
}

/// B's daemon, its directory new.
fn receiver(lab: &Lab, dir: &Path) -> Result<Daemon> {
    let b = dir.join("b");
    let _ = fs::remove_dir_all(&b);
    Daemon::start(lab, &b, "127.0.0.1:0", "127.0.0.1")
}

/// Runs `cmd`, timed, with the relays' bytes counted; checks the file arrived at `got`.
fn measured(
    experiment: &str,
    link: String,
    mode: &str,
    relays: &[&Relay],
    cmd: &mut Command,
    want: &Path,
    got: &Path,
) -> Result<DotRun> {
    for r in relays {
        r.take();
    }
    let t = Instant::now();
    let status = run_bounded(cmd, HOUR)?;
    let seconds = t.elapsed().as_secs_f64();
    let (mut up, mut down) = (0, 0);
    for r in relays {
        let (u, d) = r.take();
        up += u;
        down += d;
    }
    let status = match status
        .map_err(anyhow::Error::msg)
        .and_then(|_| same_files(want, got))
    {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("failed: {e}"),
    };
    Ok(DotRun {
        experiment: experiment.into(),
        link,
        mode: mode.into(),
        seconds,
        bytes_up: up,
        bytes_down: down,
        status,
    })
}

/// Figure 6: `ferry cp` (pulling, daemon to daemon) against scp and rsync over one link shape.
fn gcp(lab: &Lab, dir: &Path, link: Shape, tool: &str) -> Result<DotRun> {
    let want = dir.join("src/file");
    let got = dir.join("got");
    let _ = fs::remove_file(&got);
    let ssh = Relay::start(link, lab.sshd.addr)?;
    let rsh = lab.sshd.rsh(ssh.port);
    let from = format!("{}:{}", lab.sshd.host(), want.display());
    match tool {
        "ferry-cp" => {
            let port = free_port()?;
            let peer = Relay::start(link, format!("127.0.0.1:{port}").parse()?)?;
            let a = sender(lab, dir, &[&peer], port)?;
            let b = receiver(lab, dir)?;
            let mut c = b.cmd(&["cp", "-e", &rsh, "--remote-ferry"]);
            c.arg(format!(
                "env FERRY_DAEMON_DIR={} {}",
                a.daemon.dir.display(),
                lab.ferry.display()
            ))
            .arg(&from)
            .arg(&got);
            measured(
                "gcp",
                name(&link),
                tool,
                &[&ssh, &peer],
                &mut c,
                &want,
                &got,
            )
        }
        "scp" => {
            let mut c = Command::new("scp");
            c.args(["-q", "-F", "/dev/null"])
                .args(lab.sshd.options("-P", ssh.port))
                .arg(&from)
                .arg(&got);
            measured("gcp", name(&link), tool, &[&ssh], &mut c, &want, &got)
        }
        "rsync" => {
            let mut c = Command::new("rsync");
            c.args(["-a", "-e", &rsh]).arg(&from).arg(&got);
            measured("gcp", name(&link), tool, &[&ssh], &mut c, &want, &got)
        }
        _ => bail!("no tool {tool}"),
    }
}

/// Table 2: B fetches the object over link `a` alone, or over `a` and `b` at once.
fn multipath(lab: &Lab, dir: &Path, a: Shape, b: Shape, mode: &str) -> Result<DotRun> {
    let port = free_port()?;
    let target = format!("127.0.0.1:{port}").parse()?;
    let (ra, rb) = (Relay::start(a, target)?, Relay::start(b, target)?);
    let relays: Vec<&Relay> = match mode {
        "single" => vec![&ra],
        _ => vec![&ra, &rb],
    };
    let s = sender(lab, dir, &relays, port)?;
    let r = receiver(lab, dir)?;
    let got = dir.join("got");
    let _ = fs::remove_file(&got);
    let mut c = r.cmd(&["object", "get", &s.ticket.to_string(), "-o"]);
    c.arg(&got);
    let link = format!("{} + {}", name(&a), name(&b));
    measured(
        "multipath",
        link,
        mode,
        &[&ra, &rb],
        &mut c,
        &dir.join("src/file"),
        &got,
    )
}

/// §6.2.2: B fetches over a slow link with a device holding all or half of the object from
/// the start, or all of it plugged in a third of the way through.
fn storage(lab: &Lab, dir: &Path, link: Shape, mode: &str) -> Result<DotRun> {
    let port = free_port()?;
    let relay = Relay::start(link, format!("127.0.0.1:{port}").parse()?)?;
    // A pushes the object to a staging device once; each run's device is a copy of it.
    let staged = dir.join("staged");
    let s = sender(lab, dir, &[&relay], port)?;
    if !staged.join(".ferry-dot").is_dir() {
        fs::create_dir_all(&staged)?;
        super::output(
            s.daemon
                .cmd(&["daemon", "device", "add", "--push"])
                .arg(&staged),
        )?;
        super::output(s.daemon.cmd(&["object", "put"]).arg(dir.join("src/file")))?;
        super::output(s.daemon.cmd(&["daemon", "device", "remove"]).arg(&staged))?;
    }
    let r = receiver(lab, dir)?;
    let stick = dir.join("stick");
    let _ = fs::remove_dir_all(&stick);
    fs::create_dir_all(&stick)?;
    let contents = dir.join("stick-contents");
    let _ = fs::remove_dir_all(&contents);
    if mode != "network" {
        let ok = Command::new("cp")
            .arg("-a")
            .arg(staged.join(".ferry-dot"))
            .arg(&contents)
            .status()?;
        if !ok.success() {
            bail!("cannot copy the device's contents");
        }
        if mode == "device-half" {
            let mut files: Vec<PathBuf> = walkdir::WalkDir::new(contents.join("chunks"))
                .into_iter()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_file())
                .map(|e| e.into_path())
                .collect();
            files.sort();
            for f in files.iter().step_by(2) {
                fs::remove_file(f)?;
            }
        }
        if mode != "device-plugged" {
            fs::rename(&contents, stick.join(".ferry-dot"))?;
        }
    }
    super::output(r.cmd(&["daemon", "device", "add"]).arg(&stick))?;
    let got = dir.join("got");
    let _ = fs::remove_file(&got);
    let mut c = r.cmd(&["object", "get", &s.ticket.to_string(), "-o"]);
    c.arg(&got);
    let expected = (FILE_BYTES * 8) as f64 / link.down_bps as f64;
    std::thread::scope(|sc| {
        if mode == "device-plugged" {
            let (contents, stick) = (contents.clone(), stick.clone());
            sc.spawn(move || {
                std::thread::sleep(Duration::from_secs_f64(expected / 3.0));
                if let Err(e) = fs::rename(&contents, stick.join(".ferry-dot")) {
                    eprintln!("lab: cannot plug the device in: {e}");
                }
            });
        }
        measured(
            "storage",
            name(&link),
            mode,
            &[&relay],
            &mut c,
            &dir.join("src/file"),
            &got,
        )
    })
    .context("the storage experiment")
}

/// The results as markdown tables, one per experiment.
pub fn markdown(runs: &[DotRun]) -> String {
    let mut s = String::new();
    for (exp, title) in [
        (
            "gcp",
            "40 MB file, daemon to daemon (`ferry cp`) against scp and rsync (DOT Figure 6)",
        ),
        (
            "multipath",
            "40 MB object over one link or two at once (DOT Table 2)",
        ),
        (
            "storage",
            "40 MB object over a slow link with a device (DOT §6.2.2)",
        ),
    ] {
        s += &format!(
            "\n### {title}\n\n| link | mode | seconds | vs first | bytes down | bytes up | status |\n|---|---|---:|---:|---:|---:|---|\n"
        );
        let rows: Vec<&DotRun> = runs.iter().filter(|r| r.experiment == exp).collect();
        for r in &rows {
            let first = rows
                .iter()
                .find(|f| f.link == r.link)
                .map(|f| r.seconds / f.seconds)
                .unwrap_or(1.0);
            s += &format!(
                "| {} | {} | {:.2} | {:.2} × | {} | {} | {} |\n",
                r.link, r.mode, r.seconds, first, r.bytes_down, r.bytes_up, r.status
            );
        }
    }
    s
}
