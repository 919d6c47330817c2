//! The server's engine partitions and the table saying which worker
//! serves each.
//!
//! A server has a fixed number of partitions (`--partitions`, by default
//! `PARTITIONS_PER_WORKER_DEFAULT` per worker), each a whole engine
//! behind its own mutex. Keys map to partitions by
//! `KeyHash::partition(partitions)` alone, so a key's partition does not
//! depend on the worker count.
//!
//! The table (`owners`, one atomic per partition, and `epoch`, bumped by
//! every change) says which worker serves a partition *uncontended*:
//! clients steer each key to its partition's owner, so in the steady state
//! a worker only takes locks no other thread wants (MICA's EREW). Serving
//! never depends on the table: whoever executes an operation takes its
//! partition's lock, so a request that reaches a worker not owning the
//! partition (a client with a stale table, a partition moved while the
//! request was in flight) is still executed correctly, only contended,
//! and counted as `misrouted`. That is what lets a partition move between
//! workers while the server serves ([`Partitions::move_partition`]): the
//! move is one store to the table, no data is copied, and no request is
//! lost or answered from the wrong data.
//!
//! The lock is also there for the front-ends that cannot steer: a RESP or
//! memcache client sends any key on any connection, and its thread takes
//! the owning partition's lock for the commands that touch it. An
//! uncontended lock costs a few tens of nanoseconds per partition a frame
//! touches, against a batch's microseconds.
//!
//! Background walks (a checkpoint's, a slot stream's) hold a partition's
//! lock for a chunk of its index at a time. So that a request does not
//! wait out a whole chunk, a thread that finds the lock taken counts
//! itself as waiting ([`Partitions::wanted`]); a walk that sees a waiter
//! ends its chunk at the next chain's end, and takes the lock again only
//! once the waiters had it ([`Partitions::lock_background`]).

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};

use fabrickv_engine::{JournalSeq, Partition, PartitionStats, ScanBudget, SlotFilter};
use fabrickv_types::hash::worker_of_partition;
use fabrickv_types::limits::PARTITIONS_MAX;
use fabrickv_types::KeyHash;
use fabrickv_wire::control::PartitionTable;

/// Most keys one [`Partitions::prefetch`] prefetches: about one pipelined
/// batch; a longer run is prefetched a batch at a time by its caller.
pub const PREFETCH_KEYS_MAX: usize = 16;

/// Most times [`Partitions::lock_background`] yields the core while
/// threads wait for the partition, before it queues for the lock itself:
/// waiters hold a partition for one batch, so they are gone within a few
/// yields, and a walk under steady contention still makes progress.
pub const BACKGROUND_LOCK_YIELDS_MAX: u32 = 64;

/// Items a background walk handles in one hold of a partition's lock
/// before a request waiting for the lock ends the hold (at the next
/// chain's end, [`Partitions::scan_background`]), or keys a background
/// pass deletes before it lets such a request in.
pub const BACKGROUND_HOLD_ITEMS_MIN: usize = 16;

/// One partition's entry in the table, with the counters its native
/// operations add to. Aligned to its own cache lines: the owner writes
/// the counters of its partitions only, so workers do not share lines.
#[repr(align(128))]
struct Slot {
    /// The worker that serves the partition uncontended.
    owner: AtomicU16,
    /// Native kv operations executed on the partition, by any worker.
    ops: AtomicU64,
    /// Of those, operations executed by a worker not owning it.
    misrouted: AtomicU64,
    /// Threads blocked on the partition's lock right now: a background
    /// walk holding it stops early when this is not 0.
    waiting: AtomicU32,
    /// Times the lock was taken for requests (not by background walks):
    /// how a save tells a server that serves from an idle one. Written
    /// only under the lock.
    taken: AtomicU64,
}

/// Why a move was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveError {
    /// No partition of that number.
    NoSuchPartition,
    /// No worker of that number.
    NoSuchWorker,
}

