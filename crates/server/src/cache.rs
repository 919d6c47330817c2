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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use fabrickv_cache::{CacheConfig, CacheError, CacheStore, Lease, PutSlot};
use fabrickv_transport::{ConnId, RemoteRegion, Reply, Waker, WorkerPort};
use fabrickv_types::limits::{
    CACHE_CHUNK_BYTES_MAX, CACHE_CLIENTS_MAX, CACHE_CLIENT_BUFFER_BYTES_MAX,
    CACHE_HEARTBEAT_TIMEOUT_MS,
};
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{
    decode_request, encode_put_reply, encode_status_reply, CacheOp, CacheRequest, GetReplyWriter,
    PutSource, RegionSlice,
};

use crate::service::{wire_refusal, Call, Refusal, Service, StatsList};

/// Chunked puts one worker holds open at once (each pins its reserved
/// space until its last chunk or its deadline).
pub const CACHE_PENDING_PUTS_MAX: usize = 256;

/// A chunked put whose next chunk is this late is dropped and its space
/// freed, in milliseconds.
pub const CACHE_PENDING_PUT_TIMEOUT_MS: u64 = 10_000;

/// Expired entries one sweep removes (active expiry runs every
/// `SWEEP_INTERVAL_MS` on worker 0, so at most this many per interval).
pub const CACHE_EXPIRE_PER_SWEEP: usize = 4096;

/// How long a gRPC call waits for the worker that owns a client's
/// connection to move its bytes, in milliseconds.
pub const CACHE_JOB_TIMEOUT_MS: u64 = 5_000;

/// Jobs queued to one worker before gRPC callers are told to back off.
pub const CACHE_JOBS_QUEUED_MAX: usize = 1024;

/// Work a gRPC call hands to the worker owning a client's connection.
pub type Job = Box<dyn FnOnce(&mut dyn WorkerPort) + Send>;

fn refusal(e: CacheError) -> Refusal {
    (e.code(), e.to_string())
}

/// Settings of the cache service.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CacheSettings {
    /// The store: pool size, eviction, watermarks.
    pub store: CacheConfig,
    /// gRPC control-plane address; `None` = no gRPC.
    pub grpc: Option<String>,
    /// Whether a failure to bind `grpc` stops the server (an address given
    /// on purpose) or is logged (the default address, which another server
    /// on this host may hold).
    pub grpc_required: bool,
}

/// A client registered over gRPC.
#[derive(Debug, Clone)]
pub struct ClientRecord {
    /// Addresses the client announced (opaque to the server).
    pub addresses: Vec<String>,
    /// Size of the receive buffer it announced, in bytes.
    pub buffer_bytes: u64,
    /// Released at this time unless a heartbeat comes first.
    pub expires_at_ms: u64,
    /// Its data-plane connection and region, once it sent BIND.
    pub bound: Option<Binding>,
    /// Where the next server-chosen placement goes in its region.
    pub next_offset: u64,
}

/// A client's data-plane connection and registered region.
#[derive(Debug, Clone, Copy)]
pub struct Binding {
    /// The worker owning the connection.
    pub worker: u16,
    /// The connection on that worker.
    pub conn: ConnId,
    /// The region it registered.
    pub region: RemoteRegion,
    /// The region's size in bytes.
    pub len: u64,
}

/// Counters of the data plane and control plane, for STATS.
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Bytes written one-sided into clients' regions.
    pub one_sided_out_bytes: AtomicU64,
    /// Bytes read one-sided from clients' regions.
    pub one_sided_in_bytes: AtomicU64,
    /// Bytes sent inline in GET chunks.
    pub inline_out_bytes: AtomicU64,
    /// GETs refused because the value did not fit the destination slice.
    pub buffer_too_small: AtomicU64,
    /// Chunked puts dropped at their deadline.
    pub puts_abandoned: AtomicU64,
    /// Clients released because their heartbeats stopped.
    pub clients_expired: AtomicU64,
}

/// State shared by every worker's cache service and the gRPC backend.
pub struct CacheShared {
    store: CacheStore,
    clients: Mutex<HashMap<u64, ClientRecord>>,
    next_client: AtomicU64,
    jobs: Mutex<Vec<(Sender<Job>, Waker)>>,
    /// Counters.
    pub counters: CacheCounters,
}

