//! A worker's tcp port: every connection bound to one worker, on one epoll.
//!
//! The data path of a burst: one `epoll_wait` with zero timeout, then for
//! each ready connection one `read` into its buffer and the handler run on
//! every whole message in it, replies appended to the connection's send
//! buffer; then [`TcpPort::flush`] does one `write` per connection with
//! output. No allocation once buffers have grown to their working size.
//!
//! Bytes a handler hands over with [`Reply::append_shared`] (a leased
//! value) are not copied into the send buffer: they are queued at their
//! place in it and written from their own memory by the same vectored
//! `write`, then dropped. A shared part of at least
//! [`SPLICE_PART_BYTES_MIN`] is not copied at all: while one is queued,
//! the queue goes through a pipe, `vmsplice` handing it the part's pages
//! and `splice` moving them into the socket, so the kernel sends from the
//! value's own memory and the only copy left is the reader's (see
//! [`SPLICE_PART_BYTES_MIN`] for what guards those pages).

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use fabrickv_types::limits::{
    CONN_SEND_QUEUE_BYTES_MAX, MESSAGE_BYTES_MAX, PARTIAL_MESSAGE_TIMEOUT_MS,
};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::framing::{self, Next, PREFIX_BYTES};
use crate::{
    ConnId, MessageHandler, PortStats, Reply, Result, SharedBytes, TransportError, Waker,
    WorkerPort,
};

const WAKER: Token = Token(usize::MAX);

/// Bytes asked of each `read` call: large enough for a deep pipeline of
/// small requests, small enough to keep per-connection memory modest.
const READ_CHUNK_BYTES: usize = 64 * 1024;

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

/// Most readiness events handled per epoll call.
const EVENTS_PER_POLL: usize = 1024;

/// How often the port looks for connections stalled mid-message, in ms.
const STALL_CHECK_INTERVAL_MS: u64 = 500;

/// The acceptor's side of a worker's hand-off channel.
pub(super) struct Handoff {
    tx: Sender<TcpStream>,
    waker: Arc<mio::Waker>,
}

impl Handoff {
    /// Gives a handshaken socket to the worker; returns it if the worker is gone.
    pub(super) fn hand(&self, s: TcpStream) -> std::result::Result<(), TcpStream> {
        self.tx.send(s).map_err(|e| e.0)?;
        let _ = self.waker.wake();
        Ok(())
    }
}

