//! A command's arguments and the bounds checked on them (key and value
//! sizes, integers, expiry times, the size of a reply).

use fabrickv_resp::reply as resp;
use fabrickv_resp::{parse_i64, CommandParser};
use fabrickv_types::limits::KEY_BYTES_MAX;

use super::RESP_REPLY_BYTES_MAX;

/// The arguments of one parsed command.
#[derive(Clone, Copy)]
pub(super) struct Args<'a> {
    /// The parser that found the command; it holds the argument spans.
    pub(super) parser: &'a CommandParser,
    /// The command's bytes, which the spans index.
    pub(super) buf: &'a [u8],
}

impl<'a> Args<'a> {
    pub(super) fn len(&self) -> usize {
        self.parser.argc()
    }

    pub(super) fn get(&self, i: usize) -> &'a [u8] {
        self.parser.arg(self.buf, i)
    }
}

pub(super) const NOT_INTEGER: &str = "ERR value is not an integer or out of range";

pub(super) fn int_arg(s: &[u8]) -> Result<i64, &'static str> {
    parse_i64(s).ok_or(NOT_INTEGER)
}

/// Whether `key` is a key the in-memory kv can hold: 1 to
/// [`KEY_BYTES_MAX`] bytes, the native protocol's rule (which answers
/// both an empty and a long key with `KEY_TOO_LONG`), so that a key one
/// front end stores is one the other can read. Otherwise the error reply
/// that says so is written to `out`.
pub(super) fn check_key(key: &[u8], out: &mut Vec<u8>) -> bool {
    if key.is_empty() {
        resp::error(
            out,
            &format!("ERR empty key; FabricKV keys are 1 to {KEY_BYTES_MAX} bytes"),
        );
        return false;
    }
    within(key, KEY_BYTES_MAX, "FabricKV", "key", out)
}

/// Whether `key` could be stored at all (see [`check_key`]); the commands
/// over many keys (MGET, DEL, EXISTS) treat one that could not as absent,
/// as they do a key over the bound.
pub(super) fn storable_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= KEY_BYTES_MAX
}

/// Whether `bytes` (a `what` of a `whose` store) is at most `max` bytes;
/// otherwise the error reply that says so is written to `out`.
pub(super) fn within(bytes: &[u8], max: usize, whose: &str, what: &str, out: &mut Vec<u8>) -> bool {
    if bytes.len() > max {
        let n = bytes.len();
        resp::error(
            out,
            &format!("ERR {what} is {n} bytes; {whose} {what}s are at most {max} bytes"),
        );
        return false;
    }
    true
}

/// Whether the MGET reply begun at `mark` in `out` is still within
/// [`RESP_REPLY_BYTES_MAX`]; otherwise it is replaced by the error reply
/// that says so.
pub(super) fn mget_fits(out: &mut Vec<u8>, mark: usize) -> bool {
    if out.len() - mark > RESP_REPLY_BYTES_MAX {
        out.truncate(mark);
        resp::error(
            out,
            &format!(
                "ERR MGET reply would exceed {RESP_REPLY_BYTES_MAX} bytes; ask for fewer keys"
            ),
        );
        return false;
    }
    true
}

/// Longest argument quoted back in an "unknown command" error, in bytes.
pub(super) const ERROR_ARG_QUOTE_BYTES_MAX: usize = 128;

/// An argument quoted back in an error, cut at
/// [`ERROR_ARG_QUOTE_BYTES_MAX`] bytes.
pub(super) fn quoted(arg: &[u8]) -> String {
    let mut s = String::new();
    quote_arg(&mut s, arg);
    s
}

pub(super) fn quote_arg(msg: &mut String, arg: &[u8]) {
    let cut = &arg[..arg.len().min(ERROR_ARG_QUOTE_BYTES_MAX)];
    msg.push_str(&String::from_utf8_lossy(cut));
}
