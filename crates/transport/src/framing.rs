//! Length-prefix framing for byte-stream transports (sans-I/O).
//!
//! Each message travels as a 4-byte little-endian length followed by that
//! many bytes. A length of zero or above `MESSAGE_BYTES_MAX` is corrupt
//! framing: the stream cannot be resynchronised and must be closed.

use fabrickv_types::limits::MESSAGE_BYTES_MAX;

/// Bytes of the length prefix.
pub const PREFIX_BYTES: usize = 4;

/// What the front of a receive buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// A whole message: its bytes are `buf[PREFIX_BYTES..PREFIX_BYTES+len]`.
    Message(usize),
    /// Not enough bytes yet; at least this many more are needed.
    NeedMore(usize),
    /// The announced length breaks the bounds.
    Corrupt(u32),
}

/// Looks at the front of `buf`.
#[inline]
pub fn next(buf: &[u8]) -> Next {
    if buf.len() < PREFIX_BYTES {
        return Next::NeedMore(PREFIX_BYTES - buf.len());
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len == 0 || len as usize > MESSAGE_BYTES_MAX {
        return Next::Corrupt(len);
    }
    let total = PREFIX_BYTES + len as usize;
    if buf.len() < total {
        Next::NeedMore(total - buf.len())
    } else {
        Next::Message(len as usize)
    }
}

/// Appends a placeholder prefix and returns where the message starts.
#[inline]
pub fn begin(out: &mut Vec<u8>) -> usize {
    out.extend_from_slice(&[0; PREFIX_BYTES]);
    out.len()
}

/// Patches the prefix of the message begun at `start`. An empty message is
/// removed (nothing to send); an oversized one is removed and reported.
#[inline]
pub fn finish(out: &mut Vec<u8>, start: usize) -> Result<bool, usize> {
    let len = out.len() - start;
    if len == 0 {
        out.truncate(start - PREFIX_BYTES);
        return Ok(false);
    }
    if len > MESSAGE_BYTES_MAX {
        out.truncate(start - PREFIX_BYTES);
        return Err(len);
    }
    out[start - PREFIX_BYTES..start].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_unframes() {
        let mut out = Vec::new();
        let s = begin(&mut out);
        out.extend_from_slice(b"hello");
        assert_eq!(finish(&mut out, s), Ok(true));
        let s = begin(&mut out);
        assert_eq!(finish(&mut out, s), Ok(false), "empty messages are dropped");
        assert_eq!(next(&out), Next::Message(5));
        assert_eq!(&out[PREFIX_BYTES..], b"hello");
        assert_eq!(next(&out[..6]), Next::NeedMore(3));
        assert_eq!(next(&out[..2]), Next::NeedMore(2));
    }

    #[test]
    fn rejects_bad_lengths() {
        assert_eq!(next(&[0, 0, 0, 0]), Next::Corrupt(0));
        assert_eq!(next(&u32::MAX.to_le_bytes()), Next::Corrupt(u32::MAX));
        let mut out = Vec::new();
        let s = begin(&mut out);
        out.resize(s + MESSAGE_BYTES_MAX + 1, 0);
        assert_eq!(finish(&mut out, s), Err(MESSAGE_BYTES_MAX + 1));
        assert!(out.is_empty());
    }
}
