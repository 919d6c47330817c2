//! `fabrickv bench cluster`: what sharding costs.
//!
//! Three measurements, each against the same workload on one server given
//! the same cores, in the same run:
//! 1. aggregate kv throughput: client threads each loop over batched GETs
//!    through a [`ClusterClient`], first against one server, then against
//!    `servers` servers sharing the machine (the target is at least 0.8x);
//! 2. the latency of one multi-get of `mget` keys, one call at a time, on
//!    one server and spread over the cluster (target: within 1.5x);
//! 3. the time a new client takes to join: registry lookup in memcached
//!    plus connecting to every server (target: under 50 ms); and the same
//!    through etcd, with one server down (registered at an address where
//!    nothing listens, as a killed server is until its lease runs out).
//!
//! Over tcp each round also measures the physical floor of the split
//! ([`crate::split::tcp_split`]): the same calls, as many parts as each
//! configuration's client sends frames, over raw TCP with no key work at
//! all. Its ratio is the most of one server's throughput that any store
//! splitting calls this way could keep on these cores; the kv ratio is
//! printed beside it.
//!
//! The two configurations run side by side and take turns, `rounds`
//! times each. Both use the cluster client (a one-server cluster takes
//! the plain client's path), so the ratio isolates the split, the extra
//! connections and the merge. Every GET is checked against the value its
//! key must have.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_client::{BatchOp, Cluster, ClusterClient, ClusterOptions, Outcome};
use fabrickv_cluster::etcd::EtcdRegistry;
use fabrickv_cluster::local::{LocalEtcd, LocalMemcached};
use fabrickv_cluster::slots::SlotMap;
use fabrickv_cluster::{Registration, Registry, ServerDesc};
use fabrickv_server::{Mode, Server, ServerConfig, ServerHandle};
use fabrickv_types::ErrorCode;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::keys::check_value;
use crate::keys::make_key;
use crate::ratio;
use crate::report::{latency_histogram, print_table, rate, BenchResult};
use crate::split::{tcp_split, SplitOpts, SplitRate};

/// What to run.
#[derive(Debug, Clone)]
pub struct ClusterOpts {
    /// Servers of the cluster.
    pub servers: usize,
    /// Workers of each cluster server.
    pub cluster_workers: usize,
    /// Workers of the one server it is compared with.
    pub single_workers: usize,
    /// Transport (`tcp` or `shm`; servers run in this process).
    pub transport: String,
    /// Client threads of the throughput run.
    pub threads: usize,
    /// GETs per call in the throughput run.
    pub batch: usize,
    /// Keys of the multi-get latency run.
    pub mget: usize,
    /// Distinct keys.
    pub keys: u64,
    /// Key length in bytes.
    pub key_size: usize,
    /// Value length in bytes.
    pub value_size: usize,
    /// Measured time of each throughput and latency run.
    pub duration: Duration,
    /// Alternating runs of each configuration.
    pub rounds: usize,
    /// Joins timed.
    pub joins: usize,
}

/// The figures of one run, for the table and the JSON lines.
#[derive(Debug, Clone)]
pub struct ClusterReport {
    /// Throughput on one server and on the cluster.
    pub throughput: [BenchResult; 2],
    /// Multi-get latency on one server and on the cluster.
    pub mget: [BenchResult; 2],
    /// Joins of the cluster through the registry.
    pub join: BenchResult,
    /// Joins through etcd with one server down.
    pub join_etcd_down: BenchResult,
    /// Over tcp: the raw TCP split with the one server's and with the
    /// cluster's number of parts per call.
    pub limit: Option<[SplitRate; 2]>,
}

fn listen_addr(transport: &str, tag: &str) -> Result<String, String> {
    match transport {
        "tcp" => Ok("tcp://127.0.0.1:0".into()),
        "shm" => Ok(format!(
            "shm://fkv-bench-cluster-{}-{tag}",
            std::process::id()
        )),
        t => Err(format!("bench cluster runs over tcp or shm, not {t:?}")),
    }
}

/// Least memory of the whole system under test (one server, or all the
/// servers of the cluster together), in bytes.
const CLUSTER_MEMORY_BYTES_MIN: u64 = 64 << 20;

