//! Reply encoding, appending to the connection's output buffer.
//!
//! The free functions write RESP2 (the types both protocols share, and the
//! RESP2 nils). [`Reply`] wraps the output buffer with the connection's
//! protocol ([`Proto`]) and writes the types whose encoding depends on it
//! (null, map, set, double, boolean, verbatim string): RESP3 natively,
//! RESP2 as Redis downgrades them. A command writes every reply through a
//! `Reply`; it dereferences to the buffer, so the shared free functions
//! take it as they are.
//!
//! Every function writes straight into `out` (reserving once where the
//! size is known), so building a reply costs no allocation once the output
//! buffer has reached its working size.

use std::ops::{Deref, DerefMut};

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

/// The protocol a connection speaks: RESP2 until HELLO 3 switches it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Proto {
    /// RESP2, every connection's protocol at start.
    #[default]
    Resp2,
    /// RESP3, after `HELLO 3`.
    Resp3,
}

impl Proto {
    /// The version number HELLO and CLIENT LIST show (2 or 3).
    pub fn version(self) -> i64 {
        match self {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        }
    }
}

/// The output buffer of one connection with the protocol its replies are
/// written in.
///
/// It dereferences to the buffer, so the protocol-independent encoders
/// ([`simple`], [`error`], [`integer`], [`bulk`], [`array_header`]) take
/// it directly; the methods here write the types whose encoding differs
/// between RESP2 and RESP3. RESP2 output is byte for byte what the free
/// functions write.
#[derive(Debug)]
pub struct Reply<'a> {
    buf: &'a mut Vec<u8>,
    proto: Proto,
}

impl<'a> Reply<'a> {
    /// Replies appended to `buf` in `proto`.
    pub fn new(buf: &'a mut Vec<u8>, proto: Proto) -> Reply<'a> {
        Reply { buf, proto }
    }

    /// The protocol replies are written in.
    pub fn proto(&self) -> Proto {
        self.proto
    }

    /// Switches the protocol of the replies written from now on (HELLO
    /// answers in the protocol it selects).
    pub fn set_proto(&mut self, proto: Proto) {
        self.proto = proto;
    }

    /// The null reply: `_` in RESP3, the nil bulk string `$-1` in RESP2
    /// (GET of a missing key).
    #[inline]
    pub fn null(&mut self) {
        match self.proto {
            Proto::Resp2 => null_bulk(self.buf),
            Proto::Resp3 => self.buf.extend_from_slice(b"_\r\n"),
        }
    }

    /// The null where RESP2 sends the nil array (`*-1`): `_` in RESP3.
    #[inline]
    pub fn null_array(&mut self) {
        match self.proto {
            Proto::Resp2 => null_array(self.buf),
            Proto::Resp3 => self.buf.extend_from_slice(b"_\r\n"),
        }
    }

    /// A map of `pairs` key-value pairs, which follow as `2 * pairs`
    /// replies: `%pairs` in RESP3, a flat array of `2 * pairs` in RESP2.
    #[inline]
    pub fn map_header(&mut self, pairs: usize) {
        match self.proto {
            Proto::Resp2 => array_header(self.buf, pairs.saturating_mul(2)),
            Proto::Resp3 => length_line(self.buf, b'%', pairs),
        }
    }

    /// A set of `len` elements: `~len` in RESP3, an array in RESP2.
    #[inline]
    pub fn set_header(&mut self, len: usize) {
        match self.proto {
            Proto::Resp2 => array_header(self.buf, len),
            Proto::Resp3 => length_line(self.buf, b'~', len),
        }
    }

    /// A double: `,<value>` in RESP3 (`inf`, `-inf`, `nan` spelt so), a
    /// bulk string of the same text in RESP2. The text is the shortest
    /// that reads back as the same double.
    pub fn double(&mut self, value: f64) {
        let text = double_text(value);
        match self.proto {
            Proto::Resp2 => bulk(self.buf, text.as_bytes()),
            Proto::Resp3 => {
                self.buf.push(b',');
                self.buf.extend_from_slice(text.as_bytes());
                self.buf.extend_from_slice(b"\r\n");
            }
        }
    }

    /// A boolean: `#t` / `#f` in RESP3, the integer 1 / 0 in RESP2.
    #[inline]
    pub fn boolean(&mut self, value: bool) {
        match self.proto {
            Proto::Resp2 => integer(self.buf, i64::from(value)),
            Proto::Resp3 => self
                .buf
                .extend_from_slice(if value { b"#t\r\n" } else { b"#f\r\n" }),
        }
    }

    /// A verbatim string of plain text (INFO, CLIENT LIST): `=<len>` with
    /// the `txt:` format prefix in RESP3, a bulk string in RESP2.
    pub fn verbatim_text(&mut self, text: &[u8]) {
        match self.proto {
            Proto::Resp2 => bulk(self.buf, text),
            Proto::Resp3 => {
                length_line(self.buf, b'=', text.len() + VERBATIM_PREFIX.len());
                self.buf.extend_from_slice(VERBATIM_PREFIX);
                self.buf.extend_from_slice(text);
                self.buf.extend_from_slice(b"\r\n");
            }
        }
    }
}

impl Deref for Reply<'_> {
    type Target = Vec<u8>;

