//! The command parser: one command at a time from the front of a receive
//! buffer the caller owns.

use crate::error::ProtocolError;
use crate::limits::{
    RESP_ARGS_KEPT, RESP_ARGS_MAX, RESP_BULK_BYTES_MAX, RESP_BULK_WIRE_BYTES_MIN,
    RESP_COMMAND_BYTES_MAX, RESP_INLINE_BYTES_MAX, RESP_LARGE_BULK_BYTES_MIN,
    RESP_LENGTH_DIGITS_MAX, RESP_UNAUTH_ARGS_MAX, RESP_UNAUTH_BULK_BYTES_MAX,
};

/// Marks a span whose start is an offset into the parser's scratch buffer
/// rather than into the caller's buffer. Offsets stay far below it: a
/// command is at most `RESP_COMMAND_BYTES_MAX` bytes.
const IN_SCRATCH: u32 = 1 << 31;

const _: () = assert!(RESP_COMMAND_BYTES_MAX < IN_SCRATCH as usize);
const _: () = assert!(RESP_INLINE_BYTES_MAX <= RESP_COMMAND_BYTES_MAX);

/// What the front of the buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse {
    /// Not a whole command yet. No parse can complete until the buffer
    /// holds at least `need` bytes (counted from its start, always more
    /// than it holds now), so the caller should read until then and not
    /// parse in between: that keeps a large value arriving in many reads
    /// at O(n) parsing work instead of O(n²).
    Incomplete {
        /// Lower bound on the buffered bytes the command needs in all.
        need: usize,
    },
    /// A whole command took the first `consumed` bytes (at least 1). Its
    /// arguments are available through [`CommandParser::arg`] until the
    /// next parse; `argc` 0 is an empty command that the caller skips, as
    /// Redis does for a blank line or `*0`.
    Complete {
        /// Bytes to drop from the front of the buffer.
        consumed: usize,
    },
}

/// What the front of the buffer holds, for a parser that takes large bulks
/// ([`CommandParser::parse_large`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseLarge {
    /// As [`CommandParser::parse`] answers.
    Parse(Parse),
    /// The command's argument `arg` is a bulk of `len` bytes, at least
    /// [`RESP_LARGE_BULK_BYTES_MIN`]: its `$len` header starts at
    /// `header_at` and its payload at `data_at` (both offsets into the
    /// buffer). The caller receives the payload into a buffer of its own,
    /// replaces the header in its buffer with the empty bulk's header
    /// `$0\r\n` (shorter, so it fits in place) followed by whatever came
    /// after the payload (its CRLF first), and parses again: the command
    /// then completes with an empty argument `arg`, which the caller
    /// stands the received value in for. No arguments are available.
    LargeBulk {
        /// Offset of the bulk's `$`.
        header_at: usize,
        /// Offset of the bulk's first payload byte.
        data_at: usize,
        /// Payload bytes announced.
        len: usize,
        /// Index of the argument (0 is the command's name).
        arg: usize,
    },
}

/// A reusable RESP2 command parser.
///
/// It keeps no state between commands beyond two buffers reused from one
/// parse to the next: the argument spans, and a scratch buffer for inline
/// arguments whose quotes and escapes had to be rewritten. Both are bounded
/// by the limits, so after the first few commands a connection parses
/// without allocating. A command of more than [`RESP_ARGS_KEPT`] arguments
/// grows the spans for itself only: the next parse gives the excess back.
#[derive(Debug, Default, Clone)]
pub struct CommandParser {
    /// (start, len) of each argument of the last complete command; a start
    /// with `IN_SCRATCH` set is an offset into `scratch`.
    spans: Vec<(u32, u32)>,
    /// The last complete command grew `spans` past [`RESP_ARGS_KEPT`]:
    /// the next parse shrinks it back (not a parse that finds a large
    /// command incomplete, which would only grow it again on the retry).
    shrink_spans: bool,
    /// Unescaped quoted inline arguments.
    scratch: Vec<u8>,
    /// The connection must authenticate before anything else: multibulk
    /// counts and bulk lengths are held to Redis's smaller bounds for it
    /// ([`RESP_UNAUTH_ARGS_MAX`], [`RESP_UNAUTH_BULK_BYTES_MAX`]).
    unauthenticated: bool,
}

