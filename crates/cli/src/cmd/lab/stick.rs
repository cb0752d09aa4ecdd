//! An emulated USB stick for the lookaside experiments: a small ext4 file system on a loop
//! device, its reads throttled by the block I/O controller to a stick's rate, mounted afresh
//! before each run so nothing of it is in the page cache (the lookaside paper unmounted its
//! stick between runs). Where the machine cannot (not root, no loop devices, no blkio
//! controller), a plain directory stands in and says so.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::output;

/// What a stick here is.
pub enum Stick {
    Device {
        image: PathBuf,
        loopdev: String,
        mnt: PathBuf,
        /// The blkio cgroup whose members' reads of the device are throttled.
        cgroup: PathBuf,
    },
    /// A plain directory (unthrottled, page-cached).
    Directory(PathBuf),
}

/// Reads of a Hi-Speed USB 2 stick: the lookaside paper's was 48 Mb/s nominal.
pub const STICK_READ_BPS: u64 = 6_000_000;

const BLKIO: &str = "/sys/fs/cgroup/blkio";

impl Stick {
    /// A stick of `bytes` under `dir`, or a directory there when one cannot be made.
    pub fn new(dir: &Path, bytes: u64) -> Stick {
        match Stick::device(dir, bytes) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("lab: no emulated stick ({e:#}); a plain directory stands in");
                let d = dir.join("stick-dir");
                let _ = fs::create_dir_all(&d);
                Stick::Directory(d)
            }
        }
    }

    fn device(dir: &Path, bytes: u64) -> Result<Stick> {
        if !Path::new(BLKIO).join("cgroup.procs").exists() {
            bail!("no blkio cgroup controller at {BLKIO}");
        }
        fs::create_dir_all(dir)?;
        let image = dir.join("stick.img");
        fs::File::create(&image)?.set_len(bytes)?;
        output(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))?;
        let loopdev = output(Command::new("losetup").args(["-f", "--show"]).arg(&image))?;
        let mnt = dir.join("stick");
        fs::create_dir_all(&mnt)?;
        let cgroup = Path::new(BLKIO).join(format!("ferry-lab-{}", std::process::id()));
        let stick = Stick::Device {
            image,
            loopdev: loopdev.clone(),
            mnt: mnt.clone(),
            cgroup: cgroup.clone(),
        };
        output(Command::new("mount").arg(&loopdev).arg(&mnt))?;
        fs::create_dir_all(&cgroup)?;
        // Interrupted (Ctrl-C, a kill), the lab leaves no mount, loop device or cgroup behind.
        let (l, m, c) = (loopdev.clone(), mnt.clone(), cgroup.clone());
        let _ = ctrlc::set_handler(move || {
            release(&l, &m, &c);
            std::process::exit(130);
        });
        let rdev = fs::metadata(&loopdev)
            .map(|m| std::os::unix::fs::MetadataExt::rdev(&m))
            .context("the loop device")?;
        let (major, minor) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
        fs::write(
            cgroup.join("blkio.throttle.read_bps_device"),
            format!("{major}:{minor} {STICK_READ_BPS}"),
        )
        .context("throttling the loop device")?;
        Ok(stick)
    }

    /// Where its files are.
    pub fn root(&self) -> &Path {
        match self {
            Stick::Device { mnt, .. } => mnt,
            Stick::Directory(d) => d,
        }
    }

    /// What it is, for the report.
    pub fn describe(&self) -> String {
        match self {
            Stick::Device { .. } => format!(
                "ext4 on a loop device, reads throttled to {} MB/s (a USB 2 stick), mounted afresh for each run",
                STICK_READ_BPS / 1_000_000
            ),
            Stick::Directory(_) => "a plain directory (no throttle, page-cached)".into(),
        }
    }

    /// Replaces its contents with a copy of `src` (unthrottled: this process is not in the
    /// cgroup), nothing else left.
    pub fn fill(&self, src: &Path) -> Result<()> {
        let root = self.root();
        for e in fs::read_dir(root)? {
            let p = e?.path();
            if p.file_name().is_some_and(|n| n == "lost+found") {
                continue;
            }
            match p.is_dir() && !p.is_symlink() {
                true => fs::remove_dir_all(&p)?,
                false => fs::remove_file(&p)?,
            }
        }
        output(
            Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", src.display()))
                .arg(root),
        )?;
        Ok(())
    }

    /// Unmounts and mounts it again: nothing of it stays in the page cache.
    pub fn cold(&self) -> Result<()> {
        if let Stick::Device { loopdev, mnt, .. } = self {
            output(Command::new("umount").arg(mnt))?;
            output(Command::new("mount").arg(loopdev).arg(mnt))?;
        }
        Ok(())
    }

    /// `cmd` run with the stick's throttle applying to its reads.
    pub fn throttled(&self, cmd: &Command) -> Command {
        let mut c = match self {
            Stick::Device { cgroup, .. } => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!(
                        "echo $$ > {}/cgroup.procs && exec \"$@\"",
                        cgroup.display()
                    ))
                    .arg("sh")
                    .arg(cmd.get_program());
                c
            }
            Stick::Directory(_) => Command::new(cmd.get_program()),
        };
        c.args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }
}

impl Drop for Stick {
    fn drop(&mut self) {
        if let Stick::Device {
            image,
            loopdev,
            mnt,
            cgroup,
        } = self
        {
            release(loopdev, mnt, cgroup);
            let _ = fs::remove_file(&*image);
        }
    }
}

/// Unmounts the stick, frees its loop device and removes its cgroup.
fn release(loopdev: &str, mnt: &Path, cgroup: &Path) {
    let _ = Command::new("umount").arg("-l").arg(mnt).status();
    let _ = Command::new("losetup").arg("-d").arg(loopdev).status();
    let _ = fs::remove_dir(cgroup);
}
