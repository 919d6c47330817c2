//! The etcd registry: the membership and slot map of a replicated cluster.
//!
//! etcd is the source of truth, and FabricKV writes no consensus of its
//! own: every change of configuration is an etcd transaction that compares
//! a revision. Keys, all under `/fabrickv/CLUSTER/`:
//! - `server/ID`: the server's [`ServerDesc`] as JSON, attached to the
//!   server's lease, so it disappears [`LEASE_TTL_S`] after the server
//!   stops refreshing it (it is an address book, not a failure detector:
//!   a failed primary is found by direct heartbeats);
//! - `map`: the [`SlotMap`] as JSON. The first server to start creates it
//!   with a transaction that succeeds only while the key is absent; after
//!   that it changes only by a transaction comparing its `mod_revision`.
//!
//! With a cluster secret the values carry the registry MAC
//! ([`crate::mac`]), so that whoever can write to etcd cannot redirect
//! clients. etcd's own user and password come from the environment
//! ([`ETCD_USER_ENV`], [`ETCD_PASSWORD_FILE_ENV`] or
//! [`ETCD_PASSWORD_ENV`]), never from a command line.
//!
//! The etcd client is asynchronous (tonic); this module owns a small
//! runtime (one per process) and offers blocking calls, so the servers' and
//! clients' threads never need one. Watches run on that runtime and hand
//! each new [`ClusterView`] to a callback.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use fabrickv_auth::Secret;
use tokio::runtime::Runtime;

use crate::slots::SlotMap;
use crate::{check_name, RegistryError, ServerDesc, CLUSTER_SERVERS_MAX};

/// Seconds a server's registration lives without a keep-alive. etcd 3.4
/// refuses leases shorter than its minimum (about 2 s with default
/// timing); 5 s keeps an address book fresh without churn.
pub const LEASE_TTL_S: i64 = 5;

/// Timeout of one etcd request, in milliseconds.
pub const ETCD_IO_TIMEOUT_MS: u64 = 2_000;

/// Attempts [`EtcdRegistry::swap_map`] makes at a change whose answers
/// are lost, each a transaction and, after a lost answer, a read of
/// whether it committed.
pub const SWAP_MAP_TRIES: u32 = 3;

/// Longest wait before a broken watch is opened again, in milliseconds.
/// Retries start at 10 ms and double.
pub const WATCH_RETRY_MAX_MS: u64 = 1_000;

/// Seconds a watch may stay quiet before the cluster is read afresh and
/// the watch opened again (a backstop for streams a cut link left dead).
pub const WATCH_REREAD_S: u64 = 10;

/// Most endpoints one `etcd://` address may list.
pub const ETCD_ENDPOINTS_MAX: usize = 16;

/// Environment variable naming the etcd user, when etcd has
/// authentication on.
pub const ETCD_USER_ENV: &str = "FABRICKV_ETCD_USER";

/// Environment variable naming a file holding the etcd user's password.
pub const ETCD_PASSWORD_FILE_ENV: &str = "FABRICKV_ETCD_PASSWORD_FILE";

/// Environment variable holding the etcd user's password (the file is
/// preferred: the environment of a process can be read by its user).
pub const ETCD_PASSWORD_ENV: &str = "FABRICKV_ETCD_PASSWORD";

/// What a server's view of the cluster holds: the map, its revision (the
/// `mod_revision` a change must compare with) and each server's
/// descriptor, by id.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// The etcd revision this view was read at.
    pub revision: i64,
    /// The map and its `mod_revision`, once a server has created it.
    pub map: Option<(SlotMap, i64)>,
    /// Descriptors of the servers registered now, by id (`None`: absent).
    pub servers: Vec<Option<ServerDesc>>,
    /// Where the elected failover controller takes heartbeats (a UDP
    /// `HOST:PORT`), if one is elected.
    pub controller: Option<String>,
}

