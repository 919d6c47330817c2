//! Deterministic shard contents for `fabrickv shard gen` and the copy
//! benchmarks: pair `i` of `n` is the same for a given seed on every
//! machine, so two runs can be compared by digest alone.
//!
//! Keys ascend with `i` (so a shard is bulk-loaded without a journal) and
//! are spread over the whole key space: the first 8 bytes are `i` times
//! `2^64 / n` (big-endian), the rest a hash of the seed and `i`. Values are
//! pseudo-random bytes, uncompressible as the XDP-Rocks replicator's
//! benchmark values were (`GenSpec::seed` is the generator's seed).

/// Smallest key `shard gen` makes, in bytes: the 8-byte ascending prefix.
pub const GEN_KEY_BYTES_MIN: usize = 8;

/// A fast 64-bit mixer (splitmix64's finaliser).
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What `shard gen` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenSpec {
    /// Pairs.
    pub pairs: u64,
    /// Bytes of every key (at least [`GEN_KEY_BYTES_MIN`]).
    pub key_bytes: usize,
    /// Bytes of every value.
    pub value_bytes: usize,
    /// Seed of the contents.
    pub seed: u64,
}

impl GenSpec {
    /// The pairs of about `size_bytes` of keys and values.
    pub fn for_size(size_bytes: u64, key_bytes: usize, value_bytes: usize, seed: u64) -> GenSpec {
        let per = (key_bytes + value_bytes).max(1) as u64;
        GenSpec {
            pairs: size_bytes / per,
            key_bytes,
            value_bytes,
            seed,
        }
    }

    /// Writes key `i` into `out` (of `key_bytes`).
    pub fn key(&self, i: u64, out: &mut [u8]) {
        let stride = (u64::MAX / self.pairs.max(1)).max(1);
        out[..8].copy_from_slice(&i.wrapping_mul(stride).to_be_bytes());
        fill(mix(self.seed ^ mix(i)), &mut out[8..]);
    }

    /// Writes value `i` into `out` (of `value_bytes`).
    pub fn value(&self, i: u64, out: &mut [u8]) {
        fill(
            mix(self.seed.rotate_left(17) ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            out,
        );
    }
}

/// Fills `out` with a pseudo-random stream from `state` (xorshift-style
/// steps of splitmix64, eight bytes at a time).
fn fill(mut state: u64, out: &mut [u8]) {
    for c in out.chunks_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let w = mix(state).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}
