//! Lease breaks a server sends unasked, as the client keeps them.

use super::*;

/// A server that sends `breaks` names changed unasked ahead of each answer (but a Ping's: the
/// client times its link with one).
fn flooding_server(breaks: usize) -> Connection<UnixStream, UnixStream> {
    crate::fake_server_telling(move |m| {
        if m == Request::Ping {
            return (vec![], Reply::Ok);
        }
        let told = (0..breaks)
            .map(|i| Message::Changed {
                path: WirePath::new(format!("d/{i}").into_bytes()).unwrap(),
                attr: None,
            })
            .collect();
        (told, Reply::Ok)
    })
}

/// Breaks past what the client keeps are never dropped silently: the client is told breaks
/// were lost (the mount then voids every lease).
#[test]
fn breaks_past_the_bound_are_never_dropped_silently() {
    let max = ferry_fs::conn::MAX_BREAKS;
    let path = || WirePath::new(b"d".to_vec()).unwrap();
    let mut c = flooding_server(max);
    let id = c.send(Request::GetAttr { path: path() }).unwrap();
    c.replies(id).unwrap();
    assert_eq!(c.changed.len(), max);
    assert!(!c.breaks_lost, "all kept");

    let mut c = flooding_server(max + 1);
    let id = c.send(Request::GetAttr { path: path() }).unwrap();
    c.replies(id).unwrap();
    assert!(c.breaks_lost, "one more than kept");
}
