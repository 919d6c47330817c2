//! Protocol errors, worded as Redis words them so that clients and tests
//! written against Redis see the text they expect.

use std::fmt;

use crate::limits::RESP_COMMAND_BYTES_MAX;

/// Why the bytes at the front of a receive buffer are not a command.
///
/// Every variant is fatal for the connection: the stream cannot be
/// resynchronised, so the server answers with [`ProtocolError::write_reply`]
/// and closes it, as Redis does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolError {
    /// A `*N` header whose number is malformed.
    InvalidMultibulkLength,
    /// A `$L` header whose number is malformed, negative or above
    /// `RESP_BULK_BYTES_MAX`, or a bulk payload not followed by CRLF.
    InvalidBulkLength,
    /// Something other than `$` where a bulk argument must start.
    ExpectedDollar(u8),
    /// An inline line longer than `RESP_INLINE_BYTES_MAX`.
    TooBigInline,
    /// An inline line with an unclosed quote, or a closing quote followed by
    /// something other than whitespace.
    UnbalancedQuotes,
    /// A `*N` header longer than `RESP_LENGTH_DIGITS_MAX` characters.
    TooBigMbulkCount,
    /// A command that would take more than `RESP_COMMAND_BYTES_MAX` bytes,
    /// including a `*N` header above `RESP_ARGS_MAX` (that many arguments
    /// cannot fit).
    CommandTooBig,
    /// A `*N` header above `RESP_UNAUTH_ARGS_MAX` from a connection that
    /// must authenticate first.
    UnauthenticatedMultibulkLength,
    /// A `$L` header above `RESP_UNAUTH_BULK_BYTES_MAX` from a connection
    /// that must authenticate first.
    UnauthenticatedBulkLength,
}

impl ProtocolError {
    /// Appends the reply Redis sends before closing the connection:
    /// `-ERR <message>\r\n`. Writes straight into `out`, so the error path
    /// allocates nothing beyond the output buffer's growth.
    pub fn write_reply(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"-ERR ");
        let at = out.len();
        // Writing into a Vec cannot fail.
        let _ = std::io::Write::write_fmt(out, format_args!("{self}"));
        // Display never writes CR or LF (bytes are escaped), but the reply
        // framing depends on it, so it is enforced here as well.
        for b in &mut out[at..] {
            if *b == b'\r' || *b == b'\n' {
                *b = b' ';
            }
        }
        out.extend_from_slice(b"\r\n");
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Protocol error: ")?;
        match self {
            Self::InvalidMultibulkLength => f.write_str("invalid multibulk length"),
            Self::InvalidBulkLength => f.write_str("invalid bulk length"),
            Self::ExpectedDollar(b) => {
                f.write_str("expected '$', got '")?;
                // Redis writes the raw byte; a reply line must stay valid
                // text without CR or LF, so only printable ASCII goes as is.
                if b.is_ascii_graphic() || *b == b' ' {
                    write!(f, "{}", char::from(*b))?;
                } else {
                    write!(f, "\\x{b:02x}")?;
                }
                f.write_str("'")
            }
            Self::TooBigInline => f.write_str("too big inline request"),
            Self::UnbalancedQuotes => f.write_str("unbalanced quotes in request"),
            Self::TooBigMbulkCount => f.write_str("too big mbulk count string"),
            Self::CommandTooBig => {
                write!(f, "command larger than {RESP_COMMAND_BYTES_MAX} bytes")
            }
            Self::UnauthenticatedMultibulkLength => f.write_str("unauthenticated multibulk length"),
            Self::UnauthenticatedBulkLength => f.write_str("unauthenticated bulk length"),
        }
    }
}

impl std::error::Error for ProtocolError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_use_redis_wording() {
        let cases = [
            (
                ProtocolError::InvalidMultibulkLength,
                "Protocol error: invalid multibulk length",
            ),
            (
                ProtocolError::InvalidBulkLength,
                "Protocol error: invalid bulk length",
            ),
            (
                ProtocolError::ExpectedDollar(b'X'),
                "Protocol error: expected '$', got 'X'",
            ),
            (
                ProtocolError::TooBigInline,
                "Protocol error: too big inline request",
            ),
            (
                ProtocolError::UnbalancedQuotes,
                "Protocol error: unbalanced quotes in request",
            ),
            (
                ProtocolError::TooBigMbulkCount,
                "Protocol error: too big mbulk count string",
            ),
            (
                ProtocolError::CommandTooBig,
                "Protocol error: command larger than 8388608 bytes",
            ),
            (
                ProtocolError::UnauthenticatedMultibulkLength,
                "Protocol error: unauthenticated multibulk length",
            ),
            (
                ProtocolError::UnauthenticatedBulkLength,
                "Protocol error: unauthenticated bulk length",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
            let mut out = b"+OK\r\n".to_vec();
            e.write_reply(&mut out);
            assert_eq!(out, format!("+OK\r\n-ERR {text}\r\n").as_bytes());
        }
    }

    #[test]
    fn unprintable_bytes_are_escaped() {
        for (b, shown) in [
            (b'\r', "\\x0d"),
            (b'\n', "\\x0a"),
            (0xff, "\\xff"),
            (b' ', " "),
        ] {
            let e = ProtocolError::ExpectedDollar(b);
            assert_eq!(
                e.to_string(),
                format!("Protocol error: expected '$', got '{shown}'")
            );
            let mut out = Vec::new();
            e.write_reply(&mut out);
            assert!(!out[..out.len() - 2].contains(&b'\r'));
            assert!(!out[..out.len() - 2].contains(&b'\n'));
        }
    }
}
