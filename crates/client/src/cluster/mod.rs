//! Clients of a whole cluster: kv ([`ClusterClient`]), embedding tables
//! ([`ClusterPs`]) and the KV cache ([`ClusterCache`]).
//!
//! Keys are sharded across the servers by jump consistent hash
//! ([`fabrickv_cluster::server_of_key`], [`fabrickv_cluster::server_of_u64`]),
//! so that every client computes the same owner with no directory to ask;
//! a kv client of a cluster registered in etcd routes by its slot map
//! instead (`slots`), and sends again what a server answers WRONG_SERVER
//! after reading the map again.
//! A cluster client holds one single-server client per server and splits
//! each call by owner. Batches are split, every part is *posted* to its
//! server before any reply is awaited (so the servers work on their parts
//! at the same time and a call costs about the slowest server's round
//! trip, not the sum), and the results are merged into the caller's order.
//!
//! A server is *down* when the map has no descriptor for it, when
//! connecting to it fails, or when a call on it fails for any reason but a
//! refusal by the server. A down server's connection is dropped (it may
//! hold stray replies), and a call needing it tries to connect again,
//! bounded by the timeout, so a restarted server is picked up by the next
//! call that needs it. A call touching a down server fails with
//! [`ClientError::AtServer`], which names the server's id and address;
//! calls whose keys all live on other servers go on working.

mod cache;
pub(crate) mod members;
mod ps;
mod slots;

use std::collections::BTreeMap;
use std::time::Duration;

use fabrickv_cluster::etcd::{is_etcd_url, EtcdRegistry};
use fabrickv_cluster::{server_of_hash, Cluster, Directory, Registry};
use fabrickv_types::{ErrorCode, KeyHash};

use crate::batch::{self, BatchOp, Outcome, Sink as _};
use crate::{Client, ClientError, Result, DEFAULT_TIMEOUT};

pub use cache::{ClusterCache, ClusterPlaced};
use members::{cluster_of, is_refusal, Members};
pub use members::{ClusterOf, KvMemberOptions, PerServer};
pub use ps::{ClusterPs, ClusterPull, ClusterTable, ClusterTableInfo};
use slots::SlotFollow;
pub use slots::WRONG_SERVER_ROUNDS_MAX;

/// Most servers a cluster client connects to at once when it starts (one
/// thread each), in threads; a larger cluster connects in waves of this
/// many, so unreachable servers cost one timeout per wave.
pub const CONNECT_THREADS_MAX: usize = 64;

/// How a cluster client is set up.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The transport to use (`tcp`, `shm`, `inproc`, `fabric`): each
    /// server is reached at its first address of that scheme. `None` takes
    /// each server's first address.
    pub transport: Option<String>,
    /// Timeout of connecting to a server and of each call. A call touching
    /// a down server fails within it.
    pub timeout: Duration,
    /// In a cluster keeping several copies of each slot (etcd, `--replicas`
    /// 2 or 3), lets GETs go to any in-sync replica of the key's slot, not
    /// only its primary: reads that accept staleness spread over every
    /// copy. Each key is read from one replica per client, so the pieces
    /// of a large value come from where its GET went. Writes always go to
    /// the primary.
    pub read_from_replica: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            transport: None,
            timeout: DEFAULT_TIMEOUT,
            read_from_replica: false,
        }
    }
}

/// Reads the cluster `name` from the registry at `registry_url`
/// (`memcached://HOST:PORT`), waiting up to `wait` for every server to
/// register; servers still missing then are down slots. Returns the
/// registry too, for a client to `follow`.
pub fn lookup(registry_url: &str, name: &str, wait: Duration) -> Result<(Cluster, Registry)> {
    let reg = Registry::connect(registry_url, name).map_err(ClientError::Registry)?;
    let cluster = reg.lookup(wait, true).map_err(ClientError::Registry)?;
    Ok((cluster, reg))
}

/// Most time between two reads of an etcd cluster that has no slot map
/// yet, while a client waits for its first server, in milliseconds.
const MAP_POLL_MS: u64 = 20;

