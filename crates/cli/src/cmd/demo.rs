//! `ferry demo`: the file service end to end on a built-in project, with nothing to set up.
//!
//! A real server process (`ferry serve --stdio`) exports a generated source tree; a client in
//! this process fetches it, the server side changes, the client fetches again, edits and
//! uploads, and finally re-syncs an unchanged tree. Each step is checked (both trees equal)
//! and its bytes on the wire are set next to what copying whole files would have cost.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ferry_chunk::ChunkerSpec;
use ferry_fs::{PutOptions, Session, Sources, Traffic};
use ferry_proto::WirePath;
use ferry_store::{LocalStore, Options};
use serde_json::json;

use crate::util::human;

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object per step.
    #[arg(long)]
    json: bool,
    /// Work in DIR (kept afterwards) instead of a temporary directory.
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
}

const WORDS: &[&str] = &[
    "buffer", "chunk", "client", "commit", "cursor", "digest", "entry", "error", "frame", "handle",
    "index", "lease", "length", "offset", "owner", "packet", "path", "reader", "recipe", "reply",
    "request", "server", "session", "state", "store", "stream", "table", "token", "update",
    "value", "window", "writer",
];

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn word(&mut self) -> &'static str {
        WORDS[(self.next() % WORDS.len() as u64) as usize]
    }
}

/// A source file's worth of plausible code, about `lines` lines.
pub(crate) fn source(rng: &mut Rng, lines: usize) -> String {
    let mut s = String::new();
    for i in 0..lines {
        match i % 6 {
            0 => s.push_str(&format!(
                "pub fn {}_{}({}: &mut {}) -> Result<usize, Error> {{\n",
                rng.word(),
                rng.word(),
                rng.word(),
                rng.word()
            )),
            5 => s.push_str("}\n\n"),
            _ => s.push_str(&format!(
                "    let {} = {}.{}({}, {});\n",
                rng.word(),
                rng.word(),
                rng.word(),
                rng.next() % 4096,
                rng.word()
            )),
        }
    }
    s
}

/// The built-in project: 240 source files in 12 directories (about 2.5 MB).
pub(crate) fn make_project(root: &Path) -> Result<()> {
    let mut rng = Rng(0x5eed_f022);
    for d in 0..12 {
        let dir = root.join(format!("src/module{d:02}"));
        fs::create_dir_all(&dir)?;
        for f in 0..20 {
            let lines = 100 + (rng.next() % 400) as usize;
            fs::write(dir.join(format!("file{f:02}.rs")), source(&mut rng, lines))?;
        }
    }
    fs::write(root.join("README"), "The demo project.\n")?;
    Ok(())
}

/// Inserts a line in the middle of a file.
pub(crate) fn edit(path: &Path, line: &str) -> Result<u64> {
    let mut text = fs::read_to_string(path)?;
    let mid = text[..text.len() / 2].rfind('\n').map_or(0, |i| i + 1);
    text.insert_str(mid, line);
    fs::write(path, &text)?;
    Ok(text.len() as u64)
}

/// Every regular file under `root`, by relative path, with its bytes (not the server's own
/// `.ferry-trash`).
pub(crate) fn snapshot(root: &Path) -> Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let walk = walkdir::WalkDir::new(root).into_iter();
    for e in walk.filter_entry(|e| e.file_name() != ".ferry-trash") {
        let e = e?;
        if e.file_type().is_file() {
            out.insert(
                e.path().strip_prefix(root)?.to_path_buf(),
                fs::read(e.path())?,
            );
        }
    }
    Ok(out)
}

fn same(a: &Path, b: &Path) -> Result<()> {
    if snapshot(a)? != snapshot(b)? {
        bail!("{} and {} differ after the step", a.display(), b.display());
    }
    Ok(())
}

struct Demo {
    work: PathBuf,
    server: PathBuf,
    laptop: PathBuf,
    cache: LocalStore,
    json: bool,
}

