//! Walking the keyspace: one main bucket (with its overflow chain) at a
//! time, for SCAN, KEYS, RANDOMKEY and FLUSHDB.
//!
//! The index never resizes and an item never moves to another main
//! bucket (an overflow bucket belongs to one main bucket's chain while it
//! holds items), so a walk that visits every main bucket once sees every
//! key that was present for the whole walk, whatever is inserted or
//! deleted between two visits.

use fabrickv_types::KeyHash;

use crate::index::{offset_of, prefetch_line, slot_of_tag, tag_of, Marked, Summary};
use crate::item::{self, ItemMeta};
use crate::large::ValueRef;
use crate::partition::{Core, Hit, Storage};

/// What [`crate::Partition::scan_bucket`] calls for each live item:
/// `(key, value, expire_at_ms)`.
pub type ScanVisit<'f> = dyn FnMut(&[u8], &[u8], u64) + 'f;

/// What [`crate::Partition::scan_from`] calls for each live item:
/// `(key, value, expire_at_ms)`; it returns whether the walk may go on
/// past the chain it is in (false: stop once this chain is done, as when a
/// reply has grown to its bound). A chain is never cut, so that a cursor
/// naming the next main bucket loses nothing.
pub type ScanMore<'f> = dyn FnMut(&[u8], &[u8], u64) -> bool + 'f;

/// One live item as [`crate::Partition::scan_items_from`] shows it: all
/// a copy of the item needs (a checkpoint's record), so that a walk that
/// copies items need not look each key up again under the same lock.
#[derive(Debug, Clone, Copy)]
pub struct ScanItem<'a> {
    /// The key.
    pub key: &'a [u8],
    /// The value: its bytes in the pool, or the large value they name.
    pub value: ValueRef<'a>,
    /// Absolute expiry time in milliseconds; 0 means no TTL.
    pub expire_at_ms: u64,
    /// The CAS value and client flags, if the item was stored with them.
    pub meta: Option<ItemMeta>,
}

/// Which cluster slots a walk wants ([`crate::Partition::scan_slots_from`]):
/// items of other slots are skipped, and in a partition that keeps slot
/// tags ([`crate::Partition::use_slot_tags`]) without their items being
/// read.
pub type SlotFilter<'f> = dyn Fn(u16) -> bool + 'f;

/// What [`crate::Partition::scan_items_from`] calls for each live item;
/// it returns whether the walk may go on past the chain it is in, as
/// [`ScanMore`] does.
pub type ScanItems<'f> = dyn FnMut(ScanItem<'_>) -> bool + 'f;

/// Occupied main buckets a walk keeps prefetched ahead of the one it
/// visits: each item's header sits on a cache line (and often a page) of
/// its own, so a walk that waits for one at a time spends most of its
/// time on misses; this many in flight overlap them.
pub const SCAN_PREFETCH_BUCKETS: usize = 8;

/// Occupied main buckets, past those whose items are prefetched, whose
/// own index lines a walk prefetches: in a sparsely filled index each
/// occupied bucket is a line of its own, and a walk whose items are
/// mostly skipped by their slot tags waits on those lines instead.
pub const SCAN_PREFETCH_LINES: usize = 16;

/// The work one walk may still do; [`crate::Partition::scan_from`] takes
/// what it does out of it, so one budget can span several partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanBudget {
    /// Index entries (live or expired, matching or not) still to examine;
    /// the walk stops at the end of the chain where this reaches 0.
    pub entries: usize,
    /// Summary words still to test, each standing for
    /// [`crate::SUMMARY_BUCKETS_PER_WORD`] main buckets: what a walk over
    /// a mostly empty index costs.
    pub words: usize,
}

impl ScanBudget {
    /// Whether nothing is left to spend.
    pub fn spent(&self) -> bool {
        self.entries == 0 || self.words == 0
    }
}

