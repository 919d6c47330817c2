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

/// `ERROR`: an unknown command.
pub const ERROR: &str = "ERROR";
/// A line that is not what its command takes.
pub const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
/// A value not followed by CRLF where its length says.
pub const BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk";
/// A value over [`MC_VALUE_BYTES_MAX`] (or the engine's room).
pub const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";
/// A store-mode pool with no room left.
pub const NO_MEMORY: &str = "SERVER_ERROR out of memory storing object";
/// incr/decr of a value that is not a decimal number.
pub const NON_NUMERIC: &str = "CLIENT_ERROR cannot increment or decrement non-numeric value";
/// incr/decr whose delta is not a number.
pub const BAD_DELTA: &str = "CLIENT_ERROR invalid numeric delta argument";
/// A line longer than its bound.
pub const LINE_TOO_LONG: &str = "CLIENT_ERROR line too long";
/// A meta flag this server does not support, or a malformed one.
pub const INVALID_FLAG: &str = "CLIENT_ERROR invalid flag";
/// A meta mode this command does not have.
pub const INVALID_MODE: &str = "CLIENT_ERROR invalid mode for ms STORE";
/// A key over [`MC_KEY_BYTES_MAX`] or, base64, not decodable.
pub const KEY_TOO_LONG: &str = "CLIENT_ERROR bad command line format";
/// An expiry time that is not a number (`touch`, `gat`, `flush_all`).
pub const INVALID_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";
/// `delete` with a second word other than `0` or `noreply`.
pub const DELETE_USAGE: &str =
    "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";
/// `stats cachedump` with fewer than two arguments.
pub const BAD_LINE: &str = "CLIENT_ERROR bad command line";
/// `stats cachedump` of a class id at or over [`MC_SLAB_CLASSES_MAX`].
pub const ILLEGAL_SLAB_ID: &str = "CLIENT_ERROR Illegal slab id";

/// What [`parse`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse<'a> {
    /// No complete command yet: at least this many bytes (in all, from the
    /// start of the input) are needed.
    Incomplete {
        /// Total bytes needed before parsing again.
        need: usize,
    },
    /// A complete command, or a refusal, taking `consumed` bytes.
    Complete {
        /// Bytes of the input this command took.
        consumed: usize,
        /// The command.
        cmd: Command<'a>,
    },
}

/// How a storage command combines with what is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// `set`: always.
    Set,
    /// `add`: only if absent.
    Add,
    /// `replace`: only if present.
    Replace,
    /// `append`: after the stored value, if present.
    Append,
    /// `prepend`: before the stored value, if present.
    Prepend,
    /// `cas`: only if the stored CAS value is the one given.
    Cas,
}

/// A refused command: the reply, and what to do after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The reply line, without CRLF.
    pub reply: &'static str,
    /// Bytes that follow the consumed ones and must be discarded unread
    /// (the data of a storage command refused for its size).
    pub swallow: usize,
    /// The reply is not sent (`noreply`, or a close without a reply).
    pub noreply: bool,
    /// The stream cannot be trusted any more: close once replied.
    pub close: bool,
    /// The refused line goes on past the bytes consumed (a retrieval line
    /// longer than [`MC_KEYS_LINE_BYTES_MAX`]): discard through its newline.
    pub skip_line: bool,
}

