//! The RESP front-end's sockets: the shared loop of [`crate::text_socket`]
//! over [`RespConn`], everything else in [`crate::resp`]. What is RESP's
//! alone lives here, as the loop's hooks: AUTH parking, CLIENT KILL, and
//! large values received and sent outside the buffers.
//!
//! A connection whose AUTH failed is parked, not slept on: its reply stays
//! in its buffer and its input unread until a deadline the connection state set
//! (see `RESP_AUTH_DELAY_BASE_MS`), while the loop serves its other
//! connections and wakes by that deadline to send the reply.

use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mio::net::TcpStream;
use mio::Waker;

use fabrickv_resp::limits::RESP_COMMAND_BYTES_MAX;

use fabrickv_engine::LargeValue;
use fabrickv_types::transfer::TransferClock;

use crate::resp::{ClientPeer, KillNotify, LargeBulkAt, Receiving, RespConnState, RespShared};
use crate::text_socket::{conn_counters, Counters, Io, Proto};

/// Most RESP connections open at once over all threads (Redis's default
/// `maxclients` is 10000; FabricKV's native limit is the same as this).
pub const RESP_CONNECTIONS_MAX: usize = fabrickv_types::limits::CONNECTIONS_MAX;

/// Bytes asked of the kernel per read, and the initial input buffer size.
pub const RESP_READ_CHUNK_BYTES: usize = 16 << 10;

/// Largest input buffer of one connection, in bytes: one command at the
/// parser's bound plus a read's worth. A value over 1 MiB is not read
/// into it but into its own buffer (see [`LargeIn`]).
pub const RESP_INPUT_BYTES_MAX: usize = RESP_COMMAND_BYTES_MAX + RESP_READ_CHUNK_BYTES;

/// How long a connection may stay silent in the middle of a large value
/// before it is closed, in milliseconds (as the native protocol's
/// `PARTIAL_MESSAGE_TIMEOUT_MS`): a client cannot hold its share of
/// `RESP_LARGE_RECEIVING_BYTES_MAX` by sending nothing.
pub const RESP_LARGE_STALL_MS: u64 = fabrickv_types::limits::PARTIAL_MESSAGE_TIMEOUT_MS;

/// Bytes of the empty bulk header `$0\r\n` that stands in the input
/// buffer for a large bulk received on its own.
const EMPTY_BULK_HEADER: &[u8] = b"$0\r\n";

/// Most slices one `writev` of replies takes: output bytes, a large
/// value, output bytes, a large value.
const WRITE_SLICES_MAX: usize = 4;

/// A buffer grown past this is given back once empty, in bytes, so one
/// large value does not pin memory to an idle connection.
pub const RESP_IDLE_BUFFER_BYTES_MAX: usize = 64 << 10;

/// Least time a RESP connection must have been silent, with nothing
/// pending, before a newcomer at the connection cap may close it, in ms:
/// a client in the middle of its work is never the one to go, while
/// sockets opened and left silent (to fill the cap) make way.
pub const RESP_EVICT_IDLE_MIN_MS: u64 = 1_000;

/// One loop's RESP state.
pub(crate) struct RespLoop {
    /// The next connection id: ids step by the number of loops, so each
    /// loop's are its own.
    next_id: u64,
    id_step: u64,
    /// How CLIENT KILL tells this loop one of its connections was killed.
    kill: KillNotify,
}

/// One RESP connection's protocol state, beside the loop's buffers.
pub(crate) struct RespConn {
    state: RespConnState,
    /// Nothing is written or executed before this time (engine ms; 0:
    /// not held): the delay a failed AUTH costs.
    held_until_ms: u64,
    /// The large bulk being received, if any (one per connection).
    large_in: Option<LargeIn>,
    /// Bytes of the first queued large reply already written.
    large_pos: usize,
    /// Since when (engine ms) large replies have been queued; `None`: none
    /// is.
    large_reply: Option<TransferClock>,
}

/// A large bulk being received straight from the socket into the value's
/// final buffer, which then becomes the stored value without a copy.
struct LargeIn {
    /// The value's buffer (exactly its length, lazily zeroed by the
    /// allocator), or `None` when the value was refused and its bytes are
    /// read and dropped.
    buf: Option<Vec<u8>>,
    /// Bytes received so far.
    filled: usize,
    /// Bytes announced.
    len: usize,
    /// The argument's index in its command.
    arg: usize,
    /// The error reply a refused value's command gets.
    refusal: String,
    /// This value's share of the server's receiving bound.
    receiving: Option<Receiving>,
}

