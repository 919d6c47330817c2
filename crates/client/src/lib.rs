//! The FabricKV Rust client.
//!
//! A [`Client`] opens one connection per server worker (learning the
//! worker count from a HELLO), hashes each key to the worker that owns it
//! (client-side steering, as in MICA), packs operations into frames of up
//! to `BATCH_OPS_MAX`, posts every frame of a call before waiting for any
//! reply (pipelining: many frames in flight on each connection), and
//! matches replies to requests by id. Replies on one connection come back
//! in request order, which the client checks.
//!
//! Layout: this file has the public API; [`batch`] the pipelined executor
//! every call goes through; [`Kv`] the key-value calls (`get`, `put`,
//! `mget`, ...) written once over `execute`, for [`Client`] and
//! [`ClusterClient`] alike.

mod batch;
pub mod cache;
pub mod cluster;
mod kv;
pub mod ps;
pub mod shard;

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use fabrickv_transport::{Endpoint, TransportError};
use fabrickv_types::hash::worker_of_partition;
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::control::{
    decode_error, decode_hello_reply, decode_stats_reply, encode_hello, encode_stats_request,
    ServerInfo,
};
use fabrickv_wire::{decode_frame, FrameKind};

pub use batch::{BatchOp, Outcome};
pub use cache::{CacheClient, CacheClientOptions, Placed};
pub use cluster::{
    ClusterCache, ClusterClient, ClusterOptions, ClusterPlaced, ClusterPs, ClusterPull,
    ClusterTable, ClusterTableInfo,
};
pub use fabrickv_cluster::{Cluster, ServerDesc};
pub use fabrickv_wire::ps::{Missing, Optimizer, TableDesc, TableSpec};
pub use kv::Kv;
pub use ps::{PsClient, PullId, Pulled};
pub use shard::ShardClient;

/// How long a call waits for its replies unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a call failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientError {
    /// The connection failed or was refused.
    Transport(TransportError),
    /// The server refused the request or an operation with a stable code.
    Server {
        /// The stable code.
        code: ErrorCode,
        /// The server's words, if it sent any.
        message: String,
    },
    /// The request was not sent because it breaks a bound.
    Invalid(ErrorCode, String),
    /// The server's reply did not follow the protocol.
    Protocol(String),
    /// No reply came within the timeout.
    Timeout,
    /// The server cannot be reached at all (a cluster map has no
    /// descriptor or no address for it).
    Unavailable(String),
    /// A cluster client's call failed at one server (down, unreachable,
    /// timed out, or refusing): which one, and why.
    AtServer {
        /// The server's id in the cluster.
        id: u32,
        /// The address the client uses for it (or why it has none).
        addr: String,
        /// What went wrong there.
        error: Box<ClientError>,
    },
    /// The cluster registry could not be read.
    Registry(fabrickv_cluster::RegistryError),
}

impl ClientError {
    /// The stable code behind this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Transport(TransportError::Timeout) | ClientError::Timeout => {
                ErrorCode::Timeout
            }
            ClientError::Transport(_) => ErrorCode::Unavailable,
            ClientError::Server { code, .. } | ClientError::Invalid(code, _) => *code,
            ClientError::Protocol(_) => ErrorCode::Malformed,
            ClientError::Unavailable(_) => ErrorCode::Unavailable,
            ClientError::AtServer { error, .. } => error.code(),
            ClientError::Registry(fabrickv_cluster::RegistryError::Timeout(_)) => {
                ErrorCode::Timeout
            }
            ClientError::Registry(fabrickv_cluster::RegistryError::Memcached { .. }) => {
                ErrorCode::Unavailable
            }
            ClientError::Registry(_) => ErrorCode::Malformed,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Transport(e) => write!(f, "transport: {e}"),
            ClientError::Server { code, message } if message.is_empty() => {
                write!(f, "server: {code}")
            }
            ClientError::Server { code, message } => write!(f, "server: {code}: {message}"),
            ClientError::Invalid(code, why) => write!(f, "invalid request: {code}: {why}"),
            ClientError::Protocol(why) => write!(f, "protocol violation by server: {why}"),
            ClientError::Timeout => write!(f, "timed out waiting for the server"),
            ClientError::Unavailable(why) => write!(f, "unavailable: {why}"),
            ClientError::AtServer { id, addr, error } => write!(f, "server {id} ({addr}): {error}"),
            ClientError::Registry(e) => write!(f, "cluster registry: {e}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<TransportError> for ClientError {
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::Timeout => ClientError::Timeout,
            e => ClientError::Transport(e),
        }
    }
}

/// Result of a client call.
pub type Result<T> = std::result::Result<T, ClientError>;

/// A connection to a FabricKV server: one endpoint per worker.
pub struct Client {
    info: ServerInfo,
    endpoints: Vec<Box<dyn Endpoint>>,
    timeout: Duration,
    next_id: u64,
}

impl Client {
    /// Connects to the server at `addr` with [`DEFAULT_TIMEOUT`].
    pub fn connect(addr: &str) -> Result<Client> {
        Client::connect_with_timeout(addr, DEFAULT_TIMEOUT)
    }

