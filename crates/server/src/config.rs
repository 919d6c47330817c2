//! Server configuration: defaults, TOML file, validation.
//!
//! Precedence: built-in defaults, then the TOML file, then command-line
//! flags (the CLI applies flags on top of what [`ServerConfig::from_toml`]
//! returns).

use serde::Deserialize;

use fabrickv_types::cpus::parse_cpu_list;
use fabrickv_types::limits::{PARTITIONS_MAX, PARTITIONS_PER_WORKER_DEFAULT, WORKERS_MAX};
use fabrickv_types::size::parse_size;

/// The native protocol's default port (Redis's 6379, plus 1000).
pub const DEFAULT_PORT: u16 = 7379;

/// Where a server listens unless told otherwise: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7379";

/// The Redis-compatible front-end's documented port (Redis's own 6379,
/// plus 1000, as the native port is). It is off unless `--resp` is given.
pub const DEFAULT_RESP_PORT: u16 = 7380;

/// Longest RESP password accepted in a configuration, in bytes.
pub const RESP_PASSWORD_BYTES_MAX: usize = 512;

/// The environment variable that holds the RESP password itself (the
/// other way to give it than `--resp-password-file`; never a flag value,
/// which every user of the host can read in `/proc/PID/cmdline`).
pub const ENV_RESP_PASSWORD: &str = "FABRICKV_RESP_PASSWORD";

/// A RESP password: its `Debug` never shows it, so a configuration can
/// be logged whole.
#[derive(Clone, PartialEq, Eq)]
pub struct RespPassword(String);

impl std::fmt::Debug for RespPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RespPassword(<redacted>)")
    }
}

impl std::ops::Deref for RespPassword {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<String> for RespPassword {
    fn from(s: String) -> RespPassword {
        RespPassword(s)
    }
}

impl From<&str> for RespPassword {
    fn from(s: &str) -> RespPassword {
        RespPassword(s.to_string())
    }
}

/// Reads the RESP password from `path`: the file's text, less one trailing
/// line end (as `echo` leaves it). A file open to group or others is
/// refused as the cluster secret's is ([`fabrickv_auth::open_secret_file`]).
pub fn read_resp_password(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let mut text = String::new();
    let file = match fabrickv_auth::open_secret_file(path) {
        Ok(f) => Ok(f),
        Err(fabrickv_auth::AuthError::Read { source, .. }) => Err(source),
        Err(e) => return Err(e.to_string()),
    };
    file.and_then(|f| {
        // One more byte than allowed, and a line end, tell a password
        // over the bound from one at it.
        f.take(RESP_PASSWORD_BYTES_MAX as u64 + 3)
            .read_to_string(&mut text)
    })
    .map_err(|e| format!("cannot read the RESP password file {}: {e}", path.display()))?;
    if let Some(rest) = text.strip_suffix('\n') {
        let rest = rest.strip_suffix('\r').unwrap_or(rest);
        text.truncate(rest.len());
    }
    Ok(text)
}

/// Default engine memory over all workers, in bytes (1 GiB). Pages are
/// touched only as data arrives, so an idle server uses little of it.
pub const DEFAULT_MEMORY_BYTES: u64 = 1 << 30;

/// The default `--maxmemory-clients` is `--memory` divided by this: what
/// RESP and memcache connections buffer (queued transactions, grown
/// input, unwritten output) stays a
/// fraction of the data it serves.
pub const MAXMEMORY_CLIENTS_DEFAULT_DIVISOR: u64 = 4;

/// Least default `--maxmemory-clients`, in bytes (256 MiB): several
/// maximal transactions (`TXN_QUEUED_BYTES_MAX`, 64 MiB) fit even beside a
/// small `--memory`, so the cap closes a hog, not a client with one big
/// MULTI.
pub const MAXMEMORY_CLIENTS_DEFAULT_BYTES_MIN: u64 = 256 << 20;

/// Least engine memory per partition, in bytes.
pub const MEMORY_PER_PARTITION_BYTES_MIN: u64 = 1 << 20;

/// Least engine memory per partition the default partition count leaves,
/// in bytes (32 MiB): a partition's pages are a sixteenth of its pool, so
/// one of 16 MiB or more holds the largest value (`VALUE_BYTES_MAX`) in
/// either mode; 8 MiB ones hold values up to 512 KiB only.
pub const MEMORY_PER_PARTITION_DEFAULT_BYTES_MIN: u64 = 32 << 20;

/// What the engine does when memory is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Lossy cache: a circular log that evicts the oldest items.
    Cache,
    /// Lossless store: a full store refuses writes with INSUFFICIENT_SPACE.
    #[default]
    Store,
}

