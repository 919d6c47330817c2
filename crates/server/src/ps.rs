//! The embedding parameter server (PetPS): named tables of u64 -> f32[dim].
//!
//! All tables share one store-mode pool, cut into [`PS_SHARDS_PER_WORKER`]
//! shards per worker. An item's key is the table id and the u64 key (12
//! bytes), so tables share memory without fixed capacities, and its value
//! is the vector (plus Adagrad's accumulator). Unlike kv, any worker
//! serves any key: a pull of hundreds of keys is one request to one worker
//! (PetPS's shape), which takes each shard's read lock once per request
//! and copies the vectors, in request order, straight into the reply or
//! into the caller's registered buffer (one-sided). Pushes take the shard's
//! write lock per key and update in place, so each key's update is atomic.
//!
//! The pool is built when the first table is created (a server that never
//! serves embeddings pays nothing), with the DRAM knobs of [`PsConfig`].
//! Tables are never dropped: ids are never reused, so a stale id can never
//! read another table's vectors.
//!
//! Sans-I/O like the kv service: [`PsService`]'s [`Service::handle`]
//! takes the decoded frame, a [`Reply`] and the time.
//!
//! Layout: this file holds the configuration and the per-worker handler
//! ([`PsService`]); `store` the shared tables and pool ([`PsStore`]);
//! `pull` the pipelined copy of a pull's vectors; `push` the optimizer
//! updates of a push.

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock, RwLockWriteGuard};

use fabrickv_engine::{Partition, PoolOptions};
use fabrickv_transport::{RemoteRegion, Reply};
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::ps::{
    bitmap_bytes, decode_create, decode_request, encode_list_reply, encode_push_reply,
    encode_table_reply, key_at, PsOp, PsRequest, PullDest, PullReplyWriter, PushMode, TableSpec,
};
use fabrickv_wire::FrameKind;

use crate::service::{wire_refusal, Call, Refusal, Service, StatsList};
use crate::slot_routing::{RoutingCache, SlotRouting};
use fabrickv_cluster::slots::slot_of_u64;
use fabrickv_wire::ps::PushId;
use replica::Seen;

pub use budget::{MemoryBudget, CAP_IPC_LOCK_BIT, PS_POOL_AVAILABLE_PERCENT_MAX};
use pull::{gather, write_bitmap};
use push::{apply_gradient, overwrite, Scratch};
pub use store::PsStore;
use store::{item_hash, item_key, table_of, write, Table};

mod budget;
mod pull;
mod push;
pub mod replica;
mod store;

/// Shards of the embedding pool per worker: more shards than workers keep
/// two workers' pushes from meeting on one lock.
pub const PS_SHARDS_PER_WORKER: usize = 4;

/// Bytes of an item key: table id (u32) and key (u64), little-endian.
pub const PS_ITEM_KEY_BYTES: usize = 12;

/// Adagrad's epsilon, added to the root of the accumulator.
pub const ADAGRAD_EPSILON: f32 = 1e-10;

/// Adagrad's starting accumulator, per element (TensorFlow's default), so
/// the first steps are not huge.
pub const ADAGRAD_INITIAL_ACCUMULATOR: f32 = 0.1;

/// Default embedding pool, in bytes (1 GiB).
pub const DEFAULT_PS_POOL_BYTES: u64 = 1 << 30;

/// Smallest embedding pool per shard, in bytes.
pub const PS_SHARD_POOL_BYTES_MIN: u64 = 1 << 20;

/// The embedding service's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PsConfig {
    /// Size of the embedding pool over all shards, in bytes.
    pub pool_bytes: u64,
    /// How the pool's memory is obtained (PetPS: populate, mlock, zero).
    pub pool: PoolOptions,
    /// Tables created at start-up.
    pub tables: Vec<TableSpec>,
}

