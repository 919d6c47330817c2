//! The memcache front end's sockets: the shared loop of [`crate::text_socket`]
//! over [`McConnState`], everything else in [`crate::memcache`]. It uses none
//! of the loop's RESP hooks: memcached's text protocol has no
//! authentication (so no AUTH parking), no CLIENT KILL, and its values stay
//! in the input and output buffers.

use std::sync::Arc;

use mio::net::TcpStream;
use mio::Waker;

use fabrickv_memcache::MC_COMMAND_BYTES_MAX;

use crate::memcache::{McConnState, McShared};
use crate::text_socket::{conn_counters, Counters, Io, Proto};

/// Most memcache connections open at once over all threads (memcached's
/// `-c` defaults to 1024; FabricKV's native limit is the same as this).
pub const MC_CONNECTIONS_MAX: usize = fabrickv_types::limits::CONNECTIONS_MAX;

/// Bytes asked of the kernel per read, and the initial input buffer size.
pub const MC_READ_CHUNK_BYTES: usize = 16 << 10;

/// Largest input buffer of one connection, in bytes: one command at the
/// parser's bound plus a read's worth.
pub const MC_INPUT_BYTES_MAX: usize = MC_COMMAND_BYTES_MAX + MC_READ_CHUNK_BYTES;

/// A buffer grown past this is given back once empty, in bytes, so one
/// large value does not pin memory to an idle connection.
pub const MC_IDLE_BUFFER_BYTES_MAX: usize = 64 << 10;

/// How long a loop keeps polling without blocking after its last event,
/// in microseconds. Each poll is an `epoll_wait` system call, so spinning
/// costs server CPU whenever the client is the slower side; the shared
/// loop blocks at once, as memcached does, since the memcache figure of
/// merit is operations per server CPU-second.
pub const MC_IDLE_SPIN_US: u64 = 0;
const _: () = assert!(MC_IDLE_SPIN_US == 0, "the shared loop never spins");

/// Least time a memcache connection must have been silent, with nothing
/// pending, before a newcomer at the connection cap may close it, in ms:
/// a client in the middle of its work is never the one to go, while
/// sockets opened and left silent (to fill the cap) make way.
pub const MC_EVICT_IDLE_MIN_MS: u64 = 1_000;

/// What the two memcache front ends' connections differ in: the
/// client-facing one and the peer one share everything else.
pub(crate) trait McFront: Send + 'static {
    /// The front end's name in logs.
    const NAME: &'static str;
    /// Its threads' name, before `-{index}`.
    const THREAD: &'static str;
    /// A new connection's state.
    fn open(shared: &McShared) -> Self;
    /// The protocol state.
    fn state(&mut self) -> &mut McConnState;
    /// The same, to read.
    fn state_ref(&self) -> &McConnState;
}

impl McFront for McConnState {
    const NAME: &'static str = "memcache";
    const THREAD: &'static str = "fkv-mc";

    fn open(shared: &McShared) -> McConnState {
        McConnState::new().opened_under(&shared.slot_routing)
    }

    fn state(&mut self) -> &mut McConnState {
        self
    }

    fn state_ref(&self) -> &McConnState {
        self
    }
}

/// A connection of the peer front end, where other servers of an etcd
/// cluster send the commands they forward (`ServerDesc::memcache_peer`).
/// It is the memcache protocol over the same state, on loops of its own,
/// but never forwards: a key of a slot this server does not lead is
/// answered `SERVER_ERROR`. Forwarding blocks a loop for the owner's
/// answer; were forwarded commands served by the loops that forward, two
/// servers forwarding to each other at once would each wait on the other.
pub(crate) struct McPeerConn(McConnState);

impl McFront for McPeerConn {
    const NAME: &'static str = "memcache peer";
    const THREAD: &'static str = "fkv-mcpeer";

    fn open(_: &McShared) -> McPeerConn {
        McPeerConn(McConnState::forwarded_to())
    }

    fn state(&mut self) -> &mut McConnState {
        &mut self.0
    }

    fn state_ref(&self) -> &McConnState {
        &self.0
    }
}

impl<C: McFront> Proto for C {
    type Shared = McShared;
    type PerLoop = ();
    const NAME: &'static str = <C as McFront>::NAME;
    const THREAD: &'static str = <C as McFront>::THREAD;
    const CONNECTIONS_MAX: usize = MC_CONNECTIONS_MAX;
    const READ_CHUNK_BYTES: usize = MC_READ_CHUNK_BYTES;
    const INPUT_BYTES_MAX: usize = MC_INPUT_BYTES_MAX;
    const IDLE_BUFFER_BYTES_MAX: usize = MC_IDLE_BUFFER_BYTES_MAX;
    const EVICT_IDLE_MIN_MS: u64 = MC_EVICT_IDLE_MIN_MS;
    const REFUSAL: &'static [u8] = b"SERVER_ERROR too many open connections\r\n";

    fn counters(shared: &McShared) -> Counters<'_> {
        conn_counters!(shared.counters)
    }

    fn per_loop(_thread: usize, _threads: usize, _waker: &Arc<Waker>) {}

    fn connect(shared: &McShared, _: &mut (), _: &TcpStream, _: usize, _: u64) -> C {
        C::open(shared)
    }

    fn execute(&mut self, io: &mut Io, shared: &McShared, now_ms: u64) -> bool {
        let p = self
            .state()
            .process(shared, &io.input[io.start..io.end], &mut io.out, now_ms);
        io.took(p.consumed, p.need, p.close)
    }

    fn reset_out(&mut self) {
        self.state().replies_unsettled = false;
    }

    /// `get`/`gets` of keys held here whose writes are replicated, alone.
    fn replies_settled(&self) -> bool {
        !self.state_ref().replies_unsettled
    }
}
