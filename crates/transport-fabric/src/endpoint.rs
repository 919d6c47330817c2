//! The client side of a fabric connection: its own endpoint, completion
//! queue and address vector, with the worker's endpoint as its one peer.
//!
//! Received messages are handed to the caller straight from the receive
//! slot (no copy) when it polls; messages that arrive while the caller is
//! flushing, or beyond what one poll asked for, are copied into an inbox
//! so that the slots (and the server's credits) keep flowing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use fabrickv_transport::framing::{self, Next, PREFIX_BYTES};
use fabrickv_transport::{Capabilities, Endpoint, RemoteRegion, Result, TransportError};
use rustix::event::{PollFd, PollFlags};
use rustix::net::RecvFlags;

use crate::fi::{Event, Node};
use crate::wire::{
    Flow, Header, Kind, Opening, Outbox, Piece, Reassembly, Welcome, HEADER_BYTES, PACKET_BYTES,
    WELCOME_BYTES, WINDOW_PACKETS,
};
use crate::{CLOSE_CHECK_INTERVAL_MS, IDLE_SLEEP_US_MAX, IDLE_SPIN_US};

/// A connection to one worker of a FabricKV server over libfabric.
pub struct FabricEndpoint {
    /// Closed through [`crate::fi::retire`] when this is dropped.
    node: std::mem::ManuallyDrop<Node>,
    /// The rendezvous socket; its closing means the server is gone.
    stream: TcpStream,
    /// The worker's address in our address vector.
    peer: u64,
    /// The server's id for this connection, in every packet we send.
    conn: u32,
    flow: Flow,
    rx: Reassembly,
    out: Outbox,
    /// Framed messages received but not yet handed out, from `inbox_head`.
    inbox: Vec<u8>,
    inbox_head: usize,
    closed: bool,
    last_check: Instant,
    /// When the endpoint last saw a completion: an idle wait spins only
    /// within `IDLE_SPIN_US` of it (or of the last flush), then blocks.
    last_active: Instant,
    workers: u16,
}

impl FabricEndpoint {
    /// Opens an endpoint of `provider`, meets the server at `host`
    /// (`HOST:PORT`) and binds the connection to `worker`.
    pub fn connect(
        provider: &str,
        host: &str,
        worker: u16,
        timeout: Duration,
    ) -> Result<FabricEndpoint> {
        Self::connect_with(
            provider,
            host,
            worker,
            &fabrickv_transport::Dial::new(timeout)?,
        )
    }

