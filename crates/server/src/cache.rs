//! The KV-cache service: large values with TTL in one shared store
//! (`fabrickv-cache`), served on the native data plane by every worker and
//! controlled over gRPC (`fabrickv-control`, wired in [`crate::cache_grpc`]).
//!
//! Data plane (this file): PUT (whole, chunked, or read one-sided from the
//! client's region), GET (written one-sided into a slice of the client's
//! region after a size check, or returned inline in chunks pinned to the
//! value's generation), DELETE, EXISTS, and BIND, which ties a gRPC client
//! id to the connection's registered region so that gRPC calls can place
//! values there.
//!
//! A gRPC call that moves bytes to or from a client's region runs on the
//! worker that owns the client's connection: it is queued as a [`Job`] and
//! the worker runs it between bursts, with its port.
//!
//! Layout: this file holds the settings and the per-worker handler
//! ([`CacheService`]: its dispatch, DELETE, EXISTS, BIND); `put` and
//! `get` the two transfers; `shared` the state every worker and the gRPC
//! backend share ([`CacheShared`]: the store, registered clients, the
//! per-worker job queues, counters).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::Receiver;
use fabrickv_cache::{CacheConfig, CacheError, PutSlot};
use fabrickv_transport::{ConnId, RemoteRegion, Reply, WorkerPort};
use fabrickv_types::transfer::Transfers;
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{
    decode_request, encode_status_reply, CacheOp, CacheRequest, RegionSlice,
};
use fabrickv_wire::FrameKind;

use crate::service::{wire_refusal, Call, Refusal, Service, StatsList};
use crate::slot_routing::{RoutingCache, SlotRouting};
use fabrickv_cluster::slots::key_slot;

use get::ChunkCrcs;
pub use get::{CACHE_CHUNK_CRCS_MAX, CACHE_SHARED_CHUNK_BYTES_MIN};
pub use shared::{
    Binding, CacheCounters, CacheShared, ClientRecord, Job, CACHE_CLIENTS_PER_CONN_MAX,
    CACHE_CLIENTS_PER_HOST_MAX, CACHE_EXPIRE_PER_SWEEP, CACHE_JOBS_QUEUED_MAX,
    CACHE_JOB_TIMEOUT_MS,
};

mod get;
mod put;
mod shared;

/// Chunked puts one worker holds open at once (each pins its reserved
/// space until its last chunk or its deadline).
pub const CACHE_PENDING_PUTS_MAX: usize = 256;

/// A chunked put whose next chunk is this late is dropped and its space
/// freed, in milliseconds.
pub const CACHE_PENDING_PUT_TIMEOUT_MS: u64 = 10_000;

fn refusal(e: CacheError) -> Refusal {
    (e.code(), e.to_string())
}

/// Settings of the cache service.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CacheSettings {
    /// The store: pool size, eviction, watermarks.
    pub store: CacheConfig,
    /// gRPC control-plane address; `None` = no gRPC. An address that
    /// cannot be bound stops the server at start, the default one too:
    /// a server that started beside a process holding its address would
    /// leave that process answering the clients of the documented address.
    pub grpc: Option<String>,
}

/// A chunked put under way.
struct Pending {
    /// The reserved space the chunks are copied into; invisible until
    /// committed.
    slot: PutSlot,
    /// The key every chunk must name.
    key: Vec<u8>,
    /// Bytes received so far: where the next chunk must start.
    received: u64,
}

/// The cache service of one worker.
pub struct CacheService {
    /// This worker's id, sent in every reply header and bound with BIND.
    worker: u16,
    /// The store and what every worker shares.
    shared: Arc<CacheShared>,
    /// Chunked puts open on this worker's connections, by connection and
    /// transfer id; one idle for [`CACHE_PENDING_PUT_TIMEOUT_MS`] is
    /// dropped by the sweep.
    pending: Transfers<(ConnId, u64), Pending>,
    /// Transfers the gRPC backend queued to this worker (none in tests).
    jobs: Option<Receiver<Job>>,
    /// Checksums of inline GET chunks already sent (see [`ChunkCrcs`]).
    chunk_crcs: ChunkCrcs,
    /// Which slots this server serves, in a cluster with a slot map.
    routing: Option<Arc<SlotRouting>>,
    view: RoutingCache,
}

impl CacheService {
    /// The service of worker `worker`.
    pub fn new(worker: u16, shared: Arc<CacheShared>, jobs: Option<Receiver<Job>>) -> Self {
        CacheService {
            worker,
            shared,
            pending: Transfers::new(),
            jobs,
            chunk_crcs: ChunkCrcs::default(),
            routing: None,
            view: RoutingCache::default(),
        }
    }

    /// Serves only the keys of slots `routing` gives this server, once it
    /// has a map (an etcd cluster): an operation on another server's key
    /// is answered `WRONG_SERVER`, so that a value is only ever stored on
    /// its slot's primary and a client with an older map finds the new
    /// owner rather than a copy left behind.
    pub fn with_slot_routing(mut self, routing: Arc<SlotRouting>) -> CacheService {
        self.routing = Some(routing);
        self
    }

