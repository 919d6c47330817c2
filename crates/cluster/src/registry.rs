//! The memcached registry: servers publish their descriptors there under a
//! cluster name, clients read them, and processes meet at named barriers.
//!
//! Keys (all under `fabrickv/CLUSTER/`):
//! - `size`: the cluster's server count, written by every server (they
//!   must agree; a server that disagrees refuses to start);
//! - `server/ID`: the server's [`ServerDesc`] as JSON;
//! - `barrier/NAME`: the count of processes that reached the barrier.
//!
//! A server's keys expire [`REGISTRATION_TTL_S`] seconds after its last
//! refresh, so a server that dies without deregistering disappears on its
//! own; a live one rewrites them every third of that.
//!
//! Anyone who reaches memcached can write there, so with a cluster secret
//! the `size` and `server/ID` values carry a MAC: `VALUE\nmac:HEX`, where
//! HEX is [`Secret::mac`] under [`REGISTRY_MAC_CONTEXT`] of the key, a 0
//! byte and the value. A reader holding the secret ignores (and logs) a
//! value whose MAC is wrong or missing, as if the key were absent; one
//! without the secret reads the value and ignores the MAC. Whatever is
//! stored under one server's key (junk, a forgery) costs only that slot:
//! the other servers are read as usual.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fabrickv_auth::Secret;
use memcache::MemcacheError;

use crate::{check_name, Cluster, ServerDesc, CLUSTER_SERVERS_MAX};

/// Seconds a registration lives without a refresh.
pub const REGISTRATION_TTL_S: u32 = 10;

/// Seconds a barrier's counter lives in memcached; a barrier name can be
/// used again once it has expired.
pub const BARRIER_TTL_S: u32 = 3600;

/// Longest wait between two polls of a cluster that is not complete yet,
/// in milliseconds. Polls start at 1 ms and double.
pub const POLL_INTERVAL_MAX_MS: u64 = 20;

/// Longest wait between two polls of a barrier's count, in milliseconds:
/// waiters are released within about this long of the last arrival. A
/// poll is one memcached GET, so even a hundred waiters cost memcached
/// little; a benchmark's clients start within a few milliseconds.
pub const BARRIER_POLL_MAX_MS: u64 = 2;

/// Timeout of one memcached request, in milliseconds.
pub const REGISTRY_IO_TIMEOUT_MS: u64 = 2_000;

/// Largest descriptor a server may publish, in bytes (memcached's default
/// item limit is 1 MiB; descriptors are a few hundred bytes).
pub const DESC_BYTES_MAX: usize = 64 * 1024;

pub use crate::mac::REGISTRY_MAC_CONTEXT;

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry address is neither `memcached://HOST:PORT` nor
    /// `etcd://HOST:PORT[,...]`.
    #[error("invalid registry address {0:?}: expected memcached://HOST:PORT or etcd://HOST:PORT[,HOST:PORT...]")]
    Address(String),
    /// A name or size breaks a rule.
    #[error("{0}")]
    Invalid(String),
    /// memcached could not be reached or answered an error.
    #[error("registry {addr}: {source}")]
    Memcached {
        /// The registry's address.
        addr: String,
        /// What went wrong.
        source: MemcacheError,
    },
    /// etcd could not be reached or answered an error.
    #[error("registry {addr}: {source}")]
    Etcd {
        /// The registry's address.
        addr: String,
        /// What went wrong.
        source: etcd_client::Error,
    },
    /// What was stored there is not what a FabricKV server writes.
    #[error("registry {addr}: key {key}: {why}")]
    Corrupt {
        /// The registry's address.
        addr: String,
        /// The key.
        key: String,
        /// Why it could not be read.
        why: String,
    },
    /// The wait ran out.
    #[error("{0}")]
    Timeout(String),
}

/// A connection to the registry for one cluster. Clones share the
/// connection (requests on it take turns).
#[derive(Clone)]
pub struct Registry {
    addr: String,
    cluster: String,
    mc: memcache::Client,
    /// The cluster secret: MACs what this handle writes and checks what
    /// it reads; `None` writes bare values and trusts what it reads.
    secret: Option<Secret>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("addr", &self.addr)
            .field("cluster", &self.cluster)
            .field("authenticated", &self.secret.is_some())
            .finish()
    }
}

