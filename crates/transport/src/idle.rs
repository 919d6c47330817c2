//! Room at the connection cap: the longest-idle connection makes way.
//!
//! Refusing every new client while `CONNECTIONS_MAX` connections sit idle
//! lets anyone who opens that many sockets lock everyone else out. So each
//! worker's port reports, at each of its idle checks, since when its
//! longest-idle connection (nothing in flight) has been silent. While some
//! port has one, a newcomer at the cap is judged as fitting
//! ([`IdleBoard::fits`]); only once its hello is accepted does the acceptor
//! ask the port holding the oldest idle connection to close it
//! ([`IdleBoard::make_room`]), so a socket that never completes a
//! handshake evicts no one. With no idle connection anywhere, the
//! newcomer is refused as before.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::Waker;

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

/// The connections of one worker port as the idle rules see them: what
/// the tcp, shm and fabric ports each say about their own connections,
/// so that making way at the cap and reporting to the board are written
/// once.
pub trait IdleConns {
    /// The board this port reports to, and its place there.
    fn idle_board(&self) -> Option<&(Arc<IdleBoard>, usize)>;

    /// Connection slots, empty ones included.
    fn slots(&self) -> usize;

    /// When the connection in `slot` last saw a request, if it has
    /// nothing in flight; `None` for an empty slot or a busy connection.
    fn slot_idle_since(&self, slot: usize) -> Option<Instant>;

    /// Closes the connection in `slot` for its idleness (and counts it).
    fn close_for_idleness(&mut self, slot: usize);

    /// Moves the connection in `slot`'s last activity to `now` if it saw
    /// a request since the last check.
    fn note_activity(&mut self, slot: usize, now: Instant);

    /// At an idle check (`now`): notes each connection's activity and
    /// closes those silent `timeout` or longer with nothing in flight.
    fn close_idle_past(&mut self, now: Instant, timeout: Option<std::time::Duration>) {
        for slot in 0..self.slots() {
            self.note_activity(slot, now);
            let idle_for = self.slot_idle_since(slot).map(|t| now.duration_since(t));
            if let (Some(idle), Some(d)) = (timeout, idle_for) {
                if d >= idle {
                    tracing::debug!("closing a connection idle for {idle:?}");
                    self.close_for_idleness(slot);
                }
            }
        }
    }

    /// Closes the longest-idle connections the acceptor asked for, one per
    /// eviction asked; an eviction with nothing idle to close is declined.
    fn evict_idle(&mut self) {
        // One load on the hot path; the board is cloned only to evict.
        let asked = match self.idle_board() {
            Some((board, me)) => board.take_evictions(*me),
            None => return,
        };
        let Some((board, me)) = self.idle_board().cloned().filter(|_| asked > 0) else {
            return;
        };
        for _ in 0..asked {
            let oldest = (0..self.slots())
                .filter_map(|s| Some((s, self.slot_idle_since(s)?)))
                .min_by_key(|&(_, t)| t);
            match oldest {
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
    /// been silent (or that it has none); returns whether it has one.
    fn report_idle(&self) -> bool {
        let Some((board, me)) = self.idle_board() else {
            return false;
        };
        let oldest = (0..self.slots())
            .filter_map(|s| self.slot_idle_since(s))
            .min();
        board.report(*me, oldest);
        oldest.is_some()
    }
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
