//! Corruption campaigns: what a failing disk, a bad cable or a careless copy does to bytes at
//! rest (bit flips, zeroed 4 KiB sectors, truncations, duplicated and swapped ranges), applied
//! at random to a copy of a pristine directory, one damage per trial, each trial checked by the
//! caller: wrong bytes are never returned with success, and what is damaged is named.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::model::Rng;

/// One damage to one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    /// One bit flipped.
    Flip { at: u64, bit: u8 },
    /// A 4 KiB sector (aligned) read back as zeros.
    ZeroSector { at: u64 },
    /// The file cut to `len` bytes.
    Truncate { len: u64 },
    /// `len` bytes from `from` copied over those at `to` (a record written twice).
    Duplicate { from: u64, len: u64, to: u64 },
    /// Two ranges of `len` bytes exchanged (records out of order).
    Swap { a: u64, b: u64, len: u64 },
}

/// A sector, as a disk loses it.
pub const SECTOR_4K: u64 = 4096;

impl Damage {
    /// A random damage to a file of `len` bytes (none for an empty file).
    pub fn pick(rng: &mut Rng, len: u64) -> Option<Damage> {
        if len == 0 {
            return None;
        }
        let at = rng.range(0, len - 1);
        Some(match rng.next_u64() % 8 {
            0..=2 => Damage::Flip {
                at,
                bit: (rng.next_u64() % 8) as u8,
            },
            3 => Damage::ZeroSector {
                at: at / SECTOR_4K * SECTOR_4K,
            },
            4 => Damage::Truncate { len: at },
            5 | 6 if len >= 2 => {
                let n = rng.range(1, (len / 2).clamp(1, 8192));
                let from = rng.range(0, len - n);
                let to = rng.range(0, len - n);
                if rng.chance(2) {
                    Damage::Duplicate { from, len: n, to }
                } else {
                    Damage::Swap {
                        a: from,
                        b: to,
                        len: n,
                    }
                }
            }
            _ => Damage::Flip { at, bit: 0 },
        })
    }

    /// Does the damage to the file at `path`. Returns whether any byte changed.
    pub fn apply(&self, path: &Path) -> io::Result<bool> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        let len = f.metadata()?.len();
        let read = |at: u64, n: u64| -> io::Result<Vec<u8>> {
            let mut b = vec![0; n.min(len.saturating_sub(at)) as usize];
            f.read_exact_at(&mut b, at)?;
            Ok(b)
        };
        match *self {
            Damage::Flip { at, bit } => {
                let mut b = read(at, 1)?;
                b[0] ^= 1 << bit;
                f.write_all_at(&b, at)?;
                Ok(true)
            }
            Damage::ZeroSector { at } => {
                let old = read(at, SECTOR_4K)?;
                f.write_all_at(&vec![0; old.len()], at)?;
                Ok(old.iter().any(|&b| b != 0))
            }
            Damage::Truncate { len: to } => {
                f.set_len(to)?;
                Ok(to < len)
            }
            Damage::Duplicate { from, len: n, to } => {
                let before = read(0, len)?;
                f.write_all_at(&read(from, n)?, to)?;
                Ok(read(0, len)? != before)
            }
            Damage::Swap { a, b, len: n } => {
                let before = read(0, len)?;
                let (x, y) = (read(a, n)?, read(b, n)?);
                f.write_all_at(&y, a)?;
                f.write_all_at(&x, b)?;
                Ok(read(0, len)? != before)
            }
        }
    }
}

/// The regular files beneath `dir`, sorted.
pub fn files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Copies the tree at `from` to `to` (which must not exist): directories and regular files.
pub fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type()?.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// How each trial of a campaign ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Something refused to read, and the damage was named (an error, or a check that names it).
    Caught,
    /// Everything read back right: the damage touched nothing read, or recovery repaired it.
    Harmless,
}

/// A campaign's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub tried: u64,
    pub caught: u64,
    pub harmless: u64,
}

/// Runs `trials` trials: each copies `pristine` to a fresh directory, damages one of its files
/// (chosen by `pick_file` among them) once, and hands it to `check`, which returns the outcome
/// or an error when wrong bytes came back with success or damage went unnamed. Stops at the
/// first error, naming the trial, the file and the damage.
pub fn campaign(
    pristine: &Path,
    trials: u64,
    seed: u64,
    mut check: impl FnMut(&Path, &Path, &Damage) -> Result<Outcome, String>,
) -> Result<Tally, String> {
    let targets = files(pristine).map_err(|e| e.to_string())?;
    let sizes: Vec<u64> = targets
        .iter()
        .map(|p| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .collect();
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    let work = tempfile::Builder::new()
        .prefix("ferry-campaign-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let mut trial = 0u64;
    while tally.tried < trials {
        trial += 1;
        // Half the trials on any file, half weighted by size (packs and blocks hold the data).
        let i = if rng.chance(2) {
            rng.range(0, targets.len() as u64 - 1) as usize
        } else {
            let total: u64 = sizes.iter().sum::<u64>().max(1);
            let mut at = rng.range(0, total - 1);
            sizes
                .iter()
                .position(|&s| {
                    let hit = at < s;
                    at = at.saturating_sub(s);
                    hit
                })
                .unwrap_or(0)
        };
        let Some(damage) = Damage::pick(&mut rng, sizes[i]) else {
            continue;
        };
        let dir = work.path().join(format!("t{trial}"));
        copy_tree(pristine, &dir).map_err(|e| e.to_string())?;
        let rel = targets[i].strip_prefix(pristine).expect("beneath");
        let file = dir.join(rel);
        if !damage.apply(&file).map_err(|e| e.to_string())? {
            fs::remove_dir_all(&dir).map_err(|e| e.to_string())?;
            continue;
        }
        tally.tried += 1;
        match check(&dir, rel, &damage) {
            Ok(Outcome::Caught) => tally.caught += 1,
            Ok(Outcome::Harmless) => tally.harmless += 1,
            Err(e) => {
                return Err(format!(
                    "trial {trial} (seed {seed}): {} damaged by {damage:?}: {e}",
                    rel.display()
                ))
            }
        }
        fs::remove_dir_all(&dir).map_err(|e| e.to_string())?;
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_damage_changes_what_it_says() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let mut rng = Rng(7);
        let mut kinds = std::collections::HashSet::new();
        for _ in 0..500 {
            fs::write(&p, &data).unwrap();
            let d = Damage::pick(&mut rng, data.len() as u64).unwrap();
            let changed = d.apply(&p).unwrap();
            assert_eq!(changed, fs::read(&p).unwrap() != data, "{d:?}");
            kinds.insert(std::mem::discriminant(&d));
        }
        assert_eq!(kinds.len(), 5);
    }
}