impl ClusterView {
    /// The descriptor of server `id`, if it is registered.
    pub fn server(&self, id: u32) -> Option<&ServerDesc> {
        self.servers.get(id as usize).and_then(Option::as_ref)
    }
}

/// A connection to etcd for one cluster. Clones share it.
#[derive(Clone)]
pub struct EtcdRegistry {
    url: String,
    cluster: String,
    secret: Option<Secret>,
    rt: &'static Runtime,
    client: Client,
}

impl std::fmt::Debug for EtcdRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRegistry")
            .field("url", &self.url)
            .field("cluster", &self.cluster)
            .field("authenticated", &self.secret.is_some())
            .finish()
    }
}

/// The process's one runtime for etcd's client, started by the first
/// registry and never dropped: tasks that hold a registry (a lease's
/// keep-alive, a watch) end on its thread, where dropping the runtime
/// they run on would not be allowed.
fn runtime() -> Result<&'static Runtime, RegistryError> {
    static RUNTIME: std::sync::OnceLock<Runtime> = std::sync::OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    // A thread the runtime starts later (its blocking pool grows from
    // whichever thread calls into it) would inherit that thread's CPUs:
    // those of a server's data movement (`serve --stream-cpus`) when a
    // confined replicator commits a map. It takes the CPUs of the thread
    // that built the runtime instead.
    let cpus = rustix::thread::sched_getaffinity(None).ok();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fkv-etcd")
        .on_thread_start(move || {
            if let Some(c) = &cpus {
                // A refusal (the process's own set changed since) leaves
                // the thread as it was.
                let _ = rustix::thread::sched_setaffinity(None, c);
            }
        })
        .enable_all()
        .build()
        .map_err(|e| RegistryError::Invalid(format!("cannot start the etcd runtime: {e}")))?;
    // Two first callers may both build one; the loser's is dropped here,
    // outside any runtime.
    Ok(RUNTIME.get_or_init(|| rt))
}

/// The scheme of an etcd registry's address.
pub const ETCD_SCHEME: &str = "etcd://";

/// Whether `url` names an etcd registry (rather than memcached).
pub fn is_etcd_url(url: &str) -> bool {
    url.starts_with(ETCD_SCHEME)
}

/// The `HOST:PORT` endpoints of an `etcd://HOST:PORT[,HOST:PORT...]`
/// address.
pub fn parse_etcd_url(url: &str) -> Result<Vec<String>, RegistryError> {
    let bad = || RegistryError::Address(url.to_string());
    let list = url.strip_prefix(ETCD_SCHEME).ok_or_else(bad)?;
    let endpoints: Vec<String> = list.split(',').map(str::to_string).collect();
    if endpoints.len() > ETCD_ENDPOINTS_MAX
        || endpoints
            .iter()
            .any(|e| e.is_empty() || e.contains('/') || e.contains('?') || !e.contains(':'))
    {
        return Err(bad());
    }
    Ok(endpoints)
}

/// etcd's user and password from the environment, if a user is named.
fn etcd_credentials() -> Result<Option<(String, String)>, RegistryError> {
    let Ok(user) = std::env::var(ETCD_USER_ENV) else {
        return Ok(None);
    };
    let password = match std::env::var(ETCD_PASSWORD_FILE_ENV) {
        Ok(path) => std::fs::read_to_string(&path)
            .map_err(|e| {
                RegistryError::Invalid(format!("cannot read {ETCD_PASSWORD_FILE_ENV} {path}: {e}"))
            })?
            .trim_end_matches(['\r', '\n'])
            .to_string(),
        Err(_) => std::env::var(ETCD_PASSWORD_ENV).map_err(|_| {
            RegistryError::Invalid(format!(
                "{ETCD_USER_ENV} is set but neither {ETCD_PASSWORD_FILE_ENV} nor {ETCD_PASSWORD_ENV}"
            ))
        })?,
    };
    Ok(Some((user, password)))
}

