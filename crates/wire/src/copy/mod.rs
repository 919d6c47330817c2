//! The shard copy's wire formats, sans-I/O: the control payloads (carried
//! in SHARD frames of the native protocol, ops CHECKPOINT, START, STATUS,
//! END; [`control`]) and the data streams' opening and frames (plain TCP,
//! source to target; [`stream`]). The source (in the server's shard
//! service) and the target (`fabrickv-copy`) both speak it through this
//! module, so neither depends on the other.
//!
//! One run of a copy, from its CHECKPOINT to its END, is a *copy run*:
//! the source's snapshot, its ranges and its data streams, named by the
//! run id and token the CHECKPOINT reply gives. A copy resumed after a
//! crash is a new run on a new checkpoint.
//!
//! All integers are little-endian. Keys are byte strings (the empty key
//! included) written as `u32 len, bytes`.
//!
//! Control payloads:
//!
//! ```text
//! CHECKPOINT request (name = the shard):
//!     u32 ranges (1..=COPY_RANGES_MAX), u32 boundaries (0, or ranges - 1),
//!     key x boundaries       the lower bound of ranges 1.. (a resumed copy
//!                            sends the ranges it had; 0 = source splits)
//! CHECKPOINT reply: u64 run_id, u64 token, u16 data_port, u16 0, u32 0
//! START request:  u64 run_id, u64 token, u16 streams (1..=COPY_STREAMS_MAX),
//!     u16 0, u32 entries (<= ranges), entry x entries
//!     entry: u32 range, u8 done, u8[3] 0, u64 next_seq, Digest (32),
//!            key after   (the range resumes after this key; done: skipped)
//! START reply:    empty
//! STATUS / END request: u64 run_id
//! STATUS / END reply: Status (below)
//! Status: u8 state, u8 ready, u16 error code, u32 ranges, u32 ranges_done,
//!     u32 message_len, u64 pairs_sent, u64 bytes_sent, u64 pairs_estimate,
//!     u64 bytes_estimate, message (UTF-8), and when ready: u32 boundaries,
//!     key x boundaries
//! Digest: u64 pairs, u64 bytes, u128 sum
//! ```
//!
//! A data stream opens with the target's 32-byte opening (u32 STREAM_OPENING_MAGIC,
//! u32 version 1, u64 run_id, u64 token, u32 stream, u32 0); then the
//! source sends frames, each a 64-byte header and a payload:
//!
//! ```text
//! 0  u32 FRAME_MAGIC   4  u8 kind (1 DATA, 2 END_OF_RANGE, 3 ABORT)
//! 5  u8[3] 0           8  u32 range
//! 12 u32 pairs         16 u64 seq (per range, consecutive from 0)
//! 24 u32 payload_len   28 u32 0
//! 32 Digest: the range's running digest after this frame
//! DATA payload: pairs x (u32 key_len, u32 value_len, key, value)
//! END_OF_RANGE: no payload; the digest is the range's total
//! ABORT payload: u16 error code, UTF-8 message (the source failed)
//! ```
//!
//! Why the data frames have a header of their own rather than the native
//! 32-byte [`crate::header`] every other frame uses: the native header
//! bounds a body by `FRAME_BODY_BYTES_MAX` (about 1 MiB, checked by every
//! native port before it buffers a body) and its op count by
//! `BATCH_OPS_MAX`, while a data frame holds a 1 MiB batch plus one whole
//! pair of up to `SHARD_VALUE_BYTES_MAX` (64 MiB) and thousands of pairs;
//! and the native header's CRC-32C over the body would be a second pass
//! over every byte copied, which the copy does not need: every frame
//! carries the range's running digest (XXH3-128 of each pair), which the
//! target checks frame by frame and which also proves the order and
//! completeness of the range. Making the native header carry copy frames
//! would take a per-kind body bound and a checksum rule that skips the
//! payload, two exceptions in the header every port trusts, to save 32
//! bytes per MiB. The copy is spoken only between two fabrickv processes of
//! one build, so the two headers can be merged later without a version
//! dance if that trade changes.
//!
//! Control payloads are decoded into owned values (boundaries, messages;
//! once per op, a few per copy); data frames and their pairs are decoded
//! without allocating, and nothing here panics on any input.

pub mod control;
pub mod stream;
#[cfg(test)]
mod tests;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use fabrickv_types::limits::{SHARD_KEY_BYTES_MAX, SHARD_VALUE_BYTES_MAX};
use fabrickv_types::{Digest, ErrorCode};

pub use control::{
    decode_run_id, encode_run_id, range_bounds, CheckpointReply, CheckpointRequest, ResumePoint,
    StartRequest, Status,
};
pub use stream::{
    decode_abort, encode_abort, put_pair, DataFrameHeader, DataFrameKind, Pairs, StreamOpening,
};

/// Most ranges a copy is split into.
pub const COPY_RANGES_MAX: u32 = 1024;

/// Most data streams (parallel range iterators) of one copy.
pub const COPY_STREAMS_MAX: u16 = 64;

/// Bytes of pairs a source packs into one DATA frame before sending it:
/// large enough that a frame's header and the per-frame work are noise,
/// small enough that a queue of frames stays a few MiB per stream.
pub const COPY_FRAME_PAYLOAD_BYTES: usize = 1 << 20;

