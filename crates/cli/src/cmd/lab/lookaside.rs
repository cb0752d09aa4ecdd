//! The lookaside paper's experiments, over the lab's emulated links:
//!
//! - its Figure 5: the newest of five consecutive releases of a real project fetched at four
//!   bandwidths with an emulated USB stick holding that release, one, two, three or four
//!   releases older, or no stick; each with Ferry's chunk-level lookaside and with lookaside
//!   restricted to whole files (the paper's design);
//! - its Figure 7: one 41 MB incompressible file (the paper's suspended VM memory image) with the
//!   stick holding it, against no stick.
//!
//! Every run starts with an empty cache and destination, the stick mounted afresh (cold) and its
//! reads throttled to a stick's rate; the server was primed over an unshaped link (a server that
//! served the tree before). Time is the whole `ferry get`; bytes are those on the link.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::link::{Relay, Shape};
use super::stick::Stick;
use super::{run_bounded, same_files, Lab};
use crate::cmd::demo::Rng;

/// The paper's four bandwidths, with round trips of links of their kind.
const BANDWIDTHS: &[(&str, u64, u64)] = &[
    ("100 Mb/s", 100_000_000, 1),
    ("10 Mb/s", 10_000_000, 10),
    ("1 Mb/s", 1_000_000, 30),
    ("100 kb/s", 100_000, 30),
];

/// Figure 7's file: 41 MB, incompressible.
const IMAGE_BYTES: usize = 41_000_000;
/// A run expected to take longer than this (its bytes at the link's rate) is not run.
const LONGEST: Duration = Duration::from_secs(1800);

/// One run.
#[derive(Serialize, Deserialize)]
pub struct LkRun {
    /// "fig5" or "fig7".
    pub experiment: String,
    pub bandwidth: String,
    /// What the stick held: a release (and how many releases older than the one fetched), or
    /// "none".
    pub device: String,
    /// "chunks" (Ferry), "whole-files" (the paper's design), "none" (no lookaside).
    pub mode: String,
    /// The median of the runs' times (`--repeat`), each in `times`.
    pub seconds: Option<f64>,
    #[serde(default)]
    pub times: Vec<f64>,
    pub bytes_down: u64,
    pub bytes_up: u64,
    /// Chunk bytes the stick supplied.
    pub from_device: u64,
    pub status: String,
}

fn shape(bps: u64, rtt_ms: u64) -> Shape {
    Shape {
        down_bps: bps,
        up_bps: bps,
        rtt: Duration::from_millis(rtt_ms),
    }
}

/// Release directories under `dir`, oldest first (by version number).
fn releases(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    let key = |p: &PathBuf| -> Vec<u64> {
        p.file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect()
    };
    v.sort_by_key(key);
    if v.len() < 2 {
        bail!(
            "{} must hold at least two release directories (lab/workloads.sh makes five)",
            dir.display()
        );
    }
    Ok(v)
}

/// Runs both experiments with the releases under `dir`; returns the stick's description and
/// the runs.
/// Which cells to run, and how often each.
pub struct Select<'a> {
    /// Bandwidths by name without spaces (`100Mb/s`); empty: all.
    pub bandwidths: &'a [String],
    /// 5, 7 or both; empty: both.
    pub figures: &'a [u32],
    pub repeat: usize,
}

