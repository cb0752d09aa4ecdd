//! Opening `s3://BUCKET/PREFIX` stores from the command line: credentials the AWS way
//! (environment, `~/.aws`), the index cached under the user's cache directory.

use anyhow::{Context, Result};
use ferry_s3::{Locator, Options, S3Store};

use crate::cmd::remote::cache_root;

/// Opens the store `locator` names; `create` makes the store (and its bucket) if missing.
pub fn open(locator: &str, create: bool) -> Result<S3Store> {
    let loc = Locator::parse(locator)?;
    let resolved = ferry_s3::config::resolve(&loc, &ferry_s3::config::ProcessEnv)?;
    // One cache per endpoint, bucket and prefix.
    let key =
        blake3::hash(format!("{}\n{}\n{}", resolved.endpoint, loc.bucket, loc.prefix).as_bytes());
    let cache = cache_root().join("s3").join(&key.to_hex()[..16]);
    let opts = Options {
        create,
        create_bucket: create,
        ..Options::new(cache)
    };
    S3Store::open(&loc, &resolved, opts).with_context(|| format!("cannot open {}", loc.display()))
}
