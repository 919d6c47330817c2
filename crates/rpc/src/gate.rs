//! The one check every reply passes before it leaves a server: a worker
//! and a text front end's loop call [`FlushGate::before_flush`] before
//! writing what a burst produced.
//!
//! A server that replicates must not tell a client a write happened
//! before its backups have it, nor show a reader a value that a failover
//! could still take back; the replicator armed here waits for that (and
//! for the server's lease to be valid) before the replies go. Replies are
//! held per burst, not per request, so one wait covers every write of the
//! burst: the batching that keeps synchronous replication's cost to about
//! one round trip per burst. A server that does not replicate never arms
//! its gate, and pays one relaxed load per burst.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// What an armed gate runs before a flush.
pub trait Settle: Send + Sync {
    /// Returns once the replies produced so far may be sent.
    fn settle(&self);
}

/// A server's gate, shared by its workers and front-end loops.
#[derive(Default)]
pub struct FlushGate {
    armed: AtomicBool,
    settle: OnceLock<Arc<dyn Settle>>,
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
}

impl std::fmt::Debug for FlushGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlushGate")
            .field("armed", &self.is_armed())
            .finish()
    }
}