struct Conn {
    stream: TcpStream,
    /// The peer has shut down its sending side (FIN seen by epoll): keep
    /// reading until `read` returns 0 even after a short read, since no
    /// further edge will come.
    read_closed: bool,
    /// Receive buffer; bytes `in_head..in_tail` are received and not yet
    /// handled. Its length only grows, and it is zeroed only as it grows,
    /// never per `read`.
    inbuf: Vec<u8>,
    in_head: usize,
    in_tail: usize,
    /// Framed replies waiting to be written, from `out_head`.
    out: Vec<u8>,
    out_head: usize,
    /// Bytes replies refer to, in stream order, each written just before
    /// `out[at..]`; `shared_head` bytes of the front one are written.
    shared: VecDeque<Shared>,
    shared_head: usize,
    /// Bytes of `shared` not yet written.
    shared_bytes: usize,
    /// The socket may have more bytes to read (edge-triggered epoll).
    readable: bool,
    /// Listed in `ready`.
    queued: bool,
    /// Paused because the client is not reading its replies.
    paused: bool,
    /// When a partial message first sat in `inbuf`.
    partial_since: Option<Instant>,
    /// The pipe large shared parts are spliced through.
    pipe: SplicePipe,
    /// Bytes of the queue, from what is written on, in the pipe and not
    /// yet in the socket; nothing else is written until they are.
    piped: usize,
    /// Bytes of shared parts handed to the pipe by `vmsplice` (sent
    /// without a copy), for the port's stats.
    spliced: u64,
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
struct Shared {
    /// Written just before `out[at..]`.
    at: usize,
    bytes: SharedBytes,
}

impl Shared {
    fn bytes(&self) -> &[u8] {
        (*self.bytes).as_ref()
    }
}

/// The reply of one message: the connection's send buffer, and its queue
/// of shared bytes.
struct ConnReply<'a> {
    out: &'a mut Vec<u8>,
    shared: &'a mut VecDeque<Shared>,
    /// Shared bytes and parts this reply queued.
    added_bytes: usize,
    added: usize,
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
    fn new(stream: TcpStream) -> Conn {
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
            pipe: SplicePipe::Untried,
            piped: 0,
            spliced: 0,
        }
    }

    /// Reply bytes queued and not yet written.
    fn pending(&self) -> usize {
        self.out.len() - self.out_head + self.shared_bytes
    }

    /// Writes queued replies until done or the socket is full; returns
    /// true if the connection failed.
    fn write_out(&mut self) -> bool {
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
            match self.stream.write_vectored(&iov[..n]) {
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
    fn compact(&mut self) {
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

pub(crate) struct TcpPort {
    poll: Poll,
    events: Events,
    waker: Arc<mio::Waker>,
    incoming: Receiver<TcpStream>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Connections with bytes to read or whole messages buffered.
    ready: Vec<usize>,
    /// Connections with replies to write.
    dirty: Vec<usize>,
    open: Arc<AtomicUsize>,
    stats: PortStats,
    last_stall_check: Instant,
}

impl TcpPort {
    pub(super) fn new(open: Arc<AtomicUsize>) -> Result<(TcpPort, Handoff)> {
        let poll = Poll::new()?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKER)?);
        let (tx, rx) = crossbeam_channel::unbounded();
        let port = TcpPort {
            poll,
            events: Events::with_capacity(EVENTS_PER_POLL),
            waker: waker.clone(),
            incoming: rx,
            conns: Vec::new(),
            free: Vec::new(),
            ready: Vec::new(),
            dirty: Vec::new(),
            open,
            stats: PortStats::default(),
            last_stall_check: Instant::now(),
        };
        Ok((port, Handoff { tx, waker }))
    }

    fn adopt(&mut self) {
        while let Ok(mut stream) = self.incoming.try_recv() {
            let slot = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            if self
                .poll
                .registry()
                .register(
                    &mut stream,
                    Token(slot),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .is_err()
            {
                self.free.push(slot);
                self.open.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            self.conns[slot] = Some(Conn::new(stream));
            self.ready.push(slot);
            self.stats.conns_accepted += 1;
            self.stats.conns_open += 1;
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some(mut c) = self.conns[slot].take() {
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.free.push(slot);
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.stats.conns_open -= 1;
        }
    }

    /// Turns readiness events into `ready` and `dirty` entries.
    fn absorb_events(&mut self) {
        let mut adopt = false;
        for ev in self.events.iter() {
            if ev.token() == WAKER {
                adopt = true;
                continue;
            }
            let slot = ev.token().0;
            let Some(c) = self.conns.get_mut(slot).and_then(|c| c.as_mut()) else {
                continue;
            };
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                c.readable = true;
                c.read_closed |= ev.is_read_closed() || ev.is_error();
                if !c.queued && !c.paused {
                    c.queued = true;
                    self.ready.push(slot);
                }
            }
            if ev.is_writable() && c.pending() > 0 {
                self.dirty.push(slot);
            }
        }
        if adopt {
            self.adopt();
        }
    }

    fn check_stalls(&mut self, now: Instant) {
        if now.duration_since(self.last_stall_check)
            < Duration::from_millis(STALL_CHECK_INTERVAL_MS)
        {
            return;
        }
        self.last_stall_check = now;
        let limit = Duration::from_millis(PARTIAL_MESSAGE_TIMEOUT_MS);
        for slot in 0..self.conns.len() {
            let stalled = self.conns[slot]
                .as_ref()
                .and_then(|c| c.partial_since)
                .is_some_and(|t| now.duration_since(t) >= limit);
            if stalled {
                tracing::debug!("closing a connection stalled mid-message");
                self.stats.conns_closed_timeout += 1;
                self.close(slot);
            }
        }
    }

    /// Reads and handles one connection; returns messages handled and
    /// whether it stays ready.
    fn service(
        &mut self,
        slot: usize,
        budget: usize,
        handler: &mut MessageHandler<'_>,
    ) -> (usize, bool) {
        let Some(c) = self.conns[slot].as_mut() else {
            return (0, false);
        };
        let mut closed = false;
        if c.readable {
            if c.in_head == c.in_tail {
                c.in_head = 0;
                c.in_tail = 0;
            } else if c.in_head > 0 && c.inbuf.len() - c.in_tail < READ_CHUNK_BYTES {
                c.inbuf.copy_within(c.in_head..c.in_tail, 0);
                c.in_tail -= c.in_head;
                c.in_head = 0;
            }
            if c.inbuf.len() - c.in_tail < READ_CHUNK_BYTES {
                // Zeroed once, as the buffer grows; never per read.
                c.inbuf.resize(c.in_tail + READ_CHUNK_BYTES, 0);
            }
            let len = c.in_tail;
            match c.stream.read(&mut c.inbuf[len..len + READ_CHUNK_BYTES]) {
                Ok(0) => closed = true,
                Ok(n) => {
                    c.in_tail = len + n;
                    // A short read drained the socket: the next byte brings a new edge.
                    c.readable = n == READ_CHUNK_BYTES || c.read_closed;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.readable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => closed = true,
            }
        }
        let mut handled = 0;
        let mut corrupt = false;
        // Corrupt framing is acted on even with no budget or room left: a
        // connection whose next bytes are garbage has nothing more to
        // deliver, and would otherwise wait for an edge that never comes.
        loop {
            let room = c.pending() < CONN_SEND_QUEUE_BYTES_MAX;
            match framing::next(&c.inbuf[c.in_head..c.in_tail]) {
                Next::Message(_) if handled >= budget || !room => break,
                Next::Message(len) => {
                    let start = c.in_head + PREFIX_BYTES;
                    let msg = &c.inbuf[start..start + len];
                    let at = framing::begin(&mut c.out);
                    let mut reply = ConnReply {
                        out: &mut c.out,
                        shared: &mut c.shared,
                        added_bytes: 0,
                        added: 0,
                    };
                    handler(slot as ConnId, msg, &mut reply);
                    let (extra, parts) = (reply.added_bytes, reply.added);
                    let out_len = c.out.len() - at + extra;
                    if out_len == 0 || out_len > MESSAGE_BYTES_MAX {
                        // Nothing to send, or too much: the message goes,
                        // with the shared parts it queued.
                        c.out.truncate(at - PREFIX_BYTES);
                        c.shared.truncate(c.shared.len() - parts);
                        if out_len > 0 {
                            tracing::error!("dropping an oversized reply of {out_len} bytes");
                        }
                    } else {
                        c.out[at - PREFIX_BYTES..at]
                            .copy_from_slice(&(out_len as u32).to_le_bytes());
                        c.shared_bytes += extra;
                        self.stats.msgs_out += 1;
                    }
                    c.in_head = start + len;
                    handled += 1;
                }
                Next::NeedMore(_) => break,
                Next::Corrupt(len) => {
                    tracing::debug!("closing a connection with corrupt framing (length {len})");
                    corrupt = true;
                    break;
                }
            }
        }
        self.stats.msgs_in += handled as u64;
        let buffered = c.in_head < c.in_tail;
        let whole_message_left = matches!(
            framing::next(&c.inbuf[c.in_head..c.in_tail]),
            Next::Message(_)
        );
        // The clock times each message on its own: a client streaming large
        // messages back to back always has one partly received, and is not
        // stalled as long as each completes within the bound.
        c.partial_since = match (buffered && !whole_message_left, c.partial_since) {
            (true, Some(t)) if handled == 0 => Some(t),
            (true, _) => Some(Instant::now()),
            (false, _) => None,
        };
        if c.pending() > 0 {
            self.dirty.push(slot);
        }
        let over = c.pending() >= CONN_SEND_QUEUE_BYTES_MAX;
        if over && !c.paused {
            c.paused = true;
            self.stats.backpressure_pauses += 1;
        }
        if corrupt || (closed && !whole_message_left) {
            if corrupt {
                self.stats.conns_closed_framing += 1;
            } else {
                // A peer that half-closed after its last request still gets
                // the replies: one non-blocking attempt before closing.
                let _ = c.write_out();
            }
            self.close(slot);
            return (handled, false);
        }
        let again = !c.paused && (c.readable || whole_message_left);
        c.queued = again;
        (handled, again)
    }
}

impl WorkerPort for TcpPort {
    fn poll(&mut self, max: usize, handler: &mut MessageHandler<'_>) -> Result<usize> {
        match self.poll.poll(&mut self.events, Some(Duration::ZERO)) {
            Ok(()) => self.absorb_events(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
        let ready = std::mem::take(&mut self.ready);
        let (handled, mut ready) = crate::serve_ready(ready, max, |slot, budget| {
            Ok::<_, TransportError>(self.service(slot, budget, handler))
        })?;
        // Connections readied by adoption during this burst come after.
        ready.append(&mut self.ready);
        self.ready = ready;
        self.check_stalls(Instant::now());
        Ok(handled)
    }

    fn flush(&mut self) -> Result<()> {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for &slot in &dirty {
            let Some(c) = self.conns[slot].as_mut() else {
                continue;
            };
            let failed = c.write_out();
            self.stats.spliced_bytes += std::mem::take(&mut c.spliced);
            c.compact();
            if c.paused && c.pending() < CONN_SEND_QUEUE_BYTES_MAX / 2 {
                c.paused = false;
                if !c.queued {
                    c.queued = true;
                    self.ready.push(slot);
                }
            }
            if failed {
                self.close(slot);
            }
        }
        dirty.clear();
        self.dirty = dirty;
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        if !self.ready.is_empty() {
            return Ok(());
        }
        // Wake in time to enforce the stalled-message bound even when idle.
        let timeout = timeout.min(Duration::from_millis(STALL_CHECK_INTERVAL_MS));
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => self.absorb_events(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
        self.check_stalls(Instant::now());
        Ok(())
    }

    fn waker(&self) -> Waker {
        let w = self.waker.clone();
        Waker::new(move || {
            let _ = w.wake();
        })
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}

impl Drop for TcpPort {
    fn drop(&mut self) {
        for slot in 0..self.conns.len() {
            self.close(slot);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::net::TcpListener;

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
