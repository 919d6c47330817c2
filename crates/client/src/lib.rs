//! The FabricKV Rust client.
//!
//! A [`Client`] opens one connection per server worker (learning the
//! worker and partition counts from a HELLO and the partition table from
//! a PARTITIONS request), hashes each key to its partition and sends it
//! to the worker the table names (client-side steering, as in MICA;
//! [`Client::refresh_table`] when a reply says the table moved on), packs operations into frames of up
//! to `BATCH_OPS_MAX`, posts every frame of a call before waiting for any
//! reply (pipelining: many frames in flight on each connection), and
//! matches replies to requests by id. Replies on one connection come back
//! in request order, which the client checks.
//!
//! Layout: this file has the public API and the errors; [`conn`] how
//! every client connects, over the request layer of `fabrickv-rpc`
//! (`Sessions`: request ids, requests in flight, credits, deadlines, the
//! one reply loop; `worker`: which worker a key or a client goes to),
//! which the kv, ps, cache and shard clients all stand on; [`batch`] the pipelined executor
//! every kv call goes through; [`Kv`] the key-value calls (`get`, `put`,
//! `mget`, ...) written once over `execute`, for [`Client`] and
//! [`ClusterClient`] alike; [`MgetBuf`] the caller's buffer that
//! `mget_into` decodes values into, with no allocation per key; [`ps`], [`cache`] and [`shard`] the other
//! services' clients; [`cluster`] the clients of a whole cluster.

mod batch;
pub mod cache;
pub mod cluster;
mod conn;
mod kv;
mod large;
mod mget;
pub mod ps;
pub mod shard;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_transport::{Endpoint, TransportError};
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::control::{
    decode_checkpoint_reply, decode_partitions_reply, decode_stats_reply,
    encode_checkpoint_request, encode_partitions_request, encode_stats_request, CheckpointRequest,
    PartitionMove, ServerInfo,
};

pub use batch::{BatchOp, Outcome};
pub use cache::{CacheClient, CacheClientOptions, Placed, CACHE_REGISTERED_BUFFERS_MAX};
pub use cluster::{
    ClusterCache, ClusterClient, ClusterOf, ClusterOptions, ClusterPlaced, ClusterPs, ClusterPull,
    ClusterTable, ClusterTableInfo, KvMemberOptions, PerServer,
};
pub use conn::{server_workers, CONN_REQUESTS_IN_FLIGHT_MAX};
pub use fabrickv_cluster::{Cluster, ServerDesc};
pub use fabrickv_wire::control::{CheckpointStatus, PartitionTable};
pub use fabrickv_wire::ps::{Missing, Optimizer, TableDesc, TableSpec};
pub use kv::Kv;
pub use mget::MgetBuf;
pub use ps::{PsClient, PullId, Pulled};
pub use shard::ShardClient;

/// How long a call waits for its replies unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest pause between two status reads while waiting for a checkpoint
/// save, in time: short beside a save of any size worth waiting for.
pub const CHECKPOINT_POLL_MAX: Duration = Duration::from_millis(50);

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
    /// Whether the server could not be reached or did not answer (rather
    /// than refused): a call to a replicated cluster may be sent again
    /// to the slot's next primary.
    pub fn is_transport(&self) -> bool {
        match self {
            ClientError::Transport(_) | ClientError::Timeout | ClientError::Unavailable(_) => true,
            ClientError::AtServer { error, .. } => error.is_transport(),
            _ => false,
        }
    }

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
            ClientError::Registry(
                fabrickv_cluster::RegistryError::Memcached { .. }
                | fabrickv_cluster::RegistryError::Etcd { .. },
            ) => ErrorCode::Unavailable,
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
            // The server's stable code, as every other refusal carries it.
            TransportError::Denied(code, message) => ClientError::Server { code, message },
            e => ClientError::Transport(e),
        }
    }
}

/// Result of a client call.
pub type Result<T> = std::result::Result<T, ClientError>;

/// A connection to a FabricKV server: one session per worker.
pub struct Client {
    info: ServerInfo,
    /// One session per worker, by worker: ids, frames in flight (each
    /// tagged with its operations' positions), credits, the reply loop.
    sessions: conn::Conn<batch::FrameTag>,
    /// The worker serving each partition, by partition: the server's
    /// partition table as last fetched.
    owners: Vec<u16>,
    /// The epoch of that table.
    epoch: u64,
    /// A reply carried the WRONG_WORKER hint since the table was fetched:
    /// the next call fetches it again first.
    table_stale: bool,
    /// Tables fetched since connecting (the first at connect).
    refreshes: u64,
    /// GETs (and their large values' pieces) may be answered by any
    /// replica of the key's slot ([`Client::set_replica_reads`]).
    replica_reads: bool,
    /// The epoch of the slot map a cluster client routes this server's
    /// requests by, stamped on every request frame
    /// ([`Client::set_map_epoch_source`]); none for a plain client.
    map_epoch: Option<Arc<AtomicU64>>,
}

