//! The memcache front end's sockets: one epoll loop per thread, bytes in
//! and out, everything else in [`crate::memcache`]. The loop is the RESP
//! front end's (`resp_net`), without AUTH parking: memcached's text
//! protocol has no authentication.
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

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use fabrickv_memcache::MC_COMMAND_BYTES_MAX;
use fabrickv_transport::idle::IdleBoard;

use crate::memcache::{McSession, McShared};
use crate::service::Clock;

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
/// in microseconds (RESP's loop spins 50). Each poll is an `epoll_wait`
/// system call, so spinning costs server CPU whenever the client is the
/// slower side; the memcache loop blocks at once, as memcached does, since
/// its figure of merit is operations per server CPU-second.
pub const MC_IDLE_SPIN_US: u64 = 0;

/// How often a loop looks for idle connections, in milliseconds: the idle
/// timeout is enforced to within this (and `POLL_TIMEOUT_MS`).
const IDLE_CHECK_INTERVAL_MS: u64 = 500;

/// Least time a memcache connection must have been silent, with nothing
/// pending, before a newcomer at the connection cap may close it, in ms:
/// a client in the middle of its work is never the one to go, while
/// sockets opened and left silent (to fill the cap) make way.
pub const MC_EVICT_IDLE_MIN_MS: u64 = 1_000;

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
pub(crate) struct McFrontEnd {
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
    shared: impl FnOnce(u16) -> McShared,
    clock: Clock,
    idle_timeout: Option<Duration>,
    stop: Arc<AtomicBool>,
) -> io::Result<McFrontEnd> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let local = std_listener.local_addr()?;
    let shared = Arc::new(shared(local.port()));
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
        handles.push(
            std::thread::Builder::new()
                .name(format!("fkv-mc-{t}"))
                .spawn(move || {
                    let mut lp = Loop {
                        poll,
                        listener,
                        conns: Vec::new(),
                        free: Vec::new(),
                        shared,
                        clock,
                        idle_timeout_ms: idle_timeout.map_or(0, |d| d.as_millis() as u64),
                        last_idle_check_ms: 0,
                        board,
                        port: t,
                        first,
                        last_report_ms: 0,
                    };
                    if let Err(e) = lp.run(&stop) {
                        tracing::error!("memcache loop stopped: {e}");
                    }
                })?,
        );
    }
    Ok(McFrontEnd {
        addr: local,
        wakers,
        threads: handles,
    })
}

struct Conn {
    stream: TcpStream,
    session: McSession,
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
    /// When the client last sent something (the loop's clock, in ms).
    active_ms: u64,
}

struct Loop {
    poll: Poll,
    listener: TcpListener,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    shared: Arc<McShared>,
    clock: Clock,
    /// Connections silent this long with no command pending are closed,
    /// in milliseconds; 0 keeps them.
    idle_timeout_ms: u64,
    last_idle_check_ms: u64,
    /// Where every loop says since when its most evictable connection has
    /// been idle, and asks another loop to close one at the cap.
    board: Arc<IdleBoard>,
    /// This loop's place on the board.
    port: usize,
    /// The start of the front end: reported when a silence is longer than
    /// an `Instant` can go back.
    first: Instant,
    last_report_ms: u64,
}

enum Drive {
    Keep,
    Close,
}

impl Loop {
    fn run(&mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        let mut ready: Vec<usize> = Vec::with_capacity(EVENTS_PER_POLL);
        let mut last_event = Instant::now();
        let spin = Duration::from_micros(MC_IDLE_SPIN_US);
        while !stop.load(Ordering::Acquire) {
            let timeout = if last_event.elapsed() < spin {
                Duration::ZERO
            } else {
                Duration::from_millis(POLL_TIMEOUT_MS)
            };
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            ready.clear();
            self.close_idle();
            self.serve_board();
            if events.is_empty() && ready.is_empty() {
                continue;
            }
            last_event = Instant::now();
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

    fn accept_all(&mut self) {
        loop {
            let (mut stream, _) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: leave the rest queued for the next event.
                    tracing::warn!("memcache accept failed: {e}");
                    return;
                }
            };
            let c = &self.shared.counters;
            c.connections_received.fetch_add(1, Ordering::Relaxed);
            // At the cap a newcomer fits while some loop holds a silent
            // connection (it is asked to close it below).
            let open = c.connected.load(Ordering::Acquire) as usize;
            if self.board.fits(open, MC_CONNECTIONS_MAX) >= MC_CONNECTIONS_MAX {
                c.rejected.fetch_add(1, Ordering::Relaxed);
                // Best effort, as memcached does; the socket is closed either way.
                let _ = stream.write(b"SERVER_ERROR too many open connections\r\n");
                continue;
            }
            let open = c.connected.fetch_add(1, Ordering::AcqRel) as usize;
            self.board.make_room(open, MC_CONNECTIONS_MAX);
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
                tracing::warn!("memcache register failed: {e}");
                self.free.push(i);
                c.connected.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            self.conns[i] = Some(Conn {
                stream,
                session: McSession::new(),
                input: vec![0; MC_READ_CHUNK_BYTES],
                start: 0,
                end: 0,
                need: 0,
                out: Vec::new(),
                out_pos: 0,
                drained: false,
                eof: false,
                closing: false,
                active_ms: self.clock.now_ms(),
            });
            // Data may have arrived before registration; drive it now.
            let now = self.clock.now_ms();
            if let Some(Some(conn)) = self.conns.get_mut(i) {
                match drive(conn, &self.shared, now) {
                    Drive::Keep => {}
                    Drive::Close => self.close(i),
                }
            }
        }
    }

