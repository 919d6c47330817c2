//! Everything the store's lock protects: the index, the entry records with
//! their LRU list, the deadline heap, the allocator and the counters.
//!
//! Nothing here touches value bytes, so every operation under the lock is
//! O(log n) bookkeeping; the copies happen outside it.
//!
//! An entry record lives in a `Vec` arena and is named by its index (its
//! slot), so the LRU list is intrusive without pointers, and a lease names
//! its entry by slot. A record is in one of three states:
//! - linked: in the index and the LRU list, visible to gets;
//! - unlinked but leased: removed from both (deleted, replaced, expired or
//!   evicted) while a lease still reads its block, so the block is kept
//!   ("pending free") until the last lease drops;
//! - vacant: block freed, slot on the vacant list for the next entry.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use crate::alloc::Allocator;
use crate::{CacheConfig, CacheError, CacheStats};

/// The deadline heap is cleared of stale items once it holds more than this
/// many items (entries)...
pub const DEADLINE_HEAP_SLACK_ENTRIES: usize = 1024;

/// ...and more than this many times the entries that have a TTL: stale
/// items (of overwritten or deleted entries) are dropped lazily when they
/// reach the top, and this bounds how many can pile up meanwhile.
pub const DEADLINE_HEAP_STALE_FACTOR: usize = 2;

/// One stored value's bookkeeping.
#[derive(Debug)]
struct Entry {
    key: Arc<[u8]>,
    offset: usize,
    block_bytes: usize,
    value_len: usize,
    generation: u64,
    /// Monotonic ms at which the value stops being visible; 0 = never.
    expires_at_ms: u64,
    /// Live leases on the block.
    leases: u64,
    /// In the index and the LRU list.
    linked: bool,
    /// LRU neighbour toward the most recently used end.
    newer: Option<usize>,
    /// LRU neighbour toward the least recently used end.
    older: Option<usize>,
}

/// A lease taken by a snapshot's walk, with its entry's key.
pub(crate) type KeyedLease = (Arc<[u8]>, LeaseInfo);

/// What a lease needs to read its value without the lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseInfo {
    pub slot: usize,
    pub offset: usize,
    pub len: usize,
    pub generation: u64,
    pub expires_at_ms: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: u64,
    misses: u64,
    puts: u64,
    deletes: u64,
    evictions: u64,
    expirations: u64,
    full_errors: u64,
}

/// Whether an entry with this deadline is expired at `now_ms`.
fn is_expired(expires_at_ms: u64, now_ms: u64) -> bool {
    expires_at_ms != 0 && now_ms >= expires_at_ms
}

#[derive(Debug)]
pub(crate) struct State {
    alloc: Allocator,
    evict: bool,
    /// Used bytes above which a reservation first evicts.
    high_bytes: usize,
    /// Used bytes that eviction frees down to.
    low_bytes: usize,
    index: HashMap<Arc<[u8]>, usize>,
    records: Vec<Option<Entry>>,
    vacant: Vec<usize>,
    mru: Option<usize>,
    lru: Option<usize>,
    /// `(expires_at_ms, generation, slot)` of entries with a TTL, earliest
    /// first. Items of replaced or removed entries stay until they surface
    /// (the generation tells them apart) or a compaction drops them.
    deadlines: BinaryHeap<Reverse<(u64, u64, usize)>>,
    /// Linked entries with a TTL.
    ttl_entries: usize,
    next_generation: u64,
    value_bytes: u64,
    pending_free_bytes: u64,
    reserved_bytes: u64,
    leased_entries: u64,
    counters: Counters,
}

impl State {
    pub fn new(cfg: &CacheConfig) -> State {
        let alloc = Allocator::new(cfg.usable_pool_bytes());
        let capacity = alloc.capacity() as f64;
        State {
            evict: cfg.evict,
            // Float to int `as` saturates; validated fractions keep these
            // within the pool.
            high_bytes: (cfg.high_watermark * capacity) as usize,
            low_bytes: (cfg.low_watermark * capacity) as usize,
            alloc,
            index: HashMap::new(),
            records: Vec::new(),
            vacant: Vec::new(),
            mru: None,
            lru: None,
            deadlines: BinaryHeap::new(),
            ttl_entries: 0,
            next_generation: 1,
            value_bytes: 0,
            pending_free_bytes: 0,
            reserved_bytes: 0,
            leased_entries: 0,
            counters: Counters::default(),
        }
    }

