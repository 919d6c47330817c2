//! The copy's wire formats: control payloads (carried in SHARD frames of
//! the native protocol, ops CHECKPOINT, START, STATUS, END) and the data
//! streams' frames (plain TCP, source to target).
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
//! CHECKPOINT reply: u64 session, u64 token, u16 data_port, u16 0, u32 0
//! START request:  u64 session, u64 token, u16 streams (1..=COPY_STREAMS_MAX),
//!     u16 0, u32 entries (<= ranges), entry x entries
//!     entry: u32 range, u8 done, u8[3] 0, u64 next_seq, Digest (32),
//!            key after   (the range resumes after this key; done: skipped)
//! START reply:    empty
//! STATUS / END request: u64 session
//! STATUS / END reply: Status (below)
//! Status: u8 state, u8 ready, u16 error code, u32 ranges, u32 ranges_done,
//!     u32 message_len, u64 pairs_sent, u64 bytes_sent, u64 pairs_estimate,
//!     u64 bytes_estimate, message (UTF-8), and when ready: u32 boundaries,
//!     key x boundaries
//! Digest: u64 pairs, u64 bytes, u128 sum
//! ```
//!
//! A data stream opens with the target's 32-byte hello (u32 HELLO_MAGIC,
//! u32 version 1, u64 session, u64 token, u32 stream, u32 0); then the
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

use std::ops::Bound;

use fabrickv_storage::{Digest, SHARD_KEY_BYTES_MAX, SHARD_VALUE_BYTES_MAX};
use fabrickv_types::ErrorCode;

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
pub const FRAME_HEADER_BYTES: usize = 64;

/// Bytes of a data stream's hello.
pub const HELLO_BYTES: usize = 32;

/// First four bytes of every data frame ("FKCD").
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"FKCD");

/// First four bytes of a data stream's hello ("FKCH").
pub const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"FKCH");

/// Version of the data stream format.
pub const STREAM_VERSION: u32 = 1;

/// Bytes of an encoded [`Digest`].
pub const DIGEST_BYTES: usize = 32;

/// A copy session's state, as the seed's replicator names them.
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
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed copy message: {0}")]
pub struct ProtoError(pub &'static str);

impl ProtoError {
    /// The stable code of a malformed message.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::Malformed
    }
}

/// Reads a payload front to back; every read is bounds-checked.
pub(crate) struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Reader { b }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
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

    pub(crate) fn end(&self) -> Result<(), ProtoError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(ProtoError("trailing bytes"))
        }
    }
}

fn put_key(out: &mut Vec<u8>, key: &[u8]) {
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
}

/// Appends a digest's 32 bytes.
pub fn put_digest(out: &mut Vec<u8>, d: &Digest) {
    out.extend_from_slice(&d.pairs.to_le_bytes());
    out.extend_from_slice(&d.bytes.to_le_bytes());
    out.extend_from_slice(&d.sum.to_le_bytes());
}

fn read_boundaries<'a>(r: &mut Reader<'a>, n: u32) -> Result<Vec<&'a [u8]>, ProtoError> {
    if n >= COPY_RANGES_MAX {
        return Err(ProtoError("more boundaries than COPY_RANGES_MAX"));
    }
    let mut v = Vec::with_capacity(n as usize);
    let mut total = 0usize;
    for _ in 0..n {
        let k = r.key()?;
        total += k.len();
        if total > COPY_BOUNDARY_BYTES_MAX {
            return Err(ProtoError("boundaries exceed COPY_BOUNDARY_BYTES_MAX"));
        }
        if v.last().is_some_and(|last: &&[u8]| *last >= k) {
            return Err(ProtoError("boundaries do not ascend"));
        }
        v.push(k);
    }
    Ok(v)
}

