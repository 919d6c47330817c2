//! Request bodies: a batch of operations.
//!
//! Each operation is a 16-byte header followed by its key and value:
//!
//! ```text
//! offset size field
//!      0    1 opcode     OpCode
//!      1    1 flags      bits 0-1: PutCondition; bit 2: FLAG_REPLICA_READ
//!                        (GET and GET_CHUNK only); other bits must be 0
//!      2    2 key_len    bytes of key (1..=KEY_BYTES_MAX is accepted)
//!      4    4 value_len  bytes of value (PUT only; 0 otherwise)
//!      8    8 ttl_ms     time-to-live in milliseconds, 0 = none (PUT only)
//!     16    . key, then value
//! ```
//!
//! Structure (lengths, count) is checked for the whole frame before any
//! operation is handed out, so a server never executes half of a frame
//! that turns out to be malformed. Semantic bounds (key and value length,
//! TTL, opcode) are checked per operation: a bad operation gets its own
//! error result and its neighbours still run.

use fabrickv_types::limits::{
    KEY_BYTES_MAX, LARGE_CHUNK_BYTES_MAX, LARGE_VALUE_BYTES_MAX, OP_HEADER_BYTES, TTL_MS_MAX,
    VALUE_BYTES_MAX,
};
use fabrickv_types::ErrorCode;

use crate::header::{Entries, Frame, FrameKind, FrameWriter, WireError};
use crate::{le_u16, le_u32, le_u64};

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum OpCode {
    /// Read the value of a key.
    Get = 1,
    /// Store a value under a key, with an optional TTL and condition.
    Put = 2,
    /// Remove a key.
    Delete = 3,
    /// One piece of a large value's store; its value section is
    /// [`PUT_CHUNK_HEAD_BYTES`] of head (transfer id, total, offset) and
    /// then the piece's bytes.
    PutChunk = 4,
    /// Read one piece of a value pinned by a GET that answered
    /// `LARGE_VALUE`; its value section is [`GET_CHUNK_HEAD_BYTES`]
    /// (pin tag, offset, length).
    GetChunk = 5,
}

/// Head of a PUT_CHUNK's value section, in bytes: transfer id (u64),
/// total length of the value (u64), offset of this piece (u64).
pub const PUT_CHUNK_HEAD_BYTES: usize = 24;

/// Value section of a GET_CHUNK, in bytes: pin tag (u64), offset (u64),
/// length (u32).
pub const GET_CHUNK_HEAD_BYTES: usize = 20;

/// Value section of a `LARGE_VALUE` GET result, in bytes: total length
/// (u64), pin tag (u64).
pub const LARGE_RESULT_BYTES: usize = 16;

/// A PUT_CHUNK's head and piece, as read from its value section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutChunk<'a> {
    /// The transfer this piece belongs to (chosen by the client).
    pub transfer: u64,
    /// Length of the whole value, in bytes.
    pub total: u64,
    /// Where this piece starts in the value.
    pub offset: u64,
    /// The piece.
    pub bytes: &'a [u8],
}

/// A GET_CHUNK's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetChunk {
    /// The pin tag of the `LARGE_VALUE` result it reads from.
    pub tag: u64,
    /// Where the piece starts.
    pub offset: u64,
    /// Length of the piece, in bytes.
    pub len: u32,
}

impl OpCode {
    /// Parses an opcode byte.
    pub fn from_u8(v: u8) -> Option<OpCode> {
        match v {
            1 => Some(OpCode::Get),
            2 => Some(OpCode::Put),
            3 => Some(OpCode::Delete),
            4 => Some(OpCode::PutChunk),
            5 => Some(OpCode::GetChunk),
            _ => None,
        }
    }
}

/// When a PUT applies (Redis SET's NX and XX).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PutCondition {
    /// Always store.
    #[default]
    Always = 0,
    /// Store only if the key is absent (NX).
    IfAbsent = 1,
    /// Store only if the key is present (XX).
    IfPresent = 2,
}

const FLAG_COND_MASK: u8 = 0b11;

/// A read that accepts staleness: in a cluster keeping several copies of
/// each slot, any in-sync replica of the key's slot may answer it, not
/// only the primary (GET and GET_CHUNK only).
pub const FLAG_REPLICA_READ: u8 = 0b100;