/// One command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// `get`/`gets` (`cas`) of the space-separated `keys`.
    Get {
        /// The keys, space-separated (see [`keys`]); each at most
        /// [`MC_KEY_BYTES_MAX`] bytes.
        keys: &'a [u8],
        /// `gets`: with CAS values.
        cas: bool,
        /// The line goes on past these keys: read the rest with
        /// [`keys_piece`] (a line over [`MC_KEYS_LINE_BYTES_MAX`]).
        more: bool,
    },
    /// `gat`/`gats`: get and touch.
    Gat {
        /// The new expiry time.
        exptime: i64,
        /// The keys, space-separated (see [`keys`]); may be none.
        keys: &'a [u8],
        /// `gats`: with CAS values.
        cas: bool,
        /// The line goes on past these keys (see [`Command::Get`]).
        more: bool,
    },
    /// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
    Store {
        /// How it combines.
        mode: StoreMode,
        /// The key.
        key: &'a [u8],
        /// The client flags.
        flags: u32,
        /// The expiry time as given.
        exptime: i64,
        /// The value.
        data: &'a [u8],
        /// `cas`: the CAS value to compare.
        cas_unique: u64,
        /// No reply.
        noreply: bool,
    },
    /// `delete`.
    Delete {
        /// The key.
        key: &'a [u8],
        /// No reply.
        noreply: bool,
    },
    /// `incr` (`incr` true) or `decr`.
    Arith {
        /// incr or decr.
        incr: bool,
        /// The key.
        key: &'a [u8],
        /// The amount.
        delta: u64,
        /// No reply.
        noreply: bool,
    },
    /// `touch`.
    Touch {
        /// The key.
        key: &'a [u8],
        /// The new expiry time.
        exptime: i64,
        /// No reply.
        noreply: bool,
    },
    /// `flush_all [delay]`.
    FlushAll {
        /// Seconds (or a unix time) before the flush takes effect.
        delay: i64,
        /// No reply.
        noreply: bool,
    },
    /// `version`.
    Version,
    /// `verbosity`.
    Verbosity {
        /// No reply.
        noreply: bool,
    },
    /// `stats [group]`.
    Stats {
        /// The group asked for, if any.
        group: Option<&'a [u8]>,
    },
    /// `quit`.
    Quit,
    /// A meta command.
    Meta(Meta<'a>),
    /// `mn`.
    MetaNoop,
    /// A storage command (`set`, ..., `ms`) whose data is over
    /// [`MC_VALUE_BYTES_MAX`]: answered [`TOO_LARGE`] and its data
    /// swallowed. memcached also removes the key's old value when the
    /// command is `set` or `ms` (so a failed write never leaves a stale
    /// value readable).
    TooLarge {
        /// The key as sent (base64 when `base64`).
        key: &'a [u8],
        /// The key is base64 (`ms ... b`).
        base64: bool,
        /// Remove the key's old value (`set`, `ms`).
        unlink: bool,
        /// Bytes that follow, to discard unread: the data and its CRLF.
        swallow: usize,
        /// No reply (`noreply`).
        noreply: bool,
    },
    /// A refused line.
    Refused(Refusal),
}

/// Which meta command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaKind {
    /// `mg`.
    Get,
    /// `ms`.
    Set,
    /// `md`.
    Delete,
    /// `ma`.
    Arith,
}

/// A meta command: its key, its flags (parsed and, for echoing in order,
/// raw), and an `ms`'s data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta<'a> {
    /// Which command.
    pub kind: MetaKind,
    /// The key as sent (base64 when `flags.base64`).
    pub key: &'a [u8],
    /// The flags.
    pub flags: MetaFlags<'a>,
    /// `ms`: the value.
    pub data: &'a [u8],
}

/// The flags of a meta command, parsed. Return flags are echoed in the
/// order of `raw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaFlags<'a> {
    /// The flag tokens as sent, space-separated.
    pub raw: &'a [u8],
    /// `b`: the key is base64.
    pub base64: bool,
    /// `q`: quiet.
    pub quiet: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `O`: opaque token to echo.
    pub opaque: Option<&'a [u8]>,
    /// `T`: new TTL (seconds as in exptime).
    pub ttl: Option<i64>,
    /// `F`: client flags to store.
    pub client_flags: Option<u32>,
    /// `C`: CAS value to compare.
    pub compare_cas: Option<u64>,
    /// `E`: the CAS value to give the item written (`ms`, `ma`).
    pub new_cas: Option<u64>,
    /// `M`: mode character.
    pub mode: Option<u8>,
    /// `N`: vivify on miss with this TTL (`ma`).
    pub vivify: Option<i64>,
    /// `J`: initial value for a vivified `ma`.
    pub initial: Option<u64>,
    /// `D`: `ma` delta.
    pub delta: Option<u64>,
}

/// Iterates over the space-separated keys of a retrieval.
pub fn keys(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ').filter(|k| !k.is_empty())
}

/// Whether a key is one memcached accepts: 1..=250 bytes, no control
/// characters or spaces.
pub fn key_ok(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MC_KEY_BYTES_MAX && key.iter().all(|&b| b > b' ' && b != 0x7f)
}

