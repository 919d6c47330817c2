//! One tcp connection's buffers and its write path, the hot half of a
//! worker's port ([`super::port::TcpPort`] owns the epoll and the
//! rounds over connections): replies appended to the send buffer, shared
//! parts (leased values) queued at their place in it, and `flush`'s one
//! vectored `write` per connection, or `vmsplice`/`splice` through a
//! pipe for large shared parts ([`SPLICE_PART_BYTES_MIN`]).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::OwnedFd;
use std::time::Instant;

use fabrickv_types::limits::CONN_SEND_QUEUE_BYTES_MAX;
use mio::net::TcpStream;

use crate::idle::Activity;
use crate::{Reply, SharedBytes};

/// Bytes asked of each `read` call: large enough for a deep pipeline of
/// small requests, small enough to keep per-connection memory modest.
pub(super) const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Most slices one vectored `write` is given (the kernel takes up to
/// `IOV_MAX`, 1024; a burst's replies rarely need more than a few).
const WRITE_SLICES_MAX: usize = 64;

/// Smallest shared part sent zero-copy (`vmsplice` into a pipe, `splice`
/// into the socket), in bytes; smaller parts are copied by `writev`, which
/// costs less than the two extra system calls.
///
/// Why: the copy into the socket was most of a worker's time serving
/// large values over tcp (each read from DRAM, where a stream benchmark's
/// buffer stays in cache); on this project's 2-core VM a loopback stream
/// of 64 KiB values from a 256 MiB pool ran at 1.7 GB/s by `writev` and
/// 3.4 GB/s spliced.
///
/// What it costs: once spliced, the socket holds references to the pages
/// until the reader has copied them out, after the part (and the lease
/// on the value it came from) is dropped. Memory reused in that window
/// would reach the reader changed. Value chunks carry the CRC-32C of the
/// committed value, so the reader detects such a chunk and reads it again
/// (the cache client does); nothing stored is ever affected.
pub const SPLICE_PART_BYTES_MIN: usize = 32 * 1024;

/// Capacity asked for a connection's splice pipe, in bytes (Linux's
/// default ceiling for unprivileged pipes, `fs.pipe-max-size`); a smaller
/// pipe only means more `vmsplice` calls per part.
const SPLICE_PIPE_BYTES: usize = 1 << 20;

pub(crate) struct Conn {
    pub(super) stream: TcpStream,
    /// The peer has shut down its sending side (FIN seen by epoll): keep
    /// reading until `read` returns 0 even after a short read, since no
    /// further edge will come.
    pub(super) read_closed: bool,
    /// Receive buffer; bytes `in_head..in_tail` are received and not yet
    /// handled. Its length only grows, and it is zeroed only as it grows,
    /// never per `read`.
    pub(super) inbuf: Vec<u8>,
    pub(super) in_head: usize,
    pub(super) in_tail: usize,
    /// Framed replies waiting to be written, from `out_head`.
    pub(super) out: Vec<u8>,
    out_head: usize,
    /// Bytes replies refer to, in stream order, each written just before
    /// `out[at..]`; `shared_head` bytes of the front one are written.
    pub(super) shared: VecDeque<Shared>,
    shared_head: usize,
    /// Bytes of `shared` not yet written.
    pub(super) shared_bytes: usize,
    /// The socket may have more bytes to read (edge-triggered epoll).
    pub(super) readable: bool,
    /// Listed in `ready`.
    pub(super) queued: bool,
    /// Paused because the client is not reading its replies.
    pub(super) paused: bool,
    /// When a partial message first sat in `inbuf`.
    pub(super) partial_since: Option<Instant>,
    /// When bytes last arrived, as the port's idle check reads it.
    pub(super) activity: Activity,
    /// The pipe large shared parts are spliced through.
    pipe: SplicePipe,
    /// Bytes of the queue, from what is written on, in the pipe and not
    /// yet in the socket; nothing else is written until they are.
    piped: usize,
    /// Bytes of shared parts handed to the pipe by `vmsplice` (sent
    /// without a copy), for the port's stats.
    pub(super) spliced: u64,
}

/// A connection's splice pipe: made on first use, given up (back to
/// `writev`) if the kernel refuses it.
enum SplicePipe {
    Untried,
    Ready { read: OwnedFd, write: OwnedFd },
    Off,
}

/// What one step of [`Conn::splice_step`] did.
enum Spliced {
    /// Bytes moved; go on.
    Moved,
    /// The socket is full.
    Full,
    /// Splicing is not possible on this connection: write instead.
    Unavailable,
    /// The connection failed.
    Failed,
}

/// Bytes a reply refers to, and where they go in the send buffer.
pub(super) struct Shared {
    /// Written just before `out[at..]`.
    pub(super) at: usize,
    pub(super) bytes: SharedBytes,
}

impl Shared {
    fn bytes(&self) -> &[u8] {
        (*self.bytes).as_ref()
    }
}

/// The reply of one message: the connection's send buffer, and its queue
/// of shared bytes.
pub(super) struct ConnReply<'a> {
    pub(super) out: &'a mut Vec<u8>,
    pub(super) shared: &'a mut VecDeque<Shared>,
    /// Shared bytes and parts this reply queued.
    pub(super) added_bytes: usize,
    pub(super) added: usize,
}

