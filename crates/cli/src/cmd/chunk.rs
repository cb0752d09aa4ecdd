//! `ferry chunk`: print recipes.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ferry_chunk::ChunkReader;
use ferry_format::{HashAlg, Id};

use crate::util::ChunkerArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    chunker: ChunkerArgs,
    /// Hash algorithm for chunk ids.
    #[arg(long, default_value = "blake3")]
    hash: HashAlg,
    /// One JSON object per chunk per line: {"file","offset","length","id"}.
    #[arg(long)]
    json: bool,
    /// Files to chunk ("-" for standard input).
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let spec = a.chunker.spec()?;
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    for path in &a.files {
        let name = path.display().to_string();
        let src: Box<dyn Read> = if name == "-" {
            Box::new(io::stdin().lock())
        } else {
            let meta = std::fs::metadata(path).with_context(|| format!("cannot read {name}"))?;
            if !meta.is_file() {
                anyhow::bail!("{name} is not a regular file");
            }
            Box::new(File::open(path).with_context(|| format!("cannot open {name}"))?)
        };
        if !a.json {
            writeln!(out, "# {name} ({})", spec.describe())?;
        }
        let mut r = ChunkReader::new(src, spec.build());
        let (mut n, mut total) = (0u64, 0u64);
        while let Some(c) = r
            .next_chunk()
            .with_context(|| format!("cannot read {name}"))?
        {
            let id = Id::hash(a.hash, c.data);
            if a.json {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({"file": name, "offset": c.offset, "length": c.data.len(), "id": id.to_string()})
                )?;
            } else {
                writeln!(out, "{:>12} {:>7} {id}", c.offset, c.data.len())?;
            }
            n += 1;
            total += c.data.len() as u64;
        }
        if !a.json {
            let avg = total.checked_div(n).unwrap_or(0);
            writeln!(out, "# {n} chunks, {total} bytes, average {avg}")?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
