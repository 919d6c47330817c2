//! Splitting a command line into words and reading its numbers.

/// The first space-separated word and what follows it.
pub(crate) fn split_word(s: &[u8]) -> (&[u8], &[u8]) {
    let s = trim_start(s);
    match s.iter().position(|&b| b == b' ') {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, &[]),
    }
}

pub(crate) fn trim_start(mut s: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = s {
        s = rest;
    }
    s
}

/// The words of a command line, at most `N`, borrowed from the line.
pub(crate) struct Tokens<'a, const N: usize> {
    /// The words; only the first `len` are set.
    pub(crate) items: [&'a [u8]; N],
    /// How many words the line had.
    pub(crate) len: usize,
}

/// Up to `N` space-separated tokens; `None` when there are more.
pub(crate) fn tokens<const N: usize>(s: &[u8]) -> Option<Tokens<'_, N>> {
    let mut t = Tokens {
        items: [&[][..]; N],
        len: 0,
    };
    for w in s.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
        if t.len == N {
            return None;
        }
        t.items[t.len] = w;
        t.len += 1;
    }
    Some(t)
}

/// A decimal u64 (digits only, no sign, no overflow).
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// A decimal i64 with an optional minus sign.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    match s {
        [b'-', rest @ ..] => {
            let v = parse_u64(rest)?;
            0i64.checked_sub_unsigned(v)
        }
        _ => i64::try_from(parse_u64(s)?).ok(),
    }
}

pub(crate) fn parse_u32(s: &[u8]) -> Option<u32> {
    u32::try_from(parse_u64(s)?).ok()
}
