//! EXPIRE / PERSIST: change the expiry time of a stored key.

use fabrickv_types::KeyHash;

use crate::item;
use crate::partition::{Core, Storage};

impl<S: Storage> Core<S> {
    /// Sets the absolute expiry time of `key` (0 removes it). Returns
    /// false if the key is absent or already expired (and then reclaims it).
    pub(crate) fn set_expiry(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        expire_at_ms: u64,
        now_ms: u64,
    ) -> bool {
        match self.find_live(hash, key, now_ms) {
            Some(hit) => {
                self.versions.bump(hash);
                self.note_expiry(hash, expire_at_ms);
                item::set_expire(self.storage.pool_mut(), hit.pos, expire_at_ms);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::{assert_found, both_modes, h, put_ok, small};
    use crate::GetResult;

    #[test]
    fn expire_and_persist() {
        for mode in both_modes() {
            let mut p = small(mode);
            assert!(!p.set_expiry(h(b"a"), b"a", 10, 0), "absent key");
            put_ok(&mut p, b"a", b"v", 0);
            assert!(p.set_expiry(h(b"a"), b"a", 10, 0));
            assert_found(&mut p, b"a", 5, b"v", 10);
            // PERSIST before the deadline keeps the item forever.
            assert!(p.set_expiry(h(b"a"), b"a", 0, 5));
            assert_found(&mut p, b"a", 1000, b"v", 0);
            // An expiry time in the past makes it expire now.
            assert!(p.set_expiry(h(b"a"), b"a", 1000, 1000));
            assert_eq!(p.get(h(b"a"), b"a", 1000), GetResult::NotFound);
            assert!(!p.set_expiry(h(b"a"), b"a", 0, 1000));
            assert_eq!(p.stats().expired, 1);
        }
    }

    #[test]
    fn expired_key_cannot_be_revived() {
        for mode in both_modes() {
            let mut p = small(mode);
            put_ok(&mut p, b"a", b"v", 10);
            assert!(!p.set_expiry(h(b"a"), b"a", 0, 10));
            assert_eq!(p.get(h(b"a"), b"a", 10), GetResult::NotFound);
            let s = p.stats();
            assert_eq!((s.items, s.bytes, s.expired), (0, 0, 1));
        }
    }
}
