//! The floor a shard copy is measured against: the same number of bytes
//! streamed through a plain loopback TCP socket into a file, then fsynced.
//!
//! That is what the copy would cost with no storage engine on either end:
//! no checkpoint, no range iterators, no framing, no verification and no
//! bulk writer, only the socket and the file system the copy cannot avoid.
//! A copy rate close to [`raw_pipe`]'s says the engine costs little; a large
//! gap says where to look. The data is pseudo-random so nothing along the
//! way (a compressing file system, a deduplicating device) makes the floor
//! look cheaper than a real shard's bytes would be.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Instant;

/// Size of the sender's pattern buffer and the receiver's read buffer, in
/// bytes (1 MiB): large enough that per-call overhead is noise, small
/// enough to stay in cache.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Name of the file the receiver writes inside the given directory; it is
/// removed before [`raw_pipe`] returns.
pub const FILE_NAME: &str = "raw-pipe.bin";

/// Bytes in a decimal megabyte, the unit [`PipeReport::mb_per_s`] reports.
pub const BYTES_PER_MB: f64 = 1e6;

/// Seed of the xorshift generator that fills the pattern buffer (any
/// non-zero value; fixed so runs send the same bytes).
const PATTERN_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// What one [`raw_pipe`] run moved and how long it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipeReport {
    /// Bytes received and written to the file (equal to the bytes asked
    /// for: a short stream is an error, not a report).
    pub bytes: u64,
    /// Seconds from the TCP connect to after the file's `sync_all`.
    pub secs: f64,
}

impl PipeReport {
    /// Throughput in decimal MB/s (1 MB = [`BYTES_PER_MB`] bytes); 0 when
    /// no time was measured.
    pub fn mb_per_s(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / BYTES_PER_MB / self.secs
        } else {
            0.0
        }
    }
}

/// Streams `bytes` bytes of incompressible data over a loopback TCP
/// connection into `dir/raw-pipe.bin`, `sync_all`s the file, removes it and
/// reports the time from the connect to after the sync.
///
/// The sender runs on its own thread and writes a [`CHUNK_BYTES`] buffer
/// filled once by a xorshift generator, over and over, the last write
/// truncated; the receiver (the calling thread) reads into a
/// [`CHUNK_BYTES`] buffer and writes each chunk it gets to the file. Both
/// ends are plain blocking std sockets with default options, as a naive
/// copier would use them. Filling the pattern and removing the file are not
/// timed; creating the file is, as a copy target creates its files too.
///
/// Errors: binding, connecting, reading, writing or syncing fail with that
/// I/O error (the receiver's first: when it fails the sender only sees the
/// closed socket); a stream that ends before `bytes` arrived is
/// `UnexpectedEof`.
/// The file is removed on every path, a failed run included.
pub fn raw_pipe(bytes: u64, dir: &Path) -> io::Result<PipeReport> {
    let pattern = xorshift_pattern(CHUNK_BYTES);
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = listener.local_addr()?;
    let file = RemoveOnDrop(dir.join(FILE_NAME));

    let start = Instant::now();
    // Connect here rather than on the sender thread: a loopback connect to
    // a bound listener completes from its backlog, so the accept below
    // cannot wait for a sender that failed to connect.
    let send_stream = TcpStream::connect(addr)?;
    let (mut recv_stream, _) = listener.accept()?;
    let sender = thread::Builder::new()
        .name("raw-pipe-send".to_owned())
        .spawn(move || send(send_stream, &pattern, bytes))?;

    let received = receive(&mut recv_stream, &file.0);
    // A receiver that failed drops its end here, so a sender blocked in
    // write gets an error instead of waiting forever.
    drop(recv_stream);
    let sent = sender
        .join()
        .map_err(|_| io::Error::other("raw pipe sender thread panicked"))?;
    // The receiver's error is the cause when both failed (the sender then
    // only saw the closed socket); a sender error alone explains a short
    // stream.
    let received = received?;
    sent?;
    let secs = start.elapsed().as_secs_f64();
    drop(file);

    if received != bytes {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("raw pipe: sent {bytes} bytes, received {received}"),
        ));
    }
    Ok(PipeReport {
        bytes: received,
        secs,
    })
}

/// Writes `bytes` bytes of `pattern`, repeated, then shuts down the write
/// side so the receiver sees the end of the stream.
fn send(mut stream: TcpStream, pattern: &[u8], bytes: u64) -> io::Result<()> {
    let mut left = bytes;
    while left > 0 {
        let n = usize::try_from(left).map_or(pattern.len(), |left| left.min(pattern.len()));
        stream.write_all(&pattern[..n])?;
        left -= n as u64;
    }
    stream.shutdown(Shutdown::Write)
}

/// Reads `stream` to its end into a new file at `path`, writing each chunk
/// as it arrives, then `sync_all`s the file; returns the bytes received.
fn receive(stream: &mut TcpStream, path: &Path) -> io::Result<u64> {
    let mut file = File::create(path)?;
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut received = 0u64;
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        file.write_all(&buf[..n])?;
        received += n as u64;
    }
    file.sync_all()?;
    Ok(received)
}

/// `len` bytes from a xorshift64 generator seeded with [`PATTERN_SEED`]:
/// incompressible, and far faster to make than the socket can carry.
fn xorshift_pattern(len: usize) -> Vec<u8> {
    let mut state = PATTERN_SEED;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let word = state.to_le_bytes();
        let take = word.len().min(len - out.len());
        out.extend_from_slice(&word[..take]);
    }
    out
}

/// Removes the file at its path when dropped, whether the run succeeded or
/// not; a file that was never created (or is already gone) is not an error.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn streams_the_bytes_and_removes_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Not a multiple of the chunk: the last write is truncated.
        let bytes = 4 * MIB + 12_345;
        let report = raw_pipe(bytes, dir.path()).expect("raw pipe");
        assert_eq!(report.bytes, bytes);
        assert!(report.secs > 0.0, "{report:?}");
        assert!(report.mb_per_s() > 0.0, "{report:?}");
        assert!(!dir.path().join(FILE_NAME).exists(), "file left behind");
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("read dir").count(),
            0,
            "directory not empty"
        );
    }

    #[test]
    fn zero_and_small_byte_counts() {
        let dir = tempfile::tempdir().expect("tempdir");
        for bytes in [0, 1, 4095] {
            let report = raw_pipe(bytes, dir.path()).expect("raw pipe");
            assert_eq!(report.bytes, bytes);
            assert!(!dir.path().join(FILE_NAME).exists());
        }
    }

    #[test]
    fn missing_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing");
        let e = raw_pipe(MIB, &missing).expect_err("no such directory");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn mb_per_s_is_decimal() {
        let report = PipeReport {
            bytes: 500_000_000,
            secs: 2.0,
        };
        assert!((report.mb_per_s() - 250.0).abs() < 1e-9);
        let report = PipeReport {
            bytes: 1,
            secs: 0.0,
        };
        assert_eq!(report.mb_per_s(), 0.0);
    }

    #[test]
    fn pattern_is_incompressible_looking() {
        let pattern = xorshift_pattern(CHUNK_BYTES);
        assert_eq!(pattern.len(), CHUNK_BYTES);
        let mut counts = [0u64; 256];
        for &b in &pattern {
            counts[usize::from(b)] += 1;
        }
        // Uniform bytes: each value near len / 256 = 4096 times.
        let expected = (CHUNK_BYTES / 256) as u64;
        for (value, &count) in counts.iter().enumerate() {
            assert!(
                count > expected / 2 && count < expected * 2,
                "byte {value} appears {count} times"
            );
        }
    }
}
