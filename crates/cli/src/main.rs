//! `fabrickv`: one binary that serves, talks to a server, and (with the
//! `bench` feature, on by default) benchmarks.
//!
//! Exit codes of the client commands: 0 success; 1 the key (or one of the
//! keys) is not there; 2 any other failure, with the reason on stderr.

#[cfg(feature = "bench")]
mod bench;
mod checkpoint_cmd;
mod cluster_cmd;
mod cluster_moves;
mod copy_cmd;
mod partitions_cmd;
mod ps_cmd;
mod shard_cmd;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use fabrickv_client::{Client, Kv};
use fabrickv_server::{Mode, Server, ServerConfig, DEFAULT_LISTEN};
use fabrickv_types::size::parse_size;

#[derive(Parser)]
#[command(
    name = "fabrickv",
    version,
    about = "FabricKV: a partitioned in-memory key-value system"
)]
struct Cli {
    /// File holding the cluster secret (chmod 600). A server asks every
    /// client for it; a client proves it. Without this flag the secret
    /// comes from FABRICKV_AUTH_TOKEN, or none is used. Never pass the
    /// secret itself on a command line: any user can read it there.
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "FABRICKV_AUTH_TOKEN_FILE"
    )]
    auth_token_file: Option<std::path::PathBuf>,
    /// Use a secret file (--auth-token-file, --resp-password-file) that
    /// group or others may read, as a container's secret mount often is;
    /// without it such a file is refused, as ssh refuses such a key.
    #[arg(
        long,
        global = true,
        env = "FABRICKV_ALLOW_OPEN_SECRET_FILE",
        value_parser = clap::builder::BoolishValueParser::new(),
        action = clap::ArgAction::SetTrue
    )]
    allow_open_secret_file: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct ServerArg {
    /// Server address (HOST:PORT or tcp://HOST:PORT).
    #[arg(long, short = 's', default_value = DEFAULT_LISTEN, env = "FABRICKV_SERVER")]
    server: String,
    /// Per-call timeout in seconds.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
}

/// Where a key-value command goes: the server `--server` names, or the
/// cluster `--cluster-config` or `--registry` names.
#[derive(clap::Args, Clone)]
struct Target {
    #[command(flatten)]
    server: ServerArg,
    #[command(flatten)]
    cluster: cluster_cmd::ClusterSource,
    /// In a cluster keeping several copies of each slot (etcd,
    /// `--replicas` 2 or 3), let reads go to any in-sync copy of the key's
    /// slot, not only its primary: for reads that accept staleness.
    #[arg(long)]
    read_from_replica: bool,
}

/// The embedding pool's DRAM knobs (PetPS's PETPS_DRAM_* variables).
#[derive(clap::Args, Clone, Default)]
struct DramArgs {
    /// Embedding pool size in GB (GiB), shared by every table; built when
    /// the first table is created.
    #[arg(long, env = "FABRICKV_DRAM_POOL_GB", value_name = "GB")]
    dram_pool_gb: Option<f64>,
    /// Do not mlock the pool (needed where RLIMIT_MEMLOCK is small).
    #[arg(long, env = "FABRICKV_DRAM_SKIP_MLOCK", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    dram_skip_mlock: bool,
    /// Do not write zeros over the pool at creation.
    #[arg(long, env = "FABRICKV_DRAM_SKIP_MEMSET", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    dram_skip_memset: bool,
    /// Do not fault the pool in at creation (MAP_POPULATE).
    #[arg(long, env = "FABRICKV_DRAM_SKIP_POPULATE", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    dram_skip_populate: bool,
    /// Back the pool with 2 MiB huge pages (reserve them in /proc/sys/vm/nr_hugepages).
    #[arg(long, env = "FABRICKV_DRAM_HUGEPAGES", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    dram_hugepages: bool,
}

