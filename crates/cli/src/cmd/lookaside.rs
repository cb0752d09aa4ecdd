//! `ferry lookaside`: the devices fetches look aside to (USB sticks, DVDs, old backups, copies
//! of a tree), searched for chunks before the network; and the options of `get`, `sync` and
//! `mount` that use them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

use anyhow::{bail, Context, Result};
use ferry_chunk::ChunkerSpec;
use ferry_format::HashAlg;
use ferry_lookaside::{DeviceIndex, Kept, Lookaside, Matching, Registry, Supplied, Unusable};
use serde_json::json;

use ferry_fs::RemoteSpec;

use super::remote::{cache_root, Chunking, Rsh};
use crate::util::{human, Ui};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Search DIR for chunks on every fetch, after the devices added before it. Without an
    /// index, DIR is indexed in the background. A provider instead: `ferry://HOST[:PORT]`, a
    /// daemon of yours on the LAN (`ferry daemon`, this machine's key authorized there), or
    /// `HOST:PATH`, a tree on a machine with ferry, reached with the remote shell (indexed
    /// there now, and brought up to date by each fetch); both asked for chunks by id beside the
    /// server.
    Add {
        dir: PathBuf,
        /// How a `HOST:PATH` provider is reached (fetches reach it with their own `-e`).
        #[command(flatten)]
        rsh: Rsh,
    },
    /// Stop searching DIR.
    Remove { dir: PathBuf },
    /// The devices in search order: state, index, and what each supplied so far.
    List {
        /// One JSON object per device.
        #[arg(long)]
        json: bool,
    },
    /// Stop searching every device.
    Clear,
    /// Index DIR now (onto it, or into the cache when it cannot be written): later fetches
    /// cost no scan. Files unchanged since the last index are not read again.
    Index {
        dir: PathBuf,
        /// Keep the index in the user's cache, never on the device.
        #[arg(long)]
        to_cache: bool,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
        /// Run quietly, once at a time per device (how a fetch indexes a device in the
        /// background).
        #[arg(long, hide = true)]
        background: bool,
        #[command(flatten)]
        chunking: Chunking,
    },
    /// Read every file DIR's index names again and report what the index claims wrongly
    /// (exit 1 if anything).
    Verify {
        dir: PathBuf,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
}

/// The lookaside options of commands that fetch.
#[derive(clap::Args, Clone, Default)]
pub struct UseArgs {
    /// Do not search lookaside devices this time.
    #[arg(long)]
    no_lookaside: bool,
    /// Also search DIR for chunks this time (before the devices added with `ferry lookaside
    /// add`; indexed first if it has no index). Repeatable.
    #[arg(long, value_name = "DIR")]
    lookaside: Vec<PathBuf>,
    /// Match only files whose whole content is the file wanted (the lookaside paper's design):
    /// for experiments (`ferry lab --lookaside`).
    #[arg(long, hide = true)]
    lookaside_whole_files: bool,
}

/// The devices a fetch uses, and which of them are registered (their supplies are counted);
/// and the registered providers (`ferry://HOST:PORT`, `HOST:PATH`).
pub struct InUse {
    pub lookaside: std::sync::Arc<Lookaside>,
    registered: Vec<PathBuf>,
    pub providers: Vec<String>,
}

/// A provider as the registry names it, if `s` is one: `ferry://HOST[:PORT]` (a daemon) or
/// `HOST:PATH` (ferry over the remote shell).
fn provider(s: &str) -> Option<Result<String>> {
    let Some(ep) = ferry_net::Endpoint::parse(s) else {
        let spec = RemoteSpec::parse(s)?;
        let path = match spec.path.trim_end_matches('/') {
            "" => "/",
            p => p,
        };
        return Some(Ok(format!("{}:{path}", spec.host)));
    };
    Some(match ep {
        Ok(ep) if ep.path.is_empty() => Ok(format!("ferry://{}", ep.host_port())),
        Ok(_) => Err(anyhow::anyhow!(
            "{s}: a daemon provider is named without a path (ferry://HOST[:PORT]); a tree served over ssh is HOST:PATH"
        )),
        Err(e) => Err(e.into()),
    })
}

impl InUse {
    /// A session with each provider, as sources asked for chunks by id (one that cannot be
    /// reached is said so and left out).
    pub fn provider_sessions(&self, rsh: &Rsh) -> Vec<ferry_fs::Mirror> {
        self.providers
            .iter()
            .filter_map(|p| {
                let session = match ferry_net::Endpoint::parse(p) {
                    Some(ep) => super::remote::tls_session(&ep.ok()?),
                    None => rsh.provider_session(&RemoteSpec::parse(p)?),
                };
                session
                    .map_err(|e| {
                        eprintln!("ferry: lookaside provider {p}: {e:#}; going on without it")
                    })
                    .ok()
                    .map(|session| ferry_fs::Mirror {
                        session,
                        root: "".into(),
                        of: "".into(),
                        name: p.clone(),
                        by_id: true,
                    })
            })
            .collect()
    }
}

