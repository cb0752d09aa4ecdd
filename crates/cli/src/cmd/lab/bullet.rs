//! `ferry lab --bullet`: the Bullet paper's Figures 2 and 3 today. Read, and create+delete,
//! delay and bandwidth for objects of 1 B to 64 MiB, all servers on this machine over
//! loopback in one run: Ferry's object service (the daemon's peer side: TLS, pinned keys) at
//! durability 0, 1 and 2 (a second daemon as the replica), a real S3 server (versitygw, PUT,
//! GET, DELETE) and a file server (sshfs through a loopback sshd: create, read, unlink); and
//! the disk's own sequential rates beside them.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry_proto::{Reply, Request};
use serde::Serialize;

use super::Lab;

/// Object sizes measured (Bullet's: 1 B to 1 MiB; and 64 MiB).
const SIZES: [u64; 7] = [1, 16, 256, 4 << 10, 64 << 10, 1 << 20, 64 << 20];

/// How many of each operation are timed at `size`.
fn reps(size: u64, quick: bool) -> usize {
    match (size, quick) {
        (s, _) if s >= 64 << 20 => 3,
        (s, true) if s >= 1 << 20 => 5,
        (_, true) => 20,
        (s, false) if s >= 1 << 20 => 20,
        _ => 200,
    }
}

/// One server's figures at one size.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub server: String,
    pub size: u64,
    /// Median milliseconds of one read of the whole object, and of one create followed by
    /// one delete.
    pub read_ms: f64,
    pub create_delete_ms: f64,
    /// Bytes per second of a read, and of a create (its median time alone).
    pub read_mb_s: f64,
    pub create_mb_s: f64,
    pub ops: usize,
    pub status: String,
}

/// What each server is asked to do.
trait Server {
    fn name(&self) -> String;
    /// Creates an object of `data`; returns what names it.
    fn create(&mut self, data: &[u8], n: usize) -> Result<String>;
    fn read(&mut self, name: &str) -> Result<Vec<u8>>;
    fn delete(&mut self, name: &str) -> Result<()>;
}

