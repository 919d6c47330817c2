//! Chunked transfers a server holds open for a client: a large value
//! being received or read piece by piece (native kv, cache), a large reply
//! a client has not read yet (RESP), a copy run its target has not
//! started. Each holds memory (a buffer, a pinned value, a snapshot), and
//! the server is not always told when its client goes away, so each is
//! dropped once it has not moved for a while or has lived too long.
//!
//! [`TransferClock`] is that bookkeeping, once: when a transfer began and
//! when it last moved, in milliseconds of the caller's clock (the engine's
//! `now_ms`, so that tests step it by hand). [`Transfers`] keeps the
//! transfers of one worker's connections by key, each with its clock,
//! and drops the idle ones in its sweep.

use std::collections::HashMap;
use std::hash::Hash;

/// When a transfer began and when it last moved, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferClock {
    since_ms: u64,
    last_ms: u64,
}

impl TransferClock {
    /// A transfer beginning at `now_ms`.
    pub fn start(now_ms: u64) -> TransferClock {
        TransferClock {
            since_ms: now_ms,
            last_ms: now_ms,
        }
    }

    /// The transfer moved at `now_ms` (a piece in or out).
    pub fn touch(&mut self, now_ms: u64) {
        self.last_ms = self.last_ms.max(now_ms);
    }

    /// When the transfer began.
    pub fn since_ms(&self) -> u64 {
        self.since_ms
    }

    /// Whether the transfer has not moved for more than `idle_ms` at
    /// `now_ms`.
    pub fn idle(&self, now_ms: u64, idle_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_ms) > idle_ms
    }

    /// Whether `life_ms` have passed since the transfer began, at
    /// `now_ms`, however it moved meanwhile.
    pub fn outlived(&self, now_ms: u64, life_ms: u64) -> bool {
        now_ms.saturating_sub(self.since_ms) >= life_ms
    }
}

/// The open transfers of one worker's connections, by key (a connection,
/// or a connection and a transfer id), each with its [`TransferClock`].
#[derive(Debug)]
pub struct Transfers<K, T> {
    open: HashMap<K, (TransferClock, T)>,
}

impl<K, T> Default for Transfers<K, T> {
    fn default() -> Self {
        Transfers {
            open: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq, T> Transfers<K, T> {
    /// No transfer open.
    pub fn new() -> Self {
        Self::default()
    }

    /// Transfers open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Opens a transfer under `key` at `now_ms`, replacing (and dropping)
    /// the one open there.
    pub fn open(&mut self, key: K, transfer: T, now_ms: u64) {
        self.open
            .insert(key, (TransferClock::start(now_ms), transfer));
    }

    /// The transfer under `key` and its clock.
    pub fn get_mut(&mut self, key: &K) -> Option<(&mut TransferClock, &mut T)> {
        self.open.get_mut(key).map(|(c, t)| (c, t))
    }

    /// The transfer under `key`, moved at `now_ms`.
    pub fn touch(&mut self, key: &K, now_ms: u64) -> Option<&mut T> {
        let (clock, t) = self.open.get_mut(key)?;
        clock.touch(now_ms);
        Some(t)
    }

    /// Closes the transfer under `key` (finished or refused).
    pub fn remove(&mut self, key: &K) -> Option<T> {
        self.open.remove(key).map(|(_, t)| t)
    }

    /// Drops the transfers idle for more than `idle_ms` at `now_ms`;
    /// returns how many.
    pub fn sweep(&mut self, now_ms: u64, idle_ms: u64) -> usize {
        self.sweep_with(|clock, _| !clock.idle(now_ms, idle_ms))
    }

    /// Keeps the transfers `keep` says to (it may also change them, e.g.
    /// free what one holds and keep its entry); returns how many went.
    pub fn sweep_with(&mut self, mut keep: impl FnMut(&TransferClock, &mut T) -> bool) -> usize {
        let before = self.open.len();
        self.open.retain(|_, (clock, t)| keep(clock, t));
        before - self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_is_idle_after_its_last_move_and_outlived_after_its_start() {
        let mut c = TransferClock::start(100);
        c.touch(150);
        assert!(!c.idle(160, 10));
        assert!(c.idle(161, 10));
        assert!(!c.outlived(199, 100));
        assert!(c.outlived(200, 100));
        // A clock never runs back.
        c.touch(120);
        assert!(!c.idle(160, 10));
        assert_eq!(c.since_ms(), 100);
    }

    #[test]
    fn the_sweep_drops_idle_transfers_and_keeps_moving_ones() {
        let mut t: Transfers<u32, &str> = Transfers::new();
        t.open(1, "a", 0);
        t.open(2, "b", 0);
        assert_eq!(t.touch(&2, 50).copied(), Some("b"));
        assert_eq!(t.sweep(60, 40), 1);
        assert_eq!(t.len(), 1);
        assert!(t.get_mut(&1).is_none());
        t.open(2, "c", 70);
        assert_eq!(t.remove(&2), Some("c"));
        assert!(t.is_empty());
    }
}
