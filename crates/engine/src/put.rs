//! PUT: store a value, with an optional condition and expiry time.
//!
//! Both modes first check sizes, then look the key up (reclaiming an
//! expired copy) to decide the condition. They differ in where the new item
//! goes: cache mode appends to the log and, if the bucket is full, drops
//! the oldest entry of the bucket; store mode allocates a chunk and fails
//! with nothing changed when either a chunk or an index slot is missing
//! (each mode's [`Place`]).

use fabrickv_types::KeyHash;

use crate::alloc::Slab;
use crate::index::{offset_of, pack, SlotRef, ITEM_SLOTS_PER_BUCKET, OFFSET_MASK};
use crate::item;
use crate::large::{self, LargeValue, LARGE_STUB_BYTES};
use crate::log::Log;
use crate::partition::{Core, Hit, Storage};

/// When a PUT applies (Redis `SET`, `SET NX`, `SET XX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutCond {
    /// Always store.
    Always,
    /// Store only if the key is absent (or expired).
    IfAbsent,
    /// Store only if the key is present and live.
    IfPresent,
}

/// Outcome of a PUT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum PutResult {
    /// The value is stored.
    Stored,
    /// Store mode only: no room for the item or its index slot. Nothing
    /// was changed; a previous value of the key is intact.
    InsufficientSpace,
    /// The key or value is longer than this partition can ever hold.
    TooLarge,
    /// The `PutCond` did not hold; nothing was changed.
    ConditionFailed,
}

/// One PUT as each mode's `Core::put` takes it.
pub(crate) struct Put<'a> {
    /// The key's hash.
    pub hash: KeyHash,
    /// The key.
    pub key: &'a [u8],
    /// The bytes that go inline in the pool: the value, or with `large`
    /// [`LARGE_STUB_BYTES`] zeros standing for its stub (the size checks
    /// read its length; the stub is written in its place).
    pub value: &'a [u8],
    /// A large value: it goes into the partition's table and the pool
    /// holds its stub.
    pub large: Option<LargeValue>,
    /// Absolute expiry time on the caller's clock; 0 means none.
    pub expire_at_ms: u64,
    /// When the PUT applies.
    pub cond: PutCond,
    /// The caller's clock, to tell an expired copy from a live one.
    pub now_ms: u64,
    /// A memcached client's CAS value and flags, stored with the item
    /// (none beside a stub: memcached values stay small).
    pub meta: Option<item::ItemMeta>,
}

/// The part of a PUT that differs by mode: where the checked item goes.
/// Implemented for each mode's core and called with no indirection.
pub(crate) trait Place {
    /// Stores the item of `put`, which passed the checks; `existing` is
    /// the live item with its key, if any.
    fn place(&mut self, put: Put<'_>, existing: Option<Hit>) -> PutResult;
}

impl<S: Storage> Core<S>
where
    Core<S>: Place,
{
    /// PUT: the checks common to both modes, then the mode's placement.
    /// Always inlined into each mode's `put`, with `place` inlined too:
    /// one function per mode, as if written out twice.
    #[inline(always)]
    fn checked_put(&mut self, put: Put<'_>) -> PutResult {
        match self.put_precheck(&put) {
            Ok(existing) => self.place(put, existing),
            Err(refused) => refused,
        }
    }
}

impl Core<Log> {
    /// Cache-mode PUT. Not generic, so that it is compiled in this crate,
    /// where the helpers it calls can be inlined, whichever crate calls
    /// [`crate::Partition::put`].
    pub(crate) fn put(&mut self, put: Put<'_>) -> PutResult {
        self.checked_put(put)
    }
}

impl Core<Slab> {
    /// Store-mode PUT; not generic, as the cache mode's.
    pub(crate) fn put(&mut self, put: Put<'_>) -> PutResult {
        self.checked_put(put)
    }
}

impl<S: Storage> Core<S> {
    /// The checks common to both modes. Returns the live item with this
    /// key if the PUT may go on, or the result to give if it may not.
    #[inline(always)]
    fn put_precheck(&mut self, put: &Put<'_>) -> Result<Option<Hit>, PutResult> {
        debug_assert!(
            put.large.is_none() || (put.value.len() == LARGE_STUB_BYTES && put.meta.is_none()),
            "a large value's PUT carries its stub's length and no meta"
        );
        if !self.fits(put.key.len(), put.value.len(), put.meta.is_some()) {
            return Err(PutResult::TooLarge);
        }
        if let Some(v) = &put.large {
            if v.len() > large::LARGE_VALUE_BYTES_MAX || v.len() as u64 > self.large.bytes_max {
                return Err(PutResult::TooLarge);
            }
        }
        let existing = self.find_live(put.hash, put.key, put.now_ms);
        match (put.cond, existing.is_some()) {
            (PutCond::IfAbsent, true) | (PutCond::IfPresent, false) => {
                Err(PutResult::ConditionFailed)
            }
            _ => Ok(existing),
        }
    }

