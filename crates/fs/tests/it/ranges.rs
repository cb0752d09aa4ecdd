//! ReadRange on the server: a file too large for the history is hashed as its ranges go by,
//! and names its object id on the range that ends it; nothing else can pass for that id.

use super::*;
use ferry_format::{HashAlg, Id};
use ferry_proto::Target;

/// A server whose history is bounded to `history` bytes (files over 1/16 of it are not kept).
fn connect_history(root: &Path, history: u64) -> Connection<UnixStream, UnixStream> {
    let (a, b) = UnixStream::pair().unwrap();
    let export = Export::open(root).unwrap();
    std::thread::spawn(move || {
        let mut server = Server::new(export, ServerOptions::default(), staging())
            .with_history(staging(), history);
        let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
    });
    Connection::open(b.try_clone().unwrap(), b).unwrap()
}

/// (version, object id, bytes) of one range of `f`.
fn range(
    c: &mut Connection<UnixStream, UnixStream>,
    offset: u64,
    len: u32,
) -> (u64, Option<Id>, Vec<u8>) {
    let r = c
        .call(Request::ReadRange {
            target: Target::Path("f".into()),
            offset,
            len,
        })
        .unwrap();
    match r.into_iter().next() {
        Some(Reply::Range { version, oid, data }) => (version, oid, data),
        other => panic!("{other:?}"),
    }
}

const SIZE: usize = 300_000;

fn export(content: &[u8]) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("f"), content).unwrap();
    t
}

#[test]
fn a_large_file_read_in_order_names_its_id_on_the_range_that_ends_it() {
    let content = bytes(80, SIZE);
    let t = export(&content);
    // A 1 MiB history keeps files up to 64 KiB: this one is hashed as it goes.
    let mut c = connect_history(t.path(), 1 << 20);
    let (v0, id0, a) = range(&mut c, 0, 100_000);
    let (v1, id1, b) = range(&mut c, 100_000, 100_000);
    let (v2, id2, rest) = range(&mut c, 200_000, 200_000);
    assert_eq!((id0, id1), (None, None));
    assert_eq!(id2, Some(Id::hash(HashAlg::Blake3, &content)));
    assert!(v0 == v1 && v1 == v2);
    assert_eq!([a, b, rest].concat(), content);
    // Known now: a new reading names it from the first range, and so may a request by id.
    assert_eq!(range(&mut c, 0, 10).1, id2);
    let r = c
        .call(Request::ReadRange {
            target: Target::Object(id2.unwrap()),
            offset: 5,
            len: 5,
        })
        .unwrap();
    assert!(matches!(&r[..], [Reply::Range { data, .. }] if data[..] == content[5..10]));
}

#[test]
fn a_range_out_of_order_or_of_a_kept_file_names_the_id_first() {
    let content = bytes(81, SIZE);
    let oid = Some(Id::hash(HashAlg::Blake3, &content));
    let t = export(&content);
    // Not read from the start: the file is cut first.
    let mut c = connect_history(t.path(), 1 << 20);
    assert_eq!(range(&mut c, 100_000, 10).1, oid);
    // The history keeps files this size: cut first (its chunks go into the history).
    let mut c = connect_history(t.path(), 1 << 30);
    assert_eq!(range(&mut c, 0, 10).1, oid);
}

#[test]
fn a_file_changed_between_ranges_names_another_version_and_its_own_id() {
    let content = bytes(82, SIZE);
    let t = export(&content);
    let mut c = connect_history(t.path(), 0);
    let (v0, _, _) = range(&mut c, 0, 100_000);
    // Same size, other bytes, another mtime (a write in the same clock tick may keep it).
    let changed = bytes(83, SIZE);
    let path = t.path().join("f");
    fs::write(&path, &changed).unwrap();
    fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(7))
        .unwrap();
    let (v1, id1, data) = range(&mut c, 100_000, 200_000);
    assert_ne!(v0, v1);
    // The rest of the new version, under the new version's id: never the old bytes' id,
    // never one for a mix of both.
    assert_eq!(data, changed[100_000..]);
    assert_eq!(id1, Some(Id::hash(HashAlg::Blake3, &changed)));
}
