//! The session stream's tests: round trips, levels, raw segments, hostile input.

use super::*;
use crate::{Message, Reply, Request, WirePath};

/// A sender's stream at `level` and a receiver's, both started.
fn zstd_pair(level: Level) -> (Outflow, Inflow) {
    let mut out = Outflow::plain();
    out.start_zstd(level).unwrap();
    let mut inflow = Inflow::new();
    inflow.start_zstd().unwrap();
    (out, inflow)
}

fn frame(i: u32) -> Frame {
    Message::Request(Request::GetAttr {
        path: WirePath::new(format!("src/dir{}/file{i}.rs", i % 7)).unwrap(),
    })
    .to_frame(i)
}

#[test]
fn a_stream_of_batches_round_trips_and_compresses_across_frames() {
    let mut out = Outflow::plain();
    let mut bytes = vec![];
    out.push(&frame(0), &mut bytes).unwrap();
    out.flush(&mut bytes).unwrap();
    let plain_hello = bytes.len();
    out.start_zstd(Level::Fixed(3)).unwrap();
    let mut inflow = Inflow::new();
    inflow.feed(&bytes);
    assert_eq!(inflow.next_frame().unwrap(), Some(frame(0)));
    inflow.start_zstd().unwrap();
    let mut plain = 0;
    let mut wire = 0;
    for batch in 0..20u32 {
        let mut b = vec![];
        for i in 0..50 {
            let f = frame(1 + batch * 50 + i);
            plain += f.encode(false).unwrap().len();
            out.push(&f, &mut b).unwrap();
        }
        out.flush(&mut b).unwrap();
        wire += b.len();
        // Delivered in awkward pieces.
        for piece in b.chunks(97) {
            inflow.feed(piece);
        }
        for i in 0..50 {
            assert_eq!(
                inflow.next_frame().unwrap(),
                Some(frame(1 + batch * 50 + i))
            );
        }
        assert_eq!(inflow.next_frame().unwrap(), None);
    }
    assert!(plain_hello > 0);
    assert!(
        wire * 4 < plain,
        "{wire} bytes on the wire for {plain} plain"
    );
}

/// A near link moves an adaptive stream that has not moved to level 3 before its next
/// frame, and the peer decodes across the change; a fixed level stays.
#[test]
fn a_near_link_starts_an_adaptive_stream_low() {
    let (mut out, mut inflow) = zstd_pair(Level::Adapt);
    let mut b = vec![];
    out.push(&frame(1), &mut b).unwrap();
    assert_eq!(out.level(), 9);
    out.near_link();
    out.push(&frame(2), &mut b).unwrap();
    out.flush(&mut b).unwrap();
    assert_eq!(out.level(), 3);
    inflow.feed(&b);
    assert_eq!(inflow.next_frame().unwrap(), Some(frame(1)));
    assert_eq!(inflow.next_frame().unwrap(), Some(frame(2)));
    // Once only: a stream that moved since is left where its governor put it.
    out.near_link();
    assert_eq!(out.next_level, None);
    let mut fixed = Outflow::plain();
    fixed.start_zstd(Level::Fixed(9)).unwrap();
    fixed.near_link();
    let mut b = vec![];
    fixed.push(&frame(3), &mut b).unwrap();
    assert_eq!(fixed.level(), 9);
}

/// An adaptive stream whose governor turns compression off sends every frame raw, small
/// ones too, each decoded as it comes; a level after turns it back on.
#[test]
fn an_adaptive_stream_turned_off_goes_raw_and_back() {
    let (mut out, mut inflow) = zstd_pair(Level::Adapt);
    let mut b = vec![];
    out.push(&frame(1), &mut b).unwrap();
    out.next_level = Some(0);
    let text = Message::Reply(Reply::Range {
        version: 1,
        oid: None,
        data: b"ferry ".repeat(10_000),
    })
    .to_frame(2);
    out.push(&text, &mut b).unwrap();
    out.push(&frame(3), &mut b).unwrap();
    out.flush(&mut b).unwrap();
    assert_eq!(out.level(), 0);
    assert!(b.len() > 60_000, "sent raw: {} bytes", b.len());
    inflow.feed(&b);
    for f in [frame(1), text.clone(), frame(3)] {
        assert_eq!(inflow.next_frame().unwrap(), Some(f));
    }
    assert_eq!(inflow.next_frame().unwrap(), None);
    // Counted as plain bytes of the level, which the governor weighs it by.
    assert!(out.plain >= 60_000);
    out.next_level = Some(1);
    let mut b = vec![];
    out.push(&text, &mut b).unwrap();
    out.flush(&mut b).unwrap();
    assert_eq!(out.level(), 1);
    assert!(b.len() < 2_000, "compressed again: {} bytes", b.len());
    inflow.feed(&b);
    assert_eq!(inflow.next_frame().unwrap(), Some(text));
}

