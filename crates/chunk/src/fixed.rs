//! `fixed-v1`: fixed-size blocks, the "Block" baseline of the OceanStore evaluation. An
//! insertion shifts every later block, which is exactly what the baseline is there to show.

use crate::Cutter;

/// Cuts every `size` bytes.
pub struct FixedCutter {
    size: usize,
    len: usize,
}

impl FixedCutter {
    pub(crate) fn new(size: usize) -> Self {
        FixedCutter { size, len: 0 }
    }
}

impl Cutter for FixedCutter {
    fn next_cut(&mut self, data: &[u8]) -> Option<usize> {
        let want = self.size - self.len;
        if data.len() >= want {
            self.len = 0;
            Some(want)
        } else {
            self.len += data.len();
            None
        }
    }

    fn reset(&mut self) {
        self.len = 0;
    }

    fn max_size(&self) -> usize {
        self.size
    }
}
