//! The RESP front-end's sockets: one epoll loop per thread, bytes in and
//! out, everything else in [`crate::resp`].
//!
//! Each thread polls its own clone of the listening socket and owns the
//! connections it accepted. Sockets are registered edge-triggered for
//! reading and writing once; a connection is driven until its input is
//! drained (a short read means the kernel had nothing more) or its output
//! blocks, in which case it waits for a writable event before executing
//! more (backpressure: a client that does not read its replies stops
//! being served, it does not make the server buffer without bound). The
//! loop blocks in epoll when idle: no spinning, so the CPU it uses is the
//! CPU the commands cost.
//!
//! A connection whose AUTH failed is parked, not slept on: its reply stays
//! in its buffer and its input unread until a deadline the session set
//! (see `RESP_AUTH_DELAY_BASE_MS`), while the loop serves its other
//! connections and wakes by that deadline to send the reply.

use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use fabrickv_resp::limits::RESP_COMMAND_BYTES_MAX;
use fabrickv_transport::idle::IdleBoard;

use fabrickv_engine::LargeValue;

use crate::resp::{ClientPeer, KillNotify, LargeBulkAt, Receiving, RespSession, RespShared};
use crate::service::Clock;

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

/// How often a loop looks for idle connections, in milliseconds: the idle
/// timeout is enforced to within this (and `POLL_TIMEOUT_MS`).
const IDLE_CHECK_INTERVAL_MS: u64 = 500;

/// Least time a RESP connection must have been silent, with nothing
/// pending, before a newcomer at the connection cap may close it, in ms:
/// a client in the middle of its work is never the one to go, while
/// sockets opened and left silent (to fill the cap) make way.
pub const RESP_EVICT_IDLE_MIN_MS: u64 = 1_000;

/// How often a loop tells the board about its idle connections, in ms.
const IDLE_REPORT_INTERVAL_MS: u64 = 100;

/// Most events taken per epoll wait.
const EVENTS_PER_POLL: usize = 256;

/// Longest epoll wait, in milliseconds; bounds how late a stop is seen.
const POLL_TIMEOUT_MS: u64 = 200;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// The running front-end: where it listens, and how to stop it.
pub(crate) struct RespFrontEnd {
    pub addr: SocketAddr,
    pub wakers: Vec<Arc<Waker>>,
    pub threads: Vec<JoinHandle<()>>,
}

/// Listens on `addr` and starts `threads` loops over the state `shared`
/// builds (given the port actually bound). Threads started before a
/// failure see `stop` only when the caller sets it.
pub(crate) fn start(
    addr: &str,
    threads: usize,
    shared: impl FnOnce(u16) -> RespShared,
    clock: Clock,
    idle_timeout: Option<Duration>,
    stop: Arc<AtomicBool>,
) -> io::Result<RespFrontEnd> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let local = std_listener.local_addr()?;
    let shared = shared(local.port());
    shared.idle_timeout_ms.store(
        idle_timeout.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        Ordering::Relaxed,
    );
    let shared = Arc::new(shared);
    let mut wakers = Vec::with_capacity(threads);
    let mut handles = Vec::with_capacity(threads);
    let mut polls = Vec::with_capacity(threads);
    for _ in 0..threads {
        let poll = Poll::new()?;
        wakers.push(Arc::new(Waker::new(poll.registry(), WAKER)?));
        polls.push(poll);
    }
    // Taken before the board, so it reads as the oldest idle time there is.
    let first = Instant::now();
    let board = IdleBoard::new(
        wakers
            .iter()
            .map(|w| fabrickv_transport::Waker::from_mio(w.clone()))
            .collect(),
    );
    for (t, poll) in polls.into_iter().enumerate() {
        let mut listener = TcpListener::from_std(std_listener.try_clone()?);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let shared = shared.clone();
        let stop = stop.clone();
        let board = board.clone();
        let kill = KillNotify {
            pending: Arc::new(AtomicBool::new(false)),
            waker: wakers[t].clone(),
        };
        handles.push(
            std::thread::Builder::new()
                .name(format!("fkv-resp-{t}"))
                .spawn(move || {
                    let mut lp = Loop {
                        poll,
                        listener,
                        conns: Vec::new(),
                        free: Vec::new(),
                        held: Vec::new(),
                        shared,
                        clock,
                        next_id: t as u64 + 1,
                        id_step: threads as u64,
                        last_idle_check_ms: 0,
                        kill,
                        board,
                        port: t,
                        first,
                        last_report_ms: 0,
                    };
                    if let Err(e) = lp.run(&stop) {
                        tracing::error!("resp loop stopped: {e}");
                    }
                })?,
        );
    }
    Ok(RespFrontEnd {
        addr: local,
        wakers,
        threads: handles,
    })
}

