//! Hard links through the mount: a second name is the same inode here and the same file on
//! the server; changes through either name reach both; a name removed leaves the others.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use ferry_mount::{Errno, SpecialKind, ROOT};

use super::{client, one_client, read, write, Remote};

#[test]
fn a_link_is_one_inode_with_two_names_here_and_there() {
    let (_t, root, _remote, v) = one_client();
    write(&v, "f", b"first").unwrap();
    let f = v.lookup(ROOT, b"f").unwrap();
    let g = v.link(f.ino, ROOT, b"g").unwrap();
    assert_eq!(g.ino, f.ino, "one inode");
    assert_eq!(g.nlink, 2);
    let (sf, sg) = (
        std::fs::metadata(root.join("f")).unwrap(),
        std::fs::metadata(root.join("g")).unwrap(),
    );
    assert_eq!(
        (sf.ino(), sf.nlink()),
        (sg.ino(), 2),
        "one file on the server"
    );
    // Looked up again, by either name: the same inode, two links.
    for name in [&b"f"[..], b"g"] {
        let s = v.lookup(ROOT, name).unwrap();
        assert_eq!((s.ino, s.nlink), (f.ino, 2));
        v.forget(s.ino, 1);
    }
    // Written through one name: both names have it, here and on the server.
    write(&v, "g", b"second, longer").unwrap();
    v.send_changes(Duration::ZERO);
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"second, longer");
    assert_eq!(read(&v, "f").unwrap(), b"second, longer");
    assert_eq!(
        std::fs::metadata(root.join("f")).unwrap().nlink(),
        2,
        "the server kept both names"
    );
    // A change of mode through one name shows through the other.
    v.setattr(f.ino, Some(0o600), None, None).unwrap();
    let s = v.lookup(ROOT, b"g").unwrap();
    assert_eq!(s.mode, 0o600);
    v.forget(s.ino, 1);
    // The same name again, or a directory: refused.
    assert_eq!(v.link(f.ino, ROOT, b"f").unwrap_err(), Errno::EEXIST);
    let d = v.mkdir(ROOT, b"d", 0o755).unwrap();
    assert_eq!(v.link(d.ino, ROOT, b"d2").unwrap_err(), Errno::EPERM);
    // A rename of one name onto the other does nothing (rename(2)).
    v.rename(ROOT, b"f", ROOT, b"g", false).unwrap();
    assert!(root.join("f").exists() && root.join("g").exists());
    // The first name removed: the inode lives on under the other, with one link.
    v.unlink(ROOT, b"f").unwrap();
    v.send_changes(Duration::ZERO);
    assert!(!root.join("f").exists());
    assert_eq!(v.lookup(ROOT, b"f").unwrap_err(), Errno::ENOENT);
    let s = v.getattr(f.ino).unwrap();
    assert_eq!(s.nlink, 1);
    assert_eq!(read(&v, "g").unwrap(), b"second, longer");
    write(&v, "g", b"third").unwrap();
    v.send_changes(Duration::ZERO);
    assert_eq!(std::fs::read(root.join("g")).unwrap(), b"third");
}

/// A file new here (its commit queued, or still open for writing) is committed before its
/// link is made: the server links the file with what was written.
#[test]
fn a_new_file_is_committed_before_its_link() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let (s, o) = v.create_excl(ROOT, b"tmp_obj", 0o444).unwrap();
    v.write(o.fh, 0, b"object").unwrap();
    v.flush(o.fh).unwrap();
    v.release(o.fh).unwrap();
    // git's object write: link the temporary file to its name, remove the temporary.
    v.link(s.ino, ROOT, b"obj").unwrap();
    v.unlink(ROOT, b"tmp_obj").unwrap();
    v.send_changes(Duration::ZERO);
    assert_eq!(std::fs::read(root.join("obj")).unwrap(), b"object");
    assert!(!root.join("tmp_obj").exists());
    assert_eq!(read(&v, "obj").unwrap(), b"object");
}

#[test]
fn a_special_file_gets_names_here() {
    let (_t, root, _remote, v) = one_client();
    let p = v.mknod(ROOT, b"fifo", SpecialKind::Fifo, 0o644, 0).unwrap();
    let q = v.link(p.ino, ROOT, b"fifo2").unwrap();
    assert_eq!((q.ino, q.nlink), (p.ino, 2));
    assert!(!root.join("fifo2").exists(), "never on the server");
    v.setattr(p.ino, Some(0o600), None, None).unwrap();
    let s = v.lookup(ROOT, b"fifo2").unwrap();
    assert_eq!((s.mode, s.nlink), (0o600, 2));
    let before = v.getattr(p.ino).unwrap().ctime_ns;
    v.unlink(ROOT, b"fifo").unwrap();
    let s = v.lookup(ROOT, b"fifo2").unwrap();
    assert_eq!((s.ino, s.nlink), (p.ino, 1));
    assert!(
        s.ctime_ns >= before,
        "a name removed is a change of the file"
    );
    assert_eq!(v.lookup(ROOT, b"fifo").unwrap_err(), Errno::ENOENT);
}