pub fn run(lab: &Lab, dir: &Path, select: &Select<'_>) -> Result<(String, Vec<LkRun>)> {
    let rels = releases(dir)?;
    let (only, repeat) = (select.bandwidths, select.repeat);
    let bandwidths: Vec<_> = BANDWIDTHS
        .iter()
        .filter(|(name, ..)| only.is_empty() || only.iter().any(|o| *o == name.replace(' ', "")))
        .collect();
    if bandwidths.is_empty() {
        bail!("none of the bandwidths {only:?} (100Mb/s, 10Mb/s, 1Mb/s, 100kb/s)");
    }
    let figure = |n: u32| select.figures.is_empty() || select.figures.contains(&n);
    if !figure(5) && !figure(7) {
        bail!("the figures are 5 and 7, not {:?}", select.figures);
    }
    let work = lab.work.join("lookaside");
    let src = work.join("src");
    fs::create_dir_all(&src)?;
    let newest = rels.last().expect("two at least");
    super::workloads::copy_tree(newest, &src.join("tree"))?;
    let image = random_file(IMAGE_BYTES);
    fs::write(src.join("memory.img"), &image)?;
    let bytes: u64 = rels
        .iter()
        .map(|r| super::workloads::size(r).0)
        .sum::<u64>()
        + IMAGE_BYTES as u64 * 2
        + (256 << 20);
    let stick = Stick::new(&work, bytes);
    let mut runs = vec![];
    // Prime the server, unshaped: it has cut everything once.
    prime(lab, &work)?;
    let name = |i: usize| {
        let r = rels[i]
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        match rels.len() - 1 - i {
            0 => format!("{r} (current)"),
            n => format!("{r} ({n} older)"),
        }
    };
    let tree = src.join("tree");
    let fig5 = if figure(5) { rels.len() } else { 0 };
    for i in (0..fig5).rev() {
        stick.fill(&rels[i])?;
        index(lab, stick.root())?;
        for &&(bw, bps, rtt) in &bandwidths {
            for mode in ["chunks", "whole-files"] {
                let r = repeated(repeat, || {
                    one(lab, &work, &stick, "fig5", &tree, shape(bps, rtt), mode)
                })?;
                runs.push(LkRun {
                    bandwidth: bw.into(),
                    device: name(i),
                    ..r
                });
                log(runs.last().expect("pushed"));
            }
        }
    }
    for &&(bw, bps, rtt) in bandwidths.iter().filter(|_| figure(5)) {
        let r = repeated(repeat, || {
            one(lab, &work, &stick, "fig5", &tree, shape(bps, rtt), "none")
        })?;
        runs.push(LkRun {
            bandwidth: bw.into(),
            device: "none".into(),
            ..r
        });
        log(runs.last().expect("pushed"));
    }
    if !figure(7) {
        return Ok((stick.describe(), runs));
    }
    // Figure 7: the stick holds the image.
    let img_dir = work.join("image");
    fs::create_dir_all(&img_dir)?;
    fs::write(img_dir.join("memory.img"), &image)?;
    stick.fill(&img_dir)?;
    index(lab, stick.root())?;
    let img = src.join("memory.img");
    for &&(bw, bps, rtt) in &bandwidths {
        for mode in ["chunks", "none"] {
            let expected = IMAGE_BYTES as f64 * 8.0 / bps as f64;
            let r = if mode == "none" && expected > LONGEST.as_secs_f64() {
                LkRun {
                    experiment: "fig7".into(),
                    bandwidth: String::new(),
                    device: String::new(),
                    mode: mode.into(),
                    seconds: None,
                    times: vec![],
                    bytes_down: 0,
                    bytes_up: 0,
                    from_device: 0,
                    status: format!("not run: about {expected:.0} s at the link's rate"),
                }
            } else {
                repeated(repeat, || {
                    one(lab, &work, &stick, "fig7", &img, shape(bps, rtt), mode)
                })?
            };
            runs.push(LkRun {
                bandwidth: bw.into(),
                device: if mode == "none" {
                    "none"
                } else {
                    "memory.img (current)"
                }
                .into(),
                ..r
            });
            log(runs.last().expect("pushed"));
        }
    }
    Ok((stick.describe(), runs))
}

fn random_file(n: usize) -> Vec<u8> {
    let mut rng = Rng(0x10c4_a51d);
    (0..n.div_ceil(8))
        .flat_map(|_| rng.next().to_le_bytes())
        .take(n)
        .collect()
}

fn log(r: &LkRun) {
    eprintln!(
        "lab: lookaside {} {:>9} {:<22} {:<11} {:>8} s  {:>10} B down  {:>10} B from the stick  ({})",
        r.experiment,
        r.bandwidth,
        r.device,
        r.mode,
        r.seconds.map_or("–".into(), |s| format!("{s:.2}")),
        r.bytes_down,
        r.from_device,
        r.status
    );
}

/// `ferry lookaside index` of the stick (the index goes onto it, as a prepared stick's).
fn index(lab: &Lab, root: &Path) -> Result<()> {
    let mut c = Command::new(&lab.ferry);
    c.args(["-q", "lookaside", "index"]).arg(root);
    match run_bounded(&mut c, Duration::from_secs(1800))? {
        Ok(()) => Ok(()),
        Err(e) => bail!("indexing the stick: {e}"),
    }
}

fn prime(lab: &Lab, work: &Path) -> Result<()> {
    for what in ["tree", "memory.img"] {
        let mut c = get(lab, work, lab.direct.port, what, &["--no-lookaside"]);
        if let Err(e) = run_bounded(&mut c, Duration::from_secs(3600))? {
            bail!("priming the server: {e}");
        }
    }
    Ok(())
}

/// `ferry get --json` of `what` (under src) through `port`, with an empty cache and
/// destination and no registered devices.
fn get(lab: &Lab, work: &Path, port: u16, what: &str, extra: &[&str]) -> Command {
    let (dst, state) = (work.join("dst"), work.join("state"));
    let _ = fs::remove_dir_all(&dst);
    let _ = fs::create_dir_all(&dst);
    let _ = fs::remove_dir_all(state.join("cache"));
    let mut c = lab.ferry_command(&["-q", "get", "--json"], port, &state);
    c.env("XDG_DATA_HOME", work.join("data"))
        .args(extra)
        .arg(format!(
            "{}:{}",
            lab.sshd.host(),
            work.join("src").join(what).display()
        ))
        .arg(dst.join(what));
    c
}

