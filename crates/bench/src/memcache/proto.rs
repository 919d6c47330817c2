//! memcached's text protocol as the load generator speaks it: the keys
//! (`key:%012d`, as `redis-benchmark -r` makes them) and the parser of
//! replies, which takes bytes and returns items, with no socket.

/// What every key starts with.
pub const KEY_PREFIX: &[u8] = b"key:";
/// Digits of a key's number, zero padded (`key:%012d`: 16-byte keys).
pub const KEY_DIGITS: usize = 12;
/// Longest reply line accepted, bytes with its `\r\n`. memcached keys are
/// at most 250 bytes, so a `VALUE` line is far shorter; a longer line means
/// the stream is not what this parser thinks it is.
pub const MAX_LINE_BYTES: usize = 1024;
/// Largest value accepted in a reply, bytes: memcached's default item size
/// limit (`-I 1m`), which no value it stores by default exceeds.
pub const MAX_VALUE_BYTES: usize = 1 << 20;

/// Writes key number `i` into `out` (replacing what it held):
/// `key:000000000042`.
pub fn key_of(i: u64, out: &mut Vec<u8>) {
    out.clear();
    push_key(i, out);
}

/// Appends key number `i` to `out`.
pub(crate) fn push_key(i: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(KEY_PREFIX);
    // u64::MAX has 20 digits; the buffer starts as zeros for the padding.
    let mut digits = [b'0'; 20];
    let mut at = digits.len();
    let mut n = i;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at.min(digits.len() - KEY_DIGITS)..]);
}

/// The number of a key made by [`key_of`]; `None` for any other key.
pub fn key_number(key: &[u8]) -> Option<u64> {
    let digits = key.strip_prefix(KEY_PREFIX)?;
    parse_u64(digits)
}

/// A decimal number made of digits only (no sign, no spaces).
fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// One reply item of the text protocol. A GET's reply is zero or more
/// `Value`s then `End`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McReply<'a> {
    /// `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n`.
    Value {
        /// The key.
        key: &'a [u8],
        /// The client flags stored with the item.
        flags: u32,
        /// The value.
        data: &'a [u8],
    },
    /// `END\r\n`: the end of a GET's reply.
    End,
    /// `STORED\r\n`: a SET's reply.
    Stored,
    /// `ERROR`, `CLIENT_ERROR ...` or `SERVER_ERROR ...` (the line,
    /// without `\r\n`).
    Error(&'a [u8]),
    /// Any other line (`NOT_STORED`, `EXISTS`, ...), without `\r\n`.
    Other(&'a [u8]),
}

/// Parses the reply item at the start of `buf`: `Ok(None)` when `buf`
/// holds only part of it (read more and call again with the same start),
/// else the item and how many bytes of `buf` it took. It keeps no state,
/// so a reply split at any byte across reads parses the same.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(McReply<'_>, usize)>, String> {
    let window = &buf[..buf.len().min(MAX_LINE_BYTES)];
    let Some(nl) = window.iter().position(|&b| b == b'\n') else {
        if window.len() == MAX_LINE_BYTES {
            return Err(format!(
                "reply line longer than {MAX_LINE_BYTES} bytes: {}",
                lossy(&window[..64])
            ));
        }
        return Ok(None);
    };
    if nl == 0 || buf[nl - 1] != b'\r' {
        return Err(format!(
            "reply line not ended by \\r\\n: {}",
            lossy(&buf[..nl])
        ));
    }
    let line = &buf[..nl - 1];
    let after = nl + 1;
    let reply = match line {
        b"END" => McReply::End,
        b"STORED" => McReply::Stored,
        b"ERROR" => McReply::Error(line),
        _ if line.starts_with(b"CLIENT_ERROR ") || line.starts_with(b"SERVER_ERROR ") => {
            McReply::Error(line)
        }
        _ if line.starts_with(b"VALUE ") => return parse_value(line, buf, after),
        _ => McReply::Other(line),
    };
    Ok(Some((reply, after)))
}

