//! Persistent-shard frames: data operations on a shard a server serves
//! (`serve --shard NAME=PATH`) and the control of a shard copy.
//!
//! A shard frame uses the common header with kind `Shard` (client to
//! server) or `ShardReply`; `op_count` is 0. Every body starts with an
//! 8-byte prefix and the shard's name:
//!
//! ```text
//! 0  u8  op        ShardOp
//! 1  u8  flags     0 (every bit reserved)
//! 2  u16 name_len  1..=SHARD_NAME_BYTES_MAX (0 for the copy ops that
//!                  name a copy run instead of a shard)
//! 4  u32 reserved  must be 0
//! 8  name          UTF-8
//! ```
//!
//! The rest of the body is the op's payload. Data ops (GET, PUT, DELETE)
//! are specified with their codec in `shard_data` (server and client
//! share it); the copy's control ops (CHECKPOINT, START, STATUS, END) in
//! [`crate::copy`], with the copy's data streams. A reply
//! repeats the prefix with the op, no name, and its payload; its header
//! `status` is the op's ErrorCode, and a refused op carries a UTF-8
//! message as its payload.

use fabrickv_types::limits::{ERROR_MESSAGE_BYTES_MAX, SHARD_NAME_BYTES_MAX};
use fabrickv_types::ErrorCode;

use crate::header::{finish_frame, Frame, FrameHeader, FrameKind, WireError};
use crate::{le_u16, le_u32};

/// Bytes of the prefix every shard body starts with.
pub const SHARD_PREFIX_BYTES: usize = 8;

/// A shard operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ShardOp {
    /// Read keys.
    Get = 1,
    /// Write pairs, atomically, durable when acknowledged.
    Put = 2,
    /// Remove keys, atomically, durable when acknowledged.
    Delete = 3,
    /// Copy control: take a consistent checkpoint of the shard and split
    /// it into ranges; opens a copy run.
    CopyCheckpoint = 16,
    /// Copy control: start streaming the run's ranges.
    CopyStart = 17,
    /// Copy control: the run's state and counters.
    CopyStatus = 18,
    /// Copy control: end the run (stops streaming, frees the
    /// checkpoint).
    CopyEnd = 19,
}

impl ShardOp {
    /// Parses an op byte.
    pub fn from_u8(v: u8) -> Option<ShardOp> {
        Some(match v {
            1 => ShardOp::Get,
            2 => ShardOp::Put,
            3 => ShardOp::Delete,
            16 => ShardOp::CopyCheckpoint,
            17 => ShardOp::CopyStart,
            18 => ShardOp::CopyStatus,
            19 => ShardOp::CopyEnd,
            _ => return None,
        })
    }

    /// Whether the op belongs to the copy's control.
    pub fn is_copy(self) -> bool {
        (self as u8) >= ShardOp::CopyCheckpoint as u8
    }
}

/// A decoded shard request (or reply): op, shard name, payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMessage<'a> {
    /// The operation.
    pub op: ShardOp,
    /// The shard's name (empty in replies and in the copy ops that name a run).
    pub name: &'a str,
    /// The op's payload.
    pub payload: &'a [u8],
}

/// Appends one whole shard frame (request or reply): the header, the
/// prefix naming `op` and `name`, and the payload `payload` writes; the
/// header's checksum and length are filled in last.
#[allow(clippy::too_many_arguments)]
fn encode_frame(
    out: &mut Vec<u8>,
    kind: FrameKind,
    request_id: u64,
    worker: u16,
    status: u16,
    op: ShardOp,
    name: &str,
    payload: impl FnOnce(&mut Vec<u8>),
) {
    let start = FrameHeader::begin(out, kind, request_id, worker, status);
    out.push(op as u8);
    out.push(0);
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    payload(out);
    finish_frame(out, start, 0);
}

/// Appends a shard request whose payload `payload` writes; the name must
/// be at most `SHARD_NAME_BYTES_MAX` bytes (checked by the decoder).
pub fn encode_request(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    op: ShardOp,
    name: &str,
    payload: impl FnOnce(&mut Vec<u8>),
) {
    let kind = FrameKind::Shard;
    encode_frame(out, kind, request_id, worker, 0, op, name, payload);
}

