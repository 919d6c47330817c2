//! The background TTL sweep (the engine's active expiry).
//!
//! Expired items are reclaimed when an operation meets them, but keys that
//! are never touched again would hold their space forever, and DBSIZE (the
//! partitions' item counts) would go on counting them. The owning worker
//! calls `sweep` every `SWEEP_INTERVAL_MS` with a small work budget; a
//! cursor remembers where the last call stopped. The sweep visits only the
//! chains the index's volatile summary marks (those that may hold an item
//! with an expiry time), and skips 64 unmarked main buckets per word
//! tested, so a partition with few keys with a TTL is covered in one call
//! however large its index or however many keys without a TTL it holds,
//! as Redis's active expire cycle samples only keys with a TTL.

use crate::index::{offset_of, Marked, Summary};
use crate::item;
use crate::partition::{Core, Hit, Storage};

impl<S: Storage> Core<S> {
    /// Reclaims the expired items of the next chains marked volatile,
    /// spending at most `budget` units of work (one per summary word
    /// tested, one per chain visited) and covering each main bucket at
    /// most once per call; the cursor wraps. Returns how many items it
    /// reclaimed.
    pub(crate) fn sweep(&mut self, now_ms: u64, budget: usize) -> usize {
        let main_count = self.index.main_count();
        let start = self.sweep_cursor % main_count;
        let mut budget = budget;
        let mut reclaimed = 0;
        // The walk covers [start, main_count), then [0, start).
        let mut b = start;
        let mut end = main_count;
        let mut wrapped = start == 0;
        loop {
            let next = if b >= end {
                Marked::End
            } else {
                self.index.next_marked(Summary::Volatile, b, &mut budget)
            };
            match next {
                Marked::At(main) if main < end => {
                    if budget == 0 {
                        b = main;
                        break;
                    }
                    budget -= 1;
                    reclaimed += self.sweep_chain(main, now_ms);
                    b = main + 1;
                }
                Marked::Later(at) if at < end => {
                    b = at;
                    break;
                }
                _ if wrapped => {
                    b = end;
                    break;
                }
                _ => {
                    wrapped = true;
                    end = start;
                    b = 0;
                }
            }
        }
        self.sweep_cursor = b % main_count;
        reclaimed
    }

    /// Reclaims the expired items of the chain of `main`; unmarks it as
    /// volatile when no item with an expiry time is left there. Returns
    /// how many it reclaimed.
    fn sweep_chain(&mut self, main: usize, now_ms: u64) -> usize {
        let mut reclaimed = 0;
        // Unlinking may return an overflow bucket to the pool, so the
        // chain is searched afresh after each removal; chains are short.
        loop {
            match self.first_expired_in(main, now_ms) {
                Expiring::Expired(hit) => {
                    self.unlink(&hit);
                    self.stats.expired += 1;
                    reclaimed += 1;
                }
                Expiring::Later => return reclaimed,
                Expiring::Never => {
                    self.index.unmark_volatile(main);
                    return reclaimed;
                }
            }
        }
    }

    /// The first expired item in the chain of main bucket `main`, or
    /// whether any item there has an expiry time.
    fn first_expired_in(&self, main: usize, now_ms: u64) -> Expiring {
        let pool = self.storage.pool();
        let mut volatile = false;
        for (at, e) in self.index.chain(main) {
            let Some(pos) = self.storage.resolve(offset_of(e)) else {
                continue;
            };
            let header = item::read_header(pool, pos);
            if header.is_expired(now_ms) {
                return Expiring::Expired(Hit { at, pos, header });
            }
            volatile |= header.expire_at_ms != 0;
        }
        if volatile {
            Expiring::Later
        } else {
            Expiring::Never
        }
    }
}

/// What the sweep found in a chain.
enum Expiring {
    /// This item has expired.
    Expired(Hit),
    /// Nothing has expired, but an item has an expiry time.
    Later,
    /// No item has an expiry time.
    Never,
}

#[cfg(test)]
mod tests {
    use crate::testutil::{both_modes, h, put_ok, sized, small};
    use crate::{GetResult, Mode, PutCond, PutResult};