impl std::fmt::Display for MoveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MoveError::NoSuchPartition => write!(f, "no such partition"),
            MoveError::NoSuchWorker => write!(f, "no such worker"),
        }
    }
}

/// Every partition of one server, and the table of their owners.
pub struct Partitions {
    parts: Box<[Mutex<Partition>]>,
    /// Owner and counters of each partition, by partition.
    slots: Box<[Slot]>,
    /// Bumped by every move, so a client can tell its table is old.
    epoch: AtomicU64,
    /// Workers of the server: every owner is below it.
    workers: u16,
    /// Bytes of large values being received over native connections (the
    /// kv service's PUT_CHUNK transfers), over every worker; bounded by
    /// `crate::kv::KV_LARGE_RECEIVING_BYTES_MAX`.
    pub kv_large_receiving: AtomicUsize,
    /// Each partition's replication journal counts, on a server that
    /// replicates ([`Partitions::key_settled`]).
    journals: OnceLock<Box<[Arc<JournalSeq>]>>,
}

impl Partitions {
    /// Wraps the partitions built at start-up, dealt to `workers` workers
    /// round robin (`worker_of_partition`).
    pub fn with_workers(parts: Vec<Partition>, workers: u16) -> Partitions {
        assert!(workers > 0, "a server has a worker");
        assert!(
            !parts.is_empty() && parts.len() <= PARTITIONS_MAX,
            "1..={PARTITIONS_MAX} partitions"
        );
        let slots = (0..parts.len())
            .map(|i| Slot {
                owner: AtomicU16::new(worker_of_partition(i as u32, u32::from(workers)) as u16),
                ops: AtomicU64::new(0),
                misrouted: AtomicU64::new(0),
                waiting: AtomicU32::new(0),
                taken: AtomicU64::new(0),
            })
            .collect();
        Partitions {
            parts: parts.into_iter().map(Mutex::new).collect(),
            slots,
            epoch: AtomicU64::new(0),
            workers,
            kv_large_receiving: AtomicUsize::new(0),
            journals: OnceLock::new(),
        }
    }

    /// Wraps partitions with one worker per partition (partition `i`
    /// served by worker `i`), for tests of a front end alone.
    pub fn new(parts: Vec<Partition>) -> Partitions {
        let n = parts.len().clamp(1, usize::from(u16::MAX)) as u16;
        Partitions::with_workers(parts, n)
    }

