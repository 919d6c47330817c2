//! The rendezvous: a TCP listener whose acceptor thread swaps endpoint
//! names with each client and hands the connection to its worker.
//!
//! ```text
//! client -> server:  Hello   { worker, window, client endpoint name }
//! server -> client:  Welcome { status, workers, conn id, window, worker endpoint name }
//! ```
//!
//! The worker gets the connection (and inserts the client into its
//! address vector) before the client gets its answer, so the client's
//! first packet always finds its connection adopted. Handshakes are
//! bounded in number and time, as in the tcp transport.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_transport::{Acceptor, Listening, Result, Waker, WorkerPort};
use fabrickv_types::limits::{CONNECTIONS_MAX, HANDSHAKES_PENDING_MAX, HANDSHAKE_TIMEOUT_MS};
use fabrickv_types::ErrorCode;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use crate::port::{FabricPort, Handoff, NewConn};
use crate::wire::{Hello, Welcome, HELLO_BYTES, WINDOW_PACKETS};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_PENDING: usize = 2;

/// Readiness events handled per epoll call.
const EVENTS_PER_POLL: usize = 256;

struct Pending {
    stream: TcpStream,
    buf: Vec<u8>,
    deadline: Instant,
}

struct FabricAcceptor {
    listener: TcpListener,
    poll: Poll,
    waker: Arc<mio::Waker>,
    handoffs: Vec<Handoff>,
    /// The next connection id of each worker (never reused while the
    /// server runs, so a stale packet cannot reach a newer connection).
    next_id: Vec<u32>,
    open: Arc<AtomicUsize>,
    pending: Vec<Option<Pending>>,
}

/// Listens on `host` (`HOST:PORT`, port 0 picks one) with one endpoint of
/// `provider` per worker.
pub(crate) fn listen(provider: &str, host: &str, workers: usize) -> Result<Listening> {
    let sa = crate::resolve(host)?;
    let listener = std::net::TcpListener::bind(sa)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let open = Arc::new(AtomicUsize::new(0));
    let mut ports: Vec<Box<dyn WorkerPort>> = Vec::with_capacity(workers);
    let mut handoffs = Vec::with_capacity(workers);
    for _ in 0..workers {
        let node = crate::source_node(provider, local.ip());
        let (port, handoff) = FabricPort::new(provider, &node, open.clone())?;
        ports.push(Box::new(port));
        handoffs.push(handoff);
    }
    let mut listener = TcpListener::from_std(listener);
    let poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let waker = Arc::new(mio::Waker::new(poll.registry(), WAKER)?);
    let acceptor = FabricAcceptor {
        listener,
        poll,
        waker,
        next_id: vec![1; handoffs.len()],
        handoffs,
        open,
        pending: Vec::new(),
    };
    Ok(Listening {
        local_addr: format!("{}://{provider}/{local}", crate::SCHEME),
        acceptor: Box::new(acceptor),
        ports,
    })
}

