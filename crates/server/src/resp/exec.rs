//! The execution context of one `process` call over the in-memory kv:
//! the partition lock it holds across a pipelined run, and the prefetch
//! of a run's keys. The commands themselves are in `strings` and `expiry`.

use std::sync::MutexGuard;

use fabrickv_engine::{LargeValue, Partition, PutResult, ValueRef};
use fabrickv_resp::reply as resp;
use fabrickv_types::KeyHash;

use super::{LargeReplies, RespShared};

/// The reply to a write the engine refused (`OOM` when the store is full,
/// as Redis says it).
pub(super) fn put_error(out: &mut Vec<u8>, r: PutResult) {
    match r {
        PutResult::InsufficientSpace => resp::error(
            out,
            "OOM command not allowed when used memory > 'maxmemory'.",
        ),
        PutResult::TooLarge => resp::error(out, "ERR value is too large for this server"),
        PutResult::Stored | PutResult::ConditionFailed => resp::null_bulk(out),
    }
}

/// Execution context of one `process` call: the partition lock it holds.
pub(super) struct Exec<'a> {
    /// The partitions, shards and counters every connection shares.
    pub(super) shared: &'a RespShared,
    /// The partition lock held across a run of commands on one partition
    /// (released before a shard command, which may wait for a disk sync).
    pub(super) held: Option<(usize, MutexGuard<'a, Partition>)>,
    /// The time of the whole `process` call, in engine milliseconds.
    pub(super) now_ms: u64,
    /// The same instant as Unix time in milliseconds (EXPIREAT, EXPIRETIME).
    pub(super) unix_ms: u64,
    /// Several partitions locked at once (guard `i` is partition `i`'s),
    /// taken in ascending order: a command over keys of several partitions,
    /// or EXEC (every partition). Empty otherwise.
    pub(super) many: Vec<Option<MutexGuard<'a, Partition>>>,
    /// EXEC is running: every partition is locked in `many` until it ends,
    /// so the commands it runs neither take nor release locks.
    pub(super) in_exec: bool,
    /// The large value received for the running command's argument (only
    /// SET's value), for the command to take.
    pub(super) large_arg: Option<LargeValue>,
    /// The large values the replies written so far refer to.
    pub(super) large_out: LargeReplies,
    /// Set by the running command when its reply shows only what every
    /// follower already has (a GET of a key with no write of its set in
    /// flight), so that it need not wait for a replication round. Reset
    /// before each command: anything else may show an unreplicated write.
    pub(super) read_settled: bool,
}

impl<'a> Exec<'a> {
    /// The partition owning `hash`, locked (reusing the lock already held
    /// when it is the same partition; never holding two).
    pub(super) fn part(&mut self, hash: KeyHash) -> &mut Partition {
        let i = self.shared.parts.index_of(hash);
        self.part_at(i)
    }

    /// Partition `i`, locked (see [`Exec::part`]); while several are held
    /// in `many`, the one there.
    pub(super) fn part_at(&mut self, i: usize) -> &mut Partition {
        if !self.many.is_empty() {
            if !matches!(self.many.get(i), Some(Some(_))) {
                // Never taken out of order: a command locks every partition
                // it touches up front. Should one be missed, every lock is
                // retaken in order rather than risk a deadlock.
                debug_assert!(false, "partition {i} used without its lock");
                let all: Vec<usize> = (0..self.shared.parts.len()).collect();
                self.many.clear();
                self.lock_many(&all);
            }
            match self.many.get_mut(i) {
                Some(Some(g)) => return g,
                _ => unreachable!("every partition was just locked"),
            }
        }
        if self.held.as_ref().is_none_or(|(h, _)| *h != i) {
            self.held = None;
            self.held = Some((i, self.shared.parts.lock(i)));
        }
        match &mut self.held {
            Some((_, g)) => g,
            None => unreachable!("a lock was just taken"),
        }
    }

    /// Locks the partitions `parts` (any order, duplicates allowed) all at
    /// once, in ascending order, dropping any lock held before: a command
    /// over keys of several partitions runs with all of them held, so no
    /// other client sees it half done. One partition alone takes the
    /// ordinary single lock. Nothing changes while EXEC holds them all.
    pub(super) fn lock_many(&mut self, parts: &[usize]) {
        if self.in_exec {
            return;
        }
        let mut want = vec![false; self.shared.parts.len()];
        for &p in parts {
            if let Some(w) = want.get_mut(p) {
                *w = true;
            }
        }
        self.lock_wanted(&want);
    }

