//! A worker's tcp port: every connection bound to one worker, on one epoll.
//!
//! The data path of a burst: one `epoll_wait` with zero timeout (skipped
//! while connections read earlier still hold messages, up to
//! [`READY_POLLS_PER_EPOLL`] polls), then for each ready connection one
//! `read` into its buffer and the handler run on every whole message in
//! it, replies appended to the connection's send buffer; then
//! [`TcpPort::flush`] does one `write` per connection with output. No allocation once buffers have grown to their working size.
//!
//! Bytes a handler hands over with [`crate::Reply::append_shared`] (a leased
//! value) are not copied into the send buffer: they are queued at their
//! place in it and written from their own memory by the same vectored
//! `write`, then dropped. A shared part of at least
//! [`super::SPLICE_PART_BYTES_MIN`] is not copied at all: while one is queued,
//! the queue goes through a pipe, `vmsplice` handing it the part's pages
//! and `splice` moving them into the socket, so the kernel sends from the
//! value's own memory and the only copy left is the reader's (see
//! [`super::SPLICE_PART_BYTES_MIN`] for what guards those pages).
//!
//! This file holds the port (epoll, rounds over ready connections, the
//! read side and the hand-off from the acceptor); one connection's
//! buffers and its write path are in [`super::conn_datapath`].