struct Conn {
    stream: TcpStream,
    session: RespSession,
    input: Vec<u8>,
    /// Unconsumed input is `input[start..end]`.
    start: usize,
    end: usize,
    /// Unconsumed bytes needed before parsing again.
    need: usize,
    out: Vec<u8>,
    out_pos: usize,
    /// The last read came back short: nothing more until the next event.
    drained: bool,
    /// The peer closed its side.
    eof: bool,
    /// Close once the output is written.
    closing: bool,
    /// Nothing is written or executed before this time (engine ms; 0:
    /// not held): the delay a failed AUTH costs.
    held_until_ms: u64,
    /// When the client last sent something (the loop's clock, in ms).
    active_ms: u64,
    /// The large bulk being received, if any (one per connection).
    large_in: Option<LargeIn>,
    /// Bytes of the first queued large reply already written.
    large_pos: usize,
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

struct Loop {
    poll: Poll,
    listener: TcpListener,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Parked connections, (deadline in engine ms, index): each is driven
    /// again once its deadline passes. An entry may outlive its
    /// connection; driving whatever holds the index then is harmless.
    held: Vec<(u64, usize)>,
    shared: Arc<RespShared>,
    clock: Clock,
    next_id: u64,
    id_step: u64,
    last_idle_check_ms: u64,
    /// How CLIENT KILL tells this loop one of its connections was killed.
    kill: KillNotify,
    /// Where every loop says since when its most evictable connection has
    /// been idle, and asks another loop to close one at the cap.
    board: Arc<IdleBoard>,
    /// This loop's place on the board.
    port: usize,
    /// Reported for a loop holding a silent unauthenticated connection:
    /// older than any real idle time, so such connections go first.
    first: Instant,
    last_report_ms: u64,
}

enum Drive {
    Keep,
    Close,
    /// Parked until this time (engine ms) by a failed AUTH.
    Held(u64),
}

impl Loop {
    fn run(&mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        let mut ready: Vec<usize> = Vec::with_capacity(EVENTS_PER_POLL);
        // Blocks at once when there is nothing to do, as Redis does:
        // polling on for a few tens of microseconds after each event (tried
        // here, always and only when busy) cost more server CPU per
        // operation at every load `bench compare` measures, pipelined or
        // not, and won no throughput that held up between runs.
        while !stop.load(Ordering::Acquire) {
            let mut timeout = Duration::from_millis(POLL_TIMEOUT_MS);
            if let Some(first) = self.held.iter().map(|&(at, _)| at).min() {
                let wait = first.saturating_sub(self.clock.now_ms());
                timeout = timeout.min(Duration::from_millis(wait));
            }
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            ready.clear();
            self.take_released(&mut ready);
            self.close_killed();
            self.close_idle();
            self.serve_board();
            if events.is_empty() && ready.is_empty() {
                continue;
            }
            let mut accept = false;
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => accept = true,
                    WAKER => {}
                    Token(t) => {
                        let i = t - FIRST_CONN;
                        if let Some(Some(c)) = self.conns.get_mut(i) {
                            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                                c.drained = false;
                                c.active_ms = self.clock.now_ms();
                            }
                            ready.push(i);
                        }
                    }
                }
            }
            if accept {
                self.accept_all();
            }
            let now = self.clock.now_ms();
            // Read and execute for every ready connection first, then
            // write every reply: the replies of one wake-up leave together,
            // so a client multiplexing many connections (redis-benchmark)
            // finds them in one epoll wait instead of waking per reply.
            for &i in &ready {
                if let Some(Some(c)) = self.conns.get_mut(i) {
                    fill(c, &self.shared, now);
                }
            }
            for &i in &ready {
                let Some(Some(c)) = self.conns.get_mut(i) else {
                    continue;
                };
                match drive(c, &self.shared, now) {
                    Drive::Keep => {}
                    Drive::Close => self.close(i),
                    Drive::Held(until) => self.park(i, until),
                }
            }
        }
        for i in 0..self.conns.len() {
            if self.conns[i].is_some() {
                self.close(i);
            }
        }
        Ok(())
    }

    /// Parks connection `i` until `until` (once, however many events it
    /// gets meanwhile: its input is left unread, so they stop coming).
    fn park(&mut self, i: usize, until: u64) {
        if !self.held.contains(&(until, i)) {
            self.held.push((until, i));
        }
    }

    /// Moves the parked connections whose deadline has passed to `ready`.
    fn take_released(&mut self, ready: &mut Vec<usize>) {
        if self.held.is_empty() {
            return;
        }
        let now = self.clock.now_ms();
        self.held.retain(|&(until, i)| {
            if until > now {
                return true;
            }
            ready.push(i);
            false
        });
        for &i in ready.iter() {
            // Input that arrived while parked was left unread.
            if let Some(Some(c)) = self.conns.get_mut(i) {
                c.drained = false;
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            let (mut stream, _) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: leave the rest queued for the next event.
                    tracing::warn!("resp accept failed: {e}");
                    return;
                }
            };
            let c = &self.shared.counters;
            c.connections_received.fetch_add(1, Ordering::Relaxed);
            // At the cap a newcomer fits while some loop holds a silent
            // connection (it is asked to close it below).
            let open = c.connected.load(Ordering::Acquire) as usize;
            if self.board.fits(open, RESP_CONNECTIONS_MAX) >= RESP_CONNECTIONS_MAX {
                c.rejected.fetch_add(1, Ordering::Relaxed);
                // Best effort, as Redis does; the socket is closed either way.
                let _ = stream.write(b"-ERR max number of clients reached\r\n");
                continue;
            }
            let open = c.connected.fetch_add(1, Ordering::AcqRel) as usize;
            self.board.make_room(open, RESP_CONNECTIONS_MAX);
            let _ = stream.set_nodelay(true);
            let i = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                Token(i + FIRST_CONN),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!("resp register failed: {e}");
                self.free.push(i);
                c.connected.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let id = self.next_id;
            self.next_id += self.id_step;
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
                now_ms: self.clock.now_ms(),
                kill: Some(self.kill.clone()),
            };
            self.conns[i] = Some(Conn {
                stream,
                session: RespSession::connected(&self.shared, id, peer),
                input: vec![0; RESP_READ_CHUNK_BYTES],
                start: 0,
                end: 0,
                need: 0,
                out: Vec::new(),
                out_pos: 0,
                drained: false,
                eof: false,
                closing: false,
                held_until_ms: 0,
                active_ms: self.clock.now_ms(),
                large_in: None,
                large_pos: 0,
            });
            // Data may have arrived before registration; drive it now.
            let now = self.clock.now_ms();
            if let Some(Some(conn)) = self.conns.get_mut(i) {
                match drive(conn, &self.shared, now) {
                    Drive::Keep => {}
                    Drive::Close => self.close(i),
                    Drive::Held(until) => self.park(i, until),
                }
            }
        }
    }

    /// The connection of this loop to close for a newcomer at the cap:
    /// silent at least [`RESP_EVICT_IDLE_MIN_MS`] with nothing pending,
    /// one that never authenticated before one that did, then the one
    /// silent longest.
    fn evictable(&self) -> Option<(usize, bool, u64)> {
        let now = self.clock.now_ms();
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
            .filter(|(_, c)| {
                !c.pending() && now.saturating_sub(c.active_ms) >= RESP_EVICT_IDLE_MIN_MS
            })
            .map(|(i, c)| (i, c.session.authenticated(), c.active_ms))
            .min_by_key(|&(_, authed, active)| (authed, active))
    }

    /// Closes what other loops' newcomers asked room for, then tells the
    /// board (at most every [`IDLE_REPORT_INTERVAL_MS`]) since when this
    /// loop's most evictable connection has been silent, a silent
    /// unauthenticated one reading as older than any.
    fn serve_board(&mut self) {
        for _ in 0..self.board.take_evictions(self.port) {
            match self.evictable() {
                Some((i, _, _)) => {
                    tracing::debug!("closing the longest-idle RESP connection for a newcomer");
                    self.board.evicted();
                    self.close(i);
                    self.shared
                        .counters
                        .evicted_idle
                        .fetch_add(1, Ordering::Relaxed);
                }
                None => self.board.declined(self.port),
            }
            self.last_report_ms = 0;
        }
        let now = self.clock.now_ms();
        if now.saturating_sub(self.last_report_ms) < IDLE_REPORT_INTERVAL_MS {
            return;
        }
        self.last_report_ms = now;
        let since = self.evictable().map(|(_, authed, active)| {
            if authed {
                let silent = Duration::from_millis(now.saturating_sub(active));
                Instant::now().checked_sub(silent).unwrap_or(self.first)
            } else {
                self.first
            }
        });
        self.board.report(self.port, since);
    }

    /// Closes the connections CLIENT KILL named, once told some were.
    fn close_killed(&mut self) {
        if !self.kill.pending.swap(false, Ordering::AcqRel) {
            return;
        }
        for i in 0..self.conns.len() {
            if self.conns[i].as_ref().is_some_and(|c| c.session.killed()) {
                tracing::debug!("closing a RESP connection CLIENT KILL named");
                self.close(i);
            }
        }
    }

    /// Closes connections silent past the idle timeout (CONFIG SET
    /// timeout changes it live) with no command pending, and those silent
    /// for [`RESP_LARGE_STALL_MS`] in the middle of a large value (which
    /// hold a share of the server's receiving bound), at most once per
    /// `IDLE_CHECK_INTERVAL_MS`.
    fn close_idle(&mut self) {
        let idle_timeout_ms = self.shared.idle_timeout_ms.load(Ordering::Relaxed);
        let now = self.clock.now_ms();
        if now.saturating_sub(self.last_idle_check_ms) < IDLE_CHECK_INTERVAL_MS {
            return;
        }
        self.last_idle_check_ms = now;
        for i in 0..self.conns.len() {
            let Some(c) = self.conns[i].as_ref() else {
                continue;
            };
            let silent = now.saturating_sub(c.active_ms);
            let idle = idle_timeout_ms != 0 && !c.pending() && silent >= idle_timeout_ms;
            let stalled = c.large_in.is_some() && silent >= RESP_LARGE_STALL_MS;
            if idle || stalled {
                tracing::debug!(
                    "closing a RESP connection silent for {silent} ms{}",
                    if stalled {
                        " in the middle of a large value"
                    } else {
                        ""
                    }
                );
                self.close(i);
            }
        }
    }

    fn close(&mut self, i: usize) {
        if let Some(mut c) = self.conns[i].take() {
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.shared
                .counters
                .connected
                .fetch_sub(1, Ordering::AcqRel);
            self.free.push(i);
        }
    }
}

