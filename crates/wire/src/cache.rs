//! KV-cache frames: the data plane of the LLM KV-cache service.
//!
//! A cache frame uses the common header with kind `Cache` (client to
//! server) or `CacheReply`; `op_count` is 0. Every body starts with a
//! 16-byte prefix:
//!
//! ```text
//! 0  u8  op        CacheOp
//! 1  u8  flags     PUT: bit 0 = value is in the client's region
//!                  GET: bit 0 = write the value into the client's region
//!                  (every other bit must be 0)
//! 2  u16 key_len   1..=CACHE_KEY_BYTES_MAX (0 for BIND)
//! 4  u32 reserved  must be 0
//! 8  u64 tag       PUT: the client's transfer id (chunked puts);
//!                  GET: the generation asked for (0 = whichever is live)
//! ```
//!
//! then, by op:
//!
//! ```text
//! PUT:    u64 ttl_ms, u64 total_len, u64 offset, key,
//!         then either RemoteRegion (24) + u64 region_offset (flag 0: the
//!         server reads total_len bytes from the client's region; offset
//!         must be 0) or the chunk: bytes [offset, offset + chunk) of the
//!         value (the rest of the body)
//! GET:    u64 offset, u64 max_len (largest inline chunk wanted), key,
//!         then, with flag 0, RemoteRegion (24) + u64 region_offset +
//!         u64 slice_len (the destination slice; the value must fit it)
//! DELETE: key
//! EXISTS: key
//! BIND:   u64 client_id, RemoteRegion (24), u64 region_len
//! ```
//!
//! Replies (`CacheReply`; header `status` = the operation's ErrorCode; the
//! prefix repeats op, flags 0, key_len 0 and carries in `tag` the value's
//! generation where one is known):
//!
//! ```text
//! PUT:    u64 received (bytes of the value the server holds so far),
//!         u64 total_len; status OK and received == total_len = committed
//! GET:    u64 total_len, u64 offset, u64 expires_in_ms (0 = never),
//!         then the inline chunk, or nothing when written to the region
//! DELETE, EXISTS: nothing (status OK: it was there; NOT_FOUND: it was not)
//! BIND:   nothing
//! ```
//!
//! Over a transport with one-sided writes a GET is one request and one
//! small reply after the value has landed; otherwise the value comes back
//! in chunks of at most `CACHE_CHUNK_BYTES_MAX`, each asked for with the
//! generation of the first, so a value replaced mid-transfer is reported
//! (`VALUE_CHANGED`) instead of being stitched from two versions.

use fabrickv_types::limits::{
    CACHE_CHUNK_BYTES_MAX, CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX, FRAME_HEADER_BYTES,
};
use fabrickv_types::ErrorCode;

use crate::header::{finish_frame, Frame, FrameHeader, FrameKind, WireError};
use crate::{le_u16, le_u32, le_u64};

/// Bytes of the prefix every cache body starts with.
pub const CACHE_PREFIX_BYTES: usize = 16;

/// Bytes of a region descriptor on the wire (`RemoteRegion::ENCODED_BYTES`).
pub const REGION_BYTES: usize = 24;

/// Flag bit: the value is in (PUT) or goes to (GET) the client's region.
pub const FLAG_REGION: u8 = 1;

/// A cache operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CacheOp {
    /// Store a value (whole, in chunks, or read from the client's region).
    Put = 1,
    /// Read a value (into the client's region, or inline in chunks).
    Get = 2,
    /// Remove a key.
    Delete = 3,
    /// Ask whether a key is live.
    Exists = 4,
    /// Tie a gRPC client id to this connection's registered region.
    Bind = 5,
}

impl CacheOp {
    fn from_u8(v: u8) -> Option<CacheOp> {
        Some(match v {
            1 => CacheOp::Put,
            2 => CacheOp::Get,
            3 => CacheOp::Delete,
            4 => CacheOp::Exists,
            5 => CacheOp::Bind,
            _ => return None,
        })
    }
}

/// A slice of a client's registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSlice {
    /// The region descriptor, encoded as `RemoteRegion` encodes it.
    pub region: [u8; REGION_BYTES],
    /// Byte offset of the slice in the region.
    pub offset: u64,
    /// Bytes of the slice (GET: the value must fit; PUT: the value's size).
    pub len: u64,
}

