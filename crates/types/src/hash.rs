//! The key hash, and how its bits are split between partition, bucket and tag.
//!
//! One 64-bit hash per key, computed once by the client and once by the
//! server, feeds three independent decisions:
//! - bits 32..64 choose the partition (and so the owning worker), by
//!   multiply-shift so any partition count works without a modulo;
//! - bits 16..48 choose the bucket inside the partition's index;
//! - bits 0..16 are the tag stored in the index slot, so that most slot
//!   mismatches are rejected without touching the item.

use xxhash_rust::xxh3::xxh3_64;

/// The hash of a key. Clients and servers must agree on it bit for bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash(pub u64);

impl KeyHash {
    /// Hashes a key (XXH3, 64 bits).
    #[inline]
    pub fn of(key: &[u8]) -> KeyHash {
        KeyHash(xxh3_64(key))
    }

    /// The partition in `0..partitions` that owns this key.
    #[inline]
    pub fn partition(self, partitions: u32) -> u32 {
        (((self.0 >> 32) * u64::from(partitions)) >> 32) as u32
    }

    /// The bucket index bits; the engine masks them to its bucket count.
    #[inline]
    pub fn bucket_bits(self) -> u64 {
        self.0 >> 16
    }

    /// The 16-bit tag kept in an index slot; never zero, so that zero can
    /// mark an empty slot.
    #[inline]
    pub fn tag(self) -> u16 {
        let t = self.0 as u16;
        if t == 0 {
            1
        } else {
            t
        }
    }
}

/// The worker that owns a partition: partitions are dealt to workers round
/// robin, so that with as many partitions as workers each owns exactly one.
#[inline]
pub fn worker_of_partition(partition: u32, workers: u32) -> u32 {
    partition % workers.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_is_in_range_and_spreads() {
        for parts in [1u32, 2, 3, 7, 16, 255] {
            let mut counts = vec![0u32; parts as usize];
            for i in 0..20_000u64 {
                let p = KeyHash::of(&i.to_le_bytes()).partition(parts);
                assert!(p < parts);
                counts[p as usize] += 1;
            }
            let expect = 20_000 / parts;
            for c in counts {
                assert!(
                    c > expect / 2 && c < expect * 2,
                    "skewed partitioning: {c} vs {expect}"
                );
            }
        }
    }

    #[test]
    fn tag_is_never_zero() {
        assert_eq!(KeyHash(0).tag(), 1);
        assert_eq!(KeyHash(0x1_0000).tag(), 1);
        assert_eq!(KeyHash(7).tag(), 7);
    }

    #[test]
    fn hash_is_stable_across_builds() {
        // Clients in other languages must reproduce this value exactly.
        assert_eq!(KeyHash::of(b"").0, 0x2d06800538d394c2);
    }
}