/// Appends a shard reply with `status` and the payload `payload` writes.
/// A reply names no shard: the request it answers did.
pub fn encode_reply(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    op: ShardOp,
    status: ErrorCode,
    payload: impl FnOnce(&mut Vec<u8>),
) {
    let (kind, status) = (FrameKind::ShardReply, status.as_u16());
    encode_frame(out, kind, request_id, worker, status, op, "", payload);
}

/// Appends a reply refusing `op` with `code` and a message.
pub fn encode_refusal(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    op: ShardOp,
    code: ErrorCode,
    why: &str,
) {
    let end = crate::control::char_floor(why, ERROR_MESSAGE_BYTES_MAX);
    encode_reply(out, request_id, worker, op, code, |b| {
        b.extend_from_slice(&why.as_bytes()[..end])
    });
}

fn decode_body(body: &[u8]) -> Result<ShardMessage<'_>, WireError> {
    if body.len() < SHARD_PREFIX_BYTES {
        return Err(WireError::Malformed("shard body shorter than its prefix"));
    }
    let op = ShardOp::from_u8(body[0]).ok_or(WireError::Malformed("unknown shard op"))?;
    if body[1] != 0 || le_u32(body, 4) != 0 {
        return Err(WireError::ReservedBits);
    }
    let name_len = usize::from(le_u16(body, 2));
    if name_len > SHARD_NAME_BYTES_MAX {
        return Err(WireError::Malformed(
            "shard name longer than SHARD_NAME_BYTES_MAX",
        ));
    }
    let rest = &body[SHARD_PREFIX_BYTES..];
    if rest.len() < name_len {
        return Err(WireError::Malformed("shard name runs past the body"));
    }
    let (name, payload) = rest.split_at(name_len);
    let name =
        std::str::from_utf8(name).map_err(|_| WireError::Malformed("shard name is not UTF-8"))?;
    Ok(ShardMessage { op, name, payload })
}

/// Reads a `Shard` frame's body.
pub fn decode_request<'a>(frame: &Frame<'a>) -> Result<ShardMessage<'a>, WireError> {
    if frame.header.kind != FrameKind::Shard {
        return Err(WireError::Malformed("not a shard request"));
    }
    decode_body(frame.body)
}

/// Reads a `ShardReply` frame: the op's code (from the header) and body.
pub fn decode_reply<'a>(frame: &Frame<'a>) -> Result<(ErrorCode, ShardMessage<'a>), WireError> {
    if frame.header.kind != FrameKind::ShardReply {
        return Err(WireError::Malformed("not a shard reply"));
    }
    let code = ErrorCode::from_u16(frame.header.status).unwrap_or(ErrorCode::Internal);
    Ok((code, decode_body(frame.body)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode_frame;

    #[test]
    fn request_and_reply_round_trip() {
        let mut out = Vec::new();
        encode_request(&mut out, 7, 1, ShardOp::Get, "users", |b| {
            b.extend_from_slice(b"xyz")
        });
        let f = decode_frame(&out).expect("frame");
        let m = decode_request(&f).expect("request");
        assert_eq!(
            (m.op, m.name, m.payload),
            (ShardOp::Get, "users", &b"xyz"[..])
        );
        out.clear();
        encode_refusal(
            &mut out,
            7,
            1,
            ShardOp::Put,
            ErrorCode::NoSuchShard,
            "no shard",
        );
        let f = decode_frame(&out).expect("frame");
        let (code, m) = decode_reply(&f).expect("reply");
        assert_eq!(
            (code, m.op, m.payload),
            (ErrorCode::NoSuchShard, ShardOp::Put, &b"no shard"[..])
        );
    }

    #[test]
    fn bad_prefixes_are_refused() {
        let mut out = Vec::new();
        encode_request(&mut out, 1, 0, ShardOp::Get, "s", |_| {});
        let body_at = fabrickv_types::limits::FRAME_HEADER_BYTES;
        for (at, byte) in [(0, 99u8), (1, 1), (2, 200), (4, 1)] {
            let mut body = out[body_at..].to_vec();
            body[at] = byte;
            assert!(decode_body(&body).is_err(), "byte {at} = {byte} accepted");
        }
        assert!(decode_body(&[1, 0, 0]).is_err());
        assert!(decode_body(&[1, 0, 2, 0, 0, 0, 0, 0, 0xff, 0xfe]).is_err());
    }
}
