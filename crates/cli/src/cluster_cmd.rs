//! Cluster membership from the command line: a server's registration
//! (`serve --registry`, memcached or etcd), `fabrickv barrier` and
//! `fabrickv cluster show`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fabrickv_client::Kv;
use fabrickv_cluster::etcd::{is_etcd_url, EtcdRegistration, EtcdRegistry, WatchHandle};
use fabrickv_cluster::registry::REGISTRATION_TTL_S;
use fabrickv_cluster::slots::SlotMap;
use fabrickv_cluster::{Cluster, Registration, Registry, ServerDesc};
use fabrickv_server::ServerHandle;

/// How `serve` joins a cluster through a registry.
#[derive(clap::Args, Clone, Default)]
pub struct ServeClusterArgs {
    /// Publish this server in a registry so clients find it by cluster
    /// name: memcached://HOST:PORT (single-copy clusters placed by jump
    /// hashing) or etcd://HOST:PORT[,HOST:PORT...] (a slot map of replica
    /// groups, which Redis cluster clients follow too).
    #[arg(long, env = "FABRICKV_REGISTRY", value_name = "URL")]
    pub registry: Option<String>,
    /// The cluster's name in the registry.
    #[arg(long, env = "FABRICKV_CLUSTER", default_value = "default")]
    pub cluster: String,
    /// This server's id, 0..cluster-size: the share of keys it owns. In
    /// an etcd cluster, an id past the map's size registers a server to
    /// be given slots by `fabrickv cluster add`.
    #[arg(long, value_name = "N")]
    pub id: Option<u32>,
    /// How many servers the cluster has (in etcd: how many the first
    /// map has; the cluster grows and shrinks from there).
    #[arg(long, value_name = "N")]
    pub cluster_size: Option<u32>,
    /// Seconds the registration outlives this server if it dies without
    /// deregistering (it is refreshed every third of this).
    #[arg(long, default_value_t = REGISTRATION_TTL_S, value_name = "S")]
    pub registry_ttl: u32,
    /// Copies of each slot an etcd cluster keeps (1 to 3): a primary and
    /// replicas - 1 backups that apply every write before it is
    /// acknowledged. Above 1 the cluster needs a failover controller
    /// (`fabrickv cluster controller`).
    #[arg(long, default_value_t = 1, value_name = "R")]
    pub replicas: u8,
    /// Where this server takes the writes its primaries replicate to it
    /// (TCP HOST:PORT; default: the --listen host, any free port).
    #[arg(long, value_name = "ADDR")]
    pub repl_listen: Option<String>,
    /// The CPUs slot moves run on: a primary streaming to a joiner, the
    /// joiner applying the stream, and the release of moved keys, so that
    /// a move takes at most those cores from serving. `auto`: the last
    /// CPU this process may use, when it may use two or more; `any`: no
    /// limit; or a list such as `3` or `2-3,6`.
    #[arg(long, default_value = "auto", value_name = "CPUS")]
    pub stream_cpus: String,
}

/// How long `serve` keeps trying to reach etcd and register there, in
/// milliseconds: a server started beside its etcd (one compose file, one
/// boot) waits for etcd to elect its leader instead of failing.
pub const ETCD_JOIN_WAIT_MS: u64 = 30_000;

/// Pause between two tries to reach etcd while `serve` starts, in
/// milliseconds.
const ETCD_JOIN_RETRY_MS: u64 = 200;

/// A server's membership, kept while it serves (dropping it leaves the
/// registry).
pub enum Membership {
    /// Published in memcached.
    Memcached { _registration: Registration },
    /// Published in etcd, following the slot map.
    Etcd { _member: Box<EtcdMember> },
}

/// A server's part in an etcd cluster: its lease and its watch of the map
/// (dropping it stops both and removes the registration).
pub struct EtcdMember {
    // Dropped first: replication stops before the registration goes.
    _replication: Option<fabrickv_server::replication::Replication>,
    _watch: WatchHandle,
    _registration: EtcdRegistration,
}

