//! A worker's port: one libfabric endpoint, completion queue and address
//! vector shared by every connection bound to the worker.
//!
//! Receive slots form one pool that grows by [`WINDOW_PACKETS`] slots per
//! connection adopted (never shrinking; a closed connection's slots serve
//! the next), so the slots posted always cover every credit granted.
//! A burst: read completions, queue each packet on its connection (by the
//! connection id in its header), run the handler on whole messages,
//! repost each slot once its packet is used up; [`FabricPort::flush`]
//! packs each connection's replies into packets as its credits allow.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use fabrickv_transport::framing;
use fabrickv_transport::idle::{Activity, IdleBoard, IdleConns, IdleWatch};
use fabrickv_transport::{
    Capabilities, ConnId, MessageHandler, PortStats, RemoteRegion, Reply, Result, TransportError,
    Waker, WorkerPort,
};
use fabrickv_types::limits::CONN_SEND_QUEUE_BYTES_MAX;
use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use crate::fi::{Core, Event, Node};
use crate::wire::{
    Flow, Header, Kind, Outbox, Piece, Reassembly, HEADER_BYTES, PACKET_BYTES, WINDOW_PACKETS,
};
use crate::{CLOSE_CHECK_INTERVAL_MS, IDLE_SLEEP_US_MAX, IDLE_SPIN_US};

const WAKER: Token = Token(usize::MAX);
const CQ: Token = Token(usize::MAX - 1);

/// Readiness events handled per epoll call.
const EVENTS_PER_POLL: usize = 256;

/// Send slots of a port, shared by its connections (packets larger than
/// the provider's inject size wait in one until sent).
const PORT_SEND_SLOTS: usize = 64;

/// A connection the acceptor hands to its worker.
pub(crate) struct NewConn {
    pub id: u32,
    pub name: Vec<u8>,
    pub window: u32,
    pub stream: TcpStream,
}

/// The acceptor's side of a worker's hand-off channel.
pub(crate) struct Handoff {
    tx: Sender<NewConn>,
    waker: Arc<mio::Waker>,
    /// The worker endpoint's name, told to its clients.
    pub name: Vec<u8>,
}

impl Handoff {
    /// Gives a connection to the worker; returns it if the worker is gone.
    pub fn hand(&self, c: NewConn) -> std::result::Result<(), NewConn> {
        self.tx.send(c).map_err(|e| e.0)?;
        let _ = self.waker.wake();
        Ok(())
    }
}

/// A packet waiting on its connection: receive slot and read position.
#[derive(Clone, Copy)]
struct Held {
    slab: usize,
    slot: usize,
    len: usize,
    pos: usize,
}

pub(crate) struct Conn {
    id: ConnId,
    /// The client's address in this port's address vector.
    addr: u64,
    /// The rendezvous socket; its closing closes the connection.
    stream: TcpStream,
    flow: Flow,
    rx: Reassembly,
    /// Received packets not yet used up, oldest first.
    held: VecDeque<Held>,
    out: Outbox,
    /// Listed in `ready`.
    queued: bool,
    /// Listed in `dirty`.
    dirty: bool,
    /// Paused because the client is not taking its replies.
    paused: bool,
    /// When requests last arrived, as the port's idle check reads it.
    activity: Activity,
}

/// One worker's port.
pub(crate) struct FabricPort {
    /// Closed through [`crate::fi::retire`] when this is dropped.
    node: std::mem::ManuallyDrop<Node>,
    poll: Poll,
    events: Events,
    waker: Arc<mio::Waker>,
    incoming: Receiver<NewConn>,
    conns: Vec<Option<Conn>>,
    by_id: HashMap<ConnId, usize>,
    free: Vec<usize>,
    /// Connections with packets to handle.
    ready: Vec<usize>,
    /// Connections with output or credits to send.
    dirty: Vec<usize>,
    /// How many of `dirty` the last flush kept back because the worker
    /// holds their replies: they give [`WorkerPort::wait`] no reason to
    /// return at once (only a flush that releases them does).
    dirty_held: usize,
    /// Receive slots posted in the pool.
    slots: usize,
    /// Addresses of closed connections still in the address vector
    /// because a send to them has not completed (see [`FabricPort::close`]);
    /// removed once it has. At most [`PORT_SEND_SLOTS`] long, since each
    /// holds a busy send slot.
    unmapping: Vec<u64>,
    open: Arc<AtomicUsize>,
    stats: PortStats,
    last_check: Instant,
    /// When the port last saw a completion: an idle wait spins only
    /// within `IDLE_SPIN_US` of it, then blocks.
    last_active: Instant,
    /// The idle timeout and this port's place on the listener's board.
    idle: IdleWatch,
}