/// A decoded cache request, borrowing the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheRequest<'a> {
    /// PUT.
    Put {
        /// Key.
        key: &'a [u8],
        /// Chunked transfer id chosen by the client (unique per connection).
        transfer: u64,
        /// Time to live in ms (0 = none).
        ttl_ms: u64,
        /// Size of the whole value.
        total_len: u64,
        /// Where this chunk starts in the value.
        offset: u64,
        /// The chunk, or where the whole value is.
        source: PutSource<'a>,
    },
    /// GET.
    Get {
        /// Key.
        key: &'a [u8],
        /// Generation asked for (0 = any).
        generation: u64,
        /// First byte wanted (inline chunks).
        offset: u64,
        /// Most bytes wanted inline.
        max_len: u64,
        /// Where the whole value goes, if one-sided.
        dest: Option<RegionSlice>,
    },
    /// DELETE.
    Delete {
        /// Key.
        key: &'a [u8],
    },
    /// EXISTS.
    Exists {
        /// Key.
        key: &'a [u8],
    },
    /// BIND.
    Bind {
        /// The id the gRPC RegisterClient returned.
        client_id: u64,
        /// The connection's registered region (offset 0, its length).
        region: RegionSlice,
    },
}

/// Where a PUT's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutSource<'a> {
    /// In the frame.
    Inline(&'a [u8]),
    /// In the client's region (`len` = the value's size).
    Region(RegionSlice),
}

fn prefix(out: &mut Vec<u8>, op: CacheOp, flags: u8, key_len: usize, tag: u64) {
    out.push(op as u8);
    out.push(flags);
    out.extend_from_slice(&(key_len as u16).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&tag.to_le_bytes());
}

fn put_slice(out: &mut Vec<u8>, s: &RegionSlice, with_len: bool) {
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

fn take<'a>(
    b: &'a [u8],
    at: &mut usize,
    n: usize,
    what: &'static str,
) -> Result<&'a [u8], WireError> {
    let s = b.get(*at..*at + n).ok_or(WireError::Malformed(what))?;
    *at += n;
    Ok(s)
}

