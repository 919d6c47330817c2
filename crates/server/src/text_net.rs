//! The socket loop the RESP (`resp_net`) and memcache (`memcache_net`)
//! front ends share: one epoll loop per thread, bytes in and out, the
//! protocol in a [`Proto`] that each front end implements.
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
//! What connections buffer beyond a fixed allowance (a grown input
//! buffer, output kept past a burst, a queued transaction) is summed
//! server-wide in a [`ClientMemory`] shared by every loop of both front
//! ends, and bounded by `--maxmemory-clients` as Redis's
//! `maxmemory-clients` is: past it, the connection using the most is
//! closed, whichever loop holds it. Each connection reports its usage
//! after each of its wake-ups, and only when it changed, so a steady
//! pipeline costs no shared write.
//!
//! The loop is generic over the protocol, not `dyn`: each front end gets
//! its own copy of the hot path (fill, drive, execute), with the hooks it
//! does not use (AUTH parking, CLIENT KILL, large values) compiled away.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use fabrickv_transport::idle::IdleBoard;
use fabrickv_types::transfer::TransferClock;

use crate::service::Clock;

/// How often a loop looks for idle connections, in milliseconds: the idle
/// timeout is enforced to within this (and `POLL_TIMEOUT_MS`).
const IDLE_CHECK_INTERVAL_MS: u64 = 500;

/// How often a loop tells the board about its idle connections, in ms.
const IDLE_REPORT_INTERVAL_MS: u64 = 100;

/// Most events taken per epoll wait.
const EVENTS_PER_POLL: usize = 256;

/// Longest epoll wait, in milliseconds; bounds how late a stop is seen.
const POLL_TIMEOUT_MS: u64 = 200;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// The server-wide account of what connections buffer, and its cap
/// (Redis's `maxmemory-clients`): one for every loop of the RESP and
/// memcache front ends.
///
/// A connection counts the bytes it holds beyond the allowance every
/// connection has (its first `READ_CHUNK_BYTES` of input buffer and up to
/// `IDLE_BUFFER_BYTES_MAX` of output buffer kept between bursts, which the
/// connection cap bounds): input grown for a long command, output not yet
/// written or kept from a burst, and what the protocol holds
/// ([`Proto::held_bytes`]: a queued MULTI). Large values are not counted
/// here: those in replies are the store's buffers, counted in the
/// large-value budget while a reply holds them, and those being received
/// have their own server-wide bound (`RESP_LARGE_RECEIVING_BYTES_MAX`),
/// reserved before their buffer is allocated.
pub(crate) struct ClientMemory {
    /// Sum of every open connection's last report, in bytes.
    used: AtomicUsize,
    /// The cap of `used`, in bytes; 0: none.
    cap: usize,
    /// Connections closed because `used` passed `cap`.
    evicted: AtomicU64,
    /// The largest input buffer a connection had when it last reported,
    /// since the last read of it (INFO's `client_recent_max_input_buffer`).
    recent_max_input: AtomicUsize,
    /// The largest output buffer likewise (`client_recent_max_output_buffer`).
    recent_max_output: AtomicUsize,
    /// Every loop: the most bytes one of its connections reported (exact
    /// after the loop rescans, else possibly stale), and how to wake it
    /// to close that connection. Locked only past the cap.
    loops: Mutex<Vec<LoopShare>>,
}

/// One loop's entry in [`ClientMemory`].
struct LoopShare {
    largest: Arc<AtomicUsize>,
    /// Set to ask the loop to check the cap at its next wake-up.
    asked: Arc<AtomicBool>,
    waker: Arc<Waker>,
}

impl ClientMemory {
    /// An account with a cap of `cap` bytes (0: no cap).
    pub(crate) fn new(cap: usize) -> ClientMemory {
        ClientMemory {
            used: AtomicUsize::new(0),
            cap,
            evicted: AtomicU64::new(0),
            recent_max_input: AtomicUsize::new(0),
            recent_max_output: AtomicUsize::new(0),
            loops: Mutex::new(Vec::new()),
        }
    }

