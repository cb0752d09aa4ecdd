//! `ferry lab`: Ferry against rsync (with and without -z), scp and the near-ideal delta, on
//! the same workloads over the same emulated link, in one run; bytes counted at the link.
//!
//! Every contender reaches a throwaway sshd on loopback through a relay that shapes the link
//! ([`link`]): rate each way and round-trip time from the profiles of DESIGN.md. The relay
//! counts what crosses it in each direction, so no tool's own report is taken. Results go to
//! `results.json`, `results.md` and, with gnuplot, PNG charts.

mod bullet;
mod chart;
mod dot;
mod interactive;
mod link;
mod lookaside;
mod multipath;
mod netns;
mod sshd;
mod stick;
mod vault;
mod workloads;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::util::human;
use link::{Relay, Shape};
use workloads::Workload;

#[derive(clap::Args)]
pub struct Args {
    /// One workload (project-edit) over one profile (cable): a few minutes.
    #[arg(long)]
    quick: bool,
    /// Link profiles to run (cellular, modem, cable, dsl, t1, lan) [default: lan, dsl, cable,
    /// t1, and cable at 10, 100 and 300 ms round trips; with --quick, cable].
    #[arg(long = "profile", value_name = "NAME")]
    profiles: Vec<String>,
    /// A custom link instead: downstream rate (bits per second: 384k, 1.5M).
    #[arg(long, value_parser = parse_rate, requires_all = ["up", "rtt"])]
    down: Option<u64>,
    /// Upstream rate of the custom link.
    #[arg(long, value_parser = parse_rate)]
    up: Option<u64>,
    /// Round-trip time of the custom link, in milliseconds.
    #[arg(long, value_name = "MS")]
    rtt: Option<f64>,
    /// Also drop this percentage of TCP packets each way, on every profile (root: the server
    /// runs in a network namespace behind an nftables rule).
    #[arg(long, value_name = "PERCENT", value_parser = parse_loss)]
    loss: Option<f64>,
    /// Directory of `<name>/{old,new}` workloads (as built by lab/workloads.sh), run besides
    /// the built-in ones.
    #[arg(long, value_name = "DIR")]
    workloads: Option<PathBuf>,
    /// Only these workloads (by name).
    #[arg(long = "workload", value_name = "NAME")]
    only: Vec<String>,
    /// Contenders [default: all of ferry, ferry-warm, rsync, rsync-z, scp]. ferry-warm is
    /// Ferry after this client fetched the old version from this server (its history and the
    /// client's cache hold it), the usual case for a tool run again and again; ferry's server
    /// never saw the old version, as rsync's.
    #[arg(long = "tool", value_name = "NAME")]
    tools: Vec<String>,
    /// Skip a whole-file copy expected to take longer than this on a profile (seconds: its
    /// bytes at the downstream rate plus four round trips a file).
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    max_whole: f64,
    /// Also run the LBFS interactive workloads (document saves, a rebuild after a header
    /// change, an ed script) and everyday ones (unpack: a tree of 200 small files written as
    /// `tar x` does; remove-tree: that tree removed; rsync-tree: it copied in by `rsync -a`;
    /// sqlite: 100 transactions of 100 rows; git-clone: a repository cloned in; build: a C
    /// project built by `make -j2`) through `ferry mount` and sshfs (root and /dev/fuse
    /// needed); with --quick, the document saves only.
    #[arg(long)]
    interactive: bool,
    /// The mounts --interactive runs [default: both of ferry-mount, sshfs].
    #[arg(long = "mount", value_name = "NAME", requires = "interactive")]
    mounts: Vec<String>,
    /// Run DOT's multi-path experiment instead (its Table 2): a 40 MB file over two emulated
    /// links at once (`ferry get --mirror`), with and without request borrowing, against the
    /// faster link alone, and each link cut in the middle of a transfer. Writes multipath.md
    /// and multipath.json into --out.
    #[arg(long, conflicts_with_all = ["quick", "profiles", "down", "interactive", "from_json"])]
    multipath: bool,
    /// Run DOT's experiments instead: `ferry cp` (daemon to daemon) against scp and rsync for
    /// a 40 MB file over three links (its Figure 6), one object over two links at once (Table
    /// 2), and a slow link with a device holding all or half of the object, or plugged in
    /// during the transfer (§6.2.2). Writes dot.md and dot.json into --out.
    #[arg(long, conflicts_with_all = ["quick", "profiles", "down", "interactive", "from_json", "multipath"])]
    dot: bool,
    /// Run the lookaside paper's experiments instead (its Figures 5 and 7) with the releases
    /// in DIR (one directory per release, as lab/workloads.sh puts in releases/tokio): the
    /// newest fetched at four bandwidths with an emulated USB stick holding it, older ones or
    /// nothing, with chunk-level and whole-file lookaside; and a 41 MB memory image. Root
    /// emulates the stick (a throttled loop device). Writes lookaside.md, lookaside.json and
    /// (with gnuplot) lookaside.png.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["quick", "profiles", "down", "interactive", "from_json", "multipath"])]
    lookaside: Option<PathBuf>,
    /// With --lookaside: only these of the four bandwidths (100Mb/s, 10Mb/s, 1Mb/s, 100kb/s),
    /// in both figures.
    #[arg(long = "bandwidth", value_name = "NAME", requires = "lookaside")]
    bandwidths: Vec<String>,
    /// With --lookaside: run each cell this many times and report the median (every time is
    /// in the JSON).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "lookaside")]
    repeat: usize,
    /// With --lookaside: only this figure (5 or 7).
    #[arg(long, value_name = "N", requires = "lookaside", value_parser = clap::value_parser!(u32).range(5..=7))]
    figure: Vec<u32>,
    /// Run the Bullet paper's Figures 2 and 3 instead: read and create+delete, delay and
    /// bandwidth, objects of 1 B to 64 MiB, over loopback: Ferry's object service at
    /// durability 0, 1 and 2 against an S3 server (versitygw) and a file server (sshfs), and
    /// the disk's sequential rates. With --bullet-quick, fewer operations. Writes bullet.md and
    /// bullet.json into --out.
    #[arg(long, conflicts_with_all = ["quick", "profiles", "down", "interactive", "from_json", "multipath", "dot"])]
    bullet: bool,
    #[arg(long, requires = "bullet")]
    bullet_quick: bool,
    /// Run the OceanStore paper's Figures 6 and 7 instead: bytes and latency of writing the
    /// next version of each workload into a vault on the lab's server (Whole, Block,
    /// FileSummary, against the near-ideal delta), and of a cold read, over the profiles
    /// [default: lan, cable, modem, cellular]; --max-whole skips runs estimated longer.
    /// Writes vault.md and vault.json into --out.
    #[arg(long, conflicts_with_all = ["quick", "interactive", "multipath", "dot", "bullet"])]
    vault: bool,
    /// Where results go.
    #[arg(long, default_value = "lab-results", value_name = "DIR")]
    out: PathBuf,
    /// The ferry program run as the contender, client and server (default: this one): to
    /// compare two builds on the same workloads.
    #[arg(long, value_name = "PATH")]
    ferry: Option<PathBuf>,
    /// Print the results as JSON too.
    #[arg(long)]
    json: bool,
    /// Run nothing: write the tables and charts of an earlier run's results.json (or
    /// lookaside.json) into --out.
    #[arg(long, value_name = "FILE")]
    from_json: Option<PathBuf>,
}