    /// Connects with a timeout for connecting and for each call.
    pub fn connect_with_timeout(addr: &str, timeout: Duration) -> Result<Client> {
        let (first, info) = connect_hello(addr, timeout)?;
        let mut endpoints = vec![first];
        for w in 1..info.workers {
            endpoints.push(fabrickv_transport::connect(addr, w, timeout)?);
        }
        Ok(Client {
            info,
            endpoints,
            timeout,
            next_id: 1,
        })
    }

    /// The server's shape and limits.
    pub fn info(&self) -> ServerInfo {
        self.info
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The worker that owns `key`.
    #[inline]
    pub fn worker_of(&self, key: &[u8]) -> u16 {
        self.worker_of_hash(KeyHash::of(key))
    }

    /// The worker that owns a key whose hash is known.
    #[inline]
    pub fn worker_of_hash(&self, hash: KeyHash) -> u16 {
        worker_of_partition(
            hash.partition(self.info.partitions),
            u32::from(self.info.workers),
        ) as u16
    }

    /// A fresh request id.
    #[inline]
    pub fn next_request_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// The raw endpoint bound to `worker`, for load generators that build
    /// their own frames. Replies must be drained before using other calls.
    pub fn endpoint(&mut self, worker: u16) -> &mut dyn Endpoint {
        &mut *self.endpoints[usize::from(worker)]
    }

    /// Runs any mix of operations, pipelined; one outcome per operation,
    /// in order. Per-operation errors are outcomes, not `Err`.
    pub fn execute(&mut self, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>> {
        batch::execute(self, ops)
    }

    /// Counters of every worker.
    pub fn stats_per_worker(&mut self) -> Result<Vec<Vec<(String, u64)>>> {
        let timeout = self.timeout;
        let mut out = Vec::with_capacity(self.endpoints.len());
        for w in 0..self.endpoints.len() {
            let id = self.next_request_id();
            let ep = &mut *self.endpoints[w];
            ep.post_with(&mut |b| encode_stats_request(b, id, w as u16))?;
            ep.flush(timeout)?;
            out.push(recv_control(ep, timeout, |f| {
                decode_stats_reply(f).map_err(|e| ClientError::Protocol(e.to_string()))
            })?);
        }
        Ok(out)
    }

    /// Counters summed over every worker.
    pub fn stats(&mut self) -> Result<BTreeMap<String, u64>> {
        let mut sum = BTreeMap::new();
        for w in self.stats_per_worker()? {
            for (k, v) in w {
                *sum.entry(k).or_insert(0) += v;
            }
        }
        sum.insert("workers".into(), u64::from(self.info.workers));
        Ok(sum)
    }
}

/// Asks the worker at the other end of `ep` for the server's shape and
/// limits (HELLO).
fn hello(ep: &mut dyn Endpoint, timeout: Duration) -> Result<ServerInfo> {
    ep.post_with(&mut |b| encode_hello(b, 0, 0))?;
    ep.flush(timeout)?;
    recv_control(ep, timeout, |frame| {
        decode_hello_reply(frame).map_err(|e| ClientError::Protocol(e.to_string()))
    })
}

/// Connects to worker 0 of `addr` and asks the server's shape (HELLO).
fn connect_hello(addr: &str, timeout: Duration) -> Result<(Box<dyn Endpoint>, ServerInfo)> {
    let mut ep = fabrickv_transport::connect(addr, 0, timeout)?;
    let info = hello(&mut *ep, timeout)?;
    Ok((ep, info))
}

/// Connects to the worker whose turn `turns` gives: the server's worker
/// count is asked of worker 0, whose connection is kept when the turn is
/// its own. Clients of one kind in one process so spread round robin.
fn connect_in_turn(
    addr: &str,
    timeout: Duration,
    turns: &std::sync::atomic::AtomicUsize,
) -> Result<(Box<dyn Endpoint>, u16)> {
    let (first, info) = connect_hello(addr, timeout)?;
    let turn = turns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let worker = (turn % usize::from(info.workers.max(1))) as u16;
    if worker == 0 {
        return Ok((first, 0));
    }
    Ok((fabrickv_transport::connect(addr, worker, timeout)?, worker))
}

/// How many workers the server at `addr` runs (asked of worker 0): what a
/// caller placing its threads with `connect_worker` (`PsClient`,
/// `CacheClient`) divides by.
pub fn server_workers(addr: &str, timeout: Duration) -> Result<u16> {
    Ok(connect_hello(addr, timeout)?.1.workers)
}

/// Waits for one control reply on `ep` and decodes it with `f`.
fn recv_control<T>(
    ep: &mut dyn Endpoint,
    timeout: Duration,
    mut f: impl FnMut(&fabrickv_wire::Frame<'_>) -> Result<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut got: Option<Result<T>> = None;
        ep.poll(1, &mut |msg| {
            got = Some(match decode_frame(msg) {
                Ok(frame) if frame.header.kind == FrameKind::Error => {
                    Err(match decode_error(&frame) {
                        Ok((code, message)) => ClientError::Server { code, message },
                        Err(e) => ClientError::Protocol(e.to_string()),
                    })
                }
                Ok(frame) => f(&frame),
                Err(e) => Err(ClientError::Protocol(e.to_string())),
            });
        })?;
        if let Some(r) = got {
            return r;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClientError::Timeout);
        }
        ep.wait(left)?;
    }
}
