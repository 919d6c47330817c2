//! The benchmark's keys and values: key `i` is named `key-0000000i` and
//! its value is a function of `i` and of the byte position, so every read
//! is checked whole where it landed.

/// Multiplier that spreads a word's position over all its bytes, so every
/// byte of a value depends on where it sits (the 64-bit golden ratio).
const POSITION_MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// Mixed into a key index before hashing, so that the values differ from
/// other benchmarks' patterns of the same indices.
const SEED_SALT: u64 = 0xCAC8_E5EE_D000_0000;

/// The name of key `index`, as kv-bench names them.
pub fn key_name(index: u64) -> String {
    format!("key-{index:08}")
}

/// The names of keys `0..n`, as bytes.
pub fn key_names(n: u64) -> Vec<Vec<u8>> {
    (0..n).map(|i| key_name(i).into_bytes()).collect()
}

/// The 64-bit seed of key `index`'s value.
#[inline]
fn value_seed(index: u64) -> u64 {
    fabrickv_wire::ps::splitmix64(index ^ SEED_SALT)
}

/// The little-endian word at word position `word` of a value with `seed`.
#[inline]
fn value_word(seed: u64, word: usize) -> u64 {
    seed ^ (word as u64).wrapping_mul(POSITION_MIX)
}

/// Fills `out` with key `index`'s value: word `j` (bytes `8j..8j+8`,
/// little-endian) is the key's seed xor `j` times a mixing constant; a
/// last partial word is cut short. Written eight bytes at a time, so
/// making a value costs about as much as copying it.
pub fn fill_value(index: u64, out: &mut [u8]) {
    let seed = value_seed(index);
    for (j, c) in out.chunks_mut(8).enumerate() {
        let w = value_word(seed, j).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// The byte at `pos` of key `index`'s value.
fn expected_byte(index: u64, pos: usize) -> u8 {
    value_word(value_seed(index), pos / 8).to_le_bytes()[pos % 8]
}

/// Checks that `bytes` is key `index`'s value of `len` bytes; the error
/// names the key, the first wrong byte, what it held and what was due.
///
/// The differences of all words are ORed with no early exit, so that the
/// loop vectorizes: the check must cost far less than the read it checks.
/// Only a failed check walks the bytes again to say where.
pub fn check_value(index: u64, bytes: &[u8], len: usize) -> Result<(), String> {
    if bytes.len() != len {
        return Err(format!(
            "{}: read {} bytes, expected {len}",
            key_name(index),
            bytes.len()
        ));
    }
    let seed = value_seed(index);
    let words = bytes.chunks_exact(8);
    let tail = words.remainder();
    // Word j is due to hold `value_word(seed, j)`, `seed ^ j * POSITION_MIX`:
    // the product is kept as a running sum (the same value, mod 2^64), so
    // the loop is loads, xors, ors and adds, which vectorize on any x86-64
    // (a 64-bit multiply per word does not, without AVX-512).
    let mut diff = 0u64;
    let mut mix = 0u64;
    for c in words {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        diff |= w ^ seed ^ mix;
        mix = mix.wrapping_add(POSITION_MIX);
    }
    let tail_at = len - tail.len();
    for (k, b) in tail.iter().enumerate() {
        diff |= u64::from(b ^ expected_byte(index, tail_at + k));
    }
    if diff == 0 {
        return Ok(());
    }
    let (pos, got) = bytes
        .iter()
        .enumerate()
        .find(|(p, b)| **b != expected_byte(index, *p))
        .map_or((0, 0), |(p, b)| (p, *b));
    Err(format!(
        "{}: byte {pos} of {len} is {got:#04x}, expected {:#04x}",
        key_name(index),
        expected_byte(index, pos)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_check_catches_one_flipped_byte() {
        for len in [1, 7, 8, 9, 4096, 65_536 + 3] {
            let mut v = vec![0u8; len];
            fill_value(12, &mut v);
            assert_eq!(check_value(12, &v, len), Ok(()), "len {len}");
            assert!(check_value(13, &v, len).is_err(), "another key's value");
            assert!(check_value(12, &v, len + 1).is_err(), "a short value");
            for pos in [0, len / 2, len - 1] {
                let mut bad = v.clone();
                bad[pos] ^= 0x10;
                let e = check_value(12, &bad, len).expect_err("a flipped byte");
                assert!(e.contains(&format!("byte {pos} of {len}")), "{e}");
                assert!(e.contains("key-00000012"), "{e}");
            }
        }
    }

    #[test]
    fn values_differ_by_position_and_key() {
        let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
        fill_value(1, &mut a);
        fill_value(2, &mut b);
        assert_ne!(a, b);
        assert_ne!(a[..8], a[8..16], "a value shifted by a word is caught");
    }
}
