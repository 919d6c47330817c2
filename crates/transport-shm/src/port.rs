//! A worker's shm port: every connection bound to one worker.
//!
//! The data path of a burst: for each connection in round-robin order,
//! read records in place from its client-to-server ring and run the
//! handler on each (the message is borrowed from shared memory), writing
//! each reply straight into the server-to-client ring past its published
//! tail; then [`ShmPort::flush`] publishes each connection's replies with
//! one store and wakes the client only if it said it sleeps. No syscall
//! and no allocation on that path once buffers have their working size.
//!
//! Each request is copied out of the ring into the port's own buffer
//! before the handler sees it: the client can write its ring at any time,
//! so bytes a decoder checked in place could change before they are used
//! (a shard name checked as UTF-8, then formatted, once panicked a worker).
//! A copy is what every service can trust, whatever it parses.
//!
//! A client that does not read its replies fills its ring; later replies
//! wait in a staging buffer of at most `CONN_SEND_QUEUE_BYTES_MAX` bytes,
//! and at that bound the port stops reading the connection's requests.
//! Its socket is watched all the same: when the client closes or dies,
//! the connection is reaped at once, however full its rings are, with the
//! replies it will never read and the requests it published but will
//! never learn the outcome of. (Handling those first let a client that
//! opened connections, filled their rings and closed them hold slots of
//! `SHM_CONNECTIONS_MAX` while the port worked through 4 MiB each.)

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use fabrickv_transport::idle::{Activity, IdleBoard, IdleConns, IdleWatch};
use fabrickv_transport::{
    Capabilities, ConnId, MessageHandler, PortStats, RemoteRegion, Reply, Result, TransportError,
    Waker, WorkerPort,
};
use fabrickv_types::limits::{CONN_SEND_QUEUE_BYTES_MAX, MESSAGE_BYTES_MAX};
use rustix::event::epoll;

use crate::ctl;
use crate::mem::Mapping;
use crate::region::{Access, LocalRegions, PeerLink};
use crate::ring::{fence_seqcst, Dir, Reader, Writer};
use crate::{CONTROL_CHECK_INTERVAL_US, IDLE_SPIN_US, SHM_CAPABILITIES};

/// Epoll token of the port's waker eventfd.
const WAKE: u64 = u64::MAX;

/// Most readiness events handled per epoll call.
const EVENTS_PER_WAIT: usize = 256;

/// Bytes of a staged reply's length prefix.
const STAGED_PREFIX_BYTES: usize = 4;

/// A connection the acceptor hands to its worker.
pub(crate) struct NewConn {
    /// The liveness and control socket.
    pub(crate) sock: UnixStream,
    /// The connection's shared memory.
    pub(crate) map: Mapping,
    /// The server sleeps on this one.
    pub(crate) ev_server: OwnedFd,
    /// The client sleeps on this one.
    pub(crate) ev_client: OwnedFd,
}

/// The acceptor's side of a worker's hand-off channel.
pub(crate) struct Handoff {
    tx: Sender<NewConn>,
    wake: Arc<WakeState>,
}

impl Handoff {
    /// Gives a handshaken connection to the worker.
    pub(crate) fn hand(&self, c: NewConn) -> std::result::Result<(), NewConn> {
        self.tx.send(c).map_err(|e| e.0)?;
        self.wake.wake();
        Ok(())
    }
}

/// What wakes a port: an eventfd in its epoll, and a flag its spin sees.
struct WakeState {
    fd: OwnedFd,
    woken: AtomicBool,
}

impl WakeState {
    fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        ctl::signal(&self.fd);
    }
}

pub(crate) struct Conn {
    sock: UnixStream,
    map: Mapping,
    ev_server: OwnedFd,
    ev_client: OwnedFd,
    /// Requests (client to server ring).
    rx: Reader,
    /// Replies (server to client ring).
    tx: Writer,
    /// Replies that found the ring full: `[u32 length][payload]` each,
    /// sent from `staged_head`.
    staged: Vec<u8>,
    staged_head: usize,
    /// Control records from the socket and the regions the client
    /// announced in them.
    peer: PeerLink,
    /// Listed in the port's `dirty` list.
    dirty: bool,
    /// Not read until its staged replies drain.
    paused: bool,
    /// When requests last arrived, as the port's idle check reads it.
    activity: Activity,
}