impl EtcdRegistry {
    /// Connects to etcd at `etcd://HOST:PORT[,...]` for cluster `cluster`,
    /// with the process's cluster secret, if any (a server sets its own
    /// with [`EtcdRegistry::with_secret`]).
    pub fn connect(url: &str, cluster: &str) -> Result<EtcdRegistry, RegistryError> {
        check_name("cluster", cluster).map_err(RegistryError::Invalid)?;
        let endpoints = parse_etcd_url(url)?;
        let rt = runtime()?;
        let io = Duration::from_millis(ETCD_IO_TIMEOUT_MS);
        // HTTP/2 pings notice a dead etcd member while a watch is idle.
        let mut options = ConnectOptions::new()
            .with_connect_timeout(io)
            .with_keep_alive(Duration::from_secs(1), io)
            .with_keep_alive_while_idle(true);
        if let Some((user, password)) = etcd_credentials()? {
            options = options.with_user(user, password);
        }
        let client = rt
            .block_on(async {
                tokio::time::timeout(io, Client::connect(&endpoints, Some(options))).await
            })
            .map_err(|_| {
                RegistryError::Timeout(format!("etcd {url}: no answer in {ETCD_IO_TIMEOUT_MS} ms"))
            })?
            .map_err(|e| etcd_err(url, e))?;
        let secret =
            fabrickv_auth::client_secret().map_err(|e| RegistryError::Invalid(e.to_string()))?;
        Ok(EtcdRegistry {
            url: url.to_string(),
            cluster: cluster.to_string(),
            secret,
            rt,
            client,
        })
    }

    /// The same registry, MACing and checking its entries with `secret`
    /// (`None`: neither) instead of the process's.
    pub fn with_secret(mut self, secret: Option<Secret>) -> EtcdRegistry {
        self.secret = secret;
        self
    }

