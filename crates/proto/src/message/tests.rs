use super::*;
use crate::FrameDecoder;
use ferry_format::{ChunkRef, HashAlg};
use proptest::prelude::*;

fn id(n: u8) -> Id {
    Id::from_parts(HashAlg::Blake3, [n; 32])
}

fn attr() -> Attr {
    Attr {
        kind: FileKind::File,
        mode: 0o644,
        size: 12345,
        mtime_ns: -5,
        version: 9,
        oid: Some(id(3)),
        lease_ms: 60_000,
        extra: None,
    }
}

/// The rest of stat(2) the exact-bytes vector pins.
fn stat_extra() -> StatExtra {
    StatExtra {
        atime_ns: -1,
        ctime_ns: 7,
        blocks: 8,
        nlink: 2,
        id: None,
    }
}

fn frame_payload() -> Payload {
    Payload::Frame {
        context: false,
        olds: vec![1],
        refs: vec![1, 0, 300],
        data: vec![0x28, 0xb5, 0x2f, 0xfd],
    }
}

/// One or more of every message.
pub(crate) fn samples() -> Vec<Message> {
    let refs = vec![
        ChunkRef {
            id: id(1),
            len: 8192,
        },
        ChunkRef { id: id(2), len: 7 },
    ];
    let q = Message::Request;
    let r = Message::Reply;
    vec![
        Message::Hello(Hello {
            version: VERSION,
            features: FEATURES,
            agent: "ferry test".into(),
        }),
        Message::Invalidate("a/b".into()),
        Message::Changed {
            path: "a/b".into(),
            attr: None,
        },
        Message::Changed {
            path: "a/c".into(),
            attr: Some(Attr {
                kind: FileKind::Dir,
                mode: 0o1777,
                size: 4096,
                mtime_ns: -1,
                version: 7,
                oid: None,
                lease_ms: 1,
                extra: Some(StatExtra {
                    atime_ns: 1,
                    ctime_ns: 2,
                    blocks: 8,
                    nlink: 3,
                    id: Some(u64::MAX),
                }),
            }),
        },
        Message::Rate {
            rate: 0,
            sample: 0,
            round_trip: 0,
        },
        Message::Compressed,
        Message::Rate {
            rate: u64::MAX,
            sample: u64::MAX,
            round_trip: u64::MAX,
        },
        q(Request::GetAttr { path: "".into() }),
        q(Request::ReadDir {
            path: "src".into(),
            keys: vec![],
        }),
        q(Request::ReadDir {
            path: "d".into(),
            keys: vec![0, 0xff_ffff, 0x12_3456],
        }),
        q(Request::ReadLink { path: "l".into() }),
        q(Request::Ping),
        q(Request::ReadTree {
            path: "".into(),
            known: crate::KnownEntries::default(),
        }),
        q(Request::ReadTree {
            path: "a/b".into(),
            known: crate::KnownEntries::for_entries(100),
        }),
        q(Request::Mkdir {
            path: "d".into(),
            mode: 0o755,
        }),
        q(Request::Rename {
            from: "a".into(),
            to: "b/c".into(),
        }),
        q(Request::Unlink { path: "a".into() }),
        q(Request::Link {
            from: "a".into(),
            to: "b/c".into(),
        }),
        q(Request::Rmdir { path: "d".into() }),
        q(Request::Symlink {
            path: "l".into(),
            target: b"../x".to_vec(),
        }),
        q(Request::SetAttr {
            path: "f".into(),
            mode: Some(0o700),
            mtime_ns: None,
        }),
        q(Request::GetRecipe {
            target: Target::Path("big.iso".into()),
            short: false,
            known: vec![],
        }),
        q(Request::GetRecipe {
            target: Target::Object(id(9)),
            short: true,
            known: vec![1, u64::MAX],
        }),
        q(Request::GetChunks(GetChunks {
            ids: Ids::Full(vec![id(1), id(2)]),
            at: None,
            against: None,
        })),
        q(Request::GetChunks(GetChunks {
            ids: Ids::Full(vec![id(1), id(2), id(3)]),
            at: Some(Located {
                runs: vec![
                    (Target::Path("f".into()), vec![(0, 8192), (1 << 40, 1)]),
                    (Target::Object(id(4)), vec![(300, 2)]),
                ],
            }),
            against: None,
        })),
        q(Request::GetChunks(GetChunks {
            ids: Ids::Short(vec![0, u64::MAX]),
            at: None,
            against: Some(Against {
                key_bytes: 3,
                runs: true,
                keys: Some(vec![0xff_ffff, 0]),
                olds: Some(vec![5, u64::MAX]),
                context: None,
            }),
        })),
        q(Request::GetChunks(GetChunks {
            ids: Ids::Short(vec![7]),
            at: None,
            against: Some(Against {
                key_bytes: 8,
                runs: false,
                keys: None,
                olds: None,
                context: Some(Context {
                    path: "d/f".into(),
                    ranges: vec![(0, 10), (20, 5), (MAX_CONTEXT, MAX_CONTEXT - 15)],
                }),
            }),
        })),
        q(Request::ReadFiles {
            files: vec![("f".into(), vec![1, 2]), ("g".into(), vec![])],
        }),
        q(Request::ReadRange {
            target: Target::Path("big".into()),
            offset: 4 << 20,
            len: MAX_READ_RANGE,
        }),
        q(Request::Have {
            ids: Ids::Full(vec![id(4)]),
        }),
        q(Request::Have {
            ids: Ids::Short(vec![4, 5]),
        }),
        q(Request::GetKeys {
            path: "f".into(),
            version: Some(3),
            olds: KeyOlds::Indices(vec![0, 1, 300]),
            new_bytes: 1 << 20,
        }),
        q(Request::GetKeys {
            path: "f".into(),
            version: None,
            olds: KeyOlds::Except(vec![1, u64::MAX]),
            new_bytes: 0,
        }),
        q(Request::Create {
            handle: 1,
            path: "d/f".into(),
            base: Some(3),
        }),
        q(Request::Create {
            handle: u32::MAX,
            path: "g".into(),
            base: None,
        }),
        q(Request::Write {
            handle: 1,
            parts: vec![
                WritePart::Base {
                    start: 0,
                    count: u32::MAX,
                },
                WritePart::Chunks(refs.clone()),
                WritePart::Data {
                    lens: vec![5, 1],
                    payload: Payload::Plain(b"hello!".to_vec()),
                },
                WritePart::Data {
                    lens: vec![100],
                    payload: frame_payload(),
                },
            ],
        }),
        q(Request::Commit {
            handle: 1,
            mode: 0o600,
            mtime_ns: 1,
            size: 8199,
            oid: id(5),
        }),
        q(Request::Abort { handle: 7 }),
        r(Reply::Attr(attr())),
        r(Reply::Entries {
            present: vec![],
            entries: vec![
                DirEntry {
                    name: b"x".to_vec(),
                    attr: attr(),
                },
                DirEntry {
                    name: vec![0xff, 0xfe],
                    attr: Attr {
                        kind: FileKind::Dir,
                        oid: None,
                        ..attr()
                    },
                },
                DirEntry {
                    name: b"y".to_vec(),
                    attr: Attr {
                        extra: Some(stat_extra()),
                        ..attr()
                    },
                },
            ],
        }),
        r(Reply::Entries {
            present: vec![true, false, true],
            entries: vec![],
        }),
        r(Reply::Link(b"../target".to_vec())),
        r(Reply::Tree(vec![])),
        r(Reply::Tree(vec!["".into(), "a".into(), "a/b".into()])),
        r(Reply::FsStats(FsStats {
            block_size: 4096,
            blocks: 1 << 40,
            blocks_free: 7,
            blocks_avail: 6,
            files: u64::MAX,
            files_free: 0,
            name_max: 255,
        })),
        q(Request::StatFs { path: "a/b".into() }),
        q(Request::Sync),
        r(Reply::Recipe(RecipeDelta {
            version: 9,
            total_chunks: 40,
            check: [7; 32],
            alg: HashAlg::Blake3,
            parts: vec![
                RecipePart::Known(3),
                RecipePart::Chunks(refs.clone()),
                RecipePart::Short(vec![(8192, 0x0807_0605_0403_0201), (1, 0)]),
            ],
        })),
        r(Reply::Chunks(Chunks {
            found: vec![0, 2],
            payload: frame_payload(),
        })),
        r(Reply::Chunks(Chunks {
            found: vec![0],
            payload: Payload::Frame {
                context: true,
                olds: vec![],
                refs: vec![],
                data: vec![1],
            },
        })),
        r(Reply::Chunks(Chunks {
            found: vec![],
            payload: Payload::Plain(vec![]),
        })),
        r(Reply::Files {
            files: vec![Some((5, Some(id(2)))), None, Some((300, None))],
            payload: frame_payload(),
        }),
        r(Reply::Range {
            version: 9,
            oid: Some(id(3)),
            data: b"part".to_vec(),
        }),
        r(Reply::Range {
            version: u64::MAX,
            oid: None,
            data: vec![],
        }),
        r(Reply::Have(vec![
            true, false, true, true, false, false, false, false, true,
        ])),
        r(Reply::Keys(Keys {
            key_bytes: 3,
            runs: true,
            keys: vec![0xff_ffff, 1],
        })),
        q(Request::ObjectRecipe {
            oid: id(5),
            cap: vec![7; 60],
            from: 70_000,
        }),
        q(Request::ObjectChunks {
            oid: id(5),
            cap: vec![7; 60],
            ids: Ids::Full(vec![id(1), id(2)]),
        }),
        r(Reply::Object {
            oid: id(5),
            size: 8199,
            total: 2,
            from: 0,
            chunks: refs.clone(),
        }),
        r(Reply::Object {
            oid: id(5),
            size: 0,
            total: 0,
            from: 0,
            chunks: vec![],
        }),
        q(Request::ObjectRead {
            cap: vec![7; 60],
            offset: 1 << 40,
            len: 0,
        }),
        q(Request::ObjectCreate {
            durability: 0,
            size: 1 << 30,
            data: vec![1, 2, 3],
        }),
        q(Request::ObjectAppend { data: vec![4; 100] }),
        q(Request::ObjectDelete { cap: vec![] }),
        q(Request::ObjectReplicate {
            durability: 1,
            ticket: vec![9; 200],
        }),
        r(Reply::Created {
            durability: 1,
            ticket: vec![7; 160],
        }),
        q(Request::Vault {
            path: "vaults/mine".into(),
            op: VaultOp::Apply,
            name: vec![],
            data: vec![5; 300],
        }),
        q(Request::Vault {
            path: "".into(),
            op: VaultOp::List,
            name: b"heads/".to_vec(),
            data: b"heads/00000000000000000007".to_vec(),
        }),
        r(Reply::VaultData(None)),
        r(Reply::VaultData(Some(vec![1; 70]))),
        r(Reply::Ok),
        r(Reply::Error {
            code: ErrorCode::Conflict,
            message: "changed since version 3".into(),
        }),
    ]
}