use std::io::{self, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use fabrickv_types::limits::{
    CONN_SEND_QUEUE_BYTES_MAX, MESSAGE_BYTES_MAX, PARTIAL_MESSAGE_TIMEOUT_MS,
};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use super::conn_datapath::{Conn, ConnReply, READ_CHUNK_BYTES};
use crate::framing::{self, Next, PREFIX_BYTES};
use crate::idle::{IdleBoard, IdleConns, IdleWatch};
use crate::{ConnId, MessageHandler, PortStats, Result, TransportError, Waker, WorkerPort};

const WAKER: Token = Token(usize::MAX);

/// Most readiness events handled per epoll call.
const EVENTS_PER_POLL: usize = 1024;

/// How often the port looks for connections stalled mid-message, in ms.
const STALL_CHECK_INTERVAL_MS: u64 = 500;

/// Polls served from the ready list alone, while it still holds
/// connections, before the port asks epoll again. A worker polls a few
/// messages at a time (`POLL_BURST_MSGS`), so a client's ten pipelined
/// requests, read in one `read`, took three polls and three
/// `epoll_wait`s where one tells all; a connection that turns ready
/// meanwhile waits at most this many polls to be seen.
const READY_POLLS_PER_EPOLL: u32 = 8;

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
    /// Polls since the last `epoll_wait` (see [`READY_POLLS_PER_EPOLL`]).
    polls_since_epoll: u32,
    /// The idle timeout and this port's place on the listener's board.
    idle: IdleWatch,
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
            polls_since_epoll: 0,
            idle: IdleWatch::new(),
        };
        Ok((port, Handoff { tx, waker }))
    }

    fn adopt(&mut self) {
        while let Ok(mut stream) = self.incoming.try_recv() {
            let slot = crate::vacant_slot(&mut self.conns, &mut self.free);
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
            self.idle.opened();
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

    /// Reports to, and takes evictions from, `board` as port `index`.
    pub(super) fn set_idle_board(&mut self, board: Arc<IdleBoard>, index: usize) {
        self.idle.set_board(board, index);
    }

    fn check_stalls(&mut self, now: Instant) {
        if now.duration_since(self.last_stall_check)
            < Duration::from_millis(STALL_CHECK_INTERVAL_MS)
        {
            return;
        }
        self.last_stall_check = now;
        let limit = Duration::from_millis(PARTIAL_MESSAGE_TIMEOUT_MS);
        self.close_idle_past(now);
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
        self.report_idle();
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
                    c.activity.touch();
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

crate::idle_conns!(TcpPort, Conn, |c| c.in_head != c.in_tail || c.pending() > 0);

impl WorkerPort for TcpPort {
    fn poll(&mut self, max: usize, handler: &mut MessageHandler<'_>) -> Result<usize> {
        if self.ready.is_empty() || self.polls_since_epoll >= READY_POLLS_PER_EPOLL {
            self.polls_since_epoll = 0;
            match self.poll.poll(&mut self.events, Some(Duration::ZERO)) {
                Ok(()) => self.absorb_events(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        } else {
            self.polls_since_epoll += 1;
        }
        let ready = std::mem::take(&mut self.ready);
        let (handled, mut ready) = crate::serve_ready(ready, max, |slot, budget| {
            Ok::<_, TransportError>(self.service(slot, budget, handler))
        })?;
        // Connections readied by adoption during this burst come after.
        ready.append(&mut self.ready);
        self.ready = ready;
        self.check_stalls(Instant::now());
        self.evict_idle();
        Ok(handled)
    }

    fn flush_after_ops(&self) -> usize {
        super::TCP_FLUSH_AFTER_OPS
    }

    fn flush(&mut self) -> Result<()> {
        self.flush_except(&[])
    }

    fn holds_replies(&self) -> bool {
        true
    }

    fn flush_except(&mut self, held: &[ConnId]) -> Result<()> {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let mut kept = 0;
        for i in 0..dirty.len() {
            let slot = dirty[i];
            if held.binary_search(&(slot as ConnId)).is_ok() {
                // Stays dirty, its replies queued, until it is not held.
                dirty[kept] = slot;
                kept += 1;
                continue;
            }
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
        dirty.truncate(kept);
        self.dirty = dirty;
        Ok(())
    }

    #[allow(unsafe_code)]
    fn input_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsRawFd;
        // SAFETY: the epoll descriptor is owned by `self.poll`, which
        // outlives the borrow; the port's waker and every connection are
        // registered with it.
        Some(unsafe { std::os::fd::BorrowedFd::borrow_raw(self.poll.as_raw_fd()) })
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
        self.evict_idle();
        Ok(())
    }

    crate::port_accessors!(waker: |p| Waker::from_mio(p.waker.clone()));
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
    use std::io::Write;
    use std::net::TcpListener;

    use super::*;
    use crate::WorkerPort;

    /// A connection handed to the port, and the client's end of it.
    fn connection(l: &TcpListener, h: &Handoff) -> std::net::TcpStream {
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        assert!(h.hand(TcpStream::from_std(server)).is_ok());
        client
    }

    /// `msg` with its length prefix, as an endpoint sends it.
    fn framed(msg: &[u8]) -> Vec<u8> {
        let mut v = (msg.len() as u32).to_le_bytes().to_vec();
        v.extend_from_slice(msg);
        v
    }

    #[test]
    fn a_connection_turning_ready_is_seen_while_another_still_has_messages() {
        let (mut port, h) = TcpPort::new(Arc::new(AtomicUsize::new(0))).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut busy = connection(&l, &h);
        let mut late = connection(&l, &h);
        const FLOOD: usize = 1000;
        let flood: Vec<u8> = (0..FLOOD).flat_map(|_| framed(b"a")).collect();
        busy.write_all(&flood).unwrap();
        let mut got = Vec::new();
        let poll = |port: &mut TcpPort, got: &mut Vec<u8>| {
            port.poll(1, &mut |_, msg, _| got.extend_from_slice(msg))
                .unwrap()
        };
        // Adopt both, read the flood, and visit `late` (nothing to read)
        // so that only epoll can tell the port it turned ready.
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.is_empty() {
            assert!(Instant::now() < deadline, "the flood never arrived");
            poll(&mut port, &mut got);
        }
        for _ in 0..4 {
            poll(&mut port, &mut got);
        }
        late.write_all(&framed(b"b")).unwrap();
        let mut polls = 0;
        while !got.contains(&b'b') {
            assert!(
                polls <= 3 * READY_POLLS_PER_EPOLL as usize,
                "{polls} polls without seeing the late connection"
            );
            poll(&mut port, &mut got);
            polls += 1;
        }
        assert!(got.len() < FLOOD, "seen only once the flood ran out");
    }
}
