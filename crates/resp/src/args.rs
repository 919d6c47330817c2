//! Helpers for reading command arguments, which arrive as raw bytes.

/// Longest decimal `i64` text: `-9223372036854775808`.
const I64_CHARS_MAX: usize = 20;

/// Reads a whole argument as an `i64`, with Redis's `string2ll` rules.
///
/// Strict so that a number has exactly one spelling: `INCRBY k 010`,
/// `+5`, ` 5` or `-0` are refused by Redis, and a client that relies on
/// that must see the same here. Accepts an optional `-`, then `0` alone or
/// a digit 1-9 followed by digits, with no overflow.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > I64_CHARS_MAX {
        return None;
    }
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    match digits {
        [] => return None,
        [b'0'] if !neg => return Some(0),
        [b'0', ..] => return None,
        _ => {}
    }
    let mut mag: u64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        mag = mag.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    if neg {
        // The magnitude of i64::MIN is one more than i64::MAX.
        if mag > i64::MIN.unsigned_abs() {
            return None;
        }
        Some(0i64.wrapping_sub_unsigned(mag))
    } else {
        i64::try_from(mag).ok()
    }
}

/// Whether `arg` spells `name` in any letter case. Command names and
/// keywords (`EX`, `NX`, ...) are case-insensitive in Redis; this compares
/// without lowercasing a copy first.
#[inline]
pub fn eq_ignore_case(arg: &[u8], name: &[u8]) -> bool {
    arg.eq_ignore_ascii_case(name)
}

/// Lowercases `arg` into `out` and returns it, or `None` when it is longer
/// than `N` (so it cannot be a known name). Lets the server dispatch on a
/// command with one `match` on byte-string literals instead of a chain of
/// comparisons, without allocating.
#[inline]
pub fn lowercase<'b, const N: usize>(arg: &[u8], out: &'b mut [u8; N]) -> Option<&'b [u8]> {
    let dst = out.get_mut(..arg.len())?;
    for (d, s) in dst.iter_mut().zip(arg) {
        *d = s.to_ascii_lowercase();
    }
    Some(dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_i64_accepts_canonical_numbers() {
        let cases: [(&[u8], i64); 9] = [
            (b"0", 0),
            (b"1", 1),
            (b"-1", -1),
            (b"10", 10),
            (b"-10", -10),
            (b"1234567890", 1_234_567_890),
            (b"9223372036854775807", i64::MAX),
            (b"-9223372036854775808", i64::MIN),
            (b"-9223372036854775807", i64::MIN + 1),
        ];
        for (s, v) in cases {
            assert_eq!(parse_i64(s), Some(v), "{:?}", String::from_utf8_lossy(s));
        }
    }

    #[test]
    fn parse_i64_refuses_everything_else() {
        let cases: [&[u8]; 20] = [
            b"",
            b"-",
            b"+1",
            b"+0",
            b"-0",
            b"00",
            b"01",
            b"-01",
            b" 1",
            b"1 ",
            b"1\r\n",
            b"1a",
            b"0x10",
            b"1.0",
            b"1e3",
            b"--1",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"99999999999999999999",
            b"-99999999999999999999",
        ];
        for s in cases {
            assert_eq!(parse_i64(s), None, "{:?}", String::from_utf8_lossy(s));
        }
        // 21 characters is refused before any digit is read.
        assert_eq!(parse_i64(b"-00000000000000000001"), None);
        assert_eq!(parse_i64(b"100000000000000000000"), None);
    }

    #[test]
    fn parse_i64_agrees_with_std_on_canonical_text() {
        for v in [
            i64::MIN,
            i64::MIN + 1,
            -1_000_000_007,
            -1,
            0,
            1,
            42,
            i64::MAX - 1,
            i64::MAX,
        ] {
            assert_eq!(parse_i64(v.to_string().as_bytes()), Some(v));
        }
    }

    #[test]
    fn names_compare_case_insensitively() {
        assert!(eq_ignore_case(b"GET", b"get"));
        assert!(eq_ignore_case(b"gEt", b"GET"));
        assert!(!eq_ignore_case(b"GETX", b"get"));
        assert!(!eq_ignore_case(b"GE", b"get"));
        assert!(!eq_ignore_case(b"G\xc5T", b"get"));
        assert!(eq_ignore_case(b"", b""));
    }

    #[test]
    fn lowercase_fits_or_refuses() {
        let mut tmp = [0u8; 8];
        assert_eq!(lowercase(b"MSet", &mut tmp), Some(&b"mset"[..]));
        assert_eq!(lowercase(b"12345678", &mut tmp), Some(&b"12345678"[..]));
        assert_eq!(lowercase(b"123456789", &mut tmp), None);
        assert_eq!(lowercase(b"", &mut tmp), Some(&b""[..]));
    }
}
