//! Hard links (`FEATURE_HARD_LINKS`): `Link` makes a second name of a file, every name shows
//! the file's identity, and a commit to a file of several names writes it in place, so every
//! name keeps the new content.

use super::*;
use ferry_proto::{Attr, FEATURE_HARD_LINKS, FEATURE_STAT_EXTRA};

#[test]
fn a_link_is_a_second_name_of_the_same_file() {
    let t = tempfile::tempdir().unwrap();
    fs::create_dir(t.path().join("d")).unwrap();
    fs::write(t.path().join("f"), b"shared").unwrap();
    fs::write(t.path().join("other"), b"shared").unwrap();
    let mut c = connect_asking(t.path(), FEATURE_STAT_EXTRA | FEATURE_HARD_LINKS);
    c.call(Request::Link {
        from: "f".into(),
        to: "d/g".into(),
    })
    .unwrap();
    assert_eq!(fs::read(t.path().join("d/g")).unwrap(), b"shared");
    let (f, g, other) = (
        attr_of(&mut c, "f"),
        attr_of(&mut c, "d/g"),
        attr_of(&mut c, "other"),
    );
    let x = |a: &Attr| a.extra.unwrap();
    assert_eq!((x(&f).nlink, x(&g).nlink, x(&other).nlink), (2, 2, 1));
    assert!(x(&f).id.is_some());
    assert_eq!(x(&f).id, x(&g).id);
    assert_ne!(x(&f).id, x(&other).id);
    // Refused: a name taken, a directory, a path out of the export, a missing file.
    let code = |c: &mut Connection<UnixStream, UnixStream>, from: &str, to: &str| match c.call(
        Request::Link {
            from: from.into(),
            to: to.into(),
        },
    ) {
        Err(ferry_fs::ConnError::Remote { code, .. }) => code,
        r => panic!("{from} → {to}: {r:?}"),
    };
    assert_eq!(code(&mut c, "f", "other"), ErrorCode::Exists);
    assert_eq!(code(&mut c, "d", "d2"), ErrorCode::Permission);
    assert_eq!(code(&mut c, "none", "n2"), ErrorCode::NotFound);
    // (A symlink out of the export on either side.)
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"x").unwrap();
    std::os::unix::fs::symlink(outside.path(), t.path().join("esc")).unwrap();
    assert_eq!(code(&mut c, "f", "esc/out"), ErrorCode::Escape);
    assert_eq!(code(&mut c, "esc/secret", "s"), ErrorCode::Escape);
    assert!(!outside.path().join("out").exists() && !t.path().join("s").exists());
    // A session that did not ask sees no identity.
    let mut plain = connect_asking(t.path(), FEATURE_STAT_EXTRA);
    assert_eq!(attr_of(&mut plain, "f").extra.unwrap().id, None);
}

#[test]
fn a_commit_to_a_file_of_several_names_reaches_every_name() {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("f"), b"old content").unwrap();
    fs::hard_link(t.path().join("f"), t.path().join("g")).unwrap();
    let mut c = connect_asking(t.path(), FEATURE_STAT_EXTRA | FEATURE_HARD_LINKS);
    let before = attr_of(&mut c, "f");
    upload(&mut c, 1, "f", Some(before.version), b"new content, longer").unwrap();
    let replies = commit(&mut c, 1, b"new content, longer").unwrap();
    let Some(Reply::Attr(after)) = replies.last() else {
        panic!("{replies:?}")
    };
    for name in ["f", "g"] {
        assert_eq!(
            fs::read(t.path().join(name)).unwrap(),
            b"new content, longer"
        );
    }
    let x = after.extra.unwrap();
    assert_eq!(x.nlink, 2);
    assert_eq!(x.id, before.extra.unwrap().id, "the same file");
    assert_eq!(after.version, attr_of(&mut c, "g").version);
    // Nothing left beside them, nothing in the trash (the old bytes are gone), and no redo
    // record once done.
    assert_eq!(names(t.path()), [".ferry-redo", "f", "g"]);
    assert!(names(&t.path().join(".ferry-redo")).is_empty());
    // A file of one name is still replaced whole (a new inode, the old one in the trash).
    fs::remove_file(t.path().join("g")).unwrap();
    let one = attr_of(&mut c, "f");
    upload(&mut c, 2, "f", Some(one.version), b"third").unwrap();
    let replies = commit(&mut c, 2, b"third").unwrap();
    let Some(Reply::Attr(third)) = replies.last() else {
        panic!("{replies:?}")
    };
    assert_ne!(third.extra.unwrap().id, x.id);
}

