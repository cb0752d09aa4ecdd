//! An emulated link in user space: a TCP relay on loopback that delivers each direction at a
//! set rate and after a set one-way delay, and counts the bytes it carries.
//!
//! Each direction is a reader and a writer thread. The reader takes bytes off one socket in
//! segments of at most an Ethernet payload, works out when each would leave a link of the
//! given rate (after the segments before it) and arrive (plus the delay), and queues it; the
//! writer sleeps until then and writes it out. The queue holds about a bandwidth-delay product
//! plus 64 KiB, so a sender meets backpressure as on a real bottleneck. Loss is not emulated
//! here: a relay of a TCP stream cannot drop bytes (that needs a kernel queue: tc and nftables
//! in a network namespace).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// One segment's worth: the payload of a 1500-byte Ethernet frame.
const SEGMENT: usize = 1448;

/// A link's shape: bits per second each way and the round-trip time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Server to client.
    pub down_bps: u64,
    /// Client to server.
    pub up_bps: u64,
    pub rtt: Duration,
}

impl Shape {
    /// No shaping at all.
    pub const UNLIMITED: Shape = Shape {
        down_bps: u64::MAX,
        up_bps: u64::MAX,
        rtt: Duration::ZERO,
    };
}

/// Bytes carried each way since the last [`Relay::take`].
#[derive(Default)]
struct Counters {
    up: AtomicU64,
    down: AtomicU64,
}

/// A running relay: connections to `127.0.0.1:port` reach the target through the link.
pub struct Relay {
    pub port: u16,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    /// The link is dead: every connection through it is shut down, new ones refused.
    cut: Arc<AtomicBool>,
    /// The link is silent: nothing crosses it either way, and nothing tells the ends.
    mute: Arc<AtomicBool>,
}

impl Relay {
    pub fn start(shape: Shape, target: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let mute = Arc::new(AtomicBool::new(false));
        let (c, s, dead, quiet) = (counters.clone(), stop.clone(), cut.clone(), mute.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = conn else { continue };
                if dead.load(Ordering::Relaxed) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let half = shape.rtt / 2;
                let (cr, sr) = match (client.try_clone(), server.try_clone()) {
                    (Ok(a), Ok(b)) => (a, b),
                    _ => continue,
                };
                let up = c.clone();
                let ends = (dead.clone(), quiet.clone());
                pump(cr, server, shape.up_bps, half, ends.clone(), move |n| {
                    up.up.fetch_add(n, Ordering::Relaxed);
                });
                let down = c.clone();
                pump(sr, client, shape.down_bps, half, ends, move |n| {
                    down.down.fetch_add(n, Ordering::Relaxed);
                });
            }
        });
        Ok(Relay {
            port,
            counters,
            stop,
            cut,
            mute,
        })
    }

    /// Silences the link: from now on nothing crosses it either way, and the connections stay
    /// open (a link that loses every packet: the ends find out only when their own timers say).
    pub fn mute(&self) {
        self.mute.store(true, Ordering::Relaxed);
    }

    /// Kills the link: within a segment's time every connection through it is shut down both
    /// ways (the ends see it closed), and new ones are closed at once.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }

    /// Bytes carried (up, down) since the last call; the counters start again from zero.
    pub fn take(&self) -> (u64, u64) {
        (
            self.counters.up.swap(0, Ordering::Relaxed),
            self.counters.down.swap(0, Ordering::Relaxed),
        )
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Carries `from` to `to` at `bps` after `delay`, calling `count` with each segment's length
/// as it enters the link; at the end of `from`, shuts down the writing half of `to`; once `cut`
/// is set, shuts both down both ways; while `mute` is set, delivers nothing.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    bps: u64,
    delay: Duration,
    (cut, mute): (Arc<AtomicBool>, Arc<AtomicBool>),
    count: impl Fn(u64) + Send + 'static,
) {
    let bdp = (bps as f64 / 8.0 * delay.as_secs_f64() * 2.0) as usize;
    let (tx, rx) = mpsc::sync_channel::<(Instant, Vec<u8>)>((bdp + (64 << 10)) / SEGMENT + 1);
    let reading = from.try_clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let mut free = Instant::now();
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for seg in buf[..n].chunks(SEGMENT) {
                count(seg.len() as u64);
                let now = Instant::now();
                let wire = Duration::from_secs_f64(seg.len() as f64 * 8.0 / bps.max(1) as f64);
                free = free.max(now) + wire;
                if tx.send((free + delay, seg.to_vec())).is_err() {
                    return;
                }
            }
        }
        // Dropping the sender tells the writer the stream ended.
    });
    std::thread::spawn(move || {
        let idle = Duration::from_millis(20);
        loop {
            if cut.load(Ordering::Relaxed) {
                let _ = to.shutdown(Shutdown::Both);
                if let Ok(r) = &reading {
                    let _ = r.shutdown(Shutdown::Both);
                }
                return;
            }
            if mute.load(Ordering::Relaxed) {
                std::thread::sleep(idle);
                continue;
            }
            let (at, seg) = match rx.recv_timeout(idle) {
                Ok(s) => s,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if to.write_all(&seg).is_err() {
                return;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback.
    fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = c.unwrap();
                std::thread::spawn(move || {
                    let mut r = c.try_clone().unwrap();
                    let _ = std::io::copy(&mut r, &mut c);
                });
            }
        });
        addr
    }

    #[test]
    fn bytes_are_counted_each_way_and_delayed() {
        let shape = Shape {
            down_bps: 800_000,
            up_bps: 400_000,
            rtt: Duration::from_millis(100),
        };
        let relay = Relay::start(shape, echo()).unwrap();
        let mut s = TcpStream::connect(("127.0.0.1", relay.port)).unwrap();
        let t = Instant::now();
        s.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        // One round trip at least: half the delay each way.
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        // 20 KB up at 400 kbit/s take at least 0.4 s to cross (whatever the machine).
        let data = vec![7u8; 20_000];
        let t = Instant::now();
        let mut w = s.try_clone().unwrap();
        let writer = std::thread::spawn(move || w.write_all(&data));
        let mut back = vec![0u8; 20_000];
        s.read_exact(&mut back).unwrap();
        writer.join().unwrap().unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(back, vec![7u8; 20_000]);
        assert_eq!(relay.take(), (20_004, 20_004));
        assert_eq!(relay.take(), (0, 0));
    }

    /// A read that found the connection closed (not one that merely timed out).
    fn closed(r: &std::io::Result<usize>) -> bool {
        use std::io::ErrorKind::{TimedOut, WouldBlock};
        matches!(r, Ok(0))
            || r.as_ref()
                .is_err_and(|e| !matches!(e.kind(), WouldBlock | TimedOut))
    }

    #[test]
    fn a_cut_link_closes_its_connections_and_takes_no_new_ones() {
        let relay = Relay::start(Shape::UNLIMITED, echo()).unwrap();
        let mut s = TcpStream::connect(("127.0.0.1", relay.port)).unwrap();
        s.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        relay.cut();
        // A generous deadline: only a link that never closes fails.
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let r = s.read(&mut b);
        assert!(closed(&r), "{r:?}");
        let mut n = TcpStream::connect(("127.0.0.1", relay.port)).unwrap();
        n.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let r = n.read(&mut b);
        assert!(closed(&r), "{r:?}");
    }
}