    /// How many partitions there are.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Whether there are none (never, for a started server).
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The server's worker count.
    pub fn workers(&self) -> u16 {
        self.workers
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
        let g = self.lock_uncounted(i);
        // The lock's holder is the only writer: a plain load and store.
        let taken = &self.slots[i].taken;
        taken.store(taken.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        g
    }

    /// [`Partitions::lock`] without counting the hold as a request's.
    #[inline]
    fn lock_uncounted(&self, i: usize) -> MutexGuard<'_, Partition> {
        match self.parts[i].try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => self.lock_contended(i),
        }
    }

    /// [`Partitions::lock`] when the partition is taken: counted as
    /// waiting while blocked, so that a background walk holding it lets
    /// go at its next chain's end.
    #[cold]
    fn lock_contended(&self, i: usize) -> MutexGuard<'_, Partition> {
        let waiting = &self.slots[i].waiting;
        waiting.fetch_add(1, Ordering::Relaxed);
        let g = self.parts[i]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        waiting.fetch_sub(1, Ordering::Relaxed);
        g
    }

    /// Records the partitions' journal counts, once replication starts.
    pub fn set_journals(&self, seqs: Box<[Arc<JournalSeq>]>) {
        debug_assert_eq!(seqs.len(), self.parts.len());
        let _ = self.journals.set(seqs);
    }

    /// Whether the partitions' writes are journaled for replication
    /// (set once replication starts).
    #[inline]
    pub fn replicates(&self) -> bool {
        self.journals.get().is_some()
    }

    /// Whether a read of the key hashed `hash` made before this call may
    /// be answered without waiting for replication: every write of its
    /// set of keys in its partition is applied by every follower
    /// (`JournalSeq::key_settled`), however busy the rest of the
    /// partition is; always, on a server that does not replicate.
    #[inline]
    pub fn key_settled(&self, hash: KeyHash) -> bool {
        self.journals
            .get()
            .is_none_or(|j| j[self.index_of(hash)].key_settled(hash))
    }

    /// Whether a thread is blocked on partition `i`'s lock: a background
    /// walk holding it should end its chunk.
    #[inline]
    pub fn wanted(&self, i: usize) -> bool {
        self.slots[i].waiting.load(Ordering::Relaxed) != 0
    }

    /// Locks partition `i` for a background walk: while threads wait for
    /// it, yields the core to them first (at most
    /// [`BACKGROUND_LOCK_YIELDS_MAX`] times), so that a walk that just let
    /// the lock go for them does not take it back ahead of them.
    pub fn lock_background(&self, i: usize) -> MutexGuard<'_, Partition> {
        for _ in 0..BACKGROUND_LOCK_YIELDS_MAX {
            if !self.wanted(i) {
                break;
            }
            std::thread::yield_now();
        }
        self.lock_uncounted(i)
    }

    /// Walks partition `i` from main bucket `from` in one background hold
    /// of its lock ([`Partitions::lock_background`]), examining at most
    /// `entries` index entries and calling `f(key, value)` for each live
    /// item of a cluster slot `want` takes (the others, in a partition
    /// with slot tags, unread: see `Partition::scan_slots_from`); once
    /// [`BACKGROUND_HOLD_ITEMS_MIN`] items are seen, a request waiting for
    /// the partition ends the hold at the next chain's end. Returns the
    /// main bucket to resume from, or `None` at the end.
    pub fn scan_background(
        &self,
        i: usize,
        from: usize,
        now_ms: u64,
        entries: usize,
        want: &SlotFilter<'_>,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Option<usize> {
        let mut budget = ScanBudget {
            entries,
            words: entries,
        };
        let mut seen = 0usize;
        self.lock_background(i)
            .scan_slots_from(from, now_ms, &mut budget, want, &mut |k, v, _| {
                f(k, v);
                seen += 1;
                seen < BACKGROUND_HOLD_ITEMS_MIN || !self.wanted(i)
            })
    }

    /// How many times, over every partition, a lock was taken for
    /// requests so far: a save compares two readings to tell whether the
    /// server served in between.
    pub fn requests_seen(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| s.taken.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }

    /// Prefetches the index bucket, then the item, of every hash in
    /// `hashes` (at most [`PREFETCH_KEYS_MAX`]; the rest are skipped), so
    /// that the cache misses of a pipelined batch overlap instead of each
    /// command waiting for its own (MICA's prefetch, which the kv service
    /// and RESP's `Exec::prefetch` do in their own batches). Every
    /// partition the hashes touch is locked once, in ascending order as
    /// multi-key commands lock theirs, and released before returning: the
    /// prefetch is a hint, the commands then look up under their own lock.
    pub fn prefetch(&self, hashes: &[KeyHash]) {
        let hashes = &hashes[..hashes.len().min(PREFETCH_KEYS_MAX)];
        let mut set = [0usize; PREFETCH_KEYS_MAX];
        let mut n = 0;
        for &h in hashes {
            let p = self.index_of(h);
            if !set[..n].contains(&p) {
                set[n] = p;
                n += 1;
            }
        }
        let set = &mut set[..n];
        set.sort_unstable();
        // Each hash's place in the set, found once and without an early
        // exit (a search's exit, random where the keys spread over several
        // partitions, is a mispredicted branch; the passes below would pay
        // it twice per key).
        let mut slot_of = [0usize; PREFETCH_KEYS_MAX];
        for (slot, &h) in slot_of.iter_mut().zip(hashes) {
            let p = self.index_of(h);
            for (k, &q) in set.iter().enumerate() {
                *slot = if q == p { k } else { *slot };
            }
        }
        let mut guards: [Option<MutexGuard<'_, Partition>>; PREFETCH_KEYS_MAX] = Default::default();
        for (g, &p) in guards.iter_mut().zip(set.iter()) {
            *g = Some(self.lock(p));
        }
        for (&h, &k) in hashes.iter().zip(&slot_of) {
            if let Some(g) = guards[k].as_deref() {
                g.prefetch(h);
            }
        }
        for (&h, &k) in hashes.iter().zip(&slot_of) {
            if let Some(g) = guards[k].as_deref() {
                g.prefetch_item(h);
            }
        }
    }

    /// The worker that serves partition `i` uncontended.
    #[inline]
    pub fn owner(&self, i: usize) -> u16 {
        self.slots[i].owner.load(Ordering::Acquire)
    }

    /// The table's epoch: bumped by every move.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Counts `ops` native operations executed on partition `i`, of which
    /// `misrouted` by a worker not owning it. The caller holds partition
    /// `i`'s lock (`_held`), so no other writer races: a plain load and
    /// store, not a locked read-modify-write, per partition per frame.
    #[inline]
    pub fn count(&self, i: usize, _held: &Partition, ops: u64, misrouted: u64) {
        let s = &self.slots[i];
        s.ops
            .store(s.ops.load(Ordering::Relaxed) + ops, Ordering::Relaxed);
        if misrouted > 0 {
            s.misrouted.store(
                s.misrouted.load(Ordering::Relaxed) + misrouted,
                Ordering::Relaxed,
            );
        }
    }

    /// Makes `worker` the owner of `partition`. Requests already steered
    /// to the old owner are still served by it, under the partition's
    /// lock, and counted as misrouted; clients learn of the move from the
    /// hint in those replies and fetch the table again. Returns the new
    /// epoch (the old one when the owner does not change).
    pub fn move_partition(&self, partition: u32, worker: u16) -> Result<u64, MoveError> {
        let slot = self
            .slots
            .get(partition as usize)
            .ok_or(MoveError::NoSuchPartition)?;
        if worker >= self.workers {
            return Err(MoveError::NoSuchWorker);
        }
        if slot.owner.swap(worker, Ordering::AcqRel) == worker {
            return Ok(self.epoch());
        }
        Ok(self.epoch.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// The table as a PARTITIONS reply carries it. The epoch is read
    /// before the owners, so a move racing with this read makes the table
    /// look older, never newer, than its owners: a client holding it
    /// refreshes again at the next hint.
    pub fn table(&self) -> PartitionTable {
        let epoch = self.epoch();
        let n = self.slots.len();
        let mut t = PartitionTable {
            epoch,
            workers: self.workers,
            owners: Vec::with_capacity(n),
            ops: Vec::with_capacity(n),
            misrouted: Vec::with_capacity(n),
        };
        for s in self.slots.iter() {
            t.owners.push(s.owner.load(Ordering::Acquire));
            t.ops.push(s.ops.load(Ordering::Relaxed));
            t.misrouted.push(s.misrouted.load(Ordering::Relaxed));
        }
        t
    }

    /// How many partitions `worker` owns now.
    pub fn owned_by(&self, worker: u16) -> usize {
        self.slots
            .iter()
            .filter(|s| s.owner.load(Ordering::Relaxed) == worker)
            .count()
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

/// Partitions whose counters STATS carries (on worker 0), each as two
/// entries; a STATS reply holds at most `BATCH_OPS_MAX` entries, and the
/// PARTITIONS reply carries every partition's.
pub const STATS_PARTITIONS_MAX: usize = 64;

/// The STATS names of the first [`STATS_PARTITIONS_MAX`] partitions'
/// counters: `(ops, misrouted)`, written out so STATS names stay static.
pub const STAT_NAMES: [(&str, &str); STATS_PARTITIONS_MAX] = [
    ("partition_0_ops", "partition_0_misrouted"),
    ("partition_1_ops", "partition_1_misrouted"),
    ("partition_2_ops", "partition_2_misrouted"),
    ("partition_3_ops", "partition_3_misrouted"),
    ("partition_4_ops", "partition_4_misrouted"),
    ("partition_5_ops", "partition_5_misrouted"),
    ("partition_6_ops", "partition_6_misrouted"),
    ("partition_7_ops", "partition_7_misrouted"),
    ("partition_8_ops", "partition_8_misrouted"),
    ("partition_9_ops", "partition_9_misrouted"),
    ("partition_10_ops", "partition_10_misrouted"),
    ("partition_11_ops", "partition_11_misrouted"),
    ("partition_12_ops", "partition_12_misrouted"),
    ("partition_13_ops", "partition_13_misrouted"),
    ("partition_14_ops", "partition_14_misrouted"),
    ("partition_15_ops", "partition_15_misrouted"),
    ("partition_16_ops", "partition_16_misrouted"),
    ("partition_17_ops", "partition_17_misrouted"),
    ("partition_18_ops", "partition_18_misrouted"),
    ("partition_19_ops", "partition_19_misrouted"),
    ("partition_20_ops", "partition_20_misrouted"),
    ("partition_21_ops", "partition_21_misrouted"),
    ("partition_22_ops", "partition_22_misrouted"),
    ("partition_23_ops", "partition_23_misrouted"),
    ("partition_24_ops", "partition_24_misrouted"),
    ("partition_25_ops", "partition_25_misrouted"),
    ("partition_26_ops", "partition_26_misrouted"),
    ("partition_27_ops", "partition_27_misrouted"),
    ("partition_28_ops", "partition_28_misrouted"),
    ("partition_29_ops", "partition_29_misrouted"),
    ("partition_30_ops", "partition_30_misrouted"),
    ("partition_31_ops", "partition_31_misrouted"),
    ("partition_32_ops", "partition_32_misrouted"),
    ("partition_33_ops", "partition_33_misrouted"),
    ("partition_34_ops", "partition_34_misrouted"),
    ("partition_35_ops", "partition_35_misrouted"),
    ("partition_36_ops", "partition_36_misrouted"),
    ("partition_37_ops", "partition_37_misrouted"),
    ("partition_38_ops", "partition_38_misrouted"),
    ("partition_39_ops", "partition_39_misrouted"),
    ("partition_40_ops", "partition_40_misrouted"),
    ("partition_41_ops", "partition_41_misrouted"),
    ("partition_42_ops", "partition_42_misrouted"),
    ("partition_43_ops", "partition_43_misrouted"),
    ("partition_44_ops", "partition_44_misrouted"),
    ("partition_45_ops", "partition_45_misrouted"),
    ("partition_46_ops", "partition_46_misrouted"),
    ("partition_47_ops", "partition_47_misrouted"),
    ("partition_48_ops", "partition_48_misrouted"),
    ("partition_49_ops", "partition_49_misrouted"),
    ("partition_50_ops", "partition_50_misrouted"),
    ("partition_51_ops", "partition_51_misrouted"),
    ("partition_52_ops", "partition_52_misrouted"),
    ("partition_53_ops", "partition_53_misrouted"),
    ("partition_54_ops", "partition_54_misrouted"),
    ("partition_55_ops", "partition_55_misrouted"),
    ("partition_56_ops", "partition_56_misrouted"),
    ("partition_57_ops", "partition_57_misrouted"),
    ("partition_58_ops", "partition_58_misrouted"),
    ("partition_59_ops", "partition_59_misrouted"),
    ("partition_60_ops", "partition_60_misrouted"),
    ("partition_61_ops", "partition_61_misrouted"),
    ("partition_62_ops", "partition_62_misrouted"),
    ("partition_63_ops", "partition_63_misrouted"),
];

const _: () = assert!(2 * STATS_PARTITIONS_MAX + 64 <= fabrickv_types::limits::BATCH_OPS_MAX);

/// Partitions as a replicating server has them, for the tests of the
/// front ends' settled reads.
#[cfg(test)]
pub(crate) mod journaled {
    use super::*;
    use fabrickv_engine::{Mode, PartitionConfig};

    /// Two store partitions of 4 MiB each, their writes journaled as on
    /// a server that replicates; and their journal counts, which a test
    /// marks replicated in place of a replicator.
    pub(crate) fn two() -> (Arc<Partitions>, Box<[Arc<JournalSeq>]>) {
        let mut parts: Vec<Partition> = (0..2)
            .map(|_| {
                Partition::new(&PartitionConfig {
                    mode: Mode::Store,
                    pool_bytes: 4 << 20,
                    index_buckets: None,
                    memory: Default::default(),
                })
                .expect("partition")
            })
            .collect();
        let seqs: Box<[Arc<JournalSeq>]> = parts.iter_mut().map(|p| p.enable_journal()).collect();
        let parts = Arc::new(Partitions::new(parts));
        parts.set_journals(seqs.clone());
        (parts, seqs)
    }

    /// The first key `{prefix}{n}` of partition `i`.
    pub(crate) fn key_in(parts: &Partitions, i: usize, prefix: &str) -> String {
        (0..)
            .map(|n| format!("{prefix}{n}"))
            .find(|k| parts.index_of(KeyHash::of(k.as_bytes())) == i)
            .expect("a key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fabrickv_engine::{Mode, PartitionConfig, PoolOptions};

    fn parts(n: usize, workers: u16) -> Partitions {
        let p = (0..n)
            .map(|_| {
                Partition::new(&PartitionConfig {
                    mode: Mode::Store,
                    pool_bytes: 1 << 20,
                    index_buckets: None,
                    memory: PoolOptions::default(),
                })
                .expect("partition")
            })
            .collect();
        Partitions::with_workers(p, workers)
    }

    /// A thread blocked on a partition counts as waiting until it has the
    /// lock; requests' holds are counted, background walks' are not.
    #[test]
    fn waiters_are_seen_and_only_requests_counted() {
        let p = std::sync::Arc::new(parts(2, 1));
        let before = p.requests_seen();
        drop(p.lock(0));
        drop(p.lock(1));
        drop(p.lock_background(1));
        assert_eq!(p.requests_seen() - before, 2, "two requests' holds");
        let held = p.lock(0);
        let q = p.clone();
        let waiter = std::thread::spawn(move || drop(q.lock(0)));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !p.wanted(0) {
            assert!(
                std::time::Instant::now() < deadline,
                "the waiter never blocked"
            );
            std::thread::yield_now();
        }
        assert!(!p.wanted(1), "only its own partition");
        drop(held);
        waiter.join().expect("waiter");
        assert!(!p.wanted(0), "counted out once it had the lock");
        assert_eq!(p.requests_seen() - before, 4);
    }

    #[test]
    fn partitions_are_dealt_round_robin_and_moves_bump_the_epoch() {
        let p = parts(8, 2);
        assert_eq!(p.table().owners, vec![0, 1, 0, 1, 0, 1, 0, 1]);
        assert_eq!(p.epoch(), 0);
        assert_eq!(p.move_partition(3, 0), Ok(1));
        assert_eq!(p.owner(3), 0);
        assert_eq!(p.move_partition(3, 0), Ok(1), "no change, same epoch");
        assert_eq!(p.move_partition(8, 0), Err(MoveError::NoSuchPartition));
        assert_eq!(p.move_partition(0, 2), Err(MoveError::NoSuchWorker));
        assert_eq!((p.owned_by(0), p.owned_by(1)), (5, 3));
        p.count(3, &p.lock(3), 10, 4);
        let t = p.table();
        assert_eq!((t.epoch, t.ops[3], t.misrouted[3]), (1, 10, 4));
    }
}
