//! Small things every command shares.

use std::io;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ferry_chunk::{Algorithm, ChunkerSpec};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Ui {
    pub quiet: bool,
}

impl Ui {
    /// A byte-progress bar on stderr; hidden when quiet or stderr is not a terminal.
    pub fn bytes_bar(&self, len: u64, what: &str) -> ProgressBar {
        if self.quiet {
            return ProgressBar::hidden();
        }
        let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        pb.set_style(
            ProgressStyle::with_template(
                "{msg:>10} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        pb.set_message(what.to_string());
        pb
    }
}

pub fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    // fuser's one warning, "Failed to umount filesystem" (EINVAL), comes at the end of every
    // mount that `ferry umount` or `fusermount -u` ended: the mount is gone already.
    let filter = tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{default},fuser::session=error"))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_target(false)
        .init();
}

pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    // A pipe to the far side breaking is the link failing, not a reader of our output leaving.
    conn_error(e).is_none()
        && e.chain().any(|c| {
            c.downcast_ref::<io::Error>()
                .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
        })
}

/// Parses a size: `8192`, `8k`, `8KiB`, `4M`, `1MiB`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (try 8192, 8k or 1MiB)"))?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("unknown size unit in {s:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses a duration: `90`, `90s`, `15m`, `2h`, `1d`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (try 90s, 15m, 2h or 1d)"))?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("unknown duration unit in {s:?} (s, m, h or d)")),
    };
    n.checked_mul(mult)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// Chunker options shared by every command that chunks.
#[derive(clap::Args, Clone, Debug)]
pub struct ChunkerArgs {
    /// Chunking algorithm: fastcdc (default), lbfs (the paper's Rabin chunker) or fixed.
    #[arg(long, default_value = "fastcdc")]
    pub chunker: Algorithm,
    /// Minimum chunk size (default 2KiB).
    #[arg(long, value_parser = parse_size)]
    pub min: Option<usize>,
    /// Average chunk size, a power of two (default 8KiB); the block size for `fixed`.
    #[arg(long, value_parser = parse_size)]
    pub avg: Option<usize>,
    /// Maximum chunk size (default 64KiB).
    #[arg(long, value_parser = parse_size)]
    pub max: Option<usize>,
}

impl ChunkerArgs {
    pub fn spec(&self) -> Result<ChunkerSpec> {
        let base = match self.chunker {
            Algorithm::Lbfs => ChunkerSpec::lbfs(),
            Algorithm::Fixed => ChunkerSpec::fixed(self.avg.unwrap_or(8192)),
            _ => ChunkerSpec::default(),
        };
        let spec = if self.chunker == Algorithm::Fixed {
            if self.min.is_some() || self.max.is_some() {
                bail!("--min and --max do not apply to the fixed chunker (use --avg for the block size)");
            }
            base
        } else {
            ChunkerSpec {
                min: self.min.unwrap_or(base.min),
                avg: self.avg.unwrap_or(base.avg),
                max: self.max.unwrap_or(base.max),
                ..base
            }
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Regular files under `path` (or `path` itself), sorted, with their sizes. Symlinks and special
/// files are skipped.
pub fn files_under(path: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if meta.is_file() {
        return Ok(vec![(path.to_path_buf(), meta.len())]);
    }
    if !meta.is_dir() {
        bail!("{} is neither a file nor a directory", path.display());
    }
    let mut out = vec![];
    for e in walkdir::WalkDir::new(path).sort_by_file_name() {
        let e = e.with_context(|| format!("cannot walk {}", path.display()))?;
        if e.file_type().is_file() {
            let len = e
                .metadata()
                .with_context(|| format!("cannot read {}", e.path().display()))?
                .len();
            out.push((e.into_path(), len));
        }
    }
    Ok(out)
}

/// Human-readable bytes.
pub fn human(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// The protocol or link error behind `e`, if there is one.
pub fn conn_error(e: &anyhow::Error) -> Option<&ferry_fs::ConnError> {
    e.chain().find_map(|c| {
        c.downcast_ref::<ferry_fs::ConnError>()
            .or(match c.downcast_ref::<ferry_fs::GetError>() {
                Some(ferry_fs::GetError::Conn(ce)) => Some(ce),
                _ => None,
            })
            .or(match c.downcast_ref::<ferry_net::NetError>() {
                Some(ferry_net::NetError::Link(ce)) => Some(ce),
                _ => None,
            })
    })
}

/// Starts this command again in the background with `--foreground -v` (out of the terminal's
/// process group, so Ctrl-C in this shell does not reach it; `env_flag` set; standard error to
/// `log`, at `log_path`), and waits for its first word on standard output: `ready` (then the
/// child is returned, running), or `error: WHY` (then that is the error). `what` names it in
/// errors.
pub fn start_background(
    log: &std::fs::File,
    log_path: &Path,
    env_flag: &str,
    what: &str,
) -> anyhow::Result<std::process::Child> {
    use anyhow::{bail, Context};
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().context("cannot find this program")?;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .arg("--foreground")
        .arg("-v")
        .env(env_flag, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.try_clone().context("cannot share the log")?);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {what} in the background"))?;
    let out = std::io::BufReader::new(child.stdout.take().expect("piped"));
    for line in out.lines() {
        let line = line.unwrap_or_default();
        if line == "ready" {
            return Ok(child);
        }
        if let Some(err) = line.strip_prefix("error: ") {
            let _ = child.wait();
            bail!("{err}");
        }
    }
    let status = child.wait()?;
    bail!(
        "{what} ended ({status}) before it was ready; see {}",
        log_path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8192"), Ok(8192));
        assert_eq!(parse_size("8k"), Ok(8192));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert!(parse_size("eight").is_err());
        assert!(parse_size("8q").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(12), "12 B");
        assert_eq!(parse_duration("90").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("15m").unwrap().as_secs(), 900);
        assert_eq!(parse_duration("1d").unwrap().as_secs(), 86400);
        assert!(parse_duration("1w").is_err() && parse_duration("").is_err());
    }
}
