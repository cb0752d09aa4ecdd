//! `ferry mount` through the kernel: real programs in a real mount (root and /dev/fuse needed;
//! CI runs as root with fuse3 installed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{data, s, script, test_cache};

/// Whether real mounts can be made here; says why not when they cannot.
fn can_mount() -> bool {
    let root = rustix::process::getuid().is_root();
    let fuse = Path::new("/dev/fuse").exists();
    if !(root && fuse) {
        eprintln!("skipped: mounting needs root and /dev/fuse (root: {root}, /dev/fuse: {fuse})");
    }
    root && fuse
}

/// A mounted export: unmounted when dropped.
struct Mounted {
    at: PathBuf,
    /// The mount's process, as `ferry mount` reports it ("process N").
    pid: Option<u32>,
}

impl Mounted {
    /// Unmounts; returns the mount's process.
    fn unmount(self) -> Option<u32> {
        self.pid
    }
}

/// Waits (a minute at most) for process `pid` to end.
fn wait_ended(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the mount did not end"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = umount(&self.at);
    }
}

/// `ferry umount`, in the mount's environment (its cache root notes the mount's process).
fn umount(at: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["umount", s(at)])
        .env("XDG_CACHE_HOME", test_cache())
        .output()
        .unwrap()
}

/// Whether process `pid` has ended (gone, or a zombie not yet reaped).
fn ended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| {
        st.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// A remote shell that runs the far side locally, noting its process id in `pids`.
fn fake_ssh(dir: &Path) -> PathBuf {
    let body = format!(
        "#!/bin/sh\nshift\necho $$ >> {}/pids\nexec \"$@\"\n",
        dir.display()
    );
    script(dir, "fake-ssh", &body)
}

fn mount(t: &Path, srv: &Path, at: &Path, cache: &Path) -> Mounted {
    mount_with(t, srv, at, cache, &[])
}

fn mount_with(t: &Path, srv: &Path, at: &Path, cache: &Path, extra: &[&str]) -> Mounted {
    std::fs::create_dir_all(at).unwrap();
    let rsh = fake_ssh(t);
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "mount",
            "-e",
            s(&rsh),
            "--remote-ferry",
            env!("CARGO_BIN_EXE_ferry"),
            "--cache",
            s(cache),
            "--timeout",
            "5",
            &format!("host:{}", srv.display()),
            s(at),
        ])
        .args(extra)
        .env("XDG_CACHE_HOME", test_cache())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mount failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let said =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    let pid = said
        .split("(process ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .and_then(|n| n.parse().ok());
    Mounted {
        at: at.to_path_buf(),
        pid,
    }
}