impl Client {
    /// Connects to the server at `addr` with [`DEFAULT_TIMEOUT`].
    pub fn connect(addr: &str) -> Result<Client> {
        Client::connect_with_timeout(addr, DEFAULT_TIMEOUT)
    }

    /// Connects with a timeout for connecting and for each call.
    pub fn connect_with_timeout(addr: &str, timeout: Duration) -> Result<Client> {
        let conn::Connected { sessions, info, .. } =
            conn::connect(addr, timeout, conn::Workers::Every, 0)?;
        let info = info.ok_or_else(|| ClientError::Protocol("no HELLO reply".into()))?;
        let mut c = Client {
            info,
            sessions,
            owners: Vec::new(),
            epoch: 0,
            table_stale: false,
            refreshes: 0,
            replica_reads: false,
            map_epoch: None,
        };
        match c.refresh_table() {
            Ok(_) => {}
            // A server from before partition tables places partition p on
            // worker p % workers and never moves it: steer by that, so a
            // new client keeps working across a rolling upgrade.
            Err(ClientError::Server {
                code: ErrorCode::UnknownOpcode,
                ..
            }) => {
                let workers = u32::from(c.info.workers);
                c.owners = (0..c.info.partitions)
                    .map(|p| fabrickv_types::hash::worker_of_partition(p, workers) as u16)
                    .collect();
            }
            Err(e) => return Err(e),
        }
        Ok(c)
    }

    /// Asks worker 0 for the partition table (and, with `mv`, to move a
    /// partition first), and steers by it from now on.
    fn call_partitions(&mut self, mv: Option<PartitionMove>) -> Result<PartitionTable> {
        let t = conn::call_control(
            &mut self.sessions,
            0,
            batch::FrameTag::default(),
            |b, id, w| encode_partitions_request(b, id, w, mv),
            |f| decode_partitions_reply(f).map_err(conn::protocol),
        )?;
        if t.owners.len() != self.info.partitions as usize
            || t.workers != self.info.workers
            || t.owners
                .iter()
                .any(|&w| usize::from(w) >= self.sessions.len())
        {
            return Err(ClientError::Protocol(
                "the partition table does not match the server's shape".into(),
            ));
        }
        self.owners.clone_from(&t.owners);
        self.epoch = t.epoch;
        self.table_stale = false;
        self.refreshes += 1;
        Ok(t)
    }

    /// Fetches the partition table again (what a call does by itself
    /// after a reply said the table moved on); returns its epoch. Every
    /// frame of earlier calls must have been answered.
    pub fn refresh_table(&mut self) -> Result<u64> {
        self.call_partitions(None)?;
        Ok(self.epoch)
    }

    /// The server's partition table now, with each partition's counters
    /// (ops and misrouted); the client steers by it from now on.
    pub fn partition_table(&mut self) -> Result<PartitionTable> {
        self.call_partitions(None)
    }

    /// Moves `partition` to `worker` on the server (an administrative
    /// call: the connection proved the server's secret), and steers by
    /// the new table. Other clients learn of it from their next reply
    /// from the old owner.
    pub fn move_partition(&mut self, partition: u32, worker: u16) -> Result<PartitionTable> {
        self.call_partitions(Some(PartitionMove { partition, worker }))
    }

    /// The server's checkpoint status: saves finished, the last good
    /// one's directory and time, whether one runs, the last failure.
    pub fn checkpoint_status(&mut self) -> Result<CheckpointStatus> {
        self.call_checkpoint(CheckpointRequest::Status)
    }