impl DramArgs {
    /// Applies the knobs given on top of `ps`.
    fn apply(&self, ps: &mut fabrickv_server::ps::PsConfig) -> Result<(), String> {
        if let Some(gb) = self.dram_pool_gb {
            if !(gb.is_finite() && gb > 0.0) {
                return Err(format!(
                    "--dram-pool-gb must be a positive number, not {gb}"
                ));
            }
            ps.pool_bytes = (gb * (1u64 << 30) as f64) as u64;
        }
        ps.pool.lock &= !self.dram_skip_mlock;
        ps.pool.zero &= !self.dram_skip_memset;
        ps.pool.populate &= !self.dram_skip_populate;
        ps.pool.hugepages |= self.dram_hugepages;
        Ok(())
    }
}

/// KV-cache service settings of `serve`.
#[derive(clap::Args)]
struct CacheArgs {
    /// gRPC control plane of the KV cache: an address, or `off`. The
    /// address, the default one too, must bind: a server whose address
    /// another process holds refuses to start (run several servers on one
    /// host with `--grpc off` or a port each).
    #[arg(long, env = "FABRICKV_GRPC", value_name = "ADDR")]
    grpc: Option<String>,
    /// KV-cache pool size, e.g. 1GB (default) or 512MB.
    #[arg(long, env = "FABRICKV_CACHE_MEMORY", value_name = "SIZE")]
    cache_memory: Option<String>,
    /// Refuse puts when the cache pool is full (INSUFFICIENT_SPACE)
    /// instead of evicting least recently used values.
    #[arg(long, env = "FABRICKV_CACHE_NO_EVICT", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    cache_no_evict: bool,
    /// Fraction of the cache pool above which puts first evict (0.9).
    #[arg(long, value_name = "F")]
    cache_high_watermark: Option<f64>,
    /// Fraction of the cache pool eviction frees down to (0.8).
    #[arg(long, value_name = "F")]
    cache_low_watermark: Option<f64>,
    /// Fault the cache pool's pages in at start.
    #[arg(long, env = "FABRICKV_CACHE_POPULATE", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    cache_populate: bool,
}

/// Default gRPC address of the KV-cache control plane (the Rust KV-cache
/// server's gRPC default).
const DEFAULT_GRPC: &str = "[::1]:50051";

impl CacheArgs {
    fn apply(self, c: &mut fabrickv_server::cache::CacheSettings) -> Result<(), String> {
        match self.grpc.as_deref() {
            Some("off") => c.grpc = None,
            Some(a) => c.grpc = Some(a.to_string()),
            None => c.grpc = Some(DEFAULT_GRPC.to_string()),
        }
        if let Some(v) = self.cache_memory {
            c.store.pool_bytes = parse_size(&v).map_err(|e| e.to_string())? as usize;
        }
        c.store.evict &= !self.cache_no_evict;
        if let Some(h) = self.cache_high_watermark {
            c.store.high_watermark = h;
        }
        if let Some(l) = self.cache_low_watermark {
            c.store.low_watermark = l;
        }
        c.store.populate |= self.cache_populate;
        c.store.validate().map_err(|e| format!("cache: {e}"))
    }
}

/// `serve`'s checkpoint flags.
#[derive(clap::Args)]
struct CheckpointArgs {
    /// Directory of checkpoints: SAVE, BGSAVE, `fabrickv checkpoint save`
    /// and --checkpoint-every write under it, and the server loads its
    /// newest good checkpoint at start. Clients may name only it or
    /// directories inside it.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Save a checkpoint this often while serving (e.g. 30s, 15m, 1h;
    /// needs --checkpoint-dir).
    #[arg(long, value_name = "DURATION")]
    checkpoint_every: Option<String>,
    /// Checkpoints kept under --checkpoint-dir after each save; 0 keeps all.
    #[arg(long, value_name = "N", default_value_t = fabrickv_server::checkpoint::CHECKPOINT_KEEP_DEFAULT)]
    checkpoint_keep: usize,
    /// Load this checkpoint (or the newest in this directory of them)
    /// before listening; the start fails if it cannot be loaded whole.
    #[arg(long, value_name = "DIR")]
    restore: Option<std::path::PathBuf>,
    /// Checkpoints hold the KV cache too (its blocks can be far larger
    /// than the keyspace; without this a save leaves the cache out).
    #[arg(long)]
    checkpoint_cache: bool,
}

