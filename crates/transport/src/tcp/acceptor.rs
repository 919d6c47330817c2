//! The acceptor thread of a TCP listener: accepts sockets and feeds their
//! bytes to a [`Handshakes`] table; what to answer and where the socket
//! goes is up to a [`Conclude`]. The tcp transport and the fabric
//! transport's rendezvous both run on it.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use fabrickv_types::limits::CONNECTIONS_MAX;
use fabrickv_types::ErrorCode;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use super::port::Handoff;
use crate::handshake::{CompactOpening, Handshakes, Limits, OpeningFormat, Verdict};
use crate::idle::IdleBoard;
use crate::{Acceptor, Result, Waker};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_PENDING: usize = 2;

/// Most readiness events handled per epoll call.
const EVENTS_PER_POLL: usize = 256;

/// The opening of the tcp transport.
pub(super) const TCP_OPENING: CompactOpening = CompactOpening { magic: *b"FKV" };

/// What a transport does with a handshake the table has judged: write the
/// answer, and on acceptance hand the socket to its worker.
pub trait Conclude: Send {
    /// The transport's opening.
    type Format: OpeningFormat + Send;

    /// Answers `verdict` on `stream` (already out of the acceptor's poll)
    /// and hands the connection over if it is accepted.
    fn conclude(
        &mut self,
        stream: TcpStream,
        verdict: Verdict<<Self::Format as OpeningFormat>::Opening>,
        format: &Self::Format,
    );
}

/// Accepts TCP connections and runs their handshakes; see the module docs.
pub struct TcpAcceptor<C: Conclude> {
    listener: TcpListener,
    poll: Poll,
    waker: Arc<mio::Waker>,
    /// Connections open over all workers (the workers count them down).
    open: Arc<AtomicUsize>,
    table: Handshakes<TcpStream, C::Format>,
    conclude: C,
    /// At the cap, asks the longest-idle connection to make way.
    idle: Option<Arc<IdleBoard>>,
}

impl<C: Conclude> TcpAcceptor<C> {
    /// An acceptor of `listener` for a server of `workers` workers, with
    /// `open` counting the connections open.
    pub fn new(
        mut listener: TcpListener,
        format: C::Format,
        workers: usize,
        open: Arc<AtomicUsize>,
        conclude: C,
    ) -> Result<Self> {
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKER)?);
        Ok(TcpAcceptor {
            listener,
            poll,
            waker,
            open,
            table: Handshakes::new(format, Limits::with_conns_max(CONNECTIONS_MAX), workers),
            conclude,
            idle: None,
        })
    }

    /// Asks every client to prove `secret` in its handshake.
    pub fn with_secret(mut self, secret: Option<fabrickv_auth::Secret>) -> Self {
        self.table = self.table.with_secret(secret);
        self
    }

    /// Counts failed proofs per peer address in `throttle` (the server's
    /// one, shared with its other front ends).
    pub fn with_throttle(
        mut self,
        throttle: Option<fabrickv_auth::throttle::SharedThrottle>,
    ) -> Self {
        self.table = self.table.with_throttle(throttle);
        self
    }

    /// At the connection cap, judges a newcomer as fitting while a port
    /// reporting to `board` has an idle connection (its `Conclude` then
    /// asks for that one to close: `IdleBoard::make_room`).
    pub fn with_idle_board(mut self, board: Arc<IdleBoard>) -> Self {
        self.idle = Some(board);
        self
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    let source = fabrickv_auth::throttle::Source::ip(peer.ip());
                    let mut open = self.open.load(Ordering::Acquire);
                    if let Some(b) = &self.idle {
                        open = b.fits(open, CONNECTIONS_MAX);
                    }
                    let registry = self.poll.registry();
                    let unregister = |old: &mut TcpStream| {
                        let _ = registry.deregister(old);
                    };
                    // Over a bound: refuse by closing at once.
                    let now = Instant::now();
                    let admitted = self.table.admit_or_close(
                        stream,
                        source,
                        now,
                        open,
                        "connections",
                        unregister,
                    );
                    let Some((slot, stream)) = admitted else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let token = Token(FIRST_PENDING + slot);
                    if registry
                        .register(stream, token, Interest::READABLE)
                        .is_err()
                    {
                        self.table.remove(slot);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return;
                }
            }
        }
    }

    /// Reads what the handshake has sent and acts on the table's step.
    fn advance(&mut self, slot: usize) {
        let (open, registry, idle) = (&self.open, self.poll.registry(), &self.idle);
        let judged = self.table.readable(
            slot,
            || {
                let n = open.load(Ordering::Acquire);
                idle.as_ref().map_or(n, |b| b.fits(n, CONNECTIONS_MAX))
            },
            |s| {
                let _ = registry.deregister(s);
            },
        );
        if let Some((stream, verdict)) = judged {
            self.conclude.conclude(stream, verdict, self.table.format());
        }
    }
}

impl<C: Conclude> Acceptor for TcpAcceptor<C> {
    fn run(&mut self, stop: &AtomicBool) -> Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        while !stop.load(Ordering::Acquire) {
            let registry = self.poll.registry();
            let timeout = self.table.expire(Instant::now(), |mut s| {
                let _ = registry.deregister(&mut s);
            });
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all(),
                    WAKER => {}
                    Token(t) => self.advance(t - FIRST_PENDING),
                }
            }
        }
        Ok(())
    }

    fn waker(&self) -> Waker {
        Waker::from_mio(self.waker.clone())
    }
}

/// The tcp transport's end of a handshake: answer, then hand the socket
/// to its worker's port.
pub(super) struct TcpConclude {
    pub(super) handoffs: Vec<Handoff>,
    pub(super) open: Arc<AtomicUsize>,
    /// At the cap, the longest-idle connection makes way for an accepted one.
    pub(super) idle: Arc<IdleBoard>,
}

impl Conclude for TcpConclude {
    type Format = CompactOpening;

    fn conclude(&mut self, mut stream: TcpStream, verdict: Verdict<u16>, format: &CompactOpening) {
        use std::io::Write;
        let workers = self.handoffs.len() as u16;
        let (status, worker) = verdict.answer();
        // A fresh socket's send buffer is empty, so 8 bytes always fit.
        let _ = stream.write(&format.encode(status.as_u16(), workers));
        if status != ErrorCode::Ok {
            return;
        }
        let open = self.open.fetch_add(1, Ordering::AcqRel);
        self.idle.make_room(open + 1, CONNECTIONS_MAX + 1);
        if let Err(stream) = self.handoffs[worker].hand(stream) {
            self.open.fetch_sub(1, Ordering::AcqRel);
            drop(stream);
        }
    }
}