impl ServeClusterArgs {
    /// Registers the started server, if `--registry` was given, its
    /// entries MACed with the server's cluster secret `secret` (so that
    /// clients holding it can tell them from forgeries). The registration
    /// lasts as long as the returned value.
    pub fn register(
        &self,
        handle: &ServerHandle,
        secret: Option<fabrickv_auth::Secret>,
    ) -> Result<Option<Membership>, String> {
        let Some(url) = &self.registry else {
            if self.id.is_some() || self.cluster_size.is_some() {
                return Err("--id and --cluster-size need --registry".into());
            }
            return Ok(None);
        };
        let (Some(id), Some(size)) = (self.id, self.cluster_size) else {
            return Err("--registry needs --id and --cluster-size".into());
        };
        let desc = ServerDesc {
            id,
            addrs: vec![handle.addr().to_string()],
            resp: handle.resp_addr().map(str::to_string),
            grpc: handle.grpc_addr().map(|a| a.to_string()),
            memcache: handle.memcache_addr().map(str::to_string),
            memcache_peer: handle.memcache_peer_addr().map(str::to_string),
            repl: None,
            workers: handle.workers() as u32,
            pid: std::process::id(),
        };
        if is_etcd_url(url) {
            return self.join_etcd(url, handle, desc, size, secret).map(Some);
        }
        let registry = Registry::connect(url, &self.cluster)
            .map_err(|e| e.to_string())?
            .with_secret(secret);
        let r = Registration::start(registry, size, desc, self.registry_ttl)
            .map_err(|e| format!("cannot register: {e}"))?;
        eprintln!(
            "fabrickv: registered as server {id} of {size} in cluster {} at {url}",
            self.cluster
        );
        Ok(Some(Membership::Memcached { _registration: r }))
    }

    /// Publishes the server in etcd, creates the cluster's first slot map
    /// unless a server did already, installs the map before returning (so
    /// the server redirects keys it does not serve from its first
    /// command on) and follows every later change of it.
    fn join_etcd(
        &self,
        url: &str,
        handle: &ServerHandle,
        desc: ServerDesc,
        size: u32,
        secret: Option<fabrickv_auth::Secret>,
    ) -> Result<Membership, String> {
        let mut desc = desc;
        let id = desc.id;
        // An id past the first map's size is a server started to be
        // added (`fabrickv cluster add`): it registers and waits.
        if id >= fabrickv_cluster::CLUSTER_SERVERS_MAX {
            return Err(format!(
                "--id {id} is past the most servers a cluster has ({})",
                fabrickv_cluster::CLUSTER_SERVERS_MAX
            ));
        }
        let initial = SlotMap::initial(size, self.replicas)?;
        let stream_cpus = fabrickv_server::replication::cpus::allowed_cpus()
            .map_err(|e| format!("--stream-cpus: cannot read this process's CPUs: {e}"))
            .and_then(|allowed| {
                fabrickv_server::replication::cpus::StreamCpus::parse(&self.stream_cpus, &allowed)
            })?;
        // Every server of an etcd cluster takes streams (a cluster of one
        // copy too: slots moved to it come that way), and one keeping
        // copies draws the incarnation that tells this run from an
        // earlier one of the same id (a server of one copy has nothing a
        // restart could leave stale: it serves what it holds).
        // It binds where primaries ship to before it registers that
        // address.
        let repl_listener = {
            let listen = match &self.repl_listen {
                Some(a) => a.clone(),
                None => format!("{}:0", listen_host(&desc.addrs[0])),
            };
            let l = fabrickv_server::replication::bind(&listen)
                .map_err(|e| format!("--repl-listen {listen}: {e}"))?;
            desc.repl = Some(l.local_addr().map_err(|e| e.to_string())?.to_string());
            if self.replicas > 1 {
                handle
                    .slot_routing()
                    .set_incarnation(fabrickv_auth::random_u64() | 1);
            }
            Some(l)
        };
        let deadline = Instant::now() + Duration::from_millis(ETCD_JOIN_WAIT_MS);
        let (registry, registration) = loop {
            let joined = EtcdRegistry::connect(url, &self.cluster).and_then(|r| {
                let r = r.with_secret(secret.clone());
                let registration = r.register(&desc)?;
                r.create_map(&initial)?;
                Ok((r, registration))
            });
            match joined {
                Ok(j) => break j,
                // A map of another shape will not change by waiting.
                Err(e @ fabrickv_cluster::RegistryError::Invalid(_)) => return Err(e.to_string()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("cannot join the cluster in etcd: {e}"))
                }
                Err(e) => {
                    tracing::info!("etcd not ready yet ({e}); trying again");
                    std::thread::sleep(Duration::from_millis(ETCD_JOIN_RETRY_MS));
                }
            }
        };
        let watch = handle
            .slot_routing()
            .follow(id, &registry)
            .map_err(|e| e.to_string())?;
        let replication = match repl_listener {
            Some(l) => Some(
                fabrickv_server::replication::start(
                    fabrickv_server::replication::ReplicationParts {
                        parts: handle.partitions().clone(),
                        ps: handle.ps_store().clone(),
                        cache: handle.cache().clone(),
                        routing: handle.slot_routing().clone(),
                        gate: handle.gate().clone(),
                        clock: handle.clock(),
                        stream_cpus,
                    },
                    id,
                    handle.slot_routing().incarnation(),
                    registry.clone(),
                    secret,
                    l,
                )
                .map_err(|e| format!("cannot start replication: {e}"))?,
            ),
            None => None,
        };
        eprintln!(
            "fabrickv: registered as server {id} of {size} in cluster {} at {url}{}",
            self.cluster,
            if self.replicas > 1 {
                format!(", {} copies of each slot", self.replicas)
            } else {
                String::new()
            }
        );
        Ok(Membership::Etcd {
            _member: Box::new(EtcdMember {
                _replication: replication,
                _watch: watch,
                _registration: registration,
            }),
        })
    }
}

