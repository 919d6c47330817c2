//! The gRPC control plane's view of the cache: [`GrpcBackend`] implements
//! `fabrickv_control::CacheBackend` over the store every worker serves.
//!
//! Inline calls (Put, Get, Delete, Exists, Stats) touch the shared store
//! directly from tonic's blocking pool: the store is behind its own lock
//! and needs no worker. Calls that move bytes to or from a client's
//! registered buffer (Put from the client, Get into the client) cannot run
//! there, because only the worker that owns the client's data-plane
//! connection may use it: they are queued to that worker
//! ([`CacheShared::run_on_worker`]) and wait for it. A client makes its
//! buffer reachable by registering over gRPC, then sending BIND with its id
//! on a data-plane connection that registered the buffer.
//!
//! The size of every placement is checked against the client's buffer
//! ([`CacheShared::place`]) before any byte moves, and a value being
//! written to a client stays leased, so it is neither freed nor evicted
//! while the transfer runs.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fabrickv_control::{
    BackendError, Bytes, CacheBackend, Caller, ClientRange, ControlServer, Fetched, Placed,
    Registered, Registration, StatsSnapshot,
};
use fabrickv_transport::TransportError;
use fabrickv_types::limits::CACHE_HEARTBEAT_TIMEOUT_MS;
use fabrickv_types::ErrorCode;

use crate::cache::CacheShared;
use crate::service::{Clock, Refusal};
use crate::slot_routing::SlotRouting;
use fabrickv_cluster::slots::key_slot;

/// How often clients are asked to heartbeat: a third of the timeout, so
/// that two lost heartbeats in a row do not release a live client.
pub const CACHE_HEARTBEAT_INTERVAL_MS: u64 = CACHE_HEARTBEAT_TIMEOUT_MS / 3;

/// The cache, as the gRPC service sees it.
pub struct GrpcBackend {
    shared: Arc<CacheShared>,
    clock: Clock,
    data_plane: Vec<String>,
    /// Which slots this server serves, in a cluster with a slot map.
    routing: Arc<SlotRouting>,
}

impl GrpcBackend {
    /// A backend over `shared`; `data_plane` are the addresses of the
    /// server's native listener, told to registering clients.
    pub fn new(shared: Arc<CacheShared>, clock: Clock, data_plane: Vec<String>) -> GrpcBackend {
        GrpcBackend {
            shared,
            clock,
            data_plane,
            routing: SlotRouting::new(),
        }
    }

    /// Serves only the keys of slots `routing` gives this server, as the
    /// data plane's cache service does: a block stored through gRPC on a
    /// server that does not own its slot would be a miss for every
    /// client that routes by the map, and one read there could be stale.
    pub fn with_slot_routing(mut self, routing: Arc<SlotRouting>) -> GrpcBackend {
        self.routing = routing;
        self
    }

    /// Refuses `key` with `WRONG_SERVER` when another server owns its slot.
    fn check_slot(&self, key: &[u8]) -> Result<(), BackendError> {
        let Some(r) = self.routing.routing() else {
            return Ok(());
        };
        let slot = key_slot(key);
        if r.serves(slot, false) {
            return Ok(());
        }
        Err(backend_error(r.wrong_server(slot)))
    }
}

fn backend_error((code, message): Refusal) -> BackendError {
    BackendError::new(code, message)
}

fn cache_error(e: fabrickv_cache::CacheError) -> BackendError {
    BackendError::new(e.code(), e.to_string())
}

/// Milliseconds from `now_ms` until `expires_at_ms` (0 = never), never 0
/// for an entry that does expire.
fn expires_in(expires_at_ms: u64, now_ms: u64) -> u64 {
    match expires_at_ms {
        0 => 0,
        at => at.saturating_sub(now_ms).max(1),
    }
}

/// A transfer the owning worker's transport refused (the client's region
/// descriptor was bad, or the connection closed under it). A transport
/// without one-sided access never gets this far: [`require_one_sided`]
/// refuses first.
fn transfer_failed(what: &str, e: TransportError) -> Refusal {
    let code = match e {
        TransportError::Closed => ErrorCode::NoSuchClient,
        _ => ErrorCode::Malformed,
    };
    (code, format!("{what} the client's buffer failed: {e}"))
}

/// Refuses a transfer up front, as unavailable, where the owning worker's
/// transport has no one-sided `access` (`capable` false: a client that
/// sent a region descriptor over tcp). The message is the one the failed
/// transfer used to give, so clients see no change.
fn require_one_sided(capable: bool, what: &str, access: &'static str) -> Result<(), Refusal> {
    if capable {
        return Ok(());
    }
    let e = TransportError::Unsupported(access);
    Err((
        ErrorCode::Unavailable,
        format!("{what} the client's buffer failed: {e}"),
    ))
}

impl CacheBackend for GrpcBackend {
    fn put(&self, key: &[u8], value: &[u8], ttl_ms: u64) -> Result<(), BackendError> {
        self.check_slot(key)?;
        self.shared
            .store()
            .put(key, value, ttl_ms, self.clock.now_ms())
            .map_err(cache_error)
    }

