//! The kv service: one REQUEST frame in, one RESPONSE frame out.
//!
//! Sans-I/O: [`KvService`]'s [`Service::handle`] takes the frame the worker
//! decoded, the time and a reply to append to. It never panics on any
//! input: a batch that cannot be read is refused whole (the worker sends
//! the ERROR frame), and an operation that breaks a bound gets its own
//! error result while the rest of its batch runs.

use std::sync::Arc;

use fabrickv_engine::{DeleteResult, GetResult, PutCond, PutResult};
use fabrickv_transport::Reply;
use fabrickv_types::hash::worker_of_partition;
use fabrickv_types::limits::{BATCH_OPS_MAX, KEY_BYTES_MAX, VALUE_BYTES_MAX};
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::control::ServerInfo;
use fabrickv_wire::{OpCode, PutCondition, RequestIter, ResponseBuilder};

use crate::config::Mode;
use crate::partitions::Partitions;
use crate::service::{wire_refusal, Call, Refusal, Service, StatsList};

/// Index buckets the TTL sweep visits per run: 1 MiB of index, a fraction
/// of a millisecond. A 64 MiB partition's index (128 Ki buckets) is swept
/// in about a second; a 1 GiB one (4 Mi buckets) in about 25 s when busy
/// and 50 s when idle (runs are then `IDLE_WAIT_MS` apart). Expired items
/// are never served in between; the sweep only gives their memory back.
pub const SWEEP_BUCKETS_PER_RUN: usize = 16384;

/// Counters of the kv service of one worker. STATS reports them beside
/// the worker's own `frames_refused` (see [`crate::worker`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct KvCounters {
    /// Request frames executed.
    pub frames: u64,
    /// Operations executed (or answered with a per-op error).
    pub ops: u64,
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
    counters: KvCounters,
    /// The key hashes of the frame being executed (kept to reuse its memory).
    hashes: Vec<KeyHash>,
}

impl KvService {
    /// The service of worker `id` out of `workers`, which owns partition `id`.
    pub fn new(id: u16, workers: u16, parts: Arc<Partitions>, mode: Mode) -> KvService {
        KvService {
            id,
            workers,
            parts,
            mode,
            counters: KvCounters::default(),
            hashes: Vec::with_capacity(BATCH_OPS_MAX),
        }
    }

    /// This service's counters.
    pub fn counters(&self) -> KvCounters {
        self.counters
    }

    /// Background work when idle: reclaims expired items in up to
    /// `buckets` index buckets; returns how many items it reclaimed.
    pub fn sweep_buckets(&mut self, now_ms: u64, buckets: usize) -> usize {
        self.parts.lock(usize::from(self.id)).sweep(now_ms, buckets)
    }

    /// The shape a HELLO reply announces: workers, partitions and limits,
    /// the value bound lowered to what this worker's partition can hold.
    pub fn server_info(&self) -> ServerInfo {
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
        self.counters.frames += 1;
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
            self.counters.ops += 1;
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
                self.counters.misrouted += 1;
                rb.result(ErrorCode::WrongWorker, &[]);
                continue;
            }
            match code {
                OpCode::Get => match partition.get(hash, op.key, now_ms) {
                    GetResult::Found { value, .. } if rb.fits(value.len(), after) => {
                        rb.result(ErrorCode::Ok, value)
                    }
                    // A large value (set over RESP) never fits a native
                    // frame: say so rather than ReplyFull, which asks for a
                    // resend that could never succeed.
                    GetResult::Found { value, .. }
                        if value.len() > fabrickv_types::limits::VALUE_BYTES_MAX =>
                    {
                        rb.result(ErrorCode::ValueTooLarge, &[])
                    }
                    GetResult::Found { .. } => {
                        self.counters.reply_full += 1;
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

    /// The engine counters of this worker's partition, appended to a
    /// STATS reply first.
    pub fn engine_stats(&self, out: &mut StatsList) {
        let e = self.parts.lock(usize::from(self.id)).stats();
        out.extend([
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
        ]);
    }
}

impl Service for KvService {
    /// Executes one REQUEST frame (the worker sends it no other kind).
    #[inline]
    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        let ops = RequestIter::new(&call.frame).map_err(wire_refusal)?;
        self.execute(ops, call.id(), reply.buf(), call.now_ms);
        Ok(())
    }

    fn sweep(&mut self, now_ms: u64) {
        self.sweep_buckets(now_ms, SWEEP_BUCKETS_PER_RUN);
    }
}
