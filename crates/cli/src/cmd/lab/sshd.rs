//! An sshd on a loopback port with throwaway keys, so every contender (rsync, scp, Ferry over
//! a remote shell) reaches the "server" the way users reach theirs.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub struct Sshd {
    child: Child,
    pub addr: SocketAddr,
    key: PathBuf,
    user: String,
}

/// A free loopback port (free when asked; a race with another program is possible).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn keygen(path: &Path) -> Result<()> {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .status()
        .context("cannot run ssh-keygen (apt-get install openssh-client)")?;
    if !st.success() {
        bail!("ssh-keygen failed");
    }
    Ok(())
}

/// The sshd program: on PATH or in /usr/sbin.
fn sshd_program() -> Result<PathBuf> {
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin"])
    {
        let p = Path::new(dir).join("sshd");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("sshd not found (apt-get install openssh-server)")
}

impl Sshd {
    /// Starts sshd in `dir` (keys, configuration and logs go there), on loopback or inside
    /// the namespace `ns`.
    pub fn start(dir: &Path, ns: Option<&super::netns::Netns>) -> Result<Sshd> {
        let program = sshd_program()?;
        let (host, key) = (dir.join("host_ed25519"), dir.join("client_ed25519"));
        keygen(&host)?;
        keygen(&key)?;
        std::fs::copy(key.with_extension("pub"), dir.join("authorized_keys"))?;
        let port = free_port()?;
        let ip: std::net::Ipv4Addr = ns.map_or([127, 0, 0, 1].into(), |n| n.addr);
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress {ip}\nHostKey {host}\nAuthorizedKeysFile {auth}\n\
                 PidFile {pid}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel ERROR\n\
                 Subsystem sftp internal-sftp\nMaxStartups 100\n",
                host = host.display(),
                auth = dir.join("authorized_keys").display(),
                pid = dir.join("sshd.pid").display(),
            ),
        )?;
        // Privilege separation wants this directory (run as root).
        let _ = std::fs::create_dir_all("/run/sshd");
        let log = std::fs::File::create(dir.join("sshd.log"))?;
        // The server should die with the lab, even one killed by a signal: util-linux's
        // setpriv sets that up before starting it, when it is there.
        let mut words: Vec<String> = ns.map(|n| n.exec()).unwrap_or_default();
        if Command::new("setpriv")
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            words.extend(["setpriv".into(), "--pdeathsig".into(), "KILL".into()]);
        }
        words.push(program.display().to_string());
        let mut cmd = Command::new(&words[0]);
        cmd.args(&words[1..]);
        let child = cmd
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let addr: SocketAddr = (ip, port).into();
        let user = std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .or_else(|| {
                let o = Command::new("id").arg("-un").output().ok()?;
                Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
            })
            .unwrap_or_else(|| "root".into());
        let mut sshd = Sshd {
            child,
            addr,
            key,
            user,
        };
        let start = Instant::now();
        while TcpStream::connect(addr).is_err() {
            if let Some(st) = sshd.child.try_wait()? {
                let log = std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default();
                bail!("sshd exited ({st}): {log}");
            }
            // Generous: a loaded machine, or a link that drops the first SYNs, is slow here.
            if start.elapsed() > Duration::from_secs(60) {
                bail!("sshd did not start listening on {addr} within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(sshd)
    }

    /// `user@127.0.0.1`.
    pub fn host(&self) -> String {
        format!("{}@127.0.0.1", self.user)
    }

    /// ssh options for a connection through `port` (the relay's), as separate words; `-p` or
    /// `-P` (scp) for the port flag.
    pub fn options(&self, port_flag: &str, port: u16) -> Vec<String> {
        let mut o: Vec<String> = vec![
            port_flag.into(),
            port.to_string(),
            "-i".into(),
            self.key.display().to_string(),
        ];
        for opt in [
            "IdentitiesOnly=yes",
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            "BatchMode=yes",
            "LogLevel=ERROR",
            "Compression=no",
        ] {
            o.push("-o".into());
            o.push(opt.into());
        }
        o
    }

    /// The remote shell command (`ssh` and its options) as one string, for `-e`.
    pub fn rsh(&self, port: u16) -> String {
        let mut words = vec!["ssh".to_string(), "-F".into(), "/dev/null".into()];
        words.extend(self.options("-p", port));
        words.join(" ")
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
