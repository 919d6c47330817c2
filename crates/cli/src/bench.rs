//! `fabrickv bench ...`: flags of each benchmark, and the peer runs.

use std::time::Duration;

use clap::{Args, Subcommand};
use fabrickv_bench::compare::{self, CompareOpts, System};
use fabrickv_bench::herd::{self, HerdOpts};
use fabrickv_bench::kv::{self, KvOpts};
use fabrickv_bench::peers;
use fabrickv_bench::report::{print_kv_table, BenchResult};

use crate::clients::{Sweep, SweepArgs};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// GET/PUT mix over the native protocol (Mops, p50, p99), optionally beside Redis.
    Kv(KvArgs),
    /// HERD's workload and table: Cores x Batched / Non-batched Mops, per-worker lines.
    Herd(HerdArgs),
    /// FabricKV (RESP, native tcp, shm) beside redis-server and memcached: Mops, p50/p99, server CPU-s per Mop.
    Compare(CompareArgs),
    /// PetPS's embedding pulls: throughput lines, thread x batch matrix, multi-client sums, --compare with Redis/raw TCP/memcpy.
    Ps(crate::ps_bench::PsArgs),
    /// The KV cache's read benchmark: write, warm up, N-thread checked reads, GET latency; --compare with Redis GET, raw TCP, memcpy.
    Cache(crate::cache_bench::CacheArgs),
    /// The seed's shard copy: a generated shard copied from a server in this process, MB/s beside the seed's and the raw pipe (TCP into a file).
    Copy(crate::copy_bench::CopyBenchArgs),
    /// What sharding costs: kv throughput and multi-get latency on N servers beside one server on the same cores, and the time a client takes to join through the registry.
    Cluster(crate::cluster_bench::ClusterBenchArgs),
    /// Echo RPCs over a transport: the seed's table (ops/s, fast, ave, p50, p99).
    Rpc(crate::rpc_bench::RpcArgs),
    /// The echo server `bench rpc` starts as a pinned child process.
    #[command(hide = true)]
    RpcServer(crate::rpc_bench::RpcServerArgs),
}

#[derive(Args)]
pub struct KvArgs {
    /// Server to load. Without it a server is started: in this process, or
    /// as a pinned child process with --server-cpus.
    #[arg(long)]
    server: Option<String>,
    /// Start the server (and peers) as processes pinned to these CPUs (taskset list, e.g. 0).
    #[arg(long)]
    server_cpus: Option<String>,
    /// Pin client threads (and redis-benchmark) to these CPUs (e.g. 1).
    #[arg(long)]
    client_cpus: Option<String>,
    /// Workers of a server this command starts.
    #[arg(long, default_value_t = 1)]
    server_workers: usize,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Distinct keys, preloaded before measuring.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Key size in bytes (16 = HERD).
    #[arg(long, default_value_t = 16)]
    key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Percentage of GETs (the rest are PUTs); HERD uses 95.
    #[arg(long, default_value_t = 95)]
    get_percent: u32,
    /// Operations per request frame (batch depth).
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Request frames in flight per connection.
    #[arg(long, default_value_t = 8)]
    in_flight: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Also run redis-server + redis-benchmark (GET, -P batch, -d value size) pinned the same way.
    #[arg(long)]
    compare_redis: bool,
    /// Print one JSON object per result as well as the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct HerdArgs {
    /// Worker counts to measure, one row each (HERD's "Cores"), e.g. 1,2 or 1-4.
    #[arg(long, default_value = "1")]
    workers: String,
    /// Keys in each worker's partition (HERD_NUM_KEYS).
    #[arg(long, default_value_t = 100_000)]
    keys_per_partition: u64,
    /// Value size in bytes (keys are 16 bytes).
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Percentage of PUTs (HERD's update_percentage).
    #[arg(long, default_value_t = 5)]
    update_percentage: u32,
    /// Operations per request frame of the batched client.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Request frames in flight per connection.
    #[arg(long, default_value_t = 8)]
    in_flight: usize,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Measured seconds of each run.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// tcp, shm, inproc or fabric.
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// libfabric provider for --transport fabric.
    #[arg(long, default_value = "shm")]
    provider: String,
    /// Start each server as a process pinned to these CPUs (e.g. 0).
    #[arg(long)]
    server_cpus: Option<String>,
    /// Pin client threads to these CPUs (e.g. 1).
    #[arg(long)]
    client_cpus: Option<String>,
    /// Print one JSON object per result as well as the table.
    #[arg(long)]
    json: bool,
    /// Run each load as this many client processes at once (e.g. 2,4,8),
    /// released together by a barrier in a memcached registry (--registry,
    /// or one started for the sweep), and sum their figures; a row per
    /// worker count and client count.
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,
    /// The preloaded server a client process of a sweep loads.
    #[arg(long, hide = true, requires = "child")]
    server: Option<String>,
    #[command(flatten)]
    sweep: SweepArgs,
}

#[derive(Args)]
pub struct CompareArgs {
    /// Systems to run: redis, memcached, fabrickv-resp, fabrickv-tcp, fabrickv-shm.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis,memcached,fabrickv-resp,fabrickv-tcp,fabrickv-shm"
    )]
    systems: Vec<String>,
    /// CPUs every server is pinned to.
    #[arg(long, default_value = "0")]
    server_cpus: String,
    /// CPU every load generator is pinned to.
    #[arg(long, default_value_t = 1)]
    client_cpu: usize,
    /// Distinct keys, preloaded and checked before measuring.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Pipeline depths of the GET and SET workloads.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    depths: Vec<usize>,
    /// Multi-get sizes (keys per MGET).
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    mget: Vec<usize>,
    /// Connections (redis-benchmark -c), or native frames in flight.
    #[arg(long, default_value_t = 50)]
    conns: usize,
    /// Measured seconds per case.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Print one JSON object per result as well as the table.
    #[arg(long)]
    json: bool,
}

