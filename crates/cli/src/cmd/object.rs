//! `ferry object put|get|stat`: thin clients of the daemon's API (`ferry daemon` must run).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use ferry_daemon::api::{FetchRequest, ObjectInfo, PutReply, PutRequest};
use ferry_daemon::client::Client;
use ferry_daemon::fetch::Fetched;
use ferry_daemon::Ticket;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    /// The daemon's directory, as given to `ferry daemon --dir` [default: the environment's].
    #[arg(long, global = true, value_name = "DIR", env = "FERRY_DAEMON_DIR")]
    dir: Option<PathBuf>,
    /// Answer in JSON.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Hand FILE to the daemon: prints the ticket (OID, size, hints, read capability) that
    /// lets another daemon fetch it.
    Put { file: PathBuf },
    /// Fetch the object of TICKET from the sources its hints name (and any this daemon
    /// already holds), verified, into FILE.
    Get {
        ticket: String,
        /// Where to install it (atomically) [default: only into the daemon's store].
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// What a ticket says: OID, size, hints; and whether this daemon holds the object.
    Stat { ticket: String },
}

pub fn run(a: Args) -> Result<ExitCode> {
    let paths = super::daemon::paths(a.dir.as_ref());
    let client = Client::new(&paths.socket)?;
    match a.cmd {
        Cmd::Put { file } => {
            let path = absolute(&file)?;
            let r: PutReply = client
                .post("/v1/objects", &PutRequest { path })
                .with_context(|| format!("cannot put {}", file.display()))?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                eprintln!(
                    "{}: {} bytes, {} chunks ({} new, {} bytes)",
                    r.oid, r.size, r.chunks, r.new_chunks, r.new_bytes
                );
                println!("{}", r.ticket);
            }
        }
        Cmd::Get { ticket, output } => {
            let path = output.as_deref().map(absolute).transpose()?;
            let r: Fetched = client
                .post("/v1/fetches", &FetchRequest { ticket, path })
                .context("cannot fetch the object")?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                let got: u64 = r.sources.iter().map(|s| s.bytes).sum();
                eprint!(
                    "{}: {} bytes; {} already here, {} fetched",
                    r.oid, r.size, r.bytes_held, got
                );
                for s in &r.sources {
                    eprint!("; {} bytes from {}", s.bytes, s.name);
                }
                eprintln!();
                for f in &r.failed_hints {
                    eprintln!("ferry: unused hint {f}");
                }
            }
        }
        Cmd::Stat { ticket } => {
            let t: Ticket = ticket.parse()?;
            let held = match client.get::<ObjectInfo>(&format!("/v1/objects/{}", t.oid)) {
                Ok(_) => true,
                Err(ferry_daemon::DaemonError::NotFound(_)) => false,
                Err(e) => return Err(e.into()),
            };
            let v = serde_json::json!({
                "oid": t.oid.to_string(),
                "size": t.size,
                "hints": t.hints,
                "held": held,
            });
            if a.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("oid   {}\nsize  {}\nheld  {}", t.oid, t.size, held);
                for h in &t.hints {
                    println!(
                        "hint  {} (priority {}, weight {})",
                        h.uri, h.priority, h.weight
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The daemon does not share this process's directory: paths go to it absolute.
fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("cannot resolve {}", p.display()))
}
