//! The one-line commands (`delete`, `incr`, `decr`, `touch`, `flush_all`,
//! `version`, `verbosity`, `stats`, `quit`, ...).

use super::*;

/// The other classic commands, with memcached's word counts: a wrong
/// count is `ERROR` (whatever the last word); past that, a last word
/// `noreply` silences the command's errors as well as its answer.
pub(crate) fn simple<'a>(name: &[u8], t: &[&'a [u8]]) -> Command<'a> {
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