/// One operation as read from a frame, borrowing key and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op<'a> {
    /// Raw opcode byte; see [`Op::check`].
    pub opcode: u8,
    /// Raw flags byte.
    pub flags: u8,
    /// The key bytes.
    pub key: &'a [u8],
    /// The value bytes (empty for GET and DELETE).
    pub value: &'a [u8],
    /// Time-to-live in milliseconds, 0 = none.
    pub ttl_ms: u64,
}

impl<'a> Op<'a> {
    /// Whether any replica of the key's slot may answer this read
    /// ([`FLAG_REPLICA_READ`]).
    #[inline]
    pub fn replica_read(&self) -> bool {
        self.flags & FLAG_REPLICA_READ != 0
    }

    /// Checks the operation's semantic bounds and returns its opcode and
    /// PUT condition, or the stable error code to answer it with.
    pub fn check(&self) -> Result<(OpCode, PutCondition), ErrorCode> {
        let code = OpCode::from_u8(self.opcode).ok_or(ErrorCode::UnknownOpcode)?;
        let cond = match self.flags & !FLAG_REPLICA_READ {
            0 => PutCondition::Always,
            1 => PutCondition::IfAbsent,
            2 => PutCondition::IfPresent,
            _ => return Err(ErrorCode::Malformed),
        };
        if self.replica_read() && !matches!(code, OpCode::Get | OpCode::GetChunk) {
            return Err(ErrorCode::Malformed);
        }
        if self.key.is_empty() || self.key.len() > KEY_BYTES_MAX {
            return Err(ErrorCode::KeyTooLong);
        }
        if self.ttl_ms > TTL_MS_MAX {
            return Err(ErrorCode::TtlTooLarge);
        }
        match code {
            OpCode::Put if self.value.len() > VALUE_BYTES_MAX => Err(ErrorCode::ValueTooLarge),
            OpCode::Put => Ok((code, cond)),
            OpCode::PutChunk => self.put_chunk().map(|_| (code, cond)),
            OpCode::GetChunk if self.ttl_ms != 0 || cond != PutCondition::Always => {
                Err(ErrorCode::Malformed)
            }
            OpCode::GetChunk => self.get_chunk().map(|_| (code, cond)),
            OpCode::Get | OpCode::Delete
                if !self.value.is_empty() || self.ttl_ms != 0 || cond != PutCondition::Always =>
            {
                Err(ErrorCode::Malformed)
            }
            OpCode::Get | OpCode::Delete => Ok((code, cond)),
        }
    }

    /// The head and piece of a PUT_CHUNK, checked: a piece of 1 to
    /// `LARGE_CHUNK_BYTES_MAX` bytes, lying within a total that only a
    /// large value has (over `VALUE_BYTES_MAX`, at most
    /// `LARGE_VALUE_BYTES_MAX`).
    pub fn put_chunk(&self) -> Result<PutChunk<'a>, ErrorCode> {
        let v = self.value;
        if v.len() <= PUT_CHUNK_HEAD_BYTES {
            return Err(ErrorCode::Malformed);
        }
        let c = PutChunk {
            transfer: le_u64(v, 0),
            total: le_u64(v, 8),
            offset: le_u64(v, 16),
            bytes: &v[PUT_CHUNK_HEAD_BYTES..],
        };
        if c.bytes.len() > LARGE_CHUNK_BYTES_MAX
            || c.total > LARGE_VALUE_BYTES_MAX as u64
            || c.total <= VALUE_BYTES_MAX as u64
        {
            return Err(ErrorCode::ValueTooLarge);
        }
        match c.offset.checked_add(c.bytes.len() as u64) {
            Some(end) if end <= c.total => Ok(c),
            _ => Err(ErrorCode::Malformed),
        }
    }

    /// The fields of a GET_CHUNK, checked: exactly its head, a length of
    /// 1 to `LARGE_CHUNK_BYTES_MAX` bytes, no overflow (whether the piece
    /// lies within the value is the server's check).
    pub fn get_chunk(&self) -> Result<GetChunk, ErrorCode> {
        let v = self.value;
        if v.len() != GET_CHUNK_HEAD_BYTES {
            return Err(ErrorCode::Malformed);
        }
        let c = GetChunk {
            tag: le_u64(v, 0),
            offset: le_u64(v, 8),
            len: le_u32(v, 16),
        };
        if c.len == 0 || c.len as usize > LARGE_CHUNK_BYTES_MAX {
            return Err(ErrorCode::Malformed);
        }
        if c.offset.checked_add(u64::from(c.len)).is_none() {
            return Err(ErrorCode::Malformed);
        }
        Ok(c)
    }
}

