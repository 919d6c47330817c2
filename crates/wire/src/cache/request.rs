//! Encoding and decoding of KV-cache requests (PUT, GET, DELETE, EXISTS, BIND).

use super::*;

pub(super) fn prefix(out: &mut Vec<u8>, op: CacheOp, flags: u8, key_len: usize, tag: u64) {
    out.push(op as u8);
    out.push(flags);
    out.extend_from_slice(&(key_len as u16).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&tag.to_le_bytes());
}

pub(super) fn put_slice(out: &mut Vec<u8>, s: &RegionSlice, with_len: bool) {
    out.extend_from_slice(&s.region);
    out.extend_from_slice(&s.offset.to_le_bytes());
    if with_len {
        out.extend_from_slice(&s.len.to_le_bytes());
    }
}

/// Appends a PUT of bytes `[offset, offset + chunk.len())` of a value of
/// `total_len` bytes.
#[allow(clippy::too_many_arguments)]
pub fn encode_put_chunk(
    out: &mut Vec<u8>,
    id: u64,
    worker: u16,
    key: &[u8],
    transfer: u64,
    ttl_ms: u64,
    total_len: u64,
    offset: u64,
    chunk: &[u8],
) {
    let s = FrameHeader::begin(out, FrameKind::Cache, id, worker, 0);
    prefix(out, CacheOp::Put, 0, key.len(), transfer);
    out.extend_from_slice(&ttl_ms.to_le_bytes());
    out.extend_from_slice(&total_len.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(chunk);
    finish_frame(out, s, 0);
}

/// Appends a GET of the whole value into `dest`, a slice of the client's
/// region that the client copies out as soon as the reply arrives
/// ([`FLAG_READ_NOW`]).
pub fn encode_get_read_now(
    out: &mut Vec<u8>,
    id: u64,
    worker: u16,
    key: &[u8],
    dest: &RegionSlice,
) {
    let s = FrameHeader::begin(out, FrameKind::Cache, id, worker, 0);
    prefix(out, CacheOp::Get, FLAG_REGION | FLAG_READ_NOW, key.len(), 0);
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(key);
    put_slice(out, dest, true);
    finish_frame(out, s, 0);
}

/// Appends a PUT whose value the server reads from the client's region
/// (`src.len` bytes at `src.offset`).
pub fn encode_put_from_region(
    out: &mut Vec<u8>,
    id: u64,
    worker: u16,
    key: &[u8],
    ttl_ms: u64,
    src: &RegionSlice,
) {
    let s = FrameHeader::begin(out, FrameKind::Cache, id, worker, 0);
    prefix(out, CacheOp::Put, FLAG_REGION, key.len(), 0);
    out.extend_from_slice(&ttl_ms.to_le_bytes());
    out.extend_from_slice(&src.len.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(key);
    put_slice(out, src, false);
    finish_frame(out, s, 0);
}

/// Appends a GET: inline from `offset` (at most `max_len` bytes), or, with
/// `dest`, the whole value written into the client's region slice.
#[allow(clippy::too_many_arguments)]
pub fn encode_get(
    out: &mut Vec<u8>,
    id: u64,
    worker: u16,
    key: &[u8],
    generation: u64,
    offset: u64,
    max_len: u64,
    dest: Option<&RegionSlice>,
) {
    let s = FrameHeader::begin(out, FrameKind::Cache, id, worker, 0);
    let flags = if dest.is_some() { FLAG_REGION } else { 0 };
    prefix(out, CacheOp::Get, flags, key.len(), generation);
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&max_len.to_le_bytes());
    out.extend_from_slice(key);
    if let Some(d) = dest {
        put_slice(out, d, true);
    }
    finish_frame(out, s, 0);
}

/// Appends a DELETE or an EXISTS.
pub fn encode_key_op(out: &mut Vec<u8>, id: u64, worker: u16, op: CacheOp, key: &[u8]) {
    let s = FrameHeader::begin(out, FrameKind::Cache, id, worker, 0);
    prefix(out, op, 0, key.len(), 0);
    out.extend_from_slice(key);
    finish_frame(out, s, 0);
}

/// Appends a BIND of `client_id` to the region `region` (offset 0).
pub fn encode_bind(out: &mut Vec<u8>, id: u64, worker: u16, client_id: u64, region: &RegionSlice) {
    let s = FrameHeader::begin(out, FrameKind::Cache, id, worker, 0);
    prefix(out, CacheOp::Bind, 0, 0, 0);
    out.extend_from_slice(&client_id.to_le_bytes());
    out.extend_from_slice(&region.region);
    out.extend_from_slice(&region.len.to_le_bytes());
    finish_frame(out, s, 0);
}

pub(super) fn take<'a>(
    b: &'a [u8],
    at: &mut usize,
    n: usize,
    what: &'static str,
) -> Result<&'a [u8], WireError> {
    let s = b.get(*at..*at + n).ok_or(WireError::Malformed(what))?;
    *at += n;
    Ok(s)
}

pub(super) fn region_of(b: &[u8]) -> [u8; REGION_BYTES] {
    let mut r = [0u8; REGION_BYTES];
    r.copy_from_slice(&b[..REGION_BYTES]);
    r
}