    /// Bytes the allocator manages.
    pub fn capacity(&self) -> usize {
        self.alloc.capacity()
    }

    fn entry(&self, slot: usize) -> Option<&Entry> {
        self.records.get(slot).and_then(Option::as_ref)
    }

    fn entry_mut(&mut self, slot: usize) -> Option<&mut Entry> {
        self.records.get_mut(slot).and_then(Option::as_mut)
    }

    // ----- LRU list -----

    fn lru_detach(&mut self, slot: usize) {
        let Some(e) = self.entry_mut(slot) else {
            return;
        };
        let (newer, older) = (e.newer.take(), e.older.take());
        match newer.and_then(|n| self.entry_mut(n)) {
            Some(n) => n.older = older,
            None => self.mru = older,
        }
        match older.and_then(|o| self.entry_mut(o)) {
            Some(o) => o.newer = newer,
            None => self.lru = newer,
        }
    }

    fn lru_push_mru(&mut self, slot: usize) {
        let old_mru = self.mru;
        let Some(e) = self.entry_mut(slot) else {
            return;
        };
        e.newer = None;
        e.older = old_mru;
        match old_mru.and_then(|m| self.entry_mut(m)) {
            Some(m) => m.newer = Some(slot),
            None => self.lru = Some(slot),
        }
        self.mru = Some(slot);
    }

    fn touch(&mut self, slot: usize) {
        if self.mru != Some(slot) {
            self.lru_detach(slot);
            self.lru_push_mru(slot);
        }
    }

    // ----- entry life cycle -----

    /// The slot of the live entry of `key`; an expired one is reclaimed
    /// (and counted) on the way, so it is absent from then on.
    fn live_slot(&mut self, key: &[u8], now_ms: u64) -> Option<usize> {
        let slot = *self.index.get(key)?;
        let expires_at_ms = self.entry(slot)?.expires_at_ms;
        if is_expired(expires_at_ms, now_ms) {
            self.unlink(slot);
            self.counters.expirations += 1;
            return None;
        }
        Some(slot)
    }

    /// Removes a linked entry from the index and the LRU list, freeing its
    /// block now if unleased, else when its last lease drops.
    fn unlink(&mut self, slot: usize) {
        let Some(e) = self.entry_mut(slot) else {
            return;
        };
        if !e.linked {
            return;
        }
        e.linked = false;
        let key = Arc::clone(&e.key);
        let (expires_at_ms, value_len, leases, block_bytes) =
            (e.expires_at_ms, e.value_len, e.leases, e.block_bytes);
        self.index.remove(&key[..]);
        self.lru_detach(slot);
        if expires_at_ms != 0 {
            self.ttl_entries -= 1;
        }
        self.value_bytes -= value_len as u64;
        if leases == 0 {
            self.release_record(slot);
        } else {
            self.pending_free_bytes += block_bytes as u64;
        }
    }

    /// Frees an unlinked, unleased record's block and its slot.
    fn release_record(&mut self, slot: usize) {
        let Some(e) = self.records.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let freed = self.alloc.free(e.offset, e.block_bytes);
        debug_assert!(
            freed,
            "entry block {}+{} was not allocated",
            e.offset, e.block_bytes
        );
        self.vacant.push(slot);
    }

    fn acquire(&mut self, slot: usize) -> Option<LeaseInfo> {
        let e = self.entry_mut(slot)?;
        e.leases = e.leases.checked_add(1)?;
        let info = LeaseInfo {
            slot,
            offset: e.offset,
            len: e.value_len,
            generation: e.generation,
            expires_at_ms: e.expires_at_ms,
        };
        if e.leases == 1 {
            self.leased_entries += 1;
        }
        Some(info)
    }