/// The bounds of range `r` of a copy split at `boundaries` (the lower
/// bounds of ranges 1..), so that source and target cut ranges alike.
pub fn range_bounds(boundaries: &[Vec<u8>], r: usize) -> (Bound<&[u8]>, Bound<&[u8]>) {
    let from = r
        .checked_sub(1)
        .and_then(|i| boundaries.get(i))
        .map_or(Bound::Unbounded, |b| Bound::Included(b.as_slice()));
    let to = boundaries
        .get(r)
        .map_or(Bound::Unbounded, |b| Bound::Excluded(b.as_slice()));
    (from, to)
}

/// A CHECKPOINT request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRequest<'a> {
    /// Ranges wanted.
    pub ranges: u32,
    /// Lower bounds of ranges 1.. (empty: the source splits).
    pub boundaries: Vec<&'a [u8]>,
}

impl<'a> CheckpointRequest<'a> {
    /// Appends the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ranges.to_le_bytes());
        out.extend_from_slice(&(self.boundaries.len() as u32).to_le_bytes());
        for b in &self.boundaries {
            put_key(out, b);
        }
    }

    /// Reads a payload.
    pub fn decode(b: &'a [u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b);
        let ranges = r.u32("ranges")?;
        if ranges == 0 || ranges > COPY_RANGES_MAX {
            return Err(ProtoError("ranges must be 1..=COPY_RANGES_MAX"));
        }
        let n = r.u32("boundaries")?;
        if n != 0 && n != ranges - 1 {
            return Err(ProtoError("boundaries must be 0 or ranges - 1"));
        }
        let boundaries = read_boundaries(&mut r, n)?;
        r.end()?;
        Ok(CheckpointRequest { ranges, boundaries })
    }
}

/// A CHECKPOINT reply: the session and where its data streams connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointReply {
    /// The session id.
    pub session: u64,
    /// The secret a data stream's hello must carry.
    pub token: u64,
    /// The TCP port of the data streams (on the server's host).
    pub data_port: u16,
}

impl CheckpointReply {
    /// Appends the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.data_port.to_le_bytes());
        out.extend_from_slice(&[0u8; 6]);
    }

    /// Reads a payload.
    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b);
        let session = r.u64("session")?;
        let token = r.u64("token")?;
        let data_port = r.u16("data port")?;
        r.zero(6)?;
        r.end()?;
        Ok(CheckpointReply {
            session,
            token,
            data_port,
        })
    }
}

/// Where one range resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The range.
    pub range: u32,
    /// The range was written to its end: skip it.
    pub done: bool,
    /// The sequence number of the range's next frame.
    pub next_seq: u64,
    /// The digest of the pairs the target holds durably.
    pub digest: Digest,
    /// The last key the target holds durably; the range resumes after it.
    pub after: Vec<u8>,
}

/// A START request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRequest {
    /// The session.
    pub session: u64,
    /// Its token.
    pub token: u64,
    /// Data streams the target will open.
    pub streams: u16,
    /// Ranges that do not start from their beginning.
    pub resume: Vec<ResumePoint>,
}

impl StartRequest {
    /// Appends the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.streams.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(self.resume.len() as u32).to_le_bytes());
        for p in &self.resume {
            out.extend_from_slice(&p.range.to_le_bytes());
            out.push(u8::from(p.done));
            out.extend_from_slice(&[0u8; 3]);
            out.extend_from_slice(&p.next_seq.to_le_bytes());
            put_digest(out, &p.digest);
            put_key(out, &p.after);
        }
    }

    /// Reads a payload.
    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b);
        let session = r.u64("session")?;
        let token = r.u64("token")?;
        let streams = r.u16("streams")?;
        if streams == 0 || streams > COPY_STREAMS_MAX {
            return Err(ProtoError("streams must be 1..=COPY_STREAMS_MAX"));
        }
        r.zero(2)?;
        let n = r.u32("resume entries")?;
        if n > COPY_RANGES_MAX {
            return Err(ProtoError("more resume entries than COPY_RANGES_MAX"));
        }
        let mut resume = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let range = r.u32("range")?;
            let done = match r.u8("done")? {
                0 => false,
                1 => true,
                _ => return Err(ProtoError("done is not 0 or 1")),
            };
            r.zero(3)?;
            let next_seq = r.u64("next seq")?;
            let digest = r.digest()?;
            let after = r.key()?.to_vec();
            resume.push(ResumePoint {
                range,
                done,
                next_seq,
                digest,
                after,
            });
        }
        r.end()?;
        Ok(StartRequest {
            session,
            token,
            streams,
            resume,
        })
    }
}