    #[test]
    fn sweep_reclaims_expired_items_only() {
        for mode in both_modes() {
            let mut p = small(mode);
            for i in 0..100u32 {
                let k = i.to_le_bytes();
                let exp = if i % 2 == 0 { 50 } else { 0 };
                put_ok(&mut p, &k, b"value", exp);
            }
            assert_eq!(p.sweep(49, usize::MAX), 0, "nothing expired yet");
            assert_eq!(p.stats().items, 100);
            assert_eq!(p.sweep(50, usize::MAX), 50);
            let s = p.stats();
            assert_eq!((s.items, s.bytes, s.expired), (50, 50 * 9, 50));
            for i in 0..100u32 {
                let k = i.to_le_bytes();
                let found = matches!(p.get(h(&k), &k, 60), GetResult::Found { .. });
                assert_eq!(found, i % 2 == 1);
            }
            p.check();
        }
    }

    #[test]
    fn sweep_is_incremental_and_wraps() {
        for mode in both_modes() {
            let mut p = small(mode);
            for i in 0..200u32 {
                let k = i.to_le_bytes();
                put_ok(&mut p, &k, b"v", 10);
            }
            // Each chain visited costs one unit, so a budget of 40 reclaims
            // at most 40 chains' items per call; the calls resume where the
            // last one stopped and together cover every chain.
            let mut total = 0;
            let mut calls = 0;
            while total < 200 {
                let n = p.sweep(10, 40);
                assert!(n > 0, "each call makes progress");
                total += n;
                calls += 1;
                assert!(calls <= 200, "the sweep covers the index");
            }
            assert!(calls > 1, "one call sees only part of the index");
            assert_eq!(total, 200);
            assert_eq!(p.sweep(10, usize::MAX), 0);
            assert_eq!(p.sweep(10, 0), 0);
            p.check();
        }
    }

    /// DBSIZE counts items, so an expired key must leave the count soon
    /// even when nothing touches it: one sweep call of a small budget
    /// reclaims the few keys with a TTL of a large index, however many
    /// keys without one it holds (the clock is an argument: no sleeps).
    #[test]
    fn one_small_sweep_reclaims_the_few_ttl_keys_of_a_large_index() {
        for mode in both_modes() {
            let mut p = sized(mode, 8 << 20, Some(1 << 16));
            for i in 0..3000u32 {
                let k = i.to_le_bytes();
                let exp = if i % 1000 == 7 { 500 } else { 0 };
                put_ok(&mut p, &k, b"v", exp);
            }
            assert_eq!(p.sweep(499, 2048), 0, "nothing expired yet");
            assert_eq!(p.stats().items, 3000);
            // 1024 summary words cover the 65,536 buckets; the rest of the
            // budget visits the three chains.
            assert_eq!(p.sweep(500, 2048), 3);
            assert_eq!(p.stats().items, 2997);
            // The chains hold no TTL'd item now: the next sweep visits none.
            assert_eq!(p.sweep(600, 1024), 0);
            p.check();
        }
    }

    #[test]
    fn expire_and_persist_keep_the_volatile_summary_true() {
        for mode in both_modes() {
            let mut p = sized(mode, 1 << 20, Some(1 << 12));
            let k = b"k";
            put_ok(&mut p, k, b"v", 0);
            assert!(p.set_expiry(h(k), k, 50, 0));
            p.check();
            assert!(p.set_expiry(h(k), k, 0, 1), "persist");
            assert_eq!(p.sweep(100, usize::MAX), 0, "a persisted key stays");
            assert!(p.set_expiry(h(k), k, 150, 100));
            assert_eq!(p.sweep(150, usize::MAX), 1, "the sweep saw the new TTL");
            assert_eq!(p.stats().items, 0);
            p.check();
        }
    }

    #[test]
    fn store_space_is_reusable_after_sweep() {
        let mut p = small(Mode::Store);
        let value = vec![7u8; 1000];
        let mut n = 0u32;
        loop {
            let k = n.to_le_bytes();
            match p.put(h(&k), &k, &value, 100, PutCond::Always, 0) {
                PutResult::Stored => n += 1,
                PutResult::InsufficientSpace => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(n > 10);
        let k = u32::MAX.to_le_bytes();
        assert_eq!(
            p.put(h(&k), &k, &value, 0, PutCond::Always, 0),
            PutResult::InsufficientSpace
        );
        assert_eq!(p.sweep(100, usize::MAX), n as usize);
        assert_eq!((p.stats().items, p.stats().bytes), (0, 0));
        for i in 0..n {
            let k = (i + 1_000_000).to_le_bytes();
            assert_eq!(
                p.put(h(&k), &k, &value, 0, PutCond::Always, 100),
                PutResult::Stored
            );
        }
        p.check();
    }
}