    /// As [`FabricEndpoint::connect`], as `dial` says (its timeout, and
    /// the secret to prove if the server asks for one in the rendezvous).
    pub fn connect_with(
        provider: &str,
        host: &str,
        worker: u16,
        dial: &fabrickv_transport::Dial,
    ) -> Result<FabricEndpoint> {
        let timeout = dial.timeout;
        let sa = fabrickv_transport::tcp::resolve(host)?;
        let mut stream = TcpStream::connect_timeout(&sa, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let source = crate::source_node(provider, stream.local_addr()?.ip());
        let mut node = Node::open(
            provider,
            Some(&source),
            WINDOW_PACKETS as usize,
            PACKET_BYTES,
        )?;
        node.add_rx_slab(WINDOW_PACKETS as usize, PACKET_BYTES)?;
        let opening = Opening {
            worker,
            window: WINDOW_PACKETS,
            name: node.core.name.clone(),
        };
        stream.write_all(&opening.encode())?;
        let mut fixed = [0u8; WELCOME_BYTES];
        // The first bytes are a challenge or the start of the welcome.
        let head = fabrickv_transport::handshake::CHALLENGE_HEAD_BYTES;
        stream.read_exact(&mut fixed[..head])?;
        let proved = fabrickv_transport::handshake::answer_challenge(
            &fixed[..head],
            &mut stream,
            dial.secret.as_ref(),
        )?;
        let from = if proved { 0 } else { head };
        stream.read_exact(&mut fixed[from..])?;
        let (mut welcome, name_len) = Welcome::decode_fixed(&fixed).ok_or_else(|| {
            TransportError::Refused("the peer is not a FabricKV fabric server".into())
        })?;
        welcome.name = vec![0; name_len];
        stream.read_exact(&mut welcome.name)?;
        fabrickv_transport::handshake::check_answer(worker, welcome.status, welcome.workers)?;
        let peer = node.core.insert(&welcome.name)?;
        Ok(FabricEndpoint {
            node: std::mem::ManuallyDrop::new(node),
            stream,
            peer,
            conn: welcome.conn,
            flow: Flow::new(welcome.window),
            rx: Reassembly::default(),
            out: Outbox::default(),
            inbox: Vec::new(),
            inbox_head: 0,
            closed: false,
            last_check: Instant::now(),
            last_active: Instant::now(),
            workers: welcome.workers,
        })
    }

    /// Workers the server said it has.
    pub fn server_workers(&self) -> u16 {
        self.workers
    }

    /// The libfabric provider in use, as it names itself.
    pub fn provider(&self) -> &str {
        &self.node.core.caps.provider
    }

    /// Takes completed packets; hands messages to `on_msg` while `budget`
    /// lasts, copies the rest into the inbox. Returns messages handed.
    fn absorb(&mut self, budget: usize, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize> {
        if self.node.core.progress()? > 0 {
            self.last_active = Instant::now();
        }
        let mut n = 0;
        while let Some(ev) = self.node.core.events.pop_front() {
            match ev {
                Event::Recv { slab, slot, len } => {
                    let packet = self.node.rx[slab].slot(slot, len);
                    let h = Header::decode(packet).ok_or_else(|| {
                        TransportError::Framing("server sent a packet with a bad header".into())
                    })?;
                    self.flow.on_packet(&h).map_err(TransportError::Framing)?;
                    if h.kind == Kind::Data {
                        let mut pos = HEADER_BYTES;
                        loop {
                            match self.rx.next(packet, &mut pos) {
                                Ok(Piece::Message(m)) => {
                                    if n < budget && self.inbox_head == self.inbox.len() {
                                        on_msg(m);
                                        n += 1;
                                    } else {
                                        let at = framing::begin(&mut self.inbox);
                                        self.inbox.extend_from_slice(m);
                                        let _ = framing::finish(&mut self.inbox, at);
                                    }
                                }
                                Ok(Piece::End) => break,
                                Err(why) => return Err(TransportError::Framing(why)),
                            }
                        }
                    }
                    self.node.post_recv(slab, slot)?;
                    self.flow.owed += 1;
                }
                Event::RecvFailed { slab, slot } => self.node.post_recv(slab, slot)?,
                Event::SendFailed { .. } => self.mark_closed(),
            }
        }
        if self.flow.should_return() {
            let h = self.flow.peek_header(Kind::Credit, self.conn);
            if self.node.core.send(self.peer, &[&h.encode()])? {
                self.flow.sent();
            }
        }
        Ok(n)
    }

    fn inbox_message(&self) -> Option<(usize, usize)> {
        match framing::next(&self.inbox[self.inbox_head..]) {
            Next::Message(len) => Some((self.inbox_head + PREFIX_BYTES, len)),
            _ => None,
        }
    }

    /// Looks at the rendezvous socket; true if the server closed it.
    fn check_closed(&mut self) -> bool {
        self.last_check = Instant::now();
        let mut b = [0u8; 1];
        let gone =
            match rustix::net::recv(&self.stream, &mut b, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
                Ok((0, _)) => true,
                Ok(_) | Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => false,
                Err(_) => true,
            };
        if gone {
            self.mark_closed();
        }
        self.closed
    }

    /// The server is gone: stop addressing it and say goodbye, so that it
    /// may close its endpoint (it waits for this).
    fn mark_closed(&mut self) {
        if !self.closed {
            self.closed = true;
            // Not while a send to it is in flight: the shm provider would
            // unmap the server's region under that send's completion
            // (`cli --test fabric_shm`); the whole endpoint is closed on drop.
            if !self.node.core.sending_to(self.peer) {
                self.node.core.remove(self.peer);
            }
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Blocks on the completion queue's wait object and the socket.
    fn block(&mut self, timeout: Duration) -> Result<()> {
        let can_block = self.node.core.trywait();
        let timeout = if can_block {
            timeout
        } else {
            timeout.min(Duration::from_micros(IDLE_SLEEP_US_MAX))
        };
        let ts = fabrickv_transport::timespec(timeout);
        let cq_fd = self.node.core.wait_fd();
        // SAFETY: the descriptor belongs to the completion queue, which
        // lives as long as self.node, beyond this call.
        let cq = cq_fd.map(|fd| unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
        let mut fds = Vec::with_capacity(2);
        fds.push(PollFd::new(&self.stream, PollFlags::IN));
        if let (true, Some(cq)) = (can_block, cq.as_ref()) {
            fds.push(PollFd::new(cq, PollFlags::IN));
        }
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
        if fds[0]
            .revents()
            .intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR)
        {
            self.check_closed();
        }
        Ok(())
    }
}

impl Drop for FabricEndpoint {
    fn drop(&mut self) {
        self.goodbye();
        // SAFETY: `node` is taken once, here, and never used after.
        let node = unsafe { std::mem::ManuallyDrop::take(&mut self.node) };
        crate::fi::retire(node);
    }
}

impl FabricEndpoint {
    /// Shuts our side of the rendezvous and waits (bounded) for the server
    /// to close the connection before the endpoint goes.
    fn goodbye(&mut self) {
        if self.closed {
            return;
        }
        // A graceful goodbye (see the port's Drop): shut our write side,
        // keep our queue moving until the server has closed the
        // connection (its socket closes), then close the endpoint.
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        let deadline = Instant::now() + Duration::from_millis(crate::DISCONNECT_WAIT_MS);
        let _ = self.stream.set_read_timeout(Some(Duration::from_millis(1)));
        let mut b = [0u8; 64];
        while Instant::now() < deadline {
            let _ = self.node.core.progress();
            self.node.core.events.clear();
            match self.stream.read(&mut b) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
    }
}

impl Endpoint for FabricEndpoint {
    fn post_with(&mut self, build: &mut dyn FnMut(&mut Vec<u8>)) -> Result<()> {
        let at = framing::begin(&mut self.out.out);
        build(&mut self.out.out);
        match framing::finish(&mut self.out.out, at) {
            Ok(true) => Ok(()),
            Ok(false) => Err(TransportError::MessageTooLarge(0)),
            Err(n) => Err(TransportError::MessageTooLarge(n)),
        }
    }

    fn flush(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        if self.out.pending() > 0 {
            // A request is going out: its reply is worth spinning for.
            self.last_active = Instant::now();
        }
        while self.out.pending() > 0 {
            if self.closed {
                return Err(TransportError::Closed);
            }
            if self.flow.can_send_data() {
                let h = self.flow.peek_header(Kind::Data, self.conn);
                let payload = self.out.next_payload();
                let n = payload.len();
                if self.node.core.send(self.peer, &[&h.encode(), payload])? {
                    self.flow.sent();
                    self.out.advance(n);
                    continue;
                }
            }
            // Out of credits (or the provider's queue is full): take what
            // the server sends meanwhile, which brings credits back.
            self.absorb(0, &mut |_| {})?;
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::Timeout);
            }
            if now.duration_since(self.last_check) >= Duration::from_millis(CLOSE_CHECK_INTERVAL_MS)
                && self.check_closed()
            {
                return Err(TransportError::Closed);
            }
        }
        Ok(())
    }

    fn poll(&mut self, max: usize, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut n = 0;
        while n < max {
            let Some((start, len)) = self.inbox_message() else {
                break;
            };
            on_msg(&self.inbox[start..start + len]);
            self.inbox_head = start + len;
            n += 1;
        }
        if self.inbox_head == self.inbox.len() {
            self.inbox.clear();
            self.inbox_head = 0;
        } else {
            return Ok(n);
        }
        n += self.absorb(max - n, on_msg)?;
        if n == 0 {
            if self.closed {
                return Err(TransportError::Closed);
            }
            if self.last_check.elapsed() >= Duration::from_millis(CLOSE_CHECK_INTERVAL_MS)
                && self.check_closed()
            {
                return Err(TransportError::Closed);
            }
        }
        Ok(n)
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        if self.inbox_message().is_some() || self.closed {
            return Ok(());
        }
        let spin_until = self.last_active + Duration::from_micros(IDLE_SPIN_US).min(timeout);
        loop {
            // Keep the completion queue moving (one-sided operations of
            // the server into our memory progress only while we poll).
            self.absorb(0, &mut |_| {})?;
            if self.inbox_message().is_some() {
                return Ok(());
            }
            if Instant::now() >= spin_until {
                break;
            }
            std::hint::spin_loop();
        }
        self.block(timeout)
    }

    fn capabilities(&self) -> Capabilities {
        self.node.core.capabilities()
    }

    fn register(&mut self, len: usize) -> Result<RemoteRegion> {
        self.node.core.register_region(len)
    }

    fn local_region(&mut self, region: &RemoteRegion) -> Result<&mut [u8]> {
        self.node.core.region_mut(region, "endpoint")
    }

    fn write_remote(&mut self, region: &RemoteRegion, offset: usize, data: &[u8]) -> Result<()> {
        self.node.core.write(self.peer, region, offset, data)
    }

    fn read_remote(&mut self, region: &RemoteRegion, offset: usize, out: &mut [u8]) -> Result<()> {
        self.node.core.read(self.peer, region, offset, out)
    }
}
