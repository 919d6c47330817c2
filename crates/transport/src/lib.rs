//! The transport contract, and the `inproc` and `tcp` transports.
//!
//! A transport moves whole messages (opaque byte strings of at most
//! `MESSAGE_BYTES_MAX` bytes) over reliable, ordered connections, in the
//! style of RDMA verbs so the same server code can later run on real
//! fabrics:
//! - senders *post* many messages and *flush* once (one syscall or one
//!   doorbell per burst);
//! - receivers *poll* completed messages in bursts and may *wait* (block)
//!   when idle so an idle server costs no CPU;
//! - each connection is bound at connect time to one server *worker*
//!   (a data-path thread): the client chooses the worker, as an RDMA client
//!   connects a queue pair to one server thread.
//!
//! Layout:
//! - this file: the traits ([`Endpoint`] on the client, [`WorkerPort`] and
//!   [`Acceptor`] on the server), what a connection can do
//!   ([`Capabilities`]), and errors;
//! - `address`: [`listen`]/[`connect`], which pick an implementation from
//!   the address scheme, and the registry of schemes from other crates;
//! - [`framing`]: sans-I/O length-prefix framing for byte-stream transports;
//! - [`handshake`]: sans-I/O server side of every transport's connection
//!   handshake (the bounded, timed table of pending openings and how an opening
//!   is judged), and the client's check of the answer;
//! - [`inproc`]: the in-process mock (channels, for tests);
//! - [`tcp`]: mio/epoll on the server, blocking sockets on the client.

use std::fmt;
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod address;
#[cfg(feature = "conformance")]
#[allow(clippy::unwrap_used)]
pub mod conformance;
#[cfg(feature = "conformance")]
pub mod conformance_evict;
#[cfg(feature = "conformance")]
pub mod conformance_idle;
pub mod framing;
pub mod handshake;
pub mod idle;
pub mod inproc;
pub mod tcp;

pub use address::{
    connect, connect_with, listen, listen_with, register_scheme, Address, ConnectFn, Dial,
    ListenFn, ListenOptions,
};

/// Identifies a connection within one worker port.
pub type ConnId = u32;

/// What a worker runs on each received message: the connection, the
/// message, and the reply to build.
pub type MessageHandler<'a> = dyn FnMut(ConnId, &[u8], &mut dyn Reply) + 'a;

/// Bytes a reply refers to instead of copying them (a leased value): the
/// transport keeps them alive until they have been sent. "Sent" means
/// handed to the kernel: a tcp worker splices large ones, and the socket
/// may still read their pages after they are dropped
/// ([`tcp::SPLICE_PART_BYTES_MIN`]).
pub type SharedBytes = Box<dyn AsRef<[u8]> + Send>;

/// The answer a handler builds for one message: the reply message, and
/// one-sided writes into the requesting peer's registered memory that land
/// before the reply does (so the reply can announce them, as an RDMA
/// write followed by a send).
pub trait Reply {
    /// The reply message; whatever is appended is sent as one message
    /// (nothing appended, nothing sent).
    fn buf(&mut self) -> &mut Vec<u8>;

    /// Appends `bytes` to the reply message at this point, as if copied
    /// into [`Reply::buf`] (bytes appended to `buf` later follow them). A
    /// transport that writes vectored (tcp) keeps `bytes` until they are
    /// sent and writes them from their own memory, saving the copy of a
    /// large value into the reply; the default copies. `buf().len()` does
    /// not count them: a frame encoder that patches lengths or checksums
    /// over `buf` accounts for them itself.
    fn append_shared(&mut self, bytes: SharedBytes) {
        let b: &[u8] = (*bytes).as_ref();
        self.buf().extend_from_slice(b);
    }

    /// What this reply's connection offers: the one-sided calls below
    /// work only where it says so.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    /// Writes `data` into a region the requesting peer registered, at
    /// `offset`; in place before the peer receives this reply.
    fn write_remote(&mut self, _region: &RemoteRegion, _offset: usize, _data: &[u8]) -> Result<()> {
        Err(TransportError::Unsupported("one-sided write"))
    }