/// Two names linked by another client are two inodes here, but one file: a rename of one onto
/// the other does nothing (rename(2)), here as on the server.
#[test]
fn a_rename_between_two_names_of_one_file_linked_elsewhere_does_nothing() {
    // Leases that outlast the test: what `v` learns, the server told.
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let remote = Remote::new(&root, 3_600_000);
    let v = client(&remote, &t.path().join("c1"), Duration::from_secs(5));
    let other = client(&remote, &t.path().join("c2"), Duration::from_secs(5));
    write(&v, "f", b"one file").unwrap();
    let f = other.lookup(ROOT, b"f").unwrap();
    other.link(f.ino, ROOT, b"g").unwrap();
    // Told by the server: `g` made, and so `f`'s link count changed (which the server sees
    // under `g` only: `v` breaks the lease of every name of the file it knows).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let links = |n: &[u8]| v.lookup(ROOT, n).map(|s| s.nlink);
    while links(b"g").is_err() || links(b"f") != Ok(2) {
        assert!(
            std::time::Instant::now() < deadline,
            "never told of the link"
        );
        v.tick();
        std::thread::sleep(Duration::from_millis(10));
    }
    let (a, b) = (v.lookup(ROOT, b"f").unwrap(), v.lookup(ROOT, b"g").unwrap());
    assert_eq!((a.nlink, b.nlink), (2, 2));
    v.rename(ROOT, b"f", ROOT, b"g", false).unwrap();
    v.send_changes(Duration::ZERO);
    assert!(root.join("f").exists() && root.join("g").exists());
    assert_eq!(read(&v, "f").unwrap(), b"one file");
    assert_eq!(read(&v, "g").unwrap(), b"one file");
}

/// Writes through a descriptor of a file that loses the name it was opened by (removed, or
/// renamed while another name stays) are kept: the copy follows the inode to its other name,
/// and the close commits them there.
#[test]
fn writes_through_a_file_that_loses_its_first_name_are_kept() {
    let (_t, root, _remote, v) = one_client();
    write(&v, "a", b"first").unwrap();
    let a = v.lookup(ROOT, b"a").unwrap();
    let o = v.open(a.ino, true, false).unwrap();
    v.link(a.ino, ROOT, b"b").unwrap();
    v.write(o.fh, 5, b", then more").unwrap();
    // Being written, it still shows both names.
    assert_eq!(v.getattr_open(a.ino, Some(o.fh)).unwrap().nlink, 2);
    v.unlink(ROOT, b"a").unwrap();
    v.write(o.fh, 16, b", and after the unlink").unwrap();
    v.flush(o.fh).unwrap();
    v.send_changes(Duration::ZERO);
    let want = b"first, then more, and after the unlink";
    assert_eq!(std::fs::read(root.join("b")).unwrap(), want);
    // Renamed: the open name moves, the inode stays one file.
    v.link(a.ino, ROOT, b"c").unwrap();
    v.rename(ROOT, b"c", ROOT, b"d", false).unwrap();
    v.write(o.fh, 0, b"FIRST").unwrap();
    v.flush(o.fh).unwrap();
    v.release(o.fh).unwrap();
    v.send_changes(Duration::ZERO);
    for name in ["b", "d"] {
        assert_eq!(
            &std::fs::read(root.join(name)).unwrap()[..5],
            b"FIRST",
            "{name}"
        );
    }
    // Forgotten by the kernel: every name of it still looks up.
    v.forget(a.ino, 3);
    for name in [&b"b"[..], b"d"] {
        let s = v.lookup(ROOT, name).unwrap();
        assert_eq!(s.nlink, 2);
        v.forget(s.ino, 1);
    }
    // A special file of this mount holds a name: no link onto it.
    v.mknod(ROOT, b"fifo", SpecialKind::Fifo, 0o644, 0).unwrap();
    let b = v.lookup(ROOT, b"b").unwrap();
    assert_eq!(v.link(b.ino, ROOT, b"fifo").unwrap_err(), Errno::EEXIST);
    assert!(!root.join("fifo").exists());
}
