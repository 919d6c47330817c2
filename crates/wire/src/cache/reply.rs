//! Encoding and decoding of KV-cache replies, the chunked GET reply included.

use super::*;

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