fn parse_rate(s: &str) -> Result<u64, String> {
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1e3),
        Some('m' | 'M') => (&s[..s.len() - 1], 1e6),
        Some('g' | 'G') => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: a rate such as 384k or 1.5M (bits per second)"))?;
    if v.is_nan() || v <= 0.0 {
        return Err(format!("{s:?}: a rate must be positive"));
    }
    Ok((v * mul) as u64)
}

fn parse_loss(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(v) if (0.0..=50.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: a percentage from 0 to 50")),
    }
}

/// A named link shape.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Profile {
    name: String,
    down_bps: u64,
    up_bps: u64,
    rtt_ms: f64,
    /// TCP packets dropped each way, in percent.
    #[serde(default)]
    loss_pct: f64,
    /// Bytes (up, down) of an ssh session that does nothing, measured on this link.
    #[serde(skip_serializing_if = "Option::is_none")]
    ssh_session: Option<(u64, u64)>,
}

impl Profile {
    fn shape(&self) -> Shape {
        Shape {
            down_bps: self.down_bps,
            up_bps: self.up_bps,
            rtt: Duration::from_secs_f64(self.rtt_ms / 1000.0),
        }
    }
}

/// The profiles of DESIGN.md: (name, down, up, round trip in ms).
const PROFILES: &[(&str, u64, u64, f64)] = &[
    ("cellular", 10_000, 10_000, 100.0),
    ("modem", 56_000, 56_000, 100.0),
    ("cable", 1_500_000, 384_000, 30.0),
    ("dsl", 4_000_000, 2_000_000, 30.0),
    ("t1", 1_500_000, 1_500_000, 10.0),
    ("lan", 100_000_000, 100_000_000, 0.2),
];

