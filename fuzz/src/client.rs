//! The client's handling of arbitrary server answers (in-process, no sockets): after a valid
//! Hello, the input is the server's byte stream as frames (type, flags, request id, 16-bit
//! length, body), and the client runs a get of a tree, a put of one, or a listing against it.
//! No panic, bounded memory (libFuzzer's RSS limit), and nothing written outside the
//! destination: a hostile server can fail the command, never reach beyond it.

use std::io::Cursor;

use ferry_fs::{Connection, GetStats, PutOptions, PutStats, Sources};
use ferry_proto::{Frame, Hello, Message, VERSION};
use ferry_store::MemStore;

fn stream(data: &[u8]) -> Vec<u8> {
    let hello = Message::Hello(Hello {
        version: VERSION,
        features: 0,
        agent: "fuzz".into(),
    });
    let mut out = hello.to_frame(0).encode(false).unwrap();
    let mut rest = data;
    while rest.len() >= 5 {
        let len = (u16::from_le_bytes([rest[3], rest[4]]) as usize).min(rest.len() - 5);
        let f = Frame {
            msg_type: rest[0],
            flags: rest[1] & ferry_proto::FLAG_MORE,
            request_id: rest[2] as u32,
            body: rest[5..5 + len].to_vec(),
        };
        rest = &rest[5 + len..];
        if let Ok(b) = f.encode(false) {
            out.extend(b);
        }
    }
    out
}

/// One input.
pub fn run(data: &[u8]) {
    let Some((&op, data)) = data.split_first() else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("outside")).unwrap();
    std::fs::write(t.path().join("outside/secret"), b"secret").unwrap();
    std::fs::create_dir_all(t.path().join("src/d")).unwrap();
    std::fs::write(t.path().join("src/a"), vec![1u8; 3000]).unwrap();
    std::fs::write(t.path().join("src/d/b"), b"b").unwrap();
    let Ok(mut conn) = Connection::open(Cursor::new(stream(data)), std::io::sink()) else {
        return;
    };
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    match op % 3 {
        0 => {
            let src = Sources {
                borrowing: true,
                cache: &cache,
                chunker: Default::default(),
                delete: op & 4 != 0,
                dry_run: false,
                progress: None,
                lookaside: None,
                cold: op & 8 != 0,
                ranges: op & 16 != 0,
                short_ids: true,
                cache_file_max: u64::MAX,
                mirrors: None,
            };
            let mut stats = GetStats::default();
            let _ = ferry_fs::get(
                &mut conn,
                &"".into(),
                &t.path().join("dst"),
                &src,
                &mut stats,
            );
        }
        1 => {
            let opts = PutOptions {
                chunker: Default::default(),
                delete: op & 4 != 0,
                dry_run: false,
                progress: None,
                cache: None,
                fewer_round_trips: op & 8 != 0,
                stat_after: None,
                sync_after: false,
            };
            let mut stats = PutStats::default();
            let _ = ferry_fs::put(
                &mut conn,
                &t.path().join("src"),
                &"".into(),
                &opts,
                &mut stats,
            );
        }
        _ => {
            let _ = ferry_fs::list(&mut conn, &"".into());
        }
    }
    let _ = conn.close();
    crate::outside_intact(t.path(), &["dst", "outside", "src"], "the destination");
}