    /// The cluster this handle reads and writes.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The address it was connected with.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn prefix(&self) -> String {
        format!("/fabrickv/{}/", self.cluster)
    }

    fn map_key(&self) -> String {
        format!("{}map", self.prefix())
    }

    /// The election the failover controllers campaign in; each
    /// candidate's key is this, a slash and its lease.
    fn controller_key(&self) -> String {
        format!("{}controller", self.prefix())
    }

    fn server_key(&self, id: u32) -> String {
        format!("{}server/{id}", self.prefix())
    }

    /// Runs one etcd request on the registry's runtime, within
    /// [`ETCD_IO_TIMEOUT_MS`], from a thread outside it.
    fn call<T, F>(&self, what: &str, fut: F) -> Result<T, RegistryError>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        self.rt.block_on(self.timed(what, fut))
    }

    /// One etcd request, within [`ETCD_IO_TIMEOUT_MS`].
    async fn timed<T, F>(&self, what: &str, fut: F) -> Result<T, RegistryError>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let io = Duration::from_millis(ETCD_IO_TIMEOUT_MS);
        tokio::time::timeout(io, fut)
            .await
            .map_err(|_| {
                RegistryError::Timeout(format!(
                    "etcd {}: {what}: no answer in {ETCD_IO_TIMEOUT_MS} ms",
                    self.url
                ))
            })?
            .map_err(|e| etcd_err(&self.url, e))
    }

    /// Reads the whole cluster: map and descriptors, at one revision.
    pub fn view(&self) -> Result<ClusterView, RegistryError> {
        self.rt.block_on(self.read_view())
    }

    async fn read_view(&self) -> Result<ClusterView, RegistryError> {
        let mut c = self.client.clone();
        let prefix = self.prefix();
        let resp = self
            .timed(
                "read the cluster",
                c.get(prefix.clone(), Some(GetOptions::new().with_prefix())),
            )
            .await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut view = ClusterView {
            revision,
            ..ClusterView::default()
        };
        // The election's leader is its candidate created first.
        let mut leader_rev = i64::MAX;
        let election = self.controller_key();
        for kv in resp.kvs() {
            let Ok(key) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            if key.starts_with(&format!("{election}/")) {
                if kv.create_revision() < leader_rev {
                    if let Some(addr) =
                        crate::mac::open(self.secret.as_ref(), &self.url, &election, kv.value())
                    {
                        leader_rev = kv.create_revision();
                        view.controller = Some(addr.to_string());
                    }
                }
                continue;
            }
            let Some(value) = crate::mac::open(self.secret.as_ref(), &self.url, key, kv.value())
            else {
                continue;
            };
            let rest = &key[prefix.len()..];
            if rest == "map" {
                match SlotMap::from_json(value.as_bytes()) {
                    Ok(map) => view.map = Some((map, kv.mod_revision())),
                    Err(why) => {
                        return Err(RegistryError::Corrupt {
                            addr: self.url.clone(),
                            key: key.to_string(),
                            why,
                        })
                    }
                }
            } else if let Some(id) = rest.strip_prefix("server/") {
                if let Some(desc) = self.desc_of(key, id, value) {
                    let i = desc.id as usize;
                    if view.servers.len() <= i {
                        view.servers.resize(i + 1, None);
                    }
                    view.servers[i] = Some(desc);
                }
            }
        }
        Ok(view)
    }

    /// The descriptor stored under `key` (server `id`), if it is one:
    /// JSON of a descriptor of that id, below [`CLUSTER_SERVERS_MAX`];
    /// anything else is logged and ignored.
    fn desc_of(&self, key: &str, id: &str, value: &str) -> Option<ServerDesc> {
        let desc: Option<ServerDesc> = serde_json::from_str(value).ok();
        match (id.parse::<u32>(), desc) {
            (Ok(id), Some(desc)) if id == desc.id && id < CLUSTER_SERVERS_MAX => Some(desc),
            _ => {
                tracing::warn!(
                    "etcd {}: key {key} is not a server descriptor; ignored",
                    self.url
                );
                None
            }
        }
    }

    /// Server `id`'s descriptor, if it is registered (and, with a secret,
    /// carries a good MAC): one read of its key.
    pub fn server(&self, id: u32) -> Result<Option<ServerDesc>, RegistryError> {
        let key = self.server_key(id);
        let mut c = self.client.clone();
        let resp = self.call("read a server", c.get(key.clone(), None))?;
        Ok(resp.kvs().first().and_then(|kv| {
            let value = crate::mac::open(self.secret.as_ref(), &self.url, &key, kv.value())?;
            self.desc_of(&key, &id.to_string(), value)
        }))
    }

    /// Creates the cluster's map as `initial` unless one exists, in one
    /// transaction, and returns the map in force and its `mod_revision`.
    /// A map of another copy count is an error: this server was started
    /// for another cluster. Its size is the map's, whatever `initial`
    /// says (the cluster may have grown or shrunk since it began).
    pub fn create_map(&self, initial: &SlotMap) -> Result<(SlotMap, i64), RegistryError> {
        let key = self.map_key();
        let sealed = crate::mac::seal(self.secret.as_ref(), &key, &initial.to_json());
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), sealed, None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let mut c = self.client.clone();
        let resp = self.call("create the slot map", c.txn(txn))?;
        if resp.succeeded() {
            let rev = resp.header().map_or(0, |h| h.revision());
            return Ok((initial.clone(), rev));
        }
        let existing = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g
                .kvs()
                .first()
                .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
            _ => None,
        });
        let Some((raw, rev)) = existing else {
            return Err(RegistryError::Corrupt {
                addr: self.url.clone(),
                key,
                why: "the map vanished while it was read".into(),
            });
        };
        let corrupt = |why: String| RegistryError::Corrupt {
            addr: self.url.clone(),
            key: key.clone(),
            why,
        };
        let text =
            crate::mac::open(self.secret.as_ref(), &self.url, &key, &raw).ok_or_else(|| {
                corrupt("its MAC does not check out with this cluster's secret".into())
            })?;
        let map = SlotMap::from_json(text.as_bytes()).map_err(corrupt)?;
        // The size may differ: a cluster grows and shrinks (`fabrickv
        // cluster add`), and a server started to be added has an id past
        // the map's until it is.
        if map.replicas != initial.replicas {
            return Err(RegistryError::Invalid(format!(
                "cluster {} in etcd keeps {} copies of each slot; this server expects {}",
                self.cluster, map.replicas, initial.replicas
            )));
        }
        Ok((map, rev))
    }

    /// Replaces the map if it is still at `mod_revision` `expected`, in
    /// one transaction; `Ok(false)` when another change won.
    ///
    /// A transaction whose answer is lost (a timeout with etcd or this
    /// process starved on a busy machine, a connection cut) may have
    /// committed or not; a caller told only the error would report a
    /// failure that did happen, and one trying again would be told that
    /// its own write "won" against it. So the outcome is found out, and a
    /// call made again with the same arguments answers as the first would
    /// have: a map still at `expected` was not replaced, and the
    /// transaction is sent again (it compares the revision, so it cannot
    /// apply twice); a map replaced since `expected` was replaced by the
    /// first write after it, which a watch from the next revision replays,
    /// and it was this change if it holds these bytes. After
    /// [`SWAP_MAP_TRIES`] attempts without an answer the error says the
    /// outcome is unknown.
    pub fn swap_map(&self, expected: i64, map: &SlotMap) -> Result<bool, RegistryError> {
        map.validate().map_err(RegistryError::Invalid)?;
        let key = self.map_key();
        let sealed = crate::mac::seal(self.secret.as_ref(), &key, &map.to_json());
        let mut last = None;
        for _ in 0..SWAP_MAP_TRIES {
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    expected,
                )])
                .and_then([TxnOp::put(key.clone(), sealed.clone(), None)]);
            let mut c = self.client.clone();
            match self.call("change the slot map", c.txn(txn)) {
                Ok(r) if r.succeeded() => return Ok(true),
                // The compare failed, on another change or on this one
                // made by an attempt whose answer was lost.
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("{e}; reading the map to learn whether it changed");
                    last = Some(e);
                }
            }
            match self.rt.block_on(self.swap_outcome(&key, expected, &sealed)) {
                Ok(Some(won)) => return Ok(won),
                Ok(None) => {}
                Err(e) => last = Some(e),
            }
        }
        let why = last.map_or_else(String::new, |e| format!(": {e}"));
        Err(RegistryError::Timeout(format!(
            "etcd {}: whether the slot map changed is unknown after {SWAP_MAP_TRIES} attempts{why}",
            self.url
        )))
    }

    /// Whether the write that replaced the map at `mod_revision`
    /// `expected` stored `sealed`; `None` while the map is still at
    /// `expected`. Every change of the map compares the revision it read,
    /// so the first write after `expected` is the one change that won
    /// against it.
    async fn swap_outcome(
        &self,
        key: &str,
        expected: i64,
        sealed: &str,
    ) -> Result<Option<bool>, RegistryError> {
        let mut c = self.client.clone();
        let now = self.timed("read the slot map", c.get(key, None)).await?;
        if now.kvs().first().map_or(0, |kv| kv.mod_revision()) == expected {
            return Ok(None);
        }
        let opts = WatchOptions::new().with_start_revision(expected + 1);
        let mut stream = self
            .timed("replay the slot map's changes", c.watch(key, Some(opts)))
            .await?;
        let io = Duration::from_millis(ETCD_IO_TIMEOUT_MS);
        let lost = |why: &str| {
            RegistryError::Timeout(format!(
                "etcd {}: cannot tell whether the slot map change committed: {why}",
                self.url
            ))
        };
        loop {
            let r = match tokio::time::timeout(io, stream.message()).await {
                Err(_) => return Err(lost("no change replayed")),
                Ok(Err(e)) => return Err(etcd_err(&self.url, e)),
                Ok(Ok(None)) => return Err(lost("the watch ended")),
                Ok(Ok(Some(r))) => r,
            };
            if r.compact_revision() > 0 {
                return Err(lost("etcd compacted that revision away"));
            }
            if r.canceled() {
                return Err(lost("the watch was cancelled"));
            }
            if let Some(first) = r.events().first() {
                let won = first.event_type() == EventType::Put
                    && first.kv().is_some_and(|kv| kv.value() == sealed.as_bytes());
                return Ok(Some(won));
            }
        }
    }

    /// Publishes `desc` under a lease of [`LEASE_TTL_S`] and keeps it
    /// alive until the returned registration is dropped.
    pub fn register(&self, desc: &ServerDesc) -> Result<EtcdRegistration, RegistryError> {
        let key = self.server_key(desc.id);
        let json =
            serde_json::to_string(desc).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let value = crate::mac::seal(self.secret.as_ref(), &key, &json);
        let lease = Arc::new(AtomicI64::new(self.grant_and_put(&key, &value)?));
        let me = self.clone();
        let held = lease.clone();
        let task = self
            .rt
            .spawn(async move { me.keep_alive(key, value, held).await });
        Ok(EtcdRegistration {
            registry: self.clone(),
            lease,
            task,
        })
    }

    fn grant_and_put(&self, key: &str, value: &str) -> Result<i64, RegistryError> {
        let mut c = self.client.clone();
        let lease = self
            .call("grant a lease", c.lease_grant(LEASE_TTL_S, None))?
            .id();
        let mut c = self.client.clone();
        self.call(
            "publish the server",
            c.put(key, value, Some(PutOptions::new().with_lease(lease))),
        )?;
        Ok(lease)
    }

    /// One keep-alive of `lease`, within [`ETCD_IO_TIMEOUT_MS`]:
    /// `Some(true)` while it lives, `Some(false)` once etcd says it is
    /// gone, `None` when etcd could not be asked (unreachable, timed out:
    /// try again; a cut link must not hang the caller for ever).
    async fn renew(&self, lease: i64) -> Option<bool> {
        let io = Duration::from_millis(ETCD_IO_TIMEOUT_MS);
        let mut c = self.client.clone();
        let once = async {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease).await.ok()?;
            keeper.keep_alive().await.ok()?;
            match stream.message().await {
                Ok(Some(r)) => Some(r.ttl() > 0),
                _ => None,
            }
        };
        tokio::time::timeout(io, once).await.ok().flatten()
    }

    /// Refreshes the lease every third of its TTL. Once it is gone (etcd
    /// unreachable for longer than the TTL, a server frozen or cut off),
    /// grants a new one and publishes the descriptor again, so a server
    /// that comes back is found again.
    async fn keep_alive(self, key: String, value: String, held: Arc<AtomicI64>) {
        let period = Duration::from_millis(LEASE_TTL_S as u64 * 1000 / 3);
        let io = Duration::from_millis(ETCD_IO_TIMEOUT_MS);
        let ttl = Duration::from_secs(LEASE_TTL_S as u64);
        let mut renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(period).await;
            let lease = held.load(Ordering::Relaxed);
            match self.renew(lease).await {
                Some(true) => {
                    renewed = tokio::time::Instant::now();
                    continue;
                }
                // etcd cannot be asked (or will not say): try again next
                // period, unless the lease has surely expired meanwhile.
                None if renewed.elapsed() < ttl => continue,
                _ => {}
            }
            tracing::warn!(
                "etcd {}: registration lease expired; registering again",
                self.url
            );
            let mut c = self.client.clone();
            let again = async {
                let g = c.lease_grant(LEASE_TTL_S, None).await?;
                let opts = PutOptions::new().with_lease(g.id());
                c.put(key.clone(), value.clone(), Some(opts)).await?;
                Ok::<i64, etcd_client::Error>(g.id())
            };
            match tokio::time::timeout(io, again).await {
                Ok(Ok(id)) => {
                    held.store(id, Ordering::Relaxed);
                    renewed = tokio::time::Instant::now();
                }
                Ok(Err(e)) => tracing::warn!("etcd {}: cannot register again: {e}", self.url),
                Err(_) => tracing::warn!("etcd {}: cannot register again: no answer", self.url),
            }
        }
    }

    /// Campaigns in the cluster's controller election with `addr` (where
    /// this controller takes heartbeats) and returns once elected, which
    /// may be never while another controller leads. Leadership lasts
    /// while the returned value's lease is kept alive: dropping it
    /// revokes the lease and so hands leadership to the next candidate;
    /// [`Leadership::lost`] tells the holder it lost the lease anyway
    /// (etcd unreachable past its TTL).
    pub fn campaign(&self, addr: &str) -> Result<Leadership, RegistryError> {
        let mut c = self.client.clone();
        let lease = self
            .call("grant a lease", c.lease_grant(LEASE_TTL_S, None))?
            .id();
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let me = self.clone();
        let flag = lost.clone();
        let keeper = self.rt.spawn(async move {
            let period = Duration::from_millis(LEASE_TTL_S as u64 * 1000 / 3);
            // Lost once etcd says the lease is gone, or once it could not
            // be renewed for a whole TTL (it may have expired unseen).
            let mut renewed = tokio::time::Instant::now();
            loop {
                match me.renew(lease).await {
                    Some(true) => renewed = tokio::time::Instant::now(),
                    Some(false) => break,
                    None if renewed.elapsed() >= Duration::from_secs(LEASE_TTL_S as u64) => break,
                    None => {}
                }
                tokio::time::sleep(period).await;
            }
            flag.store(true, Ordering::Release);
        });
        let value = crate::mac::seal(self.secret.as_ref(), &self.controller_key(), addr);
        let mut c = self.client.clone();
        // No timeout: a candidate waits as long as another leads.
        let elected = self
            .rt
            .block_on(c.campaign(self.controller_key(), value, lease))
            .map_err(|e| etcd_err(&self.url, e));
        if let Err(e) = elected {
            keeper.abort();
            return Err(e);
        }
        Ok(Leadership {
            registry: self.clone(),
            lease,
            lost,
            keeper,
        })
    }

    /// Calls `on_view` with the cluster as it is now, and again after
    /// every change of the map or of a descriptor, until the returned
    /// handle is dropped. A broken watch is opened again (backing off up
    /// to [`WATCH_RETRY_MAX_MS`]) and the cluster read afresh, so no change
    /// is missed.
    pub fn watch<F>(&self, mut on_view: F) -> WatchHandle
    where
        F: FnMut(ClusterView) + Send + 'static,
    {
        let me = self.clone();
        let task = self.rt.spawn(async move {
            let mut backoff = Duration::from_millis(10);
            loop {
                let view = match me.read_view().await {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::warn!("etcd watch: {e}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_millis(WATCH_RETRY_MAX_MS));
                        continue;
                    }
                };
                let from = view.revision + 1;
                on_view(view);
                let mut c = me.client.clone();
                let opts = WatchOptions::new().with_prefix().with_start_revision(from);
                let io = Duration::from_millis(ETCD_IO_TIMEOUT_MS);
                let opened = tokio::time::timeout(io, c.watch(me.prefix(), Some(opts)))
                    .await
                    .unwrap_or_else(|_| {
                        Err(etcd_client::Error::WatchError(
                            "no answer to the watch request".into(),
                        ))
                    });
                match opened {
                    Ok(mut stream) => {
                        backoff = Duration::from_millis(10);
                        // Any event newer than the view: read the whole
                        // view again (changes are rare; a full read cannot
                        // miss one), on the same watch. Opening a watch
                        // per change cost etcd a cancel, a read and a
                        // create per watcher, and a move's few map
                        // changes, with every server and client watching,
                        // took a tenth of a two-core machine. A watch
                        // quiet for WATCH_REREAD_S is read afresh anyway:
                        // a link cut and restored can leave a stream that
                        // never delivers again.
                        let quiet = Duration::from_secs(WATCH_REREAD_S);
                        let mut seen = from - 1;
                        loop {
                            let r = match tokio::time::timeout(quiet, stream.message()).await {
                                Ok(Ok(Some(r))) if !r.canceled() => r,
                                _ => break,
                            };
                            let newest = r
                                .events()
                                .iter()
                                .filter_map(|e| e.kv().map(|kv| kv.mod_revision()))
                                .max();
                            // An event without its key-value is read for.
                            if r.events().is_empty() || newest.is_some_and(|n| n <= seen) {
                                continue;
                            }
                            match me.read_view().await {
                                Ok(view) => {
                                    seen = view.revision;
                                    on_view(view);
                                }
                                Err(e) => {
                                    tracing::warn!("etcd watch: {e}");
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!("etcd watch: {e}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_millis(WATCH_RETRY_MAX_MS));
                    }
                }
            }
        });
        WatchHandle { task }
    }
}

fn etcd_err(url: &str, e: etcd_client::Error) -> RegistryError {
    RegistryError::Etcd {
        addr: url.to_string(),
        source: e,
    }
}

/// A controller's leadership of its cluster's election (see
/// [`EtcdRegistry::campaign`]).
pub struct Leadership {
    registry: EtcdRegistry,
    lease: i64,
    lost: Arc<std::sync::atomic::AtomicBool>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Whether the lease behind the leadership could not be kept alive:
    /// another candidate may lead now.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.keeper.abort();
        let mut c = self.registry.client.clone();
        if let Err(e) = self
            .registry
            .call("revoke the lease", c.lease_revoke(self.lease))
        {
            tracing::warn!("etcd: cannot resign the controller's leadership: {e}");
        }
    }
}

/// A server's live registration in etcd: its lease is kept alive until
/// this is dropped, and revoked then (which deletes its descriptor).
pub struct EtcdRegistration {
    registry: EtcdRegistry,
    lease: Arc<AtomicI64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EtcdRegistration {
    fn drop(&mut self) {
        self.task.abort();
        let lease = self.lease.load(Ordering::Relaxed);
        let mut c = self.registry.client.clone();
        if let Err(e) = self
            .registry
            .call("revoke the lease", c.lease_revoke(lease))
        {
            tracing::warn!("cannot remove the registration: {e}");
        }
    }
}

/// A running watch; dropping it stops the watch.
pub struct WatchHandle {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

    use super::*;

    /// The calling thread's CPUs.
    fn my_cpus() -> Vec<usize> {
        let set = sched_getaffinity(None).unwrap();
        (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
    }

    /// A thread the etcd runtime starts from a thread confined to one CPU
    /// (a replicator streaming a move, committing a map) runs on the
    /// CPUs the runtime was built with, not that one.
    #[test]
    fn threads_the_runtime_starts_do_not_inherit_a_confined_callers_cpus() {
        let all = my_cpus();
        let rt = runtime().unwrap();
        let Some(&last) = all.last().filter(|_| all.len() >= 2) else {
            return; // one CPU: nothing to confine to
        };
        let seen = std::thread::spawn(move || {
            let mut one = CpuSet::new();
            one.set(last);
            sched_setaffinity(None, &one).unwrap();
            assert_eq!(my_cpus(), [last]);
            // Blocking tasks past the pool's idle threads start threads
            // from this one.
            let tasks: Vec<_> = (0..4)
                .map(|_| {
                    rt.spawn_blocking(|| {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        my_cpus()
                    })
                })
                .collect();
            rt.block_on(async {
                let mut seen = Vec::new();
                for t in tasks {
                    seen.push(t.await.unwrap());
                }
                seen
            })
        })
        .join()
        .unwrap();
        for cpus in seen {
            assert_eq!(cpus, all);
        }
    }
}