/// Starts `n` servers of `workers` workers each, in this process. The
/// servers share one memory budget, as they share the cores, so that the
/// cluster and the one server hold the same data in the same memory (each
/// server's index is sized from its memory: given `n` budgets, the
/// cluster would walk `n` times the index for the same keys).
fn start_servers(
    o: &ClusterOpts,
    n: usize,
    workers: usize,
    tag: &str,
) -> Result<Vec<ServerHandle>, String> {
    let item = o.key_size + o.value_size + 64;
    let total = ((o.keys as usize * item * 3) as u64).max(CLUSTER_MEMORY_BYTES_MIN);
    let least = workers as u64 * fabrickv_server::config::MEMORY_PER_PARTITION_BYTES_MIN;
    let memory = (total / n as u64).max(least);
    (0..n)
        .map(|i| {
            Server::start(&ServerConfig {
                listen: listen_addr(&o.transport, &format!("{tag}{i}"))?,
                workers: Some(workers),
                mode: Mode::Store,
                memory_bytes: memory,
                log_level: "warn".into(),
                ..ServerConfig::default()
            })
            .map_err(|e| e.to_string())
        })
        .collect()
}

fn cluster_of(name: &str, servers: &[ServerHandle]) -> Result<Cluster, String> {
    let addrs: Vec<&str> = servers.iter().map(ServerHandle::addr).collect();
    Cluster::of_addrs(name, &addrs).map_err(|e| e.to_string())
}

fn connect(c: &Cluster) -> Result<ClusterClient, String> {
    ClusterClient::connect(c, ClusterOptions::default()).map_err(|e| e.to_string())
}

fn preload(c: &Cluster, o: &ClusterOpts) -> Result<(), String> {
    crate::kv::preload_keys(&mut connect(c)?, o.keys, o.key_size, o.value_size)
}

/// What one client thread did.
struct Done {
    hist: Histogram<u64>,
    keys: u64,
    wrong: u64,
    seconds: f64,
}

/// Keys `0..o.keys`, made once per run and shared by every client.
type Keys = Arc<[Vec<u8>]>;

fn make_keys(o: &ClusterOpts) -> Keys {
    (0..o.keys)
        .map(|i| {
            let mut k = Vec::new();
            make_key(i, o.key_size, &mut k);
            k
        })
        .collect()
}