impl FabricAcceptor {
    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    if self.open.load(Ordering::Acquire) >= CONNECTIONS_MAX {
                        tracing::warn!("refusing a connection: {CONNECTIONS_MAX} connections open");
                        continue;
                    }
                    let live = self.pending.iter().filter(|p| p.is_some()).count();
                    if live >= HANDSHAKES_PENDING_MAX {
                        if let Some(oldest) = (0..self.pending.len())
                            .filter_map(|i| self.pending[i].as_ref().map(|p| (p.deadline, i)))
                            .min()
                            .map(|(_, i)| i)
                        {
                            self.drop_pending(oldest);
                        }
                    }
                    let _ = stream.set_nodelay(true);
                    let slot = self
                        .pending
                        .iter()
                        .position(|p| p.is_none())
                        .unwrap_or_else(|| {
                            self.pending.push(None);
                            self.pending.len() - 1
                        });
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, Token(FIRST_PENDING + slot), Interest::READABLE)
                        .is_err()
                    {
                        continue;
                    }
                    self.pending[slot] = Some(Pending {
                        stream,
                        buf: Vec::with_capacity(HELLO_BYTES),
                        deadline: Instant::now() + Duration::from_millis(HANDSHAKE_TIMEOUT_MS),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn advance(&mut self, slot: usize) {
        let Some(p) = self.pending.get_mut(slot).and_then(|p| p.as_mut()) else {
            return;
        };
        loop {
            let want = if p.buf.len() < HELLO_BYTES {
                HELLO_BYTES
            } else {
                match Hello::total_bytes(&p.buf) {
                    Some(n) => n,
                    None => return self.refuse(slot, ErrorCode::UnsupportedVersion, 0),
                }
            };
            if p.buf.len() == want {
                return self.complete(slot);
            }
            let mut chunk = [0u8; 512];
            let n = (want - p.buf.len()).min(chunk.len());
            match p.stream.read(&mut chunk[..n]) {
                Ok(0) => return self.drop_pending(slot),
                Ok(k) => p.buf.extend_from_slice(&chunk[..k]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.drop_pending(slot),
            }
        }
    }

    fn drop_pending(&mut self, slot: usize) {
        if let Some(mut p) = self.pending[slot].take() {
            let _ = self.poll.registry().deregister(&mut p.stream);
        }
    }

    fn refuse(&mut self, slot: usize, status: ErrorCode, worker: usize) {
        let Some(mut p) = self.pending[slot].take() else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut p.stream);
        let name = self
            .handoffs
            .get(worker)
            .map(|h| h.name.clone())
            .unwrap_or_default();
        let w = Welcome {
            status: status.as_u16(),
            workers: self.handoffs.len() as u16,
            conn: 0,
            window: 0,
            name,
        };
        let _ = p.stream.write(&w.encode());
    }

    fn complete(&mut self, slot: usize) {
        let hello = self.pending[slot]
            .as_ref()
            .and_then(|p| Hello::decode(&p.buf));
        let Some(hello) = hello else {
            return self.refuse(slot, ErrorCode::UnsupportedVersion, 0);
        };
        let worker = usize::from(hello.worker);
        if worker >= self.handoffs.len() {
            return self.refuse(slot, ErrorCode::NoSuchWorker, 0);
        }
        if self.open.load(Ordering::Acquire) >= CONNECTIONS_MAX || hello.window < 4 {
            return self.refuse(slot, ErrorCode::Unavailable, worker);
        }
        let Some(mut p) = self.pending[slot].take() else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut p.stream);
        let id = self.next_id[worker];
        self.next_id[worker] = id.wrapping_add(1).max(1);
        let w = Welcome {
            status: ErrorCode::Ok.as_u16(),
            workers: self.handoffs.len() as u16,
            conn: id,
            window: WINDOW_PACKETS,
            name: self.handoffs[worker].name.clone(),
        };
        // The socket is handed to the worker, which watches it for the
        // client's departure; the answer is written first by our own
        // duplicate of it, after the worker has the connection.
        let reply_stream = match p.stream.peer_addr().and_then(|_| dup_stream(&p.stream)) {
            Ok(s) => s,
            Err(_) => return,
        };
        self.open.fetch_add(1, Ordering::AcqRel);
        let nc = NewConn {
            id,
            name: hello.name,
            window: hello.window,
            stream: p.stream,
        };
        if self.handoffs[worker].hand(nc).is_err() {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        // A fresh socket's send buffer is empty: the answer always fits.
        let mut reply_stream = reply_stream;
        let _ = reply_stream.write_all(&w.encode());
    }

    fn expire(&mut self, now: Instant) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        for slot in 0..self.pending.len() {
            let Some(deadline) = self.pending[slot].as_ref().map(|p| p.deadline) else {
                continue;
            };
            if deadline <= now {
                self.drop_pending(slot);
            } else {
                let left = deadline - now;
                next = Some(next.map_or(left, |n| n.min(left)));
            }
        }
        next
    }
}

/// A blocking duplicate of a socket, to write the answer with.
fn dup_stream(s: &TcpStream) -> io::Result<std::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = s.as_fd().try_clone_to_owned()?;
    Ok(std::net::TcpStream::from(fd))
}

impl Acceptor for FabricAcceptor {
    fn run(&mut self, stop: &AtomicBool) -> Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        while !stop.load(Ordering::Acquire) {
            let timeout = self.expire(Instant::now());
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
        let w = self.waker.clone();
        Waker::new(move || {
            let _ = w.wake();
        })
    }
}
