//! The client side of a tcp connection.
//!
//! The socket stays in blocking mode so that a round trip costs two
//! syscalls (`send`, then a blocking `recv`); non-blocking steps use
//! `MSG_DONTWAIT` per call instead of switching the socket's mode.
//!
//! [`Endpoint::recv_split`] reads a message's head into the endpoint's
//! buffer and its tail from the socket straight into the caller's slice
//! (`MSG_WAITALL`), so a large reply crosses user space once, in the
//! kernel's copy.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::net::{RecvFlags, SendFlags};

use super::acceptor::TCP_OPENING;
use super::{resolve, HANDSHAKE_BYTES};
use crate::framing::{self, Next, PREFIX_BYTES};
use crate::{check_split_head, Endpoint, Landed, Result, SplitSink, TransportError};

/// Least free room in the receive buffer before each `recv`, in bytes.
const RECV_CHUNK_BYTES: usize = 64 * 1024;

/// How far a blocking receive may run past the caller's deadline, in
/// milliseconds: the socket's receive timeout is set again only when it
/// exceeds the time left by more than this, which spares a `setsockopt`
/// per receive (the deadline is checked after every receive either way).
const RECV_TIMEOUT_SLACK_MS: u64 = 10;

/// How long [`Endpoint::recv_split`] polls for a reply to start before it
/// sleeps in `recv`, in microseconds. A reply is usually tens of
/// microseconds away; polling (yielding the CPU to other threads between
/// polls) spares the sleep and the wake-up, which on a virtual machine
/// means an interrupt to a halted vCPU and costs more than the poll. The
/// server's workers poll the same way (`IDLE_SPIN_US`).
pub const RECV_SPIN_US: u64 = 50;

/// A yield of the poll in [`Endpoint::recv_split`] that takes longer than
/// this, in microseconds, gave the CPU to another thread that had work:
/// the poll stops and the receive sleeps instead. Threads that share a
/// CPU (several readers pinned to one core) would otherwise spend it on
/// each other's polls: measured here, four tcp readers on one CPU read
/// 64 KiB values about 1.5x faster without the poll, while a lone reader
/// is twice as fast with it.
pub const SPIN_YIELD_BUSY_US: u64 = 4;

/// A connection to one worker of a FabricKV server.
pub struct TcpEndpoint {
    stream: TcpStream,
    /// Receive buffer; bytes `in_head..in_tail` are received and not yet
    /// handed out. Its length only grows (to the largest message seen),
    /// and it is zeroed only when it grows, never per `recv`.
    inbuf: Vec<u8>,
    in_head: usize,
    in_tail: usize,
    /// Bytes of a message abandoned mid-tail by [`Endpoint::recv_split`]
    /// (timeout or error) still to arrive; they are dropped on arrival so
    /// the stream stays framed.
    discard: usize,
    out: Vec<u8>,
    out_head: usize,
    /// The receive timeout currently set on the socket, to skip redundant
    /// `setsockopt` calls.
    read_timeout: Option<Duration>,
    /// Workers the server reported in its handshake.
    workers: u16,
    /// Messages posted and not yet answered (see the `Drop` impl).
    unanswered: u64,
}

/// A connection dropped with a request unanswered is reset, not closed.
/// A plain close leaves the kernel sending what the server has not
/// acknowledged, for minutes: a server cut off when the client gave up
/// would run the request once the link is back, long after the client
/// was told it failed and may have sent it elsewhere (the fault test
/// found a write so run 12 s late, over newer ones). A reset makes the
/// kernel drop the bytes at once.
impl Drop for TcpEndpoint {
    fn drop(&mut self) {
        if self.unanswered != 0 {
            let _ = rustix::net::sockopt::set_socket_linger(&self.stream, Some(Duration::ZERO));
        }
    }
}

/// Whether a receive error only means "nothing yet".
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn corrupt(len: u32) -> TransportError {
    TransportError::Framing(format!("server sent a message length of {len}"))
}

impl TcpEndpoint {
    /// Connects and binds the connection to `worker`, proving the
    /// process's client secret if the server asks (`Dial::new`).
    pub fn connect(addr: &str, worker: u16, timeout: Duration) -> Result<TcpEndpoint> {
        Self::connect_with(addr, worker, &crate::Dial::new(timeout)?)
    }