impl Registry {
    /// Connects to `memcached://HOST:PORT` for cluster `cluster`, with the
    /// process's cluster secret ([`fabrickv_auth::client_secret`]: the
    /// CLI's `--auth-token-file` or the environment), if any; a server
    /// sets its own with [`Registry::with_secret`].
    pub fn connect(url: &str, cluster: &str) -> Result<Registry, RegistryError> {
        check_name("cluster", cluster).map_err(RegistryError::Invalid)?;
        let hostport = url
            .strip_prefix("memcached://")
            .filter(|h| !h.is_empty() && !h.contains('/') && !h.contains('?'))
            .ok_or_else(|| RegistryError::Address(url.to_string()))?;
        let io = Duration::from_millis(REGISTRY_IO_TIMEOUT_MS);
        let mc = memcache::Client::builder()
            .add_server(format!(
                "memcache://{hostport}?protocol=ascii&tcp_nodelay=true"
            ))
            .and_then(|b| {
                b.with_max_pool_size(1)
                    .with_connection_timeout(io)
                    .with_read_timeout(io)
                    .with_write_timeout(io)
                    .build()
            })
            .map_err(|source| RegistryError::Memcached {
                addr: url.to_string(),
                source,
            })?;
        let secret =
            fabrickv_auth::client_secret().map_err(|e| RegistryError::Invalid(e.to_string()))?;
        Ok(Registry {
            addr: url.to_string(),
            cluster: cluster.to_string(),
            mc,
            secret,
        })
    }

    /// The same registry, MACing and checking its entries with `secret`
    /// (`None`: neither) instead of the process's.
    pub fn with_secret(mut self, secret: Option<Secret>) -> Registry {
        self.secret = secret;
        self
    }

    /// `value` as stored under `key`: with its MAC when there is a secret.
    fn seal(&self, key: &str, value: &str) -> String {
        crate::mac::seal(self.secret.as_ref(), key, value)
    }