/// Reads the cluster `name` and its slot map from etcd at `url`, waiting
/// up to `wait` for the map (written by the first server to start); the
/// servers not registered then are down.
pub fn lookup_etcd(
    url: &str,
    name: &str,
    wait: Duration,
) -> Result<(Cluster, fabrickv_cluster::slots::SlotMap, EtcdRegistry)> {
    let reg = EtcdRegistry::connect(url, name).map_err(ClientError::Registry)?;
    let deadline = std::time::Instant::now() + wait;
    loop {
        let view = reg.view().map_err(ClientError::Registry)?;
        if let Some((map, _)) = view.map.clone() {
            let servers = (0..map.size).map(|i| view.server(i).cloned()).collect();
            let cluster = Cluster {
                name: name.to_string(),
                servers,
            };
            return Ok((cluster, map, reg));
        }
        if std::time::Instant::now() >= deadline {
            return Err(ClientError::Unavailable(format!(
                "cluster {name} has no slot map in {url}: no server has started"
            )));
        }
        std::thread::sleep(Duration::from_millis(MAP_POLL_MS));
    }
}

/// A kv client of a whole cluster: one [`Client`] per server, every batch
/// split by owner, posted to all owners, then collected and merged in
/// request order.
pub struct ClusterClient {
    m: Members<Client>,
    /// The slot map, for a cluster registered in etcd; jump hashing
    /// otherwise.
    slots: Option<Box<SlotFollow>>,
}

impl std::fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClient")
            .field("cluster", &self.m.cluster)
            .field("servers", &self.m.size())
            .field(
                "up",
                &(0..self.m.servers.len())
                    .filter(|&s| self.m.is_up(s))
                    .count(),
            )
            .finish()
    }
}

impl From<Members<Client>> for ClusterClient {
    fn from(m: Members<Client>) -> Self {
        ClusterClient { m, slots: None }
    }
}

/// A sink that keeps the operations a server answered WRONG_SERVER apart
/// (to be sent again after the map is read again) and passes every other
/// result on.
struct Rerouted<'a, S: batch::Sink> {
    inner: &'a mut S,
    moved: Vec<usize>,
    /// The epoch of the map the batch was routed by, and whether a
    /// server refused under an older one (its watch is behind: the
    /// refusal is no reason to wait for a newer map).
    epoch: u64,
    behind: bool,
    /// Which operations got a result, by position, when the batch may be
    /// sent again after a failover (empty otherwise).
    landed: Vec<bool>,
}

impl<S: batch::Sink> batch::Sink for Rerouted<'_, S> {
    #[inline]
    fn land(&mut self, pos: usize, code: ErrorCode, value: &[u8]) -> Result<()> {
        if code == ErrorCode::WrongServer {
            if let Ok(b) = <[u8; 8]>::try_from(value) {
                self.behind |= u64::from_le_bytes(b) < self.epoch;
            }
            self.moved.push(pos);
            return Ok(());
        }
        if let Some(l) = self.landed.get_mut(pos) {
            *l = true;
        }
        self.inner.land(pos, code, value)
    }

    fn reply_full(&mut self, again: &mut Vec<usize>) {
        self.inner.reply_full(again)
    }
}

cluster_of!(ClusterClient, Client);

impl ClusterClient {
    /// Connects to every registered server of `cluster`. Servers that
    /// cannot be reached now are down (calls needing them try again);
    /// fails only if none can be reached.
    pub fn connect(cluster: &Cluster, opts: ClusterOptions) -> Result<ClusterClient> {
        let member = KvMemberOptions::new(opts.read_from_replica);
        ClusterClient::connect_cluster(cluster, &opts, member)
    }

    /// Looks the cluster `name` up in the registry at `registry_url`
    /// (`memcached://HOST:PORT`, waiting up to the timeout for every
    /// server to register; or `etcd://HOST:PORT[,...]`, waiting for the
    /// slot map, whose changes the client then follows) and connects to
    /// it.
    pub fn join(registry_url: &str, name: &str, opts: ClusterOptions) -> Result<ClusterClient> {
        if is_etcd_url(registry_url) {
            let (cluster, map, reg) = lookup_etcd(registry_url, name, opts.timeout)?;
            return Ok(ClusterClient::connect(&cluster, opts)?.follow_slots(reg, map));
        }
        let (cluster, reg) = lookup(registry_url, name, opts.timeout)?;
        Ok(ClusterClient::connect(&cluster, opts)?.follow(reg))
    }

    /// Keeps `registry` (the one the map was read from): a down server's
    /// descriptor is read there again before each reconnect, so a server
    /// that comes back at another address is found.
    pub fn follow(self, registry: Registry) -> ClusterClient {
        self.following(Some(registry.into()))
    }