impl CacheShared {
    /// The shared state over a new store.
    pub fn new(cfg: CacheConfig) -> Result<Arc<CacheShared>, String> {
        let store = CacheStore::new(cfg).map_err(|e| format!("cache pool: {e}"))?;
        Ok(Arc::new(CacheShared {
            store,
            clients: Mutex::new(HashMap::new()),
            next_client: AtomicU64::new(1),
            jobs: Mutex::new(Vec::new()),
            counters: CacheCounters::default(),
        }))
    }

    /// The store.
    pub fn store(&self) -> &CacheStore {
        &self.store
    }

    /// Adds worker `jobs.len()`'s job queue; returns its receiving end.
    pub fn add_worker(&self, waker: Waker) -> Receiver<Job> {
        let (tx, rx) = crossbeam_channel::bounded(CACHE_JOBS_QUEUED_MAX);
        lock(&self.jobs).push((tx, waker));
        rx
    }

    fn clients(&self) -> MutexGuard<'_, HashMap<u64, ClientRecord>> {
        lock(&self.clients)
    }

    /// Registers a client (id 0: the server picks one); returns its id.
    pub fn register(
        &self,
        client_id: u64,
        addresses: Vec<String>,
        buffer_bytes: u64,
        now_ms: u64,
    ) -> Result<u64, Refusal> {
        if buffer_bytes > CACHE_CLIENT_BUFFER_BYTES_MAX {
            return Err((
                ErrorCode::ValueTooLarge,
                format!("a receive buffer of {buffer_bytes} bytes exceeds {CACHE_CLIENT_BUFFER_BYTES_MAX}"),
            ));
        }
        let mut clients = self.clients();
        let id = if client_id == 0 {
            loop {
                let id = self.next_client.fetch_add(1, Ordering::Relaxed);
                if !clients.contains_key(&id) {
                    break id;
                }
            }
        } else {
            client_id
        };
        if !clients.contains_key(&id) && clients.len() >= CACHE_CLIENTS_MAX {
            return Err((
                ErrorCode::Unavailable,
                format!("{CACHE_CLIENTS_MAX} clients are registered already"),
            ));
        }
        let rec = ClientRecord {
            addresses,
            buffer_bytes,
            expires_at_ms: now_ms + CACHE_HEARTBEAT_TIMEOUT_MS,
            bound: None,
            next_offset: 0,
        };
        clients.insert(id, rec);
        Ok(id)
    }

    /// Extends a client's registration; returns ms until it lapses.
    pub fn heartbeat(&self, client_id: u64, now_ms: u64) -> Result<u64, Refusal> {
        let mut clients = self.clients();
        let c = clients
            .get_mut(&client_id)
            .ok_or_else(|| no_client(client_id))?;
        c.expires_at_ms = now_ms + CACHE_HEARTBEAT_TIMEOUT_MS;
        Ok(CACHE_HEARTBEAT_TIMEOUT_MS)
    }

    /// Releases a client; false if it was not registered.
    pub fn unregister(&self, client_id: u64) -> bool {
        self.clients().remove(&client_id).is_some()
    }

    /// Number of registered clients.
    pub fn client_count(&self) -> usize {
        self.clients().len()
    }

    fn bind(&self, client_id: u64, b: Binding) -> Result<(), Refusal> {
        let mut clients = self.clients();
        let c = clients
            .get_mut(&client_id)
            .ok_or_else(|| no_client(client_id))?;
        c.bound = Some(b);
        c.next_offset = 0;
        Ok(())
    }

    /// Active expiry: entries past their TTL and clients past their last
    /// heartbeat. Called by worker 0 every sweep interval.
    pub fn sweep(&self, now_ms: u64) {
        self.store.expire(now_ms, CACHE_EXPIRE_PER_SWEEP);
        let mut clients = self.clients();
        let before = clients.len();
        clients.retain(|_, c| c.expires_at_ms > now_ms);
        let gone = before - clients.len();
        if gone > 0 {
            self.counters
                .clients_expired
                .fetch_add(gone as u64, Ordering::Relaxed);
        }
    }

    /// Where a placement for `client_id` of `len` bytes goes: `offset` if
    /// given (checked), else the next free place in the client's region,
    /// wrapping to its start (the client consumes values before the
    /// region comes round, as the reader of a ring buffer does).
    pub fn place(
        &self,
        client_id: u64,
        offset: Option<u64>,
        len: u64,
    ) -> Result<(Binding, u64), Refusal> {
        let mut clients = self.clients();
        let c = clients
            .get_mut(&client_id)
            .ok_or_else(|| no_client(client_id))?;
        let b = c.bound.ok_or_else(|| {
            (
                ErrorCode::NoSuchClient,
                format!("client {client_id} has not bound a data-plane region (BIND)"),
            )
        })?;
        let at = match offset {
            Some(o) => o,
            None if c.next_offset + len <= b.len => c.next_offset,
            None => 0,
        };
        if at.checked_add(len).is_none_or(|end| end > b.len) {
            return Err((
                ErrorCode::BufferTooSmall,
                format!(
                    "{len} bytes at offset {at} do not fit client {client_id}'s {}-byte buffer",
                    b.len
                ),
            ));
        }
        if offset.is_none() {
            c.next_offset = at + len;
        }
        Ok((b, at))
    }

    /// Runs `job` on the worker owning `b`'s connection and waits for its
    /// result.
    pub fn run_on_worker<T: Send + 'static>(
        &self,
        b: &Binding,
        job: impl FnOnce(&mut dyn WorkerPort) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Refusal> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        // Set when the caller stops waiting: a job that has not started by
        // then is skipped, so that a call reported as timed out does not
        // write into the client's buffer afterwards.
        let abandoned = Arc::new(AtomicBool::new(false));
        let skip = Arc::clone(&abandoned);
        let boxed: Job = Box::new(move |port| {
            if !skip.load(Ordering::Acquire) {
                let _ = tx.send(job(port));
            }
        });
        {
            let jobs = lock(&self.jobs);
            let (q, waker) = jobs
                .get(usize::from(b.worker))
                .ok_or_else(|| (ErrorCode::Internal, format!("no worker {}", b.worker)))?;
            q.try_send(boxed).map_err(|_| {
                (
                    ErrorCode::Unavailable,
                    format!(
                        "worker {} has {CACHE_JOBS_QUEUED_MAX} transfers queued",
                        b.worker
                    ),
                )
            })?;
            waker.wake();
        }
        rx.recv_timeout(Duration::from_millis(CACHE_JOB_TIMEOUT_MS))
            .map_err(|_| {
                abandoned.store(true, Ordering::Release);
                (
                    ErrorCode::Timeout,
                    format!("worker {} did not run the transfer in time", b.worker),
                )
            })?
    }

    /// Store and service counters, for STATS.
    pub fn stats_list(&self) -> Vec<(&'static str, u64)> {
        let s = self.store.stats();
        let c = &self.counters;
        vec![
            ("cache_entries", s.entries),
            ("cache_pool_bytes", s.pool_bytes),
            ("cache_used_bytes", s.used_bytes),
            ("cache_value_bytes", s.value_bytes),
            ("cache_free_bytes", s.free_bytes),
            ("cache_largest_free_bytes", s.largest_free_bytes),
            ("cache_fragmentation_ppm", (s.fragmentation * 1e6) as u64),
            ("cache_leased_entries", s.leased_entries),
            ("cache_hits", s.hits),
            ("cache_misses", s.misses),
            ("cache_puts", s.puts),
            ("cache_deletes", s.deletes),
            ("cache_evictions", s.evictions),
            ("cache_expirations", s.expirations),
            ("cache_full_errors", s.full_errors),
            ("cache_clients", self.client_count() as u64),
            (
                "cache_clients_expired",
                c.clients_expired.load(Ordering::Relaxed),
            ),
            (
                "cache_one_sided_out_bytes",
                c.one_sided_out_bytes.load(Ordering::Relaxed),
            ),
            (
                "cache_one_sided_in_bytes",
                c.one_sided_in_bytes.load(Ordering::Relaxed),
            ),
            (
                "cache_inline_out_bytes",
                c.inline_out_bytes.load(Ordering::Relaxed),
            ),
            (
                "cache_buffer_too_small",
                c.buffer_too_small.load(Ordering::Relaxed),
            ),
            (
                "cache_puts_abandoned",
                c.puts_abandoned.load(Ordering::Relaxed),
            ),
        ]
    }
}