/// The host of a native address (`tcp://H:P`, `H:P`, `fabric://P/H:P`),
/// or loopback for one without a host (shm).
fn listen_host(addr: &str) -> String {
    let rest = addr.rsplit("//").next().unwrap_or(addr);
    let rest = rest.rsplit('/').next().unwrap_or(rest);
    match rest.rsplit_once(':') {
        Some((h, _)) if !h.is_empty() => h.to_string(),
        _ => "127.0.0.1".to_string(),
    }
}

/// Where a command finds the cluster: a static file or the registry.
#[derive(clap::Args, Clone, Default)]
pub struct ClusterSource {
    /// Static cluster file (TOML: name, and [[server]] tables with id and
    /// addrs).
    #[arg(long, value_name = "FILE", conflicts_with = "registry")]
    pub cluster_config: Option<PathBuf>,
    /// Registry to read the cluster from (memcached://HOST:PORT or
    /// etcd://HOST:PORT[,HOST:PORT...]).
    #[arg(long, env = "FABRICKV_REGISTRY", value_name = "URL")]
    pub registry: Option<String>,
    /// The cluster's name in the registry.
    #[arg(long, env = "FABRICKV_CLUSTER", default_value = "default")]
    pub cluster: String,
}

impl ClusterSource {
    /// Reads the cluster map, waiting up to `wait` for servers still
    /// registering.
    pub fn load(&self, wait: Duration) -> Result<Cluster, String> {
        if let Some(path) = &self.cluster_config {
            return Cluster::from_file(path).map_err(|e| e.to_string());
        }
        let Some(url) = &self.registry else {
            return Err("name a cluster with --cluster-config FILE or --registry URL".into());
        };
        Registry::connect(url, &self.cluster)
            .and_then(|r| r.lookup(wait, true))
            .map_err(|e| e.to_string())
    }
}

/// `fabrickv cluster ...`
#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    /// Prints the cluster's servers and how long the lookup took; exits 1
    /// if a server is not registered.
    Show {
        #[command(flatten)]
        source: ClusterSource,
        /// Seconds to wait for servers that have not registered yet.
        #[arg(long, default_value_t = 0.0)]
        wait: f64,
        /// Print the map as the static file's TOML instead.
        #[arg(long)]
        toml: bool,
    },
    /// Runs a failover controller for an etcd cluster keeping several
    /// copies of each slot: it takes the servers' heartbeats, fails a
    /// silent primary's slots over to a backup, and brings servers back
    /// as joiners. Run two for a standby (they campaign in etcd; one
    /// leads). The cluster secret comes from FABRICKV_AUTH_TOKEN_FILE or
    /// FABRICKV_AUTH_TOKEN, as the servers'.
    Controller {
        /// The etcd registry (etcd://HOST:PORT[,HOST:PORT...]).
        #[arg(long, env = "FABRICKV_REGISTRY", value_name = "URL")]
        registry: String,
        /// The cluster's name.
        #[arg(long, env = "FABRICKV_CLUSTER", default_value = "default")]
        cluster: String,
        /// UDP address taking heartbeats (published in etcd).
        #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
        listen: String,
    },
    /// Gives a server (started with `serve --registry etcd://... --id N`)
    /// an even share of an etcd cluster's slots, moved to it while every
    /// server serves; waits until the move is done.
    Add {
        #[command(flatten)]
        target: crate::cluster_moves::MoveTarget,
        #[command(flatten)]
        which: crate::cluster_moves::Which,
    },
    /// Moves every slot a server leads to the others, then its backup
    /// copies; it holds nothing after and can be stopped.
    Remove {
        #[command(flatten)]
        target: crate::cluster_moves::MoveTarget,
        /// The server's id.
        #[arg(long)]
        id: u32,
    },
    /// Evens out the slots each server of an etcd cluster leads.
    Rebalance {
        #[command(flatten)]
        target: crate::cluster_moves::MoveTarget,
    },
}