#[test]
fn a_reader_polled_often_with_nothing_new_stays_in_step() {
    // A mount polls its idle sessions for lease breaks many times a second; mid zstd
    // frame, with nothing arrived, each poll must be a quiet "nothing yet".
    let (mut out, mut inflow) = zstd_pair(Level::Fixed(3));
    for i in 1..4 {
        let mut b = vec![];
        out.push(&frame(i), &mut b).unwrap();
        out.flush(&mut b).unwrap();
        inflow.feed(&b);
        assert_eq!(inflow.next_frame().unwrap(), Some(frame(i)));
        for _ in 0..1000 {
            assert_eq!(inflow.next_frame().unwrap(), None);
        }
    }
}

#[test]
fn an_adaptive_stream_changes_level_between_zstd_frames() {
    // A span's worth of plain bytes in each batch (repetitive: quick at any level).
    let bulk = |i: u32| {
        let mut data = format!("batch {i} ").repeat(1 << 17).into_bytes();
        data.truncate(governor::ADAPT_SPAN as usize + 1);
        Message::Reply(Reply::Range {
            version: 1,
            oid: Some(ferry_format::Id::hash(ferry_format::HashAlg::Blake3, b"x")),
            data,
        })
        .to_frame(i)
    };
    let mut out = Outflow::plain();
    out.start_zstd(Level::Adapt).unwrap();
    assert_eq!(out.level(), 9);
    let mut inflow = Inflow::new();
    inflow.start_zstd().unwrap();
    let mut send = |out: &mut Outflow, i: u32, waited: std::time::Duration| {
        let mut b = vec![];
        out.push(&bulk(i), &mut b).unwrap();
        // How long compressing took is the machine's business: a fixed figure here, so
        // the test depends on the waits it gives alone (the governor's own test covers
        // the arithmetic).
        out.busy = std::time::Duration::from_millis(1);
        out.wrote(waited);
        // A new level ends the zstd frame before the next bytes, mid-batch.
        out.push(&frame(i), &mut b).unwrap();
        out.flush(&mut b).unwrap();
        inflow.feed(&b);
        assert_eq!(inflow.next_frame().unwrap(), Some(bulk(i)));
        assert_eq!(inflow.next_frame().unwrap(), Some(frame(i)));
        out.level()
    };
    // A transport slower than the compressor: the level climbs, each change ending a zstd
    // frame, and the peer decodes on.
    let levels: Vec<i32> = (0..5)
        .map(|i| {
            send(
                &mut out,
                i,
                std::time::Duration::from_millis(20 * (i as u64 + 1)),
            )
        })
        .collect();
    assert!(levels[0] > 9, "{levels:?}");
    assert!(levels.windows(2).all(|w| w[0] <= w[1]), "{levels:?}");
    assert_eq!(levels[4], 19, "{levels:?}");
}

#[test]
fn levels_parse_and_print() {
    assert_eq!("adapt".parse(), Ok(Level::Adapt));
    assert_eq!("19".parse(), Ok(Level::Fixed(19)));
    assert!("0".parse::<Level>().is_err() && "x".parse::<Level>().is_err());
    assert_eq!(Level::Adapt.to_string(), "adapt");
    assert_eq!(Level::Fixed(3).to_string(), "3");
}

#[test]
fn frames_larger_than_a_step_arrive_whole() {
    let big = Message::Reply(Reply::Range {
        version: 1,
        oid: Some(ferry_format::Id::hash(ferry_format::HashAlg::Blake3, b"x")),
        data: vec![7u8; 3 << 20],
    })
    .to_frame(9);
    let mut out = Outflow::plain();
    out.start_zstd(Level::Fixed(1)).unwrap();
    let mut b = vec![];
    out.push(&big, &mut b).unwrap();
    out.push(&frame(10), &mut b).unwrap();
    out.flush(&mut b).unwrap();
    let mut inflow = Inflow::new();
    inflow.start_zstd().unwrap();
    inflow.feed(&b);
    assert_eq!(inflow.next_frame().unwrap(), Some(big));
    assert_eq!(inflow.next_frame().unwrap(), Some(frame(10)));
    assert_eq!(inflow.next_frame().unwrap(), None);
}

