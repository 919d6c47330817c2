//! `fabrickv bench kv`: the GET/PUT mix over the native protocol against
//! a given server, one started in this process, or one started as a pinned
//! child process; with `--compare-redis`, redis-benchmark's GETs beside it.

use clap::Args;

use super::{cpu_list, duration_of, ShapeArgs};
use crate::kv::{self, KvOpts};
use crate::peers;
use crate::report::{print_kv_table, BenchResult};

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
    #[command(flatten)]
    pub(super) shape: ShapeArgs,
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

/// Runs `bench kv`; fails if any read came back wrong.
pub fn run(a: KvArgs) -> Result<(), String> {
    let duration = duration_of(a.duration)?;
    let mut opts = KvOpts {
        server: a.server.clone(),
        server_workers: a.server_workers,
        threads: a.threads,
        keys: a.keys,
        shape: a.shape.shape(),
        duration,
        client_cpus: cpu_list(&a.client_cpus)?,
        preload: true,
    };
    // Pin this thread too, so preload and bookkeeping stay off the server's CPUs.
    if let Some(&id) = opts.client_cpus.first() {
        crate::pin_current_thread(id);
    }
    let mut _server = None;
    if opts.server.is_none() && a.server_cpus.is_some() {
        let memory = format!(
            "{}",
            ((a.keys as usize * (opts.shape.key_size + opts.shape.value_size + 64) * 2)
                .max(64 << 20))
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

/// Redis GET with the same value size, pipeline depth and outstanding
/// requests (clients = threads x in-flight), pinned the same way.
fn run_redis(a: &KvArgs, ours: &BenchResult) -> Result<BenchResult, String> {
    let (_redis, port) = peers::spawn_redis(a.server_cpus.as_deref())?;
    let cpus = a.client_cpus.as_deref();
    let shape = a.shape.shape();
    let v = shape.value_size.to_string();
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
    let clients = (a.threads * shape.in_flight).max(1);
    // Enough requests to run for about the same time as our run.
    let n = ((ours.ops_per_s * a.duration) as u64).clamp(100_000, 200_000_000);
    let args: Vec<String> = [
        "-t",
        "get",
        "-P",
        &shape.batch.to_string(),
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
