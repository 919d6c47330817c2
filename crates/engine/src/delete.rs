//! DELETE: remove a key.

use fabrickv_types::KeyHash;

use crate::partition::{Core, Storage};

/// Outcome of a DELETE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum DeleteResult {
    /// A live item was removed.
    Deleted,
    /// The key was absent or expired (an expired item is reclaimed).
    NotFound,
}

impl<S: Storage> Core<S> {
    /// Removes `key`. In store mode its chunk is free for reuse at once; in
    /// cache mode its log bytes stay, dead, until the log comes round.
    pub(crate) fn delete(&mut self, hash: KeyHash, key: &[u8], now_ms: u64) -> DeleteResult {
        match self.find_live(hash, key, now_ms) {
            Some(hit) => {
                self.unlink(&hit);
                self.stats.deletes += 1;
                DeleteResult::Deleted
            }
            None => DeleteResult::NotFound,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::{assert_found, both_modes, h, put_ok, small};
    use crate::{DeleteResult, GetResult, Mode, PutCond, PutResult};

    #[test]
    fn delete_removes_only_its_key() {
        for mode in both_modes() {
            let mut p = small(mode);
            assert_eq!(p.delete(h(b"a"), b"a", 0), DeleteResult::NotFound);
            put_ok(&mut p, b"a", b"1", 0);
            put_ok(&mut p, b"b", b"22", 0);
            assert_eq!(p.delete(h(b"a"), b"a", 0), DeleteResult::Deleted);
            assert_eq!(p.delete(h(b"a"), b"a", 0), DeleteResult::NotFound);
            assert_eq!(p.get(h(b"a"), b"a", 0), GetResult::NotFound);
            assert_found(&mut p, b"b", 0, b"22", 0);
            let s = p.stats();
            assert_eq!((s.deletes, s.items, s.bytes), (1, 1, 3));
            p.check();
        }
    }

    #[test]
    fn delete_of_expired_item_is_not_found_but_reclaims() {
        for mode in both_modes() {
            let mut p = small(mode);
            put_ok(&mut p, b"a", b"1", 10);
            assert_eq!(p.delete(h(b"a"), b"a", 10), DeleteResult::NotFound);
            let s = p.stats();
            assert_eq!((s.deletes, s.expired, s.items, s.bytes), (0, 1, 0, 0));
        }
    }

    #[test]
    fn store_mode_delete_frees_overflow_buckets() {
        let mut p = small(Mode::Store);
        let same = h(b"k");
        let keys: Vec<Vec<u8>> = (0..40u32).map(|i| i.to_le_bytes().to_vec()).collect();
        let mut stored = 0;
        for k in &keys {
            match p.put(same, k, b"v", 0, PutCond::Always, 0) {
                PutResult::Stored => stored += 1,
                PutResult::InsufficientSpace => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(
            stored > crate::index::ITEM_SLOTS_PER_BUCKET,
            "chained into overflow"
        );
        let free_before = p.free_overflow_buckets();
        for k in &keys[..stored] {
            assert_eq!(p.delete(same, k, 0), DeleteResult::Deleted);
        }
        assert!(p.free_overflow_buckets() > free_before);
        // All overflow buckets are back: the same chain can be rebuilt.
        for k in &keys[..stored] {
            assert_eq!(
                p.put(same, k, b"v", 0, PutCond::Always, 0),
                PutResult::Stored
            );
        }
        p.check();
    }
}