#[test]
fn every_message_round_trips() {
    for (i, m) in samples().into_iter().enumerate() {
        let bytes = m.encode(i as u32 + 1, true).unwrap();
        let mut d = FrameDecoder::new();
        d.feed(&bytes);
        let f = d.next_frame().unwrap().unwrap();
        assert_eq!(f.request_id, i as u32 + 1);
        assert_eq!(Message::decode(&f).unwrap(), m);
    }
}

#[test]
fn truncated_bodies_are_errors() {
    for m in samples() {
        let f = m.to_frame(1);
        for cut in 0..f.body.len() {
            let short = Frame {
                body: f.body[..cut].to_vec(),
                ..f.clone()
            };
            // Some prefixes of variable-length lists are themselves valid; none may panic,
            // and none may decode to the original message.
            if let Ok(d) = Message::decode(&short) {
                assert_ne!(d, m);
            }
        }
    }
}

/// Bytes from a hex string; anything but hex digits (spaces, `|`) separates fields.
fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .chars()
        .filter_map(|c| c.to_digit(16).map(|d| d as u8))
        .collect();
    assert!(digits.len().is_multiple_of(2), "odd hex in {s:?}");
    digits.chunks(2).map(|p| p[0] << 4 | p[1]).collect()
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `n` copies of byte `b`, as hex.
fn rep(b: u8, n: usize) -> String {
    format!("{b:02x}").repeat(n)
}

