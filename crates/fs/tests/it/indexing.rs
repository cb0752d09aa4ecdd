//! The server's chunk index: chunks cut by one session served by id to later ones (and to
//! others at once, when the first goes quiet); `Server::index_export` (`ferry serve --stdio
//! --index`): every file of the export recorded in the index at once, so that a later session
//! (a lookaside provider over ssh) serves any of their chunks by id; files the index holds as
//! they are are not read again.

use std::fs;
use std::path::Path;

use ferry_fs::{Export, Server, ServerOptions};

use std::os::unix::net::UnixStream;

use ferry_fs::Connection;
use ferry_proto::{Reply, Request};

use crate::{bytes, chunk_ids, serving_with, staging};

fn ids(data: &[u8]) -> Vec<ferry_format::Id> {
    chunk_ids(data).0
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

/// A server session with the chunk index `index` (shared by sessions over one export).
fn connect_indexed(
    root: &Path,
    index: std::sync::Arc<ferry_store::PathIndex>,
) -> Connection<UnixStream, UnixStream> {
    let b = serving_with(root, move |s| s.with_index(index));
    Connection::open(b.try_clone().unwrap(), b).unwrap()
}

/// The chunks a GetChunks by full id found (their places in the request).
fn found(c: &mut Connection<UnixStream, UnixStream>, ids: Vec<ferry_format::Id>) -> Vec<u32> {
    let r = c
        .call(Request::GetChunks(ferry_proto::GetChunks {
            ids: ferry_proto::Ids::Full(ids),
            at: None,
            against: None,
        }))
        .unwrap();
    r.into_iter()
        .flat_map(|r| match r {
            Reply::Chunks(c) => c.found,
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn chunks_cut_by_an_earlier_session_are_served_by_id() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir_all(srv.join("d")).unwrap();
    let content = bytes(71, 200_000);
    fs::write(srv.join("d/f"), &content).unwrap();
    let (ids, oid) = chunk_ids(&content);
    let path = t.path().join("index.redb");
    let index = |p: &Path| {
        std::sync::Arc::new(ferry_store::PathIndex::open(p, ferry_format::HashAlg::Blake3).unwrap())
    };
    // A session that never read the file knows none of its chunks.
    let i = index(&path);
    assert!(found(&mut connect_indexed(&srv, i.clone()), ids.clone()).is_empty());
    // One cuts it (its recipe asked for) and ends.
    let mut c = connect_indexed(&srv, i.clone());
    c.call(Request::GetRecipe {
        target: ferry_proto::Target::Path("d/f".into()),
        short: false,
        known: vec![],
    })
    .unwrap();
    drop(c);
    drop(i);
    // A later session (a new process: the index opened again) serves them by id, and the
    // file by its object id.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let i = loop {
        match ferry_store::PathIndex::open(&path, ferry_format::HashAlg::Blake3) {
            Ok(i) => break std::sync::Arc::new(i),
            // The earlier sessions' threads let go of it as they end.
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    };
    let mut c = connect_indexed(&srv, i.clone());
    assert_eq!(found(&mut c, ids.clone()).len(), ids.len());
    let r = c.call(Request::ReadRange {
        target: ferry_proto::Target::Object(oid.id()),
        offset: 0,
        len: 10,
    });
    assert!(matches!(&r.unwrap()[..], [Reply::Range { data, .. }] if data[..] == content[..10]));
    // The file changed: what the index says is wrong now, and nothing wrong is served.
    fs::write(srv.join("d/f"), bytes(72, 200_000)).unwrap();
    let mut c = connect_indexed(&srv, i);
    assert!(found(&mut c, ids).is_empty());
}

/// What a session cut goes into the index once its client goes quiet, though the session
/// stays open (a mount's): another session then serves those chunks by id. (It is written then,
/// not after each request: a mount's commits had each paid a transaction of the index.)
#[test]
fn a_quiet_session_records_what_it_cut_for_the_others() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir_all(&srv).unwrap();
    let content = bytes(73, 200_000);
    fs::write(srv.join("f"), &content).unwrap();
    let ids = ids(&content);
    let index = std::sync::Arc::new(
        ferry_store::PathIndex::open(&t.path().join("index.redb"), ferry_format::HashAlg::Blake3)
            .unwrap(),
    );
    let mut quiet = connect_indexed(&srv, index.clone());
    quiet
        .call(Request::GetRecipe {
            target: ferry_proto::Target::Path("f".into()),
            short: false,
            known: vec![],
        })
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while found(&mut connect_indexed(&srv, index.clone()), ids.clone()).len() < ids.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "never recorded while the session stayed open"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The next quiet moment makes what it records durable too (those sessions' ends synced
    // the first file): a session's end after it has nothing left to sync.
    let other = bytes(74, 100_000);
    fs::write(srv.join("g"), &other).unwrap();
    quiet
        .call(Request::GetRecipe {
            target: ferry_proto::Target::Path("g".into()),
            short: false,
            known: vec![],
        })
        .unwrap();
    let first = crate::chunk_ids(&other).0[0];
    while index.locate(&first).unwrap().is_none() || index.unsynced() {
        assert!(
            std::time::Instant::now() < deadline + std::time::Duration::from_secs(60),
            "recorded in a quiet moment, not made durable"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(quiet);
}