    /// Routes by the slot map `map` of the etcd cluster at `registry`, and
    /// follows both its changes and its servers' descriptors there.
    pub fn follow_slots(
        self,
        registry: EtcdRegistry,
        map: fabrickv_cluster::slots::SlotMap,
    ) -> ClusterClient {
        let mut c = self.following(Some(Directory::Etcd(Box::new(registry.clone()))));
        c.slots = Some(Box::new(SlotFollow::start(registry, map)));
        c.stamp_map_epoch();
        c
    }

    /// Takes what the etcd watch delivered since the last call: the map,
    /// and servers' new addresses.
    #[inline]
    fn follow_map(&mut self) {
        slots::follow_map(&mut self.slots, &mut self.m);
        self.stamp_map_epoch();
    }

    /// Has every server's client stamp its requests with the epoch of the
    /// map this client routes by from now on (one store).
    #[inline]
    fn stamp_map_epoch(&self) {
        if let Some(s) = &self.slots {
            self.m
                .options()
                .map_epoch
                .store(s.epoch(), std::sync::atomic::Ordering::Release);
        }
    }

    /// The epoch of the slot map the client routes by, for a cluster
    /// registered in etcd.
    pub fn slot_map_epoch(&self) -> Option<u64> {
        self.slots.as_ref().map(|s| s.epoch())
    }

    /// The number of servers, up or down.
    pub fn size(&self) -> u32 {
        self.servers()
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        self.cluster_name()
    }

    /// The server that owns `key` (as far as the client knows: a cluster
    /// registered in etcd may have moved it since).
    #[inline]
    pub fn server_of(&self, key: &[u8]) -> u32 {
        self.server_for(key, KeyHash::of(key))
    }

    /// The server that owns the embedding-table rows of `key`: its slot's
    /// primary ([`fabrickv_cluster::slots::slot_of_u64`]) in a cluster
    /// with a slot map, its jump-hash bucket otherwise (as
    /// [`ClusterPs::server_of`] routes them).
    pub fn server_of_u64(&self, key: u64) -> u32 {
        match &self.slots {
            Some(s) => s.primary_of_slot(fabrickv_cluster::slots::slot_of_u64(key)),
            None => fabrickv_cluster::server_of_u64(key, self.m.size()),
        }
    }

    /// The server for `key`, whose hash is `hash`: its slot's primary in
    /// the slot map, or its jump-hash bucket.
    #[inline]
    fn server_for(&self, key: &[u8], hash: KeyHash) -> u32 {
        match &self.slots {
            Some(s) => s.server_of(key),
            None => server_of_hash(hash.0, self.m.size()),
        }
    }

    /// The server for `op` (its key's hash `hash`): a read goes to one of
    /// the slot's copies with [`ClusterOptions::read_from_replica`], any
    /// other operation to the server for its key.
    #[inline]
    fn server_for_op(&self, op: &BatchOp<'_>, hash: KeyHash) -> u32 {
        match &self.slots {
            Some(s)
                if self.m.options().replica_reads
                    && matches!(op, BatchOp::Get { .. } | BatchOp::GetChunk { .. }) =>
            {
                s.reader_of(op.key(), hash.0)
            }
            _ => self.server_for(op.key(), hash),
        }
    }

    /// Whether server `id` is connected now (a down one is tried again by
    /// the next call that needs it).
    pub fn is_up(&self, id: u32) -> bool {
        self.server_up(id)
    }

    /// The address the client uses for server `id`, if it has one.
    pub fn addr(&self, id: u32) -> Option<&str> {
        self.server_addr(id)
    }

    /// The connection to server `id` (connecting if it is down), for calls
    /// that address one server.
    pub fn server(&mut self, id: u32) -> Result<&mut Client> {
        self.server_client(id)
    }

