//! The pipelined executor behind every client call.
//!
//! 1. Each operation goes to the worker the partition table names for its
//!    key's partition; a reply with the WRONG_WORKER hint marks the table
//!    stale, and the next call fetches it first.
//! 2. Per worker, operations are packed into frames of at most
//!    `BATCH_OPS_MAX` operations and `FRAME_BODY_BYTES_MAX` bytes; every
//!    frame is posted before any reply is awaited, and each connection is
//!    flushed once.
//! 3. Replies are read per connection in request order and their results
//!    landed at the operations' positions in a [`Sink`]: [`Outcomes`] (one
//!    `Outcome` each, for [`execute`]) or the caller's `MgetBuf` (values
//!    copied straight from the reply frames, for `Kv::mget_into`).
//!
//! Steps 1-2 ([`post`]) and 3 ([`collect`]) are separate so that the
//! cluster client can post its parts to every server before it waits on
//! any of them. Request ids, the frames in flight and their order, the
//! credits, the waits and the late-reply policy are the request layer's
//! (`fabrickv_rpc::Sessions`, one session per worker); each frame in
//! flight is tagged with its operations' positions ([`FrameTag`]).

use std::time::Instant;

use fabrickv_rpc::Sent;
use fabrickv_types::limits::{
    BATCH_OPS_MAX, KEY_BYTES_MAX, LARGE_CHUNK_BYTES_MAX, VALUE_BYTES_MAX,
};
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::{
    decode_frame, FrameKind, PutCondition, RequestBuilder, ResponseIter, GET_CHUNK_HEAD_BYTES,
    PUT_CHUNK_HEAD_BYTES,
};

use crate::conn::{protocol, refusal};
use crate::{Client, ClientError, Result};

/// One operation of a batch.
#[derive(Debug, Clone, Copy)]
pub enum BatchOp<'a> {
    /// Read a key.
    Get {
        /// The key.
        key: &'a [u8],
    },
    /// Store a value.
    Put {
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
        /// Time-to-live in milliseconds, 0 = none.
        ttl_ms: u64,
        /// When to apply.
        cond: PutCondition,
    },
    /// Remove a key.
    Delete {
        /// The key.
        key: &'a [u8],
    },
    /// One piece of a large value's store ([`crate::Kv::put_with`] sends
    /// a value over `VALUE_BYTES_MAX` as these, in order).
    PutChunk {
        /// The key.
        key: &'a [u8],
        /// The transfer the piece belongs to.
        transfer: u64,
        /// Length of the whole value, in bytes.
        total: u64,
        /// Where the piece starts.
        offset: u64,
        /// The piece (at most `LARGE_CHUNK_BYTES_MAX` bytes).
        bytes: &'a [u8],
        /// Time-to-live in milliseconds, 0 = none.
        ttl_ms: u64,
        /// When to apply.
        cond: PutCondition,
    },
    /// One piece of a value a GET answered `LARGE_VALUE` for.
    GetChunk {
        /// The key.
        key: &'a [u8],
        /// The pin tag of that answer.
        tag: u64,
        /// Where the piece starts.
        offset: u64,
        /// Length of the piece, in bytes.
        len: u32,
    },
}

impl BatchOp<'_> {
    /// The key the operation addresses.
    pub fn key(&self) -> &[u8] {
        match self {
            BatchOp::Get { key }
            | BatchOp::Put { key, .. }
            | BatchOp::Delete { key }
            | BatchOp::PutChunk { key, .. }
            | BatchOp::GetChunk { key, .. } => key,
        }
    }

    /// Bytes of the operation's value section on the wire.
    fn value_len(&self) -> usize {
        match self {
            BatchOp::Put { value, .. } => value.len(),
            BatchOp::PutChunk { bytes, .. } => PUT_CHUNK_HEAD_BYTES + bytes.len(),
            BatchOp::GetChunk { .. } => GET_CHUNK_HEAD_BYTES,
            _ => 0,
        }
    }

    /// Bytes of value the operation carries, checked against its bound.
    fn payload(&self) -> (usize, usize) {
        match self {
            BatchOp::Put { value, .. } => (value.len(), VALUE_BYTES_MAX),
            BatchOp::PutChunk { bytes, .. } => (bytes.len(), LARGE_CHUNK_BYTES_MAX),
            _ => (0, 0),
        }
    }
}

/// The result of one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The stable code the server answered with.
    pub code: ErrorCode,
    /// The value of a GET hit; empty otherwise.
    pub value: Vec<u8>,
}

impl Outcome {
    /// This outcome as an error.
    pub fn into_error(self) -> ClientError {
        ClientError::Server {
            code: self.code,
            message: String::new(),
        }
    }
}

/// What a frame in flight needs for its reply: the positions of its
/// operations. (The tag of a control request, which carries none, is the
/// default.)
#[derive(Default)]
pub(crate) struct FrameTag {
    /// Indices into the whole batch (and its output), so the parts of a
    /// batch split over several clients (servers) all land in one output
    /// vector.
    positions: Vec<usize>,
}

