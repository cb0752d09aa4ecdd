//! The lab's workloads: each a directory pair `old` → `new` (the receiver holds `old`, the
//! sender `new`). Built-in ones are generated here, deterministically, with nothing to
//! download; the public set (real releases from the package registries) is built by
//! `lab/workloads.sh` into a directory of `<name>/{old,new}` that `--workloads` names.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cmd::demo::{edit, make_project, source, Rng};

pub struct Workload {
    pub name: String,
    pub old: PathBuf,
    pub new: PathBuf,
}

/// The built-in workloads, generated under `dir`.
pub const BUILTIN: &[&str] = &["project-edit", "log-append", "doc-insert"];

/// Generates the built-in workload `name` under `dir`.
pub fn builtin(dir: &Path, name: &str) -> Result<Workload> {
    let (old, new) = (dir.join(name).join("old"), dir.join(name).join("new"));
    let _ = fs::remove_dir_all(dir.join(name));
    fs::create_dir_all(&old)?;
    match name {
        // A source tree after a morning's work: lines added to 8 files, one file added, one
        // removed (LBFS's edits to a source tree).
        "project-edit" => {
            make_project(&old)?;
            copy_tree(&old, &new)?;
            for (i, m) in [0, 1, 3, 4, 6, 7, 9, 11].iter().enumerate() {
                let f = new.join(format!("src/module{m:02}/file{:02}.rs", i * 2));
                edit(
                    &f,
                    &format!("    // reviewed: keep the lease short ({i})\n"),
                )?;
            }
            let mut rng = Rng(0x1ab);
            fs::write(new.join("src/module05/added.rs"), source(&mut rng, 300))?;
            fs::remove_file(new.join("src/module02/file07.rs"))?;
        }
        // A mail spool or log with 2 % appended (LBFS's mbox).
        "log-append" => {
            let mut rng = Rng(0x106);
            let mut text = String::new();
            while text.len() < 4 << 20 {
                text.push_str(&source(&mut rng, 40));
            }
            fs::write(old.join("spool"), &text)?;
            fs::create_dir_all(&new)?;
            while text.len() < (4 << 20) + (80 << 10) {
                text.push_str(&source(&mut rng, 40));
            }
            fs::write(new.join("spool"), &text)?;
        }
        // A document saved after three insertions near its front (a word processor's save).
        "doc-insert" => {
            let mut rng = Rng(0xd0c);
            let text = source(&mut rng, 30_000);
            fs::write(old.join("report.txt"), &text)?;
            fs::create_dir_all(&new)?;
            let mut t = text.clone();
            for (at, what) in [
                (0.01, "A new opening line.\n"),
                (0.05, "Another.\n"),
                (0.2, "X\n"),
            ] {
                let i = t[..(t.len() as f64 * at) as usize]
                    .rfind('\n')
                    .map_or(0, |i| i + 1);
                t.insert_str(i, what);
            }
            fs::write(new.join("report.txt"), t)?;
        }
        _ => bail!(
            "no built-in workload {name} (built in: {})",
            BUILTIN.join(", ")
        ),
    }
    Ok(Workload {
        name: name.into(),
        old,
        new,
    })
}

/// The workloads in `dir`: every `<name>/{old,new}` pair, by name.
pub fn from_dir(dir: &Path) -> Result<Vec<Workload>> {
    let mut out = vec![];
    for e in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let p = e?.path();
        if p.join("old").is_dir() && p.join("new").is_dir() {
            out.push(Workload {
                name: p.file_name().unwrap_or_default().to_string_lossy().into(),
                old: p.join("old"),
                new: p.join("new"),
            });
        }
    }
    if out.is_empty() {
        bail!("{} holds no <name>/old and <name>/new pairs", dir.display());
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// `cp -a`: a copy keeping modes and times (as a receiver's old copy would be).
pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(to);
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()?;
    if !st.success() {
        bail!("cp -a {} {} failed", from.display(), to.display());
    }
    Ok(())
}

/// Bytes in the regular files under `dir`, and how many files.
pub fn size(dir: &Path) -> (u64, u64) {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| e.metadata().ok())
        .fold((0, 0), |(b, n), m| (b + m.len(), n + 1))
}
