//! `ferry similarity`: what LBFS's Table 1 measures, for any two files or trees.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use ferry_chunk::{ChunkReader, ChunkerSpec};
use ferry_format::{HashAlg, Id};
use serde::Serialize;

use crate::util::{files_under, human, ChunkerArgs, Ui};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    chunker: ChunkerArgs,
    /// Print a JSON report.
    #[arg(long)]
    json: bool,
    /// Run on a built-in example (a document edited three ways) with every chunker.
    #[arg(long, conflicts_with_all = ["old", "new"])]
    example: bool,
    /// The version the receiver already has (file or directory).
    #[arg(required_unless_present = "example")]
    old: Option<PathBuf>,
    /// The version to send (file or directory).
    #[arg(required_unless_present = "example")]
    new: Option<PathBuf>,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub chunker: String,
    pub old_files: usize,
    pub old_bytes: u64,
    pub new_files: usize,
    pub new_bytes: u64,
    /// Chunks of NEW (with repeats).
    pub chunks: u64,
    /// Distinct chunks of NEW that OLD lacks, and their bytes: what must travel.
    pub new_chunks: u64,
    pub new_data: u64,
    /// Share of NEW already present in OLD.
    pub overlap_pct: f64,
    /// The recipes of NEW's files (Recipe v1 encoding).
    pub recipe_bytes: u64,
    /// recipe_bytes + new_data: a chunk-level transfer.
    pub transfer_bytes: u64,
    /// The same with the new chunks compressed together (zstd -3).
    pub transfer_zstd_bytes: u64,
}

