//! Walking the keyspace: one main bucket (with its overflow chain) at a
//! time, for SCAN, KEYS, RANDOMKEY and FLUSHDB.
//!
//! The index never resizes and an item never moves to another main
//! bucket (an overflow bucket belongs to one main bucket's chain while it
//! holds items), so a walk that visits every main bucket once sees every
//! key that was present for the whole walk, whatever is inserted or
//! deleted between two visits.

use fabrickv_types::KeyHash;

use crate::index::{offset_of, SlotRef, ITEM_SLOTS_PER_BUCKET};
use crate::item;
use crate::partition::{Core, Hit, Storage};

/// What [`crate::Partition::scan_bucket`] calls for each live item:
/// `(key, value, expire_at_ms)`.
pub type ScanVisit<'f> = dyn FnMut(&[u8], &[u8], u64) + 'f;

impl<S: Storage> Core<S> {
    /// Calls `f(key, value, expire_at_ms)` for every item live at `now_ms`
    /// in the chain of main bucket `main` (nothing if `main` is out of
    /// range). Changes nothing.
    pub(crate) fn scan_bucket(&self, main: usize, now_ms: u64, f: &mut ScanVisit<'_>) {
        if main >= self.index.main_count() {
            return;
        }
        let pool = self.storage.pool();
        let mut bucket = Some(main);
        while let Some(b) = bucket {
            for slot in 0..ITEM_SLOTS_PER_BUCKET {
                let e = self.index.entry(SlotRef { bucket: b, slot });
                if e == 0 {
                    continue;
                }
                let Some(pos) = self.storage.resolve(offset_of(e)) else {
                    continue;
                };
                let header = item::read_header(pool, pos);
                if header.is_expired(now_ms) {
                    continue;
                }
                f(
                    item::key(pool, pos, &header),
                    item::value(pool, pos, &header),
                    header.expire_at_ms,
                );
            }
            bucket = self.index.next(b);
        }
    }

    /// Removes every item; returns how many were live.
    pub(crate) fn flush(&mut self, now_ms: u64) -> usize {
        let mut live = 0;
        for main in 0..self.index.main_count() {
            while let Some(hit) = self.first_in(main) {
                if !hit.header.is_expired(now_ms) {
                    live += 1;
                }
                self.unlink(&hit);
                self.stats.deletes += 1;
            }
        }
        live
    }

    /// The first item in the chain of main bucket `main`.
    fn first_in(&self, main: usize) -> Option<Hit> {
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
                return Some(Hit { at, pos, header });
            }
            bucket = self.index.next(b);
        }
        None
    }

    /// The version counter of the key of `hash` (see `watch`).
    #[inline]
    pub(crate) fn key_version(&self, hash: KeyHash) -> u64 {
        self.versions.get(hash)
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::{both_modes, h, small};
    use crate::{PutCond, PutResult};

    #[test]
    fn scan_visits_every_live_key_once_and_flush_empties() {
        for mode in both_modes() {
            let mut p = small(mode);
            for i in 0..100u32 {
                let k = i.to_le_bytes();
                let exp = if i < 10 { 5 } else { 0 };
                assert_eq!(
                    p.put(h(&k), &k, b"v", exp, PutCond::Always, 0),
                    PutResult::Stored
                );
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
            assert_eq!(
                p.put(h(k), k, b"1", 0, PutCond::Always, 0),
                PutResult::Stored
            );
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
        assert_eq!(
            p.put(h(k), k, b"v", 0, PutCond::Always, 0),
            PutResult::Stored
        );
        let before = p.key_version(h(k));
        // Write until the log comes round over the first item.
        let big = vec![7u8; 4000];
        for i in 0..10_000u32 {
            let key = i.to_le_bytes();
            assert_eq!(
                p.put(h(&key), &key, &big, 0, PutCond::Always, 0),
                PutResult::Stored
            );
            if p.stats().evictions > 0 && p.get(h(k), k, 0) == crate::GetResult::NotFound {
                break;
            }
        }
        assert_eq!(p.get(h(k), k, 0), crate::GetResult::NotFound, "evicted");
        assert_ne!(p.key_version(h(k)), before);
    }
}