impl Conn {
    fn staged_bytes(&self) -> usize {
        self.staged.len() - self.staged_head
    }

    /// Moves staged replies into the ring while they fit.
    fn unstage(&mut self) -> std::result::Result<(), ()> {
        while self.staged_head < self.staged.len() {
            let h = self.staged_head;
            let mut p = [0u8; STAGED_PREFIX_BYTES];
            p.copy_from_slice(&self.staged[h..h + STAGED_PREFIX_BYTES]);
            let len = u32::from_le_bytes(p) as usize;
            let msg = &self.staged[h + STAGED_PREFIX_BYTES..h + STAGED_PREFIX_BYTES + len];
            match self.tx.try_push(&self.map, msg) {
                Ok(true) => self.staged_head += STAGED_PREFIX_BYTES + len,
                Ok(false) => break,
                Err(e) => {
                    tracing::debug!("closing a connection: {}", e.0);
                    return Err(());
                }
            }
        }
        if self.staged_head == self.staged.len() {
            self.staged.clear();
            self.staged_head = 0;
        } else if self.staged_head > CONN_SEND_QUEUE_BYTES_MAX {
            self.staged.drain(..self.staged_head);
            self.staged_head = 0;
        }
        Ok(())
    }

    /// Queues one reply: into the ring if nothing is staged and it fits.
    fn push_reply(&mut self, msg: &[u8]) -> std::result::Result<(), ()> {
        if self.staged_bytes() == 0 {
            match self.tx.try_push(&self.map, msg) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!("closing a connection: {}", e.0);
                    return Err(());
                }
            }
        }
        self.staged
            .extend_from_slice(&(msg.len() as u32).to_le_bytes());
        self.staged.extend_from_slice(msg);
        Ok(())
    }
}

/// The reply handed to a handler: the reply bytes, and one-sided writes
/// into regions the requesting client registered.
struct ShmReply<'a> {
    buf: &'a mut Vec<u8>,
    peer: &'a mut PeerLink,
    sock: &'a UnixStream,
}

impl Reply for ShmReply<'_> {
    fn buf(&mut self) -> &mut Vec<u8> {
        self.buf
    }

    fn capabilities(&self) -> Capabilities {
        SHM_CAPABILITIES
    }

    crate::region::one_sided_via_peer_link!();

    fn remote_mut(
        &mut self,
        r: &RemoteRegion,
        offset: usize,
        len: usize,
    ) -> Result<Option<&mut [u8]>> {
        self.peer
            .view_mut(self.sock.as_fd(), r, offset, len)
            .map(Some)
    }
}

pub(crate) struct ShmPort {
    epoll: OwnedFd,
    wake: Arc<WakeState>,
    incoming: Receiver<NewConn>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Where the next burst starts its round.
    next: usize,
    /// Connections with something to publish or release.
    dirty: Vec<usize>,
    /// Connections open over all workers.
    open: Arc<AtomicUsize>,
    stats: PortStats,
    /// Regions this worker registered.
    locals: LocalRegions,
    /// The reply buffer lent to each handler call.
    scratch: Vec<u8>,
    /// The request handed to each handler call, copied out of the ring
    /// (only ever grown, to at most `MESSAGE_BYTES_MAX`).
    request: Vec<u8>,
    last_control_check: Instant,
    /// The idle timeout and this port's place on the listener's board.
    idle: IdleWatch,
}

/// Epoll tokens of a connection slot: its eventfd and its socket.
fn ev_token(slot: usize) -> u64 {
    (slot as u64) << 1
}
fn sock_token(slot: usize) -> u64 {
    (slot as u64) << 1 | 1
}