pub fn run(a: Args, ui: &Ui) -> Result<ExitCode> {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    if a.example {
        return example(a.json, &mut out);
    }
    let (old, new) = (a.old.unwrap(), a.new.unwrap());
    let spec = a.chunker.spec()?;
    let r = measure(&old, &new, &spec, ui)?;
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
    } else {
        writeln!(
            out,
            "old:       {} ({} files, {})",
            old.display(),
            r.old_files,
            human(r.old_bytes)
        )?;
        writeln!(
            out,
            "new:       {} ({} files, {})",
            new.display(),
            r.new_files,
            human(r.new_bytes)
        )?;
        writeln!(out, "chunker:   {}", r.chunker)?;
        writeln!(out, "chunks:    {} in new", r.chunks)?;
        writeln!(
            out,
            "new data:  {} in {} chunks",
            human(r.new_data),
            r.new_chunks
        )?;
        writeln!(out, "overlap:   {:.1} %", r.overlap_pct)?;
        writeln!(
            out,
            "transfer:  {} (recipes {} + new chunks {}); {} with the new chunks compressed",
            human(r.transfer_bytes),
            human(r.recipe_bytes),
            human(r.new_data),
            human(r.transfer_zstd_bytes)
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Chunks every file of OLD into a set, then counts what of NEW is outside it.
pub fn measure(old: &Path, new: &Path, spec: &ChunkerSpec, ui: &Ui) -> Result<Report> {
    let old_files = files_under(old)?;
    let new_files = files_under(new)?;
    let old_bytes: u64 = old_files.iter().map(|f| f.1).sum();
    let new_bytes: u64 = new_files.iter().map(|f| f.1).sum();
    let pb = ui.bytes_bar(old_bytes + new_bytes, "chunking");
    let mut known: HashSet<Id> = HashSet::new();
    for (path, _) in &old_files {
        for_each_chunk(path, spec, |data| {
            known.insert(Id::hash(HashAlg::Blake3, data));
            pb.inc(data.len() as u64);
            Ok(())
        })?;
    }
    let mut z = zstd::stream::Encoder::new(CountingSink(0), 3)?;
    let (mut chunks, mut new_chunks, mut new_data, mut recipe_bytes) = (0u64, 0u64, 0u64, 0u64);
    for (path, _) in &new_files {
        let mut n = 0u64;
        let mut lens = 0u64;
        for_each_chunk(path, spec, |data| {
            let id = Id::hash(HashAlg::Blake3, data);
            chunks += 1;
            n += 1;
            lens += varint_len(data.len() as u64);
            if known.insert(id) {
                new_chunks += 1;
                new_data += data.len() as u64;
                z.write_all(data)?;
            }
            pb.inc(data.len() as u64);
            Ok(())
        })?;
        // Recipe v1: magic, version, algorithm, count, then (length, digest) per chunk.
        recipe_bytes += 6 + varint_len(n) + lens + n * 32;
    }
    let compressed = z.finish()?.0;
    pb.finish_and_clear();
    Ok(Report {
        chunker: spec.describe(),
        old_files: old_files.len(),
        old_bytes,
        new_files: new_files.len(),
        new_bytes,
        chunks,
        new_chunks,
        new_data,
        overlap_pct: if new_bytes == 0 {
            100.0
        } else {
            100.0 * (1.0 - new_data as f64 / new_bytes as f64)
        },
        recipe_bytes,
        transfer_bytes: recipe_bytes + new_data,
        transfer_zstd_bytes: recipe_bytes + compressed,
    })
}

fn varint_len(v: u64) -> u64 {
    (64 - v.max(1).leading_zeros() as u64).div_ceil(7)
}

fn for_each_chunk(
    path: &Path,
    spec: &ChunkerSpec,
    mut f: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut r = ChunkReader::new(file, spec.build());
    while let Some(c) = r
        .next_chunk()
        .with_context(|| format!("cannot read {}", path.display()))?
    {
        f(c.data)?;
    }
    Ok(())
}

struct CountingSink(u64);

impl Write for CountingSink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A deterministic document of about 1 MiB of English-like text, and its edited version: a
/// paragraph inserted near the front, one word changed in the middle, 2 % appended.
pub fn example_versions() -> (Vec<u8>, Vec<u8>) {
    const WORDS: &[&str] = &[
        "the",
        "of",
        "and",
        "to",
        "in",
        "a",
        "is",
        "that",
        "for",
        "it",
        "as",
        "was",
        "with",
        "be",
        "by",
        "on",
        "not",
        "he",
        "this",
        "are",
        "or",
        "his",
        "from",
        "at",
        "which",
        "but",
        "have",
        "an",
        "had",
        "they",
        "you",
        "were",
        "their",
        "one",
        "all",
        "we",
        "can",
        "her",
        "has",
        "there",
        "been",
        "if",
        "more",
        "when",
        "will",
        "would",
        "who",
        "so",
        "no",
        "file",
        "server",
        "client",
        "chunk",
        "link",
        "bandwidth",
        "cache",
        "lease",
        "version",
        "network",
        "latency",
        "editor",
        "document",
        "compile",
        "object",
        "storage",
        "transfer",
        "protocol",
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut paragraph = |min_words: u64| {
        let mut p = String::new();
        let n = min_words + next() % 80;
        for i in 0..n {
            let w = WORDS[(next() % WORDS.len() as u64) as usize];
            p.push_str(w);
            p.push(if i + 1 == n {
                '.'
            } else if next() % 12 == 0 {
                ','
            } else {
                ' '
            });
            if i + 1 < n && p.ends_with(',') {
                p.push(' ');
            }
        }
        p.push_str("\n\n");
        p
    };
    let mut old = String::new();
    while old.len() < 1 << 20 {
        old.push_str(&paragraph(40));
    }
    let mut new = old.clone();
    let at = new[new.len() / 10..].find("\n\n").unwrap() + new.len() / 10 + 2;
    new.insert_str(at, &paragraph(60));
    let mid = new[new.len() / 2..].find(" the ").unwrap() + new.len() / 2;
    new.replace_range(mid..mid + 5, " THE ");
    while new.len() < old.len() * 102 / 100 {
        new.push_str(&paragraph(40));
    }
    (old.into_bytes(), new.into_bytes())
}

fn example(json: bool, out: &mut impl Write) -> Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let (old, new) = example_versions();
    let (po, pn) = (dir.path().join("old.txt"), dir.path().join("new.txt"));
    std::fs::write(&po, &old)?;
    std::fs::write(&pn, &new)?;
    let quiet = Ui { quiet: true };
    let mut reports = vec![];
    for spec in [
        ChunkerSpec::default(),
        ChunkerSpec::lbfs(),
        ChunkerSpec::fixed(8192),
    ] {
        reports.push(measure(&po, &pn, &spec, &quiet)?);
    }
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&reports)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "Example: a {} document saved again after an edit (a paragraph inserted near the front,\none word changed, 2 % appended). What must travel to bring the old copy up to date:\n",
        human(old.len() as u64)
    )?;
    writeln!(
        out,
        "{:<32} {:>7} {:>11} {:>8} {:>11} {:>11}",
        "chunker", "chunks", "new data", "overlap", "transfer", "+zstd"
    )?;
    for r in &reports {
        writeln!(
            out,
            "{:<32} {:>7} {:>11} {:>7.1}% {:>11} {:>11}",
            r.chunker,
            r.chunks,
            human(r.new_data),
            r.overlap_pct,
            human(r.transfer_bytes),
            human(r.transfer_zstd_bytes)
        )?;
    }
    writeln!(
        out,
        "\nwhole file: {}, compressed (zstd -3): {}",
        human(new.len() as u64),
        human(zstd::bulk::compress(&new, 3)?.len() as u64)
    )?;
    Ok(ExitCode::SUCCESS)
}
