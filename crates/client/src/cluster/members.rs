//! The per-server clients of a cluster client ([`Members`]) and the trait
//! they are held through ([`PerServer`]): one slot per server, connected
//! at once at start, marked down when a call fails for any reason but a
//! refusal, and connected again by the next call that needs it. Every
//! cluster client (kv, ps, cache) splits its calls through it, and its
//! split calls post to every server before collecting from any
//! ([`Members::post_then_collect`]). [`ClusterOf`] is what the three
//! cluster clients share over their members, written once.

use std::time::{Duration, Instant};

use fabrickv_cluster::{Cluster, Directory};

use super::{ClusterOptions, CONNECT_THREADS_MAX};
use crate::{ClientError, Result};
use fabrickv_types::ErrorCode;

/// A client of one server, as a cluster client holds one per server: the
/// kv [`crate::Client`], the ps client with its tables, the
/// [`crate::CacheClient`].
pub trait PerServer: Send + Sized {
    /// What connecting needs beyond the address and the timeout (the cache
    /// client's buffer size; nothing for the others).
    type Options: Send + Sync;

    /// Connects to the server at `addr`.
    fn connect(addr: &str, timeout: Duration, options: &Self::Options) -> Result<Self>;
}

impl<C: PerServer> Members<C> {
    /// The options each server's client connects with.
    pub(crate) fn options(&self) -> &C::Options {
        &self.options
    }
}

/// What each server's [`crate::Client`] of a cluster client is set up with.
pub struct KvMemberOptions {
    /// Whether its GETs may be answered by any replica
    /// ([`crate::Client::set_replica_reads`]).
    pub replica_reads: bool,
    /// The epoch of the slot map the cluster client routes by (0 without
    /// one), stamped on its request frames
    /// ([`crate::Client::set_map_epoch_source`]); the cluster client
    /// keeps it.
    pub(crate) map_epoch: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl KvMemberOptions {
    /// Options whose GETs go to any replica when `replica_reads`; no map
    /// epoch is stamped until the cluster client follows a slot map.
    pub fn new(replica_reads: bool) -> KvMemberOptions {
        KvMemberOptions {
            replica_reads,
            map_epoch: Default::default(),
        }
    }
}

impl PerServer for crate::Client {
    type Options = KvMemberOptions;

    fn connect(addr: &str, timeout: Duration, o: &KvMemberOptions) -> Result<Self> {
        let mut c = crate::Client::connect_with_timeout(addr, timeout)?;
        c.set_replica_reads(o.replica_reads);
        c.set_map_epoch_source(o.map_epoch.clone());
        Ok(c)
    }
}

impl PerServer for crate::CacheClient {
    /// Bytes of the client's receive buffer.
    type Options = usize;

