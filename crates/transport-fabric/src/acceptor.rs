//! The rendezvous: a TCP listener whose acceptor thread swaps endpoint
//! names with each client and hands the connection to its worker.
//!
//! ```text
//! client -> server:  Opening { worker, window, client endpoint name }
//! server -> client:  Welcome { status, workers, conn id, window, worker endpoint name }
//! ```
//!
//! The worker gets the connection (and inserts the client into its
//! address vector) before the client gets its answer, so the client's
//! first packet always finds its connection adopted. The acceptor thread
//! is the tcp transport's (`fabrickv_transport::tcp::TcpAcceptor`), with
//! the same bounded, timed table of handshakes; this file says what an
//! accepted or refused fabric opening gets.

use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use fabrickv_transport::handshake::Verdict;
use fabrickv_transport::idle::IdleBoard;
use fabrickv_transport::tcp::{Conclude, TcpAcceptor};
use fabrickv_transport::{Listening, Result, WorkerPort};
use fabrickv_types::limits::CONNECTIONS_MAX;
use fabrickv_types::ErrorCode;
use mio::net::TcpStream;

use crate::port::{FabricPort, Handoff, NewConn};
use crate::wire::{Opening, OpeningWire, Welcome, WINDOW_PACKETS};

/// Listens on `host` (`HOST:PORT`, port 0 picks one) with one endpoint of
/// `provider` per worker.
pub(crate) fn listen(
    provider: &str,
    host: &str,
    opts: &fabrickv_transport::ListenOptions,
) -> Result<Listening> {
    let workers = opts.workers;
    let (listener, local) = fabrickv_transport::tcp::bind(host)?;
    let open = Arc::new(AtomicUsize::new(0));
    let mut fabric_ports = Vec::with_capacity(workers);
    let mut handoffs = Vec::with_capacity(workers);
    for _ in 0..workers {
        let node = crate::source_node(provider, local.ip());
        let (port, handoff) = FabricPort::new(provider, &node, open.clone())?;
        fabric_ports.push(port);
        handoffs.push(handoff);
    }
    let board = IdleBoard::new(fabric_ports.iter().map(WorkerPort::waker).collect());
    let mut ports: Vec<Box<dyn WorkerPort>> = Vec::with_capacity(workers);
    for (i, mut port) in fabric_ports.into_iter().enumerate() {
        port.set_idle_board(board.clone(), i);
        ports.push(Box::new(port));
    }
    let conclude = FabricConclude {
        next_id: vec![1; handoffs.len()],
        handoffs,
        open: open.clone(),
        idle: board.clone(),
    };
    let acceptor = TcpAcceptor::new(listener, OpeningWire, workers, open, conclude)?
        .with_secret(opts.secret.clone())
        .with_throttle(opts.throttle.clone())
        .with_idle_board(board);
    Ok(Listening {
        local_addr: format!("{}://{provider}/{local}", crate::SCHEME),
        acceptor: Box::new(acceptor),
        ports,
    })
}

/// The fabric transport's end of a handshake: give the connection an id,
/// hand it to its worker, then answer with the worker endpoint's name.
struct FabricConclude {
    handoffs: Vec<Handoff>,
    /// The next connection id of each worker (never reused while the
    /// server runs, so a stale packet cannot reach a newer connection).
    next_id: Vec<u32>,
    /// Connections open over all workers.
    open: Arc<AtomicUsize>,
    /// At the cap, the longest-idle connection makes way for an accepted one.
    idle: Arc<IdleBoard>,
}

impl FabricConclude {
    /// Answers a refusal; names `worker`'s endpoint as every answer does.
    fn refuse(&self, mut stream: TcpStream, status: ErrorCode, worker: usize) {
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
        let _ = stream.write(&w.encode());
    }
}

impl Conclude for FabricConclude {
    type Format = OpeningWire;

    fn conclude(&mut self, stream: TcpStream, verdict: Verdict<Opening>, _format: &OpeningWire) {
        let (worker, opening) = match verdict {
            Verdict::Accept { worker, opening } => (worker, opening),
            Verdict::Refuse { code, worker } => return self.refuse(stream, code, worker),
        };
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
        let mut reply_stream = match stream.peer_addr().and_then(|_| dup_stream(&stream)) {
            Ok(s) => s,
            Err(_) => return,
        };
        let open = self.open.fetch_add(1, Ordering::AcqRel);
        self.idle.make_room(open + 1, CONNECTIONS_MAX + 1);
        let nc = NewConn {
            id,
            name: opening.name,
            window: opening.window,
            stream,
        };
        if self.handoffs[worker].hand(nc).is_err() {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        // A fresh socket's send buffer is empty: the answer always fits.
        let _ = reply_stream.write_all(&w.encode());
    }
}

/// A blocking duplicate of a socket, to write the answer with.
fn dup_stream(s: &TcpStream) -> io::Result<std::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = s.as_fd().try_clone_to_owned()?;
    Ok(std::net::TcpStream::from(fd))
}
