//! The storage commands (`set`, `add`, `replace`, `append`, `prepend`,
//! `cas`): the command line, then the data block.

use super::*;

pub(crate) fn storage<'a>(
    input: &'a [u8],
    line_end: usize,
    name: &[u8],
    rest: &'a [u8],
) -> Parse<'a> {
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
                Some(data) => Command::Store(Storage {
                    mode,
                    key,
                    flags,
                    exptime,
                    data,
                    cas_unique,
                    noreply,
                }),
                None => refuse_quietly(BAD_CHUNK, noreply),
            },
        },
    }
}

/// The `bytes` of data after the line and their CRLF: `Ok((Some(data),
/// consumed))`, `Ok((None, consumed))` for a chunk not ended by CRLF, or
/// `Err(bytes needed)`.
pub(crate) fn data_chunk(
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
