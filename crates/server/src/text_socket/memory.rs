//! What connections buffer, summed over every loop of both front ends,
//! and its cap (`--maxmemory-clients`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use mio::Waker;

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
    pub(super) used: AtomicUsize,
    /// The cap of `used`, in bytes; 0: none.
    pub(super) cap: usize,
    /// Connections closed because `used` passed `cap`.
    pub(super) evicted: AtomicU64,
    /// The largest input buffer a connection had when it last reported,
    /// since the last read of it (INFO's `client_recent_max_input_buffer`).
    pub(super) recent_max_input: AtomicUsize,
    /// The largest output buffer likewise (`client_recent_max_output_buffer`).
    pub(super) recent_max_output: AtomicUsize,
    /// Every loop: the most bytes one of its connections reported (exact
    /// after the loop rescans, else possibly stale), and how to wake it
    /// to close that connection. Locked only past the cap.
    pub(super) loops: Mutex<Vec<LoopShare>>,
}

/// One loop's entry in [`ClientMemory`].
pub(super) struct LoopShare {
    pub(super) largest: Arc<AtomicUsize>,
    /// Set to ask the loop to check the cap at its next wake-up.
    pub(super) asked: Arc<AtomicBool>,
    pub(super) waker: Arc<Waker>,
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

    pub(super) fn over_cap(&self) -> bool {
        self.cap != 0 && self.used.load(Ordering::Relaxed) > self.cap
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<LoopShare>> {
        self.loops.lock().unwrap_or_else(|p| p.into_inner())
    }
}