impl ShmPort {
    pub(crate) fn new(open: Arc<AtomicUsize>) -> Result<(ShmPort, Handoff)> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(io::Error::from)?;
        let wake = Arc::new(WakeState {
            fd: ctl::eventfd()?,
            woken: AtomicBool::new(false),
        });
        epoll::add(
            &ep,
            &wake.fd,
            epoll::EventData::new_u64(WAKE),
            epoll::EventFlags::IN,
        )
        .map_err(io::Error::from)?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let port = ShmPort {
            epoll: ep,
            wake: wake.clone(),
            incoming: rx,
            conns: Vec::new(),
            free: Vec::new(),
            next: 0,
            dirty: Vec::new(),
            open,
            stats: PortStats::default(),
            locals: LocalRegions::default(),
            scratch: Vec::new(),
            request: Vec::new(),
            last_control_check: Instant::now(),
            idle: IdleWatch::new(),
        };
        Ok((port, Handoff { tx, wake }))
    }

    fn adopt(&mut self) {
        while let Ok(nc) = self.incoming.try_recv() {
            let slot = fabrickv_transport::vacant_slot(&mut self.conns, &mut self.free);
            let registered = epoll::add(
                &self.epoll,
                &nc.ev_server,
                epoll::EventData::new_u64(ev_token(slot)),
                epoll::EventFlags::IN,
            )
            .and_then(|()| {
                epoll::add(
                    &self.epoll,
                    &nc.sock,
                    epoll::EventData::new_u64(sock_token(slot)),
                    epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
                )
            });
            // The client may use this worker's regions as soon as it
            // learns their descriptors, so it gets their files first.
            let announced = registered.is_ok()
                && self.locals.iter().all(|r| {
                    ctl::send_with_fds(nc.sock.as_fd(), &ctl::region_record(&r.desc), &[r.fd()])
                        .is_ok()
                });
            if !announced {
                let _ = epoll::delete(&self.epoll, &nc.ev_server);
                let _ = epoll::delete(&self.epoll, &nc.sock);
                self.free.push(slot);
                self.open.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            self.conns[slot] = Some(Conn {
                sock: nc.sock,
                map: nc.map,
                ev_server: nc.ev_server,
                ev_client: nc.ev_client,
                rx: Reader::new(Dir::ToServer),
                tx: Writer::new(Dir::ToClient),
                staged: Vec::new(),
                staged_head: 0,
                peer: PeerLink::default(),
                dirty: false,
                paused: false,
                activity: Activity::new(Instant::now()),
            });
            self.stats.conns_accepted += 1;
            self.stats.conns_open += 1;
            self.idle.opened();
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some(c) = self.conns.get_mut(slot).and_then(Option::take) {
            let _ = epoll::delete(&self.epoll, &c.ev_server);
            let _ = epoll::delete(&self.epoll, &c.sock);
            self.free.push(slot);
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.stats.conns_open -= 1;
        }
    }

    /// Reads a connection's socket: adopts announced regions; closes the
    /// connection at end-of-file, whatever its rings hold.
    fn read_control(&mut self, slot: usize) {
        let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        match c.peer.drain(c.sock.as_fd()) {
            Ok(()) => {}
            Err(TransportError::Closed) => self.close(slot),
            Err(e) => {
                tracing::debug!("closing a connection with a bad control stream: {e}");
                self.stats.conns_closed_framing += 1;
                self.close(slot);
            }
        }
    }

    /// One epoll call: wakes, new connections, socket events.
    fn wait_events(&mut self, timeout: Duration) -> Result<()> {
        let ts = fabrickv_transport::timespec(timeout);
        let mut buf = [std::mem::MaybeUninit::<epoll::Event>::uninit(); EVENTS_PER_WAIT];
        let tokens: Vec<u64> = match epoll::wait(&self.epoll, &mut buf, Some(&ts)) {
            Ok((events, _)) => events.iter().map(|e| e.data.u64()).collect(),
            Err(rustix::io::Errno::INTR) => Vec::new(),
            Err(e) => return Err(io::Error::from(e).into()),
        };
        for t in tokens {
            if t == WAKE {
                ctl::clear(&self.wake.fd);
                continue;
            }
            let slot = (t >> 1) as usize;
            if t & 1 == 1 {
                self.read_control(slot);
            } else if let Some(c) = self.conns.get(slot).and_then(Option::as_ref) {
                ctl::clear(&c.ev_server);
            }
        }
        self.last_control_check = Instant::now();
        if !self.incoming.is_empty() {
            self.adopt();
        }
        Ok(())
    }

    /// Reports to, and takes evictions from, `board` as port `index`.
    pub(crate) fn set_idle_board(&mut self, board: Arc<IdleBoard>, index: usize) {
        self.idle.set_board(board, index);
    }

    /// Whether `poll` would find something to do now.
    fn has_work(&self) -> bool {
        !self.incoming.is_empty()
            || self.conns.iter().flatten().any(|c| {
                (!c.paused && c.rx.has_data(&c.map))
                    || (c.staged_bytes() > 0 && c.tx.head_moved(&c.map))
            })
    }

    fn mark_dirty(dirty: &mut Vec<usize>, c: &mut Conn, slot: usize) {
        if !c.dirty {
            c.dirty = true;
            dirty.push(slot);
        }
    }

    /// Handles up to `budget` messages of one connection.
    fn service(&mut self, slot: usize, budget: usize, handler: &mut MessageHandler<'_>) -> usize {
        let ShmPort {
            conns,
            scratch,
            request,
            stats,
            dirty,
            ..
        } = self;
        let Some(c) = conns.get_mut(slot).and_then(Option::as_mut) else {
            return 0;
        };
        if c.paused {
            return 0;
        }
        let mut handled = 0;
        let mut broken = false;
        while handled < budget {
            let (off, len) = match c.rx.peek(&c.map) {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!("closing a connection with a corrupt ring: {}", e.0);
                    stats.conns_closed_framing += 1;
                    broken = true;
                    break;
                }
            };
            scratch.clear();
            if request.len() < len {
                request.resize(len, 0);
            }
            let msg = &mut request[..len];
            c.map.read(off, msg);
            {
                let mut reply = ShmReply {
                    buf: scratch,
                    peer: &mut c.peer,
                    sock: &c.sock,
                };
                handler(slot as ConnId, msg, &mut reply);
            }
            c.rx.advance(len);
            handled += 1;
            if scratch.len() > MESSAGE_BYTES_MAX {
                tracing::error!("dropping an oversized reply of {} bytes", scratch.len());
            } else if !scratch.is_empty() {
                if c.push_reply(scratch).is_err() {
                    stats.conns_closed_framing += 1;
                    broken = true;
                    break;
                }
                stats.msgs_out += 1;
            }
            if c.staged_bytes() >= CONN_SEND_QUEUE_BYTES_MAX {
                c.paused = true;
                stats.backpressure_pauses += 1;
                break;
            }
        }
        stats.msgs_in += handled as u64;
        if handled > 0 {
            c.activity.touch();
            // Free the requests now: a client waiting for room resumes
            // after the fence and flag check in `flush`.
            c.rx.release(&c.map);
            Self::mark_dirty(dirty, c, slot);
        }
        if broken {
            self.close(slot);
        }
        handled
    }
}

