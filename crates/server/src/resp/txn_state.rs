//! What a connection keeps of its transaction between commands: the
//! queue after MULTI and the keys WATCH recorded (run by `txn`).

use fabrickv_types::KeyHash;

/// A transaction being queued.
#[derive(Default)]
pub(super) struct Txn {
    /// The queued commands' bytes, one after another, as received.
    pub(super) queued: Vec<u8>,
    /// How many commands `queued` holds.
    pub(super) count: usize,
    /// A queue-time error was answered: EXEC must refuse.
    pub(super) dirty: bool,
}

/// A watched key as WATCH saw it.
pub(super) struct Watched {
    pub(super) part: usize,
    pub(super) hash: KeyHash,
    pub(super) version: u64,
    /// The key's expiry time then (engine ms; 0 none or absent).
    pub(super) expire_at_ms: u64,
}