impl Default for PsConfig {
    fn default() -> Self {
        PsConfig {
            pool_bytes: DEFAULT_PS_POOL_BYTES,
            pool: PoolOptions {
                hugepages: false,
                populate: true,
                lock: true,
                zero: true,
            },
            tables: Vec::new(),
        }
    }
}
/// The PS service of one worker: per-worker scratch space over the shared
/// store.
pub struct PsService {
    worker: u16,
    store: Arc<PsStore>,
    /// Item keys and hashes of the request being served.
    keys: Vec<([u8; PS_ITEM_KEY_BYTES], KeyHash)>,
    /// Shard of each key.
    shard_of: Vec<u32>,
    /// Vectors staged for a transport without a mapped view (fabric).
    staging: Vec<u8>,
    /// Buffers of a push, reused from key to key.
    scratch: Scratch,
    /// Found bits of a one-sided pull.
    found: Vec<u64>,
    /// Which slots this server serves, in a cluster with a slot map.
    routing: Option<Arc<SlotRouting>>,
    view: RoutingCache,
}

impl PsService {
    /// The service of worker `worker`.
    pub fn new(worker: u16, store: Arc<PsStore>) -> PsService {
        PsService {
            worker,
            store,
            keys: Vec::new(),
            shard_of: Vec::new(),
            staging: Vec::new(),
            scratch: Scratch::default(),
            found: Vec::new(),
            routing: None,
            view: RoutingCache::default(),
        }
    }

    /// Serves only the rows of slots `routing` gives this server, once it
    /// has a map (an etcd cluster): a request with a row of another
    /// server's slot is refused whole with `WRONG_SERVER`.
    pub fn with_slot_routing(mut self, routing: Arc<SlotRouting>) -> PsService {
        self.routing = Some(routing);
        self
    }

    /// Refuses a request holding a key of a slot served elsewhere: one
    /// atomic load without a map.
    fn check_slots(&mut self, keys: &[u8]) -> Result<(), Refusal> {
        let Some(shared) = &self.routing else {
            return Ok(());
        };
        let Some(r) = self.view.current(shared) else {
            return Ok(());
        };
        for i in 0..keys.len() / 8 {
            let slot = slot_of_u64(key_at(keys, i));
            if !r.serves(slot, false) {
                return Err(r.wrong_server(slot));
            }
        }
        Ok(())
    }