impl FabricPort {
    pub(crate) fn new(
        provider: &str,
        node_name: &str,
        open: Arc<AtomicUsize>,
    ) -> Result<(FabricPort, Handoff)> {
        let node = Node::open(provider, Some(node_name), PORT_SEND_SLOTS, PACKET_BYTES)?;
        let poll = Poll::new()?;
        if let Some(fd) = node.core.wait_fd() {
            poll.registry()
                .register(&mut SourceFd(&fd), CQ, Interest::READABLE)?;
        }
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKER)?);
        let (tx, rx) = crossbeam_channel::unbounded();
        let name = node.core.name.clone();
        let port = FabricPort {
            node: std::mem::ManuallyDrop::new(node),
            poll,
            events: Events::with_capacity(EVENTS_PER_POLL),
            waker: waker.clone(),
            incoming: rx,
            conns: Vec::new(),
            by_id: HashMap::new(),
            free: Vec::new(),
            ready: Vec::new(),
            dirty: Vec::new(),
            dirty_held: 0,
            slots: 0,
            unmapping: Vec::new(),
            open,
            stats: PortStats::default(),
            last_check: Instant::now(),
            last_active: Instant::now(),
            idle: IdleWatch::new(),
        };
        Ok((port, Handoff { tx, waker, name }))
    }

    fn adopt(&mut self) {
        while let Ok(mut nc) = self.incoming.try_recv() {
            let addr = match self.node.core.insert(&nc.name) {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("dropping a connection whose address was refused: {e}");
                    self.open.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
            };
            // Post the new connection's share of receive slots.
            let needed = (self.by_id.len() + 1) * WINDOW_PACKETS as usize;
            if self.slots < needed {
                match self.node.add_rx_slab(WINDOW_PACKETS as usize, PACKET_BYTES) {
                    Ok(_) => self.slots += WINDOW_PACKETS as usize,
                    Err(e) => {
                        tracing::warn!("dropping a connection: no receive slots: {e}");
                        self.node.core.remove(addr);
                        self.open.fetch_sub(1, Ordering::AcqRel);
                        continue;
                    }
                }
            }
            let slot = fabrickv_transport::vacant_slot(&mut self.conns, &mut self.free);
            if self
                .poll
                .registry()
                .register(&mut nc.stream, Token(slot), Interest::READABLE)
                .is_err()
            {
                self.free.push(slot);
                self.node.core.remove(addr);
                self.open.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            self.conns[slot] = Some(Conn {
                id: nc.id,
                addr,
                stream: nc.stream,
                flow: Flow::new(nc.window),
                rx: Reassembly::default(),
                held: VecDeque::new(),
                out: Outbox::default(),
                queued: false,
                dirty: false,
                paused: false,
                activity: Activity::new(Instant::now()),
            });
            self.by_id.insert(nc.id, slot);
            self.stats.conns_accepted += 1;
            self.stats.conns_open += 1;
            self.idle.opened();
        }
    }

    fn close(&mut self, slot: usize) {
        let Some(mut c) = self.conns[slot].take() else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut c.stream);
        for h in c.held.drain(..) {
            let _ = self.node.post_recv(h.slab, h.slot);
        }
        // A peer with a send still in flight stays in the address vector
        // until the send completes: the shm provider unmaps a removed
        // peer's region, and the completion of a send to it (the peer's
        // answer, read in a later progress call) locks that region. A
        // client that closes right after a reply larger than the inject
        // size made the worker fault there (`cli --test fabric_shm`).
        if self.node.core.sending_to(c.addr) {
            self.unmapping.push(c.addr);
        } else {
            self.node.core.remove(c.addr);
        }
        self.by_id.remove(&c.id);
        self.free.push(slot);
        self.open.fetch_sub(1, Ordering::AcqRel);
        self.stats.conns_open -= 1;
    }

    /// Reports to, and takes evictions from, `board` as port `index`.
    pub(crate) fn set_idle_board(&mut self, board: Arc<IdleBoard>, index: usize) {
        self.idle.set_board(board, index);
    }

    /// Reads a burst of completions and sorts them onto connections.
    fn progress(&mut self) -> Result<()> {
        if self.node.core.progress()? > 0 {
            self.last_active = Instant::now();
        }
        if !self.unmapping.is_empty() {
            let core = &mut self.node.core;
            self.unmapping.retain(|&addr| {
                let busy = core.sending_to(addr);
                if !busy {
                    core.remove(addr);
                }
                busy
            });
        }
        while let Some(ev) = self.node.core.events.pop_front() {
            match ev {
                Event::Recv { slab, slot, len } => self.on_packet(slab, slot, len)?,
                Event::RecvFailed { slab, slot } => self.node.post_recv(slab, slot)?,
                Event::SendFailed { dest, err } => {
                    let victim = self
                        .conns
                        .iter()
                        .position(|c| c.as_ref().is_some_and(|c| c.addr == dest));
                    if let Some(s) = victim {
                        tracing::debug!(
                            "closing a connection whose send failed: {}",
                            crate::fi::strerror(err)
                        );
                        self.close(s);
                    }
                }
            }
        }
        Ok(())
    }

    fn on_packet(&mut self, slab: usize, slot: usize, len: usize) -> Result<()> {
        let header = Header::decode(self.node.rx[slab].slot(slot, len));
        let Some(h) = header else {
            tracing::debug!("dropping a packet with a bad header");
            return self.node.post_recv(slab, slot);
        };
        let mut at = self.by_id.get(&h.conn).copied();
        if at.is_none() {
            // The acceptor hands a connection over before answering its
            // client, so its first packet finds it in the channel.
            self.adopt();
            at = self.by_id.get(&h.conn).copied();
        }
        let Some(s) = at else {
            tracing::debug!("dropping a packet for unknown connection {}", h.conn);
            return self.node.post_recv(slab, slot);
        };
        let Some(c) = self.conns[s].as_mut() else {
            return self.node.post_recv(slab, slot);
        };
        if let Err(why) = c.flow.on_packet(&h) {
            tracing::debug!("closing connection {}: {why}", c.id);
            self.stats.conns_closed_framing += 1;
            self.close(s);
            return self.node.post_recv(slab, slot);
        }
        if !c.dirty && (c.out.pending() > 0 || c.flow.should_return()) {
            c.dirty = true;
            self.dirty.push(s);
        }
        match h.kind {
            Kind::Credit => {
                c.flow.owed += 1;
                if !c.dirty && c.flow.should_return() {
                    c.dirty = true;
                    self.dirty.push(s);
                }
                self.node.post_recv(slab, slot)
            }
            Kind::Data => {
                c.held.push_back(Held {
                    slab,
                    slot,
                    len,
                    pos: HEADER_BYTES,
                });
                if !c.queued && !c.paused {
                    c.queued = true;
                    self.ready.push(s);
                }
                Ok(())
            }
        }
    }

    /// Handles up to `budget` messages of connection `s`; returns how many
    /// and whether it has more ready.
    fn service(
        &mut self,
        s: usize,
        budget: usize,
        handler: &mut MessageHandler<'_>,
    ) -> Result<(usize, bool)> {
        let Some(c) = self.conns[s].as_mut() else {
            return Ok((0, false));
        };
        let mut handled = 0;
        let mut corrupt = false;
        let node: &mut Node = &mut self.node;
        while handled < budget && c.out.pending() < CONN_SEND_QUEUE_BYTES_MAX {
            let Some(h) = c.held.front_mut() else {
                break;
            };
            let packet = node.rx[h.slab].slot(h.slot, h.len);
            match c.rx.next(packet, &mut h.pos) {
                Ok(Piece::Message(m)) => {
                    let at = framing::begin(&mut c.out.out);
                    let mut reply = PortReply {
                        out: &mut c.out.out,
                        core: &mut node.core,
                        peer: c.addr,
                    };
                    handler(c.id, m, &mut reply);
                    match framing::finish(&mut c.out.out, at) {
                        Ok(true) => self.stats.msgs_out += 1,
                        Ok(false) => {}
                        Err(n) => tracing::error!("dropping an oversized reply of {n} bytes"),
                    }
                    handled += 1;
                }
                Ok(Piece::End) => {
                    let done = *h;
                    c.held.pop_front();
                    // The slot goes back to the pool and its credit to the client.
                    c.flow.owed += 1;
                    node.post_recv(done.slab, done.slot)?;
                }
                Err(why) => {
                    tracing::debug!("closing connection {}: {why}", c.id);
                    corrupt = true;
                    break;
                }
            }
        }
        self.stats.msgs_in += handled as u64;
        if handled > 0 {
            c.activity.touch();
        }
        if corrupt {
            self.stats.conns_closed_framing += 1;
            self.close(s);
            return Ok((handled, false));
        }
        if !c.dirty && (c.out.pending() > 0 || c.flow.should_return()) {
            c.dirty = true;
            self.dirty.push(s);
        }
        if c.out.pending() >= CONN_SEND_QUEUE_BYTES_MAX && !c.paused {
            c.paused = true;
            self.stats.backpressure_pauses += 1;
        }
        let again = !c.paused && !c.held.is_empty();
        c.queued = again;
        Ok((handled, again))
    }

    /// Sends what connection `s` may send; returns true if it still has
    /// output waiting.
    fn send_conn(&mut self, s: usize) -> Result<bool> {
        let Some(c) = self.conns[s].as_mut() else {
            return Ok(false);
        };
        let mut failed = false;
        while c.out.pending() > 0 && c.flow.can_send_data() {
            let h = c.flow.peek_header(Kind::Data, 0);
            let payload = c.out.next_payload();
            let n = payload.len();
            match self.node.core.send(c.addr, &[&h.encode(), payload]) {
                Ok(true) => {
                    c.flow.sent();
                    c.out.advance(n);
                }
                Ok(false) => break,
                Err(e) => {
                    tracing::debug!("closing connection {}: {e}", c.id);
                    failed = true;
                    break;
                }
            }
        }
        if !failed && c.flow.should_return() {
            let h = c.flow.peek_header(Kind::Credit, 0);
            match self.node.core.send(c.addr, &[&h.encode()]) {
                Ok(true) => c.flow.sent(),
                Ok(false) => {}
                Err(_) => failed = true,
            }
        }
        if failed {
            self.close(s);
            return Ok(false);
        }
        if c.paused && c.out.pending() < CONN_SEND_QUEUE_BYTES_MAX / 2 {
            c.paused = false;
            if !c.queued && !c.held.is_empty() {
                c.queued = true;
                self.ready.push(s);
            }
        }
        Ok(c.out.pending() > 0)
    }

    /// Looks at the rendezvous sockets (closed clients) and the waker.
    fn check_sockets(&mut self, timeout: Option<Duration>) -> Result<()> {
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        self.last_check = Instant::now();
        let mut closed = Vec::new();
        for ev in self.events.iter() {
            match ev.token() {
                WAKER | CQ => {}
                Token(s) => closed.push(s),
            }
        }
        self.adopt();
        for s in closed {
            let gone = match self.conns.get_mut(s).and_then(|c| c.as_mut()) {
                Some(c) => {
                    let mut b = [0u8; 64];
                    match std::io::Read::read(&mut c.stream, &mut b) {
                        Ok(0) => true,
                        Ok(_) => false,
                        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                    }
                }
                None => false,
            };
            if gone {
                self.close(s);
            }
        }
        Ok(())
    }
}

