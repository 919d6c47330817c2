//! An order-independent digest of a set of pairs: what `shard checksum`
//! prints and what a copy is verified against. Each pair hashes to 128
//! bits (XXH3 over the key's length, the key and the value, so no two
//! different pairs hash alike by shifting bytes between key and value) and
//! the hashes are summed modulo 2^128: the sum does not depend on the
//! order the pairs are met in (ranges copied in parallel arrive in any
//! order), and unlike a xor a pair counted twice does not cancel out.

use xxhash_rust::xxh3::{xxh3_128, Xxh3};

/// Pairs of up to this many bytes (with the 8-byte key length) are hashed
/// from a copy on the stack in one call; longer ones stream.
const PAIR_HASH_STACK_BYTES: usize = 1024;

/// The hash of one pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairDigest(pub u128);

impl PairDigest {
    /// The hash of the pair (`key`, `value`).
    pub fn of(key: &[u8], value: &[u8]) -> PairDigest {
        let len = (key.len() as u64).to_le_bytes();
        let total = len.len() + key.len() + value.len();
        if total <= PAIR_HASH_STACK_BYTES {
            // XXH3 of the bytes laid end to end is the streaming hash's
            // value; one call over a copy is about twice as fast for pairs
            // of a few hundred bytes as three streaming updates.
            let mut buf = [0u8; PAIR_HASH_STACK_BYTES];
            buf[..8].copy_from_slice(&len);
            buf[8..8 + key.len()].copy_from_slice(key);
            buf[8 + key.len()..total].copy_from_slice(value);
            return PairDigest(xxh3_128(&buf[..total]));
        }
        let mut h = Xxh3::new();
        h.update(&len);
        h.update(key);
        h.update(value);
        PairDigest(h.digest128())
    }
}

/// The digest of a set of pairs: their count, their bytes (keys and
/// values) and the sum of their hashes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digest {
    /// Pairs added.
    pub pairs: u64,
    /// Key and value bytes added.
    pub bytes: u64,
    /// Sum of the pairs' hashes, modulo 2^128.
    pub sum: u128,
}

impl Digest {
    /// Adds one pair.
    pub fn add(&mut self, key: &[u8], value: &[u8]) {
        self.add_hashed(PairDigest::of(key, value), (key.len() + value.len()) as u64);
    }

    /// Adds a pair already hashed, of `bytes` bytes.
    pub fn add_hashed(&mut self, h: PairDigest, bytes: u64) {
        self.pairs += 1;
        self.bytes += bytes;
        self.sum = self.sum.wrapping_add(h.0);
    }

    /// Adds another digest (of a disjoint set of pairs).
    pub fn merge(&mut self, other: &Digest) {
        self.pairs += other.pairs;
        self.bytes += other.bytes;
        self.sum = self.sum.wrapping_add(other.sum);
    }

    /// The sum as 32 hex digits.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.sum)
    }
}
