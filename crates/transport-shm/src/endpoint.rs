//! The client side of an shm connection.
//!
//! Posting writes records straight into the client-to-server ring past its
//! published tail (or, when the ring is full, into a local staging buffer
//! that keeps order); flushing publishes them all with one store and wakes
//! the server only if it said it sleeps. Polling reads replies in place.
//! A flush that waits for room keeps taking replies into a local buffer,
//! so client and server never wait on each other.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_transport::handshake::check_answer;
use fabrickv_transport::{Capabilities, Endpoint, RemoteRegion, Result, TransportError};
use fabrickv_types::limits::MESSAGE_BYTES_MAX;
use rustix::event::{PollFd, PollFlags};

use crate::ctl::{self, HANDSHAKE_FDS, SHM_OPENING};
use crate::mem::Mapping;
use crate::region::{LocalRegions, PeerLink};
use crate::ring::{fence_seqcst, Dir, Reader, Writer, CONN_SHM_BYTES, HEADER_BYTES, RING_BYTES};
use crate::{socket_addr, CONTROL_CHECK_INTERVAL_US, IDLE_SPIN_US, SHM_CAPABILITIES};

/// Bytes of a buffered message's length prefix (staged posts, replies
/// taken during a flush).
const PREFIX_BYTES: usize = 4;

/// A connection to one worker of a FabricKV server over shared memory.
pub struct ShmEndpoint {
    /// Liveness and control socket (non-blocking).
    sock: UnixStream,
    /// The connection's shared memory (shared with a [`Scribbler`] in
    /// tests of a hostile peer).
    map: Arc<Mapping>,
    /// The server sleeps on this one.
    ev_server: OwnedFd,
    /// This side sleeps on this one.
    ev_client: OwnedFd,
    /// Requests (client to server ring).
    tx: Writer,
    /// Replies (server to client ring).
    rx: Reader,
    /// Posts that found the ring full, `[u32 length][payload]` each, sent
    /// from `staged_head`.
    staged: Vec<u8>,
    staged_head: usize,
    /// The buffer lent to `post_with` builders.
    scratch: Vec<u8>,
    /// Replies taken out of the ring while a flush waited, delivered before
    /// the ring's; `[u32 length][payload]` each, from `received_head`.
    received: Vec<u8>,
    received_head: usize,
    /// Control records from the socket and the regions the server
    /// announced in them.
    peer: PeerLink,
    /// Regions this side registered.
    locals: LocalRegions,
    /// The server is gone (socket end-of-file) or broke the protocol.
    closed: bool,
    last_control_check: Instant,
    /// Workers the server reported in its handshake.
    workers: u16,
}

/// Where the request ring's head word lives in the header page.
const REQUEST_HEAD_OFFSET: usize = 0;

/// Flips bytes in a connection's request ring; see
/// [`ShmEndpoint::scribbler`].
#[doc(hidden)]
pub struct Scribbler {
    map: Arc<Mapping>,
}

