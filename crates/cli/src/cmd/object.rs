//! `ferry object put|get|stat`: thin clients of the daemon's API (`ferry daemon` must run).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use ferry_daemon::api::{FetchRequest, ObjectInfo, PutReply, PutRequest};
use ferry_daemon::client::Client;
use ferry_daemon::jobs::{Job, State, What};
use ferry_daemon::Ticket;

use crate::util::Ui;

/// How long a fetch is followed through a daemon that does not answer (restarting, say).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

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
    /// Hand FILE (`-`: standard input, streamed) to the daemon: prints the ticket (OID, size,
    /// hints, read capability) that lets another daemon fetch it.
    Put { file: PathBuf },
    /// Fetch the object of TICKET from the sources its hints name (and any this daemon
    /// already holds), verified, into FILE.
    Get {
        ticket: String,
        /// Where to install it (atomically); `-`: standard output [default: only into the
        /// daemon's store].
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Print the fetch's id and return at once (the daemon goes on; `ferry object wait ID`
        /// follows it).
        #[arg(long)]
        no_wait: bool,
    },
    /// Follow a fetch the daemon accepted (`get --no-wait`) until it ends.
    Wait { id: String },
    /// What a ticket says: OID, size, hints; and whether this daemon holds the object.
    Stat { ticket: String },
    /// `ferry cp`'s far side: puts PATH (a file or tree) and prints its manifest.
    #[command(hide = true)]
    Send { path: PathBuf },
    /// `ferry cp`'s far side: fetches the manifest on standard input into DEST.
    #[command(hide = true)]
    Receive { dest: PathBuf },
}

pub fn run(a: Args, ui: &Ui) -> Result<ExitCode> {
    match &a.cmd {
        Cmd::Send { path } => return super::cp::send_here(path),
        Cmd::Receive { dest } => return super::cp::receive_here(dest),
        _ => {}
    }
    let paths = super::daemon::paths(a.dir.as_ref());
    let client = Client::new(&paths.socket)?;
    match a.cmd {
        Cmd::Put { file } => {
            let r: PutReply = if file.as_os_str() == "-" {
                client
                    .post_stream("/v1/objects", std::io::stdin())
                    .context("cannot put standard input")?
            } else {
                let path = absolute(&file)?;
                client
                    .post("/v1/objects", &PutRequest { path })
                    .with_context(|| format!("cannot put {}", file.display()))?
            };
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
        Cmd::Get {
            ticket,
            output,
            no_wait,
        } => {
            let to_stdout = output.as_deref() == Some(Path::new("-"));
            let path = match to_stdout {
                true => None,
                false => output.as_deref().map(absolute).transpose()?,
            };
            let oid = ticket.parse::<Ticket>()?.oid;
            let job: Job = client
                .post("/v1/fetches", &FetchRequest { ticket, path })
                .context("cannot fetch the object")?;
            if no_wait {
                println!("{}", job.id);
                return Ok(ExitCode::SUCCESS);
            }
            if !to_stdout {
                return follow(&client, &job.id, a.json, ui);
            }
            // Fetched (verified, whole) into the daemon first, then streamed out of it.
            follow(&client, &job.id, false, &Ui { quiet: true })?;
            let mut out = std::io::stdout().lock();
            client
                .get_bytes(&format!("/v1/objects/{oid}/data"), |d| {
                    out.write_all(d)
                        .map_err(|e| ferry_daemon::DaemonError::Api(e.to_string()))
                })
                .context("cannot stream the object")?;
            out.flush()?;
        }
        Cmd::Wait { id } => return follow(&client, &id, a.json, ui),
        Cmd::Send { .. } | Cmd::Receive { .. } => unreachable!("handled above"),
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

/// Follows fetch `id` to its end with a progress bar; prints what came from where.
fn follow(client: &Client, id: &str, json: bool, ui: &Ui) -> Result<ExitCode> {
    let mut bar = None;
    let job = client.follow(id, 0, PATIENCE, |e| match &e.what {
        What::Started { size, restarts } => {
            if *restarts > 0 {
                eprintln!("ferry: the daemon restarted; fetch {id} taken up again");
            }
            if !json {
                bar = Some(ui.bytes_bar(*size, "fetching"));
            }
        }
        What::Progress { bytes, .. } => {
            if let Some(b) = &bar {
                b.set_position(*bytes);
            }
        }
        What::Done { .. } | What::Failed { .. } => {
            if let Some(b) = bar.take() {
                b.finish_and_clear();
            }
        }
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&job)?);
    }
    let r = match (job.state, &job.report) {
        (State::Done, Some(r)) => r,
        _ => anyhow::bail!(
            "cannot fetch the object: {}",
            job.error.as_deref().unwrap_or("the fetch did not end")
        ),
    };
    if !json {
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
    Ok(ExitCode::SUCCESS)
}

/// The daemon does not share this process's directory: paths go to it absolute.
fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("cannot resolve {}", p.display()))
}
