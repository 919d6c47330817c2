//! HERD-style keys and checkable values.
//!
//! Key `i` is the 16-byte XXH3-128 hash of `i` (HERD uses 16-byte hashes
//! of integers). Value `i` of length `n` is a byte pattern derived from
//! `i`, so a reader can tell a right value from a stale or foreign one.

use xxhash_rust::xxh3::xxh3_128;

/// The 16-byte key number `i`.
#[inline]
pub fn herd_key(i: u64) -> [u8; 16] {
    xxh3_128(&i.to_le_bytes()).to_le_bytes()
}

/// Writes value number `i` into `out` (its length is the value size).
#[inline]
pub fn fill_value(i: u64, out: &mut [u8]) {
    let seed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
    for (j, b) in out.iter_mut().enumerate() {
        *b = seed[j % 8] ^ (j as u8);
    }
}

/// Whether `v` is value number `i` of length `len`.
#[inline]
pub fn check_value(i: u64, len: usize, v: &[u8]) -> bool {
    if v.len() != len {
        return false;
    }
    let seed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
    v.iter()
        .enumerate()
        .all(|(j, b)| *b == seed[j % 8] ^ (j as u8))
}

/// Key number `i` at length `size`: the HERD key, repeated or cut.
pub fn make_key(i: u64, size: usize, out: &mut Vec<u8>) {
    out.clear();
    let k = herd_key(i);
    while out.len() < size {
        let n = (size - out.len()).min(k.len());
        out.extend_from_slice(&k[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_check_only_against_their_own_key() {
        let mut v = vec![0; 32];
        fill_value(7, &mut v);
        assert!(check_value(7, 32, &v));
        assert!(!check_value(8, 32, &v));
        assert!(!check_value(7, 32, &v[..31]), "a short value is wrong");
        v[5] ^= 1;
        assert!(!check_value(7, 32, &v), "a flipped byte is wrong");
        assert_ne!(herd_key(1), herd_key(2));
    }
}