impl From<Mode> for fabrickv_engine::Mode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Cache => fabrickv_engine::Mode::Cache,
            Mode::Store => fabrickv_engine::Mode::Store,
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "cache" => Ok(Mode::Cache),
            "store" => Ok(Mode::Store),
            _ => Err(format!("unknown mode {s:?}: expected cache or store")),
        }
    }
}

/// How long a native connection (tcp, shm, fabric) may sit silent with
/// nothing in flight before the server closes it, in seconds, unless
/// configured; 0 is never. Off by default, as Redis's and memcached's:
/// the kv and shard clients dial again before their next request when the
/// server closed a quiet connection, but the PS and KV-cache clients hold
/// memory registered with their connection and do not yet, so a default
/// timeout would break every such client idle that long. Idle sockets
/// cannot lock clients out without one: at `CONNECTIONS_MAX` the
/// longest-idle connection makes way for a newcomer.
pub const NATIVE_IDLE_TIMEOUT_SECS: u64 = 0;

/// Longest idle timeout accepted, in seconds (30 days); 0 turns it off.
pub const IDLE_TIMEOUT_SECS_MAX: u64 = 30 * 24 * 3600;

/// Longest a reply holding large values may wait to be written, from when
/// it was queued, in milliseconds, before the connection is closed (the
/// default of `ServerConfig::resp_large_reply_ms`, which tests shorten):
/// the reply holds the store's buffer, which counts in the large budget while held (once
/// the key is rewritten), so a client that stops reading must not hold it
/// forever. 60 s writes a maximal 512 MiB value at under 9 MB/s, as the
/// native `KV_LARGE_PIN_MS`. Redis has no such bound (its
/// `client-output-buffer-limit` for normal clients is off by default).
pub const RESP_LARGE_REPLY_MS: u64 = 60_000;

