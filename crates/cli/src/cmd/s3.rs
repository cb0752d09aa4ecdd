//! Opening `s3://BUCKET/PREFIX` stores from the command line: credentials the AWS way
//! (environment, `~/.aws`), the index cached under the user's cache directory.

use anyhow::{Context, Result};
use ferry_s3::S3Store;

use crate::cmd::remote::cache_root;

/// Opens the store `locator` names; `create` makes the store (and its bucket) if missing.
pub fn open(locator: &str, create: bool) -> Result<S3Store> {
    S3Store::open_locator(locator, &cache_root().join("s3"), create, create)
        .with_context(|| format!("cannot open {locator}"))
}