    fn put_from_client(
        &self,
        key: &[u8],
        from: ClientRange,
        ttl_ms: u64,
    ) -> Result<(), BackendError> {
        self.check_slot(key)?;
        let ClientRange {
            client_id,
            offset,
            len,
        } = from;
        let (b, at) = self
            .shared
            .place(client_id, Some(offset), len)
            .map_err(backend_error)?;
        let now = self.clock.now_ms();
        let slot = self
            .shared
            .store()
            .reserve(key, len as usize, ttl_ms, now)
            .map_err(cache_error)?;
        // The slot travels to the worker and back; if the call gives up
        // first, the slot is dropped there and its space freed, unseen.
        let slot = self
            .shared
            .run_on_worker(&b, move |port| {
                let mut slot = slot;
                require_one_sided(
                    port.capabilities().one_sided_read,
                    "reading",
                    "one-sided read",
                )?;
                port.read_remote(b.conn, &b.region, at as usize, slot.bytes_mut())
                    .map_err(|e| transfer_failed("reading", e))?;
                Ok(slot)
            })
            .map_err(backend_error)?;
        slot.commit(self.clock.now_ms()).map_err(cache_error)?;
        self.shared
            .counters
            .one_sided_in_bytes
            .fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    fn get(&self, key: &[u8]) -> Result<Option<Fetched>, BackendError> {
        self.check_slot(key)?;
        let now = self.clock.now_ms();
        Ok(self.shared.store().get(key, now).map(|lease| Fetched {
            // Copied out so that the lease ends now, not when a slow gRPC
            // client has finished receiving.
            value: Bytes::copy_from_slice(&lease),
            expires_in_ms: expires_in(lease.expires_at_ms(), now),
        }))
    }

    fn get_to_client(
        &self,
        key: &[u8],
        client_id: u64,
        offset: Option<u64>,
    ) -> Result<Option<Placed>, BackendError> {
        self.check_slot(key)?;
        let now = self.clock.now_ms();
        let Some(lease) = self.shared.store().get(key, now) else {
            return Ok(None);
        };
        let length = lease.len() as u64;
        let expires_in_ms = expires_in(lease.expires_at_ms(), now);
        let (b, at) = match self.shared.place(client_id, offset, length) {
            Ok(p) => p,
            Err(r) => {
                if r.0 == ErrorCode::BufferTooSmall {
                    self.shared
                        .counters
                        .buffer_too_small
                        .fetch_add(1, Ordering::Relaxed);
                }
                return Err(backend_error(r));
            }
        };
        self.shared
            .run_on_worker(&b, move |port| {
                require_one_sided(
                    port.capabilities().one_sided_write,
                    "writing",
                    "one-sided write",
                )?;
                port.write_remote(b.conn, &b.region, at as usize, &lease)
                    .map_err(|e| transfer_failed("writing", e))
            })
            .map_err(backend_error)?;
        self.shared
            .counters
            .one_sided_out_bytes
            .fetch_add(length, Ordering::Relaxed);
        Ok(Some(Placed {
            offset: at,
            length,
            expires_in_ms,
        }))
    }

    fn delete(&self, key: &[u8]) -> Result<bool, BackendError> {
        self.check_slot(key)?;
        Ok(self.shared.store().delete(key, self.clock.now_ms()))
    }

    fn exists(&self, key: &[u8]) -> Result<bool, BackendError> {
        self.check_slot(key)?;
        Ok(self.shared.store().exists(key, self.clock.now_ms()))
    }

    fn register(&self, caller: &Caller, r: Registration) -> Result<Registered, BackendError> {
        let client_id = self
            .shared
            .register(
                caller.peer,
                r.client_id,
                r.addresses,
                r.receive_buffer_bytes,
                self.clock.now_ms(),
            )
            .map_err(backend_error)?;
        Ok(Registered {
            client_id,
            heartbeat_interval_ms: CACHE_HEARTBEAT_INTERVAL_MS,
            heartbeat_timeout_ms: CACHE_HEARTBEAT_TIMEOUT_MS,
            data_plane: self.data_plane.clone(),
        })
    }

    fn heartbeat(&self, caller: &Caller, client_id: u64) -> Result<u64, BackendError> {
        self.shared
            .heartbeat(caller.peer, client_id, self.clock.now_ms())
            .map_err(backend_error)
    }

    fn unregister(&self, caller: &Caller, client_id: u64) -> Result<bool, BackendError> {
        Ok(self.shared.unregister(caller.peer, client_id))
    }

    fn stats(&self) -> StatsSnapshot {
        StatsSnapshot {
            counters: self
                .shared
                .stats_list()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            fragmentation: self.shared.store().stats().fragmentation,
        }
    }
}

/// Starts the gRPC control plane on `addr` (port 0 picks one) over the
/// cache in `shared`; with `auth`, every call must carry the cluster
/// secret as its bearer token.
pub fn start(
    addr: SocketAddr,
    shared: Arc<CacheShared>,
    clock: Clock,
    data_plane: Vec<String>,
    auth: Option<fabrickv_auth::Secret>,
    throttle: fabrickv_auth::throttle::SharedThrottle,
    routing: Arc<SlotRouting>,
) -> Result<ControlServer, fabrickv_control::ServeError> {
    let backend = GrpcBackend::new(shared, clock, data_plane).with_slot_routing(routing);
    let check = fabrickv_control::auth::BearerCheck::new(auth).with_throttle(Some(throttle));
    ControlServer::start_checked(addr, Arc::new(backend), check)
}