#[test]
fn a_decompression_bomb_stays_bounded() {
    // Zeros compress ~4000:1; the receiver holds one frame in progress plus one step.
    let mut out = Outflow::plain();
    out.start_zstd(Level::Fixed(3)).unwrap();
    let mut b = vec![];
    let mut huge = u32::MAX.to_le_bytes().to_vec();
    huge.resize(64 << 20, 0);
    out.push_encoded(&huge, &mut b).unwrap();
    out.flush(&mut b).unwrap();
    let mut inflow = Inflow::new();
    inflow.start_zstd().unwrap();
    inflow.feed(&b);
    assert!(matches!(
        inflow.next_frame(),
        Err(ProtoError::FrameTooLarge { .. })
    ));
    assert!(inflow.buffered() <= INFLATE_STEP);
}

/// A reply carrying `data` (a frame of its length and a little more).
fn range(i: u32, data: Vec<u8>) -> Frame {
    Message::Reply(Reply::Range {
        version: 1,
        oid: Some(ferry_format::Id::hash(ferry_format::HashAlg::Blake3, b"x")),
        data,
    })
    .to_frame(i)
}

/// Bytes no compressor shrinks (BLAKE3's output stream).
fn noise(len: usize, seed: u8) -> Vec<u8> {
    let mut data = vec![0u8; len];
    blake3::Hasher::new()
        .update(&[seed])
        .finalize_xof()
        .fill(&mut data);
    data
}

#[test]
fn frames_that_do_not_compress_travel_raw_between_zstd_frames() {
    let (mut out, mut inflow) = zstd_pair(Level::Fixed(19));
    let sent = vec![
        frame(1),
        range(2, noise(1 << 20, 2)),
        range(3, noise(RAW_MIN, 3)),
        frame(4),
        range(5, b"compressible ".repeat(1 << 16)),
        range(6, noise(200 << 10, 6)),
    ];
    let mut b = vec![];
    for (n, f) in sent.iter().enumerate() {
        out.push(f, &mut b).unwrap();
        // A flush between some of them, none before the first raw one.
        if n % 2 == 1 {
            out.flush(&mut b).unwrap();
        }
    }
    out.flush(&mut b).unwrap();
    // Raw: each incompressible frame's bytes appear whole, after its segment header.
    for f in [&sent[1], &sent[2], &sent[5]] {
        let bytes = f.encode(false).unwrap();
        let mut header = RAW_MAGIC.to_le_bytes().to_vec();
        header.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        header.extend_from_slice(&bytes[..64]);
        assert!(b.windows(header.len()).any(|w| w == header));
    }
    let plain: usize = sent.iter().map(|f| f.encode(false).unwrap().len()).sum();
    assert!(b.len() < plain, "{} on the wire for {plain}", b.len());
    // Delivered in awkward pieces, split inside segment headers too.
    let mut got = vec![];
    for piece in b.chunks(4093) {
        inflow.feed(piece);
        while let Some(f) = inflow.next_frame().unwrap() {
            got.push(f);
        }
    }
    assert_eq!(got, sent);
}

#[test]
fn a_raw_segment_longer_than_a_frame_is_refused() {
    let mut inflow = Inflow::new();
    inflow.start_zstd().unwrap();
    let mut b = RAW_MAGIC.to_le_bytes().to_vec();
    b.extend_from_slice(&(crate::MAX_FRAME as u32 + 5).to_le_bytes());
    inflow.feed(&b);
    assert!(matches!(
        inflow.next_frame(),
        Err(ProtoError::FrameTooLarge { .. })
    ));
}

#[test]
fn a_cut_raw_segment_yields_nothing_until_its_end() {
    let mut out = Outflow::plain();
    out.start_zstd(Level::Fixed(3)).unwrap();
    let big = range(1, noise(300 << 10, 1));
    let mut b = vec![];
    out.push(&big, &mut b).unwrap();
    out.flush(&mut b).unwrap();
    let mut inflow = Inflow::new();
    inflow.start_zstd().unwrap();
    inflow.feed(&b[..b.len() - 1]);
    assert_eq!(inflow.next_frame().unwrap(), None);
    inflow.feed(&b[b.len() - 1..]);
    assert_eq!(inflow.next_frame().unwrap(), Some(big));
}

#[test]
fn garbage_in_the_stream_is_an_error() {
    let mut inflow = Inflow::new();
    inflow.start_zstd().unwrap();
    inflow.feed(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(inflow.next_frame().is_err());
}