/// Iterates the operations of a structurally valid request frame.
#[derive(Debug, Clone)]
pub struct RequestIter<'a> {
    entries: Entries<'a>,
    /// The frame's header `map_epoch`.
    map_epoch: u32,
}

impl<'a> RequestIter<'a> {
    /// Checks the structure of a request frame's body and returns an
    /// iterator over its operations. Fails if the frame is not a request,
    /// if any length overruns the body, if the count is wrong, or if bytes
    /// are left over.
    pub fn new(frame: &Frame<'a>) -> Result<RequestIter<'a>, WireError> {
        let entries = Entries::checked(
            frame,
            FrameKind::Request,
            "not a request frame",
            "bytes after the last operation",
            split_op,
        )?;
        Ok(RequestIter {
            entries,
            map_epoch: frame.header.map_epoch,
        })
    }

    /// Operations not yet returned.
    pub fn remaining(&self) -> usize {
        self.entries.remaining()
    }

    /// The slot map epoch the client stamped the frame with (0: none).
    pub fn map_epoch(&self) -> u32 {
        self.map_epoch
    }
}

/// Splits one operation off the front of `b`.
fn split_op(b: &[u8]) -> Result<(Op<'_>, &[u8]), WireError> {
    if b.len() < OP_HEADER_BYTES {
        return Err(WireError::Malformed("operation header overruns the body"));
    }
    let key_len = usize::from(le_u16(b, 2));
    let value_len = le_u32(b, 4) as usize;
    let total = OP_HEADER_BYTES
        .checked_add(key_len)
        .and_then(|n| n.checked_add(value_len))
        .ok_or(WireError::Malformed("operation length overflows"))?;
    if b.len() < total {
        return Err(WireError::Malformed(
            "operation key or value overruns the body",
        ));
    }
    let op = Op {
        opcode: b[0],
        flags: b[1],
        key: &b[OP_HEADER_BYTES..OP_HEADER_BYTES + key_len],
        value: &b[OP_HEADER_BYTES + key_len..total],
        ttl_ms: le_u64(b, 8),
    };
    Ok((op, &b[total..]))
}

impl<'a> Iterator for RequestIter<'a> {
    type Item = Op<'a>;

    fn next(&mut self) -> Option<Op<'a>> {
        self.entries.next(split_op)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining(), Some(self.remaining()))
    }
}

/// Appends a request frame to a buffer, one operation at a time.
///
/// Bounds are the caller's business: the builder writes what it is given,
/// so tests can produce frames that break them. [`RequestBuilder::fits`]
/// tells whether one more operation stays within the frame bounds.
#[derive(Debug)]
pub struct RequestBuilder<'b> {
    w: FrameWriter<'b>,
}

frame_builder!(
    RequestBuilder,
    FrameKind::Request,
    "Starts a request frame for `worker` at the end of `out`.",
    "Operations",
    "operation"
);

impl<'b> RequestBuilder<'b> {
    /// Stamps the frame with the slot map epoch its operations were routed
    /// by (see the header's `map_epoch`). An epoch past `u32::MAX` is
    /// stamped as `u32::MAX`, which servers take as no stamp (the check
    /// off, as for an unstamped frame) rather than compare wrongly.
    pub fn stamp_map_epoch(&mut self, epoch: u64) {
        self.w
            .set_map_epoch(u32::try_from(epoch).unwrap_or(u32::MAX));
    }

    /// Whether one more operation with these lengths stays within
    /// `BATCH_OPS_MAX` and `FRAME_BODY_BYTES_MAX`.
    pub fn fits(&self, key_len: usize, value_len: usize) -> bool {
        self.w.len() < fabrickv_types::limits::BATCH_OPS_MAX
            && self.body_bytes() + OP_HEADER_BYTES + key_len + value_len
                <= fabrickv_types::limits::FRAME_BODY_BYTES_MAX
    }

    fn op(&mut self, code: u8, flags: u8, key: &[u8], value: &[u8], ttl_ms: u64) -> &mut Self {
        let o = &mut *self.w.out;
        o.push(code);
        o.push(flags);
        o.extend_from_slice(&(key.len() as u16).to_le_bytes());
        o.extend_from_slice(&(value.len() as u32).to_le_bytes());
        o.extend_from_slice(&ttl_ms.to_le_bytes());
        o.extend_from_slice(key);
        o.extend_from_slice(value);
        self.w.entry_done();
        self
    }

