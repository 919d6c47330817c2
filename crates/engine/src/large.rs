//! Large values: separately allocated, reference-counted buffers that a
//! small item in the pool points to.
//!
//! A value of [`LARGE_VALUE_BYTES_MIN`] bytes or more (up to
//! [`LARGE_VALUE_BYTES_MAX`], Redis's 512 MiB) does not go into the pool:
//! it is one heap buffer, a [`LargeValue`] (an `Arc`), held in the
//! partition's [`LargeTable`]. The index names an ordinary item (a *stub*)
//! whose header carries `FLAG_LARGE` and whose 8-byte inline value is the
//! slot of the large value in the table. Every key operation (lookup,
//! delete, expiry, the sweep, the cache-mode log overwriting the stub)
//! goes through the stub, so they are the same code for small and large
//! values; only reading the value and unlinking the item look at the flag.
//!
//! Large values have their own budget per partition
//! ([`LargeTable::bytes_max`], set with `Partition::set_large_bytes_max`;
//! by default as many bytes as the pool), counted exactly as the sum of
//! their lengths. A full budget evicts the oldest large values first in
//! cache mode (FIFO, as the log evicts small items) and answers
//! `InsufficientSpace` in store mode.
//!
//! A reader may hold a clone of a [`LargeValue`] past the partition's lock
//! (the RESP front end writes GET replies from it without copying, a
//! native GET_CHUNK reader pins it). A value that leaves the table (its key
//! deleted, rewritten, evicted or expired) while a reader still holds it
//! is *pinned*: its bytes move from [`LargeTable::bytes`] to the table's
//! pinned count, and leave that only when the last clone drops (the
//! buffer's own drop subtracts them). The budget covers both, so the
//! memory of large values, stored or pinned, never passes it: readers
//! that keep replaced values alive make later large PUTs evict (cache
//! mode) or answer `InsufficientSpace` (store mode) instead of growing
//! memory. The front ends bound how long a reader may pin a value.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

pub use fabrickv_types::limits::LARGE_VALUE_BYTES_MAX;
use fabrickv_types::limits::VALUE_BYTES_MAX;

/// Smallest value kept as a large object, in bytes: anything longer than
/// the 1 MiB an item in the pool holds ([`VALUE_BYTES_MAX`]). Values up to
/// that stay inline exactly as before.
pub const LARGE_VALUE_BYTES_MIN: usize = VALUE_BYTES_MAX + 1;

/// Bytes of a stub item's inline value: the large value's slot (u32 LE)
/// and four zero bytes.
pub(crate) const LARGE_STUB_BYTES: usize = 8;

/// The FIFO of large values (cache-mode eviction order) is compacted when
/// it holds more than this many entries per live large value (stale
/// entries of deleted or replaced values), so it stays bounded.
const FIFO_SLACK_FACTOR: usize = 2;

/// Entries the FIFO may hold besides the slack factor's, before compacting.
const FIFO_SLACK_MIN: usize = 64;

const _: () = assert!(LARGE_VALUE_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(LARGE_VALUE_BYTES_MIN <= LARGE_VALUE_BYTES_MAX);

/// A large value: one heap buffer shared by reference count. Cloning is
/// cheap (a reference); the bytes are never copied.
#[derive(Clone)]
pub struct LargeValue(Arc<Buffer>);

/// The buffer a [`LargeValue`] shares.
struct Buffer {
    bytes: Box<[u8]>,
    /// The pinned count of the table the value left while still shared
    /// (set at most once, by [`LargeTable::remove`]): the buffer's drop
    /// takes its bytes off it.
    pinned: OnceLock<Arc<AtomicU64>>,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(pinned) = self.pinned.get() {
            pinned.fetch_sub(self.bytes.len() as u64, Ordering::AcqRel);
        }
    }
}

impl PartialEq for LargeValue {
    fn eq(&self, other: &LargeValue) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for LargeValue {}

impl LargeValue {
    /// Wraps a filled buffer without copying it (a socket read into a
    /// zeroed `Vec` of exactly the value's length, then this).
    pub fn from_boxed(bytes: Box<[u8]>) -> LargeValue {
        LargeValue(Arc::new(Buffer {
            bytes,
            pinned: OnceLock::new(),
        }))
    }