impl Demo {
    /// A session with a fresh server process, as a user's command would have.
    fn session(&self) -> Result<Session> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["serve", "--stdio"])
            .arg(&self.server)
            .env("XDG_CACHE_HOME", self.work.join("server-cache"));
        Ok(Session::command(cmd)?)
    }

    fn get(&self) -> Result<Traffic> {
        let mut s = self.session()?;
        let cold = ferry_store::ChunkStore::is_empty(&self.cache)?;
        let src = Sources {
            borrowing: true,
            cache: &self.cache,
            chunker: ChunkerSpec::default(),
            delete: true,
            dry_run: false,
            progress: None,
            lookaside: None,
            cold,
            ranges: cold,
            short_ids: true,
            cache_file_max: u64::MAX,
            mirrors: None,
        };
        let mut stats = ferry_fs::GetStats::default();
        ferry_fs::get(
            &mut s.conn,
            &WirePath::default(),
            &self.laptop,
            &src,
            &mut stats,
        )?;
        let t = s.conn.traffic();
        s.close()?;
        Ok(t)
    }

    fn put(&self) -> Result<Traffic> {
        let mut s = self.session()?;
        let opts = PutOptions {
            chunker: ChunkerSpec::default(),
            delete: true,
            dry_run: false,
            progress: None,
            cache: Some(&self.cache),
            fewer_round_trips: false,
            stat_after: None,
            sync_after: false,
        };
        let mut stats = ferry_fs::PutStats::default();
        ferry_fs::put(
            &mut s.conn,
            &self.laptop,
            &WirePath::default(),
            &opts,
            &mut stats,
        )?;
        let t = s.conn.traffic();
        s.close()?;
        Ok(t)
    }

    fn report(&self, step: &str, whole: u64, t: &Traffic, secs: f64) -> Result<()> {
        same(&self.server, &self.laptop)?;
        let wire = t.bytes_sent + t.bytes_received;
        if self.json {
            println!(
                "{}",
                json!({"step": step, "bytes_sent": t.bytes_sent, "bytes_received": t.bytes_received,
                       "whole_files_bytes": whole, "round_trips": t.round_trips, "seconds": secs,
                       "verified": true})
            );
        } else {
            let ratio = if wire > 0 && whole > 0 {
                format!("{:.1}×", whole as f64 / wire as f64)
            } else {
                "-".into()
            };
            println!(
                "{step:<44} {:>10} {:>10} {:>7} {:>6}",
                human(wire),
                human(whole),
                ratio,
                t.round_trips
            );
        }
        Ok(())
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let _tmp;
    let work = match &a.keep {
        Some(d) => {
            fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            _tmp = tempfile::tempdir()?;
            _tmp.path().to_path_buf()
        }
    };
    let demo = Demo {
        server: work.join("server/project"),
        laptop: work.join("laptop/project"),
        cache: LocalStore::open_or_create(work.join("laptop-cache"), Options::default())
            .context("cannot make the demo's cache")?,
        json: a.json,
        work,
    };
    if demo.server.exists() || demo.laptop.exists() {
        bail!(
            "{} already holds a demo; remove it or pick another directory",
            demo.work.display()
        );
    }
    make_project(&demo.server)?;
    fs::create_dir_all(demo.laptop.parent().expect("has a parent"))?;
    let total: u64 = snapshot(&demo.server)?
        .values()
        .map(|v| v.len() as u64)
        .sum();
    if !a.json {
        println!(
            "A server process exports a {} project of 241 files ({}); the client fetches,\n\
             edits and uploads over its standard input and output, as it would over ssh.\n",
            human(total),
            demo.server.display()
        );
        println!(
            "{:<44} {:>10} {:>10} {:>7} {:>6}",
            "step", "wire", "whole", "saved", "RTTs"
        );
    }

    let t = Instant::now();
    let tr = demo.get()?;
    demo.report(
        "1. first fetch, empty cache",
        total,
        &tr,
        t.elapsed().as_secs_f64(),
    )?;

    // The server side changes: five files edited, one renamed, one added.
    let src = demo.server.join("src");
    let mut whole = 0;
    for d in 0..5 {
        let p = src.join(format!("module{d:02}/file07.rs"));
        whole += edit(&p, "    // reviewed: keep the lease short here\n")?;
    }
    fs::rename(
        src.join("module05/file03.rs"),
        src.join("module05/renamed.rs"),
    )?;
    whole += fs::metadata(src.join("module05/renamed.rs"))?.len();
    let mut rng = Rng(42);
    let added = source(&mut rng, 300);
    fs::write(src.join("module06/new.rs"), &added)?;
    whole += added.len() as u64;
    let t = Instant::now();
    let tr = demo.get()?;
    demo.report(
        "2. server: 5 edits, 1 rename, 1 new file",
        whole,
        &tr,
        t.elapsed().as_secs_f64(),
    )?;

    // The laptop edits a file and uploads.
    let whole = edit(
        &demo.laptop.join("src/module09/file11.rs"),
        "    let fixed = true;\n",
    )?;
    let t = Instant::now();
    let tr = demo.put()?;
    demo.report(
        "3. laptop: 1 edit, uploaded",
        whole,
        &tr,
        t.elapsed().as_secs_f64(),
    )?;

    let t = Instant::now();
    let tr = demo.get()?;
    demo.report(
        "4. nothing changed, fetch again",
        0,
        &tr,
        t.elapsed().as_secs_f64(),
    )?;
    if !a.json {
        println!(
            "\nwire: bytes both ways at the link; whole: the changed files' sizes (what copying\n\
             whole files would send); every step verified: the two trees are identical."
        );
    }
    Ok(ExitCode::SUCCESS)
}
