//! The meta commands (`mg`, `ms`, `md`, `ma`, `mn`, `me`) and their flags.

use super::*;

pub(crate) fn meta_set<'a>(input: &'a [u8], line_end: usize, rest: &'a [u8]) -> Parse<'a> {
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

pub(crate) fn meta(kind: MetaKind, rest: &[u8]) -> Command<'_> {
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
pub(crate) fn meta_flags(kind: MetaKind, raw: &[u8]) -> Result<MetaFlags<'_>, &'static str> {
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