    /// Bytes the connections hold now, beyond their allowance.
    pub(crate) fn used_bytes(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The cap, in bytes (0: none).
    pub(crate) fn cap_bytes(&self) -> usize {
        self.cap
    }

    /// Connections closed for the cap since start.
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// The largest input and output buffers reported since the last call
    /// (Redis's `client_recent_max_input_buffer` / `..._output_buffer`).
    pub(crate) fn take_recent_max(&self) -> (usize, usize) {
        (
            self.recent_max_input.swap(0, Ordering::Relaxed),
            self.recent_max_output.swap(0, Ordering::Relaxed),
        )
    }

    fn over_cap(&self) -> bool {
        self.cap != 0 && self.used.load(Ordering::Relaxed) > self.cap
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<LoopShare>> {
        self.loops.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A front end's connection counters, as its stats report them.
pub(crate) struct Counters<'a> {
    pub received: &'a AtomicU64,
    pub connected: &'a AtomicU64,
    pub rejected: &'a AtomicU64,
    pub evicted_idle: &'a AtomicU64,
}

/// A front end's [`Counters`], from its counters struct (RESP's and
/// memcache's name these four alike).
macro_rules! conn_counters {
    ($c:expr) => {
        $crate::text_net::Counters {
            received: &$c.connections_received,
            connected: &$c.connected,
            rejected: &$c.rejected,
            evicted_idle: &$c.evicted_idle,
        }
    };
}
pub(crate) use conn_counters;

/// What differs between front ends: `Self` is one connection's protocol
/// state. The hooks with defaults are RESP's alone (AUTH parking, CLIENT
/// KILL, large values received and sent outside the buffers).
pub(crate) trait Proto: Sized + 'static {
    /// The state every connection of the front end shares.
    type Shared: Send + Sync + 'static;
    /// One loop's own state, made before its thread starts.
    type PerLoop: Send + 'static;
    /// The front end's name in logs.
    const NAME: &'static str;
    /// Its threads' name, before `-{index}`.
    const THREAD: &'static str;
    /// Most connections open at once over all threads.
    const CONNECTIONS_MAX: usize;
    /// Bytes asked of the kernel per read, and the initial input buffer size.
    const READ_CHUNK_BYTES: usize;
    /// Largest input buffer of one connection, in bytes.
    const INPUT_BYTES_MAX: usize;
    /// A buffer grown past this is given back once empty, in bytes.
    const IDLE_BUFFER_BYTES_MAX: usize;
    /// Least silence, nothing pending, before a newcomer at the cap may
    /// close a connection, in ms.
    const EVICT_IDLE_MIN_MS: u64;
    /// Written (best effort) to a newcomer refused at the cap.
    const REFUSAL: &'static [u8];
    /// How long a connection may stay silent while [`Proto::receiving`],
    /// in ms, before it is closed; `None`: nothing is ever received so.
    const LARGE_STALL_MS: Option<u64> = None;

    fn counters(shared: &Self::Shared) -> Counters<'_>;
    fn per_loop(thread: usize, threads: usize, waker: &Arc<Waker>) -> Self::PerLoop;
    /// A new connection, registered at slot `slot`.
    fn connect(
        shared: &Self::Shared,
        lp: &mut Self::PerLoop,
        stream: &TcpStream,
        slot: usize,
        now_ms: u64,
    ) -> Self;
    /// Runs the buffered commands (the loop has checked there is enough
    /// input and the connection is not closing); returns true when it
    /// stopped for output room with whole commands possibly left.
    fn execute(&mut self, io: &mut Io, shared: &Self::Shared, now_ms: u64) -> bool;

    /// Records the idle timeout the front end started with.
    fn set_idle_timeout(_shared: &Self::Shared, _ms: u64) {}
    /// The idle timeout now, in ms (0: none), given the one it started with.
    fn idle_timeout_ms(_shared: &Self::Shared, started: u64) -> u64 {
        started
    }
    /// Whether some connection of this loop was killed since last asked.
    fn take_killed(_lp: &Self::PerLoop) -> bool {
        false
    }
    fn killed(&self) -> bool {
        false
    }
    /// Unauthenticated connections are evicted first.
    fn authenticated(&self) -> bool {
        true
    }
    /// Nothing is written or executed before this time (engine ms; 0:
    /// not held).
    fn held_until_ms(&self) -> u64 {
        0
    }
    /// Bytes the protocol state holds for the connection besides the
    /// loop's buffers (a queued transaction), counted in [`ClientMemory`].
    fn held_bytes(&self) -> usize {
        0
    }
    /// Whether a value is being received outside the input buffer.
    fn receiving(&self) -> bool {
        false
    }
    /// Longest a reply holding a large value may take to be written,
    /// from when it was queued, in ms (0: no bound); past it the
    /// connection is closed, so a client that stops reading cannot keep
    /// the value alive.
    fn large_reply_ms(_shared: &Self::Shared) -> u64 {
        0
    }
    /// Since when (engine ms) replies holding large values have been
    /// waiting to be written; `None` when none is.
    fn large_reply(&self) -> Option<TransferClock> {
        None
    }
    /// Reads more of the value being received.
    fn read_large(&mut self, _io: &mut Io) -> io::Result<()> {
        Ok(())
    }
    /// Whether replies are queued outside `io.out`.
    fn output_queued(&self) -> bool {
        false
    }
    /// Writes as much of the pending replies as the socket takes.
    fn write_some(&mut self, io: &mut Io) -> io::Result<usize> {
        io.stream.write(&io.out[io.out_pos..])
    }
    /// Counts `n` more reply bytes written.
    fn advance_out(&mut self, io: &mut Io, n: usize) {
        io.out_pos += n;
    }
    /// Every reply was written.
    fn reset_out(&mut self) {}
}

/// The running front-end: where it listens, and how to stop it.
pub(crate) struct FrontEnd {
    pub addr: SocketAddr,
    pub wakers: Vec<Arc<Waker>>,
    pub threads: Vec<JoinHandle<()>>,
}

/// Listens on `addr` and starts `threads` loops over the state `shared`
/// builds (given the port actually bound). Threads started before a
/// failure see `stop` only when the caller sets it.
pub(crate) fn start<P: Proto>(
    addr: &str,
    threads: usize,
    shared: impl FnOnce(u16) -> P::Shared,
    clock: Clock,
    idle_timeout: Option<Duration>,
    client_memory: Arc<ClientMemory>,
    stop: Arc<AtomicBool>,
) -> io::Result<FrontEnd> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let local = std_listener.local_addr()?;
    let shared = shared(local.port());
    let idle_timeout_ms =
        idle_timeout.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    P::set_idle_timeout(&shared, idle_timeout_ms);
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
        let per_loop = P::per_loop(t, threads, &wakers[t]);
        let largest = Arc::new(AtomicUsize::new(0));
        let asked = Arc::new(AtomicBool::new(false));
        client_memory.lock().push(LoopShare {
            largest: largest.clone(),
            asked: asked.clone(),
            waker: wakers[t].clone(),
        });
        let client_memory = client_memory.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("{}-{t}", P::THREAD))
                .spawn(move || {
                    let mut lp = Loop::<P> {
                        poll,
                        listener,
                        conns: Vec::new(),
                        free: Vec::new(),
                        held: Vec::new(),
                        shared,
                        clock,
                        idle_timeout_ms,
                        last_idle_check_ms: 0,
                        per_loop,
                        board,
                        port: t,
                        first,
                        last_report_ms: 0,
                        mem: client_memory,
                        largest,
                        asked,
                    };
                    if let Err(e) = lp.run(&stop) {
                        tracing::error!("{} loop stopped: {e}", P::NAME);
                    }
                })?,
        );
    }
    Ok(FrontEnd {
        addr: local,
        wakers,
        threads: handles,
    })
}