    /// Drops one lease of the entry at `slot`; the last lease of an
    /// unlinked entry frees its block.
    pub fn release_lease(&mut self, slot: usize, generation: u64) {
        let Some(e) = self.entry_mut(slot) else {
            debug_assert!(false, "lease of vacant slot {slot}");
            return;
        };
        if e.generation != generation || e.leases == 0 {
            debug_assert!(false, "lease of slot {slot} does not match its entry");
            return;
        }
        e.leases -= 1;
        if e.leases > 0 {
            return;
        }
        let (linked, block_bytes) = (e.linked, e.block_bytes);
        self.leased_entries -= 1;
        if !linked {
            self.pending_free_bytes -= block_bytes as u64;
            self.release_record(slot);
        }
    }

    // ----- reclaiming space -----

    /// Removes the expired entry with the earliest deadline, if any is
    /// expired at `now_ms`. Stale heap items met on the way are dropped.
    fn expire_one(&mut self, now_ms: u64) -> bool {
        while let Some(&Reverse((deadline, generation, slot))) = self.deadlines.peek() {
            if deadline > now_ms {
                return false;
            }
            self.deadlines.pop();
            let current = self
                .entry(slot)
                .is_some_and(|e| e.linked && e.generation == generation);
            if current {
                self.unlink(slot);
                self.counters.expirations += 1;
                return true;
            }
        }
        false
    }

    /// Evicts the least recently used unleased entry; false when every
    /// linked entry is leased (or there is none). Leased entries are
    /// skipped, not unlinked: unlinking them would free nothing until the
    /// reader finishes, yet lose a value someone is using.
    fn evict_one(&mut self) -> bool {
        let mut cursor = self.lru;
        while let Some(slot) = cursor {
            let Some(e) = self.entry(slot) else {
                return false;
            };
            if e.leases == 0 {
                self.unlink(slot);
                self.counters.evictions += 1;
                return true;
            }
            cursor = e.newer;
        }
        false
    }

    /// Removes up to `max_entries` expired entries, earliest deadline first.
    pub fn expire(&mut self, now_ms: u64, max_entries: usize) -> usize {
        let mut removed = 0;
        while removed < max_entries && self.expire_one(now_ms) {
            removed += 1;
        }
        removed
    }

    /// Drops the stale items of the deadline heap once they dominate it, so
    /// its size stays within a constant factor of the live TTL entries.
    /// Filters the heap itself (not the records), so the cost is linear in
    /// the items that piled up since the last pass: amortized O(1) per push.
    fn compact_deadlines(&mut self) {
        if self.deadlines.len() <= DEADLINE_HEAP_SLACK_ENTRIES
            || self.deadlines.len() <= DEADLINE_HEAP_STALE_FACTOR * self.ttl_entries
        {
            return;
        }
        let records = &self.records;
        self.deadlines.retain(|&Reverse((_, generation, slot))| {
            records
                .get(slot)
                .and_then(Option::as_ref)
                .is_some_and(|e| e.linked && e.generation == generation)
        });
    }

    // ----- reservations and commits -----

    /// Allocates a block of `bytes` for a reservation.
    ///
    /// With eviction on, a reservation that would take the used bytes past
    /// the high watermark first removes expired entries, then LRU entries,
    /// until it would fit under the low watermark. Then, whatever the mode,
    /// an allocation that still fails (pool full, or free space too
    /// fragmented) reclaims expired entries (they are already gone for
    /// readers) and, with eviction on, LRU entries, one at a time until it
    /// fits or nothing is left to remove.
    pub fn reserve(&mut self, bytes: usize, now_ms: u64) -> Result<usize, CacheError> {
        if self.evict && self.alloc.used_bytes().saturating_add(bytes) > self.high_bytes {
            while self.alloc.used_bytes().saturating_add(bytes) > self.low_bytes
                && (self.expire_one(now_ms) || self.evict_one())
            {}
        }
        loop {
            if let Some(offset) = self.alloc.alloc(bytes) {
                self.reserved_bytes += bytes as u64;
                return Ok(offset);
            }
            let removed = self.expire_one(now_ms) || (self.evict && self.evict_one());
            if !removed {
                self.counters.full_errors += 1;
                return Err(CacheError::Full);
            }
        }
    }

    /// Gives back a reservation that was never committed.
    pub fn cancel(&mut self, offset: usize, bytes: usize) {
        let freed = self.alloc.free(offset, bytes);
        debug_assert!(freed, "reservation {offset}+{bytes} was not allocated");
        if freed {
            self.reserved_bytes -= bytes as u64;
        }
    }