/// A length header read from the buffer.
enum Header {
    /// The whole line: its number (negative numbers as -1) and the offset
    /// just past its CRLF.
    Done { value: i64, end: usize },
    /// The buffer ends inside the line. `end` is the least offset at which
    /// the line can end, `value` the least number it can still hold.
    Partial { end: usize, value: usize },
}

/// The two kinds of length header, which differ in their bound, in whether
/// a negative number is allowed, and in the error they report.
#[derive(Clone, Copy)]
enum HeaderKind {
    Count,
    Bulk,
}

impl HeaderKind {
    fn invalid(self) -> ProtocolError {
        match self {
            Self::Count => ProtocolError::InvalidMultibulkLength,
            Self::Bulk => ProtocolError::InvalidBulkLength,
        }
    }

    fn too_long(self) -> ProtocolError {
        match self {
            Self::Count => ProtocolError::TooBigMbulkCount,
            Self::Bulk => ProtocolError::InvalidBulkLength,
        }
    }

    /// The error for a number past [`HeaderKind::max`]: a count that many
    /// arguments cannot fit in a command.
    fn over(self) -> ProtocolError {
        match self {
            Self::Count => ProtocolError::CommandTooBig,
            Self::Bulk => ProtocolError::InvalidBulkLength,
        }
    }

    fn max(self) -> u64 {
        match self {
            Self::Count => RESP_ARGS_MAX as u64,
            Self::Bulk => RESP_BULK_BYTES_MAX as u64,
        }
    }

    /// The bound for a connection that has not authenticated, and the
    /// error past it.
    fn unauth(self) -> (u64, ProtocolError) {
        match self {
            Self::Count => (
                RESP_UNAUTH_ARGS_MAX as u64,
                ProtocolError::UnauthenticatedMultibulkLength,
            ),
            Self::Bulk => (
                RESP_UNAUTH_BULK_BYTES_MAX as u64,
                ProtocolError::UnauthenticatedBulkLength,
            ),
        }
    }
}

/// Reads the `*N` or `$L` line whose type byte is at `at`.
///
/// Each byte is judged as it arrives, so a line that can no longer become a
/// valid header (a bad character, a number past its bound) is refused at
/// once rather than after its CRLF, which a hostile client may never send.
/// The number follows `parse_i64`'s rules: no `+`, no spaces, no leading
/// zeros, no `-0`.
///
/// With `unauth`, a number past the unauthenticated bound is refused with
/// its own error as soon as it has grown past it.
fn header(buf: &[u8], at: usize, kind: HeaderKind, unauth: bool) -> Result<Header, ProtocolError> {
    let first = at + 1;
    let mut neg = false;
    let mut digits = 0usize;
    let mut mag: u64 = 0;
    let mut i = first;
    while let Some(&b) = buf.get(i) {
        if b == b'\r' {
            if digits == 0 {
                return Err(kind.invalid());
            }
            return match buf.get(i + 1) {
                None => Ok(Header::Partial {
                    end: i + 2,
                    value: if neg { 0 } else { mag as usize },
                }),
                Some(b'\n') => Ok(Header::Done {
                    value: if neg { -1 } else { mag as i64 },
                    end: i + 2,
                }),
                Some(_) => Err(kind.invalid()),
            };
        }
        if i - first >= RESP_LENGTH_DIGITS_MAX {
            return Err(kind.too_long());
        }
        if b == b'-' && i == first {
            if matches!(kind, HeaderKind::Bulk) {
                return Err(kind.invalid());
            }
            neg = true;
        } else if b.is_ascii_digit() {
            // "0" may only stand alone, and "-0" not at all.
            if (digits > 0 && mag == 0) || (neg && b == b'0' && digits == 0) {
                return Err(kind.invalid());
            }
            mag = mag
                .checked_mul(10)
                .and_then(|m| m.checked_add(u64::from(b - b'0')))
                .ok_or(kind.invalid())?;
            if neg && mag > i64::MIN.unsigned_abs() {
                return Err(kind.invalid());
            }
            if !neg && mag > kind.max() {
                return Err(kind.over());
            }
            if unauth && !neg {
                let (max, err) = kind.unauth();
                if mag > max {
                    return Err(err);
                }
            }
            digits += 1;
        } else {
            return Err(kind.invalid());
        }
        i += 1;
    }
    // The line can end no sooner than a digit (if none yet) and CRLF away,
    // and later digits only make the number larger.
    Ok(Header::Partial {
        end: i + if digits == 0 { 3 } else { 2 },
        value: if neg { 0 } else { mag as usize },
    })
}

