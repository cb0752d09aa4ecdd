//! `Server::index_export` (`ferry serve --stdio --index`): every file of the export recorded in
//! the chunk index at once, so that a later session (a lookaside provider over ssh) serves any
//! of their chunks by id; files the index holds as they are are not read again.

use std::fs;
use std::path::Path;

use ferry_chunk::ChunkerSpec;
use ferry_fs::{Export, Server, ServerOptions};

use crate::{connect_indexed, found, staging};

fn ids(data: &[u8]) -> Vec<ferry_format::Id> {
    let (recipe, _) = ferry_format::chunk_object(
        data,
        &ChunkerSpec::default(),
        ferry_format::HashAlg::Blake3,
        |_, _| Ok::<_, std::io::Error>(()),
    )
    .unwrap();
    recipe.chunks().iter().map(|c| c.id).collect()
}

fn index_once(root: &Path, index: &std::sync::Arc<ferry_store::PathIndex>) -> ferry_fs::IndexStats {
    let mut server = Server::new(
        Export::open(root).unwrap(),
        ServerOptions::default(),
        staging(),
    )
    .with_index(index.clone());
    server.index_export().unwrap()
}

#[test]
fn an_indexed_export_serves_every_chunk_by_id_and_reads_only_what_changed() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir_all(srv.join("d/e")).unwrap();
    let (a, b) = (crate::bytes(1, 300_000), crate::bytes(2, 40_000));
    fs::write(srv.join("a"), &a).unwrap();
    fs::write(srv.join("d/e/b"), &b).unwrap();
    // Not followed: a symlink, even to a file inside.
    std::os::unix::fs::symlink("a", srv.join("d/link")).unwrap();
    let index = std::sync::Arc::new(
        ferry_store::PathIndex::open(&t.path().join("i.redb"), ferry_format::HashAlg::Blake3)
            .unwrap(),
    );
    let first = index_once(&srv, &index);
    assert_eq!(
        (first.files, first.cut, first.bytes),
        (2, 2, 340_000),
        "{first:?}"
    );
    // A session that never read a file finds every chunk of both by id.
    let all: Vec<_> = ids(&a).into_iter().chain(ids(&b)).collect();
    let n = all.len();
    let got = found(&mut connect_indexed(&srv, index.clone()), all);
    assert_eq!(got.len(), n);
    // Again: nothing read. One file changed: it alone, and its new chunks are found.
    assert_eq!(index_once(&srv, &index).cut, 0);
    let b2 = crate::bytes(3, 50_000);
    fs::write(srv.join("d/e/b"), &b2).unwrap();
    let again = index_once(&srv, &index);
    assert_eq!(
        (again.files, again.cut, again.bytes),
        (2, 1, 50_000),
        "{again:?}"
    );
    let new = ids(&b2);
    let n = new.len();
    assert_eq!(
        found(&mut connect_indexed(&srv, index.clone()), new).len(),
        n
    );
}

/// Chunks the index places in a file gone since are not held (`Have`), and are forgotten
/// (together, after the request: one transaction, not one a chunk).
#[test]
fn chunks_of_a_file_gone_since_are_not_held_and_forgotten() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir_all(&srv).unwrap();
    let a = crate::bytes(4, 400_000);
    fs::write(srv.join("a"), &a).unwrap();
    let index = std::sync::Arc::new(
        ferry_store::PathIndex::open(&t.path().join("i.redb"), ferry_format::HashAlg::Blake3)
            .unwrap(),
    );
    index_once(&srv, &index);
    let all = ids(&a);
    assert!(all.iter().all(|id| index.locate(id).unwrap().is_some()));
    fs::remove_file(srv.join("a")).unwrap();
    let shorts = all.iter().map(ferry_proto::short_id).collect();
    let mut c = connect_indexed(&srv, index.clone());
    let r = c
        .call(ferry_proto::Request::Have {
            ids: ferry_proto::Ids::Short(shorts),
        })
        .unwrap();
    assert!(
        matches!(&r[..], [ferry_proto::Reply::Have(f)] if f.len() == all.len() && f.iter().all(|&h| !h)),
        "{r:?}"
    );
    assert!(all.iter().all(|id| index.locate(id).unwrap().is_none()));
}