/// One client's part of a batch that is posted and flushed but not yet
/// answered: its frames are in flight in the client's sessions.
pub(crate) struct Pending(());

/// Where the results of a batch land, by the operations' positions: the
/// outcomes of [`execute`] (one `Outcome` each), or the caller's buffer
/// of [`crate::Kv::mget_into`] (values copied straight from the reply
/// frames, no allocation per key).
pub(crate) trait Sink {
    /// Lands the result of the operation at `pos`: its code and its value
    /// section (a GET hit's value, a `LARGE_VALUE` head, or empty).
    fn land(&mut self, pos: usize, code: ErrorCode, value: &[u8]) -> Result<()>;

    /// Moves the positions answered `REPLY_FULL` since the last call into
    /// `again` (cleared first): they are sent again.
    fn reply_full(&mut self, again: &mut Vec<usize>);
}

/// The outcomes of [`execute`], one per operation once it is done.
pub(crate) struct Outcomes {
    /// By position; `None` until the operation's result is in.
    out: Vec<Option<Outcome>>,
    /// Positions answered `REPLY_FULL` and not yet sent again.
    full: Vec<usize>,
}

impl Outcomes {
    /// Room for the outcomes of `n` operations.
    pub(crate) fn new(n: usize) -> Outcomes {
        Outcomes {
            out: vec![None; n],
            full: Vec::new(),
        }
    }

    /// The outcomes, once every operation has one.
    pub(crate) fn finish(self) -> Result<Vec<Outcome>> {
        self.out
            .into_iter()
            .map(|o| o.ok_or_else(|| ClientError::Protocol("an operation got no result".into())))
            .collect()
    }
}

impl Sink for Outcomes {
    #[inline]
    fn land(&mut self, pos: usize, code: ErrorCode, value: &[u8]) -> Result<()> {
        if code == ErrorCode::ReplyFull {
            self.full.push(pos);
        }
        self.out[pos] = Some(Outcome {
            code,
            value: value.to_vec(),
        });
        Ok(())
    }

    fn reply_full(&mut self, again: &mut Vec<usize>) {
        again.clear();
        std::mem::swap(again, &mut self.full);
    }
}