/// The answer for a command that needs at least `need` bytes in all.
fn incomplete(need: usize) -> Result<Parse, ProtocolError> {
    if need > RESP_COMMAND_BYTES_MAX {
        return Err(ProtocolError::CommandTooBig);
    }
    Ok(Parse::Incomplete { need })
}

/// Separators of inline arguments: C's `isspace`, as Redis splits with it.
#[inline]
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// After a closing quote: the argument must end there.
fn after_quote(line: &[u8], i: usize) -> Result<usize, ProtocolError> {
    match line.get(i) {
        Some(&b) if !is_space(b) => Err(ProtocolError::UnbalancedQuotes),
        _ => Ok(i),
    }
}

impl CommandParser {
    /// A parser with empty buffers; they grow to the working size of the
    /// connection's commands and stay there.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds the commands parsed from now on to the bounds of a connection
    /// that must still authenticate (`true`), or lifts them (`false`).
    #[inline]
    pub fn set_unauthenticated(&mut self, unauthenticated: bool) {
        self.unauthenticated = unauthenticated;
    }

    /// Parses one command at the start of `buf`.
    ///
    /// A buffer starting with `*` is a multibulk command (what redis-cli,
    /// redis-benchmark and client libraries send); anything else is an
    /// inline command line (telnet, `nc`). On `Incomplete` or an error no
    /// arguments are available.
    pub fn parse(&mut self, buf: &[u8]) -> Result<Parse, ProtocolError> {
        match self.parse_any(buf, false)? {
            ParseLarge::Parse(p) => Ok(p),
            // Not produced when large bulks are not asked for.
            ParseLarge::LargeBulk { .. } => Err(ProtocolError::CommandTooBig),
        }
    }

    /// [`CommandParser::parse`], except that a multibulk argument of
    /// [`RESP_LARGE_BULK_BYTES_MIN`] bytes or more (up to
    /// [`RESP_BULK_BYTES_MAX`]) is not waited for in `buf` but handed to
    /// the caller as soon as its header is read ([`ParseLarge::LargeBulk`]).
    pub fn parse_large(&mut self, buf: &[u8]) -> Result<ParseLarge, ProtocolError> {
        self.parse_any(buf, true)
    }

    fn parse_any(&mut self, buf: &[u8], large: bool) -> Result<ParseLarge, ProtocolError> {
        self.spans.clear();
        self.scratch.clear();
        if self.shrink_spans {
            self.spans.shrink_to(RESP_ARGS_KEPT);
            self.shrink_spans = false;
        }
        let result = match buf.first() {
            None => Ok(ParseLarge::Parse(Parse::Incomplete { need: 1 })),
            Some(b'*') => self.parse_multibulk(buf, large),
            Some(_) => self.parse_inline(buf).map(ParseLarge::Parse),
        };
        if matches!(result, Ok(ParseLarge::Parse(Parse::Complete { .. }))) {
            self.shrink_spans = self.spans.len() > RESP_ARGS_KEPT;
        } else {
            self.spans.clear();
        }
        result
    }

    /// Arguments of the last complete command (0 for an empty command, and
    /// after `Incomplete` or an error).
    #[inline]
    pub fn argc(&self) -> usize {
        self.spans.len()
    }