impl UseArgs {
    /// Loads the devices to search with chunker `spec`: those named for this run (indexed now
    /// if they have no index), then the registered ones (indexed in the background if they have
    /// none; they sit this fetch out). Devices that cannot be used are said so and left out.
    pub fn load(&self, spec: &ChunkerSpec) -> Result<InUse> {
        let mut roots = vec![];
        for d in &self.lookaside {
            let root = device_root(d)?;
            ensure_index(&root, spec)?;
            roots.push(root);
        }
        let all: Vec<PathBuf> = match self.no_lookaside {
            true => vec![],
            false => registry().list()?.into_iter().map(|e| e.path).collect(),
        };
        // Devices are absolute paths; providers (`ferry://…`, `HOST:PATH`) are not.
        let (registered, providers): (Vec<PathBuf>, Vec<PathBuf>) =
            all.into_iter().partition(|p| p.is_absolute());
        let providers = providers
            .into_iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        for r in &registered {
            if !roots.contains(r) {
                roots.push(r.clone());
            }
        }
        let matching = match self.lookaside_whole_files {
            true => Matching::WholeFiles,
            false => Matching::Chunks,
        };
        let (lookaside, unusable) =
            Lookaside::load(&roots, &index_cache(), spec, HashAlg::Blake3, matching);
        for (root, why) in unusable {
            match why {
                Unusable::NoIndex | Unusable::OtherChunker(_) => {
                    tracing::info!(
                        "lookaside {}: {why}; indexing it in the background",
                        root.display()
                    );
                    index_in_background(&root, spec);
                }
                why => eprintln!(
                    "ferry: lookaside {}: {why}; going on without it",
                    root.display()
                ),
            }
        }
        Ok(InUse {
            lookaside: std::sync::Arc::new(lookaside),
            registered,
            providers,
        })
    }
}

impl InUse {
    /// Adds what the registered devices, and the providers among `sources` (a fetch's), supplied
    /// to their counts.
    pub fn count(&self, sources: &[ferry_fs::SourceStats]) -> Result<()> {
        let mut supplied: Vec<(PathBuf, Supplied)> = self
            .lookaside
            .supplied()
            .into_iter()
            .filter(|(p, s)| self.registered.contains(p) && *s != Supplied::default())
            .collect();
        // And what the providers supplied, as the engine counted it.
        for s in sources.iter().filter(|s| self.providers.contains(&s.name)) {
            supplied.push((
                PathBuf::from(&s.name),
                Supplied {
                    requests: s.requests,
                    chunks: s.chunks,
                    bytes: s.bytes,
                    misses: s.misses,
                    rejected: s.rejected,
                    ..Supplied::default()
                },
            ));
        }
        registry()
            .count(&supplied)
            .context("cannot count what lookaside devices supplied")
    }
}

fn registry() -> Registry {
    Registry::new(ferry_net::data_dir())
}

/// Where indexes of devices that cannot hold one are kept.
fn index_cache() -> PathBuf {
    cache_root().join("lookaside")
}

/// A device's root as the registry names it: absolute, symlinks resolved.
fn device_root(dir: &Path) -> Result<PathBuf> {
    let root =
        std::fs::canonicalize(dir).with_context(|| format!("cannot use {}", dir.display()))?;
    if !root.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    Ok(root)
}

/// Whether `root` has an index cut with `spec`.
fn indexed(root: &Path, spec: &ChunkerSpec) -> bool {
    matches!(
        ferry_lookaside::load(root, &index_cache()),
        Ok(Some((i, _))) if i.chunker == ferry_lookaside::ChunkerMark::of(spec)
    )
}

/// Indexes `root` now unless it has an index cut with `spec`.
fn ensure_index(root: &Path, spec: &ChunkerSpec) -> Result<()> {
    if indexed(root, spec) {
        return Ok(());
    }
    index(root, spec, false, &Ui { quiet: true }).map(drop)
}

/// Starts `ferry lookaside index --background DIR` on its own, not waited for.
fn index_in_background(root: &Path, spec: &ChunkerSpec) {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["lookaside", "index", "--background"])
        .arg(format!("--chunk-size={}", spec.avg))
        .arg(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    if let Err(e) = cmd.spawn() {
        tracing::warn!("cannot index {} in the background: {e}", root.display());
    }
}