/// Appends a STATUS or END request (the session id).
pub fn encode_session(out: &mut Vec<u8>, session: u64) {
    out.extend_from_slice(&session.to_le_bytes());
}

/// Reads a STATUS or END request.
pub fn decode_session(b: &[u8]) -> Result<u64, ProtoError> {
    let mut r = Reader::new(b);
    let s = r.u64("session")?;
    r.end()?;
    Ok(s)
}

/// A session's state and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Where the session is.
    pub state: CopyState,
    /// Whether the checkpoint is split (`boundaries` is then set).
    pub ready: bool,
    /// Why it failed (`Ok` unless ERROR).
    pub error: ErrorCode,
    /// Ranges of the checkpoint.
    pub ranges: u32,
    /// Ranges sent to their end.
    pub ranges_done: u32,
    /// Pairs sent so far.
    pub pairs_sent: u64,
    /// Key and value bytes sent so far.
    pub bytes_sent: u64,
    /// Pairs in the shard, estimated.
    pub pairs_estimate: u64,
    /// Key and value bytes in the shard, estimated from the samples.
    pub bytes_estimate: u64,
    /// What went wrong, or empty.
    pub message: String,
    /// Lower bounds of ranges 1.. once `ready`.
    pub boundaries: Vec<Vec<u8>>,
}

impl Status {
    /// Appends the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.state as u8);
        out.push(u8::from(self.ready));
        out.extend_from_slice(&self.error.as_u16().to_le_bytes());
        out.extend_from_slice(&self.ranges.to_le_bytes());
        out.extend_from_slice(&self.ranges_done.to_le_bytes());
        let msg = &self.message.as_bytes()[..self.message.len().min(1024)];
        out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
        for v in [
            self.pairs_sent,
            self.bytes_sent,
            self.pairs_estimate,
            self.bytes_estimate,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(msg);
        if self.ready {
            out.extend_from_slice(&(self.boundaries.len() as u32).to_le_bytes());
            for b in &self.boundaries {
                put_key(out, b);
            }
        }
    }

    /// Reads a payload.
    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b);
        let state = CopyState::from_u8(r.u8("state")?).ok_or(ProtoError("unknown state"))?;
        let ready = r.u8("ready")? != 0;
        let error = ErrorCode::from_u16(r.u16("error")?).unwrap_or(ErrorCode::Internal);
        let ranges = r.u32("ranges")?;
        let ranges_done = r.u32("ranges done")?;
        let msg_len = r.u32("message length")? as usize;
        let pairs_sent = r.u64("pairs")?;
        let bytes_sent = r.u64("bytes")?;
        let pairs_estimate = r.u64("pairs estimate")?;
        let bytes_estimate = r.u64("bytes estimate")?;
        let message = String::from_utf8_lossy(r.take(msg_len, "message")?).into_owned();
        let boundaries = if ready {
            let n = r.u32("boundaries")?;
            read_boundaries(&mut r, n)?
                .into_iter()
                .map(<[u8]>::to_vec)
                .collect()
        } else {
            Vec::new()
        };
        r.end()?;
        Ok(Status {
            state,
            ready,
            error,
            ranges,
            ranges_done,
            pairs_sent,
            bytes_sent,
            pairs_estimate,
            bytes_estimate,
            message,
            boundaries,
        })
    }
}

/// A data stream's hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The session.
    pub session: u64,
    /// Its token.
    pub token: u64,
    /// Which stream of the session this is.
    pub stream: u32,
}