    /// A large value holding a copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> LargeValue {
        LargeValue::from_boxed(bytes.into())
    }

    /// The value's bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        &self.0.bytes
    }

    /// The value's bytes, writable, if no reader holds a clone.
    pub fn get_mut(&mut self) -> Option<&mut [u8]> {
        Arc::get_mut(&mut self.0).map(|b| &mut b.bytes[..])
    }

    /// Whether a clone of this value is held elsewhere.
    fn shared(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }
}

impl Deref for LargeValue {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        &self.0.bytes
    }
}

impl AsRef<[u8]> for LargeValue {
    fn as_ref(&self) -> &[u8] {
        &self.0.bytes
    }
}

impl fmt::Debug for LargeValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LargeValue({} bytes)", self.0.bytes.len())
    }
}

/// A value as the engine holds it: inline in the pool (borrowed) or a
/// large object (a reference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueRef<'a> {
    /// Bytes in the pool, valid until the partition is next used.
    Inline(&'a [u8]),
    /// A large value; clone it to keep it past the partition's lock.
    Large(&'a LargeValue),
}

impl<'a> ValueRef<'a> {
    /// The value's bytes.
    #[inline]
    pub fn bytes(&self) -> &'a [u8] {
        match *self {
            ValueRef::Inline(b) => b,
            ValueRef::Large(v) => v.as_slice(),
        }
    }
}

/// One stored large value.
struct Slot {
    value: LargeValue,
    /// Distinguishes reuses of a slot in the FIFO.
    generation: u64,
    /// The key's hash and key, so that eviction can find the stub.
    hash: u64,
    key: Box<[u8]>,
}

/// The large values of one partition.
pub(crate) struct LargeTable {
    /// Slots; a stub names its value by index here.
    slots: Vec<Option<Slot>>,
    /// Empty slots, reused first.
    free: Vec<u32>,
    /// (slot, generation) in the order values were stored: cache-mode
    /// eviction order. Entries whose slot moved on are skipped.
    fifo: VecDeque<(u32, u64)>,
    next_generation: u64,
    /// Sum of the lengths of the values held, in bytes.
    pub bytes: u64,
    /// Bytes of the values that left the table while a reader held them
    /// and are still alive: added by [`LargeTable::remove`], taken off by
    /// the buffer's drop (in whatever thread drops the last clone).
    pinned: Arc<AtomicU64>,
    /// The budget of `bytes` plus the pinned bytes, in bytes.
    pub bytes_max: u64,
    /// Values held.
    pub count: u64,
}

impl LargeTable {
    /// An empty table with a budget of `bytes_max` bytes.
    pub fn new(bytes_max: u64) -> LargeTable {
        LargeTable {
            slots: Vec::new(),
            free: Vec::new(),
            fifo: VecDeque::new(),
            next_generation: 0,
            bytes: 0,
            pinned: Arc::new(AtomicU64::new(0)),
            bytes_max,
            count: 0,
        }
    }

    /// Holds `value` for the key (`hash`, `key`); returns its slot. The
    /// caller checked the budget. The front ends insert each buffer they
    /// receive once; a clone inserted again after it was pinned would stay
    /// counted as pinned too (an overcount, never an undercount).
    pub fn insert(&mut self, value: LargeValue, hash: u64, key: &[u8]) -> u32 {
        let generation = self.next_generation;
        self.next_generation += 1;
        self.bytes += value.len() as u64;
        self.count += 1;
        let slot = Slot {
            value,
            generation,
            hash,
            key: key.into(),
        };
        let at = match self.free.pop() {
            Some(at) => {
                self.slots[at as usize] = Some(slot);
                at
            }
            None => {
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as u32
            }
        };
        self.fifo.push_back((at, generation));
        if self.fifo.len() > FIFO_SLACK_FACTOR * self.count as usize + FIFO_SLACK_MIN {
            let slots = &self.slots;
            self.fifo.retain(|&(s, g)| {
                slots
                    .get(s as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|x| x.generation == g)
            });
        }
        at
    }

