//! Arbitrary request sequences into the file server's handler (`Server::handle`, in-process, no
//! sockets), on a small export beside a directory it must never touch: no panic, every frame
//! it answers decodes, replies stay bounded, and nothing outside the export changes or
//! appears. The input is a run of frames: type, flags, a 16-bit length, the body.

use std::path::Path;
use std::sync::Arc;

use ferry_fs::{Export, Server, ServerOptions};
use ferry_proto::{Frame, Hello, Message, FEATURES, FLAG_MORE, VERSION};
use ferry_store::MemStore;

fn setup(root: &Path) {
    let ex = root.join("export");
    std::fs::create_dir_all(ex.join("d/e")).unwrap();
    std::fs::write(ex.join("a"), vec![7u8; 5000]).unwrap();
    std::fs::write(ex.join("d/b"), b"bee").unwrap();
    std::fs::write(
        ex.join("d/e/c"),
        (0..20_000u32)
            .map(|i| (i * 31 % 251) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    // A file of two names: commits to it are written in place, under a redo record.
    std::fs::hard_link(ex.join("a"), ex.join("d/a2")).unwrap();
    std::os::unix::fs::symlink("a", ex.join("link")).unwrap();
    std::os::unix::fs::symlink("../outside", ex.join("escape")).unwrap();
    std::os::unix::fs::symlink("/etc", ex.join("abs")).unwrap();
    std::fs::create_dir_all(root.join("outside")).unwrap();
    std::fs::write(root.join("outside/secret"), b"secret").unwrap();
}

/// One input.
pub fn run(data: &[u8]) {
    let t = tempfile::tempdir().unwrap();
    setup(t.path());
    let export = Export::open(t.path().join("export")).unwrap();
    let opts = ServerOptions {
        lease_ms: 0,
        group_sync_min: std::time::Duration::ZERO,
        ..ServerOptions::default()
    };
    let staging = Arc::new(MemStore::new(ferry_format::HashAlg::Blake3));
    let mut server = Server::new(export, opts, staging);
    // As a session's loop does: commits may wait to be synced together, settled whenever the
    // input runs dry (here, after frames whose flags byte has its top bit set, and at the end).
    server.group_commits();
    // Greeted first, so that every handler can be reached; every feature the server has.
    let hello = Message::Hello(Hello {
        version: VERSION,
        features: FEATURES,
        agent: "fuzz".into(),
    });
    server.handle(&hello.to_frame(0));
    let mut rest = data;
    let mut id = 1u32;
    let mut answered = 0usize;
    while rest.len() >= 4 {
        let (msg_type, flags, settle) = (rest[0], rest[1] & FLAG_MORE, rest[1] & 0x80 != 0);
        let len = (u16::from_le_bytes([rest[2], rest[3]]) as usize).min(rest.len() - 4);
        let body = rest[4..4 + len].to_vec();
        rest = &rest[4 + len..];
        let frame = Frame {
            msg_type,
            flags,
            request_id: id,
            body,
        };
        id += 1;
        let mut out = server.handle(&frame);
        if settle || rest.len() < 4 {
            out.extend(server.settle());
        }
        for f in out {
            answered += f.body.len();
            Message::decode(&f).expect("the server's own frames decode");
        }
        // A few kilobytes of requests never make gigabytes of answers.
        assert!(answered < 256 << 20, "{answered} bytes answered");
    }
    drop(server);
    crate::outside_intact(t.path(), &["export", "outside"], "the export");
}
