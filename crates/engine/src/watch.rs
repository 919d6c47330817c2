//! Modification versions for optimistic transactions (Redis's WATCH).
//!
//! Every partition keeps a small table of counters indexed by bits of the
//! key hash; every change to a key (a stored value, a delete, a new
//! expiry, an expired or evicted item leaving the index) bumps the
//! counter of its slot. A client that read a key's counter earlier and
//! finds it unchanged, under the partition's lock, knows the key was not
//! touched since. Keys whose hashes share a slot share a counter: a write
//! to one looks like a write to the others, a false conflict (a
//! transaction that need not have aborted aborts), never a missed one.
//! With [`WATCH_VERSION_SLOTS`] slots per partition, two given keys of one
//! partition collide with probability 1 / 4096.

use fabrickv_types::KeyHash;

/// Counters in each partition's version table (a power of two), 8 bytes
/// each: 32 KiB per partition.
pub const WATCH_VERSION_SLOTS: usize = 4096;

const _: () = assert!(WATCH_VERSION_SLOTS.is_power_of_two());

/// The version table of one partition.
pub(crate) struct Versions {
    slots: Box<[u64]>,
}

impl Versions {
    /// A table of zero counters.
    pub(crate) fn new() -> Versions {
        Versions {
            slots: vec![0; WATCH_VERSION_SLOTS].into_boxed_slice(),
        }
    }

    /// The slot of a hash: the bucket bits mixed with the tag, so keys of
    /// one index bucket still spread.
    #[inline]
    fn slot(hash: KeyHash) -> usize {
        ((hash.0 ^ (hash.0 >> 16)) as usize) & (WATCH_VERSION_SLOTS - 1)
    }

    /// Records a change to the key of `hash`.
    #[inline]
    pub(crate) fn bump(&mut self, hash: KeyHash) {
        let s = &mut self.slots[Self::slot(hash)];
        *s = s.wrapping_add(1);
    }

    /// The current counter of the key of `hash`.
    #[inline]
    pub(crate) fn get(&self, hash: KeyHash) -> u64 {
        self.slots[Self::slot(hash)]
    }
}
