//! `ferry object put|get|stat|rm|restrict`: thin clients of the daemon's API (`ferry daemon`
//! must run); `restrict` needs no daemon (a capability is weakened without its server).

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
    #[command(flatten)]
    client: super::daemon::ClientOpts,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Hand FILE (`-`: standard input, streamed) to the daemon: prints the ticket (OID, size,
    /// hints, capability) that lets another daemon fetch it.
    Put {
        file: PathBuf,
        /// Bullet's paranoia factor: 0 answers once the object is in the daemon's RAM (lost if
        /// it crashes before writing it); 1 once it is on disk, synced; N once N stores hold it
        /// (this daemon and N-1 replicas: `ferry daemon replica add`). The ticket says which
        /// was met.
        #[arg(long, short = 'P', default_value_t = 1, value_name = "P")]
        durability: u8,
    },
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
        #[arg(long, conflicts_with = "range")]
        no_wait: bool,
        /// Only bytes A to B (B excluded; `A-` to the end).
        #[arg(long, value_name = "A-B", value_parser = parse_range)]
        range: Option<(u64, Option<u64>)>,
    },
    /// Follow a fetch the daemon accepted (`get --no-wait`) until it ends.
    Wait { id: String },
    /// The object's size, OID, kind and durability (Bullet's SIZE) when it is this daemon's;
    /// what the ticket says otherwise.
    Stat { ticket: String },
    /// Delete the object (the ticket's capability needs the delete right).
    Rm { ticket: String },
    /// Print a ticket whose capability carries only RIGHTS, made here without asking the
    /// object's server (it needs the restrict right).
    Restrict {
        ticket: String,
        /// Rights to keep: read, delete, restrict, modify (comma-separated).
        #[arg(long, value_name = "RIGHTS")]
        rights: String,
    },
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
        Cmd::Restrict { ticket, rights } => {
            let t: Ticket = ticket.parse()?;
            let keep: ferry_daemon::Rights = rights.parse()?;
            let r = t.restrict(keep)?;
            if a.client.json {
                let v = serde_json::json!({"ticket": r.to_string(), "rights": r.cap.rights().to_string()});
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                eprintln!("rights: {}", r.cap.rights());
                println!("{r}");
            }
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let paths = super::daemon::paths(a.client.dir.as_ref());
    let client = Client::new(&paths.socket)?;
    match a.cmd {
        Cmd::Put { file, durability } => {
            let r: PutReply = if file.as_os_str() == "-" {
                client
                    .post_stream(
                        &format!("/v1/objects?durability={durability}"),
                        std::io::stdin(),
                    )
                    .context("cannot put standard input")?
            } else {
                let path = absolute(&file)?;
                client
                    .post("/v1/objects", &PutRequest { path, durability })
                    .with_context(|| format!("cannot put {}", file.display()))?
            };
            if a.client.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                eprintln!(
                    "{}: {} bytes, {} chunks, durability {} met, rights {}",
                    r.oid, r.size, r.chunks, r.durability, r.rights
                );
                println!("{}", r.ticket);
            }
        }
        Cmd::Rm { ticket } => {
            ticket.parse::<Ticket>()?;
            client
                .delete(&format!("/v1/objects/{ticket}"))
                .context("cannot delete the object")?;
            if a.client.json {
                println!("{}", serde_json::json!({"deleted": true}));
            }
        }
        Cmd::Get {
            ticket,
            output,
            no_wait,
            range,
        } => {
            ticket.parse::<Ticket>()?;
            // One of this daemon's own objects is read where it lies; any other is fetched.
            let own = client
                .get::<ObjectInfo>(&format!("/v1/objects/{ticket}"))
                .is_ok();
            if own || range.is_some() {
                return read_out(
                    &client,
                    &ticket,
                    own,
                    range,
                    output.as_deref(),
                    a.client.json,
                    ui,
                );
            }
            let to_stdout = output.as_deref() == Some(Path::new("-"));
            let path = match to_stdout {
                true => None,
                false => output.as_deref().map(absolute).transpose()?,
            };
            let job: Job = client
                .post("/v1/fetches", &FetchRequest { ticket, path })
                .context("cannot fetch the object")?;
            if no_wait {
                println!("{}", job.id);
                return Ok(ExitCode::SUCCESS);
            }
            if !to_stdout {
                follow(&client, &job.id, a.client.json, ui)?;
                return Ok(ExitCode::SUCCESS);
            }
            // Fetched (verified, whole) into the daemon first, then streamed out of it.
            let local = follow(&client, &job.id, false, &Ui { quiet: true })?;
            stream(&client, &local, None, &mut std::io::stdout().lock())?;
        }
        Cmd::Wait { id } => {
            follow(&client, &id, a.client.json, ui)?;
        }
        Cmd::Send { .. } | Cmd::Receive { .. } | Cmd::Restrict { .. } => {
            unreachable!("handled above")
        }
        Cmd::Stat { ticket } => {
            let t: Ticket = ticket.parse()?;
            let info = match client.get::<ObjectInfo>(&format!("/v1/objects/{ticket}")) {
                Ok(i) => Some(i),
                Err(ferry_daemon::DaemonError::NotFound(_)) => None,
                Err(e) => return Err(e.into()),
            };
            let v = serde_json::json!({
                "oid": t.oid.to_string(),
                "size": t.size,
                "rights": t.cap.rights().to_string(),
                "durability": info.as_ref().map_or(t.durability, |i| i.durability),
                "kind": info.as_ref().map(|i| i.kind.clone()),
                "hints": t.hints,
                "here": info.is_some(),
            });
            if a.client.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("oid         {}\nsize        {}", t.oid, t.size);
                println!("rights      {}", t.cap.rights());
                match &info {
                    Some(i) => println!("here        yes: {}, durability {}", i.kind, i.durability),
                    None => println!(
                        "here        no (another daemon's, or deleted; durability {} at its create)",
                        t.durability
                    ),
                }
                for h in &t.hints {
                    println!(
                        "hint        {} (priority {}, weight {})",
                        h.uri, h.priority, h.weight
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `A-B` or `A-`.
fn parse_range(s: &str) -> Result<(u64, Option<u64>), String> {
    let (a, b) = s.split_once('-').ok_or("a range is A-B or A-")?;
    let a: u64 = a
        .parse()
        .map_err(|_| format!("{a:?} is not a byte offset"))?;
    let b = match b {
        "" => None,
        b => Some(
            b.parse::<u64>()
                .map_err(|_| format!("{b:?} is not a byte offset"))?,
        ),
    };
    if b.is_some_and(|b| b < a) {
        return Err(format!("the range {s} ends before it starts"));
    }
    Ok((a, b))
}

/// Streams the object `ticket` reads (its bytes `range`) from the daemon into `out`.
fn stream(
    client: &Client,
    ticket: &str,
    range: Option<(u64, Option<u64>)>,
    out: &mut dyn Write,
) -> Result<u64> {
    let mut path = format!("/v1/objects/{ticket}/data");
    if let Some((a, b)) = range {
        path.push_str(&format!("?start={a}"));
        if let Some(b) = b {
            path.push_str(&format!("&end={b}"));
        }
    }
    let mut n = 0u64;
    client
        .get_bytes(&path, |d| {
            n += d.len() as u64;
            out.write_all(d)
                .map_err(|e| ferry_daemon::DaemonError::Api(e.to_string()))
        })
        .context("cannot read the object")?;
    out.flush()?;
    Ok(n)
}

/// `get` of this daemon's own object, or of a range (of an object fetched whole first).
fn read_out(
    client: &Client,
    ticket: &str,
    own: bool,
    range: Option<(u64, Option<u64>)>,
    output: Option<&Path>,
    json: bool,
    ui: &Ui,
) -> Result<ExitCode> {
    let local = match own {
        true => ticket.to_string(),
        false => {
            let job: Job = client
                .post(
                    "/v1/fetches",
                    &FetchRequest {
                        ticket: ticket.to_string(),
                        path: None,
                    },
                )
                .context("cannot fetch the object")?;
            follow(client, &job.id, false, ui)?
        }
    };
    let n = match output.filter(|p| *p != Path::new("-")) {
        None => stream(client, &local, range, &mut std::io::stdout().lock())?,
        Some(p) => {
            let dir = p
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let mut tmp = tempfile::Builder::new()
                .prefix(".ferry-object")
                .tempfile_in(dir)
                .with_context(|| format!("cannot create a file in {}", dir.display()))?;
            let n = stream(
                client,
                &local,
                range,
                &mut std::io::BufWriter::new(tmp.as_file_mut()),
            )?;
            tmp.as_file().sync_all()?;
            tmp.persist(p)
                .with_context(|| format!("cannot install {}", p.display()))?;
            n
        }
    };
    if json {
        println!("{}", serde_json::json!({"bytes": n}));
    }
    Ok(ExitCode::SUCCESS)
}

/// Follows fetch `id` to its end with a progress bar; prints what came from where. Returns
/// the ticket of the daemon's copy.
fn follow(client: &Client, id: &str, json: bool, ui: &Ui) -> Result<String> {
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
    r.local
        .clone()
        .context("the daemon did not say where its copy is")
}

/// The daemon does not share this process's directory: paths go to it absolute.
fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("cannot resolve {}", p.display()))
}
