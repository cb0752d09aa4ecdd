//! Any byte stream into a session's compressed inflow (the zstd stream after a `Compressed`): no
//! panic, and the plain bytes held stay bounded by a frame plus one decompression step.

use ferry_proto::{Inflow, MAX_FRAME};

/// One input.
pub fn run(data: &[u8]) {
    let mut inflow = Inflow::new();
    inflow.start_zstd().expect("decoder");
    for piece in data.chunks(97) {
        inflow.feed(piece);
        while let Ok(Some(_)) = inflow.next_frame() {
            assert!(inflow.buffered() <= MAX_FRAME + 4 + (256 << 10));
        }
    }
}
