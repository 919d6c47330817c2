//! Room at the connection cap: the longest-idle connection makes way.
//!
//! Refusing every new client while `CONNECTIONS_MAX` connections sit idle
//! lets anyone who opens that many sockets lock everyone else out. So each
//! worker's port reports, at each of its idle checks, since when its
//! longest-idle connection (nothing in flight) has been silent. While some
//! port has one, a newcomer at the cap is judged as fitting
//! ([`IdleBoard::fits`]); only once its opening is accepted does the acceptor
//! ask the port holding the oldest idle connection to close it
//! ([`IdleBoard::make_room`]), so a socket that never completes a
//! handshake evicts no one. With no idle connection anywhere, the
//! newcomer is refused as before.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Waker;

/// How often the shm and fabric ports look for idle connections, in
/// milliseconds ([`IdleConns::check_idle`]): the idle timeout is enforced
/// to within this, and a walk over every connection twice a second costs
/// nothing measurable. (The tcp port checks at its stalled-message
/// interval instead, which is shorter.)
pub const IDLE_CHECK_INTERVAL_MS: u64 = 500;

/// What one port last reported, and the evictions asked of it.
struct PortIdle {
    /// When its longest-idle connection last saw a request, in
    /// milliseconds since the board's epoch plus one; 0 when it has none.
    idle_since_ms: AtomicU64,
    /// Evictions asked of it and not yet taken.
    evictions: AtomicUsize,
    /// Wakes the port, so an eviction does not wait for its next poll.
    waker: Waker,
}

/// Shared by one listener's acceptor and ports; see the module docs.
pub struct IdleBoard {
    epoch: Instant,
    ports: Vec<PortIdle>,
    /// Evictions asked for and not yet done or declined: the newcomers
    /// they make room for count as fitting meanwhile.
    pending: AtomicUsize,
}

impl IdleBoard {
    /// A board for ports woken by `wakers`, in worker order.
    pub fn new(wakers: Vec<Waker>) -> Arc<IdleBoard> {
        Arc::new(IdleBoard {
            epoch: Instant::now(),
            ports: wakers
                .into_iter()
                .map(|waker| PortIdle {
                    idle_since_ms: AtomicU64::new(0),
                    evictions: AtomicUsize::new(0),
                    waker,
                })
                .collect(),
            pending: AtomicUsize::new(0),
        })
    }

    /// Port `port` reports since when its longest-idle connection has been
    /// silent, or that it has none.
    pub fn report(&self, port: usize, idle_since: Option<Instant>) {
        let ms = idle_since.map_or(0, |t| {
            t.saturating_duration_since(self.epoch).as_millis() as u64 + 1
        });
        if let Some(p) = self.ports.get(port) {
            p.idle_since_ms.store(ms, Ordering::Relaxed);
        }
    }

    /// The port holding the longest-idle connection, as last reported.
    fn oldest(&self) -> Option<usize> {
        self.ports
            .iter()
            .map(|p| p.idle_since_ms.load(Ordering::Relaxed))
            .enumerate()
            .filter(|&(_, ms)| ms != 0)
            .min_by_key(|&(_, ms)| ms)
            .map(|(port, _)| port)
    }

    /// The open count a newcomer is judged by against `cap`: `open` less
    /// the evictions under way, and one below the cap when it is reached
    /// but some connection is idle (it will make way).
    pub fn fits(&self, open: usize, cap: usize) -> usize {
        let effective = open.saturating_sub(self.pending.load(Ordering::Acquire));
        if effective >= cap && self.oldest().is_some() {
            cap - 1
        } else {
            effective
        }
    }

    /// A newcomer was accepted with `open` connections open: at `cap`,
    /// asks the port holding the longest-idle connection to close it.
    pub fn make_room(&self, open: usize, cap: usize) {
        if open.saturating_sub(self.pending.load(Ordering::Acquire)) < cap {
            return;
        }
        let Some(port) = self.oldest() else {
            return;
        };
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.ports[port].evictions.fetch_add(1, Ordering::AcqRel);
        self.ports[port].waker.wake();
    }