    /// The start of every pull and push: finds the table `table` of
    /// `store` and its shards, then hashes every key of the request once
    /// and finds its shard (into `keys` and `shard_of`).
    fn prepare<'s>(
        &mut self,
        store: &'s PsStore,
        table: u32,
        keys: &[u8],
    ) -> Result<(Arc<Table>, &'s [RwLock<Partition>]), Refusal> {
        let (t, shards) = table_of(store, table)?;
        self.keys.clear();
        self.shard_of.clear();
        for i in 0..keys.len() / 8 {
            let key = key_at(keys, i);
            let k = item_key(table, key);
            let h = item_hash(table, key);
            self.shard_of.push(h.partition(shards.len() as u32));
            self.keys.push((k, h));
        }
        Ok((t, shards))
    }

    fn pull(
        &mut self,
        id: u64,
        table: u32,
        keys: &[u8],
        dest: Option<PullDest>,
        reply: &mut dyn Reply,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        self.check_slots(keys)?;
        let store = self.store.clone();
        let (t, shards) = self.prepare(&store, table, keys)?;
        let (n, vb) = (self.keys.len(), t.vector_bytes());
        self.found.clear();
        self.found.resize(bitmap_bytes(n) / 8, 0);
        let total = n * vb;
        // The one gather of this pull, into whichever memory `dest` picks.
        let (item_keys, shard_of) = (&self.keys, &self.shard_of);
        let gather_into = |dest: &mut [u8], found: &mut [u64]| {
            gather(&t, shards, item_keys, shard_of, dest, found, now_ms)
        };
        let misses;
        match dest {
            None => {
                let out = reply.buf();
                let (w, bitmap_at) = PullReplyWriter::begin(out, id, self.worker, table, n);
                let values_at = out.len();
                out.resize(values_at + total, 0);
                misses = gather_into(&mut out[values_at..], &mut self.found);
                write_bitmap(&mut out[bitmap_at..], &self.found);
                w.finish(out);
            }
            Some(d) => {
                let region = RemoteRegion::decode(&d.region)
                    .ok_or_else(|| (ErrorCode::Malformed, "bad region".to_string()))?;
                let offset = usize::try_from(d.offset)
                    .map_err(|_| (ErrorCode::Malformed, "offset too large".to_string()))?;
                // Bounds first: an overrun is refused before any byte moves.
                region
                    .check(offset, total)
                    .map_err(|e| (ErrorCode::Malformed, e.to_string()))?;
                let one_sided = |e: fabrickv_transport::TransportError| {
                    (
                        ErrorCode::Malformed,
                        format!("one-sided write refused: {e}"),
                    )
                };
                match reply
                    .remote_mut(&region, offset, total)
                    .map_err(one_sided)?
                {
                    Some(view) => {
                        misses = gather_into(view, &mut self.found);
                    }
                    None => {
                        self.staging.clear();
                        self.staging.resize(total, 0);
                        misses = gather_into(&mut self.staging, &mut self.found);
                        reply
                            .write_remote(&region, offset, &self.staging)
                            .map_err(one_sided)?;
                    }
                }
                store
                    .counters
                    .one_sided_bytes
                    .fetch_add(total as u64, Ordering::Relaxed);
                let out = reply.buf();
                let (w, bitmap_at) = PullReplyWriter::begin(out, id, self.worker, table, n);
                write_bitmap(&mut out[bitmap_at..], &self.found);
                w.finish(out);
            }
        }
        // Checked after the reads: write counts only grow, so settled now
        // means settled for what was read.
        if store.rows_settled(self.keys.iter().map(|&(_, h)| h), &self.shard_of) {
            fabrickv_rpc::gate::reply_settled();
        }
        let c = &store.counters;
        c.pulls.fetch_add(1, Ordering::Relaxed);
        c.pull_keys.fetch_add(n as u64, Ordering::Relaxed);
        c.pull_misses.fetch_add(misses, Ordering::Relaxed);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        id: u64,
        table: u32,
        mode: PushMode,
        keys: &[u8],
        values: &[u8],
        request: Option<PushId>,
        out: &mut Vec<u8>,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let first = (!keys.is_empty()).then(|| key_at(keys, 0));
        if let Err(refused) = self.check_slots(keys) {
            return self.refuse_push(refused, id, table, request, first, out, now_ms);
        }
        let store = self.store.clone();
        let (t, shards) = self.prepare(&store, table, keys)?;
        let (n, vb) = (self.keys.len(), t.vector_bytes());
        if values.len() != n * vb {
            return Err((
                ErrorCode::BadDimension,
                format!(
                    "{} value bytes for {n} keys of table {:?} (dim {}, {vb} bytes each)",
                    values.len(),
                    t.spec.name,
                    t.spec.dim
                ),
            ));
        }
        // Held to the last row: a round ships all of this push or none.
        let _barrier = store.push_barrier();
        if let (Some(rid), Some(first)) = (request, first) {
            let seen = store.check_marker(rid, first, now_ms);
            if self.answer_seen(seen, id, table, out)? {
                return Ok(());
            }
        }
        let mut applied = 0u32;
        let mut status = ErrorCode::Ok;
        // In request order, so what was applied is a prefix of the request.
        let mut held: Option<(u32, RwLockWriteGuard<'_, Partition>)> = None;
        for (i, (k, h)) in self.keys.iter().enumerate() {
            let s = self.shard_of[i];
            if held.as_ref().is_none_or(|(hs, _)| *hs != s) {
                // Release before taking the next shard: never two locks.
                drop(held.take());
                held = Some((s, write(&shards[s as usize])));
            }
            let Some((_, p)) = held.as_mut() else {
                continue;
            };
            let v = &values[i * vb..(i + 1) * vb];
            let r = match mode {
                PushMode::Overwrite => overwrite(&t, p, *h, k, v, &mut self.scratch, now_ms),
                PushMode::Gradient => apply_gradient(&t, p, *h, k, v, &mut self.scratch, now_ms),
            };
            match r {
                Ok(()) => applied += 1,
                Err(code) => {
                    status = code;
                    break;
                }
            }
        }
        drop(held);
        if let (Some(rid), Some(first)) = (request, first) {
            store.answer_marker(rid, first, status, applied, now_ms);
        }
        let c = &store.counters;
        c.pushes.fetch_add(1, Ordering::Relaxed);
        c.push_keys.fetch_add(u64::from(applied), Ordering::Relaxed);
        encode_push_reply(out, id, self.worker, table, status, applied);
        Ok(())
    }

    /// Answers a push its marker says was seen before (true), or goes on
    /// to apply a new one (false).
    fn answer_seen(
        &self,
        seen: Seen,
        id: u64,
        table: u32,
        out: &mut Vec<u8>,
    ) -> Result<bool, Refusal> {
        match seen {
            Seen::New => Ok(false),
            Seen::Answered { status, applied } => {
                encode_push_reply(out, id, self.worker, table, status, applied);
                Ok(true)
            }
            Seen::Applying => Err((
                ErrorCode::Unavailable,
                "this push is being applied now; ask again for its answer".into(),
            )),
            Seen::Stale => Err((
                ErrorCode::ConditionFailed,
                "a later push of this client was applied since; this one was not".into(),
            )),
        }
    }

    /// Whether this server leads `slot` (every slot before it has a map).
    fn leads(&mut self, slot: u16) -> bool {
        let Some(shared) = &self.routing else {
            return true;
        };
        self.view
            .current(shared)
            .is_none_or(|r| r.serves(slot, false))
    }

    /// A push holding a key of a slot served elsewhere. A client splits a
    /// push by group and sends a part that failed again under its id; if
    /// the map moved some of the part's slots meanwhile (growth), the part
    /// now spans groups and would be split anew under new ids. Its marker
    /// lives in its first key's slot (and moves with it), so the server
    /// leading that slot decides: a part applied before is answered as it
    /// was, never applied again in new parts; one never applied is refused
    /// whole, and its marker keeps the refusal, so a late copy of the first
    /// send cannot apply after the client has sent its keys split anew.
    #[allow(clippy::too_many_arguments)]
    fn refuse_push(
        &mut self,
        refused: Refusal,
        id: u64,
        table: u32,
        request: Option<PushId>,
        first: Option<u64>,
        out: &mut Vec<u8>,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let (Some(rid), Some(first)) = (request, first) else {
            return Err(refused);
        };
        if !self.leads(slot_of_u64(first)) {
            return Err(refused);
        }
        let store = self.store.clone();
        let _barrier = store.push_barrier();
        let seen = store.peek_marker(rid, first, now_ms);
        if seen == Seen::New {
            store.answer_marker(rid, first, refused.0, 0, now_ms);
            return Err(refused);
        }
        self.answer_seen(seen, id, table, out).map(|_| ())
    }
}

