//! The fixed frame header.
//!
//! ```text
//! offset size field
//!      0    2 magic        0x4B46 ("FK" in memory order)
//!      2    1 version      1
//!      3    1 kind         FrameKind
//!      4    2 flags        reserved, must be 0
//!      6    2 op_count     operations (requests) or results (responses)
//!      8    8 request_id   chosen by the client, echoed by the server
//!     16    4 body_len     bytes after the header
//!     20    4 checksum     CRC-32C of the body
//!     24    2 worker       worker the frame is for (request) or from (reply)
//!     26    2 status       frame-level ErrorCode (replies), 0 in requests;
//!                          in a RESPONSE, WRONG_WORKER is a hint, not a
//!                          refusal: every result stands, but some
//!                          operation was for a partition this worker does
//!                          not own (the client's partition table is stale)
//!     28    4 map_epoch    requests of a cluster client: the slot map
//!                          epoch it routed them by (0: none, no check);
//!                          a server runs no write of such a frame to a
//!                          group whose primary took it over at a later
//!                          epoch, so a request held up in the network
//!                          across a failover and back never runs late.
//!                          0 in replies
//! ```

use std::fmt;

use fabrickv_types::limits::{BATCH_OPS_MAX, FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES};
use fabrickv_types::ErrorCode;

use crate::{le_u16, le_u32, le_u64};

/// First two bytes of every frame.
pub const MAGIC: u16 = 0x4B46;

/// The protocol version this crate speaks.
pub const VERSION: u8 = 1;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Client asks for the server's shape (workers, partitions, limits).
    Hello = 1,
    /// Server's answer to `Hello`.
    HelloReply = 2,
    /// A batch of key-value operations.
    Request = 3,
    /// One result per operation of a `Request`, in the same order.
    Response = 4,
    /// Client asks for the worker's statistics.
    Stats = 5,
    /// Named counters of one worker.
    StatsReply = 6,
    /// The whole frame was refused; `status` says why, the body is a message.
    Error = 7,
    /// An embedding-table (parameter server) request (`crate::ps`).
    Ps = 8,
    /// The answer to a `Ps` request.
    PsReply = 9,
    /// A KV-cache request (`crate::cache`).
    Cache = 10,
    /// The answer to a `Cache` request.
    CacheReply = 11,
    /// A persistent-shard request: data or copy control (`crate::shard`).
    Shard = 12,
    /// The answer to a `Shard` request.
    ShardReply = 13,
    /// Asks for the partition table, or moves one partition to another
    /// worker and asks for the new table (`crate::control`).
    Partitions = 14,
    /// The partition table: its epoch, each partition's owner and counters.
    PartitionsReply = 15,
    /// Bytes to send back unchanged (`crate::echo`): served only by a
    /// server that registers the echo service (`fabrickv bench rpc`).
    Echo = 16,
    /// The answer to an `Echo`: the request's body.
    EchoReply = 17,
    /// Starts a checkpoint save, or asks how saves went (`crate::control`).
    Checkpoint = 18,
    /// The server's checkpoint status.
    CheckpointReply = 19,
}

impl FrameKind {
    /// Parses a kind byte.
    pub fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Hello,
            2 => FrameKind::HelloReply,
            3 => FrameKind::Request,
            4 => FrameKind::Response,
            5 => FrameKind::Stats,
            6 => FrameKind::StatsReply,
            7 => FrameKind::Error,
            8 => FrameKind::Ps,
            9 => FrameKind::PsReply,
            10 => FrameKind::Cache,
            11 => FrameKind::CacheReply,
            12 => FrameKind::Shard,
            13 => FrameKind::ShardReply,
            14 => FrameKind::Partitions,
            15 => FrameKind::PartitionsReply,
            16 => FrameKind::Echo,
            17 => FrameKind::EchoReply,
            18 => FrameKind::Checkpoint,
            19 => FrameKind::CheckpointReply,
            _ => return None,
        })
    }
}

/// Why bytes are not a valid frame. Each maps to a stable [`ErrorCode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Shorter than a header, or body length disagrees with the message.
    Truncated,
    /// The first two bytes are not [`MAGIC`].
    BadMagic,
    /// A version this crate does not speak.
    UnsupportedVersion(u8),
    /// An unknown frame kind.
    UnknownKind(u8),
    /// Reserved bits set.
    ReservedBits,
    /// The body is longer than `FRAME_BODY_BYTES_MAX`.
    FrameTooLarge(u32),
    /// More operations than `BATCH_OPS_MAX`.
    BatchTooLarge(u16),
    /// The checksum does not match the body.
    BadChecksum,
    /// The body's structure disagrees with its own lengths or op count.
    Malformed(&'static str),
}