impl Scribbler {
    /// XORs `mask` into the request ring's data byte at `at` (taken modulo
    /// the ring's size), atomically, so the flip is a plain race on
    /// shared memory as between two processes.
    pub fn flip(&self, at: usize, mask: u8) {
        let at = at % RING_BYTES;
        let word = HEADER_BYTES + at / 4 * 4;
        let shift = (at % 4) * 8;
        self.map.u32_at(word).fetch_xor(
            u32::from(mask) << shift,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Bytes of the request ring the server has released so far (its
    /// head): the records it reads next start there.
    pub fn consumed(&self) -> usize {
        self.map
            .u64_at(REQUEST_HEAD_OFFSET)
            .load(std::sync::atomic::Ordering::Acquire) as usize
    }
}

fn refused(why: String) -> TransportError {
    TransportError::Refused(why)
}

/// Pops framed `[u32 len][payload]` at `head`; returns the payload range.
fn next_framed(buf: &[u8], head: usize) -> Option<(usize, usize)> {
    let p = buf.get(head..head + PREFIX_BYTES)?;
    let len = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
    Some((head + PREFIX_BYTES, len))
}

impl ShmEndpoint {
    /// Connects to worker `worker` of the server at `shm://name`, proving
    /// the process's client secret if the server asks.
    pub fn connect(name: &str, worker: u16, timeout: Duration) -> Result<ShmEndpoint> {
        Self::connect_with(name, worker, &fabrickv_transport::Dial::new(timeout)?)
    }

    /// Connects to worker `worker` of the server at `shm://name` as
    /// `dial` says.
    pub fn connect_with(
        name: &str,
        worker: u16,
        dial: &fabrickv_transport::Dial,
    ) -> Result<ShmEndpoint> {
        let timeout = dial.timeout;
        let addr = socket_addr(name)?;
        let mut sock = UnixStream::connect_addr(&addr).map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => {
                refused(format!("nothing listens on shm://{name}"))
            }
            _ => e.into(),
        })?;
        let timeout = timeout.max(Duration::from_millis(1));
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        sock.write_all(&SHM_OPENING.encode(worker, 0))?;
        let (mut reply, mut fds) = ctl::recv_handshake(sock.as_fd())?;
        if fabrickv_transport::handshake::answer_challenge(&reply, &mut sock, dial.secret.as_ref())?
        {
            (reply, fds) = ctl::recv_handshake(sock.as_fd())?;
        }
        let (status, workers) = SHM_OPENING
            .fields(&reply)
            .ok_or_else(|| refused("the peer is not a FabricKV shm server".into()))?;
        check_answer(worker, status, workers)?;
        if fds.len() != HANDSHAKE_FDS {
            return Err(refused(format!(
                "handshake carried {} descriptors, {HANDSHAKE_FDS} expected",
                fds.len()
            )));
        }
        let (Some(memfd), Some(ev_server), Some(ev_client)) =
            (fds.pop_front(), fds.pop_front(), fds.pop_front())
        else {
            return Err(refused("handshake without shared memory".into()));
        };
        let map = Mapping::open(memfd.as_fd(), CONN_SHM_BYTES)
            .map(Arc::new)
            .map_err(|e| refused(format!("unusable shared memory: {e}")))?;
        drop(memfd);
        sock.set_nonblocking(true)?;
        Ok(ShmEndpoint {
            sock,
            map,
            ev_server,
            ev_client,
            tx: Writer::new(Dir::ToServer),
            rx: Reader::new(Dir::ToClient),
            staged: Vec::new(),
            staged_head: 0,
            scratch: Vec::new(),
            received: Vec::new(),
            received_head: 0,
            peer: PeerLink::default(),
            locals: LocalRegions::default(),
            closed: false,
            last_control_check: Instant::now(),
            workers,
        })
    }

    /// Workers the server said it has.
    pub fn server_workers(&self) -> u16 {
        self.workers
    }

    /// Publishes a record whose length word is `len` whatever it holds,
    /// as a hostile or broken client would; for tests of the server.
    #[doc(hidden)]
    pub fn publish_bogus_record(&mut self, len: u32) {
        self.tx.publish_bogus(&self.map, len);
        fence_seqcst();
        if self.tx.take_consumer_wait(&self.map) {
            ctl::signal(&self.ev_server);
        }
    }

    /// A handle that flips bytes of this connection's request ring from
    /// any thread, as a hostile peer sharing the memory would, while the
    /// server reads it; for tests of the server.
    #[doc(hidden)]
    pub fn scribbler(&self) -> Scribbler {
        Scribbler {
            map: self.map.clone(),
        }
    }

    /// Posts `msg` into the request ring and publishes it if it fits,
    /// never reading a reply (a client that stopped consuming); returns
    /// whether it fit. For tests of the server.
    #[doc(hidden)]
    pub fn post_unread(&mut self, msg: &[u8]) -> Result<bool> {
        match self.tx.try_push(&self.map, msg) {
            Ok(true) => {
                self.publish();
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => Err(self.corrupt(e.0)),
        }
    }

    fn corrupt(&mut self, why: String) -> TransportError {
        tracing::debug!("shm connection broken: {why}");
        self.closed = true;
        TransportError::Framing(why)
    }

    /// Reads the socket: regions the server announced, end-of-file.
    fn check_control(&mut self) -> Result<()> {
        self.last_control_check = Instant::now();
        match self.peer.drain(self.sock.as_fd()) {
            Ok(()) => Ok(()),
            Err(TransportError::Closed) => {
                self.closed = true;
                Ok(())
            }
            Err(TransportError::Framing(why)) => Err(self.corrupt(why)),
            Err(e) => Err(e),
        }
    }

    /// Publishes posted records; wakes the server if it sleeps.
    fn publish(&mut self) {
        if self.tx.publish(&self.map) {
            fence_seqcst();
            if self.tx.take_consumer_wait(&self.map) {
                ctl::signal(&self.ev_server);
            }
        }
    }

    /// Frees consumed replies; wakes the server if it waits for room.
    fn release(&mut self) {
        if self.rx.release(&self.map) {
            fence_seqcst();
            if self.rx.take_producer_wait(&self.map) {
                ctl::signal(&self.ev_server);
            }
        }
    }

    /// Moves staged posts into the ring while they fit.
    fn unstage(&mut self) -> Result<()> {
        while let Some((start, len)) = next_framed(&self.staged, self.staged_head) {
            match self
                .tx
                .try_push(&self.map, &self.staged[start..start + len])
            {
                Ok(true) => self.staged_head = start + len,
                Ok(false) => return Ok(()),
                Err(e) => return Err(self.corrupt(e.0)),
            }
        }
        self.staged.clear();
        self.staged_head = 0;
        Ok(())
    }

    /// Takes every published reply out of the ring into `received`.
    fn take_replies(&mut self) -> Result<()> {
        loop {
            match self.rx.peek(&self.map) {
                Ok(Some((off, len))) => {
                    self.received.extend_from_slice(&(len as u32).to_le_bytes());
                    self.received.extend_from_slice(self.map.slice(off, len));
                    self.rx.advance(len);
                }
                Ok(None) => break,
                Err(e) => return Err(self.corrupt(e.0)),
            }
        }
        self.release();
        Ok(())
    }

    /// Blocks on the eventfd and the socket for at most `timeout`.
    fn sleep(&mut self, timeout: Duration) -> Result<()> {
        let mut fds = [
            PollFd::new(&self.ev_client, PollFlags::IN),
            PollFd::new(&self.sock, PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, Some(&fabrickv_transport::timespec(timeout))) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
        let (woken, sock) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if woken {
            ctl::clear(&self.ev_client);
        }
        if sock {
            self.check_control()?;
        }
        Ok(())
    }

    fn has_received(&self) -> bool {
        self.received_head < self.received.len()
    }
}

impl Endpoint for ShmEndpoint {
    fn peer_closed(&mut self) -> bool {
        // The server's end of the unix socket closes with the connection.
        if !self.closed && self.check_control().is_err() {
            return true;
        }
        self.closed && !self.has_received() && !self.rx.has_data(&self.map)
    }

    fn post_with(&mut self, build: &mut dyn FnMut(&mut Vec<u8>)) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        build(&mut scratch);
        let r = self.post(&scratch);
        self.scratch = scratch;
        r
    }

    fn post(&mut self, msg: &[u8]) -> Result<()> {
        if msg.is_empty() || msg.len() > MESSAGE_BYTES_MAX {
            return Err(TransportError::MessageTooLarge(msg.len()));
        }
        if self.staged_head == self.staged.len() {
            match self.tx.try_push(&self.map, msg) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(self.corrupt(e.0)),
            }
        }
        self.staged
            .extend_from_slice(&(msg.len() as u32).to_le_bytes());
        self.staged.extend_from_slice(msg);
        Ok(())
    }

    fn flush(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.unstage()?;
            self.publish();
            if self.staged.is_empty() {
                return Ok(());
            }
            if self.closed {
                return Err(TransportError::Closed);
            }
            // The ring is full: take replies meanwhile, so that a server
            // blocked on a full reply ring makes progress too.
            self.take_replies()?;
            let start = Instant::now();
            if start >= deadline {
                return Err(TransportError::Timeout);
            }
            let spin = (deadline - start).min(Duration::from_micros(IDLE_SPIN_US));
            while start.elapsed() < spin && !self.tx.head_moved(&self.map) {
                std::hint::spin_loop();
            }
            if self.tx.head_moved(&self.map) {
                continue;
            }
            self.tx.arm_wait(&self.map);
            fence_seqcst();
            let r = if self.tx.head_moved(&self.map) || self.rx.has_data(&self.map) {
                Ok(())
            } else {
                self.sleep(deadline.saturating_duration_since(Instant::now()))
            };
            self.tx.disarm_wait(&self.map);
            r?;
        }
    }