fn region_of(b: &[u8]) -> [u8; REGION_BYTES] {
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
    if flags & !FLAG_REGION != 0 || (!takes_flag && flags != 0) {
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

/// Appends a PUT reply.
pub fn encode_put_reply(
    out: &mut Vec<u8>,
    id: u64,
    worker: u16,
    status: ErrorCode,
    generation: u64,
    received: u64,
    total_len: u64,
) {
    let s = FrameHeader::begin(out, FrameKind::CacheReply, id, worker, status.as_u16());
    prefix(out, CacheOp::Put, 0, 0, generation);
    out.extend_from_slice(&received.to_le_bytes());
    out.extend_from_slice(&total_len.to_le_bytes());
    finish_frame(out, s, 0);
}

/// A GET reply being built: the caller appends the inline chunk (if any)
/// after [`GetReplyWriter::begin`], then finishes.
#[derive(Debug)]
pub struct GetReplyWriter {
    start: usize,
}

impl GetReplyWriter {
    /// Appends header, prefix and the fixed fields.
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        out: &mut Vec<u8>,
        id: u64,
        worker: u16,
        status: ErrorCode,
        generation: u64,
        total_len: u64,
        offset: u64,
        expires_in_ms: u64,
    ) -> GetReplyWriter {
        let start = FrameHeader::begin(out, FrameKind::CacheReply, id, worker, status.as_u16());
        prefix(out, CacheOp::Get, 0, 0, generation);
        out.extend_from_slice(&total_len.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&expires_in_ms.to_le_bytes());
        GetReplyWriter { start }
    }

    /// Patches length and checksum.
    pub fn finish(self, out: &mut [u8]) {
        finish_frame(out, self.start, 0);
    }

    /// Patches length and checksum of a reply whose inline chunk is not
    /// appended to `out` but sent right after it from its own memory (a
    /// vectored write of a leased value): the rest of the body is a chunk
    /// of `chunk_len` bytes whose CRC-32C is `chunk_crc` (which a server
    /// may have computed once for many reads of one value). Nothing may
    /// follow the begun fields in `out`.
    pub fn finish_before(self, out: &mut [u8], chunk_len: usize, chunk_crc: u32) {
        finish_frame(out, self.start, 0);
        // Header layout (crate::header): body_len at 16, checksum at 20.
        let at = self.start;
        let body_len = le_u32(out, at + 16) as usize + chunk_len;
        let crc = crc32c_concat(le_u32(out, at + 20), chunk_crc, chunk_len);
        out[at + 16..at + 20].copy_from_slice(&(body_len as u32).to_le_bytes());
        out[at + 20..at + 24].copy_from_slice(&crc.to_le_bytes());
    }
}

/// CRC-32C's polynomial, bit-reversed (the crate computes it reflected).
const CRC32C_POLY_REFLECTED: u32 = 0x82F6_3B78;

/// `a * b mod P` for polynomials over GF(2) in reflected form (bit 31 is
/// x^0).
const fn crc_mul_mod(a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    let mut i = 0;
    while i < 32 {
        if a & (1 << (31 - i)) != 0 {
            p ^= b;
        }
        b = if b & 1 != 0 {
            (b >> 1) ^ CRC32C_POLY_REFLECTED
        } else {
            b >> 1
        };
        i += 1;
    }
    p
}

/// `x^(2^n) mod P` for n in 0..32 (the powers repeat with period dividing
/// 2^32 - 1 beyond that, and lengths stay far below 2^32 bits anyway).
const CRC_X2N: [u32; 32] = {
    let mut t = [0u32; 32];
    let mut p = 1u32 << 30; // x^1
    let mut n = 0;
    while n < 32 {
        t[n] = p;
        p = crc_mul_mod(p, p);
        n += 1;
    }
    t
};

/// The CRC-32C of a chunk, as frame checksums compute it: what
/// [`GetReplyWriter::finish_before`] takes for a chunk sent on its own.
pub fn chunk_crc(chunk: &[u8]) -> u32 {
    crate::checksum::crc32c(chunk)
}

/// The CRC-32C of `A ++ B` from `crc_a`, `crc_b` and the length of `B`,
/// in a few dozen shifts (zlib's `crc32_combine` by powers of x), so a
/// frame can be checksummed around a chunk whose CRC is already known.
pub fn crc32c_concat(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    // x^(8 len_b) mod P, as a product of the powers x^(2^k) that make it.
    let mut shift = 1u32 << 31; // x^0
    let mut n = len_b as u64;
    let mut k = 3; // 8 bits per byte: start at x^(2^3)
    while n != 0 {
        if n & 1 != 0 {
            shift = crc_mul_mod(CRC_X2N[k & 31], shift);
        }
        n >>= 1;
        k += 1;
    }
    crc_mul_mod(shift, crc_a) ^ crc_b
}

/// Appends the reply of an operation that carries no fields (DELETE,
/// EXISTS, BIND, or any refusal of one operation).
pub fn encode_status_reply(
    out: &mut Vec<u8>,
    id: u64,
    worker: u16,
    op: CacheOp,
    status: ErrorCode,
) {
    let s = FrameHeader::begin(out, FrameKind::CacheReply, id, worker, status.as_u16());
    prefix(out, op, 0, 0, 0);
    finish_frame(out, s, 0);
}

/// A decoded cache reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheReply<'a> {
    /// Which request kind it answers.
    pub op: CacheOp,
    /// The operation's status.
    pub status: ErrorCode,
    /// The value's generation, where the reply knows one.
    pub generation: u64,
    /// PUT: bytes held so far; GET: the value's size.
    pub a: u64,
    /// PUT: the value's size; GET: where the inline chunk starts.
    pub b: u64,
    /// GET: ms until the value expires (0 = never).
    pub expires_in_ms: u64,
    /// GET: the inline chunk (empty when the value went one-sided).
    pub data: &'a [u8],
}