    /// Writes the item of `put` at `pos` of the pool. Always inlined:
    /// each PUT path compiles to the direct `item::write` it had, with no
    /// call added.
    ///
    /// With a large value, it goes into the partition's table and the
    /// item written is its stub. Returns the value bytes `stats.bytes`
    /// counts for it.
    #[inline(always)]
    fn write_item(&mut self, pos: usize, put: Put<'_>) -> usize {
        let (hash, key, expire_at_ms) = (put.hash, put.key, put.expire_at_ms);
        self.note_expiry(hash, expire_at_ms);
        match put.large {
            None => {
                let pool = self.storage.pool_mut();
                item::write(pool, pos, hash.0, key, put.value, expire_at_ms, put.meta);
                put.value.len()
            }
            Some(v) => {
                let len = v.len();
                let stub = large::stub(self.large.insert(v, hash.0, key));
                let pool = self.storage.pool_mut();
                item::write(pool, pos, hash.0, key, &stub, expire_at_ms, None);
                item::add_flags(pool, pos, item::FLAG_LARGE);
                len
            }
        }
    }

    /// Counts a stored item of `kv_bytes` key and value bytes.
    fn count_stored(&mut self, kv_bytes: usize) {
        self.stats.puts += 1;
        self.stats.items += 1;
        self.stats.bytes += kv_bytes as u64;
    }
}

impl Place for Core<Log> {
    /// Cache-mode PUT: append to the log, then point the index at it.
    ///
    /// With a large value, its stub goes into the log; the oldest large
    /// values are evicted first while the large budget has no room for
    /// it. The item `existing` found is not used: appending may overwrite
    /// it, so the log looks the key up again after.
    #[inline(always)]
    fn place(&mut self, put: Put<'_>, _existing: Option<Hit>) -> PutResult {
        let (hash, key) = (put.hash, put.key);
        if let Some(v) = &put.large {
            if !self.evict_large_for(v.len() as u64, put.now_ms) {
                return PutResult::InsufficientSpace;
            }
        }
        let size = item::item_bytes_with(key.len(), put.value.len(), put.meta.is_some());
        let (logical, pos) = self.log_append(size, put.now_ms);
        let value_len = self.write_item(pos, put);
        let entry = pack(hash.tag(), logical & OFFSET_MASK);

        // Appending may have overwritten the old copy, so look again.
        let at = match self.find(hash, key) {
            Some(old) => {
                self.unlink(&old);
                old.at
            }
            None => {
                let main = self.index.main_bucket(hash);
                match self.index.find_empty(main) {
                    Some(at) => at,
                    None => self.drop_oldest_in(main),
                }
            }
        };
        self.index.set(at, entry);
        self.versions.bump(hash);
        self.count_stored(key.len() + value_len);
        PutResult::Stored
    }
}

impl Core<Log> {
    /// Evicts the oldest large values until `len` more bytes fit the
    /// large budget. False if they cannot: the values readers pin (which
    /// evicting does not free) leave no room, or nothing is left to evict.
    fn evict_large_for(&mut self, len: u64, now_ms: u64) -> bool {
        if self.large.pinned_bytes() + len > self.large.bytes_max {
            return false;
        }
        let mut can_fit = false;
        while self.large.used_bytes() + len > self.large.bytes_max {
            let Some((slot, hash, key)) = self.large.oldest() else {
                return false;
            };
            // Evicting a value a reader holds frees nothing. The first
            // time that would happen, check that evicting can make room
            // at all (a walk over every slot, so not on the common path
            // where victims are unread), and refuse, evicting nothing
            // more, when only held values would be left.
            if !can_fit && self.large.freed_by_removing(slot) == 0 {
                let held = self.large.pinned_bytes() + self.large.shared_bytes();
                if held + len > self.large.bytes_max {
                    return false;
                }
                can_fit = true;
            }
            let hash = KeyHash(hash);
            match self.find(hash, &key) {
                Some(hit)
                    if hit.header.is_large()
                        && large::slot_of(item::value(
                            self.storage.pool(),
                            hit.pos,
                            &hit.header,
                        )) == slot =>
                {
                    self.unlink(&hit);
                    if hit.header.is_expired(now_ms) {
                        self.stats.expired += 1;
                    } else {
                        self.stats.evictions += 1;
                    }
                }
                _ => {
                    // Not reachable: a held value always has its stub.
                    debug_assert!(false, "large value without its stub");
                    self.large.remove(slot);
                }
            }
        }
        true
    }

