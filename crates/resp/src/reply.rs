//! RESP2 reply encoding, appending to the connection's output buffer.
//!
//! Every function writes straight into `out` (reserving once where the
//! size is known), so building a reply costs no allocation once the output
//! buffer has reached its working size.

/// Two ASCII digits for each number 0..100: numbers are written two digits
/// per division, which halves the divisions of the digit-by-digit loop.
const DIGIT_PAIRS: [u8; 200] = {
    let mut t = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        t[2 * i] = b'0' + (i / 10) as u8;
        t[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    t
};

/// Longest decimal `u64`, in bytes.
const U64_DIGITS_MAX: usize = 20;

/// Appends the decimal digits of `n`.
#[inline]
fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut tmp = [0u8; U64_DIGITS_MAX];
    let mut at = U64_DIGITS_MAX;
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        at -= 2;
        tmp[at..at + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        at -= 2;
        tmp[at..at + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        at -= 1;
        tmp[at] = b'0' + n as u8;
    }
    out.extend_from_slice(&tmp[at..]);
}

/// Appends `text` with CR and LF replaced by spaces: a simple string or
/// error ends at the first CRLF, so one inside would let the rest of the
/// text be read as further replies.
#[inline]
fn write_line(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    let at = out.len();
    out.extend_from_slice(bytes);
    if bytes.iter().any(|&b| b == b'\r' || b == b'\n') {
        for b in &mut out[at..] {
            if *b == b'\r' || *b == b'\n' {
                *b = b' ';
            }
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// `+<text>\r\n`, e.g. `simple(out, "OK")`.
#[inline]
pub fn simple(out: &mut Vec<u8>, text: &str) {
    out.reserve(text.len() + 3);
    out.push(b'+');
    write_line(out, text);
}

/// `-<message>\r\n`; the message carries its own prefix (`ERR ...`,
/// `WRONGTYPE ...`), as clients read the first word as the error kind.
#[inline]
pub fn error(out: &mut Vec<u8>, message: &str) {
    out.reserve(message.len() + 3);
    out.push(b'-');
    write_line(out, message);
}

/// `:<n>\r\n`.
#[inline]
pub fn integer(out: &mut Vec<u8>, n: i64) {
    out.reserve(1 + U64_DIGITS_MAX + 1 + 2);
    out.push(b':');
    if n < 0 {
        out.push(b'-');
    }
    // unsigned_abs is exact for i64::MIN, whose magnitude no i64 holds.
    write_u64(out, n.unsigned_abs());
    out.extend_from_slice(b"\r\n");
}

/// `$<len>\r\n<bytes>\r\n`.
#[inline]
pub fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(1 + U64_DIGITS_MAX + 2 + bytes.len() + 2);
    bulk_header(out, bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// `$<len>\r\n` alone, for a payload the caller appends itself (e.g. copied
/// straight out of the store), followed by its own `\r\n`.
#[inline]
pub fn bulk_header(out: &mut Vec<u8>, len: usize) {
    length_line(out, b'$', len);
}

/// `$-1\r\n`: the RESP2 nil, e.g. GET of a missing key.
#[inline]
pub fn null_bulk(out: &mut Vec<u8>) {
    out.extend_from_slice(b"$-1\r\n");
}

/// `*<len>\r\n`; the `len` elements follow as further replies.
#[inline]
pub fn array_header(out: &mut Vec<u8>, len: usize) {
    length_line(out, b'*', len);
}

/// `<kind><len>\r\n`: the line that opens a bulk string (`$`) or an
/// array (`*`).
#[inline]
fn length_line(out: &mut Vec<u8>, kind: u8, len: usize) {
    out.push(kind);
    write_u64(out, len as u64);
    out.extend_from_slice(b"\r\n");
}

/// `*-1\r\n`: the RESP2 nil array.
#[inline]
pub fn null_array(out: &mut Vec<u8>) {
    out.extend_from_slice(b"*-1\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        f(&mut out);
        out
    }

    #[test]
    fn encodes_each_kind() {
        assert_eq!(with(|o| simple(o, "OK")), b"+OK\r\n");
        assert_eq!(with(|o| simple(o, "")), b"+\r\n");
        assert_eq!(with(|o| error(o, "ERR nope")), b"-ERR nope\r\n");
        assert_eq!(with(|o| integer(o, 0)), b":0\r\n");
        assert_eq!(with(|o| integer(o, -7)), b":-7\r\n");
        assert_eq!(with(|o| bulk(o, b"hi")), b"$2\r\nhi\r\n");
        assert_eq!(with(|o| bulk(o, b"")), b"$0\r\n\r\n");
        assert_eq!(with(null_bulk), b"$-1\r\n");
        assert_eq!(with(|o| array_header(o, 3)), b"*3\r\n");
        assert_eq!(with(|o| array_header(o, 0)), b"*0\r\n");
        assert_eq!(with(null_array), b"*-1\r\n");
        assert_eq!(with(|o| bulk_header(o, 10)), b"$10\r\n");
    }

    #[test]
    fn appends_after_existing_bytes() {
        let mut out = b"+OK\r\n".to_vec();
        integer(&mut out, 5);
        bulk(&mut out, b"x");
        assert_eq!(out, b"+OK\r\n:5\r\n$1\r\nx\r\n");
    }

    #[test]
    fn line_breaks_in_text_become_spaces() {
        assert_eq!(with(|o| error(o, "ERR a\r\nb\nc\rd")), b"-ERR a  b c d\r\n");
        assert_eq!(with(|o| simple(o, "a\nb")), b"+a b\r\n");
    }

    #[test]
    fn integers_at_the_edges() {
        for n in [
            i64::MIN,
            i64::MIN + 1,
            -1_000_000,
            -100,
            -99,
            -10,
            -9,
            -1,
            0,
            1,
            9,
            10,
            99,
            100,
            101,
            999,
            1000,
            i64::MAX - 1,
            i64::MAX,
        ] {
            assert_eq!(with(|o| integer(o, n)), format!(":{n}\r\n").as_bytes());
        }
        // Every power of ten and its neighbours, where digit counts change.
        let mut p: u64 = 1;
        loop {
            for m in [p - 1, p, p + 1] {
                let mut out = Vec::new();
                write_u64(&mut out, m);
                assert_eq!(out, m.to_string().as_bytes());
            }
            match p.checked_mul(10) {
                Some(q) => p = q,
                None => break,
            }
        }
        let mut out = Vec::new();
        write_u64(&mut out, u64::MAX);
        assert_eq!(out, u64::MAX.to_string().as_bytes());
    }
}