/// Reads a `CacheReply` frame.
pub fn decode_reply<'a>(frame: &Frame<'a>) -> Result<CacheReply<'a>, WireError> {
    let b = frame.body;
    if frame.header.kind != FrameKind::CacheReply || b.len() < CACHE_PREFIX_BYTES {
        return Err(WireError::Malformed("not a cache reply"));
    }
    let op = CacheOp::from_u8(b[0]).ok_or(WireError::Malformed("unknown cache op"))?;
    let status = ErrorCode::from_u16(frame.header.status).unwrap_or(ErrorCode::Internal);
    let rest = &b[CACHE_PREFIX_BYTES..];
    let mut r = CacheReply {
        op,
        status,
        generation: le_u64(b, 8),
        a: 0,
        b: 0,
        expires_in_ms: 0,
        data: &[],
    };
    match op {
        CacheOp::Put if rest.len() == 16 => {
            r.a = le_u64(rest, 0);
            r.b = le_u64(rest, 8);
        }
        CacheOp::Get if rest.len() >= 24 => {
            r.a = le_u64(rest, 0);
            r.b = le_u64(rest, 8);
            r.expires_in_ms = le_u64(rest, 16);
            r.data = &rest[24..];
        }
        // A refused PUT or GET (and every DELETE, EXISTS, BIND) has no fields.
        _ if rest.is_empty() => {}
        _ => {
            return Err(WireError::Malformed(
                "cache reply fields disagree with its op",
            ))
        }
    }
    Ok(r)
}

/// Bytes of a GET reply before its inline chunk: the frame header, the
/// cache prefix and the three GET fields. A client that receives the
/// head first can place the chunk where it belongs before it arrives
/// ([`peek_get_reply_head`], then [`decode_split_get_reply`]).
pub const GET_REPLY_HEAD_BYTES: usize = FRAME_HEADER_BYTES + CACHE_PREFIX_BYTES + 24;

/// What the head of a GET reply says, read before its chunk arrives.
/// Only the header's own checks have run: the checksum covers the chunk
/// too, so nothing here is trusted until [`decode_split_get_reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetReplyHead {
    /// The request this answers.
    pub request_id: u64,
    /// The operation's status.
    pub status: ErrorCode,
    /// The value's generation.
    pub generation: u64,
    /// The value's size.
    pub total_len: u64,
    /// Where the chunk starts in the value.
    pub offset: u64,
    /// Bytes of the chunk (the message beyond the head).
    pub chunk_len: usize,
}

/// Reads the first [`GET_REPLY_HEAD_BYTES`] of a message of `msg_len`
/// bytes as the head of a GET reply carrying an inline chunk.
pub fn peek_get_reply_head(head: &[u8], msg_len: usize) -> Result<GetReplyHead, WireError> {
    if head.len() != GET_REPLY_HEAD_BYTES || msg_len < GET_REPLY_HEAD_BYTES {
        return Err(WireError::Truncated);
    }
    let header = FrameHeader::decode(head)?;
    if header.body_len as usize + FRAME_HEADER_BYTES != msg_len {
        return Err(WireError::Truncated);
    }
    let b = &head[FRAME_HEADER_BYTES..];
    if header.kind != FrameKind::CacheReply || b[0] != CacheOp::Get as u8 {
        return Err(WireError::Malformed("not a GET reply"));
    }
    let f = &b[CACHE_PREFIX_BYTES..];
    Ok(GetReplyHead {
        request_id: header.request_id,
        status: ErrorCode::from_u16(header.status).unwrap_or(ErrorCode::Internal),
        generation: le_u64(b, 8),
        total_len: le_u64(f, 0),
        offset: le_u64(f, 8),
        chunk_len: msg_len - GET_REPLY_HEAD_BYTES,
    })
}