fn profile(name: &str) -> Result<Profile> {
    // `cable@100` is cable with a 100 ms round trip.
    let (base, rtt) = match name.split_once('@') {
        Some((b, r)) => (
            b,
            Some(r.parse::<f64>().context("a round trip in ms after @")?),
        ),
        None => (name, None),
    };
    let Some(&(n, down, up, r)) = PROFILES.iter().find(|p| p.0 == base) else {
        let names: Vec<_> = PROFILES.iter().map(|p| p.0).collect();
        bail!("no profile {name:?} (profiles: {})", names.join(", "));
    };
    Ok(Profile {
        name: match rtt {
            Some(r) => format!("{n}@{r}ms"),
            None => n.into(),
        },
        down_bps: down,
        up_bps: up,
        rtt_ms: rtt.unwrap_or(r),
        loss_pct: 0.0,
        ssh_session: None,
    })
}

const TOOLS: &[&str] = &["ferry", "ferry-warm", "rsync", "rsync-z", "scp"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_profiles_parse() {
        assert_eq!(parse_rate("384k"), Ok(384_000));
        assert_eq!(parse_rate("1.5M"), Ok(1_500_000));
        assert_eq!(parse_rate("100"), Ok(100));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-1k").is_err());
        let p = profile("cable@100").unwrap();
        assert_eq!(
            (p.down_bps, p.up_bps, p.rtt_ms),
            (1_500_000, 384_000, 100.0)
        );
        assert_eq!(p.name, "cable@100ms");
        assert!(profile("carrier-pigeon").is_err());
        assert_eq!(parse_loss("1.5"), Ok(1.5));
        assert_eq!(parse_loss("2%"), Ok(2.0));
        assert!(parse_loss("80").is_err() && parse_loss("-1").is_err() && parse_loss("x").is_err());
    }
}

/// One contender's run of one workload over one profile.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Run {
    profile: String,
    workload: String,
    tool: String,
    bytes_up: u64,
    bytes_down: u64,
    seconds: f64,
    /// "ok", "skipped: …" or "failed: …".
    status: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct WorkloadInfo {
    name: String,
    old_bytes: u64,
    new_bytes: u64,
    #[serde(default)]
    new_files: u64,
    /// `zstd -19 --long=27 --patch-from=old.tar new.tar`: the near-ideal delta.
    ideal_bytes: u64,
}

impl Run {
    fn skipped(p: &Profile, workload: &str, tool: &str, why: String) -> Run {
        Run {
            profile: p.name.clone(),
            workload: workload.into(),
            tool: tool.into(),
            bytes_up: 0,
            bytes_down: 0,
            seconds: 0.0,
            status: format!("skipped: {why}"),
        }
    }

    /// One line of progress on standard error.
    fn log(&self) {
        eprintln!(
            "lab: {:<10} {:<16} {:<11} {:>10} down {:>9} up {:>7.1} s  {}",
            self.profile,
            self.workload,
            self.tool,
            human(self.bytes_down),
            human(self.bytes_up),
            self.seconds,
            self.status
        );
    }
}

/// Everything a contender needs.
struct Lab {
    work: PathBuf,
    sshd: sshd::Sshd,
    /// With `--loss`: the namespace the server runs in (dropped after it).
    _netns: Option<netns::Netns>,
    /// An unshaped, unmeasured way to the server (for what happens before a measurement).
    direct: Relay,
    ferry: PathBuf,
}

impl Lab {
    /// Runs `tool` on `w` through `relay`; the destination starts as a copy of `old` (empty
    /// for scp, a whole copy).
    /// The bytes of an ssh session that does nothing (`ssh host true`): the floor under every
    /// contender, none of which the near-ideal delta counts.
    fn ssh_floor(&self, relay: &Relay) -> Result<(u64, u64)> {
        let mut c = Command::new("ssh");
        c.args(["-F", "/dev/null"])
            .args(self.sshd.options("-p", relay.port))
            .arg(self.sshd.host())
            .arg("true");
        relay.take();
        if let Err(e) = run_bounded(&mut c, Duration::from_secs(300))? {
            bail!("ssh through the emulated link failed: {e}");
        }
        Ok(relay.take())
    }

    /// `ferry ARGS -e RSH --remote-ferry … --cache …`: a Ferry client reaching the lab's sshd
    /// through `port`, its cache and the server's state (history, staging) under `state`.
    fn ferry_command(&self, args: &[&str], port: u16, state: &Path) -> Command {
        let mut c = Command::new(&self.ferry);
        c.args(args)
            .args(["-e", &self.sshd.rsh(port), "--remote-ferry"])
            .arg(format!(
                "env XDG_CACHE_HOME={} {}",
                state.join("server").display(),
                self.ferry.display()
            ))
            .arg("--cache")
            .arg(state.join("cache"));
        c
    }