/// The reply to one message: its bytes go to the connection's outbox; a
/// one-sided write goes at once and is delivered before the reply leaves.
struct PortReply<'a> {
    out: &'a mut Vec<u8>,
    core: &'a mut Core,
    peer: u64,
}

impl Reply for PortReply<'_> {
    fn buf(&mut self) -> &mut Vec<u8> {
        self.out
    }

    fn capabilities(&self) -> Capabilities {
        self.core.capabilities()
    }

    fn write_remote(&mut self, region: &RemoteRegion, offset: usize, data: &[u8]) -> Result<()> {
        self.core.write(self.peer, region, offset, data)
    }

    fn read_remote(&mut self, region: &RemoteRegion, offset: usize, out: &mut [u8]) -> Result<()> {
        self.core.read(self.peer, region, offset, out)
    }
}

fabrickv_transport::idle_conns!(FabricPort, Conn, |c| !c.held.is_empty()
    || c.out.pending() > 0);

impl WorkerPort for FabricPort {
    fn poll(&mut self, max: usize, handler: &mut MessageHandler<'_>) -> Result<usize> {
        if !self.incoming.is_empty() {
            self.adopt();
        }
        self.progress()?;
        let ready = std::mem::take(&mut self.ready);
        let (handled, mut ready) = fabrickv_transport::serve_ready(ready, max, |s, budget| {
            self.service(s, budget, handler)
        })?;
        ready.append(&mut self.ready);
        self.ready = ready;
        if handled == 0
            && self.last_check.elapsed() >= Duration::from_millis(CLOSE_CHECK_INTERVAL_MS)
        {
            self.check_sockets(Some(Duration::ZERO))?;
        }
        self.check_idle(Instant::now());
        self.evict_idle();
        Ok(handled)
    }