impl CheckpointArgs {
    fn apply(self, c: &mut fabrickv_server::config::CheckpointSettings) -> Result<(), String> {
        c.dir = self.checkpoint_dir.or(c.dir.take());
        c.keep = self.checkpoint_keep;
        c.restore = self.restore.or(c.restore.take());
        c.cache |= self.checkpoint_cache;
        if let Some(v) = self.checkpoint_every {
            let secs = parse_duration_secs(&v)?;
            if c.dir.is_none() {
                return Err("--checkpoint-every needs --checkpoint-dir".into());
            }
            c.every_secs = Some(secs);
        }
        Ok(())
    }
}

/// Seconds in `30s`, `15m`, `2h` or a bare number of seconds (at least 1).
fn parse_duration_secs(v: &str) -> Result<u64, String> {
    let v = v.trim();
    let (num, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{v:?} is not a duration (e.g. 30s, 15m, 1h)"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(format!("{v:?} is not a duration (e.g. 30s, 15m, 1h)")),
    };
    match n.checked_mul(mult) {
        Some(s) if s > 0 => Ok(s),
        _ => Err(format!("{v:?}: a duration from 1s up")),
    }
}

// Parsed once at start; the size of the serve variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Runs a server (defaults: 127.0.0.1:7379, one worker per core, store mode, 1GB).
    Serve {
        /// TOML configuration file; flags override it.
        #[arg(long, short = 'c')]
        config: Option<std::path::PathBuf>,
        /// Address to listen on: HOST:PORT for tcp, a name for shm, or a
        /// full address with its scheme (tcp://, shm://, fabric://P/HOST:PORT).
        #[arg(long)]
        listen: Option<String>,
        /// Transport for a --listen without a scheme: tcp, shm or fabric.
        #[arg(long, default_value = "tcp")]
        transport: String,
        /// libfabric provider for --transport fabric (tcp;ofi_rxm, shm, udp;ofi_rxd, verbs, efa).
        #[arg(long, default_value = "tcp;ofi_rxm")]
        provider: String,
        /// Data-path worker threads (default: one per core).
        #[arg(long)]
        workers: Option<usize>,
        /// Engine partitions, each with its share of --memory; keys map to
        /// partitions, partitions to workers by a table that can change
        /// at run time (default: 4 per worker, fewer if memory is short).
        #[arg(long)]
        partitions: Option<usize>,
        /// Pin worker i to the i-th CPU of this list (taskset syntax, e.g.
        /// 0-3; round robin when workers outnumber it). Unpinned by default.
        #[arg(long, value_name = "LIST", env = "FABRICKV_WORKER_CPUS")]
        worker_cpus: Option<String>,
        /// cache (evicts oldest when full) or store (refuses writes when full).
        #[arg(long)]
        mode: Option<Mode>,
        /// Engine memory over all workers, e.g. 512MB or 4GB.
        #[arg(long)]
        memory: Option<String>,
        /// Budget of values over 1 MiB (up to 512 MiB each, set over RESP),
        /// kept outside the engine's pools, over all workers, e.g. 8GB.
        /// Default: as much as --memory.
        #[arg(long, value_name = "SIZE")]
        large_memory: Option<String>,
        /// Log level: error, warn, info, debug, trace.
        #[arg(long)]
        log_level: Option<String>,
        /// Also serve the Redis protocol (RESP2) on this TCP address, e.g.
        /// 127.0.0.1:7380 (off by default; 7380 is the documented port).
        #[arg(long, value_name = "ADDR")]
        resp: Option<String>,
        /// A file holding the password RESP clients must AUTH with
        /// (Redis's requirepass; FABRICKV_RESP_PASSWORD holds it instead).
        /// Without one, AUTH takes the cluster secret. Never the password
        /// itself on the command line, where every user can read it.
        #[arg(long, value_name = "FILE")]
        resp_password_file: Option<std::path::PathBuf>,
        /// Close a native (tcp, shm, fabric) connection silent this many
        /// seconds with no request in flight; 0 never does [default: 0].
        #[arg(long, value_name = "SECS")]
        idle_timeout: Option<u64>,
        /// Close a RESP connection silent this many seconds with no
        /// command pending, as Redis's `timeout`; 0 never does [default: 0].
        #[arg(long, value_name = "SECS")]
        resp_idle_timeout: Option<u64>,
        /// Cap on what RESP and memcache connections buffer together
        /// (queued MULTI commands, grown input, unwritten output), as
        /// Redis's maxmemory-clients: past it
        /// the connection using the most is closed. 0: no cap [default:
        /// --memory / 4, at least 256MB].
        #[arg(long, value_name = "SIZE")]
        maxmemory_clients: Option<String>,
        /// Also serve memcached's text and meta protocol on this TCP
        /// address, e.g. 127.0.0.1:11211 (off by default). It has no
        /// authentication: beyond loopback it needs --insecure, secret or
        /// not (see docs/memcache.md).
        #[arg(long, value_name = "ADDR")]
        memcache: Option<String>,
        /// Close a memcache connection silent this many seconds with no
        /// command pending; 0 never does [default: 0].
        #[arg(long, value_name = "SECS")]
        memcache_idle_timeout: Option<u64>,
        /// Embedding tables to create at start:
        /// NAME:DIM[:optimizer=sgd|adagrad][:lr=F][:missing=zeros|init][:seed=N].
        #[arg(long = "table", value_name = "SPEC")]
        tables: Vec<String>,
        /// A persistent shard to serve, as NAME=PATH (repeatable); the
        /// directory is created when missing. Writes are durable when
        /// acknowledged; RESP clients reach shard n with SELECT n.
        #[arg(long = "shard", value_name = "NAME=PATH")]
        shards: Vec<String>,
        #[command(flatten)]
        dram: DramArgs,
        #[command(flatten)]
        cache: CacheArgs,
        #[command(flatten)]
        checkpoints: CheckpointArgs,
        /// Listen beyond loopback without a secret: anyone who reaches a
        /// port can read and write everything. Only for a network that is
        /// itself trusted.
        #[arg(long)]
        insecure: bool,
        /// Let processes of this user (uid) connect over shm too
        /// (repeatable); by default only the server's own user may.
        #[arg(long = "shm-allow-uid", value_name = "UID")]
        shm_allow_uids: Vec<u32>,
        #[command(flatten)]
        cluster: cluster_cmd::ServeClusterArgs,
    },
    /// Stores a value.
    Put {
        key: String,
        value: String,
        /// Expire after this many seconds.
        #[arg(long)]
        ttl: Option<f64>,
        #[command(flatten)]
        to: Target,
    },
    /// Stores many values: KEY VALUE [KEY VALUE ...].
    Mset {
        #[arg(required = true, num_args = 2.., value_name = "KEY VALUE")]
        pairs: Vec<String>,
        /// Expire after this many seconds.
        #[arg(long)]
        ttl: Option<f64>,
        #[command(flatten)]
        to: Target,
    },
    /// Prints a value to stdout: its raw bytes to a pipe or file, with a
    /// line end on a terminal; exits 1 if the key is absent.
    Get {
        key: String,
        #[command(flatten)]
        to: Target,
    },
    /// Removes a key; exits 1 if it was absent.
    Del {
        key: String,
        #[command(flatten)]
        to: Target,
    },
    /// Prints one line per key: its value, or (nil); exits 1 if any is absent.
    Mget {
        #[arg(required = true)]
        keys: Vec<String>,
        #[command(flatten)]
        to: Target,
    },
    /// Prints the server's counters, summed over its workers (per server
    /// for a cluster).
    Stats {
        #[command(flatten)]
        to: Target,
    },
    /// The partition table: show which worker serves each partition, or
    /// move one to another worker while the server serves.
    Partitions {
        #[command(subcommand)]
        which: partitions_cmd::PartitionsCommand,
    },
    /// Checkpoints: have a running server save its memory while it
    /// serves (under its --checkpoint-dir), or show how saves went.
    Checkpoint {
        #[command(subcommand)]
        which: checkpoint_cmd::CheckpointCommand,
    },
    /// Embedding tables: create, list, preload (and check), pull.
    Ps {
        #[command(subcommand)]
        which: ps_cmd::PsCommand,
    },
    /// Persistent shards: generate one, print its digest.
    Shard {
        #[command(subcommand)]
        which: shard_cmd::ShardCommand,
    },
    /// Pulls a shard from a server into a directory: checkpointed,
    /// parallel ranges, verified, resumable.
    Copy(copy_cmd::CopyArgs),
    /// Waits until COUNT processes reach the named barrier in the
    /// registry (as PetPS's processes meet); prints this one's arrival order.
    Barrier(cluster_cmd::BarrierArgs),
    /// Cluster membership: show the servers of a registry or static file.
    Cluster {
        #[command(subcommand)]
        which: cluster_cmd::ClusterCommand,
    },
    /// Benchmarks (see `fabrickv bench --help`).
    #[cfg(feature = "bench")]
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
}

