//! The kv service: one native frame in, one reply frame out.
//!
//! Sans-I/O: [`KvService::handle`] takes the request bytes, the time and a
//! buffer to append the reply to. It never panics on any input: a frame
//! that cannot be decoded gets an ERROR frame with a stable code, and an
//! operation that breaks a bound gets its own error result while the rest
//! of its batch runs.

use std::sync::Arc;
use std::time::Instant;

use fabrickv_engine::{DeleteResult, GetResult, PutCond, PutResult};
use fabrickv_types::hash::worker_of_partition;
use fabrickv_types::limits::{BATCH_OPS_MAX, KEY_BYTES_MAX, VALUE_BYTES_MAX};
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::control::{encode_error, encode_hello_reply, encode_stats_reply, ServerInfo};
use fabrickv_wire::{decode_frame, FrameKind, OpCode, PutCondition, RequestIter, ResponseBuilder};

use fabrickv_transport::PortStats;

use crate::config::Mode;
use crate::partitions::Partitions;

/// Milliseconds since the server started, as the engine's clock. Never 0,
/// so that 0 can mean "no expiry".
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    /// The current time in engine milliseconds.
    #[inline]
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Counters of the protocol layer of one worker.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProtocolStats {
    /// Request frames executed.
    pub frames: u64,
    /// Operations executed (or answered with a per-op error).
    pub ops: u64,
    /// Frames refused whole with an ERROR frame.
    pub frames_refused: u64,
    /// Operations answered WRONG_WORKER (client steered to the wrong thread).
    pub misrouted: u64,
    /// GETs answered REPLY_FULL because their frame's reply had no room.
    pub reply_full: u64,
}

/// The kv service of one worker, serving its own partition.
pub struct KvService {
    id: u16,
    workers: u16,
    parts: Arc<Partitions>,
    mode: Mode,
    stats: ProtocolStats,
    /// The worker port's counters as of the current burst.
    transport: PortStats,
    /// The key hashes of the frame being executed (kept to reuse its memory).
    hashes: Vec<KeyHash>,
    /// The embedding store, whose counters STATS reports too.
    ps: Option<Arc<crate::ps::PsStore>>,
    /// The KV-cache store, likewise.
    cache: Option<Arc<crate::cache::CacheShared>>,
}

impl KvService {
    /// The service of worker `id` out of `workers`, which owns partition `id`.
    pub fn new(id: u16, workers: u16, parts: Arc<Partitions>, mode: Mode) -> KvService {
        KvService {
            id,
            workers,
            parts,
            mode,
            stats: ProtocolStats::default(),
            transport: PortStats::default(),
            hashes: Vec::with_capacity(BATCH_OPS_MAX),
            ps: None,
            cache: None,
        }
    }

    /// Reports the KV-cache counters in STATS as well.
    pub fn with_cache(mut self, cache: Arc<crate::cache::CacheShared>) -> KvService {
        self.cache = Some(cache);
        self
    }

    /// Reports the embedding store's counters in STATS as well.
    pub fn with_ps(mut self, ps: Arc<crate::ps::PsStore>) -> KvService {
        self.ps = Some(ps);
        self
    }

    /// Handles one request message, appending the reply to `out`.
    pub fn handle(&mut self, msg: &[u8], out: &mut Vec<u8>, now_ms: u64) {
        let frame = match decode_frame(msg) {
            Ok(f) => f,
            Err(e) => return self.refuse(out, request_id_of(msg), e.code(), &e.to_string()),
        };
        let id = frame.header.request_id;
        match frame.header.kind {
            FrameKind::Request => match RequestIter::new(&frame) {
                Ok(ops) => self.execute(ops, id, out, now_ms),
                Err(e) => self.refuse(out, id, e.code(), &e.to_string()),
            },
            FrameKind::Hello => encode_hello_reply(out, id, self.id, &self.info()),
            FrameKind::Stats => {
                let s = self.stats_list(now_ms);
                encode_stats_reply(out, id, self.id, &s);
            }
            other => self.refuse(
                out,
                id,
                ErrorCode::UnknownOpcode,
                &format!("{other:?} is not a request"),
            ),
        }
    }

    /// Counts a frame another service (PS) refused with an ERROR frame, so
    /// `frames_refused` covers every refusal of this worker.
    pub fn count_refused(&mut self) {
        self.stats.frames_refused += 1;
    }

    /// Records the transport's counters, to be reported by STATS.
    pub fn set_transport_stats(&mut self, s: PortStats) {
        self.transport = s;
    }

    /// Background work when idle: reclaims expired items.
    pub fn sweep(&mut self, now_ms: u64, buckets: usize) -> usize {
        self.parts.lock(usize::from(self.id)).sweep(now_ms, buckets)
    }

    fn refuse(&mut self, out: &mut Vec<u8>, id: u64, code: ErrorCode, why: &str) {
        self.stats.frames_refused += 1;
        encode_error(out, id, self.id, code, why);
    }

    fn info(&self) -> ServerInfo {
        ServerInfo {
            workers: self.workers,
            partitions: u32::from(self.workers),
            store_mode: self.mode == Mode::Store,
            key_bytes_max: KEY_BYTES_MAX as u32,
            value_bytes_max: VALUE_BYTES_MAX
                .min(self.parts.lock(usize::from(self.id)).max_item_value_bytes())
                as u32,
            batch_ops_max: BATCH_OPS_MAX as u32,
        }
    }