    /// Runs any mix of operations across the cluster; one outcome per
    /// operation, in order. Per-operation errors are outcomes, not `Err`.
    /// Every server the batch touches is connected before any part is
    /// sent, so a batch needing a down server fails before it changes
    /// anything; a server failing mid-batch fails it (the parts already
    /// applied elsewhere stay applied).
    pub fn execute(&mut self, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>> {
        let mut out = batch::Outcomes::new(ops.len());
        self.run(ops, &mut out, &mut Vec::new())?;
        out.finish()
    }

    /// Runs `f` on the connected client of the server holding `key`: the
    /// pieces of a large value all go to it (`crate::large`). A failure
    /// other than the server's refusal drops its connection, as in `run`.
    pub(crate) fn with_server_of<R>(
        &mut self,
        key: &[u8],
        f: impl FnOnce(&mut Client) -> Result<R>,
    ) -> Result<R> {
        self.follow_map();
        let s = self.server_of(key);
        self.on_server(s, f)
    }

    /// Runs `f` on server `s`'s connected client; a failure other than
    /// the server's refusal drops the connection.
    fn on_server<R>(&mut self, s: u32, f: impl FnOnce(&mut Client) -> Result<R>) -> Result<R> {
        let s = s as usize;
        let c = self.m.ensure(s)?;
        f(c).map_err(|e| self.m.fail_or_wrap(s, e))
    }

    /// [`ClusterClient::with_server_of`] for reading a large value's
    /// pieces: at the copy its GET went to.
    pub(crate) fn with_reader_of<R>(
        &mut self,
        key: &[u8],
        f: impl FnOnce(&mut Client) -> Result<R>,
    ) -> Result<R> {
        self.follow_map();
        let s = self.server_for_op(&BatchOp::Get { key }, KeyHash::of(key));
        self.on_server(s, f)
    }

    /// [`ClusterClient::execute`], landing every result in `sink`
    /// (`again`: scratch for the operations sent again). Allocates per
    /// server and per frame, never per operation.
    pub(crate) fn run<S: batch::Sink>(
        &mut self,
        ops: &[BatchOp<'_>],
        sink: &mut S,
        again: &mut Vec<usize>,
    ) -> Result<()> {
        batch::validate(ops)?;
        self.follow_map();
        let n = self.m.size();
        if n == 1 {
            // One server: the plain client's path, with no split.
            let c = self.m.ensure(0)?;
            batch::refresh_if_stale(c, ops);
            return batch::run_valid(c, ops, sink, again).map_err(|e| self.m.fail(0, e));
        }
        // Each key is hashed once: the hash picks the server here (unless
        // the slot map does) and the worker inside it.
        let hashes: Vec<KeyHash> = ops.iter().map(|o| KeyHash::of(o.key())).collect();
        let owners: Vec<u32> = ops
            .iter()
            .zip(&hashes)
            .map(|(o, h)| self.server_for_op(o, *h))
            .collect();
        let mut counts = vec![0usize; n as usize];
        for &s in &owners {
            counts[s as usize] += 1;
        }
        let mut parts: Vec<Vec<usize>> = counts.iter().map(|&k| Vec::with_capacity(k)).collect();
        for (i, &s) in owners.iter().enumerate() {
            parts[s as usize].push(i);
        }
        let mut rerouted = 0;
        // In a replicated cluster a batch survives a server's failure: the
        // operations that got no result are sent again to their slots'
        // new primaries once the map names them (an operation applied
        // before the failure and again after leaves what applying it once
        // would: kv operations overwrite).
        let failover_deadline =
            std::time::Instant::now() + Duration::from_millis(slots::FAILOVER_WAIT_MS);
        let follows = self.slots.is_some();
        loop {
            let mut sink = Rerouted {
                inner: &mut *sink,
                moved: Vec::new(),
                epoch: self.slots.as_ref().map_or(0, |f| f.epoch()),
                behind: false,
                landed: if follows {
                    vec![false; ops.len()]
                } else {
                    Vec::new()
                },
            };
            if let Err(e) = self.round(ops, &parts, &hashes, &mut sink) {
                let epoch = self.slots.as_ref().map(|f| f.epoch());
                let retry = match (&mut self.slots, epoch) {
                    (Some(f), Some(epoch)) if e.is_transport() => {
                        f.wait_newer(epoch, failover_deadline)
                    }
                    _ => false,
                };
                if !retry {
                    return Err(e);
                }
                let landed = sink.landed;
                let unlanded: Vec<usize> = parts
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|&i| !landed[i])
                    .collect();
                self.follow_map();
                parts.iter_mut().for_each(Vec::clear);
                parts.resize_with(self.m.size() as usize, Vec::new);
                for i in unlanded {
                    parts[self.server_for_op(&ops[i], hashes[i]) as usize].push(i);
                }
                continue;
            }
            // GETs that did not fit their reply frame go again, and so do
            // operations a server said are another's, once the map is
            // read again (a bounded number of times).
            sink.reply_full(again);
            let moved = sink.moved;
            let behind = sink.behind;
            if !moved.is_empty() {
                let reloaded = match &mut self.slots {
                    Some(_) if behind && std::time::Instant::now() < failover_deadline => {
                        // A server refused under an older map than this
                        // client's: its watch delivers the newer one in
                        // a moment.
                        std::thread::sleep(Duration::from_millis(slots::BEHIND_PAUSE_MS));
                        true
                    }
                    Some(f)
                        if rerouted < WRONG_SERVER_ROUNDS_MAX
                            && std::time::Instant::now() < failover_deadline =>
                    {
                        let epoch = f.epoch();
                        f.reload()?;
                        // The server refused with the map this client
                        // holds: it is between roles (a failover under
                        // way, its lease lapsed, a group handed over);
                        // wait for the next map. Only refusals no newer
                        // map explains count against the bound: a move
                        // changes the map several times in a row.
                        let newer = f.epoch() > epoch || f.wait_newer(epoch, failover_deadline);
                        if !newer {
                            rerouted += 1;
                        }
                        true
                    }
                    _ => false,
                };
                if reloaded {
                    again.extend_from_slice(&moved);
                } else {
                    // The servers kept refusing after the map was read
                    // again: WRONG_SERVER is the operations' outcome.
                    for &i in &moved {
                        sink.inner.land(i, ErrorCode::WrongServer, &[])?;
                    }
                }
            }
            if again.is_empty() {
                return Ok(());
            }
            // The map may have been read again (and grown) above.
            self.follow_map();
            parts.iter_mut().for_each(Vec::clear);
            parts.resize_with(self.m.size() as usize, Vec::new);
            for &i in again.iter() {
                parts[self.server_for_op(&ops[i], hashes[i]) as usize].push(i);
            }
        }
    }

    /// One round of a split batch: connect every server with a part,
    /// post every part, then collect every part by one deadline.
    fn round<S: batch::Sink>(
        &mut self,
        ops: &[BatchOp<'_>],
        parts: &[Vec<usize>],
        hashes: &[KeyHash],
        out: &mut S,
    ) -> Result<()> {
        for (s, p) in parts.iter().enumerate() {
            if !p.is_empty() {
                self.m.ensure(s)?;
            }
        }
        let with_part = (0..parts.len()).filter(|&s| !parts[s].is_empty());
        self.m.post_then_collect(
            with_part,
            false,
            |c, s| {
                // A server whose reply said its partition table moved on
                // is asked for it before this part is steered.
                batch::refresh_if_stale(c, ops);
                batch::post(c, ops, parts[s].iter().copied(), Some(hashes))
            },
            |c, pend, deadline| batch::collect(c, pend, deadline, out),
        )
    }

    /// Counters of each server, summed over its workers, in server order;
    /// a down server's entry is its error.
    pub fn stats(&mut self) -> Vec<Result<BTreeMap<String, u64>>> {
        (0..self.m.servers.len())
            .map(|s| {
                let c = self.m.ensure(s)?;
                c.stats().map_err(|e| self.m.fail(s, e))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fabrickv_transport::TransportError;
    use fabrickv_types::ErrorCode;

    #[test]
    fn an_error_at_a_server_names_it_and_keeps_the_inner_code() {
        let e = ClientError::AtServer {
            id: 2,
            addr: "tcp://10.0.0.3:7379".into(),
            error: Box::new(ClientError::Transport(TransportError::Closed)),
        };
        assert_eq!(
            e.to_string(),
            "server 2 (tcp://10.0.0.3:7379): transport: connection closed by peer"
        );
        assert_eq!(e.code(), ErrorCode::Unavailable);
        let t = ClientError::AtServer {
            id: 0,
            addr: "inproc://a".into(),
            error: Box::new(ClientError::Timeout),
        };
        assert_eq!(t.code(), ErrorCode::Timeout);
        assert!(is_refusal(&ClientError::Server {
            code: ErrorCode::NoSuchTable,
            message: String::new()
        }));
        assert!(!is_refusal(&ClientError::Timeout));
    }

    #[test]
    fn missing_slots_and_addresses_are_down_not_fatal() {
        let mut cluster = Cluster::of_addrs("t", &["inproc://nobody-listens-here", "tcp://x:1"])
            .expect("cluster");
        cluster.servers[1] = None;
        let e = ClusterClient::connect(&cluster, ClusterOptions::default())
            .expect_err("no server can be reached");
        assert!(
            e.to_string()
                .starts_with("server 0 (inproc://nobody-listens-here)"),
            "{e}"
        );
        let opts = ClusterOptions {
            transport: Some("shm".into()),
            timeout: Duration::from_millis(100),
            ..Default::default()
        };
        let e = ClusterClient::connect(&cluster, opts).expect_err("no shm address");
        assert_eq!(e.code(), ErrorCode::Unavailable);
    }
}