pub fn cpu_list(s: &Option<String>) -> Result<Vec<usize>, String> {
    s.as_deref()
        .map_or(Ok(Vec::new()), fabrickv_types::cpus::parse_cpu_list)
}

pub fn run(cmd: BenchCommand) -> Result<(), String> {
    match cmd {
        BenchCommand::Kv(a) => run_kv(a),
        BenchCommand::Herd(a) => run_herd(a),
        BenchCommand::Compare(a) => run_compare(a),
        BenchCommand::Ps(a) => crate::ps_bench::run(a),
        BenchCommand::Cache(a) => crate::cache_bench::run(a),
        BenchCommand::Rpc(a) => crate::rpc_bench::run(a),
        BenchCommand::Copy(a) => crate::copy_bench::run(a),
        BenchCommand::Cluster(a) => crate::cluster_bench::run(&a),
        BenchCommand::RpcServer(a) => crate::rpc_bench::serve(a),
    }
}

fn run_kv(a: KvArgs) -> Result<(), String> {
    if !(a.duration.is_finite() && a.duration > 0.0) {
        return Err("--duration must be a positive number of seconds".into());
    }
    let mut opts = KvOpts {
        server: a.server.clone(),
        server_workers: a.server_workers,
        threads: a.threads,
        keys: a.keys,
        key_size: a.key_size,
        value_size: a.value_size,
        get_percent: a.get_percent.min(100),
        batch: a.batch,
        in_flight: a.in_flight,
        duration: Duration::from_secs_f64(a.duration),
        client_cpus: cpu_list(&a.client_cpus)?,
        preload: true,
    };
    if let Some(c) = &a.client_cpus {
        // Pin this thread too, so preload and bookkeeping stay off the server's CPUs.
        if let Some(&id) = cpu_list(&Some(c.clone()))?.first() {
            core_affinity_set(id);
        }
    }
    let mut _server = None;
    if opts.server.is_none() && a.server_cpus.is_some() {
        let memory = format!(
            "{}",
            ((a.keys as usize * (a.key_size + a.value_size + 64) * 2).max(64 << 20))
        );
        let (child, addr) =
            peers::spawn_fabrickv(a.server_cpus.as_deref(), a.server_workers, &memory)?;
        _server = Some(child);
        opts.server = Some(addr);
    }
    let mut results = vec![kv::run(&opts)?];
    drop(_server);
    if a.compare_redis {
        results.push(run_redis(&a, &results[0])?);
    }
    print_kv_table(&results);
    if a.json {
        for r in &results {
            println!("{}", r.json());
        }
    }
    if results.iter().any(|r| r.wrong_values > 0) {
        return Err("some reads returned wrong values".into());
    }
    Ok(())
}

fn run_herd(a: HerdArgs) -> Result<(), String> {
    if !(a.duration.is_finite() && a.duration > 0.0) {
        return Err("--duration must be a positive number of seconds".into());
    }
    let client_cpus = cpu_list(&a.client_cpus)?;
    if let Some(&id) = client_cpus.first() {
        core_affinity_set(id);
    }
    let opts = HerdOpts {
        workers: cpu_list(&Some(a.workers.clone()))
            .map_err(|_| format!("bad --workers {}", a.workers))?,
        keys_per_partition: a.keys_per_partition,
        value_size: a.value_size,
        update_percent: a.update_percentage.min(100),
        batch: a.batch,
        in_flight: a.in_flight,
        threads: a.threads,
        duration: Duration::from_secs_f64(a.duration),
        transport: a.transport.clone(),
        provider: a.provider.clone(),
        server_cpus: a.server_cpus.clone(),
        client_cpus,
    };
    if a.sweep.child {
        return herd_child(&a, &opts);
    }
    let rows = if a.clients.is_empty() {
        herd::run(&opts)?
    } else {
        crate::clients::check_counts(&a.clients)?;
        let sweep = Sweep::start(&a.sweep, "herd")?;
        herd::run_clients(&opts, &a.clients, &mut |s| herd_clients(&a, &sweep, s))?
    };
    herd::print(&opts, &rows);
    if a.json {
        for r in &rows {
            println!("{}", r.batched.json());
            println!("{}", r.non_batched.json());
        }
    }
    match rows.iter().find(|r| !r.status.passed()) {
        Some(r) => Err(format!(
            "cores {} clients {}: {}",
            r.cores,
            r.clients.unwrap_or(1),
            r.status.cell()
        )),
        None => Ok(()),
    }
}