    /// Adds a GET.
    pub fn get(&mut self, key: &[u8]) -> &mut Self {
        self.op(OpCode::Get as u8, 0, key, &[], 0)
    }

    /// Adds a GET any replica of the key's slot may answer
    /// ([`FLAG_REPLICA_READ`]).
    pub fn get_any_replica(&mut self, key: &[u8]) -> &mut Self {
        self.op(OpCode::Get as u8, FLAG_REPLICA_READ, key, &[], 0)
    }

    /// Adds a PUT with a TTL in milliseconds (0 = none) and a condition.
    pub fn put(&mut self, key: &[u8], value: &[u8], ttl_ms: u64, cond: PutCondition) -> &mut Self {
        self.op(
            OpCode::Put as u8,
            cond as u8 & FLAG_COND_MASK,
            key,
            value,
            ttl_ms,
        )
    }

    /// Adds a PUT_CHUNK: piece `bytes` at `offset` of a value of `total`
    /// bytes, in transfer `transfer`; TTL and condition apply when the
    /// last piece stores the value.
    #[allow(clippy::too_many_arguments)]
    pub fn put_chunk(
        &mut self,
        key: &[u8],
        transfer: u64,
        total: u64,
        offset: u64,
        bytes: &[u8],
        ttl_ms: u64,
        cond: PutCondition,
    ) -> &mut Self {
        let o = &mut *self.w.out;
        o.push(OpCode::PutChunk as u8);
        o.push(cond as u8 & FLAG_COND_MASK);
        o.extend_from_slice(&(key.len() as u16).to_le_bytes());
        o.extend_from_slice(&((PUT_CHUNK_HEAD_BYTES + bytes.len()) as u32).to_le_bytes());
        o.extend_from_slice(&ttl_ms.to_le_bytes());
        o.extend_from_slice(key);
        o.extend_from_slice(&transfer.to_le_bytes());
        o.extend_from_slice(&total.to_le_bytes());
        o.extend_from_slice(&offset.to_le_bytes());
        o.extend_from_slice(bytes);
        self.w.entry_done();
        self
    }

    /// Adds a GET_CHUNK of `len` bytes at `offset` of the value pinned
    /// under `tag`.
    pub fn get_chunk(&mut self, key: &[u8], tag: u64, offset: u64, len: u32) -> &mut Self {
        self.chunk_read(0, key, tag, offset, len)
    }

    /// Adds a GET_CHUNK for a value a [`RequestBuilder::get_any_replica`]
    /// pinned: the replica that answered that GET answers it too.
    pub fn get_chunk_any_replica(
        &mut self,
        key: &[u8],
        tag: u64,
        offset: u64,
        len: u32,
    ) -> &mut Self {
        self.chunk_read(FLAG_REPLICA_READ, key, tag, offset, len)
    }

    fn chunk_read(&mut self, flags: u8, key: &[u8], tag: u64, offset: u64, len: u32) -> &mut Self {
        let mut v = [0u8; GET_CHUNK_HEAD_BYTES];
        v[0..8].copy_from_slice(&tag.to_le_bytes());
        v[8..16].copy_from_slice(&offset.to_le_bytes());
        v[16..20].copy_from_slice(&len.to_le_bytes());
        self.op(OpCode::GetChunk as u8, flags, key, &v, 0)
    }

    /// Adds a DELETE.
    pub fn delete(&mut self, key: &[u8]) -> &mut Self {
        self.op(OpCode::Delete as u8, 0, key, &[], 0)
    }

    /// Adds an operation with raw fields, for tests of bad input.
    pub fn raw(
        &mut self,
        opcode: u8,
        flags: u8,
        key: &[u8],
        value: &[u8],
        ttl_ms: u64,
    ) -> &mut Self {
        self.op(opcode, flags, key, value, ttl_ms)
    }
}