    /// Drops the value in `slot` (its stub left the index); returns its
    /// length in bytes, 0 if the slot was empty. A value a reader still
    /// holds stays counted as pinned until its last clone drops.
    pub fn remove(&mut self, slot: u32) -> u64 {
        match self.slots.get_mut(slot as usize).and_then(Option::take) {
            Some(s) => {
                let n = s.value.len() as u64;
                self.bytes -= n;
                self.count -= 1;
                self.free.push(slot);
                // The table's clone is alive until the end of this arm, so
                // the buffer's drop (which takes the bytes off) comes after
                // they were added. A value already pinned elsewhere (set
                // once) is not counted twice.
                if s.value.shared() && s.value.0.pinned.set(Arc::clone(&self.pinned)).is_ok() {
                    self.pinned.fetch_add(n, Ordering::AcqRel);
                }
                n
            }
            None => {
                debug_assert!(false, "large slot {slot} is empty");
                0
            }
        }
    }

    /// The value in `slot`.
    #[inline]
    pub fn get(&self, slot: u32) -> Option<&LargeValue> {
        self.slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .map(|s| &s.value)
    }

    /// The value in `slot`, writable.
    pub fn get_mut(&mut self, slot: u32) -> Option<&mut LargeValue> {
        self.slots
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
            .map(|s| &mut s.value)
    }

    /// Length of the value in `slot`, in bytes (0 if empty).
    #[inline]
    pub fn len_of(&self, slot: u32) -> u64 {
        self.get(slot).map_or(0, |v| v.len() as u64)
    }

    /// Bytes removing the value in `slot` would give back now: its length
    /// if no reader holds it, 0 if one does (it would stay, pinned).
    pub fn freed_by_removing(&self, slot: u32) -> u64 {
        self.get(slot)
            .filter(|v| !v.shared())
            .map_or(0, |v| v.len() as u64)
    }

    /// Bytes of the stored values a reader holds now (evicting them would
    /// free nothing). Walks every slot: for the rare PUT that must evict.
    pub fn shared_bytes(&self) -> u64 {
        self.slots
            .iter()
            .flatten()
            .filter(|s| s.value.shared())
            .map(|s| s.value.len() as u64)
            .sum()
    }

    /// Bytes of values that left the table but a reader still holds.
    #[inline]
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned.load(Ordering::Acquire)
    }

    /// Bytes the budget counts: stored plus pinned.
    #[inline]
    pub fn used_bytes(&self) -> u64 {
        self.bytes + self.pinned_bytes()
    }

    /// The oldest value still held: (slot, key hash, key), with stale
    /// FIFO entries dropped on the way.
    pub fn oldest(&mut self) -> Option<(u32, u64, Box<[u8]>)> {
        while let Some(&(slot, generation)) = self.fifo.front() {
            match self.slots.get(slot as usize).and_then(Option::as_ref) {
                Some(s) if s.generation == generation => {
                    return Some((slot, s.hash, s.key.clone()));
                }
                _ => {
                    self.fifo.pop_front();
                }
            }
        }
        None
    }
}

/// The inline stub naming `slot`.
#[inline]
pub(crate) fn stub(slot: u32) -> [u8; LARGE_STUB_BYTES] {
    let mut b = [0u8; LARGE_STUB_BYTES];
    b[..4].copy_from_slice(&slot.to_le_bytes());
    b
}