    fn run(&self, tool: &str, w: &Workload, relay: &Relay, p: &Profile) -> Result<Run> {
        let dst = self.work.join("dst");
        let _ = fs::remove_dir_all(&dst);
        let state = self.work.join("ferry-state");
        let _ = fs::remove_dir_all(&state);
        let src = format!("{}:{}", self.sshd.host(), w.new.display());
        let rsh = self.sshd.rsh(relay.port);
        // `ferry get` with its own server state and cache, through the ssh at `port`.
        let ferry_get = |port: u16, from: &Path| {
            let mut c = self.ferry_command(&["-q", "get"], port, &state);
            c.arg(format!("{}:{}", self.sshd.host(), from.display()))
                .arg(&dst);
            c
        };
        match tool {
            "scp" => {}
            "ferry-warm" => {
                // This client fetched the old version from this server before, over a link
                // not measured: the server's history and the client's cache hold it.
                let mut prime = ferry_get(self.direct.port, &w.old);
                if let Err(e) = run_bounded(&mut prime, Duration::from_secs(1800))? {
                    bail!("fetching the old version of {} first: {e}", w.name);
                }
            }
            _ => workloads::copy_tree(&w.old, &dst)?,
        }
        let mut cmd = match tool {
            // A server that never saw the old version (as rsync's), and an empty cache.
            "ferry" | "ferry-warm" => ferry_get(relay.port, &w.new),
            "rsync" | "rsync-z" => {
                let mut c = Command::new("rsync");
                c.args(["-a", "--delete"]);
                if tool == "rsync-z" {
                    c.arg("-z");
                }
                c.args(["-e", &rsh])
                    .arg(format!("{src}/"))
                    .arg(format!("{}/", dst.display()));
                c
            }
            "scp" => {
                let mut c = Command::new("scp");
                c.args(["-q", "-r", "-F", "/dev/null"])
                    .args(self.sshd.options("-P", relay.port))
                    .arg(&src)
                    .arg(&dst);
                c
            }
            _ => bail!("no tool {tool:?} (tools: {})", TOOLS.join(", ")),
        };
        relay.take();
        let t = Instant::now();
        let status = run_bounded(&mut cmd, Duration::from_secs(1800))?;
        let seconds = t.elapsed().as_secs_f64();
        let (bytes_up, bytes_down) = relay.take();
        let status = match status {
            Ok(()) => match same_files(&w.new, &dst) {
                Ok(()) => "ok".into(),
                Err(e) => format!("failed: {e}"),
            },
            Err(e) => format!("failed: {e}"),
        };
        Ok(Run {
            profile: p.name.clone(),
            workload: w.name.clone(),
            tool: tool.into(),
            bytes_up,
            bytes_down,
            seconds,
            status,
        })
    }
}

/// Why `tool` (a mount) cannot run here, if it cannot.
fn mount_unavailable(tool: &str) -> Option<String> {
    if !rustix::process::getuid().is_root() || !Path::new("/dev/fuse").exists() {
        return Some("mounting needs root and /dev/fuse".into());
    }
    let found = |prog: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {prog}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if tool == "sshfs" && !found("sshfs") {
        return Some("sshfs not installed (apt-get install sshfs)".into());
    }
    if !found("make") || !found("gcc") {
        return Some("the workloads need make and gcc".into());
    }
    None
}

/// Runs `cmd` with output captured, killing it after `limit`; `Err(message)` when it failed.
fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<Result<(), String>> {
    run_bounded_keep_stdout(cmd.stdout(Stdio::null()), limit)
}

/// [`run_bounded`] with standard output where `cmd` already sends it.
fn run_bounded_keep_stdout(cmd: &mut Command, limit: Duration) -> Result<Result<(), String>> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let start = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = reader.join().unwrap_or_default();
    Ok(match st {
        Some(st) if st.success() => Ok(()),
        Some(st) => Err(format!("{st}: {}", stderr.trim())),
        None => Err(format!("no result after {} s", limit.as_secs())),
    })
}

/// Every regular file and symlink under `want` is at `got` with the same content.
fn same_files(want: &Path, got: &Path) -> Result<()> {
    for e in walkdir::WalkDir::new(want) {
        let e = e?;
        let rel = e.path().strip_prefix(want)?;
        // `want` a file: `got` is the other file (joining "" would add a slash).
        let other = match rel.as_os_str().is_empty() {
            true => got.to_path_buf(),
            false => got.join(rel),
        };
        if e.file_type().is_file() {
            if fs::read(e.path())? != fs::read(&other).unwrap_or_default() {
                bail!("{} differs", rel.display());
            }
        } else if e.file_type().is_symlink() && fs::read_link(e.path())? != fs::read_link(&other)? {
            bail!("symlink {} differs", rel.display());
        }
    }
    Ok(())
}