fn main() -> ExitCode {
    install_transports();
    let cli = Cli::parse();
    if !hosts_servers(&cli.command) {
        stop_quietly_on_closed_output();
    }
    fabrickv_auth::set_allow_open_secret_files(cli.allow_open_secret_file);
    let secret = match fabrickv_auth::Secret::resolve(cli.auth_token_file.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fabrickv: error: {e}");
            return ExitCode::from(2);
        }
    };
    // Every connection this process opens (a client command's, or a
    // server's own to its peers) proves this secret.
    fabrickv_auth::set_client_secret(secret.clone());
    match run(cli.command, secret) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("fabrickv: error: {msg}");
            ExitCode::from(2)
        }
    }
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// A progress bar on stderr, `what` then the bar then `counts` (an
/// indicatif template of the figures after it); hidden when `quiet`.
fn progress_bar(len: u64, what: &str, quiet: bool, counts: &str) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(&format!("{{msg}} [{{bar:40}}] {counts}"))
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    b.set_style(style);
    b.set_message(what.to_string());
    b.enable_steady_tick(Duration::from_millis(200));
    b
}

/// The per-call timeout of a client command.
fn timeout_of(s: &ServerArg) -> Result<Duration, String> {
    if !(s.timeout.is_finite() && s.timeout > 0.0) {
        return Err(format!(
            "--timeout must be a positive number of seconds, not {}",
            s.timeout
        ));
    }
    Ok(Duration::from_secs_f64(s.timeout))
}