/// Everything a server needs to start.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Transport address to listen on (`HOST:PORT`, `tcp://`, `inproc://`).
    pub listen: String,
    /// Data-path worker threads; `None` means one per core.
    pub workers: Option<usize>,
    /// Engine partitions, each a whole engine with its share of memory
    /// (`--partitions`); `None` gives `PARTITIONS_PER_WORKER_DEFAULT` per
    /// worker, fewer when memory is short ([`ServerConfig::partitions`]).
    /// Keys map to partitions by this count alone, never by the workers.
    pub partitions: Option<usize>,
    /// CPUs the workers are pinned to: worker `i` runs on
    /// `worker_cpus[i % len]`; empty leaves them to the scheduler. Pinned,
    /// a worker keeps its caches and its clients can sit beside it (a
    /// shm client thread on its worker's CPU reads pulled values from
    /// that core's cache, not across cores).
    pub worker_cpus: Vec<usize>,
    /// Cache or store.
    pub mode: Mode,
    /// Engine memory over all workers, in bytes.
    pub memory_bytes: u64,
    /// Budget of large values (over 1 MiB, kept outside the engine's
    /// pools, see `fabrickv_engine::LargeValue`) over all workers, in
    /// bytes, split evenly like `memory_bytes` (`--large-memory`); `None`
    /// gives them as much as `memory_bytes` again.
    pub large_memory_bytes: Option<u64>,
    /// Log filter (`error`, `warn`, `info`, `debug`, `trace`, or a
    /// `tracing` directive).
    pub log_level: String,
    /// Where the Redis-compatible (RESP) front-end listens (`HOST:PORT`,
    /// TCP); `None` leaves it off.
    pub resp: Option<String>,
    /// Password RESP clients must give with AUTH before any other command
    /// (Redis's `requirepass`); `None` lets every client in (or, with a
    /// cluster secret, asks for that).
    pub resp_password: Option<RespPassword>,
    /// The embedding parameter server: pool size, DRAM knobs, tables.
    pub ps: crate::ps::PsConfig,
    /// The KV-cache service: pool, eviction, gRPC control plane.
    pub cache: crate::cache::CacheSettings,
    /// Persistent shards to serve (`--shard NAME=PATH`).
    pub shards: Vec<crate::shard::ShardSpec>,
    /// The cluster secret every front end asks of its clients; `None`
    /// lets every client in, which [`ServerConfig::validate`] allows only
    /// on loopback or with `insecure`.
    pub auth: Option<fabrickv_auth::Secret>,
    /// Serve beyond loopback without a secret (`--insecure`): the
    /// operator says the network itself is trusted.
    pub insecure: bool,
    /// shm: users (uids) besides the server's own whose processes may
    /// connect (`--shm-allow-uid`).
    pub shm_allow_uids: Vec<u32>,
    /// Seconds a native connection may stay silent with nothing in flight
    /// before it is closed (`--idle-timeout`); 0 keeps idle connections.
    /// The RESP front end has its own, [`ServerConfig::resp_idle_timeout_secs`].
    pub idle_timeout_secs: u64,
    /// Seconds a RESP connection may stay silent with no command pending
    /// before it is closed (`--resp-idle-timeout`, Redis's `timeout`);
    /// 0, the default as in Redis, keeps idle connections.
    pub resp_idle_timeout_secs: u64,
    /// Cap on what every RESP and memcache connection together buffer, in
    /// bytes (`--maxmemory-clients`, Redis's `maxmemory-clients`): past
    /// it the connection using the most is closed. `None`: the default
    /// ([`ServerConfig::maxmemory_clients`]); `Some(0)`: no cap.
    pub maxmemory_clients_bytes: Option<u64>,
    /// Longest a RESP reply holding large values may wait to be written
    /// before its connection is closed, in ms (`RESP_LARGE_REPLY_MS`; 0:
    /// never). Not a flag: tests shorten it.
    pub resp_large_reply_ms: u64,
    /// Where the memcached-compatible front end listens (`HOST:PORT`,
    /// TCP); `None` leaves it off. memcached's text protocol has no
    /// authentication, so beyond loopback it needs `insecure` even when a
    /// cluster secret is set (see `validate`).
    pub memcache: Option<String>,
    /// Seconds a memcache connection may stay silent with no command
    /// pending before it is closed (`--memcache-idle-timeout`,
    /// memcached's `idle_timeout`); 0, the default, keeps them.
    pub memcache_idle_timeout_secs: u64,
    /// Whether the memcache front end also listens, on a port of its own
    /// (port 0 on its host), for commands other servers of an etcd
    /// cluster forward to it; `serve --registry etcd://...` sets it. Not
    /// a file setting: it follows from joining a cluster.
    pub memcache_forwarding: bool,
    /// Checkpoints: where saves go, how often, how many are kept, and
    /// what is loaded at start.
    pub checkpoint: CheckpointSettings,
}

/// `serve`'s checkpoint flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointSettings {
    /// `--checkpoint-dir`: where SAVE, BGSAVE, `checkpoint save` and the
    /// timer write (the only directory, with those inside it, a client
    /// may name); at start, its newest good checkpoint is loaded.
    pub dir: Option<std::path::PathBuf>,
    /// `--checkpoint-every`: seconds between saves (needs a dir).
    pub every_secs: Option<u64>,
    /// `--checkpoint-keep`: checkpoints kept after a save (0: all).
    pub keep: usize,
    /// `--restore`: a checkpoint (or a directory of them, the newest
    /// taken) that must load before the server listens.
    pub restore: Option<std::path::PathBuf>,
    /// `--checkpoint-cache`: saves hold the KV cache too (a checkpoint
    /// that holds it is restored either way).
    pub cache: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: DEFAULT_LISTEN.to_string(),
            workers: None,
            partitions: None,
            worker_cpus: Vec::new(),
            mode: Mode::Store,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            large_memory_bytes: None,
            log_level: "info".to_string(),
            resp: None,
            resp_password: None,
            ps: crate::ps::PsConfig::default(),
            cache: crate::cache::CacheSettings::default(),
            shards: Vec::new(),
            auth: None,
            insecure: false,
            shm_allow_uids: Vec::new(),
            idle_timeout_secs: NATIVE_IDLE_TIMEOUT_SECS,
            resp_idle_timeout_secs: 0,
            maxmemory_clients_bytes: None,
            resp_large_reply_ms: RESP_LARGE_REPLY_MS,
            memcache: None,
            memcache_idle_timeout_secs: 0,
            memcache_forwarding: false,
            checkpoint: CheckpointSettings {
                keep: crate::checkpoint::CHECKPOINT_KEEP_DEFAULT,
                ..CheckpointSettings::default()
            },
        }
    }
}