impl Service for PsService {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Ps]
    }

    /// Serves one PS request; every refusal (a bad request, an unknown
    /// table, a pull that cannot be written) refuses the frame whole.
    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        let id = call.id();
        let now_ms = call.now_ms;
        let req = decode_request(&call.frame).map_err(wire_refusal)?;
        match req {
            PsRequest::Create(body) => decode_create(body)
                .and_then(|spec| self.store.create(&spec))
                .map(|d| encode_table_reply(reply.buf(), id, self.worker, PsOp::Create, &d)),
            PsRequest::Open(name) => match self.store.by_name(name) {
                Some(t) => {
                    encode_table_reply(reply.buf(), id, self.worker, PsOp::Open, &t.desc());
                    Ok(())
                }
                None => Err((ErrorCode::NoSuchTable, format!("no table named {name:?}"))),
            },
            PsRequest::List => {
                encode_list_reply(reply.buf(), id, self.worker, &self.store.list());
                Ok(())
            }
            PsRequest::Pull { table, keys, dest } => {
                self.pull(id, table, keys, dest, reply, now_ms)
            }
            PsRequest::Push {
                table,
                mode,
                keys,
                values,
                request,
            } => self.push(id, table, mode, keys, values, request, reply.buf(), now_ms),
        }
    }

    fn shared_stats(&self, out: &mut StatsList) {
        out.extend(self.store.stats_list());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