/// A `--ttl` in seconds as a duration; it must be positive.
fn ttl_of(ttl: Option<f64>) -> Result<Option<Duration>, String> {
    match ttl {
        Some(t) if t.is_finite() && t > 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(format!(
            "--ttl must be a positive number of seconds, not {t}"
        )),
        None => Ok(None),
    }
}

fn connect(s: &ServerArg) -> Result<Client, String> {
    Client::connect_with_timeout(&s.server, timeout_of(s)?)
        .map_err(|e| format!("cannot connect to {}: {e}", s.server))
}

fn run(cmd: Command, secret: Option<fabrickv_auth::Secret>) -> Result<ExitCode, String> {
    match cmd {
        Command::Serve {
            config,
            listen,
            transport,
            provider,
            workers,
            partitions,
            worker_cpus,
            mode,
            memory,
            large_memory,
            log_level,
            resp,
            resp_password_file,
            idle_timeout,
            resp_idle_timeout,
            maxmemory_clients,
            memcache,
            memcache_idle_timeout,
            tables,
            shards,
            dram,
            cache,
            checkpoints,
            insecure,
            shm_allow_uids,
            cluster,
        } => {
            let mut cfg = match config {
                Some(path) => {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                    ServerConfig::from_toml(&text)
                        .map_err(|e| format!("{}: {e}", path.display()))?
                }
                None => ServerConfig::default(),
            };
            if let Some(v) = listen {
                cfg.listen = v;
            }
            cfg.listen = with_scheme(&transport, &provider, &cfg.listen)?;
            if workers.is_some() {
                cfg.workers = workers;
            }
            if partitions.is_some() {
                cfg.partitions = partitions;
            }
            if let Some(v) = worker_cpus {
                cfg.worker_cpus = fabrickv_types::cpus::parse_cpu_list(&v)?;
            }
            if let Some(v) = mode {
                cfg.mode = v;
            }
            if let Some(v) = memory {
                cfg.memory_bytes = parse_size(&v).map_err(|e| e.to_string())?;
            }
            if let Some(v) = large_memory {
                cfg.large_memory_bytes = Some(parse_size(&v).map_err(|e| e.to_string())?);
            }
            if let Some(v) = log_level {
                cfg.log_level = v;
            }
            if resp.is_some() {
                cfg.resp = resp;
            }
            // The flag, then the environment, win over the file's
            // resp_password_file.
            if let Some(path) = &resp_password_file {
                cfg.resp_password = Some(fabrickv_server::config::read_resp_password(path)?.into());
            } else if let Ok(p) = std::env::var(fabrickv_server::config::ENV_RESP_PASSWORD) {
                cfg.resp_password = Some(p.into());
            }
            if let Some(v) = idle_timeout {
                cfg.idle_timeout_secs = v;
            }
            if let Some(v) = resp_idle_timeout {
                cfg.resp_idle_timeout_secs = v;
            }
            if let Some(v) = maxmemory_clients {
                cfg.maxmemory_clients_bytes = Some(parse_size(&v).map_err(|e| e.to_string())?);
            }
            if memcache.is_some() {
                cfg.memcache = memcache;
            }
            if let Some(v) = memcache_idle_timeout {
                cfg.memcache_idle_timeout_secs = v;
            }
            for t in &tables {
                cfg.ps.tables.push(fabrickv_client::TableSpec::parse(t)?);
            }
            for s in &shards {
                cfg.shards.push(s.parse()?);
            }
            dram.apply(&mut cfg.ps)?;
            cache.apply(&mut cfg.cache)?;
            checkpoints.apply(&mut cfg.checkpoint)?;
            // The flag or environment wins over the file's auth_token_file.
            if secret.is_some() {
                cfg.auth = secret;
            }
            cfg.insecure |= insecure;
            cfg.shm_allow_uids.extend(shm_allow_uids);
            // Only an etcd cluster's servers forward memcache commands.
            cfg.memcache_forwarding = cluster
                .registry
                .as_deref()
                .is_some_and(fabrickv_cluster::etcd::is_etcd_url);
            init_logging(&cfg.log_level);
            serve(&cfg, &cluster)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Put {
            key,
            value,
            ttl,
            to,
        } => {
            let ttl = ttl_of(ttl)?;
            cluster_cmd::Conn::open(&to)?
                .mput(&[(key.as_bytes(), value.as_bytes())], ttl)
                .map_err(|e| e.to_string())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Mset { pairs, ttl, to } => {
            if pairs.len() % 2 != 0 {
                return Err(format!(
                    "mset takes KEY VALUE pairs; {} words is not pairs",
                    pairs.len()
                ));
            }
            let ttl = ttl_of(ttl)?;
            let items: Vec<(&[u8], &[u8])> = pairs
                .chunks_exact(2)
                .map(|p| (p[0].as_bytes(), p[1].as_bytes()))
                .collect();
            cluster_cmd::Conn::open(&to)?
                .mput(&items, ttl)
                .map_err(|e| e.to_string())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Get { key, to } => match cluster_cmd::Conn::open(&to)?
            .mget(&[key.as_bytes()])
            .map_err(|e| e.to_string())?
            .pop()
            .flatten()
        {
            Some(v) => {
                let out = std::io::stdout();
                let tty = std::io::IsTerminal::is_terminal(&out);
                let mut out = out.lock();
                write_value(&mut out, &v, tty)
                    .and_then(|_| out.flush())
                    .map_err(|e| e.to_string())?;
                Ok(ExitCode::SUCCESS)
            }
            None => {
                eprintln!("fabrickv: key not found: {key}");
                Ok(ExitCode::from(1))
            }
        },
        Command::Del { key, to } => {
            if cluster_cmd::Conn::open(&to)?
                .mdelete(&[key.as_bytes()])
                .map_err(|e| e.to_string())?
                .pop()
                .unwrap_or(false)
            {
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("fabrickv: key not found: {key}");
                Ok(ExitCode::from(1))
            }
        }
        Command::Mget { keys, to } => {
            let values = cluster_cmd::Conn::open(&to)?
                .mget(&keys)
                .map_err(|e| e.to_string())?;
            let mut out = std::io::stdout().lock();
            let mut missing = 0;
            for v in &values {
                let r = match v {
                    Some(v) => out.write_all(v),
                    None => {
                        missing += 1;
                        out.write_all(b"(nil)")
                    }
                };
                r.and_then(|_| out.write_all(b"\n"))
                    .map_err(|e| e.to_string())?;
            }
            out.flush().map_err(|e| e.to_string())?;
            if missing > 0 {
                eprintln!("fabrickv: {missing} of {} keys not found", keys.len());
                return Ok(ExitCode::from(1));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Stats { to } => {
            cluster_cmd::Conn::open(&to)?.print_stats()?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Partitions { which } => partitions_cmd::run(which),
        Command::Checkpoint { which } => checkpoint_cmd::run(which),
        Command::Ps { which } => ps_cmd::run(which),
        Command::Shard { which } => shard_cmd::run(which),
        Command::Copy(args) => {
            init_logging("warn");
            copy_cmd::run(args)
        }
        Command::Barrier(a) => cluster_cmd::barrier(&a),
        Command::Cluster { which } => cluster_cmd::run(which),
        #[cfg(feature = "bench")]
        Command::Bench { which } => bench::run(which).map(|_| ExitCode::SUCCESS),
    }
}

/// Writes a value as `get` prints it: the raw bytes, then a line end
/// when `tty` (a terminal, as `redis-cli` does, so that the shell prompt
/// starts on a line of its own). A pipe or file gets the bytes exactly as
/// stored, so that `fabrickv get k > file` round-trips binary values.
fn write_value(out: &mut impl Write, value: &[u8], tty: bool) -> std::io::Result<()> {
    out.write_all(value)?;
    if tty {
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Whether `command` runs servers in this process (`serve`, and `bench`
/// with its in-process servers): those keep SIGPIPE ignored, see
/// [`stop_quietly_on_closed_output`].
fn hosts_servers(command: &Command) -> bool {
    match command {
        Command::Serve { .. } => true,
        #[cfg(feature = "bench")]
        Command::Bench { .. } => true,
        _ => false,
    }
}

/// Lets a client command die of SIGPIPE when its output is closed early,
/// as `cat` and `redis-cli` do (`fabrickv stats | head -1`).
///
/// Rust ignores SIGPIPE, so a write to a closed pipe fails with EPIPE and
/// `println!` panics on it (exit 101, a backtrace where RUST_BACKTRACE is
/// set); restoring the default disposition covers every subcommand and
/// every `println!` in the crates they call, with no writer to thread
/// through. `serve` and `bench` keep SIGPIPE ignored: a server must see
/// a peer that went away as an error on that one connection, never die
/// of it, and `bench` runs its servers in its own process (their
/// `splice` of large values into a socket has no flag to hold the signal
/// back). The sockets of the client commands raise no SIGPIPE: tcp
/// writes use `MSG_NOSIGNAL` (std's `TcpStream::write`, and
/// `fabrickv_transport::tcp::send_vectored` for gathered writes), and so
/// do shm control records (`ctl::send_with_fds`). The plain writes left
/// are the shm handshake's few bytes, which meet a closed socket only if
/// the peer went away in mid-handshake; a client command then ends by
/// SIGPIPE instead of with an error.
#[allow(unsafe_code)]
fn stop_quietly_on_closed_output() {
    // SAFETY: called from the main thread before any other thread starts;
    // SIG_DFL is a valid disposition for SIGPIPE and no Rust state depends
    // on the previous (ignoring) one.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Puts a transport scheme in front of an address that has none.
fn with_scheme(transport: &str, provider: &str, addr: &str) -> Result<String, String> {
    if addr.contains("://") {
        return Ok(addr.to_string());
    }
    match transport {
        "tcp" => Ok(addr.to_string()),
        "shm" => Ok(format!("shm://{addr}")),
        "fabric" => Ok(format!("fabric://{provider}/{addr}")),
        t => Err(format!(
            "unknown transport {t:?}: expected tcp, shm or fabric"
        )),
    }
}

/// Makes the transports of other crates reachable by address scheme.
pub fn install_transports() {
    fabrickv_transport_shm::install();
    #[cfg(feature = "fabric")]
    fabrickv_transport_fabric::install();
}

/// Puts `signals` back to their default action before we register ours.
///
/// signal-hook chains to whatever handler was installed before it, and a
/// library loaded with the binary may have installed one (libfabric's
/// constructor hooks SIGINT and SIGTERM and exits the process with status
/// 1 from them), which would cut the clean shutdown short.
#[allow(unsafe_code)]
fn restore_default_disposition(signals: &[i32]) {
    for &sig in signals {
        // SAFETY: called from the main thread before the server starts any
        // thread, with a valid signal number and the default disposition;
        // no Rust state depends on the previous handler.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// Serves until SIGINT or SIGTERM, then stops every thread cleanly.
fn serve(cfg: &ServerConfig, cluster: &cluster_cmd::ServeClusterArgs) -> Result<(), String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    restore_default_disposition(&[SIGINT, SIGTERM]);
    // Register before starting so that an early signal is not lost.
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(|e| e.to_string())?;
    let handle = Server::start(cfg).map_err(|e| e.to_string())?;
    // Registered before the banner, so that whoever waits for the banner
    // finds the server in the registry too.
    let registration = cluster.register(&handle, cfg.auth.clone())?;
    // Its own line, before the banner that scripts wait for, so that the
    // banner's format does not depend on whether gRPC is on.
    if let Some(g) = handle.grpc_addr() {
        eprintln!("fabrickv: gRPC (fabrickv.cache.v1.KvCache) on {g}");
    }
    if let Some(m) = handle.memcache_addr() {
        eprintln!("fabrickv: memcache on {m}");
    }
    match handle.resp_addr() {
        Some(r) => eprintln!(
            "fabrickv: serving on {}, RESP on {r} (Ctrl-C to stop)",
            handle.addr()
        ),
        None => eprintln!("fabrickv: serving on {} (Ctrl-C to stop)", handle.addr()),
    }
    if let Some(sig) = signals.forever().next() {
        tracing::info!("signal {sig}: shutting down");
    }
    // Leave the registry first, so that no client is sent here while the
    // server stops.
    drop(registration);
    handle.shutdown();
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn get_ends_a_value_with_a_line_only_on_a_terminal() {
        let mut out = Vec::new();
        write_value(&mut out, b"hello world", true).unwrap();
        assert_eq!(out, b"hello world\n");
        let mut out = Vec::new();
        write_value(&mut out, b"raw\x00bytes", false).unwrap();
        assert_eq!(
            out, b"raw\x00bytes",
            "a pipe or file gets the bytes as stored"
        );
    }
}