/// Indexes `root` (reusing its earlier index for unchanged files) and saves the index.
fn index(
    root: &Path,
    spec: &ChunkerSpec,
    to_cache: bool,
    ui: &Ui,
) -> Result<(DeviceIndex, ferry_lookaside::ScanReport, Kept)> {
    let cache = index_cache();
    let old = match ferry_lookaside::load(root, &cache) {
        Ok(old) => old.map(|(i, _)| i),
        Err(e) => {
            tracing::warn!("{e}; indexing from scratch");
            None
        }
    };
    let bar = ui.bytes_bar(0, "indexing");
    bar.set_length(old.as_ref().map_or(0, |o| o.bytes()));
    let (index, report) = ferry_lookaside::scan(root, spec, HashAlg::Blake3, old.as_ref(), &|n| {
        if bar.position() + n > bar.length().unwrap_or(0) {
            bar.set_length(bar.position() + n);
        }
        bar.inc(n)
    })
    .with_context(|| format!("cannot index {}", root.display()))?;
    bar.finish_and_clear();
    let kept = ferry_lookaside::save(root, &cache, &index, to_cache)
        .with_context(|| format!("cannot save the index of {}", root.display()))?;
    Ok((index, report, kept))
}

pub fn run(a: Args, ui: &Ui) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match a.command {
        Cmd::Add { dir, rsh } => {
            if let Some(p) = provider(&dir.to_string_lossy()) {
                let p = p?;
                if let Some(spec) = RemoteSpec::parse(&p).filter(|_| !p.starts_with("ferry://")) {
                    // Indexed there now, so the first fetch finds its chunks.
                    if !ui.quiet {
                        eprintln!(
                            "ferry: indexing {p} there (files indexed before are not read again)"
                        );
                    }
                    drop(rsh.provider_session(&spec)?);
                }
                if !registry().add(Path::new(&p))? {
                    writeln!(out, "{p} is already a lookaside provider")?;
                } else if p.starts_with("ferry://") {
                    writeln!(
                        out,
                        "added {p}, a provider: its daemon must authorize this machine's key (`ferry key authorize` there)"
                    )?;
                } else {
                    writeln!(
                        out,
                        "added {p}, a provider over the remote shell (indexed there; each fetch brings its index up to date)"
                    )?;
                }
                return Ok(ExitCode::SUCCESS);
            }
            let root = device_root(&dir)?;
            if !registry().add(&root)? {
                writeln!(out, "{} is already a lookaside device", root.display())?;
                return Ok(ExitCode::SUCCESS);
            }
            let spec = rsh.chunker();
            if indexed(&root, &spec) {
                writeln!(out, "added {}", root.display())?;
            } else {
                index_in_background(&root, &spec);
                writeln!(
                    out,
                    "added {}; indexing it in the background (`ferry lookaside list` shows when it is ready)",
                    root.display()
                )?;
            }
        }
        Cmd::Remove { dir } => {
            if let Some(p) = provider(&dir.to_string_lossy()) {
                let p = p?;
                if !registry().remove(Path::new(&p))? {
                    bail!("{p} is not a lookaside provider (see `ferry lookaside list`)");
                }
                writeln!(out, "removed {p}")?;
                return Ok(ExitCode::SUCCESS);
            }
            let root = std::fs::canonicalize(&dir)
                .or_else(|_| std::path::absolute(&dir))
                .with_context(|| format!("cannot name {}", dir.display()))?;
            if !registry().remove(&root)? {
                bail!(
                    "{} is not a lookaside device (see `ferry lookaside list`)",
                    dir.display()
                );
            }
            writeln!(out, "removed {}", root.display())?;
        }
        Cmd::Clear => {
            let n = registry().clear()?;
            writeln!(out, "removed {n} lookaside devices")?;
        }
        Cmd::List { json } => list(&mut out, json)?,
        Cmd::Index {
            dir,
            to_cache,
            json,
            background,
            chunking,
        } => {
            let root = device_root(&dir)?;
            let quiet = Ui {
                quiet: ui.quiet || background || json,
            };
            let _lock = match background {
                true => match lock_indexing(&root)? {
                    Some(l) => Some(l),
                    // Another is at it.
                    None => return Ok(ExitCode::SUCCESS),
                },
                false => None,
            };
            let (index, r, kept) = index(&root, &chunking.spec(), to_cache, &quiet)?;
            let (place, at) = match &kept {
                Kept::OnDevice(p) => ("device", p),
                Kept::InCache(p) => ("cache", p),
            };
            if json {
                writeln!(
                    out,
                    "{}",
                    json!({"device": root, "index": at, "kept": place, "files": r.files, "bytes": r.bytes,
                           "chunks": index.chunks(), "reused": r.reused, "hashed": r.hashed,
                           "unreadable": r.unreadable, "skipped": r.skipped})
                )?;
            } else if !background {
                writeln!(
                    out,
                    "indexed {}: {} files ({}), {} chunks; {} unchanged, {} read; {} unreadable, {} not regular files; index in {}",
                    root.display(),
                    r.files,
                    human(r.bytes),
                    index.chunks(),
                    r.reused,
                    human(r.hashed),
                    r.unreadable,
                    r.skipped,
                    at.display()
                )?;
            }
        }
        Cmd::Verify { dir, json } => return verify(&mut out, &dir, json),
    }
    Ok(ExitCode::SUCCESS)
}