fn sh(dir: &Path, script: &str) -> String {
    let o = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
        .env("HOME", dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "script failed:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

#[test]
fn programs_work_in_a_real_mount() {
    if !can_mount() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    std::fs::create_dir_all(&srv).unwrap();
    std::fs::write(srv.join("existing.bin"), data(3_000_000, 1)).unwrap();
    let at = t.path().join("mnt");
    let _m = mount(t.path(), &srv, &at, &t.path().join("cache"));
    let out = sh(
        &at,
        r#"
        # a removal, rename, chmod or utimes the leases vouch for, and a small new file's commit,
        # reach the server before the next operation, or within 100 ms or so
        gone() { for _ in $(seq 100); do test ! -e "$1" && return 0; sleep 0.1; done; return 1; }
        settled() {
          for _ in $(seq 100); do eval "$1" && return 0; sleep 0.1; done
          echo "never on the server: $1" >&2; return 1
        }
        cmp existing.bin ../srv/existing.bin
        # write, append, truncate, overwrite
        echo one > f; echo two >> f; settled 'test "$(cat ../srv/f)" = "$(printf "one\ntwo")"'
        truncate -s 3 f; test "$(cat ../srv/f)" = one
        : > f; test ! -s ../srv/f
        # a big file, written and read back through the cache
        head -c 5000000 /dev/urandom > big; cmp big ../srv/big
        # mmap, read and shared write
        python3 -c "
import mmap
with open('big', 'r+b') as f:
    m = mmap.mmap(f.fileno(), 0)
    assert m[:100] == open('../srv/big', 'rb').read(100)
    m[0:5] = b'HELLO'
    m.flush(); m.close()
"
        test "$(head -c 5 ../srv/big)" = HELLO
        # vim: write a new file and rename it over the old one
        echo 'saved by vim' > .f.swp; mv .f.swp f; settled 'test "$(cat ../srv/f)" = "saved by vim"'
        # emacs: autosave file, backup by rename, new version, autosave removed
        echo draft > '#f#'; mv f f~; echo 'saved by emacs' > f; rm '#f#'
        settled 'test "$(cat ../srv/f~)" = "saved by vim"'; settled 'test "$(cat ../srv/f)" = "saved by emacs"'; gone '../srv/#f#'
        # a file removed while open stays readable through its descriptor
        exec 3<f~; rm f~; test "$(cat <&3)" = 'saved by vim'; exec 3<&-; gone ../srv/f~
        # directories, symlinks, modes, times
        mkdir -p a/b/c; rmdir a/b/c; test -d ../srv/a/b; test ! -e ../srv/a/b/c
        ln -s ../f a/link; test "$(readlink ../srv/a/link)" = ../f; test "$(cat a/link)" = 'saved by emacs'
        chmod 600 f; settled 'test "$(stat -c %a ../srv/f)" = 600'
        touch -d '2020-02-02 02:02:02' f
        settled 'test "$(stat -c %Y ../srv/f)" = "$(date -d "2020-02-02 02:02:02" +%s)"'
        mv a z; test -L ../srv/z/link
        # a build inside the mount
        mkdir proj; cd proj
        printf '#include <stdio.h>\nint main(void){puts("built in ferry");return 0;}\n' > main.c
        printf 'hello: main.o\n\tgcc -o hello main.o\nmain.o: main.c\n\tgcc -c main.c\n' > Makefile
        make -s; ./hello
        make -s; touch main.c; make -s
        # git inside the mount
        git init -q .; git add .; git commit -qm first; echo '// more' >> main.c; git commit -qam second
        git status --porcelain; git log --oneline | wc -l
        cd ..
        # a FIFO and a socket: the mount's own (never on the server), their data the kernel's
        mkfifo fifo; test -p fifo; test ! -e ../srv/fifo
        (echo through the fifo > fifo &); read -r line < fifo; test "$line" = 'through the fifo'
        python3 -c "
import socket
s = socket.socket(socket.AF_UNIX); s.bind('sock'); s.listen(1)
c = socket.socket(socket.AF_UNIX); c.connect('sock'); a, _ = s.accept()
c.send(b'hi'); assert a.recv(2) == b'hi'
"
        test -S sock; test ! -e ../srv/sock; ls -l | grep -q '^p.* fifo$'; rm fifo sock
        # a file made by its commit (a create without O_EXCL: SQLite's journal, >>) shows the
        # same change time before the server has it and after
        python3 -c "
import os, time
fd = os.open('made', os.O_CREAT | os.O_WRONLY, 0o644)
os.close(fd)
before = os.stat('made').st_ctime_ns
for _ in range(200):
    if os.path.exists('../srv/made'):
        break
    time.sleep(0.05)
assert os.path.exists('../srv/made')
assert os.stat('made').st_ctime_ns == before
"
        # removals: a tree of files gone at once, here and (before the next operation) there
        mkdir -p gone/a gone/b; for i in 1 2 3; do echo $i > gone/a/$i; echo $i > gone/b/$i; done
        rm -rf gone; test ! -e gone; test ! -e ../srv/gone
        # hard links: one inode here, one file there; a write through one name reaches both
        ln f hard; test "$(stat -c %i,%h f)" = "$(stat -c %i,%h hard)"; test "$(stat -c %h f)" = 2
        echo 'through the link' >> hard; cmp f hard
        settled 'test "$(stat -c %h ../srv/f)" = 2 && cmp ../srv/f ../srv/hard && grep -q link ../srv/f'
        rm hard; test "$(stat -c %h f)" = 1; gone ../srv/hard
        # what is not supported fails clearly
        python3 -c "
import errno, os
for attempt in (lambda: os.getxattr('f', 'user.x'), lambda: os.setxattr('f', 'user.x', b'1'),
                lambda: os.removexattr('f', 'user.x'), lambda: os.getxattr('f', 'user.x')):
    try:
        attempt()
        raise SystemExit('an extended attribute worked')
    except OSError as e:
        assert e.errno == errno.EOPNOTSUPP, e
assert os.listxattr('f') == []
"
        echo done
        "#,
    );
    // A removal just before `ferry umount` is on the server when it returns; the log has no
    // warning of fuser's about the unmount.
    std::fs::write(at.join("last"), b"x").unwrap();
    std::fs::remove_file(at.join("last")).unwrap();
    let pid = _m.unmount().expect("ferry mount names its process");
    assert!(!srv.join("last").exists());
    wait_ended(pid);
    let log = std::fs::read_to_string(t.path().join("cache/mount.log")).unwrap();
    assert!(!log.contains("Failed to umount"), "{log}");
    assert!(out.contains("built in ferry"), "{out}");
    assert!(out.trim_end().ends_with("done"), "{out}");
    // The server's copy of the repository is a repository.
    let log = Command::new("git")
        .args(["-C", s(&srv.join("proj")), "log", "--oneline"])
        .output()
        .unwrap();
    assert!(log.status.success());
    assert_eq!(String::from_utf8_lossy(&log.stdout).lines().count(), 2);
    let fsck = Command::new("git")
        .args(["-C", s(&srv.join("proj")), "fsck", "--strict"])
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stderr)
    );
}

