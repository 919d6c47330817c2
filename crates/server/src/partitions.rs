//! The server's engine partitions, one per worker.
//!
//! The native protocol keeps MICA's EREW discipline: clients steer every
//! key to the worker that owns its partition, so a worker only ever takes
//! its own partition's lock and never waits for it. The lock is there for
//! the front-ends that cannot steer: a RESP client sends any key on any
//! connection, and its thread takes the owning partition's lock for the
//! commands that touch it (a pipelined run of commands on one partition
//! takes it once). An uncontended lock costs a few tens of nanoseconds per
//! batch, against a batch's microseconds.

use std::sync::atomic::AtomicUsize;
use std::sync::{Mutex, MutexGuard};

use fabrickv_engine::{Partition, PartitionStats};
use fabrickv_types::KeyHash;

/// Every partition of one server.
pub struct Partitions {
    parts: Box<[Mutex<Partition>]>,
    /// Bytes of large values being received over native connections (the
    /// kv service's PUT_CHUNK transfers), over every worker; bounded by
    /// `crate::kv::KV_LARGE_RECEIVING_BYTES_MAX`.
    pub kv_large_receiving: AtomicUsize,
}

impl Partitions {
    /// Wraps the partitions built at start-up; partition `i` belongs to worker `i`.
    pub fn new(parts: Vec<Partition>) -> Partitions {
        Partitions {
            parts: parts.into_iter().map(Mutex::new).collect(),
            kv_large_receiving: AtomicUsize::new(0),
        }
    }

    /// How many partitions there are.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Whether there are none (never, for a started server).
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The partition that owns a key's hash.
    #[inline]
    pub fn index_of(&self, hash: KeyHash) -> usize {
        hash.partition(self.parts.len() as u32) as usize
    }

    /// Locks partition `i`. A thread that panicked while holding it left
    /// the engine's structures as they were between two operations (no
    /// engine call panics halfway by design), so poisoning is ignored
    /// rather than taking the whole server down.
    #[inline]
    pub fn lock(&self, i: usize) -> MutexGuard<'_, Partition> {
        self.parts[i]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Engine counters summed over every partition.
    pub fn stats(&self) -> PartitionStats {
        let mut total = PartitionStats::default();
        for i in 0..self.parts.len() {
            total.add(&self.lock(i).stats());
        }
        total
    }
}