fn no_client(id: u64) -> Refusal {
    (
        ErrorCode::NoSuchClient,
        format!("client {id} is not registered (or its heartbeats stopped)"),
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A chunked put under way.
struct Pending {
    slot: PutSlot,
    key: Vec<u8>,
    received: u64,
    deadline_ms: u64,
}

/// The cache service of one worker.
pub struct CacheService {
    worker: u16,
    shared: Arc<CacheShared>,
    pending: HashMap<(ConnId, u64), Pending>,
    jobs: Option<Receiver<Job>>,
    /// Checksums of inline GET chunks already sent (see [`ChunkCrcs`]).
    chunk_crcs: ChunkCrcs,
}

impl CacheService {
    /// The service of worker `worker`.
    pub fn new(worker: u16, shared: Arc<CacheShared>, jobs: Option<Receiver<Job>>) -> Self {
        CacheService {
            worker,
            shared,
            pending: HashMap::new(),
            jobs,
            chunk_crcs: ChunkCrcs::default(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        conn: ConnId,
        id: u64,
        key: &[u8],
        transfer: u64,
        ttl_ms: u64,
        total_len: u64,
        offset: u64,
        source: PutSource<'_>,
        reply: &mut dyn Reply,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let store = &self.shared.store;
        let total = total_len as usize;
        match source {
            PutSource::Region(src) => {
                let region = region_of(&src)?;
                region
                    .check(src.offset as usize, total)
                    .map_err(|e| (ErrorCode::Malformed, e.to_string()))?;
                let mut slot = store.reserve(key, total, ttl_ms, now_ms).map_err(refusal)?;
                reply
                    .read_remote(&region, src.offset as usize, slot.bytes_mut())
                    .map_err(|e| (ErrorCode::Malformed, format!("one-sided read refused: {e}")))?;
                let generation = slot.commit(now_ms).map_err(refusal)?;
                self.shared
                    .counters
                    .one_sided_in_bytes
                    .fetch_add(total_len, Ordering::Relaxed);
                encode_put_reply(
                    reply.buf(),
                    id,
                    self.worker,
                    ErrorCode::Ok,
                    generation,
                    total_len,
                    total_len,
                );
                Ok(())
            }
            PutSource::Inline(chunk) if offset == 0 && chunk.len() == total => {
                let mut slot = store.reserve(key, total, ttl_ms, now_ms).map_err(refusal)?;
                slot.bytes_mut().copy_from_slice(chunk);
                let generation = slot.commit(now_ms).map_err(refusal)?;
                encode_put_reply(
                    reply.buf(),
                    id,
                    self.worker,
                    ErrorCode::Ok,
                    generation,
                    total_len,
                    total_len,
                );
                Ok(())
            }
            PutSource::Inline(chunk) if offset == 0 => {
                if self.pending.len() >= CACHE_PENDING_PUTS_MAX {
                    return Err((
                        ErrorCode::Unavailable,
                        format!("{CACHE_PENDING_PUTS_MAX} chunked puts are open on this worker"),
                    ));
                }
                let mut slot = store.reserve(key, total, ttl_ms, now_ms).map_err(refusal)?;
                slot.bytes_mut()[..chunk.len()].copy_from_slice(chunk);
                // A new transfer with a used id replaces the old one, whose
                // space is freed (nothing of it was ever visible).
                self.pending.insert(
                    (conn, transfer),
                    Pending {
                        slot,
                        key: key.to_vec(),
                        received: chunk.len() as u64,
                        deadline_ms: now_ms + CACHE_PENDING_PUT_TIMEOUT_MS,
                    },
                );
                encode_put_reply(
                    reply.buf(),
                    id,
                    self.worker,
                    ErrorCode::Ok,
                    0,
                    chunk.len() as u64,
                    total_len,
                );
                Ok(())
            }
            PutSource::Inline(chunk) => {
                let Some(p) = self.pending.get_mut(&(conn, transfer)) else {
                    return Err((
                        ErrorCode::NotFound,
                        format!("no chunked put {transfer} is open on this connection"),
                    ));
                };
                if p.key != key || p.slot.len() as u64 != total_len || p.received != offset {
                    // Chunks of one transfer come in order on one
                    // connection; anything else is a broken client. The
                    // transfer is dropped so nothing half-written lands.
                    self.pending.remove(&(conn, transfer));
                    return Err((
                        ErrorCode::Malformed,
                        format!("chunk at {offset} does not continue put {transfer}"),
                    ));
                }
                let at = offset as usize;
                p.slot.bytes_mut()[at..at + chunk.len()].copy_from_slice(chunk);
                p.received += chunk.len() as u64;
                p.deadline_ms = now_ms + CACHE_PENDING_PUT_TIMEOUT_MS;
                if p.received < total_len {
                    let received = p.received;
                    encode_put_reply(
                        reply.buf(),
                        id,
                        self.worker,
                        ErrorCode::Ok,
                        0,
                        received,
                        total_len,
                    );
                    return Ok(());
                }
                let Some(p) = self.pending.remove(&(conn, transfer)) else {
                    return Err((ErrorCode::Internal, "chunked put vanished".to_string()));
                };
                let generation = p.slot.commit(now_ms).map_err(refusal)?;
                encode_put_reply(
                    reply.buf(),
                    id,
                    self.worker,
                    ErrorCode::Ok,
                    generation,
                    total_len,
                    total_len,
                );
                Ok(())
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn get(
        &mut self,
        id: u64,
        key: &[u8],
        generation: u64,
        offset: u64,
        max_len: u64,
        dest: Option<RegionSlice>,
        reply: &mut dyn Reply,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let store = &self.shared.store;
        let lease: Lease = if generation == 0 {
            store
                .get(key, now_ms)
                .ok_or_else(|| (ErrorCode::NotFound, "no such key".to_string()))?
        } else {
            store.lease_if(key, generation, now_ms).map_err(refusal)?
        };
        let total = lease.len() as u64;
        let expires_in = match lease.expires_at_ms() {
            0 => 0,
            at => at.saturating_sub(now_ms).max(1),
        };
        let gen = lease.generation();
        match dest {
            Some(d) => {
                let region = region_of(&d)?;
                if total > d.len {
                    // Checked before any byte moves: the value does not fit
                    // the slice the client named.
                    self.shared
                        .counters
                        .buffer_too_small
                        .fetch_add(1, Ordering::Relaxed);
                    let w = GetReplyWriter::begin(
                        reply.buf(),
                        id,
                        self.worker,
                        ErrorCode::BufferTooSmall,
                        gen,
                        total,
                        0,
                        expires_in,
                    );
                    w.finish(reply.buf());
                    return Ok(());
                }
                let at = d.offset as usize;
                region
                    .check(at, d.len as usize)
                    .map_err(|e| (ErrorCode::Malformed, e.to_string()))?;
                let one_sided = |e: fabrickv_transport::TransportError| {
                    (
                        ErrorCode::Malformed,
                        format!("one-sided write refused: {e}"),
                    )
                };
                match reply
                    .remote_mut(&region, at, lease.len())
                    .map_err(one_sided)?
                {
                    Some(view) => fabrickv_cache::copy_to_reader(view, &lease),
                    None => reply.write_remote(&region, at, &lease).map_err(one_sided)?,
                }
                self.shared
                    .counters
                    .one_sided_out_bytes
                    .fetch_add(total, Ordering::Relaxed);
                let w = GetReplyWriter::begin(
                    reply.buf(),
                    id,
                    self.worker,
                    ErrorCode::Ok,
                    gen,
                    total,
                    0,
                    expires_in,
                );
                w.finish(reply.buf());
            }
            None => {
                let start = offset.min(total) as usize;
                let want = max_len.min(CACHE_CHUNK_BYTES_MAX as u64) as usize;
                let end = (start + want).min(lease.len());
                let out = reply.buf();
                let w = GetReplyWriter::begin(
                    out,
                    id,
                    self.worker,
                    ErrorCode::Ok,
                    gen,
                    total,
                    start as u64,
                    expires_in,
                );
                if end - start < CACHE_SHARED_CHUNK_BYTES_MIN {
                    out.extend_from_slice(&lease[start..end]);
                    w.finish(out);
                } else {
                    // The chunk goes out from the leased value itself (a
                    // vectored write over tcp), not copied into the reply;
                    // the transport holds the lease until it is sent. Its
                    // checksum is computed once per value and chunk.
                    let crc = self.chunk_crcs.of(gen, start..end, &lease[start..end]);
                    w.finish_before(out, end - start, crc);
                    reply.append_shared(Box::new(LeasedChunk {
                        lease,
                        range: start..end,
                    }));
                }
                self.shared
                    .counters
                    .inline_out_bytes
                    .fetch_add((end - start) as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

impl Service for CacheService {
    /// Serves one CACHE frame. An operation that fails is answered with
    /// its code in the reply (the frame was well formed); only a malformed
    /// request (a bad region, a broken chunk sequence) refuses the frame.
    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        let (conn, id, now_ms) = (call.conn, call.id(), call.now_ms);
        let req = decode_request(&call.frame).map_err(wire_refusal)?;
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
            } => (
                CacheOp::Get,
                self.get(id, key, generation, offset, max_len, dest, reply, now_ms),
            ),
            CacheRequest::Delete { key } => {
                let found = self.shared.store.delete(key, now_ms);
                (CacheOp::Delete, {
                    found_status(reply, id, self.worker, CacheOp::Delete, found);
                    Ok(())
                })
            }
            CacheRequest::Exists { key } => {
                let found = self.shared.store.exists(key, now_ms);
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
        let before = self.pending.len();
        self.pending.retain(|_, p| p.deadline_ms > now_ms);
        let dropped = before - self.pending.len();
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

/// Smallest inline GET chunk sent from the leased value instead of copied
/// into the reply, in bytes: below it the copy costs less than queueing
/// the lease (an allocation and a slice of the vectored write).
pub const CACHE_SHARED_CHUNK_BYTES_MIN: usize = 16 << 10;

/// Checksums of chunks one worker keeps, in entries (about 40 bytes each:
/// 2.5 MiB at most per worker). Only chunks of at least
/// `CACHE_SHARED_CHUNK_BYTES_MIN` are kept, so the entries cover at least
/// 1 GiB of values; when full the table starts over.
pub const CACHE_CHUNK_CRCS_MAX: usize = 1 << 16;

/// CRC-32C of inline GET chunks by (generation, start, end). A
/// generation names one committed value, unique and never reused, and a
/// value never changes once committed, so an entry is never stale: a value
/// read many times (the KV-cache pattern) is checksummed once, and each
/// reply's checksum is the header's combined with it
/// (`wire::cache::crc32c_concat`), which leaves the worker no pass over
/// the value at all.
#[derive(Default)]
struct ChunkCrcs {
    crcs: HashMap<(u64, usize, usize), u32>,
}

impl ChunkCrcs {
    /// The checksum of `bytes`, chunk `range` of generation `gen`.
    fn of(&mut self, gen: u64, range: std::ops::Range<usize>, bytes: &[u8]) -> u32 {
        let key = (gen, range.start, range.end);
        if let Some(&crc) = self.crcs.get(&key) {
            return crc;
        }
        if self.crcs.len() >= CACHE_CHUNK_CRCS_MAX {
            self.crcs.clear();
        }
        let crc = fabrickv_wire::cache::chunk_crc(bytes);
        self.crcs.insert(key, crc);
        crc
    }
}

/// A chunk of a leased value that a reply sends from the value's memory;
/// the lease keeps the bytes intact until the transport drops this.
struct LeasedChunk {
    lease: Lease,
    range: std::ops::Range<usize>,
}

impl AsRef<[u8]> for LeasedChunk {
    fn as_ref(&self) -> &[u8] {
        &self.lease[self.range.clone()]
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