impl Hello {
    /// The hello's bytes.
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&STREAM_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.session.to_le_bytes());
        b[16..24].copy_from_slice(&self.token.to_le_bytes());
        b[24..28].copy_from_slice(&self.stream.to_le_bytes());
        b
    }

    /// Reads a hello.
    pub fn decode(b: &[u8; HELLO_BYTES]) -> Result<Hello, ProtoError> {
        let mut r = Reader::new(b);
        if r.u32("magic")? != HELLO_MAGIC {
            return Err(ProtoError("not a copy stream hello"));
        }
        if r.u32("version")? != STREAM_VERSION {
            return Err(ProtoError("unsupported copy stream version"));
        }
        let session = r.u64("session")?;
        let token = r.u64("token")?;
        let stream = r.u32("stream")?;
        r.zero(4)?;
        Ok(Hello {
            session,
            token,
            stream,
        })
    }
}

/// What a data frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Pairs of a range, in key order.
    Data = 1,
    /// The range is complete; the digest is its total.
    EndOfRange = 2,
    /// The source failed; the payload says why.
    Abort = 3,
}

/// A data frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the frame carries.
    pub kind: FrameKind,
    /// The range.
    pub range: u32,
    /// Pairs in the payload.
    pub pairs: u32,
    /// The frame's sequence number within its range.
    pub seq: u64,
    /// Bytes after the header.
    pub payload_len: u32,
    /// The range's running digest after this frame.
    pub digest: Digest,
}

impl FrameHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut b = Vec::with_capacity(FRAME_HEADER_BYTES);
        b.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
        b.push(self.kind as u8);
        b.extend_from_slice(&[0u8; 3]);
        b.extend_from_slice(&self.range.to_le_bytes());
        b.extend_from_slice(&self.pairs.to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.payload_len.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        put_digest(&mut b, &self.digest);
        let mut a = [0u8; FRAME_HEADER_BYTES];
        a.copy_from_slice(&b);
        a
    }

    /// Reads and checks a header (the payload length against its bound).
    pub fn decode(b: &[u8; FRAME_HEADER_BYTES]) -> Result<FrameHeader, ProtoError> {
        let mut r = Reader::new(b);
        if r.u32("magic")? != FRAME_MAGIC {
            return Err(ProtoError("not a copy data frame"));
        }
        let kind = match r.u8("kind")? {
            1 => FrameKind::Data,
            2 => FrameKind::EndOfRange,
            3 => FrameKind::Abort,
            _ => return Err(ProtoError("unknown data frame kind")),
        };
        r.zero(3)?;
        let range = r.u32("range")?;
        let pairs = r.u32("pairs")?;
        let seq = r.u64("seq")?;
        let payload_len = r.u32("payload length")?;
        if payload_len as usize > COPY_FRAME_PAYLOAD_BYTES_MAX {
            return Err(ProtoError(
                "payload longer than COPY_FRAME_PAYLOAD_BYTES_MAX",
            ));
        }
        r.zero(4)?;
        let digest = r.digest()?;
        Ok(FrameHeader {
            kind,
            range,
            pairs,
            seq,
            payload_len,
            digest,
        })
    }
}

/// Appends one pair to a DATA payload.
pub fn put_pair(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// The pairs of a DATA payload, each checked against the shard's bounds.
pub struct Pairs<'a> {
    r: Reader<'a>,
}

impl<'a> Pairs<'a> {
    /// Iterates `payload`.
    pub fn new(payload: &'a [u8]) -> Self {
        Pairs {
            r: Reader::new(payload),
        }
    }
}

impl<'a> Iterator for Pairs<'a> {
    type Item = Result<(&'a [u8], &'a [u8]), ProtoError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.r.b.is_empty() {
            return None;
        }
        let pair = (|| {
            let klen = self.r.u32("key length")? as usize;
            let vlen = self.r.u32("value length")? as usize;
            if klen > SHARD_KEY_BYTES_MAX || vlen > SHARD_VALUE_BYTES_MAX {
                return Err(ProtoError("pair beyond the shard's bounds"));
            }
            let k = self.r.take(klen, "key runs past the frame")?;
            let v = self.r.take(vlen, "value runs past the frame")?;
            Ok((k, v))
        })();
        if pair.is_err() {
            // One error ends the payload: nothing after it can be framed.
            self.r.b = &[];
        }
        Some(pair)
    }
}