/// Reads the body of a `Cache` frame. Checks everything the codec can
/// know: lengths against their bounds, reserved bits, chunk placement.
pub fn decode_request<'a>(frame: &Frame<'a>) -> Result<CacheRequest<'a>, WireError> {
    let b = frame.body;
    if frame.header.kind != FrameKind::Cache || b.len() < CACHE_PREFIX_BYTES {
        return Err(WireError::Malformed("cache body shorter than its prefix"));
    }
    if frame.header.op_count != 0 {
        return Err(WireError::Malformed("cache frames carry op count 0"));
    }
    if le_u32(b, 4) != 0 {
        return Err(WireError::ReservedBits);
    }
    let op = CacheOp::from_u8(b[0]).ok_or(WireError::Malformed("unknown cache op"))?;
    let flags = b[1];
    let key_len = usize::from(le_u16(b, 2));
    let tag = le_u64(b, 8);
    let takes_flag = matches!(op, CacheOp::Put | CacheOp::Get);
    let read_now = flags & FLAG_READ_NOW != 0;
    if flags & !(FLAG_REGION | FLAG_READ_NOW) != 0
        || (!takes_flag && flags != 0)
        || (read_now && (op != CacheOp::Get || flags & FLAG_REGION == 0))
    {
        return Err(WireError::ReservedBits);
    }
    if op == CacheOp::Bind {
        if key_len != 0 || tag != 0 {
            return Err(WireError::Malformed("BIND has no key"));
        }
    } else if key_len == 0 || key_len > CACHE_KEY_BYTES_MAX {
        return Err(WireError::Malformed("cache key length out of range"));
    }
    let rest = &b[CACHE_PREFIX_BYTES..];
    let mut at = 0;
    match op {
        CacheOp::Put => {
            let f = take(rest, &mut at, 24, "PUT shorter than its fields")?;
            let (ttl_ms, total_len, offset) = (le_u64(f, 0), le_u64(f, 8), le_u64(f, 16));
            let key = take(rest, &mut at, key_len, "PUT key truncated")?;
            if total_len > CACHE_VALUE_BYTES_MAX as u64 {
                return Err(WireError::Malformed(
                    "PUT value larger than CACHE_VALUE_BYTES_MAX",
                ));
            }
            let source = if flags & FLAG_REGION != 0 {
                let d = take(rest, &mut at, REGION_BYTES + 8, "PUT source truncated")?;
                if offset != 0 || tag != 0 {
                    return Err(WireError::Malformed("a PUT from a region is whole"));
                }
                PutSource::Region(RegionSlice {
                    region: region_of(d),
                    offset: le_u64(d, REGION_BYTES),
                    len: total_len,
                })
            } else {
                let chunk = &rest[at..];
                at = rest.len();
                let end = offset.checked_add(chunk.len() as u64);
                if chunk.len() > CACHE_CHUNK_BYTES_MAX || end.is_none_or(|e| e > total_len) {
                    return Err(WireError::Malformed("PUT chunk outside its value"));
                }
                if chunk.is_empty() && total_len != 0 {
                    return Err(WireError::Malformed("empty PUT chunk"));
                }
                PutSource::Inline(chunk)
            };
            if at != rest.len() {
                return Err(WireError::Malformed("PUT has trailing bytes"));
            }
            Ok(CacheRequest::Put {
                key,
                transfer: tag,
                ttl_ms,
                total_len,
                offset,
                source,
            })
        }
        CacheOp::Get => {
            let f = take(rest, &mut at, 16, "GET shorter than its fields")?;
            let (offset, max_len) = (le_u64(f, 0), le_u64(f, 8));
            let key = take(rest, &mut at, key_len, "GET key truncated")?;
            let dest = if flags & FLAG_REGION != 0 {
                let d = take(
                    rest,
                    &mut at,
                    REGION_BYTES + 16,
                    "GET destination truncated",
                )?;
                Some(RegionSlice {
                    region: region_of(d),
                    offset: le_u64(d, REGION_BYTES),
                    len: le_u64(d, REGION_BYTES + 8),
                })
            } else {
                None
            };
            if at != rest.len() {
                return Err(WireError::Malformed("GET has trailing bytes"));
            }
            Ok(CacheRequest::Get {
                key,
                generation: tag,
                offset,
                max_len,
                dest,
                read_now,
            })
        }
        CacheOp::Delete | CacheOp::Exists => {
            if rest.len() != key_len {
                return Err(WireError::Malformed("key length disagrees with the body"));
            }
            Ok(if op == CacheOp::Delete {
                CacheRequest::Delete { key: rest }
            } else {
                CacheRequest::Exists { key: rest }
            })
        }
        CacheOp::Bind => {
            if rest.len() != 8 + REGION_BYTES + 8 {
                return Err(WireError::Malformed("BIND body has the wrong length"));
            }
            Ok(CacheRequest::Bind {
                client_id: le_u64(rest, 0),
                region: RegionSlice {
                    region: region_of(&rest[8..]),
                    offset: 0,
                    len: le_u64(rest, 8 + REGION_BYTES),
                },
            })
        }
    }
}
