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