/// The TOML file's shape; every key is optional.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    workers: Option<usize>,
    partitions: Option<usize>,
    /// CPU list in `taskset -c` syntax (`"0-3"`).
    worker_cpus: Option<String>,
    mode: Option<Mode>,
    memory: Option<String>,
    /// Budget of values over 1 MiB (`4GB`).
    large_memory: Option<String>,
    log_level: Option<String>,
    resp: Option<String>,
    /// A file that holds the RESP password (never the password itself,
    /// for the same reason as `auth_token_file`).
    resp_password_file: Option<std::path::PathBuf>,
    /// Embedding tables created at start, as `NAME:DIM[:KEY=VALUE...]`.
    tables: Option<Vec<String>>,
    /// Embedding pool size (`4GB`).
    dram_pool: Option<String>,
    dram_skip_mlock: Option<bool>,
    dram_skip_memset: Option<bool>,
    dram_skip_populate: Option<bool>,
    dram_hugepages: Option<bool>,
    /// Persistent shards served, as `NAME=PATH`.
    shards: Option<Vec<String>>,
    /// A file that holds the cluster secret (never the secret itself: a
    /// configuration file is shared and copied more than a secret should).
    auth_token_file: Option<std::path::PathBuf>,
    insecure: Option<bool>,
    shm_allow_uids: Option<Vec<u32>>,
    /// Seconds before a silent native connection is closed; 0 is never.
    idle_timeout: Option<u64>,
    /// Seconds before a silent RESP connection is closed; 0 is never.
    resp_idle_timeout: Option<u64>,
    /// Cap on what RESP and memcache connections buffer (`1GB`; `0`: none).
    maxmemory_clients: Option<String>,
    /// Where the memcache front end listens.
    memcache: Option<String>,
    /// Seconds before a silent memcache connection is closed; 0 is never.
    memcache_idle_timeout: Option<u64>,
}

impl ServerConfig {
    /// Parses a TOML configuration on top of the defaults.
    pub fn from_toml(text: &str) -> Result<ServerConfig, String> {
        let f: FileConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut c = ServerConfig::default();
        if let Some(v) = f.listen {
            c.listen = v;
        }
        if f.workers.is_some() {
            c.workers = f.workers;
        }
        if f.partitions.is_some() {
            c.partitions = f.partitions;
        }
        if let Some(v) = f.worker_cpus {
            c.worker_cpus = parse_cpu_list(&v)?;
        }
        if let Some(v) = f.mode {
            c.mode = v;
        }
        if let Some(v) = f.memory {
            c.memory_bytes = parse_size(&v).map_err(|e| e.to_string())?;
        }
        if let Some(v) = f.large_memory {
            c.large_memory_bytes = Some(parse_size(&v).map_err(|e| e.to_string())?);
        }
        if let Some(v) = f.maxmemory_clients {
            c.maxmemory_clients_bytes = Some(parse_size(&v).map_err(|e| e.to_string())?);
        }
        if let Some(v) = f.log_level {
            c.log_level = v;
        }
        c.resp = f.resp;
        if let Some(path) = f.resp_password_file {
            c.resp_password = Some(read_resp_password(&path)?.into());
        }
        for t in f.tables.unwrap_or_default() {
            c.ps.tables.push(fabrickv_wire::ps::TableSpec::parse(&t)?);
        }
        if let Some(v) = f.dram_pool {
            c.ps.pool_bytes = parse_size(&v).map_err(|e| e.to_string())?;
        }
        let pool = &mut c.ps.pool;
        pool.lock &= !f.dram_skip_mlock.unwrap_or(false);
        pool.zero &= !f.dram_skip_memset.unwrap_or(false);
        pool.populate &= !f.dram_skip_populate.unwrap_or(false);
        pool.hugepages |= f.dram_hugepages.unwrap_or(false);
        for spec in f.shards.unwrap_or_default() {
            c.shards.push(spec.parse()?);
        }
        if let Some(path) = f.auth_token_file {
            c.auth = Some(fabrickv_auth::Secret::from_file(&path).map_err(|e| e.to_string())?);
        }
        c.insecure = f.insecure.unwrap_or(false);
        c.shm_allow_uids = f.shm_allow_uids.unwrap_or_default();
        if let Some(v) = f.idle_timeout {
            c.idle_timeout_secs = v;
        }
        if let Some(v) = f.resp_idle_timeout {
            c.resp_idle_timeout_secs = v;
        }
        c.memcache = f.memcache;
        if let Some(v) = f.memcache_idle_timeout {
            c.memcache_idle_timeout_secs = v;
        }
        Ok(c)
    }