impl<S: Storage> Core<S> {
    /// Calls `f(key, value, expire_at_ms)` for every item live at `now_ms`
    /// in the chain of main bucket `main` (nothing if `main` is out of
    /// range). Changes nothing.
    pub(crate) fn scan_bucket(&self, main: usize, now_ms: u64, f: &mut ScanVisit<'_>) {
        if main >= self.index.main_count() {
            return;
        }
        self.visit_chain(main, now_ms, None, f);
    }

    /// The item at `pos` with this header, whole: what a walk that copies
    /// items, and replication's read of a key, hand on.
    #[inline]
    pub(crate) fn item_at(&self, pos: usize, header: &item::Header) -> ScanItem<'_> {
        let pool = self.storage.pool();
        ScanItem {
            key: item::key(pool, pos, header),
            value: self.value_of(pos, header),
            expire_at_ms: header.expire_at_ms,
            meta: item::meta(pool, pos, header),
        }
    }

    /// Whether index entry `e` may name an item of a slot `want` takes,
    /// told from the entry alone: with slot tags, exactly; without, the
    /// item decides ([`Core::item_is_wanted`]).
    #[inline]
    fn entry_may_be_wanted(&self, e: u64, want: Option<&SlotFilter<'_>>) -> bool {
        match want {
            Some(want) if self.slot_tags => want(slot_of_tag(tag_of(e))),
            _ => true,
        }
    }

    /// Whether the item at `pos` is of a slot `want` takes, where the
    /// entry could not tell (a partition without slot tags).
    #[inline]
    fn item_is_wanted(
        &self,
        pos: usize,
        header: &item::Header,
        want: Option<&SlotFilter<'_>>,
    ) -> bool {
        match want {
            Some(want) if !self.slot_tags => want(fabrickv_types::slot::key_slot(item::key(
                self.storage.pool(),
                pos,
                header,
            ))),
            _ => true,
        }
    }

    /// Asks the cache for the first line of every item in the chain of
    /// `main` (its header and key), without waiting.
    fn prefetch_chain(&self, main: usize, want: Option<&SlotFilter<'_>>) {
        let pool = self.storage.pool();
        for (_, e) in self.index.chain(main) {
            if !self.entry_may_be_wanted(e, want) {
                continue;
            }
            if let Some(byte) = self.storage.resolve(offset_of(e)).and_then(|p| pool.get(p)) {
                prefetch_line((byte as *const u8).cast());
            }
        }
    }

    /// Calls `f` for every item live at `now_ms` in the chain of `main`;
    /// returns how many entries the chain holds (live or not).
    fn visit_chain(
        &self,
        main: usize,
        now_ms: u64,
        want: Option<&SlotFilter<'_>>,
        f: &mut ScanVisit<'_>,
    ) -> usize {
        let pool = self.storage.pool();
        self.for_live_items(main, now_ms, want, &mut |pos, header| {
            f(
                item::key(pool, pos, header),
                item::value(pool, pos, header),
                header.expire_at_ms,
            )
        })
    }

    /// Calls `f(pos, header)` for every item live at `now_ms` in the
    /// chain of `main` (of a slot `want` takes, if given); returns how
    /// many entries the chain holds.
    fn for_live_items(
        &self,
        main: usize,
        now_ms: u64,
        want: Option<&SlotFilter<'_>>,
        f: &mut dyn FnMut(usize, &item::Header),
    ) -> usize {
        let pool = self.storage.pool();
        let mut examined = 0;
        for (_, e) in self.index.chain(main) {
            examined += 1;
            if !self.entry_may_be_wanted(e, want) {
                continue;
            }
            let Some(pos) = self.storage.resolve(offset_of(e)) else {
                continue;
            };
            let header = item::read_header(pool, pos);
            if !header.is_expired(now_ms) && self.item_is_wanted(pos, &header, want) {
                f(pos, &header);
            }
        }
        examined
    }

    /// Walks the occupied main buckets from `from` on, in order, calling
    /// `f` for every item live at `now_ms`, until `budget` is spent (at a
    /// chain's end), `f` asks to stop, or the index ends. Returns the main
    /// bucket to resume from, or `None` when the walk reached the end.
    /// Empty buckets cost a bit each in the occupancy summary, not a
    /// cache line. Changes no item; a bucket marked occupied whose chain
    /// a delete emptied costs one unit of `budget.entries` and is
    /// unmarked.
    pub(crate) fn scan_from(
        &mut self,
        from: usize,
        now_ms: u64,
        budget: &mut ScanBudget,
        want: Option<&SlotFilter<'_>>,
        f: &mut ScanMore<'_>,
    ) -> Option<usize> {
        self.walk_chains(from, budget, want, &mut |core, main| {
            let mut more = true;
            let examined = core.visit_chain(main, now_ms, want, &mut |k, v, e| {
                more &= f(k, v, e);
            });
            (examined, more)
        })
    }

    /// [`Core::scan_from`] with each item whole: its value resolved (a
    /// large value's, not its stub's bytes) and its meta.
    pub(crate) fn scan_items_from(
        &mut self,
        from: usize,
        now_ms: u64,
        budget: &mut ScanBudget,
        f: &mut ScanItems<'_>,
    ) -> Option<usize> {
        self.walk_chains(from, budget, None, &mut |core, main| {
            let mut more = true;
            let examined = core.for_live_items(main, now_ms, None, &mut |pos, header| {
                more &= f(core.item_at(pos, header));
            });
            (examined, more)
        })
    }

    /// The walk both scans share: `visit(core, main)` visits one occupied
    /// main bucket's chain and returns the entries it examined and
    /// whether the walk may go on; the items prefetched ahead are those
    /// `want` may take.
    fn walk_chains(
        &mut self,
        from: usize,
        budget: &mut ScanBudget,
        want: Option<&SlotFilter<'_>>,
        visit: &mut dyn FnMut(&Self, usize) -> (usize, bool),
    ) -> Option<usize> {
        let main_count = self.index.main_count();
        let resume = |b: usize| (b < main_count).then_some(b);
        let mut b = from;
        // The next occupied bucket not prefetched yet, and how many are
        // prefetched past the one visited (looking ahead costs no budget).
        let mut ahead = from;
        let mut prefetched = 0usize;
        // The first stage: occupied buckets from `ahead` whose lines are
        // loading, up to `lines_end`, and how many.
        let mut lines_end = from;
        let mut lines = 0usize;
        loop {
            if budget.entries == 0 {
                return resume(b);
            }
            match self
                .index
                .next_marked(Summary::Occupied, b, &mut budget.words)
            {
                Marked::End => return None,
                Marked::Later(at) => return resume(at),
                Marked::At(main) => {
                    if ahead <= main {
                        ahead = main + 1;
                        prefetched = 0;
                    } else {
                        prefetched = prefetched.saturating_sub(1);
                    }
                    if lines_end < ahead {
                        lines_end = ahead;
                        lines = 0;
                    }
                    let mut look = SCAN_PREFETCH_LINES;
                    while lines < SCAN_PREFETCH_LINES {
                        match self
                            .index
                            .next_marked(Summary::Occupied, lines_end, &mut look)
                        {
                            Marked::At(next) => {
                                self.index.prefetch_main(next);
                                lines_end = next + 1;
                                lines += 1;
                            }
                            _ => break,
                        }
                    }
                    let mut look = SCAN_PREFETCH_BUCKETS;
                    while prefetched < SCAN_PREFETCH_BUCKETS {
                        match self.index.next_marked(Summary::Occupied, ahead, &mut look) {
                            Marked::At(next) => {
                                self.prefetch_chain(next, want);
                                ahead = next + 1;
                                prefetched += 1;
                                lines = lines.saturating_sub(1);
                            }
                            _ => break,
                        }
                    }
                    let (examined, more) = visit(self, main);
                    if examined == 0 {
                        self.index.unmark_occupied(main);
                    }
                    budget.entries = budget.entries.saturating_sub(examined.max(1));
                    b = main + 1;
                    if !more {
                        return resume(b);
                    }
                }
            }
        }
    }

    /// Turns slot tags on ([`crate::Partition::use_slot_tags`]) and
    /// rewrites every index entry's tag to match; nothing if already on.
    pub(crate) fn retag_by_slot(&mut self) {
        if self.slot_tags {
            return;
        }
        self.slot_tags = true;
        let mut words = usize::MAX;
        let mut from = 0;
        let mut retagged: Vec<(crate::index::SlotRef, u64)> = Vec::new();
        while let Marked::At(main) = self.index.next_marked(Summary::Occupied, from, &mut words) {
            let pool = self.storage.pool();
            for (at, e) in self.index.chain(main) {
                let Some(pos) = self.storage.resolve(offset_of(e)) else {
                    continue;
                };
                let header = item::read_header(pool, pos);
                let tag = self.tag_for(KeyHash(header.hash), item::key(pool, pos, &header));
                retagged.push((at, crate::index::pack(tag, offset_of(e))));
            }
            for (at, e) in retagged.drain(..) {
                self.index.set(at, e);
            }
            from = main + 1;
        }
    }

    /// Removes every item; returns how many were live.
    pub(crate) fn flush(&mut self, now_ms: u64) -> usize {
        let mut live = 0;
        let mut from = 0;
        let mut words = usize::MAX;
        while let Marked::At(main) = self.index.next_marked(Summary::Occupied, from, &mut words) {
            while let Some(hit) = self.first_in(main) {
                if !hit.header.is_expired(now_ms) {
                    live += 1;
                }
                self.unlink(&hit);
                self.stats.deletes += 1;
            }
            self.index.unmark_occupied(main);
            from = main + 1;
        }
        live
    }

    /// The first item in the chain of main bucket `main`.
    fn first_in(&self, main: usize) -> Option<Hit> {
        let pool = self.storage.pool();
        self.index.chain(main).find_map(|(at, e)| {
            let pos = self.storage.resolve(offset_of(e))?;
            let header = item::read_header(pool, pos);
            Some(Hit { at, pos, header })
        })
    }

    /// The version counter of the key of `hash` (see `watch`).
    #[inline]
    pub(crate) fn key_version(&self, hash: KeyHash) -> u64 {
        self.versions.get(hash)
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::{both_modes, h, put_ok, sized, small};
    use crate::{PutCond, PutResult, ScanBudget};

    #[test]
    fn scan_visits_every_live_key_once_and_flush_empties() {
        for mode in both_modes() {
            let mut p = small(mode);
            for i in 0..100u32 {
                let k = i.to_le_bytes();
                let exp = if i < 10 { 5 } else { 0 };
                put_ok(&mut p, &k, b"v", exp);
            }
            let mut seen = Vec::new();
            for b in 0..=p.index_buckets() {
                p.scan_bucket(b, 5, &mut |k, v, _| {
                    assert_eq!(v, b"v");
                    seen.push(k.to_vec());
                });
            }
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), 90, "expired keys are skipped");
            assert_eq!(p.flush(5), 90);
            assert_eq!(p.stats().items, 0);
            p.check();
        }
    }

    /// `scan_items_from` hands each live item whole, as a lookup would
    /// read it: value (a large one's bytes, not its stub's), expiry and
    /// meta; expired items are left out.
    #[test]
    fn scan_items_from_gives_what_a_lookup_gives() {
        use crate::{ItemMeta, LargeValue, ValueRef, LARGE_VALUE_BYTES_MIN};
        let mut p = sized(crate::Mode::Store, 8 << 20, None);
        p.set_large_bytes_max(256 << 20);
        for i in 0..200u32 {
            let k = format!("k{i}");
            let v = vec![i as u8; 1 + i as usize];
            let r = match i % 4 {
                0 => p.put(h(k.as_bytes()), k.as_bytes(), &v, 0, PutCond::Always, 0),
                1 => p.put(h(k.as_bytes()), k.as_bytes(), &v, 50, PutCond::Always, 0),
                2 => p.put_with_meta(
                    h(k.as_bytes()),
                    k.as_bytes(),
                    &v,
                    900,
                    PutCond::Always,
                    0,
                    ItemMeta {
                        cas: u64::from(i),
                        client_flags: i * 3,
                    },
                ),
                _ => p.put_large(
                    h(k.as_bytes()),
                    k.as_bytes(),
                    LargeValue::copy_from(&vec![i as u8; LARGE_VALUE_BYTES_MIN + i as usize]),
                    0,
                    PutCond::Always,
                    0,
                ),
            };
            assert_eq!(r, PutResult::Stored, "{k}");
        }
        let now = 100; // the keys with expiry 50 are gone
        let mut seen = 0;
        let mut from = Some(0);
        while let Some(b) = from {
            let mut budget = ScanBudget {
                entries: 16,
                words: usize::MAX,
            };
            let mut found = Vec::new();
            from = p.scan_items_from(b, now, &mut budget, &mut |item| {
                let large = matches!(item.value, ValueRef::Large(_));
                found.push((
                    item.key.to_vec(),
                    item.value.bytes().to_vec(),
                    item.expire_at_ms,
                    item.meta,
                    large,
                ));
                true
            });
            for (k, v, expire, meta, large) in found {
                let want = p.get_item(h(&k), &k, now).expect("a live key");
                assert_eq!(v, want.value, "{k:?}");
                assert_eq!(expire, want.expire_at_ms);
                assert_eq!(meta, want.meta);
                assert_eq!(large, v.len() >= LARGE_VALUE_BYTES_MIN);
                seen += 1;
            }
        }
        assert_eq!(seen, 150, "every live key once; the expired left out");
    }

    /// Every key, walked with `scan_from` in calls of `count` entries;
    /// returns the keys (with repeats) and the number of calls.
    fn walk(p: &mut crate::Partition, count: usize, now: u64) -> (Vec<Vec<u8>>, usize) {
        let mut keys = Vec::new();
        let mut calls = 0;
        let mut from = Some(0);
        while let Some(b) = from {
            let mut budget = ScanBudget {
                entries: count,
                words: usize::MAX,
            };
            calls += 1;
            from = p.scan_from(b, now, &mut budget, &mut |k, _, _| {
                keys.push(k.to_vec());
                true
            });
        }
        (keys, calls)
    }

    #[test]
    fn scan_from_skips_empty_buckets_and_counts_entries() {
        for mode in both_modes() {
            let mut p = sized(mode, 8 << 20, Some(1 << 14));
            // A few keys in a large index come back in one call.
            for i in 0..3u32 {
                let k = i.to_le_bytes();
                put_ok(&mut p, &k, b"v", 0);
            }
            let (keys, calls) = walk(&mut p, 10, 0);
            assert_eq!((keys.len(), calls), (3, 1));
            // COUNT bounds the entries one call examines: 1000 keys at 10
            // per call take about 100 calls (a call ends at a chain's end,
            // so it may examine a few more).
            for i in 3..1000u32 {
                let k = i.to_le_bytes();
                let exp = if i % 2 == 0 { 5 } else { 0 };
                put_ok(&mut p, &k, b"v", exp);
            }
            let (keys, calls) = walk(&mut p, 10, 0);
            assert_eq!(keys.len(), 1000);
            assert!((80..=101).contains(&calls), "{calls} calls");
            // Expired entries are examined (they count) but not returned.
            let (keys, calls) = walk(&mut p, 10, 5);
            assert_eq!(keys.len(), 3 + 499, "0..3 and the odd keys from 3");
            assert!((80..=101).contains(&calls), "{calls} calls");
            // The word budget bounds the walk over empty buckets: with one
            // word per call, a walk of an empty index takes a call per 64
            // buckets and returns where to go on.
            assert_eq!(p.flush(5), 502);
            let mut budget = ScanBudget {
                entries: 10,
                words: 1,
            };
            let next = p.scan_from(0, 5, &mut budget, &mut |_, _, _| true);
            assert_eq!(next, Some(crate::SUMMARY_BUCKETS_PER_WORD));
            assert!(budget.spent());
            p.check();
        }
    }

    /// A delete leaves its bucket's occupied bit for the next walk to
    /// clear (the delete touches no summary line); that walk pays one
    /// entry of its budget per such bucket, once.
    #[test]
    fn a_walk_clears_the_bits_deletes_left() {
        for mode in both_modes() {
            let mut p = sized(mode, 8 << 20, Some(1 << 14));
            for i in 0..1000u32 {
                let k = i.to_le_bytes();
                put_ok(&mut p, &k, b"v", 0);
            }
            for i in 3..1000u32 {
                let k = i.to_le_bytes();
                assert_eq!(p.delete(h(&k), &k, 0), crate::DeleteResult::Deleted);
            }
            p.check();
            let (keys, calls) = walk(&mut p, 10, 0);
            assert_eq!(keys.len(), 3);
            assert!(calls <= 101, "{calls} calls");
            let (keys, calls) = walk(&mut p, 10, 0);
            assert_eq!((keys.len(), calls), (3, 1), "the bits are cleared");
            p.check();
        }
    }

    #[test]
    fn scan_from_stops_after_the_chain_where_the_visitor_asks() {
        let mut p = small(crate::Mode::Store);
        for i in 0..50u32 {
            let k = i.to_le_bytes();
            put_ok(&mut p, &k, b"v", 0);
        }
        let mut budget = ScanBudget {
            entries: usize::MAX,
            words: usize::MAX,
        };
        let mut seen = 0;
        let next = p.scan_from(0, 0, &mut budget, &mut |_, _, _| {
            seen += 1;
            false
        });
        let b = next.expect("more to come");
        let mut rest = 0;
        assert_eq!(
            p.scan_from(b, 0, &mut budget, &mut |_, _, _| {
                rest += 1;
                true
            }),
            None
        );
        assert_eq!(
            seen + rest,
            50,
            "the stop lost nothing and repeated nothing"
        );
    }

    #[test]
    fn every_change_moves_the_key_version() {
        for mode in both_modes() {
            let mut p = small(mode);
            let k = b"watched";
            let mut last = p.key_version(h(k));
            let mut moved = |p: &crate::Partition, what: &str| {
                let v = p.key_version(h(k));
                assert_ne!(v, last, "{what} moves the version");
                last = v;
            };
            put_ok(&mut p, k, b"1", 0);
            moved(&p, "put");
            assert!(p.set_expiry(h(k), k, 10, 0));
            moved(&p, "expire");
            let _ = p.get(h(k), k, 10);
            moved(&p, "expiry reclaimed");
            assert_eq!(
                p.put(h(k), k, b"2", 0, PutCond::Always, 10),
                PutResult::Stored
            );
            moved(&p, "put again");
            let _ = p.delete(h(k), k, 10);
            moved(&p, "delete");
            let other = b"other";
            let before = p.key_version(h(k));
            let _ = p.get(h(other), other, 10);
            assert_eq!(p.key_version(h(k)), before, "a read changes nothing");
        }
    }

    #[test]
    fn an_eviction_moves_the_key_version() {
        let mut p = small(crate::Mode::Cache);
        let k = b"first";
        put_ok(&mut p, k, b"v", 0);
        let before = p.key_version(h(k));
        // Write until the log comes round over the first item.
        let big = vec![7u8; 4000];
        for i in 0..10_000u32 {
            let key = i.to_le_bytes();
            put_ok(&mut p, &key, &big, 0);
            if p.stats().evictions > 0 && p.get(h(k), k, 0) == crate::GetResult::NotFound {
                break;
            }
        }
        assert_eq!(p.get(h(k), k, 0), crate::GetResult::NotFound, "evicted");
        assert_ne!(p.key_version(h(k)), before);
    }
}