    /// Saves a checkpoint of the server's memory (its keys, embedding
    /// tables and, if the server was started so, its KV cache) into `to`
    /// under the server's checkpoint directory (`None` or "": the
    /// directory itself), and waits up to `wait` for it to finish. The
    /// server keeps serving while it saves; the save itself runs on the
    /// server whatever this call's wait, and a save already running is
    /// refused `SAVE_IN_PROGRESS`. Returns the status after the save,
    /// whose `dir` is the checkpoint written.
    pub fn checkpoint_save(
        &mut self,
        to: Option<&str>,
        wait: Duration,
    ) -> Result<CheckpointStatus> {
        let started =
            self.call_checkpoint(CheckpointRequest::Save(to.unwrap_or("").to_string()))?;
        // The reply is read after the save was claimed: it has finished
        // once `finished` moves past the count before it.
        let before = started.finished.saturating_sub(u64::from(!started.saving));
        let deadline = Instant::now() + wait;
        let mut pause = Duration::from_millis(1);
        loop {
            let st = self.call_checkpoint(CheckpointRequest::Status)?;
            if st.finished > before {
                return match &st.error {
                    Some(why) => Err(ClientError::Server {
                        code: ErrorCode::StorageFailed,
                        message: format!("checkpoint save failed: {why}"),
                    }),
                    None => Ok(st),
                };
            }
            if Instant::now() >= deadline {
                return Err(ClientError::Timeout);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(CHECKPOINT_POLL_MAX);
        }
    }

    fn call_checkpoint(&mut self, req: CheckpointRequest) -> Result<CheckpointStatus> {
        conn::call_control(
            &mut self.sessions,
            0,
            batch::FrameTag::default(),
            |b, id, w| encode_checkpoint_request(b, id, w, &req),
            |f| decode_checkpoint_reply(f).map_err(conn::protocol),
        )
    }

    /// The epoch of the table this client steers by.
    pub fn table_epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether a reply said the table moved on since it was fetched.
    pub fn table_is_stale(&self) -> bool {
        self.table_stale
    }

    /// How many times the table was fetched (once at connect).
    pub fn table_refreshes(&self) -> u64 {
        self.refreshes
    }

    /// Lets this client's GETs be answered by a backup of the key's slot
    /// in a cluster keeping several copies: a read that accepts
    /// staleness (what a failover could take back, or a write not yet
    /// applied there). A server that is no replica of the slot still
    /// answers WRONG_SERVER.
    pub fn set_replica_reads(&mut self, on: bool) {
        self.replica_reads = on;
    }

    /// Stamps every request frame from now on with the slot map epoch in
    /// `epoch`, which a cluster client keeps at the epoch of the map it
    /// routes by. A server then runs no write of the frame to a group
    /// whose primary took it over at a later epoch: a request the client
    /// gave up on, held up in the network across a failover and back,
    /// cannot land over writes made since (the client's kernel may still
    /// deliver it after the connection is gone).
    pub fn set_map_epoch_source(&mut self, epoch: Arc<AtomicU64>) {
        self.map_epoch = Some(epoch);
    }

    /// The map epoch to stamp on a request frame now (0: none).
    #[inline]
    pub(crate) fn map_epoch(&self) -> u64 {
        self.map_epoch
            .as_ref()
            .map_or(0, |e| e.load(Ordering::Acquire))
    }

    /// The partition that owns `key`.
    #[inline]
    pub fn partition_of(&self, key: &[u8]) -> u32 {
        KeyHash::of(key).partition(self.info.partitions)
    }

    /// The server's shape and limits.
    pub fn info(&self) -> ServerInfo {
        self.info
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.sessions.timeout()
    }

    /// The worker that serves `key`'s partition, by the table.
    #[inline]
    pub fn worker_of(&self, key: &[u8]) -> u16 {
        self.worker_of_hash(KeyHash::of(key))
    }

    /// The worker that owns a key whose hash is known, by the table.
    #[inline]
    pub fn worker_of_hash(&self, hash: KeyHash) -> u16 {
        self.owners[hash.partition(self.info.partitions) as usize]
    }

    /// A fresh request id.
    #[inline]
    pub fn next_request_id(&mut self) -> u64 {
        self.sessions.next_request_id()
    }

    /// The raw endpoint bound to `worker`, for load generators that build
    /// their own frames. Replies must be drained before using other calls.
    pub fn endpoint(&mut self, worker: u16) -> &mut dyn Endpoint {
        self.sessions.session(usize::from(worker)).endpoint()
    }

    /// Runs any mix of operations, pipelined; one outcome per operation,
    /// in order. Per-operation errors are outcomes, not `Err`.
    pub fn execute(&mut self, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>> {
        batch::execute(self, ops)
    }

    /// Counters of every worker.
    pub fn stats_per_worker(&mut self) -> Result<Vec<Vec<(String, u64)>>> {
        let mut out = Vec::with_capacity(self.sessions.len());
        for w in 0..self.sessions.len() {
            out.push(conn::call_control(
                &mut self.sessions,
                w,
                batch::FrameTag::default(),
                encode_stats_request,
                |f| decode_stats_reply(f).map_err(conn::protocol),
            )?);
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
