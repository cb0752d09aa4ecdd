//! Tickets (binary and text) and lookaside device indexes from arbitrary bytes: no panic,
//! bounded allocation, and what decodes re-encodes to the same bytes (both are canonical).

use ferry_daemon::Ticket;
use ferry_lookaside::DeviceIndex;

/// One input.
pub fn run(data: &[u8]) {
    if let Ok(t) = Ticket::from_bytes(data) {
        assert_eq!(t.to_bytes(), data);
        assert_eq!(t.to_string().parse::<Ticket>().unwrap(), t);
    }
    let _ = String::from_utf8_lossy(data).parse::<Ticket>();
    if let Ok(i) = DeviceIndex::decode(data) {
        assert_eq!(i.encode(), data);
    }
}