fn one(
    lab: &Lab,
    work: &Path,
    stick: &Stick,
    experiment: &str,
    what: &Path,
    link: Shape,
    mode: &str,
) -> Result<LkRun> {
    let name = what
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let root = stick.root().display().to_string();
    let extra: Vec<&str> = match mode {
        "chunks" => vec!["--lookaside", &root],
        "whole-files" => vec!["--lookaside", &root, "--lookaside-whole-files"],
        _ => vec!["--no-lookaside"],
    };
    stick.cold()?;
    let relay = Relay::start(link, lab.sshd.addr)?;
    let cmd = get(lab, work, relay.port, &name, &extra);
    let mut cmd = stick.throttled(&cmd);
    let out = work.join("get.json");
    relay.take();
    let t = Instant::now();
    let status = run_to(&mut cmd, &out, Duration::from_secs(7200))?;
    let seconds = t.elapsed().as_secs_f64();
    let (up, down) = relay.take();
    let json: serde_json::Value = fs::read_to_string(&out)
        .ok()
        .and_then(|s| serde_json::from_str(s.trim()).ok())
        .unwrap_or_default();
    let status = match status {
        Ok(()) => match same_files(what, &work.join("dst").join(&name)) {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("failed: {e}"),
        },
        Err(e) => format!("failed: {e}"),
    };
    Ok(LkRun {
        experiment: experiment.into(),
        bandwidth: String::new(),
        device: String::new(),
        mode: mode.into(),
        seconds: Some(seconds),
        times: vec![seconds],
        bytes_down: down,
        bytes_up: up,
        from_device: json["chunk_bytes_from_lookaside"].as_u64().unwrap_or(0),
        status,
    })
}

/// `run` `repeat` times: the last run, with every time and their median (the first failure
/// instead, if one fails).
fn repeated(repeat: usize, mut run: impl FnMut() -> Result<LkRun>) -> Result<LkRun> {
    let mut times = vec![];
    let mut last = None;
    for _ in 0..repeat.max(1) {
        let r = run()?;
        if r.status != "ok" {
            return Ok(r);
        }
        times.extend(r.seconds);
        last = Some(r);
    }
    let mut r = last.expect("ran once at least");
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    r.seconds = sorted.get(sorted.len() / 2).copied();
    r.times = times;
    Ok(r)
}

/// [`run_bounded`] with standard output to `out`.
fn run_to(cmd: &mut Command, out: &Path, limit: Duration) -> Result<Result<(), String>> {
    let f = fs::File::create(out)?;
    cmd.stdout(Stdio::from(f));
    super::run_bounded_keep_stdout(cmd, limit)
}