    fn flush(&mut self) -> Result<()> {
        self.flush_except(&[])
    }

    fn holds_replies(&self) -> bool {
        true
    }

    /// A held connection stays listed in `dirty`, its replies (and the
    /// credits it owes) unsent, until a flush that does not hold it.
    fn flush_except(&mut self, held: &[ConnId]) -> Result<()> {
        let mut dirty = std::mem::take(&mut self.dirty);
        let mut keep = 0;
        let mut kept_held = 0;
        for i in 0..dirty.len() {
            let s = dirty[i];
            let holds = !held.is_empty()
                && self.conns[s]
                    .as_ref()
                    .is_some_and(|c| held.binary_search(&c.id).is_ok());
            if holds || self.send_conn(s)? {
                dirty[keep] = s;
                keep += 1;
                kept_held += usize::from(holds);
            } else if let Some(c) = self.conns[s].as_mut() {
                c.dirty = false;
            }
        }
        self.dirty_held = kept_held;
        dirty.truncate(keep);
        dirty.append(&mut self.dirty);
        self.dirty = dirty;
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        if !self.ready.is_empty() {
            return Ok(());
        }
        let spin_until = self.last_active + Duration::from_micros(IDLE_SPIN_US).min(timeout);
        loop {
            self.progress()?;
            // Held connections wait for a flush that releases them, not
            // for send completions: a worker idle while it holds replies
            // would otherwise spin here.
            if !self.ready.is_empty() || self.dirty.len() > self.dirty_held {
                return Ok(());
            }
            if Instant::now() >= spin_until {
                break;
            }
            std::hint::spin_loop();
        }
        let timeout = if self.node.core.trywait() {
            timeout
        } else {
            // No wait object (or events pending inside the provider):
            // sleep briefly and look again.
            timeout.min(Duration::from_micros(IDLE_SLEEP_US_MAX))
        };
        self.check_sockets(Some(timeout))?;
        self.check_idle(Instant::now());
        self.evict_idle();
        self.progress()
    }