/// Decodes a GET reply received in two pieces, its head
/// ([`GET_REPLY_HEAD_BYTES`]) and its inline chunk, wherever that landed:
/// every check of [`crate::decode_frame`] and [`decode_reply`], the
/// checksum over both pieces included. Returns the header and the reply,
/// whose `data` is `chunk`.
pub fn decode_split_get_reply<'a>(
    head: &[u8],
    chunk: &'a [u8],
) -> Result<(FrameHeader, CacheReply<'a>), WireError> {
    if head.len() != GET_REPLY_HEAD_BYTES {
        return Err(WireError::Truncated);
    }
    let header = FrameHeader::decode(head)?;
    let body = &head[FRAME_HEADER_BYTES..];
    if header.body_len as usize != body.len() + chunk.len() {
        return Err(WireError::Truncated);
    }
    if crate::checksum::crc32c_of(&[body, chunk]) != header.checksum {
        return Err(WireError::BadChecksum);
    }
    // The fields are checked on the head alone (an empty chunk), then
    // the chunk is attached.
    let r = decode_reply(&Frame { header, body })?;
    if r.op != CacheOp::Get {
        return Err(WireError::Malformed("not a GET reply"));
    }
    let r = CacheReply {
        op: r.op,
        status: r.status,
        generation: r.generation,
        a: r.a,
        b: r.b,
        expires_in_ms: r.expires_in_ms,
        data: chunk,
    };
    Ok((header, r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode_frame;

    fn req(msg: &[u8]) -> CacheRequest<'_> {
        decode_request(&decode_frame(msg).expect("frame")).expect("request")
    }

    fn slice() -> RegionSlice {
        RegionSlice {
            region: [7; REGION_BYTES],
            offset: 4096,
            len: 1 << 20,
        }
    }

    #[test]
    fn requests_round_trip() {
        let mut m = Vec::new();
        encode_put_chunk(&mut m, 1, 0, b"k1", 9, 500, 10, 4, b"abc");
        assert_eq!(
            req(&m),
            CacheRequest::Put {
                key: b"k1",
                transfer: 9,
                ttl_ms: 500,
                total_len: 10,
                offset: 4,
                source: PutSource::Inline(b"abc"),
            }
        );
        m.clear();
        encode_put_from_region(&mut m, 1, 0, b"k2", 0, &slice());
        assert_eq!(
            req(&m),
            CacheRequest::Put {
                key: b"k2",
                transfer: 0,
                ttl_ms: 0,
                total_len: 1 << 20,
                offset: 0,
                source: PutSource::Region(slice()),
            }
        );
        m.clear();
        encode_get(&mut m, 1, 0, b"k3", 5, 100, 200, Some(&slice()));
        assert_eq!(
            req(&m),
            CacheRequest::Get {
                key: b"k3",
                generation: 5,
                offset: 100,
                max_len: 200,
                dest: Some(slice()),
            }
        );
        m.clear();
        encode_key_op(&mut m, 1, 0, CacheOp::Exists, b"k4");
        assert_eq!(req(&m), CacheRequest::Exists { key: b"k4" });
        m.clear();
        let region = RegionSlice {
            offset: 0,
            ..slice()
        };
        encode_bind(&mut m, 1, 0, 77, &region);
        assert_eq!(
            req(&m),
            CacheRequest::Bind {
                client_id: 77,
                region
            }
        );
    }

    #[test]
    fn replies_round_trip() {
        let mut m = Vec::new();
        let w = GetReplyWriter::begin(&mut m, 3, 1, ErrorCode::Ok, 42, 9, 3, 1000);
        m.extend_from_slice(b"xyz");
        w.finish(&mut m);
        let f = decode_frame(&m).expect("frame");
        let r = decode_reply(&f).expect("reply");
        assert_eq!(
            (r.op, r.status, r.generation),
            (CacheOp::Get, ErrorCode::Ok, 42)
        );
        assert_eq!(
            (r.a, r.b, r.expires_in_ms, r.data),
            (9, 3, 1000, &b"xyz"[..])
        );
        m.clear();
        encode_put_reply(&mut m, 3, 1, ErrorCode::Ok, 8, 10, 10);
        let f = decode_frame(&m).expect("frame");
        let r = decode_reply(&f).expect("reply");
        assert_eq!((r.op, r.generation, r.a, r.b), (CacheOp::Put, 8, 10, 10));
        m.clear();
        encode_status_reply(&mut m, 3, 1, CacheOp::Get, ErrorCode::BufferTooSmall);
        let f = decode_frame(&m).expect("frame");
        assert_eq!(
            decode_reply(&f).expect("reply").status,
            ErrorCode::BufferTooSmall
        );
    }

    #[test]
    fn a_reply_finished_before_its_chunk_equals_one_with_it() {
        let chunk = vec![0x5A; 3000];
        let mut whole = Vec::new();
        let w = GetReplyWriter::begin(&mut whole, 4, 2, ErrorCode::Ok, 7, 9000, 3000, 0);
        whole.extend_from_slice(&chunk);
        w.finish(&mut whole);
        let mut head = vec![1, 2, 3];
        let w = GetReplyWriter::begin(&mut head, 4, 2, ErrorCode::Ok, 7, 9000, 3000, 0);
        w.finish_before(&mut head, chunk.len(), crate::checksum::crc32c(&chunk));
        head.extend_from_slice(&chunk);
        assert_eq!(head[3..], whole[..]);
    }

    #[test]
    fn concatenated_crcs_match_the_crc_of_the_concatenation() {
        let data: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for cut in [0, 1, 7, 64, 1000, 65_536, 69_999, 70_000] {
            let (a, b) = data.split_at(cut);
            assert_eq!(
                crc32c_concat(
                    crate::checksum::crc32c(a),
                    crate::checksum::crc32c(b),
                    b.len()
                ),
                crate::checksum::crc32c(&data),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn split_get_replies_decode_like_whole_ones() {
        let chunk: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let mut m = Vec::new();
        let w = GetReplyWriter::begin(&mut m, 9, 0, ErrorCode::Ok, 33, 12_000, 4096, 50);
        m.extend_from_slice(&chunk);
        w.finish(&mut m);
        let (head, tail) = m.split_at(GET_REPLY_HEAD_BYTES);
        let h = peek_get_reply_head(head, m.len()).expect("head");
        assert_eq!(
            (
                h.request_id,
                h.status,
                h.generation,
                h.total_len,
                h.offset,
                h.chunk_len
            ),
            (9, ErrorCode::Ok, 33, 12_000, 4096, chunk.len())
        );
        let (header, r) = decode_split_get_reply(head, tail).expect("split reply");
        let whole = decode_frame(&m).expect("frame");
        assert_eq!(header, whole.header);
        assert_eq!(r, decode_reply(&whole).expect("reply"));
        // One flipped byte of the chunk, wherever it landed, is caught.
        let mut bad = tail.to_vec();
        bad[4321] ^= 1;
        assert_eq!(
            decode_split_get_reply(head, &bad).err(),
            Some(WireError::BadChecksum)
        );
        // A chunk of the wrong length, a head of the wrong length or kind.
        assert_eq!(
            decode_split_get_reply(head, &tail[1..]).err(),
            Some(WireError::Truncated)
        );
        assert!(peek_get_reply_head(head, m.len() + 1).is_err());
        assert!(peek_get_reply_head(&head[1..], m.len()).is_err());
        let mut put = Vec::new();
        encode_put_reply(&mut put, 9, 0, ErrorCode::Ok, 1, 2, 2);
        put.resize(GET_REPLY_HEAD_BYTES, 0);
        assert!(peek_get_reply_head(&put, 10_000).is_err());
    }

    #[test]
    fn malformed_requests_are_refused() {
        let bad = |m: &[u8]| decode_request(&decode_frame(m).expect("frame")).is_err();
        let mut m = Vec::new();
        // A chunk that runs past the value's end.
        encode_put_chunk(&mut m, 1, 0, b"k", 0, 0, 4, 2, b"abc");
        assert!(bad(&m));
        m.clear();
        // An empty key.
        encode_key_op(&mut m, 1, 0, CacheOp::Delete, b"");
        assert!(bad(&m));
        m.clear();
        // A key over the bound.
        encode_key_op(
            &mut m,
            1,
            0,
            CacheOp::Delete,
            &vec![b'k'; CACHE_KEY_BYTES_MAX + 1],
        );
        assert!(bad(&m));
        m.clear();
        // A value over the bound.
        encode_put_chunk(
            &mut m,
            1,
            0,
            b"k",
            0,
            0,
            CACHE_VALUE_BYTES_MAX as u64 + 1,
            0,
            b"a",
        );
        assert!(bad(&m));
        m.clear();
        // Unknown flags.
        encode_key_op(&mut m, 1, 0, CacheOp::Exists, b"k");
        m[fabrickv_types::limits::FRAME_HEADER_BYTES + 1] = 2;
        let s = 0;
        finish_frame(&mut m, s, 0);
        assert!(bad(&m));
    }
}