fn refuse(reply: &'static str) -> Command<'static> {
    refuse_quietly(reply, false)
}

/// A refusal that `noreply` silences: memcached reads `noreply` before it
/// checks the rest of a classic command's line, so its errors are not
/// sent either (a client that asked for no reply reads none).
fn refuse_quietly(reply: &'static str, noreply: bool) -> Command<'static> {
    Command::Refused(Refusal {
        reply,
        swallow: 0,
        noreply,
        close: false,
        skip_line: false,
    })
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

fn checked_piece(keys: &[u8], consumed: usize, last: bool) -> KeysPiece<'_> {
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

fn keys_too_long(keys: &[u8]) -> bool {
    self::keys(keys).any(|k| k.len() > MC_KEY_BYTES_MAX)
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
            return Parse::Complete {
                consumed: input.len(),
                cmd: Command::Refused(Refusal {
                    reply: LINE_TOO_LONG,
                    swallow: 0,
                    noreply: false,
                    close: true,
                    skip_line: false,
                }),
            };
        }
        return Parse::Incomplete {
            need: input.len() + 1,
        };
    };
    let line_end = nl + 1;
    let line = &input[..nl];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() > limit {
        return Parse::Complete {
            consumed: line_end,
            cmd: Command::Refused(Refusal {
                reply: LINE_TOO_LONG,
                swallow: 0,
                noreply: false,
                close: true,
                skip_line: false,
            }),
        };
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

/// The first piece of a retrieval line longer than the bound on what is
/// held (`piece` is its first [`MC_KEYS_LINE_BYTES_MAX`] bytes): its whole
/// keys, the rest of the line left for [`keys_piece`]. A refusal here
/// discards the rest of the line too.
fn long_retrieval(piece: &[u8]) -> Parse<'_> {
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
fn http_request_line(name: &[u8], t: &[&[u8]]) -> bool {
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

fn is_retrieval(input: &[u8]) -> bool {
    [&b"get "[..], b"gets ", b"gat ", b"gats "]
        .iter()
        .any(|p| input.starts_with(p))
}

fn keys_present(keys: &[u8]) -> bool {
    self::keys(keys).next().is_some()
}

fn retrieval(keys: &[u8], cas: bool) -> Command<'_> {
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
fn touching_retrieval(rest: &[u8], cas: bool) -> Command<'_> {
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

/// The first space-separated word and what follows it.
fn split_word(s: &[u8]) -> (&[u8], &[u8]) {
    let s = trim_start(s);
    match s.iter().position(|&b| b == b' ') {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, &[]),
    }
}

fn trim_start(mut s: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = s {
        s = rest;
    }
    s
}

struct Tokens<'a, const N: usize> {
    items: [&'a [u8]; N],
    len: usize,
}

/// Up to `N` space-separated tokens; `None` when there are more.
fn tokens<const N: usize>(s: &[u8]) -> Option<Tokens<'_, N>> {
    let mut t = Tokens {
        items: [&[][..]; N],
        len: 0,
    };
    for w in s.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
        if t.len == N {
            return None;
        }
        t.items[t.len] = w;
        t.len += 1;
    }
    Some(t)
}

/// A decimal u64 (digits only, no sign, no overflow).
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// A decimal i64 with an optional minus sign.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    match s {
        [b'-', rest @ ..] => {
            let v = parse_u64(rest)?;
            0i64.checked_sub_unsigned(v)
        }
        _ => i64::try_from(parse_u64(s)?).ok(),
    }
}

fn parse_u32(s: &[u8]) -> Option<u32> {
    u32::try_from(parse_u64(s)?).ok()
}

