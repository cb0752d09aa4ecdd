//! Packet loss for the lab: the sshd runs in a network namespace of its own, reached over a
//! veth pair whose far end drops TCP packets at random both ways (an nftables rule: real loss
//! in the kernel, since this kernel has no `netem`). Rate and delay stay in the user-space
//! relay in front of it (`link.rs`), so a lost packet is recovered over the short hop between
//! the relay and the server: loss shows as stalls and slower starts, not as a full emulated
//! round trip per loss, and the relay's byte counts (payload, as each tool sent it) do not
//! include retransmissions. Root only; the namespace goes when the lab ends.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

pub struct Netns {
    name: String,
    host_if: String,
    /// The server's address inside the namespace.
    pub addr: Ipv4Addr,
}

fn run(args: &[&str], input: Option<&str>) -> Result<()> {
    let mut c = Command::new(args[0]);
    c.args(&args[1..])
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c
        .spawn()
        .with_context(|| format!("cannot run {} (apt-get install iproute2 nftables)", args[0]))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        std::io::Write::write_all(&mut stdin, text.as_bytes())?;
    }
    let o = child.wait_with_output()?;
    if !o.status.success() {
        bail!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

impl Netns {
    /// A namespace whose link drops `loss_pct` % of TCP packets each way.
    pub fn create(loss_pct: f64) -> Result<Netns> {
        if !rustix::process::getuid().is_root() {
            bail!("--loss needs root (a network namespace and an nftables rule)");
        }
        let id = std::process::id();
        let (host_if, ns_if) = (
            format!("flh{}", id % 100_000),
            format!("fln{}", id % 100_000),
        );
        let ns = Netns {
            name: format!("ferrylab{id}"),
            host_if: host_if.clone(),
            addr: Ipv4Addr::new(10, 213, (id % 250) as u8, 2),
        };
        let host_addr = format!("10.213.{}.1/30", id % 250);
        let ns_addr = format!("{}/30", ns.addr);
        run(&["ip", "netns", "add", &ns.name], None)?;
        // From here on, dropping `ns` removes the namespace (and the veth pair with it).
        run(
            &[
                "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
            ],
            None,
        )?;
        run(&["ip", "link", "set", &ns_if, "netns", &ns.name], None)?;
        run(&["ip", "addr", "add", &host_addr, "dev", &host_if], None)?;
        run(&["ip", "link", "set", &host_if, "up"], None)?;
        run(
            &["ip", "-n", &ns.name, "addr", "add", &ns_addr, "dev", &ns_if],
            None,
        )?;
        run(&["ip", "-n", &ns.name, "link", "set", &ns_if, "up"], None)?;
        run(&["ip", "-n", &ns.name, "link", "set", "lo", "up"], None)?;
        // In ten-thousandths: numgen draws 0..9999 per packet.
        let n = (loss_pct * 100.0).round() as u32;
        let rules = format!(
            "table inet ferrylab {{\n\
               chain input {{ type filter hook input priority 0; policy accept; \
                 meta l4proto tcp numgen random mod 10000 < {n} drop; }}\n\
               chain output {{ type filter hook output priority 0; policy accept; \
                 meta l4proto tcp numgen random mod 10000 < {n} drop; }}\n\
             }}\n"
        );
        run(
            &["ip", "netns", "exec", &ns.name, "nft", "-f", "-"],
            Some(&rules),
        )?;
        Ok(ns)
    }

    /// The words that run a command inside the namespace.
    pub fn exec(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run(&["ip", "netns", "del", &self.name], None);
        // Gone with the namespace, unless setting up stopped before its far end moved in.
        let _ = run(&["ip", "link", "del", &self.host_if], None);
    }
}
