//! `ferry daemon` and `ferry object` as a user runs them: two users' daemons (two homes,
//! found through XDG_DATA_HOME and XDG_RUNTIME_DIR alone) exchanging a file by ticket.

use std::path::Path;
use std::process::{Command, Output};

fn ferry_in(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env_remove("FERRY_DAEMON_DIR")
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .output()
        .unwrap()
}

fn ok_in(home: &Path, args: &[&str]) -> String {
    let o = ferry_in(home, args);
    assert!(
        o.status.success(),
        "ferry {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Stops the daemon of a home when the test ends, however it ends.
struct Running<'a>(&'a Path);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let _ = ferry_in(self.0, &["daemon", "stop"]);
    }
}

#[test]
fn objects_move_between_two_users_daemons_by_ticket() {
    let t = tempfile::tempdir().unwrap();
    let (alice, bob) = (t.path().join("alice"), t.path().join("bob"));
    let none = ferry_in(&alice, &["object", "put", "/etc/hostname"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("ferry daemon"));
    let mut running = vec![];
    for home in [&alice, &bob] {
        ok_in(home, &["daemon", "--detach", "--listen", "127.0.0.1:0"]);
        running.push(Running(home));
    }
    let status: serde_json::Value =
        serde_json::from_str(&ok_in(&alice, &["daemon", "status", "--json"])).unwrap();
    assert!(status["socket"]
        .as_str()
        .unwrap()
        .starts_with(alice.to_str().unwrap()));
    let src = t.path().join("report.bin");
    let bytes = super::data(1_500_000, 9);
    std::fs::write(&src, &bytes).unwrap();
    let ticket = ok_in(&alice, &["object", "put", src.to_str().unwrap()]);
    let ticket = ticket.trim();
    assert!(ticket.starts_with("ferry1"), "{ticket}");
    let out = t.path().join("got.bin");
    let json = ok_in(
        &bob,
        &[
            "object",
            "get",
            ticket,
            "-o",
            out.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    let r: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(r["state"], "done");
    assert_eq!(r["report"]["size"], 1_500_000);
    assert_eq!(r["report"]["sources"][0]["bytes"], 1_500_000);
    let stat = ok_in(&bob, &["object", "stat", ticket, "--json"]);
    let stat: serde_json::Value = serde_json::from_str(&stat).unwrap();
    assert_eq!(stat["held"], true);
    // A damaged ticket is refused before anything is asked.
    let mut bad = ticket.to_string();
    bad.truncate(bad.len() - 3);
    let o = ferry_in(&bob, &["object", "get", &bad, "-o", "x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("ticket"));
}