/// Takes the lock that keeps two background indexings of one device apart: `None` when
/// another process holds it.
fn lock_indexing(root: &Path) -> Result<Option<std::fs::File>> {
    let cache = index_cache();
    std::fs::create_dir_all(&cache)?;
    let name = ferry_lookaside::cache_path(root, &cache)?.with_extension("lock");
    let f = std::fs::File::create(&name)?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn list(out: &mut impl Write, json: bool) -> Result<()> {
    let entries = registry().list()?;
    if entries.is_empty() && !json {
        writeln!(
            out,
            "no lookaside devices (add one with `ferry lookaside add DIR`)"
        )?;
    }
    for (n, e) in entries.iter().enumerate() {
        let daemon = e.path.to_string_lossy().starts_with("ferry://");
        let (state, index) = match ferry_lookaside::load(&e.path, &index_cache()) {
            _ if daemon => ("provider (a daemon, asked by chunk id)".to_string(), None),
            _ if !e.path.is_absolute() => (
                "provider (ferry over the remote shell, asked by chunk id)".to_string(),
                None,
            ),
            Ok(Some((i, kept))) => (
                "ready".to_string(),
                Some((i.files.len(), i.chunks(), i.bytes(), kept)),
            ),
            Ok(None) if e.path.is_dir() => ("not indexed yet".into(), None),
            Ok(None) => ("missing (not mounted?)".into(), None),
            Err(err) => (format!("unusable: {err}"), None),
        };
        let s = &e.supplied;
        if json {
            let index = index.as_ref().map(|(files, chunks, bytes, kept)| {
                json!({"files": files, "chunks": chunks, "bytes": bytes, "path": kept.path(),
                       "kept": matches!(kept, Kept::OnDevice(_)).then_some("device").unwrap_or("cache")})
            });
            writeln!(
                out,
                "{}",
                json!({"position": n + 1, "path": e.path, "state": state, "index": index,
                       "supplied": {"requests": s.requests, "chunks": s.chunks, "bytes": s.bytes, "misses": s.misses,
                                    "rejected": s.rejected, "rejected_bytes": s.rejected_bytes,
                                    "stale_files": s.stale_files}})
            )?;
            continue;
        }
        writeln!(out, "{}. {}  {state}", n + 1, e.path.display())?;
        if let Some((files, chunks, bytes, kept)) = &index {
            writeln!(
                out,
                "   index: {files} files ({}), {chunks} chunks, in {}",
                human(*bytes),
                kept.path().display()
            )?;
        }
        writeln!(
            out,
            "   supplied: {} chunks ({}), {} misses, {} rejected ({}), {} files found changed",
            s.chunks,
            human(s.bytes),
            s.misses,
            s.rejected,
            human(s.rejected_bytes),
            s.stale_files
        )?;
    }
    Ok(())
}

fn verify(out: &mut impl Write, dir: &Path, json: bool) -> Result<ExitCode> {
    let root = device_root(dir)?;
    let Some((index, kept)) = ferry_lookaside::load(&root, &index_cache())? else {
        bail!(
            "{} has no index (make one with `ferry lookaside index {}`)",
            root.display(),
            dir.display()
        );
    };
    let v = ferry_lookaside::verify(&root, &index)
        .with_context(|| format!("cannot verify {}", root.display()))?;
    let bad = v.missing.len() + v.changed.len() + v.wrong.len();
    if json {
        let names = |l: &[Vec<u8>]| {
            l.iter()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect::<Vec<_>>()
        };
        writeln!(
            out,
            "{}",
            json!({"device": root, "index": kept.path(), "files": index.files.len(), "ok": v.ok,
                   "missing": names(&v.missing), "changed": names(&v.changed), "wrong": names(&v.wrong)})
        )?;
    } else {
        for (what, l) in [
            ("missing", &v.missing),
            ("changed since indexed", &v.changed),
            (
                "content differs from the index (same size and times)",
                &v.wrong,
            ),
        ] {
            for p in l {
                writeln!(out, "{what}: {}", String::from_utf8_lossy(p))?;
            }
        }
        writeln!(
            out,
            "{}: {} files as indexed, {} missing, {} changed, {} wrong{}",
            root.display(),
            v.ok,
            v.missing.len(),
            v.changed.len(),
            v.wrong.len(),
            if bad > 0 {
                format!(
                    " (none is ever used wrongly; `ferry lookaside index {}` refreshes the index)",
                    dir.display()
                )
            } else {
                String::new()
            }
        )?;
    }
    Ok(if bad > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