    /// Frees the slot of `main` whose item is oldest in the log (the next
    /// to be overwritten anyway) and returns it: MICA's lossy index.
    fn drop_oldest_in(&mut self, main: usize) -> SlotRef {
        let at = (0..ITEM_SLOTS_PER_BUCKET)
            .map(|slot| SlotRef { bucket: main, slot })
            .max_by_key(|&at| self.storage.age(offset_of(self.index.entry(at))))
            .unwrap_or(SlotRef {
                bucket: main,
                slot: 0,
            });
        let e = self.index.entry(at);
        if let Some(pos) = self.storage.resolve(offset_of(e)) {
            let header = item::read_header(self.storage.pool(), pos);
            self.unlink(&Hit { at, pos, header });
            self.stats.index_collisions += 1;
        }
        at
    }
}

impl Place for Core<Slab> {
    /// Store-mode PUT: allocate first, so that a full store changes nothing.
    ///
    /// With a large value, its stub takes a chunk; a large
    /// budget without room for it (after the key's old large value, if
    /// any, leaves) answers `InsufficientSpace` with nothing changed.
    #[inline(always)]
    fn place(&mut self, put: Put<'_>, existing: Option<Hit>) -> PutResult {
        let (hash, key) = (put.hash, put.key);
        if let Some(v) = &put.large {
            // The key's old large value gives its bytes back, unless a
            // reader holds it (it then stays, pinned, in the budget).
            let leaving = existing
                .filter(|old| old.header.is_large())
                .map_or(0, |old| {
                    let inline = item::value(self.storage.pool(), old.pos, &old.header);
                    self.large.freed_by_removing(large::slot_of(inline))
                });
            if self.large.used_bytes() - leaving + v.len() as u64 > self.large.bytes_max {
                return PutResult::InsufficientSpace;
            }
        }
        let size = item::item_bytes_with(key.len(), put.value.len(), put.meta.is_some());
        let Some(class) = self.storage.class_for(size) else {
            return PutResult::TooLarge;
        };
        let value_len = match existing {
            Some(old) if self.storage.class_of(old.pos) == class => {
                // Same chunk size: overwrite in place. Nothing can fail
                // half-way, and no reader holds a borrow of the old value.
                self.drop_value(old.pos, &old.header);
                self.write_item(old.pos, put)
            }
            Some(old) => {
                let vacated = self.storage.pages_vacated();
                let Some(pos) = self.alloc_chunk(class) else {
                    return PutResult::InsufficientSpace;
                };
                // Emptying a page for this chunk may have moved the old item.
                let old = if self.storage.pages_vacated() == vacated {
                    old
                } else if let Some(moved) = self.find(hash, key) {
                    moved
                } else {
                    debug_assert!(false, "relocation keeps every item");
                    self.storage.free(pos);
                    return PutResult::InsufficientSpace;
                };
                self.drop_value(old.pos, &old.header);
                let n = self.write_item(pos, put);
                self.index
                    .set(old.at, pack(self.tag_for(hash, key), pos as u64));
                self.storage.free(old.pos);
                n
            }
            None => {
                let main = self.index.main_bucket(hash);
                if !self.index.can_insert(main) {
                    return PutResult::InsufficientSpace;
                }
                let Some(pos) = self.alloc_chunk(class) else {
                    return PutResult::InsufficientSpace;
                };
                let n = self.write_item(pos, put);
                if self
                    .index
                    .insert(main, pack(self.tag_for(hash, key), pos as u64))
                    .is_none()
                {
                    debug_assert!(false, "can_insert promised a slot");
                    let header = item::read_header(self.storage.pool(), pos);
                    self.stats.bytes += (key.len() + n) as u64;
                    self.drop_value(pos, &header);
                    self.storage.free(pos);
                    return PutResult::InsufficientSpace;
                }
                self.stats.items += 1;
                n
            }
        };
        self.versions.bump(hash);
        self.stats.puts += 1;
        self.stats.bytes += (key.len() + value_len) as u64;
        PutResult::Stored
    }
}

#[cfg(test)]
mod tests {
    use fabrickv_types::limits::{KEY_BYTES_MAX, VALUE_BYTES_MAX};