/// Runs a batch; GETs the server could not fit in a reply frame
/// (`REPLY_FULL`) are sent again until every operation has its outcome.
/// Each round makes progress: the first GET of a frame always fits.
pub(crate) fn execute(c: &mut Client, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>> {
    validate(ops)?;
    refresh_if_stale(c, ops);
    execute_valid(c, ops)
}

/// Fetches the partition table again when a reply said it moved on, with
/// nothing in flight. Never before a batch of large-value pieces: a
/// transfer's pieces must all reach the connection that holds it, and its
/// batches run back to back (the refresh waits for the next other call).
/// A refresh that fails leaves the old table, which still works: the
/// server serves a partition on any worker.
pub(crate) fn refresh_if_stale(c: &mut Client, ops: &[BatchOp<'_>]) {
    if !c.table_stale
        || c.sessions.in_flight() > 0
        || ops
            .iter()
            .any(|op| matches!(op, BatchOp::PutChunk { .. } | BatchOp::GetChunk { .. }))
    {
        return;
    }
    if let Err(e) = c.refresh_table() {
        tracing::debug!("partition table refresh failed: {e}");
    }
}

/// [`execute`] of a batch [`validate`] has passed.
fn execute_valid(c: &mut Client, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>> {
    let mut out = Outcomes::new(ops.len());
    run_valid(c, ops, &mut out, &mut Vec::new())?;
    out.finish()
}

/// Runs a batch [`validate`] has passed, landing every result in `sink`;
/// operations answered `REPLY_FULL` are sent again (using `again` as
/// scratch) until none is. Allocates per frame, never per operation.
pub(crate) fn run_valid<S: Sink>(
    c: &mut Client,
    ops: &[BatchOp<'_>],
    sink: &mut S,
    again: &mut Vec<usize>,
) -> Result<()> {
    let pending = post(c, ops, 0..ops.len(), None)?;
    collect(c, pending, c.sessions.deadline(), sink)?;
    loop {
        sink.reply_full(again);
        if again.is_empty() {
            return Ok(());
        }
        let pending = post(c, ops, again.iter().copied(), None)?;
        collect(c, pending, c.sessions.deadline(), sink)?;
    }
}

/// Checks every operation against the key and value bounds, so that a
/// batch breaking one is refused before any part of it is sent.
pub(crate) fn validate(ops: &[BatchOp<'_>]) -> Result<()> {
    for op in ops {
        let key = op.key();
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return Err(ClientError::Invalid(
                ErrorCode::KeyTooLong,
                format!(
                    "key of {} bytes; keys are 1..={KEY_BYTES_MAX} bytes",
                    key.len()
                ),
            ));
        }
        let (len, max) = op.payload();
        if len > max {
            return Err(ClientError::Invalid(
                ErrorCode::ValueTooLarge,
                format!("value of {len} bytes exceeds {max}"),
            ));
        }
    }
    Ok(())
}

/// The post phase: packs the operations at positions `sel` of `ops`
/// (already validated) into frames per worker, posts every frame and
/// flushes each connection once, without waiting for any reply.
/// `hashes`, if given, holds every operation's key hash (by position), so
/// a caller that hashed the keys already (to pick a server) does not hash
/// them again.
pub(crate) fn post(
    c: &mut Client,
    ops: &[BatchOp<'_>],
    sel: impl Iterator<Item = usize>,
    hashes: Option<&[KeyHash]>,
) -> Result<Pending> {
    // The positions grouped by worker, in request order within each (a
    // counting sort): three allocations however many operations.
    let workers = c.sessions.len();
    let tagged: Vec<(usize, usize)> = sel
        .map(|i| {
            let hash = match hashes {
                Some(h) => h[i],
                None => KeyHash::of(ops[i].key()),
            };
            (usize::from(c.worker_of_hash(hash)), i)
        })
        .collect();
    // `ends[w]`: first where worker w's positions start, then where they end.
    let mut ends = vec![0usize; workers];
    for &(w, _) in &tagged {
        ends[w] += 1;
    }
    let mut start = 0;
    for e in &mut ends {
        let n = *e;
        *e = start;
        start += n;
    }
    let mut order = vec![0usize; tagged.len()];
    for &(w, i) in &tagged {
        order[ends[w]] = i;
        ends[w] += 1;
    }
    let replica = c.replica_reads;
    let epoch = c.map_epoch();
    let mut at = 0;
    for (w, &end) in ends.iter().enumerate() {
        while at < end {
            let tag = FrameTag {
                positions: Vec::with_capacity((end - at).min(BATCH_OPS_MAX)),
            };
            c.sessions.post_tagging(w, tag, |buf, tag, id, worker| {
                let mut b = RequestBuilder::new(buf, id, worker);
                b.stamp_map_epoch(epoch);
                while at < end {
                    let pos = order[at];
                    let op = &ops[pos];
                    // The first op always goes in: bounds were checked by
                    // `validate`, so one op always fits an empty frame.
                    if !b.is_empty() && !b.fits(op.key().len(), op.value_len()) {
                        break;
                    }
                    match *op {
                        BatchOp::Get { key } if replica => b.get_any_replica(key),
                        BatchOp::Get { key } => b.get(key),
                        BatchOp::Put {
                            key,
                            value,
                            ttl_ms,
                            cond,
                        } => b.put(key, value, ttl_ms, cond),
                        BatchOp::Delete { key } => b.delete(key),
                        BatchOp::PutChunk {
                            key,
                            transfer,
                            total,
                            offset,
                            bytes,
                            ttl_ms,
                            cond,
                        } => b.put_chunk(key, transfer, total, offset, bytes, ttl_ms, cond),
                        BatchOp::GetChunk {
                            key,
                            tag,
                            offset,
                            len,
                        } if replica => b.get_chunk_any_replica(key, tag, offset, len),
                        BatchOp::GetChunk {
                            key,
                            tag,
                            offset,
                            len,
                        } => b.get_chunk(key, tag, offset, len),
                    };
                    tag.positions.push(pos);
                    at += 1;
                }
                b.finish();
            })?;
        }
    }
    c.sessions.flush()?;
    Ok(Pending(()))
}

/// The collect phase: reads the replies to `pending` (per connection, in
/// request order, through the request layer's reply loop,
/// `Sessions::collect_all`) until `deadline`, scattering each result to
/// its operation's position in `out`. On an error the frames still in
/// flight are given up: their replies are read and dropped by the next
/// call (the layer's late-reply policy). A connection out of step (a
/// reply out of order or undecodable) stays so, and a cluster client
/// drops it.
pub(crate) fn collect<S: Sink>(
    c: &mut Client,
    _pending: Pending,
    deadline: Instant,
    out: &mut S,
) -> Result<()> {
    let mut stale = false;
    let r = c
        .sessions
        .collect_all(deadline, |msg, sent| absorb(msg, &sent, out, &mut stale));
    c.table_stale |= stale;
    r
}

/// Applies one reply message to the frame it answers.
/// A RESPONSE whose status is WRONG_WORKER sets `stale`: its results
/// stand, but the worker does not own some partition it served.
#[inline]
fn absorb<S: Sink>(msg: &[u8], sent: &Sent<FrameTag>, out: &mut S, stale: &mut bool) -> Result<()> {
    let frame = decode_frame(msg).map_err(protocol)?;
    match frame.header.kind {
        FrameKind::Response => {
            if frame.header.status == ErrorCode::WrongWorker.as_u16() {
                *stale = true;
            }
            let results = ResponseIter::new(&frame).map_err(protocol)?;
            if results.len() != sent.tag.positions.len() {
                return Err(ClientError::Protocol(
                    "result count differs from operation count".into(),
                ));
            }
            for (r, &pos) in results.zip(&sent.tag.positions) {
                out.land(pos, r.code(), r.value)?;
            }
            Ok(())
        }
        FrameKind::Error => Err(refusal(&frame)),
        k => Err(ClientError::Protocol(format!("unexpected {k:?} frame"))),
    }
}