/// One connection's socket and buffers, as every front end has them.
pub(crate) struct Io {
    pub stream: TcpStream,
    pub input: Vec<u8>,
    /// Unconsumed input is `input[start..end]`.
    pub start: usize,
    pub end: usize,
    /// Unconsumed bytes needed before parsing again.
    pub need: usize,
    pub out: Vec<u8>,
    pub out_pos: usize,
    /// The last read came back short: nothing more until the next event.
    pub drained: bool,
    /// The peer closed its side.
    pub eof: bool,
    /// Close once the output is written.
    pub closing: bool,
    /// When the client last sent something (the loop's clock, in ms).
    active_ms: u64,
}

impl Io {
    /// Records what one `process` call did; returns true when whole
    /// commands may be left (it stopped for output room).
    pub fn took(&mut self, consumed: usize, need: usize, close: bool) -> bool {
        self.start += consumed;
        self.need = need;
        self.closing |= close;
        !close && need == 0 && self.start < self.end
    }

    /// One read into `dst` (not the input buffer): records EOF, and
    /// whether the socket is drained; returns the bytes read.
    pub fn read_into(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let offered = dst.len();
        match self.stream.read(dst) {
            Ok(0) => self.eof = true,
            Ok(n) => {
                self.drained = n < offered;
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drained = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        Ok(0)
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

struct Conn<P> {
    io: Io,
    proto: P,
    /// The bytes this connection last reported to [`ClientMemory`].
    reported: usize,
}

struct Loop<P: Proto> {
    poll: Poll,
    listener: TcpListener,
    conns: Vec<Option<Conn<P>>>,
    free: Vec<usize>,
    /// Parked connections, (deadline in engine ms, index): each is driven
    /// again once its deadline passes. An entry may outlive its
    /// connection; driving whatever holds the index then is harmless.
    held: Vec<(u64, usize)>,
    shared: Arc<P::Shared>,
    clock: Clock,
    /// The idle timeout the front end started with, in ms (0: none);
    /// [`Proto::idle_timeout_ms`] may change it live.
    idle_timeout_ms: u64,
    last_idle_check_ms: u64,
    per_loop: P::PerLoop,
    /// Where every loop says since when its most evictable connection has
    /// been idle, and asks another loop to close one at the cap.
    board: Arc<IdleBoard>,
    /// This loop's place on the board.
    port: usize,
    /// Reported for a loop holding a silent unauthenticated connection:
    /// older than any real idle time, so such connections go first (and
    /// when a silence is longer than an `Instant` can go back).
    first: Instant,
    last_report_ms: u64,
    /// What every connection of the server buffers, and its cap.
    mem: Arc<ClientMemory>,
    /// This loop's largest report, as [`ClientMemory`] shows it.
    largest: Arc<AtomicUsize>,
    /// Set when another loop asks this one to check the cap.
    asked: Arc<AtomicBool>,
}

enum Drive {
    Keep,
    Close,
    /// Parked until this time (engine ms), e.g. by a failed AUTH.
    Held(u64),
}

impl<P: Proto> Loop<P> {
    fn run(&mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        let mut ready: Vec<usize> = Vec::with_capacity(EVENTS_PER_POLL);
        // Blocks at once when there is nothing to do, as Redis and
        // memcached do: polling on for a few tens of microseconds after
        // each event (tried here, always and only when busy) cost more
        // server CPU per operation at every load `bench compare` measures,
        // pipelined or not, and won no throughput that held up between runs.
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
            // One plain load per wake-up; the swap only when asked.
            if self.asked.load(Ordering::Relaxed) && self.asked.swap(false, Ordering::AcqRel) {
                self.enforce_cap();
            }
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
                                c.io.drained = false;
                                c.io.active_ms = self.clock.now_ms();
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
                let d = drive(c, &self.shared, now);
                self.after(i, d);
                self.account(i);
            }
        }
        for i in 0..self.conns.len() {
            if self.conns[i].is_some() {
                self.close(i);
            }
        }
        Ok(())
    }

    fn after(&mut self, i: usize, d: Drive) {
        match d {
            Drive::Keep => {}
            Drive::Close => self.close(i),
            Drive::Held(until) => self.park(i, until),
        }
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
                c.io.drained = false;
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
                    tracing::warn!("{} accept failed: {e}", P::NAME);
                    return;
                }
            };
            let c = P::counters(&self.shared);
            c.received.fetch_add(1, Ordering::Relaxed);
            // At the cap a newcomer fits while some loop holds a silent
            // connection (it is asked to close it below).
            let open = c.connected.load(Ordering::Acquire) as usize;
            if self.board.fits(open, P::CONNECTIONS_MAX) >= P::CONNECTIONS_MAX {
                c.rejected.fetch_add(1, Ordering::Relaxed);
                // Best effort, as Redis and memcached do; the socket is
                // closed either way.
                let _ = stream.write(P::REFUSAL);
                continue;
            }
            let open = c.connected.fetch_add(1, Ordering::AcqRel) as usize;
            self.board.make_room(open, P::CONNECTIONS_MAX);
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
                tracing::warn!("{} register failed: {e}", P::NAME);
                self.free.push(i);
                c.connected.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let now = self.clock.now_ms();
            let proto = P::connect(&self.shared, &mut self.per_loop, &stream, i, now);
            self.conns[i] = Some(Conn {
                io: Io {
                    stream,
                    input: vec![0; P::READ_CHUNK_BYTES],
                    start: 0,
                    end: 0,
                    need: 0,
                    out: Vec::new(),
                    out_pos: 0,
                    drained: false,
                    eof: false,
                    closing: false,
                    active_ms: now,
                },
                proto,
                reported: 0,
            });
            // Data may have arrived before registration; drive it now.
            let now = self.clock.now_ms();
            if let Some(Some(conn)) = self.conns.get_mut(i) {
                let d = drive(conn, &self.shared, now);
                self.after(i, d);
                self.account(i);
            }
        }
    }

    /// The connection of this loop to close for a newcomer at the cap:
    /// silent at least [`Proto::EVICT_IDLE_MIN_MS`] with nothing pending,
    /// one that never authenticated before one that did, then the one
    /// silent longest.
    fn evictable(&self) -> Option<(usize, bool, u64)> {
        let now = self.clock.now_ms();
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
            .filter(|(_, c)| {
                !c.pending() && now.saturating_sub(c.io.active_ms) >= P::EVICT_IDLE_MIN_MS
            })
            .map(|(i, c)| (i, c.proto.authenticated(), c.io.active_ms))
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
                    tracing::debug!(
                        "closing the longest-idle {} connection for a newcomer",
                        P::NAME
                    );
                    self.board.evicted();
                    self.close(i);
                    P::counters(&self.shared)
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
        if !P::take_killed(&self.per_loop) {
            return;
        }
        for i in 0..self.conns.len() {
            if self.conns[i].as_ref().is_some_and(|c| c.proto.killed()) {
                tracing::debug!("closing a {} connection CLIENT KILL named", P::NAME);
                self.close(i);
            }
        }
    }

    /// Closes connections silent past the idle timeout with no command
    /// pending, those silent for [`Proto::LARGE_STALL_MS`] in the
    /// middle of a large value (which hold a share of the server's
    /// receiving bound), and those whose reply holding a large value is
    /// unwritten past [`Proto::large_reply_ms`] (which keep the value in
    /// the large budget), at most once per `IDLE_CHECK_INTERVAL_MS`.
    fn close_idle(&mut self) {
        let idle_timeout_ms = P::idle_timeout_ms(&self.shared, self.idle_timeout_ms);
        let large_reply_ms = P::large_reply_ms(&self.shared);
        if idle_timeout_ms == 0 && P::LARGE_STALL_MS.is_none() && large_reply_ms == 0 {
            return;
        }
        let now = self.clock.now_ms();
        if now.saturating_sub(self.last_idle_check_ms) < IDLE_CHECK_INTERVAL_MS {
            return;
        }
        self.last_idle_check_ms = now;
        for i in 0..self.conns.len() {
            let Some(c) = self.conns[i].as_ref() else {
                continue;
            };
            let silent = now.saturating_sub(c.io.active_ms);
            let idle = idle_timeout_ms != 0 && !c.pending() && silent >= idle_timeout_ms;
            let stalled = c.proto.receiving() && P::LARGE_STALL_MS.is_some_and(|ms| silent >= ms);
            let unread = large_reply_ms != 0
                && c.proto
                    .large_reply()
                    .is_some_and(|clock| clock.outlived(now, large_reply_ms));
            if unread {
                tracing::debug!(
                    "closing a {} connection that did not read a large value within {large_reply_ms} ms",
                    P::NAME
                );
                self.close(i);
                continue;
            }
            if idle || stalled {
                tracing::debug!(
                    "closing a {} connection silent for {silent} ms{}",
                    P::NAME,
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

    /// Reports connection `i`'s buffered bytes to [`ClientMemory`] if they
    /// changed since its last report (a steady pipeline's do not, so it
    /// costs no shared write), and closes the connections using the most,
    /// here or in another loop, while the total is over the cap.
    fn account(&mut self, i: usize) {
        let Some(Some(c)) = self.conns.get_mut(i) else {
            return;
        };
        let now = c.held_bytes();
        if now == c.reported {
            return;
        }
        if now > c.reported {
            self.mem.used.fetch_add(now - c.reported, Ordering::Relaxed);
        } else {
            self.mem.used.fetch_sub(c.reported - now, Ordering::Relaxed);
        }
        c.reported = now;
        self.mem
            .recent_max_input
            .fetch_max(c.io.input.len(), Ordering::Relaxed);
        self.mem
            .recent_max_output
            .fetch_max(c.io.out.capacity(), Ordering::Relaxed);
        if now > self.largest.load(Ordering::Relaxed) {
            self.largest.store(now, Ordering::Relaxed);
        }
        if self.mem.over_cap() {
            self.enforce_cap();
        }
    }

    /// While the connections' total is over the cap: publishes this loop's
    /// exact largest, and closes it if it is the largest of the server,
    /// else asks the loop that holds that one (which does the same when it
    /// wakes, so a stale figure is corrected on the way).
    fn enforce_cap(&mut self) {
        while self.mem.over_cap() {
            let mine = self
                .conns
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.as_ref().map(|c| (i, c.reported)))
                .max_by_key(|&(_, n)| n);
            self.largest
                .store(mine.map_or(0, |(_, n)| n), Ordering::Relaxed);
            let (ask, top) = {
                let loops = self.mem.lock();
                let top = loops
                    .iter()
                    .max_by_key(|l| l.largest.load(Ordering::Relaxed))
                    .filter(|l| l.largest.load(Ordering::Relaxed) > 0);
                match top {
                    Some(l) if !Arc::ptr_eq(&l.largest, &self.largest) => {
                        l.asked.store(true, Ordering::Release);
                        (Some(l.waker.clone()), 0)
                    }
                    Some(l) => (None, l.largest.load(Ordering::Relaxed)),
                    None => return,
                }
            };
            if let Some(w) = ask {
                let _ = w.wake();
                return;
            }
            let Some((i, _)) = mine.filter(|&(_, n)| n == top && n > 0) else {
                return;
            };
            tracing::info!(
                "closing a {} connection holding {top} bytes: clients hold more than maxmemory-clients ({} bytes)",
                P::NAME,
                self.mem.cap
            );
            self.mem.evicted.fetch_add(1, Ordering::Relaxed);
            self.close(i);
        }
    }

    fn close(&mut self, i: usize) {
        if let Some(mut c) = self.conns[i].take() {
            self.mem.used.fetch_sub(c.reported, Ordering::Relaxed);
            let _ = self.poll.registry().deregister(&mut c.io.stream);
            P::counters(&self.shared)
                .connected
                .fetch_sub(1, Ordering::AcqRel);
            self.free.push(i);
        }
    }
}

/// The first half of a wake-up: reads and executes what one read brings,
/// leaving the replies for [`drive`] to write.
fn fill<P: Proto>(c: &mut Conn<P>, shared: &P::Shared, now_ms: u64) {
    if c.io.closing || c.io.eof || c.io.drained || c.output_pending() {
        return;
    }
    if c.proto.receiving() {
        if c.proto.read_large(&mut c.io).is_ok() && !c.proto.receiving() {
            c.execute(shared, now_ms);
        }
        return;
    }
    if !make_room::<P>(&mut c.io) {
        return;
    }
    // An error is left for drive, which meets it again and closes.
    if c.io.read_once().is_ok() {
        c.execute(shared, now_ms);
    }
}

/// Executes, writes and reads for one connection until it has nothing to
/// do or must wait for the socket.
fn drive<P: Proto>(c: &mut Conn<P>, shared: &P::Shared, now_ms: u64) -> Drive {
    loop {
        // 1. Execute what is buffered (bounded by the output soft limit).
        let more_buffered = c.execute(shared, now_ms);
        // A failed AUTH parks the connection, its reply unsent.
        let held_until_ms = c.proto.held_until_ms();
        if held_until_ms > now_ms {
            return Drive::Held(held_until_ms);
        }
        // 2. Write the replies.
        while c.output_pending() {
            match c.proto.write_some(&mut c.io) {
                Ok(0) => return Drive::Close,
                Ok(n) => c.proto.advance_out(&mut c.io, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Drive::Keep,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Drive::Close,
            }
        }
        c.reset_out();
        if c.io.closing || (c.io.eof && !more_buffered) {
            return Drive::Close;
        }
        if more_buffered {
            continue;
        }
        if c.io.drained {
            compact_idle::<P>(&mut c.io);
            return Drive::Keep;
        }
        // 3. Read more.
        if c.proto.receiving() {
            if c.proto.read_large(&mut c.io).is_err() {
                return Drive::Close;
            }
            continue;
        }
        if !make_room::<P>(&mut c.io) {
            // A command over every bound: the parser refuses it before this.
            return Drive::Close;
        }
        if c.io.read_once().is_err() {
            return Drive::Close;
        }
    }
}

impl<P: Proto> Conn<P> {
    /// Runs the buffered commands; returns true when it stopped for output
    /// room with whole commands possibly left.
    fn execute(&mut self, shared: &P::Shared, now_ms: u64) -> bool {
        if self.io.closing || self.io.end - self.io.start < self.io.need.max(1) {
            return false;
        }
        self.proto.execute(&mut self.io, shared, now_ms)
    }

    /// Whether anything is pending: unparsed input, a large value being
    /// received, or replies not yet written.
    fn pending(&self) -> bool {
        self.io.start != self.io.end || self.proto.receiving() || self.output_pending()
    }

    /// Bytes this connection holds beyond every connection's allowance
    /// (see [`ClientMemory`]).
    fn held_bytes(&self) -> usize {
        self.io.input.len().saturating_sub(P::READ_CHUNK_BYTES)
            + self
                .io
                .out
                .capacity()
                .saturating_sub(P::IDLE_BUFFER_BYTES_MAX)
            + self.proto.held_bytes()
    }

    /// Whether replies are waiting to be written.
    fn output_pending(&self) -> bool {
        self.io.out_pos < self.io.out.len() || self.proto.output_queued()
    }

    fn reset_out(&mut self) {
        self.io.out.clear();
        self.io.out_pos = 0;
        self.proto.reset_out();
        if self.io.out.capacity() > P::IDLE_BUFFER_BYTES_MAX {
            self.io.out = Vec::new();
        }
    }
}

/// Gives back a large input buffer once nothing is pending in it.
fn compact_idle<P: Proto>(io: &mut Io) {
    if io.start == io.end {
        io.start = 0;
        io.end = 0;
        if io.input.len() > P::IDLE_BUFFER_BYTES_MAX {
            io.input = vec![0; P::READ_CHUNK_BYTES];
        }
    }
}

/// Makes room for a read: moves pending bytes to the front, and grows the
/// buffer (up to [`Proto::INPUT_BYTES_MAX`]) when a command needs more.
fn make_room<P: Proto>(io: &mut Io) -> bool {
    if io.start == io.end {
        io.start = 0;
        io.end = 0;
    }
    if io.input.len() - io.end >= P::READ_CHUNK_BYTES {
        return true;
    }
    let pending = io.end - io.start;
    if io.start > 0 {
        io.input.copy_within(io.start..io.end, 0);
        io.start = 0;
        io.end = pending;
    }
    let want = (pending.max(io.need) + P::READ_CHUNK_BYTES).min(P::INPUT_BYTES_MAX);
    if io.input.len() < want {
        io.input.resize(want, 0);
    }
    io.input.len() > io.end
}
