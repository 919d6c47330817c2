//! The shared-memory transport: FabricKV between processes on one host.
//!
//! `shm://NAME` addresses reach it through `fabrickv_transport::listen`
//! and `connect` once [`install`] has run.
//!
//! How a connection works:
//! - **Rendezvous**: the server listens on a unix socket in the Linux
//!   abstract namespace (`fabrickv-shm-NAME`; nothing in the filesystem).
//!   Its acceptor thread runs the handshake (the client names the worker),
//!   creates the connection's shared memory with `memfd_create` (sealed
//!   against resizing), and passes it with two eventfds to the client over
//!   the socket (`SCM_RIGHTS`). The memory is anonymous: when both
//!   processes have exited or unmapped it, the kernel frees it, so even
//!   `kill -9` leaks nothing.
//! - **Data**: two single-producer single-consumer rings in that memory
//!   (`ring`), one per direction. A sender writes records past the
//!   published tail and publishes a whole burst with one release store at
//!   flush; a receiver reads records (the client in place; the server
//!   copies each request out first, since the client may rewrite it) and
//!   releases them with one store per burst.
//! - **Idle back-off**: a receiver spins for `IDLE_SPIN_US`, then sets a
//!   wait flag in shared memory and blocks on its eventfd (the server on
//!   one epoll over all its connections). A sender checks the flag after
//!   publishing (store, full fence, load) and writes the eventfd only when
//!   it is set, so the busy path makes no syscall.
//! - **Liveness**: the unix socket stays open; end-of-file on it means the
//!   peer is gone (the server drops the connection at once, however full
//!   its rings; the client reports `Closed`).
//! - **One-sided access**: a registered region is a memfd of its own,
//!   passed over the socket and mapped by the peer (`region`).
//!
//! Layout: `mem` (the only `unsafe`: mappings and atomics in them),
//! `ring` (layout and ring protocol), `ctl` (the socket: handshake,
//! descriptor passing), `region`, `acceptor`, `port` (server data
//! path), `endpoint` (client data path).

#![allow(unsafe_code)]

mod acceptor;
mod ctl;
mod endpoint;
mod mem;
mod port;
mod region;
mod ring;

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use fabrickv_transport::{Capabilities, Endpoint, Listening, Result, TransportError, WorkerPort};

pub use endpoint::{Scribbler, ShmEndpoint};
pub use region::{PEER_REGIONS_MAX, REGIONS_MAX, REGION_BYTES_MAX};
pub use ring::{CONN_SHM_BYTES, HEADER_BYTES, RECORD_HEADER_BYTES, RING_BYTES};

/// Prefix of the abstract unix socket name a server listens on.
pub const SOCKET_NAME_PREFIX: &str = "fabrickv-shm-";

/// Longest `NAME` in `shm://NAME`, in bytes (the socket name must fit in
/// `sun_path`, 108 bytes).
pub const NAME_BYTES_MAX: usize = 64;

/// Most shared-memory connections one server accepts at once, over all
/// workers: each holds `CONN_SHM_BYTES` (8 MiB) of shared memory, so this
/// bounds the server's shared memory at 2 GiB.
pub const SHM_CONNECTIONS_MAX: usize = 256;

/// How long a receiver with nothing to do spins before it sleeps, in
/// microseconds: long enough to catch the next message of a busy peer
/// without a wake-up, short enough that an idle process costs nothing.
pub const IDLE_SPIN_US: u64 = 50;

/// How often a busy side looks at its unix sockets (peer gone, regions
/// announced) while it never sleeps, in microseconds.
pub const CONTROL_CHECK_INTERVAL_US: u64 = 1_000;

const _: () = assert!(SHM_CONNECTIONS_MAX <= fabrickv_types::limits::CONNECTIONS_MAX);
const _: () = assert!(SOCKET_NAME_PREFIX.len() + NAME_BYTES_MAX <= 107);

/// What every shm connection offers: regions are memfds mapped by the
/// peer, so both sides read and write them, and a reply can lend the
/// client's mapped memory in place.
pub const SHM_CAPABILITIES: Capabilities = Capabilities {
    remote_view: true,
    ..Capabilities::ONE_SIDED
};

/// Makes `shm://NAME` addresses work with `fabrickv_transport::listen` and
/// `connect`. Idempotent.
pub fn install() {
    fabrickv_transport::register_scheme("shm", listen_with, connect);
}

/// The abstract socket address for `shm://name`.
fn socket_addr(name: &str) -> Result<SocketAddr> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX || name.contains('\0') {
        return Err(TransportError::BadAddress(format!("shm://{name}")));
    }
    let full = format!("{SOCKET_NAME_PREFIX}{name}");
    SocketAddr::from_abstract_name(full.as_bytes())
        .map_err(|_| TransportError::BadAddress(format!("shm://{name}")))
}

/// Listens on `shm://name` with `workers` worker ports, for processes of
/// the server's user, with no secret.
pub fn listen(name: &str, workers: usize) -> Result<Listening> {
    listen_with(name, &fabrickv_transport::ListenOptions::workers(workers))
}

/// Listens on `shm://name` as `opts` say.
pub fn listen_with(name: &str, opts: &fabrickv_transport::ListenOptions) -> Result<Listening> {
    let workers = opts.workers;
    let addr = socket_addr(name)?;
    let listener = UnixListener::bind_addr(&addr).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            TransportError::Refused(format!("shm://{name} is already listening"))
        } else {
            e.into()
        }
    })?;
    listener.set_nonblocking(true)?;
    let open = Arc::new(AtomicUsize::new(0));
    let mut shm_ports = Vec::with_capacity(workers);
    let mut handoffs = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (port, handoff) = port::ShmPort::new(open.clone())?;
        shm_ports.push(port);
        handoffs.push(handoff);
    }
    let board =
        fabrickv_transport::idle::IdleBoard::new(shm_ports.iter().map(WorkerPort::waker).collect());
    let mut ports: Vec<Box<dyn WorkerPort>> = Vec::with_capacity(workers);
    for (i, mut port) in shm_ports.into_iter().enumerate() {
        port.set_idle_board(board.clone(), i);
        ports.push(Box::new(port));
    }
    let acceptor = acceptor::ShmAcceptor::new(listener, name, handoffs, open, board, opts)?;
    Ok(Listening {
        local_addr: format!("shm://{name}"),
        acceptor: Box::new(acceptor),
        ports,
    })
}

/// Connects to worker `worker` of the server at `shm://name`.
pub fn connect(
    name: &str,
    worker: u16,
    dial: &fabrickv_transport::Dial,
) -> Result<Box<dyn Endpoint>> {
    Ok(Box::new(ShmEndpoint::connect_with(name, worker, dial)?))
}