    fn connect(addr: &str, timeout: Duration, buffer_bytes: &usize) -> Result<Self> {
        crate::CacheClient::connect_with(
            addr,
            crate::CacheClientOptions {
                buffer_bytes: *buffer_bytes,
                timeout,
            },
        )
    }
}

/// Where to reach a server of cluster `cluster` over transport `want`,
/// or why it cannot be reached.
pub(crate) fn addr_of_slot(
    cluster: &str,
    slot: Option<&fabrickv_cluster::ServerDesc>,
    want: Option<&str>,
) -> std::result::Result<String, String> {
    match slot {
        None => Err(format!(
            "not registered in cluster {cluster} (not started, or gone)"
        )),
        Some(d) => d.addr_for(want).map(str::to_string).ok_or_else(|| {
            format!(
                "no {} address among {}",
                want.unwrap_or("usable"),
                d.addrs.join(", ")
            )
        }),
    }
}

/// Whether `e` is the server refusing a request (the connection is still
/// in step) rather than the connection failing.
pub(crate) fn is_refusal(e: &ClientError) -> bool {
    matches!(e, ClientError::Server { .. } | ClientError::Invalid(..))
}

/// One server's slot.
pub(crate) struct Member<C> {
    /// Where to reach it, or why it cannot be reached.
    pub(crate) addr: std::result::Result<String, String>,
    /// The connection, while the server is up.
    pub(crate) conn: Option<C>,
    /// Counts the connections made, so that handles tied to one connection
    /// (an outstanding pull) are not taken for another's.
    pub(crate) epoch: u64,
}

/// The per-server connections of a cluster client, and the rules for
/// marking servers down and bringing them back.
pub struct Members<C: PerServer> {
    /// The cluster's name, for errors.
    pub(crate) cluster: String,
    /// One slot per server id.
    pub(crate) servers: Vec<Member<C>>,
    /// Timeout of connecting and of each call.
    pub(crate) timeout: Duration,
    /// What connecting to a server needs beyond its address.
    options: C::Options,
    /// The transport asked for, to pick a re-read descriptor's address.
    transport: Option<String>,
    /// Where the map came from, for a client that joined through the
    /// registry: a down server's descriptor is read again before each
    /// reconnect, so a server restarted elsewhere (another host or port)
    /// is found.
    pub(crate) registry: Option<Directory>,
}

impl<C: PerServer> Members<C> {
    /// Connects to every registered server at once (threads, at most
    /// [`CONNECT_THREADS_MAX`] at a time, so that unreachable servers cost
    /// one timeout in all, not one each). Fails only if no server at all
    /// can be reached.
    pub(crate) fn connect(
        cluster: &Cluster,
        opts: &ClusterOptions,
        options: C::Options,
    ) -> Result<Self> {
        let want = opts.transport.as_deref();
        let addrs: Vec<std::result::Result<String, String>> = cluster
            .servers
            .iter()
            .map(|slot| addr_of_slot(&cluster.name, slot.as_ref(), want))
            .collect();
        let timeout = opts.timeout;
        let mut conns: Vec<Option<Result<C>>> = Vec::with_capacity(addrs.len());
        for wave in addrs.chunks(CONNECT_THREADS_MAX) {
            std::thread::scope(|s| {
                let handles: Vec<_> = wave
                    .iter()
                    .map(|a| {
                        let options = &options;
                        a.as_ref()
                            .ok()
                            .map(|addr| s.spawn(move || C::connect(addr, timeout, options)))
                    })
                    .collect();
                conns.extend(handles.into_iter().map(|h| {
                    h.map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(ClientError::Protocol("connecting thread panicked".into()))
                        })
                    })
                }));
            });
        }
        let mut m = Members {
            cluster: cluster.name.clone(),
            servers: Vec::with_capacity(addrs.len()),
            timeout,
            options,
            transport: opts.transport.clone(),
            registry: None,
        };
        let mut first_err = None;
        for (id, (addr, conn)) in addrs.into_iter().zip(conns).enumerate() {
            let conn = match conn {
                Some(Ok(c)) => Some(c),
                Some(Err(e)) => {
                    first_err.get_or_insert((id, e));
                    None
                }
                None => None,
            };
            m.servers.push(Member {
                addr,
                epoch: u64::from(conn.is_some()),
                conn,
            });
        }
        if m.servers.iter().all(|s| s.conn.is_none()) {
            let e = match first_err {
                Some((id, e)) => m.at(id, e),
                None => ClientError::Unavailable(format!(
                    "no server of cluster {} has an address to connect to",
                    m.cluster
                )),
            };
            return Err(e);
        }
        Ok(m)
    }

    pub(crate) fn size(&self) -> u32 {
        self.servers.len() as u32
    }

    /// The address of server `s` as errors show it.
    pub(crate) fn addr_text(&self, s: usize) -> String {
        match &self.servers[s].addr {
            Ok(a) => a.clone(),
            Err(_) => "no address".into(),
        }
    }

    /// `e` as an error of server `s`.
    pub(crate) fn at(&self, s: usize, e: ClientError) -> ClientError {
        if matches!(e, ClientError::AtServer { .. }) {
            return e;
        }
        ClientError::AtServer {
            id: s as u32,
            addr: self.addr_text(s),
            error: Box::new(e),
        }
    }

    /// Marks server `s` down (drops its connection, which may hold stray
    /// replies) and returns `e` naming it.
    pub(crate) fn fail(&mut self, s: usize, e: ClientError) -> ClientError {
        self.servers[s].conn = None;
        self.at(s, e)
    }

    /// [`Members::fail`], unless `e` is a refusal by the server, after
    /// which the connection is still in step and is kept.
    pub(crate) fn fail_or_wrap(&mut self, s: usize, e: ClientError) -> ClientError {
        if is_refusal(&e) {
            self.at(s, e)
        } else {
            self.fail(s, e)
        }
    }

    /// Reads server `s`'s descriptor again from the registry, when the
    /// client joined through one; a registry that cannot be read leaves
    /// the address as it was (the connect that follows says what fails).
    pub(crate) fn refresh(&mut self, s: usize) {
        let Some(reg) = &self.registry else {
            return;
        };
        match reg.server(s as u32) {
            Ok(d) => {
                self.servers[s].addr =
                    addr_of_slot(&self.cluster, d.as_ref(), self.transport.as_deref());
            }
            Err(e) => tracing::debug!("cannot re-read server {s}: {e}"),
        }
    }

    /// Takes the servers' descriptors a registry delivered: a server whose
    /// address changed (restarted elsewhere) loses its old connection, and
    /// is connected at the new address when next needed.
    pub(crate) fn adopt_descs(&mut self, descs: &[Option<fabrickv_cluster::ServerDesc>]) {
        self.grow_to(descs.len());
        for (s, m) in self.servers.iter_mut().enumerate() {
            let Some(Some(d)) = descs.get(s) else {
                continue;
            };
            let addr = addr_of_slot(&self.cluster, Some(d), self.transport.as_deref());
            if addr.is_ok() && addr != m.addr {
                m.addr = addr;
                m.conn = None;
            }
        }
    }

    /// Makes room for servers up to id `n - 1` (a cluster grown since
    /// the client joined), down until their descriptors are read.
    pub(crate) fn grow_to(&mut self, n: usize) {
        while self.servers.len() < n {
            let id = self.servers.len();
            self.servers.push(Member {
                addr: Err(format!(
                    "server {id} joined cluster {} after this client; its address is not read yet",
                    self.cluster
                )),
                conn: None,
                epoch: 0,
            });
        }
    }

    /// The connection to server `s`, connecting first if it is down.
    pub(crate) fn ensure(&mut self, s: usize) -> Result<&mut C> {
        if self.servers[s].conn.is_none() {
            self.refresh(s);
            let conn = match &self.servers[s].addr {
                Ok(addr) => C::connect(addr, self.timeout, &self.options),
                Err(why) => Err(ClientError::Unavailable(why.clone())),
            };
            match conn {
                Ok(c) => {
                    let m = &mut self.servers[s];
                    m.epoch += 1;
                    m.conn = Some(c);
                }
                Err(e) => return Err(self.at(s, e)),
            }
        }
        self.conn(s)
    }

    /// The connection to server `s`, which must be up.
    pub(crate) fn conn(&mut self, s: usize) -> Result<&mut C> {
        if self.servers[s].conn.is_none() {
            return Err(self.at(s, ClientError::Unavailable("down".into())));
        }
        self.servers[s]
            .conn
            .as_mut()
            .ok_or_else(|| ClientError::Unavailable("down".into()))
    }

    /// Runs `f` on server `s`'s connection, connecting first if needed;
    /// marks it down if the call fails for any reason but a refusal.
    pub(crate) fn with<T>(&mut self, s: usize, f: impl FnOnce(&mut C) -> Result<T>) -> Result<T> {
        let c = self.ensure(s)?;
        f(c).map_err(|e| self.fail_or_wrap(s, e))
    }

    pub(crate) fn is_up(&self, s: usize) -> bool {
        self.servers.get(s).is_some_and(|m| m.conn.is_some())
    }

    pub(crate) fn addr(&self, s: usize) -> Option<&str> {
        self.servers.get(s).and_then(|m| m.addr.as_deref().ok())
    }
}