    fn deref(&self) -> &Vec<u8> {
        self.buf
    }
}

impl DerefMut for Reply<'_> {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        self.buf
    }
}

/// The format prefix of a plain-text verbatim string: three letters and
/// a colon, counted in its length.
const VERBATIM_PREFIX: &[u8] = b"txt:";

/// The text of a double as RESP3 writes it: `inf`, `-inf`, `nan`, else
/// the shortest decimal that reads back as `value` (`1.5`, `3`, `1e+300`
/// is written out in full digits by Rust's formatting).
pub fn double_text(value: f64) -> String {
    if value.is_nan() {
        "nan".into()
    } else if value.is_infinite() {
        if value > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{value}")
    }
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

    fn with3(proto: Proto, f: impl FnOnce(&mut Reply<'_>)) -> Vec<u8> {
        let mut out = Vec::new();
        f(&mut Reply::new(&mut out, proto));
        out
    }

    #[test]
    fn resp2_writer_is_byte_identical_to_the_free_functions() {
        let p = Proto::Resp2;
        assert_eq!(with3(p, |r| r.null()), with(null_bulk));
        assert_eq!(with3(p, |r| r.null_array()), with(null_array));
        assert_eq!(with3(p, |r| r.map_header(2)), b"*4\r\n");
        assert_eq!(with3(p, |r| r.set_header(3)), b"*3\r\n");
        assert_eq!(with3(p, |r| r.double(1.5)), b"$3\r\n1.5\r\n");
        assert_eq!(with3(p, |r| r.boolean(true)), b":1\r\n");
        assert_eq!(with3(p, |r| r.boolean(false)), b":0\r\n");
        assert_eq!(with3(p, |r| r.verbatim_text(b"a:1")), b"$3\r\na:1\r\n");
        // The shared encoders go through the writer unchanged.
        assert_eq!(
            with3(p, |r| {
                simple(r, "OK");
                bulk(r, b"x");
                integer(r, 3)
            }),
            b"+OK\r\n$1\r\nx\r\n:3\r\n"
        );
    }

    #[test]
    fn resp3_writer_encodes_each_type() {
        let p = Proto::Resp3;
        assert_eq!(with3(p, |r| r.null()), b"_\r\n");
        assert_eq!(with3(p, |r| r.null_array()), b"_\r\n");
        assert_eq!(with3(p, |r| r.map_header(2)), b"%2\r\n");
        assert_eq!(with3(p, |r| r.map_header(0)), b"%0\r\n");
        assert_eq!(with3(p, |r| r.set_header(3)), b"~3\r\n");
        assert_eq!(with3(p, |r| r.double(1.5)), b",1.5\r\n");
        assert_eq!(with3(p, |r| r.double(3.0)), b",3\r\n");
        assert_eq!(with3(p, |r| r.double(-0.25)), b",-0.25\r\n");
        assert_eq!(with3(p, |r| r.double(f64::INFINITY)), b",inf\r\n");
        assert_eq!(with3(p, |r| r.double(f64::NEG_INFINITY)), b",-inf\r\n");
        assert_eq!(with3(p, |r| r.double(f64::NAN)), b",nan\r\n");
        assert_eq!(with3(p, |r| r.boolean(true)), b"#t\r\n");
        assert_eq!(with3(p, |r| r.boolean(false)), b"#f\r\n");
        assert_eq!(with3(p, |r| r.verbatim_text(b"a:1")), b"=7\r\ntxt:a:1\r\n");
        assert_eq!(with3(p, |r| r.verbatim_text(b"")), b"=4\r\ntxt:\r\n");
    }

    #[test]
    fn the_protocol_can_switch_mid_buffer() {
        let mut out = Vec::new();
        let mut r = Reply::new(&mut out, Proto::Resp2);
        r.null();
        assert_eq!(r.proto(), Proto::Resp2);
        r.set_proto(Proto::Resp3);
        r.null();
        assert_eq!(r.proto().version(), 3);
        assert_eq!(out, b"$-1\r\n_\r\n");
    }

    #[test]
    fn doubles_read_back_exactly() {
        for v in [0.1, 1e300, -1e-300, 123456.789, f64::MAX, f64::MIN_POSITIVE] {
            let t = double_text(v);
            assert_eq!(t.parse::<f64>().ok(), Some(v), "{t}");
        }
    }
}