impl ExactSizeIterator for RequestIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode_frame;

    #[test]
    fn batch_round_trips() {
        let mut buf = Vec::new();
        let mut b = RequestBuilder::new(&mut buf, 7, 1);
        b.get(b"alpha")
            .put(b"beta", b"value", 1500, PutCondition::IfAbsent)
            .delete(b"gamma");
        b.finish();
        let f = decode_frame(&buf).expect("frame");
        let ops: Vec<_> = RequestIter::new(&f).expect("structure").collect();
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[0].check(), Ok((OpCode::Get, PutCondition::Always)));
        assert_eq!(ops[0].key, b"alpha");
        assert_eq!(ops[1].check(), Ok((OpCode::Put, PutCondition::IfAbsent)));
        assert_eq!(
            (ops[1].key, ops[1].value, ops[1].ttl_ms),
            (&b"beta"[..], &b"value"[..], 1500)
        );
        assert_eq!(ops[2].check(), Ok((OpCode::Delete, PutCondition::Always)));
    }

    #[test]
    fn per_op_bounds_are_errors_not_frame_failures() {
        let long_key = vec![b'k'; KEY_BYTES_MAX + 1];
        let mut buf = Vec::new();
        let mut b = RequestBuilder::new(&mut buf, 1, 0);
        b.get(&long_key).get(b"").raw(99, 0, b"k", b"", 0).put(
            b"k",
            b"v",
            TTL_MS_MAX + 1,
            PutCondition::Always,
        );
        b.raw(OpCode::Get as u8, 0, b"k", b"unexpected", 0).raw(
            OpCode::Put as u8,
            0x80,
            b"k",
            b"v",
            0,
        );
        b.finish();
        let f = decode_frame(&buf).expect("frame");
        let codes: Vec<_> = RequestIter::new(&f)
            .expect("structure")
            .map(|o| o.check().err())
            .collect();
        assert_eq!(
            codes,
            vec![
                Some(ErrorCode::KeyTooLong),
                Some(ErrorCode::KeyTooLong),
                Some(ErrorCode::UnknownOpcode),
                Some(ErrorCode::TtlTooLarge),
                Some(ErrorCode::Malformed),
                Some(ErrorCode::Malformed),
            ]
        );
    }

    #[test]
    fn only_reads_may_ask_for_any_replica() {
        let mut buf = Vec::new();
        let mut b = RequestBuilder::new(&mut buf, 1, 0);
        b.get_any_replica(b"k");
        b.get_chunk_any_replica(b"k", 7, 0, 10);
        b.get(b"k");
        b.op(OpCode::Put as u8, FLAG_REPLICA_READ, b"k", b"v", 0);
        b.op(OpCode::Delete as u8, FLAG_REPLICA_READ, b"k", b"", 0);
        b.op(OpCode::Get as u8, 0b1000, b"k", b"", 0);
        b.finish();
        let f = decode_frame(&buf).expect("frame");
        let got: Vec<_> = RequestIter::new(&f)
            .expect("structure")
            .map(|o| (o.replica_read(), o.check().err()))
            .collect();
        assert_eq!(
            got,
            vec![
                (true, None),
                (true, None),
                (false, None),
                (true, Some(ErrorCode::Malformed)),
                (true, Some(ErrorCode::Malformed)),
                (false, Some(ErrorCode::Malformed)),
            ]
        );
    }

    #[test]
    fn structure_errors_reject_the_whole_frame() {
        let mut buf = Vec::new();
        let mut b = RequestBuilder::new(&mut buf, 1, 0);
        b.get(b"one").get(b"two");
        b.finish();
        // Claim three operations where there are two.
        let mut bad = buf.clone();
        bad[6] = 3;
        let f = decode_frame(&bad).expect("header and checksum still hold");
        assert!(RequestIter::new(&f).is_err());
        // Claim one operation where there are two: trailing bytes.
        let mut bad = buf.clone();
        bad[6] = 1;
        let f = decode_frame(&bad).expect("header");
        assert!(RequestIter::new(&f).is_err());
    }
}

#[cfg(test)]
mod chunk_tests {
    use super::*;
    use crate::decode_frame;