fn storage<'a>(input: &'a [u8], line_end: usize, name: &[u8], rest: &'a [u8]) -> Parse<'a> {
    let mode = match name {
        b"set" => StoreMode::Set,
        b"add" => StoreMode::Add,
        b"replace" => StoreMode::Replace,
        b"append" => StoreMode::Append,
        b"prepend" => StoreMode::Prepend,
        _ => StoreMode::Cas,
    };
    let Some(t) = tokens::<7>(rest) else {
        return Parse::Complete {
            consumed: line_end,
            cmd: refuse(ERROR),
        };
    };
    let t = &t.items[..t.len];
    let fixed = if mode == StoreMode::Cas { 5 } else { 4 };
    // memcached takes one more word and reads it as noreply only when it
    // is that word; with no data announced it cannot swallow anything.
    let noreply = t.len() == fixed + 1 && t[fixed] == b"noreply";
    let bad = |reply| Parse::Complete {
        consumed: line_end,
        cmd: refuse_quietly(reply, noreply),
    };
    if t.len() != fixed && t.len() != fixed + 1 {
        return bad(ERROR);
    }
    let key = t[0];
    let (Some(flags), Some(exptime), Some(bytes)) =
        (parse_u32(t[1]), parse_i64(t[2]), parse_i64(t[3]))
    else {
        return bad(BAD_FORMAT);
    };
    let cas_unique = if mode == StoreMode::Cas {
        match parse_u64(t[4]) {
            Some(c) => c,
            None => return bad(BAD_FORMAT),
        }
    } else {
        0
    };
    if bytes < 0 || bytes as u64 > MC_DATA_LENGTH_BYTES_MAX || key.len() > MC_KEY_BYTES_MAX {
        return bad(BAD_FORMAT);
    }
    let bytes = bytes as u64;
    if bytes > MC_VALUE_BYTES_MAX as u64 {
        return Parse::Complete {
            consumed: line_end,
            cmd: Command::TooLarge {
                key,
                base64: false,
                unlink: mode == StoreMode::Set,
                swallow: bytes as usize + 2,
                noreply,
            },
        };
    }
    let bytes = bytes as usize;
    match data_chunk(input, line_end, bytes) {
        Err(need) => Parse::Incomplete { need },
        Ok((data, consumed)) => Parse::Complete {
            consumed,
            cmd: match data {
                Some(data) => Command::Store {
                    mode,
                    key,
                    flags,
                    exptime,
                    data,
                    cas_unique,
                    noreply,
                },
                None => refuse_quietly(BAD_CHUNK, noreply),
            },
        },
    }
}

/// The `bytes` of data after the line and their CRLF: `Ok((Some(data),
/// consumed))`, `Ok((None, consumed))` for a chunk not ended by CRLF, or
/// `Err(bytes needed)`.
fn data_chunk(
    input: &[u8],
    line_end: usize,
    bytes: usize,
) -> Result<(Option<&[u8]>, usize), usize> {
    let end = line_end + bytes + 2;
    if input.len() < end {
        return Err(end);
    }
    let data = &input[line_end..line_end + bytes];
    let ok = &input[line_end + bytes..end] == b"\r\n";
    Ok((ok.then_some(data), end))
}

/// The other classic commands, with memcached's word counts: a wrong
/// count is `ERROR` (whatever the last word); past that, a last word
/// `noreply` silences the command's errors as well as its answer.
fn simple<'a>(name: &[u8], t: &[&'a [u8]]) -> Command<'a> {
    let last_is_noreply = t.last() == Some(&&b"noreply"[..]);
    match name {
        b"delete" => {
            let zero = |i: usize| t[i] == b"0";
            let (valid, noreply) = match t.len() {
                1 => (true, false),
                2 => (zero(1) || last_is_noreply, last_is_noreply),
                3 => (zero(1) && last_is_noreply, last_is_noreply),
                _ => return refuse(ERROR),
            };
            if !valid {
                refuse_quietly(DELETE_USAGE, noreply)
            } else if t[0].len() > MC_KEY_BYTES_MAX {
                refuse_quietly(BAD_FORMAT, noreply)
            } else {
                Command::Delete { key: t[0], noreply }
            }
        }
        b"incr" | b"decr" => {
            if t.len() != 2 && t.len() != 3 {
                return refuse(ERROR);
            }
            let noreply = t.len() == 3 && last_is_noreply;
            if t[0].len() > MC_KEY_BYTES_MAX {
                return refuse_quietly(BAD_FORMAT, noreply);
            }
            match parse_u64(t[1]) {
                Some(delta) => Command::Arith {
                    incr: name == b"incr",
                    key: t[0],
                    delta,
                    noreply,
                },
                None => refuse_quietly(BAD_DELTA, noreply),
            }
        }
        b"touch" => {
            if t.len() != 2 && t.len() != 3 {
                return refuse(ERROR);
            }
            let noreply = t.len() == 3 && last_is_noreply;
            if t[0].len() > MC_KEY_BYTES_MAX {
                return refuse_quietly(BAD_FORMAT, noreply);
            }
            match parse_i64(t[1]) {
                Some(exptime) => Command::Touch {
                    key: t[0],
                    exptime,
                    noreply,
                },
                None => refuse_quietly(INVALID_EXPTIME, noreply),
            }
        }
        b"flush_all" => {
            if t.len() > 2 {
                return refuse(ERROR);
            }
            let noreply = last_is_noreply;
            // A delay is read unless the only word is noreply.
            if t.len() == usize::from(noreply) {
                return Command::FlushAll { delay: 0, noreply };
            }
            match parse_i64(t[0]) {
                Some(delay) => Command::FlushAll { delay, noreply },
                None => refuse_quietly(INVALID_EXPTIME, noreply),
            }
        }
        // memcached answers `version` whatever follows it.
        b"version" => Command::Version,
        b"verbosity" => {
            if t.len() != 1 && t.len() != 2 {
                return refuse(ERROR);
            }
            let noreply = last_is_noreply;
            match parse_u32(t[0]) {
                Some(_) => Command::Verbosity { noreply },
                None => refuse_quietly(BAD_FORMAT, noreply),
            }
        }
        b"stats" => match t {
            [] => Command::Stats { group: None },
            [g, args @ ..] if *g == b"cachedump" => match args {
                [id, limit, ..] => match (parse_u32(id), parse_u32(limit)) {
                    (Some(id), Some(_)) if id < MC_SLAB_CLASSES_MAX => {
                        Command::Stats { group: Some(g) }
                    }
                    (Some(_), Some(_)) => refuse(ILLEGAL_SLAB_ID),
                    _ => refuse(BAD_FORMAT),
                },
                _ => refuse(BAD_LINE),
            },
            // Words after the group are ignored, as in memcached.
            [g, ..] => Command::Stats { group: Some(g) },
        },
        // memcached quits whatever follows `quit`.
        b"quit" => Command::Quit,
        _ if http_request_line(name, t) => Command::Refused(Refusal {
            reply: "",
            swallow: 0,
            noreply: true,
            close: true,
            skip_line: false,
        }),
        _ => refuse(ERROR),
    }
}

