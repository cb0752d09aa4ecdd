//! Any byte stream into the frame decoder and every frame into the message decoder: no panic,
//! no unbounded allocation, and whatever decodes re-encodes to a frame that decodes the same.

use ferry_proto::{FrameDecoder, Message};

/// One input.
pub fn run(data: &[u8]) {
    let mut dec = FrameDecoder::new();
    // Feed in two pieces so partial frames are exercised too.
    let (a, b) = data.split_at(data.len() / 2);
    dec.feed(a);
    let mut frames = vec![];
    while let Ok(Some(f)) = dec.next_frame() {
        frames.push(f);
    }
    dec.feed(b);
    while let Ok(Some(f)) = dec.next_frame() {
        frames.push(f);
    }
    for f in frames {
        if let Ok(m) = Message::decode(&f) {
            let again =
                Message::decode(&m.to_frame(f.request_id)).expect("re-encoded message decodes");
            assert_eq!(again, m);
        }
    }
}