    fn execute(&mut self, ops: RequestIter<'_>, id: u64, out: &mut Vec<u8>, now_ms: u64) {
        self.stats.frames += 1;
        let partitions = u32::from(self.workers);
        // Uncontended: only RESP threads ever take another worker's lock.
        let mut partition = self.parts.lock(usize::from(self.id));
        // Prefetch passes: every key's bucket, then every item those buckets
        // name, before the first lookup, so the batch's misses overlap.
        // Each key is hashed once, here; execution reuses the hash.
        self.hashes.clear();
        self.hashes
            .extend(ops.clone().map(|op| KeyHash::of(op.key)));
        for &h in &self.hashes {
            partition.prefetch(h);
        }
        for &h in &self.hashes {
            partition.prefetch_item(h);
        }
        let mut rb = ResponseBuilder::new(out, id, self.id);
        let total = ops.len();
        for (op, &hash) in ops.zip(&self.hashes) {
            // Results still to come after this one, each at least a header.
            let after = total - rb.len() - 1;
            self.stats.ops += 1;
            let (code, cond) = match op.check() {
                Ok(c) => c,
                Err(e) => {
                    rb.result(e, &[]);
                    continue;
                }
            };
            if worker_of_partition(hash.partition(partitions), u32::from(self.workers))
                != u32::from(self.id)
            {
                self.stats.misrouted += 1;
                rb.result(ErrorCode::WrongWorker, &[]);
                continue;
            }
            match code {
                OpCode::Get => match partition.get(hash, op.key, now_ms) {
                    GetResult::Found { value, .. } if rb.fits(value.len(), after) => {
                        rb.result(ErrorCode::Ok, value)
                    }
                    GetResult::Found { .. } => {
                        self.stats.reply_full += 1;
                        rb.result(ErrorCode::ReplyFull, &[])
                    }
                    GetResult::NotFound => rb.result(ErrorCode::NotFound, &[]),
                },
                OpCode::Put => {
                    let expire_at = if op.ttl_ms == 0 {
                        0
                    } else {
                        now_ms + op.ttl_ms
                    };
                    let cond = match cond {
                        PutCondition::Always => PutCond::Always,
                        PutCondition::IfAbsent => PutCond::IfAbsent,
                        PutCondition::IfPresent => PutCond::IfPresent,
                    };
                    let code = match partition.put(hash, op.key, op.value, expire_at, cond, now_ms)
                    {
                        PutResult::Stored => ErrorCode::Ok,
                        PutResult::InsufficientSpace => ErrorCode::InsufficientSpace,
                        PutResult::TooLarge => ErrorCode::ValueTooLarge,
                        PutResult::ConditionFailed => ErrorCode::ConditionFailed,
                    };
                    rb.result(code, &[])
                }
                OpCode::Delete => match partition.delete(hash, op.key, now_ms) {
                    DeleteResult::Deleted => rb.result(ErrorCode::Ok, &[]),
                    DeleteResult::NotFound => rb.result(ErrorCode::NotFound, &[]),
                },
            };
        }
        rb.finish();
    }

    /// Engine, protocol and transport counters, as sent in a STATS reply.
    pub fn stats_list(&self, _now_ms: u64) -> Vec<(&'static str, u64)> {
        let e = self.parts.lock(usize::from(self.id)).stats();
        let p = self.stats;
        let t = self.transport;
        let mut list = vec![
            ("gets", e.gets),
            ("hits", e.hits),
            ("misses", e.misses),
            ("puts", e.puts),
            ("deletes", e.deletes),
            ("evictions", e.evictions),
            ("expired", e.expired),
            ("items", e.items),
            ("bytes", e.bytes),
            ("pool_bytes", e.pool_bytes),
            ("index_collisions", e.index_collisions),
            ("frames", p.frames),
            ("ops", p.ops),
            ("frames_refused", p.frames_refused),
            ("misrouted", p.misrouted),
            ("reply_full", p.reply_full),
            ("conns_accepted", t.conns_accepted),
            ("conns_open", t.conns_open),
            ("conns_closed_framing", t.conns_closed_framing),
            ("conns_closed_timeout", t.conns_closed_timeout),
            ("msgs_in", t.msgs_in),
            ("msgs_out", t.msgs_out),
            ("backpressure_pauses", t.backpressure_pauses),
            ("spliced_bytes", t.spliced_bytes),
        ];
        // The embedding store is shared: worker 0 alone reports it, so
        // clients that add up workers count it once.
        if let (Some(ps), 0) = (&self.ps, self.id) {
            list.extend(ps.stats_list());
        }
        if let (Some(cache), 0) = (&self.cache, self.id) {
            list.extend(cache.stats_list());
        }
        list
    }
}

/// The request id of a frame whose header may be broken, so that even an
/// ERROR reply can be matched to its request when the id is readable.
pub(crate) fn request_id_of(msg: &[u8]) -> u64 {
    msg.get(8..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The frame in `msg` when it decodes and is of `kind`, which its service
/// then reads; otherwise an ERROR reply is appended to `out` (with
/// `not_kind` when the frame is of another kind) and the frame is refused.
pub(crate) fn frame_of_kind<'a>(
    msg: &'a [u8],
    kind: FrameKind,
    worker: u16,
    not_kind: &str,
    out: &mut Vec<u8>,
) -> Option<fabrickv_wire::Frame<'a>> {
    let id = request_id_of(msg);
    match decode_frame(msg) {
        Ok(f) if f.header.kind == kind => Some(f),
        Ok(_) => {
            encode_error(out, id, worker, ErrorCode::UnknownOpcode, not_kind);
            None
        }
        Err(e) => {
            encode_error(out, id, worker, e.code(), &e.to_string());
            None
        }
    }
}