fn meta_set<'a>(input: &'a [u8], line_end: usize, rest: &'a [u8]) -> Parse<'a> {
    let bad = |reply| Parse::Complete {
        consumed: line_end,
        cmd: refuse(reply),
    };
    let (key, rest) = split_word(rest);
    let (len, flags) = split_word(rest);
    if key.is_empty() {
        return bad(BAD_FORMAT);
    }
    let bytes = match parse_u64(len) {
        Some(b) if b <= MC_DATA_LENGTH_BYTES_MAX => b as usize,
        _ => return bad(BAD_FORMAT),
    };
    let parsed = match meta_flags(MetaKind::Set, flags) {
        Ok(f) => f,
        // memcached swallows the data of an ms refused for its flags, so
        // that it is not read as commands.
        Err(reply) => {
            return Parse::Complete {
                consumed: line_end,
                cmd: Command::Refused(Refusal {
                    reply,
                    swallow: bytes + 2,
                    noreply: false,
                    close: false,
                    skip_line: false,
                }),
            }
        }
    };
    if bytes > MC_VALUE_BYTES_MAX {
        return Parse::Complete {
            consumed: line_end,
            cmd: Command::TooLarge {
                key,
                base64: parsed.base64,
                unlink: true,
                swallow: bytes + 2,
                noreply: false,
            },
        };
    }
    match data_chunk(input, line_end, bytes) {
        Err(need) => Parse::Incomplete { need },
        Ok((None, consumed)) => Parse::Complete {
            consumed,
            cmd: refuse(BAD_CHUNK),
        },
        Ok((Some(data), consumed)) => Parse::Complete {
            consumed,
            cmd: Command::Meta(Meta {
                kind: MetaKind::Set,
                key,
                flags: parsed,
                data,
            }),
        },
    }
}

fn meta(kind: MetaKind, rest: &[u8]) -> Command<'_> {
    let (key, flags) = split_word(rest);
    if key.is_empty() {
        return refuse(BAD_FORMAT);
    }
    match meta_flags(kind, flags) {
        Ok(flags) => Command::Meta(Meta {
            kind,
            key,
            flags,
            data: &[],
        }),
        Err(reply) => refuse(reply),
    }
}

