//! Redis's glob patterns (`stringmatchlen`), for KEYS and SCAN MATCH:
//! `*` any run of bytes, `?` any one byte, `[abc]`, `[a-z]` and `[^...]`
//! classes, and `\x` for a literal `x`, outside or inside a class.
//!
//! Redis recurses on each `*`; this matcher is iterative with a single
//! backtrack point (the last star), which is exact for these patterns and
//! costs at most pattern x subject steps, further capped at
//! [`GLOB_STEPS_MAX`]: a pattern that needs more is answered "no match"
//! rather than letting one KEYS run for seconds.

/// Most steps (one pattern element tried against one subject byte) one
/// match may take; beyond it the subject does not match.
pub(super) const GLOB_STEPS_MAX: usize = 1 << 20;

/// Whether `s` matches the glob `pattern` (case-sensitive).
pub(super) fn stringmatch(pattern: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    // The pattern position after the last star, and the subject position
    // that star would next swallow up to.
    let mut star: Option<(usize, usize)> = None;
    let mut steps = 0usize;
    loop {
        steps += 1;
        if steps > GLOB_STEPS_MAX {
            return false;
        }
        if pattern.get(p) == Some(&b'*') {
            while pattern.get(p) == Some(&b'*') {
                p += 1;
            }
            if p == pattern.len() {
                return true;
            }
            star = Some((p, i));
            continue;
        }
        let Some(&c) = s.get(i) else {
            return p == pattern.len();
        };
        if p < pattern.len() {
            let (hit, next) = one(pattern, p, c);
            if hit {
                p = next;
                i += 1;
                continue;
            }
        }
        match star {
            Some((sp, si)) if si < s.len() => {
                p = sp;
                i = si + 1;
                star = Some((sp, si + 1));
            }
            _ => return false,
        }
    }
}

/// Whether the pattern element at `p` (not a star) matches byte `c`, and
/// where the next element starts.
fn one(pattern: &[u8], p: usize, c: u8) -> (bool, usize) {
    match pattern[p] {
        b'?' => (true, p + 1),
        b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == c, p + 2),
        b'[' => class(pattern, p + 1, c),
        lit => (lit == c, p + 1),
    }
}

/// A class whose body starts at `q` (after `[`): whether `c` is in it, and
/// the position after its `]` (or the pattern's end, for an unclosed one).
fn class(pattern: &[u8], mut q: usize, c: u8) -> (bool, usize) {
    let negate = pattern.get(q) == Some(&b'^');
    if negate {
        q += 1;
    }
    let mut hit = false;
    while q < pattern.len() {
        match pattern[q] {
            b'\\' if q + 1 < pattern.len() => {
                hit |= pattern[q + 1] == c;
                q += 2;
            }
            b']' => {
                q += 1;
                return (hit != negate, q);
            }
            lo if q + 2 < pattern.len() && pattern[q + 1] == b'-' => {
                let hi = pattern[q + 2];
                let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
                hit |= (lo..=hi).contains(&c);
                q += 3;
            }
            b => {
                hit |= b == c;
                q += 1;
            }
        }
    }
    (hit != negate, q)
}

/// Whether `pattern` has no special byte, so that it names one key.
pub(super) fn is_literal(pattern: &[u8]) -> bool {
    !pattern
        .iter()
        .any(|b| matches!(b, b'*' | b'?' | b'[' | b'\\'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_like_redis() {
        // (pattern, subject, whether Redis's stringmatch matches them)
        let cases: &[(&[u8], &[u8], bool)] = &[
            (b"*", b"", true),
            (b"*", b"anything", true),
            (b"h?llo", b"hello", true),
            (b"h*llo", b"heeeello", true),
            (b"h[ae]llo", b"hallo", true),
            (b"h[^e]llo", b"hallo", true),
            (b"h[a-b]llo", b"hbllo", true),
            (b"h[b-a]llo", b"hallo", true),
            (b"h\\*llo", b"h*llo", true),
            (b"[\\]]", b"]", true),
            (b"a*b*c", b"aXbYc", true),
            (b"*.txt", b"a.b.txt", true),
            (b"user:*:name", b"user:42:name", true),
            (b"", b"", true),
            (b"h?llo", b"hllo", false),
            (b"h[ae]llo", b"hillo", false),
            (b"h[^e]llo", b"hello", false),
            (b"h\\*llo", b"hello", false),
            (b"a*b", b"acd", false),
            (b"", b"a", false),
            (b"abc", b"ab", false),
        ];
        for &(p, s, matches) in cases {
            assert_eq!(stringmatch(p, s), matches, "{:?} ~ {:?}", p, s);
        }
    }

    #[test]
    fn hostile_patterns_are_bounded() {
        let pattern = [b"*a".repeat(200), b"b".to_vec()].concat();
        let subject = vec![b'a'; 10_000];
        let t = std::time::Instant::now();
        assert!(!stringmatch(&pattern, &subject));
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert!(is_literal(b"user:1") && !is_literal(b"user:*"));
    }
}