/// A commit through one name of a file whose version moved on through another (in another
/// directory, under another directory's lock) is a conflict, not a mix of both. (Two at once
/// take turns on the file's own lock and check the version through the descriptor they write:
/// not reproduced here.) And no name is made of the server's own files.
#[test]
fn a_commit_through_one_name_after_another_names_is_a_conflict() {
    let t = tempfile::tempdir().unwrap();
    fs::create_dir(t.path().join("d")).unwrap();
    fs::write(t.path().join("f"), b"base").unwrap();
    fs::hard_link(t.path().join("f"), t.path().join("d/g")).unwrap();
    let mut c = connect_asking(t.path(), FEATURE_STAT_EXTRA | FEATURE_HARD_LINKS);
    let base = attr_of(&mut c, "f").version;
    upload(&mut c, 1, "d/g", Some(base), b"through g").unwrap();
    upload(&mut c, 2, "f", Some(base), b"through f").unwrap();
    commit(&mut c, 1, b"through g").unwrap();
    match commit(&mut c, 2, b"through f") {
        Err(ferry_fs::ConnError::Remote { code, .. }) => assert_eq!(code, ErrorCode::Conflict),
        r => panic!("{r:?}"),
    }
    assert_eq!(fs::read(t.path().join("f")).unwrap(), b"through g");
    // The trash and a commit's temporary file are the server's own.
    let refused = |c: &mut Connection<UnixStream, UnixStream>, from: &str, to: &str| {
        matches!(
            c.call(Request::Link {
                from: from.into(),
                to: to.into()
            }),
            Err(ferry_fs::ConnError::Remote {
                code: ErrorCode::Permission,
                ..
            })
        )
    };
    fs::create_dir(t.path().join(".ferry-trash")).unwrap();
    assert!(refused(&mut c, "f", ".ferry-trash/kept"));
    assert!(!t.path().join(".ferry-trash/kept").exists());
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Leaves in export `root` what a server killed in the middle of writing `new` over the file
/// of two names `f` and `d/g` leaves: its redo record (`ID.target`, `ID.new` with mode 0640 and
/// an old time) and the file part-written.
fn interrupted_in_place_commit(root: &std::path::Path, new: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(root.join("d")).unwrap();
    let old = bytes(7, new.len() + 1000);
    fs::write(root.join("f"), &old).unwrap();
    fs::hard_link(root.join("f"), root.join("d/g")).unwrap();
    let redo = root.join(".ferry-redo");
    fs::create_dir(&redo).unwrap();
    fs::set_permissions(&redo, fs::Permissions::from_mode(0o700)).unwrap();
    fs::hard_link(
        root.join("f"),
        redo.join("ferry-1-00000000000000ab-3.target"),
    )
    .unwrap();
    let n = redo.join("ferry-1-00000000000000ab-3.new");
    fs::write(&n, new).unwrap();
    fs::set_permissions(&n, fs::Permissions::from_mode(0o640)).unwrap();
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    fs::File::options()
        .write(true)
        .open(&n)
        .unwrap()
        .set_modified(t)
        .unwrap();
    // Half of the new bytes written over the old.
    let mut torn = new[..new.len() / 2].to_vec();
    torn.extend_from_slice(&old[new.len() / 2..]);
    fs::write(root.join("f"), &torn).unwrap();
}

/// A server killed in the middle of an in-place commit leaves the file part-written: the next
/// session finishes the copy from its record before serving anything, so every name holds the
/// whole new version (its mode and time too), and the record is gone.
#[test]
fn an_in_place_commit_cut_short_is_finished_by_the_next_session() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let t = tempfile::tempdir().unwrap();
    let new = bytes(8, 5000);
    interrupted_in_place_commit(t.path(), &new);
    // Records that lost a part: the new content alone (the copy never began), the target alone.
    let redo = t.path().join(".ferry-redo");
    fs::write(redo.join("ferry-1-00000000000000ab-4.new"), b"never copied").unwrap();
    fs::write(t.path().join("h"), b"untouched").unwrap();
    fs::hard_link(
        t.path().join("h"),
        redo.join("ferry-1-00000000000000ab-5.target"),
    )
    .unwrap();
    let mut c = connect_asking(t.path(), FEATURE_STAT_EXTRA | FEATURE_HARD_LINKS);
    for name in ["f", "d/g"] {
        assert_eq!(fs::read(t.path().join(name)).unwrap(), new, "{name}");
    }
    let m = fs::metadata(t.path().join("d/g")).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o640);
    assert_eq!(m.mtime(), 1_000_000_000);
    assert_eq!(m.nlink(), 2);
    assert_eq!(fs::read(t.path().join("h")).unwrap(), b"untouched");
    assert_eq!(fs::metadata(t.path().join("h")).unwrap().nlink(), 1);
    assert!(names(&redo).is_empty(), "{:?}", names(&redo));
    // The records are the server's own: not linked into.
    assert!(matches!(
        c.call(Request::Link {
            from: "f".into(),
            to: ".ferry-redo/x.target".into()
        }),
        Err(ferry_fs::ConnError::Remote {
            code: ErrorCode::Permission,
            ..
        })
    ));
}

