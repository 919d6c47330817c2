//! The background TTL sweep.
//!
//! Expired items are reclaimed when an operation meets them, but keys that
//! are never touched again would hold their space forever. The owning
//! worker calls `sweep` when idle (or every few batches) with a small
//! bucket budget; a cursor remembers where the last call stopped, so the
//! whole index is covered in `main buckets / budget` calls and no call
//! takes long.

use crate::index::{offset_of, SlotRef, ITEM_SLOTS_PER_BUCKET};
use crate::item;
use crate::partition::{Core, Hit, Storage};

impl<S: Storage> Core<S> {
    /// Visits the next `max_buckets` main buckets (at most all of them)
    /// with their overflow chains, reclaiming expired items. Returns how
    /// many it reclaimed.
    pub(crate) fn sweep(&mut self, now_ms: u64, max_buckets: usize) -> usize {
        let main_count = self.index.main_count();
        let mut reclaimed = 0;
        for _ in 0..max_buckets.min(main_count) {
            let main = self.sweep_cursor;
            self.sweep_cursor = (main + 1) % main_count;
            // Unlinking may return an overflow bucket to the pool, so the
            // chain is searched afresh after each removal; chains are short.
            while let Some(hit) = self.first_expired_in(main, now_ms) {
                self.unlink(&hit);
                self.stats.expired += 1;
                reclaimed += 1;
            }
        }
        reclaimed
    }

    /// The first expired item in the chain of main bucket `main`.
    fn first_expired_in(&self, main: usize, now_ms: u64) -> Option<Hit> {
        let pool = self.storage.pool();
        let mut bucket = Some(main);
        while let Some(b) = bucket {
            for slot in 0..ITEM_SLOTS_PER_BUCKET {
                let at = SlotRef { bucket: b, slot };
                let e = self.index.entry(at);
                if e == 0 {
                    continue;
                }
                let Some(pos) = self.storage.resolve(offset_of(e)) else {
                    continue;
                };
                let header = item::read_header(pool, pos);
                if header.is_expired(now_ms) {
                    return Some(Hit { at, pos, header });
                }
            }
            bucket = self.index.next(b);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::{both_modes, h, small};
    use crate::{GetResult, Mode, PutCond, PutResult};

    #[test]
    fn sweep_reclaims_expired_items_only() {
        for mode in both_modes() {
            let mut p = small(mode);
            for i in 0..100u32 {
                let k = i.to_le_bytes();
                let exp = if i % 2 == 0 { 50 } else { 0 };
                assert_eq!(
                    p.put(h(&k), &k, b"value", exp, PutCond::Always, 0),
                    PutResult::Stored
                );
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
            let buckets = p.index_buckets();
            for i in 0..200u32 {
                let k = i.to_le_bytes();
                assert_eq!(
                    p.put(h(&k), &k, b"v", 10, PutCond::Always, 0),
                    PutResult::Stored
                );
            }
            let mut total = 0;
            let step = buckets / 4;
            for _ in 0..4 {
                let n = p.sweep(10, step);
                assert!(n < 200, "one step sees only part of the index");
                total += n;
            }
            assert_eq!(total, 200, "four quarter-steps cover every bucket");
            assert_eq!(p.sweep(10, buckets), 0);
            assert_eq!(p.sweep(10, 0), 0);
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
