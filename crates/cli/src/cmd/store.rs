//! `ferry store`: a content-addressed chunk store on the local disk or in an S3 bucket.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use ferry_format::{HashAlg, Oid};
use ferry_store::{read_object, store_object, ChunkStore, LocalStore, Options};
use serde_json::json;

use crate::util::{files_under, human, ChunkerArgs, Ui};

#[derive(clap::Args)]
pub struct Args {
    /// The store: a directory, or `s3://BUCKET/PREFIX` (credentials, region and endpoint as
    /// the AWS tools take them: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL,
    /// AWS_REGION, AWS_PROFILE, ~/.aws; or `?endpoint=URL&region=R&profile=P`)
    /// [default: $FERRY_STORE, else ~/.local/share/ferry/store].
    #[arg(long, global = true, value_name = "DIR|s3://BUCKET/PREFIX")]
    store: Option<String>,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Create an empty store.
    Init {
        /// Hash algorithm for chunk and object ids.
        #[arg(long, default_value = "blake3")]
        hash: HashAlg,
    },
    /// Store files (creating the store if needed); prints each file's object id.
    Add {
        #[command(flatten)]
        chunker: ChunkerArgs,
        /// Files or directories (every regular file below them).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Write an object's content to standard output or a file.
    Cat {
        oid: Oid,
        /// Write here instead of standard output (atomically: temp file, fsync, rename).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// List objects.
    Ls,
    /// Forget objects (their chunks go at the next gc).
    Rm {
        #[arg(required = true)]
        oids: Vec<Oid>,
    },
    /// Counts: chunks, bytes, objects, deduplication.
    Stats,
    /// Read and check every chunk; exit 1 if anything is damaged or missing.
    Verify,
    /// Recreate the index from the pack files.
    Rebuild,
    /// Delete chunks no object uses and compact sparse packs. On S3, in two phases safe with
    /// several servers writing: packs are condemned in one run and deleted by a later one
    /// once `--grace` has passed (docs/s3.md).
    Gc {
        /// Rewrite packs whose live share is below this fraction.
        #[arg(long, default_value_t = 0.5)]
        min_live: f64,
        /// S3 only: how long a condemned pack stays before a later gc deletes it; longer than
        /// any writer's session.
        #[arg(long, default_value = "1d", value_parser = crate::util::parse_duration)]
        grace: std::time::Duration,
    },
}

pub fn default_store() -> String {
    if let Ok(p) = std::env::var("FERRY_STORE") {
        return p;
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    data.join("ferry/store").display().to_string()
}

/// A store on the local disk or in a bucket.
enum Opened {
    Local(Box<LocalStore>),
    S3(ferry_s3::S3Store),
}

impl std::ops::Deref for Opened {
    type Target = dyn ChunkStore;
    fn deref(&self) -> &Self::Target {
        match self {
            Opened::Local(s) => &**s,
            Opened::S3(s) => s,
        }
    }
}

impl Opened {
    fn verify(&self, progress: impl FnMut(u64)) -> Result<ferry_store::VerifyReport> {
        Ok(match self {
            Opened::Local(s) => s.verify(progress)?,
            Opened::S3(s) => s.verify(progress)?,
        })
    }
}

fn is_s3(store: &str) -> bool {
    ferry_s3::Locator::is_s3(store)
}

/// Opens the store; `create` makes it if missing (for S3, its bucket too).
fn open(store: &str, create: bool) -> Result<Opened> {
    if is_s3(store) {
        return Ok(Opened::S3(crate::cmd::s3::open(store, create)?));
    }
    let dir = Path::new(store);
    if create {
        return Ok(Opened::Local(Box::new(LocalStore::open_or_create(
            dir,
            Options::default(),
        )?)));
    }
    if !dir.join("ferry-store").exists() {
        bail!(
            "no store at {} (create one with `ferry store init` or `ferry store add`, or pass --store)",
            dir.display()
        );
    }
    Ok(Opened::Local(Box::new(LocalStore::open(
        dir,
        Options::default(),
    )?)))
}

pub fn run(a: Args, ui: &Ui) -> Result<ExitCode> {
    let dir = a.store.clone().unwrap_or_else(default_store);
    let shown = dir.clone();
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let code = match a.cmd {
        Cmd::Init { hash } => {
            if is_s3(&dir) {
                if hash != HashAlg::Blake3 {
                    bail!("S3 stores keep BLAKE3 ids");
                }
                crate::cmd::s3::open(&dir, true)?;
            } else {
                if Path::new(&dir).join("ferry-store").exists() {
                    bail!("{dir} is already a store");
                }
                LocalStore::create(
                    &dir,
                    Options {
                        hash_alg: hash,
                        ..Options::default()
                    },
                )?;
            }
            if a.json {
                writeln!(out, "{}", json!({"store": dir, "hash": hash.name()}))?;
            } else {
                writeln!(out, "created store {dir} ({hash} ids)")?;
            }
            ExitCode::SUCCESS
        }
        Cmd::Add { chunker, paths } => {
            let spec = chunker.spec()?;
            let mut files = vec![];
            for p in &paths {
                files.extend(files_under(p)?);
            }
            let s = open(&dir, true)?;
            let pb = ui.bytes_bar(files.iter().map(|f| f.1).sum(), "storing");
            for (path, _) in &files {
                let f =
                    File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
                let (oid, recipe, st) = store_object(&*s, f, &spec, |n| pb.inc(n))
                    .with_context(|| format!("cannot store {}", path.display()))?;
                pb.suspend(|| -> Result<()> {
                    if a.json {
                        writeln!(
                            out,
                            "{}",
                            json!({"file": path, "oid": oid.to_string(), "size": recipe.total_len(),
                                   "chunks": recipe.len(), "new_chunks": st.new_chunks, "new_bytes": st.new_bytes})
                        )?;
                    } else {
                        writeln!(out, "{oid}  {:>10}  new {:>10}  {}", recipe.total_len(), st.new_bytes, path.display())?;
                    }
                    Ok(())
                })?;
            }
            pb.finish_and_clear();
            ExitCode::SUCCESS
        }
        Cmd::Cat { oid, output } => {
            let s = open(&dir, false)?;
            let missing = || anyhow::anyhow!("no object {oid} in {shown}");
            match output {
                None => {
                    read_object(&*s, &oid, &mut out)?.ok_or_else(missing)?;
                }
                Some(path) => {
                    let parent = path
                        .parent()
                        .filter(|p| !p.as_os_str().is_empty())
                        .unwrap_or(Path::new("."));
                    let mut tmp = tempfile::NamedTempFile::new_in(parent).with_context(|| {
                        format!("cannot create a temporary file in {}", parent.display())
                    })?;
                    read_object(&*s, &oid, BufWriter::new(tmp.as_file_mut()))?
                        .ok_or_else(missing)?;
                    tmp.as_file()
                        .sync_all()
                        .with_context(|| format!("cannot fsync {}", path.display()))?;
                    tmp.persist(&path)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                }
            }
            ExitCode::SUCCESS
        }
        Cmd::Ls => {
            let s = open(&dir, false)?;
            for (oid, len) in s.objects()? {
                if a.json {
                    writeln!(out, "{}", json!({"oid": oid.to_string(), "size": len}))?;
                } else {
                    writeln!(out, "{oid}  {len:>12}")?;
                }
            }
            ExitCode::SUCCESS
        }
        Cmd::Rm { oids } => {
            let s = open(&dir, false)?;
            let mut missing = 0;
            for oid in &oids {
                if !s.remove_object(oid)? {
                    eprintln!("ferry: no object {oid}");
                    missing += 1;
                }
            }
            s.flush()?;
            if missing > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Cmd::Stats => {
            let s = open(&dir, false)?;
            let st = s.stats()?;
            if a.json {
                writeln!(
                    out,
                    "{}",
                    json!({"store": dir, "hash": s.hash_alg().name(), "chunks": st.chunks, "chunk_bytes": st.chunk_bytes,
                           "stored_bytes": st.stored_bytes, "objects": st.objects, "object_bytes": st.object_bytes,
                           "packs": st.packs, "index_bytes": st.index_bytes, "damaged": st.damaged,
                           "dedup_ratio": st.dedup_ratio()})
                )?;
            } else {
                writeln!(out, "store:        {} ({} ids)", dir, s.hash_alg())?;
                writeln!(
                    out,
                    "objects:      {} ({})",
                    st.objects,
                    human(st.object_bytes)
                )?;
                writeln!(
                    out,
                    "chunks:       {} ({} before compression)",
                    st.chunks,
                    human(st.chunk_bytes)
                )?;
                writeln!(
                    out,
                    "stored:       {} in {} packs",
                    human(st.stored_bytes),
                    st.packs
                )?;
                writeln!(out, "index:        {}", human(st.index_bytes))?;
                writeln!(out, "dedup ratio:  {:.2}", st.dedup_ratio())?;
                if st.damaged > 0 {
                    writeln!(
                        out,
                        "DAMAGED:      {} chunks (run `ferry store verify`)",
                        st.damaged
                    )?;
                }
            }
            ExitCode::SUCCESS
        }
        Cmd::Verify => {
            let s = open(&dir, false)?;
            let pb = ui.bytes_bar(s.stats()?.chunk_bytes, "verifying");
            let r = s.verify(|n| pb.inc(n))?;
            pb.finish_and_clear();
            let ok = r.damaged.is_empty() && r.missing.is_empty();
            if a.json {
                writeln!(
                    out,
                    "{}",
                    json!({"ok": ok, "chunks_checked": r.chunks_checked, "bytes_checked": r.bytes_checked,
                           "damaged": r.damaged.iter().map(|(id, why)| json!({"id": id, "why": why})).collect::<Vec<_>>(),
                           "missing": r.missing.iter().map(|(o, id)| json!({"oid": o.to_string(), "id": id.to_string()})).collect::<Vec<_>>()})
                )?;
            } else {
                writeln!(
                    out,
                    "checked {} chunks ({})",
                    r.chunks_checked,
                    human(r.bytes_checked)
                )?;
                for (id, why) in &r.damaged {
                    writeln!(out, "DAMAGED {id}: {why}")?;
                }
                for (oid, id) in &r.missing {
                    writeln!(out, "MISSING {id} (needed by {oid})")?;
                }
                writeln!(
                    out,
                    "{}",
                    if ok {
                        "ok"
                    } else {
                        "store has damage; `ferry store add` the original files again to repair"
                    }
                )?;
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Cmd::Rebuild if is_s3(&dir) => {
            let Opened::S3(s) = open(&dir, false)? else {
                unreachable!("an s3:// store opens as one")
            };
            let packs = s.rebuild()?;
            if a.json {
                writeln!(out, "{}", json!({"packs_scanned": packs}))?;
            } else {
                writeln!(out, "rebuilt the local index of {dir} from {packs} packs")?;
            }
            ExitCode::SUCCESS
        }
        Cmd::Rebuild => {
            if !Path::new(&dir).join("ferry-store").exists() {
                bail!("no store at {dir}");
            }
            let (mut s, r) = LocalStore::rebuild(&dir, Options::default())?;
            s.compact_index()?;
            if a.json {
                writeln!(
                    out,
                    "{}",
                    json!({"packs_scanned": r.packs_scanned, "records": r.records, "damaged_records": r.damaged_records,
                           "torn_bytes_truncated": r.torn_bytes_truncated, "unreadable_bytes": r.unreadable_bytes})
                )?;
            } else {
                writeln!(
                    out,
                    "rebuilt the index from {} packs: {} records, {} damaged, {} unreadable bytes",
                    r.packs_scanned, r.records, r.damaged_records, r.unreadable_bytes
                )?;
            }
            ExitCode::SUCCESS
        }
        Cmd::Gc { min_live, .. } if !(0.0..=1.0).contains(&min_live) => {
            bail!("--min-live must be between 0 and 1");
        }
        Cmd::Gc { min_live, grace } if is_s3(&dir) => {
            let Opened::S3(s) = open(&dir, false)? else {
                unreachable!("an s3:// store opens as one")
            };
            if !s.conditional_writes()? {
                eprintln!(
                    "ferry: warning: this S3 server ignores conditional writes: make sure no \
                     other gc runs on {dir} now"
                );
            }
            let r = s.gc(grace, min_live)?;
            if a.json {
                writeln!(
                    out,
                    "{}",
                    json!({"live_chunks": r.live_chunks, "packs_condemned": r.packs_condemned,
                           "packs_repacked": r.packs_repacked, "chunks_moved": r.chunks_moved,
                           "packs_deleted": r.packs_deleted, "bytes_deleted": r.bytes_deleted,
                           "packs_pardoned": r.packs_pardoned, "packs_waiting": r.packs_waiting})
                )?;
            } else {
                writeln!(
                    out,
                    "deleted {} packs ({}) condemned earlier; kept {} still needed; {} wait out \
                     their grace; condemned {} now ({} repacked, {} chunks moved)",
                    r.packs_deleted,
                    human(r.bytes_deleted),
                    r.packs_pardoned,
                    r.packs_waiting,
                    r.packs_condemned,
                    r.packs_repacked,
                    r.chunks_moved
                )?;
            }
            ExitCode::SUCCESS
        }
        Cmd::Gc { min_live, .. } => {
            let Opened::Local(mut s) = open(&dir, false)? else {
                unreachable!("a directory opens as a local store")
            };
            let r = s.gc(min_live)?;
            s.compact_index()?;
            if a.json {
                writeln!(
                    out,
                    "{}",
                    json!({"chunks_removed": r.chunks_removed, "chunk_bytes_removed": r.chunk_bytes_removed,
                           "packs_rewritten": r.packs_rewritten, "pack_bytes_before": r.pack_bytes_before,
                           "pack_bytes_after": r.pack_bytes_after})
                )?;
            } else {
                writeln!(
                    out,
                    "removed {} chunks ({}); rewrote {} packs; packs {} -> {}",
                    r.chunks_removed,
                    human(r.chunk_bytes_removed),
                    r.packs_rewritten,
                    human(r.pack_bytes_before),
                    human(r.pack_bytes_after)
                )?;
            }
            ExitCode::SUCCESS
        }
    };
    out.flush()?;
    Ok(code)
}