    /// The native ports' idle timeout; `None` when turned off.
    pub fn idle_timeout(&self) -> Option<std::time::Duration> {
        (self.idle_timeout_secs > 0).then(|| std::time::Duration::from_secs(self.idle_timeout_secs))
    }

    /// The RESP front end's idle timeout; `None` when turned off.
    pub fn resp_idle_timeout(&self) -> Option<std::time::Duration> {
        (self.resp_idle_timeout_secs > 0)
            .then(|| std::time::Duration::from_secs(self.resp_idle_timeout_secs))
    }

    /// The cap on what RESP and memcache connections buffer, in bytes (0:
    /// none): `--maxmemory-clients`, by default `--memory /
    /// MAXMEMORY_CLIENTS_DEFAULT_DIVISOR` and at least
    /// [`MAXMEMORY_CLIENTS_DEFAULT_BYTES_MIN`].
    pub fn maxmemory_clients(&self) -> u64 {
        self.maxmemory_clients_bytes.unwrap_or_else(|| {
            (self.memory_bytes / MAXMEMORY_CLIENTS_DEFAULT_DIVISOR)
                .max(MAXMEMORY_CLIENTS_DEFAULT_BYTES_MIN)
        })
    }

    /// The memcache front end's idle timeout; `None` when turned off.
    pub fn memcache_idle_timeout(&self) -> Option<std::time::Duration> {
        (self.memcache_idle_timeout_secs > 0)
            .then(|| std::time::Duration::from_secs(self.memcache_idle_timeout_secs))
    }

    /// Workers to run: the configured count, or one per core.
    pub fn workers(&self) -> usize {
        self.workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .min(WORKERS_MAX)
    }

    /// Partitions to build: the configured count, or
    /// `PARTITIONS_PER_WORKER_DEFAULT` per worker, lowered (to a smaller
    /// multiple of the workers, at least one each) while a partition would
    /// get less than `MEMORY_PER_PARTITION_DEFAULT_BYTES_MIN`.
    pub fn partitions(&self) -> usize {
        if let Some(p) = self.partitions {
            return p.min(PARTITIONS_MAX);
        }
        let w = self.workers() as u64;
        let fit = self.memory_bytes / (w * MEMORY_PER_PARTITION_DEFAULT_BYTES_MIN).max(1);
        let per = fit.clamp(1, PARTITIONS_PER_WORKER_DEFAULT as u64);
        (w * per).min(PARTITIONS_MAX as u64) as usize
    }