    /// The value stored under `key`, if it is one to trust
    /// ([`crate::mac::open`]).
    fn open<'a>(&self, key: &str, raw: &'a [u8]) -> Option<&'a str> {
        crate::mac::open(self.secret.as_ref(), &self.addr, key, raw)
    }

    /// The cluster this registry handle reads and writes.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    fn key(&self, rest: &str) -> String {
        format!("fabrickv/{}/{rest}", self.cluster)
    }

    fn mc_err(&self, source: MemcacheError) -> RegistryError {
        RegistryError::Memcached {
            addr: self.addr.clone(),
            source,
        }
    }

    fn get_string(&self, key: &str) -> Result<Option<String>, RegistryError> {
        self.mc.get::<String>(key).map_err(|e| self.mc_err(e))
    }

    /// The cluster size servers published, if any has. A size that is not
    /// one (junk, or a MAC that fails) counts as none published, so that
    /// a server starting next overwrites it instead of refusing to start.
    pub fn size(&self) -> Result<Option<u32>, RegistryError> {
        let key = self.key("size");
        let raw = self.mc.get::<Vec<u8>>(&key).map_err(|e| self.mc_err(e))?;
        let Some(raw) = raw else {
            return Ok(None);
        };
        let Some(s) = self.open(&key, &raw) else {
            return Ok(None);
        };
        match s.trim().parse::<u32>() {
            Ok(n) if (1..=CLUSTER_SERVERS_MAX).contains(&n) => Ok(Some(n)),
            _ => {
                tracing::warn!(
                    "registry {}: key {key} holds {} bytes that are not a cluster size; ignored",
                    self.addr,
                    s.len()
                );
                Ok(None)
            }
        }
    }

    /// Writes the server's descriptor and the cluster size, both expiring
    /// after `ttl_s` seconds. Fails if the registry already holds a
    /// different size for this cluster.
    pub fn publish(&self, size: u32, desc: &ServerDesc, ttl_s: u32) -> Result<(), RegistryError> {
        if size == 0 || size > CLUSTER_SERVERS_MAX || desc.id >= size {
            return Err(RegistryError::Invalid(format!(
                "server id {} of a {size}-server cluster (ids are 0..size, size 1..={CLUSTER_SERVERS_MAX})",
                desc.id
            )));
        }
        if let Some(have) = self.size()? {
            if have != size {
                return Err(RegistryError::Invalid(format!(
                    "cluster {} is registered with {have} servers, not {size}",
                    self.cluster
                )));
            }
        }
        let json =
            serde_json::to_string(desc).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        if json.len() > DESC_BYTES_MAX {
            return Err(RegistryError::Invalid(format!(
                "descriptor of {} bytes exceeds {DESC_BYTES_MAX}",
                json.len()
            )));
        }
        let size_key = self.key("size");
        self.mc
            .set(
                &size_key,
                self.seal(&size_key, &size.to_string()).as_str(),
                ttl_s,
            )
            .map_err(|e| self.mc_err(e))?;
        let key = self.key(&format!("server/{}", desc.id));
        self.mc
            .set(&key, self.seal(&key, &json).as_str(), ttl_s)
            .map_err(|e| self.mc_err(e))
    }

    /// Removes a server's descriptor (its orderly exit).
    pub fn unpublish(&self, id: u32) -> Result<(), RegistryError> {
        self.mc
            .delete(&self.key(&format!("server/{id}")))
            .map(|_| ())
            .map_err(|e| self.mc_err(e))
    }

    /// Reads the cluster as registered now: `None` if no server has
    /// published a size; servers not registered are `None` slots, and so
    /// are those whose entry cannot be trusted or read (logged): one bad
    /// entry must not hide the live servers beside it.
    pub fn read(&self) -> Result<Option<Cluster>, RegistryError> {
        let Some(size) = self.size()? else {
            return Ok(None);
        };
        let keys: Vec<String> = (0..size)
            .map(|i| self.key(&format!("server/{i}")))
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        // As bytes: a value that is not UTF-8 would fail the whole
        // multi-get if read as text.
        let mut found = self.mc.gets::<Vec<u8>>(&refs).map_err(|e| self.mc_err(e))?;
        let mut servers = Vec::with_capacity(size as usize);
        for (i, key) in keys.iter().enumerate() {
            servers.push(found.remove(key).and_then(|raw| {
                let json = self.open(key, &raw)?;
                self.parse_desc(key, i as u32, json)
                    .map_err(|e| tracing::warn!("{e}; ignored"))
                    .ok()
            }));
        }
        Ok(Some(Cluster {
            name: self.cluster.clone(),
            servers,
        }))
    }

    /// Reads one server's descriptor: `None` if it is not registered or
    /// its entry fails its MAC (logged); an entry that passes but is not a
    /// descriptor is an error.
    pub fn server(&self, id: u32) -> Result<Option<ServerDesc>, RegistryError> {
        let key = self.key(&format!("server/{id}"));
        let raw = self.mc.get::<Vec<u8>>(&key).map_err(|e| self.mc_err(e))?;
        match raw.as_deref().and_then(|r| self.open(&key, r)) {
            None => Ok(None),
            Some(json) => self.parse_desc(&key, id, json).map(Some),
        }
    }

    /// A descriptor read from `key`, which must be server `id`'s.
    fn parse_desc(&self, key: &str, id: u32, json: &str) -> Result<ServerDesc, RegistryError> {
        let corrupt = |why: String| RegistryError::Corrupt {
            addr: self.addr.clone(),
            key: key.to_string(),
            why,
        };
        let d: ServerDesc = serde_json::from_str(json).map_err(|e| corrupt(e.to_string()))?;
        if d.id != id {
            return Err(corrupt(format!("holds server id {}", d.id)));
        }
        Ok(d)
    }

    /// Reads the cluster, waiting up to `wait` for it to appear and, when
    /// `all` is set, for every server to be registered. Returns what is
    /// registered at the deadline if some servers are still missing (their
    /// slots are `None`); fails only if no server has registered at all.
    pub fn lookup(&self, wait: Duration, all: bool) -> Result<Cluster, RegistryError> {
        let deadline = Instant::now() + wait;
        let mut pause = Duration::from_millis(1);
        loop {
            let now = self.read()?;
            let done = match &now {
                Some(c) => !all || c.missing().is_empty(),
                None => false,
            };
            if done || Instant::now() >= deadline {
                return now.ok_or_else(|| {
                    RegistryError::Timeout(format!(
                        "no server of cluster {} is registered at {} (waited {:.1} s)",
                        self.cluster,
                        self.addr,
                        wait.as_secs_f64()
                    ))
                });
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_millis(POLL_INTERVAL_MAX_MS));
        }
    }

    /// Waits until `count` processes (this one included) have reached the
    /// barrier `name`, or `timeout` passes. Each call counts one arrival;
    /// a name serves one rendezvous until it expires ([`BARRIER_TTL_S`]).
    /// Returns this process's arrival order, from 1.
    pub fn barrier(&self, name: &str, count: u64, timeout: Duration) -> Result<u64, RegistryError> {
        check_name("barrier", name).map_err(RegistryError::Invalid)?;
        if count == 0 {
            return Err(RegistryError::Invalid(
                "a barrier needs a count of at least 1".into(),
            ));
        }
        let key = self.key(&format!("barrier/{name}"));
        // `add` creates the counter only if absent; losing that race to
        // another process is expected.
        match self.mc.add(&key, "0", BARRIER_TTL_S) {
            Ok(()) | Err(MemcacheError::CommandError(memcache::CommandError::KeyExists)) => {}
            Err(e) => return Err(self.mc_err(e)),
        }
        let me = self.mc.increment(&key, 1).map_err(|e| self.mc_err(e))?;
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(1);
        let mut arrived = me;
        while arrived < count {
            if Instant::now() >= deadline {
                return Err(RegistryError::Timeout(format!(
                    "barrier {name} of cluster {}: {arrived} of {count} arrived within {:.1} s",
                    self.cluster,
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_millis(BARRIER_POLL_MAX_MS));
            arrived = match self.get_string(&key)? {
                Some(v) => v.trim().parse().map_err(|_| RegistryError::Corrupt {
                    addr: self.addr.clone(),
                    key: key.clone(),
                    why: format!("{v:?} is not a count"),
                })?,
                None => {
                    return Err(RegistryError::Invalid(format!(
                        "barrier {name} of cluster {} vanished (memcached restarted or evicted it)",
                        self.cluster
                    )))
                }
            };
        }
        Ok(me)
    }
}

/// A server's live registration: refreshes its descriptor every third of
/// the TTL on a thread of its own and removes it when dropped.
pub struct Registration {
    stop: Arc<(Mutex<bool>, Condvar)>,
    failing: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Registration {
    /// Publishes `desc` as server `desc.id` of a `size`-server cluster and
    /// keeps it published.
    pub fn start(
        registry: Registry,
        size: u32,
        desc: ServerDesc,
        ttl_s: u32,
    ) -> Result<Registration, RegistryError> {
        if ttl_s == 0 {
            return Err(RegistryError::Invalid(
                "registration TTL must be at least 1 s".into(),
            ));
        }
        registry.publish(size, &desc, ttl_s)?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let failing = Arc::new(AtomicBool::new(false));
        let period = Duration::from_millis(u64::from(ttl_s) * 1000 / 3);
        let thread = {
            let stop = stop.clone();
            let failing = failing.clone();
            std::thread::Builder::new()
                .name("fkv-registry".into())
                .spawn(move || refresh(registry, size, desc, ttl_s, period, &stop, &failing))
                .map_err(|e| RegistryError::Invalid(format!("cannot start a thread: {e}")))?
        };
        Ok(Registration {
            stop,
            failing,
            thread: Some(thread),
        })
    }

    /// Whether the last refresh failed (the registry is unreachable).
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }
}

fn refresh(
    registry: Registry,
    size: u32,
    desc: ServerDesc,
    ttl_s: u32,
    period: Duration,
    stop: &(Mutex<bool>, Condvar),
    failing: &AtomicBool,
) {
    let (lock, cv) = stop;
    let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let (guard, _) = cv
            .wait_timeout_while(stopped, period, |s| !*s)
            .unwrap_or_else(|p| p.into_inner());
        stopped = guard;
        if *stopped {
            break;
        }
        match registry.publish(size, &desc, ttl_s) {
            Ok(()) => {
                if failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("registry {}: registration refreshed again", registry.addr);
                }
            }
            Err(e) => {
                if !failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!("cannot refresh the registration: {e}");
                }
            }
        }
    }
    drop(stopped);
    if let Err(e) = registry.unpublish(desc.id) {
        tracing::warn!("cannot remove the registration: {e}");
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