/// One client process of `bench herd --clients`: the load of one step
/// against the parent's preloaded server, started at the barrier.
fn herd_child(a: &HerdArgs, opts: &HerdOpts) -> Result<(), String> {
    let server = a
        .server
        .as_deref()
        .ok_or("a client of a sweep needs --server")?;
    let &[cores] = opts.workers.as_slice() else {
        return Err("a client of a sweep needs one --workers count".into());
    };
    let mut gate = a.sweep.gate()?;
    let r = kv::run_gated(&opts.kv_opts(server, cores, a.batch), &mut || gate.pass())?;
    let v = serde_json::to_value(&r).map_err(|e| e.to_string())?;
    println!("{}", gate.line(v));
    Ok(())
}

/// Runs one step of `bench herd --clients` as client processes and sums
/// their results.
fn herd_clients(
    a: &HerdArgs,
    sweep: &Sweep,
    s: &herd::Step,
) -> Result<(BenchResult, Option<String>), String> {
    let n = s.clients.unwrap_or(1);
    let args = crate::clients::child_args(
        &["bench", "herd", "--server", s.addr],
        &[
            ("--workers", s.cores.to_string()),
            ("--batch", s.batch.to_string()),
            ("--keys-per-partition", a.keys_per_partition.to_string()),
            ("--value-size", a.value_size.to_string()),
            ("--update-percentage", a.update_percentage.to_string()),
            ("--in-flight", a.in_flight.to_string()),
            ("--threads", a.threads.to_string()),
            ("--duration", a.duration.to_string()),
        ],
        a.client_cpus.as_deref(),
    );
    let c = sweep.run(&format!("w{}-n{n}-b{}", s.cores, s.batch), n, &args)?;
    let parts = c
        .lines
        .iter()
        .map(|v| serde_json::from_value(v.clone()))
        .collect::<Result<Vec<BenchResult>, _>>()
        .map_err(|e| format!("a client's result: {e}"))?;
    let mut r = BenchResult::sum("herd", &parts);
    r.params["start_skew_ms"] = c.start_skew_ms.into();
    Ok((r, c.failure))
}

fn run_compare(a: CompareArgs) -> Result<(), String> {
    if !(a.duration.is_finite() && a.duration > 0.0) {
        return Err("--duration must be a positive number of seconds".into());
    }
    let opts = CompareOpts {
        systems: a
            .systems
            .iter()
            .map(|s| System::parse(s))
            .collect::<Result<_, _>>()?,
        server_cpus: a.server_cpus,
        client_cpu: a.client_cpu,
        keys: a.keys,
        value_size: a.value_size,
        depths: a.depths,
        mget: a.mget,
        conns: a.conns,
        duration: Duration::from_secs_f64(a.duration),
    };
    let rows = compare::run(&opts)?;
    compare::print(&opts, &rows);
    if a.json {
        for r in &rows {
            println!("{}", compare::json(&rows, r));
        }
    }
    if rows.iter().any(|r| r.result.wrong_values > 0) {
        return Err("some reads returned wrong values".into());
    }
    Ok(())
}

fn core_affinity_set(id: usize) {
    fabrickv_bench::pin_current_thread(id);
}

/// Redis GET with the same value size, pipeline depth and outstanding
/// requests (clients = threads x in-flight), pinned the same way.
fn run_redis(a: &KvArgs, ours: &BenchResult) -> Result<BenchResult, String> {
    let (_redis, port) = peers::spawn_redis(a.server_cpus.as_deref())?;
    let cpus = a.client_cpus.as_deref();
    let v = a.value_size.to_string();
    // Store the key redis-benchmark reads, so GETs return a value of the same size.
    peers::redis_benchmark(
        cpus,
        port,
        &[
            "-t".into(),
            "set".into(),
            "-n".into(),
            "1000".into(),
            "-d".into(),
            v.clone(),
        ],
    )?;
    let clients = (a.threads * a.in_flight).max(1);
    // Enough requests to run for about the same time as our run.
    let n = ((ours.ops_per_s * a.duration) as u64).clamp(100_000, 200_000_000);
    let args: Vec<String> = [
        "-t",
        "get",
        "-P",
        &a.batch.to_string(),
        "-d",
        &v,
        "-c",
        &clients.to_string(),
        "-n",
        &n.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let start = std::time::Instant::now();
    let rows = peers::redis_benchmark(cpus, port, &args)?;
    let secs = start.elapsed().as_secs_f64();
    let row = rows
        .iter()
        .find(|r| r.test == "GET")
        .ok_or("redis-benchmark printed no GET row")?;
    Ok(BenchResult {
        bench: "kv".into(),
        case: ours.case.clone(),
        system: "redis".into(),
        ops_per_s: row.rps,
        p50_us: row.p50_us,
        p99_us: row.p99_us,
        ops: n,
        seconds: secs,
        wrong_values: 0,
        params: serde_json::json!({"tool": "redis-benchmark", "args": args, "note": "GET of one preloaded 16-byte key"}),
    })
}