/// The exact bytes of every message type, as `docs/protocol.md` lays them out: frame header
/// (length, type, flags, request id), then the body. Request id 5 throughout.
#[test]
fn exact_bytes_of_every_message() {
    let a1 = rep(0xa1, 32);
    let b2 = rep(0xb2, 32);
    let b3 = format!("01{}", rep(0x03, 32)); // tag 1 (BLAKE3) · digest
    let attr_hex =
        format!("01 a4010000 3930000000000000 fbffffffffffffff 0900000000000000 01 {b3} 60ea0000");
    let cases: Vec<(Message, String)> = vec![
        (
            Message::Hello(Hello {
                version: 3,
                features: 3,
                agent: "x".into(),
            }),
            "17000000 01 00 00000000 | 4645525259 0300 0300000000000000 01 78".into(),
        ),
        (
            Message::Invalidate("ab".into()),
            "09000000 60 00 00000000 | 02 6162".into(),
        ),
        (
            Message::Changed {
                path: "ab".into(),
                attr: None,
            },
            "0a000000 62 00 00000000 | 02 6162 00".into(),
        ),
        (
            Message::Rate {
                rate: 300_000,
                sample: 20_000,
                round_trip: 1500,
            },
            "0e000000 61 00 00000000 | e0a712 a09c01 dc0b".into(),
        ),
        (Message::Compressed, "06000000 02 00 00000000 |".into()),
        (
            Message::Request(Request::GetAttr { path: "ab".into() }),
            "09000000 10 00 05000000 | 02 6162".into(),
        ),
        (
            Message::Request(Request::ReadDir {
                path: "d".into(),
                keys: vec![0x03_0201],
            }),
            "0c000000 11 00 05000000 | 01 64 | 01 010203".into(),
        ),
        (
            Message::Request(Request::ReadLink { path: "l".into() }),
            "08000000 12 00 05000000 | 01 6c".into(),
        ),
        (
            Message::Request(Request::Mkdir {
                path: "d".into(),
                mode: 0o755,
            }),
            "0c000000 13 00 05000000 | 01 64 | ed010000".into(),
        ),
        (
            Message::Request(Request::Rename {
                from: "a".into(),
                to: "b".into(),
            }),
            "0a000000 14 00 05000000 | 01 61 | 01 62".into(),
        ),
        (
            Message::Request(Request::Link {
                from: "a".into(),
                to: "b".into(),
            }),
            "0a000000 1b 00 05000000 | 01 61 | 01 62".into(),
        ),
        (
            Message::Request(Request::ReadTree {
                path: "d".into(),
                known: crate::KnownEntries {
                    hashes: 7,
                    bits: vec![0x01, 0x80],
                },
            }),
            "0c000000 1c 00 05000000 | 01 64 | 07 | 02 0180".into(),
        ),
        (
            Message::Request(Request::Ping),
            "06000000 1d 00 05000000".into(),
        ),
        (
            Message::Request(Request::Unlink { path: "a".into() }),
            "08000000 15 00 05000000 | 01 61".into(),
        ),
        (
            Message::Request(Request::Rmdir { path: "d".into() }),
            "08000000 16 00 05000000 | 01 64".into(),
        ),
        (
            Message::Request(Request::Symlink {
                path: "l".into(),
                target: b"x".to_vec(),
            }),
            "0a000000 17 00 05000000 | 01 6c | 01 78".into(),
        ),
        (
            Message::Request(Request::SetAttr {
                path: "f".into(),
                mode: Some(0o600),
                mtime_ns: None,
            }),
            "0e000000 18 00 05000000 | 01 66 | 01 80010000 | 00".into(),
        ),
        (
            Message::Request(Request::GetRecipe {
                target: Target::Path("f".into()),
                short: true,
                known: vec![0x0807_0605_0403_0201],
            }),
            "13000000 20 00 05000000 | 00 01 66 | 01 | 01 0102030405060708".into(),
        ),
        (
            Message::Request(Request::GetChunks(GetChunks {
                ids: Ids::Full(vec![Id::from_parts(HashAlg::Blake3, [0xa1; 32])]),
                at: Some(Located {
                    runs: vec![(Target::Path("f".into()), vec![(300, 2)])],
                }),
                against: None,
            })),
            format!("33000000 21 00 05000000 | 00 01 01{a1} | 01 01 00 01 66 01 ac02 02 | 00"),
        ),
        (
            Message::Request(Request::GetChunks(GetChunks {
                ids: Ids::Short(vec![0x0807_0605_0403_0201]),
                at: None,
                against: Some(Against {
                    key_bytes: 3,
                    runs: true,
                    keys: Some(vec![0x03_0201]),
                    olds: Some(vec![]),
                    context: Some(Context {
                        path: "f".into(),
                        ranges: vec![(1, 2), (5, 3)],
                    }),
                }),
            })),
            // key byte 0xa3: 3 bytes, runs (bit 7), context (bit 5); ranges by gap from the
            // end of the one before.
            "21000000 21 00 05000000 | 01 01 0102030405060708 | 00 | 01 a3 01 01 010203 01 00 \
             01 66 02 01 02 02 03"
                .into(),
        ),
        (
            Message::Request(Request::ReadFiles {
                files: vec![("f".into(), vec![0x0807_0605_0403_0201])],
            }),
            "12000000 22 00 05000000 | 01 01 66 01 0102030405060708".into(),
        ),
        (
            Message::Request(Request::ReadRange {
                target: Target::Path("f".into()),
                offset: 300,
                len: 2,
            }),
            "0c000000 23 00 05000000 | 00 01 66 ac02 02".into(),
        ),
        (
            Message::Request(Request::Have {
                ids: Ids::Short(vec![0x0807_0605_0403_0201]),
            }),
            "10000000 30 00 05000000 | 01 01 0102030405060708".into(),
        ),
        (
            Message::Request(Request::GetKeys {
                path: "f".into(),
                version: Some(3),
                olds: KeyOlds::Indices(vec![2, 3, 300]),
                new_bytes: 300,
            }),
            // Old indices increasing, each as the gap from the one before.
            "19000000 31 00 05000000 | 01 66 01 0300000000000000 00 03 02 01 a902 ac02".into(),
        ),
        (
            Message::Request(Request::GetKeys {
                path: "f".into(),
                version: None,
                olds: KeyOlds::Except(vec![0x0807_0605_0403_0201]),
                new_bytes: 0,
            }),
            "14000000 31 00 05000000 | 01 66 00 01 01 0102030405060708 00".into(),
        ),
        (
            Message::Request(Request::Create {
                handle: 1,
                path: "f".into(),
                base: Some(3),
            }),
            "15000000 32 00 05000000 | 01000000 01 66 01 0300000000000000".into(),
        ),
        (
            Message::Request(Request::Write {
                handle: 1,
                parts: vec![
                    WritePart::Base {
                        start: 300,
                        count: 2,
                    },
                    WritePart::Chunks(vec![ChunkRef {
                        id: Id::from_parts(HashAlg::Blake3, [0xa1; 32]),
                        len: 300,
                    }]),
                    WritePart::Data {
                        lens: vec![2],
                        payload: Payload::Plain(b"hi".to_vec()),
                    },
                ],
            }),
            format!(
                "3b000000 33 00 05000000 | 01000000 03 | 00 ac02 02 | 01 01 01 ac02 {a1} \
                 | 02 01 02 00 02 6869"
            ),
        ),
        (
            Message::Request(Request::Commit {
                handle: 1,
                mode: 0o644,
                mtime_ns: 1,
                size: 2,
                oid: Id::from_parts(HashAlg::Blake3, [0xa1; 32]),
            }),
            format!(
                "3f000000 34 00 05000000 | 01000000 a4010000 0100000000000000 0200000000000000 01{a1}"
            ),
        ),
        (
            Message::Request(Request::Abort { handle: 1 }),
            "0a000000 35 00 05000000 | 01000000".into(),
        ),
        (
            Message::Request(Request::ObjectRecipe {
                oid: Id::from_parts(HashAlg::Blake3, [0xa1; 32]),
                cap: vec![0xc7; 3],
                from: 300,
            }),
            format!("2d000000 38 00 05000000 | 01{a1} | 03c7c7c7 | ac02"),
        ),
        (
            Message::Request(Request::ObjectChunks {
                oid: Id::from_parts(HashAlg::Blake3, [0xa1; 32]),
                cap: vec![0xc7; 3],
                ids: Ids::Full(vec![Id::from_parts(HashAlg::Blake3, [0xb2; 32])]),
            }),
            format!("4e000000 39 00 05000000 | 01{a1} | 03c7c7c7 | 00 01 01{b2}"),
        ),
        (
            Message::Reply(Reply::Object {
                oid: Id::from_parts(HashAlg::Blake3, [0xa1; 32]),
                size: 300,
                total: 1,
                from: 0,
                chunks: vec![ChunkRef {
                    id: Id::from_parts(HashAlg::Blake3, [0xb2; 32]),
                    len: 300,
                }],
            }),
            format!("4e000000 4b 00 05000000 | 01{a1} | ac02 01 00 | 01 ac02 {b2}"),
        ),
        (
            Message::Request(Request::ObjectRead {
                cap: vec![0xc7; 3],
                offset: 300,
                len: 1,
            }),
            "0d000000 3a 00 05000000 | 03c7c7c7 | ac02 01".into(),
        ),
        (
            Message::Request(Request::ObjectCreate {
                durability: 1,
                size: 300,
                data: b"hi".to_vec(),
            }),
            "0c000000 3b 00 05000000 | 01 | ac02 | 026869".into(),
        ),
        (
            Message::Request(Request::ObjectAppend {
                data: b"hi".to_vec(),
            }),
            "09000000 3e 00 05000000 | 026869".into(),
        ),
        (
            Message::Request(Request::ObjectDelete {
                cap: vec![0xc7; 3],
            }),
            "0a000000 3c 00 05000000 | 03c7c7c7".into(),
        ),
        (
            Message::Request(Request::ObjectReplicate {
                durability: 0,
                ticket: vec![0xd8; 2],
            }),
            "0a000000 3d 00 05000000 | 00 | 02d8d8".into(),
        ),
        (
            Message::Reply(Reply::Created {
                durability: 0,
                ticket: vec![0xc7; 3],
            }),
            "0b000000 4c 00 05000000 | 00 | 03c7c7c7".into(),
        ),
        (
            Message::Request(Request::Vault {
                path: "v".into(),
                op: VaultOp::Create,
                name: b"h/1".to_vec(),
                data: vec![0xaa],
            }),
            "0f000000 3f 00 05000000 | 0176 | 03 | 03682f31 | 01aa".into(),
        ),
        (
            Message::Reply(Reply::VaultData(Some(vec![1]))),
            "09000000 4d 00 05000000 | 01 | 0101".into(),
        ),
        (
            Message::Reply(Reply::VaultData(None)),
            "07000000 4d 00 05000000 | 00".into(),
        ),
        (
            Message::Reply(Reply::Attr(attr())),
            format!("49000000 40 00 05000000 | {attr_hex}"),
        ),
        (
            Message::Changed {
                path: "ab".into(),
                attr: Some(attr()),
            },
            format!("4d000000 62 00 00000000 | 02 6162 01 {attr_hex}"),
        ),
        (
            // The rest of stat(2), flagged in the kind byte (0x80).
            Message::Reply(Reply::Attr(Attr {
                kind: FileKind::Dir,
                oid: None,
                extra: Some(stat_extra()),
                ..attr()
            })),
            "44000000 40 00 05000000 | 82 a4010000 3930000000000000 fbffffffffffffff \
             0900000000000000 00 60ea0000 | ffffffffffffffff 0700000000000000 \
             0800000000000000 02000000"
                .into(),
        ),
        (
            // With the file's identity after it (0x40; `FEATURE_HARD_LINKS`).
            Message::Reply(Reply::Attr(Attr {
                kind: FileKind::File,
                oid: None,
                extra: Some(StatExtra {
                    id: Some(0x0102030405060708),
                    ..stat_extra()
                }),
                ..attr()
            })),
            "4c000000 40 00 05000000 | c1 a4010000 3930000000000000 fbffffffffffffff \
             0900000000000000 00 60ea0000 | ffffffffffffffff 0700000000000000 \
             0800000000000000 02000000 | 0807060504030201"
                .into(),
        ),
        (
            Message::Request(Request::StatFs { path: "ab".into() }),
            "09000000 19 00 05000000 | 02 6162".into(),
        ),
        (
            Message::Request(Request::Sync),
            "06000000 1a 00 05000000".into(),
        ),
        (
            Message::Reply(Reply::FsStats(FsStats {
                block_size: 4096,
                blocks: 2,
                blocks_free: 1,
                blocks_avail: 1,
                files: 3,
                files_free: 2,
                name_max: 255,
            })),
            "36000000 4e 00 05000000 | 00100000 | 0200000000000000 0100000000000000 \
             0100000000000000 0300000000000000 0200000000000000 | ff000000"
                .into(),
        ),
        (
            Message::Reply(Reply::Tree(vec!["".into(), "a/b".into()])),
            "0c000000 4f 00 05000000 | 02 | 00 | 03 612f62".into(),
        ),
        (
            Message::Reply(Reply::Entries {
                present: vec![false, true],
                entries: vec![DirEntry {
                    name: b"x".to_vec(),
                    attr: attr(),
                }],
            }),
            format!("4e000000 41 00 05000000 | 02 02 | 01 01 78 {attr_hex}"),
        ),
        (
            Message::Reply(Reply::Recipe(RecipeDelta {
                version: 1,
                total_chunks: 2,
                check: [0xcc; 32],
                alg: HashAlg::Blake3,
                parts: vec![
                    RecipePart::Known(5),
                    RecipePart::Chunks(vec![ChunkRef {
                        id: Id::from_parts(HashAlg::Blake3, [0xa1; 32]),
                        len: 300,
                    }]),
                    RecipePart::Short(vec![(2, 9)]),
                ],
            })),
            format!(
                "69000000 42 00 05000000 | 0100000000000000 0200000000000000 {} 01 03 \
                 | 00 05 | 01 01 ac02 {a1} | 02 01 02 0900000000000000",
                rep(0xcc, 32)
            ),
        ),
        (
            Message::Reply(Reply::Chunks(Chunks {
                found: vec![0, 2],
                payload: Payload::Frame {
                    context: false,
                    olds: vec![],
                    refs: vec![300],
                    data: vec![9],
                },
            })),
            "10000000 43 00 05000000 | 02 00 02 | 01 00 01 ac02 | 01 09".into(),
        ),
        (
            Message::Reply(Reply::Chunks(Chunks {
                found: vec![1],
                payload: Payload::Plain(b"ab".to_vec()),
            })),
            "0c000000 43 00 05000000 | 01 01 | 00 02 6162".into(),
        ),
        (
            Message::Reply(Reply::Have(vec![true, false, true])),
            "08000000 44 00 05000000 | 03 05".into(),
        ),
        (
            Message::Reply(Reply::Ok),
            "06000000 45 00 05000000".into(),
        ),
        (
            Message::Reply(Reply::Error {
                code: ErrorCode::Conflict,
                message: "no".into(),
            }),
            "0b000000 46 00 05000000 | 0700 02 6e6f".into(),
        ),
        (
            Message::Reply(Reply::Link(b"x".to_vec())),
            "08000000 47 00 05000000 | 01 78".into(),
        ),
        (
            Message::Reply(Reply::Files {
                files: vec![Some((2, Some(id(3)))), None, Some((300, None))],
                payload: Payload::Frame {
                    context: false,
                    olds: vec![1],
                    refs: vec![],
                    data: vec![7],
                },
            }),
            format!("34000000 48 00 05000000 | 03 02 02 {b3} 00 01 ac02 | 01 01 01 00 01 07"),
        ),
        (
            Message::Reply(Reply::Range {
                version: 0x0807_0605_0403_0201,
                oid: Some(id(3)),
                data: b"ab".to_vec(),
            }),
            format!("33000000 49 00 05000000 | 0102030405060708 01 {b3} 02 6162"),
        ),
        (
            Message::Reply(Reply::Range {
                version: 1,
                oid: None,
                data: b"ab".to_vec(),
            }),
            "12000000 49 00 05000000 | 0100000000000000 00 02 6162".into(),
        ),
        (
            Message::Reply(Reply::Keys(Keys {
                key_bytes: 3,
                runs: true,
                keys: vec![0x03_0201],
            })),
            "0b000000 4a 00 05000000 | 83 01 010203".into(),
        ),
    ];
    let mut wrong = vec![];
    for (m, want) in &cases {
        let unasked = matches!(
            m,
            Message::Hello(_)
                | Message::Invalidate(_)
                | Message::Changed { .. }
                | Message::Rate { .. }
                | Message::Compressed
        );
        let got = m.encode(if unasked { 0 } else { 5 }, false).unwrap();
        if got != hex(want) {
            wrong.push(format!(
                "{m:?}\n  got  {}\n  want {}",
                to_hex(&got),
                to_hex(&hex(want))
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every type code appears in the table above.
    let mut codes: Vec<u8> = cases.iter().map(|(m, _)| m.to_frame(0).msg_type).collect();
    codes.sort();
    codes.dedup();
    let mut all: Vec<u8> = samples().iter().map(|m| m.to_frame(0).msg_type).collect();
    all.sort();
    all.dedup();
    assert_eq!(codes, all, "a message type without exact bytes");
}

#[test]
fn out_of_range_fields_are_refused() {
    let decode = |bytes: &[u8]| {
        let mut d = FrameDecoder::new();
        d.feed(bytes);
        Message::decode(&d.next_frame().unwrap().unwrap())
    };
    // A key length out of range: 3 to 8 bytes.
    for n in [2u8, 9] {
        let b = hex(&format!(
            "0d000000 21 00 05000000 | 01 00 | 00 | 01 {n:02x} 00 00"
        ));
        assert!(decode(&b).is_err(), "key length {n}");
    }
    // More than MAX_READ_RANGE at once.
    let b = hex("0e000000 23 00 05000000 | 00 01 66 00 8180 8002");
    assert!(decode(&b).is_err());
    // More than MAX_CONTEXT bytes of context.
    let b = hex("13000000 21 00 05000000 | 01 00 | 00 | 01 24 00 00 01 66 01 00 8180 8002");
    assert!(decode(&b).is_err());
    // A file identity without the rest of stat (0x40 without 0x80).
    let b = hex(
        "30000000 40 00 05000000 | 41 a4010000 3930000000000000 fbffffffffffffff \
         0900000000000000 00 60ea0000 | 0807060504030201",
    );
    assert!(decode(&b).is_err());
    // Old indices in GetKeys that do not increase.
    let b = hex("15000000 31 00 05000000 | 01 66 01 0300000000000000 00 02 05 00 00");
    assert!(decode(&b).is_err());
    // Locations that do not match the ids.
    let b = hex("11000000 21 00 05000000 | 01 00 | 01 01 00 01 66 01 00 01 | 00");
    assert!(decode(&b).is_err());
    // A Write whose data passes MAX_WRITE_DATA.
    let mut w = crate::codec::Writer::default();
    w.u32(1);
    w.varint(2);
    for _ in 0..2 {
        w.u8(2);
        w.varint(1);
        w.varint(ferry_chunk::MAX_CHUNK_LIMIT as u64);
        w.u8(0);
        w.varint(0);
    }
    let f = Frame {
        msg_type: 0x33,
        flags: 0,
        request_id: 1,
        body: w.0,
    };
    assert!(MAX_WRITE_DATA < 2 * ferry_chunk::MAX_CHUNK_LIMIT as u64);
    assert!(Message::decode(&f).is_err());
}

#[test]
fn paths_cannot_climb() {
    for bad in ["..", "a/../b", "/etc", "a//b", "a/", ".", "a/./b"] {
        assert!(WirePath::new(bad.as_bytes().to_vec()).is_err(), "{bad}");
        let f = Frame {
            msg_type: 0x10,
            flags: 0,
            request_id: 1,
            body: {
                let mut w = Writer::default();
                w.bytes(bad.as_bytes());
                w.0
            },
        };
        assert!(
            matches!(
                Message::decode(&f),
                Err(ProtoError::Invalid { what: "path", .. })
            ),
            "{bad}"
        );
    }
    assert!(WirePath::new(vec![b'a', 0, b'b']).is_err());
    let d = WirePath::from("d");
    assert_eq!(d.join(b"x").unwrap(), WirePath::from("d/x"));
    assert_eq!(WirePath::default().join(b"x").unwrap(), WirePath::from("x"));
    assert!(d.join(b"x/y").is_err(), "a name is one component");
    assert!(d.join(b"..").is_err());
    assert_eq!(
        WirePath::from("a/b/c").split_last(),
        Some((WirePath::from("a/b"), &b"c"[..]))
    );
    assert_eq!(WirePath::default().split_last(), None);
    assert!(WirePath::new(vec![b'a'; 5000]).is_err());
    assert_eq!(
        WirePath::from("a/b/c").strip_prefix(&"a".into()),
        Some("b/c".into())
    );
    assert_eq!(WirePath::from("ab/c").strip_prefix(&"a".into()), None);
    assert_eq!(
        WirePath::from("x").join_path(&"y/z".into()).unwrap(),
        "x/y/z".into()
    );
}

#[test]
fn hostile_counts_do_not_allocate() {
    // Each body: the fields before a count, then a count of 2^63 - 1.
    let cases: &[(u8, &str)] = &[
        (0x11, "01 64"),
        (0x20, "00 01 66 00"),
        (0x21, "00"),
        (0x21, "01"),
        (0x22, ""),
        (0x30, "00"),
        (0x31, "01 66 00 00"),
        (0x31, "01 66 00 01"),
        (0x33, "01000000"),
        (0x41, "00"),
        (0x42, &format!("{} 01", rep(0, 48))),
        (0x43, ""),
        (0x44, ""),
        (0x48, ""),
        (0x4a, "03"),
    ];
    for (t, before) in cases {
        let mut w = Writer::default();
        w.0.extend_from_slice(&hex(before));
        w.varint(u64::MAX >> 1);
        let f = Frame {
            msg_type: *t,
            flags: 0,
            request_id: 1,
            body: w.0,
        };
        assert!(
            matches!(Message::decode(&f), Err(ProtoError::CountTooLarge { .. })),
            "type {t:#x}: {:?}",
            Message::decode(&f)
        );
    }
    let f = Frame {
        msg_type: 0x7e,
        flags: 0,
        request_id: 1,
        body: vec![],
    };
    assert_eq!(Message::decode(&f), Err(ProtoError::UnknownType(0x7e)));
}

proptest! {
    /// Arbitrary bodies never panic the decoder.
    #[test]
    fn arbitrary_bodies_never_panic(t in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Message::decode(&Frame { msg_type: t, flags: 0, request_id: 1, body });
    }

    /// Mutating a valid message's body never panics the decoder.
    #[test]
    fn mutated_messages_never_panic(which in 0usize..64, at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let all = samples();
        let m = &all[which % all.len()];
        let mut f = m.to_frame(1);
        if !f.body.is_empty() {
            let i = at.index(f.body.len());
            f.body[i] = byte;
        }
        let _ = Message::decode(&f);
    }
}
