//! `ferry vault`: files kept encrypted on storage that cannot read them (a directory, an S3
//! bucket), updated by small diffs (issue 22; the design is in docs/vault.md).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use ferry_vault::local::{export, plan_put};
use ferry_vault::{Backend, Config, DirBackend, KdfParams, S3Backend, Snapshot, Vault};
use serde_json::json;

use super::remote::cache_root;
use crate::util::{human, Ui};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    /// The vault: a directory, s3://BUCKET/PREFIX, or a Ferry server (HOST:PATH, or
    /// `ferry://HOST[:PORT]/PATH`).
    #[arg(
        short = 'r',
        long = "vault",
        global = true,
        env = "FERRY_VAULT",
        value_name = "TARGET"
    )]
    vault: Option<String>,
    #[command(flatten)]
    secret: Secret,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Remote shell for a HOST:PATH vault, as with rsync.
    #[arg(short = 'e', long = "rsh", global = true, default_value = "ssh")]
    rsh: String,
    /// The ferry program on the remote side.
    #[arg(long, global = true, default_value = "ferry")]
    remote_ferry: String,
}

/// Where the passphrase comes from: `--passphrase-file`, `--key-file`, FERRY_VAULT_PASSPHRASE,
/// else the terminal.
#[derive(clap::Args)]
struct Secret {
    /// Read the passphrase from the first line of FILE.
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "key_file")]
    passphrase_file: Option<PathBuf>,
    /// Use the whole of FILE (random bytes, say) as the secret.
    #[arg(long, global = true, value_name = "FILE")]
    key_file: Option<PathBuf>,
}

#[derive(clap::Args)]
struct Kdf {
    /// Argon2id memory for the new key slot, in MiB.
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    kdf_memory: u32,
    /// Argon2id passes for the new key slot.
    #[arg(long, default_value_t = 3, value_name = "N")]
    kdf_passes: u32,
}

impl Kdf {
    fn params(&self) -> Result<KdfParams> {
        if !(1..=4096).contains(&self.kdf_memory) || !(1..=64).contains(&self.kdf_passes) {
            bail!("--kdf-memory must be 1 to 4096 MiB and --kdf-passes 1 to 64");
        }
        Ok(KdfParams {
            memory_kib: self.kdf_memory << 10,
            passes: self.kdf_passes,
            lanes: 1,
        })
    }
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Make a new vault at TARGET: a directory (made if missing), s3://BUCKET/PREFIX, or a
    /// Ferry server (HOST:PATH, `ferry://HOST[:PORT]/PATH`), which then applies updates itself.
    Init {
        target: String,
        #[command(flatten)]
        kdf: Kdf,
        /// Cut files into fixed blocks of BYTES instead of content-defined ones (for
        /// comparison: an insert then changes every block after it).
        #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(4096..=4 << 20))]
        fixed_blocks: Option<u32>,
    },
    /// Store a file or tree as NAME (default: LOCAL's last name). Only what changed since
    /// the vault's version is sent; a tree's files gone locally are removed from NAME.
    Put {
        local: PathBuf,
        name: Option<String>,
    },
    /// Write NAME (a file, or a tree) to LOCAL.
    Get {
        name: String,
        local: PathBuf,
        /// An older version of the vault (see `log`).
        #[arg(long, value_name = "N")]
        version: Option<u64>,
    },
    /// List the files under NAME (all without it).
    Ls {
        name: Option<String>,
        #[arg(long, value_name = "N")]
        version: Option<u64>,
    },
    /// The versions that changed NAME (or anything, without it), newest first.
    Log { name: Option<String> },
    /// Remove NAMEs (and what is under them) from the newest version; older versions keep
    /// them.
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Verify every version's record, and every node and block of the newest version (of
    /// all versions with --all): hashes checked, blocks decrypted.
    Check {
        #[arg(long)]
        all: bool,
    },
    /// Key slots: more than one passphrase, or a new one.
    #[command(subcommand)]
    Key(KeyCmd),
}

#[derive(clap::Subcommand)]
enum KeyCmd {
    /// The key slots.
    List,
    /// Add a slot for another passphrase (asked on the terminal, or --new-passphrase-file).
    Add {
        #[arg(long, value_name = "FILE")]
        new_passphrase_file: Option<PathBuf>,
        #[command(flatten)]
        kdf: Kdf,
    },
    /// Remove the slot ID (never the last).
    Remove { id: String },
    /// Replace the slot the current passphrase opens with one for a new passphrase.
    Passwd {
        #[arg(long, value_name = "FILE")]
        new_passphrase_file: Option<PathBuf>,
        #[command(flatten)]
        kdf: Kdf,
    },
}