    /// Makes a reservation the visible value of `key`, replacing any
    /// previous one. On error the reservation is given back.
    pub fn commit(
        &mut self,
        key: &Arc<[u8]>,
        offset: usize,
        block_bytes: usize,
        value_len: usize,
        ttl_ms: u64,
        now_ms: u64,
    ) -> Result<u64, CacheError> {
        let generation = self.next_generation;
        let Some(next) = generation.checked_add(1) else {
            self.cancel(offset, block_bytes);
            return Err(CacheError::Internal("generations exhausted".into()));
        };
        self.next_generation = next;
        self.reserved_bytes -= block_bytes as u64;
        if let Some(&old) = self.index.get(&key[..]) {
            self.unlink(old);
        }
        // 0 means "never"; a real deadline is at least now + 1.
        let expires_at_ms = if ttl_ms == 0 {
            0
        } else {
            now_ms.saturating_add(ttl_ms)
        };
        let entry = Entry {
            key: Arc::clone(key),
            offset,
            block_bytes,
            value_len,
            generation,
            expires_at_ms,
            leases: 0,
            linked: true,
            newer: None,
            older: None,
        };
        let slot = match self.vacant.pop() {
            Some(slot) => {
                if let Some(r) = self.records.get_mut(slot) {
                    *r = Some(entry);
                }
                slot
            }
            None => {
                self.records.push(Some(entry));
                self.records.len() - 1
            }
        };
        self.index.insert(Arc::clone(key), slot);
        self.lru_push_mru(slot);
        self.value_bytes += value_len as u64;
        self.counters.puts += 1;
        if expires_at_ms != 0 {
            self.deadlines
                .push(Reverse((expires_at_ms, generation, slot)));
            self.ttl_entries += 1;
            self.compact_deadlines();
        }
        Ok(generation)
    }

    // ----- reads and deletes -----

    /// A lease on the live value of `key`, marking it most recently used.
    pub fn get(&mut self, key: &[u8], now_ms: u64) -> Option<LeaseInfo> {
        let leased = self.live_slot(key, now_ms).and_then(|slot| {
            self.touch(slot);
            self.acquire(slot)
        });
        match leased {
            Some(_) => self.counters.hits += 1,
            None => self.counters.misses += 1,
        }
        leased
    }

    /// A lease on the live value of `key` if it still is `generation`.
    pub fn lease_if(
        &mut self,
        key: &[u8],
        generation: u64,
        now_ms: u64,
    ) -> Result<LeaseInfo, CacheError> {
        let slot = self.live_slot(key, now_ms).ok_or(CacheError::NotFound)?;
        if self.entry(slot).map(|e| e.generation) != Some(generation) {
            return Err(CacheError::ValueChanged);
        }
        self.touch(slot);
        self.acquire(slot)
            .ok_or_else(|| CacheError::Internal("lease count overflow".into()))
    }

    pub fn delete(&mut self, key: &[u8], now_ms: u64) -> bool {
        match self.live_slot(key, now_ms) {
            Some(slot) => {
                self.unlink(slot);
                self.counters.deletes += 1;
                true
            }
            None => false,
        }
    }

    pub fn delete_where(&mut self, doomed: &dyn Fn(&[u8]) -> bool) -> usize {
        let slots: Vec<usize> = self
            .index
            .iter()
            .filter(|(k, _)| doomed(k))
            .map(|(_, &slot)| slot)
            .collect();
        for &slot in &slots {
            self.unlink(slot);
            self.counters.deletes += 1;
        }
        slots.len()
    }

    /// The generation of the newest value committed so far (0: none): a
    /// snapshot's cut.
    pub fn last_generation(&self) -> u64 {
        self.next_generation - 1
    }