/// An ABORT payload: code and message.
pub fn encode_abort(out: &mut Vec<u8>, code: ErrorCode, why: &str) {
    out.extend_from_slice(&code.as_u16().to_le_bytes());
    out.extend_from_slice(&why.as_bytes()[..why.len().min(1024)]);
}

/// Reads an ABORT payload.
pub fn decode_abort(b: &[u8]) -> (ErrorCode, String) {
    let mut r = Reader::new(b);
    let code = r
        .u16("code")
        .ok()
        .and_then(ErrorCode::from_u16)
        .unwrap_or(ErrorCode::Internal);
    (code, String::from_utf8_lossy(r.rest()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest() -> Digest {
        let mut d = Digest::default();
        d.add(b"", b"empty key");
        d.add(b"k", b"v");
        d
    }

    #[test]
    fn control_payloads_round_trip() {
        let mut b = Vec::new();
        let cp = CheckpointRequest {
            ranges: 3,
            boundaries: vec![b"g", b"p"],
        };
        cp.encode(&mut b);
        assert_eq!(CheckpointRequest::decode(&b), Ok(cp));

        let st = StartRequest {
            session: 9,
            token: 77,
            streams: 2,
            resume: vec![ResumePoint {
                range: 1,
                done: false,
                next_seq: 5,
                digest: digest(),
                after: Vec::new(),
            }],
        };
        b.clear();
        st.encode(&mut b);
        assert_eq!(StartRequest::decode(&b), Ok(st));

        let status = Status {
            state: CopyState::Error,
            ready: true,
            error: ErrorCode::StorageFailed,
            ranges: 2,
            ranges_done: 1,
            pairs_sent: 10,
            bytes_sent: 100,
            pairs_estimate: 20,
            bytes_estimate: 200,
            message: "disk".into(),
            boundaries: vec![b"m".to_vec()],
        };
        b.clear();
        status.encode(&mut b);
        assert_eq!(Status::decode(&b), Ok(status));
    }

    #[test]
    fn frames_and_pairs_round_trip_the_empty_key_included() {
        let h = FrameHeader {
            kind: FrameKind::Data,
            range: 4,
            pairs: 2,
            seq: 12,
            payload_len: 30,
            digest: digest(),
        };
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
        let mut p = Vec::new();
        put_pair(&mut p, b"", b"empty key");
        put_pair(&mut p, b"k", b"");
        let got: Vec<_> = Pairs::new(&p).collect::<Result<_, _>>().expect("pairs");
        assert_eq!(
            got,
            vec![(&b""[..], &b"empty key"[..]), (&b"k"[..], &b""[..])]
        );
        let hello = Hello {
            session: 1,
            token: 2,
            stream: 3,
        };
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
    }

    #[test]
    fn bad_input_is_refused_never_panics() {
        assert!(CheckpointRequest::decode(&[0; 8]).is_err(), "0 ranges");
        let mut b = Vec::new();
        CheckpointRequest {
            ranges: 3,
            boundaries: vec![b"p", b"g"],
        }
        .encode(&mut b);
        assert!(CheckpointRequest::decode(&b).is_err(), "descending");
        let mut h = FrameHeader {
            kind: FrameKind::Data,
            range: 0,
            pairs: 0,
            seq: 0,
            payload_len: 0,
            digest: Digest::default(),
        }
        .encode();
        h[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(FrameHeader::decode(&h).is_err(), "oversized payload");
        let mut p = Vec::new();
        put_pair(&mut p, b"key", b"value");
        p.truncate(p.len() - 1);
        assert!(Pairs::new(&p).any(|r| r.is_err()), "truncated pair");
        // Arbitrary bytes: errors, no panic.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = CheckpointRequest::decode(&bytes);
            let _ = StartRequest::decode(&bytes);
            let _ = Status::decode(&bytes);
            let _ = Pairs::new(&bytes).count();
            let _ = decode_abort(&bytes);
        }
    }
}