    fn poll(&mut self, max: usize, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut n = 0;
        while n < max {
            let Some((start, len)) = next_framed(&self.received, self.received_head) else {
                break;
            };
            on_msg(&self.received[start..start + len]);
            self.received_head = start + len;
            n += 1;
        }
        if self.has_received() {
            return Ok(n);
        }
        self.received.clear();
        self.received_head = 0;
        if n == 0
            && !self.closed
            && self.last_control_check.elapsed() >= Duration::from_micros(CONTROL_CHECK_INTERVAL_US)
            && !self.rx.has_data(&self.map)
        {
            self.check_control()?;
        }
        let mut from_ring = 0;
        while n < max {
            match self.rx.peek(&self.map) {
                Ok(Some((off, len))) => {
                    on_msg(self.map.slice(off, len));
                    self.rx.advance(len);
                    n += 1;
                    from_ring += 1;
                }
                Ok(None) => break,
                Err(e) => return Err(self.corrupt(e.0)),
            }
        }
        if from_ring > 0 {
            self.release();
        }
        if n == 0 && self.closed {
            return Err(TransportError::Closed);
        }
        Ok(n)
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        if self.has_received() || self.closed || self.rx.has_data(&self.map) {
            return Ok(());
        }
        let start = Instant::now();
        let spin = timeout.min(Duration::from_micros(IDLE_SPIN_US));
        while start.elapsed() < spin {
            // Yield rather than pause: client threads often share a CPU,
            // and one polling its ring must not hold the CPU from another
            // whose reply is already in.
            std::thread::yield_now();
            if self.rx.has_data(&self.map) {
                return Ok(());
            }
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Ok(());
        }
        self.rx.arm_wait(&self.map);
        fence_seqcst();
        let r = if self.rx.has_data(&self.map) {
            Ok(())
        } else {
            self.sleep(left)
        };
        self.rx.disarm_wait(&self.map);
        r
    }

    fn capabilities(&self) -> Capabilities {
        // The client's side lends nothing in place: only replies do.
        Capabilities {
            remote_view: false,
            ..SHM_CAPABILITIES
        }
    }

    fn register(&mut self, len: usize) -> Result<RemoteRegion> {
        let r = self.locals.register(len)?;
        ctl::send_with_fds(self.sock.as_fd(), &ctl::region_record(&r.desc), &[r.fd()])?;
        Ok(r.desc)
    }

    fn local_region(&mut self, r: &RemoteRegion) -> Result<&mut [u8]> {
        self.locals.view(r)
    }

    crate::region::one_sided_via_peer_link!();
}
