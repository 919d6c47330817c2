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
//!
//! Layout: this file holds the [`Proto`] contract and [`start`]; `memory`
//! the [`ClientMemory`] account; `conn` one connection's socket, buffers
//! and wake-up (fill, drive); `event_loop` the thread's epoll loop
//! (accepting, parking, idle timeout and board, the memory cap).

use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Poll, Token, Waker};

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

mod conn;
mod event_loop;
mod memory;

pub(crate) use conn::Io;
use event_loop::Loop;
pub(crate) use memory::ClientMemory;
use memory::LoopShare;

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
        $crate::text_socket::Counters {
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
    /// The clock of the replies holding large values that wait to be
    /// written; `None` when none does.
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
    /// Whether every reply buffered shows only what the followers replies
    /// wait for already have (settled reads), so that the replies need
    /// not wait for a replication round. Unknown is unsettled.
    fn replies_settled(&self) -> bool {
        false
    }
}

/// The running front-end: where it listens, and how to stop it.
pub(crate) struct FrontEnd {
    pub addr: SocketAddr,
    pub wakers: Vec<Arc<Waker>>,
    pub threads: Vec<JoinHandle<()>>,
}

/// What the loops of both text front ends share with the rest of the
/// server.
#[derive(Clone)]
pub(crate) struct LoopEnv {
    /// The engine clock.
    pub clock: Clock,
    /// What every connection buffers, and its cap.
    pub client_memory: Arc<ClientMemory>,
    /// What replies wait for before they are written.
    pub gate: Arc<fabrickv_rpc::gate::FlushGate>,
    /// Set to stop every loop.
    pub stop: Arc<AtomicBool>,
    /// The request threads a hand-over waits out; every loop is one.
    pub quiescence: Arc<fabrickv_rpc::quiesce::Quiescence>,
}

/// Listens on `addr` and starts `threads` loops over the state `shared`
/// builds (given the port actually bound; two front ends may share one
/// state). Threads started before a failure see `stop` only when the
/// caller sets it.
pub(crate) fn start<P: Proto>(
    addr: &str,
    threads: usize,
    shared: impl FnOnce(u16) -> Arc<P::Shared>,
    idle_timeout: Option<Duration>,
    env: &LoopEnv,
) -> io::Result<FrontEnd> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let local = std_listener.local_addr()?;
    let shared = shared(local.port());
    let idle_timeout_ms =
        idle_timeout.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    P::set_idle_timeout(&shared, idle_timeout_ms);
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
        let stop = env.stop.clone();
        let clock = env.clock;
        let board = board.clone();
        let per_loop = P::per_loop(t, threads, &wakers[t]);
        let largest = Arc::new(AtomicUsize::new(0));
        let asked = Arc::new(AtomicBool::new(false));
        env.client_memory.lock().push(LoopShare {
            largest: largest.clone(),
            asked: asked.clone(),
            waker: wakers[t].clone(),
        });
        let client_memory = env.client_memory.clone();
        let waker = wakers[t].clone();
        let settling_flag = env.gate.add_waiter(Box::new(move || {
            let _ = waker.wake();
        }));
        let gate = env.gate.clone();
        let participant = env.quiescence.participant();
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
                        gate,
                        settling: Vec::new(),
                        settling_flag,
                        participant,
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