    /// Reads `out.len()` bytes of a region the requesting peer registered,
    /// at `offset` (a one-sided READ: a PUT whose value waits in the
    /// client's memory).
    fn read_remote(
        &mut self,
        _region: &RemoteRegion,
        _offset: usize,
        _out: &mut [u8],
    ) -> Result<()> {
        Err(TransportError::Unsupported("one-sided read"))
    }

    /// Lends `len` bytes of the requesting peer's registered region at
    /// `offset`, where the transport maps the peer's memory (shm), so a
    /// handler can build a large result in place instead of staging it
    /// and copying it with [`Reply::write_remote`]. Bounds and key are
    /// checked before anything is lent. `Ok(None)`: this transport has no
    /// such view; use `write_remote`. Whatever is written is in place
    /// before the peer receives this reply.
    fn remote_mut(
        &mut self,
        _region: &RemoteRegion,
        _offset: usize,
        _len: usize,
    ) -> Result<Option<&mut [u8]>> {
        Ok(None)
    }
}

/// A bare buffer is a reply with no one-sided writes.
impl Reply for Vec<u8> {
    fn buf(&mut self) -> &mut Vec<u8> {
        self
    }
}

/// Wakes a blocked [`WorkerPort::wait`] or [`Acceptor::run`] from another
/// thread, for shutdown.
#[derive(Clone)]
pub struct Waker(Arc<dyn Fn() + Send + Sync>);

impl Waker {
    /// Wraps a wake function.
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> Waker {
        Waker(Arc::new(f))
    }

    /// Wakes through a mio waker (the tcp port and acceptor, fabric's
    /// port): each owner polls a mio `Poll` the waker belongs to.
    pub fn from_mio(w: Arc<mio::Waker>) -> Waker {
        Waker::new(move || {
            let _ = w.wake();
        })
    }

    /// Wakes the owner.
    pub fn wake(&self) {
        (self.0)()
    }
}

impl fmt::Debug for Waker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Waker")
    }
}

/// `d` as the timespec that `poll`/`epoll_wait` take (saturating at the
/// longest one they can express): every transport blocks through one of
/// them.
pub fn timespec(d: Duration) -> rustix::event::Timespec {
    rustix::event::Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

/// Why a transport operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum TransportError {
    /// The address does not name a transport this build has.
    BadAddress(String),
    /// An operating-system error.
    Io(io::Error),
    /// The peer closed the connection.
    Closed,
    /// The server refused the connection (unknown worker, too many
    /// connections, incompatible version).
    Refused(String),
    /// A message is empty or larger than `MESSAGE_BYTES_MAX`.
    MessageTooLarge(usize),
    /// The byte stream broke the framing rules; the connection is unusable.
    Framing(String),
    /// A blocking step did not finish in time.
    Timeout,
    /// The transport does not offer this operation.
    Unsupported(&'static str),
    /// A one-sided access names a region this connection does not know, or
    /// falls outside it; nothing was read or written.
    BadRegion(String),
    /// The server refused this client's authentication (`AUTH_REQUIRED`,
    /// `AUTH_FAILED`, `PEER_NOT_ALLOWED`), with what to do about it.
    Denied(fabrickv_types::ErrorCode, String),
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::BadAddress(a) => {
                write!(f, "bad address {a:?}: expected HOST:PORT, tcp://HOST:PORT")
                    .and_then(|()| address::write_registered_schemes(f))
            }
            TransportError::Io(e) => write!(f, "{e}"),
            TransportError::Closed => write!(f, "connection closed by peer"),
            TransportError::Refused(why) => write!(f, "connection refused: {why}"),
            TransportError::MessageTooLarge(n) => write!(
                f,
                "message of {n} bytes is empty or exceeds {} bytes",
                fabrickv_types::limits::MESSAGE_BYTES_MAX
            ),
            TransportError::Framing(why) => write!(f, "framing error: {why}"),
            TransportError::Timeout => write!(f, "timed out"),
            TransportError::Unsupported(what) => {
                write!(f, "{what} is not supported by this transport")
            }
            TransportError::BadRegion(why) => write!(f, "bad one-sided access: {why}"),
            TransportError::Denied(code, why) => write!(f, "{why} ({})", code.name()),
        }
    }
}

impl std::error::Error for TransportError {}

impl From<io::Error> for TransportError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => TransportError::Timeout,
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => TransportError::Closed,
            _ => TransportError::Io(e),
        }
    }
}

