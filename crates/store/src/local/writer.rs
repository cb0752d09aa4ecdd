//! The pack being appended to. Records gather in a buffer and reach the file a megabyte at a
//! time (by default) (a chunk per `pwrite` costs more in system calls than in copying); a flush, a read of
//! a record not yet in the file, and the end of the pack write the buffer out first.

use std::fs::File;
use std::os::unix::fs::FileExt;

pub(super) struct Writer {
    pub(super) num: u32,
    file: File,
    /// Length of the pack, buffered records included.
    pub(super) len: u64,
    /// Length at the last commit of the index.
    pub(super) committed: u64,
    pub(super) dir_synced: bool,
    /// Records not yet in the file; they start at `len - buf.len()`.
    buf: Vec<u8>,
    /// Bytes gathered before they are written.
    limit: usize,
}

impl Writer {
    /// A pack whose first `len` bytes are in the file; `committed` of them are indexed.
    pub(super) fn new(
        num: u32,
        file: File,
        len: u64,
        committed: u64,
        dir_synced: bool,
        limit: usize,
    ) -> Self {
        Writer {
            num,
            file,
            len,
            committed,
            dir_synced,
            buf: Vec::new(),
            limit,
        }
    }

    /// Appends a record; returns its offset.
    pub(super) fn append(&mut self, rec: &[u8]) -> std::io::Result<u64> {
        let at = self.len;
        self.buf.extend_from_slice(rec);
        self.len += rec.len() as u64;
        if self.buf.len() >= self.limit {
            self.write_out()?;
        }
        Ok(at)
    }

    /// Writes the buffered records to the file. On failure the file is cut back to its whole
    /// records and the buffered ones are lost: the caller poisons the store.
    pub(super) fn write_out(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let start = self.len - self.buf.len() as u64;
        if let Err(e) = self.file.write_all_at(&self.buf, start) {
            let _ = self.file.set_len(start);
            return Err(e);
        }
        self.buf.clear();
        Ok(())
    }

    /// Writes the buffer out and makes the pack's data durable.
    pub(super) fn sync(&mut self) -> std::io::Result<()> {
        self.write_out()?;
        self.file.sync_data()
    }
}
