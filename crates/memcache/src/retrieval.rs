//! The retrieval commands (`get`, `gets`, `gat`, `gats`): their keys,
//! lines longer than [`MC_KEYS_LINE_BYTES_MAX`] taken in pieces.

use super::*;

/// Iterates over the space-separated keys of a retrieval.
pub fn keys(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ').filter(|k| !k.is_empty())
}

/// Whether a key is one memcached accepts: 1..=250 bytes, no control
/// characters or spaces.
pub fn key_ok(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MC_KEY_BYTES_MAX && key.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// What [`keys_piece`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeysPiece<'a> {
    /// No piece yet: at least this many bytes (in all) are needed.
    Incomplete {
        /// Total bytes needed before looking again.
        need: usize,
    },
    /// Whole keys of the line, taking `consumed` bytes.
    Keys {
        /// The keys, space-separated; each at most [`MC_KEY_BYTES_MAX`].
        keys: &'a [u8],
        /// Bytes of the input taken.
        consumed: usize,
        /// The line ended with these keys (its newline was consumed).
        last: bool,
    },
    /// A key over [`MC_KEY_BYTES_MAX`] in these `consumed` bytes: the line
    /// is refused ([`BAD_FORMAT`]) and, unless `last`, the rest of it
    /// discarded through its newline.
    TooLong {
        /// Bytes of the input taken.
        consumed: usize,
        /// The line ended within them.
        last: bool,
    },
}

/// The next piece of a retrieval line that [`parse`] began with `more`:
/// its keys through the newline when that is within
/// [`MC_KEYS_LINE_BYTES_MAX`] bytes, else the whole keys among the first
/// [`MC_KEYS_LINE_BYTES_MAX`] bytes (a key cut by that bound stays for
/// the next piece).
pub fn keys_piece(input: &[u8]) -> KeysPiece<'_> {
    let window = &input[..input.len().min(MC_KEYS_LINE_BYTES_MAX + 2)];
    if let Some(nl) = window.iter().position(|&b| b == b'\n') {
        let line = &input[..nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() <= MC_KEYS_LINE_BYTES_MAX {
            return checked_piece(line, nl + 1, true);
        }
    } else if input.len() <= MC_KEYS_LINE_BYTES_MAX + 1 {
        return KeysPiece::Incomplete {
            need: input.len() + 1,
        };
    }
    let piece = &input[..MC_KEYS_LINE_BYTES_MAX];
    match piece.iter().rposition(|&b| b == b' ') {
        Some(i) => checked_piece(&piece[..i], i + 1, false),
        // One word of 64 KiB: a key over every bound.
        None => KeysPiece::TooLong {
            consumed: piece.len(),
            last: false,
        },
    }
}

pub(crate) fn checked_piece(keys: &[u8], consumed: usize, last: bool) -> KeysPiece<'_> {
    if keys_too_long(keys) {
        KeysPiece::TooLong { consumed, last }
    } else {
        KeysPiece::Keys {
            keys,
            consumed,
            last,
        }
    }
}

pub(crate) fn keys_too_long(keys: &[u8]) -> bool {
    self::keys(keys).any(|k| k.len() > MC_KEY_BYTES_MAX)
}

/// The first piece of a retrieval line longer than the bound on what is
/// held (`piece` is its first [`MC_KEYS_LINE_BYTES_MAX`] bytes): its whole
/// keys, the rest of the line left for [`keys_piece`]. A refusal here
/// discards the rest of the line too.
pub(crate) fn long_retrieval(piece: &[u8]) -> Parse<'_> {
    let (name, rest) = split_word(piece);
    let cas = matches!(name, b"gets" | b"gats");
    let (exptime, keys) = if matches!(name, b"gat" | b"gats") {
        let (t, keys) = split_word(rest);
        (parse_i64(t).ok_or(INVALID_EXPTIME), keys)
    } else {
        (Ok(0), rest)
    };
    // Cut after the last space: a key the bound cuts is left whole for
    // the next piece.
    let cut = keys.iter().rposition(|&b| b == b' ');
    let consumed = cut.map_or(piece.len(), |i| piece.len() - keys.len() + i + 1);
    let keys = &keys[..cut.unwrap_or(keys.len())];
    let refused = |reply| Parse::Complete {
        consumed,
        cmd: Command::Refused(Refusal {
            reply,
            swallow: 0,
            noreply: false,
            close: false,
            skip_line: true,
        }),
    };
    let exptime = match exptime {
        Ok(t) => t,
        Err(reply) => return refused(reply),
    };
    // A word as long as the piece is a key over every bound.
    if cut.is_none() || keys_too_long(keys) {
        return refused(BAD_FORMAT);
    }
    let cmd = if matches!(name, b"gat" | b"gats") {
        Command::Gat {
            exptime,
            keys,
            cas,
            more: true,
        }
    } else {
        Command::Get {
            keys,
            cas,
            more: true,
        }
    };
    Parse::Complete { consumed, cmd }
}

/// Whether memcached closes the connection, without a reply, at this
/// line: an unknown command whose last word (of the first 23, its token
/// bound) starts `HTTP/`, a web client at the wrong port. Names memcached
/// dispatches on their first letter (`g`, `s`, `a`, `c`, `i`, `d`, `t`,
/// two-letter `m`) are answered `ERROR` instead, as there.
pub(crate) fn http_request_line(name: &[u8], t: &[&[u8]]) -> bool {
    let dispatched = matches!(
        name.first(),
        Some(b'g' | b's' | b'a' | b'c' | b'i' | b'd' | b't')
    ) || (name.len() == 2 && name[0] == b'm');
    let last = match t.len().min(MC_TOKENS_MAX - 2) {
        0 => name,
        n => t[n - 1],
    };
    name.len() >= 2 && !dispatched && last.starts_with(b"HTTP/")
}

pub(crate) fn is_retrieval(input: &[u8]) -> bool {
    [&b"get "[..], b"gets ", b"gat ", b"gats "]
        .iter()
        .any(|p| input.starts_with(p))
}

pub(crate) fn keys_present(keys: &[u8]) -> bool {
    self::keys(keys).next().is_some()
}

pub(crate) fn retrieval(keys: &[u8], cas: bool) -> Command<'_> {
    if !keys_present(keys) {
        return refuse(ERROR);
    }
    if keys_too_long(keys) {
        return refuse(BAD_FORMAT);
    }
    Command::Get {
        keys,
        cas,
        more: false,
    }
}

/// `gat`/`gats`: an exptime, then any number of keys (none answers just
/// `END`, as in memcached).
pub(crate) fn touching_retrieval(rest: &[u8], cas: bool) -> Command<'_> {
    let (t, keys) = split_word(rest);
    if t.is_empty() {
        return refuse(ERROR);
    }
    let Some(exptime) = parse_i64(t) else {
        return refuse(INVALID_EXPTIME);
    };
    if keys_too_long(keys) {
        return refuse(BAD_FORMAT);
    }
    Command::Gat {
        exptime,
        keys,
        cas,
        more: false,
    }
}
