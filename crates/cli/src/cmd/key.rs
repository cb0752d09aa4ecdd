//! `ferry key`: this user's key, and the trust files of the TLS daemon and its clients.

use std::process::ExitCode;

use anyhow::{bail, Result};
use ferry_net::{data_dir, Fingerprint, Identity};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Print this user's key fingerprint (made on first use): give it to a daemon's owner.
    Show {
        #[arg(long)]
        json: bool,
    },
    /// Let a client key use this user's daemon (`ferry serve --listen`).
    Authorize {
        /// The client's fingerprint, as `ferry key show` prints it there.
        fingerprint: Fingerprint,
        /// A name for logs.
        name: Vec<String>,
    },
    /// Pin a daemon's key before the first connection (instead of trusting it on first use).
    Trust {
        /// `HOST[:PORT]`, as in `ferry://HOST[:PORT]/…`
        host: String,
        /// The key the daemon printed when it started.
        fingerprint: Fingerprint,
    },
}

pub fn run(a: Args) -> Result<ExitCode> {
    let dir = data_dir();
    match a.cmd {
        Cmd::Show { json } => {
            let (id, new) = Identity::load_or_create(&dir)?;
            if new {
                eprintln!("ferry: made a new key in {}", id.path.display());
            }
            if json {
                println!(
                    "{}",
                    json!({"fingerprint": id.fingerprint().to_string(), "path": id.path})
                );
            } else {
                println!("{}", id.fingerprint());
            }
        }
        Cmd::Authorize { fingerprint, name } => {
            let path = dir.join("authorized_keys");
            if ferry_net::read_authorized(&path)?
                .iter()
                .any(|k| k.fingerprint == fingerprint)
            {
                eprintln!("ferry: {fingerprint} is already authorized");
            } else {
                let name = name.join(" ");
                ferry_net::append_line(&path, format!("{fingerprint} {name}").trim_end())?;
                eprintln!("ferry: authorized {fingerprint} in {}", path.display());
            }
        }
        Cmd::Trust { host, fingerprint } => {
            let Some(Ok(ep)) = ferry_net::Endpoint::parse(&format!("ferry://{host}/")) else {
                bail!("{host:?} is not HOST[:PORT]");
            };
            let path = dir.join("known_hosts");
            ferry_net::append_line(&path, &format!("{} {fingerprint}", ep.host_port()))?;
            eprintln!("ferry: {} pinned to {fingerprint}", ep.host_port());
        }
    }
    Ok(ExitCode::SUCCESS)
}
