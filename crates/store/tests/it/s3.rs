//! The S3 backend against a real S3 server (versitygw on loopback): several servers on one
//! store, resumed uploads, and a server that fails.

use std::path::Path;

use ferry_format::HashAlg;
use ferry_s3::testing::Versitygw;
use ferry_s3::{Locator, Options, S3Store};
use ferry_store::StoreError;

/// Small packs and windows, so tests cross their boundaries.
pub fn options(cache: &Path, create: bool) -> Options {
    Options {
        create,
        create_bucket: create,
        pack_target: 256 << 10,
        window: 128 << 10,
        cache_windows: 8,
        ..Options::new(cache)
    }
}

pub fn open(
    gw: &Versitygw,
    loc: &Locator,
    cache: &Path,
    create: bool,
) -> Result<S3Store, StoreError> {
    S3Store::open(loc, &gw.resolved(), options(cache, create))
}

pub fn open_alg(
    gw: &Versitygw,
    loc: &Locator,
    cache: &Path,
    alg: HashAlg,
) -> Result<S3Store, StoreError> {
    S3Store::open(
        loc,
        &gw.resolved(),
        Options {
            hash_alg: alg,
            ..options(cache, true)
        },
    )
}