/// Result of a transport operation.
pub type Result<T> = std::result::Result<T, TransportError>;

/// A registered memory region as its peer sees it. It travels inside
/// messages (24 bytes: addr, len, key, little-endian) so that the peer can
/// read or write the region one-sided, as with an RDMA memory key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// Transport-defined address of the region's first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Transport-defined key that grants access.
    pub key: u64,
}

impl RemoteRegion {
    /// Bytes of the encoded form.
    pub const ENCODED_BYTES: usize = 24;

    /// Appends the 24-byte encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.addr.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.key.to_le_bytes());
    }

    /// Reads the 24-byte encoding.
    pub fn decode(b: &[u8]) -> Option<RemoteRegion> {
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?))
        };
        Some(RemoteRegion {
            addr: word(0)?,
            len: word(8)?,
            key: word(16)?,
        })
    }

    /// Checks that `offset..offset+len` lies inside the region.
    pub fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end as u64 <= self.len => Ok(()),
            _ => Err(TransportError::BadRegion(format!(
                "{len} bytes at offset {offset} overrun a region of {} bytes",
                self.len
            ))),
        }
    }
}

/// What a connection offers beyond two-sided messages, so that a caller
/// chooses its path up front (a client registers a buffer, a server
/// writes a value one-sided) instead of trying and matching on
/// [`TransportError::Unsupported`]. The answer holds for the connection's
/// life; fabric's depends on the provider (`FI_RMA`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// `register` and `local_region` work: this side can expose memory
    /// for its peer to read and write one-sided.
    pub memory_registration: bool,
    /// `write_remote` works: this side can write a region its peer
    /// registered.
    pub one_sided_write: bool,
    /// `read_remote` works: this side can read a region its peer
    /// registered.
    pub one_sided_read: bool,
    /// [`Reply::remote_mut`] lends the peer's registered memory in place
    /// (shm maps it), so a handler can build a result there with no copy.
    pub remote_view: bool,
}

impl Capabilities {
    /// Messages only (inproc, tcp).
    pub const NONE: Capabilities = Capabilities {
        memory_registration: false,
        one_sided_write: false,
        one_sided_read: false,
        remote_view: false,
    };

    /// Registration and one-sided reads and writes (fabric with `FI_RMA`).
    pub const ONE_SIDED: Capabilities = Capabilities {
        memory_registration: true,
        one_sided_write: true,
        one_sided_read: true,
        remote_view: false,
    };

    /// True if registration, one-sided write and one-sided read all work.
    pub fn one_sided(&self) -> bool {
        self.memory_registration && self.one_sided_write && self.one_sided_read
    }
}

/// Longest head [`Endpoint::recv_split`] shows its sink before the sink
/// says where the rest of the message goes, in bytes. A head is parsed
/// from the endpoint's own buffer; it is meant for a frame header and a
/// few fields, and a longer one would stage what the split is there to
/// keep out of that buffer.
pub const SPLIT_HEAD_BYTES_MAX: usize = 4096;

/// Where [`Endpoint::recv_split`] puts the message it receives: the
/// sink sees the message's head and chooses a place for its tail, so that
/// a large payload can land where it belongs with no staging copy (over
/// tcp it is read from the socket straight into that place).
pub trait SplitSink {
    /// Sees the first `head.len()` bytes of a message of `len` bytes
    /// (always `len > head.len()`) and says where the other
    /// `len - head.len()` go: a slice at least that long, whose first
    /// `len - head.len()` bytes are then written, or `None` to take the
    /// message whole through [`SplitSink::whole`]. A slice too short for
    /// the tail is never written: the message is then taken whole.
    fn tail(&mut self, head: &[u8], len: usize) -> Option<&mut [u8]>;

    /// A message taken whole: no longer than the head, refused by
    /// [`SplitSink::tail`], or given too short a slice. Whatever `tail`
    /// noted for this message is stale.
    fn whole(&mut self, msg: &[u8]);
}

/// What [`Endpoint::recv_split`] did with the message it received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landed {
    /// Handed whole to [`SplitSink::whole`].
    Whole,
    /// Head shown to [`SplitSink::tail`], tail written into the slice it
    /// returned.
    Split,
}