    /// Checks every bound; the message says which and why.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(w) = self.workers {
            if w == 0 || w > WORKERS_MAX {
                return Err(format!("workers must be 1..={WORKERS_MAX}, not {w}"));
            }
        }
        if let Some(p) = self.partitions {
            if p == 0 || p > PARTITIONS_MAX {
                return Err(format!("partitions must be 1..={PARTITIONS_MAX}, not {p}"));
            }
        }
        self.validate_worker_cpus()?;
        let per = self.memory_bytes / self.partitions() as u64;
        if per < MEMORY_PER_PARTITION_BYTES_MIN {
            return Err(format!(
                "memory {} leaves {} per partition ({} partitions over {} workers); each \
                 partition needs at least {}",
                fabrickv_types::size::format_size(self.memory_bytes),
                fabrickv_types::size::format_size(per),
                self.partitions(),
                self.workers(),
                fabrickv_types::size::format_size(MEMORY_PER_PARTITION_BYTES_MIN),
            ));
        }
        if let Some(p) = &self.resp_password {
            if p.is_empty() || p.len() > RESP_PASSWORD_BYTES_MAX {
                return Err(format!(
                    "resp password must be 1..={RESP_PASSWORD_BYTES_MAX} bytes, not {}",
                    p.len()
                ));
            }
        }
        for (what, secs) in [
            ("idle timeout", self.idle_timeout_secs),
            ("resp idle timeout", self.resp_idle_timeout_secs),
            ("memcache idle timeout", self.memcache_idle_timeout_secs),
        ] {
            if secs > IDLE_TIMEOUT_SECS_MAX {
                return Err(format!(
                    "{what} must be 0 (off) or 1..={IDLE_TIMEOUT_SECS_MAX} seconds, not {secs}"
                ));
            }
        }
        crate::shard::ShardSpec::validate_all(&self.shards)?;
        self.validate_exposure()?;
        crate::ps::PsStore::validate(&self.ps, self.workers())
    }

    /// The TCP addresses this configuration listens on, each with the
    /// front end it serves: the native listener (tcp, or the rendezvous
    /// of fabric), RESP, and the gRPC control plane. shm and inproc reach
    /// only this host and are left out.
    pub fn tcp_listeners(&self) -> Vec<(&'static str, &str)> {
        let mut out = Vec::new();
        let native = match self.listen.split_once("://") {
            None => Some(self.listen.as_str()),
            Some(("tcp", rest)) => Some(rest),
            // fabric://PROVIDER/HOST:PORT: the rendezvous listens on HOST.
            Some(("fabric", rest)) => rest.rsplit_once('/').map(|(_, host)| host),
            Some(_) => None,
        };
        out.extend(native.map(|a| ("the native listener", a)));
        out.extend(self.resp.as_deref().map(|a| ("the RESP front end", a)));
        out.extend(
            self.memcache
                .as_deref()
                .map(|a| ("the memcache front end", a)),
        );
        out.extend(
            self.cache
                .grpc
                .as_deref()
                .map(|a| ("the gRPC control plane", a)),
        );
        out
    }

    /// A listener beyond loopback needs a secret, or `insecure`: anyone
    /// who can reach the port could otherwise read and write everything.
    fn validate_exposure(&self) -> Result<(), String> {
        // memcached's text protocol has no AUTH: a secret cannot guard it.
        if let Some(addr) = &self.memcache {
            if !self.insecure && !fabrickv_auth::is_loopback_addr(addr) {
                return Err(format!(
                    "the memcache front end would listen on {addr}, beyond this host; \
                     memcached's protocol has no authentication, so no secret can guard it: \
                     listen on loopback, or pass --insecure to let anyone who reaches the port in"
                ));
            }
        }
        if self.auth.is_some() || self.insecure {
            return Ok(());
        }
        match self
            .tcp_listeners()
            .into_iter()
            .find(|(_, a)| !fabrickv_auth::is_loopback_addr(a))
        {
            Some((what, addr)) => Err(format!(
                "{what} would listen on {addr}, beyond this host, with no secret: \
                 write a secret to a file only you can read and pass --auth-token-file FILE \
                 (or set {}), or pass --insecure to let anyone who reaches the port in",
                fabrickv_auth::ENV_TOKEN
            )),
            None => Ok(()),
        }
    }

    /// Every CPU of `worker_cpus` must be one this process may run on
    /// (its affinity mask, as `taskset` or a cgroup left it): pinning to
    /// another would fail in the worker, after the server had started.
    fn validate_worker_cpus(&self) -> Result<(), String> {
        if self.worker_cpus.is_empty() {
            return Ok(());
        }
        let allowed: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .iter()
            .map(|c| c.id)
            .collect();
        match self.worker_cpus.iter().find(|c| !allowed.contains(c)) {
            Some(c) => Err(format!(
                "worker_cpus names CPU {c}, which this process may not run on (allowed: {allowed:?})"
            )),
            None => Ok(()),
        }
    }

    /// The CPU worker `id` is pinned to, if any.
    pub fn worker_cpu(&self, id: usize) -> Option<usize> {
        (!self.worker_cpus.is_empty()).then(|| self.worker_cpus[id % self.worker_cpus.len()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_overrides_defaults() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pw = dir.path().join("resp-password");
        std::fs::write(&pw, "pw\n").expect("write password");
        std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        let c = ServerConfig::from_toml(&format!(
            "listen = \"127.0.0.1:9000\"\nworkers = 3\nmode = \"cache\"\nmemory = \"64MB\"\nresp = \"127.0.0.1:7380\"\nresp_password_file = {:?}\n",
            pw.display().to_string()
        ))
        .expect("valid config");
        assert_eq!(c.listen, "127.0.0.1:9000");
        assert_eq!(c.workers(), 3);
        assert_eq!(c.mode, Mode::Cache);
        assert_eq!(c.memory_bytes, 64 << 20);
        assert_eq!(c.log_level, "info");
        assert_eq!(c.resp.as_deref(), Some("127.0.0.1:7380"));
        assert_eq!(c.resp_password.as_deref(), Some("pw"));
        assert_eq!(ServerConfig::default().resp, None, "RESP is off by default");
    }

    #[test]
    fn the_resp_password_is_never_written_in_the_config_itself() {
        let e = ServerConfig::from_toml("resp_password = \"pw\"\n").expect_err("refused");
        assert!(e.contains("resp_password"), "{e}");
    }

    #[test]
    fn worker_cpus_pin_round_robin_and_must_be_ours() {
        let c = ServerConfig::from_toml("workers = 3\nworker_cpus = \"0\"\n").expect("valid");
        assert_eq!(c.worker_cpus, vec![0]);
        assert_eq!((c.worker_cpu(0), c.worker_cpu(2)), (Some(0), Some(0)));
        assert_eq!(
            ServerConfig::default().worker_cpu(0),
            None,
            "unpinned by default"
        );
        let ours = core_affinity::get_core_ids().expect("affinity")[0].id;
        let c = ServerConfig {
            worker_cpus: vec![ours],
            ..ServerConfig::default()
        };
        assert!(c.validate().is_ok());
        let c = ServerConfig {
            worker_cpus: vec![fabrickv_types::cpus::CPU_ID_MAX],
            ..ServerConfig::default()
        };
        let e = c.validate().expect_err("a CPU this process may not use");
        assert!(e.contains("CPU 8191"), "{e}");
        assert!(ServerConfig::from_toml("worker_cpus = \"2-1\"").is_err());
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        assert!(ServerConfig::from_toml("lisen = \"x\"").is_err());
        assert!(ServerConfig::from_toml("mode = \"lossy\"").is_err());
        assert!(ServerConfig::from_toml("memory = \"lots\"").is_err());
    }

    #[test]
    fn validates_bounds() {
        let mut c = ServerConfig {
            workers: Some(0),
            ..ServerConfig::default()
        };
        assert!(c.validate().is_err());
        c.workers = Some(4);
        c.memory_bytes = 1 << 20;
        assert!(c
            .validate()
            .expect_err("too little memory")
            .contains("per partition"));
        c.memory_bytes = 64 << 20;
        assert!(c.validate().is_ok());
        assert_eq!(c.partitions(), 4, "one per worker when memory is short");
        c.memory_bytes = 256 << 20;
        assert_eq!(c.partitions(), 8, "two per worker: 32 MiB each");
        c.memory_bytes = 1 << 30;
        assert_eq!(c.partitions(), 16, "four per worker by default");
        c.partitions = Some(0);
        assert!(c.validate().is_err());
        c.partitions = Some(PARTITIONS_MAX + 1);
        assert!(c.validate().is_err());
        c.partitions = Some(8);
        assert!(c.validate().is_ok());
        c.resp_password = Some(String::new().into());
        assert!(c.validate().is_err(), "an empty password is refused");
    }

    #[test]
    fn a_listener_beyond_loopback_needs_a_secret_or_insecure() {
        let open = |listen: &str, resp: Option<&str>, grpc: Option<&str>| {
            let mut c = ServerConfig {
                listen: listen.to_string(),
                resp: resp.map(str::to_string),
                ..ServerConfig::default()
            };
            c.cache.grpc = grpc.map(str::to_string);
            c
        };
        for (listen, resp, grpc) in [
            ("127.0.0.1:0", None, None),
            ("tcp://[::1]:0", Some("127.0.0.1:0"), Some("[::1]:50051")),
            ("fabric://shm/127.0.0.1:0", None, None),
            ("shm://name", None, None),
        ] {
            let c = open(listen, resp, grpc);
            assert!(c.validate().is_ok(), "{listen} {resp:?} {grpc:?}");
        }
        for (listen, resp, grpc, named) in [
            ("0.0.0.0:7379", None, None, "native listener"),
            (
                "fabric://tcp;ofi_rxm/10.0.0.1:7",
                None,
                None,
                "native listener",
            ),
            ("127.0.0.1:0", Some("0.0.0.0:7380"), None, "RESP"),
            ("127.0.0.1:0", None, Some("[::]:50051"), "gRPC"),
        ] {
            let mut c = open(listen, resp, grpc);
            let e = c.validate().expect_err("exposed without a secret");
            assert!(
                e.contains(named) && e.contains("--auth-token-file") && e.contains("--insecure"),
                "{e}"
            );
            c.insecure = true;
            assert!(c.validate().is_ok(), "--insecure lets it start");
            c.insecure = false;
            c.auth =
                Some(fabrickv_auth::Secret::from_bytes(b"0123456789abcdef", "t").expect("secret"));
            assert!(c.validate().is_ok(), "a secret lets it start");
        }
    }

    #[test]
    fn toml_names_a_secret_file_never_the_secret() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "a long enough secret\n").expect("write");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        let c = ServerConfig::from_toml(&format!(
            "listen = \"0.0.0.0:0\"\nauth_token_file = {:?}\n",
            path.display().to_string()
        ))
        .expect("valid");
        assert!(c
            .auth
            .as_ref()
            .is_some_and(|s| s.matches(b"a long enough secret")));
        assert!(c.validate().is_ok());
        assert!(
            ServerConfig::from_toml("auth_token = \"x\"").is_err(),
            "no inline secret"
        );
        let e = ServerConfig::from_toml("auth_token_file = \"/nonexistent/token\"")
            .expect_err("missing");
        assert!(e.contains("/nonexistent/token"), "{e}");
    }

    #[test]
    fn memcache_is_off_by_default_and_stays_on_loopback_without_insecure() {
        assert_eq!(ServerConfig::default().memcache, None);
        let mut c =
            ServerConfig::from_toml("memcache = \"127.0.0.1:11211\"\nmemcache_idle_timeout = 9\n")
                .expect("toml");
        assert_eq!(c.memcache.as_deref(), Some("127.0.0.1:11211"));
        assert_eq!(
            c.memcache_idle_timeout(),
            Some(std::time::Duration::from_secs(9))
        );
        assert!(c.validate().is_ok());
        c.memcache = Some("0.0.0.0:11211".into());
        let e = c.validate().expect_err("refused beyond loopback");
        assert!(e.contains("memcache") && e.contains("--insecure"), "{e}");
        // A secret does not help: the protocol cannot ask for it.
        c.auth = Some(
            fabrickv_auth::Secret::from_bytes(b"0123456789abcdef0123456789abcdef", "test")
                .expect("secret"),
        );
        assert!(c.validate().is_err());
        c.insecure = true;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn idle_timeout_defaults_on_reads_from_toml_and_is_bounded() {
        let c = ServerConfig::default();
        assert_eq!(c.idle_timeout(), None, "off by default");
        let off = ServerConfig::from_toml("idle_timeout = 0").expect("toml");
        assert_eq!(off.idle_timeout(), None);
        assert!(off.validate().is_ok());
        let mut c = ServerConfig::from_toml("idle_timeout = 7").expect("toml");
        assert_eq!(c.idle_timeout_secs, 7);
        assert_eq!(c.resp_idle_timeout(), None, "RESP: off by default");
        let r = ServerConfig::from_toml("resp_idle_timeout = 9").expect("toml");
        assert_eq!(
            r.resp_idle_timeout(),
            Some(std::time::Duration::from_secs(9))
        );
        c.resp_idle_timeout_secs = IDLE_TIMEOUT_SECS_MAX + 1;
        assert!(c.validate().expect_err("too long").contains("resp idle"));
        c.resp_idle_timeout_secs = 0;
        c.idle_timeout_secs = IDLE_TIMEOUT_SECS_MAX + 1;
        assert!(c.validate().expect_err("too long").contains("idle timeout"));
    }

    #[test]
    fn a_config_logged_whole_shows_no_password() {
        let c = ServerConfig {
            resp_password: Some("hunter2-the-password".into()),
            auth: fabrickv_auth::Secret::from_bytes(b"the cluster secret here", "t").ok(),
            ..ServerConfig::default()
        };
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("cluster secret"),
            "{shown}"
        );
        assert_eq!(c.resp_password.as_deref(), Some("hunter2-the-password"));
    }
}