/// Times `reps` create+delete pairs and `reps` reads of one object of `size` bytes.
fn measure(s: &mut dyn Server, size: u64, quick: bool) -> Row {
    let n = reps(size, quick);
    let data = super::incompressible(size ^ 0xb0b, size as usize);
    let mut row = Row {
        server: s.name(),
        size,
        read_ms: 0.0,
        create_delete_ms: 0.0,
        read_mb_s: 0.0,
        create_mb_s: 0.0,
        ops: n,
        status: "ok".into(),
    };
    let r = (|| -> Result<()> {
        let (mut pairs, mut creates, mut reads) = (vec![], vec![], vec![]);
        for i in 0..n {
            let t = Instant::now();
            let name = s.create(&data, i)?;
            let c = t.elapsed().as_secs_f64();
            s.delete(&name)?;
            pairs.push(t.elapsed().as_secs_f64());
            creates.push(c);
        }
        let name = s.create(&data, n)?;
        for _ in 0..n {
            let t = Instant::now();
            let got = s.read(&name)?;
            reads.push(t.elapsed().as_secs_f64());
            if got != data {
                bail!("a read returned other bytes ({} of {size})", got.len());
            }
        }
        s.delete(&name)?;
        let (p, c, r) = (median(&mut pairs), median(&mut creates), median(&mut reads));
        row.create_delete_ms = p * 1e3;
        row.read_ms = r * 1e3;
        row.create_mb_s = size as f64 / c / 1e6;
        row.read_mb_s = size as f64 / r / 1e6;
        Ok(())
    })();
    if let Err(e) = r {
        row.status = format!("failed: {e:#}");
    }
    row
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Ferry's object service through a daemon's peer side.
struct Ferry {
    session: ferry_fs::Session,
    durability: u8,
    /// A key the replica does not know: its copies are deleted with their capabilities alone,
    /// which any key may present; the session is kept for the next.
    guest: ferry_net::Identity,
    replica: Option<ferry_fs::Session>,
}

impl Server for Ferry {
    fn name(&self) -> String {
        format!("ferry P={}", self.durability)
    }

    fn create(&mut self, data: &[u8], _: usize) -> Result<String> {
        // One request up to 1 MiB; larger objects in pieces of 1 MiB, sent without waiting
        // for each answer (the last one's is the object's).
        const PIECE: usize = 1 << 20;
        let first = data.len().min(PIECE);
        let conn = &mut self.session.conn;
        let mut ids = vec![conn.send(Request::ObjectCreate {
            durability: self.durability,
            size: data.len() as u64,
            data: data[..first].to_vec(),
        })?];
        for piece in data[first..].chunks(PIECE) {
            ids.push(conn.send(Request::ObjectAppend {
                data: piece.to_vec(),
            })?);
        }
        conn.flush()?;
        let mut r = vec![];
        for id in ids {
            r = conn.replies(id)?;
        }
        match r.into_iter().next() {
            Some(Reply::Created { durability, ticket }) if durability >= self.durability => {
                Ok(ferry_daemon::Ticket::from_bytes(&ticket)?.to_string())
            }
            r => bail!("{r:?} to a create"),
        }
    }

    fn read(&mut self, name: &str) -> Result<Vec<u8>> {
        // Every piece asked for at once (at most MAX_OBJECT_READ each), the answers collected
        // in order: the server's reading overlaps the link's carrying.
        let t: ferry_daemon::Ticket = name.parse()?;
        let cap = t.cap.to_bytes();
        let conn = &mut self.session.conn;
        let mut ids = vec![];
        let mut offset = 0;
        while offset < t.size.max(1) {
            let len = (t.size - offset).min(ferry_fs::MAX_OBJECT_READ);
            ids.push(conn.send(Request::ObjectRead {
                cap: cap.clone(),
                offset,
                len,
            })?);
            offset += len.max(1);
        }
        conn.flush()?;
        let mut out = Vec::with_capacity(t.size as usize);
        for id in ids {
            for reply in conn.replies(id)? {
                match reply {
                    Reply::Range { data, .. } => out.extend_from_slice(&data),
                    r => bail!("{r:?} to a read"),
                }
            }
        }
        Ok(out)
    }

    fn delete(&mut self, name: &str) -> Result<()> {
        let t: ferry_daemon::Ticket = name.parse()?;
        self.session.conn.call(Request::ObjectDelete {
            cap: t.cap.to_bytes(),
        })?;
        // A durability-2 object's copy goes too, as `ferry object rm` does.
        for h in t.hints.iter().filter(|h| h.cap.is_some()) {
            if self.replica.is_none() {
                let (ep, key) = ferry_daemon::fetch::parse_peer(&h.uri)?;
                self.replica = Some(ferry_net::connect_pinned(&ep, &self.guest, key)?);
            }
            let cap = h.cap.as_ref().expect("filtered").to_bytes();
            let s = self.replica.as_mut().expect("connected");
            s.conn.call(Request::ObjectDelete { cap })?;
        }
        Ok(())
    }
}

/// An S3 server (versitygw, started here, stopped when dropped): PUT, GET, DELETE of one key
/// per object through the S3 store's client (SigV4, kept-alive HTTP/1.1 connections).
struct S3 {
    _server: ferry_s3::testing::S3Server,
    client: ferry_s3::Client,
}

impl S3 {
    fn start(dir: &Path) -> Result<S3> {
        let server = ferry_s3::testing::S3Server::start(dir, 0)?;
        let client = ferry_s3::Client::new(&server.resolved(), "bullet", Default::default())?;
        client.create_bucket()?;
        Ok(S3 {
            _server: server,
            client,
        })
    }
}

impl Server for S3 {
    fn name(&self) -> String {
        "S3 (versitygw)".into()
    }

    fn create(&mut self, data: &[u8], n: usize) -> Result<String> {
        let key = format!("o{n}-{}", data.len());
        self.client.put(&key, data, ferry_s3::Cond::None)?;
        Ok(key)
    }

    fn read(&mut self, key: &str) -> Result<Vec<u8>> {
        self.client
            .get(key, None)?
            .ok_or_else(|| anyhow::anyhow!("GET {key}: not there"))
    }

    fn delete(&mut self, key: &str) -> Result<()> {
        Ok(self.client.delete(key)?)
    }
}

/// A file server through a mount: create (write, close), read, unlink.
struct Files {
    name: String,
    dir: PathBuf,
}

impl Server for Files {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn create(&mut self, data: &[u8], n: usize) -> Result<String> {
        let p = self.dir.join(format!("o{n}-{}", data.len()));
        let mut f = fs::File::create(&p)?;
        f.write_all(data)?;
        drop(f);
        Ok(p.to_string_lossy().into_owned())
    }

    fn read(&mut self, p: &str) -> Result<Vec<u8>> {
        let mut out = vec![];
        fs::File::open(p)?.read_to_end(&mut out)?;
        Ok(out)
    }

    fn delete(&mut self, p: &str) -> Result<()> {
        Ok(fs::remove_file(p)?)
    }
}

/// A process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(|h| Path::new(&h).join("go/bin"));
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(home)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// sshfs of `dir` through the lab's sshd (loopback, no relay).
fn sshfs(lab: &Lab, dir: &Path, at: &Path) -> Result<Proc> {
    which("sshfs").context("sshfs not found (apt-get install sshfs)")?;
    fs::create_dir_all(dir)?;
    fs::create_dir_all(at)?;
    let mut ssh = vec!["ssh".to_string(), "-F".into(), "/dev/null".into()];
    ssh.extend(lab.sshd.options("-p", lab.sshd.addr.port()));
    let child = Command::new("sshfs")
        .arg("-f")
        .arg("-o")
        .arg(format!("ssh_command={}", ssh.join(" ")))
        .arg(format!("{}:{}", lab.sshd.host(), dir.display()))
        .arg(at)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let p = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mounted = fs::read_to_string("/proc/self/mounts")?
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(&*at.to_string_lossy()));
        if mounted {
            return Ok(p);
        }
        if Instant::now() > deadline {
            bail!("sshfs did not mount {}", at.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two daemons: A serves, R keeps copies for A (durability 2); the lab's key is authorized
/// at A. Returns them and a session with A's peer side.
fn daemons(lab: &Lab, dir: &Path) -> Result<(Vec<super::dot::Daemon>, ferry_fs::Session)> {
    let a = super::dot::Daemon::start(lab, &dir.join("a"), "127.0.0.1:0", "127.0.0.1")?;
    let r = super::dot::Daemon::start(lab, &dir.join("r"), "127.0.0.1:0", "127.0.0.1")?;
    fs::write(dir.join("r/authorized_keys"), format!("{} a\n", a.key))?;
    let me_dir = dir.join("client");
    fs::create_dir_all(&me_dir)?;
    let (me, _) = ferry_net::Identity::load_or_create(&me_dir)?;
    fs::write(
        dir.join("a/authorized_keys"),
        format!("{} lab\n", me.fingerprint()),
    )?;
    let (listen_a, listen_r) = (a.listen()?, r.listen()?);
    super::output(&mut a.cmd(&["daemon", "replica", "add", &format!("ferry://{listen_r}")]))?;
    let ep =
        ferry_net::Endpoint::parse(&format!("ferry://{listen_a}")).context("A's address")??;
    let session = ferry_net::connect_pinned(&ep, &me, a.key.parse()?)?;
    Ok((vec![a, r], session))
}

/// The disk's sequential rates where the servers keep their data: writing 256 MiB and
/// syncing it, and reading it back with the page cache dropped for the file.
fn disk(dir: &Path) -> Result<(f64, f64)> {
    let p = dir.join("disk-probe");
    let data = super::incompressible(7, 64 << 20);
    let t = Instant::now();
    let mut f = fs::File::create(&p)?;
    for _ in 0..4 {
        f.write_all(&data)?;
    }
    f.sync_all()?;
    let write = (256 << 20) as f64 / t.elapsed().as_secs_f64() / 1e6;
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
    drop(f);
    let t = Instant::now();
    let mut buf = vec![0; 8 << 20];
    let mut f = fs::File::open(&p)?;
    while f.read(&mut buf)? > 0 {}
    let read = (256 << 20) as f64 / t.elapsed().as_secs_f64() / 1e6;
    fs::remove_file(&p)?;
    Ok((write, read))
}

/// Everything measured.
#[derive(Debug, Serialize)]
pub struct Report {
    pub rows: Vec<Row>,
    pub disk_write_mb_s: f64,
    pub disk_read_mb_s: f64,
}

pub fn run(lab: &Lab, quick: bool) -> Result<Report> {
    let dir = lab.work.join("bullet");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let (disk_write_mb_s, disk_read_mb_s) = disk(&dir)?;
    let (_daemons, session) = daemons(lab, &dir.join("ferry"))?;
    let guest_dir = dir.join("guest");
    fs::create_dir_all(&guest_dir)?;
    let mut ferry = Ferry {
        session,
        durability: 0,
        guest: ferry_net::Identity::load_or_create(&guest_dir)?.0,
        replica: None,
    };
    let mut keep: Vec<Proc> = vec![];
    let mut others: Vec<Box<dyn Server>> = vec![];
    match S3::start(&dir.join("s3")) {
        Ok(s3) => others.push(Box::new(s3)),
        Err(e) => eprintln!("ferry lab: no S3 server: {e:#}"),
    }
    let at = dir.join("sshfs-mnt");
    match sshfs(lab, &dir.join("files"), &at) {
        Ok(p) => {
            keep.push(p);
            others.push(Box::new(Files {
                name: "file server (sshfs)".into(),
                dir: at.clone(),
            }));
        }
        Err(e) => eprintln!("ferry lab: no file server: {e:#}"),
    }
    let mut rows = vec![];
    for size in SIZES {
        for p in [0, 1, 2] {
            ferry.durability = p;
            rows.push(measure(&mut ferry, size, quick));
        }
        for s in others.iter_mut() {
            rows.push(measure(&mut **s, size, quick));
        }
    }
    drop(others);
    let _ = Command::new("fusermount3").arg("-u").arg(&at).status();
    drop(keep);
    Ok(Report {
        rows,
        disk_write_mb_s,
        disk_read_mb_s,
    })
}

/// The report as Markdown: one table per size, and the ratios the issue asks about.
pub fn markdown(r: &Report) -> String {
    let mut md = String::from(
        "# Bullet's Figures 2 and 3, today\n\n\
         Medians over the operations counted; all servers on this machine over loopback, in one \
         run. `ferry P=N`: Ferry's object service (the daemon's peer side, TLS 1.3) at \
         durability N (0: answered once in RAM; 1: synced to disk; 2: also held by a second \
         daemon, which fetches it from the first). Reads are of one object read again and \
         again (every chunk verified).\n\n",
    );
    md.push_str(&format!(
        "The disk under them: {:.0} MB/s writing 256 MiB and syncing it, {:.0} MB/s reading it \
         back with the page cache dropped for the file.\n\n",
        r.disk_write_mb_s, r.disk_read_mb_s
    ));
    md.push_str("| size | server | read ms | read MB/s | create+delete ms | create MB/s | ops |\n");
    md.push_str("|---:|---|---:|---:|---:|---:|---:|\n");
    for row in &r.rows {
        if row.status != "ok" {
            md.push_str(&format!(
                "| {} | {} | {} | | | | |\n",
                human(row.size),
                row.server,
                row.status
            ));
            continue;
        }
        md.push_str(&format!(
            "| {} | {} | {:.3} | {:.1} | {:.3} | {:.1} | {} |\n",
            human(row.size),
            row.server,
            row.read_ms,
            row.read_mb_s,
            row.create_delete_ms,
            row.create_mb_s,
            row.ops
        ));
    }
    md.push_str("\n## Against the S3 server (rates: operations per second, higher is better)\n\n");
    md.push_str(
        "| size | read, P=1 | create+delete, P=0 | create+delete, P=1 | create+delete, P=2 |\n",
    );
    md.push_str("|---:|---:|---:|---:|---:|\n");
    let find = |server: &str, size: u64| {
        r.rows
            .iter()
            .find(|x| x.server == server && x.size == size && x.status == "ok")
    };
    for size in SIZES {
        let Some(s3) = find("S3 (versitygw)", size) else {
            continue;
        };
        let ratio = |p: u8, read: bool| match find(&format!("ferry P={p}"), size) {
            Some(f) if read => format!("{:.2} ×", s3.read_ms / f.read_ms),
            Some(f) => format!("{:.2} ×", s3.create_delete_ms / f.create_delete_ms),
            None => "–".into(),
        };
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            human(size),
            ratio(1, true),
            ratio(0, false),
            ratio(1, false),
            ratio(2, false)
        ));
    }
    if let Some(f) = find("ferry P=1", 64 << 20) {
        md.push_str(&format!(
            "\n64 MiB at P=1: reads at {:.0} % of the disk's read rate, creates at {:.0} % of its \
             write rate (both include verifying or hashing every byte).\n",
            100.0 * f.read_mb_s / r.disk_read_mb_s,
            100.0 * f.create_mb_s / r.disk_write_mb_s
        ));
    }
    md
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}
