//! `ferry lab --vault`: the OceanStore paper's Figures 6 and 7 on today's links. For each
//! workload (a version already in the vault, the next one written) and link: the bytes and
//! time of the write, and the time of a cold read of the new version, for
//! - **Whole**: the new version (a tar) sealed whole with XChaCha20-Poly1305 and sent again
//!   (`ssh host 'cat > file'`; read back with `ssh host cat`);
//! - **Block**: `ferry vault` with fixed 8 KiB blocks (changed blocks sent; an insert shifts
//!   every block after it);
//! - **FileSummary**: `ferry vault` as it is (keyed content-defined blocks, the client's file
//!   summary diffed into actions the server applies);
//! - **Ideal**: the near-ideal delta, unencrypted (`zstd -19 --patch-from`), bytes only.
//!
//! Every vault lives on the lab's sshd (`HOST:PATH`, the server applying the actions) and
//! every byte is counted at the emulated link. Runs whose bytes, measured on the fastest link
//! first, would take longer than `--max-whole` seconds on a slow one are skipped with that
//! estimate.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::link::Relay;
use super::workloads::Workload;
use super::{run_bounded, same_files, Lab, Profile, WorkloadInfo};
use crate::util::human;

pub const CONTENDERS: [&str; 3] = ["Whole", "Block", "FileSummary"];
const LIMIT: Duration = Duration::from_secs(3600);

/// What vault.json holds (what `--from-json` reads back).
#[derive(Deserialize)]
pub struct Report {
    pub rows: Vec<Row>,
    pub workloads: Vec<WorkloadInfo>,
    pub profiles: Vec<Profile>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Row {
    pub workload: String,
    pub profile: String,
    pub contender: String,
    /// The write of the new version: bytes each way at the link, and seconds.
    pub write_up: u64,
    pub write_down: u64,
    pub write_s: f64,
    /// A cold read of the new version by another client.
    pub read_up: u64,
    pub read_down: u64,
    pub read_s: f64,
    pub status: String,
    /// The read was not run: estimated longer than --max-whole (its estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_skipped: Option<String>,
}

struct Measured {
    up: u64,
    down: u64,
    secs: f64,
}

fn timed(relay: &Relay, cmd: &mut Command, what: &str) -> Result<Measured> {
    relay.take();
    let t = Instant::now();
    if let Err(e) = run_bounded(cmd, LIMIT)? {
        bail!("{what}: {e}");
    }
    let secs = t.elapsed().as_secs_f64();
    let (up, down) = relay.take();
    Ok(Measured { up, down, secs })
}

impl Lab {
    /// `ferry vault ARGS` reaching the lab's sshd through `port`, with the client state under
    /// `state` (`cache`: which client this is).
    fn vault_command(&self, args: &[&str], port: u16, state: &Path, cache: &str) -> Command {
        let mut c = Command::new(&self.ferry);
        c.arg("-q")
            .arg("vault")
            .args(args)
            .args(["-e", &self.sshd.rsh(port), "--remote-ferry"])
            .arg(&self.ferry)
            .env("FERRY_VAULT_PASSPHRASE", "lab passphrase")
            .env("XDG_CACHE_HOME", state.join(cache))
            .env("XDG_DATA_HOME", state.join(format!("{cache}-data")))
            .env_remove("FERRY_VAULT");
        c
    }