/// The storage TARGET names: s3://…, a Ferry server (HOST:PATH over a remote shell, or
/// `ferry://HOST[:PORT]/PATH`), or a directory.
fn backend(a: &Args, target: &str, create: bool) -> Result<Box<dyn Backend>> {
    if ferry_s3::Locator::is_s3(target) {
        return Ok(Box::new(S3Backend::open(target, create)?));
    }
    if target.starts_with("ferry://") || ferry_fs::RemoteSpec::parse(target).is_some() {
        let rsh = super::remote::Rsh::shell(a.rsh.clone(), a.remote_ferry.clone());
        let (connect, wire) = super::remote::connector(target, &rsh, 0)?;
        let remote = ferry_fs::vault::RemoteVault::new(connect, wire, target.to_string());
        if create {
            remote.make_dir()?;
        }
        return Ok(Box::new(remote));
    }
    Ok(Box::new(DirBackend::open(Path::new(target), create)?))
}

/// The passphrase: from a file, the environment, or the terminal (twice when `confirm`).
fn passphrase(s: &Secret, prompt: &str, confirm: bool) -> Result<Vec<u8>> {
    if let Some(f) = &s.key_file {
        let b = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        if b.len() < 16 {
            bail!("{}: a key file needs at least 16 bytes", f.display());
        }
        return Ok(b);
    }
    if let Some(f) = &s.passphrase_file {
        return first_line(f);
    }
    if let Ok(p) = std::env::var("FERRY_VAULT_PASSPHRASE") {
        return Ok(p.into_bytes());
    }
    ask(prompt, confirm)
}

fn first_line(f: &Path) -> Result<Vec<u8>> {
    let file = std::fs::File::open(f).with_context(|| format!("reading {}", f.display()))?;
    let mut line = String::new();
    std::io::BufReader::new(file).read_line(&mut line)?;
    let p = line.trim_end_matches(['\n', '\r']);
    if p.is_empty() {
        bail!("{}: the passphrase is empty", f.display());
    }
    Ok(p.as_bytes().to_vec())
}

/// Reads a passphrase from the terminal with echo off.
fn ask(prompt: &str, confirm: bool) -> Result<Vec<u8>> {
    use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions};
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .context(
            "no terminal to ask for the passphrase: give --passphrase-file, --key-file or \
             FERRY_VAULT_PASSPHRASE",
        )?;
    let read_one = |prompt: &str| -> Result<String> {
        let mut w = &tty;
        write!(w, "{prompt}")?;
        let saved = tcgetattr(&tty)?;
        let mut quiet = saved.clone();
        quiet.local_modes.remove(LocalModes::ECHO);
        tcsetattr(&tty, OptionalActions::Now, &quiet)?;
        let mut line = String::new();
        let read = std::io::BufReader::new(&tty).read_line(&mut line);
        tcsetattr(&tty, OptionalActions::Now, &saved)?;
        writeln!(w)?;
        read?;
        Ok(line.trim_end_matches(['\n', '\r']).to_string())
    };
    let p = read_one(prompt)?;
    if p.is_empty() {
        bail!("the passphrase is empty");
    }
    if confirm && read_one("again: ")? != p {
        bail!("the passphrases differ");
    }
    Ok(p.into_bytes())
}

fn new_passphrase(file: &Option<PathBuf>) -> Result<Vec<u8>> {
    match file {
        Some(f) => first_line(f),
        None => ask("new passphrase: ", true),
    }
}

/// The vault, opened with its node cache and this client's memory of its newest version.
fn open(a: &Args) -> Result<Vault> {
    let Some(target) = &a.vault else {
        bail!("which vault? give --vault TARGET (or set FERRY_VAULT)");
    };
    let pass = passphrase(&a.secret, "vault passphrase: ", false)?;
    let v = Vault::open(backend(a, target, false)?, &pass)?;
    let id = v.config.id_hex();
    Ok(
        v.with_node_cache(cache_root().join("vault").join(&id).join("nodes"))
            .with_memory(ferry_net::data_dir().join("vaults").join(id)),
    )
}

fn snapshot(v: &Vault, version: Option<u64>) -> Result<Snapshot> {
    let latest = v.latest()?;
    match version {
        None => Ok(latest),
        Some(n) if n > latest.seq => bail!("the vault has {} versions", latest.seq),
        Some(n) => Ok(v.snapshot(n)?),
    }
}