/// Hands one received message to `sink`: split at `head_bytes` if the
/// sink gives its tail a place long enough, else whole. The copying
/// implementation behind the default [`Endpoint::recv_split`].
pub fn deliver_split(msg: &[u8], head_bytes: usize, sink: &mut dyn SplitSink) -> Landed {
    if msg.len() > head_bytes {
        let (head, rest) = msg.split_at(head_bytes);
        if let Some(place) = sink.tail(head, msg.len()) {
            if let Some(dst) = place.get_mut(..rest.len()) {
                dst.copy_from_slice(rest);
                return Landed::Split;
            }
        }
    }
    sink.whole(msg);
    Landed::Whole
}

/// Checks the head length given to [`Endpoint::recv_split`].
pub fn check_split_head(head_bytes: usize) -> Result<()> {
    if head_bytes == 0 || head_bytes > SPLIT_HEAD_BYTES_MAX {
        return Err(TransportError::Unsupported(
            "a split head of 0 or more than SPLIT_HEAD_BYTES_MAX bytes",
        ));
    }
    Ok(())
}

/// The client side of one connection, bound to one server worker.
pub trait Endpoint: Send {
    /// Queues one message that `build` appends to the given buffer; nothing
    /// is sent until [`Endpoint::flush`]. A message must not be empty.
    fn post_with(&mut self, build: &mut dyn FnMut(&mut Vec<u8>)) -> Result<()>;

    /// Queues a copy of `msg`.
    fn post(&mut self, msg: &[u8]) -> Result<()> {
        self.post_with(&mut |b| b.extend_from_slice(msg))
    }

    /// Sends everything queued. Blocks at most `timeout` if the peer is not
    /// reading, receiving (and buffering) its replies meanwhile so that the
    /// two sides never wait on each other.
    fn flush(&mut self, timeout: Duration) -> Result<()>;

    /// Hands up to `max` received messages to `on_msg` without blocking;
    /// returns how many.
    fn poll(&mut self, max: usize, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize>;

    /// Blocks until a message may be ready or `timeout` passes. Returning
    /// is not a promise that [`Endpoint::poll`] will find a message.
    fn wait(&mut self, timeout: Duration) -> Result<()>;

    /// Whether the server has already closed this connection, as far as
    /// can be seen without consuming anything (a received end-of-file).
    /// A client asks before it sends on a connection that has been quiet,
    /// so that one the server closed as idle is dialled again before a
    /// request goes into it, never after. `false` where a transport
    /// cannot tell.
    fn peer_closed(&mut self) -> bool {
        false
    }

    /// Receives the next message, waiting at most `timeout`, and hands it
    /// to `sink`: its first `head_bytes` bytes (at most
    /// [`SPLIT_HEAD_BYTES_MAX`]) to [`SplitSink::tail`], the rest into
    /// the slice that returns; or the message whole. The default polls
    /// and copies; a byte-stream transport reads the tail from the wire
    /// straight into the slice. On an error the slice may hold part of
    /// the tail, and that message is lost (the connection stays framed).
    fn recv_split(
        &mut self,
        head_bytes: usize,
        timeout: Duration,
        sink: &mut dyn SplitSink,
    ) -> Result<Landed> {
        check_split_head(head_bytes)?;
        let deadline = Instant::now() + timeout;
        loop {
            let mut landed = None;
            self.poll(1, &mut |m| {
                landed = Some(deliver_split(m, head_bytes, sink))
            })?;
            if let Some(l) = landed {
                return Ok(l);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TransportError::Timeout);
            }
            self.wait(left)?;
        }
    }

    /// What this connection offers: the registration and one-sided
    /// calls below work only where it says so.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    /// Registers `len` zeroed bytes that the peer may read and write
    /// one-sided; send the returned descriptor to the peer in a message.
    fn register(&mut self, _len: usize) -> Result<RemoteRegion> {
        Err(TransportError::Unsupported("memory registration"))
    }

    /// This side's view of a region it registered.
    fn local_region(&mut self, _region: &RemoteRegion) -> Result<&mut [u8]> {
        Err(TransportError::Unsupported("memory registration"))
    }

    /// Writes `data` into the peer's registered region at `offset`. The
    /// bytes are in place before the peer receives any message this side
    /// posts after the call.
    fn write_remote(&mut self, _region: &RemoteRegion, _offset: usize, _data: &[u8]) -> Result<()> {
        Err(TransportError::Unsupported("one-sided write"))
    }