/// Largest payload a target accepts in one frame, in bytes: a full frame
/// plus one pair of the largest size the shard allows (a pair is never
/// split across frames).
pub const COPY_FRAME_PAYLOAD_BYTES_MAX: usize =
    COPY_FRAME_PAYLOAD_BYTES + 8 + SHARD_KEY_BYTES_MAX + SHARD_VALUE_BYTES_MAX;

/// Total bytes of range boundaries in a control message; a source whose
/// sampled keys are longer splits into fewer ranges.
pub const COPY_BOUNDARY_BYTES_MAX: usize = 512 << 10;

/// Bytes of a data frame's header.
pub const DATA_FRAME_HEADER_BYTES: usize = 64;

/// Bytes of a data stream's opening.
pub const STREAM_OPENING_BYTES: usize = 32;

/// First four bytes of every data frame ("FKCD").
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"FKCD");

/// First four bytes of a data stream's opening ("FKCH").
pub const STREAM_OPENING_MAGIC: u32 = u32::from_le_bytes(*b"FKCH");

/// Version of the data stream format.
pub const STREAM_VERSION: u32 = 1;

/// Bytes of an encoded [`Digest`].
pub const DIGEST_BYTES: usize = 32;

/// A copy run's state, named as the RocksDB shard replicator (the copy
/// tool FabricKV's copy replaces) names them, so its operators' scripts
/// read the same words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CopyState {
    /// The checkpoint exists (or is being split); nothing streams yet.
    Idle = 0,
    /// Ranges are streaming.
    InProgress = 1,
    /// Every range was sent to its end.
    Done = 2,
    /// The copy failed; the status carries the code and a message.
    Error = 3,
    /// Ended (END, or every stream gone) before it was done.
    Stopped = 4,
}

impl CopyState {
    /// Parses a state byte.
    pub fn from_u8(v: u8) -> Option<CopyState> {
        Some(match v {
            0 => CopyState::Idle,
            1 => CopyState::InProgress,
            2 => CopyState::Done,
            3 => CopyState::Error,
            4 => CopyState::Stopped,
            _ => return None,
        })
    }

    /// The name the logs and the CLI print.
    pub fn name(self) -> &'static str {
        match self {
            CopyState::Idle => "IDLE",
            CopyState::InProgress => "IN_PROGRESS",
            CopyState::Done => "DONE",
            CopyState::Error => "ERROR",
            CopyState::Stopped => "STOPPED",
        }
    }
}

/// Why bytes are not a valid control payload or data frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub &'static str);

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed copy message: {}", self.0)
    }
}

impl std::error::Error for ProtoError {}

impl ProtoError {
    /// The stable code of a malformed message.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::Malformed
    }
}

/// Reads a payload front to back; every read is bounds-checked.
pub(crate) struct Reader<'a> {
    /// The bytes not read yet.
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Reader { b }
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        if self.b.len() < n {
            return Err(ProtoError(what));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtoError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn digest(&mut self) -> Result<Digest, ProtoError> {
        Ok(Digest {
            pairs: self.u64("digest")?,
            bytes: self.u64("digest")?,
            sum: u128::from_le_bytes(self.array("digest")?),
        })
    }

    /// A `u32 len, bytes` key of at most `SHARD_KEY_BYTES_MAX` bytes.
    pub(crate) fn key(&mut self) -> Result<&'a [u8], ProtoError> {
        let n = self.u32("key length")? as usize;
        if n > SHARD_KEY_BYTES_MAX {
            return Err(ProtoError("key longer than SHARD_KEY_BYTES_MAX"));
        }
        self.take(n, "key runs past the message")
    }

    pub(crate) fn zero(&mut self, n: usize) -> Result<(), ProtoError> {
        if self.take(n, "reserved bytes")?.iter().any(|&b| b != 0) {
            return Err(ProtoError("reserved bytes are not 0"));
        }
        Ok(())
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }

    /// Whether every byte was read.
    pub(crate) fn is_empty(&self) -> bool {
        self.b.is_empty()
    }

    /// Drops what is left (a payload that stopped making sense).
    pub(crate) fn clear(&mut self) {
        self.b = &[];
    }

    pub(crate) fn end(&self) -> Result<(), ProtoError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(ProtoError("trailing bytes"))
        }
    }
}

pub(crate) fn put_key(out: &mut Vec<u8>, key: &[u8]) {
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
}

/// Appends a digest's 32 bytes.
pub(crate) fn put_digest(out: &mut Vec<u8>, d: &Digest) {
    out.extend_from_slice(&d.pairs.to_le_bytes());
    out.extend_from_slice(&d.bytes.to_le_bytes());
    out.extend_from_slice(&d.sum.to_le_bytes());
}

/// The host the data streams of a copy use, from a native address: its IP
/// when it has one (`HOST:PORT`, `tcp://HOST:PORT`,
/// `fabric://PROVIDER/HOST:PORT`), else loopback (shm and inproc addresses
/// are local). The source binds its data port there and the target
/// connects there, so both read the address alike.
pub fn data_host(addr: &str) -> IpAddr {
    let bare = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let bare = bare.rsplit('/').next().unwrap_or(bare);
    bare.parse::<SocketAddr>()
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}