    /// Leases (with their keys) on up to `max` linked entries committed
    /// at or before generation `cut` and unexpired at `now_ms`, from arena
    /// slot `from` on; and the slot to go on from (`None` at the end).
    /// A snapshot's read: neither the LRU order nor any counter changes.
    /// An entry keeps its slot while linked, and a slot reused after `cut`
    /// holds a later generation, so walking the slots in order meets
    /// every entry of the cut that is still there when the walk passes.
    pub fn snapshot_from(
        &mut self,
        from: usize,
        max: usize,
        cut: u64,
        now_ms: u64,
    ) -> (Vec<KeyedLease>, Option<usize>) {
        let mut out = Vec::new();
        let mut slot = from;
        while slot < self.records.len() && out.len() < max {
            let wanted = self.entry(slot).filter(|e| {
                e.linked && e.generation <= cut && !is_expired(e.expires_at_ms, now_ms)
            });
            if let Some(key) = wanted.map(|e| e.key.clone()) {
                if let Some(info) = self.acquire(slot) {
                    out.push((key, info));
                }
            }
            slot += 1;
        }
        (out, (slot < self.records.len()).then_some(slot))
    }

    pub fn exists(&mut self, key: &[u8], now_ms: u64) -> bool {
        self.live_slot(key, now_ms).is_some()
    }

    pub fn stats(&self) -> CacheStats {
        let free = self.alloc.free_bytes() as u64;
        let largest = self.alloc.largest_free() as u64;
        let c = &self.counters;
        CacheStats {
            entries: self.index.len() as u64,
            pool_bytes: self.alloc.capacity() as u64,
            used_bytes: self.alloc.used_bytes() as u64,
            value_bytes: self.value_bytes,
            free_bytes: free,
            largest_free_bytes: largest,
            fragmentation: if free == 0 {
                0.0
            } else {
                1.0 - largest as f64 / free as f64
            },
            free_blocks: self.alloc.free_blocks() as u64,
            leased_entries: self.leased_entries,
            pending_free_bytes: self.pending_free_bytes,
            reserved_bytes: self.reserved_bytes,
            hits: c.hits,
            misses: c.misses,
            puts: c.puts,
            deletes: c.deletes,
            evictions: c.evictions,
            expirations: c.expirations,
            full_errors: c.full_errors,
        }
    }

    /// Items in the deadline heap (stale ones included). For tests.
    #[cfg(test)]
    pub fn deadline_items(&self) -> usize {
        self.deadlines.len()
    }

    /// Checks that every derived number and link agrees with the records.
    /// For tests.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        self.alloc.check()?;
        let mut block_sum = 0u64;
        let (mut value_sum, mut pending, mut leased, mut linked, mut ttl) = (0u64, 0u64, 0, 0, 0);
        for (slot, e) in self.records.iter().enumerate() {
            let Some(e) = e else {
                if !self.vacant.contains(&slot) {
                    return Err(format!("vacant slot {slot} not on the vacant list"));
                }
                continue;
            };
            block_sum += e.block_bytes as u64;
            if e.leases > 0 {
                leased += 1;
            }
            if e.linked {
                linked += 1;
                value_sum += e.value_len as u64;
                if e.expires_at_ms != 0 {
                    ttl += 1;
                }
                if self.index.get(&e.key[..]) != Some(&slot) {
                    return Err(format!("linked slot {slot} not indexed under its key"));
                }
            } else if e.leases == 0 {
                return Err(format!("unlinked, unleased slot {slot} not freed"));
            } else {
                pending += e.block_bytes as u64;
            }
        }
        if block_sum + self.reserved_bytes != self.alloc.used_bytes() as u64 {
            return Err(format!(
                "entries hold {block_sum} + reserved {} but allocator says {} used",
                self.reserved_bytes,
                self.alloc.used_bytes()
            ));
        }
        if value_sum != self.value_bytes
            || pending != self.pending_free_bytes
            || leased != self.leased_entries
            || ttl != self.ttl_entries
            || linked != self.index.len()
        {
            return Err("a derived counter disagrees with the records".into());
        }
        // The LRU list, walked both ways, holds exactly the linked entries.
        let mut seen = 0;
        let mut cursor = self.mru;
        let mut newer = None;
        while let Some(slot) = cursor {
            let e = self
                .entry(slot)
                .ok_or_else(|| format!("LRU reaches vacant slot {slot}"))?;
            if !e.linked || e.newer != newer {
                return Err(format!("LRU link of slot {slot} is wrong"));
            }
            seen += 1;
            if seen > linked {
                return Err("LRU list has a cycle".into());
            }
            newer = Some(slot);
            cursor = e.older;
        }
        if seen != linked || self.lru != newer {
            return Err("LRU list does not hold exactly the linked entries".into());
        }
        Ok(())
    }
}
