//! The one check every reply passes before it leaves a server: a worker
//! and a text front end's loop take a ticket ([`FlushGate::ticket`])
//! before writing what a burst produced, and hold the replies of the
//! connections that need one until it is done (a worker on a port that
//! cannot hold replies waits instead: [`FlushGate::before_flush`]).
//!
//! A server that replicates must not tell a client a write happened
//! before its backups have it, nor show a reader a value that a failover
//! could still take back; the replicator armed here says when that holds
//! for the replies made so far. One ticket covers every write of a
//! burst: the batching that keeps synchronous replication's cost to about
//! one round trip per burst. A reply its service calls settled
//! ([`reply_settled`]: a read of a partition with no write in flight)
//! needs none. A server that does not replicate never arms its gate, and
//! pays one relaxed load per burst.

use std::cell::Cell;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

thread_local! {
    static REQUEST_SETTLED: Cell<bool> = const { Cell::new(false) };
}

/// A worker is about to hand a request to its service: until the service
/// says otherwise ([`reply_settled`]), the reply may show anything.
#[inline]
pub fn request_begins() {
    REQUEST_SETTLED.set(false);
}

/// Said by a service, while it handles a request, when the reply changes
/// nothing and shows only what every follower the replies wait for
/// already has (a read of a partition with no write in flight): the
/// reply may leave without waiting for any round, as a clean read does
/// in CRAQ.
#[inline]
pub fn reply_settled() {
    REQUEST_SETTLED.set(true);
}

/// Whether the service handling the current request said its reply is
/// settled.
#[inline]
pub fn request_is_settled() -> bool {
    REQUEST_SETTLED.get()
}

/// What an armed gate runs before a flush.
pub trait Settle: Send + Sync {
    /// Returns once the replies produced so far may be sent.
    fn settle(&self);

    /// Without waiting on another thread: `None` when the replies
    /// produced so far may be sent now (the work that makes them so may
    /// have been done in this call), else a ticket that [`Settle::done`]
    /// answers once they may.
    fn ticket(&self) -> Option<u64>;

    /// Whether the replies a ticket was taken for may be sent.
    fn done(&self, ticket: u64) -> bool;

    /// Waits up to `timeout` for the work that settles tickets, doing it
    /// in this thread where it can (so the thread that will send the
    /// replies is the one woken), and returns early once `also` (the
    /// caller's own poll descriptor) is readable. False, at once, when
    /// there is nothing to wait on here: the caller waits its own way and
    /// is woken through its waker.
    fn wait(&self, also: Option<BorrowedFd<'_>>, timeout: Duration) -> bool;
}

/// A loop waiting on tickets: woken after work that may have settled one.
struct Waiter {
    /// Set by the loop while it holds connections on tickets.
    waiting: Arc<AtomicBool>,
    wake: Box<dyn Fn() + Send + Sync>,
}

/// A server's gate, shared by its workers and front-end loops.
#[derive(Default)]
pub struct FlushGate {
    armed: AtomicBool,
    settle: OnceLock<Arc<dyn Settle>>,
    waiters: std::sync::Mutex<Vec<Waiter>>,
}

impl FlushGate {
    /// An unarmed gate.
    pub fn new() -> Arc<FlushGate> {
        Arc::new(FlushGate::default())
    }

    /// Arms the gate with `settle`; the first arming wins (a server
    /// replicates for its whole life once it starts).
    pub fn arm(&self, settle: Arc<dyn Settle>) {
        if self.settle.set(settle).is_ok() {
            self.armed.store(true, Ordering::Release);
        }
    }

    /// Whether the gate is armed.
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire)
    }

    /// Waits, when armed, until the replies produced so far may leave.
    #[inline]
    pub fn before_flush(&self) {
        if self.armed.load(Ordering::Relaxed) {
            if let Some(s) = self.settle.get() {
                s.settle();
            }
        }
    }

    /// Without blocking, for a loop serving many connections: `None` when
    /// the replies produced so far may leave now, else a ticket to hold
    /// them on ([`FlushGate::done`]); the loop is woken through the waker
    /// it registered once tickets may be done.
    #[inline]
    pub fn ticket(&self) -> Option<u64> {
        if !self.armed.load(Ordering::Relaxed) {
            return None;
        }
        self.settle.get().and_then(|s| s.ticket())
    }

    /// For a loop holding replies on tickets, before it blocks: waits up
    /// to `timeout` for them to settle or for `also` (its poll
    /// descriptor, if it has one) to be readable. False when it did not
    /// wait.
    pub fn wait(&self, also: Option<BorrowedFd<'_>>, timeout: Duration) -> bool {
        self.settle.get().is_some_and(|s| s.wait(also, timeout))
    }

    /// Whether replies held on `ticket` may leave.
    #[inline]
    pub fn done(&self, ticket: u64) -> bool {
        self.settle.get().is_none_or(|s| s.done(ticket))
    }

    /// Registers a loop's waker; the loop sets the returned flag while it
    /// holds connections on tickets, and is woken only then.
    pub fn add_waiter(&self, wake: Box<dyn Fn() + Send + Sync>) -> Arc<AtomicBool> {
        let waiting = Arc::new(AtomicBool::new(false));
        self.waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Waiter {
                waiting: waiting.clone(),
                wake,
            });
        waiting
    }

    /// Wakes every loop holding connections on tickets: called by the
    /// work that settles them, after each step of it.
    pub fn wake_waiters(&self) {
        for w in self
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            if w.waiting.load(Ordering::Acquire) {
                (w.wake)();
            }
        }
    }
}

impl std::fmt::Debug for FlushGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlushGate")
            .field("armed", &self.is_armed())
            .finish()
    }
}
