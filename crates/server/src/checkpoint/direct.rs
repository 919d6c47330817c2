//! Checkpoint files written with direct I/O (`O_DIRECT`): a save streams
//! gigabytes it will not read again, and through the page cache it would
//! pay a copy per byte, evict what the server's host had cached, and
//! leave the kernel's writeback to throttle it. Bytes gather in an
//! aligned buffer written whole; the last block is padded and the file
//! cut back to its length. Where the file system refuses direct I/O the
//! same writer goes through the page cache.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Alignment direct I/O needs of buffers, lengths and file offsets, in
/// bytes (the logical block size of every common device, or a multiple).
pub const DIRECT_ALIGN_BYTES: usize = 4096;

/// Bytes gathered before one write to the device.
pub const DIRECT_WRITE_BYTES: usize = 4 << 20;

/// A file being written, through direct I/O where it can be.
pub struct DirectWriter {
    file: File,
    /// `DIRECT_WRITE_BYTES` plus room to align them; never reallocated.
    buf: Vec<u8>,
    /// Where the aligned part of `buf` starts.
    start: usize,
    /// Bytes gathered and not written yet.
    filled: usize,
    /// Bytes written to the file so far (a multiple of the alignment
    /// while direct).
    written: u64,
    direct: bool,
}

impl DirectWriter {
    /// Creates (or truncates) `path`.
    pub fn create(path: &Path) -> std::io::Result<DirectWriter> {
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.write(true).create(true).truncate(true);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let (file, direct) = match open(true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(false)?, false),
            Err(e) => return Err(e),
        };
        let buf = vec![0u8; DIRECT_WRITE_BYTES + DIRECT_ALIGN_BYTES];
        let start = buf.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
        Ok(DirectWriter {
            file,
            buf,
            start,
            filled: 0,
            written: 0,
            direct,
        })
    }

    /// Appends `b`.
    pub fn write_all(&mut self, mut b: &[u8]) -> std::io::Result<()> {
        while !b.is_empty() {
            let room = DIRECT_WRITE_BYTES - self.filled;
            let n = room.min(b.len());
            let at = self.start + self.filled;
            self.buf[at..at + n].copy_from_slice(&b[..n]);
            self.filled += n;
            b = &b[n..];
            if self.filled == DIRECT_WRITE_BYTES {
                self.flush_whole()?;
            }
        }
        Ok(())
    }

    fn flush_whole(&mut self) -> std::io::Result<()> {
        let chunk = &self.buf[self.start..self.start + self.filled];
        self.file.write_all(chunk)?;
        self.written += self.filled as u64;
        self.filled = 0;
        Ok(())
    }

    /// Writes what is left, cuts the file to the bytes appended, and
    /// syncs it; returns the file's length.
    pub fn finish(mut self) -> std::io::Result<u64> {
        let len = self.written + self.filled as u64;
        if self.direct && !self.filled.is_multiple_of(DIRECT_ALIGN_BYTES) {
            let padded = self.filled.next_multiple_of(DIRECT_ALIGN_BYTES);
            let at = self.start + self.filled;
            self.buf[at..self.start + padded].fill(0);
            self.filled = padded;
        }
        self.flush_whole()?;
        if self.written != len {
            self.file.set_len(len)?;
        }
        self.file.sync_all()?;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_is_read_back_whatever_the_sizes() {
        let dir = tempfile::tempdir().expect("tempdir");
        for total in [
            0usize,
            1,
            4095,
            4096,
            4097,
            DIRECT_WRITE_BYTES,
            DIRECT_WRITE_BYTES + 13,
        ] {
            let path = dir.path().join(format!("f{total}"));
            let want: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
            let mut w = DirectWriter::create(&path).expect("create");
            for piece in want.chunks(1000) {
                w.write_all(piece).expect("write");
            }
            assert_eq!(w.finish().expect("finish"), total as u64);
            assert_eq!(std::fs::read(&path).expect("read"), want, "{total} bytes");
        }
    }
}