    /// The connection of this loop to close for a newcomer at the cap:
    /// silent at least [`MC_EVICT_IDLE_MIN_MS`] with nothing pending, the
    /// one silent longest.
    fn evictable(&self) -> Option<(usize, u64)> {
        let now = self.clock.now_ms();
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
            .filter(|(_, c)| {
                let pending = c.start != c.end || c.out_pos < c.out.len();
                !pending && now.saturating_sub(c.active_ms) >= MC_EVICT_IDLE_MIN_MS
            })
            .map(|(i, c)| (i, c.active_ms))
            .min_by_key(|&(_, active)| active)
    }

    /// Closes what other loops' newcomers asked room for, then tells the
    /// board (at most every [`IDLE_REPORT_INTERVAL_MS`]) since when this
    /// loop's most evictable connection has been silent, a silent
    /// unauthenticated one reading as older than any.
    fn serve_board(&mut self) {
        for _ in 0..self.board.take_evictions(self.port) {
            match self.evictable() {
                Some((i, _)) => {
                    tracing::debug!("closing the longest-idle memcache connection for a newcomer");
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
        let since = self.evictable().map(|(_, active)| {
            let silent = Duration::from_millis(now.saturating_sub(active));
            Instant::now().checked_sub(silent).unwrap_or(self.first)
        });
        self.board.report(self.port, since);
    }

    /// Closes connections silent past the idle timeout with no command
    /// pending, at most once per `IDLE_CHECK_INTERVAL_MS`.
    fn close_idle(&mut self) {
        if self.idle_timeout_ms == 0 {
            return;
        }
        let now = self.clock.now_ms();
        if now.saturating_sub(self.last_idle_check_ms) < IDLE_CHECK_INTERVAL_MS {
            return;
        }
        self.last_idle_check_ms = now;
        for i in 0..self.conns.len() {
            let idle = self.conns[i].as_ref().is_some_and(|c| {
                let pending = c.start != c.end || c.out_pos < c.out.len();
                !pending && now.saturating_sub(c.active_ms) >= self.idle_timeout_ms
            });
            if idle {
                tracing::debug!(
                    "closing a memcache connection idle for {} ms",
                    self.idle_timeout_ms
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
fn fill(c: &mut Conn, shared: &McShared, now_ms: u64) {
    if c.closing || c.eof || c.drained || c.out_pos < c.out.len() || !make_room(c) {
        return;
    }
    // An error is left for drive, which meets it again and closes.
    if c.read_once().is_ok() {
        c.execute(shared, now_ms);
    }
}

/// Executes, writes and reads for one connection until it has nothing to
/// do or must wait for the socket.
fn drive(c: &mut Conn, shared: &McShared, now_ms: u64) -> Drive {
    loop {
        // 1. Execute what is buffered (bounded by the output soft limit).
        let more_buffered = c.execute(shared, now_ms);
        // 2. Write the replies.
        while c.out_pos < c.out.len() {
            match c.stream.write(&c.out[c.out_pos..]) {
                Ok(0) => return Drive::Close,
                Ok(n) => c.out_pos += n,
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
    fn execute(&mut self, shared: &McShared, now_ms: u64) -> bool {
        if self.closing || self.end - self.start < self.need.max(1) {
            return false;
        }
        let p = self.session.process(
            shared,
            &self.input[self.start..self.end],
            &mut self.out,
            now_ms,
        );
        self.start += p.consumed;
        self.need = p.need;
        self.closing |= p.close;
        !p.close && p.need == 0 && self.start < self.end
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
    if c.out.capacity() > MC_IDLE_BUFFER_BYTES_MAX {
        c.out = Vec::new();
    }
}

/// Gives back a large input buffer once nothing is pending in it.
fn compact_idle(c: &mut Conn) {
    if c.start == c.end {
        c.start = 0;
        c.end = 0;
        if c.input.len() > MC_IDLE_BUFFER_BYTES_MAX {
            c.input = vec![0; MC_READ_CHUNK_BYTES];
        }
    }
}

/// Makes room for a read: moves pending bytes to the front, and grows the
/// buffer (up to [`MC_INPUT_BYTES_MAX`]) when a command needs more.
fn make_room(c: &mut Conn) -> bool {
    if c.start == c.end {
        c.start = 0;
        c.end = 0;
    }
    if c.input.len() - c.end >= MC_READ_CHUNK_BYTES {
        return true;
    }
    let pending = c.end - c.start;
    if c.start > 0 {
        c.input.copy_within(c.start..c.end, 0);
        c.start = 0;
        c.end = pending;
    }
    let want = (pending.max(c.need) + MC_READ_CHUNK_BYTES).min(MC_INPUT_BYTES_MAX);
    if c.input.len() < want {
        c.input.resize(want, 0);
    }
    c.input.len() > c.end
}