/// The first half of a wake-up: reads and executes what one read brings,
/// leaving the replies for [`drive`] to write.
fn fill(c: &mut Conn, shared: &RespShared, now_ms: u64) {
    if c.closing || c.eof || c.drained || c.output_pending() {
        return;
    }
    if c.large_in.is_some() {
        if c.read_large(shared).is_ok() && c.large_in.is_none() {
            c.execute(shared, now_ms);
        }
        return;
    }
    if !make_room(c) {
        return;
    }
    // An error is left for drive, which meets it again and closes.
    if c.read_once().is_ok() {
        c.execute(shared, now_ms);
    }
}

/// Executes, writes and reads for one connection until it has nothing to
/// do or must wait for the socket.
fn drive(c: &mut Conn, shared: &RespShared, now_ms: u64) -> Drive {
    loop {
        // 1. Execute what is buffered (bounded by the output soft limit).
        let more_buffered = c.execute(shared, now_ms);
        // A failed AUTH parks the connection, its reply unsent.
        if c.held_until_ms > now_ms {
            return Drive::Held(c.held_until_ms);
        }
        // 2. Write the replies.
        while c.output_pending() {
            match c.write_some() {
                Ok(0) => return Drive::Close,
                Ok(n) => c.advance_out(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Drive::Keep,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Drive::Close,
            }
        }
        reset_out(c);
        if c.closing || (c.eof && !more_buffered) {
            return Drive::Close;
        }
        if more_buffered {
            continue;
        }
        if c.drained {
            compact_idle(c);
            return Drive::Keep;
        }
        // 3. Read more.
        if c.large_in.is_some() {
            if c.read_large(shared).is_err() {
                return Drive::Close;
            }
            continue;
        }
        if !make_room(c) {
            // A command over every bound: the parser refuses it before this.
            return Drive::Close;
        }
        if c.read_once().is_err() {
            return Drive::Close;
        }
    }
}

impl Conn {
    /// Runs the buffered commands; returns true when it stopped for output
    /// room with whole commands possibly left.
    fn execute(&mut self, shared: &RespShared, now_ms: u64) -> bool {
        if self.closing
            || self.large_in.is_some()
            || self.held_until_ms > now_ms
            || self.end - self.start < self.need.max(1)
        {
            return false;
        }
        let base = self.start;
        let p = self.session.process(
            shared,
            &self.input[self.start..self.end],
            &mut self.out,
            now_ms,
        );
        self.start += p.consumed;
        self.need = p.need;
        self.closing |= p.close;
        if let Some(until) = p.hold_until_ms {
            self.held_until_ms = until;
            return false;
        }
        if let (Some(at), false) = (p.large, p.close) {
            self.begin_large(shared, base, at);
            // Parse again at once if the whole value was already here.
            return self.large_in.is_none();
        }
        !p.close && p.need == 0 && self.start < self.end
    }

    /// Whether anything is pending: unparsed input, a large value being
    /// received, or replies not yet written.
    fn pending(&self) -> bool {
        self.start != self.end || self.large_in.is_some() || self.output_pending()
    }

    /// Whether replies are waiting to be written.
    fn output_pending(&self) -> bool {
        self.out_pos < self.out.len() || !self.session.large_out.queue.is_empty()
    }

    /// Starts receiving the large bulk `at` (offsets from `base` in the
    /// input): reserves its bytes of the server's bound and allocates its
    /// buffer (or, refused, arranges to drop its bytes), moves what of it
    /// is already buffered there, and leaves `$0\r\n` in its place in the
    /// input, which the bulk's own CRLF will complete.
    fn begin_large(&mut self, shared: &RespShared, base: usize, at: LargeBulkAt) {
        let header = base + at.header_at;
        let data = base + at.data_at;
        let (buf, refusal, receiving) = if !self.session.takes_large() {
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
        let here = (self.end - data).min(at.len);
        let mut large = LargeIn {
            buf,
            filled: here,
            len: at.len,
            arg: at.arg,
            refusal,
            receiving,
        };
        if let Some(b) = large.buf.as_mut() {
            b[..here].copy_from_slice(&self.input[data..data + here]);
        }
        let after = data + here;
        let stub_end = header + EMPTY_BULK_HEADER.len();
        self.input[header..stub_end].copy_from_slice(EMPTY_BULK_HEADER);
        self.input.copy_within(after..self.end, stub_end);
        self.end = stub_end + (self.end - after);
        self.need = 0;
        self.large_in = Some(large);
        self.finish_large_if_done();
    }

    /// Reads more of the large bulk being received, straight into its
    /// buffer (or into a scratch buffer, dropped, when refused).
    fn read_large(&mut self, _shared: &RespShared) -> io::Result<()> {
        let Some(large) = self.large_in.as_mut() else {
            return Ok(());
        };
        let mut sink = [0u8; RESP_READ_CHUNK_BYTES];
        let left = large.len - large.filled;
        let dst: &mut [u8] = match large.buf.as_mut() {
            Some(b) => &mut b[large.filled..],
            None => &mut sink[..left.min(RESP_READ_CHUNK_BYTES)],
        };
        let offered = dst.len();
        match self.stream.read(dst) {
            Ok(0) => self.eof = true,
            Ok(n) => {
                large.filled += n;
                self.drained = n < offered;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drained = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        self.finish_large_if_done();
        Ok(())
    }

    /// Hands a fully received large bulk to the session.
    fn finish_large_if_done(&mut self) {
        if self.large_in.as_ref().is_some_and(|l| l.filled == l.len) {
            if let Some(l) = self.large_in.take() {
                let value = match l.buf {
                    Some(b) => Ok(LargeValue::from_boxed(b.into_boxed_slice())),
                    None => Err(l.refusal),
                };
                self.session.large_received(l.arg, value, l.receiving);
            }
        }
    }

    /// Writes as much of the pending replies as the socket takes, in one
    /// `writev`: output bytes up to the next large value, the value from
    /// the store's own buffer, and so on.
    fn write_some(&mut self) -> io::Result<usize> {
        let mut slices: [IoSlice<'_>; WRITE_SLICES_MAX] = [IoSlice::new(&[]); WRITE_SLICES_MAX];
        let mut n = 0;
        let mut pos = self.out_pos;
        let mut skip = self.large_pos;
        let mut values = 0;
        for r in self.session.large_out.queue.iter() {
            if n + 2 > WRITE_SLICES_MAX {
                break;
            }
            values += 1;
            if r.at > pos {
                slices[n] = IoSlice::new(&self.out[pos..r.at]);
                n += 1;
            }
            slices[n] = IoSlice::new(&r.value[skip..]);
            n += 1;
            pos = r.at;
            skip = 0;
        }
        // The output after the last value, once every value is in.
        if n < WRITE_SLICES_MAX
            && pos < self.out.len()
            && values == self.session.large_out.queue.len()
        {
            slices[n] = IoSlice::new(&self.out[pos..]);
            n += 1;
        }
        self.stream.write_vectored(&slices[..n])
    }

    /// Counts `n` more reply bytes written (see [`Conn::write_some`]).
    fn advance_out(&mut self, mut n: usize) {
        while n > 0 {
            let q = &mut self.session.large_out;
            match q.queue.front() {
                Some(r) if r.at == self.out_pos => {
                    let left = r.value.len() - self.large_pos;
                    if n >= left {
                        n -= left;
                        self.large_pos = 0;
                        q.pop();
                    } else {
                        self.large_pos += n;
                        n = 0;
                    }
                }
                front => {
                    let upto = front.map_or(self.out.len(), |r| r.at);
                    let k = n.min(upto.saturating_sub(self.out_pos));
                    self.out_pos += k;
                    n -= k;
                    if k == 0 {
                        debug_assert!(false, "wrote past the replies");
                        return;
                    }
                }
            }
        }
    }

    /// One read into the room [`make_room`] made: records EOF, and whether
    /// the socket is drained (a short read or nothing to read).
    fn read_once(&mut self) -> io::Result<()> {
        let offered = self.input.len() - self.end;
        match self.stream.read(&mut self.input[self.end..]) {
            Ok(0) => self.eof = true,
            Ok(n) => {
                self.end += n;
                self.drained = n < offered;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drained = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

fn reset_out(c: &mut Conn) {
    c.out.clear();
    c.out_pos = 0;
    c.large_pos = 0;
    if c.out.capacity() > RESP_IDLE_BUFFER_BYTES_MAX {
        c.out = Vec::new();
    }
}

/// Gives back a large input buffer once nothing is pending in it.
fn compact_idle(c: &mut Conn) {
    if c.start == c.end {
        c.start = 0;
        c.end = 0;
        if c.input.len() > RESP_IDLE_BUFFER_BYTES_MAX {
            c.input = vec![0; RESP_READ_CHUNK_BYTES];
        }
    }
}

/// Makes room for a read: moves pending bytes to the front, and grows the
/// buffer (up to [`RESP_INPUT_BYTES_MAX`]) when a command needs more.
fn make_room(c: &mut Conn) -> bool {
    if c.start == c.end {
        c.start = 0;
        c.end = 0;
    }
    if c.input.len() - c.end >= RESP_READ_CHUNK_BYTES {
        return true;
    }
    let pending = c.end - c.start;
    if c.start > 0 {
        c.input.copy_within(c.start..c.end, 0);
        c.start = 0;
        c.end = pending;
    }
    let want = (pending.max(c.need) + RESP_READ_CHUNK_BYTES).min(RESP_INPUT_BYTES_MAX);
    if c.input.len() < want {
        c.input.resize(want, 0);
    }
    c.input.len() > c.end
}