/// The near-ideal delta's size: `zstd -19 --long=27 --patch-from=old.tar new.tar`.
fn ideal(w: &Workload, work: &Path) -> Result<u64> {
    let tar = |dir: &Path, out: &Path| -> Result<()> {
        let st = Command::new("tar")
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "-C",
            ])
            .arg(dir)
            .arg("-cf")
            .arg(out)
            .arg(".")
            .status()?;
        if !st.success() {
            bail!("tar of {} failed", dir.display());
        }
        Ok(())
    };
    let (old, new) = (work.join("old.tar"), work.join("new.tar"));
    tar(&w.old, &old)?;
    tar(&w.new, &new)?;
    let o = Command::new("zstd")
        .args(["-q", "-19", "--long=27", "-c"])
        .arg(format!("--patch-from={}", old.display()))
        .arg(&new)
        .output()
        .context("cannot run zstd (apt-get install zstd)")?;
    if !o.status.success() {
        bail!(
            "zstd --patch-from failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let _ = (fs::remove_file(old), fs::remove_file(new));
    Ok(o.stdout.len() as u64)
}

fn check_tools(tools: &[String]) -> Result<()> {
    let mut missing = vec![];
    for (prog, pkg) in [
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
        ("zstd", "zstd"),
        ("tar", "tar"),
    ]
    .into_iter()
    .chain(
        tools
            .iter()
            .any(|t| t.starts_with("rsync"))
            .then_some(("rsync", "rsync")),
    ) {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {prog}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            missing.push(pkg);
        }
    }
    missing.dedup();
    if !missing.is_empty() {
        bail!("the lab needs: apt-get install {}", missing.join(" "));
    }
    Ok(())
}

/// What a run wrote to results.json, read back.
#[derive(Deserialize)]
struct Report {
    command: String,
    profiles: Vec<Profile>,
    workloads: Vec<WorkloadInfo>,
    runs: Vec<Run>,
}

/// Writes results.md and the charts of `r` into `out`; returns the chart files.
fn render(out: &Path, r: &Report) -> Result<(String, Vec<String>)> {
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let md =
        markdown(&r.command, &r.profiles, &r.workloads, &r.runs) + &interactive::markdown(&r.runs);
    fs::write(out.join("results.md"), &md)?;
    let charts = chart::draw(out, &r.profiles, &r.workloads, &r.runs)?;
    Ok((md, charts))
}