    use crate::testutil::{assert_found, both_modes, h, put_ok, sized, small};
    use crate::{GetResult, Mode, PutCond, PutResult, PAGES_PER_POOL_MIN, PAGE_BYTES_MAX};

    #[test]
    fn overwrite_replaces_value_and_counts_once() {
        for mode in both_modes() {
            let mut p = small(mode);
            put_ok(&mut p, b"k", b"short", 0);
            let long = vec![9u8; 700];
            put_ok(&mut p, b"k", &long, 0);
            assert_found(&mut p, b"k", 0, &long, 0);
            put_ok(&mut p, b"k", b"xy", 5);
            assert_found(&mut p, b"k", 0, b"xy", 5);
            let s = p.stats();
            assert_eq!((s.puts, s.items, s.bytes), (3, 1, 3));
            p.check();
        }
    }

    #[test]
    fn conditions() {
        use PutCond::{IfAbsent, IfPresent};
        use PutResult::{ConditionFailed, Stored};
        // Each PUT of key `c`: value, expiry, condition, clock, result,
        // and what a read at that clock then finds (value, expiry).
        type Step = (&'static [u8], u64, PutCond, u64, PutResult);
        type Read = Option<(&'static [u8], u64)>;
        let steps: [(Step, Read); 6] = [
            ((b"1", 0, IfPresent, 0, ConditionFailed), None),
            ((b"1", 10, IfAbsent, 0, Stored), Some((b"1", 10))),
            ((b"2", 0, IfAbsent, 0, ConditionFailed), Some((b"1", 10))),
            ((b"3", 10, IfPresent, 0, Stored), Some((b"3", 10))),
            // Once expired the key is absent for both conditions.
            ((b"4", 0, IfPresent, 10, ConditionFailed), None),
            ((b"5", 0, IfAbsent, 10, Stored), Some((b"5", 0))),
        ];
        for mode in both_modes() {
            let mut p = small(mode);
            let k = b"c";
            for ((value, expire_at_ms, cond, now, result), then) in steps {
                assert_eq!(p.put(h(k), k, value, expire_at_ms, cond, now), result);
                match then {
                    Some((v, exp)) => assert_found(&mut p, k, now, v, exp),
                    None => assert_eq!(p.get(h(k), k, now), GetResult::NotFound),
                }
            }
            let s = p.stats();
            assert_eq!((s.items, s.expired, s.puts), (1, 1, 3));
            p.check();
        }
    }

    #[test]
    fn too_large_is_refused_and_the_limit_is_exact() {
        for mode in both_modes() {
            let mut p = small(mode);
            let max = p.max_item_value_bytes();
            assert!(max > 2000);
            let key = vec![b'k'; KEY_BYTES_MAX];
            let hk = h(&key);
            let v = vec![1u8; max];
            assert_eq!(
                p.put(hk, &key, &v, 0, PutCond::Always, 0),
                PutResult::Stored
            );
            assert_eq!(
                p.get(hk, &key, 0),
                GetResult::Found {
                    value: &v,
                    expire_at_ms: 0
                }
            );
            let v = vec![1u8; max + 1];
            assert_eq!(
                p.put(hk, &key, &v, 0, PutCond::Always, 0),
                PutResult::TooLarge
            );
            let long_key = vec![b'k'; KEY_BYTES_MAX + 1];
            assert_eq!(
                p.put(h(&long_key), &long_key, b"", 0, PutCond::Always, 0),
                PutResult::TooLarge
            );
            p.check();
        }
    }

    #[test]
    fn big_pools_hold_the_largest_value() {
        for mode in both_modes() {
            let p = sized(mode, PAGES_PER_POOL_MIN * PAGE_BYTES_MAX, Some(16));
            assert_eq!(p.max_item_value_bytes(), VALUE_BYTES_MAX);
        }
    }

    #[test]
    fn store_replace_failure_keeps_the_old_value() {
        let mut p = sized(Mode::Store, 64 << 10, None);
        let small_v = vec![3u8; 10];
        put_ok(&mut p, b"keep", &small_v, 0);
        // Fill every page with big items.
        let big = vec![4u8; 3000];
        let mut n = 0u32;
        while p.put(
            h(&n.to_le_bytes()),
            &n.to_le_bytes(),
            &big,
            0,
            PutCond::Always,
            0,
        ) == PutResult::Stored
        {
            n += 1;
        }
        let before = p.stats();
        // Replacing with a value of another size class needs a new chunk.
        assert_eq!(
            p.put(h(b"keep"), b"keep", &big, 0, PutCond::Always, 0),
            PutResult::InsufficientSpace
        );
        assert_found(&mut p, b"keep", 0, &small_v, 0);
        let after = p.stats();
        assert_eq!(
            (after.items, after.bytes, after.puts),
            (before.items, before.bytes, before.puts)
        );
        // A value of the same class still replaces in place.
        let same_class = vec![5u8; 12];
        put_ok(&mut p, b"keep", &same_class, 0);
        assert_found(&mut p, b"keep", 0, &same_class, 0);
        p.check();
    }

    #[test]
    fn store_replacing_across_classes_does_not_leak() {
        // Far more bytes than the pool holds go through one key, moving it
        // between size classes each time: the old chunk must be freed.
        let mut p = sized(Mode::Store, 64 << 10, None);
        for i in 0..2000u32 {
            let v = vec![i as u8; if i % 2 == 0 { 100 } else { 3000 }];
            assert_eq!(
                p.put(h(b"k"), b"k", &v, 0, PutCond::Always, 0),
                PutResult::Stored,
                "round {i}"
            );
            assert_found(&mut p, b"k", 0, &v, 0);
        }
        assert_eq!(p.stats().items, 1);
        p.check();
    }

    #[test]
    fn meta_is_stored_replaced_and_survives_expiry_changes() {
        use crate::ItemMeta;
        for mode in both_modes() {
            let mut p = small(mode);
            let m = ItemMeta {
                cas: 7,
                client_flags: u32::MAX,
            };
            assert_eq!(
                p.put_with_meta(h(b"k"), b"k", b"v1", 0, PutCond::Always, 0, m),
                PutResult::Stored
            );
            let it = p.get_item(h(b"k"), b"k", 0).expect("found");
            assert_eq!((it.value, it.meta), (&b"v1"[..], Some(m)));
            assert!(p.set_expiry(h(b"k"), b"k", 50, 0));
            let it = p.get_item(h(b"k"), b"k", 0).expect("found");
            assert_eq!((it.expire_at_ms, it.meta), (50, Some(m)));
            // A plain put (RESP, native kv) drops the meta.
            put_ok(&mut p, b"k", b"v2", 0);
            assert_eq!(p.get_item(h(b"k"), b"k", 0).expect("found").meta, None);
            assert_found(&mut p, b"k", 0, b"v2", 0);
            let s = p.stats();
            assert_eq!((s.items, s.bytes), (1, 3));
            p.check();
        }
    }

    #[test]
    fn meta_items_wrap_the_cache_log_and_fill_the_store() {
        use crate::ItemMeta;
        for mode in both_modes() {
            let mut p = sized(mode, 64 << 10, None);
            for i in 0..5000u32 {
                let k = i.to_le_bytes();
                let v = vec![i as u8; (i % 300) as usize];
                let m = ItemMeta {
                    cas: u64::from(i) + 1,
                    client_flags: i,
                };
                let r = if i % 3 == 0 {
                    p.put(h(&k), &k, &v, 0, PutCond::Always, 0)
                } else {
                    p.put_with_meta(h(&k), &k, &v, 0, PutCond::Always, 0, m)
                };
                match r {
                    PutResult::Stored => {
                        let it = p.get_item(h(&k), &k, 0).expect("just stored");
                        assert_eq!(it.value, &v[..]);
                        assert_eq!(it.meta, (i % 3 != 0).then_some(m));
                    }
                    PutResult::InsufficientSpace if mode == Mode::Store => {}
                    other => panic!("{mode:?} {i}: {other:?}"),
                }
            }
            p.check();
        }
    }

    #[test]
    fn cache_full_bucket_drops_its_oldest_entry() {
        let mut p = small(Mode::Cache);
        let same = h(b"bucket");
        let keys: Vec<[u8; 4]> = (0..10u32).map(|i| i.to_le_bytes()).collect();
        for k in &keys {
            assert_eq!(p.put(same, k, k, 0, PutCond::Always, 0), PutResult::Stored);
        }
        let dropped = keys.len() - crate::ITEM_SLOTS_PER_BUCKET;
        assert_eq!(p.stats().index_collisions, dropped as u64);
        for (i, k) in keys.iter().enumerate() {
            let r = p.get(same, k, 0);
            if i < dropped {
                assert_eq!(r, GetResult::NotFound, "oldest entries go first");
            } else {
                assert_eq!(
                    r,
                    GetResult::Found {
                        value: k,
                        expire_at_ms: 0
                    }
                );
            }
        }
        assert_eq!(p.stats().items, crate::ITEM_SLOTS_PER_BUCKET as u64);
        p.check();
    }
}
