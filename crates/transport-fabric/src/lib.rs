//! The libfabric transport of FabricKV: `fabric://PROVIDER/HOST:PORT`.
//!
//! `PROVIDER` is a libfabric provider (`shm`, `tcp;ofi_rxm`,
//! `udp;ofi_rxd`, `verbs;ofi_rxm`, `efa`, ...); `HOST:PORT` is an
//! out-of-band TCP rendezvous where a client and the server's acceptor
//! swap endpoint names (`fi_getname`) and the handshake (worker, status,
//! worker count, connection id, windows), as RDMA programs swap queue-pair
//! information. The rendezvous socket stays open for the connection's
//! life: its closing is how each side learns that the other is gone (RDM
//! endpoints have no connections to break).
//!
//! Every side uses one reliable-datagram endpoint (`FI_EP_RDM`, `FI_MSG`
//! and, where offered, `FI_RMA`): each server worker owns one endpoint,
//! completion queue and address vector shared by all its clients; each
//! client owns its own. Messages travel in packets (see [`wire`]) with
//! credit-based flow control, so a sender never overruns the receive
//! slots its peer posted.
//!
//! Layout:
//! - [`sys`]: bindgen's raw bindings (build.rs);
//! - `fi`: the safe wrapper; every libfabric call is there;
//! - [`wire`]: packets, credits, reassembly and the handshake (no I/O);
//! - `acceptor`, `port`, `endpoint`: the acceptor thread, a worker's
//!   port, the client endpoint (the shape of the tcp transport's);
//! - [`raw`]: a bare `fi_send`/`fi_recv` ping-pong, the floor to compare
//!   against.
#![allow(unsafe_code)]

mod acceptor;
mod endpoint;
mod fi;
mod port;
pub mod raw;
pub mod sys;
pub mod wire;

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fabrickv_transport::{Endpoint, Listening, Result, TransportError};

pub use endpoint::FabricEndpoint;
pub use raw::raw_pingpong;

/// The address scheme this crate registers.
pub const SCHEME: &str = "fabric";

/// Longest a one-sided transfer may take before it fails, in ms.
pub const RMA_TIMEOUT_MS: u64 = 10_000;

/// How long an idle loop polls the completion queue before it blocks, in
/// microseconds: a reply that comes within this costs no wake-up.
pub const IDLE_SPIN_US: u64 = 200;

/// Longest single sleep of an idle loop whose provider has no wait object
/// (shm), in microseconds: bounds the latency of the first message after
/// an idle period, at a few hundred wake-ups a second.
pub const IDLE_SLEEP_US_MAX: u64 = 1_000;

/// How often a busy loop looks at its rendezvous sockets for closed
/// peers, in ms.
pub const CLOSE_CHECK_INTERVAL_MS: u64 = 5;

/// Longest a closing side waits for its peer to let go of the connection
/// (graceful disconnect over the rendezvous socket), in ms.
pub const DISCONNECT_WAIT_MS: u64 = 200;

/// Makes `fabric://PROVIDER/HOST:PORT` addresses reach this transport
/// through `fabrickv_transport::listen` and `connect`.
pub fn install() {
    fabrickv_transport::register_scheme(SCHEME, listen_scheme, connect_scheme);
}

fn listen_scheme(rest: &str, workers: usize) -> Result<Listening> {
    let (provider, host) = parse(rest)?;
    acceptor::listen(provider, host, workers)
}

fn connect_scheme(rest: &str, worker: u16, timeout: Duration) -> Result<Box<dyn Endpoint>> {
    let (provider, host) = parse(rest)?;
    Ok(Box::new(FabricEndpoint::connect(
        provider, host, worker, timeout,
    )?))
}

/// Splits `PROVIDER/HOST:PORT`.
pub fn parse(rest: &str) -> Result<(&str, &str)> {
    match rest.rsplit_once('/') {
        Some((p, h)) if !p.is_empty() && h.contains(':') => Ok((p, h)),
        _ => Err(TransportError::BadAddress(format!(
            "{SCHEME}://{rest} (expected {SCHEME}://PROVIDER/HOST:PORT, e.g. \
             {SCHEME}://tcp;ofi_rxm/127.0.0.1:7500 or {SCHEME}://shm/127.0.0.1:7500)"
        ))),
    }
}

fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|_| TransportError::BadAddress(addr.to_string()))?
        .next()
        .ok_or_else(|| TransportError::BadAddress(addr.to_string()))
}

/// True for providers whose endpoints are named rather than bound to an
/// IP address.
fn named_provider(provider: &str) -> bool {
    provider.split(';').next() == Some("shm")
}

/// The source "node" to open an endpoint on: a fresh name for shm (each
/// shm endpoint needs its own, or two in one process collide), else the
/// IP address of the local interface that reaches the peer.
fn source_node(provider: &str, local_ip: std::net::IpAddr) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    if named_provider(provider) {
        format!(
            "fkv-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    } else {
        local_ip.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        assert_eq!(
            parse("tcp;ofi_rxm/127.0.0.1:7500").ok(),
            Some(("tcp;ofi_rxm", "127.0.0.1:7500"))
        );
        assert_eq!(parse("shm/[::1]:1").ok(), Some(("shm", "[::1]:1")));
        for bad in ["127.0.0.1:1", "/127.0.0.1:1", "shm/", "shm/host"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
