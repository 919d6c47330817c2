//! What every worker's cache service and the gRPC backend share: the
//! store, the clients registered over gRPC and their bound regions, the
//! job queue of each worker (a gRPC call that moves bytes runs on the
//! worker owning the client's connection), and the counters STATS reports.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use fabrickv_cache::{CacheConfig, CacheStore};
use fabrickv_transport::{ConnId, RemoteRegion, Waker, WorkerPort};
use fabrickv_types::limits::{
    CACHE_CLIENTS_MAX, CACHE_CLIENT_BUFFER_BYTES_MAX, CACHE_HEARTBEAT_TIMEOUT_MS,
};
use fabrickv_types::ErrorCode;

use crate::service::Refusal;

/// Expired entries one sweep removes (active expiry runs every
/// `SWEEP_INTERVAL_MS` on worker 0, so at most this many per interval).
pub const CACHE_EXPIRE_PER_SWEEP: usize = 4096;

/// How long a gRPC call waits for the worker that owns a client's
/// connection to move its bytes, in milliseconds.
pub const CACHE_JOB_TIMEOUT_MS: u64 = 5_000;

/// Jobs queued to one worker before gRPC callers are told to back off.
pub const CACHE_JOBS_QUEUED_MAX: usize = 1024;

/// Registrations one gRPC connection (one peer address and port) may
/// hold at once: a client process needs one per data-plane connection it
/// binds, so a few dozen is ample, and a caller registering in a loop
/// stops here instead of filling the table.
pub const CACHE_CLIENTS_PER_CONN_MAX: usize = 64;

/// Registrations all the connections of one host (peer IP address) may
/// hold at once: a quarter of the table, so that no one host, however
/// many connections it opens, locks the others out.
pub const CACHE_CLIENTS_PER_HOST_MAX: usize = CACHE_CLIENTS_MAX / 4;

const _: () = assert!(CACHE_CLIENTS_PER_CONN_MAX <= CACHE_CLIENTS_PER_HOST_MAX);
const _: () = assert!(CACHE_CLIENTS_PER_HOST_MAX < CACHE_CLIENTS_MAX);

/// Work a gRPC call hands to the worker owning a client's connection.
pub type Job = Box<dyn FnOnce(&mut dyn WorkerPort) + Send>;
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
    /// The gRPC connection that registered it (`None`: a caller with no
    /// socket, in-process): only that connection may heartbeat or
    /// unregister it, and a reconnect from the same host may take it over
    /// by registering again with its id.
    pub owner: Option<SocketAddr>,
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

    /// Registers a client for the connection `owner` (id 0: the server
    /// picks one); returns its id.
    ///
    /// Ids are random (never sequential), so that one client's id cannot
    /// be guessed from another's: before, ids 2, 3, 4, ... let any caller
    /// heartbeat, unregister or take over the others' registrations. A
    /// non-zero id renews a registration `owner` holds, or moves it to a
    /// new connection of the same host (a reconnect presenting its id); an
    /// id registered elsewhere or not at all is refused as
    /// [`ErrorCode::NoSuchClient`], the same answer, so that ids do not
    /// leak. One connection holds at most [`CACHE_CLIENTS_PER_CONN_MAX`]
    /// registrations and one host [`CACHE_CLIENTS_PER_HOST_MAX`]
    /// ([`ErrorCode::Unavailable`] beyond), so that no caller can fill
    /// the table (4,095 registrations from one caller used to lock every
    /// new client out).
    pub fn register(
        &self,
        owner: Option<SocketAddr>,
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
        let renewing = client_id != 0;
        if renewing {
            let held = clients
                .get(&client_id)
                .is_some_and(|c| same_host(c.owner, owner));
            if !held {
                return Err(no_client(client_id));
            }
        }
        // What this connection and host hold, the renewed registration
        // not counted (it is replaced, not added).
        let (mut on_conn, mut on_host) = (0, 0);
        for (id, c) in clients.iter() {
            if *id != client_id && same_host(c.owner, owner) {
                on_host += 1;
                on_conn += usize::from(c.owner == owner);
            }
        }
        if on_conn >= CACHE_CLIENTS_PER_CONN_MAX {
            return Err((
                ErrorCode::Unavailable,
                format!(
                    "this connection holds {CACHE_CLIENTS_PER_CONN_MAX} registrations already; \
                     unregister one first"
                ),
            ));
        }
        if on_host >= CACHE_CLIENTS_PER_HOST_MAX {
            return Err((
                ErrorCode::Unavailable,
                format!("this host holds {CACHE_CLIENTS_PER_HOST_MAX} registrations already"),
            ));
        }
        if !renewing && clients.len() >= CACHE_CLIENTS_MAX {
            return Err((
                ErrorCode::Unavailable,
                format!("{CACHE_CLIENTS_MAX} clients are registered already"),
            ));
        }
        let id = if renewing {
            client_id
        } else {
            loop {
                let id = fabrickv_auth::random_u64();
                if id != 0 && !clients.contains_key(&id) {
                    break id;
                }
            }
        };
        let rec = ClientRecord {
            addresses,
            buffer_bytes,
            expires_at_ms: now_ms + CACHE_HEARTBEAT_TIMEOUT_MS,
            bound: None,
            next_offset: 0,
            owner,
        };
        clients.insert(id, rec);
        Ok(id)
    }

    /// Extends a client's registration; returns ms until it lapses. Only
    /// the connection that registered it may; to any other the id is
    /// unknown.
    pub fn heartbeat(
        &self,
        owner: Option<SocketAddr>,
        client_id: u64,
        now_ms: u64,
    ) -> Result<u64, Refusal> {
        let mut clients = self.clients();
        let c = clients
            .get_mut(&client_id)
            .filter(|c| c.owner == owner)
            .ok_or_else(|| no_client(client_id))?;
        c.expires_at_ms = now_ms + CACHE_HEARTBEAT_TIMEOUT_MS;
        Ok(CACHE_HEARTBEAT_TIMEOUT_MS)
    }

    /// Releases a client; false if it was not registered, or not by the
    /// connection `owner` (the same answer, so that ids do not leak).
    pub fn unregister(&self, owner: Option<SocketAddr>, client_id: u64) -> bool {
        let mut clients = self.clients();
        if clients.get(&client_id).is_some_and(|c| c.owner == owner) {
            clients.remove(&client_id);
            true
        } else {
            false
        }
    }

    /// Number of registered clients.
    pub fn client_count(&self) -> usize {
        self.clients().len()
    }

    pub(super) fn bind(&self, client_id: u64, b: Binding) -> Result<(), Refusal> {
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
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
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
            ("cache_clients_expired", load(&c.clients_expired)),
            ("cache_one_sided_out_bytes", load(&c.one_sided_out_bytes)),
            ("cache_one_sided_in_bytes", load(&c.one_sided_in_bytes)),
            ("cache_inline_out_bytes", load(&c.inline_out_bytes)),
            ("cache_buffer_too_small", load(&c.buffer_too_small)),
            ("cache_puts_abandoned", load(&c.puts_abandoned)),
        ]
    }
}

/// Whether two connections are on one host (both in-process counts as
/// one).
fn same_host(a: Option<SocketAddr>, b: Option<SocketAddr>) -> bool {
    a.map(|a| a.ip()) == b.map(|b| b.ip())
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