/// A record whose writer still runs (it holds the lock of the record's new content) is left to it by a session
/// starting meanwhile; and a session already running, asked to read the file after that writer
/// died, finishes the record first: no reader is served the part-written file.
#[test]
fn a_live_writers_record_is_left_to_it_and_a_reader_finishes_a_dead_ones() {
    for size in [3_000usize, 300_000] {
        let t = tempfile::tempdir().unwrap();
        let new = bytes(9, size);
        interrupted_in_place_commit(t.path(), &new);
        let torn = fs::read(t.path().join("f")).unwrap();
        let mark = t.path().join(".ferry-redo/ferry-1-00000000000000ab-3.new");
        let writer = fs::File::open(mark).unwrap();
        rustix::fs::flock(&writer, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let mut c = connect(t.path());
        assert_eq!(
            fs::read(t.path().join("f")).unwrap(),
            torn,
            "left to its writer"
        );
        assert_eq!(names(&t.path().join(".ferry-redo")).len(), 2);
        drop(writer);
        let dest = tempfile::tempdir().unwrap();
        let cache = ferry_store::MemStore::new(ferry_format::HashAlg::Blake3);
        get_with(&mut c, "d", dest.path(), &cache, false, false, true).unwrap();
        assert_eq!(
            fs::read(dest.path().join("g")).unwrap(),
            new,
            "{size} bytes"
        );
        assert_eq!(fs::read(t.path().join("f")).unwrap(), new);
    }
}

/// A dead writer's record of a file met by the next commit to that file: the commit's reading
/// of its base finishes the record first, so the commit is told the file changed (never
/// written over a version it did not see); made again against the version now there, it is
/// the file's, and no record is left to replay over it.
#[test]
fn a_commit_after_a_dead_writers_record_is_not_undone_by_it() {
    let t = tempfile::tempdir().unwrap();
    let mut c = connect_asking(t.path(), FEATURE_STAT_EXTRA | FEATURE_HARD_LINKS);
    // Made after the session started: nothing has finished it.
    let finished = bytes(10, 4000);
    interrupted_in_place_commit(t.path(), &finished);
    let base = attr_of(&mut c, "f").version;
    let newer = bytes(11, 6000);
    let first = upload(&mut c, 1, "f", Some(base), &newer).and_then(|()| commit(&mut c, 1, &newer));
    assert!(is_code(&first, ErrorCode::Conflict), "{first:?}");
    assert_eq!(fs::read(t.path().join("f")).unwrap(), finished);
    let base = attr_of(&mut c, "f").version;
    upload(&mut c, 2, "f", Some(base), &newer).unwrap();
    commit(&mut c, 2, &newer).unwrap();
    assert!(names(&t.path().join(".ferry-redo")).is_empty());
    let dest = tempfile::tempdir().unwrap();
    let cache = ferry_store::MemStore::new(ferry_format::HashAlg::Blake3);
    get_with(&mut c, "d", dest.path(), &cache, false, false, true).unwrap();
    assert_eq!(fs::read(dest.path().join("g")).unwrap(), newer);
    assert_eq!(fs::read(t.path().join("f")).unwrap(), newer);
}

/// A record of the file that another session is finishing (it holds the record's mark, and
/// waits for the file's lock to copy) when a commit to the file comes: the commit is refused,
/// not written in place, or that session's copy would undo it once the lock is let go.
#[test]
fn a_commit_meeting_a_record_being_finished_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    fs::create_dir_all(t.path().join("d")).unwrap();
    let old = bytes(7, 5000);
    fs::write(t.path().join("f"), &old).unwrap();
    fs::hard_link(t.path().join("f"), t.path().join("d/g")).unwrap();
    let mut c = connect_asking(t.path(), FEATURE_STAT_EXTRA | FEATURE_HARD_LINKS);
    let base = attr_of(&mut c, "f").version;
    let newer = bytes(11, 6000);
    upload(&mut c, 1, "f", Some(base), &newer).unwrap();
    // Meanwhile: a dead writer's record of the file, which another session is finishing.
    let redo = t.path().join(".ferry-redo");
    fs::create_dir(&redo).unwrap();
    fs::set_permissions(&redo, fs::Permissions::from_mode(0o700)).unwrap();
    fs::hard_link(
        t.path().join("f"),
        redo.join("ferry-1-00000000000000ab-3.target"),
    )
    .unwrap();
    let n = redo.join("ferry-1-00000000000000ab-3.new");
    fs::write(&n, bytes(10, 4000)).unwrap();
    let finisher = fs::File::open(&n).unwrap();
    rustix::fs::flock(&finisher, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let r = commit(&mut c, 1, &newer);
    assert!(is_code(&r, ErrorCode::Conflict), "{r:?}");
    assert_eq!(fs::read(t.path().join("f")).unwrap(), old);
}
