//! GET: look a key up and return its value in place.

use fabrickv_types::KeyHash;

use crate::item;
use crate::large::{self, ValueRef};
use crate::partition::{Core, Storage};

/// Outcome of a GET.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum GetResult<'a> {
    /// The key is stored and live.
    Found {
        /// The value, borrowed from the pool (zero-copy): valid until the
        /// partition is next used.
        value: &'a [u8],
        /// Absolute expiry time in milliseconds; 0 means no TTL.
        expire_at_ms: u64,
    },
    /// The key is absent, evicted or expired.
    NotFound,
}

/// Outcome of a GET that tells inline values from large ones
/// ([`crate::Partition::get_ref`]), so that a caller can keep a large
/// value by reference instead of copying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum GetRefResult<'a> {
    /// The key is stored and live.
    Found {
        /// The value: borrowed from the pool, or a large value.
        value: ValueRef<'a>,
        /// Absolute expiry time in milliseconds; 0 means no TTL.
        expire_at_ms: u64,
    },
    /// The key is absent, evicted or expired.
    NotFound,
}

/// A live item as [`crate::Partition::get_item`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemView<'a> {
    /// The value, borrowed from the pool.
    pub value: &'a [u8],
    /// Absolute expiry time in milliseconds; 0 means no TTL.
    pub expire_at_ms: u64,
    /// The CAS value and client flags, if the item was stored with them.
    pub meta: Option<item::ItemMeta>,
}

impl<S: Storage> Core<S> {
    /// [`Core::get`] with the item's meta.
    pub(crate) fn get_item(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        now_ms: u64,
    ) -> Option<ItemView<'_>> {
        self.stats.gets += 1;
        match self.find_live(hash, key, now_ms) {
            Some(hit) => {
                self.stats.hits += 1;
                let pool = self.storage.pool();
                Some(ItemView {
                    // A large value's bytes, not its stub's.
                    value: self.value_of(hit.pos, &hit.header).bytes(),
                    expire_at_ms: hit.header.expire_at_ms,
                    meta: item::meta(pool, hit.pos, &hit.header),
                })
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Looks `key` up; an expired item met on the way is reclaimed.
    pub(crate) fn get(&mut self, hash: KeyHash, key: &[u8], now_ms: u64) -> GetResult<'_> {
        match self.get_ref(hash, key, now_ms) {
            GetRefResult::Found {
                value,
                expire_at_ms,
            } => GetResult::Found {
                value: value.bytes(),
                expire_at_ms,
            },
            GetRefResult::NotFound => GetResult::NotFound,
        }
    }

    /// [`Core::get`], telling a large value from an inline one.
    pub(crate) fn get_ref(&mut self, hash: KeyHash, key: &[u8], now_ms: u64) -> GetRefResult<'_> {
        self.stats.gets += 1;
        match self.find_live(hash, key, now_ms) {
            Some(hit) => {
                self.stats.hits += 1;
                GetRefResult::Found {
                    value: self.value_of(hit.pos, &hit.header),
                    expire_at_ms: hit.header.expire_at_ms,
                }
            }
            None => {
                self.stats.misses += 1;
                GetRefResult::NotFound
            }
        }
    }
}