    fn one_op(build: impl FnOnce(&mut RequestBuilder<'_>)) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut b = RequestBuilder::new(&mut buf, 1, 0);
        build(&mut b);
        b.finish();
        buf
    }

    fn check_of(buf: &[u8]) -> (Op<'_>, Result<(OpCode, PutCondition), ErrorCode>) {
        let f = decode_frame(buf).expect("frame");
        let op = RequestIter::new(&f).expect("structure").next().expect("op");
        (op, op.check())
    }

    #[test]
    fn put_chunk_round_trips() {
        let total = (VALUE_BYTES_MAX + 10) as u64;
        let buf = one_op(|b| {
            b.put_chunk(b"k", 77, total, 5, b"abc", 9, PutCondition::IfAbsent);
        });
        let (op, check) = check_of(&buf);
        assert_eq!(check, Ok((OpCode::PutChunk, PutCondition::IfAbsent)));
        assert_eq!(op.ttl_ms, 9);
        let c = op.put_chunk().expect("chunk");
        assert_eq!(
            (c.transfer, c.total, c.offset, c.bytes),
            (77, total, 5, &b"abc"[..])
        );
    }

    #[test]
    fn get_chunk_round_trips() {
        let buf = one_op(|b| {
            b.get_chunk(b"k", 3, 1 << 20, 4096);
        });
        let (op, check) = check_of(&buf);
        assert_eq!(check, Ok((OpCode::GetChunk, PutCondition::Always)));
        assert_eq!(
            op.get_chunk(),
            Ok(GetChunk {
                tag: 3,
                offset: 1 << 20,
                len: 4096
            })
        );
    }

    #[test]
    fn malformed_chunks_are_refused() {
        let big = (VALUE_BYTES_MAX + 1) as u64;
        let cases: Vec<(Vec<u8>, ErrorCode)> = vec![
            // A total a frame could carry is not a large value.
            (
                one_op(|b| {
                    b.put_chunk(
                        b"k",
                        1,
                        VALUE_BYTES_MAX as u64,
                        0,
                        b"x",
                        0,
                        PutCondition::Always,
                    );
                }),
                ErrorCode::ValueTooLarge,
            ),
            // Over the largest value.
            (
                one_op(|b| {
                    b.put_chunk(
                        b"k",
                        1,
                        (LARGE_VALUE_BYTES_MAX + 1) as u64,
                        0,
                        b"x",
                        0,
                        PutCondition::Always,
                    );
                }),
                ErrorCode::ValueTooLarge,
            ),
            // A piece past the end, and one whose end overflows.
            (
                one_op(|b| {
                    b.put_chunk(b"k", 1, big, big, b"x", 0, PutCondition::Always);
                }),
                ErrorCode::Malformed,
            ),
            (
                one_op(|b| {
                    b.put_chunk(b"k", 1, big, u64::MAX, b"x", 0, PutCondition::Always);
                }),
                ErrorCode::Malformed,
            ),
            // An empty piece (head only) and a short head.
            (
                one_op(|b| {
                    b.put_chunk(b"k", 1, big, 0, b"", 0, PutCondition::Always);
                }),
                ErrorCode::Malformed,
            ),
            (
                one_op(|b| {
                    b.raw(OpCode::PutChunk as u8, 0, b"k", &[0; 10], 0);
                }),
                ErrorCode::Malformed,
            ),
            // GET_CHUNK: zero or too long a length, wrong head size, a TTL,
            // flags, an end that overflows.
            (
                one_op(|b| {
                    b.get_chunk(b"k", 1, 0, 0);
                }),
                ErrorCode::Malformed,
            ),
            (
                one_op(|b| {
                    b.get_chunk(b"k", 1, 0, LARGE_CHUNK_BYTES_MAX as u32 + 1);
                }),
                ErrorCode::Malformed,
            ),
            (
                one_op(|b| {
                    b.get_chunk(b"k", 1, u64::MAX, 1);
                }),
                ErrorCode::Malformed,
            ),
            (
                one_op(|b| {
                    b.raw(OpCode::GetChunk as u8, 0, b"k", &[0; 21], 0);
                }),
                ErrorCode::Malformed,
            ),
            (
                one_op(|b| {
                    let mut v = [0u8; GET_CHUNK_HEAD_BYTES];
                    v[16] = 1;
                    b.raw(OpCode::GetChunk as u8, 0, b"k", &v, 5);
                }),
                ErrorCode::Malformed,
            ),
            (
                one_op(|b| {
                    let mut v = [0u8; GET_CHUNK_HEAD_BYTES];
                    v[16] = 1;
                    b.raw(OpCode::GetChunk as u8, 1, b"k", &v, 0);
                }),
                ErrorCode::Malformed,
            ),
            // A GET with a value stays malformed.
            (
                one_op(|b| {
                    b.raw(OpCode::Get as u8, 0, b"k", b"v", 0);
                }),
                ErrorCode::Malformed,
            ),
        ];
        for (i, (buf, want)) in cases.iter().enumerate() {
            assert_eq!(check_of(buf).1.map(|_| ()), Err(*want), "case {i}");
        }
    }
}