    /// Connects as `dial` says and binds the connection to `worker`.
    pub fn connect_with(addr: &str, worker: u16, dial: &crate::Dial) -> Result<TcpEndpoint> {
        let timeout = dial.timeout;
        let sa = resolve(addr)?;
        let mut stream = TcpStream::connect_timeout(&sa, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.write_all(&TCP_OPENING.encode(worker, 0))?;
        let mut reply = [0u8; HANDSHAKE_BYTES];
        stream.read_exact(&mut reply)?;
        if crate::handshake::answer_challenge(&reply, &mut stream, dial.secret.as_ref())? {
            stream.read_exact(&mut reply)?;
        }
        let (status, workers) = TCP_OPENING
            .fields(&reply)
            .ok_or_else(|| TransportError::Refused("the peer is not a FabricKV server".into()))?;
        crate::handshake::check_answer(worker, status, workers)?;
        Ok(TcpEndpoint {
            stream,
            inbuf: Vec::new(),
            in_head: 0,
            in_tail: 0,
            discard: 0,
            out: Vec::new(),
            out_head: 0,
            read_timeout: Some(timeout),
            workers,
            unanswered: 0,
        })
    }

    /// Workers the server said it has.
    pub fn server_workers(&self) -> u16 {
        self.workers
    }

    /// Writes raw bytes to the socket, for tests of hostile input.
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Received bytes not yet handed out.
    fn buffered(&self) -> &[u8] {
        &self.inbuf[self.in_head..self.in_tail]
    }

    /// Makes at least `room` bytes free after `in_tail`, moving the
    /// buffered bytes to the front or growing the buffer as needed.
    fn make_room(&mut self, room: usize) {
        if self.in_head == self.in_tail {
            self.in_head = 0;
            self.in_tail = 0;
        }
        if self.inbuf.len() - self.in_tail >= room {
            return;
        }
        if self.in_head > 0 {
            self.inbuf.copy_within(self.in_head..self.in_tail, 0);
            self.in_tail -= self.in_head;
            self.in_head = 0;
        }
        if self.inbuf.len() - self.in_tail < room {
            self.inbuf.resize(self.in_tail + room, 0);
        }
    }

    /// Sets the socket's receive timeout for a blocking receive that must
    /// end by `deadline`; `Err(Timeout)` if it has passed.
    fn arm_timeout(&mut self, deadline: Instant) -> Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(TransportError::Timeout);
        }
        let slack = Duration::from_millis(RECV_TIMEOUT_SLACK_MS);
        let stale = match self.read_timeout {
            None => true,
            Some(t) => t > left + slack,
        };
        if stale {
            // Zero would mean "block forever" to the socket.
            let t = left.max(Duration::from_micros(1));
            self.stream.set_read_timeout(Some(t))?;
            self.read_timeout = Some(t);
        }
        Ok(())
    }

    /// One `recv` of at most `max` bytes into the buffer (blocking unless
    /// `dontwait`); `Ok(false)` if nothing was there. Bytes of an
    /// abandoned message are dropped as they arrive.
    fn recv_some(&mut self, max: usize, dontwait: bool) -> Result<bool> {
        self.make_room(max.max(1));
        let end = (self.in_tail + max).min(self.inbuf.len());
        let flags = if dontwait {
            RecvFlags::DONTWAIT
        } else {
            RecvFlags::empty()
        };
        let r = rustix::net::recv(&self.stream, &mut self.inbuf[self.in_tail..end], flags)
            .map(|(n, _)| n)
            .map_err(io::Error::from);
        match r {
            Ok(0) => Err(TransportError::Closed),
            Ok(n) => {
                self.in_tail += n;
                let dropped = self.discard.min(self.in_tail - self.in_head);
                self.in_head += dropped;
                self.discard -= dropped;
                Ok(true)
            }
            Err(e) if transient(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// One `recv` of whatever is there, up to the buffer's free room.
    fn recv_once(&mut self, dontwait: bool) -> Result<bool> {
        self.make_room(RECV_CHUNK_BYTES);
        let room = self.inbuf.len() - self.in_tail;
        self.recv_some(room, dontwait)
    }

    fn has_message(&self) -> Result<bool> {
        match framing::next(self.buffered()) {
            Next::Message(_) => Ok(true),
            Next::NeedMore(_) => Ok(false),
            Next::Corrupt(n) => Err(corrupt(n)),
        }
    }

    /// Receives until the buffer holds either a whole message or the
    /// prefix and `head_bytes` of a message longer than that; returns the
    /// message's length. Reads no further than this message's bytes, so
    /// the next message's tail is left on the socket for its own split.
    fn recv_head(&mut self, head_bytes: usize, deadline: Instant) -> Result<usize> {
        loop {
            let have = self.in_tail - self.in_head;
            let want = match framing::next(self.buffered()) {
                Next::Message(len) => return Ok(len),
                Next::Corrupt(n) => return Err(corrupt(n)),
                Next::NeedMore(more) if have >= PREFIX_BYTES => {
                    let b = self.buffered();
                    let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
                    if len > head_bytes && have >= PREFIX_BYTES + head_bytes {
                        return Ok(len);
                    }
                    if len > head_bytes {
                        PREFIX_BYTES + head_bytes - have
                    } else {
                        more
                    }
                }
                Next::NeedMore(_) => PREFIX_BYTES + head_bytes - have,
            };
            if !self.spin_recv(want)? {
                self.arm_timeout(deadline)?;
                self.recv_some(want, false)?;
            }
        }
    }

    /// Polls for up to [`RECV_SPIN_US`] for bytes (at most `max`),
    /// yielding between polls, until a yield shows that another thread
    /// wants the CPU ([`SPIN_YIELD_BUSY_US`]); true if some came.
    fn spin_recv(&mut self, max: usize) -> Result<bool> {
        let start = Instant::now();
        loop {
            if self.recv_some(max, true)? {
                return Ok(true);
            }
            let before = Instant::now();
            if before.duration_since(start) >= Duration::from_micros(RECV_SPIN_US) {
                return Ok(false);
            }
            std::thread::yield_now();
            if before.elapsed() >= Duration::from_micros(SPIN_YIELD_BUSY_US) {
                return Ok(false);
            }
        }
    }

    /// Reads the rest of a message's tail (`dst`, of which `got` bytes
    /// are filled) from the socket. On failure the bytes still to come are
    /// marked for discarding, so the stream stays framed.
    fn recv_tail(&mut self, dst: &mut [u8], mut got: usize, deadline: Instant) -> Result<()> {
        while got < dst.len() {
            let r = self.arm_timeout(deadline).and_then(|()| {
                rustix::net::recv(&self.stream, &mut dst[got..], RecvFlags::WAITALL)
                    .map(|(n, _)| n)
                    .map_err(|e| io::Error::from(e).into())
            });
            match r {
                Ok(0) => {
                    self.discard = dst.len() - got;
                    return Err(TransportError::Closed);
                }
                Ok(n) => got += n,
                Err(TransportError::Io(e)) if transient(&e) => {}
                Err(TransportError::Timeout) if Instant::now() < deadline => {}
                Err(e) => {
                    self.discard = dst.len() - got;
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

impl Endpoint for TcpEndpoint {
    fn peer_closed(&mut self) -> bool {
        if !self.buffered().is_empty() || self.discard > 0 {
            return false;
        }
        // Peek without blocking: end-of-file or a reset means closed.
        if self.stream.set_nonblocking(true).is_err() {
            return false;
        }
        let closed = match self.stream.peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !transient(&e),
        };
        let _ = self.stream.set_nonblocking(false);
        closed
    }

    fn post_with(&mut self, build: &mut dyn FnMut(&mut Vec<u8>)) -> Result<()> {
        let at = framing::begin(&mut self.out);
        build(&mut self.out);
        match framing::finish(&mut self.out, at) {
            Ok(true) => {
                self.unanswered += 1;
                Ok(())
            }
            Ok(false) => Err(TransportError::MessageTooLarge(0)),
            Err(n) => Err(TransportError::MessageTooLarge(n)),
        }
    }

    fn flush(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.out_head < self.out.len() {
            match rustix::net::send(
                &self.stream,
                &self.out[self.out_head..],
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            ) {
                Ok(n) => self.out_head += n,
                Err(rustix::io::Errno::AGAIN) => {
                    // The server is not taking more: take its replies while waiting,
                    // so that neither side blocks on a full buffer of the other.
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(TransportError::Timeout);
                    }
                    let mut fds = [PollFd::new(&self.stream, PollFlags::IN | PollFlags::OUT)];
                    let ts = crate::timespec(left);
                    match rustix::event::poll(&mut fds, Some(&ts)) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(io::Error::from(e).into()),
                    }
                    if fds[0].revents().contains(PollFlags::IN) {
                        self.recv_once(true)?;
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        self.out.clear();
        self.out_head = 0;
        Ok(())
    }

    fn poll(&mut self, max: usize, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize> {
        if !self.has_message()? {
            self.recv_once(true)?;
        }
        let mut n = 0;
        while n < max {
            match framing::next(self.buffered()) {
                Next::Message(len) => {
                    let start = self.in_head + PREFIX_BYTES;
                    on_msg(&self.inbuf[start..start + len]);
                    self.in_head = start + len;
                    self.unanswered = self.unanswered.saturating_sub(1);
                    n += 1;
                }
                Next::NeedMore(_) => break,
                Next::Corrupt(len) => return Err(corrupt(len)),
            }
        }
        Ok(n)
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        if self.has_message()? {
            return Ok(());
        }
        self.arm_timeout(Instant::now() + timeout.max(Duration::from_micros(1)))?;
        self.recv_once(false)?;
        Ok(())
    }

    fn recv_split(
        &mut self,
        head_bytes: usize,
        timeout: Duration,
        sink: &mut dyn SplitSink,
    ) -> Result<Landed> {
        check_split_head(head_bytes)?;
        let deadline = Instant::now() + timeout;
        let len = self.recv_head(head_bytes, deadline)?;
        let start = self.in_head + PREFIX_BYTES;
        if len > head_bytes {
            let tail_len = len - head_bytes;
            let at = start + head_bytes;
            // Tail bytes that came with the head (the rest is on the socket).
            let early = (self.in_tail - at).min(tail_len);
            let head = &self.inbuf[start..at];
            let placed = match sink.tail(head, len) {
                // The slice's length is checked before any byte is written.
                Some(place) if place.len() >= tail_len => {
                    let dst = &mut place[..tail_len];
                    dst[..early].copy_from_slice(&self.inbuf[at..at + early]);
                    self.in_head = at + early;
                    self.recv_tail(dst, early, deadline)?;
                    true
                }
                _ => false,
            };
            if placed {
                self.unanswered = self.unanswered.saturating_sub(1);
                return Ok(Landed::Split);
            }
        }
        // Taken whole: the rest of the message into the buffer.
        while self.in_tail - self.in_head < PREFIX_BYTES + len {
            let want = PREFIX_BYTES + len - (self.in_tail - self.in_head);
            self.arm_timeout(deadline)?;
            self.recv_some(want, false)?;
        }
        let start = self.in_head + PREFIX_BYTES;
        self.in_head = start + len;
        self.unanswered = self.unanswered.saturating_sub(1);
        sink.whole(&self.inbuf[start..start + len]);
        Ok(Landed::Whole)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::net::TcpListener;
    use std::thread::JoinHandle;

    use fabrickv_types::limits::MESSAGE_BYTES_MAX;

    use super::*;
    use crate::SPLIT_HEAD_BYTES_MAX;

    const TIMEOUT: Duration = Duration::from_secs(10);

    /// Accepts one client and answers its handshake (one worker).
    fn accept_one(l: &TcpListener) -> std::net::TcpStream {
        let (mut s, _) = l.accept().unwrap();
        let mut hs = [0u8; HANDSHAKE_BYTES];
        s.read_exact(&mut hs).unwrap();
        s.write_all(&TCP_OPENING.encode(0, 1)).unwrap();
        s
    }

    /// A fake server: answers the handshake, then writes each script step
    /// (bytes, then a pause) and holds the socket until the test ends.
    fn fake_server(script: Vec<(Vec<u8>, Duration)>) -> (String, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let mut s = accept_one(&l);
            for (bytes, pause) in script {
                s.write_all(&bytes).unwrap();
                std::thread::sleep(pause);
            }
            // Hold the connection until the client closes it.
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        });
        (addr, t)
    }

    fn framed(msg: &[u8]) -> Vec<u8> {
        let mut v = (msg.len() as u32).to_le_bytes().to_vec();
        v.extend_from_slice(msg);
        v
    }

    fn message(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// Places every tail at the front of `dst` if it fits, and records
    /// what it saw.
    struct Sink {
        dst: Vec<u8>,
        refuse: bool,
        heads: Vec<Vec<u8>>,
        wholes: Vec<Vec<u8>>,
    }

    impl Sink {
        fn new(dst_len: usize) -> Sink {
            Sink {
                dst: vec![0xEE; dst_len],
                refuse: false,
                heads: Vec::new(),
                wholes: Vec::new(),
            }
        }
    }

    impl SplitSink for Sink {
        fn tail(&mut self, head: &[u8], _len: usize) -> Option<&mut [u8]> {
            self.heads.push(head.to_vec());
            if self.refuse {
                None
            } else {
                Some(&mut self.dst)
            }
        }

        fn whole(&mut self, msg: &[u8]) {
            self.wholes.push(msg.to_vec());
        }
    }

    const HEAD: usize = 72;

    #[test]
    fn tails_land_in_the_slice_and_short_messages_come_whole() {
        let big = message(200_000, 1);
        let small = message(40, 2);
        let after = message(1000, 3);
        // Two messages in one write, so the second's head and part of its
        // tail arrive buffered with the first.
        let mut both = framed(&big);
        both.extend_from_slice(&framed(&after));
        let (addr, t) = fake_server(vec![
            (framed(&small), Duration::ZERO),
            (both, Duration::ZERO),
        ]);
        let mut ep = TcpEndpoint::connect(&addr, 0, TIMEOUT).unwrap();
        let mut sink = Sink::new(300_000);
        assert_eq!(
            ep.recv_split(HEAD, TIMEOUT, &mut sink).unwrap(),
            Landed::Whole
        );
        assert_eq!(sink.wholes, vec![small]);
        assert!(
            sink.heads.is_empty(),
            "a message no longer than the head is not split"
        );
        assert_eq!(
            ep.recv_split(HEAD, TIMEOUT, &mut sink).unwrap(),
            Landed::Split
        );
        assert_eq!(sink.heads[0], big[..HEAD]);
        assert_eq!(sink.dst[..big.len() - HEAD], big[HEAD..]);
        assert_eq!(sink.dst[big.len() - HEAD], 0xEE, "nothing past the tail");
        assert_eq!(
            ep.recv_split(HEAD, TIMEOUT, &mut sink).unwrap(),
            Landed::Split
        );
        assert_eq!(sink.dst[..after.len() - HEAD], after[HEAD..]);
        drop(ep);
        t.join().unwrap();
    }

    #[test]
    fn a_slice_too_small_is_never_written_and_the_message_comes_whole() {
        let big = message(100_000, 4);
        let next = message(5000, 5);
        let mut script = framed(&big);
        script.extend_from_slice(&framed(&next));
        let (addr, t) = fake_server(vec![(script, Duration::ZERO)]);
        let mut ep = TcpEndpoint::connect(&addr, 0, TIMEOUT).unwrap();
        // One byte short of the tail: the size is checked before any byte
        // is written.
        let mut sink = Sink::new(big.len() - HEAD - 1);
        assert_eq!(
            ep.recv_split(HEAD, TIMEOUT, &mut sink).unwrap(),
            Landed::Whole
        );
        assert!(
            sink.dst.iter().all(|&b| b == 0xEE),
            "the short slice is untouched"
        );
        assert_eq!(sink.wholes, vec![big]);
        // A refusing sink gets the message whole too; framing holds.
        sink.refuse = true;
        assert_eq!(
            ep.recv_split(HEAD, TIMEOUT, &mut sink).unwrap(),
            Landed::Whole
        );
        assert_eq!(sink.wholes[1], next);
        drop(ep);
        t.join().unwrap();
    }

    #[test]
    fn corrupt_lengths_are_framing_errors() {
        for bad in [0u32, (MESSAGE_BYTES_MAX + 1) as u32, u32::MAX] {
            let mut bytes = bad.to_le_bytes().to_vec();
            bytes.extend_from_slice(&[7; 100]);
            let (addr, t) = fake_server(vec![(bytes, Duration::ZERO)]);
            let mut ep = TcpEndpoint::connect(&addr, 0, TIMEOUT).unwrap();
            let mut sink = Sink::new(1 << 20);
            let r = ep.recv_split(HEAD, TIMEOUT, &mut sink);
            assert!(matches!(r, Err(TransportError::Framing(_))), "{bad}: {r:?}");
            assert!(sink.heads.is_empty() && sink.wholes.is_empty());
            assert!(sink.dst.iter().all(|&b| b == 0xEE));
            drop(ep);
            t.join().unwrap();
        }
    }

    #[test]
    fn a_tail_cut_short_by_the_deadline_is_dropped_and_framing_holds() {
        let big = message(50_000, 6);
        let framed_big = framed(&big);
        let next = message(3000, 7);
        // Half the message, a pause longer than the client's timeout, the
        // rest and one more message.
        let (first, rest) = framed_big.split_at(20_000);
        let mut rest = rest.to_vec();
        rest.extend_from_slice(&framed(&next));
        let (addr, t) = fake_server(vec![
            (first.to_vec(), Duration::from_millis(600)),
            (rest, Duration::ZERO),
        ]);
        let mut ep = TcpEndpoint::connect(&addr, 0, TIMEOUT).unwrap();
        let mut sink = Sink::new(100_000);
        let r = ep.recv_split(HEAD, Duration::from_millis(200), &mut sink);
        assert!(matches!(r, Err(TransportError::Timeout)), "{r:?}");
        assert_eq!(sink.heads.len(), 1);
        // The next call skips the abandoned bytes and gets the next message.
        assert_eq!(
            ep.recv_split(HEAD, TIMEOUT, &mut sink).unwrap(),
            Landed::Split
        );
        assert_eq!(sink.heads[1], next[..HEAD]);
        assert_eq!(sink.dst[..next.len() - HEAD], next[HEAD..]);
        drop(ep);
        t.join().unwrap();
    }

    /// A server that reads one request, answers it or not, and reports
    /// how the client's side ended: `true` for a reset.
    fn ending_seen(answer: bool) -> bool {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let mut s = accept_one(&l);
            let mut request = [0u8; PREFIX_BYTES + 3];
            s.read_exact(&mut request).unwrap();
            if answer {
                s.write_all(&framed(b"ok")).unwrap();
            }
            let mut rest = Vec::new();
            match s.read_to_end(&mut rest) {
                Ok(_) => false,
                Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
            }
        });
        let mut ep = TcpEndpoint::connect(&addr, 0, TIMEOUT).unwrap();
        ep.post_with(&mut |b| b.extend_from_slice(b"req")).unwrap();
        ep.flush(TIMEOUT).unwrap();
        let mut sink = Sink::new(16);
        let wait = if answer {
            TIMEOUT
        } else {
            Duration::from_millis(100)
        };
        assert_eq!(ep.recv_split(HEAD, wait, &mut sink).is_ok(), answer);
        drop(ep);
        t.join().unwrap()
    }

    #[test]
    fn a_connection_dropped_with_a_request_unanswered_is_reset() {
        assert!(
            ending_seen(false),
            "an unanswered request's connection is reset"
        );
        assert!(!ending_seen(true), "an answered one is closed");
    }

    #[test]
    fn split_and_poll_share_the_stream() {
        let a = message(10_000, 8);
        let b = message(70_000, 9);
        let mut bytes = framed(&a);
        bytes.extend_from_slice(&framed(&b));
        let (addr, t) = fake_server(vec![(bytes, Duration::ZERO)]);
        let mut ep = TcpEndpoint::connect(&addr, 0, TIMEOUT).unwrap();
        let mut sink = Sink::new(100_000);
        assert_eq!(
            ep.recv_split(HEAD, TIMEOUT, &mut sink).unwrap(),
            Landed::Split
        );
        assert_eq!(sink.dst[..a.len() - HEAD], a[HEAD..]);
        // The next message, received by poll, whole and unharmed.
        let deadline = Instant::now() + TIMEOUT;
        let mut got = None;
        while got.is_none() {
            assert!(Instant::now() < deadline, "no second message");
            if ep.poll(1, &mut |m| got = Some(m.to_vec())).unwrap() == 0 {
                ep.wait(TIMEOUT).unwrap();
            }
        }
        assert_eq!(got.unwrap(), b);
        drop(ep);
        t.join().unwrap();
    }

    #[test]
    fn head_lengths_are_bounded() {
        let (addr, t) = fake_server(Vec::new());
        let mut ep = TcpEndpoint::connect(&addr, 0, TIMEOUT).unwrap();
        let mut sink = Sink::new(16);
        for bad in [0, SPLIT_HEAD_BYTES_MAX + 1] {
            let r = ep.recv_split(bad, TIMEOUT, &mut sink);
            assert!(
                matches!(r, Err(TransportError::Unsupported(_))),
                "{bad}: {r:?}"
            );
        }
        drop(ep);
        t.join().unwrap();
    }
}