impl WireError {
    /// The stable code sent back to the client for this error.
    pub fn code(self) -> ErrorCode {
        match self {
            WireError::Truncated | WireError::BadMagic | WireError::ReservedBits => {
                ErrorCode::Malformed
            }
            WireError::Malformed(_) => ErrorCode::Malformed,
            WireError::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
            WireError::UnknownKind(_) => ErrorCode::UnknownOpcode,
            WireError::FrameTooLarge(_) => ErrorCode::FrameTooLarge,
            WireError::BatchTooLarge(_) => ErrorCode::BatchTooLarge,
            WireError::BadChecksum => ErrorCode::BadChecksum,
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => write!(f, "truncated frame"),
            WireError::BadMagic => write!(f, "bad magic"),
            WireError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "unsupported protocol version {v} (this side speaks {VERSION})"
                )
            }
            WireError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            WireError::ReservedBits => write!(f, "reserved header bits are set"),
            WireError::FrameTooLarge(n) => {
                write!(f, "frame body of {n} bytes exceeds {FRAME_BODY_BYTES_MAX}")
            }
            WireError::BatchTooLarge(n) => {
                write!(f, "{n} operations in one frame exceed {BATCH_OPS_MAX}")
            }
            WireError::BadChecksum => write!(f, "checksum mismatch"),
            WireError::Malformed(why) => write!(f, "malformed frame: {why}"),
        }
    }
}

impl std::error::Error for WireError {}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the frame carries.
    pub kind: FrameKind,
    /// Operations or results in the body.
    pub op_count: u16,
    /// Client-chosen id, echoed in the reply so replies can be matched.
    pub request_id: u64,
    /// Bytes after the header.
    pub body_len: u32,
    /// CRC-32C of the body.
    pub checksum: u32,
    /// Worker the frame is addressed to or comes from.
    pub worker: u16,
    /// Frame-level status (replies only).
    pub status: u16,
    /// The slot map epoch a cluster client built the request under,
    /// capped at `u32::MAX` (0: none). See the module's table.
    pub map_epoch: u32,
}

impl FrameHeader {
    /// Parses and checks the fixed header. It does not look at the body.
    pub fn decode(b: &[u8]) -> Result<FrameHeader, WireError> {
        if b.len() < FRAME_HEADER_BYTES {
            return Err(WireError::Truncated);
        }
        if le_u16(b, 0) != MAGIC {
            return Err(WireError::BadMagic);
        }
        if b[2] != VERSION {
            return Err(WireError::UnsupportedVersion(b[2]));
        }
        let kind = FrameKind::from_u8(b[3]).ok_or(WireError::UnknownKind(b[3]))?;
        if le_u16(b, 4) != 0 {
            return Err(WireError::ReservedBits);
        }
        let op_count = le_u16(b, 6);
        if usize::from(op_count) > BATCH_OPS_MAX {
            return Err(WireError::BatchTooLarge(op_count));
        }
        let body_len = le_u32(b, 16);
        if body_len as usize > FRAME_BODY_BYTES_MAX {
            return Err(WireError::FrameTooLarge(body_len));
        }
        Ok(FrameHeader {
            kind,
            op_count,
            request_id: le_u64(b, 8),
            body_len,
            checksum: le_u32(b, 20),
            worker: le_u16(b, 24),
            status: le_u16(b, 26),
            map_epoch: le_u32(b, 28),
        })
    }

