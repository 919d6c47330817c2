//! The FabricKV server: wiring only.
//!
//! Layout:
//! - [`config`]: what a server is told (flags and TOML), with defaults;
//! - [`service`]: the request layer's contract (the [`service::Service`]
//!   trait, the clock, refusals), re-exported from `fabrickv_rpc`, whose
//!   worker decodes, dispatches by kind and replies in bursts;
//! - [`kv`], [`ps`], [`cache`], [`shard`]: the services, one per frame
//!   kind, none of which knows another (sans-I/O: a decoded frame in,
//!   reply bytes out, time passed in);
//! - [`control`]: the HELLO and PARTITIONS services, and the table that
//!   registers every service on a worker;
//! - this file: [`Server::start`], which builds partitions, listens, and
//!   starts one acceptor thread and one thread per worker.
//!
//! Threads share nothing on the data path in the steady state: a server
//! has a fixed number of engine partitions (`--partitions`), the
//! partition table ([`partitions`]) gives each to one worker, and clients
//! steer each key to its partition's owner (MICA's EREW). The table can
//! change while the server serves ([`ServerHandle::partitions`]); every
//! partition sits behind a mutex, so serving never depends on it.

pub mod cache;
pub mod cache_grpc;
pub mod checkpoint;
pub mod config;
pub mod control;
pub mod kv;
pub mod memcache;
mod memcache_net;
pub mod partitions;
pub mod ps;
pub mod replication;
pub mod resp;
mod resp_net;
pub mod service;
pub mod shard;
pub mod slot_routing;
mod text_socket;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use fabrickv_engine::{EngineError, Partition, PartitionConfig};
use fabrickv_transport::{TransportError, Waker};

use memcache::McConnState;
use resp_net::RespConn;
use text_socket::start as front_end;

/// Stops the threads started so far (`wakers` wake the native side's,
/// `text_wakers` the text front ends' loops), when a later part of the
/// server fails to start.
fn stop_started(
    stop: &AtomicBool,
    wakers: &[Waker],
    text_wakers: &[Arc<mio::Waker>],
    threads: Vec<JoinHandle<()>>,
) {
    stop.store(true, Ordering::Release);
    for w in wakers {
        w.wake();
    }
    for w in text_wakers {
        // A failed wake only delays the stop to the loop's poll timeout.
        let _ = w.wake();
    }
    for t in threads {
        let _ = t.join();
    }
}

pub use config::{Mode, ServerConfig, DEFAULT_LISTEN, DEFAULT_PORT};
pub use memcache_net::{MC_CONNECTIONS_MAX, MC_EVICT_IDLE_MIN_MS};
pub use resp_net::{RESP_CONNECTIONS_MAX, RESP_EVICT_IDLE_MIN_MS, RESP_LARGE_STALL_MS};