/// Parses a `VALUE` item whose line is `line` and whose data starts at
/// `buf[after..]`.
fn parse_value<'a>(
    line: &'a [u8],
    buf: &'a [u8],
    after: usize,
) -> Result<Option<(McReply<'a>, usize)>, String> {
    let bad = || format!("malformed reply line: {}", lossy(line));
    let mut fields = line[b"VALUE ".len()..].split(|&b| b == b' ');
    let key = fields.next().filter(|k| !k.is_empty()).ok_or_else(bad)?;
    let flags = fields
        .next()
        .and_then(parse_u64)
        .and_then(|f| u32::try_from(f).ok())
        .ok_or_else(bad)?;
    let bytes = fields
        .next()
        .and_then(parse_u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(bad)?;
    // An optional CAS unique (from `gets`), then nothing.
    if let Some(cas) = fields.next() {
        parse_u64(cas).ok_or_else(bad)?;
    }
    if fields.next().is_some() {
        return Err(bad());
    }
    if bytes > MAX_VALUE_BYTES {
        return Err(format!(
            "value of {bytes} bytes, more than the {MAX_VALUE_BYTES} accepted: {}",
            lossy(line)
        ));
    }
    let end = after + bytes + 2;
    if buf.len() < end {
        return Ok(None);
    }
    if &buf[after + bytes..end] != b"\r\n" {
        return Err(format!(
            "value data not followed by \\r\\n after {}",
            lossy(line)
        ));
    }
    let data = &buf[after..after + bytes];
    Ok(Some((McReply::Value { key, flags, data }, end)))
}

/// Bytes for an error message (lossy UTF-8).
pub(crate) fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses every item of `input`, feeding it `step` bytes at a time as
    /// reads would; returns the items as owned debug strings.
    fn parse_all(input: &[u8], step: usize) -> Result<Vec<String>, String> {
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for chunk in input.chunks(step) {
            buf.extend_from_slice(chunk);
            let mut pos = 0;
            while let Some((r, used)) = parse_reply(&buf[pos..])? {
                out.push(format!("{r:?}"));
                pos += used;
            }
            buf.drain(..pos);
        }
        assert!(buf.is_empty(), "left unparsed: {buf:?}");
        Ok(out)
    }

    #[test]
    fn makes_redis_benchmark_keys() {
        let mut k = Vec::new();
        key_of(42, &mut k);
        assert_eq!(k, b"key:000000000042");
        key_of(0, &mut k);
        assert_eq!(k, b"key:000000000000");
        key_of(u64::MAX, &mut k);
        assert_eq!(k, b"key:18446744073709551615");
        assert_eq!(key_number(&k), Some(u64::MAX));
        assert_eq!(key_number(b"key:000000000042"), Some(42));
        assert_eq!(key_number(b"key:"), None);
        assert_eq!(key_number(b"key:12a"), None);
        assert_eq!(key_number(b"kez:1"), None);
    }

    #[test]
    fn parses_replies_whole_and_split_at_every_byte() {
        // A value holding \r\n and "END", to show data is taken by length.
        let input: &[u8] = b"VALUE key:000000000001 0 5\r\na\r\nEN\r\nVALUE k 7 0 99\r\n\r\nEND\r\nSTORED\r\nEND\r\nERROR\r\nSERVER_ERROR out of memory\r\nNOT_STORED\r\n";
        let whole = parse_all(input, input.len()).expect("parses");
        assert_eq!(
            whole,
            [
                format!(
                    "{:?}",
                    McReply::Value {
                        key: b"key:000000000001",
                        flags: 0,
                        data: b"a\r\nEN"
                    }
                ),
                format!(
                    "{:?}",
                    McReply::Value {
                        key: b"k",
                        flags: 7,
                        data: b""
                    }
                ),
                format!("{:?}", McReply::End),
                format!("{:?}", McReply::Stored),
                format!("{:?}", McReply::End),
                format!("{:?}", McReply::Error(b"ERROR")),
                format!("{:?}", McReply::Error(b"SERVER_ERROR out of memory")),
                format!("{:?}", McReply::Other(b"NOT_STORED")),
            ]
        );
        for step in 1..input.len() {
            assert_eq!(
                parse_all(input, step).expect("parses"),
                whole,
                "step {step}"
            );
        }
    }

    #[test]
    fn incomplete_replies_wait_and_bad_ones_fail() {
        assert_eq!(parse_reply(b""), Ok(None));
        assert_eq!(parse_reply(b"STOR"), Ok(None));
        assert_eq!(parse_reply(b"END\r"), Ok(None));
        assert_eq!(parse_reply(b"VALUE k 0 3\r\nab"), Ok(None));
        assert_eq!(parse_reply(b"VALUE k 0 3\r\nabc\r"), Ok(None));
        assert_eq!(
            parse_reply(b"END\r\nX"),
            Ok(Some((McReply::End, 5))),
            "only the first item is taken"
        );
        for bad in [
            "END\n",
            "VALUE k 0\r\n",
            "VALUE k x 3\r\n",
            "VALUE  0 3\r\n",
            "VALUE k 0 3 1 2\r\n",
            "VALUE k 0 3\r\nabcd\r\n",
            "VALUE k 0 99999999\r\n",
        ] {
            assert!(parse_reply(bad.as_bytes()).is_err(), "{bad:?} accepted");
        }
        let long = vec![b'x'; MAX_LINE_BYTES];
        assert!(parse_reply(&long).is_err(), "an endless line is refused");
        assert_eq!(parse_reply(&long[..MAX_LINE_BYTES - 1]), Ok(None));
    }
}