    /// Reads the peer's registered region at `offset` into `out`; returns
    /// when the bytes are in `out`.
    fn read_remote(
        &mut self,
        _region: &RemoteRegion,
        _offset: usize,
        _out: &mut [u8],
    ) -> Result<()> {
        Err(TransportError::Unsupported("one-sided read"))
    }
}

/// Counters of one worker port; every field counts since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Connections handed to this worker.
    pub conns_accepted: u64,
    /// Connections open now.
    pub conns_open: u64,
    /// Connections closed because their byte stream broke the framing.
    pub conns_closed_framing: u64,
    /// Connections closed because a message stalled half-received
    /// (slow-loris bound) for longer than `PARTIAL_MESSAGE_TIMEOUT_MS`.
    pub conns_closed_timeout: u64,
    /// Messages received.
    pub msgs_in: u64,
    /// Messages sent.
    pub msgs_out: u64,
    /// Times a connection's reading was paused because its client did not
    /// read its replies (`CONN_SEND_QUEUE_BYTES_MAX`).
    pub backpressure_pauses: u64,
    /// Reply bytes sent zero-copy from their own memory (tcp: spliced).
    pub spliced_bytes: u64,
}

/// The server side of one worker: all connections bound to that worker,
/// polled together.
pub trait WorkerPort: Send {
    /// Calls `handler(conn, message, reply)` for up to `max` received
    /// messages. Whatever the handler appends to `reply.buf()` is sent back
    /// on the same connection as one message (nothing appended, nothing
    /// sent), after the one-sided writes it made through `reply`.
    /// Replies are queued until [`WorkerPort::flush`]. Returns how many
    /// messages were handled.
    fn poll(&mut self, max: usize, handler: &mut MessageHandler<'_>) -> Result<usize>;

    /// Sends every queued reply: one write per connection with output.
    fn flush(&mut self) -> Result<()>;

    /// Whether [`WorkerPort::flush_except`] keeps replies back here. A
    /// replicating server's worker then holds the replies that wait for
    /// their writes to be replicated and goes on serving its other
    /// connections; on a port that cannot, it waits before every flush.
    fn holds_replies(&self) -> bool {
        false
    }

    /// Sends the queued replies of every connection except those in
    /// `held` (sorted, so a port looks a connection up by binary search),
    /// whose replies stay queued, in order, for a later flush.
    /// Called only where [`WorkerPort::holds_replies`] says so; a port
    /// that does not hold replies sends everything.
    fn flush_except(&mut self, held: &[ConnId]) -> Result<()> {
        let _ = held;
        self.flush()
    }

    /// A descriptor that becomes readable when the port may have input
    /// (and when its [`Waker`] is woken), for a worker that waits on
    /// something else as well; `None` where the port has no one such
    /// descriptor.
    fn input_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// Blocks until there may be work or `timeout` passes.
    fn wait(&mut self, timeout: Duration) -> Result<()>;

    /// A handle that interrupts [`WorkerPort::wait`] from another thread.
    fn waker(&self) -> Waker;

    /// Closes each connection that has sent nothing for `timeout` and has
    /// nothing in flight (no request buffered or being handled, no reply
    /// waiting to be sent), counted in `conns_closed_timeout`; `None`, the
    /// default, keeps idle connections open. Without it a few thousand
    /// idle connections hold every slot of `CONNECTIONS_MAX` for good.
    /// Ports that do not implement it keep every connection.
    fn set_idle_timeout(&mut self, _timeout: Option<Duration>) {}

    /// This port's counters.
    fn stats(&self) -> PortStats;

    /// Operations a worker handles before it flushes while messages keep
    /// coming: how much work one flush is worth here. A flush that costs
    /// a system call per connection (tcp: [`tcp::TCP_FLUSH_AFTER_OPS`])
    /// is worth many operations; one that publishes to a ring is cheap,
    /// and flushing after every poll lets a client read replies while its
    /// later requests run. The default, 0: flush after every poll.
    fn flush_after_ops(&self) -> usize {
        0
    }

    /// What this port's connections offer: the registration and
    /// one-sided calls below, and those of the replies it hands its
    /// handler, work only where it says so.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    /// Registers `len` zeroed bytes that the worker's peers may read and
    /// write one-sided (each peer is told the descriptor in a message).
    fn register(&mut self, _len: usize) -> Result<RemoteRegion> {
        Err(TransportError::Unsupported("memory registration"))
    }

    /// The worker's view of a region it registered.
    fn local_region(&mut self, _region: &RemoteRegion) -> Result<&mut [u8]> {
        Err(TransportError::Unsupported("memory registration"))
    }

    /// Writes `data` into a region that the peer on `conn` registered, at
    /// `offset`. The bytes are in place before that peer receives any reply
    /// queued after the call (so a reply can announce them).
    fn write_remote(
        &mut self,
        _conn: ConnId,
        _region: &RemoteRegion,
        _offset: usize,
        _data: &[u8],
    ) -> Result<()> {
        Err(TransportError::Unsupported("one-sided write"))
    }

    /// Reads `out.len()` bytes of a region that the peer on `conn`
    /// registered, at `offset`.
    fn read_remote(
        &mut self,
        _conn: ConnId,
        _region: &RemoteRegion,
        _offset: usize,
        _out: &mut [u8],
    ) -> Result<()> {
        Err(TransportError::Unsupported("one-sided read"))
    }
}

/// One round over the connections with work (`ready`, in order) for port
/// implementations: `service(conn, budget)` handles up to `budget`
/// messages of one connection and says how many and whether it has more.
/// The round stops spending at `max` messages; connections not reached
/// stay ready first, then those served that have more (round robin).
/// Returns the messages handled and the connections still ready.
pub fn serve_ready<E>(
    mut ready: Vec<usize>,
    max: usize,
    mut service: impl FnMut(usize, usize) -> std::result::Result<(usize, bool), E>,
) -> std::result::Result<(usize, Vec<usize>), E> {
    let mut handled = 0;
    // The connections served this burst are a prefix of `ready`; those
    // still ready are compacted to its front, `again` of them.
    let mut served = 0;
    let mut again = 0;
    while served < ready.len() && handled < max {
        let conn = ready[served];
        let (n, more) = service(conn, max - handled)?;
        handled += n;
        served += 1;
        if more {
            ready[again] = conn;
            again += 1;
        }
    }
    // Served connections that are still ready go behind the ones this
    // burst did not reach, so a few busy connections cannot starve the
    // rest when the burst is short (round robin across bursts).
    ready.drain(again..served);
    ready.rotate_left(again);
    Ok((handled, ready))
}

/// The slot in a port's connection table (`conns`, with its list of
/// freed slots `free`) for a connection being adopted: the last one
/// freed, else a new one at the end, so the table grows only to the most
/// connections ever open at once. Once per connection, never per message.
pub fn vacant_slot<C>(conns: &mut Vec<Option<C>>, free: &mut Vec<usize>) -> usize {
    free.pop().unwrap_or_else(|| {
        conns.push(None);
        conns.len() - 1
    })
}

/// Accepts connections and hands each to the worker it asked for.
pub trait Acceptor: Send {
    /// Runs until `stop` is set and the acceptor's waker is called.
    fn run(&mut self, stop: &AtomicBool) -> Result<()>;