impl<C: PerServer> Members<C> {
    /// A split call's two phases over the servers with a part: `post`
    /// sends server `s`'s part without waiting, for every server, then
    /// `collect` reads each posted part's replies, all by one deadline, so
    /// the servers work on their parts at the same time. A server whose
    /// post or collect fails is marked down (or, when `keep_refused` and
    /// the server only refused, kept: its connection is still in step);
    /// the first error is returned once every part is in.
    pub(crate) fn post_then_collect<P>(
        &mut self,
        servers: impl Iterator<Item = usize>,
        keep_refused: bool,
        mut post: impl FnMut(&mut C, usize) -> Result<P>,
        mut collect: impl FnMut(&mut C, P, Instant) -> Result<()>,
    ) -> Result<()> {
        let mut first_err = None;
        let mut pending = Vec::new();
        for s in servers {
            match self.conn(s).and_then(|c| post(c, s)) {
                Ok(p) => pending.push((s, p)),
                Err(e) => {
                    first_err.get_or_insert(self.fail_as(s, e, keep_refused));
                }
            }
        }
        let deadline = Instant::now() + self.timeout;
        for (s, p) in pending {
            if let Err(e) = self.conn(s).and_then(|c| collect(c, p, deadline)) {
                // Its connection may still have replies in flight.
                first_err.get_or_insert(self.fail_as(s, e, keep_refused));
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// [`Members::fail_or_wrap`] when `keep_refused`, else [`Members::fail`].
    fn fail_as(&mut self, s: usize, e: ClientError, keep_refused: bool) -> ClientError {
        if keep_refused {
            self.fail_or_wrap(s, e)
        } else {
            self.fail(s, e)
        }
    }
}

/// A client of a whole cluster over one [`PerServer`] client per server:
/// [`super::ClusterClient`], [`super::ClusterPs`], [`super::ClusterCache`].
/// What they share is written once here, so that a caller generic over it
/// (the Python package) connects, follows a registry and asks after one
/// server in the same way for all three.
pub trait ClusterOf: Sized {
    /// The client each server gets.
    type Server: PerServer;

    /// The per-server clients (not nameable outside this crate).
    #[doc(hidden)]
    fn members(&self) -> &Members<Self::Server>;

    /// The per-server clients, mutably.
    #[doc(hidden)]
    fn members_mut(&mut self) -> &mut Members<Self::Server>;

    /// A client over per-server clients just connected.
    #[doc(hidden)]
    fn from_members(m: Members<Self::Server>) -> Self;

    /// Connects to every registered server of `cluster`, each client with
    /// `options`. Servers that cannot be reached now are down (calls
    /// needing them try again); fails only if none can be reached.
    fn connect_cluster(
        cluster: &Cluster,
        opts: &ClusterOptions,
        options: <Self::Server as PerServer>::Options,
    ) -> Result<Self> {
        Ok(Self::from_members(Members::connect(
            cluster, opts, options,
        )?))
    }

    /// Keeps `registry` (the one the map was read from), if any: a down
    /// server's descriptor is read there again before each reconnect, so
    /// a server that comes back at another address is found.
    fn following(mut self, registry: Option<Directory>) -> Self {
        if registry.is_some() {
            self.members_mut().registry = registry;
        }
        self
    }

    /// The number of servers, up or down.
    fn servers(&self) -> u32 {
        self.members().size()
    }

    /// The cluster's name.
    fn cluster_name(&self) -> &str {
        &self.members().cluster
    }

    /// Whether server `id` is connected now (a down one is tried again by
    /// the next call that needs it).
    fn server_up(&self, id: u32) -> bool {
        self.members().is_up(id as usize)
    }

    /// The address the client uses for server `id`, if it has one.
    fn server_addr(&self, id: u32) -> Option<&str> {
        self.members().addr(id as usize)
    }

    /// The client of server `id` (connecting if it is down), for calls
    /// that address one server.
    fn server_client(&mut self, id: u32) -> Result<&mut Self::Server> {
        let size = self.servers();
        if id >= size {
            return Err(ClientError::Invalid(
                ErrorCode::Malformed,
                format!("server {id} of a {size}-server cluster"),
            ));
        }
        self.members_mut().ensure(id as usize)
    }
}

/// Implements [`ClusterOf`] for a cluster client whose members are its
/// field `m`.
macro_rules! cluster_of {
    ($t:ty, $server:ty) => {
        impl $crate::cluster::ClusterOf for $t {
            type Server = $server;

            fn members(&self) -> &$crate::cluster::members::Members<$server> {
                &self.m
            }

            fn members_mut(&mut self) -> &mut $crate::cluster::members::Members<$server> {
                &mut self.m
            }

            fn from_members(m: $crate::cluster::members::Members<$server>) -> Self {
                Self::from(m)
            }
        }
    };
}
pub(crate) use cluster_of;