pub fn run(a: Args) -> Result<ExitCode> {
    if let (true, Some(file)) = (a.vault, &a.from_json) {
        // The tables of an earlier `--vault` run's vault.json.
        let text =
            fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
        let r: vault::Report = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a lab's vault.json", file.display()))?;
        let md = vault::markdown(&r.rows, &r.workloads, &r.profiles);
        fs::create_dir_all(&a.out)?;
        fs::write(a.out.join("vault.md"), &md)?;
        print!("{md}");
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(file) = &a.from_json {
        let text =
            fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
        if let Some(r) = lookaside_json(&text) {
            // An earlier `--lookaside` run's lookaside.json: its tables and chart.
            let (stick, runs, note) = r?;
            fs::create_dir_all(&a.out)?;
            let md = note + &lookaside::markdown(&stick, &runs);
            fs::write(a.out.join("lookaside.md"), &md)?;
            let png = lookaside::chart(&a.out, &runs)?;
            print!("{md}");
            eprintln!(
                "lab: wrote {} ({})",
                a.out.display(),
                png.unwrap_or_default()
            );
            return Ok(ExitCode::SUCCESS);
        }
        let r: Report = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a lab's results.json", file.display()))?;
        let (md, charts) = render(&a.out, &r)?;
        print!("{md}");
        eprintln!("lab: wrote {} ({})", a.out.display(), charts.join(", "));
        return Ok(ExitCode::SUCCESS);
    }
    let tools: Vec<String> = if a.tools.is_empty() {
        TOOLS.iter().map(|t| t.to_string()).collect()
    } else {
        a.tools.clone()
    };
    if let Some(t) = tools.iter().find(|t| !TOOLS.contains(&t.as_str())) {
        bail!("no tool {t:?} (tools: {})", TOOLS.join(", "));
    }
    let mounts: Vec<&str> = match a.mounts.is_empty() {
        true => interactive::MOUNTS.to_vec(),
        false => a.mounts.iter().map(String::as_str).collect(),
    };
    if let Some(m) = mounts.iter().find(|m| !interactive::MOUNTS.contains(m)) {
        bail!(
            "no mount {m:?} (mounts: {})",
            interactive::MOUNTS.join(", ")
        );
    }
    let mut profiles: Vec<Profile> =
        if let (Some(down), Some(up), Some(rtt)) = (a.down, a.up, a.rtt) {
            vec![Profile {
                name: format!("custom {}/{} {rtt} ms", rate(down), rate(up)),
                down_bps: down,
                up_bps: up,
                rtt_ms: rtt,
                loss_pct: 0.0,
                ssh_session: None,
            }]
        } else if !a.profiles.is_empty() {
            a.profiles
                .iter()
                .map(|p| profile(p))
                .collect::<Result<_>>()?
        } else if a.quick {
            vec![profile("cable")?]
        } else {
            [
                "lan",
                "dsl",
                "cable",
                "t1",
                "cable@10",
                "cable@100",
                "cable@300",
            ]
            .iter()
            .map(|p| profile(p))
            .collect::<Result<_>>()?
        };
    check_tools(&tools)?;
    let work = tempfile::Builder::new().prefix("ferry-lab-").tempdir()?;
    let mut wls = vec![];
    let builtin: &[&str] = if a.quick {
        &["project-edit"]
    } else {
        workloads::BUILTIN
    };
    for name in builtin {
        wls.push(workloads::builtin(&work.path().join("builtin"), name)?);
    }
    if let Some(dir) = &a.workloads {
        wls.extend(workloads::from_dir(dir)?);
    }
    let mut mounted: Vec<&str> = match (a.interactive, a.quick) {
        (false, _) => vec![],
        (true, true) => vec!["doc-saves"],
        (true, false) => interactive::WORKLOADS.to_vec(),
    };
    if !a.only.is_empty() {
        wls.retain(|w| a.only.contains(&w.name));
        mounted.retain(|w| a.only.iter().any(|o| o == w));
        if wls.is_empty() && mounted.is_empty() {
            bail!("none of the workloads {:?} exist", a.only);
        }
    }
    let ns = match a.loss.filter(|l| *l > 0.0) {
        Some(loss) => {
            for p in &mut profiles {
                p.loss_pct = loss;
                p.name = format!("{}+{loss}%loss", p.name);
            }
            Some(netns::Netns::create(loss)?)
        }
        None => None,
    };
    let sshd = sshd::Sshd::start(&fs::canonicalize(work.path())?, ns.as_ref())?;
    let direct = Relay::start(link::Shape::UNLIMITED, sshd.addr)?;
    let lab = Lab {
        work: work.path().to_path_buf(),
        sshd,
        _netns: ns,
        direct,
        ferry: match &a.ferry {
            Some(f) => {
                std::fs::canonicalize(f).with_context(|| format!("--ferry {}", f.display()))?
            }
            None => std::env::current_exe()?,
        },
    };
    if a.multipath {
        return multipath_report(&lab, &a);
    }
    if a.dot {
        let started = Instant::now();
        let runs = dot::run(&lab)?;
        let md = dot::markdown(&runs);
        let failed = runs
            .iter()
            .filter(|r| r.status.starts_with("failed"))
            .count();
        let report = serde_json::json!({ "runs": runs });
        return experiment_out(&a, "dot", started, report, &md, failed);
    }
    if let Some(dir) = &a.lookaside {
        return lookaside_report(&lab, &a, dir);
    }
    if a.bullet {
        let started = Instant::now();
        let r = bullet::run(&lab, a.bullet_quick)?;
        let md = bullet::markdown(&r);
        let failed = r.rows.iter().filter(|x| x.status != "ok").count();
        let report = serde_json::to_value(&r)?;
        return experiment_out(&a, "bullet", started, report, &md, failed);
    }
    if a.vault {
        return vault_report(&lab, &a, &wls, profiles, work.path());
    }
    let mut infos = vec![];
    for w in &wls {
        infos.push(WorkloadInfo {
            name: w.name.clone(),
            old_bytes: workloads::size(&w.old).0,
            new_bytes: workloads::size(&w.new).0,
            new_files: workloads::size(&w.new).1,
            ideal_bytes: ideal(w, work.path())?,
        });
    }
    let started = Instant::now();
    let mut runs = vec![];
    for p in &mut profiles {
        let relay = Relay::start(p.shape(), lab.sshd.addr)?;
        p.ssh_session = Some(lab.ssh_floor(&relay)?);
        let p = &*p;
        // The RTT sweep runs the first workload only (it is about latency, not data).
        let sweep = p.name.contains('@');
        for (w, info) in wls
            .iter()
            .zip(&infos)
            .take(if sweep { 1 } else { wls.len() })
        {
            for tool in &tools {
                // scp (SFTP) pays a few round trips a file besides the bytes.
                let whole_secs = info.new_bytes as f64 * 8.0 / p.down_bps as f64
                    + info.new_files as f64 * 4.0 * p.rtt_ms / 1000.0;
                let r = if tool == "scp" && whole_secs > a.max_whole {
                    let why = format!("about {whole_secs:.0} s (--max-whole)");
                    Run::skipped(p, &w.name, tool, why)
                } else {
                    lab.run(tool, w, &relay, p)?
                };
                r.log();
                runs.push(r);
            }
        }
        if sweep {
            continue;
        }
        for name in &mounted {
            for tool in &mounts {
                let r = match mount_unavailable(tool) {
                    Some(why) => Run::skipped(p, name, tool, why),
                    None => lab.run_mounted(tool, name, &relay, p)?,
                };
                r.log();
                runs.push(r);
            }
        }
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let report = serde_json::json!({
        "command": command,
        "machine": machine(),
        "seconds": started.elapsed().as_secs_f64(),
        "profiles": profiles,
        "workloads": infos,
        "runs": runs,
    });
    fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    fs::write(
        a.out.join("results.json"),
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    let failed = runs
        .iter()
        .filter(|r| r.status.starts_with("failed"))
        .count();
    let (md, charts) = render(
        &a.out,
        &Report {
            command,
            profiles,
            workloads: infos,
            runs,
        },
    )?;
    let files = format!(
        "results.md, results.json{}",
        if charts.is_empty() {
            ", no charts: gnuplot not found".to_string()
        } else {
            format!(", {}", charts.join(", "))
        }
    );
    report_out(&a, &report, &md, &files, failed)
}

/// Prints a run's results (JSON with --json, else the markdown), says where `files` went, and
/// exits 1 if `failed` runs failed.
fn report_out(
    a: &Args,
    report: &serde_json::Value,
    md: &str,
    files: &str,
    failed: usize,
) -> Result<ExitCode> {
    if a.json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print!("{md}");
    }
    eprintln!("lab: results in {} ({files})", a.out.display());
    if failed > 0 {
        eprintln!("lab: {failed} run(s) failed");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs DOT's multi-path experiment and writes its results.
fn multipath_report(lab: &Lab, a: &Args) -> Result<ExitCode> {
    let started = Instant::now();
    let runs = multipath::run(lab)?;
    let md = multipath::markdown(&runs);
    let failed = runs
        .iter()
        .filter(|r| r.status.starts_with("failed"))
        .count();
    let report = serde_json::json!({ "runs": runs });
    experiment_out(a, "multipath", started, report, &md, failed)
}

/// Runs the lookaside paper's experiments and writes their results.
fn lookaside_report(lab: &Lab, a: &Args, dir: &Path) -> Result<ExitCode> {
    let started = Instant::now();
    let (stick, runs) = lookaside::run(
        lab,
        dir,
        &lookaside::Select {
            bandwidths: &a.bandwidths,
            figures: &a.figure,
            repeat: a.repeat,
        },
    )?;
    let md = lookaside::markdown(&stick, &runs);
    let failed = runs
        .iter()
        .filter(|r| r.status.starts_with("failed"))
        .count();
    let report = serde_json::json!({ "stick": stick, "runs": runs });
    fs::create_dir_all(&a.out)?;
    if let Some(png) = lookaside::chart(&a.out, &runs)? {
        eprintln!("lab: wrote {}", a.out.join(png).display());
    }
    experiment_out(a, "lookaside", started, report, &md, failed)
}

/// The stick, the runs and the note (markdown, if any) of a lookaside.json; `None` when the
/// text is not one (no "stick").
fn lookaside_json(text: &str) -> Option<Result<(String, Vec<lookaside::LkRun>, String)>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let stick = v.get("stick")?.as_str()?.to_string();
    let note = v
        .get("note")
        .and_then(|n| n.as_str())
        .map_or(String::new(), |n| format!("{n}\n\n"));
    Some(
        serde_json::from_value(v["runs"].clone())
            .map(|runs| (stick, runs, note))
            .context("the runs of a lookaside.json"),
    )
}

/// Writes an experiment's `report` (with the command, the machine and the time it took) and
/// `md` as NAME.json and NAME.md into --out, and reports them.
/// `--vault`: Figures 6 and 7 of the OceanStore paper.
fn vault_report(
    lab: &Lab,
    a: &Args,
    wls: &[Workload],
    profiles: Vec<Profile>,
    work: &Path,
) -> Result<ExitCode> {
    let started = Instant::now();
    let mut profiles = match a.profiles.is_empty() && a.down.is_none() {
        true => ["lan", "cable", "modem", "cellular"]
            .iter()
            .map(|p| profile(p))
            .collect::<Result<Vec<_>>>()?,
        false => profiles,
    };
    let mut infos = vec![];
    for w in wls {
        infos.push(WorkloadInfo {
            name: w.name.clone(),
            old_bytes: workloads::size(&w.old).0,
            new_bytes: workloads::size(&w.new).0,
            new_files: workloads::size(&w.new).1,
            ideal_bytes: ideal(w, work)?,
        });
    }
    let rows = vault::run(lab, wls, &mut profiles, a.max_whole)?;
    let md = vault::markdown(&rows, &infos, &profiles);
    let failed = rows
        .iter()
        .filter(|r| r.status.starts_with("failed"))
        .count();
    let report = serde_json::json!({ "rows": rows, "workloads": infos, "profiles": profiles });
    experiment_out(a, "vault", started, report, &md, failed)
}

fn experiment_out(
    a: &Args,
    name: &str,
    started: Instant,
    mut report: serde_json::Value,
    md: &str,
    failed: usize,
) -> Result<ExitCode> {
    report["command"] = std::env::args().collect::<Vec<_>>().join(" ").into();
    report["machine"] = machine();
    report["seconds"] = started.elapsed().as_secs_f64().into();
    fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    fs::write(a.out.join(format!("{name}.md")), md)?;
    fs::write(
        a.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    report_out(a, &report, md, &format!("{name}.md, {name}.json"), failed)
}

/// `len` incompressible bytes, the same for the same `seed`.
fn incompressible(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = crate::cmd::demo::Rng(seed);
    (0..len.div_ceil(8))
        .flat_map(|_| rng.next().to_le_bytes())
        .take(len)
        .collect()
}

/// A command's standard output; an error with its standard error if it fails.
fn output(cmd: &mut Command) -> Result<String> {
    let o = cmd
        .output()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    if !o.status.success() {
        bail!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// 1.5M, 384k.
fn rate(bps: u64) -> String {
    if bps >= 1_000_000 {
        format!("{}M", bps as f64 / 1e6)
    } else {
        format!("{}k", bps as f64 / 1e3)
    }
}

/// What the numbers were measured on.
fn machine() -> serde_json::Value {
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    serde_json::json!({
        "cpu": cpu,
        "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "kernel": kernel.trim(),
        "ferry": env!("CARGO_PKG_VERSION"),
    })
}

/// The results as markdown: one table per profile, a column per tool (total bytes both ways,
/// then seconds), and each tool's geometric mean of bytes over the near-ideal delta.
fn markdown(command: &str, profiles: &[Profile], infos: &[WorkloadInfo], runs: &[Run]) -> String {
    let tools: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|t| runs.iter().any(|r| r.tool == *t))
        .collect();
    let mut s = format!(
        "Measured by `{command}`. Bytes are counted at the emulated link, both ways, ssh \
         included; each cell is total bytes · seconds.\n"
    );
    for p in profiles {
        let here: Vec<&Run> = runs
            .iter()
            .filter(|r| r.profile == p.name && TOOLS.contains(&r.tool.as_str()))
            .collect();
        if here.is_empty() {
            continue;
        }
        s += &format!(
            "\n### {} ({} down, {} up, {} ms round trip{})\n\n",
            p.name,
            rate(p.down_bps),
            rate(p.up_bps),
            p.rtt_ms,
            if p.loss_pct > 0.0 {
                format!(", {} % of packets lost each way", p.loss_pct)
            } else {
                String::new()
            }
        );
        if let Some((up, down)) = p.ssh_session {
            s += &format!(
                "An ssh session that does nothing costs {} bytes here ({down} down, {up} up): \
                 every contender pays it, the near-ideal delta does not.\n\n",
                up + down
            );
        }
        s += &format!(
            "| workload | new size | near-ideal | {} |\n",
            tools.join(" | ")
        );
        s += &format!("|---|---:|---:|{}\n", "---:|".repeat(tools.len()));
        let mut logs = vec![(0.0f64, 0usize); tools.len()];
        for info in infos {
            let mut row = format!(
                "| {} | {} | {} |",
                info.name, info.new_bytes, info.ideal_bytes
            );
            let mut any = false;
            for (i, tool) in tools.iter().enumerate() {
                match here
                    .iter()
                    .find(|r| r.workload == info.name && r.tool == *tool)
                {
                    Some(r) if r.status == "ok" => {
                        let total = r.bytes_up + r.bytes_down;
                        row += &format!(" {} · {:.1} s |", total, r.seconds);
                        logs[i].0 += (total as f64 / info.ideal_bytes.max(1) as f64).ln();
                        logs[i].1 += 1;
                        any = true;
                    }
                    Some(r) => {
                        row += &format!(" {} |", r.status);
                        any = true;
                    }
                    None => row += " |",
                }
            }
            if any {
                s += &row;
                s += "\n";
            }
        }
        s += "| geometric mean ÷ near-ideal | | |";
        for (sum, n) in logs {
            if n > 0 {
                s += &format!(" {:.2} (of {n}) |", (sum / n as f64).exp());
            } else {
                s += " |";
            }
        }
        s += "\n";
    }
    s
}
