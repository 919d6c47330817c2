//! A sans-I/O parser for memcached's text protocol and its meta commands.
//!
//! [`parse`] takes the bytes a connection has buffered and returns either
//! how many more it needs, or one complete [`Command`] (borrowing keys and
//! data from the input) with the number of bytes it took. It never
//! allocates and never reads past a bound: a command line is at most
//! [`MC_LINE_BYTES_MAX`] bytes, a value at most [`MC_VALUE_BYTES_MAX`].
//! A retrieval line (`get k1 k2 ...`) may be any length, as in memcached:
//! one longer than [`MC_KEYS_LINE_BYTES_MAX`] comes back in pieces, the
//! first from [`parse`] (`more: true`), the rest from [`keys_piece`], so
//! that no more than that bound of it is ever held. Refusals carry the
//! reply memcached gives for the same input, and how many bytes of data
//! follow that must be thrown away unread ([`Refusal::swallow`]).
//!
//! Executing the commands is the server's business (`fabrickv-server`'s
//! `memcache` module).

use fabrickv_types::limits::{KEY_BYTES_MAX, VALUE_BYTES_MAX};

/// Longest command line, in bytes, without its line ending: memcached's
/// own bound for a line that is not a retrieval (2048).
pub const MC_LINE_BYTES_MAX: usize = 2048;

/// Most bytes of a retrieval line (`get`, `gets`, `gat`, `gats` with many
/// keys) held at once. memcached reads such lines whatever their length
/// (a client sent 18,725 keys, 187 KB, in one); a longer line is answered
/// a piece of at most this many bytes at a time ([`keys_piece`]), so the
/// input buffer stays bounded however long the line.
pub const MC_KEYS_LINE_BYTES_MAX: usize = 64 << 10;

/// Longest key, in bytes (memcached's `KEY_MAX_LENGTH`, 250, which is
/// also the engine's bound).
pub const MC_KEY_BYTES_MAX: usize = KEY_BYTES_MAX;

/// Largest value a storage command may carry, in bytes: the engine's.
pub const MC_VALUE_BYTES_MAX: usize = VALUE_BYTES_MAX;

/// Most tokens a command line other than a retrieval may have (memcached's
/// `MAX_TOKENS` is 24); meta commands' flags count.
pub const MC_TOKENS_MAX: usize = 24;

/// Relative expiry times above this many seconds (30 days) are absolute
/// unix times, as in memcached.
pub const MC_RELATIVE_EXPTIME_SECS_MAX: i64 = 30 * 24 * 3600;

/// The longest a key is once base64-decoded, in bytes.
pub const MC_BASE64_KEY_BYTES_MAX: usize = MC_KEY_BYTES_MAX;

/// Longest data length a storage line may announce, in bytes: memcached
/// reads it as a 32-bit int and adds the CRLF (`INT_MAX - 2`). A longer
/// one (`set k 0 0 4294967295`) makes the line bad (`CLIENT_ERROR bad
/// command line format`) and nothing is swallowed; a length between
/// [`MC_VALUE_BYTES_MAX`] and this is refused as too large and its data
/// swallowed as it arrives (never buffered), as memcached does.
pub const MC_DATA_LENGTH_BYTES_MAX: u64 = i32::MAX as u64 - 2;

/// Slab class ids `stats cachedump` accepts are below this (memcached's
/// `MAX_NUMBER_OF_SLAB_CLASSES`).
pub const MC_SLAB_CLASSES_MAX: u32 = 64;

const _: () = assert!(MC_DATA_LENGTH_BYTES_MAX >= MC_VALUE_BYTES_MAX as u64);

const _: () = assert!(MC_KEYS_LINE_BYTES_MAX >= MC_LINE_BYTES_MAX);

/// Bytes the largest command (a storage line, its value and CRLF) takes.
pub const MC_COMMAND_BYTES_MAX: usize = MC_KEYS_LINE_BYTES_MAX + 2 + MC_VALUE_BYTES_MAX + 2;

mod command;
mod encoding;
mod errors;
mod meta;
mod retrieval;
mod simple;
mod storage;
mod tokens;

pub use command::*;
pub use encoding::*;
pub use errors::*;
use meta::*;
pub use retrieval::*;
use simple::*;
use storage::*;
pub use tokens::*;

pub(crate) fn refuse(reply: &'static str) -> Command<'static> {
    refuse_quietly(reply, false)
}

/// A refusal that `noreply` silences: memcached reads `noreply` before it
/// checks the rest of a classic command's line, so its errors are not
/// sent either (a client that asked for no reply reads none).
pub(crate) fn refuse_quietly(reply: &'static str, noreply: bool) -> Command<'static> {
    Command::Refused(Refusal {
        reply,
        swallow: 0,
        noreply,
        close: false,
        skip_line: false,
    })
}

/// A command line over its bound, refused after `consumed` bytes: the
/// connection closes after the reply, its framing lost.
fn line_too_long(consumed: usize) -> Parse<'static> {
    Parse::Complete {
        consumed,
        cmd: Command::Refused(Refusal {
            reply: LINE_TOO_LONG,
            swallow: 0,
            noreply: false,
            close: true,
            skip_line: false,
        }),
    }
}

/// Parses one command at the start of `input`.
pub fn parse(input: &[u8]) -> Parse<'_> {
    let limit = if is_retrieval(input) {
        MC_KEYS_LINE_BYTES_MAX
    } else {
        MC_LINE_BYTES_MAX
    };
    let window = &input[..input.len().min(limit + 2)];
    let nl = window.iter().position(|&b| b == b'\n');
    if limit == MC_KEYS_LINE_BYTES_MAX && input.len() > limit + 1 {
        let line_len = |nl: usize| nl - usize::from(nl > 0 && input[nl - 1] == b'\r');
        if nl.is_none_or(|nl| line_len(nl) > limit) {
            return long_retrieval(&input[..limit]);
        }
    }
    let Some(nl) = nl else {
        if input.len() > limit + 1 {
            return line_too_long(input.len());
        }
        return Parse::Incomplete {
            need: input.len() + 1,
        };
    };
    let line_end = nl + 1;
    let line = &input[..nl];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() > limit {
        return line_too_long(line_end);
    }
    let (name, rest) = split_word(line);
    let done = |cmd| Parse::Complete {
        consumed: line_end,
        cmd,
    };
    match name {
        b"get" | b"gets" => done(retrieval(rest, name == b"gets")),
        b"gat" | b"gats" => done(touching_retrieval(rest, name == b"gats")),
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
            storage(input, line_end, name, rest)
        }
        b"ms" => meta_set(input, line_end, rest),
        b"mg" => done(meta(MetaKind::Get, rest)),
        b"md" => done(meta(MetaKind::Delete, rest)),
        b"ma" => done(meta(MetaKind::Arith, rest)),
        b"mn" => done(Command::MetaNoop),
        _ => {
            let t = tokens::<MC_TOKENS_MAX>(rest);
            let Some(t) = t else {
                return done(refuse(ERROR));
            };
            done(simple(name, &t.items[..t.len]))
        }
    }
}

#[cfg(test)]
mod tests;