impl Proto for RespConn {
    type Shared = RespShared;
    type PerLoop = RespLoop;
    const NAME: &'static str = "RESP";
    const THREAD: &'static str = "fkv-resp";
    const CONNECTIONS_MAX: usize = RESP_CONNECTIONS_MAX;
    const READ_CHUNK_BYTES: usize = RESP_READ_CHUNK_BYTES;
    const INPUT_BYTES_MAX: usize = RESP_INPUT_BYTES_MAX;
    const IDLE_BUFFER_BYTES_MAX: usize = RESP_IDLE_BUFFER_BYTES_MAX;
    const EVICT_IDLE_MIN_MS: u64 = RESP_EVICT_IDLE_MIN_MS;
    const REFUSAL: &'static [u8] = b"-ERR max number of clients reached\r\n";
    const LARGE_STALL_MS: Option<u64> = Some(RESP_LARGE_STALL_MS);

    fn counters(shared: &RespShared) -> Counters<'_> {
        conn_counters!(shared.counters)
    }

    fn per_loop(thread: usize, threads: usize, waker: &Arc<Waker>) -> RespLoop {
        RespLoop {
            next_id: thread as u64 + 1,
            id_step: threads as u64,
            kill: KillNotify {
                pending: Arc::new(AtomicBool::new(false)),
                waker: waker.clone(),
            },
        }
    }

    fn connect(
        shared: &RespShared,
        lp: &mut RespLoop,
        stream: &TcpStream,
        _slot: usize,
        now_ms: u64,
    ) -> RespConn {
        let id = lp.next_id;
        lp.next_id += lp.id_step;
        let peer = ClientPeer {
            addr: stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            laddr: stream
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            fd: i64::from(stream.as_raw_fd()),
            now_ms,
            kill: Some(lp.kill.clone()),
        };
        RespConn {
            state: RespConnState::connected(shared, id, peer),
            held_until_ms: 0,
            large_in: None,
            large_pos: 0,
            large_reply: None,
        }
    }

    /// Parks on a failed AUTH, and starts receiving a large bulk where
    /// parsing stopped at one.
    fn execute(&mut self, io: &mut Io, shared: &RespShared, now_ms: u64) -> bool {
        if self.large_in.is_some() || self.held_until_ms > now_ms {
            return false;
        }
        let base = io.start;
        let p = self
            .state
            .process(shared, &io.input[io.start..io.end], &mut io.out, now_ms);
        let more = io.took(p.consumed, p.need, p.close);
        if self.large_reply.is_none() && !self.state.large_out.queue.is_empty() {
            self.large_reply = Some(TransferClock::start(now_ms));
        }
        if let Some(until) = p.hold_until_ms {
            self.held_until_ms = until;
            return false;
        }
        if let (Some(at), false) = (p.large, p.close) {
            self.begin_large(io, shared, base, at);
            // Parse again at once if the whole value was already here.
            return self.large_in.is_none();
        }
        more
    }

    /// CONFIG SET timeout changes the idle timeout live.
    fn set_idle_timeout(shared: &RespShared, ms: u64) {
        shared.idle_timeout_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_timeout_ms(shared: &RespShared, _started: u64) -> u64 {
        shared.idle_timeout_ms.load(Ordering::Relaxed)
    }

    fn take_killed(lp: &RespLoop) -> bool {
        lp.kill.pending.swap(false, Ordering::AcqRel)
    }

    fn killed(&self) -> bool {
        self.state.killed()
    }

    fn authenticated(&self) -> bool {
        self.state.authenticated()
    }

    fn held_until_ms(&self) -> u64 {
        self.held_until_ms
    }

    /// A queued transaction. A large value being received is not counted:
    /// it holds a share of `RESP_LARGE_RECEIVING_BYTES_MAX`, reserved
    /// before its buffer is allocated and refused with an error past it,
    /// so that a value up to Redis's 512 MiB is received whatever
    /// `maxmemory-clients` is.
    fn held_bytes(&self) -> usize {
        self.state.held_bytes()
    }

    fn receiving(&self) -> bool {
        self.large_in.is_some()
    }

    fn large_reply_ms(shared: &RespShared) -> u64 {
        shared.large_reply_ms
    }

    fn large_reply(&self) -> Option<TransferClock> {
        self.large_reply
    }

    /// Reads more of the large bulk being received, straight into its
    /// buffer (or into a scratch buffer, dropped, when refused).
    fn read_large(&mut self, io: &mut Io) -> io::Result<()> {
        let Some(large) = self.large_in.as_mut() else {
            return Ok(());
        };
        let mut sink = [0u8; RESP_READ_CHUNK_BYTES];
        let left = large.len - large.filled;
        let dst: &mut [u8] = match large.buf.as_mut() {
            Some(b) => &mut b[large.filled..],
            None => &mut sink[..left.min(RESP_READ_CHUNK_BYTES)],
        };
        large.filled += io.read_into(dst)?;
        self.finish_large_if_done();
        Ok(())
    }

    fn output_queued(&self) -> bool {
        !self.state.large_out.queue.is_empty()
    }

    /// Writes as much of the pending replies as the socket takes, in one
    /// `writev`: output bytes up to the next large value, the value from
    /// the store's own buffer, and so on.
    fn write_some(&mut self, io: &mut Io) -> io::Result<usize> {
        let mut slices: [IoSlice<'_>; WRITE_SLICES_MAX] = [IoSlice::new(&[]); WRITE_SLICES_MAX];
        let mut n = 0;
        let mut pos = io.out_pos;
        let mut skip = self.large_pos;
        let mut values = 0;
        for r in self.state.large_out.queue.iter() {
            if n + 2 > WRITE_SLICES_MAX {
                break;
            }
            values += 1;
            if r.at > pos {
                slices[n] = IoSlice::new(&io.out[pos..r.at]);
                n += 1;
            }
            slices[n] = IoSlice::new(&r.value[skip..]);
            n += 1;
            pos = r.at;
            skip = 0;
        }
        // The output after the last value, once every value is in.
        if n < WRITE_SLICES_MAX && pos < io.out.len() && values == self.state.large_out.queue.len()
        {
            slices[n] = IoSlice::new(&io.out[pos..]);
            n += 1;
        }
        fabrickv_transport::tcp::send_vectored(&io.stream, &slices[..n])
    }

    /// Counts `n` more reply bytes written (see [`RespConn::write_some`]).
    fn advance_out(&mut self, io: &mut Io, mut n: usize) {
        while n > 0 {
            let q = &mut self.state.large_out;
            match q.queue.front() {
                Some(r) if r.at == io.out_pos => {
                    let left = r.value.len() - self.large_pos;
                    if n >= left {
                        n -= left;
                        self.large_pos = 0;
                        q.pop();
                        if q.queue.is_empty() {
                            self.large_reply = None;
                        }
                    } else {
                        self.large_pos += n;
                        n = 0;
                    }
                }
                front => {
                    let upto = front.map_or(io.out.len(), |r| r.at);
                    let k = n.min(upto.saturating_sub(io.out_pos));
                    io.out_pos += k;
                    n -= k;
                    if k == 0 {
                        debug_assert!(false, "wrote past the replies");
                        return;
                    }
                }
            }
        }
    }

    fn reset_out(&mut self) {
        self.large_pos = 0;
        self.large_reply = None;
        self.state.replies_unsettled = false;
    }

    /// GETs of keys with no write in flight, alone.
    fn replies_settled(&self) -> bool {
        !self.state.replies_unsettled
    }
}

impl RespConn {
    /// Starts receiving the large bulk `at` (offsets from `base` in the
    /// input): reserves its bytes of the server's bound and allocates its
    /// buffer (or, refused, arranges to drop its bytes), moves what of it
    /// is already buffered there, and leaves `$0\r\n` in its place in the
    /// input, which the bulk's own CRLF will complete.
    fn begin_large(&mut self, io: &mut Io, shared: &RespShared, base: usize, at: LargeBulkAt) {
        let header = base + at.header_at;
        let data = base + at.data_at;
        let (buf, refusal, receiving) = if !self.state.takes_large() {
            (None, "NOAUTH Authentication required.".to_string(), None)
        } else {
            match shared.reserve_large(at.len) {
                Some(r) => (Some(vec![0u8; at.len]), String::new(), Some(r)),
                None => (
                    None,
                    format!(
                        "ERR large values being received exceed {} bytes; retry later",
                        crate::resp::RESP_LARGE_RECEIVING_BYTES_MAX
                    ),
                    None,
                ),
            }
        };
        let here = (io.end - data).min(at.len);
        let mut large = LargeIn {
            buf,
            filled: here,
            len: at.len,
            arg: at.arg,
            refusal,
            receiving,
        };
        if let Some(b) = large.buf.as_mut() {
            b[..here].copy_from_slice(&io.input[data..data + here]);
        }
        let after = data + here;
        let stub_end = header + EMPTY_BULK_HEADER.len();
        io.input[header..stub_end].copy_from_slice(EMPTY_BULK_HEADER);
        io.input.copy_within(after..io.end, stub_end);
        io.end = stub_end + (io.end - after);
        io.need = 0;
        self.large_in = Some(large);
        self.finish_large_if_done();
    }

    /// Hands a fully received large bulk to the connection state.
    fn finish_large_if_done(&mut self) {
        if self.large_in.as_ref().is_some_and(|l| l.filled == l.len) {
            if let Some(l) = self.large_in.take() {
                let value = match l.buf {
                    Some(b) => Ok(LargeValue::from_boxed(b.into_boxed_slice())),
                    None => Err(l.refusal),
                };
                self.state.large_received(l.arg, value, l.receiving);
            }
        }
    }
}
