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
//! carry length-prefixed messages (see [`crate::framing`]).
//!
//! Threads: one acceptor thread runs every handshake (bounded in count and
//! time, so a client that connects and says nothing holds nothing for
//! long) and hands the socket to its worker over a channel; each worker
//! owns a [`port::TcpPort`] with its own epoll instance.

mod acceptor;
mod endpoint;
mod port;

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

pub use endpoint::TcpEndpoint;
pub use port::SPLICE_PART_BYTES_MIN;

use crate::{Listening, Result, TransportError, WorkerPort};

/// Bytes of each handshake message.
pub const HANDSHAKE_BYTES: usize = 8;

/// First bytes of each handshake message.
const HANDSHAKE_MAGIC: &[u8; 3] = b"FKV";

/// Handshake version spoken here.
const HANDSHAKE_VERSION: u8 = 1;

fn encode_handshake(second: u16, third: u16) -> [u8; HANDSHAKE_BYTES] {
    let mut b = [0u8; HANDSHAKE_BYTES];
    b[..3].copy_from_slice(HANDSHAKE_MAGIC);
    b[3] = HANDSHAKE_VERSION;
    b[4..6].copy_from_slice(&second.to_le_bytes());
    b[6..8].copy_from_slice(&third.to_le_bytes());
    b
}

/// Parses a handshake into its two 16-bit fields.
fn decode_handshake(b: &[u8; HANDSHAKE_BYTES]) -> Option<(u16, u16)> {
    if &b[..3] != HANDSHAKE_MAGIC || b[3] != HANDSHAKE_VERSION {
        return None;
    }
    Some((
        u16::from_le_bytes([b[4], b[5]]),
        u16::from_le_bytes([b[6], b[7]]),
    ))
}

fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|_| TransportError::BadAddress(addr.to_string()))?
        .next()
        .ok_or_else(|| TransportError::BadAddress(addr.to_string()))
}

/// Listens on `addr` (port 0 picks a free port) for `workers` workers.
pub fn listen(addr: &str, workers: usize) -> Result<Listening> {
    let sa = resolve(addr)?;
    let listener = std::net::TcpListener::bind(sa)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let open = Arc::new(AtomicUsize::new(0));
    let mut ports: Vec<Box<dyn WorkerPort>> = Vec::with_capacity(workers);
    let mut handoffs = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (port, handoff) = port::TcpPort::new(open.clone())?;
        ports.push(Box::new(port));
        handoffs.push(handoff);
    }
    let acceptor =
        acceptor::TcpAcceptor::new(mio::net::TcpListener::from_std(listener), handoffs, open)?;
    Ok(Listening {
        local_addr: format!("tcp://{local}"),
        acceptor: Box::new(acceptor),
        ports,
    })
}