    /// Whether this server serves `key` now: one atomic load without a map.
    fn serves(&mut self, key: &[u8]) -> bool {
        let Some(shared) = &self.routing else {
            return true;
        };
        self.view
            .current(shared)
            .is_none_or(|r| r.serves(key_slot(key), false))
    }
}

impl Service for CacheService {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Cache]
    }

    /// Serves one CACHE frame. An operation that fails is answered with
    /// its code in the reply (the frame was well formed); only a malformed
    /// request (a bad region, a broken chunk sequence) refuses the frame.
    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        let (conn, id, now_ms) = (call.conn, call.id(), call.now_ms);
        let req = decode_request(&call.frame).map_err(wire_refusal)?;
        if let Some((op, key)) = keyed(&req) {
            if !self.serves(key) {
                encode_status_reply(reply.buf(), id, self.worker, op, ErrorCode::WrongServer);
                return Ok(());
            }
        }
        let (op, result) = match req {
            CacheRequest::Put {
                key,
                transfer,
                ttl_ms,
                total_len,
                offset,
                source,
            } => (
                CacheOp::Put,
                self.put(
                    conn, id, key, transfer, ttl_ms, total_len, offset, source, reply, now_ms,
                ),
            ),
            CacheRequest::Get {
                key,
                generation,
                offset,
                max_len,
                dest,
                read_now,
            } => (
                CacheOp::Get,
                self.get(
                    id, key, generation, offset, max_len, dest, read_now, reply, now_ms,
                ),
            ),
            CacheRequest::Delete { key } => {
                let found = self.shared.store().delete(key, now_ms);
                (CacheOp::Delete, {
                    found_status(reply, id, self.worker, CacheOp::Delete, found);
                    Ok(())
                })
            }
            CacheRequest::Exists { key } => {
                let found = self.shared.store().exists(key, now_ms);
                (CacheOp::Exists, {
                    found_status(reply, id, self.worker, CacheOp::Exists, found);
                    Ok(())
                })
            }
            CacheRequest::Bind { client_id, region } => {
                let r = RemoteRegion::decode(&region.region)
                    .ok_or_else(|| (ErrorCode::Malformed, "bad region".to_string()))
                    .and_then(|r| {
                        self.shared.bind(
                            client_id,
                            Binding {
                                worker: self.worker,
                                conn,
                                region: r,
                                len: region.len.min(r.len),
                            },
                        )
                    })
                    .map(|()| {
                        encode_status_reply(
                            reply.buf(),
                            id,
                            self.worker,
                            CacheOp::Bind,
                            ErrorCode::Ok,
                        )
                    });
                (CacheOp::Bind, r)
            }
        };
        match result {
            Err((ErrorCode::Malformed, why)) => Err((ErrorCode::Malformed, why)),
            Err((code, why)) => {
                // One operation failed: the reply says so with its code (the
                // frame itself was well formed, so it is not refused).
                tracing::debug!("cache {op:?} refused: {why}");
                encode_status_reply(reply.buf(), id, self.worker, op, code);
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// Runs the gRPC transfers queued for this worker.
    fn run_jobs(&mut self, port: &mut dyn WorkerPort) -> usize {
        let Some(rx) = &self.jobs else { return 0 };
        let mut n = 0;
        while let Ok(job) = rx.try_recv() {
            job(port);
            n += 1;
        }
        n
    }

    /// Periodic work: drops chunked puts past their deadline; worker 0 also
    /// runs the store's active expiry and releases silent clients.
    fn sweep(&mut self, now_ms: u64) {
        let dropped = self.pending.sweep(now_ms, CACHE_PENDING_PUT_TIMEOUT_MS);
        if dropped > 0 {
            self.shared
                .counters
                .puts_abandoned
                .fetch_add(dropped as u64, Ordering::Relaxed);
        }
        if self.worker == 0 {
            self.shared.sweep(now_ms);
        }
    }

    fn shared_stats(&self, out: &mut StatsList) {
        out.extend(self.shared.stats_list());
    }
}

/// The operation and key of a request that names one.
fn keyed<'a>(req: &CacheRequest<'a>) -> Option<(CacheOp, &'a [u8])> {
    match *req {
        CacheRequest::Put { key, .. } => Some((CacheOp::Put, key)),
        CacheRequest::Get { key, .. } => Some((CacheOp::Get, key)),
        CacheRequest::Delete { key } => Some((CacheOp::Delete, key)),
        CacheRequest::Exists { key } => Some((CacheOp::Exists, key)),
        CacheRequest::Bind { .. } => None,
    }
}

fn found_status(reply: &mut dyn Reply, id: u64, worker: u16, op: CacheOp, found: bool) {
    let code = if found {
        ErrorCode::Ok
    } else {
        ErrorCode::NotFound
    };
    encode_status_reply(reply.buf(), id, worker, op, code);
}

fn region_of(s: &RegionSlice) -> Result<RemoteRegion, Refusal> {
    RemoteRegion::decode(&s.region)
        .ok_or_else(|| (ErrorCode::Malformed, "bad region descriptor".to_string()))
}

#[cfg(test)]
mod tests;