    /// A handle that interrupts [`Acceptor::run`].
    fn waker(&self) -> Waker;
}

/// A server transport that is listening: the acceptor (to run on a thread
/// of its own) and one port per worker.
pub struct Listening {
    /// The address clients connect to, port resolved (`tcp://127.0.0.1:7379`).
    pub local_addr: String,
    /// Runs the handshakes; give it a thread.
    pub acceptor: Box<dyn Acceptor>,
    /// One per worker, in worker order.
    pub ports: Vec<Box<dyn WorkerPort>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vacant_slot_reuses_the_last_freed_before_growing() {
        let mut conns: Vec<Option<u8>> = Vec::new();
        let mut free = Vec::new();
        for want in 0..3 {
            let slot = vacant_slot(&mut conns, &mut free);
            assert_eq!(slot, want);
            conns[slot] = Some(0);
        }
        free.extend([0, 2]);
        assert_eq!(vacant_slot(&mut conns, &mut free), 2);
        assert_eq!(vacant_slot(&mut conns, &mut free), 0);
        assert_eq!(vacant_slot(&mut conns, &mut free), 3, "none free: grows");
        assert_eq!(conns.len(), 4);
    }

    #[test]
    fn serve_ready_is_round_robin_under_a_short_burst() {
        // Every connection always has more; a burst of 2 messages serves
        // one message each of two connections, then the next two, ...
        let mut ready = vec![1, 2, 3, 4, 5];
        let mut seen = Vec::new();
        for _ in 0..5 {
            let (n, next) = serve_ready(ready, 2, |c, _| {
                seen.push(c);
                Ok::<_, ()>((1, true))
            })
            .expect("no error");
            assert_eq!(n, 2);
            ready = next;
            assert_eq!(ready.len(), 5, "no connection is dropped");
        }
        assert_eq!(seen, vec![1, 2, 3, 4, 5, 1, 2, 3, 4, 5]);
        // Connections with nothing more leave the list.
        let (n, rest) =
            serve_ready(vec![7, 8, 9], 10, |c, _| Ok::<_, ()>((1, c == 8))).expect("no error");
        assert_eq!((n, rest), (3, vec![8]));
    }

