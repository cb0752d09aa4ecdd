//! DOT's multi-path experiment (Table 2 of the DOT paper): one file fetched over two emulated
//! links at once (`ferry get A --mirror B`, the same tree on both ends), with and without
//! request borrowing, against the faster link alone; then each link cut in the middle of a
//! transfer (closed, or for the mirror's also gone silent), which the other must finish.
//!
//! Both links reach the lab's sshd; a remote shell script maps the host names `a` and `b` to
//! them, each with a server state of its own (two servers of one tree). Each run starts with
//! an empty cache and destination, over new links; the servers were primed (their chunk
//! indexes hold the file) over an unshaped link, as servers that served it before.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::Serialize;

use super::link::{Relay, Shape};
use super::{rate, run_bounded, same_files, Lab};

/// The file fetched: incompressible, so every link carries all of it; 40 MB as in DOT's
/// experiment.
const FILE_BYTES: usize = 40_000_000;

/// A pair of links: the first is the one listings and recipes come from (and the faster).
struct Pair {
    a: Shape,
    b: Shape,
}

fn shape(mbit: f64, rtt_ms: u64) -> Shape {
    let bps = (mbit * 1e6) as u64;
    Shape {
        down_bps: bps,
        up_bps: bps,
        rtt: Duration::from_millis(rtt_ms),
    }
}

fn pairs() -> Vec<Pair> {
    [
        ((20.0, 10), (20.0, 10)),
        ((20.0, 10), (5.0, 30)),
        ((8.0, 30), (2.0, 30)),
        ((4.0, 30), (0.4, 30)),
    ]
    .into_iter()
    .map(|((am, ar), (bm, br))| Pair {
        a: shape(am, ar),
        b: shape(bm, br),
    })
    .collect()
}

/// One run's result.
#[derive(Serialize)]
pub struct MultiRun {
    pub link_a: String,
    pub link_b: String,
    /// single, multipath, no-borrowing, a-cut, b-cut.
    pub mode: String,
    pub seconds: f64,
    pub bytes_down_a: u64,
    pub bytes_down_b: u64,
    /// File bits per second over the sum of the rates of the links it used (`None` for a run
    /// with a link cut: it used one for part of the time).
    pub of_links: Option<f64>,
    pub status: String,
}

fn name(s: &Shape) -> String {
    format!("{}/{} ms", rate(s.down_bps), s.rtt.as_millis())
}

/// Runs the experiment; returns its runs (in the order run).
pub fn run(lab: &Lab) -> Result<Vec<MultiRun>> {
    let dir = lab.work.join("multipath");
    let src = dir.join("src");
    fs::create_dir_all(&src)?;
    fs::write(
        src.join("file"),
        super::incompressible(0x6d70_6174, FILE_BYTES),
    )?;
    // Prime both servers once, unshaped.
    let direct = lab.direct.port;
    let rsh = remote_shell(lab, &dir, direct, direct)?;
    for host in ["a", "b"] {
        if let Err(e) = run_bounded(&mut get(lab, &dir, &rsh, host, &[]), HOUR)? {
            bail!("priming server {host}: {e}");
        }
    }
    let mut runs = vec![];
    for p in pairs() {
        let mut modes = vec!["single", "multipath", "no-borrowing"];
        // The links cut once, on the pair of unequal fast links.
        if p.a.down_bps == 20_000_000 && p.b.down_bps == 5_000_000 {
            modes.extend(["b-cut", "b-silent", "a-cut"]);
        }
        for mode in modes {
            // New links for every run: a cut one stays dead.
            let a = Relay::start(p.a, lab.sshd.addr)?;
            let b = Relay::start(p.b, lab.sshd.addr)?;
            let rsh = remote_shell(lab, &dir, a.port, b.port)?;
            let r = one(lab, &dir, &rsh, &p, (&a, &b), mode)?;
            eprintln!(
                "lab: multipath {} + {} {:<12} {:>7.2} s  {} of the links  ({})",
                r.link_a,
                r.link_b,
                r.mode,
                r.seconds,
                percent(r.of_links),
                r.status
            );
            runs.push(r);
        }
    }
    Ok(runs)
}

const HOUR: Duration = Duration::from_secs(3600);