/// `fabrickv barrier NAME --count N`
#[derive(clap::Args)]
pub struct BarrierArgs {
    /// The barrier's name (one rendezvous per name until it expires).
    pub name: String,
    /// How many processes meet there.
    #[arg(long)]
    pub count: u64,
    /// memcached registry holding the barrier (memcached://HOST:PORT).
    #[arg(long, env = "FABRICKV_REGISTRY", value_name = "URL")]
    pub registry: String,
    /// The cluster the barrier belongs to.
    #[arg(long, env = "FABRICKV_CLUSTER", default_value = "default")]
    pub cluster: String,
    /// Seconds to wait for the others before failing.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
}

fn seconds(what: &str, s: f64) -> Result<Duration, String> {
    if !(s.is_finite() && s >= 0.0) {
        return Err(format!("{what} must be a number of seconds >= 0, not {s}"));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Runs `fabrickv barrier`: prints this process's arrival order.
pub fn barrier(a: &BarrierArgs) -> Result<std::process::ExitCode, String> {
    let timeout = seconds("--timeout", a.timeout)?;
    let r = Registry::connect(&a.registry, &a.cluster).map_err(|e| e.to_string())?;
    let me = r
        .barrier(&a.name, a.count, timeout)
        .map_err(|e| e.to_string())?;
    println!("{me}");
    Ok(std::process::ExitCode::SUCCESS)
}

/// Runs `fabrickv cluster ...`.
pub fn run(cmd: ClusterCommand) -> Result<std::process::ExitCode, String> {
    match cmd {
        ClusterCommand::Controller {
            registry,
            cluster,
            listen,
        } => controller(&registry, &cluster, &listen),
        ClusterCommand::Add { target, which } => crate::cluster_moves::add(&target, &which),
        ClusterCommand::Remove { target, id } => crate::cluster_moves::remove(&target, id),
        ClusterCommand::Rebalance { target } => crate::cluster_moves::rebalance(&target),
        ClusterCommand::Show { source, wait, toml } => {
            if let Some(url) = source.registry.as_deref().filter(|u| is_etcd_url(u)) {
                if toml {
                    return Err(
                        "--toml describes a static cluster; an etcd cluster has a slot map".into(),
                    );
                }
                return show_etcd(url, &source.cluster, seconds("--wait", wait)?);
            }
            let start = Instant::now();
            let c = source.load(seconds("--wait", wait)?)?;
            let took = start.elapsed();
            if toml {
                print!("{}", c.to_toml());
            } else {
                print!("{c}");
                eprintln!("lookup took {:.2} ms", took.as_secs_f64() * 1e3);
            }
            let missing = c.missing();
            if !missing.is_empty() {
                eprintln!("fabrickv: servers not registered: {missing:?}");
                return Ok(std::process::ExitCode::from(1));
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// Runs a controller candidate until SIGINT or SIGTERM (one that loses
/// its leadership campaigns again); exits 1 if etcd cannot be reached at
/// the start.
fn controller(url: &str, cluster: &str, listen: &str) -> Result<std::process::ExitCode, String> {
    let secret = fabrickv_auth::client_secret().map_err(|e| e.to_string())?;
    let registry = EtcdRegistry::connect(url, cluster)
        .map_err(|e| e.to_string())?
        .with_secret(secret.clone());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| e.to_string())?;
    }
    fabrickv_cluster::controller::run(&registry, secret.as_ref(), listen, &stop)
        .map_err(|e| e.to_string())?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// Most time between two reads of an etcd cluster that is not complete
/// yet, in milliseconds.
const SHOW_POLL_MS: u64 = 50;

/// `fabrickv cluster show` of an etcd cluster: its slot map (ranges,
/// primary, backups, epoch) and each server's state; exits 1 while a
/// server is not registered or no server has created the map.
fn show_etcd(url: &str, cluster: &str, wait: Duration) -> Result<std::process::ExitCode, String> {
    let start = Instant::now();
    let registry = EtcdRegistry::connect(url, cluster).map_err(|e| e.to_string())?;
    let deadline = start + wait;
    let view = loop {
        let view = registry.view().map_err(|e| e.to_string())?;
        let complete = view
            .map
            .as_ref()
            .is_some_and(|(m, _)| (0..m.size).all(|i| view.server(i).is_some()));
        if complete || Instant::now() >= deadline {
            break view;
        }
        std::thread::sleep(Duration::from_millis(SHOW_POLL_MS));
    };
    let took = start.elapsed();
    let Some((map, _)) = &view.map else {
        println!("cluster {cluster}: no slot map yet (no server has started)");
        return Ok(std::process::ExitCode::from(1));
    };
    println!("cluster {cluster} ({} servers)", map.size);
    let mut missing = Vec::new();
    for id in 0..map.size {
        let leads: u32 = map.led_by(id).iter().map(|r| r.count()).sum();
        let backs: u32 = map
            .groups
            .iter()
            .filter(|g| g.backups.contains(&id))
            .flat_map(|g| g.ranges.iter().map(|r| r.count()))
            .sum();
        match view.server(id) {
            Some(d) => println!(
                "  {id:>4}  up    {}{}  leads {leads} slots, backs up {backs}",
                d.addrs.join(","),
                d.resp
                    .as_deref()
                    .map(|r| format!("  resp={r}"))
                    .unwrap_or_default(),
            ),
            None => {
                missing.push(id);
                println!(
                    "  {id:>4}  down  (not registered)  leads {leads} slots, backs up {backs}"
                );
            }
        }
    }
    print!("{map}");
    eprintln!("lookup took {:.2} ms", took.as_secs_f64() * 1e3);
    if !missing.is_empty() {
        eprintln!("fabrickv: servers not registered: {missing:?}");
        return Ok(std::process::ExitCode::from(1));
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// What a client command talks to: one server (`--server`) or a whole
/// cluster (`--cluster-config` or `--registry`).
pub enum Conn {
    /// One server.
    One(fabrickv_client::Client),
    /// A cluster; each key goes to the server that owns it.
    Many(fabrickv_client::ClusterClient),
}

impl Conn {
    /// Connects to the cluster when one is named, else to `--server`.
    pub fn open(to: &crate::Target) -> Result<Conn, String> {
        let (server, cluster) = (&to.server, &to.cluster);
        if cluster.cluster_config.is_none() && cluster.registry.is_none() {
            return crate::connect(server).map(Conn::One);
        }
        let timeout = crate::timeout_of(server)?;
        let opts = fabrickv_client::ClusterOptions {
            transport: None,
            timeout,
            read_from_replica: to.read_from_replica,
        };
        if let Some(url) = cluster.registry.as_deref().filter(|u| is_etcd_url(u)) {
            return fabrickv_client::ClusterClient::join(url, &cluster.cluster, opts)
                .map(Conn::Many)
                .map_err(|e| format!("cannot connect to cluster {}: {e}", cluster.cluster));
        }
        let map = cluster.load(timeout)?;
        fabrickv_client::ClusterClient::connect(&map, opts)
            .map(Conn::Many)
            .map_err(|e| format!("cannot connect to cluster {}: {e}", map.name))
    }

    /// Prints the counters: `name: value` lines for one server; for a
    /// cluster, a `[server ID]` header before each server's lines. Fails
    /// (after printing the others) if a server could not be asked.
    pub fn print_stats(&mut self) -> Result<(), String> {
        match self {
            Conn::One(c) => {
                for (k, v) in c.stats().map_err(|e| e.to_string())? {
                    println!("{k}: {v}");
                }
                Ok(())
            }
            Conn::Many(c) => {
                let mut failed = Vec::new();
                for (id, s) in c.stats().into_iter().enumerate() {
                    println!("[server {id}]");
                    match s {
                        Ok(s) => {
                            for (k, v) in s {
                                println!("{k}: {v}");
                            }
                        }
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                if failed.is_empty() {
                    Ok(())
                } else {
                    Err(failed.join("; "))
                }
            }
        }
    }
}

impl Kv for Conn {
    fn execute(
        &mut self,
        ops: &[fabrickv_client::BatchOp<'_>],
    ) -> fabrickv_client::Result<Vec<fabrickv_client::Outcome>> {
        match self {
            Conn::One(c) => c.execute(ops),
            Conn::Many(c) => c.execute(ops),
        }
    }

    fn execute_into(
        &mut self,
        ops: &[fabrickv_client::BatchOp<'_>],
        buf: &mut fabrickv_client::MgetBuf,
    ) -> fabrickv_client::Result<()> {
        match self {
            Conn::One(c) => c.execute_into(ops, buf),
            Conn::Many(c) => c.execute_into(ops, buf),
        }
    }
}
