//! `ferry`: move and serve files over thin, slow and intermittent links.
//!
//! This binary is a thin shell over the library crates: it parses arguments, picks defaults,
//! draws progress and turns errors into messages and exit codes. Exit codes: 0 success, 1 an
//! error (or damage found by `store verify`), 2 bad usage, 3 a conflict (the other side changed
//! since; nothing was overwritten), 4 the link failed (running the command again resumes).

mod cmd;
mod util;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ferry", version, about = "Move and serve files over thin, slow and intermittent links", long_about = None)]
struct Cli {
    /// More log output (-v info, -vv debug); FERRY_LOG=… sets a filter.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// No progress bars.
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// See the file service work on a built-in project: fetch, change, upload, re-sync.
    Demo(cmd::demo::Args),
    /// Print the chunks (recipe) of files: offset, length and id of each chunk.
    Chunk(cmd::chunk::Args),
    /// How much of NEW is already in OLD, and what sending NEW would cost (LBFS Table 1).
    Similarity(cmd::similarity::Args),
    /// Manage a content-addressed chunk store.
    Store(cmd::store::Args),
    /// Export a directory: to one client over a remote shell (`ssh host ferry serve --stdio
    /// DIR`), or to authorized clients over TLS (`ferry serve --listen DIR`).
    Serve(cmd::serve::ServeArgs),
    /// This user's key, and which keys to trust (for the TLS daemon and `ferry://` remotes).
    Key(cmd::key::Args),
    /// List a remote directory (HOST:PATH).
    Ls(cmd::remote::LsArgs),
    /// Fetch a remote file or tree (HOST:PATH), sending only the chunks not found locally.
    Get(cmd::remote::GetArgs),
    /// Upload a file or tree to HOST:PATH, sending only the chunks the server lacks; each file
    /// is committed atomically.
    Put(cmd::remote::PutArgs),
    /// Mirror a tree in either direction (SRC or DST is HOST:PATH); `--delete` for an exact copy.
    Sync(cmd::remote::SyncArgs),
    /// Mount a remote directory (HOST:PATH or ferry://HOST/PATH): files are cached whole,
    /// read and written locally, and committed atomically on close (close-to-open).
    Mount(cmd::mount::MountArgs),
    /// Unmount a `ferry mount`, once its last changes are on the server: returns when the
    /// mount's process has ended.
    Umount(cmd::mount::UmountArgs),
    /// Devices searched for chunks before the network (USB sticks, DVDs, old copies): stale
    /// or wrong data on them costs time, never correctness.
    Lookaside(cmd::lookaside::Args),
    /// The transfer daemon (DOT): holds objects, serves them to other daemons by ticket, and
    /// fetches theirs from every source at once.
    Daemon(cmd::daemon::DaemonArgs),
    /// Objects by ticket, through the daemon (Bullet's object service): `put FILE` prints a
    /// ticket, `get TICKET -o FILE` fetches it, `stat`, `rm`, `restrict --rights read`.
    Object(cmd::object::Args),
    /// Names for objects (the directory service): versioned directories of tickets, changed by
    /// compare-and-swap, from the daemon's root.
    Dir(cmd::dir::Args),
    /// Copy a file or tree like scp (one side HOST:PATH): names over the remote shell, bytes
    /// daemon to daemon as objects (the file service where no daemon runs).
    Cp(cmd::cp::Args),
    /// Files kept encrypted on storage that cannot read them (a directory, an S3 bucket),
    /// updated by small diffs: init, put, get, ls, log, rm, check, key.
    Vault(cmd::vault::Args),
    /// Ferry against rsync, rsync -z, scp and the near-ideal delta over emulated slow links:
    /// bytes counted at the link, time, tables and charts.
    Lab(cmd::lab::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    util::init_logging(cli.verbose);
    let ui = util::Ui { quiet: cli.quiet };
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Chunk(a) => cmd::chunk::run(a),
        Command::Similarity(a) => cmd::similarity::run(a, &ui),
        Command::Store(a) => cmd::store::run(a, &ui),
        Command::Serve(a) => cmd::serve::serve(a),
        Command::Key(a) => cmd::key::run(a),
        Command::Ls(a) => cmd::remote::ls(a),
        Command::Get(a) => cmd::remote::get(a),
        Command::Put(a) => cmd::remote::put(a),
        Command::Sync(a) => cmd::remote::sync(a),
        Command::Mount(a) => cmd::mount::mount(a),
        Command::Umount(a) => cmd::mount::umount(a),
        Command::Lab(a) => cmd::lab::run(a),
        Command::Lookaside(a) => cmd::lookaside::run(a, &ui),
        Command::Daemon(a) => cmd::daemon::run(a),
        Command::Cp(a) => cmd::cp::run(a),
        Command::Object(a) => cmd::object::run(a, &ui),
        Command::Dir(a) => cmd::dir::run(a),
        Command::Vault(a) => cmd::vault::run(a, &ui),
    };
    match result {
        Ok(code) => code,
        Err(e) if util::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry: error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// The exit code for an error: scripts can tell a conflict and a failed link from the rest.
fn exit_code(e: &anyhow::Error) -> u8 {
    use ferry_fs::ConnError;
    match util::conn_error(e) {
        Some(ConnError::Remote {
            code: ferry_proto::ErrorCode::Conflict,
            ..
        }) => 3,
        Some(ConnError::Closed | ConnError::Io(_)) => 4,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::exit_code;
    use anyhow::Context;
    use ferry_fs::ConnError;
    use ferry_proto::ErrorCode;

    fn remote(code: ErrorCode) -> ConnError {
        ConnError::Remote {
            code,
            message: "m".into(),
        }
    }

    #[test]
    fn exit_codes_follow_the_cause_through_context() {
        let wrapped = |e: anyhow::Error| -> anyhow::Error {
            Err::<(), _>(e).context("cannot put x").unwrap_err()
        };
        assert_eq!(exit_code(&wrapped(remote(ErrorCode::Conflict).into())), 3);
        assert_eq!(exit_code(&wrapped(remote(ErrorCode::NoSpace).into())), 1);
        assert_eq!(exit_code(&wrapped(ConnError::Closed.into())), 4);
        let get = ferry_fs::GetError::Conn(remote(ErrorCode::Conflict));
        assert_eq!(exit_code(&wrapped(get.into())), 3);
        let net = ferry_net::NetError::Link(ConnError::Closed);
        assert_eq!(exit_code(&wrapped(net.into())), 4);
        assert_eq!(exit_code(&anyhow::anyhow!("bad input")), 1);
    }
}
