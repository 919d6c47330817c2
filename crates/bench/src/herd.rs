//! `fabrickv bench herd`: HERD's workload and table.
//!
//! For each worker count, a server with that many workers is started (in
//! this process, or as a child process pinned with `taskset`), each worker
//! owning a partition of `keys_per_partition` 16-byte keys (hashes of
//! integers, as HERD's), preloaded; then the same client load runs twice:
//! batched (`batch` operations per request frame, HERD's doorbell-batched
//! clients) and non-batched (one operation per frame). Every GET's value is
//! checked. Each worker's own counters, read before and after a run, give
//! the per-worker line HERD's workers print: IOPS, average batch size, and
//! lookup-fail rate.

use std::time::Duration;

use fabrickv_client::Client;
use fabrickv_server::{Mode, Server, ServerConfig, ServerHandle};

use crate::kv::{self, KvOpts};
use crate::peers::{free_port, pinned, spawn_until, Child};
use crate::report::BenchResult;

/// What to run.
#[derive(Debug, Clone)]
pub struct HerdOpts {
    /// Worker counts to measure, one table row each (HERD's "Cores").
    pub workers: Vec<usize>,
    /// Keys in each worker's partition (HERD_NUM_KEYS).
    pub keys_per_partition: u64,
    /// Value size in bytes (HERD_VALUE_SIZE); keys are 16 bytes.
    pub value_size: usize,
    /// Share of PUTs, in percent (HERD's update_percentage).
    pub update_percent: u32,
    /// Operations per frame of the batched client.
    pub batch: usize,
    /// Request frames in flight per connection.
    pub in_flight: usize,
    /// Client threads.
    pub threads: usize,
    /// Measured time of each run.
    pub duration: Duration,
    /// tcp, shm, inproc or fabric.
    pub transport: String,
    /// libfabric provider when the transport is fabric.
    pub provider: String,
    /// Start the server as a child process pinned to these CPUs.
    pub server_cpus: Option<String>,
    /// CPUs for client threads.
    pub client_cpus: Vec<usize>,
}

/// One worker's line: HERD's per-worker report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkerLine {
    /// Worker id.
    pub worker: usize,
    /// Operations this worker executed per second.
    pub iops: f64,
    /// Operations per request frame it received.
    pub avg_batch: f64,
    /// GETs that found no value, as a fraction of GETs.
    pub lookup_fail_rate: f64,
}

/// One row of HERD's table.
#[derive(Debug, Clone)]
pub struct HerdRow {
    /// Worker threads of the server.
    pub cores: usize,
    /// The batched client's result.
    pub batched: BenchResult,
    /// The non-batched client's result.
    pub non_batched: BenchResult,
    /// Per-worker lines of the batched run.
    pub batched_workers: Vec<WorkerLine>,
    /// Per-worker lines of the non-batched run.
    pub non_batched_workers: Vec<WorkerLine>,
}

/// Runs every worker count and returns the rows.
pub fn run(opts: &HerdOpts) -> Result<Vec<HerdRow>, String> {
    if opts.workers.is_empty() || opts.workers.contains(&0) {
        return Err("--workers must list worker counts of at least 1".into());
    }
    if opts.keys_per_partition == 0 {
        return Err("--keys-per-partition must be at least 1".into());
    }
    let mut rows = Vec::new();
    for (n, &w) in opts.workers.iter().enumerate() {
        let server = HerdServer::start(opts, w, n)?;
        let kv_opts = |batch: usize| KvOpts {
            server: Some(server.addr.clone()),
            server_workers: w,
            threads: opts.threads,
            keys: opts.keys_per_partition * w as u64,
            key_size: 16,
            value_size: opts.value_size,
            get_percent: 100 - opts.update_percent.min(100),
            batch,
            in_flight: opts.in_flight,
            duration: opts.duration,
            client_cpus: opts.client_cpus.clone(),
            preload: false,
        };
        let mut client = Client::connect(&server.addr)
            .map_err(|e| format!("connecting to {}: {e}", server.addr))?;
        kv::preload(&mut client, &kv_opts(1))?;
        let (mut batched, batched_workers) = measured(&mut client, &kv_opts(opts.batch))?;
        let (mut non_batched, non_batched_workers) = measured(&mut client, &kv_opts(1))?;
        for (r, lines) in [
            (&mut batched, &batched_workers),
            (&mut non_batched, &non_batched_workers),
        ] {
            r.bench = "herd".into();
            r.params["cores"] = w.into();
            r.params["keys_per_partition"] = opts.keys_per_partition.into();
            r.params["update_percent"] = opts.update_percent.into();
            r.params["workers_lines"] = serde_json::to_value(lines).unwrap_or_default();
        }
        batched.case = format!("cores {w} batched b{}", opts.batch);
        non_batched.case = format!("cores {w} non-batched b1");
        rows.push(HerdRow {
            cores: w,
            batched,
            non_batched,
            batched_workers,
            non_batched_workers,
        });
    }
    Ok(rows)
}

