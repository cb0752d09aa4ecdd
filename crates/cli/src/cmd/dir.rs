//! `ferry dir`: the directory service (Bullet's companion) through the daemon: names bound to
//! tickets in versioned directories, from the daemon's root directory (or `--root TICKET`).

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use ferry_daemon::api::{DirChange, DirHistory, DirListing, DirUpdate, DirVersion, Status};
use ferry_daemon::client::Client;
use ferry_daemon::dirs::Made;
use ferry_daemon::DaemonError;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    /// Start from this directory's ticket instead of the daemon's root.
    #[arg(long, global = true, value_name = "TICKET")]
    root: Option<String>,
    #[command(flatten)]
    client: super::daemon::ClientOpts,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// List a directory (PATH: names from the root, `/`-separated; none: the root).
    Ls {
        path: Option<String>,
        /// An older version.
        #[arg(long, value_name = "N")]
        version: Option<u64>,
    },
    /// Print the ticket bound to PATH.
    Get { path: String },
    /// Bind PATH to TICKET (replacing what it was bound to).
    Set {
        path: String,
        ticket: String,
        /// Commit only if the directory is still at version N (made against it); without it
        /// the change is re-applied to the current version until it commits.
        #[arg(long, value_name = "N")]
        if_version: Option<u64>,
    },
    /// Unbind PATH (what it named is not deleted).
    Rm {
        path: String,
        #[arg(long, value_name = "N")]
        if_version: Option<u64>,
    },
    /// Make a new, empty directory and bind it at PATH.
    Mkdir { path: String },
    /// The versions of the directory at PATH; for a name that is not a directory, the versions
    /// of its directory in which its binding changed.
    History { path: Option<String> },
}

/// A path's directory and last name.
fn split(path: &str) -> Result<(Vec<&str>, &str)> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    match parts.split_last() {
        Some((last, dirs)) => Ok((dirs.to_vec(), last)),
        None => bail!("{path:?} names no entry"),
    }
}

struct Dirs {
    client: Client,
    root: String,
}

impl Dirs {
    fn list(&self, dir: &str, version: Option<u64>) -> Result<DirListing, DaemonError> {
        let q = version.map_or(String::new(), |v| format!("?version={v}"));
        self.client.get(&format!("/v1/dirs/{dir}{q}"))
    }

    /// The ticket of the directory the names lead to.
    fn walk(&self, names: &[&str]) -> Result<String> {
        let mut at = self.root.clone();
        for (i, name) in names.iter().enumerate() {
            let l = self.list(&at, None)?;
            let e = l
                .entries
                .into_iter()
                .find(|e| e.name == *name)
                .with_context(|| format!("no {:?}", names[..=i].join("/")))?;
            if e.kind != "directory" {
                bail!("{} is not a directory", names[..=i].join("/"));
            }
            at = e.ticket;
        }
        Ok(at)
    }