    /// A vault holding `w.old`, then the write of `w.new` and a cold read of it.
    fn vault_run(
        &self,
        contender: &str,
        w: &Workload,
        relay: &Relay,
        dir: &Path,
        read: bool,
    ) -> Result<Row> {
        let state = dir.join("client");
        let srv = dir.join("server");
        fs::create_dir_all(&srv)?;
        let target = format!("{}:{}/vault", self.sshd.host(), srv.display());
        let mut init = vec![
            "init",
            target.as_str(),
            "--kdf-memory",
            "8",
            "--kdf-passes",
            "1",
        ];
        if contender == "Block" {
            init.extend(["--fixed-blocks", "8192"]);
        }
        let direct = self.direct.port;
        let run = |c: &mut Command, what: &str| -> Result<()> {
            match run_bounded(c, LIMIT)? {
                Ok(()) => Ok(()),
                Err(e) => bail!("{what}: {e}"),
            }
        };
        run(
            &mut self.vault_command(&init, direct, &state, "writer"),
            "init",
        )?;
        let old = w.old.display().to_string();
        let new = w.new.display().to_string();
        let put_old = ["--vault", target.as_str(), "put", old.as_str(), "w"];
        run(
            &mut self.vault_command(&put_old, direct, &state, "writer"),
            "putting the old version",
        )?;
        let put_new = ["--vault", target.as_str(), "put", new.as_str(), "w"];
        let write = timed(
            relay,
            &mut self.vault_command(&put_new, relay.port, &state, "writer"),
            "put",
        )?;
        if !read {
            return Ok(row(w, contender, &write, None));
        }
        let dst = dir.join("read");
        let dst_s = dst.display().to_string();
        let get = ["--vault", target.as_str(), "get", "w", dst_s.as_str()];
        let read = timed(
            relay,
            &mut self.vault_command(&get, relay.port, &state, "reader"),
            "get",
        )?;
        same_files(&w.new, &dst)?;
        Ok(row(w, contender, &write, Some(&read)))
    }