    fabrickv_transport::port_accessors!(waker: |p| Waker::from_mio(p.waker.clone()));

    fn capabilities(&self) -> Capabilities {
        self.node.core.capabilities()
    }

    fn register(&mut self, len: usize) -> Result<RemoteRegion> {
        self.node.core.register_region(len)
    }

    fn local_region(&mut self, region: &RemoteRegion) -> Result<&mut [u8]> {
        self.node.core.region_mut(region, "port")
    }

    fn write_remote(
        &mut self,
        conn: ConnId,
        region: &RemoteRegion,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        let peer = self.peer_of(conn)?;
        self.node.core.write(peer, region, offset, data)
    }

    fn read_remote(
        &mut self,
        conn: ConnId,
        region: &RemoteRegion,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let peer = self.peer_of(conn)?;
        self.node.core.read(peer, region, offset, out)
    }
}

impl FabricPort {
    /// The fabric address of connection `conn`'s peer.
    fn peer_of(&self, conn: ConnId) -> Result<u64> {
        self.by_id
            .get(&conn)
            .and_then(|&s| self.conns[s].as_ref())
            .map(|c| c.addr)
            .ok_or(TransportError::Closed)
    }
}

impl Drop for FabricPort {
    fn drop(&mut self) {
        // A graceful goodbye: tell every client (rendezvous write side
        // shut), keep the queue moving while they stop using our endpoint
        // and close their sockets, then close. Closing at once would pull
        // our memory from under a peer mid-operation (shm peers in one
        // process share their regions directly).
        let mut live: Vec<usize> = Vec::new();
        for (s, c) in self.conns.iter().enumerate() {
            if let Some(c) = c {
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
                live.push(s);
            }
        }
        let deadline = Instant::now() + Duration::from_millis(crate::DISCONNECT_WAIT_MS);
        while !live.is_empty() && Instant::now() < deadline {
            let _ = self.node.core.progress();
            self.node.core.events.clear();
            live.retain(|&s| {
                let Some(c) = self.conns[s].as_mut() else {
                    return false;
                };
                let mut b = [0u8; 64];
                match std::io::Read::read(&mut c.stream, &mut b) {
                    Ok(0) => false,
                    Ok(_) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                }
            });
            std::thread::sleep(Duration::from_micros(200));
        }
        for s in 0..self.conns.len() {
            if self.conns[s].is_some() {
                self.close(s);
            }
        }
        // SAFETY: `node` is taken once, here, and never used after.
        let node = unsafe { std::mem::ManuallyDrop::take(&mut self.node) };
        crate::fi::retire(node);
    }
}