fabrickv_transport::idle_conns!(ShmPort, Conn, |c| c.rx.has_data(&c.map)
    || c.staged_bytes() > 0);

impl WorkerPort for ShmPort {
    fn poll(&mut self, max: usize, handler: &mut MessageHandler<'_>) -> Result<usize> {
        if !self.incoming.is_empty() {
            self.adopt();
        }
        if self.last_control_check.elapsed() >= Duration::from_micros(CONTROL_CHECK_INTERVAL_US) {
            self.wait_events(Duration::ZERO)?;
            self.check_idle(Instant::now());
            self.evict_idle();
        }
        let n = self.conns.len();
        if n == 0 {
            return Ok(0);
        }
        let mut handled = 0;
        let start = self.next % n;
        for i in 0..n {
            if handled >= max {
                break;
            }
            handled += self.service((start + i) % n, max - handled, handler);
        }
        self.next = (start + 1) % n;
        Ok(handled)
    }

    fn flush(&mut self) -> Result<()> {
        self.flush_except(&[])
    }

    fn holds_replies(&self) -> bool {
        true
    }

    fn flush_except(&mut self, held: &[ConnId]) -> Result<()> {
        let mut dirty = std::mem::take(&mut self.dirty);
        let mut again = Vec::new();
        let mut kept = Vec::new();
        let mut broken = Vec::new();
        for &slot in &dirty {
            if held.binary_search(&(slot as ConnId)).is_ok() {
                // Still dirty (its flag stays set): its replies stay
                // staged until it is not held.
                kept.push(slot);
                continue;
            }
            let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            c.dirty = false;
            if c.unstage().is_err() {
                broken.push(slot);
                continue;
            }
            c.rx.release(&c.map);
            let published = c.tx.publish(&c.map);
            fence_seqcst();
            let wake_data = published && c.tx.take_consumer_wait(&c.map);
            let wake_room = c.rx.take_producer_wait(&c.map);
            if wake_data || wake_room {
                ctl::signal(&c.ev_client);
            }
            if c.paused && c.staged_bytes() < CONN_SEND_QUEUE_BYTES_MAX / 2 {
                c.paused = false;
            }
            if c.staged_bytes() > 0 {
                again.push(slot);
            }
        }
        for slot in broken {
            self.stats.conns_closed_framing += 1;
            self.close(slot);
        }
        dirty.clear();
        dirty.append(&mut kept);
        for slot in again {
            if let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) {
                Self::mark_dirty(&mut dirty, c, slot);
            }
        }
        self.dirty = dirty;
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        if self.has_work() {
            return Ok(());
        }
        let start = Instant::now();
        let spin = timeout.min(Duration::from_micros(IDLE_SPIN_US));
        while start.elapsed() < spin {
            std::hint::spin_loop();
            if self.wake.woken.load(Ordering::Acquire) || self.has_work() {
                self.wake.woken.store(false, Ordering::Relaxed);
                return Ok(());
            }
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Ok(());
        }
        // Say we sleep, then look again: a client that published before
        // seeing the flag is found here; one after it will signal.
        for c in self.conns.iter().flatten() {
            c.rx.arm_wait(&c.map);
            if c.staged_bytes() > 0 {
                c.tx.arm_wait(&c.map);
            }
        }
        fence_seqcst();
        let r = if self.wake.woken.load(Ordering::Acquire) || self.has_work() {
            Ok(())
        } else {
            self.wait_events(left)
        };
        for c in self.conns.iter().flatten() {
            c.rx.disarm_wait(&c.map);
            c.tx.disarm_wait(&c.map);
        }
        self.wake.woken.store(false, Ordering::Relaxed);
        self.check_idle(Instant::now());
        self.evict_idle();
        r
    }

    fabrickv_transport::port_accessors!(waker: |p| {
        let w = p.wake.clone();
        Waker::new(move || w.wake())
    });

    fn capabilities(&self) -> Capabilities {
        SHM_CAPABILITIES
    }

    fn register(&mut self, len: usize) -> Result<RemoteRegion> {
        let r = self.locals.register(len)?;
        let (desc, rec) = (r.desc, ctl::region_record(&r.desc));
        let mut failed = Vec::new();
        for (slot, c) in self.conns.iter().enumerate() {
            let Some(c) = c else { continue };
            if let Err(e) = ctl::send_with_fds(c.sock.as_fd(), &rec, &[r.fd()]) {
                tracing::debug!("closing a connection that takes no region descriptors: {e}");
                failed.push(slot);
            }
        }
        for slot in failed {
            self.close(slot);
        }
        Ok(desc)
    }

    fn local_region(&mut self, r: &RemoteRegion) -> Result<&mut [u8]> {
        self.locals.view(r)
    }

    fn write_remote(
        &mut self,
        conn: ConnId,
        r: &RemoteRegion,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        self.access(conn, r, offset, Access::Write(data))
    }

    fn read_remote(
        &mut self,
        conn: ConnId,
        r: &RemoteRegion,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        self.access(conn, r, offset, Access::Read(out))
    }
}

impl ShmPort {
    /// Performs `op` on a region the client on `conn` registered.
    fn access(
        &mut self,
        conn: ConnId,
        r: &RemoteRegion,
        offset: usize,
        op: Access<'_>,
    ) -> Result<()> {
        let c = self
            .conns
            .get_mut(conn as usize)
            .and_then(Option::as_mut)
            .ok_or(TransportError::Closed)?;
        c.peer.access(c.sock.as_fd(), r, offset, op)
    }
}

impl Drop for ShmPort {
    fn drop(&mut self) {
        for slot in 0..self.conns.len() {
            self.close(slot);
        }
    }
}