    /// Appends a header whose length and checksum are patched later by
    /// [`finish_frame`]; returns the offset of the frame in `out`. The
    /// header is put together on the stack and appended at once: eleven
    /// appends, each checking the vector's room, cost every frame about
    /// 110 instructions (callgrind), the most of any step of a 64-byte
    /// echo but the checksum.
    #[inline]
    pub(crate) fn begin(
        out: &mut Vec<u8>,
        kind: FrameKind,
        request_id: u64,
        worker: u16,
        status: u16,
    ) -> usize {
        let start = out.len();
        // Zeros: op count, flags, body length and checksum (patched by
        // `finish_frame`), and the map epoch (stamped by a cluster
        // client, `RequestBuilder::stamp_map_epoch`).
        let mut h = [0u8; FRAME_HEADER_BYTES];
        h[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        h[2] = VERSION;
        h[3] = kind as u8;
        h[8..16].copy_from_slice(&request_id.to_le_bytes());
        h[24..26].copy_from_slice(&worker.to_le_bytes());
        h[26..28].copy_from_slice(&status.to_le_bytes());
        out.extend_from_slice(&h);
        start
    }
}

/// Fills in op count, body length and checksum of the frame at `start`.
pub(crate) fn finish_frame(out: &mut [u8], start: usize, op_count: u16) {
    let body_len = (out.len() - start - FRAME_HEADER_BYTES) as u32;
    let crc = crate::checksum::crc32c(&out[start + FRAME_HEADER_BYTES..]);
    out[start + 6..start + 8].copy_from_slice(&op_count.to_le_bytes());
    out[start + 16..start + 20].copy_from_slice(&body_len.to_le_bytes());
    out[start + 20..start + 24].copy_from_slice(&crc.to_le_bytes());
}

/// The methods the request and response builders share, written once:
/// `new` (a frame of `$kind` started at the end of `out`), `len`,
/// `is_empty`, `body_bytes` and `finish`, over the builder's
/// [`FrameWriter`] in field `w`. `$new_doc` is `new`'s doc; `$entries`
/// and `$entry` name what the body holds ("Operations", "operation").
macro_rules! frame_builder {
    ($builder:ident, $kind:expr, $new_doc:literal, $entries:literal, $entry:literal) => {
        impl<'b> $builder<'b> {
            #[doc = $new_doc]
            pub fn new(out: &'b mut Vec<u8>, request_id: u64, worker: u16) -> $builder<'b> {
                $builder {
                    w: FrameWriter::new(out, $kind, request_id, worker),
                }
            }

            #[doc = concat!($entries, " added so far.")]
            pub fn len(&self) -> usize {
                self.w.len()
            }

            #[doc = concat!("True if no ", $entry, " was added.")]
            pub fn is_empty(&self) -> bool {
                self.w.len() == 0
            }

            /// Body bytes written so far.
            pub fn body_bytes(&self) -> usize {
                self.w.body_bytes()
            }

            /// Patches the header; the frame is complete in the buffer.
            pub fn finish(self) {
                self.w.finish();
            }
        }
    };
}

/// A frame being appended to a buffer: where it starts and how many
/// entries (operations or results) its body holds. The request and
/// response builders are this plus their entry encodings.
#[derive(Debug)]
pub(crate) struct FrameWriter<'b> {
    pub(crate) out: &'b mut Vec<u8>,
    start: usize,
    count: u16,
}

impl<'b> FrameWriter<'b> {
    pub(crate) fn new(out: &'b mut Vec<u8>, kind: FrameKind, request_id: u64, worker: u16) -> Self {
        let start = FrameHeader::begin(out, kind, request_id, worker, 0);
        FrameWriter {
            out,
            start,
            count: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        usize::from(self.count)
    }

    pub(crate) fn body_bytes(&self) -> usize {
        self.out.len() - self.start - FRAME_HEADER_BYTES
    }

    /// Patches the frame's status field (not covered by the checksum).
    pub(crate) fn set_status(&mut self, status: u16) {
        self.out[self.start + 26..self.start + 28].copy_from_slice(&status.to_le_bytes());
    }

    /// Patches the frame's map epoch field (not covered by the checksum).
    pub(crate) fn set_map_epoch(&mut self, epoch: u32) {
        self.out[self.start + 28..self.start + 32].copy_from_slice(&epoch.to_le_bytes());
    }

    /// Counts one more entry, written by the caller to `out`.
    pub(crate) fn entry_done(&mut self) {
        self.count = self.count.wrapping_add(1);
    }

    pub(crate) fn finish(self) {
        finish_frame(self.out, self.start, self.count);
    }

    /// [`FrameWriter::finish`], handing back the buffer and where the
    /// frame starts in it, for a frame whose body goes on past the buffer.
    pub(crate) fn finish_at(self) -> (&'b mut Vec<u8>, usize) {
        finish_frame(self.out, self.start, self.count);
        (self.out, self.start)
    }
}

/// The entries of a frame body not yet read: the reading side of
/// [`FrameWriter`]. The request and response iterators are this plus
/// their entry decodings (`split`: one entry off the front of a body, and
/// the bytes after it), passed in at each call as a generic, so that each
/// call is inlined with its decoding and compiles as the hand-written
/// loop did: no call through a pointer per entry.
#[derive(Debug, Clone)]
pub(crate) struct Entries<'a> {
    /// The body from the next entry on.
    rest: &'a [u8],
    /// Entries not yet returned.
    left: u16,
}

impl<'a> Entries<'a> {
    /// Checks that `frame` is of `kind` (else `Malformed(not_kind)`), that
    /// its body splits into exactly `op_count` entries (each split's own
    /// error otherwise) and that no bytes follow the last one (else
    /// `Malformed(trailing)`).
    #[inline]
    pub(crate) fn checked<T>(
        frame: &Frame<'a>,
        kind: FrameKind,
        not_kind: &'static str,
        trailing: &'static str,
        split: impl Fn(&'a [u8]) -> Result<(T, &'a [u8]), WireError>,
    ) -> Result<Entries<'a>, WireError> {
        if frame.header.kind != kind {
            return Err(WireError::Malformed(not_kind));
        }
        let mut rest = frame.body;
        for _ in 0..frame.header.op_count {
            rest = split(rest)?.1;
        }
        if !rest.is_empty() {
            return Err(WireError::Malformed(trailing));
        }
        Ok(Entries {
            rest: frame.body,
            left: frame.header.op_count,
        })
    }

