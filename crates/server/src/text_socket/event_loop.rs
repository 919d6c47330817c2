//! One thread's epoll loop: accepting at the connection cap, driving
//! ready connections, parked ones, idle timeouts and the idle board, and
//! the cap on what connections buffer.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};

use fabrickv_transport::idle::IdleBoard;

use super::conn::{drive, fill, Conn, Drive, Io};
use super::{
    ClientMemory, Proto, EVENTS_PER_POLL, FIRST_CONN, IDLE_CHECK_INTERVAL_MS,
    IDLE_REPORT_INTERVAL_MS, LISTENER, POLL_TIMEOUT_MS, WAKER,
};
use crate::service::Clock;

/// Longest wait of a loop holding replies on the flush gate, in
/// milliseconds (it is normally woken at once when they may go).
const SETTLING_POLL_MS: u64 = 1;

/// The descriptor of a loop's epoll instance, for a wait that also
/// watches other descriptors.
#[allow(unsafe_code)]
fn poll_fd(poll: &Poll) -> std::os::fd::BorrowedFd<'_> {
    // SAFETY: the descriptor is the epoll instance `poll` owns, open for
    // as long as `poll` is borrowed.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(std::os::fd::AsRawFd::as_raw_fd(poll)) }
}

pub(super) struct Loop<P: Proto> {
    pub(super) poll: Poll,
    pub(super) listener: TcpListener,
    pub(super) conns: Vec<Option<Conn<P>>>,
    pub(super) free: Vec<usize>,
    /// Parked connections, (deadline in engine ms, index): each is driven
    /// again once its deadline passes. An entry may outlive its
    /// connection; driving whatever holds the index then is harmless.
    pub(super) held: Vec<(u64, usize)>,
    pub(super) shared: Arc<P::Shared>,
    pub(super) clock: Clock,
    /// The idle timeout the front end started with, in ms (0: none);
    /// [`Proto::idle_timeout_ms`] may change it live.
    pub(super) idle_timeout_ms: u64,
    pub(super) last_idle_check_ms: u64,
    pub(super) per_loop: P::PerLoop,
    /// Where every loop says since when its most evictable connection has
    /// been idle, and asks another loop to close one at the cap.
    pub(super) board: Arc<IdleBoard>,
    /// This loop's place on the board.
    pub(super) port: usize,
    /// Reported for a loop holding a silent unauthenticated connection:
    /// older than any real idle time, so such connections go first (and
    /// when a silence is longer than an `Instant` can go back).
    pub(super) first: Instant,
    pub(super) last_report_ms: u64,
    /// What every connection of the server buffers, and its cap.
    pub(super) mem: Arc<ClientMemory>,
    /// This loop's largest report, as [`ClientMemory`] shows it.
    pub(super) largest: Arc<AtomicUsize>,
    /// Set when another loop asks this one to check the cap.
    pub(super) asked: Arc<AtomicBool>,
    /// What replies wait for before they are written.
    pub(super) gate: Arc<fabrickv_rpc::gate::FlushGate>,
    /// Connections holding replies on a gate ticket.
    pub(super) settling: Vec<usize>,
    /// Set while `settling` is not empty, so the gate wakes this loop.
    pub(super) settling_flag: Arc<AtomicBool>,
    /// Quiet while the loop waits, busy while it runs commands.
    pub(super) participant: fabrickv_rpc::quiesce::Participant,
}

impl<P: Proto> Loop<P> {
    pub(super) fn run(&mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        let mut ready: Vec<usize> = Vec::with_capacity(EVENTS_PER_POLL);
        self.participant.attach();
        // Blocks at once when there is nothing to do, as Redis and
        // memcached do: polling on for a few tens of microseconds after
        // each event (tried here, always and only when busy) cost more
        // server CPU per operation at every load `bench compare` measures,
        // pipelined or not, and won no throughput that held up between runs.
        while !stop.load(Ordering::Acquire) {
            let mut timeout = Duration::from_millis(POLL_TIMEOUT_MS);
            // Connections waiting on the gate: its wake-up may have come
            // before they were parked, so look again soon regardless.
            if !self.settling.is_empty() {
                timeout = timeout.min(Duration::from_millis(SETTLING_POLL_MS));
            }
            if let Some(first) = self.held.iter().map(|&(at, _)| at).min() {
                let wait = first.saturating_sub(self.clock.now_ms());
                timeout = timeout.min(Duration::from_millis(wait));
            }
            self.participant.quiet();
            // Holding replies: read the acknowledgements that settle them
            // here while nothing else comes (one wake-up, not a hand-off
            // from another thread), then take what came meanwhile.
            if !self.settling.is_empty() && self.gate.wait(Some(poll_fd(&self.poll)), timeout) {
                timeout = Duration::ZERO;
            }
            let polled = self.poll.poll(&mut events, Some(timeout));
            // Commands run from here until the next wait.
            self.participant.busy();
            match polled {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            ready.clear();
            self.take_released(&mut ready);
            self.take_settling(&mut ready);
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
                let d = drive(c, &self.shared, now, &self.gate);
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

    pub(super) fn after(&mut self, i: usize, d: Drive) {
        match d {
            Drive::Keep => {}
            Drive::Close => self.close(i),
            Drive::Held(until) => self.park(i, until),
            Drive::Settling => {
                if !self.settling.contains(&i) {
                    self.settling.push(i);
                }
                self.settling_flag.store(true, Ordering::Release);
            }
        }
    }

    /// Parks connection `i` until `until` (once, however many events it
    /// gets meanwhile: its input is left unread, so they stop coming).
    pub(super) fn park(&mut self, i: usize, until: u64) {
        if !self.held.contains(&(until, i)) {
            self.held.push((until, i));
        }
    }

    /// Moves the connections holding replies on a ticket to `ready`, to
    /// be driven again (those whose ticket is not done yet come back).
    pub(super) fn take_settling(&mut self, ready: &mut Vec<usize>) {
        if self.settling.is_empty() {
            return;
        }
        self.settling_flag.store(false, Ordering::Release);
        ready.append(&mut self.settling);
    }

    /// Moves the parked connections whose deadline has passed to `ready`.
    pub(super) fn take_released(&mut self, ready: &mut Vec<usize>) {
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

    pub(super) fn accept_all(&mut self) {
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
                ticket: None,
            });
            // Data may have arrived before registration; drive it now.
            let now = self.clock.now_ms();
            if let Some(Some(conn)) = self.conns.get_mut(i) {
                let d = drive(conn, &self.shared, now, &self.gate);
                self.after(i, d);
                self.account(i);
            }
        }
    }

    /// The connection of this loop to close for a newcomer at the cap:
    /// silent at least [`Proto::EVICT_IDLE_MIN_MS`] with nothing pending,
    /// one that never authenticated before one that did, then the one
    /// silent longest.
    pub(super) fn evictable(&self) -> Option<(usize, bool, u64)> {
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
    pub(super) fn serve_board(&mut self) {
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
    pub(super) fn close_killed(&mut self) {
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
    pub(super) fn close_idle(&mut self) {
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
    pub(super) fn account(&mut self, i: usize) {
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
    pub(super) fn enforce_cap(&mut self) {
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

    pub(super) fn close(&mut self, i: usize) {
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