    /// [`Exec::lock_many`] for the partitions `i` where `want[i]`.
    fn lock_wanted(&mut self, want: &[bool]) {
        let n = self.shared.parts.len();
        let count = want.iter().filter(|&&w| w).count();
        self.many.clear();
        if count <= 1 {
            // One partition: the ordinary lock, kept across the run.
            return;
        }
        self.held = None;
        self.many.resize_with(n, || None);
        for (i, w) in want.iter().enumerate() {
            if *w {
                self.many[i] = Some(self.shared.parts.lock(i));
            }
        }
    }

    /// Writes `value` as a bulk reply: an inline value is copied into
    /// `out`; a large one is referenced, its header and CRLF in `out` and
    /// its bytes queued to be written from the store's own buffer.
    pub(super) fn bulk_value(&mut self, out: &mut Vec<u8>, value: ValueRef<'_>) {
        match value {
            ValueRef::Inline(v) => resp::bulk(out, v),
            ValueRef::Large(v) => {
                out.push(b'$');
                out.extend_from_slice(v.len().to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
                self.large_out.push(out.len(), v.clone());
                out.extend_from_slice(b"\r\n");
            }
        }
    }

    /// [`Exec::lock_many`] for the partitions of `keys`; keys of one
    /// partition (the common case) allocate nothing and keep the lock the
    /// run holds.
    pub(super) fn lock_keys<'k>(&mut self, keys: impl Iterator<Item = &'k [u8]> + Clone) {
        if self.in_exec {
            return;
        }
        let parts = &self.shared.parts;
        let mut first = None;
        let spread = keys.clone().any(|k| {
            let i = parts.index_of(KeyHash::of(k));
            *first.get_or_insert(i) != i
        });
        if !spread {
            self.many.clear();
            return;
        }
        // One flag per partition, not one index per key: an MGET or DEL
        // of 100,000 keys allocates no more than one of two.
        let mut want = vec![false; parts.len()];
        for k in keys {
            if let Some(w) = want.get_mut(parts.index_of(KeyHash::of(k))) {
                *w = true;
            }
        }
        self.lock_wanted(&want);
    }

    /// Releases what [`Exec::lock_many`] took (not while EXEC runs).
    pub(super) fn unlock_many(&mut self) {
        if !self.in_exec {
            self.many.clear();
        }
    }

    /// Locks every partition, in ascending order, for EXEC.
    pub(super) fn lock_all(&mut self) {
        let all: Vec<usize> = (0..self.shared.parts.len()).collect();
        self.held = None;
        self.many.clear();
        self.many.resize_with(all.len(), || None);
        for i in all {
            self.many[i] = Some(self.shared.parts.lock(i));
        }
    }

    /// Items stored, summed over the partitions (DBSIZE), through the
    /// locks this context holds: O(partitions), as Redis's DBSIZE is O(1).
    /// Expired items not yet reclaimed are counted, as in Redis; rather
    /// than walk the index here to subtract them, the engine's sweep
    /// reclaims them actively (it visits only the index buckets whose
    /// chains may hold a key with a TTL, so a partition with few is
    /// covered in one run), and the count drops within about a second.
    pub(super) fn items(&mut self) -> u64 {
        (0..self.shared.parts.len())
            .map(|i| self.part_at(i).stats().items)
            .sum()
    }

    /// An engine time as Unix milliseconds.
    pub(super) fn to_unix_ms(&self, engine_ms: u64) -> i64 {
        (self.unix_ms as i64).saturating_add(engine_ms as i64 - self.now_ms as i64)
    }

    /// Forgets the large values referred to past byte `mark` of the
    /// output (a reply cut back to `mark`).
    pub(super) fn drop_large_after(&mut self, mark: usize) {
        while self.large_out.queue.back().is_some_and(|r| r.at > mark) {
            if let Some(r) = self.large_out.queue.pop_back() {
                self.large_out.bytes -= r.value.len();
            }
        }
    }

    /// Both prefetch stages for a run of keys: every bucket, then every
    /// item the buckets name.
    pub(super) fn prefetch(&mut self, hashes: &[KeyHash]) {
        for &h in hashes {
            self.part(h).prefetch(h);
        }
        for &h in hashes {
            self.part(h).prefetch_item(h);
        }
    }
}