/// Parses meta flags; a flag the command does not take (or that this
/// server does not support) is refused, not ignored.
fn meta_flags(kind: MetaKind, raw: &[u8]) -> Result<MetaFlags<'_>, &'static str> {
    let mut f = MetaFlags {
        raw,
        ..MetaFlags::default()
    };
    let mut n = 0;
    for tok in keys(raw) {
        n += 1;
        if n > MC_TOKENS_MAX {
            return Err(BAD_FORMAT);
        }
        let (c, arg) = (tok[0], &tok[1..]);
        let bare = arg.is_empty();
        use MetaKind::*;
        match (kind, c) {
            (_, b'b') if bare => f.base64 = true,
            (_, b'q') if bare => f.quiet = true,
            (_, b'O') => {
                if arg.len() > 32 {
                    return Err(INVALID_FLAG);
                }
                f.opaque = Some(arg);
            }
            (_, b'k') if bare => {}
            (Get | Arith, b'v') if bare => f.value = true,
            (Get | Arith | Set, b'c') if bare => {}
            (Get, b'f' | b's') if bare => {}
            (Get | Arith, b't') if bare => {}
            (Get | Arith | Set, b'T') => f.ttl = Some(parse_i64(arg).ok_or(INVALID_FLAG)?),
            (Set, b'F') => f.client_flags = Some(parse_u32(arg).ok_or(INVALID_FLAG)?),
            (Set | Delete | Arith, b'C') => {
                f.compare_cas = Some(parse_u64(arg).ok_or(INVALID_FLAG)?)
            }
            (Set | Arith, b'M') if arg.len() == 1 => f.mode = Some(arg[0]),
            (Set | Arith, b'E') => f.new_cas = Some(parse_u64(arg).ok_or(INVALID_FLAG)?),
            (Arith, b'N') => f.vivify = Some(parse_i64(arg).ok_or(INVALID_FLAG)?),
            (Arith, b'J') => f.initial = Some(parse_u64(arg).ok_or(INVALID_FLAG)?),
            (Arith, b'D') => f.delta = Some(parse_u64(arg).ok_or(INVALID_FLAG)?),
            _ => return Err(INVALID_FLAG),
        }
    }
    if let Some(m) = f.mode {
        let ok = match kind {
            MetaKind::Set => matches!(
                m,
                b'E' | b'A' | b'P' | b'R' | b'S' | b'e' | b'a' | b'p' | b'r' | b's'
            ),
            _ => matches!(m, b'I' | b'i' | b'+' | b'D' | b'd' | b'-'),
        };
        if !ok {
            return Err(if kind == MetaKind::Set {
                INVALID_MODE
            } else {
                "CLIENT_ERROR invalid mode for ma MODE"
            });
        }
    }
    Ok(f)
}

/// Parses an expiry time as memcached does, given the time now: `None`
/// for no expiry, `Some(0)` for already expired, else the deadline in the
/// same milliseconds as `now_ms`. `unix_now_ms` is the wall clock, for
/// absolute times (over [`MC_RELATIVE_EXPTIME_SECS_MAX`]).
pub fn deadline_ms(exptime: i64, now_ms: u64, unix_now_ms: u64) -> Option<u64> {
    if exptime == 0 {
        return None;
    }
    if exptime < 0 {
        return Some(0);
    }
    let t = exptime as u64;
    if exptime <= MC_RELATIVE_EXPTIME_SECS_MAX {
        return Some(now_ms.saturating_add(t * 1000).max(1));
    }
    let at = t.saturating_mul(1000);
    if at <= unix_now_ms {
        Some(0)
    } else {
        Some(now_ms.saturating_add(at - unix_now_ms).max(1))
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_value(c: u8) -> Option<u32> {
    B64.iter().position(|&x| x == c).map(|p| p as u32)
}

/// Decodes standard base64 (with padding) into `out`; the decoded length,
/// or `None` if `src` is not base64 or does not fit.
pub fn base64_decode(src: &[u8], out: &mut [u8]) -> Option<usize> {
    if src.is_empty() || !src.len().is_multiple_of(4) {
        return None;
    }
    let mut n = 0;
    let chunks = src.len() / 4;
    for (i, c) in src.chunks(4).enumerate() {
        let last = i + 1 == chunks;
        let pad = if last {
            c.iter().rev().take_while(|&&b| b == b'=').count()
        } else {
            0
        };
        if pad > 2 {
            return None;
        }
        let mut v: u32 = 0;
        for &b in &c[..4 - pad] {
            v = (v << 6) | b64_value(b)?;
        }
        v <<= 6 * pad as u32;
        let bytes = [(v >> 16) as u8, (v >> 8) as u8, v as u8];
        for &b in &bytes[..3 - pad] {
            *out.get_mut(n)? = b;
            n += 1;
        }
    }
    Some(n)
}

/// Appends the standard base64 of `src` to `out`.
pub fn base64_encode(src: &[u8], out: &mut Vec<u8>) {
    for c in src.chunks(3) {
        let v = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[((v >> (18 - 6 * i)) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
}

#[cfg(test)]
mod tests;
