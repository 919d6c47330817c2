//! Checkpoint files written and read with direct I/O (`O_DIRECT`): a
//! save streams gigabytes it will not read again, and a restore reads
//! them once. Through the page cache either would pay a kernel copy per
//! byte (a third of a restore's CPU, measured) and evict what the host
//! had cached, and a save would leave the kernel's writeback to throttle
//! it.
//!
//! - **Writing** ([`DirectWriter`]): bytes gather in an aligned buffer
//!   written whole; the last block is padded and the file cut back to its
//!   length.
//! - **Reading** ([`DirectReader`]): a thread of its own reads the file
//!   front to back into aligned buffers, [`DIRECT_READS_AHEAD`] ahead of
//!   the parse, so the device works while the restore applies what it
//!   read (direct reads have no kernel read-ahead).
//!
//! Where the file system refuses direct I/O both go through the page
//! cache the same way.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

/// Alignment direct I/O needs of buffers, lengths and file offsets, in
/// bytes (the logical block size of every common device, or a multiple).
pub const DIRECT_ALIGN_BYTES: usize = 4096;

/// Bytes gathered before one write to the device.
pub const DIRECT_WRITE_BYTES: usize = 4 << 20;

/// Bytes of one read from the device.
pub const DIRECT_READ_BYTES: usize = 4 << 20;

/// Buffers a [`DirectReader`] fills ahead of the one its caller reads:
/// its memory is this many plus two of [`DIRECT_READ_BYTES`].
pub const DIRECT_READS_AHEAD: usize = 2;

/// Opens `path` with `flags` (write or read), with `O_DIRECT` where the
/// file system takes it; says which.
fn open_direct(path: &Path, o: &mut OpenOptions) -> std::io::Result<(File, bool)> {
    let direct = o.clone().custom_flags(libc::O_DIRECT).open(path);
    match direct {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((o.open(path)?, false)),
        Err(e) => Err(e),
    }
}

/// An aligned buffer of one read and the bytes it holds.
struct Block {
    /// [`DIRECT_READ_BYTES`] plus room to align them; never reallocated.
    buf: Vec<u8>,
    /// Where the aligned part of `buf` starts.
    start: usize,
    /// Bytes read into it.
    len: usize,
}

impl Block {
    fn new() -> Block {
        let buf = vec![0u8; DIRECT_READ_BYTES + DIRECT_ALIGN_BYTES];
        let start = buf.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
        Block { buf, start, len: 0 }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    /// Fills the block from `file`'s position on; fewer bytes only at the
    /// end of the file.
    fn fill(&mut self, file: &mut File) -> std::io::Result<()> {
        self.len = 0;
        let room = &mut self.buf[self.start..self.start + DIRECT_READ_BYTES];
        while self.len < DIRECT_READ_BYTES {
            match file.read(&mut room[self.len..]) {
                Ok(0) => break,
                Ok(n) => self.len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A file read front to back by a thread of its own, a few buffers ahead
/// of the caller, through direct I/O where it can be.
pub struct DirectReader {
    /// Filled blocks, in file order; closed after the last (or an error).
    full: Option<Receiver<std::io::Result<Block>>>,
    /// Blocks handed back to be filled again.
    empty: Option<SyncSender<Block>>,
    /// The block being read, and how far.
    cur: Option<Block>,
    pos: usize,
    thread: Option<JoinHandle<()>>,
}

impl DirectReader {
    /// Opens `path` and starts reading it.
    pub fn open(path: &Path) -> std::io::Result<DirectReader> {
        let (mut file, _) = open_direct(path, OpenOptions::new().read(true))?;
        let (full_tx, full) = mpsc::sync_channel::<std::io::Result<Block>>(DIRECT_READS_AHEAD);
        let (empty, empty_rx) = mpsc::sync_channel::<Block>(DIRECT_READS_AHEAD + 2);
        let thread = std::thread::Builder::new()
            .name("ckpt-read".into())
            .spawn(move || {
                let mut made = 0;
                loop {
                    // A new block until there are enough, then the ones
                    // the reader handed back; none: the reader is gone.
                    let mut b = if made < DIRECT_READS_AHEAD + 2 {
                        made += 1;
                        Block::new()
                    } else {
                        match empty_rx.recv() {
                            Ok(b) => b,
                            Err(_) => return,
                        }
                    };
                    let r = b.fill(&mut file);
                    let last = r.is_err() || b.len < DIRECT_READ_BYTES;
                    if full_tx.send(r.map(|()| b)).is_err() || last {
                        return;
                    }
                }
            })?;
        Ok(DirectReader {
            full: Some(full),
            empty: Some(empty),
            cur: None,
            pos: 0,
            thread: Some(thread),
        })
    }
}

impl Read for DirectReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Some(b) = &self.cur {
                let left = &b.bytes()[self.pos..];
                if !left.is_empty() {
                    let n = left.len().min(out.len());
                    out[..n].copy_from_slice(&left[..n]);
                    self.pos += n;
                    return Ok(n);
                }
            }
            if let (Some(b), Some(empty)) = (self.cur.take(), &self.empty) {
                // Only fails once the thread stopped: nothing to fill.
                let _ = empty.try_send(b);
            }
            self.pos = 0;
            let Some(full) = &self.full else {
                return Ok(0);
            };
            match full.recv() {
                Ok(Ok(b)) => self.cur = Some(b),
                Ok(Err(e)) => {
                    self.full = None;
                    return Err(e);
                }
                // The thread sent the file's last block before.
                Err(_) => {
                    self.full = None;
                    return Ok(0);
                }
            }
        }
    }
}

impl Drop for DirectReader {
    fn drop(&mut self) {
        // Closing both channels stops the thread at its next block.
        self.full = None;
        self.empty = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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
        let (file, direct) = open_direct(
            path,
            OpenOptions::new().write(true).create(true).truncate(true),
        )?;
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
            // The reader gives the same bytes back, in pieces of any size.
            for piece in [1usize, 4096, 1 << 20, DIRECT_READ_BYTES + 7] {
                let mut r = DirectReader::open(&path).expect("open");
                let mut got = Vec::new();
                let mut buf = vec![0u8; piece];
                loop {
                    let n = r.read(&mut buf).expect("read");
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                assert!(got == want, "{total} bytes read {piece} at a time");
            }
        }
    }

    #[test]
    fn a_reader_dropped_early_stops_its_thread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let mut w = DirectWriter::create(&path).expect("create");
        w.write_all(&vec![7u8; 5 * DIRECT_READ_BYTES])
            .expect("write");
        w.finish().expect("finish");
        let mut r = DirectReader::open(&path).expect("open");
        let mut one = [0u8; 10];
        r.read_exact(&mut one).expect("read");
        assert_eq!(one, [7u8; 10]);
        // Joins the thread, which is blocked handing over a full block.
        drop(r);
    }
}