/// Calls of `batch` random GETs of `all_keys` for `duration`, each timed;
/// counts keys.
fn get_loop(
    c: &Cluster,
    o: &ClusterOpts,
    all_keys: &[Vec<u8>],
    batch: usize,
    seed: u64,
) -> Result<Done, String> {
    let mut client = connect(c)?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut hist = latency_histogram()?;
    let (mut keys, mut wrong) = (0u64, 0u64);
    let mut ids = Vec::with_capacity(batch);
    let start = Instant::now();
    let end = start + o.duration;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        ids.clear();
        ids.extend((0..batch).map(|_| rng.gen_range(0..o.keys)));
        let ops: Vec<BatchOp<'_>> = ids
            .iter()
            .map(|&i| BatchOp::Get {
                key: &all_keys[i as usize],
            })
            .collect();
        let out: Vec<Outcome> = client.execute(&ops).map_err(|e| e.to_string())?;
        hist.saturating_record(now.elapsed().as_nanos() as u64);
        for (o_, &i) in out.iter().zip(&ids) {
            if o_.code != ErrorCode::Ok || !check_value(i, o.value_size, &o_.value) {
                wrong += 1;
            }
        }
        keys += batch as u64;
    }
    Ok(Done {
        hist,
        keys,
        wrong,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn throughput(
    c: &Cluster,
    o: &ClusterOpts,
    keys: &Keys,
    system: &str,
) -> Result<(BenchResult, Histogram<u64>), String> {
    let c = Arc::new(c.clone());
    let threads: Vec<_> = (0..o.threads)
        .map(|t| {
            let (c, o, keys) = (c.clone(), o.clone(), keys.clone());
            std::thread::spawn(move || get_loop(&c, &o, &keys, o.batch, 0x5eed + t as u64))
        })
        .collect();
    let mut hist = latency_histogram()?;
    let (mut keys, mut wrong, mut seconds) = (0u64, 0u64, 0f64);
    for t in threads {
        let d = t
            .join()
            .map_err(|_| "a client thread panicked".to_string())??;
        hist.add(&d.hist).map_err(|e| e.to_string())?;
        keys += d.keys;
        wrong += d.wrong;
        seconds = seconds.max(d.seconds);
    }
    Ok((
        result(o, "throughput", system, &hist, keys, seconds, wrong),
        hist,
    ))
}

fn mget_latency(
    c: &Cluster,
    o: &ClusterOpts,
    keys: &Keys,
    system: &str,
) -> Result<(BenchResult, Histogram<u64>), String> {
    let d = get_loop(c, o, keys, o.mget, 0xface)?;
    let case = format!("mget {}", o.mget);
    let r = result(o, &case, system, &d.hist, d.keys, d.seconds, d.wrong);
    Ok((r, d.hist))
}

fn result(
    o: &ClusterOpts,
    case: &str,
    system: &str,
    hist: &Histogram<u64>,
    keys: u64,
    seconds: f64,
    wrong: u64,
) -> BenchResult {
    BenchResult {
        bench: "cluster".into(),
        case: case.into(),
        system: system.into(),
        ops_per_s: keys as f64 / seconds.max(1e-9),
        p50_us: hist.value_at_quantile(0.50) as f64 / 1e3,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
        ops: keys,
        seconds,
        wrong_values: wrong,
        params: serde_json::json!({
            "transport": o.transport, "threads": o.threads, "batch": o.batch,
            "mget": o.mget, "keys": o.keys, "key_size": o.key_size,
            "value_size": o.value_size, "servers": o.servers,
            "cluster_workers": o.cluster_workers, "single_workers": o.single_workers,
            "mean_us": hist.mean() / 1e3, "rounds": o.rounds,
        }),
    }
}

/// Publishes the cluster's servers in a fresh memcached and times
/// `ClusterClient::join` (lookup plus connections) `o.joins` times.
fn joins(servers: &[ServerHandle], o: &ClusterOpts) -> Result<BenchResult, String> {
    let mc = LocalMemcached::start()?;
    let name = format!("bench-{}", std::process::id());
    let size = servers.len() as u32;
    let _regs = servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let desc = ServerDesc {
                id: i as u32,
                addrs: vec![s.addr().to_string()],
                resp: None,
                grpc: None,
                memcache: None,
                memcache_peer: None,
                repl: None,
                workers: s.workers() as u32,
                pid: std::process::id(),
            };
            Registry::connect(&mc.url(), &name)
                .and_then(|r| Registration::start(r, size, desc, 60))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    time_joins(o, "join", &mc.url(), &name, |_| Ok(()))
}

/// Times `o.joins` joins of the cluster `name` through the registry at
/// `url`, checking each joined client with `check`.
fn time_joins(
    o: &ClusterOpts,
    case: &str,
    url: &str,
    name: &str,
    check: impl Fn(&ClusterClient) -> Result<(), String>,
) -> Result<BenchResult, String> {
    let mut hist = latency_histogram()?;
    let start = Instant::now();
    for _ in 0..o.joins.max(1) {
        let t = Instant::now();
        let c =
            ClusterClient::join(url, name, ClusterOptions::default()).map_err(|e| e.to_string())?;
        hist.saturating_record(t.elapsed().as_nanos() as u64);
        check(&c)?;
    }
    let mut r = result(
        o,
        case,
        "fabrickv-cluster",
        &hist,
        hist.len(),
        start.elapsed().as_secs_f64(),
        0,
    );
    r.params["max_us"] = (hist.max() as f64 / 1e3).into();
    Ok(r)
}

/// Registers the cluster's servers in a fresh etcd, the last one at an
/// address where nothing listens (a server killed a moment ago), and
/// times `ClusterClient::join` (the map, the descriptors and a connection
/// to each server, the dead one refused) `o.joins` times.
fn joins_etcd_one_down(servers: &[ServerHandle], o: &ClusterOpts) -> Result<BenchResult, String> {
    let etcd = LocalEtcd::start()?;
    let name = format!("bench-{}", std::process::id());
    let reg = EtcdRegistry::connect(&etcd.url(), &name).map_err(|e| e.to_string())?;
    reg.create_map(&SlotMap::initial(servers.len() as u32, 1)?)
        .map_err(|e| e.to_string())?;
    // A port this process held and let go: nothing listens there.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?;
    let _regs = servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let addr = if i + 1 == servers.len() {
                format!("tcp://{dead}")
            } else {
                s.addr().to_string()
            };
            let desc = ServerDesc {
                id: i as u32,
                addrs: vec![addr],
                resp: None,
                grpc: None,
                memcache: None,
                memcache_peer: None,
                repl: None,
                workers: s.workers() as u32,
                pid: std::process::id(),
            };
            reg.register(&desc).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dead_id = servers.len() as u32 - 1;
    time_joins(o, "join etcd, 1 down", &etcd.url(), &name, |c| {
        if c.is_up(dead_id) {
            return Err("the dead server counts as up".into());
        }
        Ok(())
    })
}

/// The raw TCP split with `parts` parts per call, for `o`'s clients.
fn limit(o: &ClusterOpts, parts: usize) -> Result<SplitRate, String> {
    tcp_split(&SplitOpts {
        parts,
        threads: o.threads,
        batch: o.batch,
        key_size: o.key_size,
        value_size: o.value_size,
        duration: o.duration,
    })
}

/// Adds `b`, one round's split, into `a`.
fn add_limit(a: &mut Option<SplitRate>, b: SplitRate) {
    match a {
        None => *a = Some(b),
        Some(r) => r.add(&b),
    }
}

/// Adds `b` into `a` (same system and case): counts and time summed,
/// percentiles the worse of the two.
fn add_round(
    a: &mut Option<(BenchResult, Histogram<u64>)>,
    b: (BenchResult, Histogram<u64>),
) -> Result<(), String> {
    match a {
        None => *a = Some(b),
        Some((r, h)) => {
            h.add(&b.1).map_err(|e| e.to_string())?;
            r.ops += b.0.ops;
            r.seconds += b.0.seconds;
            r.wrong_values += b.0.wrong_values;
            r.ops_per_s = r.ops as f64 / r.seconds.max(1e-9);
            r.p50_us = h.value_at_quantile(0.50) as f64 / 1e3;
            r.p99_us = h.value_at_quantile(0.99) as f64 / 1e3;
            r.params["mean_us"] = (h.mean() / 1e3).into();
        }
    }
    Ok(())
}

/// Runs the three measurements. Both configurations run side by side
/// (an idle server blocks and takes no CPU) and their runs alternate,
/// `rounds` times each, so that the machine's drift during the run falls
/// on both alike.
pub fn run(o: &ClusterOpts) -> Result<ClusterReport, String> {
    if o.servers == 0
        || o.threads == 0
        || o.batch == 0
        || o.mget == 0
        || o.keys == 0
        || o.rounds == 0
    {
        return Err("servers, threads, batch, mget, keys and rounds must all be at least 1".into());
    }
    let single = start_servers(o, 1, o.single_workers, "s")?;
    let many = start_servers(o, o.servers, o.cluster_workers, "c")?;
    let systems = [
        (cluster_of("one", &single)?, "1-server"),
        (cluster_of("many", &many)?, "cluster"),
    ];
    for (c, _) in &systems {
        preload(c, o)?;
    }
    let keys = make_keys(o);
    let mut tput: [Option<(BenchResult, Histogram<u64>)>; 2] = [None, None];
    let mut mget: [Option<(BenchResult, Histogram<u64>)>; 2] = [None, None];
    let mut floor: [Option<SplitRate>; 2] = [None, None];
    // Frames per call: the client sends one to each worker it touches.
    let parts = [o.single_workers, o.servers * o.cluster_workers];
    let raw = o.transport == "tcp" && parts.iter().all(|&p| p <= o.batch);
    for _ in 0..o.rounds {
        for (i, (c, system)) in systems.iter().enumerate() {
            add_round(&mut tput[i], throughput(c, o, &keys, system)?)?;
            add_round(&mut mget[i], mget_latency(c, o, &keys, system)?)?;
        }
        if raw {
            for (f, &p) in floor.iter_mut().zip(&parts) {
                add_limit(f, limit(o, p)?);
            }
        }
    }
    let join = joins(&many, o)?;
    let join_etcd_down = joins_etcd_one_down(&many, o)?;
    let take =
        |x: &mut [Option<(BenchResult, Histogram<u64>)>; 2]| -> Result<[BenchResult; 2], String> {
            let a = x[0].take().ok_or("no rounds ran")?.0;
            let b = x[1].take().ok_or("no rounds ran")?.0;
            Ok([a, b])
        };
    Ok(ClusterReport {
        throughput: take(&mut tput)?,
        mget: take(&mut mget)?,
        join,
        join_etcd_down,
        limit: match floor {
            [Some(a), Some(b)] => Some([a, b]),
            _ => None,
        },
    })
}

impl ClusterReport {
    /// Cluster throughput over one server's.
    pub fn throughput_ratio(&self) -> f64 {
        ratio(self.throughput[1].ops_per_s, self.throughput[0].ops_per_s)
    }

    /// Cluster multi-get median latency over one server's.
    pub fn mget_ratio(&self) -> f64 {
        ratio(self.mget[1].p50_us, self.mget[0].p50_us)
    }

    /// Over tcp: the raw split's ratio (cluster's parts over the one
    /// server's), the ceiling of [`Self::throughput_ratio`] when keys cost
    /// nothing.
    pub fn limit_ratio(&self) -> Option<f64> {
        self.limit
            .as_ref()
            .map(|[a, b]| ratio(b.keys_per_s, a.keys_per_s))
    }

    /// Reads that came back wrong, over every run (must be 0).
    pub fn wrong(&self) -> u64 {
        self.throughput
            .iter()
            .chain(&self.mget)
            .map(|r| r.wrong_values)
            .sum()
    }

    /// Prints the table.
    pub fn print(&self, o: &ClusterOpts) {
        println!(
            "cluster: {} servers x {} workers vs 1 server x {} workers, {}, {} client threads x {} GETs per call, {} keys of {} B values, {} alternating rounds of {:.1} s",
            o.servers, o.cluster_workers, o.single_workers, o.transport, o.threads, o.batch, o.keys, o.value_size, o.rounds, o.duration.as_secs_f64()
        );
        let us = |v: f64| format!("{v:.1}");
        let mut rows = vec![
            vec![
                "kv GET keys/s".to_string(),
                rate(self.throughput[0].ops_per_s),
                rate(self.throughput[1].ops_per_s),
                format!("{:.2}x", self.throughput_ratio()),
                ">= 0.80x".into(),
            ],
            vec![
                format!("mget {} p50 us", o.mget),
                us(self.mget[0].p50_us),
                us(self.mget[1].p50_us),
                format!("{:.2}x", self.mget_ratio()),
                "<= 1.50x".into(),
            ],
            vec![
                format!("mget {} p99 us", o.mget),
                us(self.mget[0].p99_us),
                us(self.mget[1].p99_us),
                format!("{:.2}x", ratio(self.mget[1].p99_us, self.mget[0].p99_us)),
                String::new(),
            ],
        ];
        if let (Some([a, b]), Some(r)) = (&self.limit, self.limit_ratio()) {
            rows.push(vec![
                format!("raw tcp {}/{} parts", a.parts, b.parts),
                rate(a.keys_per_s),
                rate(b.keys_per_s),
                format!("{r:.2}x"),
                "(limit)".into(),
            ]);
        }
        rows.push(vec![
            "join ms p50/max".to_string(),
            "-".into(),
            format!(
                "{:.2}/{:.2}",
                self.join.p50_us / 1e3,
                self.join.params["max_us"].as_f64().unwrap_or(0.0) / 1e3
            ),
            String::new(),
            "< 50 ms".into(),
        ]);
        rows.push(vec![
            "join etcd, 1 down, ms p50/max".to_string(),
            "-".into(),
            format!(
                "{:.2}/{:.2}",
                self.join_etcd_down.p50_us / 1e3,
                self.join_etcd_down.params["max_us"].as_f64().unwrap_or(0.0) / 1e3
            ),
            String::new(),
            "< 50 ms".into(),
        ]);
        print_table(&["metric", "1 server", "cluster", "ratio", "target"], &rows);
    }

    /// The JSON lines: every result, then the ratios.
    pub fn json_lines(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .throughput
            .iter()
            .chain(&self.mget)
            .chain([&self.join, &self.join_etcd_down])
            .map(BenchResult::json)
            .collect();
        v.extend(self.limit.iter().flatten().map(SplitRate::json));
        v.push(
            serde_json::json!({
                "bench": "cluster", "case": "ratios",
                "throughput_ratio": self.throughput_ratio(),
                "mget_p50_ratio": self.mget_ratio(),
                "join_p50_ms": self.join.p50_us / 1e3,
                "join_etcd_one_down_p50_ms": self.join_etcd_down.p50_us / 1e3,
                "limit_ratio": self.limit_ratio(),
                "wrong_values": self.wrong(),
            })
            .to_string(),
        );
        v
    }
}