    /// The next entry, `None` after the last. The structure was checked
    /// in [`Entries::checked`], so `split` cannot fail here; stop rather
    /// than panic if it somehow does.
    #[inline]
    pub(crate) fn next<T>(
        &mut self,
        split: impl FnOnce(&'a [u8]) -> Result<(T, &'a [u8]), WireError>,
    ) -> Option<T> {
        if self.left == 0 {
            return None;
        }
        let (entry, rest) = split(self.rest).ok()?;
        self.rest = rest;
        self.left -= 1;
        Some(entry)
    }

    /// Entries not yet returned.
    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        usize::from(self.left)
    }
}

/// A whole frame: its header and its body, borrowed from the message.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// The checked header.
    pub header: FrameHeader,
    /// Exactly `header.body_len` bytes, checksum verified.
    pub body: &'a [u8],
}

/// Decodes one transport message as exactly one frame: header checks, the
/// body length must match the message, and the checksum must hold. Body
/// structure is checked by the body decoders.
pub fn decode_frame(msg: &[u8]) -> Result<Frame<'_>, WireError> {
    let header = FrameHeader::decode(msg)?;
    let body = &msg[FRAME_HEADER_BYTES..];
    if body.len() != header.body_len as usize {
        return Err(WireError::Truncated);
    }
    if crate::checksum::crc32c(body) != header.checksum {
        return Err(WireError::BadChecksum);
    }
    Ok(Frame { header, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_frame(kind: FrameKind) -> Vec<u8> {
        let mut v = Vec::new();
        let s = FrameHeader::begin(&mut v, kind, 42, 3, 0);
        finish_frame(&mut v, s, 0);
        v
    }

    #[test]
    fn header_round_trips() {
        let v = empty_frame(FrameKind::Stats);
        assert_eq!(v.len(), FRAME_HEADER_BYTES);
        let f = decode_frame(&v).expect("valid frame");
        assert_eq!(f.header.kind, FrameKind::Stats);
        assert_eq!(f.header.request_id, 42);
        assert_eq!(f.header.worker, 3);
        assert_eq!(f.header.map_epoch, 0, "unstamped");
        assert!(f.body.is_empty());
    }

    #[test]
    fn a_request_carries_its_map_epoch() {
        for (epoch, stamped) in [(7u64, 7u32), (u64::from(u32::MAX) + 5, u32::MAX)] {
            let mut v = Vec::new();
            let mut b = crate::RequestBuilder::new(&mut v, 1, 0);
            b.get(b"k");
            b.stamp_map_epoch(epoch);
            b.finish();
            let f = decode_frame(&v).expect("a stamped frame decodes");
            assert_eq!(f.header.map_epoch, stamped);
        }
    }

    #[test]
    fn rejects_each_broken_field() {
        let good = empty_frame(FrameKind::Hello);
        let mut bad = good.clone();
        bad[0] ^= 1;
        assert_eq!(decode_frame(&bad).err(), Some(WireError::BadMagic));
        let mut bad = good.clone();
        bad[2] = 9;
        assert_eq!(
            decode_frame(&bad).err(),
            Some(WireError::UnsupportedVersion(9))
        );
        let mut bad = good.clone();
        bad[3] = 200;
        assert_eq!(decode_frame(&bad).err(), Some(WireError::UnknownKind(200)));
        let mut bad = good.clone();
        bad[4] = 1;
        assert_eq!(decode_frame(&bad).err(), Some(WireError::ReservedBits));
        let mut bad = good.clone();
        bad[6..8].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(
            decode_frame(&bad).err(),
            Some(WireError::BatchTooLarge(u16::MAX))
        );
        let mut bad = good.clone();
        bad[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_frame(&bad).err(),
            Some(WireError::FrameTooLarge(u32::MAX))
        );
        let mut bad = good.clone();
        bad[16..20].copy_from_slice(&4u32.to_le_bytes());
        assert_eq!(decode_frame(&bad).err(), Some(WireError::Truncated));
        let mut bad = good.clone();
        bad.extend_from_slice(&[0; 4]);
        bad[16..20].copy_from_slice(&4u32.to_le_bytes());
        assert_eq!(decode_frame(&bad).err(), Some(WireError::BadChecksum));
        assert_eq!(decode_frame(&good[..10]).err(), Some(WireError::Truncated));
    }
}