impl Reply for ConnReply<'_> {
    fn buf(&mut self) -> &mut Vec<u8> {
        self.out
    }

    fn append_shared(&mut self, bytes: SharedBytes) {
        let len = (*bytes).as_ref().len();
        if len == 0 {
            return;
        }
        self.shared.push_back(Shared {
            at: self.out.len(),
            bytes,
        });
        self.added_bytes += len;
        self.added += 1;
    }
}

impl Conn {
    /// A connection just accepted, listed as ready: bytes may have
    /// arrived before it was registered, and no edge will announce them.
    pub(super) fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            read_closed: false,
            inbuf: Vec::new(),
            in_head: 0,
            in_tail: 0,
            out: Vec::new(),
            out_head: 0,
            shared: VecDeque::new(),
            shared_head: 0,
            shared_bytes: 0,
            readable: true,
            queued: true,
            paused: false,
            partial_since: None,
            activity: Activity::new(Instant::now()),
            pipe: SplicePipe::Untried,
            piped: 0,
            spliced: 0,
        }
    }

    /// Reply bytes queued and not yet written.
    pub(super) fn pending(&self) -> usize {
        self.out.len() - self.out_head + self.shared_bytes
    }

    /// Writes queued replies until done or the socket is full; returns
    /// true if the connection failed.
    pub(super) fn write_out(&mut self) -> bool {
        while self.pending() > 0 {
            if self.piped > 0 || self.splice_wanted() {
                match self.splice_step() {
                    Spliced::Moved => continue,
                    Spliced::Full => return false,
                    Spliced::Failed => return true,
                    Spliced::Unavailable => {}
                }
            }
            let mut iov = [IoSlice::new(&[]); WRITE_SLICES_MAX];
            let mut n = 0;
            let mut pos = self.out_head;
            let mut skip = self.shared_head;
            let mut all = true;
            for sh in &self.shared {
                if n + 2 > WRITE_SLICES_MAX {
                    all = false;
                    break;
                }
                if sh.at > pos {
                    iov[n] = IoSlice::new(&self.out[pos..sh.at]);
                    n += 1;
                    pos = sh.at;
                }
                iov[n] = IoSlice::new(&sh.bytes()[skip..]);
                n += 1;
                skip = 0;
            }
            if all && pos < self.out.len() {
                iov[n] = IoSlice::new(&self.out[pos..]);
                n += 1;
            }
            match super::send_vectored(&self.stream, &iov[..n]) {
                Ok(0) => return true,
                Ok(written) => self.advance(written),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
        false
    }

    /// Whether the queue holds a shared part worth splicing (and the
    /// connection can splice).
    fn splice_wanted(&self) -> bool {
        let mut large = false;
        if !matches!(self.pipe, SplicePipe::Off) {
            self.pieces(|_, l| {
                large = l;
                !l
            });
        }
        large
    }

    /// The unwritten queue as pieces in stream order, until `each`
    /// returns false: (bytes, whether they are a shared part to splice
    /// rather than copy).
    fn pieces(&self, mut each: impl FnMut(&[u8], bool) -> bool) {
        let mut pos = self.out_head;
        for (i, sh) in self.shared.iter().enumerate() {
            if sh.at > pos {
                if !each(&self.out[pos..sh.at], false) {
                    return;
                }
                pos = sh.at;
            }
            let b = &sh.bytes()[if i == 0 { self.shared_head } else { 0 }..];
            if !each(b, b.len() >= SPLICE_PART_BYTES_MIN) {
                return;
            }
        }
        if pos < self.out.len() {
            each(&self.out[pos..], false);
        }
    }

    /// Moves the queue on through the pipe: while the pipe holds bytes,
    /// one `splice` of them into the socket; else the pipe is filled with
    /// the queue in order, large shared parts by `vmsplice` (their pages,
    /// not copied) and everything between (replies' heads) by `write`, so
    /// that one `splice` sends several replies, each head in the segment
    /// of its value.
    // The one unsafe call of the tcp transport: `vmsplice`, below.
    #[allow(unsafe_code)]
    fn splice_step(&mut self) -> Spliced {
        use rustix::pipe::{IoSliceRaw, SpliceFlags};
        if matches!(self.pipe, SplicePipe::Untried) {
            self.pipe = match rustix::pipe::pipe_with(
                rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
            ) {
                Ok((read, write)) => {
                    // Best effort: the default 64 KiB pipe works, in more calls.
                    let _ = rustix::pipe::fcntl_setpipe_size(&write, SPLICE_PIPE_BYTES);
                    SplicePipe::Ready { read, write }
                }
                Err(e) => {
                    tracing::debug!("no splice pipe ({e}); writing large parts instead");
                    SplicePipe::Off
                }
            };
        }
        let SplicePipe::Ready { read, write } = &self.pipe else {
            return Spliced::Unavailable;
        };
        if self.piped > 0 {
            return match rustix::pipe::splice(
                read,
                None,
                &self.stream,
                None,
                self.piped,
                SpliceFlags::NONBLOCK | SpliceFlags::MOVE,
            ) {
                Ok(0) => Spliced::Failed,
                Ok(k) => {
                    self.piped -= k;
                    self.advance(k);
                    Spliced::Moved
                }
                Err(rustix::io::Errno::AGAIN) => Spliced::Full,
                Err(rustix::io::Errno::INTR) => Spliced::Moved,
                Err(_) => Spliced::Failed,
            };
        }
        let mut filled = 0usize;
        let mut zero_copy = 0usize;
        let mut refused = None;
        self.pieces(|b, large| {
            let r = if large {
                warm(&b[..b.len().min(SPLICE_PIPE_BYTES.saturating_sub(filled))]);
                // SAFETY: vmsplice only reads `b`, which outlives the
                // call; the pipe (then the socket) keeps references to its
                // pages after it, which `SPLICE_PART_BYTES_MIN` documents
                // and the value checksums guard.
                unsafe {
                    rustix::pipe::vmsplice(
                        write,
                        &[IoSliceRaw::from_slice(b)],
                        SpliceFlags::NONBLOCK,
                    )
                }
            } else {
                rustix::io::write(write, b)
            };
            match r {
                Ok(k) => {
                    filled += k;
                    if large {
                        zero_copy += k;
                    }
                    // A short move means the pipe is full.
                    k == b.len()
                }
                Err(rustix::io::Errno::AGAIN) => false,
                Err(e) => {
                    refused = Some(e);
                    false
                }
            }
        });
        self.piped = filled;
        self.spliced += zero_copy as u64;
        if filled > 0 {
            return Spliced::Moved;
        }
        // Nothing is in the pipe: writing instead is safe.
        tracing::debug!(
            "splice pipe refused ({:?}); writing large parts instead",
            refused
        );
        self.pipe = SplicePipe::Off;
        Spliced::Unavailable
    }

    /// Marks `k` more bytes of the stream written, dropping the shared
    /// parts that are done.
    fn advance(&mut self, mut k: usize) {
        while k > 0 {
            let Some(sh) = self.shared.front() else {
                self.out_head += k;
                return;
            };
            if self.out_head < sh.at {
                let t = k.min(sh.at - self.out_head);
                self.out_head += t;
                k -= t;
                continue;
            }
            let left = sh.bytes().len() - self.shared_head;
            let t = k.min(left);
            self.shared_head += t;
            self.shared_bytes -= t;
            k -= t;
            if t == left {
                self.shared.pop_front();
                self.shared_head = 0;
            }
        }
    }

    /// Drops the written prefix of the send buffer when it is all written
    /// or has grown past the queue bound, so the buffer does not creep.
    pub(super) fn compact(&mut self) {
        if self.out_head == self.out.len() || self.out_head > CONN_SEND_QUEUE_BYTES_MAX {
            self.out.drain(..self.out_head);
            for sh in &mut self.shared {
                sh.at -= self.out_head;
            }
            self.out_head = 0;
        }
    }
}

/// Reads one word of every cache line of `bytes`, so that the lines are
/// in the shared cache when the reader's `recv` copies them: spliced
/// pages are copied once, by the reader, and a large value is otherwise
/// read from DRAM on the reader's CPU while the worker's sits idle. The
/// loads are independent, so the core keeps many in flight.
#[inline]
fn warm(bytes: &[u8]) {
    const LINE_BYTES: usize = 64;
    let mut x = 0u8;
    for line in bytes.chunks(LINE_BYTES) {
        x ^= line[0];
    }
    std::hint::black_box(x);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;
    use std::time::Duration;

    use super::*;

    /// A connection to a local peer, with a small send buffer so that
    /// writes come back short and the shared parts are cut mid-way.
    fn conn_and_peer() -> (Conn, std::net::TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        let sock = rustix::fd::AsFd::as_fd(&client);
        rustix::net::sockopt::set_socket_send_buffer_size(sock, 4096).unwrap();
        client.set_nonblocking(true).unwrap();
        let mut conn = Conn::new(TcpStream::from_std(client));
        // Not listed anywhere: the tests drive it by hand.
        conn.readable = false;
        conn.queued = false;
        (conn, peer)
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(13) ^ seed).collect()
    }

    /// A shared part that keeps its bytes alive beyond the transport's
    /// drop, as a test must: spliced pages are read after the drop, and
    /// freed heap memory could be reused by the reader's allocations.
    struct Kept(std::sync::Arc<Vec<u8>>);

    impl AsRef<[u8]> for Kept {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    /// Queues `parts` (shared or copied), writes them all through the
    /// small send buffer and checks the peer reads exactly the stream;
    /// returns the bytes spliced.
    fn write_parts(parts: &[(bool, Vec<u8>)], splice: bool) -> u64 {
        let (mut c, mut peer) = conn_and_peer();
        if !splice {
            c.pipe = SplicePipe::Off;
        }
        let mut want = Vec::new();
        let mut kept = Vec::new();
        let mut reply = ConnReply {
            out: &mut c.out,
            shared: &mut c.shared,
            added_bytes: 0,
            added: 0,
        };
        for (shared, b) in parts {
            want.extend_from_slice(b);
            if *shared {
                let a = std::sync::Arc::new(b.clone());
                kept.push(a.clone());
                reply.append_shared(Box::new(Kept(a)));
            } else {
                reply.buf().extend_from_slice(b);
            }
        }
        // An empty shared part is not queued.
        reply.append_shared(Box::new(Vec::new()));
        assert_eq!(reply.added, parts.iter().filter(|p| p.0).count());
        c.shared_bytes += reply.added_bytes;
        assert_eq!(c.pending(), want.len());
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; want.len()];
            peer.read_exact(&mut got).unwrap();
            assert!(got == want, "the stream differs from the parts in order");
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.pending() > 0 {
            assert!(!c.write_out(), "the connection failed");
            c.compact();
            assert!(Instant::now() < deadline, "not written in time");
            std::thread::sleep(Duration::from_micros(200));
        }
        assert!(c.shared.is_empty() && c.out.is_empty() && c.shared_bytes == 0);
        assert_eq!(c.piped, 0);
        reader.join().unwrap();
        drop(kept);
        c.spliced
    }

    /// The stream: a, S1, S2 (two shared parts back to back), b, S3, c,
    /// a small shared part, and a large shared part with nothing after it.
    fn mixed_parts() -> Vec<(bool, Vec<u8>)> {
        vec![
            (false, bytes(100, 1)),
            (true, bytes(300_000, 2)),
            (true, bytes(70_000, 3)),
            (false, bytes(5, 4)),
            (true, bytes(200_000, 5)),
            (false, bytes(1000, 6)),
            (true, bytes(SPLICE_PART_BYTES_MIN - 1, 8)),
            (true, bytes(50_000, 7)),
        ]
    }

    #[test]
    fn shared_parts_are_written_in_place_through_short_writes() {
        assert_eq!(write_parts(&mixed_parts(), false), 0);
    }

    #[test]
    fn large_shared_parts_are_spliced_in_order_through_short_writes() {
        let parts = mixed_parts();
        let large: usize = parts
            .iter()
            .filter(|(shared, b)| *shared && b.len() >= SPLICE_PART_BYTES_MIN)
            .map(|(_, b)| b.len())
            .sum();
        assert_eq!(write_parts(&parts, true), large as u64);
    }
}