/// Why a server did not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration breaks a bound.
    Config(String),
    /// The engine could not get its memory.
    Engine(EngineError),
    /// The transport could not listen.
    Transport(TransportError),
    /// A thread could not be started.
    Thread(std::io::Error),
    /// The RESP front-end could not listen on the address.
    Resp(String, std::io::Error),
    /// The memcache front end could not listen on the address.
    Memcache(String, std::io::Error),
    /// The gRPC control plane could not start on the address.
    Grpc(String, String),
    /// A checkpoint could not be restored.
    Checkpoint(String),
    /// A persistent shard could not be opened.
    Shard(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(why) => write!(f, "invalid configuration: {why}"),
            StartError::Engine(e) => write!(f, "engine: {e}"),
            StartError::Transport(e) => write!(f, "cannot listen: {e}"),
            StartError::Thread(e) => write!(f, "cannot start a thread: {e}"),
            StartError::Resp(addr, e) => write!(f, "cannot listen for RESP on {addr}: {e}"),
            StartError::Memcache(addr, e) => {
                write!(f, "cannot listen for memcache on {addr}: {e}")
            }
            StartError::Grpc(addr, e) => write!(f, "cannot serve gRPC on {addr}: {e}"),
            StartError::Checkpoint(e) => write!(f, "cannot restore the checkpoint: {e}"),
            StartError::Shard(e) => write!(f, "cannot open {e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// A running server.
pub struct ServerHandle {
    addr: String,
    workers: usize,
    parts: Arc<partitions::Partitions>,
    /// The embedding tables.
    ps: Arc<ps::PsStore>,
    /// The KV cache's store and shared state.
    cache: Arc<cache::CacheShared>,
    /// Saves and the restore at start.
    checkpoints: Arc<checkpoint::Checkpoints>,
    resp_addr: Option<String>,
    resp_wakers: Vec<Arc<mio::Waker>>,
    memcache_addr: Option<String>,
    memcache_peer_addr: Option<String>,
    grpc: Option<fabrickv_control::ControlServer>,
    slot_routing: Arc<slot_routing::SlotRouting>,
    /// What every reply waits for (armed by replication).
    gate: Arc<fabrickv_rpc::gate::FlushGate>,
    /// The engine clock every thread of the server reads.
    clock: service::Clock,
    stop: Arc<AtomicBool>,
    wakers: Vec<Waker>,
    threads: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    /// The address clients connect to, with the port resolved.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Its data-path worker count (clients open one connection per worker).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The partitions and their table: `move_partition` moves one to
    /// another worker while the server serves (what the PARTITIONS frame
    /// does for remote callers), `table` shows owners and counters.
    pub fn partitions(&self) -> &Arc<partitions::Partitions> {
        &self.parts
    }

    /// The embedding tables (replication ships their rows).
    pub fn ps_store(&self) -> &Arc<ps::PsStore> {
        &self.ps
    }

    /// The server's checkpoints (what SAVE and `checkpoint save` run).
    pub fn checkpoints(&self) -> &Arc<checkpoint::Checkpoints> {
        &self.checkpoints
    }

    /// The KV cache (replication drops a joiner's entries of the slots it
    /// is about to be streamed).
    pub fn cache(&self) -> &Arc<cache::CacheShared> {
        &self.cache
    }

    /// Which slots this server serves, once a cluster's slot map is
    /// installed there (by whoever follows the etcd registry).
    pub fn slot_routing(&self) -> &Arc<slot_routing::SlotRouting> {
        &self.slot_routing
    }

    /// The gate every reply passes, which replication arms.
    pub fn gate(&self) -> &Arc<fabrickv_rpc::gate::FlushGate> {
        &self.gate
    }

    /// The server's engine clock.
    pub fn clock(&self) -> service::Clock {
        self.clock
    }

    /// Where the RESP front-end listens, when it is on.
    pub fn resp_addr(&self) -> Option<&str> {
        self.resp_addr.as_deref()
    }

    /// Where the memcache front end listens, when it is on.
    pub fn memcache_addr(&self) -> Option<&str> {
        self.memcache_addr.as_deref()
    }

    /// Where other servers of its etcd cluster forward memcache commands
    /// for keys of its slots (`ServerConfig::memcache_forwarding`).
    pub fn memcache_peer_addr(&self) -> Option<&str> {
        self.memcache_peer_addr.as_deref()
    }

    /// Where the gRPC control plane listens, when it is on.
    pub fn grpc_addr(&self) -> Option<std::net::SocketAddr> {
        self.grpc.as_ref().map(|g| g.local_addr())
    }

    /// Asks every thread to stop; returns at once.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
        for w in &self.resp_wakers {
            // A failed wake only delays the stop to the loop's poll timeout.
            let _ = w.wake();
        }
    }

    /// Stops the server and waits for its threads.
    pub fn shutdown(mut self) {
        self.stop();
        self.join_threads();
    }

    /// Waits for the threads to end (after [`ServerHandle::stop`]).
    pub fn join(mut self) {
        self.join_threads();
    }

    fn join_threads(&mut self) {
        if let Some(g) = self.grpc.take() {
            if let Err(e) = g.shutdown() {
                tracing::warn!("gRPC control plane: {e}");
            }
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a server thread panicked");
            }
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if !self.threads.is_empty() || self.grpc.is_some() {
            self.stop();
            self.join_threads();
        }
    }
}

/// Entry point.
pub struct Server;

impl Server {
    /// Builds every partition, listens, and starts the threads.
    pub fn start(cfg: &ServerConfig) -> Result<ServerHandle, StartError> {
        cfg.validate().map_err(StartError::Config)?;
        let workers = cfg.workers();
        // Memory and the large-value budget are split over partitions, not
        // workers: a partition keeps its share whichever worker serves it.
        let count = cfg.partitions();
        let per_partition = (cfg.memory_bytes / count as u64) as usize;
        let large_per_partition = cfg.large_memory_bytes.unwrap_or(cfg.memory_bytes) / count as u64;
        let mut partitions = Vec::with_capacity(count);
        for _ in 0..count {
            let mut p = Partition::new(&PartitionConfig {
                mode: cfg.mode.into(),
                pool_bytes: per_partition,
                index_buckets: None,
                memory: fabrickv_engine::PoolOptions::default(),
            })
            .map_err(StartError::Engine)?;
            p.set_large_bytes_max(large_per_partition);
            partitions.push(p);
        }
        let parts = Arc::new(partitions::Partitions::with_workers(
            partitions,
            workers as u16,
        ));
        let ps = Arc::new(ps::PsStore::new(cfg.ps.clone(), workers));
        if let Err(why) = ps.check_budget() {
            // Said now rather than at the first CREATE, which would be
            // refused with POOL_UNAVAILABLE (a configured table fails the
            // start just below).
            tracing::warn!(
                "the embedding pool ({}) cannot be built: {why}; creating a PS table will be \
                 refused with POOL_UNAVAILABLE",
                fabrickv_types::size::format_size(cfg.ps.pool_bytes)
            );
        }
        ps.create_configured().map_err(StartError::Config)?;
        // One clock from here on: a restore turns saved expiry times into
        // this clock's, which the engine then serves by.
        let clock = service::Clock::new();
        let cache = cache::CacheShared::new(cfg.cache.store.clone()).map_err(StartError::Config)?;
        let checkpoints = Arc::new(
            checkpoint::Checkpoints::new(
                parts.clone(),
                ps.clone(),
                replication::UnixClock::new(clock),
                workers,
                cfg.checkpoint.dir.clone(),
                cfg.checkpoint.keep,
            )
            .with_cache(cache.store().clone(), cfg.checkpoint.cache),
        );
        restore_at_start(&checkpoints, &cfg.checkpoint)?;
        let copies =
            shard::copy_source::CopySources::new(fabrickv_wire::copy::data_host(&cfg.listen));
        let shards = Arc::new(shard::Shards::open(&cfg.shards, copies).map_err(StartError::Shard)?);
        // One count of failed authentications for every front end, so
        // that a guesser gains nothing by switching protocol.
        let throttle = fabrickv_auth::throttle::SharedThrottle::default();
        let listen = fabrickv_transport::ListenOptions {
            workers,
            secret: cfg.auth.clone(),
            shm_allow_uids: cfg.shm_allow_uids.clone(),
            throttle: Some(throttle.clone()),
        };
        let listening =
            fabrickv_transport::listen_with(&cfg.listen, &listen).map_err(StartError::Transport)?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut wakers = vec![listening.acceptor.waker()];
        let mut threads = Vec::with_capacity(workers + 1);
        let slot_routing = slot_routing::SlotRouting::new();
        // Armed only if the server joins a cluster keeping several copies.
        let gate = fabrickv_rpc::gate::FlushGate::new();
        // One account of what connections buffer for both text front ends.
        let client_memory = Arc::new(text_socket::ClientMemory::new(
            usize::try_from(cfg.maxmemory_clients()).unwrap_or(usize::MAX),
        ));
        let loops = text_socket::LoopEnv {
            clock,
            client_memory: client_memory.clone(),
            gate: gate.clone(),
            stop: stop.clone(),
            quiescence: slot_routing.quiescence().clone(),
        };
        // The RESP front-end binds before any thread starts, so a busy
        // port fails the start cleanly.
        let (resp_addr, mut resp_wakers, resp_threads) = match &cfg.resp {
            Some(addr) => {
                let shared = |port| {
                    Arc::new(
                        resp::RespShared::new(
                            parts.clone(),
                            cfg.resp_password.as_deref(),
                            cfg.mode,
                            cfg.memory_bytes,
                            port,
                        )
                        .with_secret(cfg.auth.clone())
                        .with_throttle(throttle.clone())
                        .with_shards(&shards)
                        .with_bind(addr)
                        .with_client_memory(client_memory.clone())
                        .with_large_reply_ms(cfg.resp_large_reply_ms)
                        .with_slot_routing(slot_routing.clone())
                        .with_checkpoints(checkpoints.clone()),
                    )
                };
                let idle = cfg.resp_idle_timeout();
                let fe = front_end::<RespConn>(addr, workers, shared, idle, &loops)
                    .map_err(|e| StartError::Resp(addr.clone(), e))?;
                (Some(fe.addr.to_string()), fe.wakers, fe.threads)
            }
            None => (None, Vec::new(), Vec::new()),
        };
        threads.extend(resp_threads);
        // The memcache front end, likewise before the workers; its wakers
        // join RESP's (both are mio wakers woken on stop).
        let (memcache_addr, memcache_peer_addr) = match &cfg.memcache {
            Some(addr) => {
                let shared = Arc::new(
                    memcache::McShared::new(parts.clone(), cfg.mode, cfg.memory_bytes, workers)
                        .with_client_memory(client_memory.clone())
                        .with_slot_routing(slot_routing.clone()),
                );
                let idle = cfg.memcache_idle_timeout();
                let fe =
                    match front_end::<McConnState>(addr, workers, |_| shared.clone(), idle, &loops)
                    {
                        Ok(fe) => fe,
                        Err(e) => {
                            stop_started(&stop, &wakers, &resp_wakers, threads);
                            return Err(StartError::Memcache(addr.clone(), e));
                        }
                    };
                resp_wakers.extend(fe.wakers);
                threads.extend(fe.threads);
                // Other servers' forwarded commands get loops of their
                // own, which never forward: a loop waiting on another
                // server's answer then never waits on a loop that waits
                // on it.
                let peer = if cfg.memcache_forwarding {
                    let at = std::net::SocketAddr::new(fe.addr.ip(), 0).to_string();
                    let started = front_end::<memcache_net::McPeerConn>(
                        &at,
                        workers,
                        |_| shared.clone(),
                        idle,
                        &loops,
                    );
                    match started {
                        Ok(p) => {
                            resp_wakers.extend(p.wakers);
                            threads.extend(p.threads);
                            Some(p.addr.to_string())
                        }
                        Err(e) => {
                            stop_started(&stop, &wakers, &resp_wakers, threads);
                            return Err(StartError::Memcache(at, e));
                        }
                    }
                } else {
                    None
                };
                (Some(fe.addr.to_string()), peer)
            }
            None => (None, None),
        };
        for (id, mut port) in listening.ports.into_iter().enumerate() {
            port.set_idle_timeout(cfg.idle_timeout());
            wakers.push(port.waker());
            let services = control::Services {
                kv: kv::KvService::new(id as u16, workers as u16, parts.clone(), cfg.mode)
                    .with_slot_routing(slot_routing.clone()),
                ps: ps::PsService::new(id as u16, ps.clone())
                    .with_slot_routing(slot_routing.clone()),
                cache: cache::CacheService::new(
                    id as u16,
                    cache.clone(),
                    Some(cache.add_worker(port.waker())),
                )
                .with_slot_routing(slot_routing.clone()),
                shard: shard::ShardService::new(id as u16, shards.clone()),
                checkpoints: checkpoints.clone(),
            };
            let worker = control::worker(id as u16, services)
                .map_err(|e| StartError::Config(format!("worker {id}: {e}")))?
                .with_gate(gate.clone())
                .with_quiescence(slot_routing.quiescence());
            let stop = stop.clone();
            let cpu = cfg.worker_cpu(id);
            let t = std::thread::Builder::new()
                .name(format!("fkv-worker-{id}"))
                .spawn(move || {
                    if let Some(c) = cpu {
                        // validate() checked the CPU is ours; a refusal
                        // now (CPU taken offline) leaves it unpinned.
                        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
                            tracing::warn!(worker = id, cpu = c, "cannot pin worker to its CPU");
                        }
                    }
                    fabrickv_rpc::worker::run(port, worker, clock, &stop)
                })
                .map_err(StartError::Thread)?;
            threads.push(t);
        }
        if let Some(secs) = cfg.checkpoint.every_secs {
            let t = checkpoints
                .start_periodic(std::time::Duration::from_secs(secs), stop.clone())
                .map_err(StartError::Thread)?;
            threads.push(t);
        }
        let mut acceptor = listening.acceptor;
        let s = stop.clone();
        let t = std::thread::Builder::new()
            .name("fkv-acceptor".into())
            .spawn(move || {
                if let Err(e) = acceptor.run(&s) {
                    tracing::error!("acceptor stopped: {e}");
                }
            })
            .map_err(StartError::Thread)?;
        threads.push(t);
        tracing::info!(
            addr = %listening.local_addr,
            workers,
            partitions = count,
            worker_cpus = ?cfg.worker_cpus,
            mode = ?cfg.mode,
            memory = %fabrickv_types::size::format_size(cfg.memory_bytes),
            "fabrickv serving"
        );
        if let Some(a) = &resp_addr {
            tracing::info!(addr = %a, "fabrickv serving RESP (Redis protocol)");
        }
        if let Some(a) = &memcache_addr {
            tracing::info!(addr = %a, "fabrickv serving memcache (memcached text protocol)");
        }
        let grpc = match start_grpc(
            cfg,
            &cache,
            clock,
            &listening.local_addr,
            &throttle,
            &slot_routing,
        ) {
            Ok(g) => g,
            Err(e) => {
                // The data plane is up already: stop it before failing.
                stop_started(&stop, &wakers, &resp_wakers, threads);
                return Err(e);
            }
        };
        Ok(ServerHandle {
            addr: listening.local_addr,
            workers,
            parts,
            ps,
            cache,
            checkpoints,
            resp_addr,
            memcache_addr,
            memcache_peer_addr,
            grpc,
            slot_routing,
            gate,
            clock,
            resp_wakers,
            stop,
            wakers,
            threads,
        })
    }
}