/// With `--strict-close`, a small new file is on the server when its close returns, and a
/// removal when the unlink does (by default both reach it within 100 ms or so).
/// A listing gives each entry's attributes (READDIRPLUS): the inode number a listing shows is
/// the one a stat of the name gives (a plain listing gave numbers of its own), for files,
/// directories, symlinks and FIFOs, made here or on the server; and the names stay right
/// after a removal.
#[test]
fn a_listing_shows_the_inodes_a_stat_does() {
    use std::os::unix::fs::{DirEntryExt, MetadataExt};
    if !can_mount() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    std::fs::create_dir_all(srv.join("d/theirs")).unwrap();
    std::fs::write(srv.join("d/old"), b"on the server").unwrap();
    let at = t.path().join("mnt");
    let _m = mount(t.path(), &srv, &at, &t.path().join("cache"));
    sh(
        &at,
        "cd d && echo x > new && mkdir sub && ln -s new link && mkfifo fifo",
    );
    let list = |dir: &Path| {
        let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name().to_string_lossy().into_owned(), e.ino())
            })
            .collect();
        v.sort();
        v
    };
    let listed = list(&at.join("d"));
    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["fifo", "link", "new", "old", "sub", "theirs"]);
    for (name, ino) in &listed {
        let st = std::fs::symlink_metadata(at.join("d").join(name)).unwrap();
        assert_eq!(st.ino(), *ino, "{name}");
    }
    std::fs::remove_file(at.join("d/old")).unwrap();
    let names: Vec<String> = list(&at.join("d")).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["fifo", "link", "new", "sub", "theirs"]);
}

#[test]
fn with_strict_close_the_server_has_each_change_when_the_call_returns() {
    if !can_mount() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    std::fs::create_dir_all(srv.join("d")).unwrap();
    let at = t.path().join("mnt");
    let _m = mount_with(
        t.path(),
        &srv,
        &at,
        &t.path().join("cache"),
        &["--strict-close"],
    );
    sh(
        &at,
        r#"
        ls d >/dev/null
        for i in 1 2 3 4 5; do
          echo "note $i" > d/n$i; test "$(cat ../srv/d/n$i)" = "note $i"
          rm d/n$i; test ! -e ../srv/d/n$i
        done
        "#,
    );
}

#[test]
fn two_mounts_see_each_others_closed_writes() {
    if !can_mount() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    std::fs::create_dir_all(&srv).unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let _ma = mount(t.path(), &srv, &a, &t.path().join("cache-a"));
    let _mb = mount(t.path(), &srv, &b, &t.path().join("cache-b"));
    let doc = data(400_000, 2);
    std::fs::write(a.join("doc"), &doc).unwrap();
    assert_eq!(std::fs::read(b.join("doc")).unwrap(), doc);
    // B changes it; A sees the change at its next open (the lease break reaches it first).
    let mut doc2 = doc.clone();
    doc2[1000..1005].copy_from_slice(b"fresh");
    std::fs::write(b.join("doc"), &doc2).unwrap();
    let t0 = Instant::now();
    while std::fs::read(a.join("doc")).unwrap() != doc2 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "A never saw B's close"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // New names appear in the other listing too.
    std::fs::write(a.join("new"), b"x").unwrap();
    let t0 = Instant::now();
    while !b.join("new").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "B never saw the new name"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn killing_the_server_during_write_back_leaves_the_old_or_the_new_file() {
    if !can_mount() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    std::fs::create_dir_all(&srv).unwrap();
    let old = data(8_000_000, 3);
    let new = data(8_000_000, 4);
    std::fs::write(srv.join("f"), &old).unwrap();
    let at = t.path().join("mnt");
    let _m = mount(t.path(), &srv, &at, &t.path().join("cache"));
    let pids = t.path().join("pids");
    let mut outcomes = (0, 0);
    for delay_ms in [0u64, 2, 5, 10, 20, 40, 80] {
        std::fs::write(srv.join("f"), &old).unwrap();
        // Open through the mount (the copy is fetched), then write it all and close: the close
        // is the write-back, and the server is killed while it runs.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(at.join("f"))
            .unwrap();
        std::io::Write::write_all(&mut f, &new).unwrap();
        let server: i32 = std::fs::read_to_string(&pids)
            .unwrap()
            .lines()
            .last()
            .unwrap()
            .parse()
            .unwrap();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(delay_ms));
            let _ = Command::new("kill")
                .args(["-9", &server.to_string()])
                .status();
        });
        let closed = std::panic::catch_unwind(move || drop(f));
        killer.join().unwrap();
        assert!(closed.is_ok());
        let on_server = std::fs::read(srv.join("f")).unwrap();
        if on_server == old {
            outcomes.0 += 1;
        } else {
            assert!(
                on_server == new,
                "a mix of old and new after a kill at {delay_ms} ms"
            );
            outcomes.1 += 1;
        }
        // Whatever happened, the mount reconnects and the new version ends up on the server.
        let t0 = Instant::now();
        while std::fs::read(srv.join("f")).unwrap() != new {
            assert!(t0.elapsed() < Duration::from_secs(20), "never written back");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(std::fs::read(at.join("f")).unwrap(), new);
    }
    eprintln!(
        "kills that left the old file: {}, the new: {}",
        outcomes.0, outcomes.1
    );
}