    /// Argument `i` of the last complete command. `buf` must be the slice
    /// given to that parse (or one starting with the same bytes); quoted
    /// inline arguments come from the parser's own scratch buffer instead.
    /// An `i` past `argc` yields an empty slice rather than a panic.
    #[inline]
    pub fn arg<'a>(&'a self, buf: &'a [u8], i: usize) -> &'a [u8] {
        let Some(&(start, len)) = self.spans.get(i) else {
            return &[];
        };
        let (src, start) = if start & IN_SCRATCH != 0 {
            (&self.scratch[..], (start & !IN_SCRATCH) as usize)
        } else {
            (buf, start as usize)
        };
        src.get(start..start + len as usize).unwrap_or(&[])
    }

    /// Room in the span buffer, in arguments (tests of its reuse).
    #[cfg(test)]
    pub(crate) fn spans_capacity(&self) -> usize {
        self.spans.capacity()
    }

    /// The arguments of the last complete command, in order.
    pub fn args<'a>(&'a self, buf: &'a [u8]) -> impl ExactSizeIterator<Item = &'a [u8]> + 'a {
        (0..self.argc()).map(move |i| self.arg(buf, i))
    }

    fn parse_multibulk(&mut self, buf: &[u8], large: bool) -> Result<ParseLarge, ProtocolError> {
        let incomplete = |need| incomplete(need).map(ParseLarge::Parse);
        let (count, mut pos) = match header(buf, 0, HeaderKind::Count, self.unauthenticated)? {
            Header::Partial { end, value } => {
                return incomplete(end + value * RESP_BULK_WIRE_BYTES_MIN)
            }
            Header::Done { value, end } => (value, end),
        };
        if count <= 0 {
            // Redis reads `*0` and `*-1` as an empty command and moves on.
            return Ok(ParseLarge::Parse(Parse::Complete { consumed: pos }));
        }
        let count = count as usize;
        for k in 0..count {
            // Each argument not yet seen takes at least `$0\r\n\r\n`.
            let later = (count - k - 1) * RESP_BULK_WIRE_BYTES_MIN;
            let Some(&b) = buf.get(pos) else {
                return incomplete(pos + RESP_BULK_WIRE_BYTES_MIN + later);
            };
            if b != b'$' {
                return Err(ProtocolError::ExpectedDollar(b));
            }
            let (len, start) = match header(buf, pos, HeaderKind::Bulk, self.unauthenticated)? {
                // A large bulk needs only its header here.
                Header::Partial { end, value } if large && value >= RESP_LARGE_BULK_BYTES_MIN => {
                    return incomplete(end)
                }
                Header::Partial { end, value } => return incomplete(end + value + 2 + later),
                Header::Done { value, end } => (value as usize, end),
            };
            if large && len >= RESP_LARGE_BULK_BYTES_MIN {
                self.spans.clear();
                return Ok(ParseLarge::LargeBulk {
                    header_at: pos,
                    data_at: start,
                    len,
                    arg: k,
                });
            }
            let payload_end = start + len;
            let need = payload_end + 2 + later;
            if need > RESP_COMMAND_BYTES_MAX {
                return Err(ProtocolError::CommandTooBig);
            }
            match buf.get(payload_end..payload_end + 2) {
                None => return incomplete(need),
                Some(b"\r\n") => {}
                Some(_) => return Err(ProtocolError::InvalidBulkLength),
            }
            self.spans.push((start as u32, len as u32));
            pos = payload_end + 2;
        }
        Ok(ParseLarge::Parse(Parse::Complete { consumed: pos }))
    }

    fn parse_inline(&mut self, buf: &[u8]) -> Result<Parse, ProtocolError> {
        // The line may hold RESP_INLINE_BYTES_MAX bytes and a CR before LF.
        let window = &buf[..buf.len().min(RESP_INLINE_BYTES_MAX + 2)];
        let Some(lf) = window.iter().position(|&b| b == b'\n') else {
            let cr_may_follow = buf.len() == RESP_INLINE_BYTES_MAX + 1
                && buf.get(RESP_INLINE_BYTES_MAX) == Some(&b'\r');
            if buf.len() > RESP_INLINE_BYTES_MAX && !cr_may_follow {
                return Err(ProtocolError::TooBigInline);
            }
            return Ok(Parse::Incomplete {
                need: buf.len() + 1,
            });
        };
        let mut line = &buf[..lf];
        if let Some((b'\r', rest)) = line.split_last() {
            line = rest;
        }
        if line.len() > RESP_INLINE_BYTES_MAX {
            return Err(ProtocolError::TooBigInline);
        }
        self.split_inline(line)?;
        Ok(Parse::Complete { consumed: lf + 1 })
    }

    /// Splits an inline line into arguments the way Redis's `sdssplitargs`
    /// does. Plain words stay spans of the caller's buffer; a word with a
    /// quoted part is rewritten into the scratch buffer.
    fn split_inline(&mut self, line: &[u8]) -> Result<(), ProtocolError> {
        let mut i = 0;
        loop {
            while line.get(i).is_some_and(|&b| is_space(b)) {
                i += 1;
            }
            if i >= line.len() {
                return Ok(());
            }
            // No count check: a line of RESP_INLINE_BYTES_MAX bytes holds
            // fewer than RESP_ARGS_MAX arguments (a compile-time check in
            // `limits`), so the multibulk bound holds for inline commands.
            let start = i;
            while line
                .get(i)
                .is_some_and(|&b| !is_space(b) && b != b'"' && b != b'\'')
            {
                i += 1;
            }
            match line.get(i) {
                Some(&q) if q == b'"' || q == b'\'' => {
                    // Redis lets a quote open in the middle of a word
                    // (`a"b c"` is `ab c`); the plain part comes along.
                    let from = self.scratch.len();
                    self.scratch.extend_from_slice(&line[start..i]);
                    i = if q == b'"' {
                        self.double_quoted(line, i + 1)?
                    } else {
                        self.single_quoted(line, i + 1)?
                    };
                    let len = self.scratch.len() - from;
                    self.spans.push((from as u32 | IN_SCRATCH, len as u32));
                }
                _ => self.spans.push((start as u32, (i - start) as u32)),
            }
        }
    }

    /// Copies a double-quoted part starting at `i` (just past the quote)
    /// with its escapes resolved; returns the offset past the closing quote.
    fn double_quoted(&mut self, line: &[u8], mut i: usize) -> Result<usize, ProtocolError> {
        loop {
            let Some(&c) = line.get(i) else {
                return Err(ProtocolError::UnbalancedQuotes);
            };
            match (c, line.get(i + 1)) {
                (b'\\', Some(&e)) => {
                    let hex = match (e, line.get(i + 2), line.get(i + 3)) {
                        (b'x', Some(&h), Some(&l)) => hex_value(h).zip(hex_value(l)),
                        _ => None,
                    };
                    if let Some((h, l)) = hex {
                        self.scratch.push((h << 4) | l);
                        i += 4;
                    } else {
                        self.scratch.push(match e {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            // `\\`, `\"` and any other escaped byte: itself.
                            other => other,
                        });
                        i += 2;
                    }
                }
                (b'"', _) => return after_quote(line, i + 1),
                _ => {
                    self.scratch.push(c);
                    i += 1;
                }
            }
        }
    }

    /// Copies a single-quoted part starting at `i` (just past the quote),
    /// where only `\'` is an escape; returns the offset past the closing
    /// quote.
    fn single_quoted(&mut self, line: &[u8], mut i: usize) -> Result<usize, ProtocolError> {
        loop {
            let Some(&c) = line.get(i) else {
                return Err(ProtocolError::UnbalancedQuotes);
            };
            match (c, line.get(i + 1)) {
                (b'\\', Some(b'\'')) => {
                    self.scratch.push(b'\'');
                    i += 2;
                }
                (b'\'', _) => return after_quote(line, i + 1),
                _ => {
                    self.scratch.push(c);
                    i += 1;
                }
            }
        }
    }
}