/// Loads `--restore`'s checkpoint (which must load), or else the newest
/// good one under `--checkpoint-dir` (if any), before the server listens.
fn restore_at_start(
    ck: &checkpoint::Checkpoints,
    cfg: &config::CheckpointSettings,
) -> Result<(), StartError> {
    let (from, required) = match (&cfg.restore, &cfg.dir) {
        (Some(r), _) => (r, true),
        (None, Some(d)) => (d, false),
        (None, None) => return Ok(()),
    };
    match ck.restore(from, required) {
        Ok(Some(s)) => {
            tracing::info!(
                dir = %s.dir.display(),
                records = s.manifest.records(),
                bytes = s.manifest.bytes(),
                ms = s.elapsed.as_millis() as u64,
                "checkpoint restored"
            );
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(StartError::Checkpoint(e.to_string())),
    }
}

/// Starts the KV cache's gRPC control plane when the configuration asks
/// for it. An address that cannot be bound, the default one included, is
/// a start-up error naming it: another process holding it would otherwise
/// answer this server's gRPC clients.
fn start_grpc(
    cfg: &ServerConfig,
    cache: &Arc<cache::CacheShared>,
    clock: service::Clock,
    data_plane: &str,
    throttle: &fabrickv_auth::throttle::SharedThrottle,
    routing: &Arc<slot_routing::SlotRouting>,
) -> Result<Option<fabrickv_control::ControlServer>, StartError> {
    let Some(addr) = &cfg.cache.grpc else {
        return Ok(None);
    };
    let sock: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| StartError::Config(format!("gRPC address {addr:?} is not HOST:PORT: {e}")))?;
    let data_plane = vec![data_plane.to_string()];
    match cache_grpc::start(
        sock,
        cache.clone(),
        clock,
        data_plane,
        cfg.auth.clone(),
        throttle.clone(),
        routing.clone(),
    ) {
        Ok(g) => Ok(Some(g)),
        Err(e) => Err(StartError::Grpc(addr.clone(), e.to_string())),
    }
}