/// The last line of `pids` (a fake remote shell's): the server it started last.
fn last_pid(pids: &Path) -> String {
    let all = std::fs::read_to_string(pids).unwrap();
    all.lines().last().unwrap().to_string()
}

/// Whether a mount of `srv` (its source `host:SRV`) is the topmost at `at`.
fn mounted_there(at: &Path, srv: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let at = at.canonicalize().unwrap();
    let top = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(s(&at)))
        .unwrap_or_default()
        .to_string();
    top.contains(&format!(" host:{} ", srv.display()))
}

/// `ferry umount` returns once the mount's process has ended (its last changes sent, its
/// cache closed): a mount again, or a removal of the cache, can follow at once.
#[test]
fn umount_returns_once_the_mounts_process_has_ended() {
    if !can_mount() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    std::fs::create_dir_all(&srv).unwrap();
    let at = t.path().join("mnt");
    let m = mount(t.path(), &srv, &at, &t.path().join("cache"));
    std::fs::write(at.join("f"), data(300_000, 7)).unwrap();
    let pid = m.pid.expect("ferry mount names its process");
    std::mem::forget(m);
    let o = umount(&at);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        ended(pid),
        "ferry umount returned while the mount's process ran"
    );
    assert_eq!(std::fs::read(srv.join("f")).unwrap(), data(300_000, 7));
}

/// A mount that is still ending (its last write-back waiting for its server) when the next
/// mount is made at the same place leaves that one alone: unmounts go by path, and the first
/// mount's end used to unmount the second (`ferry umount M; ferry mount … M`).
#[test]
fn a_mount_still_ending_leaves_the_next_mount_made_there_alone() {
    if !can_mount() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (ta, tb) = (t.path().join("a"), t.path().join("b"));
    let (srv_a, srv_b) = (ta.join("srv"), tb.join("srv"));
    std::fs::create_dir_all(&srv_a).unwrap();
    std::fs::create_dir_all(&srv_b).unwrap();
    let at = t.path().join("mnt");
    let a = mount(&ta, &srv_a, &at, &ta.join("cache"));
    assert!(mounted_there(&at, &srv_a));
    std::fs::write(at.join("f"), b"from a").unwrap();
    // A's server stops: A's end (its last changes sent and synced) waits for it.
    let server = last_pid(&ta.join("pids"));
    assert!(Command::new("kill")
        .args(["-STOP", &server])
        .status()
        .unwrap()
        .success());
    ferry_mount::unmount(&at).unwrap();
    let b = mount(&tb, &srv_b, &at, &tb.join("cache"));
    assert!(mounted_there(&at, &srv_b));
    assert!(Command::new("kill")
        .args(["-CONT", &server])
        .status()
        .unwrap()
        .success());
    // (Not dropped: that would unmount whatever is at the path, as `ferry umount` does.)
    let pid = a.pid.expect("the mount's process");
    std::mem::forget(a);
    wait_ended(pid);
    assert!(mounted_there(&at, &srv_b), "the second mount was unmounted");
    assert_eq!(std::fs::read(srv_a.join("f")).unwrap(), b"from a");
    drop(b);
}