fn one(
    lab: &Lab,
    dir: &Path,
    rsh: &str,
    p: &Pair,
    (a, b): (&Relay, &Relay),
    mode: &str,
) -> Result<MultiRun> {
    let extra: &[&str] = match mode {
        "single" => &[],
        "no-borrowing" => &["--mirror", "b:SRC", "--no-borrowing"],
        _ => &["--mirror", "b:SRC"],
    };
    let mut cmd = get(lab, dir, rsh, "a", extra);
    // The expected time on both links; a link is cut at a third of it.
    let both = (FILE_BYTES * 8) as f64 / (p.a.down_bps + p.b.down_bps) as f64;
    let cut = match mode {
        "a-cut" => Some(a),
        "b-cut" | "b-silent" => Some(b),
        _ => None,
    };
    let silent = mode.ends_with("silent");
    a.take();
    b.take();
    let t = Instant::now();
    let status = std::thread::scope(|s| {
        if let Some(link) = cut {
            s.spawn(move || {
                std::thread::sleep(Duration::from_secs_f64(both / 3.0));
                match silent {
                    true => link.mute(),
                    false => link.cut(),
                }
            });
        }
        run_bounded(&mut cmd, HOUR)
    })?;
    let seconds = t.elapsed().as_secs_f64();
    let ((_, down_a), (_, down_b)) = (a.take(), b.take());
    let status = match status {
        Ok(()) => match same_files(&dir.join("src"), &dir.join("dst")) {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("failed: {e}"),
        },
        Err(e) => format!("failed: {e}"),
    };
    // The links the run could use: one alone, or both.
    let links = match mode {
        "single" => Some(p.a.down_bps),
        "multipath" | "no-borrowing" => Some(p.a.down_bps + p.b.down_bps),
        _ => None,
    };
    let of_links = links.map(|l| (FILE_BYTES * 8) as f64 / seconds / l as f64);
    Ok(MultiRun {
        link_a: name(&p.a),
        link_b: name(&p.b),
        mode: mode.into(),
        seconds,
        bytes_down_a: down_a,
        bytes_down_b: down_b,
        of_links,
        status,
    })
}

/// `ferry get -q -e RSH … HOST:SRC/ DST/` with an empty cache and destination; `b:SRC` in
/// `extra` names the tree on the second server.
fn get(lab: &Lab, dir: &Path, rsh: &str, host: &str, extra: &[&str]) -> Command {
    let (src, dst, cache) = (dir.join("src"), dir.join("dst"), dir.join("cache"));
    let _ = fs::remove_dir_all(&dst);
    let _ = fs::remove_dir_all(&cache);
    let mut c = Command::new(&lab.ferry);
    c.args(["-q", "get", "-e", rsh, "--remote-ferry"])
        .arg(&lab.ferry)
        .arg("--cache")
        .arg(&cache)
        .arg(format!("{host}:{}/", src.display()))
        .arg(format!("{}/", dst.display()));
    for e in extra {
        c.arg(e.replace("SRC", &format!("{}/", src.display())));
    }
    c
}

/// A remote shell taking host `a` through port `pa`, `b` through `pb`, each server with a
/// state of its own.
fn remote_shell(lab: &Lab, dir: &Path, pa: u16, pb: u16) -> Result<String> {
    let script = dir.join("rsh");
    let state = |s: &str| dir.join(format!("server-{s}")).display().to_string();
    let line = |host: &str, port: u16, s: &str| {
        format!(
            "  {host}) exec {} {} env XDG_CACHE_HOME={} \"$@\" ;;\n",
            lab.sshd.rsh(port),
            lab.sshd.host(),
            state(s)
        )
    };
    let body = format!(
        "#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n{}{}  *) echo \"no host $host\" >&2; exit 255 ;;\nesac\n",
        line("a", pa, "a"),
        line("b", pb, "b"),
    );
    fs::write(&script, body)?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    Ok(script.display().to_string())
}

/// The results as a markdown table.
pub fn markdown(runs: &[MultiRun]) -> String {
    let mut s = String::from(
        "| link a | link b | mode | seconds | of the links used | bytes down a | bytes down b | status |\n|---|---|---|---:|---:|---:|---:|---|\n",
    );
    for r in runs {
        s += &format!(
            "| {} | {} | {} | {:.2} | {} | {} | {} | {} |\n",
            r.link_a,
            r.link_b,
            r.mode,
            r.seconds,
            percent(r.of_links),
            r.bytes_down_a,
            r.bytes_down_b,
            r.status
        );
    }
    s
}

fn percent(x: Option<f64>) -> String {
    x.map_or("–".into(), |x| format!("{:.0} %", x * 100.0))
}