fn time(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let (d, s) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970 (Howard Hinnant's algorithm).
    let z = d + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

pub fn run(a: Args, ui: &Ui) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match &a.cmd {
        Cmd::Init {
            target,
            kdf,
            fixed_blocks,
        } => {
            let pass = passphrase(&a.secret, "new vault passphrase: ", true)?;
            let config = match fixed_blocks {
                Some(n) => Config {
                    min: *n,
                    avg: *n,
                    max: *n,
                    ..Config::new()
                },
                None => Config::new(),
            };
            let v = Vault::init(backend(&a, target, true)?, &pass, kdf.params()?, config)?;
            if a.json {
                writeln!(
                    out,
                    "{}",
                    json!({"vault": v.describe(), "id": v.config.id_hex(), "key": v.slot})
                )?;
            } else {
                writeln!(
                    out,
                    "made a vault at {} (id {}, key slot {})",
                    v.describe(),
                    v.config.id_hex(),
                    v.slot
                )?;
                writeln!(
                    out,
                    "keep the passphrase safe: without it nothing in the vault can be read"
                )?;
            }
        }
        Cmd::Put { local, name } => {
            let v = open(&a)?;
            let name = match name {
                Some(n) => n.trim_matches('/').to_string(),
                None => local
                    .canonicalize()
                    .with_context(|| local.display().to_string())?
                    .file_name()
                    .and_then(|n| n.to_str())
                    .context("name the file in the vault: ferry vault put LOCAL NAME")?
                    .to_string(),
            };
            let snap = v.latest()?;
            let mut seen = ferry_vault::seen::Seen::load(
                &cache_root()
                    .join("vault")
                    .join(v.config.id_hex())
                    .join("seen"),
            );
            let plan = plan_put(&snap.catalog, &seen, local, &name)?;
            for s in &plan.skipped {
                eprintln!(
                    "ferry: skipped {} (not a file, directory or symlink)",
                    s.display()
                );
            }
            let total: u64 = plan
                .edits
                .iter()
                .map(|e| match e {
                    ferry_vault::Edit::Put {
                        source: ferry_vault::Source::File(p),
                        ..
                    } => std::fs::metadata(p).map_or(0, |m| m.len()),
                    _ => 0,
                })
                .sum();
            let bar = ui.bytes_bar(total, "put");
            let r = v.update_on(snap, &plan.edits, &|n| bar.inc(n))?;
            bar.finish_and_clear();
            seen.record(&plan.stats, &r.catalog);
            if let Err(e) = seen.save() {
                // Only an optimisation is lost: the next put reads the files again.
                tracing::warn!("{e}");
            }
            let t = r.traffic;
            if a.json {
                writeln!(
                    out,
                    "{}",
                    json!({"version": r.seq, "changed": r.changed, "unchanged": plan.unchanged,
                    "bytes_read": r.bytes_cut, "blocks_sent": r.blocks_sent, "block_bytes": r.block_bytes,
                    "nodes_sent": r.nodes_sent, "applied_by_server": r.applied_by_server, "retries": r.retries, "bytes_up": t.bytes_up,
                    "bytes_down": t.bytes_down, "requests": t.requests})
                )?;
            } else if r.changed == 0 {
                writeln!(out, "{name}: unchanged (version {})", r.seq)?;
            } else {
                let nodes = match r.applied_by_server {
                    true => "the server applied the tree actions".to_string(),
                    false => format!("{} nodes", r.nodes_sent),
                };
                writeln!(
                    out,
                    "{name}: version {}, {} names changed; read {}, sent {} blocks ({}), {nodes}; {} up, {} down",
                    r.seq, r.changed, human(r.bytes_cut), r.blocks_sent, human(r.block_bytes),
                    human(t.bytes_up), human(t.bytes_down)
                )?;
            }
        }
        Cmd::Get {
            name,
            local,
            version,
        } => {
            let v = open(&a)?;
            let snap = snapshot(&v, *version)?;
            let total: u64 = Vault::select(&snap, name).iter().map(|e| e.size).sum();
            let bar = ui.bytes_bar(total, "get");
            let r = export(&v, &snap, name, local, &|n| bar.inc(n))?;
            bar.finish_and_clear();
            if a.json {
                writeln!(
                    out,
                    "{}",
                    json!({"version": snap.seq, "files": r.files, "bytes": r.bytes,
                    "bytes_down": v.traffic().bytes_down})
                )?;
            } else {
                writeln!(
                    out,
                    "{} files, {} from version {}",
                    r.files,
                    human(r.bytes),
                    snap.seq
                )?;
            }
        }
        Cmd::Ls { name, version } => {
            let v = open(&a)?;
            let snap = snapshot(&v, *version)?;
            let name = name.as_deref().unwrap_or("");
            let entries = Vault::select(&snap, name);
            if entries.is_empty() && !name.is_empty() {
                bail!("{name}: not in version {} of the vault", snap.seq);
            }
            for e in entries {
                if a.json {
                    writeln!(
                        out,
                        "{}",
                        json!({"name": e.name, "size": e.size, "mode": e.mode,
                        "mtime_ns": e.mtime_ns, "symlink": e.kind == ferry_vault::Kind::Symlink})
                    )?;
                } else {
                    let kind = if e.kind == ferry_vault::Kind::Symlink {
                        'l'
                    } else {
                        '-'
                    };
                    writeln!(
                        out,
                        "{kind}{:04o} {:>12} {} {}",
                        e.mode,
                        e.size,
                        time(e.mtime_ns),
                        e.name
                    )?;
                }
            }
        }
        Cmd::Log { name } => {
            let v = open(&a)?;
            for x in v.log(name.as_deref().unwrap_or(""))? {
                let c = &x.change;
                if a.json {
                    writeln!(
                        out,
                        "{}",
                        json!({"version": x.seq, "time_ns": x.time_ns, "name": c.name,
                        "removed": c.removed, "size": c.size})
                    )?;
                } else {
                    let what = if c.removed {
                        "removed".to_string()
                    } else {
                        human(c.size)
                    };
                    writeln!(
                        out,
                        "{:>6} {} {:>10} {}",
                        x.seq,
                        time(x.time_ns),
                        what,
                        c.name
                    )?;
                }
            }
        }
        Cmd::Rm { names } => {
            let v = open(&a)?;
            let snap = v.latest()?;
            for n in names {
                if Vault::select(&snap, n).is_empty() {
                    bail!("{n}: not in the vault");
                }
            }
            let edits: Vec<_> = names
                .iter()
                .map(|n| ferry_vault::Edit::Remove(n.trim_matches('/').into()))
                .collect();
            let r = v.update_on(snap, &edits, &|_| {})?;
            if a.json {
                writeln!(out, "{}", json!({"version": r.seq, "removed": r.changed}))?;
            } else {
                writeln!(out, "removed {} files (version {})", r.changed, r.seq)?;
            }
        }
        Cmd::Check { all } => {
            let v = open(&a)?;
            let bar = ui.bytes_bar(0, "check");
            let r = v.check(*all, &|n| bar.inc(n))?;
            bar.finish_and_clear();
            if a.json {
                writeln!(
                    out,
                    "{}",
                    json!({"versions": r.versions, "files": r.files, "nodes": r.nodes,
                    "blocks": r.blocks, "bytes": r.bytes, "problems": r.problems})
                )?;
            } else {
                for p in &r.problems {
                    writeln!(out, "damaged: {p}")?;
                }
                writeln!(
                    out,
                    "{} versions, {} files: {} nodes and {} blocks ({}) checked, {} problems",
                    r.versions,
                    r.files,
                    r.nodes,
                    r.blocks,
                    human(r.bytes),
                    r.problems.len()
                )?;
            }
            if !r.problems.is_empty() {
                return Ok(ExitCode::from(1));
            }
        }
        Cmd::Key(k) => key(&a, k, &mut out)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn key(a: &Args, k: &KeyCmd, out: &mut impl Write) -> Result<()> {
    let v = open(a)?;
    match k {
        KeyCmd::List => {
            for s in v.slots()? {
                let p = s.params.map_or("unreadable".to_string(), |p| {
                    format!("argon2id {} MiB, {} passes", p.memory_kib >> 10, p.passes)
                });
                let this = if s.name == v.slot {
                    " (this passphrase)"
                } else {
                    ""
                };
                if a.json {
                    writeln!(
                        out,
                        "{}",
                        json!({"id": s.name, "current": s.name == v.slot,
                        "kdf": s.params.map(|p| json!({"memory_kib": p.memory_kib, "passes": p.passes, "lanes": p.lanes}))})
                    )?;
                } else {
                    writeln!(out, "{} {p}{this}", s.name)?;
                }
            }
        }
        KeyCmd::Add {
            new_passphrase_file,
            kdf,
        } => {
            let id = v.add_slot(&new_passphrase(new_passphrase_file)?, kdf.params()?)?;
            writeln!(out, "added key slot {id}")?;
        }
        KeyCmd::Remove { id } => {
            v.remove_slot(id)?;
            writeln!(out, "removed key slot {id}")?;
        }
        KeyCmd::Passwd {
            new_passphrase_file,
            kdf,
        } => {
            let id = v.add_slot(&new_passphrase(new_passphrase_file)?, kdf.params()?)?;
            v.remove_slot(&v.slot)?;
            writeln!(
                out,
                "the new passphrase is in key slot {id}; slot {} is gone",
                v.slot
            )?;
        }
    }
    Ok(())
}