    /// Evictions asked of `port` since its last call; it must answer each
    /// with [`IdleBoard::evicted`], whether it closed a connection or not.
    pub fn take_evictions(&self, port: usize) -> usize {
        match self.ports.get(port) {
            Some(p) if p.evictions.load(Ordering::Relaxed) > 0 => {
                p.evictions.swap(0, Ordering::AcqRel)
            }
            _ => 0,
        }
    }

    /// One eviction is about to be done: call it *before* closing the
    /// connection. Until the close lowers `open`, the victim is still
    /// counted there, so a newcomer judged in between sees one connection
    /// too many (and asks for an eviction it does need) instead of the
    /// victim taken off twice, once from `open` and once from `pending`,
    /// which would let it in over the cap.
    pub fn evicted(&self) {
        let _ = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Port `port` was asked for an eviction but holds nothing idle (its
    /// report was older than its last eviction). Its report is cleared and
    /// the eviction passes to the port now holding the longest-idle
    /// connection; only when no port has one is it dropped, so a stale
    /// report does not let a newcomer in over the cap while another port
    /// could have made way. Each call clears one report, so passing it on
    /// ends.
    pub fn declined(&self, port: usize) {
        self.report(port, None);
        match self.oldest() {
            Some(next) => {
                self.ports[next].evictions.fetch_add(1, Ordering::AcqRel);
                self.ports[next].waker.wake();
            }
            None => self.evicted(),
        }
    }
}

/// When one connection last saw a request, as the idle rules read it.
pub struct Activity {
    /// Requests arrived since the port's last idle check.
    active: bool,
    /// When the port's idle check last found requests arrived (or the
    /// connection opened).
    at: Instant,
}

impl Activity {
    /// A connection opened at `now`.
    pub fn new(now: Instant) -> Activity {
        Activity {
            active: false,
            at: now,
        }
    }

    /// A request arrived: one store on the hot path, read at the next
    /// idle check (which takes the time once, not per request).
    #[inline]
    pub fn touch(&mut self) {
        self.active = true;
    }
}

/// One connection as the idle rules see it.
pub trait IdleConn {
    /// Its last activity.
    fn activity(&mut self) -> &mut Activity;

    /// Whether it holds a request not yet handled or a reply not yet
    /// sent: such a connection is never idle, however long it is silent.
    fn busy(&self) -> bool;

    /// When it last saw a request, if it has nothing in flight.
    fn idle_since(&mut self) -> Option<Instant> {
        let busy = self.busy();
        let a = self.activity();
        (!a.active && !busy).then_some(a.at)
    }
}

/// A port's side of the idle rules: its timeout, its place on the
/// listener's board, and what it last told the board.
pub struct IdleWatch {
    /// Connections silent this long with nothing in flight are closed.
    timeout: Option<Duration>,
    /// Where this port (the index) reports its longest-idle connection
    /// and takes evictions from.
    board: Option<(Arc<IdleBoard>, usize)>,
    /// The last report to the board named an idle connection.
    reported_idle: bool,
    /// When [`IdleConns::check_idle`] last ran.
    last_check: Instant,
}

impl IdleWatch {
    /// No timeout and no board, until the port is told of them.
    pub fn new() -> IdleWatch {
        IdleWatch {
            timeout: None,
            board: None,
            reported_idle: false,
            last_check: Instant::now(),
        }
    }

    /// Closes connections silent `timeout` or longer (`None`: never).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }

    /// Reports to, and takes evictions from, `board` as port `index`.
    pub fn set_board(&mut self, board: Arc<IdleBoard>, index: usize) {
        self.board = Some((board, index));
    }

    /// A connection opened. A burst of connections up to the cap must not
    /// wait for the next idle check before one of them can make way, so
    /// the port reports one idle now unless its last report did.
    pub fn opened(&mut self) {
        if let Some((board, me)) = &self.board {
            if !self.reported_idle {
                board.report(*me, Some(Instant::now()));
                self.reported_idle = true;
            }
        }
    }
}

impl Default for IdleWatch {
    fn default() -> Self {
        IdleWatch::new()
    }
}

/// The connections of one worker port as the idle rules see them: the
/// tcp, shm and fabric ports each give their watch, their connection
/// slots and how they close one, so that the timeout, making way at the
/// cap and reporting to the board are written once.
pub trait IdleConns {
    /// The port's connection.
    type Conn: IdleConn;

    /// The port's watch and its connection slots, empty ones included.
    fn idle_view(&mut self) -> (&mut IdleWatch, &mut [Option<Self::Conn>]);

    /// Closes the connection in `slot` for its idleness (and counts it).
    fn close_for_idleness(&mut self, slot: usize);

    /// At an idle check (`now`): notes each connection's activity and
    /// closes those silent past the timeout with nothing in flight.
    fn close_idle_past(&mut self, now: Instant) {
        let (watch, conns) = self.idle_view();
        let (timeout, slots) = (watch.timeout, conns.len());
        for slot in 0..slots {
            let (_, conns) = self.idle_view();
            let Some(c) = conns[slot].as_mut() else {
                continue;
            };
            let a = c.activity();
            if std::mem::take(&mut a.active) {
                a.at = now;
            }
            let idle_for = c.idle_since().map(|t| now.duration_since(t));
            if let (Some(idle), Some(d)) = (timeout, idle_for) {
                if d >= idle {
                    tracing::debug!("closing a connection idle for {idle:?}");
                    self.close_for_idleness(slot);
                }
            }
        }
    }

    /// The slot of the longest-idle connection, if one is idle.
    fn oldest_idle(&mut self) -> Option<(usize, Instant)> {
        let (_, conns) = self.idle_view();
        conns
            .iter_mut()
            .enumerate()
            .filter_map(|(s, c)| Some((s, c.as_mut()?.idle_since()?)))
            .min_by_key(|&(_, t)| t)
    }

    /// Closes the longest-idle connections the acceptor asked for, one per
    /// eviction asked; an eviction with nothing idle to close is declined.
    fn evict_idle(&mut self) {
        // One load on the hot path; the board is cloned only to evict.
        let asked = match &self.idle_view().0.board {
            Some((board, me)) => board.take_evictions(*me),
            None => return,
        };
        let Some((board, me)) = self.idle_view().0.board.clone().filter(|_| asked > 0) else {
            return;
        };
        for _ in 0..asked {
            match self.oldest_idle() {
                Some((slot, _)) => {
                    tracing::debug!("closing the longest-idle connection for a new one");
                    board.evicted();
                    self.close_for_idleness(slot);
                }
                None => board.declined(me),
            }
        }
    }

    /// Tells the board since when this port's longest-idle connection has
    /// been silent (or that it has none).
    fn report_idle(&mut self) {
        if self.idle_view().0.board.is_none() {
            return;
        }
        let oldest = self.oldest_idle().map(|(_, t)| t);
        let (watch, _) = self.idle_view();
        if let Some((board, me)) = &watch.board {
            board.report(*me, oldest);
            watch.reported_idle = oldest.is_some();
        }
    }

    /// Closes connections idle past the timeout and reports the
    /// longest-idle one, at most once per [`IDLE_CHECK_INTERVAL_MS`].
    fn check_idle(&mut self, now: Instant) {
        let (watch, _) = self.idle_view();
        if watch.timeout.is_none() && watch.board.is_none() {
            return;
        }
        if now.duration_since(watch.last_check) < Duration::from_millis(IDLE_CHECK_INTERVAL_MS) {
            return;
        }
        watch.last_check = now;
        self.close_idle_past(now);
        self.report_idle();
    }
}

/// Implements [`IdleConn`] for a port's connection and [`IdleConns`] for
/// the port, for the ports laid out alike (tcp, shm, fabric): the port
/// holds `idle: IdleWatch`, `conns: Vec<Option<Conn>>` and
/// `stats: PortStats`, and closes a slot with `close(&mut self, slot)`;
/// the connection holds `activity: Activity`. The closure-like last
/// argument says when a connection `c` holds a request not yet handled
/// or a reply not yet sent, the one thing the ports differ in.
#[macro_export]
macro_rules! idle_conns {
    ($port:ty, $conn:ty, |$c:ident| $busy:expr) => {
        impl $crate::idle::IdleConn for $conn {
            fn activity(&mut self) -> &mut $crate::idle::Activity {
                &mut self.activity
            }

            fn busy(&self) -> bool {
                let $c = self;
                $busy
            }
        }

        impl $crate::idle::IdleConns for $port {
            type Conn = $conn;

            fn idle_view(&mut self) -> (&mut $crate::idle::IdleWatch, &mut [Option<$conn>]) {
                (&mut self.idle, &mut self.conns)
            }

            fn close_for_idleness(&mut self, slot: usize) {
                self.stats.conns_closed_timeout += 1;
                self.close(slot);
            }
        }
    };
}

/// The [`WorkerPort`](crate::WorkerPort) methods that the ports laid out
/// alike (see [`idle_conns!`]) answer the same way from their fields:
/// `set_idle_timeout` sets `idle`'s timeout and `stats` copies `stats`.
/// The closure-like argument makes the port `p`'s
/// [`Waker`](crate::Waker), the one thing they differ in (a mio waker on
/// tcp and fabric, an eventfd on shm). Invoked inside the port's
/// `impl WorkerPort`; none of these is on the message path.
#[macro_export]
macro_rules! port_accessors {
    (waker: |$p:ident| $waker:expr) => {
        fn set_idle_timeout(&mut self, timeout: Option<std::time::Duration>) {
            self.idle.set_timeout(timeout);
        }

        fn waker(&self) -> $crate::Waker {
            let $p = self;
            $waker
        }

        fn stats(&self) -> $crate::PortStats {
            self.stats
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn at_the_cap_the_port_with_the_oldest_idle_connection_is_asked() {
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        let board = IdleBoard::new(vec![
            Waker::new(|| {}),
            Waker::new(move || {
                w.fetch_add(1, Ordering::Relaxed);
            }),
        ]);
        let now = Instant::now();
        assert_eq!(board.fits(4, 5), 4, "below the cap");
        assert_eq!(board.fits(5, 5), 5, "no idle connection: refused");
        board.make_room(5, 5);
        assert_eq!(woken.load(Ordering::Relaxed), 0, "nothing to evict");
        board.report(0, Some(now + Duration::from_millis(10)));
        board.report(1, Some(now));
        assert_eq!(board.fits(5, 5), 4, "the newcomer fits");
        board.make_room(4, 5);
        assert_eq!(woken.load(Ordering::Relaxed), 0, "below the cap");
        board.make_room(5, 5);
        assert_eq!(woken.load(Ordering::Relaxed), 1);
        assert_eq!(board.take_evictions(0), 0);
        assert_eq!(board.take_evictions(1), 1);
        assert_eq!(board.fits(6, 6), 5, "evictions under way count as room");
        board.evicted();
        board.report(0, None);
        board.report(1, None);
        assert_eq!(board.fits(5, 5), 5, "no idle connection left");
    }

    #[test]
    fn a_declined_eviction_passes_to_the_next_idle_port_or_is_dropped() {
        let board = IdleBoard::new(vec![Waker::new(|| {}), Waker::new(|| {})]);
        let now = Instant::now();
        board.report(0, Some(now));
        board.report(1, Some(now + Duration::from_millis(10)));
        board.make_room(5, 5);
        assert_eq!(board.take_evictions(0), 1, "the oldest port is asked");
        board.declined(0);
        assert_eq!(board.take_evictions(0), 0, "not asked again");
        assert_eq!(board.take_evictions(1), 1, "passed to the other port");
        assert_eq!(board.fits(5, 5), 4, "still under way: counts as room");
        board.declined(1);
        assert_eq!(board.take_evictions(0) + board.take_evictions(1), 0);
        assert_eq!(board.fits(6, 5), 6, "dropped: nothing idle anywhere");
    }
}