/// The slot a stub's inline value names.
#[inline]
pub(crate) fn slot_of(inline: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    if let Some(s) = inline.get(..4) {
        b.copy_from_slice(s);
    }
    u32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use crate::testutil::{both_modes, h, put_large, put_ok, small};
    use crate::{
        DeleteResult, GetRefResult, GetResult, LargeValue, Mode, PutCond, PutResult, ValueRef,
        LARGE_VALUE_BYTES_MAX, LARGE_VALUE_BYTES_MIN,
    };

    /// A large value whose bytes name `seed`.
    fn big(seed: u8, extra: usize) -> LargeValue {
        let v: Vec<u8> = (0..LARGE_VALUE_BYTES_MIN + extra)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        LargeValue::from_boxed(v.into_boxed_slice())
    }

    #[track_caller]
    fn assert_large(p: &mut crate::Partition, key: &[u8], want: &LargeValue) {
        match p.get_ref(h(key), key, 0) {
            GetRefResult::Found {
                value: ValueRef::Large(v),
                ..
            } => assert!(v == want, "same bytes"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stored_replaced_deleted_and_counted_exactly() {
        for mode in both_modes() {
            let mut p = small(mode);
            p.set_large_bytes_max(64 << 20);
            let a = big(1, 0);
            let n = a.len() as u64;
            assert_eq!(put_large(&mut p, b"a", a.clone()), PutResult::Stored);
            assert_large(&mut p, b"a", &a);
            let s = p.stats();
            assert_eq!(
                (s.items, s.bytes, s.large_values, s.large_bytes),
                (1, 1 + n, 1, n)
            );
            // GET borrows the same bytes.
            assert!(
                matches!(p.get(h(b"a"), b"a", 0), GetResult::Found { value, .. } if value == &a[..])
            );
            // Replace with another large value, then with a small one.
            let b = big(2, 1000);
            assert_eq!(put_large(&mut p, b"a", b.clone()), PutResult::Stored);
            assert_large(&mut p, b"a", &b);
            let s = p.stats();
            assert_eq!(
                (s.items, s.large_values, s.large_bytes),
                (1, 1, b.len() as u64)
            );
            assert_eq!(s.bytes, 1 + b.len() as u64);
            p.check();
            put_ok(&mut p, b"a", b"tiny", 0);
            let s = p.stats();
            assert_eq!(
                (s.items, s.bytes, s.large_values, s.large_bytes),
                (1, 5, 0, 0)
            );
            // put() of a long slice makes a large value too.
            put_ok(&mut p, b"c", &b, 0);
            assert_large(&mut p, b"c", &b);
            assert_eq!(p.delete(h(b"c"), b"c", 0), DeleteResult::Deleted);
            let s = p.stats();
            assert_eq!(
                (s.items, s.bytes, s.large_values, s.large_bytes),
                (1, 5, 0, 0)
            );
            // The reader's clone outlives the key; the budget does not wait.
            assert_eq!(b.len(), LARGE_VALUE_BYTES_MIN + 1000);
            p.check();
        }
    }

    #[test]
    fn conditions_and_expiry_apply_to_large_values() {
        for mode in both_modes() {
            let mut p = small(mode);
            p.set_large_bytes_max(64 << 20);
            let a = big(3, 0);
            assert_eq!(
                p.put_large(h(b"k"), b"k", a.clone(), 0, PutCond::IfPresent, 0),
                PutResult::ConditionFailed
            );
            assert_eq!(p.stats().large_bytes, 0);
            assert_eq!(
                p.put_large(h(b"k"), b"k", a.clone(), 10, PutCond::IfAbsent, 0),
                PutResult::Stored
            );
            assert_eq!(
                p.put_large(h(b"k"), b"k", a.clone(), 0, PutCond::IfAbsent, 0),
                PutResult::ConditionFailed
            );
            assert!(p.set_expiry(h(b"k"), b"k", 20, 0));
            assert_eq!(p.get(h(b"k"), b"k", 20), GetResult::NotFound);
            let s = p.stats();
            assert_eq!(
                (s.items, s.bytes, s.large_values, s.large_bytes),
                (0, 0, 0, 0)
            );
            // The sweep reclaims an expired large value nobody reads.
            assert_eq!(
                p.put_large(h(b"k"), b"k", a.clone(), 30, PutCond::Always, 0),
                PutResult::Stored
            );
            let buckets = p.index_buckets();
            assert_eq!(p.sweep(30, buckets), 1);
            let s = p.stats();
            assert_eq!(
                (s.items, s.large_values, s.large_bytes, s.expired),
                (0, 0, 0, 2)
            );
            p.check();
        }
    }

    #[test]
    fn cache_mode_evicts_the_oldest_large_values_for_room() {
        let mut p = small(Mode::Cache);
        let a = big(4, 0);
        let n = a.len() as u64;
        p.set_large_bytes_max(3 * n);
        for (i, k) in [b"k0", b"k1", b"k2", b"k3", b"k4"].iter().enumerate() {
            assert_eq!(put_large(&mut p, *k, big(i as u8, 0)), PutResult::Stored);
            let s = p.stats();
            assert!(s.large_bytes <= 3 * n);
            p.check();
        }
        let s = p.stats();
        assert_eq!((s.large_values, s.large_bytes, s.evictions), (3, 3 * n, 2));
        assert_eq!(p.get(h(b"k0"), b"k0", 0), GetResult::NotFound);
        assert_eq!(p.get(h(b"k1"), b"k1", 0), GetResult::NotFound);
        assert_large(&mut p, b"k4", &big(4, 0));
        // Longer than the whole budget: refused, nothing evicted.
        let huge = LargeValue::from_boxed(vec![0; 3 * n as usize + 1].into_boxed_slice());
        assert_eq!(put_large(&mut p, b"z", huge), PutResult::TooLarge);
        assert_eq!(p.stats().large_values, 3);
        // Many store-and-delete rounds keep the FIFO bounded and the
        // counters exact.
        for i in 0..500u32 {
            let k = i.to_le_bytes();
            assert_eq!(put_large(&mut p, &k, big(4, 0)), PutResult::Stored);
            assert_eq!(p.delete(h(&k), &k, 0), DeleteResult::Deleted);
        }
        p.check();
        // The first round evicted the oldest to make room; the rest fit.
        assert_eq!(p.stats().large_values, 2);
        assert_large(&mut p, b"k4", &big(4, 0));
    }

    #[test]
    fn cache_log_overwriting_a_stub_frees_its_large_value() {
        let mut p = crate::testutil::sized(Mode::Cache, 64 << 10, None);
        p.set_large_bytes_max(64 << 20);
        assert_eq!(put_large(&mut p, b"big", big(5, 0)), PutResult::Stored);
        // Small items wrap the log round over the stub.
        for i in 0..5000u32 {
            let k = i.to_le_bytes();
            let _ = p.put(h(&k), &k, &[7u8; 100], 0, PutCond::Always, 0);
        }
        assert_eq!(p.get(h(b"big"), b"big", 0), GetResult::NotFound);
        let s = p.stats();
        assert_eq!((s.large_values, s.large_bytes), (0, 0));
        p.check();
    }

    #[test]
    fn store_mode_refuses_past_the_budget_and_keeps_the_old_value() {
        let mut p = small(Mode::Store);
        let a = big(6, 0);
        let n = a.len() as u64;
        p.set_large_bytes_max(2 * n);
        assert_eq!(put_large(&mut p, b"a", big(6, 0)), PutResult::Stored);
        assert_eq!(put_large(&mut p, b"b", big(6, 0)), PutResult::Stored);
        assert_eq!(
            put_large(&mut p, b"c", big(6, 0)),
            PutResult::InsufficientSpace
        );
        // Replacing a large value counts the old one as leaving.
        let b = big(7, 0);
        assert_eq!(put_large(&mut p, b"b", b.clone()), PutResult::Stored);
        let bigger = big(8, 10);
        assert_eq!(
            put_large(&mut p, b"b", bigger),
            PutResult::InsufficientSpace
        );
        assert_large(&mut p, b"b", &b);
        assert_eq!(p.delete(h(b"a"), b"a", 0), DeleteResult::Deleted);
        assert_eq!(put_large(&mut p, b"c", big(6, 0)), PutResult::Stored);
        let s = p.stats();
        assert_eq!((s.large_values, s.large_bytes, s.evictions), (2, 2 * n, 0));
        p.check();
        // Over the hard limit: refused before any copy.
        let over = vec![0u8; LARGE_VALUE_BYTES_MAX + 1];
        assert_eq!(
            p.put(h(b"d"), b"d", &over, 0, PutCond::Always, 0),
            PutResult::TooLarge
        );
    }

    /// Holds a clone of the large value stored under `key`, as a reader
    /// (a RESP reply, a GET_CHUNK pin) does.
    fn pin(p: &mut crate::Partition, key: &[u8]) -> LargeValue {
        match p.get_ref(h(key), key, 0) {
            GetRefResult::Found {
                value: ValueRef::Large(v),
                ..
            } => v.clone(),
            other => panic!("{other:?}"),
        }
    }

    #[track_caller]
    fn assert_within_budget(p: &crate::Partition) {
        let s = p.stats();
        assert!(
            s.large_bytes + s.large_pinned_bytes <= s.large_bytes_max,
            "{s:?}"
        );
    }

    /// A partition of `mode` whose large budget holds three values of
    /// `n` bytes (returned), where `k` was written twice and a reader
    /// holds each value written: the first, replaced, stays alive (and in
    /// the budget) as a pinned value.
    fn two_pinned_writes(mode: Mode) -> (crate::Partition, u64, Vec<LargeValue>) {
        let mut p = small(mode);
        let n = big(0, 0).len() as u64;
        p.set_large_bytes_max(3 * n);
        let mut held = Vec::new();
        for i in 0..2u8 {
            assert_eq!(put_large(&mut p, b"k", big(i, 0)), PutResult::Stored);
            held.push(pin(&mut p, b"k"));
            assert_within_budget(&p);
        }
        (p, n, held)
    }

    #[test]
    fn store_mode_counts_pinned_replaced_values_until_released() {
        let (mut p, n, mut held) = two_pinned_writes(Mode::Store);
        assert_eq!(put_large(&mut p, b"k", big(2, 0)), PutResult::Stored);
        let s = p.stats();
        assert_eq!((s.large_bytes, s.large_pinned_bytes), (n, 2 * n));
        held.push(pin(&mut p, b"k"));
        // The stored value is pinned too, so replacing it frees nothing.
        assert_eq!(
            put_large(&mut p, b"k", big(3, 0)),
            PutResult::InsufficientSpace
        );
        assert_within_budget(&p);
        p.check();
        // Readers letting go give the bytes back, in any order.
        held.remove(0);
        assert_eq!(p.stats().large_pinned_bytes, n);
        assert_eq!(put_large(&mut p, b"k", big(3, 0)), PutResult::Stored);
        assert_eq!(p.stats().large_pinned_bytes, 2 * n);
        held.clear();
        let s = p.stats();
        assert_eq!((s.large_bytes, s.large_pinned_bytes), (n, 0));
        // A value nobody holds leaves the budget at once, as before.
        assert_eq!(p.delete(h(b"k"), b"k", 0), DeleteResult::Deleted);
        let s = p.stats();
        assert_eq!((s.large_bytes, s.large_pinned_bytes), (0, 0));
        p.check();
    }

    #[test]
    fn cache_mode_evicts_around_pinned_values_and_refuses_when_they_fill_the_budget() {
        let (mut p, n, mut held) = two_pinned_writes(Mode::Cache);
        // One pinned (the first, replaced) and one stored leave room for
        // one more.
        assert_eq!(put_large(&mut p, b"other", big(5, 0)), PutResult::Stored);
        assert_within_budget(&p);
        let s = p.stats();
        assert_eq!((s.large_bytes, s.large_pinned_bytes), (2 * n, n));
        held.push(pin(&mut p, b"other"));
        // Every byte of the budget is held by readers: refused, with
        // nothing evicted (evicting would free nothing).
        assert_eq!(
            put_large(&mut p, b"k", big(6, 0)),
            PutResult::InsufficientSpace
        );
        assert_within_budget(&p);
        assert_large(&mut p, b"other", &big(5, 0));
        assert_large(&mut p, b"k", &big(1, 0));
        // With the first pin let go there is room again; the replaced
        // value, still read, stays pinned.
        held.remove(0);
        assert_eq!(put_large(&mut p, b"k", big(6, 0)), PutResult::Stored);
        assert_within_budget(&p);
        assert_large(&mut p, b"k", &big(6, 0));
        assert_eq!(p.stats().large_pinned_bytes, n);
        held.clear();
        let s = p.stats();
        assert_eq!((s.large_bytes, s.large_pinned_bytes), (2 * n, 0));
        p.check();
    }

    #[test]
    fn value_mut_writes_a_large_value_only_while_unshared() {
        let mut p = small(Mode::Store);
        p.set_large_bytes_max(64 << 20);
        put_ok(&mut p, b"a", &big(9, 0), 0);
        p.value_mut(h(b"a"), b"a", 0).expect("unshared")[0] = 0xaa;
        let held = match p.get_ref(h(b"a"), b"a", 0) {
            GetRefResult::Found {
                value: ValueRef::Large(v),
                ..
            } => v.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(held[0], 0xaa);
        assert!(p.value_mut(h(b"a"), b"a", 0).is_none(), "a reader holds it");
        drop(held);
        assert!(p.value_mut(h(b"a"), b"a", 0).is_some());
    }
}
