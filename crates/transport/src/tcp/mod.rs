//! The tcp transport: mio (epoll) on the server, blocking sockets on the
//! client.
//!
//! A connection opens with an 8-byte handshake that binds it to a worker:
//!
//! ```text
//! client -> server:  "FKV" version(u8=1) worker(u16) reserved(u16=0)
//! server -> client:  "FKV" version(u8=1) status(u16)  workers(u16)
//! ```
//!
//! `status` is an `ErrorCode` (0 = accepted). After it, both directions
//! carry length-prefixed messages (see [`crate::framing`]). The rules of
//! the handshake live in [`crate::handshake`], shared with shm and fabric.
//!
//! Threads: one acceptor thread runs every handshake (bounded in count and
//! time, so a client that connects and says nothing holds nothing for
//! long) and hands the socket to its worker over a channel; each worker
//! owns a `port::TcpPort` with its own epoll instance.

mod acceptor;
mod conn_datapath;
mod endpoint;
mod port;

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

pub use acceptor::{Conclude, TcpAcceptor};
pub use conn_datapath::SPLICE_PART_BYTES_MIN;
pub use endpoint::TcpEndpoint;

use crate::{Listening, Result, TransportError, WorkerPort};

/// Bytes of each handshake message.
pub const HANDSHAKE_BYTES: usize = crate::handshake::COMPACT_OPENING_BYTES;

/// The first socket address `addr` (`HOST:PORT`) resolves to.
pub fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|_| TransportError::BadAddress(addr.to_string()))?
        .next()
        .ok_or_else(|| TransportError::BadAddress(addr.to_string()))
}

/// Operations a tcp worker handles before it flushes while messages keep
/// coming ([`crate::WorkerPort::flush_after_ops`]). A flush is one
/// `writev` per connection, a system call of a few microseconds: 64
/// operations is four HERD frames of 16 (the flush after four frames
/// that measured best, 6.9 Mops against 5.2 after 64), or 64 frames of
/// one operation, which flushed after every four held `bench rpc`'s
/// echo throughput over tcp to about a quarter of its rate.
pub const TCP_FLUSH_AFTER_OPS: usize = 64;

/// Writes `iov` to a connected socket as `writev` would, but with
/// `MSG_NOSIGNAL`: a peer that went away is an `EPIPE` on this one
/// connection, never a SIGPIPE that ends the process. std's
/// `write_vectored` is a plain `writev`, which raises the signal, and
/// the `fabrickv` binary restores SIGPIPE's default for its client
/// commands and for `bench`, whose servers run in its own process.
pub fn send_vectored(
    socket: &impl std::os::fd::AsFd,
    iov: &[std::io::IoSlice<'_>],
) -> std::io::Result<usize> {
    let mut control = rustix::net::SendAncillaryBuffer::default();
    Ok(rustix::net::sendmsg(
        socket,
        iov,
        &mut control,
        rustix::net::SendFlags::NOSIGNAL,
    )?)
}

/// A non-blocking listener on `addr` (port 0 picks a free port) and the
/// address it got, for a [`TcpAcceptor`] (fabric's rendezvous too).
pub fn bind(addr: &str) -> Result<(mio::net::TcpListener, SocketAddr)> {
    let listener = std::net::TcpListener::bind(resolve(addr)?)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    Ok((mio::net::TcpListener::from_std(listener), local))
}

/// Listens on `addr` (port 0 picks a free port) for `workers` workers,
/// letting in every client.
pub fn listen(addr: &str, workers: usize) -> Result<Listening> {
    listen_with(addr, &crate::ListenOptions::workers(workers))
}

/// Listens on `addr` (port 0 picks a free port) as `opts` say.
pub fn listen_with(addr: &str, opts: &crate::ListenOptions) -> Result<Listening> {
    let workers = opts.workers;
    let (listener, local) = bind(addr)?;
    let open = Arc::new(AtomicUsize::new(0));
    let mut tcp_ports = Vec::with_capacity(workers);
    let mut handoffs = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (port, handoff) = port::TcpPort::new(open.clone())?;
        tcp_ports.push(port);
        handoffs.push(handoff);
    }
    let board = crate::idle::IdleBoard::new(tcp_ports.iter().map(|p| p.waker()).collect());
    let mut ports: Vec<Box<dyn WorkerPort>> = Vec::with_capacity(workers);
    for (i, mut port) in tcp_ports.into_iter().enumerate() {
        port.set_idle_board(board.clone(), i);
        ports.push(Box::new(port));
    }
    let conclude = acceptor::TcpConclude {
        handoffs,
        open: open.clone(),
        idle: board.clone(),
    };
    let acceptor = TcpAcceptor::new(listener, acceptor::TCP_OPENING, workers, open, conclude)?
        .with_secret(opts.secret.clone())
        .with_throttle(opts.throttle.clone())
        .with_idle_board(board);
    Ok(Listening {
        local_addr: format!("tcp://{local}"),
        acceptor: Box::new(acceptor),
        ports,
    })
}
