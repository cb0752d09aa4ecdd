//! The server's side of a session: frames in, the server's replies out, until the client
//! hangs up.

use std::io::{self, Read, Write};

use ferry_proto::{Inflow, Message, Outflow};

use super::{write_out, ConnError, READ_BUF};
use crate::server::Server;

/// Serves one session: reads frames from `input`, writes replies to `output`, until the client
/// hangs up. Framing errors end the session (the stream cannot be resynchronised); errors in a
/// request are replied to and the session goes on.
pub fn serve(
    server: &mut Server,
    input: impl Read + std::os::fd::AsFd,
    output: impl Write,
) -> Result<(), ConnError> {
    match serve_until_closed(server, input, output) {
        // The client hung up while replies or invalidations were on their way: its choice.
        Err(ConnError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Sends what `outflow` holds now (its stream flushed), telling `server` how long the writes
/// waited.
fn write_now(
    server: &mut Server,
    outflow: &mut Outflow,
    output: &mut impl Write,
    bytes: &mut Vec<u8>,
) -> Result<(), ConnError> {
    outflow.flush(bytes)?;
    server.wrote(write_out(outflow, output, bytes)?);
    output.flush()?;
    Ok(())
}

/// Work a batch's replies wait at most before they go out (see `serve_until_closed`).
const EAGER_WRITE: std::time::Duration = std::time::Duration::from_millis(1);

fn serve_until_closed(
    server: &mut Server,
    mut input: impl Read + std::os::fd::AsFd,
    mut output: impl Write,
) -> Result<(), ConnError> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut inflow = Inflow::new();
    let mut outflow = Outflow::plain();
    let mut bytes = Vec::with_capacity(READ_BUF);
    let mut buf = vec![0u8; READ_BUF];
    let hello_due = server.wait_limit().map(|t| std::time::Instant::now() + t);
    server.group_commits();
    // Replies pushed since the last write (the stream may hold them without a byte out yet);
    // whether the next frame is the first of what was read last.
    let (mut replied, mut fresh) = (false, false);
    // When replies last went out.
    let mut wrote = std::time::Instant::now();
    loop {
        while let Some(f) = inflow.next_frame()? {
            if f.request_id == 0 && f.msg_type == ferry_proto::COMPRESSED {
                // The client's stream starts here: it may, once it has this side's Hello
                // offering it (its requests sent before that travel plain).
                if server.stream_level().is_none() || inflow.is_compressed() {
                    return Err(ConnError::Unexpected(
                        "a Compressed the session did not agree to".into(),
                    ));
                }
                inflow.start_zstd()?;
                continue;
            }
            for reply in server.handle(&f) {
                replied = true;
                outflow.push(&reply, &mut bytes)?;
                if bytes.len() >= READ_BUF {
                    server.wrote(write_out(&mut outflow, &mut output, &mut bytes)?);
                }
            }
            if server.frame_unwritten() {
                // A large frame against old data goes out now: how long the link takes it
                // sets the level of the next.
                outflow.flush(&mut bytes)?;
                server.wrote(write_out(&mut outflow, &mut output, &mut bytes)?);
            }
            if server.near_link() {
                outflow.near_link();
            } else if server.fast_link() {
                outflow.fast_link();
            }
            if let (Some(level), false) = (server.stream_level(), outflow.is_compressed()) {
                // The Hello reply goes out plain, and at once, not held behind the
                // compressor's start. Everything after the Compressed frame is one zstd
                // stream.
                write_now(server, &mut outflow, &mut output, &mut bytes)?;
                (replied, wrote) = (false, std::time::Instant::now());
                outflow.push(&Message::Compressed.to_frame(0), &mut bytes)?;
                outflow.start_zstd(level)?;
                outflow.warm()?;
                // (`fresh` stays: the first reply to the requests after the Hello goes at once.)
                continue;
            }
            if (std::mem::take(&mut fresh) || wrote.elapsed() >= EAGER_WRITE) && replied {
                // The first reply to what came in one read goes out at once: the client times
                // its link by it, and the rest of the batch (a tree's walk, chunks to cut) may
                // take a while. After it, what a long batch's replies made goes out every
                // millisecond: the client works on them while the server makes the rest (all
                // of 133 listings sent at the end kept each side idle while the other worked).
                write_now(server, &mut outflow, &mut output, &mut bytes)?;
                (replied, wrote) = (false, std::time::Instant::now());
            }
        }
        // Nothing more has come: the replies whose frames are being compressed go (their
        // time is the client's wait), then the commits that came together are installed
        // together.
        for reply in server.finish_frames() {
            outflow.push(&reply, &mut bytes)?;
        }
        for reply in server.settle() {
            outflow.push(&reply, &mut bytes)?;
        }
        outflow.flush(&mut bytes)?;
        let waited = write_out(&mut outflow, &mut output, &mut bytes)?;
        replied = false;
        wrote = std::time::Instant::now();
        let started = std::time::Instant::now();
        output.flush()?;
        server.wrote(waited + started.elapsed());
        // Wait for the client or for a change that breaks a lease, whichever comes first.
        loop {
            let (input_ready, changed, quiet) = {
                let watch = server.watch_fd();
                let mut fds = vec![PollFd::new(&input, PollFlags::IN)];
                if let Some(w) = &watch {
                    fds.push(PollFd::new(w, PollFlags::IN));
                }
                // Until the Hello, no longer than it is due.
                let left = hello_due
                    .filter(|_| server.wait_limit().is_some())
                    .map(|due| due.saturating_duration_since(std::time::Instant::now()));
                if left.is_some_and(|l| l.is_zero()) {
                    return Err(ConnError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no hello from the client in time",
                    )));
                }
                // Work for a quiet moment waits that long at most.
                let idle = server.idle_work().then_some(crate::server::QUIET);
                let wait = match (left, idle) {
                    (Some(l), Some(i)) => Some(l.min(i)),
                    (l, i) => l.or(i),
                };
                let timeout = wait.map(|l| rustix::time::Timespec {
                    tv_sec: l.as_secs() as i64,
                    tv_nsec: l.subsec_nanos() as i64,
                });
                let ready = match poll(&mut fds, timeout.as_ref()) {
                    Ok(n) => n,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(io::Error::from(e).into()),
                };
                (
                    !fds[0].revents().is_empty(),
                    fds.get(1).is_some_and(|f| !f.revents().is_empty()),
                    ready == 0 && idle.is_some(),
                )
            };
            if quiet {
                server.idle();
            }
            if changed {
                for f in server.invalidations() {
                    outflow.push(&f, &mut bytes)?;
                }
                outflow.flush(&mut bytes)?;
                output.write_all(&bytes)?;
                bytes.clear();
                output.flush()?;
            }
            if input_ready {
                break;
            }
        }
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        inflow.feed(&buf[..n]);
        fresh = true;
    }
}
