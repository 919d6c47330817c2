//! Clients of a whole cluster: kv ([`ClusterClient`]), embedding tables
//! ([`ClusterPs`]) and the KV cache ([`ClusterCache`]).
//!
//! Keys are sharded across the servers by jump consistent hash
//! ([`fabrickv_cluster::server_of_key`], [`fabrickv_cluster::server_of_u64`]),
//! so that every client computes the same owner with no directory to ask.
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
mod ps;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fabrickv_cluster::{server_of_hash, Cluster, Registry};
use fabrickv_types::KeyHash;

use crate::batch::{self, BatchOp, Outcome};
use crate::{Client, ClientError, Result, DEFAULT_TIMEOUT};

pub use cache::{ClusterCache, ClusterPlaced};
pub use ps::{ClusterPs, ClusterPull, ClusterTable, ClusterTableInfo};

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
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            transport: None,
            timeout: DEFAULT_TIMEOUT,
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

/// Where to reach a server of cluster `cluster` over transport `want`,
/// or why it cannot be reached.
fn addr_of_slot(
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
fn is_refusal(e: &ClientError) -> bool {
    matches!(e, ClientError::Server { .. } | ClientError::Invalid(..))
}

/// Opens a connection of kind `C` to an address, with a timeout.
type Connector<C> = Box<dyn Fn(&str, Duration) -> Result<C> + Send + Sync>;

/// One server's slot.
struct Member<C> {
    /// Where to reach it, or why it cannot be reached.
    addr: std::result::Result<String, String>,
    /// The connection, while the server is up.
    conn: Option<C>,
    /// Counts the connections made, so that handles tied to one connection
    /// (an outstanding pull) are not taken for another's.
    epoch: u64,
}

/// The per-server connections of a cluster client, and the rules for
/// marking servers down and bringing them back.
struct Members<C> {
    cluster: String,
    servers: Vec<Member<C>>,
    timeout: Duration,
    connector: Connector<C>,
    /// The transport asked for, to pick a re-read descriptor's address.
    transport: Option<String>,
    /// Where the map came from, for a client that joined through the
    /// registry: a down server's descriptor is read again before each
    /// reconnect, so a server restarted elsewhere (another host or port)
    /// is found.
    registry: Option<Registry>,
}

impl<C: Send> Members<C> {
    /// Connects to every registered server at once (threads, at most
    /// [`CONNECT_THREADS_MAX`] at a time, so that unreachable servers cost
    /// one timeout in all, not one each). Fails only if no server at all
    /// can be reached.
    fn connect(cluster: &Cluster, opts: &ClusterOptions, connector: Connector<C>) -> Result<Self> {
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
                        let connector = &connector;
                        a.as_ref()
                            .ok()
                            .map(|addr| s.spawn(move || connector(addr, timeout)))
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
            connector,
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

    fn size(&self) -> u32 {
        self.servers.len() as u32
    }

    /// The address of server `s` as errors show it.
    fn addr_text(&self, s: usize) -> String {
        match &self.servers[s].addr {
            Ok(a) => a.clone(),
            Err(_) => "no address".into(),
        }
    }

    /// `e` as an error of server `s`.
    fn at(&self, s: usize, e: ClientError) -> ClientError {
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
    fn fail(&mut self, s: usize, e: ClientError) -> ClientError {
        self.servers[s].conn = None;
        self.at(s, e)
    }

    /// [`Members::fail`], unless `e` is a refusal by the server, after
    /// which the connection is still in step and is kept.
    fn fail_or_wrap(&mut self, s: usize, e: ClientError) -> ClientError {
        if is_refusal(&e) {
            self.at(s, e)
        } else {
            self.fail(s, e)
        }
    }

    /// Reads server `s`'s descriptor again from the registry, when the
    /// client joined through one; a registry that cannot be read leaves
    /// the address as it was (the connect that follows says what fails).
    fn refresh(&mut self, s: usize) {
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

    /// The connection to server `s`, connecting first if it is down.
    fn ensure(&mut self, s: usize) -> Result<&mut C> {
        if self.servers[s].conn.is_none() {
            self.refresh(s);
            let conn = match &self.servers[s].addr {
                Ok(addr) => (self.connector)(addr, self.timeout),
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
    fn conn(&mut self, s: usize) -> Result<&mut C> {
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
    fn with<T>(&mut self, s: usize, f: impl FnOnce(&mut C) -> Result<T>) -> Result<T> {
        let c = self.ensure(s)?;
        f(c).map_err(|e| self.fail_or_wrap(s, e))
    }

    fn is_up(&self, s: usize) -> bool {
        self.servers.get(s).is_some_and(|m| m.conn.is_some())
    }

    fn addr(&self, s: usize) -> Option<&str> {
        self.servers.get(s).and_then(|m| m.addr.as_deref().ok())
    }
}

/// A kv client of a whole cluster: one [`Client`] per server, every batch
/// split by owner, posted to all owners, then collected and merged in
/// request order.
pub struct ClusterClient {
    m: Members<Client>,
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

impl ClusterClient {
    /// Connects to every registered server of `cluster`. Servers that
    /// cannot be reached now are down (calls needing them try again);
    /// fails only if none can be reached.
    pub fn connect(cluster: &Cluster, opts: ClusterOptions) -> Result<ClusterClient> {
        let m = Members::connect(
            cluster,
            &opts,
            Box::new(|addr: &str, t: Duration| Client::connect_with_timeout(addr, t)),
        )?;
        Ok(ClusterClient { m })
    }

    /// Looks the cluster `name` up in the registry at `registry_url`
    /// (`memcached://HOST:PORT`; waiting up to the timeout for every
    /// server to register) and connects to it.
    pub fn join(registry_url: &str, name: &str, opts: ClusterOptions) -> Result<ClusterClient> {
        let (cluster, reg) = lookup(registry_url, name, opts.timeout)?;
        Ok(ClusterClient::connect(&cluster, opts)?.follow(reg))
    }

    /// Keeps `registry` (the one the map was read from): a down server's
    /// descriptor is read there again before each reconnect, so a server
    /// that comes back at another address is found.
    pub fn follow(mut self, registry: Registry) -> ClusterClient {
        self.m.registry = Some(registry);
        self
    }

    /// The number of servers, up or down.
    pub fn size(&self) -> u32 {
        self.m.size()
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.m.cluster
    }

    /// The server that owns `key`.
    #[inline]
    pub fn server_of(&self, key: &[u8]) -> u32 {
        fabrickv_cluster::server_of_key(key, self.m.size())
    }

    /// Whether server `id` is connected now (a down one is tried again by
    /// the next call that needs it).
    pub fn is_up(&self, id: u32) -> bool {
        self.m.is_up(id as usize)
    }

    /// The address the client uses for server `id`, if it has one.
    pub fn addr(&self, id: u32) -> Option<&str> {
        self.m.addr(id as usize)
    }

    /// The connection to server `id` (connecting if it is down), for calls
    /// that address one server.
    pub fn server(&mut self, id: u32) -> Result<&mut Client> {
        self.check_id(id)?;
        self.m.ensure(id as usize)
    }

    fn check_id(&self, id: u32) -> Result<()> {
        if id >= self.m.size() {
            return Err(ClientError::Invalid(
                fabrickv_types::ErrorCode::Malformed,
                format!("server {id} of a {}-server cluster", self.m.size()),
            ));
        }
        Ok(())
    }

    /// Runs any mix of operations across the cluster; one outcome per
    /// operation, in order. Per-operation errors are outcomes, not `Err`.
    /// Every server the batch touches is connected before any part is
    /// sent, so a batch needing a down server fails before it changes
    /// anything; a server failing mid-batch fails it (the parts already
    /// applied elsewhere stay applied).
    pub fn execute(&mut self, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>> {
        batch::validate(ops)?;
        let n = self.m.size();
        if n == 1 {
            // One server: the plain client's path, with no split.
            let c = self.m.ensure(0)?;
            return batch::execute_valid(c, ops).map_err(|e| self.m.fail(0, e));
        }
        // Each key is hashed once: the hash picks the server here and the
        // worker inside it.
        let hashes: Vec<KeyHash> = ops.iter().map(|o| KeyHash::of(o.key())).collect();
        let mut parts: Vec<Vec<usize>> = vec![Vec::new(); n as usize];
        for (i, h) in hashes.iter().enumerate() {
            parts[server_of_hash(h.0, n) as usize].push(i);
        }
        let mut out: Vec<Option<Outcome>> = vec![None; ops.len()];
        loop {
            self.round(ops, &parts, &hashes, &mut out)?;
            // GETs that did not fit their reply frame go again.
            for p in &mut parts {
                p.retain(|&i| batch::is_reply_full(&out[i]));
            }
            if parts.iter().all(Vec::is_empty) {
                return batch::finish(out);
            }
        }
    }

    /// One round of a split batch: connect every server with a part,
    /// post every part, then collect every part by one deadline.
    fn round(
        &mut self,
        ops: &[BatchOp<'_>],
        parts: &[Vec<usize>],
        hashes: &[KeyHash],
        out: &mut [Option<Outcome>],
    ) -> Result<()> {
        for (s, p) in parts.iter().enumerate() {
            if !p.is_empty() {
                self.m.ensure(s)?;
            }
        }
        let mut first_err = None;
        let mut pending = Vec::with_capacity(parts.len());
        for (s, p) in parts.iter().enumerate() {
            if p.is_empty() {
                continue;
            }
            let posted = self
                .m
                .conn(s)
                .and_then(|c| batch::post(c, ops, p.iter().copied(), Some(hashes)));
            match posted {
                Ok(pend) => pending.push((s, pend)),
                Err(e) => {
                    let e = self.m.fail(s, e);
                    first_err.get_or_insert(e);
                }
            }
        }
        let deadline = Instant::now() + self.m.timeout;
        for (s, pend) in pending {
            let got = self
                .m
                .conn(s)
                .and_then(|c| batch::collect(c, pend, deadline, out));
            if let Err(e) = got {
                // Its connection may still have replies in flight.
                let e = self.m.fail(s, e);
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
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
        };
        let e = ClusterClient::connect(&cluster, opts).expect_err("no shm address");
        assert_eq!(e.code(), ErrorCode::Unavailable);
    }
}