    /// Applies one change to the directory of `path`, against `base` or (retrying on conflict)
    /// the current version. Returns the version made.
    fn change(&self, path: &str, ticket: Option<String>, if_version: Option<u64>) -> Result<u64> {
        let (dirs, name) = split(path)?;
        let dir = self.walk(&dirs)?;
        loop {
            let base = match if_version {
                Some(b) => b,
                None => self.list(&dir, None)?.version,
            };
            let u = DirUpdate {
                base,
                changes: vec![DirChange {
                    name: name.to_string(),
                    ticket: ticket.clone(),
                }],
            };
            match self
                .client
                .post::<_, DirVersion>(&format!("/v1/dirs/{dir}"), &u)
            {
                Ok(v) => return Ok(v.version),
                Err(DaemonError::Conflict(_)) if if_version.is_none() => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let paths = super::daemon::paths(a.client.dir.as_ref());
    let client = Client::new(&paths.socket)?;
    let root = match a.root {
        Some(r) => r,
        None => client.get::<Status>("/v1/status")?.root,
    };
    let d = Dirs { client, root };
    let print = |v: &dyn erased::Json, text: &dyn Fn()| -> Result<()> {
        if a.client.json {
            println!("{}", v.json()?);
        } else {
            text();
        }
        Ok(())
    };
    match a.cmd {
        Cmd::Ls { path, version } => {
            let names: Vec<&str> = path
                .as_deref()
                .unwrap_or("")
                .split('/')
                .filter(|p| !p.is_empty())
                .collect();
            let dir = d.walk(&names)?;
            let l = d.list(&dir, version)?;
            print(&l, &|| {
                println!("version {}", l.version);
                for e in &l.entries {
                    let mark = if e.kind == "directory" { "/" } else { "" };
                    println!("{}{mark}", e.name);
                }
            })?;
        }
        Cmd::Get { path } => {
            let (dirs, name) = split(&path)?;
            let l = d.list(&d.walk(&dirs)?, None)?;
            let e = l
                .entries
                .into_iter()
                .find(|e| e.name == name)
                .with_context(|| format!("no {path:?}"))?;
            print(&e, &|| println!("{}", e.ticket))?;
        }
        Cmd::Set {
            path,
            ticket,
            if_version,
        } => {
            ticket
                .parse::<ferry_daemon::Ticket>()
                .with_context(|| format!("cannot bind {path}"))?;
            let v = d.change(&path, Some(ticket), if_version)?;
            print(&DirVersion { version: v }, &|| eprintln!("version {v}"))?;
        }
        Cmd::Rm { path, if_version } => {
            let v = d.change(&path, None, if_version)?;
            print(&DirVersion { version: v }, &|| eprintln!("version {v}"))?;
        }
        Cmd::Mkdir { path } => {
            let made: Made = d.client.post("/v1/dirs", &())?;
            let v = d.change(&path, Some(made.ticket.clone()), Some(current(&d, &path)?))?;
            print(&made, &|| {
                eprintln!("version {v}");
                println!("{}", made.ticket)
            })?;
        }
        Cmd::History { path } => history(&d, path.as_deref().unwrap_or(""), a.client.json)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The current version of the directory holding `path`'s last name.
fn current(d: &Dirs, path: &str) -> Result<u64> {
    let (dirs, name) = split(path)?;
    let dir = d.walk(&dirs)?;
    let l = d.list(&dir, None)?;
    if l.entries.iter().any(|e| e.name == name) {
        bail!("{path} exists");
    }
    Ok(l.version)
}

fn history(d: &Dirs, path: &str, json: bool) -> Result<()> {
    let names: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if let Ok(dir) = d.walk(&names) {
        let h: Vec<DirHistory> = d.client.get(&format!("/v1/dirs/{dir}/history"))?;
        if json {
            println!("{}", serde_json::to_string_pretty(&h)?);
        } else {
            for v in &h {
                println!("version {:>4}  {} entries", v.version, v.entries);
            }
        }
        return Ok(());
    }
    let (dirs, name) = split(path)?;
    let dir = d.walk(&dirs)?;
    let h: Vec<DirHistory> = d.client.get(&format!("/v1/dirs/{dir}/history"))?;
    let mut changes = vec![];
    let mut last: Option<String> = None;
    for v in h {
        let l = d.list(&dir, Some(v.version))?;
        let now = l
            .entries
            .into_iter()
            .find(|e| e.name == name)
            .map(|e| e.ticket);
        if now != last {
            changes.push(serde_json::json!({"version": v.version, "ticket": now}));
            last = now;
        }
    }
    if changes.is_empty() {
        bail!("no {path:?} in any version");
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&changes)?);
    } else {
        for c in &changes {
            let t = c["ticket"].as_str().unwrap_or("(unbound)");
            println!("version {:>4}  {t}", c["version"]);
        }
    }
    Ok(())
}

mod erased {
    /// Anything printed as JSON with `--json`.
    pub trait Json {
        fn json(&self) -> serde_json::Result<String>;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> serde_json::Result<String> {
            serde_json::to_string_pretty(self)
        }
    }
}
