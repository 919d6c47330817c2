//! Which server worker (thread) a key, a client or a request goes to: the
//! one place every client of this workspace makes that choice.
//!
//! - By key ([`of_hash`]): the worker that owns the key's partition as the
//!   server deals partitions at start (its partition table's epoch 0).
//!   The kv client steers by the table it fetches instead, which moves.
//! - By turn ([`Turns`]): each new single-connection client of a process
//!   takes the next worker, so the clients of a process spread over all of
//!   them instead of queueing on one; the ps, cache and shard clients.
//! - By client number ([`modulo`]): a client numbered `i` keeps to worker
//!   `i % workers` (eRPC's benchmarks' "ThroughputC" placement); `fabrickv
//!   bench rpc --affinity modulo`. A random worker per request is its
//!   `--affinity random` ("ThroughputB").

use std::sync::atomic::{AtomicUsize, Ordering};

use fabrickv_types::hash::worker_of_partition;
use fabrickv_types::KeyHash;

/// The worker that owns a key whose hash is `hash`, on a server of
/// `partitions` partitions over `workers` workers.
#[inline]
pub fn of_hash(hash: KeyHash, partitions: u32, workers: u16) -> u16 {
    worker_of_partition(hash.partition(partitions), u32::from(workers)) as u16
}

/// The worker client number `client` keeps to, of `workers`.
#[inline]
pub fn modulo(client: usize, workers: usize) -> usize {
    client % workers.max(1)
}

/// Hands out workers in turn: one counter per kind of client in a process.
#[derive(Debug, Default)]
pub struct Turns(AtomicUsize);

impl Turns {
    /// A counter at the first turn.
    pub const fn new() -> Turns {
        Turns(AtomicUsize::new(0))
    }

    /// The next worker of `workers`, round robin.
    pub fn next(&self, workers: u16) -> u16 {
        self.next_offset(workers, 0)
    }

    /// The next worker of `workers`, the turn moved on by `offset`: a
    /// process whose clients pass its process id spreads from a different
    /// worker than its neighbours, so processes with one client each
    /// spread too.
    pub fn next_offset(&self, workers: u16, offset: usize) -> u16 {
        let turn = self.0.fetch_add(1, Ordering::Relaxed).wrapping_add(offset);
        (turn % usize::from(workers.max(1))) as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_go_round_and_offset_shifts_them() {
        let t = Turns::new();
        let got: Vec<u16> = (0..5).map(|_| t.next(3)).collect();
        assert_eq!(got, vec![0, 1, 2, 0, 1]);
        assert_eq!(t.next_offset(3, 1), 0, "turn 5 plus 1");
        assert_eq!(t.next(0), 0, "no workers reads as one");
        assert_eq!(modulo(7, 3), 1);
    }
}