/// The results as markdown: Figure 5 as the paper lays it out (a row per bandwidth and stick,
/// time with each kind of lookaside and the win over none), then Figure 7.
pub fn markdown(device: &str, runs: &[LkRun]) -> String {
    let find = |exp: &str, bw: &str, dev: &str, mode: &str| {
        runs.iter()
            .find(|r| r.experiment == exp && r.bandwidth == bw && r.device == dev && r.mode == mode)
    };
    let secs = |r: Option<&LkRun>| {
        r.and_then(|r| r.seconds.filter(|_| r.status == "ok"))
            .map_or("–".to_string(), |s| match s < 10.0 {
                true => format!("{s:.2}"),
                false => format!("{s:.1}"),
            })
    };
    let ok = |r: Option<&LkRun>| r.filter(|r| r.status == "ok").and_then(|r| r.seconds);
    let win = |r: Option<&LkRun>, base: Option<&LkRun>| match (ok(r), ok(base)) {
        (Some(s), Some(b)) => format!("{:+.1} %", (b - s) / b * 100.0),
        _ => "–".into(),
    };
    let repeat = runs.iter().map(|r| r.times.len()).max().unwrap_or(1);
    // The bandwidths run (`--bandwidth`), in the paper's order.
    let ran: Vec<&str> = BANDWIDTHS
        .iter()
        .map(|b| b.0)
        .filter(|bw| runs.iter().any(|r| r.bandwidth == *bw))
        .collect();
    let mut s = format!("The stick: {device}.\n\n");
    if repeat > 1 {
        s += &format!("Each time is the median of {repeat} runs (all are in the JSON).\n\n");
    }
    if runs.iter().any(|r| r.experiment == "fig5") {
        s += "### Figure 5: the newest release, the stick holding an older one\n\n\
             | bandwidth | stick holds | no lookaside s | chunks s | win | whole files s | win | bytes down (chunks) | from the stick (chunks) |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|\n";
        let devices = fig5_devices(runs);
        for bw in &ran {
            let base = find("fig5", bw, "none", "none");
            for dev in &devices {
                let c = find("fig5", bw, dev, "chunks");
                let w = find("fig5", bw, dev, "whole-files");
                s += &format!(
                    "| {bw} | {dev} | {} | {} | {} | {} | {} | {} | {} |\n",
                    secs(base),
                    secs(c),
                    win(c, base),
                    secs(w),
                    win(w, base),
                    c.map_or(0, |r| r.bytes_down),
                    c.map_or(0, |r| r.from_device),
                );
            }
        }
    }
    if runs.iter().any(|r| r.experiment == "fig7") {
        s += "\n### Figure 7: a 41 MB memory image, the stick holding it\n\n\
              | bandwidth | no lookaside s | lookaside s | win | bytes down (lookaside) |\n|---|---:|---:|---:|---:|\n";
        for bw in &ran {
            let base = find("fig7", bw, "none", "none");
            let with = find("fig7", bw, "memory.img (current)", "chunks");
            let base_s = match base {
                Some(b) if b.seconds.is_none() => b.status.clone(),
                b => secs(b),
            };
            s += &format!(
                "| {bw} | {base_s} | {} | {} | {} |\n",
                secs(with),
                win(with, base),
                with.map_or(0, |r| r.bytes_down)
            );
        }
    }
    let failed: Vec<&LkRun> = runs
        .iter()
        .filter(|r| r.status.starts_with("failed"))
        .collect();
    for r in failed {
        s += &format!(
            "\nFailed: {} {} {} {}: {}\n",
            r.experiment, r.bandwidth, r.device, r.mode, r.status
        );
    }
    s
}

/// Figure 5 as the paper draws it: for each bandwidth, the time with a stick of each age
/// relative to no lookaside (under 1: a win), chunk-level and whole-file lookaside side by
/// side. Written as lookaside.png into `out` when gnuplot is installed; `None` otherwise, or
/// when the runs hold no Figure 5.
pub fn chart(out: &Path, runs: &[LkRun]) -> Result<Option<String>> {
    let ok = |bw: &str, dev: &str, mode: &str| {
        runs.iter()
            .find(|r| {
                r.experiment == "fig5"
                    && r.bandwidth == bw
                    && r.device == dev
                    && r.mode == mode
                    && r.status == "ok"
            })
            .and_then(|r| r.seconds)
    };
    let devices = fig5_devices(runs);
    let mut data = String::new();
    let mut panels = vec![];
    for &(bw, _, _) in BANDWIDTHS {
        let Some(base) = ok(bw, "none", "none") else {
            continue;
        };
        data += &format!("# {bw}: stick, chunks, whole files\n");
        for dev in &devices {
            // "1.41.0 (1 older)" → "1 older"
            let label = dev
                .split_once('(')
                .map_or(*dev, |(_, l)| l.trim_end_matches(')'));
            let rel = |mode| ok(bw, dev, mode).map_or("NaN".into(), |s| format!("{:.4}", s / base));
            data += &format!("\"{label}\" {} {}\n", rel("chunks"), rel("whole-files"));
        }
        data += "\n\n";
        panels.push(bw);
    }
    if panels.is_empty() {
        return Ok(None);
    }
    let mut script = format!(
        "set multiplot layout {},2 title \"The lookaside paper's Figure 5: time with a stick, relative to none\"\n\
         set style data histogram\nset style histogram clustered gap 1\n\
         set style fill solid 0.8 border -1\nset yrange [0:1.6]\nset grid ytics\n\
         set xtics rotate by -30\nset key top left\n",
        panels.len().div_ceil(2)
    );
    for (i, bw) in panels.iter().enumerate() {
        script += &format!(
            "set title '{bw}'\nset ylabel '{}'\n\
             plot 'lookaside.dat' index {i} using 2:xtic(1) title 'chunks', '' index {i} using 3 title 'whole files', 1 notitle lc rgb 'black'\n",
            if i == 0 { "time / no lookaside" } else { "" }
        );
    }
    script += "unset multiplot\n";
    super::chart::plot_if_found(out, "lookaside", &script, &data)
}

/// The sticks of Figure 5's runs, in the order first run.
fn fig5_devices(runs: &[LkRun]) -> Vec<&str> {
    let mut devices: Vec<&str> = vec![];
    for r in runs
        .iter()
        .filter(|r| r.experiment == "fig5" && r.device != "none")
    {
        if !devices.contains(&r.device.as_str()) {
            devices.push(&r.device);
        }
    }
    devices
}