    /// Whole: the new version sealed whole and sent again; read back whole.
    fn whole_run(&self, w: &Workload, relay: &Relay, dir: &Path, read: bool) -> Result<Row> {
        fs::create_dir_all(dir)?;
        let tar = dir.join("new.tar");
        let st = Command::new("tar")
            .arg("-C")
            .arg(&w.new)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()?;
        if !st.success() {
            bail!("tar of {} failed", w.new.display());
        }
        let keys = ferry_vault::keys::VaultKeys::generate();
        let sealed = dir.join("new.sealed");
        fs::write(&sealed, keys.seal(&fs::read(&tar)?, b"whole"))?;
        let remote = dir.join("server.sealed");
        let ssh = |port: u16, redirect: String| {
            let opts = self.sshd.options("-p", port).join(" ");
            let mut c = Command::new("sh");
            c.arg("-c").arg(format!(
                "exec ssh -F /dev/null {opts} {} {redirect}",
                self.sshd.host()
            ));
            c
        };
        let write = timed(
            relay,
            &mut ssh(
                relay.port,
                format!("'cat > {}' < {}", remote.display(), sealed.display()),
            ),
            "upload",
        )?;
        if !read {
            return Ok(row(w, "Whole", &write, None));
        }
        let back = dir.join("back.sealed");
        let read = timed(
            relay,
            &mut ssh(
                relay.port,
                format!("'cat {}' > {}", remote.display(), back.display()),
            ),
            "download",
        )?;
        let plain = keys.open(&fs::read(&back)?, b"whole", "the sealed tar")?;
        let out = dir.join("read");
        fs::create_dir_all(&out)?;
        fs::write(dir.join("back.tar"), plain)?;
        let st = Command::new("tar")
            .arg("-C")
            .arg(&out)
            .arg("-xf")
            .arg(dir.join("back.tar"))
            .status()?;
        if !st.success() {
            bail!("untar failed");
        }
        same_files(&w.new, &out)?;
        Ok(row(w, "Whole", &write, Some(&read)))
    }
}

fn row(w: &Workload, contender: &str, write: &Measured, read: Option<&Measured>) -> Row {
    Row {
        workload: w.name.clone(),
        contender: contender.into(),
        write_up: write.up,
        write_down: write.down,
        write_s: write.secs,
        read_up: read.map_or(0, |r| r.up),
        read_down: read.map_or(0, |r| r.down),
        read_s: read.map_or(0.0, |r| r.secs),
        status: "ok".into(),
        ..Row::default()
    }
}

/// Seconds `bytes_up` and `bytes_down` take on `p` (at its rates alone).
fn estimate(p: &Profile, up: u64, down: u64) -> f64 {
    up as f64 * 8.0 / p.up_bps as f64 + down as f64 * 8.0 / p.down_bps as f64
}

/// Every contender on every workload and profile (fastest profile first).
pub fn run(
    lab: &Lab,
    wls: &[Workload],
    profiles: &mut [Profile],
    max_secs: f64,
) -> Result<Vec<Row>> {
    profiles.sort_by_key(|p| std::cmp::Reverse(p.up_bps));
    let mut rows: Vec<Row> = vec![];
    for p in profiles.iter_mut() {
        let relay = Relay::start(p.shape(), lab.sshd.addr)?;
        p.ssh_session = Some(lab.ssh_floor(&relay)?);
        let p = &*p;
        for w in wls {
            for c in CONTENDERS {
                // What this contender moved on a faster link, at this one's rates: the write
                // and the read are each run only when estimated within --max-whole.
                let before = rows
                    .iter()
                    .find(|r| r.workload == w.name && r.contender == c && r.status == "ok");
                let est = |f: &dyn Fn(&Row) -> (u64, u64)| {
                    before.map(|r| {
                        let (up, down) = f(r);
                        estimate(p, up, down)
                    })
                };
                let est_write = est(&|r| (r.write_up, r.write_down));
                let est_read = est(&|r| (r.read_up, r.read_down))
                    .filter(|_| before.is_some_and(|r| r.read_skipped.is_none()));
                let mut r = match est_write {
                    Some(e) if e > max_secs => Row {
                        workload: w.name.clone(),
                        contender: c.into(),
                        status: format!("skipped: about {e:.0} s (--max-whole)"),
                        ..Row::default()
                    },
                    _ => {
                        let read = est_read.is_none_or(|e| e <= max_secs)
                            && before.is_none_or(|r| r.read_skipped.is_none());
                        let dir = lab
                            .work
                            .join("vault-lab")
                            .join(format!("{}-{}-{c}", p.name, w.name));
                        let _ = fs::remove_dir_all(&dir);
                        let result = match c {
                            "Whole" => lab.whole_run(w, &relay, &dir, read),
                            _ => lab.vault_run(c, w, &relay, &dir, read),
                        };
                        let _ = fs::remove_dir_all(&dir);
                        let mut r = result.unwrap_or_else(|e| Row {
                            workload: w.name.clone(),
                            contender: c.into(),
                            status: format!("failed: {e:#}"),
                            ..Row::default()
                        });
                        if !read {
                            r.read_skipped = Some(est_read.map_or_else(
                                || format!("> {max_secs:.0} s"),
                                |e| format!("≈ {e:.0} s"),
                            ));
                        }
                        r
                    }
                };
                r.profile = p.name.clone();
                eprintln!(
                    "vault {:<9} {:<14} {:<12} write {:>10} up {:>7.2} s, read {:>10} down {:>7.2} s  {}",
                    r.profile,
                    r.workload,
                    r.contender,
                    human(r.write_up),
                    r.write_s,
                    human(r.read_down),
                    r.read_s,
                    r.status
                );
                rows.push(r);
            }
        }
    }
    Ok(rows)
}

/// The tables: write bytes against the near-ideal delta, write and read times.
pub fn markdown(rows: &[Row], infos: &[WorkloadInfo], profiles: &[Profile]) -> String {
    let mut s = String::from(
        "# The vault: OceanStore's Figures 6 and 7\n\n\
         Bytes at the emulated link (both ways) of writing the new version of each workload into \
         a vault holding the old one, and the time of that write and of a cold read of the new \
         version by another client. Whole: the version sealed whole and sent again; Block: \
         fixed 8 KiB blocks, changed ones sent; FileSummary: Ferry's vault (keyed \
         content-defined blocks, the server applying the actions); Ideal: the near-ideal \
         delta, unencrypted (`zstd -19 --patch-from`), bytes only. Every update includes the \
         ssh session's own bytes. A time marked ≈ was not measured (it would pass \
         --max-whole): it is the bytes measured on the fastest link at this link's rates.\n\n",
    );
    let get = |w: &str, p: &str, c: &str| {
        rows.iter()
            .find(|r| r.workload == w && r.profile == p && r.contender == c)
    };
    let floor = profiles
        .first()
        .and_then(|p| p.ssh_session)
        .map_or(0, |(u, d)| u + d);
    let rates = profiles;
    let profiles: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
    let fastest = profiles.first().copied().unwrap_or("");
    s += &format!(
        "## Figure 6: bytes per update (write, both ways)\n\nAn ssh session that does nothing \
         costs {} here; the last ratio leaves it out.\n\n| workload | new size | Whole | Block | \
         FileSummary | Ideal | FileSummary ÷ Ideal | (FileSummary − ssh) ÷ Ideal | commonality |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        human(floor)
    );
    for i in infos {
        let p = profiles.first().copied().unwrap_or("");
        let bytes = |c: &str| {
            get(&i.name, p, c)
                .filter(|r| r.status == "ok")
                .map(|r| r.write_up + r.write_down)
        };
        let cell = |c: &str| bytes(c).map_or("—".to_string(), human);
        let fs_b = bytes("FileSummary");
        let ratio = fs_b.map_or("—".into(), |b| {
            format!("{:.2}", b as f64 / i.ideal_bytes.max(1) as f64)
        });
        let net = fs_b.map_or("—".into(), |b| {
            format!(
                "{:.2}",
                b.saturating_sub(floor) as f64 / i.ideal_bytes.max(1) as f64
            )
        });
        // The paper's commonality: the part of the new version the update did not resend.
        let common = fs_b.map_or("—".into(), |b| {
            format!(
                "{:.0} %",
                100.0 * (1.0 - b as f64 / i.new_bytes.max(1) as f64).max(0.0)
            )
        });
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {ratio} | {net} | {common} |\n",
            i.name,
            human(i.new_bytes),
            cell("Whole"),
            cell("Block"),
            cell("FileSummary"),
            human(i.ideal_bytes)
        );
    }
    for (title, write) in [
        ("Figure 7 (left): write latency, seconds", true),
        ("Figure 7 (right): cold read latency, seconds", false),
    ] {
        s += &format!("\n## {title}\n\n| workload | link | Whole | Block | FileSummary |\n|---|---|---:|---:|---:|\n");
        for i in infos {
            for p in &profiles {
                let cell = |c: &str| {
                    let r = get(&i.name, p, c);
                    let ran = r.filter(|r| r.status == "ok" && (write || r.read_skipped.is_none()));
                    if let Some(r) = ran {
                        return format!("{:.2}", if write { r.write_s } else { r.read_s });
                    }
                    if r.is_some_and(|r| r.status.starts_with("failed")) {
                        return "failed".into();
                    }
                    // Not run on this link: the bytes measured on the fastest one, at this
                    // one's rates.
                    let base = get(&i.name, fastest, c).filter(|b| b.status == "ok");
                    let rates = rates.iter().find(|q| q.name == *p);
                    match (base, rates) {
                        (Some(b), Some(q)) => {
                            let (up, down) = match write {
                                true => (b.write_up, b.write_down),
                                false => (b.read_up, b.read_down),
                            };
                            format!("≈ {:.0} s", estimate(q, up, down))
                        }
                        _ => "—".into(),
                    }
                };
                s += &format!(
                    "| {} | {p} | {} | {} | {} |\n",
                    i.name,
                    cell("Whole"),
                    cell("Block"),
                    cell("FileSummary")
                );
            }
        }
    }
    let failed: Vec<&Row> = rows
        .iter()
        .filter(|r| r.status.starts_with("failed"))
        .collect();
    if !failed.is_empty() {
        s += "\n## Failures\n\n";
        for r in failed {
            s += &format!(
                "- {} {} {}: {}\n",
                r.profile, r.workload, r.contender, r.status
            );
        }
    }
    s
}