/// Runs one load and reads each worker's counters around it.
fn measured(client: &mut Client, o: &KvOpts) -> Result<(BenchResult, Vec<WorkerLine>), String> {
    let before = client.stats_per_worker().map_err(|e| e.to_string())?;
    let r = kv::run(o)?;
    let after = client.stats_per_worker().map_err(|e| e.to_string())?;
    let lines = before
        .iter()
        .zip(&after)
        .enumerate()
        .map(|(worker, (b, a))| {
            let d = |name: &str| counter(a, name).saturating_sub(counter(b, name)) as f64;
            WorkerLine {
                worker,
                iops: d("ops") / r.seconds.max(1e-9),
                avg_batch: d("ops") / d("frames").max(1.0),
                lookup_fail_rate: d("misses") / d("gets").max(1.0),
            }
        })
        .collect();
    Ok((r, lines))
}

fn counter(list: &[(String, u64)], name: &str) -> u64 {
    list.iter().find(|(k, _)| k == name).map_or(0, |(_, v)| *v)
}

/// Prints HERD's table, then the per-worker lines.
pub fn print(opts: &HerdOpts, rows: &[HerdRow]) {
    println!(
        "HERD: 16-byte keys, {}-byte values, {}% UPDATEs, {} keys per partition, {} transport; batched = {} ops per frame, non-batched = 1; {} frames in flight per connection, {} client thread(s)",
        opts.value_size,
        opts.update_percent,
        opts.keys_per_partition,
        opts.transport,
        opts.batch,
        opts.in_flight,
        opts.threads
    );
    println!("All numbers are million operations/sec");
    println!("Cores  Batched  Non-batched");
    for r in rows {
        println!(
            "{:<6} {:<8.2} {:.2}",
            r.cores,
            r.batched.ops_per_s / 1e6,
            r.non_batched.ops_per_s / 1e6
        );
    }
    for r in rows {
        for (kind, lines) in [
            ("batched", &r.batched_workers),
            ("non-batched", &r.non_batched_workers),
        ] {
            for l in lines {
                println!(
                    "cores {} {kind}: Worker {}: {:.2} M IOPS. Avg batch = {:.2} ops. Lookup fail rate = {:.4}",
                    r.cores,
                    l.worker,
                    l.iops / 1e6,
                    l.avg_batch,
                    l.lookup_fail_rate
                );
            }
        }
    }
}

/// A server for one row: in this process, or a pinned child process.
struct HerdServer {
    addr: String,
    _embedded: Option<ServerHandle>,
    _child: Option<Child>,
}

impl HerdServer {
    fn start(opts: &HerdOpts, workers: usize, n: usize) -> Result<HerdServer, String> {
        let item = 16 + opts.value_size + 64;
        let memory = ((opts.keys_per_partition as usize * workers * item * 2) as u64)
            .max(64 << 20)
            .max(workers as u64 * (8 << 20));
        let child = opts.server_cpus.is_some();
        let port = if child { free_port()? } else { 0 };
        let tag = format!("fkv-herd-{}-{n}", std::process::id());
        let listen = match opts.transport.as_str() {
            "tcp" => format!("127.0.0.1:{port}"),
            "shm" => format!("shm://{tag}"),
            "inproc" if !child => format!("inproc://{tag}"),
            "inproc" => return Err("inproc servers run in this process only".into()),
            "fabric" => format!("fabric://{}/127.0.0.1:{port}", opts.provider),
            t => return Err(format!("unknown transport {t}: tcp, shm, inproc or fabric")),
        };
        if !child {
            let h = Server::start(&ServerConfig {
                listen,
                workers: Some(workers),
                mode: Mode::Store,
                memory_bytes: memory,
                log_level: "warn".into(),
                ..ServerConfig::default()
            })
            .map_err(|e| e.to_string())?;
            return Ok(HerdServer {
                addr: h.addr().to_string(),
                _embedded: Some(h),
                _child: None,
            });
        }
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = pinned(opts.server_cpus.as_deref(), &exe.to_string_lossy());
        cmd.args([
            "serve",
            "--listen",
            &listen,
            "--workers",
            &workers.to_string(),
        ])
        .args(["--memory", &memory.to_string(), "--log-level", "warn"]);
        // Ready when a client completes its handshake (any transport).
        let ready = || Client::connect_with_timeout(&listen, Duration::from_secs(1)).is_ok();
        let c = spawn_until(cmd, "fabrickv", ready)?;
        Ok(HerdServer {
            addr: listen.clone(),
            _embedded: None,
            _child: Some(c),
        })
    }
}