    /// An endpoint holding received messages, to test the default
    /// `recv_split` (the one inproc, shm and fabric use).
    struct Queued(std::collections::VecDeque<Vec<u8>>);

    impl Endpoint for Queued {
        fn post_with(&mut self, _build: &mut dyn FnMut(&mut Vec<u8>)) -> Result<()> {
            Ok(())
        }

        fn flush(&mut self, _timeout: Duration) -> Result<()> {
            Ok(())
        }

        fn poll(&mut self, max: usize, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize> {
            let mut n = 0;
            while n < max {
                let Some(m) = self.0.pop_front() else { break };
                on_msg(&m);
                n += 1;
            }
            Ok(n)
        }

        fn wait(&mut self, _timeout: Duration) -> Result<()> {
            Ok(())
        }
    }

    /// Gives every tail the front of `dst` (or nothing), keeps wholes.
    struct Sink {
        dst: Vec<u8>,
        refuse: bool,
        wholes: Vec<Vec<u8>>,
    }

    impl SplitSink for Sink {
        fn tail(&mut self, _head: &[u8], _len: usize) -> Option<&mut [u8]> {
            (!self.refuse).then_some(&mut self.dst[..])
        }

        fn whole(&mut self, msg: &[u8]) {
            self.wholes.push(msg.to_vec());
        }
    }

    #[test]
    fn default_recv_split_copies_and_checks_the_slice_first() {
        let msgs = [
            vec![1u8; 10],
            vec![2u8; 100],
            vec![3u8; 100],
            vec![4u8; 101],
        ];
        let mut ep = Queued(msgs.iter().cloned().collect());
        let mut sink = Sink {
            dst: vec![0; 90],
            refuse: false,
            wholes: Vec::new(),
        };
        let t = Duration::from_millis(10);
        // No longer than the head: whole.
        assert_eq!(ep.recv_split(10, t, &mut sink).ok(), Some(Landed::Whole));
        // A tail of exactly the slice's length: split.
        assert_eq!(ep.recv_split(10, t, &mut sink).ok(), Some(Landed::Split));
        assert_eq!(sink.dst, vec![2u8; 90]);
        sink.refuse = true;
        assert_eq!(ep.recv_split(10, t, &mut sink).ok(), Some(Landed::Whole));
        // A tail one byte longer than the slice: the slice is untouched.
        sink.refuse = false;
        sink.dst = vec![0; 90];
        assert_eq!(ep.recv_split(10, t, &mut sink).ok(), Some(Landed::Whole));
        assert_eq!(sink.dst, vec![0u8; 90]);
        assert_eq!(
            sink.wholes,
            vec![msgs[0].clone(), msgs[2].clone(), msgs[3].clone()]
        );
        // Nothing left: the deadline passes.
        assert!(matches!(
            ep.recv_split(10, Duration::ZERO, &mut sink),
            Err(TransportError::Timeout)
        ));
        assert!(matches!(
            ep.recv_split(SPLIT_HEAD_BYTES_MAX + 1, t, &mut sink),
            Err(TransportError::Unsupported(_))
        ));
    }
}