impl<S: Storage> Core<S> {
    /// Looks `key` up without changing anything: an expired item is
    /// reported absent but left for the sweep, and no counter moves. Takes
    /// `&self`, so several readers may share the partition.
    #[inline]
    pub(crate) fn peek_item(
        &self,
        hash: KeyHash,
        key: &[u8],
        now_ms: u64,
    ) -> Option<crate::scan::ScanItem<'_>> {
        let hit = self.find(hash, key)?;
        if hit.header.is_expired(now_ms) {
            return None;
        }
        Some(self.item_at(hit.pos, &hit.header))
    }

    /// Looks `key` up without changing anything (see [`Core::peek_item`]).
    #[inline]
    pub(crate) fn peek(&self, hash: KeyHash, key: &[u8], now_ms: u64) -> Option<&[u8]> {
        let hit = self.find(hash, key)?;
        if hit.header.is_expired(now_ms) {
            return None;
        }
        Some(self.value_of(hit.pos, &hit.header).bytes())
    }

    /// The live value of `key`, writable in place (an embedding update
    /// changes the bytes of a value but never its length).
    #[inline]
    pub(crate) fn value_mut(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        now_ms: u64,
    ) -> Option<&mut [u8]> {
        let hit = self.find_live(hash, key, now_ms)?;
        // The caller writes through the slice: a change for WATCH.
        self.versions.bump(hash);
        if hit.header.is_large() {
            // Writable only while no reader holds a clone of it.
            let slot = large::slot_of(item::value(self.storage.pool(), hit.pos, &hit.header));
            return self.large.get_mut(slot)?.get_mut();
        }
        let at = hit.pos + item::ITEM_HEADER_BYTES + usize::from(hit.header.key_len);
        self.storage
            .pool_mut()
            .get_mut(at..at + hit.header.value_len as usize)
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::{assert_found, both_modes, h, put_ok, small};
    use crate::{GetResult, PutCond, PutResult};

    #[test]
    fn get_returns_what_put_stored() {
        for mode in both_modes() {
            let mut p = small(mode);
            assert_eq!(p.get(h(b"a"), b"a", 0), GetResult::NotFound);
            put_ok(&mut p, b"a", b"one", 0);
            put_ok(&mut p, b"b", b"", 42);
            assert_found(&mut p, b"a", 1, b"one", 0);
            assert_found(&mut p, b"b", 1, b"", 42);
            let s = p.stats();
            assert_eq!((s.gets, s.hits, s.misses), (3, 2, 1));
        }
    }

    #[test]
    fn get_compares_the_whole_key_not_just_the_hash() {
        for mode in both_modes() {
            let mut p = small(mode);
            // Same hash (so same bucket and tag), different keys.
            let same = h(b"x");
            assert_eq!(
                p.put(same, b"x", b"1", 0, PutCond::Always, 0),
                PutResult::Stored
            );
            assert_eq!(
                p.put(same, b"y", b"2", 0, PutCond::Always, 0),
                PutResult::Stored
            );
            assert_eq!(
                p.get(same, b"x", 0),
                GetResult::Found {
                    value: b"1",
                    expire_at_ms: 0
                }
            );
            assert_eq!(
                p.get(same, b"y", 0),
                GetResult::Found {
                    value: b"2",
                    expire_at_ms: 0
                }
            );
            assert_eq!(p.get(same, b"z", 0), GetResult::NotFound);
        }
    }

    #[test]
    fn peek_reads_without_side_effects_and_value_mut_writes_in_place() {
        for mode in both_modes() {
            let mut p = small(mode);
            put_ok(&mut p, b"k", b"abcd", 0);
            put_ok(&mut p, b"t", b"v", 10);
            let before = p.stats();
            assert_eq!(p.peek(h(b"k"), b"k", 1), Some(&b"abcd"[..]));
            assert_eq!(p.peek(h(b"t"), b"t", 10), None, "expired is absent");
            assert_eq!(p.peek(h(b"z"), b"z", 1), None);
            assert_eq!(p.stats(), before, "peek changes no counter");
            p.value_mut(h(b"k"), b"k", 1)
                .expect("live")
                .copy_from_slice(b"wxyz");
            assert_eq!(p.peek(h(b"k"), b"k", 1), Some(&b"wxyz"[..]));
            assert!(p.value_mut(h(b"t"), b"t", 10).is_none());
            p.check();
        }
    }

    #[test]
    fn expired_items_are_never_returned_and_are_reclaimed() {
        for mode in both_modes() {
            let mut p = small(mode);
            put_ok(&mut p, b"t", b"v", 100);
            assert!(matches!(p.get(h(b"t"), b"t", 99), GetResult::Found { .. }));
            assert_eq!(p.stats().items, 1);
            assert_eq!(p.get(h(b"t"), b"t", 100), GetResult::NotFound);
            let s = p.stats();
            assert_eq!((s.items, s.bytes, s.expired, s.misses), (0, 0, 1, 1));
            assert_eq!(
                p.get(h(b"t"), b"t", 50),
                GetResult::NotFound,
                "reclaimed, not hidden"
            );
        }
    }
}
