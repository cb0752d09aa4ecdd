//! Lease breaks a server sends unasked, as the client keeps them.

use super::*;

/// A server that answers Hello, then sends `breaks` names changed unasked ahead of its answer
/// to the first request.
fn flooding_server(breaks: usize) -> Connection<UnixStream, UnixStream> {
    let (a, b) = UnixStream::pair().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut r, mut w) = (a.try_clone().unwrap(), std::io::BufWriter::new(a));
        let mut dec = FrameDecoder::new();
        let mut buf = [0u8; 65536];
        loop {
            while let Some(f) = dec.next_frame().unwrap() {
                let reply = match Message::decode(&f).unwrap() {
                    Message::Hello(h) => Message::Hello(Hello { features: 0, ..h }),
                    Message::Request(_) => {
                        for i in 0..breaks {
                            let path = WirePath::new(format!("d/{i}").into_bytes()).unwrap();
                            let told = Message::Changed { path, attr: None };
                            w.write_all(&told.encode(0, false).unwrap()).unwrap();
                        }
                        Message::Reply(Reply::Ok)
                    }
                    _ => return,
                };
                if w.write_all(&reply.encode(f.request_id, false).unwrap())
                    .and_then(|_| w.flush())
                    .is_err()
                {
                    return;
                }
            }
            match r.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => dec.feed(&buf[..n]),
            }
        }
    });
    Connection::open(b.try_clone().unwrap(), b).unwrap()
}

/// Names changed past what the client keeps break their leases instead; past that too, the
/// client is told breaks were lost (the mount then voids every lease), never silently.
#[test]
fn breaks_past_the_bound_are_never_dropped_silently() {
    let max = ferry_fs::conn::MAX_BREAKS;
    let path = || WirePath::new(b"d".to_vec()).unwrap();
    let mut c = flooding_server(2 * max);
    let id = c.send(Request::GetAttr { path: path() }).unwrap();
    c.replies(id).unwrap();
    assert_eq!((c.changed.len(), c.invalidated.len()), (max, max));
    assert!(!c.breaks_lost, "all kept");

    let mut c = flooding_server(2 * max + 1);
    let id = c.send(Request::GetAttr { path: path() }).unwrap();
    c.replies(id).unwrap();
    assert!(c.breaks_lost, "one more than kept");
}
